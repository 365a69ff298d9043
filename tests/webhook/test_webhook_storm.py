"""The webhook under an alert storm, and its de-duplication never hiding a failed delivery.

Real HTTP (uvicorn on loopback) against the Temporal dev server. The webhook gets its own
client whose RPCs are counted (and, for the fault case, refused) by a wrapper around the
client's `WorkflowService` calls, so the counts are what actually went to Temporal.

Cases:
- storm: 1,000 firing alerts over 10 GPUs (per GPU: the whole GPU, two MIG slices with the
  parent's UUID, a second alert rule; plus a re-fire of two alerts with a later startsAt)
  in 50 notifications posted at once -> every notification 200 and fully accepted, exactly
  10 workflows, every (workflow, fingerprint) recorded in an `alert`/`alerts` signal, never
  two calls in flight for one workflow, and between 10 (one per workflow) and 42 (one per
  distinct (workflow, status, fingerprint, startsAt)) RPCs, not 1,000; the `temporal_calls`
  metric agrees with the wrapper
- coalescing, made deterministic by holding the first call at the RPC: while it is held,
  three more notifications for the same workflow (new alerts, a duplicate of the held one,
  a resolved alert) queue; on release exactly three RPCs: the held one, ONE signal-with-start
  carrying the three new firing alerts as one `alerts` signal, then the resolved signal;
  every POST 200 only then; the workflow history holds every fingerprint once; the
  call-size histogram saw a 3-alert call; a repeat afterwards is answered from the cache
- a failed batch: the same hold, then Temporal refuses -> the held call and the batched
  call fail, every notification whose alerts rode them gets 503 with each of its alerts
  failed (none accepted, none cached); re-posting them makes real calls and every alert
  reaches the workflow
- deadline passed while queued (one call slot, held by workflow A's call; 0.5 s deadline):
  both notifications 503; on release A's call, already sent, completes and is remembered
  (A's re-post is a cache hit), B's delivery, which nobody waits for any more, is dropped
  unsent (`deliveries_dropped` metric, no RPC); B's re-post sends it and it is recorded
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
import uuid
from collections.abc import Awaitable, Callable
from typing import Any

import httpx
import pytest
from fastapi import FastAPI
from temporalio.api.enums.v1 import EventType
from temporalio.client import Client
from temporalio.service import RPCError, RPCStatusCode
from temporalio.testing import WorkflowEnvironment

from contract.names import SIG_ALERT, SIG_ALERT_RESOLVED, SIG_ALERTS, device_workflow_id
from harness.stack import free_port
from tests.conftest import start_dev_server
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
from worker.converter import DATA_CONVERTER
from worker.settings import WebhookSettings
from worker.webhook.app import create_app
from worker.webhook.dedupe import RecentDeliveries

pytestmark = pytest.mark.devserver  # the session's Temporal dev server (dev_env), or its own

RPCS = ("signal_with_start_workflow_execution", "signal_workflow_execution")


class CountingRpc:
    """Wraps the alert RPCs of one client: counts every call, records (signal name, alerts
    carried) per call, tracks the most calls in flight for one workflow id, holds calls
    while `hold` is set (they wait at the RPC, counted, until it is cleared), and refuses
    them while `refuse` is set (as an unreachable frontend would, with UNAVAILABLE)."""

    def __init__(self, client: Client) -> None:
        self.calls: collections.Counter[str] = collections.Counter()
        self.sent: list[tuple[str, int]] = []
        self.refuse = False
        self.hold = False
        self._released = asyncio.Event()
        self._inflight: collections.Counter[str] = collections.Counter()
        self.max_inflight_per_workflow = 0
        service = client.workflow_service
        for name in RPCS:
            setattr(service, name, self._wrap(name, getattr(service, name)))

    def _wrap(self, name: str, call: Callable[..., Awaitable[Any]]) -> Callable[..., Any]:
        async def counted(req: Any, *args: Any, **kwargs: Any) -> Any:
            self.calls[name] += 1
            carried = req.signal_input if name.startswith("signal_with_start") else req.input
            data = json.loads(carried.payloads[0].data)
            self.sent.append((req.signal_name, len(data) if isinstance(data, list) else 1))
            wid = getattr(req, "workflow_id", "") or req.workflow_execution.workflow_id
            self._inflight[wid] += 1
            self.max_inflight_per_workflow = max(
                self.max_inflight_per_workflow, self._inflight[wid]
            )
            try:
                if self.hold:
                    await self._released.wait()
                if self.refuse:
                    raise RPCError("injected: frontend unavailable", RPCStatusCode.UNAVAILABLE, b"")
                return await call(req, *args, **kwargs)
            finally:
                self._inflight[wid] -= 1

        return counted

    def release(self) -> None:
        self.hold = False
        self._released.set()

    @property
    def total(self) -> int:
        return sum(self.calls.values())


async def own_client(env: WorkflowEnvironment) -> Client:
    """A client of its own, so wrapping its RPCs does not touch the session's client."""
    return await Client.connect(
        env.client.service_client.config.target_host, data_converter=DATA_CONVERTER
    )


async def counted_app(
    env: WorkflowEnvironment, queue: str, **webhook: Any
) -> tuple[FastAPI, CountingRpc]:
    """The webhook app on `queue` over a client of its own whose RPCs are counted (and can be
    held); `webhook`: WebhookSettings fields besides the token."""
    client = await own_client(env)
    rpc = CountingRpc(client)
    app = create_app(
        settings_for(env, queue), client, webhook=WebhookSettings(webhook_token=TOKEN, **webhook)
    )
    return app, rpc


async def recorded(client: Client, workflow_id: str) -> list[str]:
    """Fingerprints of the `alert` / `alerts` signals in the workflow's history, in order."""
    history = await client.get_workflow_handle(workflow_id).fetch_history()
    out: list[str] = []
    for e in history.events:
        if e.event_type != EventType.EVENT_TYPE_WORKFLOW_EXECUTION_SIGNALED:
            continue
        attrs = e.workflow_execution_signaled_event_attributes
        data = json.loads(attrs.input.payloads[0].data)
        if attrs.signal_name == SIG_ALERTS:
            out.extend(d["fingerprint"] for d in data)
        elif attrs.signal_name == SIG_ALERT:
            out.append(data["fingerprint"])
    return out


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


async def test_storm_coalesces_calls_per_workflow(dev_env: WorkflowEnvironment) -> None:
    queue = f"storm-{uuid.uuid4().hex[:8]}"
    app, rpc = await counted_app(dev_env, queue)
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
    # How many calls depends on timing (which alerts arrive while a workflow's call is in
    # flight), never more than one per distinct alert nor fewer than one per workflow.
    assert 10 <= rpc.total <= len(distinct), rpc.calls
    assert rpc.max_inflight_per_workflow == 1
    assert sum(n for _name, n in rpc.sent) == len(distinct)  # each distinct alert sent once
    assert sum(b["started"] + b["signalled"] for b in bodies) == len(distinct)
    assert sum(b["duplicates"] for b in bodies) == len(alerts) - len(distinct)
    assert f'sickbay_webhook_temporal_calls_total{{call="signal-with-start"}} {rpc.total}.0' in (
        metrics
    )

    assert await count_runs(dev_env.client, f"TaskQueue = '{queue}'", expect=10) == 10
    for node, gpu in devices:
        wid = device_workflow_id(node, gpu)
        fingerprints = await recorded(dev_env.client, wid)
        assert sorted(set(fingerprints)) == [f"{node}-{v}" for v in range(4)]  # none lost
        await dev_env.client.get_workflow_handle(wid).terminate("test done")


async def test_failed_delivery_is_never_cached(dev_env: WorkflowEnvironment) -> None:
    app, rpc = await counted_app(
        dev_env, f"refused-{uuid.uuid4().hex[:8]}", webhook_temporal_timeout=5.0
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


async def _until(check: Callable[[], bool], what: str) -> None:
    """Poll a condition of the webhook's own state (real time, generous bound for a loaded
    machine: nothing here waits on a clock, only on requests reaching the handler)."""
    for _ in range(3000):
        if check():
            return
        await asyncio.sleep(0.01)
    raise AssertionError(f"timed out waiting: {what}")


async def test_held_call_coalesces_the_next_deliveries(dev_env: WorkflowEnvironment) -> None:
    app, rpc = await counted_app(
        dev_env, f"coalesce-{uuid.uuid4().hex[:8]}", webhook_temporal_timeout=60.0
    )
    service = app.state.service
    node, gpu = unique_device()
    wid = device_workflow_id(node, gpu)
    first = xid_alert(node, gpu)
    more = [xid_alert(node, gpu, fingerprint=f"fp-{node}-{k}") for k in range(3)]
    resolved = xid_alert(node, gpu, status="resolved", endsAt="2026-11-29T10:05:00Z")
    notifications = [
        payload(more[0], more[1], first),  # two new ones + a duplicate of the held one
        payload(more[2], more[0]),  # a new one + one already queued by the previous
        payload(resolved, status="resolved"),
    ]
    async with serve(app) as url, httpx.AsyncClient(base_url=url, timeout=90) as http:
        rpc.hold = True
        held = asyncio.ensure_future(
            http.post("/v1/alertmanager", json=payload(first), headers=auth())
        )
        await _until(lambda: rpc.total == 1, "the first call reached the RPC")
        posts = []
        for body in notifications:  # one after the other, so the queue order is known
            posts.append(
                asyncio.ensure_future(http.post("/v1/alertmanager", json=body, headers=auth()))
            )
            queued = 1 + len(posts)  # 2 new, then 1 new (+1 joined), then the resolved one

            def queued_now(q: int = queued) -> bool:
                return wid in service.lanes and len(service.lanes[wid].queued) == q

            await _until(
                queued_now, "the notification's new deliveries queued behind the held call"
            )
        assert rpc.total == 1 and not any(p.done() for p in [held, *posts])  # none answered
        rpc.release()
        resps = [await held, *(await asyncio.gather(*posts))]
        repeat = await http.post("/v1/alertmanager", json=notifications[0], headers=auth())
        metrics = (await http.get("/metrics")).text
    assert [r.status_code for r in resps] == [200] * 4, [r.text for r in resps]
    bodies = [r.json() for r in resps]
    assert [b["accepted"] for b in bodies] == [1, 3, 2, 1]
    assert bodies[0]["started"] == 1
    assert [r["via"] for r in bodies[1]["results"] if r["result"] == "duplicate"] == ["in-flight"]
    assert bodies[3]["resolved_signalled"] == 1
    # The held call, ONE call for the three firing alerts queued meanwhile, the resolved one.
    assert rpc.sent == [(SIG_ALERT, 1), (SIG_ALERTS, 3), (SIG_ALERT_RESOLVED, 1)]
    assert rpc.max_inflight_per_workflow == 1
    assert 'sickbay_webhook_temporal_call_alerts_bucket{le="3.0"} 3.0' in metrics
    assert 'sickbay_webhook_temporal_call_alerts_bucket{le="2.0"} 2.0' in metrics
    assert repeat.status_code == 200 and repeat.json()["duplicates"] == 3
    assert rpc.total == 3  # the repeat was answered from the cache
    assert await recorded(dev_env.client, wid) == [first["fingerprint"]] + [
        a["fingerprint"] for a in more
    ]
    await dev_env.client.get_workflow_handle(wid).terminate("test done")


async def test_failed_batch_fails_every_alert_it_carried(dev_env: WorkflowEnvironment) -> None:
    app, rpc = await counted_app(
        dev_env, f"batch-fail-{uuid.uuid4().hex[:8]}", webhook_temporal_timeout=60.0
    )
    service = app.state.service
    node, gpu = unique_device()
    wid = device_workflow_id(node, gpu)
    alerts = [xid_alert(node, gpu, fingerprint=f"fp-{node}-{k}") for k in range(4)]
    bodies = [payload(alerts[0]), payload(alerts[1], alerts[2]), payload(alerts[3])]
    async with serve(app) as url, httpx.AsyncClient(base_url=url, timeout=90) as http:
        rpc.hold = True
        posts = [
            asyncio.ensure_future(http.post("/v1/alertmanager", json=bodies[0], headers=auth()))
        ]
        await _until(lambda: rpc.total == 1, "the first call reached the RPC")
        for body in bodies[1:]:
            posts.append(
                asyncio.ensure_future(http.post("/v1/alertmanager", json=body, headers=auth()))
            )
        await _until(
            lambda: wid in service.lanes and len(service.lanes[wid].queued) == 3,
            "three deliveries queued behind the held call",
        )
        rpc.refuse = True
        rpc.release()
        down = await asyncio.gather(*posts)
        assert rpc.sent == [(SIG_ALERT, 1), (SIG_ALERTS, 3)]
        assert [r.status_code for r in down] == [503] * 3
        for r, body in zip(down, bodies, strict=True):
            data = r.json()
            assert data["accepted"] == 0 and data["duplicates"] == 0
            assert sorted(f["fingerprint"] for f in data["failed"]) == sorted(
                a["fingerprint"] for a in body["alerts"]
            )
            assert {f["reason"] for f in data["failed"]} == {"temporal-unavailable"}
        assert len(service.recent) == 0 and not service.recent.inflight and not service.lanes

        rpc.refuse = False
        again = await asyncio.gather(
            *(http.post("/v1/alertmanager", json=b, headers=auth()) for b in bodies)
        )
        assert [r.status_code for r in again] == [200] * 3, [r.text for r in again]
        assert sum(r.json()["duplicates"] for r in again) == 0  # real calls, not memory
        assert sum(r.json()["started"] for r in again) == 1
    assert sorted(await recorded(dev_env.client, wid)) == sorted(a["fingerprint"] for a in alerts)
    await dev_env.client.get_workflow_handle(wid).terminate("test done")


async def test_queued_delivery_nobody_waits_for_is_dropped(dev_env: WorkflowEnvironment) -> None:
    # One call slot, so B queues behind A; 0.5 s: both notifications give up while A is held
    # at the RPC (the hold, not the clock, decides what happens next).
    app, rpc = await counted_app(
        dev_env,
        f"dropped-{uuid.uuid4().hex[:8]}",
        webhook_concurrency=1,
        webhook_temporal_timeout=0.5,
    )
    service = app.state.service
    (node_a, gpu_a), (node_b, gpu_b) = unique_device(), unique_device()
    body_a, body_b = payload(xid_alert(node_a, gpu_a)), payload(xid_alert(node_b, gpu_b))
    wid_a, wid_b = device_workflow_id(node_a, gpu_a), device_workflow_id(node_b, gpu_b)
    async with serve(app) as url, httpx.AsyncClient(base_url=url, timeout=60) as http:
        rpc.hold = True
        post_a = asyncio.ensure_future(http.post("/v1/alertmanager", json=body_a, headers=auth()))
        await _until(lambda: rpc.total == 1, "A's call reached the RPC")
        resp_b = await http.post("/v1/alertmanager", json=body_b, headers=auth())
        resp_a = await post_a
        assert (resp_a.status_code, resp_b.status_code) == (503, 503)
        assert [f["reason"] for f in resp_b.json()["failed"]] == ["temporal-timeout"]
        rpc.release()
        await _until(lambda: not service.lanes, "both lanes finished")
        metrics = (await http.get("/metrics")).text
        assert "sickbay_webhook_deliveries_dropped_total 1.0" in metrics
        assert rpc.total == 1  # B was never sent
        again_a = await http.post("/v1/alertmanager", json=body_a, headers=auth())
        assert again_a.status_code == 200 and again_a.json()["duplicates"] == 1  # remembered
        again_b = await http.post("/v1/alertmanager", json=body_b, headers=auth())
        assert again_b.status_code == 200 and again_b.json()["started"] == 1, again_b.text
        assert rpc.total == 2
    for wid, body in ((wid_a, body_a), (wid_b, body_b)):
        assert await recorded(dev_env.client, wid) == [body["alerts"][0]["fingerprint"]]
        await dev_env.client.get_workflow_handle(wid).terminate("test done")


async def test_temporal_down_then_back_delivers(temporal_cli_path: str) -> None:
    port = free_port()
    env = await start_dev_server(temporal_cli_path, port)
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
            env = await start_dev_server(temporal_cli_path, port)  # empty: in-memory store
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
