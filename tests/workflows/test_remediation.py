"""DeviceRemediationWorkflow on the time-skipping server with name-matched activity fakes.

Cases (one per branch of the procedure):
- happy path: Xid 79 under a Deployment -> inference runbook -> NoExecute rule -> consumers
  gone -> replacement Running -> hold -> repaired -> rule removed, lease released; history
  event count <= 60; search attributes kept current;
- healthy for the cool-down releases without a person;
- application Xid 13: no taint, owner told (Event + notification), closes not-quarantined;
  the lease asked for concurrently is given back; a refused one is withdrawn, no escalation;
  a failed give-back is logged and left to the budget's reconcile (no page);
- concurrent confirm: the lease is asked while the evidence is still coming;
- stale evidence: an alert that started hours ago for a device now Healthy -> no taint;
- budget exhausted: no taint, escalated once, timeline says why; the run stays open waiting
  for a slot, absorbs repeated alerts as signals (no second escalation), retries the lease
  every minute and closes on repaired (never quarantined, nothing released);
- budget freed while waiting: the lease is retried, granted, and the procedure continues to
  quarantine; alert resolved + Healthy while waiting closes it; abort while waiting closes it;
- budget service unreachable (the acquire activity keeps failing): escalated "budget service
  unavailable", the run waits instead of failing, and proceeds once the budget answers;
- approval: timeout -> escalate (no taint); approve update -> quarantine; approve rejected by
  the validator outside the approval phase;
- eviction timeout -> force (delete) -> gone -> continue;
- eviction-api mode: NoSchedule rule, Eviction API, NoExecute backstop after the timeout;
- eviction-api mode, a PodDisruptionBudget blocks (force: none): retried for the whole timeout,
  then escalated `eviction-timeout` naming the budget and held, never backstopped past it;
  with force: noexecute the backstop goes past the budget (explicit choice);
- Pending deadline -> scale-up -> capacity -> replacement Running;
- scale-up at max -> escalate no-capacity;
- eviction churn reported -> the loop is stopped per replacement.onChurn (cordon by default:
  node cordoned before the churn escalation, which says so, and uncordoned on release;
  noschedule: the rule switched to NoSchedule), then escalate churn;
- eviction-api mode on a scheduler ignoring the rule (the watch reports one replacement
  bound to the device under NoSchedule as churn, as it does against the twin): the node is
  cordoned, the bound replacement evicted off the device, the escalation names
  kubernetes#139651 and what was done; never `pending-deadline`; onChurn noschedule there
  says the rule is NoSchedule already and changes nothing;
- abort while holding -> rule removed, lease released, aborted;
- failing notification channel: retried, each try in the timeline, one escalation;
- a non-retryable quarantine error ends in escalation, not a silent stop; so does an unknown
  device (before any runbook is chosen: escalated through `default`);
- dry run: preview only, nothing tainted;
- approval rejected -> escalated, no taint, lease returned; scale-up waits for its approval,
  and a rejected scale-up escalates and holds the quarantined device until released;
- a long hold continues-as-new and still releases; a non-canonical launch hands over to the
  canonical workflow; a runbook's escalation filter suppresses pages it does not want.
"""

from __future__ import annotations

import uuid
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from temporalio import activity
from temporalio.api.enums.v1 import EventType
from temporalio.client import (
    WorkflowExecutionStatus,
    WorkflowFailureError,
    WorkflowUpdateFailedError,
)
from temporalio.exceptions import ApplicationError
from temporalio.testing import WorkflowEnvironment

from activities.kube import KubeActivities
from contract.budget import BudgetDecision
from contract.capacity import CapacityResult
from contract.errors import ERR_FORBIDDEN, ERR_POOL_AT_MAX
from contract.kube import (
    ChurnDiagnosis,
    EvictionReport,
    EvictPodsResult,
    OwnerRef,
    PodRef,
    PodState,
    QuarantineInput,
    QuarantineResult,
    ReplacementReport,
    WaitReplacementInput,
)
from contract.names import (
    ACT_ACQUIRE_BUDGET,
    ACT_CHECK_HEALTH,
    ACT_CORDON,
    ACT_COUNT_DEVICES,
    ACT_EVICT_PODS,
    ACT_GATHER_EVIDENCE,
    ACT_NOTIFY,
    ACT_PREVIEW_QUARANTINE,
    ACT_QUARANTINE,
    ACT_RECORD_EVENT,
    ACT_RELEASE_BUDGET,
    ACT_RELEASE_QUARANTINE,
    ACT_REQUEST_CAPACITY,
    ACT_WAIT_EVICTION,
    ACT_WAIT_REPLACEMENT,
    QRY_TIMELINE,
    SIG_ABORT,
    SIG_ALERT,
    SIG_ALERT_RESOLVED,
    SIG_REPAIRED,
    UPD_APPROVE,
    taint_rule_name,
)
from contract.remediation import (
    AbortRequest,
    AlertResolved,
    ApprovalDecision,
    ApprovalResult,
    Phase,
    RemediationResult,
    RepairedRequest,
    TimelineEntry,
)
from tests.workflows.conftest import register_search_attributes
from tests.workflows.fakes import (
    NODE,
    FakeWorld,
    deployment_consumer,
    fake_of,
    make_runbook,
    new_worker,
    past_deadline,
    shipped_runbooks,
    start,
    wait_phase,
    watch_until_cancelled,
    xid_alert,
)
from tests.workflows.histories import patch_markers, save_history, scheduled_heartbeats
from workflows.remediation.eviction import FORCE_GRACE


@pytest.fixture
async def time_skipping_env(own_time_skipping_env: WorkflowEnvironment) -> WorkflowEnvironment:
    """One server per test here: twice in a full run (2026-12-07) this module's shared server
    ran its clock ~180 years ahead after one test, and every later test failed or hung."""
    await register_search_attributes(own_time_skipping_env)
    return own_time_skipping_env


@pytest.fixture(autouse=True)
def _search_attributes() -> None:
    """Registered with each test's own server (above), not once per module."""


def actions(result_timeline: list[TimelineEntry]) -> list[str]:
    return [e.action for e in result_timeline]


def with_spec(name: str, **spec: object) -> list:
    """Shipped runbooks with `name` replaced by one built from `spec`."""
    others = [r for r in shipped_runbooks() if r.name != name]
    base = next(r for r in shipped_runbooks() if r.name == name)
    return [
        *others,
        make_runbook(name, base.spec.precedence, match={"ownerKinds": ["Deployment"]}, **spec),
    ]


async def test_happy_path(time_skipping_env: WorkflowEnvironment) -> None:
    client = time_skipping_env.client
    world = FakeWorld()
    async with new_worker(client, world, replay_every_task=True) as worker:
        handle = await start(client, worker, world)
        status = await wait_phase(handle, Phase.HOLDING)
        assert status.runbook == "inference" and status.failure_class == "unhealthy"
        await handle.signal(SIG_REPAIRED, RepairedRequest(actor="alice", note="GPU reseated"))
        result = await handle.result()

    assert result.outcome == "released"
    q = world.args(ACT_QUARANTINE)
    assert len(q) == 1 and q[0].effect == "NoExecute" and q[0].taint_value == "unhealthy"
    assert q[0].consumers[0].name == "llm-7d9f-abcde"
    assert world.args(ACT_WAIT_EVICTION)[0].timeout == timedelta(minutes=2)  # inference runbook
    assert [w.look_once for w in world.args(ACT_WAIT_REPLACEMENT)] == [False]  # Running at once
    assert world.args(ACT_WAIT_REPLACEMENT)[0].owners[0].kind == "Deployment"
    assert world.names().index(ACT_RELEASE_QUARANTINE) < world.names().index(ACT_RELEASE_BUDGET)
    assert ACT_NOTIFY not in world.names() and ACT_EVICT_PODS not in world.names()
    acts = actions(result.timeline)
    assert acts[0] == "evidence" and acts[-1] == "closed"
    assert "marked repaired" in acts and "quarantine released" in acts
    assert result.status.phase is Phase.CLOSED

    history = await handle.fetch_history()
    events = history.events
    assert len(events) <= 60, f"happy path took {len(events)} history events"
    upserts = [
        e.upsert_workflow_search_attributes_event_attributes
        for e in events
        if e.event_type == EventType.EVENT_TYPE_UPSERT_WORKFLOW_SEARCH_ATTRIBUTES
    ]
    # Nothing is released: no `workflow.patched` branch (nor the SDK's TemporalChangeVersion
    # upsert that comes with one) in a run of today's code.
    assert patch_markers(history) == []
    assert all("TemporalChangeVersion" not in u.search_attributes.indexed_fields for u in upserts)
    assert upserts, "search attributes never upserted"
    first = upserts[0].search_attributes.indexed_fields
    assert set(first) >= {"SickbayPhase", "SickbayDevice", "SickbayNode", "SickbayWorkloadClass"}
    last = upserts[-1].search_attributes.indexed_fields
    assert last["SickbayPhase"].data == b'"closed"'
    save_history("happy_path", history)


async def test_healthy_for_cooldown_releases(time_skipping_env: WorkflowEnvironment) -> None:
    client = time_skipping_env.client
    world = FakeWorld(later_health="Healthy")
    async with new_worker(client, world) as worker:
        handle = await start(client, worker, world)
        result = await handle.result()  # time skips through the 5m checks and 30m cool-down
    assert result.outcome == "released"
    assert "healthy for the cool-down" in actions(result.timeline)
    healthy = next(e for e in result.timeline if e.action == "device Healthy")
    assert healthy.reason == "cool-down 30m starts"  # a duration as people write it
    checks = world.args(ACT_CHECK_HEALTH)
    assert 7 <= len(checks) <= 8  # 30m cool-down at a 5m interval: first Healthy + 6 more
    assert ACT_RELEASE_QUARANTINE in world.names()


async def test_healthy_cooldown_mode_releases_only_on_health(
    time_skipping_env: WorkflowEnvironment,
) -> None:
    """release.mode healthy-cooldown: a `repaired` mark does not release a device that still
    reports Unhealthy (it is noted in the timeline); the device staying Healthy for the
    cool-down does. (Mode `either` releases on the mark: test_happy_path.)"""
    client = time_skipping_env.client
    world = FakeWorld(
        runbooks=with_spec("inference", release={"mode": "healthy-cooldown", "cooldown": "30m"}),
        later_health="Unhealthy",
    )
    async with new_worker(client, world) as worker:
        handle = await start(client, worker, world)
        try:
            await wait_phase(handle, Phase.HOLDING)
            await handle.signal(SIG_REPAIRED, RepairedRequest(actor="alice", note="reseated"))
            await time_skipping_env.sleep(timedelta(minutes=16))
            timeline = await handle.query(QRY_TIMELINE, result_type=list[TimelineEntry])
            assert "repair noted" in actions(timeline)
            assert (await handle.describe()).status == WorkflowExecutionStatus.RUNNING
            assert ACT_RELEASE_QUARANTINE not in world.names()
            checks_while_unhealthy = len(world.args(ACT_CHECK_HEALTH))
            assert checks_while_unhealthy >= 3  # still checked every 5m after the mark
            world.later_health = "Healthy"
            result = await handle.result()
        except BaseException:
            # Nothing left running in the session's shared test server (its timers would
            # hold back time skipping for every later test).
            await handle.terminate("test failed")
            raise
        save_history("healthy_cooldown_mode", await handle.fetch_history())
    assert result.outcome == "released"
    assert result.reason == "healthy for the cool-down"
    assert len(world.args(ACT_CHECK_HEALTH)) >= checks_while_unhealthy + 7
    assert world.args(ACT_RELEASE_QUARANTINE)[0].reason == "healthy for the cool-down"


async def test_application_xid_does_not_taint(time_skipping_env: WorkflowEnvironment) -> None:
    client = time_skipping_env.client
    world = FakeWorld(health="Healthy")
    async with new_worker(client, world) as worker:
        handle = await start(client, worker, world, alerts=[xid_alert(13, "fp-13")])
        result = await handle.result()
        save_history("application_xid", await handle.fetch_history())
    assert result.outcome == "not-quarantined"
    assert result.status.failure_class == "application"
    assert ACT_QUARANTINE not in world.names()
    # The lease asked for concurrently with the evidence is given back, once.
    assert len(world.args(ACT_ACQUIRE_BUDGET)) == 1
    assert [r.holder for r in world.args(ACT_RELEASE_BUDGET)] == [handle.id]
    assert "budget lease released" in actions(result.timeline)
    event = world.args(ACT_RECORD_EVENT)[0]
    assert event.type == "Warning" and event.targets[0].name == "llm-7d9f-abcde"
    assert "NOT quarantined" in event.message
    notes = world.args(ACT_NOTIFY)
    # The owners' channel (default runbook: ownerChannels [slack]), never on-call's pagerduty.
    assert [n.channel for n in notes] == ["slack"] and notes[0].incident.severity == "warning"


async def test_result_lists_the_alert_instances_it_handled(
    time_skipping_env: WorkflowEnvironment,
) -> None:
    """The closed run's result says which Alertmanager alert instances (fingerprint +
    startsAt) it handled, including the ones an earlier run handled (`handled_before`, which
    are not new evidence): what the webhook asks Temporal before starting another run."""
    from contract.remediation import HandledAlert

    client = time_skipping_env.client
    world = FakeWorld(health="Healthy")
    at = datetime(2026, 11, 29, 10, 0, tzinfo=UTC)
    older = HandledAlert(fingerprint="fp-ecc", starts_at=at - timedelta(hours=1))
    async with new_worker(client, world) as worker:
        handle = await start(
            client,
            worker,
            world,
            alerts=[
                xid_alert(13, "fp-13", starts_at=at),
                # Already handled by the previous run: not evidence again.
                xid_alert(79, "fp-ecc", starts_at=older.starts_at),
            ],
            handled_before=[older],
        )
        result = await handle.result()
    assert result.status.failure_class == "application"  # the handled Xid 79 did not count
    assert result.status.alerts == 1
    keys = {(h.fingerprint, h.starts_at) for h in result.handled_alerts}
    assert keys == {("fp-13", at), ("fp-ecc", older.starts_at)}


async def test_unhealthy_status_overrides_application_xid(
    time_skipping_env: WorkflowEnvironment,
) -> None:
    client = time_skipping_env.client
    world = FakeWorld(health="Unhealthy")
    async with new_worker(client, world) as worker:
        handle = await start(client, worker, world, alerts=[xid_alert(13, "fp-13")])
        await wait_phase(handle, Phase.HOLDING)
        await handle.signal(SIG_REPAIRED, RepairedRequest(actor="bob"))
        result = await handle.result()
    assert result.status.failure_class == "unhealthy"
    assert len(world.args(ACT_QUARANTINE)) == 1


async def test_stale_evidence_does_not_taint(time_skipping_env: WorkflowEnvironment) -> None:
    client = time_skipping_env.client
    world = FakeWorld(health="Healthy")
    old = datetime.now(UTC) - timedelta(hours=6)
    async with new_worker(client, world) as worker:
        handle = await start(client, worker, world, alerts=[xid_alert(79, starts_at=old)])
        result = await handle.result()
    assert result.outcome == "not-quarantined"
    assert result.reason.startswith("stale evidence")
    assert ACT_QUARANTINE not in world.names()


async def test_refused_early_lease_request_is_withdrawn_without_escalation(
    time_skipping_env: WorkflowEnvironment,
) -> None:
    """Over budget, but the evidence says no quarantine: the refused early request is withdrawn
    (the budget forgets the waiter), nobody is paged and the run closes."""
    client = time_skipping_env.client
    world = FakeWorld(health="Healthy", budget_granted=False)
    async with new_worker(client, world) as worker:
        handle = await start(client, worker, world, alerts=[xid_alert(13, "fp-13")])
        result = await handle.result()
    assert result.outcome == "not-quarantined"
    assert result.status.escalation_reason == "application-error"  # the owner's notice only
    assert "budget denied" not in actions(result.timeline)
    assert [r.holder for r in world.args(ACT_RELEASE_BUDGET)] == [handle.id]
    assert [n.incident.severity for n in world.args(ACT_NOTIFY)] == ["warning"]  # owner only


async def test_lease_not_given_back_is_left_to_reconcile_without_a_page(
    time_skipping_env: WorkflowEnvironment,
) -> None:
    """No quarantine, and giving the early lease back fails: the run still closes as
    not-quarantined (the budget's reconcile drops the lease of a closed run), nobody paged."""
    client = time_skipping_env.client
    world = FakeWorld(health="Healthy", budget_release_fails=True)
    async with new_worker(client, world) as worker:
        handle = await start(client, worker, world, alerts=[xid_alert(13, "fp-13")])
        result = await handle.result()
    assert result.outcome == "not-quarantined"
    assert "budget lease not given back" in actions(result.timeline)
    assert [n.incident.severity for n in world.args(ACT_NOTIFY)] == ["warning"]  # owner only


async def test_confirm_steps_run_concurrently(time_skipping_env: WorkflowEnvironment) -> None:
    """Runbooks with resolve, then evidence, consumers, counts and the lease side by side: the
    lease is asked before the evidence answers (and the happy path still quarantines once)."""
    client = time_skipping_env.client
    world = FakeWorld(evidence_delay=timedelta(milliseconds=300))
    async with new_worker(client, world) as worker:
        handle = await start(client, worker, world)
        await wait_phase(handle, Phase.HOLDING)
        await handle.signal(SIG_REPAIRED, RepairedRequest(actor="bob"))
        result = await handle.result()
    names = world.names()
    assert names.index(ACT_ACQUIRE_BUDGET) < names.index(ACT_GATHER_EVIDENCE)
    assert len(world.args(ACT_ACQUIRE_BUDGET)) == 1 and len(world.args(ACT_QUARANTINE)) == 1
    timeline = actions(result.timeline)
    assert timeline.index("classified") < timeline.index("budget lease acquired")


async def _close_waiting(handle: Any) -> RemediationResult:
    """A remediation waiting for budget: wait for its escalation, mark repaired, result."""
    await wait_phase(handle, Phase.ESCALATED)
    await handle.signal(SIG_REPAIRED, RepairedRequest(actor="ops"))
    return await handle.result()


async def test_budget_exhausted(time_skipping_env: WorkflowEnvironment) -> None:
    client = time_skipping_env.client
    world = FakeWorld(budget_granted=False)
    async with new_worker(client, world) as worker:
        handle = await start(client, worker, world)
        status = await wait_phase(handle, Phase.ESCALATED)
        assert "budget slot" in status.awaiting
        for _ in range(5):  # repeats of the alert while waiting: signals, no new escalation
            await handle.signal(SIG_ALERT, xid_alert())
        # Lease retried every minute: 2.5 min = first try + 2 retries. Mid-interval on purpose:
        # a signal landing the instant a retry timer fires trips the time-skipping test
        # server ("invalid history builder state for action") and the run never closes.
        await time_skipping_env.sleep(timedelta(minutes=2, seconds=30))
        await handle.signal(SIG_REPAIRED, RepairedRequest(actor="ops"))
        result = await handle.result()
        save_history("budget_exhausted", await handle.fetch_history())
    assert result.outcome == "not-quarantined" and "never quarantined" in result.reason
    assert result.status.escalation_reason == "budget-exhausted"
    assert ACT_QUARANTINE not in world.names()
    assert ACT_RELEASE_BUDGET not in world.names()  # nothing was held
    acquires = len(world.args(ACT_ACQUIRE_BUDGET))
    assert acquires >= 3  # first try + retries on the interval
    assert len(world.args(ACT_COUNT_DEVICES)) < acquires  # retries reuse the device counts
    assert [n.action for n in world.args(ACT_NOTIFY)] == ["trigger", "resolve"]  # one page
    page = world.args(ACT_NOTIFY)[0].incident
    assert (page.reason, page.node_pool) == ("budget-exhausted", "pool-a")  # to group a storm
    assert result.status.duplicate_alerts >= 5
    denied = next(e for e in result.timeline if e.action == "budget denied")
    assert "device NOT tainted" in denied.reason and "pool pool-a" in denied.reason
    assert sum(e.action == "escalate" for e in result.timeline) == 1


async def test_budget_freed_while_waiting_then_quarantine(
    time_skipping_env: WorkflowEnvironment,
) -> None:
    client = time_skipping_env.client
    world = FakeWorld(budget_granted=False)
    async with new_worker(client, world) as worker:
        handle = await start(client, worker, world)
        await wait_phase(handle, Phase.ESCALATED)
        world.budget_granted = True
        await time_skipping_env.sleep(timedelta(minutes=2))
        await wait_phase(handle, Phase.HOLDING)
        await handle.signal(SIG_REPAIRED, RepairedRequest(actor="ops"))
        result = await handle.result()
        save_history("budget_freed", await handle.fetch_history())
    assert len(world.args(ACT_QUARANTINE)) == 1
    assert ACT_RELEASE_BUDGET in world.names()
    assert result.outcome == "escalated" and "released" in result.reason
    assert sum(e.action == "escalate" for e in result.timeline) == 1


async def test_long_budget_wait_continues_as_new(time_skipping_env: WorkflowEnvironment) -> None:
    """Waiting days for a budget slot (the GPUs holding it are away for repair): the wait
    continues-as-new before its history grows past the limit, keeps one timeline entry for the
    run of retries, pages once, confirms afresh in the new run and quarantines once the slot
    frees."""
    client = time_skipping_env.client
    world = FakeWorld(budget_granted=False)
    async with new_worker(client, world) as worker:
        handle = await start(client, worker, world)
        try:
            await wait_phase(handle, Phase.ESCALATED)
            first_run = (await handle.describe()).run_id
            latest = client.get_workflow_handle(handle.id, result_type=RemediationResult)
            for _ in range(20):  # 1m, then 5m retries: the limit falls within ~a day
                await time_skipping_env.sleep(timedelta(hours=2))
                if (await latest.describe()).run_id != first_run:
                    break
            assert (await latest.describe()).run_id != first_run, "never continued as new"
            evidence_calls = len(world.args(ACT_GATHER_EVIDENCE))
            world.budget_granted = True
            await time_skipping_env.sleep(timedelta(minutes=7, seconds=30))
            await wait_phase(latest, Phase.HOLDING)
            await latest.signal(SIG_REPAIRED, RepairedRequest(actor="ops"))
            result = await latest.result()
            save_history("budget_wait_resumed", await latest.fetch_history())
        except BaseException:  # leave the shared test server skipping time
            await client.get_workflow_handle(handle.id).terminate("test failed")
            raise
    acts = actions(result.timeline)
    assert ("continued as new", "waiting for budget") in [
        (e.action, e.outcome) for e in result.timeline
    ]
    assert acts.count("budget still full") <= 2 * acts.count("continued as new") + 1, acts
    assert len(result.timeline) < 60, len(result.timeline)
    assert evidence_calls >= 2  # the new run confirmed again before asking
    assert len(world.args(ACT_QUARANTINE)) == 1
    assert [n.action for n in world.args(ACT_NOTIFY)] == ["trigger", "resolve"]  # one page
    assert sum(e.action == "escalate" for e in result.timeline) == 1
    assert result.outcome == "escalated" and "released" in result.reason


async def test_budget_wait_ends_on_resolved_healthy_or_abort(
    time_skipping_env: WorkflowEnvironment,
) -> None:
    client = time_skipping_env.client
    world = FakeWorld(budget_granted=False, later_health="Healthy")
    async with new_worker(client, world) as worker:
        handle = await start(client, worker, world)
        await wait_phase(handle, Phase.ESCALATED)
        await handle.signal(SIG_ALERT_RESOLVED, AlertResolved(fingerprint="fp-79"))
        result = await handle.result()
        assert result.outcome == "not-quarantined" and "Healthy" in result.reason
        assert ACT_CHECK_HEALTH in world.names()

        other = FakeWorld(budget_granted=False)
        handle = await start(client, worker, other)
        await wait_phase(handle, Phase.ESCALATED)
        await handle.signal(SIG_ABORT, AbortRequest(actor="ops", reason="not now"))
        result = await handle.result()
    assert result.outcome == "aborted"
    assert ACT_QUARANTINE not in other.names() and ACT_RELEASE_BUDGET not in other.names()


async def test_budget_unreachable_escalates_and_waits(
    time_skipping_env: WorkflowEnvironment,
) -> None:
    """The acquire activity keeps failing (update limit, server down): never Failed."""
    from temporalio import activity as act
    from temporalio.service import RPCError, RPCStatusCode
    from temporalio.worker import Worker

    from workflows.budget import BudgetWorkflow
    from workflows.remediation import DeviceRemediationWorkflow

    client = time_skipping_env.client
    world = FakeWorld()
    failures = {"left": 2}  # two lease attempts (the workflow's bounded retries), then up

    @act.defn(name=ACT_ACQUIRE_BUDGET)
    async def refused(req: Any) -> BudgetDecision:
        world.calls.append((ACT_ACQUIRE_BUDGET, req))
        if failures["left"] > 0:
            failures["left"] -= 1
            raise RPCError(
                "limit on number of concurrent in-flight updates has been reached (10)",
                RPCStatusCode.RESOURCE_EXHAUSTED,
                b"",
            )
        return BudgetDecision(granted=True, pool_in_use=1, cluster_in_use=1)

    async with Worker(
        client,
        task_queue=f"tq-budget-down-{world.gpu_uuid}",
        workflows=[DeviceRemediationWorkflow, BudgetWorkflow],
        activities=world.activities(refused),
    ) as worker:
        handle = await start(client, worker, world)
        status = await wait_phase(handle, Phase.ESCALATED)
        assert status.escalation_reason == "error"
        await time_skipping_env.sleep(timedelta(minutes=2))
        await wait_phase(handle, Phase.HOLDING)
        await handle.signal(SIG_REPAIRED, RepairedRequest(actor="ops"))
        result = await handle.result()
    unavailable = next(e for e in result.timeline if e.action == "budget unavailable")
    assert "budget service unavailable" in unavailable.reason
    assert "in-flight updates" in unavailable.reason
    assert result.outcome == "escalated"  # one escalation, then quarantined and released
    assert len(world.args(ACT_QUARANTINE)) == 1


async def test_approval_timeout_escalates(time_skipping_env: WorkflowEnvironment) -> None:
    client = time_skipping_env.client
    world = FakeWorld(
        runbooks=with_spec(
            "inference",
            approval={"required": True, "timeout": "10m", "onTimeout": "escalate"},
            escalation={"channels": ["pagerduty"]},
        )
    )
    async with new_worker(client, world) as worker:
        handle = await start(client, worker, world)
        result = await handle.result()
    assert result.outcome == "escalated"
    assert result.status.escalation_reason == "approval-timeout"
    assert ACT_QUARANTINE not in world.names()
    assert world.args(ACT_RELEASE_BUDGET), "the lease taken before approval is given back"


async def test_approve_update_then_quarantine(time_skipping_env: WorkflowEnvironment) -> None:
    client = time_skipping_env.client
    world = FakeWorld(runbooks=with_spec("inference", approval={"required": True, "timeout": "1h"}))
    async with new_worker(client, world) as worker:
        handle = await start(client, worker, world)
        await wait_phase(handle, Phase.AWAITING_APPROVAL)
        reply = await handle.execute_update(
            UPD_APPROVE,
            ApprovalDecision(approve=True, actor="carol", reason="go"),
            result_type=ApprovalResult,
        )
        assert reply.accepted
        await wait_phase(handle, Phase.HOLDING)
        # The validator refuses a second decision outside the approval phase.
        try:
            await handle.execute_update(
                UPD_APPROVE,
                ApprovalDecision(approve=True, actor="dave"),
                result_type=ApprovalResult,
            )
            raise AssertionError("update outside awaiting-approval was accepted")
        except WorkflowUpdateFailedError as exc:
            assert "not awaiting-approval" in str(exc.cause)
        await handle.signal(SIG_REPAIRED, RepairedRequest(actor="carol"))
        result = await handle.result()
        save_history("approval", await handle.fetch_history())
    assert result.outcome == "released"
    assert len(world.args(ACT_QUARANTINE)) == 1
    approved = next(e for e in result.timeline if e.action == "approved")
    assert approved.actor == "carol"


async def test_bad_approve_input_is_refused_naming_the_problem(
    time_skipping_env: WorkflowEnvironment,
) -> None:
    """An `approve` typed in the Web UI with a missing or unknown field: the refusal names the
    field (not the SDK's bare "Failed decoding arguments"); a good one afterwards still works."""
    client = time_skipping_env.client
    world = FakeWorld(runbooks=with_spec("inference", approval={"required": True, "timeout": "1h"}))
    async with new_worker(client, world) as worker:
        handle = await start(client, worker, world)
        await wait_phase(handle, Phase.AWAITING_APPROVAL)
        refusals = []
        for body in ({"approve": True}, {"approve": True, "actor": "carol", "reasn": "go"}):
            with pytest.raises(WorkflowUpdateFailedError) as refused:
                await handle.execute_update(UPD_APPROVE, body, result_type=ApprovalResult)
            assert isinstance(refused.value.cause, ApplicationError)
            refusals.append(refused.value.cause.message)
        reply = await handle.execute_update(
            UPD_APPROVE, {"approve": True, "actor": "carol"}, result_type=ApprovalResult
        )
        await wait_phase(handle, Phase.HOLDING)
        await handle.terminate("test over")
    assert refusals[0] == "invalid approve input: actor: Field required"
    assert refusals[1].startswith("invalid approve input: reasn: unknown field")
    assert reply.accepted


async def test_eviction_timeout_then_force(time_skipping_env: WorkflowEnvironment) -> None:
    client = time_skipping_env.client
    pod = deployment_consumer().pod
    world = FakeWorld(
        eviction_reports=[
            EvictionReport(remaining=[pod], timed_out=True),
            EvictionReport(gone=[pod]),
        ]
    )
    async with new_worker(client, world) as worker:
        handle = await start(client, worker, world)
        await wait_phase(handle, Phase.HOLDING)
        await handle.signal(SIG_REPAIRED, RepairedRequest(actor="erin"))
        result = await handle.result()
        save_history("eviction_force", await handle.fetch_history())
    assert result.outcome == "released"  # forcing worked, no escalation
    forced = world.args(ACT_EVICT_PODS)
    assert len(forced) == 1 and forced[0].delete_if_blocked  # inference: force: delete
    assert ACT_WAIT_REPLACEMENT in world.names()


async def test_eviction_timeout_force_fails_escalates(
    time_skipping_env: WorkflowEnvironment,
) -> None:
    client = time_skipping_env.client
    pod = deployment_consumer().pod
    world = FakeWorld(
        eviction_reports=[
            EvictionReport(remaining=[pod], timed_out=True),
            EvictionReport(remaining=[pod], timed_out=True),
        ]
    )
    async with new_worker(client, world) as worker:
        handle = await start(client, worker, world)
        await wait_phase(handle, Phase.HOLDING)
        await handle.signal(SIG_REPAIRED, RepairedRequest(actor="erin"))
        result = await handle.result()
    assert result.outcome == "escalated"
    assert result.status.escalation_reason == "eviction-timeout"
    assert ACT_WAIT_REPLACEMENT not in world.names()
    assert ACT_RELEASE_QUARANTINE in world.names()


async def test_eviction_api_mode_with_backstop(time_skipping_env: WorkflowEnvironment) -> None:
    client = time_skipping_env.client
    pod = deployment_consumer().pod
    world = FakeWorld(
        runbooks=with_spec("inference", eviction={"mode": "eviction-api", "timeout": "5m"}),
        eviction_reports=[
            EvictionReport(remaining=[pod], timed_out=True),
            EvictionReport(gone=[pod]),
        ],
    )
    async with new_worker(client, world) as worker:
        handle = await start(client, worker, world)
        await wait_phase(handle, Phase.HOLDING)
        await handle.signal(SIG_REPAIRED, RepairedRequest(actor="erin"))
        result = await handle.result()
        save_history("eviction_api_backstop", await handle.fetch_history())
    assert result.outcome == "released"
    effects = [q.effect for q in world.args(ACT_QUARANTINE)]
    assert effects == ["NoSchedule", "NoExecute"]  # rule, then the backstop
    evictions = world.args(ACT_EVICT_PODS)
    assert len(evictions) == 1 and not evictions[0].delete_if_blocked
    names = world.names()
    assert names.index(ACT_EVICT_PODS) < names.index(ACT_WAIT_EVICTION)


BUDGET_429 = (
    "ml/llm-worker-0: The disruption budget llm-worker needs 1 healthy pods and has 1 currently"
)


async def test_eviction_api_blocked_by_a_budget_escalates_and_never_backstops(
    time_skipping_env: WorkflowEnvironment,
) -> None:
    """force: none honours PDBs: blocked evictions are retried for the whole eviction timeout
    (inside evict-pods), then the remediation escalates naming the budget and holds under the
    NoSchedule rule; no NoExecute backstop deletes the pod past the budget."""
    client = time_skipping_env.client
    pod = deployment_consumer().pod
    world = FakeWorld(
        runbooks=with_spec("inference", eviction={"mode": "eviction-api", "timeout": "30m"}),
        evict_results=[EvictPodsResult(blocked=[pod], budgets=[BUDGET_429], attempts=12)],
        eviction_reports=[EvictionReport(remaining=[pod], timed_out=True)],
    )
    async with new_worker(client, world) as worker:
        handle = await start(client, worker, world)
        await wait_phase(handle, Phase.HOLDING)
        await handle.signal(SIG_REPAIRED, RepairedRequest(actor="erin"))
        result = await handle.result()
    assert result.outcome == "escalated"
    assert result.status.escalation_reason == "eviction-timeout"
    assert [q.effect for q in world.args(ACT_QUARANTINE)] == ["NoSchedule"]  # no backstop
    (evict,) = world.args(ACT_EVICT_PODS)
    assert evict.retry_blocked_for == timedelta(minutes=30) and not evict.delete_if_blocked
    escalation = next(e for e in result.timeline if e.action.startswith("escalat"))
    assert "llm-worker needs 1 healthy pods" in escalation.reason + escalation.outcome
    assert ACT_WAIT_REPLACEMENT not in world.names()


async def test_fallback_blocked_eviction_is_retried_then_escalated(
    time_skipping_env: WorkflowEnvironment,
) -> None:
    """No DeviceTaintRule served: the fallback's one Eviction API pass was refused by a budget;
    the refused pod is retried for the eviction timeout, then escalated naming the budget."""
    client = time_skipping_env.client
    pod = deployment_consumer().pod
    world = FakeWorld(
        evict_results=[EvictPodsResult(blocked=[pod], budgets=[BUDGET_429], attempts=7)],
        eviction_reports=[EvictionReport(remaining=[pod], timed_out=True)],
        runbooks=with_spec("inference", eviction={"timeout": "10m"}),
    )

    @activity.defn(name=ACT_QUARANTINE)
    async def fallback(req: QuarantineInput) -> QuarantineResult:
        world.calls.append((ACT_QUARANTINE, req))
        return QuarantineResult(mode="fallback", action="created", blocked=[pod])

    async with new_worker(client, world, extra_activities=[fallback]) as worker:
        handle = await start(client, worker, world)
        await wait_phase(handle, Phase.HOLDING)
        await handle.signal(SIG_REPAIRED, RepairedRequest(actor="erin"))
        result = await handle.result()
    assert result.status.escalation_reason == "eviction-timeout"
    (evict,) = world.args(ACT_EVICT_PODS)
    assert evict.pods == [pod] and evict.retry_blocked_for == timedelta(minutes=10)
    escalation = next(e for e in result.timeline if e.action.startswith("escalat"))
    assert "llm-worker needs 1 healthy pods" in escalation.reason + escalation.outcome


async def test_eviction_api_blocked_but_forced_goes_past_the_budget(
    time_skipping_env: WorkflowEnvironment,
) -> None:
    """force: noexecute is the explicit choice to bypass budgets: the NoExecute backstop."""
    client = time_skipping_env.client
    pod = deployment_consumer().pod
    world = FakeWorld(
        runbooks=with_spec(
            "inference", eviction={"mode": "eviction-api", "timeout": "30m", "force": "noexecute"}
        ),
        evict_results=[EvictPodsResult(blocked=[pod], budgets=[BUDGET_429])],
        # The pod the budget still refused at the timeout is not waited for: the first wait
        # is the backstop's.
        eviction_reports=[EvictionReport(gone=[pod])],
    )
    async with new_worker(client, world) as worker:
        handle = await start(client, worker, world)
        await wait_phase(handle, Phase.HOLDING)
        await handle.signal(SIG_REPAIRED, RepairedRequest(actor="erin"))
        result = await handle.result()
    assert result.outcome == "released"
    assert [q.effect for q in world.args(ACT_QUARANTINE)] == ["NoSchedule", "NoExecute"]
    (backstop_wait,) = world.args(ACT_WAIT_EVICTION)
    assert backstop_wait.pods == [pod] and backstop_wait.timeout == FORCE_GRACE


async def test_pending_deadline_scale_up_success(time_skipping_env: WorkflowEnvironment) -> None:
    client = time_skipping_env.client
    world = FakeWorld(
        replacement_reports=[
            ReplacementReport(
                status="pending",
                unschedulable_message="0/2 nodes are available: 2 cannot allocate all claims",
            ),
            ReplacementReport(status="running"),
        ]
    )
    async with new_worker(client, world) as worker:
        handle = await start(client, worker, world)
        await past_deadline(time_skipping_env, handle, world, Phase.AWAITING_REPLACEMENT)
        await wait_phase(handle, Phase.HOLDING)
        await handle.signal(SIG_REPAIRED, RepairedRequest(actor="frank"))
        result = await handle.result()
        save_history("scale_up_success", await handle.fetch_history())
    assert result.outcome == "released"
    req = world.args(ACT_REQUEST_CAPACITY)[0]
    assert req.pool.provider == "http" and req.pool.name == "pool-a"
    assert req.max_size == 8 and req.step == 1 and req.idempotency_key
    waits = world.args(ACT_WAIT_REPLACEMENT)
    # The watch, the look at the Pending deadline, the watch after the scale-up (Running).
    assert [w.look_once for w in waits] == [False, True, False]
    assert world.watch_cancelled == 1
    assert ACT_NOTIFY not in world.names()


async def test_scale_up_at_max_escalates(time_skipping_env: WorkflowEnvironment) -> None:
    client = time_skipping_env.client
    world = FakeWorld(
        replacement_reports=[ReplacementReport(status="pending")],
        capacity=CapacityResult(status="at-max", current_size=8, target_size=8),
    )
    async with new_worker(client, world) as worker:
        handle = await start(client, worker, world)
        await past_deadline(time_skipping_env, handle, world, Phase.AWAITING_REPLACEMENT)
        await wait_phase(handle, Phase.HOLDING)
        await handle.signal(SIG_REPAIRED, RepairedRequest(actor="gina"))
        result = await handle.result()
    assert result.outcome == "escalated"
    assert result.status.escalation_reason == "no-capacity"
    assert [w.look_once for w in world.args(ACT_WAIT_REPLACEMENT)] == [False, True]
    page = world.args(ACT_NOTIFY)[0]
    assert page.action == "trigger" and page.incident.severity == "critical"
    assert "max size" in page.incident.summary
    # Released later: the page is resolved.
    assert [n.action for n in world.args(ACT_NOTIFY)] == ["trigger", "resolve"]


async def test_scale_up_error_at_max_type_escalates(time_skipping_env: WorkflowEnvironment) -> None:
    client = time_skipping_env.client
    world = FakeWorld(
        replacement_reports=[ReplacementReport(status="pending")],
        capacity=ApplicationError("pool at 8/8", type=ERR_POOL_AT_MAX, non_retryable=True),
    )
    async with new_worker(client, world) as worker:
        handle = await start(client, worker, world)
        await past_deadline(time_skipping_env, handle, world, Phase.AWAITING_REPLACEMENT)
        await wait_phase(handle, Phase.HOLDING)
        await handle.signal(SIG_ABORT, AbortRequest(reason="done testing", actor="gina"))
        result = await handle.result()
    assert result.outcome == "aborted"
    assert any(e.action == "escalate" and e.outcome == "no-capacity" for e in result.timeline)


def _churn_report() -> ReplacementReport:
    owner = OwnerRef(kind="Deployment", name="llm", namespace="serving")
    return ReplacementReport(
        status="churn",
        churn=ChurnDiagnosis(
            owner=owner,
            evictions=3,
            diagnosis="DeviceTaintManagerEviction x3: the scheduler ignores the rule",
        ),
    )


async def test_churn_escalates(time_skipping_env: WorkflowEnvironment) -> None:
    """Churn stops (default onChurn: cordon): the node is cordoned, the escalation says so, and
    the release uncordons it."""
    client = time_skipping_env.client
    world = FakeWorld(replacement_reports=[_churn_report()])
    async with new_worker(client, world) as worker:
        handle = await start(client, worker, world)
        await wait_phase(handle, Phase.HOLDING)
        await handle.signal(SIG_REPAIRED, RepairedRequest(actor="hank"))
        result = await handle.result()
        save_history("churn", await handle.fetch_history())
    assert result.outcome == "escalated"
    assert result.status.escalation_reason == "churn"
    assert ACT_REQUEST_CAPACITY not in world.names()
    summary = world.args(ACT_NOTIFY)[0].incident.summary
    assert "scheduler ignores" in summary and f"cordoning node {world.node}" in summary
    cordons = world.args(ACT_CORDON)
    assert [(c.node, c.cordon) for c in cordons] == [(world.node, True), (world.node, False)]
    names = world.names()
    assert names.index(ACT_CORDON) < names.index(ACT_NOTIFY)  # stopped before people are told
    assert names.index(ACT_RELEASE_QUARANTINE) < len(names) - names[::-1].index(ACT_CORDON)


async def test_churn_noschedule_switches_the_rule(time_skipping_env: WorkflowEnvironment) -> None:
    client = time_skipping_env.client
    world = FakeWorld(
        replacement_reports=[_churn_report()],
        runbooks=with_spec("inference", replacement={"onChurn": "noschedule"}),
    )
    async with new_worker(client, world) as worker:
        handle = await start(client, worker, world)
        await wait_phase(handle, Phase.HOLDING)
        await handle.signal(SIG_REPAIRED, RepairedRequest(actor="hank"))
        result = await handle.result()
    assert result.status.escalation_reason == "churn"
    assert [q.effect for q in world.args(ACT_QUARANTINE)] == ["NoExecute", "NoSchedule"]
    assert ACT_CORDON not in world.names()
    escalation = next(e for e in result.timeline if e.action.startswith("escalat"))
    assert "switching the rule to NoSchedule" in escalation.reason + escalation.outcome


def _binding_scheduler(world: FakeWorld) -> Any:
    """The watch on the stock 1.36.2 scheduler (tests/activities/kube/test_kube_controllers:
    the replacement binds to the tainted device): under a NoSchedule rule nothing evicts it,
    and the watch reports churn naming it; told NoExecute, the watch sees no churn yet and
    runs on (pending until the deadline)."""
    bound = PodRef(namespace="serving", name="llm-7d9f-x2x", uid="u-new")

    @fake_of(KubeActivities.wait_for_replacement)
    async def wait_replacement(req: WaitReplacementInput) -> ReplacementReport:
        world.calls.append((ACT_WAIT_REPLACEMENT, req))
        if req.look_once:
            return ReplacementReport(status="pending", unschedulable_message="(bound, churned)")
        if req.rule_effect == "NoExecute":
            await watch_until_cancelled(world)
        return ReplacementReport(
            status="churn",
            churn=ChurnDiagnosis(
                owner=OwnerRef(kind="Deployment", name="llm", namespace="serving"),
                evictions=0,
                diagnosis="replacement serving/llm-7d9f-x2x was placed on the quarantined "
                "device ... the scheduler ignores DeviceTaintRules (kubernetes#139651)",
                bound=[bound],
            ),
        )

    return wait_replacement


async def test_eviction_api_churn_is_stopped(time_skipping_env: WorkflowEnvironment) -> None:
    client = time_skipping_env.client
    world = FakeWorld(
        runbooks=with_spec(
            "inference",
            eviction={"mode": "eviction-api", "timeout": "5m"},
            replacement={"pendingDeadline": "10m"},
            scaleUp={"enabled": False},
            escalation={"channels": ["pagerduty"]},
        )
    )
    async with new_worker(client, world, [_binding_scheduler(world)]) as worker:
        handle = await start(client, worker, world)
        status = await wait_phase(handle, Phase.HOLDING)
        await handle.terminate("test over")
    assert status.escalation_reason == "churn"  # not pending-deadline
    (watch,) = world.args(ACT_WAIT_REPLACEMENT)
    assert watch.rule_effect == "NoSchedule" and not watch.look_once
    assert [(c.node, c.cordon) for c in world.args(ACT_CORDON)] == [(world.node, True)]
    evictions = world.args(ACT_EVICT_PODS)
    assert [p.name for p in evictions[-1].pods] == ["llm-7d9f-x2x"]  # off the failed GPU
    assert not evictions[-1].delete_if_blocked  # budgets honoured
    summary = world.args(ACT_NOTIFY)[0].incident.summary
    assert "kubernetes#139651" in summary
    assert f"cordoning node {world.node}" in summary
    assert "evicted serving/llm-7d9f-x2x off the failed GPU" in summary
    names = world.names()
    assert (
        names.index(ACT_CORDON)
        < len(names) - names[::-1].index(ACT_EVICT_PODS) - 1
        < (names.index(ACT_NOTIFY))
    )


async def test_eviction_api_churn_with_onchurn_noschedule_says_so(
    time_skipping_env: WorkflowEnvironment,
) -> None:
    client = time_skipping_env.client
    world = FakeWorld(
        runbooks=with_spec(
            "inference",
            eviction={"mode": "eviction-api", "timeout": "5m"},
            replacement={"onChurn": "noschedule"},
            escalation={"channels": ["pagerduty"]},
        )
    )
    async with new_worker(client, world, [_binding_scheduler(world)]) as worker:
        handle = await start(client, worker, world)
        status = await wait_phase(handle, Phase.HOLDING)
        await handle.terminate("test over")
    assert status.escalation_reason == "churn"
    assert [q.effect for q in world.args(ACT_QUARANTINE)] == ["NoSchedule"]  # no re-apply
    summary = world.args(ACT_NOTIFY)[0].incident.summary
    assert "the rule is NoSchedule already" in summary and "kubernetes#139651" in summary


async def test_abort_while_holding_undoes(time_skipping_env: WorkflowEnvironment) -> None:
    client = time_skipping_env.client
    world = FakeWorld()
    async with new_worker(client, world) as worker:
        handle = await start(client, worker, world)
        await wait_phase(handle, Phase.HOLDING)
        await handle.signal(SIG_ABORT, AbortRequest(reason="false positive", actor="ivy"))
        result = await handle.result()
        save_history("abort", await handle.fetch_history())
    assert result.outcome == "aborted"
    assert "false positive" in result.reason
    assert ACT_RELEASE_QUARANTINE in world.names() and ACT_RELEASE_BUDGET in world.names()


async def test_abort_during_approval(time_skipping_env: WorkflowEnvironment) -> None:
    client = time_skipping_env.client
    world = FakeWorld(runbooks=with_spec("inference", approval={"required": True}))
    async with new_worker(client, world) as worker:
        handle = await start(client, worker, world)
        await wait_phase(handle, Phase.AWAITING_APPROVAL)
        await handle.signal(SIG_ABORT, AbortRequest(reason="not now", actor="ivy"))
        result = await handle.result()
    assert result.outcome == "aborted"
    assert ACT_QUARANTINE not in world.names()
    assert ACT_RELEASE_QUARANTINE not in world.names()  # nothing to undo
    assert ACT_RELEASE_BUDGET in world.names()


async def test_failing_channel_retried_and_recorded(time_skipping_env: WorkflowEnvironment) -> None:
    client = time_skipping_env.client
    world = FakeWorld(budget_granted=False, notify_failures=2)
    async with new_worker(client, world) as worker:
        handle = await start(client, worker, world)
        result = await _close_waiting(handle)
    assert result.status.escalation_reason == "budget-exhausted"
    triggers = [n for n in world.args(ACT_NOTIFY) if n.action == "trigger"]
    assert len(triggers) == 3  # two failures, then delivered
    delivered = [e for e in result.timeline if e.action.startswith("notify pagerduty")]
    assert delivered[-1].outcome == "delivered (try 3)"


async def test_channel_configuration_error_is_not_retried(
    time_skipping_env: WorkflowEnvironment,
) -> None:
    """A channel that is not configured fails once; the timeline says it was not retried
    (not "gave up after 6 tries")."""
    from temporalio import activity as act

    from contract.errors import ERR_CONFIG

    client = time_skipping_env.client
    world = FakeWorld(health="Healthy")
    tries: list[int] = []

    @act.defn(name=ACT_NOTIFY)
    async def unconfigured(req: object) -> None:
        tries.append(act.info().attempt)
        raise ApplicationError(  # even without the flag: the type is never retried
            "notification channel 'pagerduty' is not configured on this worker", type=ERR_CONFIG
        )

    from temporalio.worker import Worker

    from workflows.budget import BudgetWorkflow
    from workflows.remediation import DeviceRemediationWorkflow

    async with Worker(
        client,
        task_queue="tq-unconfigured-channel",
        workflows=[DeviceRemediationWorkflow, BudgetWorkflow],
        activities=world.activities(unconfigured),
    ) as worker:
        handle = await start(client, worker, world, alerts=[xid_alert(13, "fp-13")])
        result = await handle.result()
    assert tries == [1]
    failed = [e for e in result.timeline if e.action.startswith("notify slack")]
    assert failed and failed[-1].outcome == "failed"
    assert "not retried" in failed[-1].reason and "6 tries" not in failed[-1].reason
    assert "ConfigurationError" in failed[-1].reason


async def test_non_retryable_quarantine_error_escalates(
    time_skipping_env: WorkflowEnvironment,
) -> None:
    client = time_skipping_env.client
    world = FakeWorld()
    from temporalio import activity as act

    @act.defn(name=ACT_QUARANTINE)
    async def forbidden(req: object) -> None:
        raise ApplicationError(
            "cannot create devicetaintrules: forbidden", type=ERR_FORBIDDEN, non_retryable=True
        )

    from temporalio.worker import Worker

    from workflows.budget import BudgetWorkflow
    from workflows.remediation import DeviceRemediationWorkflow

    async with Worker(
        client,
        task_queue="tq-forbidden",
        workflows=[DeviceRemediationWorkflow, BudgetWorkflow],
        activities=world.activities(forbidden),
    ) as worker:
        handle = await start(client, worker, world)
        result = await handle.result()
    assert result.outcome == "escalated"
    assert result.status.escalation_reason == "error"
    assert "KubeForbidden" in result.reason
    assert ACT_RELEASE_BUDGET in world.names()


async def test_dry_run_previews_only(time_skipping_env: WorkflowEnvironment) -> None:
    client = time_skipping_env.client
    world = FakeWorld()
    async with new_worker(client, world) as worker:
        handle = await start(client, worker, world, dry_run=True)
        result = await handle.result()
        save_history("dry_run", await handle.fetch_history())
    assert result.outcome == "dry-run"
    assert ACT_PREVIEW_QUARANTINE in world.names() and ACT_QUARANTINE not in world.names()
    assert "serving/llm-7d9f-abcde" in result.reason
    assert ACT_RECORD_EVENT not in world.names()  # a dry run writes no Events


async def test_timeline_query(time_skipping_env: WorkflowEnvironment) -> None:
    client = time_skipping_env.client
    world = FakeWorld()
    async with new_worker(client, world) as worker:
        handle = await start(client, worker, world)
        await wait_phase(handle, Phase.HOLDING)
        timeline = await handle.query(QRY_TIMELINE, result_type=list[TimelineEntry])
        await handle.signal(SIG_ABORT, AbortRequest(reason="cleanup", actor="t"))
        await handle.result()
    assert [e.action for e in timeline][:3] == ["evidence", "runbook chosen", "classified"]
    assert all(a.at <= b.at for a, b in zip(timeline, timeline[1:], strict=False))


async def test_long_hold_continues_as_new(time_skipping_env: WorkflowEnvironment) -> None:
    """A device that stays Unhealthy for days: the hold loop continues-as-new before its
    history grows past the limit, keeps timeline and quarantine, and still releases."""
    client = time_skipping_env.client
    world = FakeWorld(later_health="Unhealthy")
    async with new_worker(client, world) as worker:
        handle = await start(client, worker, world)
        await wait_phase(handle, Phase.HOLDING)
        first_run = (await handle.describe()).run_id
        latest = client.get_workflow_handle(handle.id, result_type=RemediationResult)
        for _ in range(40):  # 5m checks, ~6 events each: the limit falls within ~2 days
            await time_skipping_env.sleep(timedelta(hours=2))
            if (await latest.describe()).run_id != first_run:
                break
        assert (await latest.describe()).run_id != first_run, "never continued as new"
        await latest.signal(SIG_REPAIRED, RepairedRequest(actor="tech"))
        result = await latest.result()
        save_history("hold_resumed", await latest.fetch_history())
    assert result.outcome == "released"
    acts = actions(result.timeline)
    assert acts[0] == "evidence" and "continued as new" in acts
    assert len(world.args(ACT_QUARANTINE)) == 1  # not re-quarantined by the new run
    release = world.args(ACT_RELEASE_QUARANTINE)[0]
    assert release.rule_name and release.rule_name.startswith("sickbay-gpu-")


async def test_non_canonical_launch_hands_over(time_skipping_env: WorkflowEnvironment) -> None:
    """Started from the UI by DRA name under another id: the evidence goes to the device's
    canonical workflow (signal-with-start), so later alerts meet the same remediation."""
    import uuid as _uuid

    from activities.launch import LaunchActivities
    from contract.kube import DeviceRef
    from contract.names import WF_REMEDIATE, device_workflow_id
    from contract.remediation import RemediationInput, RemediationStatus

    client = time_skipping_env.client
    world = FakeWorld()
    queue = f"tq-{_uuid.uuid4()}"
    launch = LaunchActivities(client, queue)
    async with new_worker(
        client, world, extra_activities=[launch.signal_with_start_remediation], task_queue=queue
    ):
        result = await client.execute_workflow(
            WF_REMEDIATE,
            RemediationInput(
                device=DeviceRef(driver="gpu.nvidia.com", pool=world.node, device="gpu-0"),
                alerts=[xid_alert(79, "fp-ui")],
            ),
            id=f"ui-launch-{_uuid.uuid4().hex[:6]}",
            task_queue=queue,
            result_type=RemediationResult,
        )
        canonical = client.get_workflow_handle(device_workflow_id(world.node, world.gpu_uuid))
        status = await wait_phase(canonical, Phase.HOLDING)
        await canonical.signal(SIG_ABORT, AbortRequest(reason="test done", actor="t"))
        await canonical.result()
    assert result.outcome == "not-quarantined"
    assert result.reason == f"handed over to {canonical.id}"
    assert status.alerts == 1 and isinstance(status, RemediationStatus)
    assert len(world.args(ACT_QUARANTINE)) == 1  # only the canonical workflow tainted


async def test_escalation_filtered_by_runbook(time_skipping_env: WorkflowEnvironment) -> None:
    """training pages only without capacity: a budget denial is recorded, not paged."""
    client = time_skipping_env.client
    world = FakeWorld(
        budget_granted=False,
        consumers=[
            deployment_consumer().model_copy(
                update={"top_owner": OwnerRef(kind="JobSet", name="train", namespace="ml")}
            )
        ],
    )
    async with new_worker(client, world) as worker:
        handle = await start(client, worker, world)
        result = await _close_waiting(handle)
    assert result.status.runbook == "training"
    assert result.status.escalation_reason == "budget-exhausted"
    assert ACT_NOTIFY not in world.names()
    skipped = next(e for e in result.timeline if e.action == "escalation not sent")
    assert "escalates only on" in skipped.reason


async def test_reject_escalates_without_taint(time_skipping_env: WorkflowEnvironment) -> None:
    client = time_skipping_env.client
    world = FakeWorld(runbooks=with_spec("inference", approval={"required": True}))
    async with new_worker(client, world) as worker:
        handle = await start(client, worker, world)
        await wait_phase(handle, Phase.AWAITING_APPROVAL)
        await handle.execute_update(
            UPD_APPROVE,
            ApprovalDecision(approve=False, actor="kim", reason="GPU is fine"),
            result_type=ApprovalResult,
        )
        result = await handle.result()
        save_history("approval_rejected", await handle.fetch_history())
    assert result.outcome == "escalated"
    assert result.status.escalation_reason == "approval-rejected"
    assert "kim" in result.reason and ACT_QUARANTINE not in world.names()
    assert ACT_RELEASE_BUDGET in world.names()


async def test_scale_up_waits_for_approval(time_skipping_env: WorkflowEnvironment) -> None:
    client = time_skipping_env.client
    world = FakeWorld(
        runbooks=with_spec(
            "inference",
            replacement={"pendingDeadline": "5m"},
            scaleUp={"enabled": True, "provider": "twin", "maxSize": 4, "approval": True},
        ),
        replacement_reports=[
            ReplacementReport(status="pending"),
            ReplacementReport(status="running"),
        ],
    )
    async with new_worker(client, world) as worker:
        handle = await start(client, worker, world)
        await past_deadline(time_skipping_env, handle, world, Phase.AWAITING_REPLACEMENT)
        await wait_phase(handle, Phase.AWAITING_APPROVAL)
        assert ACT_REQUEST_CAPACITY not in world.names()  # nothing bought before approval
        await handle.execute_update(
            UPD_APPROVE, ApprovalDecision(approve=True, actor="lee"), result_type=ApprovalResult
        )
        await wait_phase(handle, Phase.HOLDING)
        await handle.signal(SIG_REPAIRED, RepairedRequest(actor="lee"))
        result = await handle.result()
    assert result.outcome == "released"
    req = world.args(ACT_REQUEST_CAPACITY)[0]
    assert req.pool.provider == "twin" and req.max_size == 4


async def test_scale_up_rejected_escalates_and_holds_the_quarantined_device(
    time_skipping_env: WorkflowEnvironment,
) -> None:
    """A rejected scale-up escalates and keeps holding the device it already quarantined: the
    rule stays until released, and the lease is given back only then (closing at once would
    leave a DeviceTaintRule nobody owns and a budget slot free for a device still tainted)."""
    client = time_skipping_env.client
    world = FakeWorld(
        runbooks=with_spec(
            "inference",
            replacement={"pendingDeadline": "5m"},
            scaleUp={"enabled": True, "provider": "twin", "maxSize": 4, "approval": True},
        ),
        replacement_reports=[ReplacementReport(status="pending")],
    )
    async with new_worker(client, world) as worker:
        handle = await start(client, worker, world)
        await past_deadline(time_skipping_env, handle, world, Phase.AWAITING_REPLACEMENT)
        await wait_phase(handle, Phase.AWAITING_APPROVAL)
        await handle.execute_update(
            UPD_APPROVE,
            ApprovalDecision(approve=False, actor="lee", reason="no budget for nodes"),
            result_type=ApprovalResult,
        )
        await wait_phase(handle, Phase.HOLDING)
        assert ACT_RELEASE_QUARANTINE not in world.names()
        assert ACT_RELEASE_BUDGET not in world.names()
        await handle.signal(SIG_REPAIRED, RepairedRequest(actor="lee"))
        result = await handle.result()
    assert result.outcome == "escalated"
    assert result.status.escalation_reason == "approval-rejected"
    assert ACT_REQUEST_CAPACITY not in world.names()
    names = world.names()
    assert names.index(ACT_RELEASE_QUARANTINE) < names.index(ACT_RELEASE_BUDGET)


async def test_escalation_puts_an_event_on_the_pods(time_skipping_env: WorkflowEnvironment) -> None:
    client = time_skipping_env.client
    world = FakeWorld(budget_granted=False)
    async with new_worker(client, world) as worker:
        handle = await start(client, worker, world)
        await _close_waiting(handle)
    events = {e.reason: e for e in world.args(ACT_RECORD_EVENT)}
    assert list(events) == ["GPUFailureConfirmed", "GPURemediationEscalated"]
    event = events["GPURemediationEscalated"]
    assert event.type == "Warning" and "Needed:" in event.message and event.aggregate
    kinds = {(t.kind, t.name) for t in event.targets}
    assert kinds == {("Node", NODE), ("Deployment", "llm"), ("Pod", "llm-7d9f-abcde")}


def _targets(event: Any) -> set[tuple[str, str]]:
    return {(t.kind, t.name) for t in event.targets}


async def test_events_for_every_decision_on_objects_that_exist(
    time_skipping_env: WorkflowEnvironment,
) -> None:
    """Confirmation, quarantine, eviction, replacement and release each write an Event on the
    rule, the node, the owner and the pods that exist then: the evicted pod only while it is
    still there, the replacement once it runs."""
    client = time_skipping_env.client
    new_pod = PodRef(namespace="serving", name="llm-7d9f-zzzzz", uid="uid-new")
    world = FakeWorld(
        replacement_reports=[
            ReplacementReport(
                status="running", pods=[PodState(pod=new_pod, phase="Running", node=NODE)]
            )
        ]
    )
    async with new_worker(client, world) as worker:
        handle = await start(client, worker, world)
        await wait_phase(handle, Phase.HOLDING)
        await handle.signal(SIG_REPAIRED, RepairedRequest(actor="erin"))
        await handle.result()
    events = world.args(ACT_RECORD_EVENT)
    assert [e.reason for e in events] == [
        "GPUFailureConfirmed",
        "GPUQuarantined",
        "GPUConsumersEvicted",
        "GPUReplacementRunning",
        "GPUQuarantineReleased",
    ]
    by = {e.reason: e for e in events}
    rule = taint_rule_name(world.node, world.gpu_uuid)
    old = ("Pod", "llm-7d9f-abcde")
    assert _targets(by["GPUQuarantined"]) == {
        ("DeviceTaintRule", rule),
        ("Node", NODE),
        ("Deployment", "llm"),
        old,
    }
    assert by["GPUQuarantined"].targets[0].api_version == "resource.k8s.io/v1"
    for later in ("GPUConsumersEvicted", "GPUReplacementRunning", "GPUQuarantineReleased"):
        assert old not in _targets(by[later]), later  # never on an evicted pod
        assert ("Deployment", "llm") in _targets(by[later]), later
    assert ("Node", NODE) in _targets(by["GPUQuarantineReleased"])
    # One Kubernetes request per decision and object: what the Events cost a remediation.
    assert sum(len(e.targets) for e in events) == 12
    assert ("Pod", new_pod.name) in _targets(by["GPUReplacementRunning"])
    assert ("DeviceTaintRule", rule) not in _targets(by["GPUQuarantineReleased"])  # deleted
    assert all(t.count == 1 for e in events for t in e.targets)


async def test_pending_escalation_event_is_on_the_pending_replacement(
    time_skipping_env: WorkflowEnvironment,
) -> None:
    client = time_skipping_env.client
    pending = PodRef(namespace="serving", name="llm-7d9f-pend1", uid="uid-pend")
    world = FakeWorld(
        runbooks=with_spec("inference", replacement={"pendingDeadline": "5m"}),
        replacement_reports=[
            ReplacementReport(
                status="pending",
                pods=[PodState(pod=pending, phase="Pending")],
                unschedulable_message="0/1 nodes are available: 1 cannot allocate all claims.",
            )
        ],
    )
    async with new_worker(client, world) as worker:
        handle = await start(client, worker, world)
        await past_deadline(time_skipping_env, handle, world, Phase.AWAITING_REPLACEMENT)
        await wait_phase(handle, Phase.HOLDING)
        await handle.signal(SIG_REPAIRED, RepairedRequest(actor="erin"))
        await handle.result()
    (escalation,) = [
        e
        for e in world.args(ACT_RECORD_EVENT)
        if e.type == "Warning" and e.reason == "GPURemediationEscalated"
    ]
    assert ("Pod", pending.name) in _targets(escalation)
    assert ("Pod", "llm-7d9f-abcde") not in _targets(escalation)  # evicted, gone
    assert {("Deployment", "llm"), ("Node", NODE)} <= _targets(escalation)


async def test_unknown_device_escalates_with_default_runbook(
    time_skipping_env: WorkflowEnvironment,
) -> None:
    """A step failing before any runbook is chosen still escalates (through `default`)."""
    from temporalio import activity as act
    from temporalio.worker import Worker

    from contract.errors import ERR_DEVICE_NOT_FOUND
    from contract.names import ACT_RESOLVE_DEVICE
    from workflows.budget import BudgetWorkflow
    from workflows.remediation import DeviceRemediationWorkflow

    client = time_skipping_env.client
    world = FakeWorld()

    @act.defn(name=ACT_RESOLVE_DEVICE)
    async def not_found(req: object) -> None:
        raise ApplicationError(
            "no ResourceSlice device has uuid GPU-x", type=ERR_DEVICE_NOT_FOUND, non_retryable=True
        )

    async with Worker(
        client,
        task_queue="tq-not-found",
        workflows=[DeviceRemediationWorkflow, BudgetWorkflow],
        activities=world.activities(not_found),
    ) as worker:
        handle = await start(client, worker, world)
        result = await handle.result()
    assert result.outcome == "escalated" and "DeviceNotFound" in result.reason
    assert [n.channel for n in world.args(ACT_NOTIFY)] == ["pagerduty"]  # default's channel
    assert ACT_QUARANTINE not in world.names()


async def test_made_up_devices_page_once_per_node(time_skipping_env: WorkflowEnvironment) -> None:
    """Alerts naming GPUs the cluster does not have (5,000 fabricated UUIDs paged 5,000 times):
    the first remediation of a node pages, the others say who did and page nobody; the
    rejections workflow counts them. Another node pages once for itself; a person's launch of
    a device the cluster has not got is invalid input: it fails at once and pages nobody."""
    from temporalio import activity as act
    from temporalio.worker import Worker

    from activities.launch import LaunchActivities
    from contract.errors import ERR_DEVICE_NOT_FOUND
    from contract.kube import DeviceRef
    from contract.names import (
        ACT_RESOLVE_DEVICE,
        QRY_REJECTIONS,
        WF_REMEDIATE,
        device_workflow_id,
        rejections_workflow_id,
    )
    from contract.notify import RejectionsSummary
    from contract.remediation import RemediationInput, RemediationResult
    from workflows.budget import BudgetWorkflow
    from workflows.rejections import RejectionsWorkflow
    from workflows.remediation import DeviceRemediationWorkflow

    client = time_skipping_env.client
    world = FakeWorld()
    queue = f"tq-made-up-{uuid.uuid4().hex[:6]}"

    @act.defn(name=ACT_RESOLVE_DEVICE)
    async def not_found(req: object) -> None:
        raise ApplicationError(
            "no ResourceSlice device has that uuid", type=ERR_DEVICE_NOT_FOUND, non_retryable=True
        )

    claims = LaunchActivities(client, queue)
    # Real time: the rejections workflow's hourly housekeeping timer must not be skipped to
    # (the window is 30 minutes).
    with time_skipping_env.auto_time_skipping_disabled():
        async with Worker(
            client,
            task_queue=queue,
            workflows=[DeviceRemediationWorkflow, BudgetWorkflow, RejectionsWorkflow],
            activities=world.activities(not_found, claims.claim_escalation),
        ) as worker:
            results = []
            for i in range(4):
                handle = await start(client, worker, world, gpu_uuid=f"GPU-made-up-{i}")
                results.append(await handle.result())
            other = FakeWorld(node="gpu-node-other")
            results.append(await (await start(client, worker, other, gpu_uuid="GPU-x")).result())
            by_hand = await client.start_workflow(
                WF_REMEDIATE,
                RemediationInput(
                    device=DeviceRef(node=world.node, gpu_uuid="GPU-made-up-9"), trigger="manual"
                ),
                id=device_workflow_id(world.node, "GPU-made-up-9"),
                task_queue=queue,
                result_type=RemediationResult,
            )
            with pytest.raises(WorkflowFailureError) as typo:
                await by_hand.result()
            summary = await client.get_workflow_handle(rejections_workflow_id(queue)).query(
                QRY_REJECTIONS, result_type=RejectionsSummary
            )
    assert all(r.outcome == "escalated" for r in results)
    pages = [n for n in world.args(ACT_NOTIFY) if n.action == "trigger"]
    assert len(pages) == 2  # node 1 once, the other node once; never the person's typo
    assert isinstance(typo.value.cause, ApplicationError)
    assert (
        typo.value.cause.type == "InvalidInput" and "no ResourceSlice" in typo.value.cause.message
    )
    first = device_workflow_id(world.node, "GPU-made-up-0")
    for r in results[1:4]:
        assert "not paged" in r.reason and first in r.reason
        assert "escalation not sent" in actions(r.timeline)
    (counted,) = [x for x in summary.reasons if x.reason == "device-not-found"]
    assert counted.count == 5  # every alert-triggered one asked; the manual one did not
    by_node = {c.node: c.suppressed for c in summary.claims}
    assert by_node == {world.node: 3, "gpu-node-other": 0}


async def test_capacity_call_on_a_dead_worker_is_retried_after_the_heartbeat_timeout(
    time_skipping_env: WorkflowEnvironment, monkeypatch: Any
) -> None:
    """The first request-capacity attempt hangs without heartbeating (its worker was killed):
    the heartbeat timeout ends it and the retry answers, long before the 15 min
    start-to-close. The test server does not skip time while an activity runs, so the
    heartbeat timeout is shortened to 2 s here (unsandboxed runner, patched constant); the
    shipped value is checked separately (45 s, 4.5 beats of the activity's 10 s)."""
    import asyncio

    from temporalio import activity as act
    from temporalio.worker import UnsandboxedWorkflowRunner, Worker

    from activities.capacity import CapacityActivities
    from workflows import call_options
    from workflows.budget import BudgetWorkflow
    from workflows.remediation import DeviceRemediationWorkflow, calls

    # The shipped value, shared with the node incident (workflows/call_options.py).
    assert calls.CAPACITY_HEARTBEAT is call_options.CAPACITY_HEARTBEAT
    assert call_options.CAPACITY_HEARTBEAT == timedelta(seconds=45)
    beat = CapacityActivities.__init__.__kwdefaults__["heartbeat_every"]
    assert call_options.CAPACITY_HEARTBEAT >= 3 * beat
    monkeypatch.setattr(calls, "CAPACITY_HEARTBEAT", timedelta(seconds=2))
    monkeypatch.setattr(
        calls,
        "CAPACITY_RETRY",
        calls.CAPACITY_RETRY.__class__(initial_interval=timedelta(milliseconds=100)),
    )
    client = time_skipping_env.client
    world = FakeWorld(
        replacement_reports=[
            ReplacementReport(status="pending"),
            ReplacementReport(status="running"),
        ]
    )
    attempts: list[int] = []

    @act.defn(name=ACT_REQUEST_CAPACITY)
    async def dies_first(req: Any) -> CapacityResult:
        attempts.append(act.info().attempt)
        if act.info().attempt == 1:
            await asyncio.sleep(3600)  # a dead worker: no heartbeat, no answer
        return CapacityResult(status="requested", current_size=2, target_size=3)

    async with Worker(
        client,
        task_queue=f"tq-capacity-dead-{world.gpu_uuid}",
        workflows=[DeviceRemediationWorkflow, BudgetWorkflow],
        activities=world.activities(dies_first),
        workflow_runner=UnsandboxedWorkflowRunner(),
        max_heartbeat_throttle_interval=timedelta(milliseconds=20),
    ) as worker:
        handle = await start(client, worker, world)
        await past_deadline(time_skipping_env, handle, world, Phase.AWAITING_REPLACEMENT)
        await wait_phase(handle, Phase.HOLDING)
        await handle.signal(SIG_REPAIRED, RepairedRequest(actor="ops"))
        result = await handle.result()
        history = await handle.fetch_history()
    assert attempts == [1, 2]
    assert result.outcome == "released"
    assert scheduled_heartbeats(history)[ACT_REQUEST_CAPACITY] == timedelta(seconds=2)
    timed_out = [
        e
        for e in history.events
        if e.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_STARTED
        and e.activity_task_started_event_attributes.attempt == 2
    ]
    assert timed_out, "the capacity call was not retried"
    # Workflow time from the capacity call to its retry: about the heartbeat timeout plus
    # backoff (10 s), not the 15 minute start-to-close.
    started_at = next(
        e.event_time.ToDatetime()
        for e in history.events
        if e.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED
        and e.activity_task_scheduled_event_attributes.activity_type.name == ACT_REQUEST_CAPACITY
    )
    retried_at = timed_out[0].event_time.ToDatetime()
    assert retried_at - started_at < timedelta(minutes=3), retried_at - started_at
