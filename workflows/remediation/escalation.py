"""Step 9, escalate: one escalation per incident (Event, page per the runbook's channels), its
resolution on release, and what a dry run would have sent. Escalation is a normal result,
never an exception."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import timedelta
from typing import Literal

from temporalio import workflow

with workflow.unsafe.imports_passed_through():
    from contract.errors import ERR_DEVICE_NOT_FOUND
    from contract.kube import EventTarget, RecordEventInput
    from contract.notify import EscalationClaim, Incident, NotifyInput
    from contract.remediation import Phase
    from workflows.remediation.calls import ACTIVITY_FAILED, error_text, error_type, gave_up
    from workflows.remediation.context import Remediation
    from workflows.remediation.lemons import incident_id
    from workflows.remediation.outcome import Closed, Escalation

Severity = Literal["critical", "error", "warning", "info"]
NotifyAction = Literal["trigger", "acknowledge", "resolve"]

# Alerts about devices the cluster does not have: one page per node per window, whatever the
# number of made-up UUIDs (the rejections workflow keeps count).
UNRESOLVABLE_PAGE_WINDOW = timedelta(minutes=30)

NEEDED: dict[str, str] = {
    "budget-exhausted": "decide whether to quarantine beyond the blast-radius budget "
    "(sickbay approve/abort) or fix the other quarantined devices first",
    "approval-timeout": "approve or abort the remediation",
    "approval-rejected": "nothing, unless the rejection was a mistake",
    "eviction-timeout": "find out why the pods do not leave the device (PDB, finalizers) "
    "and remove them",
    "pending-deadline": "add GPU capacity or free a healthy device for the replacements",
    "no-capacity": "add GPU capacity; the node pool is at its limit or did not deliver",
    "scale-up-failed": "check the cloud provider (quota, credentials) and add capacity",
    "churn": "the scheduler keeps placing pods on the tainted device: check the "
    "DeviceTaintRule support of the scheduler (kubernetes#139651) and the pods' tolerations",
    "application-error": "check the workload: the GPU looked fine, the program failed",
    "repair-failed": "repair or replace the GPU by hand (or configure the rung's provider), "
    "then mark it repaired; the timeline names each rung's result",
    "error": "look at the timeline: a step failed and automation stopped",
    "node-quarantined": "the GPU could not be quarantined alone (HAMi before v2.10, "
    "SICKBAY_HAMI_DEVICE_CORDON off, or Volcano's vGPU), so its whole node takes no new pods: "
    "repair the GPU and mark it repaired, or run HAMi v2.10+ with SICKBAY_HAMI_DEVICE_CORDON=true",
    "gpu-retired": "RMA the GPU (it failed too often: see its history), or un-retire it "
    "with a reason (sickbay gpus unretire)",
}


def cluster_tag(cluster: str) -> str:
    """`[east] ` in front of a notification's summary, so a person paged for many clusters
    sees which one; nothing for the unnamed cluster."""
    return f"[{cluster}] " if cluster else ""


async def escalate(
    r: Remediation,
    esc: Escalation,
    severity: Severity | None = None,
    awaiting: str = "people",
) -> None:
    s, j = r.s, r.j
    reason, summary = esc.reason, esc.summary
    if s.escalation.done:
        j.log("already escalated", reason=f"{reason}: {summary}")
        return
    if s.dry:
        return would_escalate(r, esc)
    s.escalation.done = True
    s.status.escalation_reason = reason
    j.enter(Phase.ESCALATED, awaiting=awaiting, next_action=NEEDED[reason])
    j.log("escalate", outcome=reason, reason=summary)
    j.upsert()
    if reason != "application-error":  # that path already put its own Event on the pods
        # Beside the page, not before it: an API server hanging on the write holds the page
        # back only until the workflow task's heartbeat, not through the write's retries.
        j.event_beside(
            "GPURemediationEscalated", f"{summary}. Needed: {NEEDED[reason]}", etype="Warning"
        )
    policy = s.spec.escalation
    if reason not in policy.on:
        j.log(
            "escalation not sent",
            reason=f"runbook {s.status.runbook} escalates only on {policy.on}",
        )
    elif not policy.channels and reason != "application-error":
        j.log("escalation not sent", reason="the runbook names no channels")
    elif reason == "application-error":  # the owners' channel, never on-call's
        if policy.owner_channels:
            await notify_all(
                r,
                "trigger",
                summary,
                severity=severity,
                needed=NEEDED[reason],
                channels=policy.owner_channels,
            )
        else:
            j.log(
                "escalation not sent",
                reason=f"runbook {s.status.runbook} names no owner channel: the owners were "
                "told by a Warning Event on the pods; on-call is never paged for the program's "
                "error",
            )
    else:
        await notify_all(r, "trigger", summary, severity=severity, needed=NEEDED[reason])
    j.metrics.create_counter(
        "sickbay_escalations", "Escalations, by reason"
    ).with_additional_attributes({"reason": reason}).add(1)


def would_escalate(r: Remediation, esc: Escalation) -> None:
    """A dry run never pages and writes no Event: it says what it would have done."""
    s = r.s
    s.escalation.done = True  # once per incident, as for real
    s.escalation.would_have = esc.reason
    policy = s.spec.escalation
    if esc.reason not in policy.on:
        send = f"no page (runbook {s.status.runbook} escalates only on {policy.on})"
    elif esc.reason == "application-error":
        send = f"the owners' channels {policy.owner_channels or '(none)'}, no page"
    elif not policy.channels:
        send = "no page (the runbook names no channels)"
    else:
        send = f"page {', '.join(policy.channels)} ({policy.severity})"
    pods = len(s.confirm.consumers)
    events = f", a Warning Event on {pods} pod(s)" if pods else ""
    r.j.log(
        "dry run: would escalate",
        outcome=esc.reason,
        reason=f"{esc.summary}; would send: {send}{events}; nothing was sent",
    )


async def notify_all(
    r: Remediation,
    action: NotifyAction,
    summary: str,
    severity: Severity | None = None,
    needed: str = "",
    channels: Sequence[str] | None = None,
) -> None:
    s, j = r.s, r.j
    policy = s.spec.escalation
    if channels is None:  # where this incident's escalation went (resolved there too)
        app = s.status.escalation_reason == "application-error"
        channels = policy.owner_channels if app else policy.channels
    if action == "resolve" and not channels:
        return
    if s.dry:  # never reached by the procedure; a last guard against paging
        j.log(f"dry run: would notify ({action})", reason=summary)
        return
    incident = Incident(
        id=s.workflow_id,
        dedup_key=incident_id(r),
        device=s.status.device,
        node=s.status.node,
        workload=", ".join(f"{p.namespace}/{p.name}" for p in s.status.consumers) or None,
        phase=s.status.phase,
        severity=severity or policy.severity,
        reason=s.status.escalation_reason,
        node_pool=s.confirm.device.node_pool if s.confirm.device else None,
        cluster=s.inp.cluster or None,
        summary=f"{cluster_tag(s.inp.cluster)}GPU {s.status.device}: {summary}",
        done=[f"{e.action}: {e.outcome}".rstrip(": ") for e in s.journal.timeline],
        needed=needed,
        timeline=s.journal.timeline,
    )
    for channel in channels:
        try:
            result = await r.act.notify(
                NotifyInput(channel=channel, action=action, incident=incident)
            )
        except ACTIVITY_FAILED as err:
            j.log(f"notify {channel} ({action})", outcome="failed", reason=gave_up(err))
            continue
        for i, failure in enumerate(result.earlier_failures, start=1):
            j.log(f"notify {channel} ({action})", outcome=f"try {i} failed", reason=failure)
        j.log(
            f"notify {channel} ({action})",
            outcome=("delivered" if result.delivered else "not delivered")
            + f" (try {result.attempt})",
            reason=result.detail,
        )


async def resolve_page(r: Remediation, summary: str) -> None:
    """Resolve the incident, if the escalation paged anyone (the runbook may filter it)."""
    if r.s.escalation.done and r.s.status.escalation_reason in r.s.spec.escalation.on:
        await notify_all(r, "resolve", summary)


async def step_failed(r: Remediation, err: BaseException) -> Escalation | Closed:
    """A step failed for good: escalate `error`, unless this node's same cause was already
    paged (then say who, page nobody, close)."""
    why = f"step failed: {error_text(err)}"
    paged = await _paged_elsewhere(r, err, why)
    if paged is None:
        return Escalation("error", why)
    r.s.status.escalation_reason = "error"
    r.j.log("escalation not sent", reason=paged)
    r.j.metrics.create_counter(
        "sickbay_pages_suppressed",
        "Escalations not paged because one was paged for the cause and node",
    ).with_additional_attributes({"cause": "device-not-found"}).add(1)
    return Closed("escalated", f"{why}; {paged}")


async def _paged_elsewhere(r: Remediation, err: BaseException, why: str) -> str | None:
    """For an alert about a device the cluster does not have (made up, or gone): None when
    this run pages, else who already paged for that on this node within the window. Asked of
    the rejections workflow; when it cannot answer, this run pages (loud, not lost)."""
    s = r.s
    if error_type(err) != ERR_DEVICE_NOT_FOUND or s.inp.trigger != "alert":
        return None
    if s.dry:  # a dry run claims nothing: it must not suppress a real page later
        return None
    node = s.inp.device.node or "-"
    claim = EscalationClaim(
        cause="device-not-found",
        node=node,
        holder=s.workflow_id,
        window=UNRESOLVABLE_PAGE_WINDOW,
        detail=why[:300],
    )
    try:
        got = await r.act.claim_escalation(claim)
    except ACTIVITY_FAILED as claim_err:
        r.j.log("escalation claim failed", reason=error_text(claim_err))
        return None
    if got.granted:
        return None
    since = got.since.isoformat() if got.since else "earlier"
    return (
        f"not paged: {got.holder} paged for device-not-found on node {node} at {since} "
        f"({got.suppressed} such alerts since, within {UNRESOLVABLE_PAGE_WINDOW})"
    )


async def notify_owner(r: Remediation, failure_class: str, why: str) -> None:
    """An application error (or a class the runbook only notifies about): a Warning Event on
    the consumers, and an `application-error` escalation at warning severity."""
    s, j = r.s, r.j
    targets = [
        EventTarget(
            api_version="v1",
            kind="Pod",
            name=c.pod.name,
            namespace=c.pod.namespace,
            uid=c.pod.uid,
        )
        for c in s.confirm.consumers
    ]
    message = (
        f"GPU {s.status.device}: {why}. Sickbay classified this as {failure_class}: "
        "the device was NOT quarantined; check the workload."
    )
    if targets and s.dry:
        j.log(
            "dry run: would record Event",
            outcome=f"Warning on {len(targets)} pod(s)",
            reason=message,
        )
    elif targets:
        try:
            await r.act.record_event(
                RecordEventInput(
                    targets=targets,
                    reason="GPUApplicationError"
                    if failure_class == "application"
                    else "GPUFaultNotQuarantined",
                    message=message,
                    type="Warning",
                    workflow_id=s.workflow_id,
                ),
                "record event",
            )
            j.log("owner notified (Event)", outcome=f"{len(targets)} pod(s)")
        except ACTIVITY_FAILED as err:
            j.log("owner Event failed", outcome="failed", reason=error_text(err))
    await escalate(r, Escalation("application-error", message), severity="warning")
