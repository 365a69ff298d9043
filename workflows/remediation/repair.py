"""Step 9a, repair: walk the runbook's ladder for the failure (`ladder_for`), each rung only
once the device's consumers are gone, then validate the repaired device; pass -> release
(no human hold), fail -> the next rung, none left -> escalate and hold as before.

    consumers gone (quarantine, eviction, replacement)
        |
        v
    for each rung of the ladder (reset -> reboot -> replace, those that apply):
        budget: the lease grows to every GPU the rung takes out (reset group / node);
                refused -> escalated "budget-exhausted", held
        drain:  reset of a group > 1: node cordoned, the group's holders evicted;
                reboot / replace: node cordoned, every pod evicted (Eviction API, PDBs
                honoured; still there after eviction.timeout -> escalated, held)
        act:    reset Job (holders checked first) | reboot / replace through the node's
                provider (preflight first: not configured -> escalated naming it), asked for
                once per attempt, logged before and after; then wait for the node's GPUs
        replace: the new node cordoned the moment it registers (before its GPUs are
                published), then one validation Job per new GPU a pod did not take first
                (the lease now counts them); all pass -> new node uncordoned, the old
                GPU's rule removed, lease given back, closed "replaced: ..."; one fails
                (or was taken) -> escalated "repair-failed" naming the failed / taken
                GPUs and the summaries, the new node kept cordoned and the device held
                (released by a person: rule, cordon and lease go);
                validation.enabled false -> closed, saying the new GPUs were not validated
        validate: the validation Job on the repaired device; pass -> released
    none passed -> escalated "repair-failed" naming each rung's result, held

A rung that fails (Job failed, timeout, a node that did not come back) goes on to the next;
a provider that is not configured or refuses escalates at once, naming it; so does a reset or
validation Job that cannot run (its pod refused by the API or never starting, its image or
command outside the operator's allowlist), with the API's own reason, at the next poll. `maintenance`
(trigger or runbook) never repairs; `repair.enabled: false` keeps the hold as before.
A dry run never reaches this step: `describe` says in its timeline what each rung would do.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta

from temporalio import workflow

with workflow.unsafe.imports_passed_through():
    from contract.base import format_duration
    from contract.errors import (
        ERR_PROVIDER_NOT_CONFIGURED,
        ERR_PROVIDER_REFUSED,
        ERR_REPAIR_JOB_REFUSED,
        ERR_REPAIR_NOT_ALLOWED,
    )
    from contract.kube import (
        CordonInput,
        EvictPodsInput,
        PodRef,
    )
    from contract.remediation import Phase
    from contract.repair_rungs import (
        CleanUpRepairJobInput,
        DrainPodsInput,
        GpuHoldersInput,
        MachineActionInput,
        RepairJobInput,
        RepairJobOutcome,
        ResetGroupInput,
        ValidationJobInput,
        WaitNodeGpusInput,
        WaitRepairJobInput,
    )
    from contract.runbook import (
        RebootRung,
        ReplaceRung,
        ResetRung,
        RungAction,
    )
    from workflows.remediation.calls import ACTIVITY_FAILED, error_text, error_type
    from workflows.remediation.context import Remediation
    from workflows.remediation.eviction import wait_gone, waited
    from workflows.remediation.ladder import (
        failure_words,
        ladder,
        repair_pool,
        skipped_rungs,
    )
    from workflows.remediation.lease import ask_lease, extended
    from workflows.remediation.lemons import (
        incident_id,
        record_repair,
        record_validation_failure,
        repair_allowed,
    )
    from workflows.remediation.outcome import Closed, Escalation
    from workflows.remediation.pause import hold_while_paused, pause_told
    from workflows.remediation.release import release_now
    from workflows.remediation.rule import cordoned, guarding

# A Job's timeout is a workflow timer raced against the poll (the step after it starts when
# it fires); the poll's own schedule-to-close is the timeout plus this margin, a bound only
# for a poll whose cancel never arrives.
JOB_MARGIN = timedelta(minutes=1)
PROVIDER_ERRORS = (ERR_PROVIDER_NOT_CONFIGURED, ERR_PROVIDER_REFUSED)
# A repair Job that cannot run (refused by the API, never starting, image or command not
# allowlisted) says nothing about the GPU and the next rung would not fix it: escalate.
JOB_ERRORS = (ERR_REPAIR_JOB_REFUSED, ERR_REPAIR_NOT_ALLOWED)


@dataclass(frozen=True)
class RungFailed:
    """The rung ran and did not repair the device: the next rung may."""

    why: str


@dataclass(frozen=True)
class Replaced:
    node: str
    gpu_uuids: list[str]


async def repair(r: Remediation) -> Escalation | Closed | None:
    """None: no rung applies (or repair is off): the hold goes on as before."""
    s, j = r.s, r.j
    if s.quarantine.result is None or s.confirm.device is None or not s.spec.repair.enabled:
        return None
    if s.inp.trigger == "maintenance":
        j.log("no repair", reason="maintenance never repairs on its own")
        return None
    if not repair_allowed(r):  # a retired GPU (lemon) is never repaired automatically
        return None
    rungs = ladder(r)
    if not rungs:
        j.log(
            "no repair",
            reason=f"no rung of runbook {s.status.runbook} applies to {failure_words(r)}",
        )
        return None
    skipped = skipped_rungs(r, rungs)
    j.log("repair ladder", outcome=" -> ".join(rungs), reason=skipped or failure_words(r))
    results: list[str] = []
    for attempt, action in enumerate(rungs, start=1):
        s.status.repair_rung, s.status.repair_attempt = action, attempt
        await hold_while_paused(r, f"repair rung {action}")
        try:
            done = await _RUNGS[action](r, attempt)
        except ACTIVITY_FAILED as err:
            if error_type(err) in PROVIDER_ERRORS:
                return Escalation(
                    "repair-failed",
                    f"{action} of node {s.confirm.device.node} refused: {error_text(err)}; "
                    "the device is held",
                )
            if error_type(err) in JOB_ERRORS:
                return _cannot_run(r, action, error_text(err))
            done = RungFailed(f"{action} failed: {error_text(err)}")
        if isinstance(done, Escalation):
            return done
        if isinstance(done, Replaced):
            return await _after_replace(r, attempt, done)
        if isinstance(done, RungFailed):
            results.append(done.why)
            j.log(f"{action} failed", outcome=f"attempt {attempt}", reason=done.why)
            await j.event("GPURepairFailed", done.why, etype="Warning", pods=False, owners=False)
            continue
        await _uncordon(r)
        if not s.spec.validation.enabled:
            j.log(
                "not validated",
                reason="validation.enabled is false: no automatic release, held as before",
            )
            return None
        outcome = await _validate(r, attempt, action)
        if outcome.refused:
            return _cannot_run(r, "validation", outcome.reason)
        if outcome.passed:
            await record_repair(r, action, outcome.summary)  # the GPU ledger counts repairs
            return await release_now(r, f"{action} repaired it; validation passed")
        results.append(f"{action}: validation failed ({outcome.reason or outcome.summary})")
        await record_validation_failure(r, action, outcome.reason or outcome.summary)
        if s.ledger.retired:  # that failure retired it: a lemon is not repaired further
            results.append("the GPU is retired (lemon): no further rung")
            break
    return Escalation(
        "repair-failed",
        f"repair ladder exhausted for {failure_words(r)}: " + "; ".join(results) + "; device held",
    )


def _cannot_run(r: Remediation, what: str, why: str) -> Escalation:
    """A repair Job that cannot run: the API's (or the allowlist's) reason in the timeline and
    the page; the device stays held (no next rung: it would not fix a configuration)."""
    r.j.log(f"{what} Job cannot run", reason=why)
    return Escalation(
        "repair-failed",
        f"{what} Job cannot run: {why}; the device is held (fix the repair namespace or the "
        "allowlist, then release or abort)",
    )


# ------------------------------------------------------------------ rungs -------------------


async def _reset(r: Remediation, attempt: int) -> Escalation | RungFailed | None:
    s, j = r.s, r.j
    device = s.confirm.device
    assert device is not None
    rung: ResetRung = s.spec.repair.reset
    _enter(r, "reset", attempt, "the GPU's reset group", rung.timeout)
    group = await r.act.find_reset_group(
        ResetGroupInput(node=device.node, gpu_uuid=device.gpu_uuid)
    )
    uuids = group.gpu_uuids or [device.gpu_uuid]
    j.log("reset group", outcome=f"{len(uuids)} GPU(s) ({group.source})", reason=", ".join(uuids))
    plan = None
    if len(uuids) > 1 or rung.cost == "node":
        plan = await r.act.find_drain_pods(
            DrainPodsInput(node=device.node, gpu_uuids=[] if rung.cost == "node" else uuids)
        )
    gpus = len(plan.node_gpu_uuids) if plan and rung.cost == "node" else len(uuids)
    refused = await _extend_budget(r, gpus, "reset")
    if refused is not None:
        return refused
    if plan is not None:
        blocked = await _drain(r, plan.pods, "reset of its group")
        if blocked is not None:
            return blocked
    _enter(r, "reset", attempt, "nothing else holding the GPU(s)", rung.timeout)
    await r.act.check_gpu_holders(
        GpuHoldersInput(node=device.node, gpu_uuids=uuids), limit=rung.timeout
    )
    j.log("reset requested", outcome=f"attempt {attempt}", reason=", ".join(uuids))
    started = await r.act.start_reset_job(
        RepairJobInput(
            workflow_id=s.workflow_id,
            incident=_incident_key(r),
            attempt=attempt,
            node=device.node,
            gpu_uuids=uuids,
            image=rung.image,
            command=rung.command,
            timeout=rung.timeout,
        )
    )
    _enter(r, "reset", attempt, f"reset Job {started.job_name}", rung.timeout)
    outcome = await _job_outcome(r, started.namespace, started.job_name, rung.timeout)
    if outcome.refused:
        return _cannot_run(r, "reset", outcome.reason)
    j.log(
        "reset done" if outcome.passed else "reset Job failed",
        outcome=started.job_name,
        reason=outcome.summary or outcome.reason,
    )
    if not outcome.passed:
        return RungFailed(f"reset Job failed: {outcome.reason or outcome.summary}")
    return None


async def _node_rung(
    r: Remediation, attempt: int, action: RungAction, rung: RebootRung | ReplaceRung
) -> Escalation | RungFailed | Replaced | None:
    s, j = r.s, r.j
    device = s.confirm.device
    assert device is not None
    _enter(r, action, attempt, "the node's provider", rung.timeout)
    pool = repair_pool(r)
    request = MachineActionInput(
        workflow_id=_incident_key(r),
        attempt=attempt,
        action="reboot" if action == "reboot" else "replace",
        node=device.node,
        pool=pool,
    )
    if pool is None:
        return Escalation(
            "repair-failed",
            f"{action} of node {device.node}: no provider configured (runbook "
            f"{s.status.runbook} names neither scaleUp.pool nor scaleUp.provider); device held",
        )
    # Preflight (asks nothing): an unconfigured provider escalates before the node is drained.
    call = r.act.reboot_node if action == "reboot" else r.act.replace_node
    await call(request.model_copy(update={"dry_run": True}))
    plan = await r.act.find_drain_pods(DrainPodsInput(node=device.node))
    gpus = max(len(plan.node_gpu_uuids), 1)
    refused = await _extend_budget(r, gpus, action)
    if refused is not None:
        return refused
    blocked = await _drain(r, plan.pods, action)
    if blocked is not None:
        return blocked
    asked_at = workflow.now()
    # Recorded before and after: a crash between the two shows the request was being made;
    # the retried activity carries the same key, so the provider is asked once.
    j.log(f"{action} requested", outcome=f"attempt {attempt}", reason=f"via {pool.provider}")
    await j.event(
        "GPURepairStarted",
        f"{action} of node {device.node} asked of {pool.provider} (attempt {attempt})",
        pods=False,
        owners=False,
    )
    done = await call(request)
    j.log(
        f"{action} asked" if done.asked else f"{action} already asked",
        outcome=done.operation or pool.provider,
        reason=done.detail,
    )
    if action == "replace":
        cordoned(r, False)  # the node goes
    _enter(r, action, attempt, "the node Ready with its GPUs published", rung.timeout)
    # A replace's new GPUs are unvalidated: the activity cordons the new node the moment it
    # sees it (nodes register before their device plugin / DRA driver publishes GPUs), so the
    # pods drained for the replace do not land on them before validation.
    guard = action == "replace" and s.spec.validation.enabled
    try:
        back = await r.act.wait_for_node_gpus(
            WaitNodeGpusInput(
                node=device.node,
                replaced=action == "replace",
                node_pool=device.node_pool,
                previous_uuids=plan.node_gpu_uuids,
                asked_at=asked_at,
                expected_gpus=gpus,
                guard_workflow_id=s.workflow_id if guard else None,
            ),
            limit=rung.timeout,
        )
    except ACTIVITY_FAILED as err:
        return RungFailed(
            f"{action}: node not back with its GPUs within {format_duration(rung.timeout)} ({error_text(err)})"
        )
    j.log("node back", outcome=back.node, reason=f"{len(back.gpu_uuids)} GPU(s) published")
    if action == "replace":
        if back.cordoned:
            guarding(r, back.node)
            j.log(
                "new GPUs guarded",
                outcome=f"node {back.node} cordoned",
                reason="cordoned when it registered: no workload on its GPUs until they pass "
                "validation",
            )
        elif guard:
            j.log("new GPUs not guarded by Sickbay", outcome=back.node, reason=back.guard_note)
        return Replaced(back.node, back.gpu_uuids)
    return None


async def _reboot(r: Remediation, attempt: int) -> Escalation | RungFailed | Replaced | None:
    return await _node_rung(r, attempt, "reboot", r.s.spec.repair.reboot)


async def _replace(r: Remediation, attempt: int) -> Escalation | RungFailed | Replaced | None:
    return await _node_rung(r, attempt, "replace", r.s.spec.repair.replace)


_RUNGS = {"reset": _reset, "reboot": _reboot, "replace": _replace}


# ------------------------------------------------------------------ helpers -----------------


def _enter(r: Remediation, action: str, attempt: int, awaiting: str, limit: timedelta) -> None:
    r.j.enter(
        Phase.REPAIRING,
        awaiting=f"{action} (attempt {attempt}): {awaiting}",
        until=limit,
        next_action="validate the repaired device",
    )
    r.j.upsert()


def _incident_key(r: Remediation) -> str:
    """The incident (`<workflow id>/<id of its first run>`, carried across continue-as-new):
    the same GPU failing again weeks later is a new incident whose reboot / replace must be
    asked for again (the provider deduplicates by key) and whose Jobs are its own."""
    return incident_id(r)


async def _extend_budget(r: Remediation, gpus: int, what: str) -> Escalation | None:
    """The lease grows to every GPU the rung takes out of service (once per size)."""
    s, j = r.s, r.j
    device = s.confirm.device
    assert device is not None
    if gpus <= s.lease.gpus:
        return None
    asked = await ask_lease(r, device, s.spec.budget, None, gpus=gpus)
    decision, pool_limit, cluster_limit = asked.decision, asked.pool_limit, asked.cluster_limit
    assert decision is not None
    if not decision.granted and decision.paused is not None:
        # Paused since the check before this rung (the notice may still be on its way): hold
        # without a page, then ask again.
        pause_told(r, decision.paused)
        await hold_while_paused(r, f"the {what}")
        return await _extend_budget(r, gpus, what)
    if not decision.granted:
        return Escalation(
            "budget-exhausted",
            f"{what} would take {gpus} GPUs out of service: blast-radius budget refuses "
            f"({decision.reason}; pool limit {pool_limit}, cluster limit {cluster_limit}); "
            "not repaired, device held",
        )
    extended(r, gpus)
    j.log("budget lease extended", outcome=f"{gpus} GPUs", reason=f"for the {what}")
    return None


async def _drain(r: Remediation, pods: list[PodRef], what: str) -> Escalation | None:
    """Cordon the node (nothing new lands), evict `pods` through the Eviction API honouring
    PodDisruptionBudgets for eviction.timeout, wait for them to go; never forced."""
    s, j = r.s, r.j
    device = s.confirm.device
    assert device is not None
    cordon = await r.act.cordon(
        CordonInput(node=device.node, workflow_id=s.workflow_id), f"cordon node ({what})"
    )
    if cordon.changed:
        cordoned(r, True)
    j.log("node cordoned", outcome=cordon.message, reason=f"for the {what}")
    if not pods:
        return None
    timeout = s.spec.eviction.timeout
    r.j.enter(
        Phase.REPAIRING,
        awaiting=f"{len(pods)} pod(s) drained for the {what} "
        f"(PodDisruptionBudgets honoured, {format_duration(timeout)})",
        until=timeout,
        next_action=what,
    )
    started = workflow.now()
    result = await r.act.evict_pods(
        EvictPodsInput(
            pods=pods,
            workflow_id=s.workflow_id,
            reason=f"Sickbay: drained for the {what} of a failed GPU",
            retry_blocked_for=timeout,
        )
    )
    # One eviction timeout for the drain (a workflow timer): what a budget still refuses is
    # not waited for, and the escalation comes when the timer fires.
    report = await wait_gone(
        r,
        pods,
        result,
        started + timeout,
        f"drain timeout ({format_duration(timeout)})",
        label="drain wait",
    )
    j.log(
        "drained",
        outcome=f"{len(report.gone)} gone, {len(report.remaining)} remaining",
        reason=", ".join(f"{p.namespace}/{p.name}" for p in report.remaining),
    )
    if report.remaining:
        blocked = {(p.namespace, p.name) for p in result.blocked}
        names = ", ".join(
            f"{p.namespace}/{p.name}"
            + (" (PodDisruptionBudget)" if (p.namespace, p.name) in blocked else "")
            for p in report.remaining
        )
        return Escalation(
            "eviction-timeout",
            f"the {what} needs node {device.node} drained, but after {waited(started)} "
            f"(eviction timeout {format_duration(timeout)}) these pods remain: {names}; not "
            "forced, not repaired, device held",
        )
    return None


async def _uncordon(r: Remediation) -> None:
    """The rung is done: the node Sickbay cordoned for its drain takes pods again (the device
    itself stays under its rule; the validation pod must be schedulable there)."""
    s = r.s
    if (
        s.quarantine.result is None
        or not s.quarantine.result.node_cordoned
        or s.confirm.device is None
    ):
        return
    result = await r.act.cordon(
        CordonInput(node=s.confirm.device.node, cordon=False, workflow_id=s.workflow_id),
        "uncordon node (rung done)",
    )
    cordoned(r, False)
    r.j.log("node uncordoned", outcome=result.message, reason="rung done; the device stays tainted")


async def _job_outcome(
    r: Remediation,
    namespace: str,
    job_name: str,
    limit: timedelta,
    claim: str | None = None,
    deadline: datetime | None = None,
) -> RepairJobOutcome:
    """The Job's verdict, or failed when the rung's / validation's timeout (a workflow timer
    at `deadline`, by default `limit` from now) fires first: the poll is then cancelled
    without waiting for it (it only reads) and the Job cleaned up at once."""
    deadline = deadline or workflow.now() + limit
    kind = "validation" if r.s.status.phase is Phase.VALIDATING else "repair"
    try:
        outcome = await r.act.within(
            r.act.wait_for_repair_job(
                WaitRepairJobInput(namespace=namespace, job_name=job_name),
                limit=limit + JOB_MARGIN,
            ),
            deadline,
            f"{kind} timeout ({format_duration(limit)})",
        )
    except ACTIVITY_FAILED as err:
        outcome = RepairJobOutcome(
            passed=False,
            summary="",
            reason=error_text(err),
            refused=error_type(err) == ERR_REPAIR_JOB_REFUSED,
        )
    if outcome is None:
        outcome = RepairJobOutcome(
            passed=False,
            summary="",
            reason=f"Job {job_name} did not finish within {format_duration(limit)} "
            f"({kind} timeout; waited {waited(deadline - limit)})",
        )
    try:
        await r.act.clean_up_repair_job(
            CleanUpRepairJobInput(namespace=namespace, job_name=job_name, claim_name=claim)
        )
    except ACTIVITY_FAILED as err:  # the Job's TTL removes it within a day
        r.j.log("repair Job not cleaned up", outcome=job_name, reason=error_text(err))
    return outcome


async def _validate(r: Remediation, attempt: int, action: str) -> RepairJobOutcome:
    s, j = r.s, r.j
    device = s.confirm.device
    assert device is not None
    policy = s.spec.validation
    dra = device.devices[0] if device.devices else None
    j.enter(
        Phase.VALIDATING,
        awaiting=f"validation Job (dcgmi diag level {policy.level}) after the {action}",
        until=policy.timeout,
        next_action="release when it passes, else the next rung",
    )
    j.upsert()
    try:
        started = await r.act.start_validation_job(
            ValidationJobInput(
                workflow_id=s.workflow_id,
                incident=_incident_key(r),
                attempt=attempt,
                mode=device.mode,
                node=device.node,
                gpu_uuid=device.gpu_uuid,
                driver=dra.driver if dra else None,
                pool=dra.pool if dra else None,
                device=dra.device if dra else None,
                device_class=device.device_class or "gpu.nvidia.com",
                taint_key=s.spec.quarantine.taint_key,
                image=policy.image,
                command=policy.command,
                level=policy.level,
                timeout=policy.timeout,
            )
        )
    except ACTIVITY_FAILED as err:
        if error_type(err) not in JOB_ERRORS:
            raise
        return RepairJobOutcome(passed=False, summary="", reason=error_text(err), refused=True)
    outcome = await _job_outcome(
        r, started.namespace, started.job_name, policy.timeout, claim=started.claim_name
    )
    if outcome.refused:
        return outcome  # no verdict on the GPU: the ladder escalates with the reason
    verdict = "passed" if outcome.passed else "failed"
    summary = outcome.summary or outcome.reason
    s.status.validation = f"{verdict} after {action}: {summary}"[:500]
    j.log(f"validation {verdict}", outcome=f"after {action}", reason=summary)
    await j.event(
        "GPUValidationPassed" if outcome.passed else "GPUValidationFailed",
        f"validation after {action} {verdict}: {summary}",
        etype="Normal" if outcome.passed else "Warning",
        pods=False,
        owners=False,
    )
    return outcome


async def _after_replace(r: Remediation, attempt: int, new: Replaced) -> Escalation | Closed:
    """The old GPU no longer exists; the new node's GPUs are new devices (new UUIDs, hence new
    workflow ids for their later failures). With validation on, each new GPU passes its own
    validation Job (under the new node's cordon) before the remediation closes; one failing
    keeps the node cordoned and escalates. The old GPU's rule goes, the lease is given back
    when the remediation closes (until then it counts the new GPUs under the guard)."""
    s, j = r.s, r.j
    assert s.confirm.device is not None
    old = s.confirm.device
    gpus = ", ".join(new.gpu_uuids) or "none"
    closing = (
        f"replaced: node {old.node}'s machine was replaced; new node {new.node} with GPUs "
        f"{gpus}; GPU {old.gpu_uuid} no longer exists, so its remediation ends here"
    )
    policy = s.spec.validation
    if not policy.enabled:
        j.log(
            "not validated",
            outcome=f"new node {new.node}",
            reason=f"validation.enabled is false: node {new.node}'s GPUs {gpus} go into "
            "service unvalidated",
        )
        return await release_now(
            r, f"{closing}; new GPUs not validated (validation.enabled is false)"
        )
    refused = await _extend_budget(r, len(new.gpu_uuids), f"validation of node {new.node}'s GPUs")
    if refused is not None:
        return refused
    taken = await _taken_before_guard(r, new)
    free = Replaced(new.node, [u for u in new.gpu_uuids if u not in taken])
    results = await _validate_new(r, attempt, free) if free.gpu_uuids else []
    failed = [(u, o) for u, o in results if not o.passed]
    if failed or taken:
        passed = [u for u, o in results if o.passed]
        guard = (
            f"node {new.node} kept cordoned by Sickbay"
            if s.quarantine.guard_node
            else f"node {new.node} NOT cordoned by Sickbay (check it)"
        )
        problems = [f"GPU {u} failed validation ({o.summary or o.reason})" for u, o in failed] + [
            f"GPU {u} not validated: in use by {', '.join(p)}" for u, p in taken.items()
        ]
        return Escalation(
            "repair-failed",
            f"replace of node {old.node}: new node {new.node}'s "
            + "; ".join(problems)
            + (f"; passed: {', '.join(passed)}" if passed else "")
            + f"; {guard}, its GPUs out of service until a person releases (repaired / abort)",
        )
    return await release_now(
        r,
        f"{closing}; new GPUs validated: dcgmi diag level {policy.level} passed on {gpus}",
    )


async def _taken_before_guard(r: Remediation, new: Replaced) -> dict[str, list[str]]:
    """New GPUs a pod already holds (it landed before the cordon: the node came up Ready with
    its GPUs between two looks, or someone else's cordon was lifted): no validation Job can
    have them, and Sickbay does not evict a workload from them; said loudly instead."""
    taken: dict[str, list[str]] = {}
    for uuid in new.gpu_uuids:
        plan = await r.act.find_drain_pods(DrainPodsInput(node=new.node, gpu_uuids=[uuid]))
        if plan.pods:
            taken[uuid] = [f"{p.namespace}/{p.name}" for p in plan.pods]
    if taken:
        what = "; ".join(f"{u}: {', '.join(p)}" for u, p in taken.items())
        r.j.log("new GPUs in use before validation", outcome=new.node, reason=what)
        await r.j.event(
            "GPUValidationSkipped",
            f"new GPU(s) on {new.node} taken by pods before Sickbay could guard them, not "
            f"validated: {what}",
            etype="Warning",
            pods=False,
            owners=False,
        )
    return taken


async def _validate_new(
    r: Remediation, attempt: int, new: Replaced
) -> list[tuple[str, RepairJobOutcome]]:
    """One validation Job per new GPU (the Job validates one GPU: on DRA its claim selects one
    device by UUID, on the device plugin NVIDIA_VISIBLE_DEVICES names one): a verdict per GPU.
    All are started first, so they run side by side; then each is waited for."""
    s, j = r.s, r.j
    device = s.confirm.device
    assert device is not None
    policy = s.spec.validation
    dra = device.devices[0] if device.devices else None
    j.enter(
        Phase.VALIDATING,
        awaiting=f"{len(new.gpu_uuids)} validation Job(s) on new node {new.node} "
        f"(dcgmi diag level {policy.level}) after the replace",
        until=policy.timeout,
        next_action="close when every new GPU passes, else escalate",
    )
    j.upsert()
    started = []
    results = []
    for uuid in new.gpu_uuids:
        try:
            job = await r.act.start_validation_job(
                ValidationJobInput(
                    workflow_id=s.workflow_id,
                    # A Job of its own per new GPU (the Job's name comes from this key).
                    incident=f"{_incident_key(r)}/{uuid}",
                    attempt=attempt,
                    mode=device.mode,
                    node=new.node,
                    gpu_uuid=uuid,
                    driver=dra.driver if dra else None,  # pool and device: found on the new node
                    device_class=device.device_class or "gpu.nvidia.com",
                    taint_key=s.spec.quarantine.taint_key,
                    image=policy.image,
                    command=policy.command,
                    level=policy.level,
                    timeout=policy.timeout,
                )
            )
        except ACTIVITY_FAILED as err:
            if error_type(err) not in JOB_ERRORS:
                raise
            refused = RepairJobOutcome(
                passed=False, summary="", reason=error_text(err), refused=True
            )
            results.append((uuid, refused))
            continue
        started.append((uuid, job))
    deadline = workflow.now() + policy.timeout  # one timeout for Jobs running side by side
    for uuid, job in started:
        outcome = await _job_outcome(
            r, job.namespace, job.job_name, policy.timeout, claim=job.claim_name, deadline=deadline
        )
        verdict = "passed" if outcome.passed else "failed"
        summary = outcome.summary or outcome.reason
        j.log(f"validation {verdict}", outcome=f"GPU {uuid} after replace", reason=summary)
        await j.event(
            "GPUValidationPassed" if outcome.passed else "GPUValidationFailed",
            f"validation of new GPU {uuid} on {new.node} after replace {verdict}: {summary}",
            etype="Normal" if outcome.passed else "Warning",
            pods=False,
            owners=False,
        )
        results.append((uuid, outcome))
    s.status.validation = (
        "after replace: "
        + "; ".join(
            f"{u} {'passed' if o.passed else 'failed'}: {o.summary or o.reason}" for u, o in results
        )
    )[:500]
    return results
