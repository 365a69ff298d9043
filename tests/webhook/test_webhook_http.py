"""The Alertmanager webhook over real HTTP (uvicorn on loopback) against the Temporal dev server.

Cases:
- a DCGM Xid 79 notification starts exactly one workflow, with the evidence as its start signal
- the same notification 20 times: one workflow; with the recent-delivery cache (default) one
  `alert` signal and 19 answers from the cache; with the cache off (0 s) 20 signals (1 start
  + 19), the responses saying started once and signalled 19 times
- the same notification 10 times at once: one workflow, one signal (single-flight + cache)
- a resolved alert signals `alert-resolved` to the running workflow
- a resolved alert for a device with no workflow starts nothing and is reported as such
- an alert whose name is not configured, and one without UUID, are listed under `unmatched`
  and counted in /metrics, while a good alert in the same notification is handled
- a notification with alerts for two devices starts two workflows
- missing / wrong / non-ASCII bearer token: 401, nothing started
- body over the limit: 413 by Content-Length and by a chunked body without one
- not JSON: 400; JSON of the wrong shape: 422 with the problems listed
- /healthz and /metrics answer; metrics count received / accepted / started / signalled
"""

from __future__ import annotations

import asyncio
import json
import uuid

import httpx
import pytest
from temporalio.testing import WorkflowEnvironment

from contract.names import SIG_ALERT, SIG_ALERT_RESOLVED, device_workflow_id
from tests.webhook.helpers import (
    TOKEN,
    Served,
    auth,
    count_runs,
    history_counts,
    payload,
    serve,
    settings_for,
    signal_names,
    unique_device,
    xid_alert,
)
from worker.settings import WebhookSettings
from worker.webhook.app import create_app

pytestmark = pytest.mark.devserver  # the session's Temporal dev server (dev_env)


def _metric(text: str, name: str, **labels: str) -> float:
    """Value of one sample in Prometheus text format (0 when absent)."""
    want = ",".join(f'{k}="{v}"' for k, v in sorted(labels.items()))
    for line in text.splitlines():
        if line.startswith("#"):
            continue
        sample, _, value = line.rpartition(" ")
        if sample == (f"{name}{{{want}}}" if want else name):
            return float(value)
    return 0.0


async def test_xid79_starts_one_workflow(served: Served) -> None:
    node, gpu = unique_device()
    resp = await served.http.post(
        "/v1/alertmanager", json=payload(xid_alert(node, gpu)), headers=auth()
    )
    assert resp.status_code == 200, resp.text
    body = resp.json()
    wid = device_workflow_id(node, gpu)
    assert body["started"] == 1 and body["signalled"] == 0 and body["unmatched"] == []
    assert body["results"][0]["workflow_id"] == wid
    assert await history_counts(served.client, wid) == {"started": 1, "signaled": 1}
    assert await signal_names(served.client, wid) == [SIG_ALERT]
    desc = await served.client.get_workflow_handle(wid).describe()
    assert desc.workflow_type == "remediate-gpu-device"
    assert desc.task_queue == served.settings.task_queue
    # The start signal carries the mapped evidence.
    history = await served.client.get_workflow_handle(wid).fetch_history()
    signalled = [
        e for e in history.events if e.HasField("workflow_execution_signaled_event_attributes")
    ]
    data = json.loads(
        signalled[0].workflow_execution_signaled_event_attributes.input.payloads[0].data
    )
    assert data["xid"] == 79 and data["source"] == "alertmanager"
    assert data["fingerprint"] == f"fp-{node}-{gpu}"[:64]
    assert data["pod"] == {"namespace": "ml", "name": "trainer-0", "uid": None}
    await served.client.get_workflow_handle(wid).terminate("test done")


async def test_same_payload_twenty_times_one_workflow(served: Served) -> None:
    node, gpu = unique_device()
    body = payload(xid_alert(node, gpu))
    wid = device_workflow_id(node, gpu)
    results = []
    for _ in range(20):
        resp = await served.http.post("/v1/alertmanager", json=body, headers=auth())
        assert resp.status_code == 200, resp.text
        results.append(resp.json())
    assert [r["started"] for r in results] == [1] + [0] * 19
    assert sum(r["signalled"] for r in results) == 0
    assert [r["duplicates"] for r in results] == [0] + [1] * 19
    assert {r["results"][0]["via"] for r in results[1:]} == {"recent"}
    assert await history_counts(served.client, wid) == {"started": 1, "signaled": 1}
    assert await count_runs(served.client, f"WorkflowId = '{wid}'", expect=1) == 1
    await served.client.get_workflow_handle(wid).terminate("test done")


async def test_same_payload_twenty_times_cache_off(dev_env: WorkflowEnvironment) -> None:
    settings = settings_for(dev_env, f"webhook-test-{uuid.uuid4().hex[:8]}")
    app = create_app(
        settings,
        dev_env.client,
        webhook=WebhookSettings(webhook_token=TOKEN, webhook_dedup_seconds=0),
    )
    node, gpu = unique_device()
    body = payload(xid_alert(node, gpu))
    wid = device_workflow_id(node, gpu)
    results = []
    async with serve(app) as url, httpx.AsyncClient(base_url=url, timeout=30) as http:
        for _ in range(20):
            resp = await http.post("/v1/alertmanager", json=body, headers=auth())
            assert resp.status_code == 200, resp.text
            results.append(resp.json())
    assert sum(r["started"] for r in results) == 1 and results[0]["started"] == 1
    assert sum(r["signalled"] for r in results) == 19
    assert await history_counts(dev_env.client, wid) == {"started": 1, "signaled": 20}
    assert await count_runs(dev_env.client, f"WorkflowId = '{wid}'", expect=1) == 1
    await dev_env.client.get_workflow_handle(wid).terminate("test done")


async def test_concurrent_duplicates_still_one_workflow(served: Served) -> None:
    node, gpu = unique_device()
    body = payload(xid_alert(node, gpu))
    wid = device_workflow_id(node, gpu)
    resps = await asyncio.gather(
        *(served.http.post("/v1/alertmanager", json=body, headers=auth()) for _ in range(10))
    )
    assert [r.status_code for r in resps] == [200] * 10
    assert sum(r.json()["started"] for r in resps) == 1
    assert sum(r.json()["duplicates"] for r in resps) == 9
    # One delivery reached Temporal; the others joined it in flight or found it delivered.
    assert await history_counts(served.client, wid) == {"started": 1, "signaled": 1}
    assert await count_runs(served.client, f"WorkflowId = '{wid}'", expect=1) == 1
    await served.client.get_workflow_handle(wid).terminate("test done")


async def test_resolved_signals_running_workflow(served: Served) -> None:
    node, gpu = unique_device()
    wid = device_workflow_id(node, gpu)
    firing = xid_alert(node, gpu)
    assert (
        await served.http.post("/v1/alertmanager", json=payload(firing), headers=auth())
    ).status_code == 200
    resolved = xid_alert(node, gpu, status="resolved", endsAt="2026-11-29T10:05:00Z")
    resp = await served.http.post(
        "/v1/alertmanager", json=payload(resolved, status="resolved"), headers=auth()
    )
    assert resp.status_code == 200, resp.text
    assert resp.json()["resolved_signalled"] == 1
    assert await signal_names(served.client, wid) == [SIG_ALERT, SIG_ALERT_RESOLVED]
    await served.client.get_workflow_handle(wid).terminate("test done")


async def test_resolved_without_workflow_starts_nothing(served: Served) -> None:
    node, gpu = unique_device()
    wid = device_workflow_id(node, gpu)
    resolved = xid_alert(node, gpu, status="resolved", endsAt="2026-11-29T10:05:00Z")
    resp = await served.http.post(
        "/v1/alertmanager", json=payload(resolved, status="resolved"), headers=auth()
    )
    assert resp.status_code == 200, resp.text
    body = resp.json()
    assert body["resolved_no_workflow"] == 1 and body["started"] == 0
    assert body["results"][0]["result"] == "resolved-no-workflow"
    assert await count_runs(served.client, f"WorkflowId = '{wid}'") == 0


async def test_unmatched_alerts_reported_and_counted(served: Served) -> None:
    node, gpu = unique_device()
    other = xid_alert(node, gpu)
    other["labels"]["alertname"] = "NodeDiskFull"
    no_uuid = xid_alert(node, gpu)
    del no_uuid["labels"]["UUID"]
    no_uuid["fingerprint"] = "nouuid"
    good_node, good_gpu = unique_device()
    good = xid_alert(good_node, good_gpu)
    before = (await served.http.get("/metrics")).text
    resp = await served.http.post(
        "/v1/alertmanager", json=payload(other, no_uuid, good), headers=auth()
    )
    assert resp.status_code == 200, resp.text
    body = resp.json()
    assert body["received"] == 3 and body["accepted"] == 1 and body["started"] == 1
    reasons = {u["index"]: u["reason"] for u in body["unmatched"]}
    assert reasons == {0: "alertname-not-configured", 1: "missing-uuid"}
    assert body["unmatched"][0]["alertname"] == "NodeDiskFull"
    after = (await served.http.get("/metrics")).text
    for reason in ("alertname-not-configured", "missing-uuid"):
        name = "sickbay_webhook_alerts_rejected_total"
        assert _metric(after, name, reason=reason) == _metric(before, name, reason=reason) + 1
    assert await count_runs(served.client, f"WorkflowId = '{device_workflow_id(node, gpu)}'") == 0
    await served.client.get_workflow_handle(device_workflow_id(good_node, good_gpu)).terminate(
        "test done"
    )


async def test_two_devices_two_workflows(served: Served) -> None:
    (n1, g1), (n2, g2) = unique_device(), unique_device()
    resp = await served.http.post(
        "/v1/alertmanager", json=payload(xid_alert(n1, g1), xid_alert(n2, g2)), headers=auth()
    )
    assert resp.status_code == 200 and resp.json()["started"] == 2
    for node, gpu in ((n1, g1), (n2, g2)):
        wid = device_workflow_id(node, gpu)
        assert await history_counts(served.client, wid) == {"started": 1, "signaled": 1}
        await served.client.get_workflow_handle(wid).terminate("test done")


async def test_bad_token_401_nothing_started(served: Served) -> None:
    node, gpu = unique_device()
    body = payload(xid_alert(node, gpu))
    for headers in (
        {},
        auth("wrong-token"),
        {"Authorization": "Basic czNjcmV0"},
        {"Authorization": "Bearer"},
        {"Authorization": "Bearer s3cret-token-for-testś".encode()},  # non-ASCII bytes
    ):
        resp = await served.http.post("/v1/alertmanager", json=body, headers=headers)
        assert resp.status_code == 401, (headers, resp.text)
        assert resp.headers["www-authenticate"] == "Bearer"
    assert await count_runs(served.client, f"WorkflowId = '{device_workflow_id(node, gpu)}'") == 0


async def test_too_large_413(served: Served) -> None:
    node, gpu = unique_device()
    big = xid_alert(node, gpu)
    big["annotations"]["description"] = "x" * 300_000  # over the fixture's 256 KiB limit
    resp = await served.http.post("/v1/alertmanager", json=payload(big), headers=auth())
    assert resp.status_code == 413

    async def chunks():  # no Content-Length: the streamed size is what counts
        yield b'{"version": "4", "status": "firing", "alerts": ['
        for _ in range(40):
            yield b" " * 8192
        yield b"]}"

    resp = await served.http.post("/v1/alertmanager", content=chunks(), headers=auth())
    assert resp.status_code == 413
    assert await count_runs(served.client, f"WorkflowId = '{device_workflow_id(node, gpu)}'") == 0


async def test_malformed_400_422_with_problems(served: Served) -> None:
    resp = await served.http.post("/v1/alertmanager", content=b"{not json", headers=auth())
    assert resp.status_code == 400 and resp.json()["problems"]
    node, gpu = unique_device()
    bad = payload(xid_alert(node, gpu))
    bad["version"] = "3"
    bad["alerts"][0]["status"] = "exploded"
    del bad["alerts"][0]["startsAt"]
    resp = await served.http.post("/v1/alertmanager", json=bad, headers=auth())
    assert resp.status_code == 422
    locs = {p["loc"] for p in resp.json()["problems"]}
    assert {"version", "alerts.0.status", "alerts.0.startsAt"} <= locs
    assert await count_runs(served.client, f"WorkflowId = '{device_workflow_id(node, gpu)}'") == 0


async def test_healthz_and_metrics(served: Served) -> None:
    resp = await served.http.get("/healthz")
    assert resp.status_code == 200 and resp.json() == {"status": "ok", "temporal_connected": True}
    node, gpu = unique_device()
    before = (await served.http.get("/metrics")).text
    first = xid_alert(node, gpu)
    second = xid_alert(node, gpu, fingerprint="second-rule")
    for body in (payload(first), payload(second), payload(first)):
        assert (
            await served.http.post("/v1/alertmanager", json=body, headers=auth())
        ).status_code == 200
    after = (await served.http.get("/metrics")).text

    def delta(name: str, **labels: str) -> float:
        return _metric(after, name, **labels) - _metric(before, name, **labels)

    name = "sickbay_webhook_workflows_total"
    assert delta(name, result="started") == 1
    assert delta(name, result="signalled") == 1
    assert delta("sickbay_webhook_alerts_deduplicated_total", via="recent") == 1
    assert delta("sickbay_webhook_temporal_calls_total", call="signal-with-start") == 2
    received = "sickbay_webhook_alerts_received_total"
    assert delta(received, status="firing") == 3
    count = "sickbay_webhook_request_seconds_count"
    assert _metric(after, count) >= _metric(before, count) + 3
    await served.client.get_workflow_handle(device_workflow_id(node, gpu)).terminate("test done")
