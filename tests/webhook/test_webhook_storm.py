"""The webhook under an alert storm, and its de-duplication never hiding a failed delivery.

Real HTTP (uvicorn on loopback) against the Temporal dev server. The webhook gets its own
client whose RPCs are counted (and, for the fault case, refused) by a wrapper around the
client's `WorkflowService` calls, so the counts are what actually went to Temporal.

Cases:
- storm: 1,000 firing alerts over 10 GPUs (per GPU: the whole GPU, two MIG slices with the
  parent's UUID, a second alert rule; plus a re-fire of two alerts with a later startsAt)
  in 50 notifications posted at once -> every notification 200 and fully accepted, exactly
  10 workflows, every (workflow, fingerprint) recorded as an `alert` signal, and exactly one
  Temporal RPC per distinct (workflow, status, fingerprint, startsAt) - 42, not 1,000; the
  `temporal_calls` metric agrees with the wrapper
- Temporal refusing calls (UNAVAILABLE injected at the RPC): the same notification posted
  5 times at once -> all 503 listing the alert as temporal-unavailable, nothing cached;
  once Temporal answers again the retry makes a real call (result "started", not a
  duplicate) and the workflow records the alert
- Temporal really down (dev server stopped) -> 503; dev server restarted on the same port
  (empty: the cache must not pretend) -> the retry reaches the new server and starts the
  workflow there
- RecentDeliveries unit: the window expires, a hit does not extend it, the size bound drops
  the oldest, a 0 s window remembers nothing
"""

from __future__ import annotations

import asyncio
import collections
import json
import random
import socket
import uuid
from collections.abc import Awaitable, Callable
from typing import Any

import httpx
import pytest
from temporalio.api.enums.v1 import EventType
from temporalio.client import Client
from temporalio.contrib.pydantic import pydantic_data_converter
from temporalio.service import RPCError, RPCStatusCode
from temporalio.testing import WorkflowEnvironment

from tests.conftest import dev_server_args
from tests.webhook.helpers import (
    TOKEN,
    auth,
    count_runs,
    payload,
    serve,
    settings_for,
    unique_device,
    xid_alert,
)
from worker.webhook import RecentDeliveries, WebhookSettings, create_app
from workflows.constants import device_workflow_id

pytestmark = pytest.mark.devserver  # the session's Temporal dev server (dev_env), or its own

RPCS = ("signal_with_start_workflow_execution", "signal_workflow_execution")


class CountingRpc:
    """Wraps the alert RPCs of one client: counts every call, and refuses them while
    `refuse` is set (as an unreachable frontend would, with UNAVAILABLE)."""

    def __init__(self, client: Client) -> None:
        self.calls: collections.Counter[str] = collections.Counter()
        self.refuse = False
        service = client.workflow_service
        for name in RPCS:
            setattr(service, name, self._wrap(name, getattr(service, name)))

    def _wrap(self, name: str, call: Callable[..., Awaitable[Any]]) -> Callable[..., Any]:
        async def counted(req: Any, *args: Any, **kwargs: Any) -> Any:
            self.calls[name] += 1
            if self.refuse:
                raise RPCError("injected: frontend unavailable", RPCStatusCode.UNAVAILABLE, b"")
            return await call(req, *args, **kwargs)

        return counted

    @property
    def total(self) -> int:
        return sum(self.calls.values())


async def own_client(env: WorkflowEnvironment) -> Client:
    """A client of its own, so wrapping its RPCs does not touch the session's client."""
    return await Client.connect(
        env.client.service_client.config.target_host, data_converter=pydantic_data_converter
    )


async def recorded(client: Client, workflow_id: str) -> list[str]:
    """Fingerprints of the `alert` signals in the workflow's history, in order."""
    history = await client.get_workflow_handle(workflow_id).fetch_history()
    return [
        json.loads(e.workflow_execution_signaled_event_attributes.input.payloads[0].data)[
            "fingerprint"
        ]
        for e in history.events
        if e.event_type == EventType.EVENT_TYPE_WORKFLOW_EXECUTION_SIGNALED
    ]


def storm_alerts(devices: list[tuple[str, str]], total: int) -> list[dict[str, Any]]:
    """`total` firing alerts cycling over four label sets per GPU, with stable startsAt (as
    Alertmanager repeats them), shuffled."""
    out = []
    for k in range(total):
        node, gpu = devices[k % len(devices)]
        variant = (k // len(devices)) % 4
        alert = xid_alert(node, gpu)
        alert["fingerprint"] = f"{node}-{variant}"
        if variant in (1, 2):  # MIG slice: parent UUID + GPU instance id
            alert["labels"]["GPU_I_ID"] = str(variant)
        elif variant == 3:  # a second rule naming the same GPU
            alert["labels"]["alertname"] = "SickbayGpuEccDoubleBitError"
        out.append(alert)
    random.Random(7).shuffle(out)
    return out


async def test_storm_one_rpc_per_distinct_alert(dev_env: WorkflowEnvironment) -> None:
    client = await own_client(dev_env)
    rpc = CountingRpc(client)
    queue = f"storm-{uuid.uuid4().hex[:8]}"
    app = create_app(
        settings_for(dev_env, queue), client, webhook=WebhookSettings(webhook_token=TOKEN)
    )
    devices = [unique_device() for _ in range(10)]
    alerts = storm_alerts(devices, 1000)
    # A re-fire: same fingerprint, later startsAt (resolved and fired again) is a new delivery.
    for node, _gpu in devices[:2]:
        refire = next(a for a in alerts if a["fingerprint"] == f"{node}-0")
        alerts.append({**refire, "startsAt": "2026-11-29T11:00:00Z"})
    batches = [alerts[i : i + 20] for i in range(0, len(alerts), 20)]
    async with serve(app) as url, httpx.AsyncClient(base_url=url, timeout=60) as http:
        resps = await asyncio.gather(
            *(http.post("/v1/alertmanager", json=payload(*b), headers=auth()) for b in batches)
        )
        metrics = (await http.get("/metrics")).text
    assert [r.status_code for r in resps] == [200] * len(batches)
    bodies = [r.json() for r in resps]
    assert [b["accepted"] for b in bodies] == [len(b) for b in batches]
    assert sum(b["started"] for b in bodies) == 10
    assert not any(b["failed"] or b["unmatched"] for b in bodies)

    distinct = {(a["labels"]["Hostname"], a["fingerprint"], a["startsAt"]) for a in alerts}
    assert len(distinct) == 42
    assert rpc.total == len(distinct), rpc.calls
    assert sum(b["started"] + b["signalled"] for b in bodies) == len(distinct)
    assert sum(b["duplicates"] for b in bodies) == len(alerts) - len(distinct)
    assert (
        f'sickbay_webhook_temporal_calls_total{{call="signal-with-start"}} {len(distinct)}.0'
        in (metrics)
    )

    assert await count_runs(dev_env.client, f"TaskQueue = '{queue}'", expect=10) == 10
    for node, gpu in devices:
        wid = device_workflow_id(node, gpu)
        fingerprints = await recorded(dev_env.client, wid)
        assert sorted(set(fingerprints)) == [f"{node}-{v}" for v in range(4)]  # none lost
        await dev_env.client.get_workflow_handle(wid).terminate("test done")


async def test_failed_delivery_is_never_cached(dev_env: WorkflowEnvironment) -> None:
    client = await own_client(dev_env)
    rpc = CountingRpc(client)
    app = create_app(
        settings_for(dev_env, f"refused-{uuid.uuid4().hex[:8]}"),
        client,
        webhook=WebhookSettings(webhook_token=TOKEN, webhook_temporal_timeout=5.0),
    )
    node, gpu = unique_device()
    wid = device_workflow_id(node, gpu)
    body = payload(xid_alert(node, gpu))
    async with serve(app) as url, httpx.AsyncClient(base_url=url, timeout=30) as http:
        rpc.refuse = True
        down = await asyncio.gather(
            *(http.post("/v1/alertmanager", json=body, headers=auth()) for _ in range(5))
        )
        assert [r.status_code for r in down] == [503] * 5
        for r in down:
            data = r.json()
            assert data["accepted"] == 0 and data["duplicates"] == 0
            assert [f["reason"] for f in data["failed"]] == ["temporal-unavailable"]
        assert 1 <= rpc.total <= 5  # concurrent identical alerts may share one failing call
        assert (
            app.state.service.recent.recent(
                (wid, "firing", f"fp-{node}-{gpu}"[:64], "2026-11-29T10:00:00+00:00")
            )
            is False
        )
        refused = rpc.total

        rpc.refuse = False
        again = await http.post("/v1/alertmanager", json=body, headers=auth())
        assert again.status_code == 200, again.text
        assert again.json()["started"] == 1 and again.json()["duplicates"] == 0
        assert rpc.total == refused + 1
        # Now it is delivered: a repeat is answered from the cache, without a call.
        repeat = await http.post("/v1/alertmanager", json=body, headers=auth())
        assert repeat.status_code == 200 and repeat.json()["duplicates"] == 1
        assert rpc.total == refused + 1
    assert await recorded(dev_env.client, wid) == [f"fp-{node}-{gpu}"[:64]]
    await dev_env.client.get_workflow_handle(wid).terminate("test done")


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


async def _start_dev_server(path: str, port: int) -> WorkflowEnvironment:
    return await WorkflowEnvironment.start_local(
        data_converter=pydantic_data_converter,
        dev_server_existing_path=path,
        dev_server_extra_args=dev_server_args(),
        port=port,
        ui=False,
    )


async def test_temporal_down_then_back_delivers(temporal_cli_path: str) -> None:
    port = _free_port()
    env = await _start_dev_server(temporal_cli_path, port)
    app = create_app(
        settings_for(env, "down-and-back"),
        env.client,
        # 2 s: the down case answers quickly; the SDK keeps retrying the call behind it.
        webhook=WebhookSettings(webhook_token=TOKEN, webhook_temporal_timeout=2.0),
    )
    node, gpu = unique_device()
    wid = device_workflow_id(node, gpu)
    body = payload(xid_alert(node, gpu))
    try:
        async with serve(app) as url, httpx.AsyncClient(base_url=url, timeout=30) as http:
            other = payload(xid_alert(*unique_device()))
            assert (
                await http.post("/v1/alertmanager", json=other, headers=auth())
            ).status_code == 200
            await env.shutdown()
            resp = await http.post("/v1/alertmanager", json=body, headers=auth())
            assert resp.status_code == 503, resp.text
            env = await _start_dev_server(temporal_cli_path, port)  # empty: in-memory store
            async with asyncio.timeout(30):  # Alertmanager retries until it gets a 200
                while resp.status_code != 200:
                    await asyncio.sleep(0.2)
                    resp = await http.post("/v1/alertmanager", json=body, headers=auth())
            assert resp.json()["accepted"] == 1
        # The proof: the new (empty) server has the workflow and the alert, so the 200 came
        # from a real call (the retry's own, or the first one, still retrying, that it joined),
        # never from memory of the failed attempt.
        assert await recorded(env.client, wid) == [f"fp-{node}-{gpu}"[:64]]
    finally:
        await env.shutdown()


def test_recent_deliveries_window_and_bound() -> None:
    now = [0.0]
    cache = RecentDeliveries(ttl=60.0, max_entries=3, clock=lambda: now[0])
    key = ("wf", "firing", "fp", "t0")
    assert not cache.recent(key)
    cache.remember(key)
    now[0] = 59.0
    assert cache.recent(key)  # the hit does not extend the window...
    now[0] = 60.0
    assert not cache.recent(key)  # ...which ends 60 s after Temporal accepted it
    for i in range(5):
        cache.remember(("wf", "firing", f"fp{i}", "t0"))
    assert len(cache) == 3  # the oldest went first
    assert not cache.recent(("wf", "firing", "fp1", "t0"))
    assert cache.recent(("wf", "firing", "fp4", "t0"))
    off = RecentDeliveries(ttl=0.0, max_entries=10)
    off.remember(key)
    assert not off.recent(key) and len(off) == 0
