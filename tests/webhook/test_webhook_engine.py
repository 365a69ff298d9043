"""The webhook feeding the real remediation workflow (workflows/remediation/) on the dev server.

The workflow and its runbook loader are real; `resolve-device` is a stand-in that holds the
workflow in its first cluster step while the webhook posts, then reports the device missing so
the workflow closes and its final state can be queried (the Kubernetes activities have their
own tests against the twin).

Cases:
- the same Xid 79 notification 20 times, the webhook's recent-delivery cache off so every
  repeat reaches the workflow: one workflow, started by the first; its status counts 19
  duplicates (the workflow de-duplicates by fingerprint on its own)
- a second alert with another fingerprint for the same GPU is new evidence (2 alerts), not a
  new workflow
- a resolved alert shows up in the workflow's timeline
"""

from __future__ import annotations

import asyncio
import uuid
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest
from temporalio import activity
from temporalio.exceptions import ApplicationError
from temporalio.testing import WorkflowEnvironment
from temporalio.worker import Worker

from activities.runbooks import RunbookActivities
from contract.errors import ERR_DEVICE_NOT_FOUND
from contract.kube import ResolvedDevice, ResolveDeviceInput
from contract.names import ACT_RESOLVE_DEVICE, QRY_STATUS, QRY_TIMELINE, device_workflow_id
from contract.remediation import RemediationStatus, TimelineEntry
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
from worker.settings import PACKAGED_RUNBOOKS, WebhookSettings
from worker.webhook.app import create_app
from workflows.remediation import DeviceRemediationWorkflow

pytestmark = pytest.mark.devserver  # the session's Temporal dev server (dev_env)


class HeldResolver:
    """Stand-in for `resolve-device`: holds the workflow in its first cluster step until
    released (at the end of the test), then reports the device missing."""

    def __init__(self) -> None:
        self.release = asyncio.Event()

    @activity.defn(name=ACT_RESOLVE_DEVICE)
    async def resolve(self, req: ResolveDeviceInput) -> ResolvedDevice:
        await self.release.wait()
        raise ApplicationError(
            "stand-in: device not found", type=ERR_DEVICE_NOT_FOUND, non_retryable=True
        )


async def test_webhook_into_real_workflow(dev_env: WorkflowEnvironment) -> None:
    client = dev_env.client
    queue = f"engine-{uuid.uuid4().hex[:8]}"
    app = create_app(
        settings_for(dev_env, queue),
        client,
        # Cache off: this test is about the workflow's own de-duplication.
        webhook=WebhookSettings(webhook_token=TOKEN, webhook_dedup_seconds=0),
    )
    node, gpu = unique_device()
    wid = device_workflow_id(node, gpu)
    body = payload(xid_alert(node, gpu))
    held = HeldResolver()
    executor = ThreadPoolExecutor(max_workers=2)  # the runbook loader is a sync activity
    async with (
        Worker(
            client,
            task_queue=queue,
            workflows=[DeviceRemediationWorkflow],
            activities=[RunbookActivities(PACKAGED_RUNBOOKS).load_runbooks, held.resolve],
            activity_executor=executor,
        ),
        serve(app) as url,
        httpx.AsyncClient(base_url=url, timeout=30) as http,
    ):
        results = [
            (await http.post("/v1/alertmanager", json=body, headers=auth())).json()
            for _ in range(20)
        ]
        assert [r["started"] for r in results] == [1] + [0] * 19
        other = xid_alert(node, gpu)
        other["labels"]["alertname"] = "SickbayGpuEccDoubleBitError"
        other["fingerprint"] = "ecc-" + other["fingerprint"]
        resp = await http.post("/v1/alertmanager", json=payload(other), headers=auth())
        assert resp.json()["signalled"] == 1
        resolved = xid_alert(node, gpu, status="resolved", endsAt="2026-11-29T10:05:00Z")
        resp = await http.post(
            "/v1/alertmanager", json=payload(resolved, status="resolved"), headers=auth()
        )
        assert resp.json()["resolved_signalled"] == 1

        # Query the running workflow (held in its first cluster step) until it has taken
        # every signal: how the engine ends a missing device is not this test's business.
        handle = client.get_workflow_handle(wid)
        s = await handle.query(QRY_STATUS, result_type=RemediationStatus)
        async with asyncio.timeout(30):
            while (s.alerts, s.duplicate_alerts) != (2, 19):
                await asyncio.sleep(0.05)
                s = await handle.query(QRY_STATUS, result_type=RemediationStatus)
        assert s.node == node
        timeline = await handle.query(QRY_TIMELINE, result_type=list[TimelineEntry])
        assert any(e.action == "alert resolved" for e in timeline)
        await handle.terminate("test done")
        held.release.set()
    executor.shutdown()
    assert await count_runs(client, f"WorkflowId = '{wid}'", expect=1) == 1
