"""Verified actors in the workflow (contract/actors.py, workflows/remediation/actors.py).

A person's action that carries `verified` counts as verified only when the worker's
`verify-actor` (holding the actions key) confirms its signature for this workflow, this action
and this content, and it is fresh. Through Temporal anyone can type a `verified` field:

- a genuine attestation (signed with the worker's key) is recorded verified, with the groups;
- one signed with another key, one whose content was altered after signing, and a stale one
  are recorded *unverified*, naming why;
- with `requireVerifiedActors`, an unverified approve is refused (the update fails, the
  refusal and the claimed actor are in the timeline) and an unverified repaired is refused
  (the device stays held) while the verified ones go through;
- the key is never in the history.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from temporalio.client import WorkflowUpdateFailedError
from temporalio.testing import WorkflowEnvironment

from activities.actors import attest, sign
from contract.actors import VerifiedActor, request_fields
from contract.errors import ERR_UNVERIFIED_ACTOR
from contract.names import SIG_ABORT, SIG_REPAIRED, UPD_APPROVE
from contract.remediation import (
    AbortRequest,
    ApprovalDecision,
    ApprovalResult,
    Phase,
    RemediationResult,
    RepairedRequest,
    TimelineEntry,
)
from tests.waiting import until
from tests.workflows.fakes import (
    ACTIONS_TEST_KEY,
    FakeWorld,
    make_runbook,
    new_worker,
    shipped_runbooks,
    start,
    wait_phase,
)

WRONG_KEY = b"not-the-workers-key-0123456789abcdef012345"


def entries(result: RemediationResult, action: str) -> list[TimelineEntry]:
    return [e for e in result.timeline if e.action == action]


async def test_a_genuine_attestation_is_verified(dev_env: WorkflowEnvironment) -> None:
    world = FakeWorld()
    async with new_worker(dev_env.client, world) as worker:
        handle = await start(dev_env.client, worker, world)
        await wait_phase(handle, Phase.HOLDING)
        req = attest(
            ACTIONS_TEST_KEY,
            handle.id,
            "abort",
            AbortRequest(actor="alice", reason="wrong node"),
            user="alice",
            groups=["sre", "system:authenticated"],
        )
        await handle.signal(SIG_ABORT, req)
        result = await handle.result()
    (abort,) = entries(result, "abort requested")
    assert abort.verification == "verified"
    assert abort.who() == "verified user alice (via kubernetes; groups sre, system:authenticated)"
    assert "aborted by alice (verified via kubernetes)" in result.reason
    history = (await handle.fetch_history()).to_json()
    assert ACTIONS_TEST_KEY.decode() not in history


@pytest.mark.parametrize("forgery", ["other key", "altered", "stale", "other workflow"])
async def test_a_forged_attestation_is_recorded_unverified(
    dev_env: WorkflowEnvironment, forgery: str
) -> None:
    world = FakeWorld()
    async with new_worker(dev_env.client, world) as worker:
        handle = await start(dev_env.client, worker, world)
        await wait_phase(handle, Phase.HOLDING)
        req = AbortRequest(actor="ceo", reason="trust me")
        if forgery == "other key":
            req = attest(WRONG_KEY, handle.id, "abort", req, user="ceo", groups=["admins"])
        elif forgery == "altered":  # signed for one reason, sent with another
            signed = attest(ACTIONS_TEST_KEY, handle.id, "abort", req, user="ceo", groups=[])
            req = signed.model_copy(update={"reason": "something else"})
        elif forgery == "other workflow":  # a signature copied from another remediation
            req = attest(ACTIONS_TEST_KEY, "sickbay-gpu-other", "abort", req, user="ceo", groups=[])
        else:
            old = VerifiedActor(
                user="ceo", issued_at=datetime.now(UTC) - timedelta(minutes=30), nonce="n" * 16
            )
            old.signature = sign(ACTIONS_TEST_KEY, handle.id, "abort", request_fields(req), old)
            req = req.model_copy(update={"verified": old})
        await handle.signal(SIG_ABORT, req)
        result = await handle.result()
    (abort,) = entries(result, "abort requested")
    assert abort.verification == "unverified"
    assert abort.who().startswith("unverified: claimed actor ceo;")
    assert "claimed verified user ceo" in abort.reason
    want = {
        "other key": "signature does not match",
        "altered": "signature does not match",
        "other workflow": "signature does not match",
        "stale": "more than 10m before it was taken in",
    }[forgery]
    assert want in abort.reason


async def test_required_verified_actors_refuse_unverified_approve_and_repaired(
    dev_env: WorkflowEnvironment,
) -> None:
    others = [r for r in shipped_runbooks() if r.name != "inference"]
    gated = make_runbook(
        "inference",
        50,
        match={"ownerKinds": ["Deployment"]},
        approval={"required": True},
        requireVerifiedActors=True,
    )
    world = FakeWorld(runbooks=[*others, gated])
    async with new_worker(dev_env.client, world) as worker:
        handle = await start(dev_env.client, worker, world)
        await wait_phase(handle, Phase.AWAITING_APPROVAL)
        forged = attest(
            WRONG_KEY,
            handle.id,
            "approve",
            ApprovalDecision(approve=True, actor="mallory", reason="go"),
            user="mallory",
            groups=["system:masters"],
        )
        for decision in (ApprovalDecision(approve=True, actor="bob", reason="go"), forged):
            with pytest.raises(WorkflowUpdateFailedError) as failed:
                await handle.execute_update(UPD_APPROVE, decision, result_type=ApprovalResult)
            assert getattr(failed.value.cause, "type", None) == ERR_UNVERIFIED_ACTOR
        genuine = attest(
            ACTIONS_TEST_KEY,
            handle.id,
            "approve",
            ApprovalDecision(approve=True, actor="alice", reason="go"),
            user="alice",
            groups=["sre"],
        )
        reply = await handle.execute_update(UPD_APPROVE, genuine, result_type=ApprovalResult)
        assert reply.accepted
        await wait_phase(handle, Phase.HOLDING)
        await handle.signal(SIG_REPAIRED, RepairedRequest(actor="bob", note="reseated"))
        await handle.signal(
            SIG_REPAIRED,
            attest(
                ACTIONS_TEST_KEY,
                handle.id,
                "repaired",
                RepairedRequest(actor="alice", note="reseated"),
                user="alice",
                groups=["sre"],
            ),
        )
        result = await handle.result()
    refused = entries(result, "approve refused")
    assert [e.actor for e in refused] == ["bob", "mallory"]
    assert all(e.verification == "unverified" for e in refused)
    assert "requires a verified actor for approve" in refused[0].reason
    assert "signature does not match" in refused[1].reason
    (approved,) = entries(result, "approved")
    assert (approved.actor, approved.verification) == ("alice", "verified")
    (refused_repair,) = entries(result, "repaired refused")
    assert refused_repair.actor == "bob"
    (repaired,) = entries(result, "marked repaired")
    assert (repaired.actor, repaired.verification) == ("alice", "verified")
    assert result.outcome == "released"


async def test_awaiting_approval_asks_the_channels_with_buttons(
    dev_env: WorkflowEnvironment,
) -> None:
    """Approval is asked for where people are: a `trigger` to the runbook's channels while
    awaiting approval (its Slack form carries Approve / Reject / Abort), resolved once
    approved."""
    from activities.notify.messages import slack_message
    from contract.names import ACT_NOTIFY

    others = [r for r in shipped_runbooks() if r.name != "inference"]
    gated = make_runbook(
        "inference",
        50,
        match={"ownerKinds": ["Deployment"]},
        approval={"required": True},
        escalation={"channels": ["slack"]},
    )
    world = FakeWorld(runbooks=[*others, gated])
    async with new_worker(dev_env.client, world) as worker:
        handle = await start(dev_env.client, worker, world)
        await wait_phase(handle, Phase.AWAITING_APPROVAL)
        # The phase is shown as it is entered; the notification is the step's next activity.
        (asked,) = await until(lambda: world.args(ACT_NOTIFY), "the approval request sent")
        assert (asked.action, asked.incident.phase) == ("trigger", Phase.AWAITING_APPROVAL)
        assert "sickbay approve|reject" in asked.incident.needed
        buttons = [
            e["action_id"]
            for b in slack_message(asked.incident, asked.action)["blocks"]
            if b["type"] == "actions"
            for e in b["elements"]
        ]
        assert buttons == ["sickbay-approve", "sickbay-reject", "sickbay-abort"]
        await handle.execute_update(
            UPD_APPROVE,
            ApprovalDecision(approve=True, actor="carol", reason="go"),
            result_type=ApprovalResult,
        )
        await wait_phase(handle, Phase.HOLDING)
        await handle.signal(SIG_ABORT, AbortRequest(actor="carol", reason="done"))
        await handle.result()
    resolved = world.args(ACT_NOTIFY)[1]
    assert resolved.action == "resolve"
    assert "approved by carol (claimed" in resolved.incident.summary
