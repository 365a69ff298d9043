"""The floor of a Temporal-based alert pipeline: the peer script's calls, made durable minimally.

    python -m bench.floor --port 9200 --kubeconfig K --temporal 127.0.0.1:7233 \\
        --namespace default [--prefix floor-]

What the least a team could put on Temporal looks like: an HTTP receiver that, for each firing
alert of an Alertmanager notification, starts one tiny workflow (`SickbayBenchFloor`, on its
own task queue `sickbay-bench-floor`) with eager start (`request_eager_start=True`: the
server hands the first workflow task back in the start response to the Worker polling that
queue in this very process, sharing its client), and answers 200 once the start returned.
The workflow makes the peer script's calls (bench/peer.py, imported, not copied) in ONE local
activity of its first workflow task: resolve (list the node's ResourceSlices, find the uuid,
read the node), then create (the DeviceTaintRule `<prefix><sickbay rule name>`; 409 is
fine). No budget, no confirmation, no search attributes, no notifications.

Every choice is the cheapest Temporal offers, so the figure is a floor: eager start, a single
local activity (each further one costs an SDK hand-off: ~3 ms here, measured with resolve and
create as two), the default data converter, a bare ASGI app on uvicorn, and the workflow run
without the SDK's sandbox (it imports nothing and calls no clock; `--sandbox` runs it in the
default sandbox, as production workers such as Sickbay's do, which costs a few ms more per
workflow). `GET /` answers how many workflows were started and how many of those the server
started eagerly (the SDK's flag: the start response carried the first workflow task).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
from concurrent.futures import ThreadPoolExecutor
from datetime import timedelta
from typing import Any

from temporalio import activity, workflow
from temporalio.common import RetryPolicy

with workflow.unsafe.imports_passed_through():
    from bench.peer import Peer
    from contract.names import taint_rule_name

log = logging.getLogger("bench.floor")

TASK_QUEUE = "sickbay-bench-floor"
WORKFLOW = "SickbayBenchFloor"
AGENT = "sickbay-bench-floor/1"
REMEDIATE = "bench-floor-remediate"
# Each call answers in milliseconds on the loopback twin; 10 s only bounds a hung connection.
CALL_TIMEOUT = timedelta(seconds=10)
# The script makes one attempt; three bound the floor's retries on a transient twin error
# without hiding a real failure behind endless attempts.
CALL_RETRY = RetryPolicy(maximum_attempts=3, initial_interval=timedelta(milliseconds=100))


@workflow.defn(name=WORKFLOW)
class FloorWorkflow:
    """resolve and create, one local activity of the first workflow task."""

    @workflow.run
    async def run(self, node: str, uuid: str) -> str:
        return await workflow.execute_local_activity(
            REMEDIATE,
            args=[node, uuid],
            result_type=str,
            start_to_close_timeout=CALL_TIMEOUT,
            retry_policy=CALL_RETRY,
        )


class FloorActivities:
    """The peer's resolve and create, as one (sync, thread-pool) local activity."""

    def __init__(self, peer: Peer) -> None:
        self.peer = peer

    @activity.defn(name=REMEDIATE)
    def remediate(self, node: str, uuid: str) -> str:
        return self.peer.create(node, uuid, self.peer.resolve(node, uuid))


def workflow_id(prefix: str, node: str, uuid: str) -> str:
    return prefix + taint_rule_name(node, uuid)


class Receiver:
    """The ASGI app: POST an Alertmanager notification -> one eager start per firing alert."""

    def __init__(self, client: Any, prefix: str) -> None:
        self.client = client
        self.prefix = prefix
        self.started = 0
        self.eager = 0

    async def start(self, node: str, uuid: str) -> str:
        from temporalio.exceptions import WorkflowAlreadyStartedError

        wf_id = workflow_id(self.prefix, node, uuid)
        try:
            handle = await self.client.start_workflow(
                WORKFLOW,
                args=[node, uuid],
                id=wf_id,
                task_queue=TASK_QUEUE,
                request_eager_start=True,
            )
        except WorkflowAlreadyStartedError:
            return wf_id  # a repeat while the first is running: deduplicated
        self.started += 1
        # The SDK's own record: the start response carried the first workflow task.
        if getattr(handle, "__temporal_eagerly_started", False):
            self.eager += 1
        return wf_id

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            return
        raw = b""
        while True:
            message = await receive()
            raw += message.get("body", b"")
            if not message.get("more_body"):
                break
        if scope["method"] != "POST":
            await self._reply(send, 200, {"ok": True, "started": self.started, "eager": self.eager})
            return
        try:
            payload = json.loads(raw)
            alerts = [a["labels"] for a in payload["alerts"] if a.get("status") == "firing"]
            pairs = [(labels["Hostname"], labels["UUID"]) for labels in alerts]
        except (ValueError, KeyError, TypeError) as err:
            await self._reply(send, 400, {"error": f"not an Alertmanager notification: {err}"})
            return
        ids = [await self.start(node, uuid) for node, uuid in pairs]
        await self._reply(send, 200, {"workflows": ids})

    @staticmethod
    async def _reply(send: Any, code: int, body: dict[str, Any]) -> None:
        data = json.dumps(body).encode()
        headers = [(b"content-type", b"application/json"), (b"content-length", b"%d" % len(data))]
        await send({"type": "http.response.start", "status": code, "headers": headers})
        await send({"type": "http.response.body", "body": data})


async def serve(
    port: int, kubeconfig: str, temporal: str, namespace: str, prefix: str, sandbox: bool = False
) -> None:
    import uvicorn
    from temporalio.client import Client
    from temporalio.worker import UnsandboxedWorkflowRunner, Worker
    from temporalio.worker.workflow_sandbox import SandboxedWorkflowRunner

    peer = Peer(kubeconfig, prefix, user_agent=AGENT)
    acts = FloorActivities(peer)
    client = await Client.connect(temporal, namespace=namespace)
    with ThreadPoolExecutor(max_workers=16, thread_name_prefix="floor-act") as pool:
        worker = Worker(
            client,
            task_queue=TASK_QUEUE,
            workflows=[FloorWorkflow],
            activities=[acts.remediate],
            activity_executor=pool,
            workflow_runner=SandboxedWorkflowRunner() if sandbox else UnsandboxedWorkflowRunner(),
        )
        server = uvicorn.Server(
            uvicorn.Config(
                Receiver(client, prefix),
                host="127.0.0.1",
                port=port,
                lifespan="off",
                access_log=False,
                log_level="warning",
            )
        )
        async with worker:  # polling before the first request: eager start needs it
            await server.serve()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--kubeconfig", required=True)
    parser.add_argument("--temporal", required=True, help="Temporal frontend host:port")
    parser.add_argument("--namespace", default="default")
    parser.add_argument("--prefix", default="floor-")
    parser.add_argument("--sandbox", action="store_true", help="run the workflow sandboxed")
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING)
    asyncio.run(
        serve(args.port, args.kubeconfig, args.temporal, args.namespace, args.prefix, args.sandbox)
    )


if __name__ == "__main__":
    main()
