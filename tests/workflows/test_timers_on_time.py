"""Every runbook timer acts on time: the step after it starts when it fires, whatever the
activity it stopped is doing, and the escalation states the time really waited.

Two kinds of proof. Where the activity the timer races keeps running, the real dev server
and real time: the fake never ends by itself (it ignores its cancel until the test releases
it), so the step after the timer can only have been started by the workflow's timer, while
the activity still ran; the assertions are on order (history events), never on how fast.
Where nothing runs during the timer, the time-skipping server and its exact times.

Cases:
- Pending deadline (`3s`): the escalation comes while the watch of the replacement still
  runs; the look at the pods is scheduled after the timer fired and before the watch ended;
  the escalation says `waited Ns` with N at least the deadline (the capacity deadline is the
  same timer and race, in the same function, after a scale-up: `replace._wait_replacement`);
- eviction timeout (mode eviction-api, `timeout: 3s`, `force: none`, a budget refusing the
  eviction): evict-pods retries the refusal for exactly the timeout, the refused pod is not
  waited for (such a wait never ends here), the escalation says `after Ns` and names the
  budget;
- repair rung (reset Job) and validation timeouts (time-skipping): the Job still running (its
  poll answering "still running" every 5 s), the rung fails when the timeout's timer fires,
  not a minute later (the poll's schedule-to-close);
- approval timeout (time-skipping): the escalation follows the timer at once.
"""

from __future__ import annotations

import asyncio
import contextlib
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from temporalio import activity
from temporalio.api.enums.v1 import EventType
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
    ACT_WAIT_REPAIR_JOB,
    ACT_WAIT_REPLACEMENT,
    QRY_STATUS,
    QRY_TIMELINE,
)
from contract.remediation import Phase, RemediationStatus, TimelineEntry
from contract.repair_rungs import RepairJobOutcome, WaitRepairJobInput
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

# On time, on the time-skipping server: the late behaviour these cases catch is a minute late
# (the poll's schedule-to-close, the next timer). The skipped clock runs at real speed while a
# worker handles a task, so on a loaded machine the step after a timer lands a few real seconds
# after it (1.6 s seen with load average 17 on 2 cores); 20 s keeps both apart.
ON_TIME = timedelta(seconds=20)


@dataclass
class Clock:
    """What the fakes share with the test: the watches hold until the test releases them."""

    released: bool = False
    started: int = 0
    ended: int = 0
    cancels_ignored: int = 0
    retry_blocked_for: list[timedelta] = field(default_factory=list)


async def _held(clock: Clock) -> None:
    """Heartbeat until the test releases the activity: a cancel that reaches it before
    then is ignored (it "arrives late"), so the activity never ends by itself."""
    while not clock.released:
        try:
            activity.heartbeat()
            await asyncio.sleep(0.02)
        except asyncio.CancelledError:
            clock.cancels_ignored += 1


def watch(clock: Clock) -> Any:
    """wait-for-replacement: the watch sees Pending until released; a look says Pending."""

    @fake_of(KubeActivities.wait_for_replacement)
    async def wait_replacement(req: WaitReplacementInput) -> ReplacementReport:
        if req.look_once:
            return ReplacementReport(status="pending", unschedulable_message="0/2 nodes")
        clock.started += 1
        try:
            await _held(clock)
        finally:
            clock.ended += 1
        raise asyncio.CancelledError()

    return wait_replacement


def eviction(clock: Clock, budget: str) -> list[Any]:
    """evict-pods refused by a budget for its whole `retry_blocked_for` (real time, as the
    real activity retries), and an eviction wait that never ends by itself."""

    @fake_of(KubeActivities.evict_pods)
    async def evict(req: EvictPodsInput) -> EvictPodsResult:
        if req.retry_blocked_for:
            clock.retry_blocked_for.append(req.retry_blocked_for)
            began = activity.info().current_attempt_scheduled_time.astimezone(UTC)
            while datetime.now(UTC) < began + req.retry_blocked_for:
                activity.heartbeat()
                await asyncio.sleep(0.05)
        return EvictPodsResult(blocked=req.pods, budgets=[budget], attempts=4)

    @fake_of(KubeActivities.wait_for_eviction)
    async def wait_eviction(req: WaitEvictionInput) -> EvictionReport:
        clock.started += 1
        try:
            await _held(clock)
        finally:
            clock.ended += 1
        return EvictionReport(remaining=req.pods, timed_out=True)

    return [evict, wait_eviction]


def job_poll(clock: Clock, hangs: str) -> Any:
    """wait-for-repair-job, a poll like the real one: the `hangs` Job ("reset" / "validate")
    never finishes, so every attempt answers "still running" (retried every 5 s); any other
    Job passes."""

    @fake_of(KubeRepairActivities.wait_for_repair_job)
    async def wait_for_repair_job(req: WaitRepairJobInput) -> RepairJobOutcome:
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


async def until_done(
    handle: Any,
    done: Callable[[RemediationStatus, list[TimelineEntry]], bool],
    limit: timedelta = timedelta(seconds=60),
) -> tuple[RemediationStatus, list[TimelineEntry]]:
    """Real time (the dev server): query the run until `done`; fail after `limit`."""
    loop = asyncio.get_running_loop()
    give_up = loop.time() + limit.total_seconds()
    while True:
        status = await handle.query(QRY_STATUS, result_type=RemediationStatus)
        entries = await handle.query(QRY_TIMELINE, result_type=list[TimelineEntry])
        if done(status, entries):
            return status, entries
        assert loop.time() < give_up, f"not done after {limit}: {status.phase} {entries[-3:]}"
        await asyncio.sleep(0.2)


def closed(history: Any, scheduled_event: Any) -> list[Any]:
    """The events that end the activity scheduled by `scheduled_event`."""
    ends = {
        EventType.EVENT_TYPE_ACTIVITY_TASK_COMPLETED: "activity_task_completed_event_attributes",
        EventType.EVENT_TYPE_ACTIVITY_TASK_FAILED: "activity_task_failed_event_attributes",
        EventType.EVENT_TYPE_ACTIVITY_TASK_TIMED_OUT: "activity_task_timed_out_event_attributes",
        EventType.EVENT_TYPE_ACTIVITY_TASK_CANCELED: "activity_task_canceled_event_attributes",
    }
    return [
        e
        for e in history.events
        if e.event_type in ends
        and getattr(e, ends[e.event_type]).scheduled_event_id == scheduled_event.event_id
    ]


async def test_replacement_deadline_acts_when_its_timer_fires(dev_env: WorkflowEnvironment) -> None:
    """`pendingDeadline: 3s` (real time, the dev server). The watch of the replacement never
    ends by itself and ignores its cancel until the test releases it: the escalation can only
    come from the workflow's own timer, while the watch still runs."""
    client = dev_env.client
    clock = Clock()
    world = FakeWorld(
        runbooks=replacement_runbooks(
            replacement={"pendingDeadline": "3s", "unsafe": ["pendingDeadline"]},
            scaleUp={"enabled": False},
        )
    )
    async with new_worker(client, world, [watch(clock)]) as worker:
        handle = await start(client, worker, world)
        try:
            status, entries = await until_done(handle, holding_or_escalated)
            still_watching = clock.started - clock.ended
            history = await handle.fetch_history()
        finally:
            clock.released = True  # the cancel "arrives"; the watch ends
            with contextlib.suppress(Exception):
                await handle.terminate("test over")
    assert still_watching == 1, "the escalation waited for the watch to end"
    watches = scheduled(history, ACT_WAIT_REPLACEMENT)
    the_watch, look = watches[0], watches[1]
    fired = fired_after(history, the_watch)
    assert fired.event_id < look.event_id
    assert not [e for e in closed(history, the_watch) if e.event_id < look.event_id]
    assert status.escalation_reason == "pending-deadline"
    escalated = entry(entries, "escalate")
    took = re.search(r"waited (\d+)s", escalated.reason)
    assert took and int(took.group(1)) >= 3, escalated.reason
    assert escalated.at >= at(fired)


async def test_eviction_timeout_escalates_on_time_saying_how_long(
    dev_env: WorkflowEnvironment,
) -> None:
    """`timeout: 3s`, `force: none`, a budget refusing the eviction all along (real time):
    evict-pods retries the refusal for the timeout, and the escalation follows it. A wait for
    the refused pod would never end here (the fake holds until released): the escalation
    comes without one."""
    client = dev_env.client
    clock = Clock()
    budget = "serving/llm: The disruption budget llm needs 1 healthy pods and has 1 currently"
    world = FakeWorld(
        runbooks=with_spec(
            "inference",
            eviction={
                "mode": "eviction-api",
                "timeout": "3s",
                "force": "none",
                "unsafe": ["timeout"],
            },
            escalation={"channels": ["pagerduty"]},
        ),
        consumers=[deployment_consumer()],
    )
    async with new_worker(client, world, eviction(clock, budget)) as worker:
        handle = await start(client, worker, world)
        try:
            status, entries = await until_done(handle, holding_or_escalated)
            history = await handle.fetch_history()
        finally:
            clock.released = True
            with contextlib.suppress(Exception):
                await handle.terminate("test over")
    (began,) = scheduled(history, ACT_EVICT_PODS)
    assert clock.retry_blocked_for == [timedelta(seconds=3)]
    assert clock.started == 0, "the refused pod was waited for"
    escalated = entry(entries, "escalate")
    assert status.escalation_reason == "eviction-timeout"
    assert escalated.at - at(began) >= timedelta(seconds=3)
    took = re.search(
        r"PodDisruptionBudget blocks eviction after (\d+)s \(eviction timeout 3s",
        (escalated.reason),
    )
    assert took and int(took.group(1)) >= 3, escalated.reason
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
