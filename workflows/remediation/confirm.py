"""Steps 1 and 2, confirm and resolve the consumers: the device, its evidence and consumers,
the runbook (strictest of the consumers'), the failure class, and whether to act at all.

Independent local activities run side by side (runbooks with resolve; evidence with consumers,
the device counts and, once the runbook is known, the budget lease), so alert -> rule waits
for 4 local activities in a row, not 7. The lease is only asked for here; it is reported (and
a refusal escalated) at the guard step, and given back if the procedure then decides not to
quarantine."""

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
    from contract.runbook import ClassAction, RunbookSet
    from workflows.classify import classify, device_evidence, is_stale
    from workflows.remediation.calls import ACTIVITY_FAILED, error_text, error_type, gather_all
    from workflows.remediation.context import Remediation
    from workflows.remediation.escalation import notify_owner
    from workflows.remediation.ladder import describe as describe_repair
    from workflows.remediation.lease import EarlyLease, ask_lease, give_back
    from workflows.remediation.outcome import Closed, InputRefused
    from workflows.remediation.rule import quarantine_input
    from workflows.runbook_match import DEFAULT_RUNBOOK, select_runbook


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
    started: list[asyncio.Task[Any]] = [loading, resolving]
    await workflow.wait(started)
    if loading.exception() is None:  # a failed resolve escalates through `default`
        s.confirm.fallback = loading.result().get(DEFAULT_RUNBOOK) or s.confirm.fallback
        pinned = inp.runbook
        if pinned and loading.result().get(pinned) is None:
            await workflow.wait([resolving])  # never leave it running behind the refusal
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
    alert_pods = [a.pod for a in s.journal.alerts if a.pod is not None]
    evidence, consumers, early = await _gather(r, device, runbooks, alert_pods)
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
    await j.event(
        "GPUFailureConfirmed",
        f"{failure_class}: {why}; runbook {runbook.name}",
        etype="Warning",
        rule=False,
        node=False,
    )
    return Confirmed(early, counts, counts_why)


async def _gather(
    r: Remediation, device: ResolvedDevice, runbooks: RunbookSet, alert_pods: list[PodRef]
) -> tuple[Evidence, ConsumersResult, EarlyLease | None]:
    """Evidence, consumers and device counts at once; the budget lease as soon as the
    consumers fix the runbook (its limits), while the evidence may still be coming."""
    s = r.s
    consumers_task = asyncio.ensure_future(
        r.act.find_consumers(FindConsumersInput(device=device, alert_pods=alert_pods))
    )
    counts_task: asyncio.Task[DeviceCounts] | None = None
    if not s.inp.dry_run:
        counts_task = asyncio.ensure_future(
            r.act.count_devices(CountDevicesInput(node_pool=device.node_pool))
        )

    async def lease() -> EarlyLease | None:
        consumers = await consumers_task
        if counts_task is None:
            return None
        try:
            counts = await counts_task
            chosen = select_runbook(runbooks.runbooks, consumers.consumers, s.inp.runbook)
            if chosen.runbook.spec.dry_run:
                return None
            return await ask_lease(r, device, chosen.runbook.spec.budget, counts)
        except ACTIVITY_FAILED as err:
            # Counts or budget unreachable: the guard step reports it as its first try
            # ("budget service unavailable", escalate, retry) as without the early request.
            return EarlyLease(device.key, error=err)

    async def counted() -> None:
        # Never leave the count running (or its error unread) behind a failed step.
        if counts_task is not None:
            await workflow.wait([counts_task])
            if not counts_task.cancelled():
                counts_task.exception()

    evidence, consumers, early, _ = await gather_all(
        r.act.gather_evidence(EvidenceInput(device=device)), consumers_task, lease(), counted()
    )
    return evidence, consumers, early


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
