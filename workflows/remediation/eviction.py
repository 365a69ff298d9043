"""Evicting the consumers of a quarantined device and waiting for them to go: the rule's
NoExecute, or the Eviction API (PodDisruptionBudgets honoured, a NoExecute backstop), forced
per the runbook. Shared by the quarantine, replace and repair steps."""

from __future__ import annotations

from datetime import datetime, timedelta

from temporalio import workflow

with workflow.unsafe.imports_passed_through():
    from contract.base import format_duration
    from contract.kube import (
        EvictionReport,
        EvictPodsInput,
        EvictPodsResult,
        PodRef,
        WaitEvictionInput,
    )
    from contract.remediation import Phase
    from workflows.remediation.context import Remediation
    from workflows.remediation.outcome import Escalation
    from workflows.remediation.pause import hold_while_paused
    from workflows.remediation.rule import apply_quarantine, effect_of


# After forcing, how long the pods get to go before we escalate.
FORCE_GRACE = timedelta(minutes=2)


def to_evict(r: Remediation) -> list[PodRef]:
    """The consumers to evict (none: nothing to evict, and so nothing to replace)."""
    s = r.s
    pods = [c.pod for c in s.confirm.consumers if not c.terminating] or [
        c.pod for c in s.confirm.consumers
    ]
    if not pods:
        r.j.log("no consumers", reason="nothing to evict or replace")
        return []
    if effect_of(r) == "NoSchedule" and s.spec.eviction.mode != "eviction-api":
        r.j.log(
            "consumers keep running",
            reason="NoSchedule only blocks new pods on the device (runbook "
            f"{s.confirm.runbook.name if s.confirm.runbook else ''})",
        )
        return []
    return pods


def _still_blocked(result: EvictPodsResult, report: EvictionReport) -> bool:
    """Some consumer still there is one a PodDisruptionBudget refused to let go."""
    keys = {(p.namespace, p.name) for p in result.blocked}
    return any((p.namespace, p.name) in keys for p in report.remaining)


def waited(since: datetime) -> str:
    """How long since `since`, in whole seconds (`20s`, `2m`): what an escalation states."""
    return format_duration(timedelta(seconds=round((workflow.now() - since).total_seconds())))


async def wait_gone(
    r: Remediation,
    pods: list[PodRef],
    blocked: EvictPodsResult,
    deadline: datetime,
    timer: str,
    label: str = "eviction wait",
) -> EvictionReport:
    """The consumers `pods` leaving, until the runbook timer at `deadline` (named `timer`):
    the watch is raced against that workflow timer and, when it fires, cancelled without
    waiting for it (one look at the pods then), so the next step starts on time. Pods a
    PodDisruptionBudget still refused (`blocked`) do not go by waiting: reported remaining,
    not waited for."""
    held = {(p.namespace, p.name) for p in blocked.blocked}
    waiting = [p for p in pods if (p.namespace, p.name) not in held]
    report = EvictionReport(remaining=[p for p in pods if (p.namespace, p.name) in held])
    if waiting:
        left = deadline - workflow.now()
        seen: EvictionReport | None = None
        if left > timedelta(0):
            seen = await r.act.within(
                r.act.wait_eviction(WaitEvictionInput(pods=waiting, timeout=left)), deadline, timer
            )
        if seen is None:  # the timer fired (or had): look once at what is still there
            seen = await r.act.wait_eviction(WaitEvictionInput(pods=waiting, timeout=timedelta(0)))
        report = EvictionReport(
            gone=seen.gone,
            remaining=[*report.remaining, *seen.remaining],
            timed_out=seen.timed_out or bool(seen.remaining),
        )
    report.timed_out = report.timed_out or bool(report.remaining)
    r.j.log(
        label,
        outcome=f"gone {len(report.gone)}, remaining {len(report.remaining)}",
        reason="timed out" if report.remaining else "",
    )
    return report


async def evict(r: Remediation, pods: list[PodRef]) -> Escalation | None:
    """None once the consumers are gone.

    The eviction timeout is one workflow timer from the start of the step: the Eviction API
    retries what a PodDisruptionBudget refuses until it (inside evict-pods, each round one
    bounded call), the watch of the others is raced against it, and when it fires the next
    step (force per the runbook, or the escalation) starts at once. A pod a budget still
    protects then is never pushed past it unless the runbook forces (`noexecute` /
    `delete`): the remediation escalates `eviction-timeout` naming the budget and the time
    it really waited, and holds the device under its NoSchedule rule."""
    s, j = r.s, r.j
    policy = s.spec.eviction
    eviction_api = policy.mode == "eviction-api"
    forcing = policy.force in ("noexecute", "delete")
    j.enter(
        Phase.EVICTING,
        awaiting=f"{len(pods)} consumer(s) to go",
        until=policy.timeout,
        next_action="wait for the replacements"
        + (
            f"; still there at the timeout: force ({policy.force})"
            if policy.force != "none"
            else "; still there at the timeout: escalate"
        ),
    )
    j.upsert()
    started = workflow.now()
    deadline = started + policy.timeout
    timer = f"eviction timeout ({format_duration(policy.timeout)})"
    blocked = EvictPodsResult()
    # No rule served: the fallback evicted once through the Eviction API; what a budget
    # refused then is retried like eviction-api mode's evictions (there is no backstop).
    fallback = s.quarantine.result is not None and s.quarantine.result.mode == "fallback"
    refused = s.quarantine.result.blocked if fallback and s.quarantine.result else []
    if eviction_api or refused:
        blocked = await _evict_pods(
            r,
            pods if eviction_api else refused,
            force=False,
            label="evict via Eviction API",
            retry_for=policy.timeout,
        )
    report = await wait_gone(r, pods, blocked, deadline, timer)
    if report.remaining and refused and _still_blocked(blocked, report) and not forcing:
        return _blocked(r, blocked, report, started)
    if report.remaining and eviction_api:
        if _still_blocked(blocked, report) and not forcing:
            return _blocked(r, blocked, report, started)
        # Backstop: NoExecute deletes pods regardless of budgets (none blocks, or forced).
        await hold_while_paused(r, "NoExecute backstop")
        await apply_quarantine(r, "NoExecute", "NoExecute backstop")
        report = await _wait_eviction(r, report.remaining, FORCE_GRACE)
    if report.remaining and policy.force in ("eviction-api", "delete"):
        await hold_while_paused(r, f"forced eviction ({policy.force})")
        blocked = await _evict_pods(
            r,
            report.remaining,
            force=policy.force == "delete",
            label=f"force ({policy.force})",
            retry_for=None if policy.force == "delete" else FORCE_GRACE,
        )
        report = await _wait_eviction(r, report.remaining, FORCE_GRACE)
        if _still_blocked(blocked, report):
            return _blocked(r, blocked, report, started)
    j.pods_now(list(report.remaining))
    if report.remaining:
        names = ", ".join(f"{p.namespace}/{p.name}" for p in report.remaining)
        return Escalation(
            "eviction-timeout",
            f"consumers still on the device after {waited(started)} (eviction timeout "
            f"{format_duration(policy.timeout)}, force: {policy.force}): {names}",
        )
    await j.event(
        "GPUConsumersEvicted",
        f"{len(report.gone)} consumer(s) left the quarantined device: "
        + ", ".join(f"{p.namespace}/{p.name}" for p in report.gone),
        pods=False,
        node=False,
    )
    return None


def _blocked(
    r: Remediation, blocked: EvictPodsResult, report: EvictionReport, started: datetime
) -> Escalation:
    """A PodDisruptionBudget still protects consumers: escalate naming it, hold."""
    r.j.pods_now(list(report.remaining))
    policy = r.s.spec.eviction
    names = ", ".join(f"{p.namespace}/{p.name}" for p in report.remaining)
    why = "; ".join(blocked.budgets) or "a PodDisruptionBudget refused the eviction"
    return Escalation(
        "eviction-timeout",
        f"PodDisruptionBudget blocks eviction after {waited(started)} (eviction timeout "
        f"{format_duration(policy.timeout)}; {blocked.attempts} tries; force: {policy.force}, "
        f"so the budget is honoured): {why}. Still on the device: {names}. Holding the "
        "device quarantined (new pods cannot get it); free the budget, or force with "
        "eviction.force noexecute/delete",
    )


async def _evict_pods(
    r: Remediation,
    pods: list[PodRef],
    *,
    force: bool,
    label: str,
    retry_for: timedelta | None = None,
) -> EvictPodsResult:
    result = await r.act.evict_pods(
        EvictPodsInput(
            pods=pods,
            workflow_id=r.s.workflow_id,
            reason=f"GPU {r.s.status.device} quarantined",
            delete_if_blocked=force,
            retry_blocked_for=retry_for,
        )
    )
    r.j.log(
        label,
        outcome=f"evicted {len(result.evicted)}, deleted {len(result.deleted)}, "
        f"blocked {len(result.blocked)}, gone {len(result.gone)}"
        + (f" after {result.attempts} tries" if result.attempts > 1 else ""),
        reason="; ".join(result.budgets),
    )
    return result


async def _wait_eviction(r: Remediation, pods: list[PodRef], limit: timedelta) -> EvictionReport:
    report = await r.act.wait_eviction(WaitEvictionInput(pods=pods, timeout=limit))
    r.j.log(
        "eviction wait",
        outcome=f"gone {len(report.gone)}, remaining {len(report.remaining)}",
        reason="timed out" if report.timed_out else "",
    )
    return report
