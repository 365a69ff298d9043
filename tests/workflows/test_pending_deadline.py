"""The Pending deadline is a durable workflow timer raced against the deadline-free watch.

Cases (time-skipping server; the fake watch heartbeats until cancelled, as the real one does):
- the deadline fires on the workflow's timer, no wall-clock wait: the watch is cancelled,
  one look says Pending, the remediation escalates `pending-deadline`;
- `extend-deadline` while waiting moves the deadline: past the old one the watch still runs,
  at the new one the timer fires; the extension is in the timeline (actor, client identity),
  an Event and the status query;
- `extend-deadline` outside the wait, or with a bad input, is rejected naming the problem and
  changes nothing;
- a worker restart during the wait keeps the deadline (the timer is the server's).
"""

from __future__ import annotations

import asyncio
import gc
import logging
from datetime import timedelta
from typing import Any

import pytest
from temporalio.api.enums.v1 import EventType
from temporalio.client import WorkflowUpdateFailedError
from temporalio.exceptions import ApplicationError
from temporalio.testing import WorkflowEnvironment

from contract.kube import ReplacementReport
from contract.names import ACT_RECORD_EVENT, ACT_WAIT_REPLACEMENT, QRY_STATUS, UPD_EXTEND_DEADLINE
from contract.remediation import (
    ExtendDeadlineRequest,
    ExtendDeadlineResult,
    Phase,
    RemediationStatus,
)
from tests.workflows.fakes import (
    WATCH_STEP,
    FakeWorld,
    make_runbook,
    new_worker,
    past_deadline,
    shipped_runbooks,
    skip_step,
    start,
    wait_phase,
)
from tests.workflows.histories import save_history


def no_scale_up(deadline: str = "5m") -> list[Any]:
    """Shipped runbooks, `inference` with the given Pending deadline and no scale-up."""
    others = [r for r in shipped_runbooks() if r.name != "inference"]
    base = next(r for r in shipped_runbooks() if r.name == "inference")
    return [
        *others,
        make_runbook(
            "inference",
            base.spec.precedence,
            match={"ownerKinds": ["Deployment"]},
            replacement={"pendingDeadline": deadline},
            scaleUp={"enabled": False},
        ),
    ]


def pending_world(deadline: str = "5m") -> FakeWorld:
    return FakeWorld(
        runbooks=no_scale_up(deadline),
        replacement_reports=[
            ReplacementReport(status="pending", unschedulable_message="0/2 nodes are available")
        ],
    )


def timers(history: Any) -> list[Any]:
    return [e for e in history.events if e.event_type == EventType.EVENT_TYPE_TIMER_FIRED]


async def extend(handle: Any, **kw: Any) -> ExtendDeadlineResult:
    return await handle.execute_update(
        UPD_EXTEND_DEADLINE,
        ExtendDeadlineRequest(reason="vendor ships a node at 16:00", actor="erin", **kw),
        result_type=ExtendDeadlineResult,
    )


async def test_deadline_fires_on_the_workflow_timer(time_skipping_env: WorkflowEnvironment) -> None:
    client = time_skipping_env.client
    world = pending_world()
    async with new_worker(client, world) as worker:
        handle = await start(client, worker, world)
        waiting = await past_deadline(time_skipping_env, handle, world, Phase.AWAITING_REPLACEMENT)
        await wait_phase(handle, Phase.HOLDING)
        history = await handle.fetch_history()
        status = await handle.query(QRY_STATUS, result_type=RemediationStatus)
        await handle.terminate("test over")
    assert waiting.deadline is not None and waiting.started_at is not None
    assert waiting.deadline - waiting.updated_at == timedelta(minutes=5)  # type: ignore[operator]
    assert world.watch_cancelled == 1  # the watch never ended by itself: the timer stopped it
    assert [w.look_once for w in world.args(ACT_WAIT_REPLACEMENT)] == [False, True]
    assert timers(history), "no timer fired: the deadline was not a workflow timer"
    assert status.escalation_reason == "pending-deadline"
    assert status.deadline is None  # no wait any more


async def test_a_deadline_that_stops_the_watch_logs_no_error(
    time_skipping_env: WorkflowEnvironment, caplog: pytest.LogCaptureFixture
) -> None:
    """The deadline stops the watch without waiting for it (TRY_CANCEL): its cancellation is
    the expected end, not an error. The worker's log must not say "Task exception was never
    retrieved" with a traceback at ERROR for it, on every deadline an SRE reads about."""
    client = time_skipping_env.client
    world = pending_world()
    with caplog.at_level(logging.ERROR):
        async with new_worker(client, world) as worker:
            handle = await start(client, worker, world)
            await past_deadline(time_skipping_env, handle, world, Phase.AWAITING_REPLACEMENT)
            await wait_phase(handle, Phase.HOLDING)
            await handle.terminate("test over")
        gc.collect()  # a task's unretrieved exception is reported when the task is collected
    assert world.watch_cancelled == 1
    errors = [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR]
    assert not errors, errors


async def test_extension_moves_the_deadline(time_skipping_env: WorkflowEnvironment) -> None:
    client = time_skipping_env.client
    world = pending_world()
    async with new_worker(client, world) as worker:
        handle = await start(client, worker, world)
        # Skip to 1 minute before the deadline, then extend it by 30 minutes.
        before = await past_deadline(
            time_skipping_env, handle, world, Phase.AWAITING_REPLACEMENT, past=-timedelta(minutes=1)
        )
        assert before.deadline is not None
        moved = await extend(handle, by=timedelta(minutes=30))
        assert moved.previous == before.deadline
        assert moved.deadline == before.deadline + timedelta(minutes=30)
        status = await handle.query(QRY_STATUS, result_type=RemediationStatus)
        assert status.deadline == status.until == moved.deadline
        # Past the old deadline: still waiting, the watch still runs.
        await past_deadline(
            time_skipping_env,
            handle,
            world,
            Phase.AWAITING_REPLACEMENT,
            past=-timedelta(minutes=25),
        )
        status = await handle.query(QRY_STATUS, result_type=RemediationStatus)
        assert status.phase is Phase.AWAITING_REPLACEMENT and world.watching
        assert world.watch_cancelled == 0
        # At the new deadline the timer fires.
        await past_deadline(time_skipping_env, handle, world, Phase.AWAITING_REPLACEMENT)
        await wait_phase(handle, Phase.HOLDING)
        timeline = (await handle.query(QRY_STATUS, result_type=RemediationStatus)).escalation_reason
        entries = await handle.query("timeline")
        save_history("deadline_extended", await handle.fetch_history())
        await handle.terminate("test over")
    assert timeline == "pending-deadline"
    assert world.watch_cancelled == 1
    (entry,) = [e for e in entries if e["action"].startswith("deadline extended")]
    assert entry["actor"] == "erin" and entry["reason"] == "vendor ships a node at 16:00"
    assert entry["client_identity"]  # the Temporal client identity the server recorded
    (event,) = [e for e in world.args(ACT_RECORD_EVENT) if e.reason == "GPUDeadlineExtended"]
    assert "erin" in event.message and "vendor ships" in event.message


async def test_extension_outside_the_wait_is_rejected(
    time_skipping_env: WorkflowEnvironment,
) -> None:
    client = time_skipping_env.client
    world = FakeWorld()  # replacements Running at once: the wait is over by the hold
    async with new_worker(client, world) as worker:
        handle = await start(client, worker, world)
        await wait_phase(handle, Phase.HOLDING)
        before = await handle.query("timeline")
        with pytest.raises(WorkflowUpdateFailedError) as refused:
            await extend(handle, by=timedelta(minutes=30))
        assert "holding" in str(refused.value.cause)
        assert "not waiting for replacements" in str(refused.value.cause)
        after = await handle.query("timeline")
        status = await handle.query(QRY_STATUS, result_type=RemediationStatus)
        await handle.terminate("test over")
    assert after == before  # nothing recorded
    assert status.deadline is None


async def test_bad_extensions_are_refused(time_skipping_env: WorkflowEnvironment) -> None:
    client = time_skipping_env.client
    world = pending_world()
    async with new_worker(client, world) as worker:
        handle = await start(client, worker, world)
        waiting = await past_deadline(
            time_skipping_env, handle, world, Phase.AWAITING_REPLACEMENT, past=-timedelta(minutes=4)
        )
        assert waiting.deadline is not None
        with pytest.raises(WorkflowUpdateFailedError) as earlier:
            await extend(handle, until=waiting.deadline - timedelta(minutes=1))
        assert "not after the current one" in str(earlier.value.cause)
        with pytest.raises(WorkflowUpdateFailedError) as too_far:
            await extend(handle, by=timedelta(days=8))
        assert "is past the limit" in str(too_far.value.cause)
        assert "a replacement wait lasts at most 168h from its start" in str(too_far.value.cause)
        with pytest.raises(WorkflowUpdateFailedError):  # no target: refused by the model
            await handle.execute_update(
                UPD_EXTEND_DEADLINE, {"reason": "x", "actor": "erin"}, result_type=Any
            )
        status = await handle.query(QRY_STATUS, result_type=RemediationStatus)
        await past_deadline(time_skipping_env, handle, world, Phase.AWAITING_REPLACEMENT)
        await wait_phase(handle, Phase.HOLDING)
        await handle.terminate("test over")
    assert status.deadline == waiting.deadline  # unchanged
    with pytest.raises(ValueError, match="positive"):
        ExtendDeadlineRequest(by=timedelta(0), reason="x", actor="erin")


async def test_worker_restart_keeps_the_deadline(time_skipping_env: WorkflowEnvironment) -> None:
    client = time_skipping_env.client
    # The least deadline the runbooks allow: under load every skip step of this test runs
    # at the speed of real time (its workers replay every task), so fewer steps.
    world = pending_world("1m")
    task_queue = f"tq-restart-{world.gpu_uuid}"
    async with new_worker(client, world, task_queue=task_queue, replay_every_task=True) as worker:
        handle = await start(client, worker, world)
        first = await past_deadline(
            time_skipping_env,
            handle,
            world,
            Phase.AWAITING_REPLACEMENT,
            past=-timedelta(seconds=40),
        )
    # The worker is gone (its watch with it); a new one takes over the same task queue.
    async with new_worker(client, world, task_queue=task_queue, replay_every_task=True):
        # The stopped worker reported its watch's end; the server starts it again after the
        # retry backoff, on its own clock (the heartbeat timeout, 60 s, if the report was lost).
        for _ in range(10):
            await skip_step(time_skipping_env, WATCH_STEP, test_holds=True)
            for _ in range(50):  # the retry's attempt starts within a second of real time
                if world.watching:
                    break
                await asyncio.sleep(0.02)
            if world.watching:
                break
        again = await past_deadline(time_skipping_env, handle, world, Phase.AWAITING_REPLACEMENT)
        await wait_phase(handle, Phase.HOLDING)
        history = await handle.fetch_history()
        status = await handle.query(QRY_STATUS, result_type=RemediationStatus)
        await handle.terminate("test over")
    assert again.deadline == first.deadline  # not restarted from the new worker's clock
    (fired,) = timers(history)[:1]
    assert abs(
        fired.event_time.ToDatetime().replace(tzinfo=first.deadline.tzinfo) - first.deadline
    ) < timedelta(seconds=1)  # type: ignore[union-attr]
    assert status.escalation_reason == "pending-deadline"


async def test_undecodable_extension_is_refused_naming_the_problem(
    time_skipping_env: WorkflowEnvironment,
) -> None:
    """An input typed by a person (the Web UI's *Send an Update*): the refusal the caller sees
    names the problem itself, not the SDK's bare "Failed decoding arguments"."""
    client = time_skipping_env.client
    world = pending_world()
    async with new_worker(client, world) as worker:
        handle = await start(client, worker, world)
        waiting = await past_deadline(
            time_skipping_env, handle, world, Phase.AWAITING_REPLACEMENT, past=-timedelta(minutes=4)
        )
        refusals = {}
        for name, body in {
            "both": {"by": "30m", "until": "2030-01-01T00:00:00Z", "reason": "x", "actor": "e"},
            "not positive": {"by": "0s", "reason": "x", "actor": "e"},
            "bad duration": {"by": "-5m", "reason": "x", "actor": "e"},
            "typo": {"by": "30m", "reason": "x", "actor": "e", "actr": "e"},
            "not an object": ["30m"],
        }.items():
            with pytest.raises(WorkflowUpdateFailedError) as refused:
                await handle.execute_update(UPD_EXTEND_DEADLINE, body, result_type=Any)
            cause = refused.value.cause
            assert isinstance(cause, ApplicationError)
            refusals[name] = cause.message
        status = await handle.query(QRY_STATUS, result_type=RemediationStatus)
        entries = await handle.query("timeline")
        await handle.terminate("test over")
    assert refusals["both"].startswith("invalid extend-deadline input: ")
    assert "give exactly one of `by` (a duration) or `until` (a time)" in refusals["both"]
    assert "`by` must be positive" in refusals["not positive"]
    assert refusals["bad duration"].startswith("invalid extend-deadline input: by: ")
    assert "actr: unknown field (fields: by, until, reason, actor, verified)" in refusals["typo"]
    assert "must be a JSON object" in refusals["not an object"]
    assert status.deadline == waiting.deadline  # nothing moved
    assert not [e for e in entries if e["action"].startswith("deadline extended")]


async def test_a_verified_extension_says_so(time_skipping_env: WorkflowEnvironment) -> None:
    """An extension sent through the actions endpoint (a signed attestation): the timeline
    entry is verified and the Event names the user as verified, not claimed."""
    from activities.actors import sign
    from contract.actors import VerifiedActor, request_fields
    from tests.workflows.fakes import ACTIONS_TEST_KEY

    client = time_skipping_env.client
    world = pending_world()
    async with new_worker(client, world) as worker:
        handle = await start(client, worker, world)
        await wait_phase(handle, Phase.AWAITING_REPLACEMENT)
        req = ExtendDeadlineRequest(by=timedelta(minutes=30), reason="node at 16:00", actor="erin")
        # Issued "now" on the workflow's (skipped) clock, as the endpoint's clock would be.
        att = VerifiedActor(
            user="erin",
            groups=["sre"],
            issued_at=await time_skipping_env.get_current_time(),
            nonce="nonce-0123456789",
        )
        att.signature = sign(ACTIONS_TEST_KEY, handle.id, "extend", request_fields(req), att)
        await handle.execute_update(
            UPD_EXTEND_DEADLINE,
            req.model_copy(update={"verified": att}),
            result_type=ExtendDeadlineResult,
        )
        entries = await handle.query("timeline")

        def told() -> list[Any]:
            return [e for e in world.args(ACT_RECORD_EVENT) if e.reason == "GPUDeadlineExtended"]

        for _ in range(600):  # up to 30 s, generous: the timer loop tells it as it wakes
            if told():
                break
            await asyncio.sleep(0.05)
        await handle.terminate("test over")
    (entry,) = [e for e in entries if e["action"].startswith("deadline extended")]
    assert (entry["actor"], entry["verification"]) == ("erin", "verified")
    (event,) = told()
    assert "by erin (verified): node at 16:00" in event.message
