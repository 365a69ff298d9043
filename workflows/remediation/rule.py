"""The device's quarantine rule: what is asked of the `quarantine` activity and applying it (the
DeviceTaintRule, or the node taint when no rule is served). Shared by the confirm, quarantine
and replace steps."""

from __future__ import annotations

from temporalio import workflow

with workflow.unsafe.imports_passed_through():
    from contract.kube import (
        QuarantineInput,
        QuarantineResult,
        TaintEffect,
    )
    from workflows.remediation.context import Remediation


def quarantine_input(r: Remediation, effect: TaintEffect, dry_run: bool = False) -> QuarantineInput:
    s = r.s
    assert s.device is not None and s.runbook is not None
    spec = s.runbook.spec
    return QuarantineInput(
        device=s.device,
        effect=effect,
        taint_key=spec.quarantine.taint_key,
        taint_value=s.status.failure_class or "unhealthy",
        workflow_id=s.workflow_id,
        reason=f"{s.status.failure_class}: runbook {s.runbook.name}",
        consumers=[c.pod for c in s.consumers],
        fallback_node_threshold=spec.fallback.node_taint_below_healthy,
        dry_run=dry_run,
    )


def effect_of(r: Remediation) -> TaintEffect:
    """The rule's first effect: NoSchedule in mode eviction-api (the Eviction API evicts)."""
    spec = r.s.spec
    return "NoSchedule" if spec.eviction.mode == "eviction-api" else spec.quarantine.effect


async def apply_quarantine(r: Remediation, effect: TaintEffect, label: str) -> QuarantineResult:
    s = r.s
    result = await r.act.quarantine(quarantine_input(r, effect), label)
    s.rule_effect = effect
    s.status.rule_name = result.rule_name or s.status.rule_name
    r.j.log(
        f"quarantined ({effect})",
        outcome=f"{result.mode} {result.action} {result.rule_name or ''}".strip(),
        reason=result.message,
    )
    if s.quarantine is not None and s.quarantine.node_tainted:
        result = result.model_copy(update={"node_tainted": True})
    return result
