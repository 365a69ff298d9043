"""Dry runs change nothing on any path; the Web UI's list view says what each run is doing.

Cases:
- dry run with a mistyped GPU UUID (resolve-device: DeviceNotFound): nobody paged, no Event,
  closes `dry-run` saying it would have escalated (and to whom);
- dry run of an application Xid (the runbook says notify): no Event on the pods, no page;
- dry run of a runbook that itself says `dryRun: true`: same guarantees;
- the `SickbayOutcome` search attribute at the end (released, escalated, dry-run) and
  `SickbayEscalation` once escalated, so "which ones escalated" is a list-view filter;
- current details (phase, what it waits for, until when, what comes next) while holding;
- the approval wait has a timeline entry, and its timer a name (not "1 (15m)"); so do the
  budget retry and the hold's health-check timers; regular activities carry a summary.
"""

from __future__ import annotations

from typing import Any

from temporalio import activity
from temporalio.api.enums.v1 import EventType
from temporalio.api.sdk.v1 import WorkflowMetadata
from temporalio.client import WorkflowHandle
from temporalio.converter import DefaultPayloadConverter
from temporalio.exceptions import ApplicationError
from temporalio.testing import WorkflowEnvironment

from contract.errors import ERR_DEVICE_NOT_FOUND
from contract.names import (
    ACT_CLAIM_ESCALATION,
    ACT_NOTIFY,
    ACT_QUARANTINE,
    ACT_RECORD_EVENT,
    ACT_RESOLVE_DEVICE,
    SA_ESCALATION,
    SA_OUTCOME,
    SIG_ABORT,
    SIG_REPAIRED,
    UPD_APPROVE,
)
from contract.remediation import (
    AbortRequest,
    ApprovalDecision,
    ApprovalResult,
    Phase,
    RepairedRequest,
)
from tests.workflows.fakes import (
    FakeWorld,
    make_runbook,
    new_worker,
    shipped_runbooks,
    start,
    wait_phase,
    xid_alert,
)

# A dry run pages nobody, writes no Event, taints nothing and claims no page (a claim would
# suppress a real page for the same cause on the node later).
SIDE_EFFECTS = (ACT_NOTIFY, ACT_RECORD_EVENT, ACT_QUARANTINE, ACT_CLAIM_ESCALATION)


async def _history(handle: WorkflowHandle[Any, Any]) -> list[Any]:
    return [e async for e in handle.fetch_history_events()]


def _summaries(events: list[Any], kind: int) -> list[str]:
    conv = DefaultPayloadConverter()
    out = []
    for e in events:
        if e.event_type == kind and e.user_metadata.HasField("summary"):
            out.append(conv.from_payload(e.user_metadata.summary, str))
    return out


async def test_dry_run_with_unknown_device_pages_nobody(
    time_skipping_env: WorkflowEnvironment,
) -> None:
    client = time_skipping_env.client
    world = FakeWorld()

    @activity.defn(name=ACT_RESOLVE_DEVICE)
    async def not_found(req: object) -> None:
        raise ApplicationError(
            "no ResourceSlice device has uuid GPU-typo",
            type=ERR_DEVICE_NOT_FOUND,
            non_retryable=True,
        )

    from temporalio.worker import Worker

    from workflows.budget import BudgetWorkflow
    from workflows.remediation import DeviceRemediationWorkflow

    async with Worker(
        client,
        task_queue="tq-dry-not-found",
        workflows=[DeviceRemediationWorkflow, BudgetWorkflow],
        activities=world.activities(not_found),
    ) as worker:
        handle = await start(client, worker, world, dry_run=True)
        result = await handle.result()
        desc = await handle.describe()
    assert not any(n in world.names() for n in SIDE_EFFECTS), world.names()
    assert result.outcome == "dry-run"
    assert "would escalate: error" in result.reason and "DeviceNotFound" in result.reason
    would = next(e for e in result.timeline if e.action == "dry run: would escalate")
    assert "pagerduty" in would.reason and "nothing was sent" in would.reason
    assert desc.search_attributes.get(SA_OUTCOME) == ["dry-run"]
    assert SA_ESCALATION not in desc.search_attributes  # nobody was actually told


async def test_dry_run_of_application_xid_writes_no_event(
    time_skipping_env: WorkflowEnvironment,
) -> None:
    client = time_skipping_env.client
    world = FakeWorld(health="Healthy")
    async with new_worker(client, world) as worker:
        handle = await start(client, worker, world, alerts=[xid_alert(13, "fp-13")], dry_run=True)
        result = await handle.result()
    assert not any(n in world.names() for n in SIDE_EFFECTS), world.names()
    assert result.outcome == "dry-run"
    acts = [e.action for e in result.timeline]
    assert "dry run: would record Event" in acts and "dry run: would escalate" in acts


async def test_runbook_dry_run_pages_nobody(time_skipping_env: WorkflowEnvironment) -> None:
    """`dryRun: true` in the runbook (not the input) keeps the same guarantees."""
    client = time_skipping_env.client
    others = [r for r in shipped_runbooks() if r.name != "inference"]
    world = FakeWorld(
        health="Healthy",
        runbooks=[
            *others,
            make_runbook(
                "inference",
                100,
                match={"ownerKinds": ["Deployment"]},
                dryRun=True,
                escalation={"channels": ["pagerduty"]},
            ),
        ],
    )
    async with new_worker(client, world) as worker:
        handle = await start(client, worker, world, alerts=[xid_alert(13, "fp-13b")])
        result = await handle.result()
    assert not any(n in world.names() for n in SIDE_EFFECTS), world.names()
    assert result.outcome == "dry-run" and result.status.dry_run


async def test_outcome_and_escalation_search_attributes(
    time_skipping_env: WorkflowEnvironment,
) -> None:
    client = time_skipping_env.client
    released, escalated = FakeWorld(), FakeWorld(budget_granted=False)
    async with new_worker(client, released) as worker:
        handle = await start(client, worker, released)
        await wait_phase(handle, Phase.HOLDING)
        await handle.signal(SIG_REPAIRED, RepairedRequest(actor="alice"))
        await handle.result()
        ok = await handle.describe()
    async with new_worker(client, escalated) as worker:
        handle2 = await start(client, worker, escalated)
        await wait_phase(handle2, Phase.ESCALATED)
        open_desc = await handle2.describe()
        await handle2.signal(SIG_ABORT, AbortRequest(reason="test done", actor="t"))
        await handle2.result()
        aborted = await handle2.describe()
    assert ok.search_attributes.get(SA_OUTCOME) == ["released"]
    assert SA_ESCALATION not in ok.search_attributes
    assert open_desc.search_attributes.get(SA_ESCALATION) == ["budget-exhausted"]
    assert SA_OUTCOME not in open_desc.search_attributes
    assert aborted.search_attributes.get(SA_OUTCOME) == ["aborted"]
    assert aborted.search_attributes.get(SA_ESCALATION) == ["budget-exhausted"]


async def test_current_details_and_named_timers(time_skipping_env: WorkflowEnvironment) -> None:
    client = time_skipping_env.client
    others = [r for r in shipped_runbooks() if r.name != "inference"]
    world = FakeWorld(
        runbooks=[
            *others,
            make_runbook(
                "inference",
                100,
                match={"ownerKinds": ["Deployment"]},
                approval={"required": True, "timeout": "15m"},
            ),
        ]
    )
    async with new_worker(client, world) as worker:
        handle = await start(client, worker, world)
        waiting = await wait_phase(handle, Phase.AWAITING_APPROVAL)
        await handle.execute_update(
            UPD_APPROVE,
            ApprovalDecision(approve=True, actor="alice"),
            result_type=ApprovalResult,
        )
        holding = await wait_phase(handle, Phase.HOLDING)
        meta = await handle.query("__temporal_workflow_metadata", result_type=WorkflowMetadata)
        await handle.signal(SIG_REPAIRED, RepairedRequest(actor="alice"))
        result = await handle.result()
        events = await _history(handle)
    assert waiting.until is not None and "timed out: escalate" in waiting.next_action
    assert holding.until is not None and holding.next_action == "check the device's health"
    details = meta.current_details
    assert details.startswith("**holding**") and f"device {world.node}/" in details
    assert "waiting for: marked repaired or Healthy" in details and " UTC" in details
    assert "next: check the device's health" in details
    signals = {d.name: d.description for d in meta.definition.signal_definitions}
    assert signals["budget-freed"].startswith("internal")
    assert signals["abort"] and signals["repaired"]
    approval = next(e for e in result.timeline if e.action == "awaiting approval")
    assert approval.phase is Phase.AWAITING_APPROVAL and "15m" in approval.outcome
    timers = _summaries(events, EventType.EVENT_TYPE_TIMER_STARTED)
    assert "approval timeout (15m, then escalate)" in timers
    assert any(t.startswith("health check (") for t in timers)
    scheduled = _summaries(events, EventType.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED)
    assert scheduled and all(scheduled), scheduled


async def test_mistyped_abort_is_refused_in_the_timeline(
    time_skipping_env: WorkflowEnvironment,
) -> None:
    """An `abort` typed by hand without its `reason` (the SDK would drop it with only a worker
    log line) is refused in the timeline, naming the field; a well-formed one then works."""
    client = time_skipping_env.client
    world = FakeWorld()
    async with new_worker(client, world) as worker:
        handle = await start(client, worker, world)
        await wait_phase(handle, Phase.HOLDING)
        await handle.signal(SIG_ABORT, {"why": "typo", "actor": "alice"})
        await handle.signal(SIG_ABORT, {"reason": "GPU swapped", "actor": "alice"})
        result = await handle.result()
    refused = next(e for e in result.timeline if e.action == "abort signal refused")
    assert "reason: Field required" in refused.reason and "why: unknown field" in refused.reason
    assert result.outcome == "aborted" and "GPU swapped" in result.reason
