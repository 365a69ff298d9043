"""Step 4, approve (optional per runbook, and again before a scale-up): wait for the `approve`
update, up to the runbook's timeout, then act per `approval.onTimeout`."""

from __future__ import annotations

from temporalio import workflow

with workflow.unsafe.imports_passed_through():
    from contract.base import format_duration
    from contract.names import UPD_APPROVE
    from contract.remediation import ApprovalDecision, Phase
    from workflows.remediation.context import Remediation
    from workflows.remediation.escalation import notify_all
    from workflows.remediation.outcome import Closed, Escalation

APPROVAL_NEEDED = (
    "approve or reject the quarantine: the Slack buttons, or `sickbay approve|reject "
    "<node>/<GPU-uuid> --via <actions URL>`"
)

ON_TIMEOUT = {
    "proceed": "quarantine anyway",
    "abort": "close without quarantine",
    "escalate": "escalate, no quarantine",
}


def decided(r: Remediation, decision: ApprovalDecision) -> None:
    """The `approve` update's decision (checked by the handler: awaiting approval, none yet)."""
    r.s.approval.decision = decision


async def approval(r: Remediation) -> Escalation | Closed | None:
    """None: approved (or timed out and the runbook proceeds)."""
    s, j = r.s, r.j
    policy = s.spec.approval
    on_timeout = ON_TIMEOUT[policy.on_timeout]
    s.approval.decision = None
    j.enter(
        Phase.AWAITING_APPROVAL,
        awaiting=f"approval: the `{UPD_APPROVE}` update or `sickbay approve|reject`",
        until=policy.timeout,
        next_action=f"approved: quarantine; rejected: escalate; timed out: {on_timeout}",
    )
    j.log(
        "awaiting approval",
        outcome=f"timeout {format_duration(policy.timeout)}",
        reason=f"then {policy.on_timeout}: {on_timeout}",
    )
    j.upsert()
    # People are asked where they are: the escalation channels get the request (Slack with
    # Approve / Reject / Abort buttons, activities/notify/messages.py); resolved once approved
    # (a rejection or a timeout escalates on the same incident).
    asked = bool(s.spec.escalation.channels) and not s.dry
    if asked:
        await notify_all(
            r,
            "trigger",
            f"awaiting approval for {format_duration(policy.timeout)}, then {on_timeout}",
            needed=APPROVAL_NEEDED,
        )
    try:
        await r.act.wait(
            lambda: s.approval.decision is not None,
            limit=policy.timeout,
            summary=f"approval timeout ({format_duration(policy.timeout)}, then {policy.on_timeout})",
        )
    except TimeoutError:
        j.log("approval timed out", outcome=policy.on_timeout)
        if policy.on_timeout == "proceed":
            return None
        if policy.on_timeout == "abort":
            return Closed("not-quarantined", "approval timed out; runbook says abort")
        return Escalation(
            "approval-timeout",
            f"no approval within {format_duration(policy.timeout)}; device NOT tainted",
        )
    decision = s.approval.decision
    assert decision is not None
    if not decision.approve:
        return Escalation(
            "approval-rejected",
            f"rejected by {j.who('decision')}: {decision.reason or 'no reason given'}",
        )
    if asked:
        await notify_all(r, "resolve", f"approved by {j.who('decision')}")
    return None
