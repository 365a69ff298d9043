"""The one way a remediation starts: signal-with-start of `remediate-gpu-device`.

Used by the Alertmanager webhook, the CLI, the health sweep and the maintenance drain, so that
every trigger reaches the same workflow for a physical GPU:

- workflow id from `constants.device_workflow_id(node, gpu_uuid)`, computable without a
  cluster call;
- `id_conflict_policy=USE_EXISTING`: a second trigger for a running remediation signals it
  instead of starting another; after a remediation closed, a new alert starts a new run;
- `start_signal=alert` carries the evidence; the workflow de-duplicates it by fingerprint,
  so Alertmanager's repeated notifications are harmless. Several alerts for one device go as
  ONE call with `start_signal=alerts` (a list, each applied as its own `alert`): the webhook
  coalesces a storm's deliveries this way.

`signal_with_start()` is the plain async function (webhook and CLI call it with their client);
`LaunchActivities.signal_with_start_remediation` wraps it as the `signal-with-start-remediation`
activity for workflows (sweep, maintenance), which must not talk to Temporal themselves.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from datetime import UTC, datetime, timedelta
from typing import Any

from temporalio.client import Client, WithStartWorkflowOperation, WorkflowExecutionStatus
from temporalio.common import (
    SearchAttributeKey,
    SearchAttributePair,
    TypedSearchAttributes,
    WorkflowIDConflictPolicy,
    WorkflowIDReusePolicy,
)
from temporalio.exceptions import ApplicationError, WorkflowAlreadyStartedError
from temporalio.service import RPCError, RPCStatusCode

from activities.defn import implements
from contract.errors import ERR_INVALID_INPUT
from contract.launch import SIGNAL_WITH_START_REMEDIATION, LaunchRequest, LaunchResult
from contract.names import (
    SA_CLUSTER,
    SA_DEVICE,
    SA_NODE,
    SA_PHASE,
    SIG_ALERT,
    SIG_ALERTS,
    SIG_REJECTED,
    UPD_CLAIM_ESCALATION,
    WF_REJECTIONS,
    WF_REMEDIATE,
    rejections_workflow_id,
)
from contract.notify import (
    CLAIM_ESCALATION,
    EscalationClaim,
    EscalationClaimResult,
    RejectedAlerts,
    RejectionsState,
)
from contract.remediation import (
    AlertEvidence,
    HandledAlert,
    Phase,
    RemediationInput,
    RemediationResult,
    already_handled,
)

log = logging.getLogger(__name__)

SA_DEVICE_KEY = SearchAttributeKey.for_keyword(SA_DEVICE)
SA_NODE_KEY = SearchAttributeKey.for_keyword(SA_NODE)
SA_CLUSTER_KEY = SearchAttributeKey.for_keyword(SA_CLUSTER)
SA_PHASE_KEY = SearchAttributeKey.for_keyword(SA_PHASE)


def manual_evidence(inp: RemediationInput) -> AlertEvidence:
    """The evidence entry for a launch that carries no alert (CLI, UI, maintenance)."""
    source = "sweep" if inp.trigger == "sweep" else "manual"
    return AlertEvidence(
        source=source,
        alertname=f"sickbay-{inp.trigger}",
        summary=inp.reason or f"{inp.trigger} launch by {inp.requested_by}",
        received_at=datetime.now(UTC),
        labels={"requested_by": inp.requested_by},
    )


def start_summary(inp: RemediationInput, evidence: AlertEvidence | None = None) -> str:
    """The Web UI list view's one-line summary of a remediation, fixed at its start."""
    what: str = inp.trigger
    if evidence is not None and evidence.xid is not None:
        what += f" Xid {evidence.xid}"
    elif evidence is not None and evidence.alertname and inp.trigger == "alert":
        what += f" {evidence.alertname}"
    text = f"GPU {inp.device.key}: {what}"
    reason = inp.reason or (evidence.summary if evidence is not None else "")
    if reason:
        text += f" - {reason}"
    if inp.dry_run:
        text += " (dry run)"
    return text[:200]


def start_details(inp: RemediationInput, evidence: AlertEvidence | None = None) -> str:
    """The static details (markdown) of a remediation: who asked for what, and why."""
    lines = [
        f"**GPU** `{inp.device.key}`",
        f"- node: {inp.device.node or 'resolved by the workflow'}",
        f"- trigger: {inp.trigger}, requested by {inp.requested_by}",
    ]
    if evidence is not None and (evidence.alertname or evidence.xid is not None):
        xid = f" (Xid {evidence.xid})" if evidence.xid is not None else ""
        lines.append(f"- evidence: {evidence.source} {evidence.alertname}{xid}")
    if inp.reason:
        lines.append(f"- reason: {inp.reason}")
    lines.append(
        f"- runbook: {inp.runbook} (pinned)"
        if inp.runbook
        else "- runbook: chosen from the consumers (see the timeline)"
    )
    lines.append(
        "- dry run: nothing is changed, nobody is paged" if inp.dry_run else "- dry run: no"
    )
    return "\n".join(lines)


def start_memo(inp: RemediationInput) -> dict[str, str]:
    """The memo shown with the run: the launch facts, no secrets."""
    memo = {
        "device": inp.device.key,
        "node": inp.device.node or "",
        "trigger": inp.trigger,
        "requested_by": inp.requested_by,
        "reason": inp.reason,
        "runbook": inp.runbook or "",
        "dry_run": "yes" if inp.dry_run else "no",
    }
    return {k: v for k, v in memo.items() if v}


def start_search_attributes(inp: RemediationInput) -> TypedSearchAttributes:
    """What a remediation is listed by from its start: phase `received`, the GPU, its node and
    the cluster (the workflow's first task sets the same values, then each phase it enters)."""
    pairs: list[SearchAttributePair[str]] = [
        SearchAttributePair(SA_PHASE_KEY, Phase.RECEIVED.value),
        SearchAttributePair(SA_DEVICE_KEY, inp.device.key),
    ]
    if inp.device.node:
        pairs.append(SearchAttributePair(SA_NODE_KEY, inp.device.node))
    if inp.cluster:
        pairs.append(SearchAttributePair(SA_CLUSTER_KEY, inp.cluster))
    return TypedSearchAttributes(pairs)


async def signal_with_start(
    client: Client,
    inp: RemediationInput,
    *,
    task_queue: str,
    evidence: AlertEvidence | None = None,
    evidence_list: Sequence[AlertEvidence] | None = None,
    rpc_timeout: timedelta | None = None,
    id_reuse_policy: WorkflowIDReusePolicy = WorkflowIDReusePolicy.ALLOW_DUPLICATE,
) -> LaunchResult:
    """Start the device's remediation, or signal the running one with `evidence`.

    `evidence_list` instead sends several alerts in one call: one is an `alert` signal as
    with `evidence`, more are one `alerts` signal carrying the list (never both arguments).
    The device must be canonical (node + GPU UUID); resolve other forms first (the CLI does
    it through the resolve-device activity code). Raises ValueError otherwise. `rpc_timeout`
    bounds the call (the SDK's default otherwise). `id_reuse_policy` decides whether a closed
    run may be followed by a new one (the webhook passes ALLOW_DUPLICATE_FAILED_ONLY first, so
    that after a completed run the server refuses with WorkflowAlreadyStartedError and the
    webhook asks which alert instances that run handled before starting another).
    """
    if evidence_list is not None and (evidence is not None or not evidence_list):
        raise ValueError("pass either evidence or a non-empty evidence_list, not both")
    if not inp.device.canonical:
        raise ValueError(
            f"device {inp.device.key} has no node + GPU UUID; resolve it before launching "
            "(the workflow id is derived from node + UUID so every trigger meets one workflow)"
        )
    workflow_id = inp.device.workflow_id(inp.cluster)
    signal_args: list[AlertEvidence] | list[list[AlertEvidence]]
    if evidence_list is not None and len(evidence_list) > 1:
        batch = list(evidence_list)
        signal, signal_args, what = SIG_ALERTS, [batch], f"{len(batch)} alerts"
        first = batch[0]
    else:
        one = evidence_list[0] if evidence_list else evidence
        ev = one if one is not None else manual_evidence(inp)
        signal, signal_args, what = SIG_ALERT, [ev], f"alert {ev.fingerprint or ev.alertname}"
        first = ev
    handle = await client.start_workflow(
        WF_REMEDIATE,
        inp,
        id=workflow_id,
        task_queue=task_queue,
        result_type=RemediationResult,
        id_conflict_policy=WorkflowIDConflictPolicy.USE_EXISTING,
        # A closed remediation may be followed by a new one for the same GPU (it failed
        # again after release), so closed ids are reusable (by default).
        id_reuse_policy=id_reuse_policy,
        start_signal=signal,
        start_signal_args=signal_args,
        rpc_timeout=rpc_timeout,
        # Only taken when this call starts the run (the list view's summary and details).
        static_summary=start_summary(inp, first),
        static_details=start_details(inp, first),
        memo=start_memo(inp),
        # Only taken when this call starts the run: listed by phase, cluster, device and node
        # from its first moment (`sickbay status --cluster`, the open-remediation gauges), not
        # from its first task, which a burst can keep waiting for seconds.
        search_attributes=start_search_attributes(inp),
    )
    # SignalWithStartWorkflowExecutionResponse.started says whether this call created the
    # run. (The time-skipping test server leaves it unset, so there it always reads False.)
    resp = getattr(handle, "_start_workflow_response", None)
    started = bool(getattr(resp, "started", False))
    log.info(
        "%s remediation %s for %s (%s)",
        "started" if started else "signalled",
        workflow_id,
        inp.device.key,
        what,
    )
    return LaunchResult(
        workflow_id=workflow_id,
        run_id=handle.result_run_id,
        started=started,
        device=inp.device.key,
    )


async def closed_run_handled(
    client: Client,
    workflow_id: str,
    rpc_timeout: timedelta | None = None,
    count: Callable[[str], None] | None = None,
) -> list[HandledAlert]:
    """The alert instances (and their evidence) the device's last run handled, when that run
    completed (a running one de-duplicates its own evidence). Asked of Temporal, so every
    webhook replica, restart and worker answers the same. A run that closed without a result
    (terminated, failed) lists nothing: its alerts may start a new one. `count(call)` is told
    of each Temporal call (`describe`, `result`)."""
    handle = client.get_workflow_handle(workflow_id)
    if count is not None:
        count("describe")
    try:
        desc = await handle.describe(rpc_timeout=rpc_timeout)
    except RPCError as exc:
        if exc.status == RPCStatusCode.NOT_FOUND:  # never ran (or its history expired)
            return []
        raise
    if desc.status != WorkflowExecutionStatus.COMPLETED:
        return []
    last = client.get_workflow_handle(
        workflow_id, run_id=desc.run_id, result_type=RemediationResult
    )
    if count is not None:
        count("result")
    result = await last.result(follow_runs=False, rpc_timeout=rpc_timeout)
    return list(result.handled_alerts)


async def start_unless_handled(
    client: Client, inp: RemediationInput, evidence: AlertEvidence, *, task_queue: str
) -> LaunchResult:
    """signal_with_start, except after a completed run that handled this evidence (the same
    Alertmanager instance, or the same Xid under other labels): then nothing is started and
    the result says `already_handled`. The webhook's rule, for a hand-over between ids."""
    try:
        return await signal_with_start(
            client,
            inp,
            task_queue=task_queue,
            evidence=evidence,
            id_reuse_policy=WorkflowIDReusePolicy.ALLOW_DUPLICATE_FAILED_ONLY,
        )
    except WorkflowAlreadyStartedError:
        pass  # the last run completed: did it handle this evidence?
    except RPCError as exc:
        if exc.status != RPCStatusCode.ALREADY_EXISTS:
            raise
    workflow_id = inp.device.workflow_id(inp.cluster)
    handled = await closed_run_handled(client, workflow_id)
    if already_handled(evidence, handled):
        log.info("%s: evidence already handled by its last run; nothing started", workflow_id)
        return LaunchResult(
            workflow_id=workflow_id, started=False, device=inp.device.key, already_handled=True
        )
    inp = inp.model_copy(update={"handled_before": handled})
    return await signal_with_start(client, inp, task_queue=task_queue, evidence=evidence)


async def claim_escalation(
    client: Client, task_queue: str, req: EscalationClaim
) -> EscalationClaimResult:
    """Ask the rejections workflow whether `req.holder` pages for this cause and node
    (update-with-start: the workflow is created on first use)."""
    wid = rejections_workflow_id(task_queue)
    start: WithStartWorkflowOperation[Any, Any] = WithStartWorkflowOperation(
        WF_REJECTIONS,
        RejectionsState(),
        id=wid,
        task_queue=task_queue,
        id_conflict_policy=WorkflowIDConflictPolicy.USE_EXISTING,
    )
    try:
        return await client.execute_update_with_start_workflow(
            UPD_CLAIM_ESCALATION,
            req,
            start_workflow_operation=start,
            result_type=EscalationClaimResult,
        )
    except RPCError as exc:
        if exc.status != RPCStatusCode.UNIMPLEMENTED:
            raise
    # Servers without multi-operation (the time-skipping test server): start, then update.
    handle = await client.start_workflow(
        WF_REJECTIONS,
        RejectionsState(),
        id=wid,
        task_queue=task_queue,
        id_conflict_policy=WorkflowIDConflictPolicy.USE_EXISTING,
    )
    return await handle.execute_update(UPD_CLAIM_ESCALATION, req, result_type=EscalationClaimResult)


async def report_rejected(client: Client, task_queue: str, batch: RejectedAlerts) -> None:
    """Hand the webhook's unusable alerts to the rejections workflow (signal-with-start)."""
    await client.start_workflow(
        WF_REJECTIONS,
        RejectionsState(),
        id=rejections_workflow_id(task_queue),
        task_queue=task_queue,
        id_conflict_policy=WorkflowIDConflictPolicy.USE_EXISTING,
        start_signal=SIG_REJECTED,
        start_signal_args=[batch],
    )


class LaunchActivities:
    """Activity wrapper for workflows that launch remediations (sweep, maintenance) or ask
    the rejections workflow whether to page (remediations of unresolvable devices)."""

    def __init__(self, client: Client, task_queue: str, cluster: str = "") -> None:
        self._client = client
        self._task_queue = task_queue
        self._cluster = cluster  # this worker's cluster: every launch is one of its devices

    @implements(CLAIM_ESCALATION)
    async def claim_escalation(self, req: EscalationClaim) -> EscalationClaimResult:
        result = await claim_escalation(self._client, self._task_queue, req)
        if result.granted:
            log.warning(
                "an alert names a device the cluster does not have (%s on node %s, %s): "
                "paging once for this node",
                req.cause,
                req.node,
                req.holder,
            )
        else:
            log.warning(
                "not paging for %s on node %s (%s): %s paged for it at %s (%d suppressed)",
                req.cause,
                req.node,
                req.holder,
                result.holder,
                result.since.isoformat() if result.since else "?",
                result.suppressed,
            )
        return result

    @implements(SIGNAL_WITH_START_REMEDIATION)
    async def signal_with_start_remediation(self, req: LaunchRequest) -> LaunchResult:
        inp = req.remediation
        if inp.cluster and inp.cluster != self._cluster:
            # Never start or signal another cluster's remediation from this one.
            raise ApplicationError(
                f"launch for cluster {inp.cluster!r} refused by the worker of cluster "
                f"{self._cluster or '(unnamed)'!r}",
                type=ERR_INVALID_INPUT,
                non_retryable=True,
            )
        if not inp.cluster and self._cluster:
            inp = inp.model_copy(update={"cluster": self._cluster})
        queue = req.task_queue or self._task_queue
        try:
            if req.respect_handled and req.evidence is not None:
                return await start_unless_handled(self._client, inp, req.evidence, task_queue=queue)
            return await signal_with_start(
                self._client, inp, task_queue=queue, evidence=req.evidence
            )
        except ValueError as exc:
            raise ApplicationError(str(exc), type=ERR_INVALID_INPUT, non_retryable=True) from exc
