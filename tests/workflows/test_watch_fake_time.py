"""Time on the time-skipping server moves only when the test moves it, also around the fake
deadline-free watch (tests/workflows/fakes.py).

Case: a watch races a one-minute deadline timer; the test skips time while it watches
(`result_skipping_watches`); at the deadline the workflow cancels the watch, then runs an
activity of about a second beside a one-hour timer. The activity must end first: time is
held while an activity runs. (The earlier fake gave the server's hold back from inside the
watch and took it back only when it heard of its cancellation, which with the default
heartbeat throttle it never did: time ran on while later activities and workflow tasks ran,
the one-hour timer won or the run hit the ten-year default execution timeout, "Workflow
timed out", as the node incident's tests did under load.)
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

import pytest
from temporalio import activity, workflow
from temporalio.common import RetryPolicy
from temporalio.testing import WorkflowEnvironment
from temporalio.worker import Worker
from temporalio.workflow import ActivityCancellationType

from harness.stack import free_port
from tests.workflows.fakes import (
    WATCH_STEP,
    heartbeats_after,
    next_step,
    result_skipping_watches,
    skip_step,
    watch_until_cancelled,
)


@dataclass
class _World:
    watching: bool = False
    heartbeats: int = 0
    watch_cancelled: int = 0
    stepping: bool = False


WORLD = _World()


@activity.defn(name="test-watch")
async def watch() -> None:
    await watch_until_cancelled(WORLD)


@activity.defn(name="test-work")
async def work() -> str:
    await asyncio.sleep(1.0)
    return "activity"


async def _watch_under_a_deadline() -> bool:
    """In a workflow: the watch raced against a one-minute deadline timer; True when the
    deadline came first and cancelled it (TRY_CANCEL: not waited for)."""
    watching = workflow.start_activity(
        watch,
        start_to_close_timeout=timedelta(hours=1),
        heartbeat_timeout=timedelta(seconds=60),
        cancellation_type=ActivityCancellationType.TRY_CANCEL,
    )
    try:
        await workflow.wait_condition(watching.done, timeout=timedelta(minutes=1))
    except TimeoutError:
        watching.cancel()
        return True
    return False


@workflow.defn(name="test-watch-then-work", sandboxed=False)  # a test-only workflow
class WatchThenWork:
    @workflow.run
    async def run(self) -> list[str]:
        said: list[str] = []
        started = workflow.now()
        if await _watch_under_a_deadline():
            said.append(f"deadline after {(workflow.now() - started).total_seconds():.0f} s")
        else:
            said.append("the watch ended by itself")
        act = workflow.start_activity(
            work, start_to_close_timeout=timedelta(minutes=5), retry_policy=RetryPolicy()
        )
        timer = asyncio.ensure_future(workflow.sleep(timedelta(hours=1)))
        done, _ = await workflow.wait([act, timer], return_when=asyncio.FIRST_COMPLETED)
        said.append("activity" if act in done else "timer")
        timer.cancel()
        await act
        return said


@pytest.fixture
async def env(temporal_test_server_path: str) -> AsyncIterator[WorkflowEnvironment]:
    env = await WorkflowEnvironment.start_time_skipping(
        port=free_port(), test_server_existing_path=temporal_test_server_path
    )
    try:
        yield env
    finally:
        await env.shutdown()


async def test_time_moves_only_in_the_tests_steps_around_a_watch(
    env: WorkflowEnvironment,
) -> None:
    async with Worker(
        env.client,
        task_queue="tq-watch-fake",
        workflows=[WatchThenWork],
        activities=[watch, work],
        max_heartbeat_throttle_interval=timedelta(milliseconds=20),
    ):
        handle = await env.client.start_workflow(
            WatchThenWork.run, id="watch-fake-time", task_queue="tq-watch-fake"
        )
        said = await result_skipping_watches(env, handle, WORLD)
    assert said == ["deadline after 60 s", "activity"], said
    assert WORLD.watch_cancelled == 1 and not WORLD.watching


async def test_a_step_with_no_activity_holding_time_still_skips(
    time_skipping_env: WorkflowEnvironment,
) -> None:
    """A worker restarted while its watch was reported ended: no activity holds time, and the
    test's step gives back the only hold (the client's) once, not twice (which the server
    refuses: "Unbalanced lock and unlock calls"); the hold is the client's again after it."""
    before = await time_skipping_env.get_current_time()
    await skip_step(time_skipping_env, WATCH_STEP, test_holds=True)
    assert await time_skipping_env.get_current_time() - before >= WATCH_STEP
    await skip_step(time_skipping_env, WATCH_STEP, test_holds=True)  # balanced: works again
    assert await time_skipping_env.get_current_time() - before >= 2 * WATCH_STEP


def test_past_deadline_never_stops_between_the_deadline_and_its_target() -> None:
    """`past_deadline` skips to 1 s past a watch's deadline. A step ending inside that second
    was followed by one more while the workflow cancelled the watch; had the watch's hold gone
    when that step gave back the test's own, the server ran its clock to the next timer: an
    approval's 20-minute timeout, once, under the load of two suites. The step that crosses
    the deadline now lands on the target, whatever the watch's start time."""
    start = datetime(2026, 12, 7, tzinfo=UTC)
    deadline = start + timedelta(minutes=5)
    target = deadline + timedelta(seconds=1)
    for offset in range(0, 20_000, 125):  # every alignment of the 20 s steps, in ms
        now = start + timedelta(milliseconds=offset)
        ends = []
        while now < target:
            step = next_step(now, deadline, target)
            assert timedelta(0) < step <= WATCH_STEP + (target - deadline)
            now += step
            ends.append(now)
        assert ends[-1] == target
        inside = [e for e in ends if deadline < e < target]
        assert not inside, f"start +{offset} ms: a step ends {inside[0] - deadline} past it"


APPROVAL = timedelta(minutes=15)
ANSWERED = "answered"


@dataclass
class _Approval:
    waiting: bool = False
    answered: bool = False


@activity.defn(name="test-look")
async def look() -> None:
    await asyncio.sleep(0.01)


@workflow.defn(name="test-watch-then-approval", sandboxed=False)  # a test-only workflow
class WatchThenApproval:
    """The remediation's scale-up, in small: a watch races a one-minute deadline; at the
    deadline the workflow cancels it without waiting for its end (TRY_CANCEL), looks once
    more, then waits up to 15 minutes for an answer."""

    def __init__(self) -> None:
        self.state = _Approval()

    @workflow.run
    async def run(self) -> str:
        await _watch_under_a_deadline()
        await workflow.execute_activity(look, start_to_close_timeout=timedelta(minutes=1))
        self.state.waiting = True
        try:
            await workflow.wait_condition(lambda: self.state.answered, timeout=APPROVAL)
        except TimeoutError:
            return f"timed out at +{workflow.now() - workflow.info().start_time}"
        return ANSWERED

    @workflow.signal(name="answer")
    def answer(self) -> None:
        self.state.answered = True

    @workflow.query(name="waiting")
    def waiting(self) -> bool:
        return self.state.waiting


@pytest.mark.parametrize("busy", [0.0, 0.5])
async def test_a_watch_cancelled_inside_a_step_keeps_its_hold_until_the_tests_is_back(
    env: WorkflowEnvironment, busy: float
) -> None:
    """The step that crosses the deadline borrows the watch's hold; the workflow cancels the
    watch inside it and waits for an approval. Had the watch given its hold back before the
    test had its own back (the test's client slow to ask, `busy`, as under load), nothing
    held time: the server ran its clock to the approval's 15-minute timeout at once, and the
    test's answer came too late (test_scale_up_rejected_escalates_and_holds_the_quarantined_
    device, twice in CI)."""
    world = WORLD
    world.watch_cancelled = 0
    async with Worker(
        env.client,
        task_queue="tq-watch-approval",
        workflows=[WatchThenApproval],
        activities=[watch, look],
        max_heartbeat_throttle_interval=timedelta(milliseconds=20),
    ):
        started = await env.get_current_time()
        handle = await env.client.start_workflow(
            WatchThenApproval.run, id=f"watch-approval-{busy}", task_queue="tq-watch-approval"
        )
        loop = asyncio.get_running_loop()
        give_up = loop.time() + 60.0
        while loop.time() < give_up:
            if world.watching:
                break
            await asyncio.sleep(0.02)
        deadline = started + timedelta(minutes=1)
        target = deadline + timedelta(seconds=1)
        while (now := await env.get_current_time()) < target and world.watching:
            beats = world.heartbeats
            step = next_step(now, deadline, target)
            await skip_step(env, step, test_holds=True, world=world, busy=busy)
            await heartbeats_after(world, beats, give_up)
        while loop.time() < give_up:
            if await handle.query(WatchThenApproval.waiting):
                break
            await asyncio.sleep(0.02)
        await asyncio.sleep(0.5)  # anything left to run on the server runs
        waited = await env.get_current_time() - deadline
        assert waited < timedelta(minutes=1), f"the clock ran {waited} past the deadline"
        await handle.signal(WatchThenApproval.answer)
        said = await handle.result()
    assert said == ANSWERED
    assert world.watch_cancelled == 1 and not world.watching


@workflow.defn(name="test-sleep-an-hour", sandboxed=False)  # a test-only workflow
class SleepAnHour:
    @workflow.run
    async def run(self) -> str:
        await workflow.sleep(timedelta(hours=1))
        return "slept"


async def test_a_refused_step_leaves_no_extra_hold(env: WorkflowEnvironment) -> None:
    """A step with no activity holding time is refused by the server once (the client's hold
    is the only one) after it already scheduled the sleep's re-lock: that re-lock must stand
    for the client's hold, not come on top of it. An extra hold would keep time from skipping
    while the test awaits a result: a one-hour timer would run in real time."""
    await skip_step(env, WATCH_STEP, test_holds=True)
    await skip_step(env, WATCH_STEP, test_holds=True)
    async with Worker(env.client, task_queue="tq-sleep-hour", workflows=[SleepAnHour]):
        handle = await env.client.start_workflow(
            SleepAnHour.run, id="sleep-an-hour", task_queue="tq-sleep-hour"
        )
        said = await asyncio.wait_for(handle.result(), 60.0)  # an hour only if time skips
    assert said == "slept"
