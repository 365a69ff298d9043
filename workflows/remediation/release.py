"""Releasing a device: the quarantine lifted (rule, Sickbay's node taint or cordon, a replaced
node's cordon), the lease given back, the page resolved. Shared by the hold and repair steps."""

from __future__ import annotations

from temporalio import workflow

with workflow.unsafe.imports_passed_through():
    from contract.kube import CordonInput, ReleaseInput
    from contract.remediation import Phase
    from workflows.remediation.context import Remediation
    from workflows.remediation.escalation import notify_all
    from workflows.remediation.lease import release_lease
    from workflows.remediation.outcome import Closed
    from workflows.remediation.rule import guarding, lifted


async def release_now(r: Remediation, reason: str) -> Closed:
    """Lift the quarantine, give the lease back, resolve the page: the device is back in
    service (or, replaced, gone)."""
    s, j = r.s, r.j
    j.enter(Phase.RELEASING, awaiting="quarantine removal", next_action="release the budget lease")
    await remove_quarantine(r, reason)
    await j.event("GPUQuarantineReleased", f"quarantine lifted: {reason}", rule=False, pods=False)
    await release_lease(r)
    if s.escalation.done:
        await notify_all(r, "resolve", f"released: {reason}")
        return Closed("escalated", f"escalated ({s.status.escalation_reason}); released: {reason}")
    return Closed("released", reason)


async def remove_quarantine(r: Remediation, reason: str) -> None:
    s = r.s
    if (
        s.quarantine.guard_node is not None
    ):  # a replace's new node, cordoned while its GPUs validated
        uncordon = await r.act.cordon(
            CordonInput(node=s.quarantine.guard_node, cordon=False, workflow_id=s.workflow_id),
            "uncordon new node",
        )
        r.j.log(
            "new node uncordoned",
            outcome=f"{s.quarantine.guard_node}: {uncordon.message}",
            reason=reason,
        )
        guarding(r, None)
    if s.quarantine.result is None or s.confirm.device is None:
        return
    result = await r.act.release_quarantine(
        ReleaseInput(
            device=s.confirm.device,
            rule_name=s.quarantine.result.rule_name,
            api_version=s.quarantine.result.api_version,
            node_tainted=s.quarantine.result.node_tainted,
            workflow_id=s.workflow_id,
            reason=reason,
            rule_uids=s.quarantine.result.rule_uids,
        )
    )
    r.j.log(
        "quarantine released",
        outcome="removed" if result.removed else "absent",
        reason=result.message,
    )
    if s.quarantine.result.node_cordoned:
        uncordon = await r.act.cordon(
            CordonInput(node=s.confirm.device.node, cordon=False, workflow_id=s.workflow_id),
            "uncordon node",
        )
        r.j.log("node uncordoned", outcome=uncordon.message)
    lifted(r)
