"""The webhook after a launch refused for bad input (real HTTP, Temporal dev server, worker with
activity fakes).

Case: a run started by hand with a typo'd field under the GPU's workflow id fails at once; the
next Alertmanager alert for that GPU starts a fresh run (the webhook reports it started, not
"signalled"), and that run remediates with the alert's evidence.
"""

from __future__ import annotations

import asyncio

import pytest
from temporalio.client import WorkflowExecutionStatus

from contract.names import SIG_ABORT, WF_REMEDIATE, device_workflow_id
from contract.remediation import AbortRequest, Phase
from tests.webhook.helpers import Served, auth, payload, unique_device, xid_alert
from tests.workflows.fakes import FakeWorld, new_worker, wait_phase

pytestmark = pytest.mark.devserver

DEADLINE_S = 60.0  # generous; the bad run fails within a workflow task


async def test_alert_after_bad_input_starts_a_fresh_run(served: Served) -> None:
    node, gpu = unique_device()
    world = FakeWorld(node=node, gpu_uuid=gpu)
    wid = device_workflow_id(node, gpu)
    async with new_worker(served.client, world, task_queue=served.settings.task_queue):
        bad = await served.client.start_workflow(
            WF_REMEDIATE,
            {"device": {"node": node, "gpu_uuid": gpu}, "dryrun": True},
            id=wid,
            task_queue=served.settings.task_queue,
        )
        loop = asyncio.get_running_loop()
        deadline = loop.time() + DEADLINE_S
        while (await bad.describe()).status == WorkflowExecutionStatus.RUNNING:
            assert loop.time() < deadline, "the bad-input run is still Running"
            await asyncio.sleep(0.05)
        assert (await bad.describe()).status == WorkflowExecutionStatus.FAILED

        resp = await served.http.post(
            "/v1/alertmanager", json=payload(xid_alert(node, gpu)), headers=auth()
        )
        assert resp.status_code == 200, resp.text
        body = resp.json()
        assert body["started"] == 1 and body["signalled"] == 0, body
        fresh = served.client.get_workflow_handle(wid)
        status = await wait_phase(fresh, Phase.HOLDING)
        assert (await fresh.describe()).run_id != bad.result_run_id
        await fresh.signal(SIG_ABORT, AbortRequest(reason="test done", actor="t"))
        await fresh.result()
    assert status.alerts == 1
