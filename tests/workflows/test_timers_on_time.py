"""Every runbook timer acts on time: the step after it starts when it fires, whatever the
activity it stopped is doing, and the escalation states the time really waited.

Time-skipping server, no wall-clock assertion: times are the server's (history event times,
timeline entries). The fakes model the real activities in server time: a watch heartbeats
until cancelled, and its cancel may arrive late (the real one learns of it with its next
heartbeat, up to 0.8 x the 60 s heartbeat timeout later); evict-pods retries a budget's
refusal for `retry_blocked_for`; the eviction wait ends at its own deadline.

Cases:
- Pending deadline: the watch's cancel arrives 2 minutes late; the look at the pods is
  scheduled within 1 s of the timer firing, and the escalation says `waited 5m`;
- (the capacity deadline is the same timer and race, in the same function, after a
  scale-up: `replace._wait_replacement`);
- eviction timeout (mode eviction-api, `timeout: 20s`, `force: none`, a budget refusing the
  eviction): the escalation comes 20 s after the evictions began, not 2 min 20 s, and says
  `after 20s`;
- repair rung (reset Job) and validation timeouts: the Job still running (its poll answering
  "still running" every 5 s), the rung fails when the timeout's timer fires, not a minute
  later (the poll's schedule-to-close);
- approval timeout: the escalation follows the timer at once.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

import google.protobuf.empty_pb2
import pytest
from temporalio import activity
from temporalio.api.enums.v1 import EventType
from temporalio.api.testservice.v1 import LockTimeSkippingRequest, UnlockTimeSkippingRequest
from temporalio.client import WorkflowExecutionStatus
from temporalio.exceptions import ApplicationError
from temporalio.testing import WorkflowEnvironment

from activities.kube import KubeActivities
from activities.kube.repair_activities import KubeRepairActivities
from contract.errors import ERR_STILL_WAITING
from contract.kube import (
    EvictionReport,
    EvictPodsInput,
    EvictPodsResult,
    ReplacementReport,
    WaitEvictionInput,
    WaitReplacementInput,
)
from contract.names import (
    ACT_EVICT_PODS,
    ACT_WAIT_EVICTION,
    ACT_WAIT_REPAIR_JOB,
    ACT_WAIT_REPLACEMENT,
    QRY_STATUS,
    QRY_TIMELINE,
)
from contract.remediation import Phase, RemediationStatus, TimelineEntry
from contract.repair import RepairJobOutcome, WaitRepairJobInput
from contract.runbook import Runbook
from tests.workflows.fakes import (
    FakeWorld,
    deployment_consumer,
    fake_of,
    make_runbook,
    new_worker,
    shipped_runbooks,
    start,
    xid_alert,
)
from tests.workflows.repair_fakes import RepairScript, repair_activities
from tests.workflows.test_remediation import with_spec
from tests.workflows.test_repair import runbooks as repair_runbooks

LATE = timedelta(minutes=2)  # how late a cancel reaches the activity in these tests
ON_TIME = timedelta(seconds=1)


@dataclass
class Clock:
    """What the fakes share with the test: which activities ignore a cancel until released."""

    late_from: int = 0  # the n-th (0-based) watch / Job poll on ignores its cancel for now
    released: bool = False
    started: int = 0
    ended: int = 0
    cancels_ignored: int = 0
    calls: list[str] = field(default_factory=list)


async def _server_now() -> datetime:
    resp = await activity.client().test_service.get_current_time(google.protobuf.empty_pb2.Empty())
    return resp.time.ToDatetime().replace(tzinfo=UTC)


def _began() -> datetime:
    """When this attempt was scheduled (server time): the real activity's clock starts then,
    give or take the milliseconds a worker takes to pick it up."""
    return activity.info().current_attempt_scheduled_time.astimezone(UTC)


@contextlib.asynccontextmanager
async def _time_given_back() -> AsyncIterator[None]:
    """An activity that waits gives back its hold on the server's clock (as fakes.py's watch
    does), so the test's `env.sleep` moves time while it runs; taken back before it ends."""
    service = activity.client().test_service
    await service.unlock_time_skipping(UnlockTimeSkippingRequest())
    try:
        yield
    finally:
        details = activity.cancellation_details()
        if not (details and (details.not_found or details.timed_out)):
            await service.lock_time_skipping(LockTimeSkippingRequest())


async def _hold(clock: Clock, until: datetime | None = None, late: bool = False) -> bool:
    """Heartbeat until server time reaches `until` (True), or until cancelled (raises); with
    `late`, a cancel is ignored until the test releases it (it "arrives" then)."""
    cancelled = False
    while True:
        try:
            activity.heartbeat()
            if until is not None and await _server_now() >= until:
                return True
            if cancelled and clock.released:
                raise asyncio.CancelledError()
            await asyncio.sleep(0.02)
        except asyncio.CancelledError:
            if not late or clock.released:
                raise
            if not cancelled:
                clock.cancels_ignored += 1
            cancelled = True


def watch(clock: Clock) -> Any:
    """wait-for-replacement: the watch sees Pending until cancelled; a look says Pending."""

    @fake_of(KubeActivities.wait_for_replacement)
    async def wait_replacement(req: WaitReplacementInput) -> ReplacementReport:
        clock.calls.append(ACT_WAIT_REPLACEMENT)
        if req.look_once:
            return ReplacementReport(status="pending", unschedulable_message="0/2 nodes")
        n, clock.started = clock.started, clock.started + 1
        try:
            async with _time_given_back():
                await _hold(clock, late=n >= clock.late_from)
        finally:
            clock.ended += 1
        raise AssertionError("the watch never ends by itself here")

    return wait_replacement


def eviction(clock: Clock, budget: str) -> list[Any]:
    """evict-pods refused by a budget for its whole `retry_blocked_for` (server time), and
    the eviction wait watching until its own deadline."""

    @fake_of(KubeActivities.evict_pods)
    async def evict(req: EvictPodsInput) -> EvictPodsResult:
        clock.calls.append(ACT_EVICT_PODS)
        if req.retry_blocked_for:
            async with _time_given_back():
                await _hold(clock, until=_began() + req.retry_blocked_for)
        return EvictPodsResult(blocked=req.pods, budgets=[budget], attempts=4)

    @fake_of(KubeActivities.wait_for_eviction)
    async def wait_eviction(req: WaitEvictionInput) -> EvictionReport:
        clock.calls.append(ACT_WAIT_EVICTION)
        if req.timeout > timedelta(0):
            async with _time_given_back():
                await _hold(clock, until=_began() + req.timeout)
        return EvictionReport(remaining=req.pods, timed_out=True)

    return [evict, wait_eviction]


def job_poll(clock: Clock, hangs: str) -> Any:
    """wait-for-repair-job, a poll like the real one: the `hangs` Job ("reset" / "validate")
    never finishes, so every attempt answers "still running" (retried every 5 s); any other
    Job passes."""

    @fake_of(KubeRepairActivities.wait_for_repair_job)
    async def wait_for_repair_job(req: WaitRepairJobInput) -> RepairJobOutcome:
        clock.calls.append(ACT_WAIT_REPAIR_JOB)
        if f"-{hangs}-" in req.job_name:
            raise ApplicationError(f"Job {req.job_name} still running", type=ERR_STILL_WAITING)
        return RepairJobOutcome(passed=True, summary="Diagnostic | PASS")

    return wait_for_repair_job


async def drive(
    env: WorkflowEnvironment,
    handle: Any,
    done: Callable[[RemediationStatus, list[TimelineEntry]], bool],
    *,
    step: timedelta,
    limit: timedelta,
    first: timedelta | None = None,
) -> tuple[RemediationStatus, list[TimelineEntry]]:
    """Move the server's time in `step`s (the first one `first`) until `done`, or until
    `limit` of server time passed. Workflow timers and retries fire at their exact times
    whatever the step; only the fakes' own deadlines are seen a step late."""
    until = await env.get_current_time() + limit
    if first is not None:
        await env.sleep(first)
        await asyncio.sleep(0.03)
    while True:
        description = await handle.describe()
        if description.status != WorkflowExecutionStatus.RUNNING:  # it went on and closed
            result = await handle.result()
            return result.status, result.timeline
        status = await handle.query(QRY_STATUS, result_type=RemediationStatus)
        entries = await handle.query(QRY_TIMELINE, result_type=list[TimelineEntry])
        if done(status, entries) or await env.get_current_time() >= until:
            return status, entries
        await env.sleep(step)
        await asyncio.sleep(0.03)  # the fakes see the new time


def at(event: Any) -> datetime:
    return event.event_time.ToDatetime().replace(tzinfo=UTC)


def scheduled(history: Any, name: str) -> list[Any]:
    return [
        e
        for e in history.events
        if e.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED
        and e.activity_task_scheduled_event_attributes.activity_type.name == name
    ]


def fired_after(history: Any, after: Any) -> Any:
    return next(
        e
        for e in history.events
        if e.event_type == EventType.EVENT_TYPE_TIMER_FIRED and e.event_id > after.event_id
    )


def entry(entries: list[TimelineEntry], action: str) -> TimelineEntry:
    return next(e for e in entries if e.action == action)


def holding_or_escalated(status: RemediationStatus, _: list[TimelineEntry]) -> bool:
    return status.phase in (Phase.HOLDING, Phase.CLOSED)


def replacement_runbooks(**spec: Any) -> list[Runbook]:
    others = [r for r in shipped_runbooks() if r.name != "inference"]
    base = next(r for r in shipped_runbooks() if r.name == "inference")
    return [
        *others,
        make_runbook(
            "inference",
            base.spec.precedence,
            match={"ownerKinds": ["Deployment"]},
            escalation={"channels": ["pagerduty"]},
            **spec,
        ),
    ]


@pytest.mark.parametrize(
    ("spec", "late_from", "reason", "waited"),
    [
        (
            {"replacement": {"pendingDeadline": "5m"}, "scaleUp": {"enabled": False}},
            0,
            "pending-deadline",
            "waited 5m",
        ),
    ],
    ids=["pending-deadline"],
)
async def test_replacement_deadline_acts_when_its_timer_fires(
    time_skipping_env: WorkflowEnvironment,
    spec: dict[str, Any],
    late_from: int,
    reason: str,
    waited: str,
) -> None:
    env, client = time_skipping_env, time_skipping_env.client
    clock = Clock(late_from=late_from)
    world = FakeWorld(runbooks=replacement_runbooks(**spec))
    async with new_worker(client, world, [watch(clock)]) as worker:
        handle = await start(client, worker, world)
        # The deadline fires; the late watch still runs for LATE after it: time moves on.
        status, _ = await drive(
            env,
            handle,
            holding_or_escalated,
            step=timedelta(minutes=1),
            limit=timedelta(minutes=20),
        )
        await drive(env, handle, lambda *_: False, step=timedelta(seconds=30), limit=LATE)
        clock.released = True  # the cancel "arrives"
        status, entries = await drive(
            env, handle, holding_or_escalated, step=timedelta(seconds=1), limit=timedelta(minutes=1)
        )
        history = await handle.fetch_history()
        # Every watch has taken back its hold on the clock before the run goes: a watch of a
        # terminated run would leave the session's clock held and stop time for later tests.
        for _ in range(3000):  # at most ~60 s
            if clock.ended >= clock.started:
                break
            await asyncio.sleep(0.02)
        await handle.terminate("test over")
    watches = scheduled(history, ACT_WAIT_REPLACEMENT)
    late_watch, look = watches[2 * late_from], watches[2 * late_from + 1]
    fired = fired_after(history, late_watch)
    assert clock.cancels_ignored >= 1  # the cancel did reach the watch late
    assert at(look) - at(fired) < ON_TIME, f"look {at(look) - at(fired)} after the timer"
    assert status.escalation_reason == reason
    assert waited in entry(entries, "escalate").reason
    assert entry(entries, "escalate").at - at(fired) < ON_TIME


async def test_eviction_timeout_escalates_on_time_saying_how_long(
    time_skipping_env: WorkflowEnvironment,
) -> None:
    """`timeout: 20s`, `force: none`, a budget refusing the eviction all along."""
    env, client = time_skipping_env, time_skipping_env.client
    clock = Clock()
    budget = "serving/llm: The disruption budget llm needs 1 healthy pods and has 1 currently"
    world = FakeWorld(
        runbooks=with_spec(
            "inference",
            eviction={
                "mode": "eviction-api",
                "timeout": "20s",
                "force": "none",
                "unsafe": ["timeout"],
            },
            escalation={"channels": ["pagerduty"]},
        ),
        consumers=[deployment_consumer()],
    )
    async with new_worker(client, world, eviction(clock, budget)) as worker:
        handle = await start(client, worker, world)
        status, entries = await drive(
            env,
            handle,
            holding_or_escalated,
            first=timedelta(seconds=20),  # evict-pods' retries end at the timeout
            step=timedelta(milliseconds=250),
            limit=timedelta(minutes=1),
        )
        history = await handle.fetch_history()
        await handle.terminate("test over")
    (began,) = scheduled(history, ACT_EVICT_PODS)
    escalated = entry(entries, "escalate")
    assert status.escalation_reason == "eviction-timeout"
    took = escalated.at - at(began)
    assert timedelta(seconds=20) <= took < timedelta(seconds=20) + ON_TIME, took
    assert "PodDisruptionBudget blocks eviction after 20s (eviction timeout 20s" in (
        escalated.reason
    )
    assert "llm needs 1 healthy pods" in escalated.reason


@pytest.mark.parametrize(
    ("hangs", "failed"),
    [("reset", "reset Job failed"), ("validate", "validation failed")],
    ids=["reset-rung-timeout", "validation-timeout"],
)
async def test_repair_timeouts_act_when_their_timer_fires(
    time_skipping_env: WorkflowEnvironment, hangs: str, failed: str
) -> None:
    env, client = time_skipping_env, time_skipping_env.client
    clock = Clock()
    rbs = [
        rb.model_copy(
            update={
                "spec": rb.spec.model_copy(
                    update={
                        "validation": rb.spec.validation.model_copy(
                            update={"timeout": timedelta(minutes=10)}
                        ),
                        "repair": rb.spec.repair.model_copy(
                            update={
                                "reset": rb.spec.repair.reset.model_copy(
                                    update={"timeout": timedelta(minutes=10)}
                                )
                            }
                        ),
                    }
                )
            }
        )
        for rb in repair_runbooks()
    ]
    world = FakeWorld(runbooks=rbs)
    fakes = [
        a
        for a in repair_activities(world, RepairScript())
        if getattr(a, "__temporal_activity_definition").name != ACT_WAIT_REPAIR_JOB
    ]
    async with new_worker(client, world, [*fakes, job_poll(clock, hangs)]) as worker:
        handle = await start(client, worker, world, alerts=[xid_alert(48, "fp-48")])
        _, entries = await drive(
            env,
            handle,
            lambda _, es: any(e.action == failed for e in es),
            step=timedelta(minutes=1),
            limit=timedelta(minutes=15),
        )
        history = await handle.fetch_history()
        with contextlib.suppress(Exception):  # it may have gone on to the next rung and closed
            await handle.terminate("test over")
    polls = scheduled(history, ACT_WAIT_REPAIR_JOB)
    poll = polls[0] if hangs == "reset" else polls[1]  # the first Job that hangs
    took = entry(entries, failed).at - at(poll)
    assert timedelta(minutes=10) <= took < timedelta(minutes=10) + ON_TIME, took
    assert "did not finish within 10m" in entry(entries, failed).reason


async def test_approval_timeout_escalates_when_its_timer_fires(
    time_skipping_env: WorkflowEnvironment,
) -> None:
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
    asked = entry(result.timeline, "awaiting approval")
    timed_out = entry(result.timeline, "approval timed out")
    escalated = entry(result.timeline, "escalate")
    assert timedelta(minutes=10) <= timed_out.at - asked.at < timedelta(minutes=10) + ON_TIME
    assert escalated.at - timed_out.at < ON_TIME
    assert "no approval within 10m" in escalated.reason
