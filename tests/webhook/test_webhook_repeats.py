"""Alertmanager's repeats of an alert a closed remediation already handled (real workflow with
the name-matched fakes of tests/workflows/fakes.py, on the dev server, webhook over HTTP).

Alertmanager re-sends a firing alert (repeat_interval, group_interval, retries) with the same
fingerprint and startsAt. Whether an earlier run handled it is decided from Temporal (the
closed run's result lists the instances it handled), not from the webhook's memory: the cache
is off here, and a second webhook app (a restart, another replica) decides the same.

Cases:
- Xid 13 (application): one run, closed; its repeats -> `already-handled`, no new run, no page;
- the same alert with a later startsAt (its series fired again after it resolved: a changed
  value) starts a new run;
- the same Xid under new labels after `repaired` (exporter restart: new `pod`; pod mapping:
  new `exported_pod`; a new fingerprint and a later startsAt) -> `already-handled`, no run, no
  page, no quarantine, and counted for `sickbay status`; another Xid starts a new run;
- ECC double-bit after `repaired`: the repeat never re-quarantines (one quarantine call);
- what the check costs (the webhook's `temporal_calls` counter): a run still running is
  signalled with one signal-with-start per lane call, nothing asked before it (the storm's
  case); only after a completed run does the server refuse that call and the webhook then
  read the closed run (describe + result) before deciding.
"""

from __future__ import annotations

import re
import uuid
from typing import Any

import httpx
import pytest
from temporalio.testing import WorkflowEnvironment

from contract.names import ACT_NOTIFY, ACT_QUARANTINE, SIG_REPAIRED, device_workflow_id
from contract.remediation import Phase, RemediationResult, RepairedRequest
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
from tests.workflows.fakes import FakeWorld, new_worker, wait_phase

pytestmark = pytest.mark.devserver


def app_for(env: WorkflowEnvironment, queue: str) -> Any:
    from worker.settings import WebhookSettings
    from worker.webhook.app import create_app

    return create_app(
        settings_for(env, queue),
        env.client,
        webhook=WebhookSettings(webhook_token=TOKEN, webhook_dedup_seconds=0),
    )


async def post(url: str, alert: dict[str, Any]) -> dict[str, Any]:
    async with httpx.AsyncClient(base_url=url, timeout=30) as http:
        resp = await http.post("/v1/alertmanager", json=payload(alert), headers=auth())
        assert resp.status_code == 200, resp.text
        body: dict[str, Any] = resp.json()
        return body


async def temporal_calls(url: str) -> dict[str, float]:
    """The webhook's Temporal calls so far, by kind (its /metrics)."""
    async with httpx.AsyncClient(base_url=url, timeout=30) as http:
        text = (await http.get("/metrics")).text
    found = re.findall(
        r'^sickbay_webhook_temporal_calls_total\{call="([^"]+)"\} (\S+)$', text, re.M
    )
    return {call: float(n) for call, n in found}


async def test_repeats_of_a_handled_alert_start_nothing(dev_env: WorkflowEnvironment) -> None:
    client = dev_env.client
    world = FakeWorld(health="Healthy", node=f"node-{uuid.uuid4().hex[:8]}")
    wid = device_workflow_id(world.node, world.gpu_uuid)
    alert = xid_alert(world.node, world.gpu_uuid)
    alert["labels"]["err_code"] = "13"
    async with new_worker(client, world) as worker:
        async with serve(app_for(dev_env, worker.task_queue)) as url:
            first = await post(url, alert)
            assert first["started"] == 1
            done = await client.get_workflow_handle(wid, result_type=RemediationResult).result()
            assert done.status.failure_class == "application"
            pages = len(world.args(ACT_NOTIFY))
            before = await temporal_calls(url)
            for _ in range(3):
                again = await post(url, alert)
                assert again["started"] == 0 and again["already_handled"] == 1
                assert [r["result"] for r in again["results"]] == ["already-handled"]
            calls = await temporal_calls(url)
            # Each repeat: a signal-with-start the server refuses (the run completed), then
            # the closed run read from Temporal (describe + result), nothing sent after it.
            for call in ("signal-with-start", "describe", "result"):
                assert calls.get(call, 0) - before.get(call, 0) == 3, (call, before, calls)
        # Another webhook process (restart, replica) decides the same from Temporal.
        async with serve(app_for(dev_env, worker.task_queue)) as url:
            again = await post(url, alert)
            assert again["already_handled"] == 1 and again["started"] == 0
            assert await count_runs(client, f"WorkflowId = '{wid}'", expect=1) == 1
            assert len(world.args(ACT_NOTIFY)) == pages  # no second page
            # A new firing (later startsAt) is a new incident: it starts a run.
            refired = dict(alert, startsAt="2026-11-29T11:00:00Z")
            assert (await post(url, refired))["started"] == 1
            await client.get_workflow_handle(wid, result_type=RemediationResult).result()
            assert await count_runs(client, f"WorkflowId = '{wid}'", expect=2) == 2


async def test_ecc_repeat_after_repaired_does_not_requarantine(
    dev_env: WorkflowEnvironment,
) -> None:
    client = dev_env.client
    world = FakeWorld(node=f"node-{uuid.uuid4().hex[:8]}")
    wid = device_workflow_id(world.node, world.gpu_uuid)
    alert = xid_alert(world.node, world.gpu_uuid)
    alert["labels"]["alertname"] = "SickbayGpuEccDoubleBitError"
    del alert["labels"]["err_code"]
    alert["annotations"]["value"] = "2.0028987341772155"
    async with (
        new_worker(client, world) as worker,
        serve(app_for(dev_env, worker.task_queue)) as url,
    ):
        assert (await post(url, alert))["started"] == 1
        handle = client.get_workflow_handle(wid, result_type=RemediationResult)
        # Quarantined and holding: a person marks it repaired, the run closes.
        await wait_phase(handle, Phase.HOLDING)
        assert ACT_QUARANTINE in world.names()
        await handle.signal(SIG_REPAIRED, RepairedRequest(actor="test"))
        result = await handle.result()
        assert result.status.failure_class == "unhealthy"
        again = await post(url, alert)  # the ECC alert still fires
        assert again["already_handled"] == 1 and again["started"] == 0
        assert len(world.args(ACT_QUARANTINE)) == 1


async def test_a_running_run_is_signalled_without_a_describe(dev_env: WorkflowEnvironment) -> None:
    """No worker polls this queue, so the run the first alert starts stays running: every
    later delivery (repeats, a second rule) is one signal-with-start that signals it, with no
    describe or result read before it, and never a second run."""
    client = dev_env.client
    node, gpu = unique_device()
    wid = device_workflow_id(node, gpu)
    queue = f"no-worker-{uuid.uuid4().hex[:8]}"
    async with serve(app_for(dev_env, queue)) as url:
        assert (await post(url, xid_alert(node, gpu)))["started"] == 1
        for n in range(4):
            body = await post(url, xid_alert(node, gpu, fingerprint=f"rule-{n % 2}"))
            assert body["signalled"] == 1 and body["started"] == 0
        calls = await temporal_calls(url)
    try:
        assert calls.get("signal-with-start") == 5
        assert calls.get("describe", 0) == 0 and calls.get("result", 0) == 0
        assert await count_runs(client, f"WorkflowId = '{wid}'", expect=1) == 1
    finally:
        await client.get_workflow_handle(wid).terminate("test done")


async def test_same_xid_under_new_labels_after_repaired_is_already_handled(
    dev_env: WorkflowEnvironment,
) -> None:
    from contract.names import QRY_REJECTIONS, rejections_workflow_id
    from contract.notify import RejectionsSummary

    client = dev_env.client
    world = FakeWorld(node=f"node-{uuid.uuid4().hex[:8]}")
    wid = device_workflow_id(world.node, world.gpu_uuid)
    alert = xid_alert(world.node, world.gpu_uuid)
    async with new_worker(client, world) as worker:
        app = app_for(dev_env, worker.task_queue)
        async with serve(app) as url:
            assert (await post(url, alert))["started"] == 1
            handle = client.get_workflow_handle(wid, result_type=RemediationResult)
            await wait_phase(handle, Phase.HOLDING)
            await handle.signal(SIG_REPAIRED, RepairedRequest(actor="test"))
            await handle.result()
            pages, quarantines = len(world.args(ACT_NOTIFY)), len(world.args(ACT_QUARANTINE))
            for n, label in enumerate(("pod", "exported_pod")):
                churned = xid_alert(world.node, world.gpu_uuid)
                churned["labels"][label] = f"dcgm-exporter-{n}x7k2q"
                churned["fingerprint"] = f"fp-churn-{n}"
                churned["startsAt"] = f"2026-11-29T1{n + 1}:00:00Z"
                again = await post(url, churned)
                assert again["already_handled"] == 1 and again["started"] == 0, again
            assert await count_runs(client, f"WorkflowId = '{wid}'", expect=1) == 1
            assert len(world.args(ACT_NOTIFY)) == pages
            assert len(world.args(ACT_QUARANTINE)) == quarantines
            assert await app.state.service.report_rejected() == 2
            summary = await client.get_workflow_handle(
                rejections_workflow_id(worker.task_queue)
            ).query(QRY_REJECTIONS, result_type=RejectionsSummary)
            [counted] = [r for r in summary.reasons if r.reason.startswith("already-handled")]
            assert counted.count == 2 and wid in counted.examples[0]
            # Another Xid on the same GPU is new evidence: a new incident.
            other = xid_alert(world.node, world.gpu_uuid)
            other["labels"]["err_code"] = "48"
            other["fingerprint"], other["startsAt"] = "fp-xid48", "2026-11-29T14:00:00Z"
            assert (await post(url, other))["started"] == 1
            await wait_phase(handle, Phase.HOLDING)
            await handle.signal(SIG_REPAIRED, RepairedRequest(actor="test"))
            await client.get_workflow_handle(wid, result_type=RemediationResult).result()


async def test_hostname_as_the_exporter_pod_after_repaired_is_already_handled(
    dev_env: WorkflowEnvironment,
) -> None:
    """dcgm-exporter without NODE_NAME labels `Hostname` with its own pod's name: the alert's
    id is not the device's, the run there resolves the device and hands the evidence over to
    the canonical id; after that id's run was repaired and completed, the same Xid is
    already handled there too: nothing started, quarantined or paged."""
    from activities.launch import LaunchActivities

    client = dev_env.client
    world = FakeWorld(node=f"node-{uuid.uuid4().hex[:8]}")
    wid = device_workflow_id(world.node, world.gpu_uuid)
    async with new_worker(client, world) as probe:
        queue = probe.task_queue
    launch = LaunchActivities(client, queue)
    async with (
        new_worker(
            client, world, extra_activities=[launch.signal_with_start_remediation], task_queue=queue
        ) as worker,
        serve(app_for(dev_env, worker.task_queue)) as url,
    ):
        assert (await post(url, xid_alert(world.node, world.gpu_uuid)))["started"] == 1
        handle = client.get_workflow_handle(wid, result_type=RemediationResult)
        await wait_phase(handle, Phase.HOLDING)
        await handle.signal(SIG_REPAIRED, RepairedRequest(actor="test"))
        await handle.result()
        pages, quarantines = len(world.args(ACT_NOTIFY)), len(world.args(ACT_QUARANTINE))
        exporter_pod = f"nvidia-dcgm-exporter-{uuid.uuid4().hex[:5]}"
        renamed = xid_alert(exporter_pod, world.gpu_uuid)
        renamed["startsAt"] = "2026-11-29T12:00:00Z"
        assert (await post(url, renamed))["started"] == 1  # under the exporter pod's id
        there = client.get_workflow_handle(
            device_workflow_id(exporter_pod, world.gpu_uuid), result_type=RemediationResult
        )
        closed = await there.result()
        assert closed.outcome == "not-quarantined" and "already handled" in closed.reason
        assert wid in closed.reason
        assert await count_runs(client, f"WorkflowId = '{wid}'", expect=1) == 1
        assert len(world.args(ACT_NOTIFY)) == pages
        assert len(world.args(ACT_QUARANTINE)) == quarantines
