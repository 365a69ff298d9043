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
from collections.abc import Sequence
from datetime import UTC, datetime, timedelta

from temporalio import activity
from temporalio.client import Client
from temporalio.common import WorkflowIDConflictPolicy, WorkflowIDReusePolicy
from temporalio.exceptions import ApplicationError

from workflows.constants import (
    ACT_SIGNAL_WITH_START,
    ERR_INVALID_INPUT,
    SIG_ALERT,
    SIG_ALERTS,
    WF_REMEDIATE,
)
from workflows.models import (
    AlertEvidence,
    LaunchRequest,
    LaunchResult,
    RemediationInput,
    RemediationResult,
)

log = logging.getLogger(__name__)


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


async def signal_with_start(
    client: Client,
    inp: RemediationInput,
    *,
    task_queue: str,
    evidence: AlertEvidence | None = None,
    evidence_list: Sequence[AlertEvidence] | None = None,
    rpc_timeout: timedelta | None = None,
) -> LaunchResult:
    """Start the device's remediation, or signal the running one with `evidence`.

    `evidence_list` instead sends several alerts in one call: one is an `alert` signal as
    with `evidence`, more are one `alerts` signal carrying the list (never both arguments).
    The device must be canonical (node + GPU UUID); resolve other forms first (the CLI does
    it through the resolve-device activity code). Raises ValueError otherwise. `rpc_timeout`
    bounds the call (the SDK's default otherwise).
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
    else:
        one = evidence_list[0] if evidence_list else evidence
        ev = one if one is not None else manual_evidence(inp)
        signal, signal_args, what = SIG_ALERT, [ev], f"alert {ev.fingerprint or ev.alertname}"
    handle = await client.start_workflow(
        WF_REMEDIATE,
        inp,
        id=workflow_id,
        task_queue=task_queue,
        result_type=RemediationResult,
        id_conflict_policy=WorkflowIDConflictPolicy.USE_EXISTING,
        # A closed remediation may be followed by a new one for the same GPU (it failed
        # again after release), so closed ids are reusable.
        id_reuse_policy=WorkflowIDReusePolicy.ALLOW_DUPLICATE,
        start_signal=signal,
        start_signal_args=signal_args,
        rpc_timeout=rpc_timeout,
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


class LaunchActivities:
    """Activity wrapper for workflows that launch remediations (sweep, maintenance)."""

    def __init__(self, client: Client, task_queue: str, cluster: str = "") -> None:
        self._client = client
        self._task_queue = task_queue
        self._cluster = cluster  # this worker's cluster: every launch is one of its devices

    @activity.defn(name=ACT_SIGNAL_WITH_START)
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
        try:
            return await signal_with_start(
                self._client,
                inp,
                task_queue=req.task_queue or self._task_queue,
                evidence=req.evidence,
            )
        except ValueError as exc:
            raise ApplicationError(str(exc), type=ERR_INVALID_INPUT, non_retryable=True) from exc
