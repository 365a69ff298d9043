"""Verified actors beyond the remediation's signals: the GPU ledger's `unretire` and the
budget's `pause` / `resume` (workflows/attestation.py), and a remediation's launch, each checked
through the worker's `verify-actor` local activity like the remediation's actions:

- a genuine attestation is recorded verified (with how and the groups) in what `sickbay gpus`
  shows and in the budget's pause and pause log; the update's answer says so;
- one signed with another key, or replayed, is recorded unverified, naming why;
- sent straight through Temporal: recorded unverified (the pause banner and Event say so);
- the runbook of the GPU's latest failure with `requireVerifiedActors` makes the ledger refuse
  an unverified un-retire (ERR_UNVERIFIED_ACTOR; the GPU stays retired), and a verified one
  goes through;
- a launch whose input the endpoint signed is `launched` verified in the timeline; one signed
  with another key, or none, is unverified;
- the actions key is never in any of the histories.
"""

from __future__ import annotations

import uuid
from datetime import timedelta

import pytest
from temporalio.client import Client, WorkflowUpdateFailedError
from temporalio.exceptions import ApplicationError
from temporalio.testing import WorkflowEnvironment
from temporalio.worker import Worker

from activities.actors import ActorActivities, attest
from activities.ledger import LedgerActivities
from contract.budget import BudgetState, PauseAnswer, PauseRequest, ResumeRequest
from contract.errors import ERR_UNVERIFIED_ACTOR
from contract.kube import DeviceRef
from contract.ledger import (
    LedgerQuery,
    LedgerReport,
    LedgerState,
    RecordFailureInput,
    UnretireRequest,
    UnretireResult,
)
from contract.names import (
    QRY_BUDGET_STATE,
    QRY_LEDGER_REPORT,
    QRY_LEDGER_STATE,
    SIG_ABORT,
    UPD_BUDGET_PAUSE,
    UPD_BUDGET_RESUME,
    UPD_LEDGER_UNRETIRE,
    WF_BUDGET,
    WF_REMEDIATE,
    budget_task_queue,
    device_workflow_id,
    ledger_task_queue,
)
from contract.remediation import (
    AbortRequest,
    Phase,
    RemediationInput,
    RemediationResult,
    TimelineEntry,
)
from tests.workflows.fakes import ACTIONS_TEST_KEY, FakeWorld, new_worker, wait_phase
from tests.workflows.histories import save_history
from worker.main import sender_identity_options
from workflows.budget import BudgetWorkflow
from workflows.ledger import GpuLedgerWorkflow, describe

WRONG_KEY = b"not-the-workers-key-0123456789abcdef012345"


def _failure(gpu: str, incident: str, *, require: bool) -> RecordFailureInput:
    return RecordFailureInput(
        gpu_uuid=gpu,
        node="node-a",
        incident=incident,
        holder=f"wf-{incident}",
        failure_class="unhealthy",
        evidence="pod status reports the device Unhealthy",
        failures=1,  # the first failure retires it
        window=timedelta(days=7),
        require_verified_actors=require,
    )


def _ledger(client: Client, queue: str) -> tuple[LedgerActivities, Worker]:
    acts = LedgerActivities(
        client,
        queue,
        workflow_id=f"sickbay-ledger-{uuid.uuid4().hex[:8]}",
        initial_state=LedgerState(),
    )
    worker = Worker(
        client,
        task_queue=ledger_task_queue(queue),
        workflows=[GpuLedgerWorkflow],
        activities=[ActorActivities(ACTIONS_TEST_KEY).verify_actor],
        **sender_identity_options(),
    )
    return acts, worker


def _signed(key: bytes, wf_id: str, action: str, req, user: str = "alice"):  # type: ignore[no-untyped-def]
    return attest(key, wf_id, action, req, user=user, groups=["sre-oncall"])


async def test_unretire_verified_refused_unverified_when_the_runbook_requires_it(
    dev_env: WorkflowEnvironment,
) -> None:
    client = dev_env.client
    acts, worker = _ledger(client, f"tq-{uuid.uuid4()}")
    gated, open_gpu = f"GPU-{uuid.uuid4()}", f"GPU-{uuid.uuid4()}"
    async with worker:
        handle = client.get_workflow_handle(acts.workflow_id)
        await acts.record_gpu_failure(_failure(gated, "g1", require=True))
        await acts.record_gpu_failure(_failure(open_gpu, "o1", require=False))

        # Straight through Temporal, the runbook requiring verified actors: refused.
        direct = UnretireRequest(gpu_uuid=gated, reason="swapped", actor="alice")
        with pytest.raises(WorkflowUpdateFailedError) as refused:
            await handle.execute_update(UPD_LEDGER_UNRETIRE, direct, result_type=UnretireResult)
        cause = refused.value.cause
        assert isinstance(cause, ApplicationError) and cause.type == ERR_UNVERIFIED_ACTOR
        assert "requires a verified actor for unretire" in str(cause)
        # Signed with another key: still unverified, so still refused, naming why.
        with pytest.raises(WorkflowUpdateFailedError) as forged:
            await handle.execute_update(
                UPD_LEDGER_UNRETIRE,
                _signed(WRONG_KEY, acts.workflow_id, "unretire", direct),
                result_type=UnretireResult,
            )
        assert "signature does not match" in str(forged.value.cause)
        still = await handle.query(QRY_LEDGER_REPORT, LedgerQuery(), result_type=LedgerReport)
        assert {g.gpu_uuid for g in still.gpus if g.retired} == {gated, open_gpu}

        good = _signed(ACTIONS_TEST_KEY, acts.workflow_id, "unretire", direct)
        done = await handle.execute_update(UPD_LEDGER_UNRETIRE, good, result_type=UnretireResult)
        # The same signed message again (copied out of history): a replay, never verified.
        await acts.record_gpu_failure(_failure(gated, "g2", require=False))
        replayed = await handle.execute_update(
            UPD_LEDGER_UNRETIRE, good, result_type=UnretireResult
        )
        # A runbook without the requirement: an unverified un-retire goes through, marked.
        claimed = await handle.execute_update(
            UPD_LEDGER_UNRETIRE,
            UnretireRequest(gpu_uuid=open_gpu, reason="reseated", actor="bob"),
            result_type=UnretireResult,
        )
        report = await handle.query(
            QRY_LEDGER_REPORT, LedgerQuery(since=timedelta(days=1)), result_type=LedgerReport
        )
        state = await handle.query(QRY_LEDGER_STATE, result_type=LedgerState)
        recorded = await handle.fetch_history()
        history = recorded.to_json()
        await handle.terminate("test done")
    assert (done.verification, replayed.verification, claimed.verification) == (
        "verified",
        "unverified",
        "unverified",
    )
    assert good.verified is not None and good.verified.nonce in state.seen_nonces
    gpus = {g.gpu_uuid: g for g in state.gpus}
    first, second = [e for e in gpus[gated].entries if e.kind == "unretired"]
    assert (first.actor, first.verification, first.via) == ("alice", "verified", "kubernetes")
    assert first.groups == ["sre-oncall"]
    assert "by alice (verified via kubernetes; groups sre-oncall)" in describe(first)
    assert second.verification == "unverified" and "already used (a replay)" in second.detail
    (bob,) = [e for e in gpus[open_gpu].entries if e.kind == "unretired"]
    assert bob.verification == "unverified"
    assert describe(bob).endswith(", unverified") and "(claimed; Temporal client" in describe(bob)
    assert report.tracked == 2
    assert ACTIONS_TEST_KEY.decode() not in history
    save_history("ledger_unretire_verified", recorded)


async def test_pause_and_resume_record_verified_or_unverified(
    dev_env: WorkflowEnvironment,
) -> None:
    client = dev_env.client
    queue = f"tq-{uuid.uuid4().hex[:8]}"
    wf_id = f"sickbay-budget-{uuid.uuid4().hex[:8]}"
    worker = Worker(
        client,
        task_queue=budget_task_queue(queue),
        workflows=[BudgetWorkflow],
        activities=[ActorActivities(ACTIONS_TEST_KEY).verify_actor],
    )
    async with worker:
        handle = await client.start_workflow(
            WF_BUDGET, BudgetState(), id=wf_id, task_queue=budget_task_queue(queue)
        )
        direct = await handle.execute_update(
            UPD_BUDGET_PAUSE,
            PauseRequest(reason="driver rollout", actor="mallory"),
            result_type=PauseAnswer,
        )
        forged = await handle.execute_update(
            UPD_BUDGET_PAUSE,
            _signed(WRONG_KEY, wf_id, "pause", PauseRequest(reason="rollout", actor="alice")),
            result_type=PauseAnswer,
        )
        # Signed for `resume` but sent as `pause`: the signature covers the action.
        swapped = await handle.execute_update(
            UPD_BUDGET_PAUSE,
            _signed(ACTIONS_TEST_KEY, wf_id, "resume", PauseRequest(reason="r", actor="alice")),
            result_type=PauseAnswer,
        )
        verified = await handle.execute_update(
            UPD_BUDGET_PAUSE,
            _signed(
                ACTIONS_TEST_KEY, wf_id, "pause", PauseRequest(reason="rollout", actor="alice")
            ),
            result_type=PauseAnswer,
        )
        paused = await handle.query(QRY_BUDGET_STATE, result_type=BudgetState)
        resumed = await handle.execute_update(
            UPD_BUDGET_RESUME,
            _signed(ACTIONS_TEST_KEY, wf_id, "resume", ResumeRequest(reason="done", actor="alice")),
            result_type=PauseAnswer,
        )
        state = await handle.query(QRY_BUDGET_STATE, result_type=BudgetState)
        recorded = await handle.fetch_history()
        history = recorded.to_json()
        await handle.terminate("test done")
    assert [a.verification for a in (direct, forged, swapped, verified, resumed)] == [
        "unverified",
        "unverified",
        "unverified",
        "verified",
        "verified",
    ]
    assert direct.pause is not None
    assert direct.pause.describe().startswith("paused by mallory (unverified) since ")
    assert paused.pause is not None and paused.pause.who() == "alice (verified via kubernetes)"
    log = [(e.action, e.actor, e.verification) for e in state.pause_log]
    assert log == [
        ("pause", "mallory", "unverified"),
        ("pause", "alice", "unverified"),
        ("pause", "alice", "unverified"),
        ("pause", "alice", "verified"),
        ("resume", "alice", "verified"),
    ]
    assert "signature does not match" in state.pause_log[1].reason
    assert state.pause is None and len(state.seen_nonces) == 2
    assert ACTIONS_TEST_KEY.decode() not in history
    save_history("budget_pause_verified", recorded)


async def test_a_launch_is_recorded_verified_or_unverified(dev_env: WorkflowEnvironment) -> None:
    """The remediation's first entry, `launched`: verified for an input the endpoint signed
    (`sickbay launch --via`), unverified for one signed with another key or none."""
    client = dev_env.client
    timelines: dict[str, list[TimelineEntry]] = {}
    for case, key in (("verified", ACTIONS_TEST_KEY), ("forged", WRONG_KEY), ("direct", None)):
        world = FakeWorld()
        wf_id = device_workflow_id(world.node, world.gpu_uuid)
        inp = RemediationInput(
            device=DeviceRef(node=world.node, gpu_uuid=world.gpu_uuid),
            trigger="manual",
            requested_by="alice",
            reason="ECC storm",
        )
        if key is not None:
            inp = _signed(key, wf_id, "launch", inp)
        async with new_worker(client, world) as worker:
            handle = await client.start_workflow(
                WF_REMEDIATE,
                inp,
                id=wf_id,
                task_queue=worker.task_queue,
                result_type=RemediationResult,
            )
            await wait_phase(handle, Phase.HOLDING)
            await handle.signal(SIG_ABORT, AbortRequest(reason="test done", actor="t"))
            result = await handle.result()
        timelines[case] = result.timeline
        if case == "verified":
            history = await handle.fetch_history()
            assert ACTIONS_TEST_KEY.decode() not in history.to_json()
            save_history("launch_verified", history)
    (verified,) = [e for e in timelines["verified"] if e.action == "launched"]
    assert (verified.actor, verified.verification, verified.via) == (
        "alice",
        "verified",
        "kubernetes",
    )
    assert verified.groups == ["sre-oncall"] and verified.reason == "ECC storm"
    (forged,) = [e for e in timelines["forged"] if e.action == "launched"]
    assert forged.verification == "unverified" and "signature does not match" in forged.reason
    (direct,) = [e for e in timelines["direct"] if e.action == "launched"]
    assert (direct.actor, direct.verification) == ("alice", "unverified")
