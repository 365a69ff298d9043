"""Steps 7 and 8, wait for the replacements under the Pending deadline, then scale up: the
owners' new pods must be Running on healthy devices; still Pending at the deadline, the node
pool is asked for capacity (approval per runbook) and waited for under a second deadline.
Eviction churn (the scheduler ignoring the rule) is stopped per `replacement.onChurn`."""

from __future__ import annotations

from datetime import timedelta

from temporalio import workflow

with workflow.unsafe.imports_passed_through():
    from contract.base import format_duration
    from contract.capacity import CapacityRequest, NodePoolTarget
    from contract.errors import ERR_POOL_AT_MAX
    from contract.kube import CordonInput, OwnerRef, ReplacementReport, WaitReplacementInput
    from contract.remediation import Phase
    from contract.runbook import EscalationReason
    from workflows.remediation.approval import approval
    from workflows.remediation.calls import ACTIVITY_FAILED, error_text, error_type
    from workflows.remediation.context import Remediation
    from workflows.remediation.outcome import Escalation
    from workflows.remediation.quarantine import apply_quarantine, evict, to_evict


async def evict_and_replace(r: Remediation) -> Escalation | None:
    """Steps 6-8: the consumers leave, their replacements run (scaling up if need be)."""
    try:
        pods = to_evict(r)
        if not pods:
            return None
        return await evict(r, pods) or await replace(r)
    except ACTIVITY_FAILED as err:
        return Escalation("error", f"activity failed: {error_text(err)}")


async def replace(r: Remediation) -> Escalation | None:
    s, j = r.s, r.j
    spec = s.spec
    owners = s.owners()
    if not owners:
        j.log("no owners", reason="bare pods: nothing will replace them")
        return None
    j.enter(
        Phase.AWAITING_REPLACEMENT,
        awaiting="replacements Running (Pending deadline "
        f"{format_duration(spec.replacement.pending_deadline)})",
        until=spec.replacement.pending_deadline,
        next_action="hold the device; still Pending at the deadline: "
        + ("scale up the node pool" if spec.scale_up.enabled else "escalate"),
    )
    j.upsert()
    report = await _wait_replacement(r, owners, spec.replacement.pending_deadline)
    if report.status == "running":
        await j.event(
            "GPUReplacementRunning",
            "replacement(s) Running on healthy devices: "
            + ", ".join(f"{p.pod.namespace}/{p.pod.name}" for p in report.pods if p.phase),
            rule=False,
            node=False,
        )
    if report.status == "pending":
        if not spec.scale_up.enabled:
            return Escalation(
                "pending-deadline",
                f"replacements still Pending after {spec.replacement.pending_deadline}: "
                f"{report.unschedulable_message or 'unschedulable'}; scale-up is off",
            )
        scaled = await _scale_up(r, owners)
        if isinstance(scaled, Escalation):
            return scaled
        report = scaled
    if report.status == "churn":
        diag = report.churn.diagnosis if report.churn else "repeated evictions"
        stopped = await _stop_churn(r)
        return Escalation("churn", f"eviction churn: {diag} {stopped}")
    if report.status in ("running", "no-replacement-needed"):
        j.metrics.create_histogram_timedelta(
            "sickbay_time_to_recovery",
            "From the remediation's start to the workload Running on healthy devices",
        ).with_additional_attributes({"workload_class": s.status.workload_class or ""}).record(
            workflow.now() - workflow.info().start_time
        )
    return None


async def _stop_churn(r: Remediation) -> str:
    """End the allocate -> evict loop per `replacement.onChurn`; says what was done."""
    s, j = r.s, r.j
    action = s.spec.replacement.on_churn
    device = s.device
    assert device is not None
    if action == "cordon":
        result = await r.act.cordon(
            CordonInput(node=device.node, workflow_id=s.workflow_id), "cordon node (churn)"
        )
        if result.changed and s.quarantine is not None:
            s.quarantine = s.quarantine.model_copy(update={"node_cordoned": True})
        j.log("churn stopped: node cordoned", outcome=result.message)
        return (
            f"Sickbay stopped the loop by cordoning node {device.node} ({result.message}; "
            "replacements go to other nodes or stay Pending; uncordoned on release)."
        )
    if action == "noschedule":
        s.quarantine = await apply_quarantine(r, "NoSchedule", "rule to NoSchedule (churn)")
        j.log("churn stopped: rule switched to NoSchedule")
        return (
            "Sickbay stopped the loop by switching the rule to NoSchedule: nothing is evicted "
            "any more, so a pod the scheduler puts on the device stays on it."
        )
    j.log("churn not stopped", reason="replacement.onChurn: none")
    return "replacement.onChurn is none: Sickbay did not stop the loop; it goes on."


async def _wait_replacement(
    r: Remediation, owners: list[OwnerRef], deadline: timedelta
) -> ReplacementReport:
    s = r.s
    report = await r.act.wait_replacement(
        WaitReplacementInput(
            owners=owners,
            old_pods=[c.pod for c in s.consumers],
            tainted=s.device.devices if s.device else [],
            deadline=deadline,
            churn_evictions=s.spec.replacement.churn_evictions,
        )
    )
    r.j.log(
        "replacement wait",
        outcome=report.status,
        reason=report.unschedulable_message or (report.churn.diagnosis if report.churn else ""),
    )
    s.live_pods = [p.pod for p in report.pods if p.phase in ("Pending", "Running")]
    return report


async def _scale_up(r: Remediation, owners: list[OwnerRef]) -> ReplacementReport | Escalation:
    """The report after capacity arrived."""
    s, j = r.s, r.j
    policy = s.spec.scale_up
    device = s.device
    assert device is not None
    j.enter(
        Phase.SCALING,
        awaiting="node-pool capacity",
        next_action="approval of the scale-up" if policy.approval else "wait for capacity",
    )
    j.upsert()
    pool = policy.pool or NodePoolTarget(
        provider=policy.provider or "http",
        name=device.node_pool or device.node,
        node_pool_label=device.node_pool,
    )
    if policy.approval:
        refused = await approval(r)
        if isinstance(refused, Escalation):
            return refused
        if refused is not None:  # timed out and the runbook says abort: no scale-up
            return Escalation("approval-timeout", f"scale-up not approved: {refused.reason}")
        j.enter(Phase.SCALING, awaiting="node-pool capacity")
    wf_id = s.workflow_id
    try:
        result = await r.act.request_capacity(
            CapacityRequest(
                pool=pool,
                need=1,
                step=policy.step,
                max_size=policy.max_size,
                cooldown=policy.cooldown,
                requester=wf_id,
                idempotency_key=f"{wf_id}-{workflow.info().run_id}-scale",
            )
        )
    except ACTIVITY_FAILED as err:
        kind: EscalationReason = (
            "no-capacity" if error_type(err) == ERR_POOL_AT_MAX else "scale-up-failed"
        )
        return Escalation(kind, f"scale-up of pool {pool.name} failed: {error_text(err)}")
    j.log(
        "capacity requested",
        outcome=result.status,
        reason=f"pool {pool.name} size {result.current_size} -> {result.target_size}"
        + (f"; {result.message}" if result.message else ""),
    )
    if result.status == "at-max":
        return Escalation(
            "no-capacity",
            f"no healthy GPU free and pool {pool.name} is at its max size "
            f"({result.current_size or policy.max_size}); replacements Pending",
        )
    if result.status == "rejected":
        return Escalation("scale-up-failed", f"pool {pool.name}: {result.message}")
    await j.event(
        "GPUScaleUpRequested",
        f"no healthy GPU free: asked pool {pool.name} for capacity "
        f"(size {result.current_size} -> {result.target_size})",
        rule=False,
    )
    j.enter(
        Phase.SCALING,
        awaiting="replacements Running (capacity deadline "
        f"{format_duration(policy.capacity_deadline)})",
        until=policy.capacity_deadline,
        next_action="hold the device; still Pending at the deadline: escalate",
    )
    after = await _wait_replacement(r, owners, policy.capacity_deadline)
    if after.status == "pending":
        return Escalation(
            "no-capacity",
            f"replacements still Pending {policy.capacity_deadline} after the scale-up "
            f"request: {after.unschedulable_message or 'unschedulable'}",
        )
    return after
