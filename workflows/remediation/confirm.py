"""Steps 1 and 2, confirm and resolve the consumers: the device, its evidence and consumers,
the runbook (strictest of the consumers'), the failure class, and whether to act at all.

Independent local activities run side by side: runbooks, resolve and the device counts (by the
alert's node) at once; then evidence and consumers, and the budget lease as soon as the device,
its counts and the runbooks are known. The lease is asked within the strictest budget of any
runbook the consumers could choose, so it need not wait for them; a refusal is asked again
within the chosen runbook's budget when that allows more. Alert -> rule waits for 3 local
activities in a row (resolve, lease, quarantine). The lease is only asked for here; it is
reported (and a refusal escalated) at the guard step, and given back if the procedure then
decides not to quarantine."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Any

from temporalio import workflow

with workflow.unsafe.imports_passed_through():
    from contract.errors import ERR_DEVICE_NOT_FOUND
    from contract.kube import (
        ConsumersResult,
        CountDevicesInput,
        DeviceCounts,
        Evidence,
        EvidenceInput,
        FindConsumersInput,
        PodRef,
        ResolvedDevice,
        ResolveDeviceInput,
    )
    from contract.launch import LaunchRequest
    from contract.remediation import Phase
    from contract.runbook import ClassAction, Runbook, RunbookSet
    from workflows.classify import classify, device_evidence, is_stale
    from workflows.remediation.calls import ACTIVITY_FAILED, error_text, error_type, gather_all
    from workflows.remediation.context import Remediation
    from workflows.remediation.escalation import notify_owner
    from workflows.remediation.ladder import describe as describe_repair
    from workflows.remediation.lease import EarlyLease, ask_lease, give_back, limits
    from workflows.remediation.outcome import Closed, InputRefused
    from workflows.remediation.rule import quarantine_input
    from workflows.runbook_match import DEFAULT_RUNBOOK, builtin_default, select_runbook


@dataclass(frozen=True)
class Confirmed:
    """The failure is confirmed and the runbook says quarantine; `early`: the budget's answer
    to the lease asked for while confirming (None: not asked); `counts`: whether it is a GPU
    failure for the ledger (confirmed device evidence), and why or why not (`counts_why`)."""

    early: EarlyLease | None
    counts: bool = False
    counts_why: str = ""


async def confirm(r: Remediation) -> Confirmed | Closed:
    s, j = r.s, r.j
    inp = s.inp
    j.enter(
        Phase.CONFIRMING,
        awaiting="cluster evidence",
        next_action="classify the failure and choose a runbook",
    )
    loading = asyncio.ensure_future(r.act.load_runbooks())
    resolving = asyncio.ensure_future(r.act.resolve_device(ResolveDeviceInput(device=inp.device)))
    counting: asyncio.Task[DeviceCounts] | None = None
    if not inp.dry_run and inp.device.node:  # the alert's node: counted while resolving
        counting = asyncio.ensure_future(
            r.act.count_devices(CountDevicesInput(node=inp.device.node))
        )
    found = await _resolve(r, loading, resolving, counting)
    if isinstance(found, Closed):
        return found
    runbooks, device = found
    alert_pods = [a.pod for a in s.journal.alerts if a.pod is not None]
    evidence, consumers, early = await _gather(
        r, device, runbooks, alert_pods, _counted(counting, device)
    )
    s.confirm.consumers = consumers.consumers
    s.status.consumers = [c.pod for c in s.confirm.consumers]
    selection = select_runbook(runbooks.runbooks, s.confirm.consumers, inp.runbook)
    runbook = s.confirm.runbook = selection.runbook
    s.status.runbook = s.status.workload_class = runbook.name
    s.status.dry_run = s.dry
    for note in selection.notes:
        j.log("runbook note", reason=note)
    j.log("runbook chosen", outcome=runbook.name, reason=selection.why)

    failure_class, why = classify(s.journal.alerts, evidence)
    s.status.failure_class = failure_class
    j.log("classified", outcome=failure_class, reason=why)
    counts, counts_why = device_evidence(inp.trigger, s.journal.alerts, evidence)
    spec = runbook.spec
    stale, stale_why = is_stale(
        s.journal.alerts, evidence, workflow.now(), spec.confirm.stale_after
    )
    if stale:
        return await _no_quarantine(r, early, f"stale evidence: {stale_why}")
    if (
        spec.confirm.require_unhealthy_status
        and inp.trigger not in ("manual", "maintenance")
        and evidence.health != "Unhealthy"
    ):
        return await _no_quarantine(
            r,
            early,
            f"runbook {runbook.name} acts only on an Unhealthy pod status; "
            f"the device reports {evidence.health or 'nothing'}",
        )
    action: ClassAction = getattr(spec.on, failure_class)
    if action == "ignore":
        return await _no_quarantine(r, early, f"runbook {runbook.name}: {failure_class} -> ignore")
    if action == "notify":
        await notify_owner(r, failure_class, why)
        return await _no_quarantine(
            r, early, f"runbook {runbook.name}: {failure_class} -> notify the owner, no quarantine"
        )
    if inp.dry_run or spec.dry_run:
        return await _dry_run(r, device)
    # Beside the budget and the quarantine, not before them: a pod on the GPU does not hold
    # the rule back by one more Kubernetes write.
    j.event_beside(
        "GPUFailureConfirmed",
        f"{failure_class}: {why}; runbook {runbook.name}",
        etype="Warning",
        rule=False,
        node=False,
    )
    return Confirmed(early, counts, counts_why)


async def _resolve(
    r: Remediation,
    loading: asyncio.Task[RunbookSet],
    resolving: asyncio.Task[ResolvedDevice],
    counting: asyncio.Task[DeviceCounts] | None,
) -> tuple[RunbookSet, ResolvedDevice] | Closed:
    """The runbooks and the device (the count by the alert's node ended too: what comes next
    is scheduled in an order that never depends on which answered first, as replay needs);
    refuses a person's bad input, hands a device launched under another id over to its
    canonical workflow."""
    s = r.s
    inp = s.inp
    started: list[asyncio.Task[Any]] = [loading, resolving]
    if counting is not None:
        started.append(counting)
    await workflow.wait(started)  # none is left running behind a refusal
    if counting is not None and not counting.cancelled():
        counting.exception()  # read: a failed count is counted again later, never raised
    if loading.exception() is None:  # a failed resolve escalates through `default`
        s.confirm.fallback = loading.result().get(DEFAULT_RUNBOOK) or s.confirm.fallback
        pinned = inp.runbook
        if pinned and loading.result().get(pinned) is None:
            known = ", ".join(sorted(rb.name for rb in loading.result().runbooks))
            raise InputRefused(f"runbook: no runbook named {pinned!r} (known: {known})")
    failed = resolving.exception()
    person = inp.trigger in ("ui", "manual")
    if failed is not None and person and error_type(failed) == ERR_DEVICE_NOT_FOUND:
        # A person's typo (a UUID the node has not got): invalid input, not an incident.
        raise InputRefused(f"device: {error_text(failed)}")
    await gather_all(loading, resolving)  # raises the first failure
    runbooks, device = loading.result(), resolving.result()
    asked = inp.device
    if (
        person
        and asked.gpu_uuid
        and asked.gpu_index is not None
        and device.gpu_index is not None
        and device.gpu_index != asked.gpu_index
    ):  # two selectors naming two GPUs: acting on either could take the wrong one
        raise InputRefused(
            f"device: gpu_index {asked.gpu_index} and gpu_uuid {asked.gpu_uuid} name different "
            f"GPUs ({asked.gpu_uuid} is GPU {device.gpu_index} of node {device.node})"
        )
    s.confirm.device = device
    s.status.device, s.status.node = device.key, device.node
    if device.workflow_id(inp.cluster) != s.workflow_id:
        return await _hand_over(r, device)
    return runbooks, device


async def _gather(
    r: Remediation,
    device: ResolvedDevice,
    runbooks: RunbookSet,
    alert_pods: list[PodRef],
    counted: DeviceCounts | None,
) -> tuple[Evidence, ConsumersResult, EarlyLease | None]:
    """Evidence and consumers at once, with the budget lease: asked first (with `counted`, the
    counts taken by the alert's node, at once; else after counting the device's pool), within
    the strictest budget a runbook the consumers could choose allows (granted there, it is
    granted within the chosen one's), so it does not wait for the consumers; refused there,
    asked again within the chosen runbook's budget if that allows more. No lease when a dry
    run could be chosen: a dry run takes nothing out of service."""
    s = r.s
    candidates = _candidates(runbooks, s.inp.runbook)

    async def lease() -> EarlyLease | None:
        if s.inp.dry_run:
            return None
        strict: tuple[int, int] | None = None
        try:
            counts = (
                counted
                if counted is not None
                else await r.act.count_devices(CountDevicesInput(node_pool=device.node_pool))
            )
            early: EarlyLease | None = None
            if not any(rb.spec.dry_run for rb in candidates):
                bounds = [limits(rb.spec.budget, counts) for rb in candidates]
                strict = (min(b[0] for b in bounds), min(b[1] for b in bounds))
                early = await ask_lease(r, device, strict, counts)
        except ACTIVITY_FAILED as err:
            # Counts or budget unreachable: the guard step reports it as its first try
            # ("budget service unavailable", escalate, retry) as without the early request.
            return EarlyLease(device.key, error=err)
        consumers = await consumers_task  # its failure is the step's (a lease held is given back)
        chosen = select_runbook(runbooks.runbooks, consumers.consumers, s.inp.runbook)
        if chosen.runbook.spec.dry_run:
            return None  # never asked: a candidate was a dry run
        wanted = limits(chosen.runbook.spec.budget, counts)
        if early is not None:
            assert early.decision is not None
            if early.decision.granted:  # within the chosen budget too: reported within it
                return early._replace(pool_limit=wanted[0], cluster_limit=wanted[1])
            if early.decision.paused is not None or wanted == strict:
                return early
        try:
            return await ask_lease(r, device, wanted, counts)
        except ACTIVITY_FAILED as err:
            return EarlyLease(device.key, error=err)

    # Created first, so the lease's first call is scheduled before the consumers' and the
    # evidence's (one order in every run and replay).
    leasing = asyncio.ensure_future(lease())
    consumers_task = asyncio.ensure_future(
        r.act.find_consumers(FindConsumersInput(device=device, alert_pods=alert_pods))
    )
    evidence, early, consumers = await gather_all(
        r.act.gather_evidence(EvidenceInput(device=device)), leasing, consumers_task
    )
    return evidence, consumers, early


def _candidates(runbooks: RunbookSet, pinned: str | None) -> list[Runbook]:
    """Every runbook the consumers could choose: the pinned one, or any loaded runbook (a
    workload-class label may name any) and the default."""
    chosen = runbooks.get(pinned) if pinned else None
    if chosen is not None:
        return [chosen]
    default = runbooks.get(DEFAULT_RUNBOOK)
    return list(runbooks.runbooks) + ([] if default is not None else [builtin_default()])


def _counted(
    counting: asyncio.Task[DeviceCounts] | None, device: ResolvedDevice
) -> DeviceCounts | None:
    """The counts taken by the alert's node (ended by now), if they counted the device's pool;
    None: none taken, failed (its error is read), or another pool (labels changed)."""
    if counting is None or counting.cancelled() or counting.exception() is not None:
        return None
    counts = counting.result()
    return counts if counts.node_pool == device.node_pool else None


async def _no_quarantine(r: Remediation, early: EarlyLease | None, reason: str) -> Closed:
    """Close without a taint; the lease asked for early is given back."""
    await give_back(r, early)
    return Closed("not-quarantined", reason)


async def _hand_over(r: Remediation, device: ResolvedDevice) -> Closed:
    """Launched under a non-canonical id (e.g. by DRA name from the UI): give the evidence
    to the device's canonical workflow so every trigger meets one remediation."""
    s = r.s
    launch = await r.act.signal_with_start(
        LaunchRequest(
            remediation=s.inp.model_copy(
                update={
                    "device": s.inp.device.model_copy(
                        update={"node": device.node, "gpu_uuid": device.gpu_uuid}
                    )
                }
            ),
            evidence=s.journal.alerts[-1] if s.journal.alerts else None,
            task_queue=workflow.info().task_queue,
            # An alert under the exporter pod's name (Hostname without NODE_NAME) repeating
            # what the device's last run handled starts nothing there either.
            respect_handled=bool(s.journal.alerts)
            and s.journal.alerts[-1].source == "alertmanager",
        )
    )
    if launch.already_handled:
        return Closed(
            "not-quarantined",
            f"already handled: {launch.workflow_id}'s last run handled this evidence "
            "(same Xid under other labels); nothing started",
        )
    return Closed("not-quarantined", f"handed over to {launch.workflow_id}")


async def _dry_run(r: Remediation, device: ResolvedDevice) -> Closed:
    preview = await r.act.preview_quarantine(quarantine_input(r, "None", dry_run=True))
    would = ", ".join(f"{p.namespace}/{p.name}" for p in preview.would_evict) or "no pods"
    r.j.log("dry run: would quarantine", outcome=preview.mode, reason=f"would evict {would}")
    rungs = describe_repair(r)
    for step in rungs:
        r.j.log("dry run: would repair", reason=step)
    then = f"; then {'; '.join(rungs)}" if rungs else ""
    return Closed("dry-run", f"dry run: would quarantine {device.key} and evict {would}{then}")
