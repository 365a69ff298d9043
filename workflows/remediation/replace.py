"""Steps 7 and 8, wait for the replacements under the Pending deadline, then scale up: the
owners' new pods must be Running on healthy devices; still Pending at the deadline, the node
pool is asked for capacity (approval per runbook) and waited for under a second deadline.
Eviction churn (the scheduler ignoring the rule) is stopped per `replacement.onChurn`.

Each deadline is a durable workflow timer (named in the Web UI) raced against the
deadline-free `wait-replacement` watch: the watch ends when the replacements run, churn is
seen or no owner needs one; the timer firing cancels it and one look (`look_once`) says what
is Pending, and why (`workflows.replacement`, shared with the node incident, which follows
its evicted workloads the same way). `extend-deadline` moves the timer while the wait runs (never past
`MAX_REPLACEMENT_WAIT` from the wait's start); a worker restart keeps it (it is the server's).
"""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import TYPE_CHECKING

from temporalio import workflow

with workflow.unsafe.imports_passed_through():
    from contract.base import format_duration
    from contract.capacity import KarpenterInput
    from contract.kube import (
        CordonInput,
        EvictPodsInput,
        OwnerRef,
        PodRef,
        ReplacementReport,
        WaitReplacementInput,
    )
    from contract.remediation import (
        MAX_REPLACEMENT_WAIT,
        ExtendDeadlineRequest,
        ExtendDeadlineResult,
        Phase,
    )
    from workflows.remediation.approval import approval
    from workflows.remediation.calls import ACTIVITY_FAILED, Aborted, error_text, error_type
    from workflows.remediation.context import Remediation
    from workflows.remediation.eviction import evict, to_evict
    from workflows.remediation.outcome import Escalation
    from workflows.remediation.pause import hold_while_paused
    from workflows.remediation.rule import apply_quarantine, cordoned
    from workflows.replacement import (
        capacity_error,
        capacity_refusal,
        capacity_request,
        pool_target,
        watch_replacements,
    )


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
    report = await _wait_replacement(r, owners, spec.replacement.pending_deadline, "Pending")
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
                f"replacements still Pending at the deadline ({s.replace.deadline.waited()}): "
                f"{report.unschedulable_message or 'unschedulable'}; scale-up is off",
            )
        scaled = await _scale_up(r, owners)
        if isinstance(scaled, Escalation):
            return scaled
        report = scaled
    if report.status == "churn":
        diag = report.churn.diagnosis if report.churn else "repeated evictions"
        stopped = await _stop_churn(r, report.churn.bound if report.churn else [])
        return Escalation("churn", f"eviction churn: {diag} {stopped}")
    if report.status in ("running", "no-replacement-needed"):
        j.metrics.create_histogram_timedelta(
            "sickbay_time_to_recovery_seconds",
            "From the remediation's start to the workload Running on healthy devices",
        ).with_additional_attributes({"workload_class": s.status.workload_class or ""}).record(
            workflow.now() - workflow.info().start_time
        )
    return None


async def _stop_churn(r: Remediation, bound: list[PodRef]) -> str:
    """End the allocate -> evict loop per `replacement.onChurn`; says what was done.
    `bound`: replacements on the tainted device that nothing evicts (a NoSchedule rule): a
    cordon alone leaves them on the failed GPU, so they are evicted (Eviction API, budgets
    honoured) and their owners recreate them on other nodes."""
    s, j = r.s, r.j
    action = s.spec.replacement.on_churn
    device = s.confirm.device
    assert device is not None
    if action == "cordon":
        result = await r.act.cordon(
            CordonInput(node=device.node, workflow_id=s.workflow_id), "cordon node (churn)"
        )
        if result.changed:
            cordoned(r, True)
        j.log("churn stopped: node cordoned", outcome=result.message)
        moved = await _evict_bound(r, bound)
        return (
            f"Sickbay stopped the loop by cordoning node {device.node} ({result.message}; "
            f"replacements go to other nodes or stay Pending; uncordoned on release){moved}."
        )
    if action == "noschedule" and s.quarantine.effect == "NoSchedule":
        j.log("churn not stopped", reason="the rule is NoSchedule already (eviction-api)")
        return (
            "replacement.onChurn is noschedule, but the rule is NoSchedule already (mode "
            "eviction-api): Sickbay changed nothing; the replacement stays on the failed GPU "
            "(onChurn: cordon would move it)."
        )
    if action == "noschedule":
        await apply_quarantine(r, "NoSchedule", "rule to NoSchedule (churn)")
        j.log("churn stopped: rule switched to NoSchedule")
        return (
            "Sickbay stopped the loop by switching the rule to NoSchedule: nothing is evicted "
            "any more, so a pod the scheduler puts on the device stays on it."
        )
    j.log("churn not stopped", reason="replacement.onChurn: none")
    return "replacement.onChurn is none: Sickbay did not stop the loop; it goes on."


async def _evict_bound(r: Remediation, bound: list[PodRef]) -> str:
    """Evict the replacements bound to the tainted device (the node is cordoned now); says
    what happened, for the escalation."""
    if not bound:
        return ""
    s = r.s
    result = await r.act.evict_pods(
        EvictPodsInput(
            pods=bound,
            workflow_id=s.workflow_id,
            reason=f"GPU {s.status.device} quarantined: placed on it despite the rule",
        )
    )
    names = ", ".join(f"{p.namespace}/{p.name}" for p in bound)
    outcome = (
        f"evicted {len(result.evicted)}, blocked {len(result.blocked)}, gone {len(result.gone)}"
    )
    r.j.log("churn: replacements evicted off the device", outcome=outcome, reason=names)
    live = s.journal.live_pods
    if live is not None:
        r.j.pods_now([p for p in live if p not in result.evicted])
    text = f", and evicted {names} off the failed GPU (Eviction API: {outcome}"
    if result.blocked:
        text += "; " + "; ".join(result.budgets) + ": still on the device"
    return text + ")"


async def _wait_replacement(
    r: Remediation, owners: list[OwnerRef], deadline: timedelta, name: str
) -> ReplacementReport:
    """Watch the replacements until they run (or churn, or no owner needs one), or until the
    deadline timer fires, then look once; `name`: the deadline's, for the timer and Events."""
    s = r.s
    inp = WaitReplacementInput(
        owners=owners,
        old_pods=[c.pod for c in s.confirm.consumers],
        tainted=s.confirm.device.devices if s.confirm.device else [],
        hami_gpu=s.confirm.device.key if s.confirm.device and s.confirm.device.hami else "",
        churn_evictions=s.spec.replacement.churn_evictions,
        rule_effect="NoSchedule" if s.quarantine.effect == "NoSchedule" else "NoExecute",
    )
    start = workflow.now()
    s.status.deadline = s.replace.deadline.start(start, deadline, MAX_REPLACEMENT_WAIT)
    r.j.waits_until(s.status.deadline)
    assert s.replace.deadline.limit is not None

    def aborted() -> None:
        if s.inbox.abort is not None:
            raise Aborted()

    def stopped() -> None:
        s.replace.deadline.stop(workflow.now())
        s.status.deadline = None

    try:
        report = await watch_replacements(
            r.act.wait_replacement,
            inp,
            s.replace.deadline.limit - start,
            s.replace.deadline.current,
            name,
            moved=s.replace.deadline.moved,
            tell=lambda: _tell_extensions(r, name),
            before_look=aborted,
        )
    except GeneratorExit:
        # Dropped from the worker's cache and closed outside the workflow's loop: nothing to
        # record (its replay on the next worker redoes the wait); workflow.now() would raise.
        raise
    except BaseException:
        stopped()
        raise
    stopped()
    r.j.log(
        "replacement wait",
        outcome=report.status,
        reason=report.unschedulable_message or (report.churn.diagnosis if report.churn else ""),
    )
    r.j.pods_now([p.pod for p in report.pods if p.phase in ("Pending", "Running")])
    return report


async def _tell_extensions(r: Remediation, name: str) -> None:
    """An Event for each extension `extend-deadline` accepted since the last look (the
    timeline entry was written by the update itself)."""
    s = r.s
    while s.replace.deadline.extensions:
        req = s.replace.deadline.extensions.pop(0)
        await r.j.event(
            "GPUDeadlineExtended",
            f"{name} deadline extended to {s.replace.deadline.current():%Y-%m-%d %H:%M:%S} UTC by "
            f"{req.actor} ({'verified' if req.verified else 'claimed'}): {req.reason}",
            rule=False,
            node=False,
        )


if TYPE_CHECKING:
    from workflows.remediation.actors import Sender


def check_extension(r: Remediation, req: ExtendDeadlineRequest) -> datetime:
    """The new deadline of an `extend-deadline` request, or ValueError naming why not."""
    s = r.s
    if not s.replace.deadline.running:
        raise ValueError(
            f"no deadline to extend: the remediation is {s.status.phase.value}, not waiting "
            "for replacements (awaiting-replacement, or scaling while waiting for capacity)"
        )
    return s.replace.deadline.check(req)


def extend_deadline(
    r: Remediation, req: ExtendDeadlineRequest, who: Sender | None = None
) -> ExtendDeadlineResult:
    """Move the running wait's deadline timer (validated by `check_extension`)."""
    s = r.s
    # Kept with its attestation only when that was checked: the Event says verified or claimed.
    verified = who is not None and who.verified is not None
    kept = req if verified else req.model_copy(update={"verified": None})
    previous = s.replace.deadline.extend(kept, check_extension(r, req))
    s.status.deadline = s.replace.deadline.current()
    r.j.waits_until(s.status.deadline, moved=True)
    r.j.log_sent(
        "extend-deadline",
        f"deadline extended to {s.replace.deadline.current():%Y-%m-%d %H:%M:%S} UTC",
        who.actor if who is not None else req.actor,
        req.reason,
        who,
    )
    workflow.set_current_details(r.j.details())
    return ExtendDeadlineResult(
        phase=s.status.phase, deadline=s.replace.deadline.current(), previous=previous
    )


async def _scale_up(r: Remediation, owners: list[OwnerRef]) -> ReplacementReport | Escalation:
    """The report after capacity arrived."""
    s, j = r.s, r.j
    policy = s.spec.scale_up
    device = s.confirm.device
    assert device is not None
    j.enter(
        Phase.SCALING,
        awaiting="node-pool capacity",
        next_action="approval of the scale-up" if policy.approval else "wait for capacity",
    )
    j.upsert()
    karpenter = await _karpenter(r, owners)
    if karpenter is not None:  # Karpenter serves them: it provisions, Sickbay scales nothing
        return karpenter
    assert policy.provider != "karpenter"  # _karpenter answered for it
    pool = pool_target(policy, device.node, device.node_pool)
    if policy.approval:
        refused = await approval(r)
        if isinstance(refused, Escalation):
            return refused
        if refused is not None:  # timed out and the runbook says abort: no scale-up
            return Escalation("approval-timeout", f"scale-up not approved: {refused.reason}")
        j.enter(Phase.SCALING, awaiting="node-pool capacity")
    await hold_while_paused(r, f"scale-up of pool {pool.name}")
    wf_id = s.workflow_id
    try:
        result = await r.act.request_capacity(
            capacity_request(policy, pool, wf_id, f"{wf_id}-{workflow.info().run_id}-scale")
        )
    except ACTIVITY_FAILED as err:
        kind = capacity_error(error_type(err))
        return Escalation(kind, f"scale-up of pool {pool.name} failed: {error_text(err)}")
    j.log(
        "capacity requested",
        outcome=result.status,
        reason=f"pool {pool.name} size {result.current_size} -> {result.target_size}"
        + (f"; {result.message}" if result.message else ""),
    )
    refusal = capacity_refusal(result, pool, policy)
    if refusal is not None:
        return Escalation(*refusal)
    await j.event(
        "GPUScaleUpRequested",
        f"no healthy GPU free: asked pool {pool.name} for capacity "
        f"(size {result.current_size} -> {result.target_size})",
        rule=False,
    )
    return await _wait_capacity(r, owners, "scale-up request")


async def _wait_capacity(
    r: Remediation, owners: list[OwnerRef], after_what: str
) -> ReplacementReport | Escalation:
    """The capacity deadline after capacity was asked for (a scale-up, a Karpenter limit)."""
    policy = r.s.spec.scale_up
    r.j.enter(
        Phase.SCALING,
        awaiting="replacements Running (capacity deadline "
        f"{format_duration(policy.capacity_deadline)})",
        until=policy.capacity_deadline,
        next_action="hold the device; still Pending at the deadline: escalate",
    )
    after = await _wait_replacement(r, owners, policy.capacity_deadline, "capacity")
    if after.status == "pending":
        return Escalation(
            "no-capacity",
            f"replacements still Pending at the capacity deadline ({r.s.replace.deadline.waited()} after the "
            f"{after_what}): {after.unschedulable_message or 'unschedulable'}",
        )
    return after


async def _karpenter(
    r: Remediation, owners: list[OwnerRef]
) -> ReplacementReport | Escalation | None:
    """At the Pending deadline with scale-up on: when a Karpenter NodePool serves the failed
    node's workloads, Karpenter's answer (Sickbay never scales a node group beside it: the
    Pending deadline measured Karpenter's provisioning); None: no Karpenter, scale the pool."""
    s, j = r.s, r.j
    policy = s.spec.scale_up
    device = s.confirm.device
    assert device is not None
    knobs = policy.karpenter
    ask = KarpenterInput(
        node=device.node,
        gpu_step=knobs.gpu_step,
        max_gpus=knobs.max_gpus,
        key=f"{s.workflow_id}-{workflow.info().run_id}-karpenter",
    )
    found = await r.act.karpenter_capacity(ask, "look for a Karpenter NodePool")
    if found.node_pool is None:
        if policy.provider == "karpenter":
            return Escalation(
                "scale-up-failed",
                f"scaleUp.provider is karpenter but {found.message}: nothing was scaled",
            )
        return None
    waited = format_duration(s.spec.replacement.pending_deadline)
    j.log("Karpenter serves the replacements", outcome=found.node_pool, reason=found.message)
    if not found.at_limit or not knobs.raise_limits:
        why = (
            "its nvidia.com/gpu limit leaves no room (scaleUp.karpenter.raiseLimits is off)"
            if found.at_limit
            else "Karpenter did not provision a node for them within it"
        )
        return Escalation(
            "no-capacity",
            f"replacements still Pending at the deadline ({waited}): Karpenter NodePool "
            f"{found.node_pool} serves them and {why}; Sickbay scales no node group beside "
            f"Karpenter ({found.message})",
        )
    if policy.approval:
        refused = await approval(r)
        if isinstance(refused, Escalation):
            return refused
        if refused is not None:
            return Escalation("approval-timeout", f"limit raise not approved: {refused.reason}")
        j.enter(Phase.SCALING, awaiting="Karpenter capacity")
    raised = await r.act.karpenter_capacity(
        ask.model_copy(update={"raise_limits": True}), "raise the Karpenter NodePool's limit"
    )
    if raised.raised_to is None:
        return Escalation("no-capacity", f"Karpenter NodePool at its limit: {raised.message}")
    j.log("Karpenter limit raised", outcome=str(raised.node_pool), reason=raised.message)
    await j.event(
        "GPUKarpenterLimitRaised",
        f"no healthy GPU free: raised Karpenter NodePool {raised.node_pool}'s nvidia.com/gpu "
        f"limit {raised.raised_from} -> {raised.raised_to} (runbook scaleUp.karpenter."
        "raiseLimits); Karpenter provisions the node",
        rule=False,
    )
    return await _wait_capacity(r, owners, "Karpenter limit raise")
