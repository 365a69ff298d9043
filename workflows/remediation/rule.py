"""The device's quarantine rule: what is asked of the `quarantine` activity and applying it (the
DeviceTaintRule, or the node taint when no rule is served). Shared by the confirm, quarantine
and replace steps.

Owns the quarantine record (`state.Quarantine`): the rule as last applied, the node's cordon
by Sickbay, a replaced node's guard cordon; the steps that cordon, uncordon or lift tell it
here (`cordoned`, `guarding`, `lifted`)."""

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
    assert s.confirm.device is not None and s.confirm.runbook is not None
    spec = s.confirm.runbook.spec
    return QuarantineInput(
        device=s.confirm.device,
        effect=effect,
        taint_key=spec.quarantine.taint_key,
        taint_value=s.status.failure_class or "unhealthy",
        workflow_id=s.workflow_id,
        reason=f"{s.status.failure_class}: runbook {s.confirm.runbook.name}",
        consumers=[c.pod for c in s.confirm.consumers],
        fallback_node_threshold=spec.fallback.node_taint_below_healthy,
        dry_run=dry_run,
    )


def effect_of(r: Remediation) -> TaintEffect:
    """The rule's first effect: NoSchedule in mode eviction-api (the Eviction API evicts)."""
    spec = r.s.spec
    return "NoSchedule" if spec.eviction.mode == "eviction-api" else spec.quarantine.effect


async def apply_quarantine(r: Remediation, effect: TaintEffect, label: str) -> QuarantineResult:
    """Apply the rule with `effect` (again: a backstop, a churn switch) and record it."""
    s = r.s
    result = await r.act.quarantine(quarantine_input(r, effect), label)
    s.quarantine.effect = effect
    s.status.rule_name = result.rule_name or s.status.rule_name
    r.j.log(
        f"quarantined ({effect})",
        outcome=f"{result.mode} {result.action} {result.rule_name or ''}".strip(),
        reason=result.message,
    )
    if s.quarantine.result is not None and s.quarantine.result.node_tainted:
        result = result.model_copy(update={"node_tainted": True})
    s.quarantine.result = result
    return result


def cordoned(r: Remediation, on: bool) -> None:
    """Sickbay cordoned the device's node (churn, a rung's drain), or uncordoned it (the rung
    done; a replaced node goes): the release uncordons only a node Sickbay cordoned."""
    q = r.s.quarantine
    if q.result is not None:
        q.result = q.result.model_copy(update={"node_cordoned": on})


def guarding(r: Remediation, node: str | None) -> None:
    """A replace's new node under Sickbay's cordon until its GPUs validate (None: uncordoned)."""
    r.s.quarantine.guard_node = node


def lifted(r: Remediation) -> None:
    """The quarantine is removed: nothing is held any more."""
    r.s.quarantine.result = None
