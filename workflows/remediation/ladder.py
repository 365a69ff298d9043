"""The repair ladder a failure gets: the runbook's rungs that apply to its class and Xid, and
what each would do (a dry run's timeline, the confirm step's plan). Shared by the confirm and
repair steps."""

from __future__ import annotations

from temporalio import workflow

with workflow.unsafe.imports_passed_through():
    from contract.base import format_duration
    from contract.capacity import NodePoolTarget
    from contract.runbook import (
        RESET_UNREACHABLE_XIDS,
        RungAction,
        ladder_for,
    )
    from workflows.classify import classify_xid
    from workflows.remediation.context import Remediation


def failure_xid(r: Remediation) -> int | None:
    """The Xid the failure class came from: the latest alert's of that class, else the
    latest Xid at all (an alert's own, else the Xid its rule stands for)."""
    xids = [x for a in r.s.journal.alerts if (x := a.xid if a.xid is not None else a.rule_xid)]
    cls = r.s.status.failure_class
    same = [x for x in xids if classify_xid(x) == cls]
    chosen = same or xids
    return chosen[-1] if chosen else None


def ladder(r: Remediation) -> list[RungAction]:
    s = r.s
    if s.inp.trigger == "maintenance":
        return []
    return ladder_for(s.spec.repair, s.status.failure_class or "unknown", failure_xid(r))


def skipped_rungs(r: Remediation, rungs: list[RungAction]) -> str:
    """Why the runbook's other rungs do not apply (for the timeline)."""
    xid = failure_xid(r)
    out = []
    for action in r.s.spec.repair.order:
        if action in rungs:
            continue
        if action == "reset" and xid in RESET_UNREACHABLE_XIDS:
            out.append(f"reset not applicable: Xid {xid}, the GPU is off the bus")
        else:
            out.append(f"{action} not applicable to {failure_words(r)}")
    return "; ".join(out)


def failure_words(r: Remediation) -> str:
    xid = failure_xid(r)
    cls = r.s.status.failure_class or "unknown"
    return f"Xid {xid} ({cls})" if xid is not None else cls


def describe(r: Remediation) -> list[str]:
    """What each rung would do (a dry run's timeline); empty when none would run."""
    s = r.s
    if not s.spec.repair.enabled or s.inp.trigger == "maintenance":
        return []
    device = s.confirm.device
    assert device is not None
    out = []
    for action in ladder(r):
        rung = s.spec.repair.rung(action)
        if action == "reset":
            out.append(
                f"reset GPU {device.gpu_uuid} (with its reset group) on {device.node} by a "
                f"privileged Job ({format_duration(rung.timeout)} timeout), once nothing holds it"
            )
        else:
            pool = repair_pool(r)
            who = f"provider {pool.provider}" if pool else "no provider (escalate)"
            out.append(
                f"{action} node {device.node} through {who} after draining it "
                f"(PodDisruptionBudgets honoured), wait {format_duration(rung.timeout)} for its GPUs"
            )
    if out and s.spec.validation.enabled:
        text = f"validate with dcgmi diag level {s.spec.validation.level} before release"
        if "replace" in ladder(r):
            text += (
                "; after a replace, cordon the new node as soon as it registers and run one "
                "validation Job per new GPU before closing (a failure keeps it cordoned and "
                "escalates)"
            )
        out.append(text)
    elif out and "replace" in ladder(r):
        out.append("a replace's new GPUs would go into service unvalidated (validation off)")
    return out


def repair_pool(r: Remediation) -> NodePoolTarget | None:
    """Where the node's machine lives: the runbook's scale-up pool, else its provider with the
    device's own pool."""
    s = r.s
    policy = s.spec.scale_up
    if policy.pool is not None:
        return policy.pool
    # `karpenter` names no machine provider (Karpenter provisions, it reboots nothing).
    if policy.provider is None or policy.provider == "karpenter" or s.confirm.device is None:
        return None
    return NodePoolTarget(
        provider=policy.provider,
        name=s.confirm.device.node_pool or s.confirm.device.node,
        node_pool_label=s.confirm.device.node_pool,
    )
