"""Alertmanager's repeats of an alert a closed remediation already handled (real workflow with
the name-matched fakes of tests/workflows/fakes.py, on the dev server, webhook over HTTP).

Alertmanager re-sends a firing alert (repeat_interval, group_interval, retries) with the same
fingerprint and startsAt. Whether an earlier run handled it is decided from Temporal (the
closed run's result lists the instances it handled), not from the webhook's memory: the cache
is off here, and a second webhook app (a restart, another replica) decides the same.

Cases:
- Xid 13 (application): one run, closed; its repeats -> `already-handled`, no new run, no page;
- the same alert with a later startsAt (a new firing after resolution) starts a new run;
- ECC double-bit after `repaired`: the repeat never re-quarantines (one quarantine call).
"""

from __future__ import annotations

import uuid
from typing import Any

import httpx
import pytest
from temporalio.testing import WorkflowEnvironment

from contract.names import ACT_NOTIFY, ACT_QUARANTINE, SIG_REPAIRED, device_workflow_id
from contract.remediation import Phase, RemediationResult, RepairedRequest
from tests.webhook.helpers import TOKEN, auth, count_runs, payload, serve, settings_for, xid_alert
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
            for _ in range(3):
                again = await post(url, alert)
                assert again["started"] == 0 and again["already_handled"] == 1
                assert [r["result"] for r in again["results"]] == ["already-handled"]
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
