"""Step 5, quarantine: the DeviceTaintRule (NoExecute; or NoSchedule, the Eviction API and a
NoExecute backstop in mode eviction-api; no rule served: the Eviction API and a node taint),
applied through `rule`. Step 6, the consumers leaving the device (`eviction`), is started by
the replace step, which then follows their replacements."""

from __future__ import annotations

from temporalio import workflow

with workflow.unsafe.imports_passed_through():
    from contract.remediation import Phase
    from workflows.remediation.calls import ACTIVITY_FAILED, error_text
    from workflows.remediation.context import Remediation
    from workflows.remediation.outcome import Escalation
    from workflows.remediation.rule import apply_quarantine, effect_of


async def quarantine(r: Remediation) -> Escalation | None:
    s, j = r.s, r.j
    j.enter(
        Phase.QUARANTINING,
        awaiting="DeviceTaintRule",
        next_action="wait for the consumers to leave the device",
    )
    effect = effect_of(r)
    try:
        result = await apply_quarantine(r, effect, "quarantine")
    except ACTIVITY_FAILED as err:
        return Escalation("error", f"quarantine failed: {error_text(err)}")
    await j.event("GPUQuarantined", result.message or effect)
    j.metrics.create_histogram_timedelta(
        "sickbay_time_to_quarantine_seconds",
        "From the remediation's start to the device's quarantine",
    ).with_additional_attributes({"workload_class": s.status.runbook or ""}).record(
        workflow.now() - workflow.info().start_time
    )
    if result.node_level:
        # HAMi without a per-GPU cordon: the whole node was tainted and its consumers evicted
        # by the quarantine itself; say so to people and hold it until the GPU is repaired.
        return Escalation("node-quarantined", result.node_level)
    return None
