"""Lemons: the GPU ledger workflow (real) and retirement in the remediation (activities faked,
the ledger real), on the time-skipping server.

Cases:
- the ledger counts failures per GPU within the window (time skipped between them), retires
  the GPU at the N-th, asks one incident for the RMA (a retry of the same incident is the same
  answer, a later incident is not asked), and records nothing twice for one incident;
- entries older than the retention are pruned (a GPU with none left is dropped); at most
  max_gpus GPUs are kept, the oldest not-retired first, a retired one never;
- the state survives continue-as-new (after max_updates_per_run updates);
- a burst of concurrent records goes in a few batched updates, each answered as if alone (a
  retry of one incident counted once, the third incident retires, one RMA); the ledger runs on
  its own task queue, and one started on the remediation queue moves there at its next
  continue-as-new;
- un-retire: refused without a reason and for a GPU that is not retired; it records actor and
  Temporal client identity, resets the count and tells the holder (`gpu-unretired`);
- remediation: the third failure in the window retires the GPU: one RMA escalation with the
  ledger history, no release (not by `repaired`, not by a Healthy cool-down), a repeat alert
  pages nobody; un-retire -> the remediation releases normally; a later incident of a retired
  GPU holds it without a second page;
- the quarantine never waits for the ledger: with the ledger's answer held back the device is
  quarantined, and the remediation goes on once it comes;
- a dry run records nothing; lemons disabled records nothing.
"""

from __future__ import annotations

import asyncio
import uuid
from datetime import timedelta

import pytest
from pydantic import ValidationError
from temporalio import activity
from temporalio.api.enums.v1 import EventType
from temporalio.client import Client, WorkflowUpdateFailedError
from temporalio.testing import WorkflowEnvironment
from temporalio.worker import Worker

from activities.ledger import LedgerActivities
from contract.ledger import (
    LedgerDecision,
    LedgerQuery,
    LedgerReport,
    LedgerState,
    RecordFailureInput,
    RecordRepairInput,
    UnretireRequest,
    UnretireResult,
)
from contract.names import (
    ACT_NOTIFY,
    ACT_QUARANTINE,
    ACT_RECORD_GPU_FAILURE,
    ACT_RELEASE_QUARANTINE,
    QRY_LEDGER_REPORT,
    QRY_LEDGER_STATE,
    QRY_TIMELINE,
    SIG_ABORT,
    SIG_ALERT,
    SIG_REPAIRED,
    UPD_LEDGER_FAILURE,
    UPD_LEDGER_UNRETIRE,
    WF_GPU_LEDGER,
    ledger_task_queue,
)
from contract.remediation import AbortRequest, Phase, RepairedRequest, TimelineEntry
from tests.workflows.fakes import FakeWorld, make_runbook, new_worker, start, wait_phase, xid_alert
from worker.main import sender_identity_options
from workflows.ledger import GpuLedgerWorkflow

WEEK = timedelta(days=7)


def _failure(gpu: str, incident: str, *, failures: int = 3, window: timedelta = WEEK, xid=48):
    return RecordFailureInput(
        gpu_uuid=gpu,
        node="node-a",
        incident=incident,
        holder=f"wf-{incident}",
        failure_class="unhealthy",
        evidence="pod status reports the device Unhealthy",
        xid=xid,
        failures=failures,
        window=window,
    )


def _ledger_activities(client: Client, queue: str, **state) -> LedgerActivities:
    return LedgerActivities(
        client,
        queue,
        workflow_id=f"sickbay-ledger-{uuid.uuid4().hex[:8]}",
        initial_state=LedgerState(**state),
    )


def _ledger_worker(client: Client, queue: str) -> Worker:
    """A worker for the ledger alone, on its own queue (as in production: worker.main)."""
    return Worker(
        client,
        task_queue=ledger_task_queue(queue),
        workflows=[GpuLedgerWorkflow],
        **sender_identity_options(),
    )


def _ledger(client: Client, queue: str, **state) -> tuple[LedgerActivities, Worker]:
    """The ledger's activities and a worker for it alone."""
    return _ledger_activities(client, queue, **state), _ledger_worker(client, queue)


async def test_window_counting_retirement_and_one_rma(time_skipping_env: WorkflowEnvironment):
    env, client = time_skipping_env, time_skipping_env.client
    acts, worker = _ledger(client, f"tq-{uuid.uuid4()}")
    gpu = f"GPU-{uuid.uuid4()}"
    async with worker:
        first = await acts.record_gpu_failure(_failure(gpu, "i1"))
        again = await acts.record_gpu_failure(_failure(gpu, "i1"))  # a retry: same incident
        await env.sleep(timedelta(days=8))  # i1 leaves the 7-day window
        second = await acts.record_gpu_failure(_failure(gpu, "i2"))
        await env.sleep(timedelta(days=2))
        third = await acts.record_gpu_failure(_failure(gpu, "i3", xid=79))
        await env.sleep(timedelta(days=1))
        fourth = await acts.record_gpu_failure(_failure(gpu, "i4"))  # the one that retires
        fourth_retry = await acts.record_gpu_failure(_failure(gpu, "i4"))
        fifth = await acts.record_gpu_failure(_failure(gpu, "i5"))  # retired already
        repair = await acts.record_gpu_repair(
            RecordRepairInput(gpu_uuid=gpu, incident="i5", rung="reset", detail="validated")
        )
        await acts.record_gpu_repair(
            RecordRepairInput(gpu_uuid=gpu, incident="i5", rung="reset", detail="validated")
        )
        report = await client.get_workflow_handle(acts.workflow_id).query(
            QRY_LEDGER_REPORT, LedgerQuery(), result_type=LedgerReport
        )
        await client.get_workflow_handle(acts.workflow_id).terminate("test done")
    assert (first.failures_in_window, again.failures_in_window) == (1, 1)
    assert len([e for e in again.history if e.kind == "failure"]) == 1  # recorded once
    assert second.failures_in_window == 1 and not second.retired  # i1 is out of the window
    assert third.failures_in_window == 2 and not third.retired
    assert fourth.failures_in_window == 3 and fourth.retired and fourth.newly_retired
    assert fourth.rma_due and fourth_retry.rma_due and not fourth_retry.newly_retired
    assert fifth.retired and not fifth.rma_due  # a later incident: no second RMA page
    assert [e.xid for e in fourth.history if e.kind == "failure"][-3:] == [48, 79, 48]
    assert repair.retired
    [summary] = report.gpus
    assert summary.gpu_uuid == gpu and summary.retired and summary.repairs == 1
    assert "3 failures within" in summary.retired_reason


async def test_pruning_and_the_gpu_cap(time_skipping_env: WorkflowEnvironment) -> None:
    env, client = time_skipping_env, time_skipping_env.client
    acts, worker = _ledger(client, f"tq-{uuid.uuid4()}", max_gpus=2)
    lemon, old, new = (f"GPU-{n}-{uuid.uuid4()}" for n in ("lemon", "old", "new"))
    async with worker:
        handle = client.get_workflow_handle(acts.workflow_id)
        await acts.record_gpu_failure(_failure(lemon, "l1", failures=1))  # retired at once
        await acts.record_gpu_failure(_failure(old, "o1"))
        await env.sleep(timedelta(days=1))
        await acts.record_gpu_failure(_failure(new, "n1"))  # third GPU: `old` goes, not `lemon`
        capped = await handle.query(QRY_LEDGER_STATE, result_type=LedgerState)
        await env.sleep(timedelta(days=8))  # past the retention: `new` has nothing left
        await acts.record_gpu_repair(RecordRepairInput(gpu_uuid=lemon, rung="reboot"))
        pruned = await handle.query(QRY_LEDGER_STATE, result_type=LedgerState)
        await handle.terminate("test done")
    assert sorted(g.gpu_uuid for g in capped.gpus) == sorted([lemon, new])
    assert [g.gpu_uuid for g in pruned.gpus] == [lemon]  # retired: kept with its history
    assert [e.kind for e in pruned.gpus[0].entries] == ["failure", "retired", "repair"]


async def test_state_survives_continue_as_new(time_skipping_env: WorkflowEnvironment) -> None:
    client = time_skipping_env.client
    acts, worker = _ledger(client, f"tq-{uuid.uuid4()}", max_updates_per_run=2)
    gpu = f"GPU-{uuid.uuid4()}"
    async with worker:
        handle = client.get_workflow_handle(acts.workflow_id)
        for i in range(3):
            await acts.record_gpu_failure(_failure(gpu, f"i{i}", failures=9))
        fourth = await acts.record_gpu_failure(_failure(gpu, "i3", failures=4))
        history = await handle.fetch_history()
        await handle.terminate("test done")
    assert fourth.failures_in_window == 4 and fourth.retired  # counted across runs
    started = history.events[0].workflow_execution_started_event_attributes
    assert started.continued_execution_run_id, "the ledger never continued as new"
    carried = LedgerState.model_validate_json(started.input.payloads[0].data)
    assert [g.gpu_uuid for g in carried.gpus] == [gpu]


async def test_unretire(time_skipping_env: WorkflowEnvironment) -> None:
    client = time_skipping_env.client
    acts, worker = _ledger(client, f"tq-{uuid.uuid4()}")
    gpu, healthy = f"GPU-{uuid.uuid4()}", f"GPU-{uuid.uuid4()}"
    async with worker:
        handle = client.get_workflow_handle(acts.workflow_id)
        await acts.record_gpu_failure(_failure(healthy, "h1"))
        for i in range(3):
            await acts.record_gpu_failure(_failure(gpu, f"i{i}"))
        for target, problem in ((healthy, "is not retired"), ("GPU-nope", "has no GPU")):
            with pytest.raises(WorkflowUpdateFailedError) as refused:
                await handle.execute_update(
                    UPD_LEDGER_UNRETIRE,
                    UnretireRequest(gpu_uuid=target, reason="x", actor="bob"),
                    result_type=UnretireResult,
                )
            assert problem in str(refused.value.cause)
        with pytest.raises(ValidationError):  # an empty reason is refused before sending
            UnretireRequest(gpu_uuid=gpu, reason="", actor="bob")
        done = await handle.execute_update(
            UPD_LEDGER_UNRETIRE,
            UnretireRequest(gpu_uuid=gpu, reason="vendor swapped the HBM", actor="bob"),
            result_type=UnretireResult,
        )
        after = await acts.record_gpu_failure(_failure(gpu, "i9"))
        report = await handle.query(QRY_LEDGER_REPORT, LedgerQuery(), result_type=LedgerReport)
        await handle.terminate("test done")
    assert done.was_retired and done.holder == "wf-i2"
    assert after.failures_in_window == 1 and not after.retired  # the count starts afresh
    unretired = [e for e in after.history if e.kind == "unretired"]
    assert unretired[0].actor == "bob" and unretired[0].detail == "vendor swapped the HBM"
    assert unretired[0].client_identity  # the Temporal client identity the server recorded
    assert report.gpus == []  # neither retired nor repaired recently


# --------------------------------------------------------------------- the remediation -------


def _runbooks(**lemons):
    """Deployment consumers get a runbook paging `pagerduty`, released by `repaired` or a
    10-minute Healthy cool-down."""
    return [
        make_runbook(
            "inference",
            match={"ownerKinds": ["Deployment"]},
            escalation={"channels": ["pagerduty"]},
            release={"mode": "either", "cooldown": "10m", "healthCheckInterval": "1m"},
            lemons={"failures": 3, "window": "7d", **lemons},
        ),
        make_runbook("default", precedence=0),
    ]


async def test_a_burst_of_records_goes_in_a_few_updates(
    time_skipping_env: WorkflowEnvironment,
) -> None:
    client = time_skipping_env.client
    acts, worker = _ledger(client, f"tq-{uuid.uuid4()}")
    lemon = f"GPU-lemon-{uuid.uuid4()}"
    others = [f"GPU-{n}-{uuid.uuid4()}" for n in range(40)]
    requests = [_failure(gpu, f"i-{gpu}") for gpu in others]
    # One GPU failing in three incidents (one of them retried) among the others.
    requests[5:5] = [_failure(lemon, "l1"), _failure(lemon, "l2")]
    requests += [_failure(lemon, "l2"), _failure(lemon, "l3")]
    async with worker:
        answers = await asyncio.gather(*(acts.record_gpu_failure(r) for r in requests))
        await client.get_workflow_handle(acts.workflow_id).terminate("test done")
    assert len(requests) == 44 and acts.batches_sent <= 8  # not one update per record
    for req, answer in zip(requests, answers, strict=True):
        assert answer.gpu_uuid == req.gpu_uuid  # each its own answer, in order
    by_incident = {
        r.incident: a for r, a in zip(requests, answers, strict=True) if r.gpu_uuid == lemon
    }
    assert [a.failures_in_window for a in answers if a.gpu_uuid in others] == [1] * 40
    assert by_incident["l1"].failures_in_window == 1 and not by_incident["l1"].retired
    assert by_incident["l2"].failures_in_window == 2  # its retry counted once
    assert by_incident["l3"].retired and by_incident["l3"].newly_retired
    assert by_incident["l3"].rma_due


async def test_ledger_on_the_remediation_queue_moves_to_its_own(
    time_skipping_env: WorkflowEnvironment,
) -> None:
    """A ledger started on the remediation queue is still served there, and its next
    continue-as-new moves it, with what it holds, to its own queue."""
    client = time_skipping_env.client
    queue = f"tq-{uuid.uuid4()}"
    acts = _ledger_activities(client, queue)
    legacy = Worker(
        client, task_queue=queue, workflows=[GpuLedgerWorkflow], **sender_identity_options()
    )
    gpu = f"GPU-{uuid.uuid4()}"
    async with legacy, _ledger_worker(client, queue):
        handle = await client.start_workflow(
            WF_GPU_LEDGER,
            LedgerState(max_updates_per_run=2),
            id=acts.workflow_id,
            task_queue=queue,
        )
        await acts.record_gpu_failure(_failure(gpu, "i1"))
        await acts.record_gpu_failure(_failure(gpu, "i2"))
        desc = await handle.describe()
        for _ in range(200):
            desc = await client.get_workflow_handle(acts.workflow_id).describe()
            if desc.run_id != handle.result_run_id:
                break
            await asyncio.sleep(0.02)
        third = await acts.record_gpu_failure(_failure(gpu, "i3"))
        await client.get_workflow_handle(acts.workflow_id).terminate("test done")
    assert desc.run_id != handle.result_run_id, "never continued as new"
    assert desc.task_queue == ledger_task_queue(queue) != queue
    assert third.failures_in_window == 3 and third.retired  # the count moved with it


async def test_quarantine_does_not_wait_for_the_ledger(
    time_skipping_env: WorkflowEnvironment,
) -> None:
    """The ledger answers every failure of the cluster; a slow answer (a burst, a ledger
    between runs) must not hold a failed GPU unquarantined."""
    client = time_skipping_env.client
    world = FakeWorld()
    answer = asyncio.Event()

    @activity.defn(name=ACT_RECORD_GPU_FAILURE)
    async def held_back(req: RecordFailureInput) -> LedgerDecision:
        await answer.wait()
        return LedgerDecision(gpu_uuid=req.gpu_uuid, failures_in_window=1, failures=3)

    with time_skipping_env.auto_time_skipping_disabled():
        async with new_worker(client, world, extra_activities=[held_back]) as worker:
            handle = await start(client, worker, world)
            loop = asyncio.get_running_loop()
            give_up = loop.time() + 60
            for _ in range(100_000):  # until quarantined, for at most 60 s
                if world.args(ACT_QUARANTINE) or loop.time() > give_up:
                    break
                await asyncio.sleep(0.02)
            quarantined_first = bool(world.args(ACT_QUARANTINE))
            before = await _timeline(handle)
            answer.set()
            await wait_phase(handle, Phase.HOLDING)
            after = await _timeline(handle)
            await handle.terminate("test done")
    assert quarantined_first, "the quarantine waited for the ledger"
    assert not any(e.action == "failure recorded" for e in before)
    actions = [e.action for e in after]
    assert "failure recorded" in actions
    first_rule = next(i for i, a in enumerate(actions) if a.startswith("quarantined"))
    assert first_rule < actions.index("failure recorded")


async def _timeline(handle) -> list[TimelineEntry]:
    return await handle.query(QRY_TIMELINE, result_type=list[TimelineEntry])


def _pages(world: FakeWorld) -> list:
    return [n for n in world.args(ACT_NOTIFY) if n.action == "trigger"]


async def test_third_failure_retires_one_rma_no_release_then_unretire(
    time_skipping_env: WorkflowEnvironment,
) -> None:
    env, client = time_skipping_env, time_skipping_env.client
    queue = f"tq-{uuid.uuid4()}"
    world = FakeWorld(use_real_ledger=True, runbooks=_runbooks(), later_health="Unhealthy")
    ledger = _ledger_activities(client, queue)
    extra = [ledger.record_gpu_failure, ledger.record_gpu_repair]
    async with (
        _ledger_worker(client, queue),
        new_worker(client, world, extra_activities=extra, task_queue=queue) as w,
    ):
        result = await _retire_then_unretire(env, client, world, ledger, w)
    assert result.outcome == "escalated" and "released" in result.reason
    assert any(e.action == "GPU un-retired" and e.actor == "ops" for e in result.timeline)
    assert len(world.args(ACT_RELEASE_QUARANTINE)) == 3
    assert len(world.args(ACT_RECORD_GPU_FAILURE)) == 0  # the real ledger answered, no fake


def _timers(history) -> int:
    """The hold's timers (health checks toward a cool-down release); the replacement wait's
    Pending-deadline timer and the eviction timeout's are not ones."""
    return sum(
        1
        for e in history.events
        if e.event_type == EventType.EVENT_TYPE_TIMER_STARTED
        and "deadline" not in e.user_metadata.summary.data.decode()
        and "eviction timeout" not in e.user_metadata.summary.data.decode()
    )


async def _eventually(check, within: float = 60.0):
    loop = asyncio.get_running_loop()
    give_up = loop.time() + within
    while loop.time() < give_up:
        value = await check()
        if value:
            return value
        await asyncio.sleep(0.05)
    raise AssertionError("never happened")


async def _retire_then_unretire(env, client, world, ledger, worker):
    # Automatic time skipping would jump the clock past the window while a run waits for its
    # result: the three failures happen at one time (window counting: the ledger tests above).
    with env.auto_time_skipping_disabled():
        runs: list[str | None] = []
        for n in (1, 2):  # two failures, each repaired by hand
            handle = await start(client, worker, world, alerts=[xid_alert(48, f"fp-{n}")])
            runs.append(handle.result_run_id)
            await wait_phase(handle, Phase.HOLDING)
            await handle.signal(SIG_REPAIRED, RepairedRequest(actor="ops"))
            assert (await handle.result()).outcome == "released"
        assert _pages(world) == []
        third = await start(client, worker, world, alerts=[xid_alert(48, "fp-3")])
        status = await wait_phase(third, Phase.HOLDING)
    assert "un-retire" in status.awaiting
    assert status.escalation_reason == "gpu-retired"
    [page] = _pages(world)
    assert page.incident.reason == "gpu-retired" and "RMA" in page.incident.summary
    # The ask leads: a PagerDuty summary is cut at 1024 characters, a long history is not.
    assert "retired as a lemon: RMA it (" in page.incident.summary[:200]
    assert page.incident.summary.count("failure Xid 48") == 3  # the ledger's history
    # Neither a repaired mark, a Healthy cool-down nor a repeat alert releases or pages: the
    # retired hold runs no health-check timer at all (a hold in release mode `either` starts
    # one at once, as the first runs' did), and the mark is only noted.
    world.later_health = "Healthy"
    await third.signal(SIG_REPAIRED, RepairedRequest(actor="ops"))
    await third.signal(SIG_ALERT, xid_alert(48, "fp-3b"))

    async def noted() -> list[TimelineEntry]:
        entries = await _timeline(third)
        return entries if any(e.action == "repair noted" for e in entries) else []

    timeline = await _eventually(noted)
    assert any(e.action == "repair noted" and "retired" in e.reason for e in timeline)
    assert _timers(await third.fetch_history()) == 0
    first = client.get_workflow_handle(third.id, run_id=runs[0])
    assert _timers(await first.fetch_history()) >= 1
    assert len(_pages(world)) == 1
    assert len(world.args(ACT_RELEASE_QUARANTINE)) == 2  # only the first two runs released
    assert (await third.describe()).status.name == "RUNNING"

    # A person un-retires it (the ledger tells the remediation): it releases normally.
    ledger_handle = client.get_workflow_handle(ledger.workflow_id)
    with env.auto_time_skipping_disabled():
        done = await ledger_handle.execute_update(
            UPD_LEDGER_UNRETIRE,
            UnretireRequest(gpu_uuid=world.gpu_uuid, reason="reseated, DCGM ok", actor="ops"),
            result_type=UnretireResult,
        )
        result = await third.result()
    await ledger_handle.terminate("test done")
    assert done.holder == third.id
    return result


async def test_later_incident_of_a_retired_gpu_holds_without_a_second_page(
    time_skipping_env: WorkflowEnvironment,
) -> None:
    client = time_skipping_env.client
    queue = f"tq-{uuid.uuid4()}"
    world = FakeWorld(use_real_ledger=True, runbooks=_runbooks(failures=1, unsafe=["failures"]))
    ledger = _ledger_activities(client, queue)
    extra = [ledger.record_gpu_failure, ledger.record_gpu_repair]
    # Without this, a wait for the first run's result on a loaded machine lets the test server
    # skip to its ten-year default execution timeout, which ends the ledger with its history.
    with time_skipping_env.auto_time_skipping_disabled():
        async with (
            _ledger_worker(client, queue),
            new_worker(client, world, extra_activities=extra, task_queue=queue) as worker,
        ):
            first = await start(client, worker, world, alerts=[xid_alert(48, "fp-1")])
            await wait_phase(first, Phase.HOLDING)
            await first.signal(SIG_ABORT, AbortRequest(reason="moving the node", actor="ops"))
            assert (await first.result()).outcome == "aborted"
            second = await start(client, worker, world, alerts=[xid_alert(48, "fp-2")])
            status = await wait_phase(second, Phase.HOLDING)
            timeline = await _timeline(second)
            await second.terminate("test done")
            await client.get_workflow_handle(ledger.workflow_id).terminate("test done")
    assert "un-retire" in status.awaiting and status.escalation_reason is None
    assert len(_pages(world)) == 1  # the first incident's RMA page only
    assert any(
        e.action == "GPU already retired" and "asked for earlier" in e.reason for e in timeline
    )
    assert len(world.args(ACT_QUARANTINE)) == 2  # still quarantined


async def test_dry_run_and_disabled_lemons_record_nothing(
    time_skipping_env: WorkflowEnvironment,
) -> None:
    client = time_skipping_env.client
    world = FakeWorld(runbooks=_runbooks(enabled=False))
    async with new_worker(client, world) as worker:
        handle = await start(client, worker, world)
        await wait_phase(handle, Phase.HOLDING)
        await handle.signal(SIG_REPAIRED, RepairedRequest(actor="ops"))
        await handle.result()
        dry = await start(client, worker, world, gpu_uuid=f"GPU-{uuid.uuid4()}", dry_run=True)
        await dry.result()
    assert world.args(ACT_RECORD_GPU_FAILURE) == []
    world = FakeWorld()
    async with new_worker(client, world) as worker:
        handle = await start(client, worker, world)
        await wait_phase(handle, Phase.HOLDING)
        await handle.signal(SIG_REPAIRED, RepairedRequest(actor="ops"))
        await handle.result()
    [recorded] = world.args(ACT_RECORD_GPU_FAILURE)
    assert recorded.gpu_uuid == world.gpu_uuid and recorded.failures == 3
    assert recorded.incident.startswith(handle.id + "/")


async def test_only_device_evidence_counts(time_skipping_env: WorkflowEnvironment) -> None:
    """A maintenance drain (even of a GPU a consumer calls Unhealthy) and a hand launch with no
    evidence never reach the ledger; the timeline says why. A hand launch on a device its pod
    reports Unhealthy counts, and says which evidence."""
    client = time_skipping_env.client
    world = FakeWorld(runbooks=_runbooks())
    async with new_worker(client, world) as worker:
        maint = await start(client, worker, world, alerts=[], trigger="maintenance")
        await wait_phase(maint, Phase.HOLDING)
        await maint.signal(SIG_REPAIRED, RepairedRequest(actor="ops"))
        maint_result = await maint.result()
        world.health = world.later_health = None
        bare = await start(client, worker, world, alerts=[], trigger="manual")
        await wait_phase(bare, Phase.HOLDING)
        await bare.signal(SIG_REPAIRED, RepairedRequest(actor="ops"))
        bare_result = await bare.result()
        assert world.args(ACT_RECORD_GPU_FAILURE) == []
        world.health = "Unhealthy"
        sick = await start(client, worker, world, alerts=[], trigger="manual")
        await wait_phase(sick, Phase.HOLDING)
        await sick.signal(SIG_REPAIRED, RepairedRequest(actor="ops"))
        sick_result = await sick.result()
    for result, why in ((maint_result, "maintenance"), (bare_result, "no device evidence")):
        [entry] = [e for e in result.timeline if e.action == "failure not counted"]
        assert why in entry.reason, entry
        assert not any(e.action == "failure recorded" for e in result.timeline)
    [recorded] = world.args(ACT_RECORD_GPU_FAILURE)
    assert recorded.incident.startswith(sick.id + "/")
    assert "Unhealthy" in recorded.evidence
    assert any(
        e.action == "failure recorded" and "Unhealthy" in e.reason for e in sick_result.timeline
    )


async def test_the_ledger_refuses_a_failure_without_evidence(
    time_skipping_env: WorkflowEnvironment,
) -> None:
    client = time_skipping_env.client
    acts, worker = _ledger(client, f"tq-{uuid.uuid4()}")
    gpu, other = f"GPU-{uuid.uuid4()}", f"GPU-{uuid.uuid4()}"
    async with worker:
        await acts.record_gpu_failure(_failure(other, "i0"))
        bare = _failure(gpu, "i1").model_copy(update={"evidence": " "})
        with pytest.raises(Exception, match="device evidence"):
            await acts.record_gpu_failure(bare)
        handle = client.get_workflow_handle(acts.workflow_id)
        with pytest.raises(WorkflowUpdateFailedError):  # the ledger's own validator, too
            await handle.execute_update(UPD_LEDGER_FAILURE, bare, result_type=LedgerDecision)
        state = await handle.query(QRY_LEDGER_STATE, result_type=LedgerState)
        await handle.terminate("test done")
    assert [g.gpu_uuid for g in state.gpus] == [other]
