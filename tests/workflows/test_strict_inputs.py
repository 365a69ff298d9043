"""What a person sends is taken literally: no string-to-bool, string-to-number or
number-to-time coercion in any signal or update a person sends (time-skipping server; the
bodies are raw JSON objects, `json/plain` payloads as the Web UI's "Send an Update / Signal"
sends them).

Cases:
- `approve` with `"approve": "yes"` / `"true"` / `1` is refused naming the field; nothing is
  decided, no quarantine; a JSON `true` afterwards approves;
- `extend-deadline` with a bare number for `by` (`300`, `"30"`) or a number for `until` is
  refused naming the field; the deadline does not move; `"30m"` and ISO 8601 still work;
- a refused `abort` / `repaired` signal is a timeline entry that keeps the actor it claims
  (as sent, even a number) beside the Temporal client identity; nothing is aborted;
- the GPU ledger's `unretire` refuses a non-string field; the GPU stays retired.
"""

from __future__ import annotations

import uuid
from datetime import timedelta
from typing import Any

import pytest
from temporalio.api.common.v1 import Payload
from temporalio.client import WorkflowUpdateFailedError
from temporalio.converter import DataConverter
from temporalio.exceptions import ApplicationError
from temporalio.testing import WorkflowEnvironment

from contract.ledger import UnretireResult
from contract.names import (
    ACT_QUARANTINE,
    QRY_STATUS,
    QRY_TIMELINE,
    SIG_ABORT,
    SIG_REPAIRED,
    UPD_APPROVE,
    UPD_EXTEND_DEADLINE,
    UPD_LEDGER_UNRETIRE,
)
from contract.remediation import ApprovalResult, Phase, RemediationStatus, TimelineEntry
from tests.workflows.fakes import FakeWorld, new_worker, past_deadline, start, wait_phase
from tests.workflows.test_lemons import _failure, _ledger
from tests.workflows.test_pending_deadline import pending_world
from tests.workflows.test_remediation import with_spec


def approval_world() -> FakeWorld:
    return FakeWorld(runbooks=with_spec("inference", approval={"required": True, "timeout": "1h"}))


async def refused(handle: Any, update: str, body: Any) -> str:
    """The refusal's message of an update sent as a raw JSON body."""
    with pytest.raises(WorkflowUpdateFailedError) as failed:
        await handle.execute_update(update, body, result_type=Any)
    assert isinstance(failed.value.cause, ApplicationError)
    return failed.value.cause.message


def test_bodies_go_as_plain_json() -> None:
    """What the tests send is what the Web UI sends: a `json/plain` payload of the object."""
    (payload,) = DataConverter.default.payload_converter.to_payloads([{"approve": "yes"}])
    assert isinstance(payload, Payload)
    assert payload.metadata["encoding"] == b"json/plain"


async def test_approve_yes_is_not_approval(time_skipping_env: WorkflowEnvironment) -> None:
    client = time_skipping_env.client
    world = approval_world()
    async with new_worker(client, world) as worker:
        handle = await start(client, worker, world)
        await wait_phase(handle, Phase.AWAITING_APPROVAL)
        refusals = [
            await refused(handle, UPD_APPROVE, {"approve": value, "actor": "mallory"})
            for value in ("yes", "true", 1)
        ]
        refusals.append(await refused(handle, UPD_APPROVE, {"approve": True, "actor": 7}))
        status = await handle.query(QRY_STATUS, result_type=RemediationStatus)
        quarantined_before = world.args(ACT_QUARANTINE)
        reply = await handle.execute_update(
            UPD_APPROVE, {"approve": True, "actor": "carol"}, result_type=ApprovalResult
        )
        await wait_phase(handle, Phase.HOLDING)
        entries = await handle.query(QRY_TIMELINE, result_type=list[TimelineEntry])
        await handle.terminate("test over")
    assert refusals[0] == (
        "invalid approve input: approve: Input should be a valid boolean, got 'yes'"
    )
    assert refusals[1].endswith("got 'true'") and refusals[2].endswith("got 1")
    assert refusals[3] == "invalid approve input: actor: Input should be a valid string, got 7"
    assert status.phase is Phase.AWAITING_APPROVAL  # nothing decided by the refused ones
    assert quarantined_before == []
    assert reply.accepted
    assert [e.actor for e in entries if e.action in ("approved", "rejected")] == ["carol"]


async def test_extend_deadline_takes_no_bare_numbers(
    time_skipping_env: WorkflowEnvironment,
) -> None:
    client = time_skipping_env.client
    world = pending_world()
    async with new_worker(client, world) as worker:
        handle = await start(client, worker, world)
        waiting = await past_deadline(
            time_skipping_env, handle, world, Phase.AWAITING_REPLACEMENT, past=-timedelta(minutes=4)
        )
        who = {"reason": "vendor ships a node", "actor": "erin"}
        refusals = {
            name: await refused(handle, UPD_EXTEND_DEADLINE, {**body, **who})
            for name, body in {
                "number": {"by": 300},
                "unitless": {"by": "30"},
                "epoch": {"until": 1900000000},
                "bool": {"by": True},
            }.items()
        }
        after_refusals = await handle.query(QRY_STATUS, result_type=RemediationStatus)
        by = await handle.execute_update(UPD_EXTEND_DEADLINE, {"by": "30m", **who}, result_type=Any)
        assert waiting.deadline is not None
        until = (waiting.deadline + timedelta(hours=2)).strftime("%Y-%m-%dT%H:%M:%SZ")
        to = await handle.execute_update(
            UPD_EXTEND_DEADLINE, {"until": until, **who}, result_type=Any
        )
        await handle.terminate("test over")
    assert refusals["number"] == (
        "invalid extend-deadline input: by: Value error, a duration is a string with its "
        'unit, e.g. "30m", "1h30m", "90s"; got 300'
    )
    assert 'needs its unit, e.g. "30m" or "30s"' in refusals["unitless"]
    assert refusals["epoch"].startswith("invalid extend-deadline input: until: Value error, a time")
    assert "by: " in refusals["bool"]
    assert after_refusals.deadline == waiting.deadline  # nothing moved
    assert by["deadline"] != by["previous"] and to["deadline"].startswith(until[:19])


async def test_refused_signal_keeps_the_claimed_actor(
    time_skipping_env: WorkflowEnvironment,
) -> None:
    client = time_skipping_env.client
    world = approval_world()
    async with new_worker(client, world) as worker:
        handle = await start(client, worker, world)
        await wait_phase(handle, Phase.AWAITING_APPROVAL)
        await handle.signal(SIG_ABORT, {"reason": "", "actor": "eve"})
        await handle.signal(SIG_ABORT, {"reason": "oops", "actor": 42})
        await handle.signal(SIG_REPAIRED, {"actor": "frank", "note": 3})
        await handle.signal(SIG_REPAIRED, {"note": "no actor", "done": True})
        entries: list[TimelineEntry] = []
        for _ in range(500):  # signals are handled in order: wait for the fourth refusal
            entries = await handle.query(QRY_TIMELINE, result_type=list[TimelineEntry])
            if len([e for e in entries if e.action.endswith("signal refused")]) == 4:
                break
        status = await handle.query(QRY_STATUS, result_type=RemediationStatus)
        await handle.terminate("test over")
    refusals = [e for e in entries if e.action.endswith("signal refused")]
    assert [(e.action, e.actor) for e in refusals] == [
        ("abort signal refused", "eve"),
        ("abort signal refused", "42"),
        ("repaired signal refused", "frank"),
        ("repaired signal refused", "unknown"),
    ]
    assert all(e.client_identity and e.client_identity != "unknown" for e in refusals)
    assert refusals[0].reason.startswith("reason: String should have at least 1 character")
    assert refusals[2].reason == "note: Input should be a valid string, got 3"
    assert "done: unknown field" in refusals[3].reason
    assert "claimed actor eve; Temporal client " in refusals[0].who()
    assert status.phase is Phase.AWAITING_APPROVAL  # nothing aborted, nothing released


async def test_unretire_is_strict(time_skipping_env: WorkflowEnvironment) -> None:
    client = time_skipping_env.client
    acts, worker = _ledger(client, f"tq-{uuid.uuid4()}")
    gpu = f"GPU-{uuid.uuid4()}"
    async with worker:
        handle = client.get_workflow_handle(acts.workflow_id)
        for i in range(3):
            decision = await acts.record_gpu_failure(_failure(gpu, f"i{i}"))
        assert decision.retired
        for body in (
            {"gpu_uuid": gpu, "reason": "swapped", "actor": 5},
            {"gpu_uuid": gpu, "reason": True, "actor": "bob"},
        ):
            with pytest.raises(WorkflowUpdateFailedError):
                await handle.execute_update(UPD_LEDGER_UNRETIRE, body, result_type=UnretireResult)
        still = await acts.record_gpu_failure(_failure(gpu, "i2"))  # a retry: same answer
        await handle.terminate("test over")
    assert still.retired
