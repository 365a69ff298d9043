"""activities/launch.signal_with_start with a list of alerts (`evidence_list`), against the real
remediation workflow (fake activities) on the time-skipping server.

Cases:
- a list of three alerts (one a repeat of another's fingerprint) starts the workflow with ONE
  `alerts` signal; a second list ([a known one, a new one]) reaches the same run; the
  workflow's status (alerts, duplicate_alerts) and its alert timeline entries are exactly
  those the same five alerts give when sent one `alert` signal each (another device);
- a list of one is a plain `alert` signal (what older workers understand);
- an empty list, or a list together with `evidence`: a clear ValueError, nothing started.
"""

from __future__ import annotations

import pytest
from temporalio.client import Client
from temporalio.testing import WorkflowEnvironment

from activities.launch import signal_with_start
from contract.kube import DeviceRef
from contract.names import QRY_TIMELINE, SIG_ABORT, SIG_ALERT, SIG_ALERTS
from contract.remediation import (
    AbortRequest,
    AlertEvidence,
    Phase,
    RemediationInput,
    RemediationStatus,
    TimelineEntry,
)
from tests.webhook.helpers import signal_names
from tests.workflows.conftest import _search_attributes  # noqa: F401  (autouse: SAs registered)
from tests.workflows.fakes import FakeWorld, new_worker, wait_phase, xid_alert

ALERT_ACTIONS = ("evidence", "alert received")


async def _run(
    client: Client, sends: list[list[AlertEvidence]], *, batched: bool
) -> tuple[RemediationStatus, list[tuple[str, str, str, str]], list[str], set[str | None]]:
    """Send `sends` to a fresh device's remediation (each inner list one call if `batched`,
    else one call per alert); return its status, alert timeline, signal names and run ids."""
    world = FakeWorld()
    async with new_worker(client, world) as worker:
        inp = RemediationInput(
            device=DeviceRef(node=world.node, gpu_uuid=world.gpu_uuid), trigger="alert"
        )
        runs: set[str | None] = set()
        for group in sends:
            calls = [group] if batched else [[one] for one in group]
            for evidence in calls:
                res = await signal_with_start(
                    client, inp, task_queue=worker.task_queue, evidence_list=evidence
                )
                runs.add(res.run_id)
        handle = client.get_workflow_handle(res.workflow_id)
        status = await wait_phase(handle, Phase.HOLDING)
        timeline = await handle.query(QRY_TIMELINE, result_type=list[TimelineEntry])
        await handle.signal(SIG_ABORT, AbortRequest(reason="test done", actor="t"))
        await handle.result()
    alerts = [
        (t.action, t.outcome, t.actor, t.reason) for t in timeline if t.action in ALERT_ACTIONS
    ]
    return status, alerts, await signal_names(client, res.workflow_id), runs


async def test_alert_list_is_applied_like_single_alerts(
    time_skipping_env: WorkflowEnvironment,
) -> None:
    client = time_skipping_env.client
    a = xid_alert(79, "fp-a", summary="fell off the bus")
    b = xid_alert(48, "fp-b", summary="double-bit ECC")
    c = xid_alert(94, "fp-c", summary="contained ECC")
    sends = [[a, b, a.model_copy()], [b.model_copy(), c]]

    status, alerts, names, runs = await _run(client, sends, batched=True)
    assert names[:2] == [SIG_ALERTS, SIG_ALERTS]  # two calls, five alerts
    assert len(runs) == 1  # the second list signalled the running workflow
    assert (status.alerts, status.duplicate_alerts) == (3, 2)
    assert [outcome for _action, outcome, _actor, _reason in alerts] == [
        "Xid 79",
        "Xid 48",
        "Xid 94",
    ]

    one_by_one, single_alerts, single_names, _runs = await _run(client, sends, batched=False)
    assert single_names[:5] == [SIG_ALERT] * 5
    assert (status.alerts, status.duplicate_alerts) == (
        one_by_one.alerts,
        one_by_one.duplicate_alerts,
    )
    assert alerts == single_alerts


async def test_list_of_one_is_a_plain_alert_signal(time_skipping_env: WorkflowEnvironment) -> None:
    client = time_skipping_env.client
    _status, alerts, names, _runs = await _run(client, [[xid_alert(79, "fp-only")]], batched=True)
    assert names[0] == SIG_ALERT and SIG_ALERTS not in names
    assert len(alerts) == 1


async def test_bad_lists_are_refused(time_skipping_env: WorkflowEnvironment) -> None:
    inp = RemediationInput(device=DeviceRef(node="n1", gpu_uuid="GPU-x"), trigger="alert")
    with pytest.raises(ValueError, match="evidence_list"):
        await signal_with_start(time_skipping_env.client, inp, task_queue="x", evidence_list=[])
    with pytest.raises(ValueError, match="evidence_list"):
        await signal_with_start(
            time_skipping_env.client,
            inp,
            task_queue="x",
            evidence=xid_alert(),
            evidence_list=[xid_alert()],
        )
