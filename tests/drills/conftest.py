"""Fixtures for the fault drills: the embedded stack (harness/stack.py) with a worker the drill
can SIGKILL and replace, and counters read from the twin's request log, the twin's cloud API
and the notification sink.

A drill stack runs the twin and the demo runbooks 30x faster (as `sickbay-dev demo`), on free
ports, without the Web UI. `Drill.kill_worker()` sends SIGKILL (no graceful shutdown: the
in-flight workflow task and activities are simply lost) and `Drill.start_worker()` starts a
fresh `sickbay worker` with the stack's environment (optionally another kubeconfig).

Knobs to park a remediation at a step: twin API faults (`api_fault`, optionally narrowed by
`match`), sink fault rules that hold a notification (`sink_fault`), the twin cloud API's
resize latency (`cloud_latency`), extra runbooks in the stack's runbook directory
(`write_runbook`; the worker reloads the directory when a file changes), and each
workflow's history (`history_facts`) to prove a kill interrupted a step.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import yaml
from temporalio.api.enums.v1 import EventType

from harness.scenarios import Demo, Progress
from harness.stack import Child, Stack, StackConfig, free_port

TIME_SCALE = 30.0


def worker_argv() -> list[str]:
    # Local override while the worker process lands (a script path run with this Python).
    override = os.environ.get("SICKBAY_DRILLS_WORKER")
    if override:
        return [override]
    return ["-m", "worker.cli", "worker"]


def start_stack(tmp: Path, **overrides: Any) -> Stack:
    config = StackConfig(
        time_scale=TIME_SCALE,
        temporal_port=free_port(),
        ui=False,
        state_dir=tmp,
        worker_argv=worker_argv(),
        notes=lambda text: print(text, file=sys.stderr),
        **overrides,
    )
    stack = Stack(config)
    stack.__enter__()
    return stack


@dataclass
class Drill:
    stack: Stack
    demo: Demo

    @property
    def info(self) -> Any:
        assert self.stack.info is not None
        return self.stack.info

    # -- the worker ----------------------------------------------------------------------------

    def workers(self) -> list[Child]:
        return [c for c in self.stack.children if c.name == "worker"]

    def kill_worker(self) -> int:
        """SIGKILL every running worker; returns how many were killed."""
        killed = 0
        for child in self.workers():
            if child.alive():
                os.kill(child.pid, signal.SIGKILL)
                child.popen.wait(10)
                killed += 1
            self.stack.children.remove(child)  # dead on purpose: not a stack failure
        return killed

    def start_worker(
        self, kubeconfig: str | None = None, extra_env: dict[str, str] | None = None
    ) -> Child:
        env = self.stack.sickbay_env()
        secrets = Path(self.stack.dir) / "secrets"
        env["SICKBAY_WEBHOOK_TOKEN_FILE"] = str(secrets / "webhook-token")
        env["SICKBAY_TWIN_CLOUD_TOKEN_FILE"] = str(secrets / "cloud-token")
        env["SICKBAY_METRICS_PORT"] = str(free_port())
        if kubeconfig is not None:
            env["KUBECONFIG"] = kubeconfig
        env.update(extra_env or {})
        n = len(list((Path(self.stack.dir) / "logs").glob("worker*.log")))
        log_path = Path(self.stack.dir) / "logs" / f"worker-{n + 1}.log"
        with open(log_path, "ab") as out:
            popen = subprocess.Popen(
                [sys.executable, *self.stack.config.worker_argv],
                stdout=out,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                env=env,
                cwd=str(Path(__file__).resolve().parents[2]),
            )
        child = Child("worker", popen, log_path)
        self.stack.children.append(child)  # stopped with the stack
        return child

    # -- what the world saw ----------------------------------------------------------------------

    def kube_requests(self, **filters: str) -> list[dict[str, Any]]:
        resp = httpx.get(f"{self.info.kube_url}/twin/requests", params=filters, timeout=30)
        resp.raise_for_status()
        return list(resp.json()["items"])

    def rule_creates(self) -> list[dict[str, Any]]:
        """Successful DeviceTaintRule creates (each one a taint put on a device)."""
        return [
            r
            for r in self.kube_requests(verb="create", resource="devicetaintrules")
            if r["status"] < 300
        ]

    def rules(self) -> list[dict[str, Any]]:
        for version in ("v1", "v1beta2", "v1alpha3"):
            r = httpx.get(
                f"{self.info.kube_url}/apis/resource.k8s.io/{version}/devicetaintrules",
                timeout=30,
            )
            if r.status_code == 200:
                return list(r.json()["items"])
        return []

    def resize_operations(self) -> list[dict[str, Any]]:
        """The twin cloud API's resize operations (one per accepted setSize request)."""
        token = (Path(self.stack.dir) / "secrets" / "cloud-token").read_text().strip()
        r = httpx.get(
            f"{self.info.cloud_url}/v1/projects/twin/locations/local/operations",
            headers={"Authorization": f"Bearer {token}"},
            timeout=30,
        )
        r.raise_for_status()
        return list(r.json().get("operations") or [])

    def notifications(self) -> list[dict[str, Any]]:
        return self.stack.notifications()

    def api_fault(self, kind: str, verb: str = "*", resource: str = "*", **extra: Any) -> int:
        body = {"kind": kind, "verb": verb, "resource": resource, **extra}
        return int(self.stack.twin("POST", "/twin/api-faults", body)["id"])

    def api_faults(self) -> list[dict[str, Any]]:
        return list(self.stack.twin("GET", "/twin/api-faults")["items"])

    def clear_api_faults(self) -> None:
        self.stack.twin("DELETE", "/twin/api-faults")

    def api_fault_hits(self, rule_id: int) -> int:
        """How many requests a twin API fault rule has taken so far (0 once removed)."""
        return next((int(r["injected"]) for r in self.api_faults() if r["id"] == rule_id), 0)

    # -- the notification sink's fault rules (harness/sink.py) ---------------------------------

    def sink_fault(self, path: str, count: int = 1, hold_seconds: float = 0.0) -> int:
        r = httpx.post(
            f"{self.info.sink_url}/faults",
            json={"path": path, "count": count, "holdSeconds": hold_seconds},
            timeout=30,
        )
        r.raise_for_status()
        return int(r.json()["id"])

    def sink_faults(self) -> list[dict[str, Any]]:
        r = httpx.get(f"{self.info.sink_url}/faults", timeout=30)
        r.raise_for_status()
        return list(r.json()["items"])

    def clear_sink_faults(self) -> None:
        httpx.delete(f"{self.info.sink_url}/faults", timeout=30).raise_for_status()

    # -- runbooks and the cloud API ----------------------------------------------------------------

    def write_runbook(self, name: str, spec: dict[str, Any]) -> None:
        doc = {"apiVersion": "sickbay/v1", "kind": "Runbook", "metadata": {"name": name}}
        doc["spec"] = spec
        path = Path(self.info.runbooks_dir) / f"{name}.yaml"
        path.write_text(yaml.safe_dump(doc, sort_keys=False))

    def twin_pool(self) -> dict[str, Any]:
        """The twin cloud API's target for the stack's pool (a runbook's scaleUp.pool)."""
        from harness.stack import POOL

        return {
            "provider": "twin",
            "name": POOL,
            "node_pool_label": POOL,
            "endpoint": self.info.cloud_url,
        }

    def cloud_latency(self, seconds: float) -> None:
        """Simulated seconds the twin cloud API's next resize operations run."""
        from harness.stack import POOL

        self.stack.twin("PUT", f"/twin/pools/{POOL}/cloud", {"latency": seconds})


@dataclass
class HistoryFacts:
    workflow_task_timeouts: int  # workflow tasks a dead worker never finished
    attempts: dict[str, int]  # activity type -> highest attempt that ran to an end


async def history_facts(demo: Demo, workflow_id: str) -> HistoryFacts:
    """What a remediation's history says about interrupted steps: a killed worker leaves a
    timed-out workflow task (local activities, e.g. the hot path and the release) or an
    activity whose finishing attempt is > 1 (heartbeat / start-to-close timeout, retried)."""
    history = await demo.handle(workflow_id).fetch_history()
    names: dict[int, str] = {}
    attempts: dict[str, int] = {}
    timeouts = 0
    for event in history.events:
        if event.event_type == EventType.EVENT_TYPE_WORKFLOW_TASK_TIMED_OUT:
            timeouts += 1
        elif event.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED:
            attrs = event.activity_task_scheduled_event_attributes
            names[event.event_id] = attrs.activity_type.name
        elif event.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_STARTED:
            started = event.activity_task_started_event_attributes
            name = names.get(started.scheduled_event_id, "?")
            attempts[name] = max(attempts.get(name, 0), started.attempt)
    return HistoryFacts(timeouts, attempts)


async def run_count(demo: Demo, workflow_id: str) -> int:
    """Runs (executions) of one workflow id: 1 means nothing was started twice."""
    return len([w async for w in demo.client.list_workflows(f"WorkflowId = '{workflow_id}'")])


def _chain(err: BaseException | None) -> str:
    parts = []
    while err is not None:
        parts.append(f"{type(err).__name__}: {err}")
        err = getattr(err, "cause", None) or err.__cause__
    return " <- ".join(parts)


async def closed(demo: Demo, incident: Any, within: float = 60.0) -> Any:
    """The remediation's result; a *failed* workflow (no escalation, nobody told) is an
    assertion error naming the failure chain."""
    from temporalio.client import WorkflowFailureError

    try:
        return await demo.closed(incident, within=within)
    except WorkflowFailureError as err:
        raise AssertionError(
            f"{incident.workflow_id} FAILED instead of escalating: {_chain(err)}"
        ) from err


@contextlib.asynccontextmanager
async def drill_stack(tmp: Path, **overrides: Any) -> AsyncIterator[Drill]:
    stack = start_stack(tmp, **overrides)
    demo = None
    try:
        demo = await Demo.open(stack, Progress(lambda line: print(line, file=sys.stderr)))
        yield Drill(stack, demo)
    finally:
        if demo is not None:
            await demo.close()
        stack.stop()


async def gpu_plugin_pods(demo: Demo) -> set[str]:
    """The names of the pods in the twin's GPU plugin namespace (plugins and validators)."""
    body = await demo.k("GET", "/api/v1/namespaces/gpu-operator/pods")
    return {p["metadata"]["name"] for p in body["items"]}


async def until_plugin_pods(demo: Demo, count: int, within: float) -> set[str]:
    """The GPU plugin pods, once there are `count` of them (within `within` real seconds)."""
    deadline = time.monotonic() + within
    while len(pods := await gpu_plugin_pods(demo)) < count:
        assert time.monotonic() < deadline, f"GPU plugin pods: {pods}"
        await asyncio.sleep(0.2)
    return pods


async def node_incident_result(handle: Any, within: float) -> Any:
    """The node incident's result, waiting while it has not started or not ended yet."""
    deadline = time.monotonic() + within
    while True:
        try:
            return await asyncio.wait_for(handle.result(), timeout=5)
        except Exception:  # not started yet, or still looking
            assert time.monotonic() < deadline, f"no closed node incident {handle.id}"
            await asyncio.sleep(0.2)


async def assert_node_untouched(demo: Demo, node: str) -> None:
    """Sickbay neither marked nor tainted `node`, and started no per-GPU remediation on it."""
    from contract.names import WF_REMEDIATE
    from contract.node_incident import CONDITION_GPU_DEVICES

    obj = await demo.k("GET", f"/api/v1/nodes/{node}")
    conditions = [c["type"] for c in obj["status"].get("conditions") or []]
    assert CONDITION_GPU_DEVICES not in conditions, obj["status"]["conditions"]
    assert not [t for t in obj["spec"].get("taints") or [] if "sickbay" in t["key"]]
    listed = [
        w.id
        async for w in demo.client.list_workflows(
            f"WorkflowType = '{WF_REMEDIATE}' AND SickbayNode = '{node}'"
        )
    ]
    assert listed == [], listed
