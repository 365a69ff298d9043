"""Helpers for the webhook tests: serve an app under uvicorn on a free loopback port, build
Alertmanager payloads, read what Temporal recorded.

No worker polls the per-module task queue, so the workflows the webhook starts just sit there:
what the tests check is what Temporal *recorded* (one execution, N signals), which does not
depend on the remediation workflow's code.
"""

from __future__ import annotations

import asyncio
import copy
import socket
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any

import httpx
import uvicorn
from temporalio.api.enums.v1 import EventType
from temporalio.client import Client
from temporalio.testing import WorkflowEnvironment

from worker.settings import Settings

TOKEN = "s3cret-token-for-tests-0123456789abcdef"  # 32+ characters: shorter ones are refused

XID79_ALERT: dict[str, Any] = {
    "status": "firing",
    "labels": {
        "alertname": "SickbayGpuXidError",
        "Hostname": "gpu-node-1",
        "UUID": "GPU-0b6b5d9e-3c5c-4c3f-9a39-000000000001",
        "gpu": "3",
        "modelName": "NVIDIA H100 80GB HBM3",
        "device": "nvidia3",
        "err_code": "79",
        "err_msg": "GPU has fallen off the bus",
        "namespace": "ml",
        "pod": "trainer-0",
        "container": "main",
        "severity": "critical",
    },
    "annotations": {"summary": "GPU 3 on gpu-node-1 reported Xid 79", "value": "79"},
    "startsAt": "2026-11-29T10:00:00.000Z",
    "endsAt": "0001-01-01T00:00:00Z",
    "generatorURL": "http://prometheus/graph?g0.expr=DCGM_FI_DEV_XID_ERRORS",
    "fingerprint": "c0ffee0000000079",
}


def payload(*alerts: dict[str, Any], status: str = "firing") -> dict[str, Any]:
    return {
        "version": "4",
        "groupKey": '{}:{alertname="SickbayGpuXidError"}',
        "truncatedAlerts": 0,
        "status": status,
        "receiver": "sickbay",
        "groupLabels": {"alertname": "SickbayGpuXidError"},
        "commonLabels": {},
        "commonAnnotations": {},
        "externalURL": "http://alertmanager:9093",
        "alerts": list(alerts),
    }


def xid_alert(node: str, gpu_uuid: str, **changes: Any) -> dict[str, Any]:
    alert = copy.deepcopy(XID79_ALERT)
    alert["labels"]["Hostname"] = node
    alert["labels"]["UUID"] = gpu_uuid
    alert["fingerprint"] = f"fp-{node}-{gpu_uuid}"[:64]
    for key, value in changes.items():
        alert[key] = value
    return alert


def unique_device() -> tuple[str, str]:
    tag = uuid.uuid4().hex[:10]
    return f"node-{tag}", f"GPU-{uuid.uuid4()}"


def auth(token: str = TOKEN) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


async def history_counts(client: Client, workflow_id: str) -> dict[str, int]:
    history = await client.get_workflow_handle(workflow_id).fetch_history()
    counts = {"started": 0, "signaled": 0}
    for event in history.events:
        if event.event_type == EventType.EVENT_TYPE_WORKFLOW_EXECUTION_STARTED:
            counts["started"] += 1
        elif event.event_type == EventType.EVENT_TYPE_WORKFLOW_EXECUTION_SIGNALED:
            counts["signaled"] += 1
    return counts


async def signal_names(client: Client, workflow_id: str) -> list[str]:
    history = await client.get_workflow_handle(workflow_id).fetch_history()
    return [
        e.workflow_execution_signaled_event_attributes.signal_name
        for e in history.events
        if e.event_type == EventType.EVENT_TYPE_WORKFLOW_EXECUTION_SIGNALED
    ]


async def count_runs(client: Client, query: str, expect: int | None = None) -> int:
    """Visibility is eventually consistent: poll briefly until `expect` (if given) shows."""
    count = -1
    for _ in range(40):
        count = (await client.count_workflows(query)).count
        if expect is None or count == expect:
            return count
        await asyncio.sleep(0.05)
    return count


@dataclass
class Served:
    url: str
    client: Client
    settings: Settings
    http: httpx.AsyncClient


def free_socket() -> socket.socket:
    # proto=IPPROTO_TCP: asyncio sets TCP_NODELAY only on sockets that say so; with proto 0
    # every small response waits ~40 ms for a delayed ACK (Nagle).
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", 0))
    sock.listen(128)
    return sock


@asynccontextmanager
async def serve(app: Any) -> AsyncIterator[str]:
    sock = free_socket()
    host, port = sock.getsockname()
    server = uvicorn.Server(
        uvicorn.Config(app, log_level="warning", lifespan="on", access_log=False)
    )
    task = asyncio.create_task(server.serve(sockets=[sock]))
    for _ in range(200):
        if server.started:
            break
        if task.done():
            task.result()
        await asyncio.sleep(0.01)
    try:
        yield f"http://{host}:{port}"
    finally:
        server.should_exit = True
        await task
        sock.close()


def settings_for(env: WorkflowEnvironment, task_queue: str) -> Settings:
    target = env.client.service_client.config.target_host
    return Settings(temporal_address=target, task_queue=task_queue)
