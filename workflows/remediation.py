"""`remediate-gpu-device`: one durable remediation per physical GPU.

State machine (each step a runbook knob; phases are the `SickbayPhase` search attribute):

    received -> confirming --stale / application / ignore / dry-run----------------> closed
                    | resolve-device, gather-evidence, find-consumers, classify,
                    | pick runbook (strictest of the consumers')
                    v
                guarding --budget exhausted / unreachable--> escalated (once), stays open:
                    |   retries the lease every minute (then 5 min), absorbs repeat alerts;
                    |   ends on abort, repaired, alert resolved + Healthy -> closed,
                    |   or a granted lease -> on to approval / quarantine; a wait of days
                    |   continues-as-new and confirms afresh
                    | budget lease (sickbay-budget workflow)
                    v
          [awaiting-approval] --rejected / timeout per runbook--> escalated / closed
                    v
              quarantining   DeviceTaintRule (taint: NoExecute; eviction-api: NoSchedule,
                    |        Eviction API, NoExecute backstop after the eviction timeout)
                    v
                evicting --timeout--> force per policy --still there--> escalated --+
                    v                                                              |
         awaiting-replacement --Pending past deadline--> scaling                   |
                    |   churn -> escalated                 | request-capacity      |
                    |                                      | at-max / no capacity  |
                    v                                      v  -> escalated         |
                 holding <-------------------------------------------------------+
                    | per release.mode: repaired (signal), Healthy for release.cooldown, or
                    | either (healthy-cooldown: only the health releases, a repaired mark
                    | is recorded)
                    v
                releasing (remove rule, release lease, resolve page) -> closed

`abort` interrupts any wait: what Sickbay did is undone (rule removed, lease released) and the
remediation closes as `aborted`. One escalation per incident; escalation is a normal result,
never an exception. Non-retryable activity errors end in escalation too.

Cheap happy path: the short calls (load-runbooks, resolve, evidence, consumers, budget,
quarantine, release) are local activities, so alert -> DeviceTaintRule runs inside the first
workflow task, and a happy remediation stays well under 60 history events. Independent calls
run side by side: load-runbooks with resolve-device, then gather-evidence with find-consumers
and count-devices; the budget lease is asked as soon as the consumers fix the runbook, while
the evidence may still be coming, and given back (a refused request withdrawn) when the
procedure then decides not to quarantine. A refusal is only reported and escalated at the
guard step.

Versioning: nothing is released yet, so a change to the command sequence changes the code and
re-records tests/histories/ (docs/architecture.md, "Workflow versioning"); `workflow.patched`
starts with the first release.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from datetime import timedelta
from typing import Any, Literal, NamedTuple, TypeVar

from temporalio import workflow
from temporalio.common import RetryPolicy, SearchAttributeKey, SearchAttributePair
from temporalio.exceptions import ActivityError, ApplicationError
from temporalio.exceptions import TimeoutError as TemporalTimeoutError

with workflow.unsafe.imports_passed_through():
    from pydantic import BaseModel, ValidationError

with workflow.unsafe.imports_passed_through():
    from contract.base import format_duration, input_problems
    from contract.budget import BudgetDecision, BudgetLeaseRequest, BudgetReleaseRequest
    from contract.capacity import CapacityRequest, CapacityResult, NodePoolTarget
    from contract.errors import (
        ERR_CHANNEL_REJECTED,
        ERR_CONFIG,
        ERR_DEVICE_NOT_FOUND,
        ERR_INVALID_INPUT,
        ERR_POOL_AT_MAX,
    )
    from contract.kube import (
        CheckHealthInput,
        Consumer,
        ConsumersResult,
        CordonInput,
        CordonResult,
        CountDevicesInput,
        DeviceCounts,
        DeviceRef,
        EventTarget,
        EvictionReport,
        EvictPodsInput,
        EvictPodsResult,
        Evidence,
        EvidenceInput,
        FindConsumersInput,
        HealthResult,
        OwnerRef,
        PodRef,
        QuarantineInput,
        QuarantineResult,
        RecordEventInput,
        ReleaseInput,
        ReleaseResult,
        ReplacementReport,
        ResolvedDevice,
        ResolveDeviceInput,
        WaitEvictionInput,
        WaitReplacementInput,
    )
    from contract.launch import LaunchRequest, LaunchResult
    from contract.names import (
        ACT_ACQUIRE_BUDGET,
        ACT_CHECK_HEALTH,
        ACT_CLAIM_ESCALATION,
        ACT_CORDON,
        ACT_COUNT_DEVICES,
        ACT_EVICT_PODS,
        ACT_FIND_CONSUMERS,
        ACT_GATHER_EVIDENCE,
        ACT_LOAD_RUNBOOKS,
        ACT_NOTIFY,
        ACT_PREVIEW_QUARANTINE,
        ACT_QUARANTINE,
        ACT_RECORD_EVENT,
        ACT_RELEASE_BUDGET,
        ACT_RELEASE_QUARANTINE,
        ACT_REQUEST_CAPACITY,
        ACT_RESOLVE_DEVICE,
        ACT_SIGNAL_WITH_START,
        ACT_WAIT_EVICTION,
        ACT_WAIT_REPLACEMENT,
        QRY_STATUS,
        QRY_TIMELINE,
        SA_CLUSTER,
        SA_DEVICE,
        SA_ESCALATION,
        SA_NODE,
        SA_OUTCOME,
        SA_PHASE,
        SA_WORKLOAD_CLASS,
        SIG_ABORT,
        SIG_ALERT,
        SIG_ALERT_RESOLVED,
        SIG_ALERTS,
        SIG_BUDGET_FREED,
        SIG_REPAIRED,
        UPD_APPROVE,
        WF_REMEDIATE,
    )
    from contract.notify import (
        EscalationClaim,
        EscalationClaimResult,
        Incident,
        NotifyInput,
        NotifyResult,
    )
    from contract.remediation import (
        AbortRequest,
        AlertEvidence,
        AlertResolved,
        ApprovalDecision,
        ApprovalResult,
        HandledAlert,
        Outcome,
        Phase,
        RemediationCarry,
        RemediationInput,
        RemediationResult,
        RemediationStatus,
        RepairedRequest,
        TimelineEntry,
        instance_key,
    )
    from contract.runbook import BudgetPolicy, EscalationReason, Runbook, RunbookSet
    from workflows.classify import classify, is_stale, merge_evidence
    from workflows.identity import claimed_by, sender_identity
    from workflows.runbook_match import DEFAULT_RUNBOOK, builtin_default, select_runbook

T = TypeVar("T")
M = TypeVar("M", bound=BaseModel)

# --- transport options (operational knobs live in the runbook) --------------------------------
# Local activities: one Kubernetes/Temporal call each, milliseconds when healthy. 10 s covers a
# slow API server (the kube client's own request timeout is 10 s); 5 attempts with backoff up
# to 5 s ride out an API-server restart (~30 s) before the step counts as failed and escalates.
LOCAL_TIMEOUT = timedelta(seconds=10)
LOCAL_RETRY = RetryPolicy(
    initial_interval=timedelta(milliseconds=200),
    backoff_coefficient=2.0,
    maximum_interval=timedelta(seconds=5),
    maximum_attempts=5,
)
# Budget lease updates (local activities): the activity itself retries a refused update (the
# 10-in-flight limit under a storm) with jittered backoff for up to 25 s, so one attempt gets
# 30 s; 2 attempts, then the remediation escalates "budget service unavailable" and waits.
BUDGET_TIMEOUT = timedelta(seconds=30)
BUDGET_RETRY = RetryPolicy(initial_interval=timedelta(seconds=1), maximum_attempts=2)
# Over budget or budget unreachable: escalate once, then retry the lease every minute for the
# first hour (a slot frees when another GPU is released), then every 5 minutes so a wait of
# days stays a few thousand history events.
BUDGET_RETRY_FIRST = timedelta(minutes=1)
BUDGET_RETRY_LATER = timedelta(minutes=5)
BUDGET_RETRY_SWITCH = 60
BUDGET_RECOUNT_EVERY = 5  # waiting: count devices again on every 5th lease retry
BUDGET_AWAITING = "a budget slot, repaired, alert resolved + Healthy, or abort"
# Long waits (watch-based activities): they heartbeat, so a dead worker is noticed within a
# minute and another worker resumes from the heartbeat details; 3 attempts, then escalate.
WAIT_HEARTBEAT = timedelta(seconds=60)
WAIT_MARGIN = timedelta(minutes=2)  # the activity's own deadline fires first and reports
WAIT_RETRY = RetryPolicy(
    initial_interval=timedelta(seconds=5),
    backoff_coefficient=2.0,
    maximum_interval=timedelta(seconds=30),
    maximum_attempts=3,
)
# Eviction through the API: each pod gets a few 429 (PDB) retries inside the activity.
EVICT_TIMEOUT = timedelta(minutes=2)
# evict-pods heartbeats every 10 s; a killed worker is noticed after 30 s, not 2 min (evicting
# again is harmless: pods already gone are reported gone).
EVICT_HEARTBEAT = timedelta(seconds=30)
# Owner kinds Events are written on, with the API version `kubectl describe` reads them in.
OWNER_API_VERSIONS = {
    "Deployment": "apps/v1",
    "StatefulSet": "apps/v1",
    "ReplicaSet": "apps/v1",
    "DaemonSet": "apps/v1",
    "Job": "batch/v1",
    "CronJob": "batch/v1",
    "JobSet": "jobset.x-k8s.io/v1alpha2",
}
# After forcing, how long the pods get to go before we escalate.
FORCE_GRACE = timedelta(minutes=2)
# Capacity requests go to the pool scaler workflow, which may hold the call while it batches
# concurrent needs and follows the provider's operation.
CAPACITY_TIMEOUT = timedelta(minutes=15)
# request-capacity heartbeats every 10 s while the scaler holds the call; a worker killed
# mid-call is noticed after 45 s (not the 15 min start-to-close) and the retry re-attaches to
# the same scaler update (same id), so nothing is asked twice.
CAPACITY_HEARTBEAT = timedelta(seconds=45)
CAPACITY_RETRY = RetryPolicy(
    initial_interval=timedelta(seconds=10),
    backoff_coefficient=2.0,
    maximum_interval=timedelta(minutes=1),
    maximum_attempts=4,
)
# Notifications: a channel failing is retried with backoff for ~10 minutes (6 tries); each
# try is reported back in NotifyResult and lands in the timeline.
NOTIFY_TIMEOUT = timedelta(seconds=30)
NOTIFY_RETRY = RetryPolicy(
    initial_interval=timedelta(seconds=10),
    backoff_coefficient=2.0,
    maximum_interval=timedelta(minutes=3),
    maximum_attempts=6,
    # A channel that is not configured, or that refused the event, fails the same way again.
    non_retryable_error_types=[ERR_CONFIG, ERR_CHANNEL_REJECTED],
)
# Alerts about devices the cluster does not have: one page per node per window, whatever the
# number of made-up UUIDs (the rejections workflow keeps count). Its update answers in
# milliseconds; 3 tries, then this run pages rather than stay silent.
UNRESOLVABLE_PAGE_WINDOW = timedelta(minutes=30)
CLAIM_TIMEOUT = timedelta(seconds=10)
CLAIM_RETRY = RetryPolicy(initial_interval=timedelta(seconds=1), maximum_attempts=3)
# Continue-as-new during a long hold, or a wait of weeks for a budget slot (the quarantined
# GPUs it waits on are away for RMA), once history grows past this (periodic health checks).
HOLD_HISTORY_LIMIT = 2_000

SA_DEVICE_KEY = SearchAttributeKey.for_keyword(SA_DEVICE)
SA_NODE_KEY = SearchAttributeKey.for_keyword(SA_NODE)
SA_WORKLOAD_KEY = SearchAttributeKey.for_keyword(SA_WORKLOAD_CLASS)
SA_PHASE_KEY = SearchAttributeKey.for_keyword(SA_PHASE)
SA_OUTCOME_KEY = SearchAttributeKey.for_keyword(SA_OUTCOME)
SA_ESCALATION_KEY = SearchAttributeKey.for_keyword(SA_ESCALATION)
SA_CLUSTER_KEY = SearchAttributeKey.for_keyword(SA_CLUSTER)


# What a failed activity raises in the workflow: ActivityError wrapping the cause for regular
# activities; local activity failures surface as their cause (ApplicationError / timeout).
ACTIVITY_FAILED = (ActivityError, ApplicationError, TemporalTimeoutError)


class _EarlyLease(NamedTuple):
    """A budget lease request already answered: the decision and what it was computed from."""

    device_key: str
    decision: BudgetDecision | None = None
    counts: DeviceCounts | None = None
    pool_limit: int = 0
    cluster_limit: int = 0
    error: BaseException | None = None  # the request failed (counts or budget unreachable)


class _Aborted(Exception):
    """Raised inside the workflow when an `abort` signal interrupts a wait."""


def _cluster_tag(cluster: str) -> str:
    """`[east] ` in front of a notification's summary, so a person paged for many clusters
    sees which one; nothing for the unnamed cluster."""
    return f"[{cluster}] " if cluster else ""


class _Done(Exception):
    """Ends the procedure early with an outcome (e.g. after an escalation without taint)."""

    def __init__(self, outcome: Outcome, reason: str) -> None:
        super().__init__(reason)
        self.outcome = outcome
        self.reason = reason


def _still_blocked(result: EvictPodsResult, report: EvictionReport) -> bool:
    """Some consumer still there is one a PodDisruptionBudget refused to let go."""
    keys = {(p.namespace, p.name) for p in result.blocked}
    return any((p.namespace, p.name) in keys for p in report.remaining)


def _error_text(err: BaseException) -> str:
    cause = err.cause if isinstance(err, ActivityError) else err
    if isinstance(cause, ApplicationError):
        return f"{cause.type or 'error'}: {cause.message}"
    if cause is not None:
        return f"{type(cause).__name__}: {cause}"
    return str(err)


def _gave_up(err: BaseException) -> str:
    """Why a notification was given up: a permanent error (configuration, rejected) is tried
    once, not NOTIFY_RETRY's six times, and the timeline says so."""
    cause = err.cause if isinstance(err, ActivityError) else err
    permanent = NOTIFY_RETRY.non_retryable_error_types or []
    if isinstance(cause, ApplicationError) and (cause.non_retryable or cause.type in permanent):
        return f"not retried: {_error_text(err)}"
    return f"gave up after {NOTIFY_RETRY.maximum_attempts} tries: {_error_text(err)}"


def _error_type(err: BaseException) -> str | None:
    cause = err.cause if isinstance(err, ActivityError) else err
    return cause.type if isinstance(cause, ApplicationError) else None


# Not sandboxed: the sandbox re-imports (and, without bytecode files, recompiles) this module
# for every run, ~15-20 ms of worker CPU before the first step of each remediation (measured:
# alert -> rule p50 61 -> 44 ms). Determinism is kept the same ways as before: the module
# imports only stdlib, temporalio and the contract (lint-imports), time/ids/randomness come
# from workflow.now()/uuid4(), and the recorded histories replay (tests/workflows/test_replay).
# A result lists at most this many handled alert instances (they add up over a GPU's runs).
MAX_HANDLED_ALERTS = 500


@workflow.defn(name=WF_REMEDIATE, sandboxed=False)
class DeviceRemediationWorkflow:
    @workflow.init
    def __init__(self, raw: Any = None) -> None:
        # The input is decoded here, not by the SDK: a payload the SDK cannot decode fails the
        # workflow *task* on every retry, so a mistyped Web UI launch would stay Running
        # forever under the device's id, swallowing its alerts. Bad input instead fails the
        # run at once (in `run`), naming the field; the next trigger starts a fresh run.
        self._input_error: str | None = None
        try:
            inp = RemediationInput.model_validate(raw)
        except ValidationError as err:
            self._input_error = input_problems(err, RemediationInput)
            inp = RemediationInput(device=DeviceRef(node="invalid-input", gpu_uuid="invalid"))
        self._inp = inp
        info = workflow.info()
        carry = inp.resume
        if carry is not None:
            self._status = carry.status
            self._timeline = list(carry.timeline)
            self._alerts = list(carry.alerts)
        else:
            self._status = RemediationStatus(
                workflow_id=info.workflow_id,
                device=inp.device.key if self._input_error is None else "unknown (invalid input)",
                node=inp.device.node if self._input_error is None else None,
                started_at=workflow.now(),
                updated_at=workflow.now(),
                dry_run=inp.dry_run,
            )
            self._timeline = []
            self._alerts = []
        self._device: ResolvedDevice | None = carry.device if carry else None
        self._runbook: Runbook | None = carry.runbook if carry else None
        self._quarantine: QuarantineResult | None = carry.quarantine if carry else None
        self._lease_held = carry.lease_held if carry else False
        self._escalated = carry.escalated if carry else False
        self._healthy_since = carry.healthy_since if carry else None
        # Aggregated Kubernetes Events: how often each (reason, object) was told so far.
        self._event_counts: dict[str, int] = dict(carry.event_counts) if carry else {}
        # Pods that exist now, for Events: None = the consumers (not evicted yet); then the
        # ones still on the device, or the replacements last seen Pending / Running.
        self._live_pods: list[PodRef] | None = None
        self._consumers: list[Consumer] = []
        self._fallback: Runbook = builtin_default()
        self._abort: AbortRequest | None = None
        self._undoing = False  # set once an abort is being handled: undo steps run to the end
        self._repaired: RepairedRequest | None = None
        # (claimed actor, Temporal client identity) of the abort / repaired / decision.
        self._sent: dict[str, tuple[str, str]] = {}
        self._health_only = False  # holding under release.mode healthy-cooldown
        self._resolved_pending = False  # an alert-resolved not yet checked against health
        self._budget_freed = False  # set by the budget workflow's wake-up signal
        self._decision: ApprovalDecision | None = None
        self._would_have: EscalationReason | None = None  # a dry run's escalation
        self._sa_phase: Phase | None = None
        self._metrics = workflow.metric_meter()
        if carry is None:
            self._add_alerts(inp.alerts, initial=True)
        if self._input_error is None:
            workflow.set_current_details(self._details())

    # ---------------------------------------------------------------- messages -------------

    @workflow.signal(
        name=SIG_ALERT, description="internal: more evidence, sent by the webhook, sweep and CLI"
    )
    def alert(self, evidence: AlertEvidence) -> None:
        self._add_alerts([evidence])

    @workflow.signal(
        name=SIG_ALERTS, description="internal: several alerts at once, sent by the webhook"
    )
    def alert_batch(self, evidence: list[AlertEvidence]) -> None:
        """Several alerts in one signal (the webhook coalesces a storm's deliveries for one
        workflow): each is handled exactly as its own `alert` signal would be."""
        for one in evidence:
            self._add_alerts([one])

    @workflow.signal(
        name=SIG_ALERT_RESOLVED, description="internal: Alertmanager resolved the alert (webhook)"
    )
    def alert_resolved(self, resolved: AlertResolved) -> None:
        self._resolved_pending = True
        self._log(
            "alert resolved",
            outcome=resolved.alertname or resolved.fingerprint,
            actor="alertmanager",
            client_identity=sender_identity(),
        )

    @workflow.signal(
        name=SIG_BUDGET_FREED,
        description="internal: sent by the sickbay-budget workflow when a slot frees; not for people",
    )
    def budget_freed(self) -> None:
        """From sickbay-budget: a slot freed while this remediation waits for one."""
        self._budget_freed = True

    @workflow.signal(
        name=SIG_ABORT,
        description='for people: stop and undo the quarantine. Input: {"reason": "why", "actor": "you"}',
    )
    def abort(self, raw: Any = None) -> None:
        req = self._message(SIG_ABORT, AbortRequest, raw)
        if req is not None and self._abort is None:
            self._abort = req
            self._log_sent("abort", "abort requested", req.actor, reason=req.reason)

    @workflow.signal(
        name=SIG_REPAIRED,
        description='for people: the GPU is repaired, release it. Input: {"actor": "you", "note": "what was done"}',
    )
    def repaired(self, raw: Any = None) -> None:
        req = self._message(SIG_REPAIRED, RepairedRequest, raw)
        if req is not None and self._repaired is None:
            self._repaired = req
            self._log_sent("repaired", "marked repaired", req.actor, reason=req.note)
            if self._health_only:
                self._note_repair()

    def _message(self, name: str, model: type[M], raw: Any) -> M | None:
        """Decode a signal typed by a person (Web UI): the SDK would drop an undecodable one
        with only a worker log line; here the refusal, naming the field, is in the timeline."""
        try:
            return model.model_validate(raw)
        except ValidationError as err:
            problems = input_problems(err, model)
            self._log(f"{name} signal refused", outcome="invalid input", reason=problems)
            workflow.logger.warning("%s signal refused: %s", name, problems)
            return None

    @workflow.update(
        name=UPD_APPROVE,
        description='for people, while awaiting-approval. Input: {"approve": true, "actor": "you", "reason": "why"}',
    )
    def approve(self, decision: ApprovalDecision) -> ApprovalResult:
        self._decision = decision
        self._log_sent(
            "decision",
            "approved" if decision.approve else "rejected",
            decision.actor,
            reason=decision.reason,
        )
        return ApprovalResult(accepted=True, phase=self._status.phase)

    @approve.validator
    def _validate_approve(self, decision: ApprovalDecision) -> None:
        if self._status.phase is not Phase.AWAITING_APPROVAL:
            raise ValueError(
                f"nothing to approve: the remediation is {self._status.phase.value}, "
                "not awaiting-approval"
            )
        if self._decision is not None:
            raise ValueError("already decided by " + self._who("decision"))

    @workflow.query(name=QRY_TIMELINE, description="the ordered timeline of decisions")
    def timeline(self) -> list[TimelineEntry]:
        return self._timeline

    @workflow.query(name=QRY_STATUS, description="phase, what it waits for, until when, next")
    def status(self) -> RemediationStatus:
        return self._status

    # ---------------------------------------------------------------- run ------------------

    @workflow.run
    async def run(self, raw: Any = None) -> RemediationResult:
        if self._input_error is not None:
            await self._refuse_input(self._input_error)
        inp = self._inp
        try:
            if inp.resume is not None and inp.resume.waiting_for_budget:
                # Weeks may have passed: confirm afresh (evidence, consumers, runbook), then
                # ask for the lease again; still escalated, so no second page.
                self._log("continued as new", outcome="waiting for budget")
                outcome, reason = await self._guarded()
            elif inp.resume is not None:
                self._log("continued as new", outcome="holding")
                outcome, reason = await self._hold_and_release()
            else:
                outcome, reason = await self._guarded()
        except _Aborted:
            outcome, reason = await self._undo_after_abort()
        except _Done as done:
            outcome, reason = done.outcome, done.reason
            await self._release_lease()
        if self._dry and outcome != "dry-run":
            # Whatever a dry run found, it changed nothing: outcome dry-run, and the reason
            # says what a real run would have done.
            would = f" (would escalate: {self._would_have})" if self._would_have else ""
            outcome, reason = "dry-run", f"dry run, nothing changed{would}: {reason}"
        self._status.outcome = outcome
        self._enter(Phase.CLOSED, awaiting="")
        self._log("closed", outcome=outcome, reason=reason)
        self._metrics.create_counter(
            "sickbay_remediations_closed", "Remediations closed, by outcome"
        ).with_additional_attributes(
            {"outcome": outcome, "workload_class": self._status.workload_class or ""}
        ).add(1)
        await workflow.wait_condition(workflow.all_handlers_finished)
        return RemediationResult(
            outcome=outcome,
            reason=reason,
            status=self._status,
            timeline=self._timeline,
            handled_alerts=self._handled_alerts(),
        )

    async def _refuse_input(self, problems: str) -> None:
        """Fail the run at once: nothing was done, and the Web UI shows why."""
        why = f"invalid input for {WF_REMEDIATE}: {problems}"
        self._status.phase, self._status.outcome = Phase.CLOSED, None
        self._log("input refused", outcome="failed", reason=why)
        workflow.set_current_details(f"**failed: invalid input**\n\n{problems}")
        workflow.upsert_search_attributes(
            [SA_PHASE_KEY.value_set(Phase.CLOSED.value), SA_OUTCOME_KEY.value_set("invalid-input")]
        )
        raise ApplicationError(why, type=ERR_INVALID_INPUT, non_retryable=True)

    async def _guarded(self) -> tuple[Outcome, str]:
        """The procedure; a step that fails for good escalates instead of failing the run."""
        try:
            return await self._remediate()
        except ACTIVITY_FAILED as err:
            why = f"step failed: {_error_text(err)}"
            paged = await self._paged_elsewhere(err, why)
            if paged is not None:  # this node's same cause was paged: say who, page nobody
                self._status.escalation_reason = "error"
                self._log("escalation not sent", reason=paged)
                self._metrics.create_counter(
                    "sickbay_pages_suppressed",
                    "Escalations not paged because one was paged for the cause and node",
                ).with_additional_attributes({"cause": "device-not-found"}).add(1)
                raise _Done("escalated", f"{why}; {paged}") from err
            await self._escalate("error", why)
            if self._quarantine is not None:
                return await self._hold_and_release()
            raise _Done("escalated", why) from err

    async def _remediate(self) -> tuple[Outcome, str]:
        inp = self._inp
        # 1. confirm and classify --------------------------------------------------------
        self._enter(
            Phase.CONFIRMING,
            awaiting="cluster evidence",
            next_action="classify the failure and choose a runbook",
        )
        # Concurrent confirm: independent local activities run side by side (runbooks with
        # resolve; evidence with consumers, the device counts and, once the runbook is known,
        # the budget lease), so alert -> rule waits for 4 local activities in a row, not 7.

        def load_runbooks() -> Awaitable[RunbookSet]:
            return self._local(ACT_LOAD_RUNBOOKS, None, RunbookSet, "load runbooks")

        def resolve() -> Awaitable[ResolvedDevice]:
            return self._local(
                ACT_RESOLVE_DEVICE, ResolveDeviceInput(device=inp.device), ResolvedDevice, "resolve"
            )

        loading = asyncio.ensure_future(load_runbooks())
        resolving = asyncio.ensure_future(resolve())
        await workflow.wait([loading, resolving])  # type: ignore[type-var]
        if loading.exception() is None:  # a failed resolve escalates through `default`
            self._fallback = loading.result().get(DEFAULT_RUNBOOK) or self._fallback
        runbooks, device = await self._all(loading, resolving)
        self._device = device
        self._status.device, self._status.node = device.key, device.node
        wf_id = workflow.info().workflow_id
        if device.workflow_id(self._inp.cluster) != wf_id:
            return await self._hand_over(device)
        alert_pods = [a.pod for a in self._alerts if a.pod is not None]
        evidence, consumers, early = await self._confirm_concurrently(device, runbooks, alert_pods)
        self._consumers = consumers.consumers
        self._status.consumers = [c.pod for c in self._consumers]
        selection = select_runbook(runbooks.runbooks, self._consumers, inp.runbook)
        runbook = self._runbook = selection.runbook
        self._status.runbook = self._status.workload_class = runbook.name
        self._status.dry_run = self._dry
        for note in selection.notes:
            self._log("runbook note", reason=note)
        self._log("runbook chosen", outcome=runbook.name, reason=selection.why)

        failure_class, why = classify(self._alerts, evidence)
        self._status.failure_class = failure_class
        self._log("classified", outcome=failure_class, reason=why)
        spec = runbook.spec
        stale, stale_why = is_stale(
            self._alerts, evidence, workflow.now(), spec.confirm.stale_after
        )
        if stale:
            return await self._no_quarantine(early, f"stale evidence: {stale_why}")
        if (
            spec.confirm.require_unhealthy_status
            and inp.trigger not in ("manual", "maintenance")
            and evidence.health != "Unhealthy"
        ):
            return await self._no_quarantine(
                early,
                f"runbook {runbook.name} acts only on an Unhealthy pod status; "
                f"the device reports {evidence.health or 'nothing'}",
            )
        action = getattr(spec.on, failure_class)
        if action == "ignore":
            return await self._no_quarantine(
                early, f"runbook {runbook.name}: {failure_class} -> ignore"
            )
        if action == "notify":
            await self._notify_owner(failure_class, why)
            return await self._no_quarantine(
                early,
                f"runbook {runbook.name}: {failure_class} -> notify the owner, no quarantine",
            )
        if inp.dry_run or spec.dry_run:
            return await self._dry_run(device)
        await self._decision_event(
            "GPUFailureConfirmed",
            f"{failure_class}: {why}; runbook {runbook.name}",
            etype="Warning",
            rule=False,
            node=False,
        )

        # 2. blast-radius guard ------------------------------------------------------------
        self._enter(
            Phase.GUARDING,
            awaiting="budget lease",
            next_action="approval" if spec.approval.required else "quarantine the device",
        )
        await self._acquire_lease(device, runbook, early)

        # 3. optional approval ---------------------------------------------------------------
        if spec.approval.required:
            await self._await_approval()

        # 4. quarantine ----------------------------------------------------------------------
        self._enter(
            Phase.QUARANTINING,
            awaiting="DeviceTaintRule",
            next_action="wait for the consumers to leave the device",
        )
        eviction_api = spec.eviction.mode == "eviction-api"
        effect = "NoSchedule" if eviction_api else spec.quarantine.effect
        try:
            self._quarantine = await self._apply_quarantine(effect, "quarantine")
        except ACTIVITY_FAILED as err:
            await self._escalate("error", f"quarantine failed: {_error_text(err)}")
            raise _Done("escalated", f"quarantine failed: {_error_text(err)}") from err
        await self._decision_event("GPUQuarantined", self._quarantine.message or effect)
        self._metrics.create_histogram_timedelta(
            "sickbay_time_to_quarantine",
            "From the remediation's start to the device's quarantine",
        ).with_additional_attributes({"workload_class": runbook.name}).record(
            workflow.now() - workflow.info().start_time
        )

        # 5-8. evict, replace, scale ------------------------------------------------------------
        try:
            await self._evict_and_replace(effect, eviction_api)
        except ACTIVITY_FAILED as err:
            await self._escalate("error", f"activity failed: {_error_text(err)}")
        return await self._hold_and_release()

    # ---------------------------------------------------------------- steps ----------------

    async def _all(self, *calls: Awaitable[Any]) -> list[Any]:
        """Run `calls` side by side; every one finishes (none left running behind a failure,
        e.g. a lease still being granted) before the first error, in call order, is raised."""
        tasks = [asyncio.ensure_future(c) for c in calls]
        await workflow.wait(tasks)  # type: ignore[type-var]
        for task in tasks:
            err = task.exception()
            if err is not None:
                raise err
        return [task.result() for task in tasks]

    async def _confirm_concurrently(
        self, device: ResolvedDevice, runbooks: RunbookSet, alert_pods: list[PodRef]
    ) -> tuple[Evidence, ConsumersResult, _EarlyLease | None]:
        """Evidence, consumers and device counts at once; the budget lease as soon as the
        consumers fix the runbook (its limits), while the evidence may still be coming. The
        lease is only asked for here; it is reported (and a refusal escalated) at the guard
        step, and given back if the procedure then decides not to quarantine."""
        consumers_task = asyncio.ensure_future(
            self._local(
                ACT_FIND_CONSUMERS,
                FindConsumersInput(device=device, alert_pods=alert_pods),
                ConsumersResult,
                "find consumers",
            )
        )
        counts_task: asyncio.Future[DeviceCounts] | None = None
        if not self._inp.dry_run:
            counts_task = asyncio.ensure_future(
                self._local(
                    ACT_COUNT_DEVICES,
                    CountDevicesInput(node_pool=device.node_pool),
                    DeviceCounts,
                    "count devices",
                )
            )

        async def lease() -> _EarlyLease | None:
            consumers = await consumers_task
            if counts_task is None:
                return None
            try:
                counts = await counts_task
                runbook = select_runbook(runbooks.runbooks, consumers.consumers, self._inp.runbook)
                if runbook.runbook.spec.dry_run:
                    return None
                return await self._ask_lease(device, runbook.runbook, counts)
            except ACTIVITY_FAILED as err:
                # Counts or budget unreachable: the guard step reports it as its first try
                # ("budget service unavailable", escalate, retry) as without the early request.
                return _EarlyLease(device.key, error=err)

        async def counted() -> None:
            # Never leave the count running (or its error unread) behind a failed step.
            if counts_task is not None:
                await workflow.wait([counts_task])  # type: ignore[type-var]
                if not counts_task.cancelled():
                    counts_task.exception()

        evidence, consumers, early, _ = await self._all(
            self._local(
                ACT_GATHER_EVIDENCE, EvidenceInput(device=device), Evidence, "gather evidence"
            ),
            consumers_task,
            lease(),
            counted(),
        )
        return evidence, consumers, early

    async def _no_quarantine(self, early: _EarlyLease | None, reason: str) -> tuple[Outcome, str]:
        """Close without a taint; a lease taken early is given back (a refused early request
        is withdrawn too, so the budget does not keep this run as a waiter to wake)."""
        if early is not None and early.error is None:
            try:
                if self._lease_held:
                    await self._release_lease()
                else:
                    await self._local(
                        ACT_RELEASE_BUDGET,
                        BudgetReleaseRequest(
                            holder=workflow.info().workflow_id, device_key=early.device_key
                        ),
                        BudgetDecision,
                        "withdraw budget request",
                        budget=True,
                    )
            except ACTIVITY_FAILED as err:
                # Nothing was tainted: no page for this. The budget's reconcile drops the lease
                # (or waiter) of a closed remediation within its interval.
                self._lease_held = False
                self._log(
                    "budget lease not given back",
                    outcome="reconcile will drop it",
                    reason=_error_text(err),
                )
        return "not-quarantined", reason

    async def _hand_over(self, device: ResolvedDevice) -> tuple[Outcome, str]:
        """Launched under a non-canonical id (e.g. by DRA name from the UI): give the evidence
        to the device's canonical workflow so every trigger meets one remediation."""
        launch = await self._local(
            ACT_SIGNAL_WITH_START,
            LaunchRequest(
                remediation=self._inp.model_copy(
                    update={
                        "device": self._inp.device.model_copy(
                            update={"node": device.node, "gpu_uuid": device.gpu_uuid}
                        )
                    }
                ),
                evidence=self._alerts[-1] if self._alerts else None,
                task_queue=workflow.info().task_queue,
            ),
            LaunchResult,
            "hand over",
        )
        return "not-quarantined", f"handed over to {launch.workflow_id}"

    async def _dry_run(self, device: ResolvedDevice) -> tuple[Outcome, str]:
        preview = await self._local(
            ACT_PREVIEW_QUARANTINE,
            self._quarantine_input("None", dry_run=True),
            QuarantineResult,
            "preview quarantine",
        )
        would = ", ".join(f"{p.namespace}/{p.name}" for p in preview.would_evict) or "no pods"
        self._log("dry run: would quarantine", outcome=preview.mode, reason=f"would evict {would}")
        return "dry-run", f"dry run: would quarantine {device.key} and evict {would}"

    async def _acquire_lease(
        self, device: ResolvedDevice, runbook: Runbook, early: _EarlyLease | None = None
    ) -> None:
        tries = 0
        counts: DeviceCounts | None = None
        # A run continued from a long wait goes on at the slower pace.
        resumed = self._inp.resume is not None and self._inp.resume.waiting_for_budget
        while True:
            tries += 1
            # Retries while waiting reuse the device counts (two cluster-wide lists) except
            # after a wake-up and every BUDGET_RECOUNT_EVERY-th try, so a storm of waiters does
            # not list every node each minute; the budget's own leases are always current.
            if self._budget_freed or tries % BUDGET_RECOUNT_EVERY == 1:
                counts = None
            # A wake-up arriving from here on is for this try; one that arrived after an early
            # request was answered is for the next try (it stays set).
            self._budget_freed = self._budget_freed and early is not None and tries == 1
            try:
                granted, kind, why, counts = await self._try_lease(
                    device, runbook, counts, early if tries == 1 else None
                )
            except ACTIVITY_FAILED as err:
                # The budget workflow could not be reached within the bounded retries (update
                # limit under a storm, server down): never fail the run, escalate and retry.
                granted, kind, counts = False, "error", None
                why = f"budget service unavailable: {_error_text(err)}; device NOT tainted"
            if granted:
                return
            if tries == 1:
                self._log(
                    "budget denied" if kind != "error" else "budget unavailable",
                    outcome="no taint",
                    reason=why,
                )
                await self._escalate(
                    kind,
                    f"{why}; waiting for a budget slot (retrying every "
                    f"{BUDGET_RETRY_FIRST}, then every {BUDGET_RETRY_LATER})",
                    awaiting=BUDGET_AWAITING,
                )
            else:
                # One timeline entry for a run of retries (the latest), not one per minute.
                self._log(
                    "budget still unavailable" if kind == "error" else "budget still full",
                    outcome=f"try {tries}",
                    reason=why,
                    replace_same=True,
                )
            first = tries < BUDGET_RETRY_SWITCH and not resumed
            interval = BUDGET_RETRY_FIRST if first else BUDGET_RETRY_LATER
            self._enter(
                Phase.ESCALATED,
                awaiting=BUDGET_AWAITING,
                until=interval,
                next_action=f"ask the budget for a lease again (try {tries + 1})",
            )
            self._upsert()
            try:
                await self._wait(
                    lambda: (
                        self._repaired is not None or self._resolved_pending or self._budget_freed
                    ),
                    limit=interval,
                    summary=f"budget lease retry {tries + 1} ({format_duration(interval)})",
                )
            except TimeoutError:
                pass
            if self._budget_freed and self._repaired is None:
                self._log("budget slot freed", actor="sickbay-budget", reason="retrying now")
            if self._repaired is not None:
                await self._resolve_page("repaired while waiting for budget")
                raise _Done(
                    "not-quarantined",
                    f"repaired ({self._who('repaired')}) while waiting for a budget slot; "
                    "never quarantined",
                )
            if self._resolved_pending:
                self._resolved_pending = False
                if await self._healthy_now():
                    await self._resolve_page("alert resolved, device Healthy")
                    raise _Done(
                        "not-quarantined",
                        "alert resolved and the device is Healthy while waiting for a budget "
                        "slot; never quarantined",
                    )
            if self._history_full():
                await workflow.wait_condition(workflow.all_handlers_finished)
                workflow.continue_as_new(self._carry(waiting_for_budget=True))

    async def _resolve_page(self, summary: str) -> None:
        """Resolve the incident, if the escalation paged anyone (the runbook may filter it)."""
        if self._escalated and self._status.escalation_reason in self._spec.escalation.on:
            await self._notify_all("resolve", summary)

    async def _healthy_now(self) -> bool:
        try:
            health = await self._local(
                ACT_CHECK_HEALTH,
                CheckHealthInput(device=self._device),
                HealthResult,
                "check health",
            )
        except ACTIVITY_FAILED as err:
            self._log("health check failed", outcome="unknown", reason=_error_text(err))
            return False
        self._log("health checked", outcome=health.health or "unknown")
        return health.health == "Healthy"

    async def _ask_lease(
        self,
        device: ResolvedDevice,
        runbook: Runbook,
        counts: DeviceCounts | None,
    ) -> _EarlyLease:
        """Count the devices (unless `counts` given) and ask the budget for a lease; marks the
        lease held as soon as it is granted (so every way out gives it back)."""
        if counts is None:
            counts = await self._local(
                ACT_COUNT_DEVICES,
                CountDevicesInput(node_pool=device.node_pool),
                DeviceCounts,
                "count devices",
            )
        budget = runbook.spec.budget
        pool_limit = BudgetPolicy.limit(budget.max_per_pool, counts.pool_devices)
        cluster_limit = BudgetPolicy.limit(budget.max_per_cluster, counts.cluster_devices)
        decision = await self._local(
            ACT_ACQUIRE_BUDGET,
            BudgetLeaseRequest(
                holder=workflow.info().workflow_id,
                device_key=device.key,
                node_pool=device.node_pool,
                pool_limit=pool_limit,
                cluster_limit=cluster_limit,
                observed_pool_quarantined=counts.pool_quarantined,
                observed_cluster_quarantined=counts.cluster_quarantined,
            ),
            BudgetDecision,
            "acquire budget lease",
            budget=True,
        )
        if decision.granted:
            self._lease_held = True
        return _EarlyLease(device.key, decision, counts, pool_limit, cluster_limit)

    def _lease_refusal(self, device: ResolvedDevice, asked: _EarlyLease) -> str | None:
        """Why the answered request was refused (None: granted, and logged so)."""
        decision, counts = asked.decision, asked.counts
        assert decision is not None and counts is not None
        pool_limit, cluster_limit = asked.pool_limit, asked.cluster_limit
        if not decision.granted:
            return (
                f"blast-radius budget exhausted: {decision.reason} (pool {device.node_pool}: "
                f"{decision.pool_in_use}/{pool_limit} of {counts.pool_devices} devices, cluster: "
                f"{decision.cluster_in_use}/{cluster_limit} of {counts.cluster_devices}); "
                "device NOT tainted"
            )
        self._log(
            "budget lease acquired",
            outcome=f"pool {decision.pool_in_use}/{pool_limit}, "
            f"cluster {decision.cluster_in_use}/{cluster_limit}",
        )
        return None

    async def _try_lease(
        self,
        device: ResolvedDevice,
        runbook: Runbook,
        counts: DeviceCounts | None = None,
        asked: _EarlyLease | None = None,
    ) -> tuple[bool, EscalationReason, str, DeviceCounts]:
        """(granted, escalation kind, why not, the counts used); raises when the budget
        cannot be reached. `counts` given: reused instead of counting again; `asked` given:
        the answer of a request already made (concurrent confirm)."""
        if asked is None:
            asked = await self._ask_lease(device, runbook, counts)
        if asked.error is not None:
            raise asked.error
        assert asked.counts is not None
        why = self._lease_refusal(device, asked)
        if why is not None:
            return False, "budget-exhausted", why, asked.counts
        return True, "budget-exhausted", "", asked.counts

    async def _await_approval(self) -> None:
        policy = self._spec.approval
        on_timeout = {
            "proceed": "quarantine anyway",
            "abort": "close without quarantine",
            "escalate": "escalate, no quarantine",
        }[policy.on_timeout]
        self._enter(
            Phase.AWAITING_APPROVAL,
            awaiting=f"approval: the `{UPD_APPROVE}` update or `sickbay approve|reject`",
            until=policy.timeout,
            next_action=f"approved: quarantine; rejected: escalate; timed out: {on_timeout}",
        )
        self._log(
            "awaiting approval",
            outcome=f"timeout {format_duration(policy.timeout)}",
            reason=f"then {policy.on_timeout}: {on_timeout}",
        )
        self._upsert()
        try:
            await self._wait(
                lambda: self._decision is not None,
                limit=policy.timeout,
                summary=f"approval timeout ({format_duration(policy.timeout)}, then {policy.on_timeout})",
            )
        except TimeoutError:
            self._log("approval timed out", outcome=policy.on_timeout)
            if policy.on_timeout == "proceed":
                return
            if policy.on_timeout == "abort":
                raise _Done("not-quarantined", "approval timed out; runbook says abort") from None
            why = f"no approval within {policy.timeout}; device NOT tainted"
            await self._escalate("approval-timeout", why)
            raise _Done("escalated", why) from None
        decision = self._decision
        assert decision is not None
        if not decision.approve:
            why = f"rejected by {self._who('decision')}: {decision.reason or 'no reason given'}"
            await self._escalate("approval-rejected", why)
            raise _Done("escalated", why)

    async def _apply_quarantine(self, effect: str, label: str) -> QuarantineResult:
        result = await self._local(
            ACT_QUARANTINE, self._quarantine_input(effect), QuarantineResult, label
        )
        self._status.rule_name = result.rule_name or self._status.rule_name
        self._log(
            f"quarantined ({effect})",
            outcome=f"{result.mode} {result.action} {result.rule_name or ''}".strip(),
            reason=result.message,
        )
        if self._quarantine is not None and self._quarantine.node_tainted:
            result = result.model_copy(update={"node_tainted": True})
        return result

    def _quarantine_input(self, effect: str, dry_run: bool = False) -> QuarantineInput:
        assert self._device is not None and self._runbook is not None
        spec = self._runbook.spec
        return QuarantineInput(
            device=self._device,
            effect=effect,  # type: ignore[arg-type]
            taint_key=spec.quarantine.taint_key,
            taint_value=self._status.failure_class or "unhealthy",
            workflow_id=workflow.info().workflow_id,
            reason=f"{self._status.failure_class}: runbook {self._runbook.name}",
            consumers=[c.pod for c in self._consumers],
            fallback_node_threshold=spec.fallback.node_taint_below_healthy,
            dry_run=dry_run,
        )

    async def _evict_and_replace(self, effect: str, eviction_api: bool) -> None:
        pods = [c.pod for c in self._consumers if not c.terminating] or [
            c.pod for c in self._consumers
        ]
        if not pods:
            self._log("no consumers", reason="nothing to evict or replace")
            return
        if effect == "NoSchedule" and not eviction_api:
            self._log(
                "consumers keep running",
                reason="NoSchedule only blocks new pods on the device (runbook "
                f"{self._runbook.name if self._runbook else ''})",
            )
            return
        if not await self._evict(pods, eviction_api):
            return  # escalated
        await self._replace()

    async def _evict(self, pods: list[PodRef], eviction_api: bool) -> bool:
        """True once the consumers are gone; False after escalating.

        Eviction API mode honours PodDisruptionBudgets: blocked evictions are retried for the
        whole `eviction.timeout`; a pod a budget still protects then is never pushed past it
        unless the runbook forces (`noexecute` / `delete`): the remediation escalates
        `eviction-timeout` naming the budget and holds the device under its NoSchedule rule."""
        policy = self._spec.eviction
        forcing = policy.force in ("noexecute", "delete")
        self._enter(
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
        self._upsert()
        blocked = EvictPodsResult()
        # No rule served: the fallback evicted once through the Eviction API; what a budget
        # refused then is retried like eviction-api mode's evictions (there is no backstop).
        fallback = self._quarantine is not None and self._quarantine.mode == "fallback"
        refused = self._quarantine.blocked if fallback and self._quarantine else []
        if eviction_api or refused:
            blocked = await self._evict_pods(
                pods if eviction_api else refused,
                force=False,
                label="evict via Eviction API",
                retry_for=policy.timeout,
            )
        # Pods a budget still blocks will not go by waiting: give the others the grace only.
        report = await self._wait_eviction(pods, FORCE_GRACE if blocked.blocked else policy.timeout)
        if report.remaining and refused and _still_blocked(blocked, report) and not forcing:
            return await self._escalate_blocked(blocked, report)
        if report.remaining and eviction_api:
            if _still_blocked(blocked, report) and not forcing:
                return await self._escalate_blocked(blocked, report)
            # Backstop: NoExecute deletes pods regardless of budgets (none blocks, or forced).
            self._quarantine = await self._apply_quarantine("NoExecute", "NoExecute backstop")
            report = await self._wait_eviction(report.remaining, FORCE_GRACE)
        if report.remaining and policy.force in ("eviction-api", "delete"):
            blocked = await self._evict_pods(
                report.remaining,
                force=policy.force == "delete",
                label=f"force ({policy.force})",
                retry_for=None if policy.force == "delete" else FORCE_GRACE,
            )
            report = await self._wait_eviction(report.remaining, FORCE_GRACE)
            if _still_blocked(blocked, report):
                return await self._escalate_blocked(blocked, report)
        self._live_pods = list(report.remaining)
        if report.remaining:
            names = ", ".join(f"{p.namespace}/{p.name}" for p in report.remaining)
            await self._escalate(
                "eviction-timeout",
                f"consumers still on the device after {policy.timeout} "
                f"(force: {policy.force}): {names}",
            )
            return False
        await self._decision_event(
            "GPUConsumersEvicted",
            f"{len(report.gone)} consumer(s) left the quarantined device: "
            + ", ".join(f"{p.namespace}/{p.name}" for p in report.gone),
            pods=False,
            node=False,
        )
        return True

    async def _escalate_blocked(self, blocked: EvictPodsResult, report: EvictionReport) -> bool:
        """A PodDisruptionBudget still protects consumers: escalate naming it, hold (False)."""
        self._live_pods = list(report.remaining)
        names = ", ".join(f"{p.namespace}/{p.name}" for p in report.remaining)
        why = "; ".join(blocked.budgets) or "a PodDisruptionBudget refused the eviction"
        await self._escalate(
            "eviction-timeout",
            f"PodDisruptionBudget blocks eviction after {self._spec.eviction.timeout} "
            f"({blocked.attempts} tries; force: {self._spec.eviction.force}, so the budget is "
            f"honoured): {why}. Still on the device: {names}. Holding the device quarantined "
            "(new pods cannot get it); free the budget, or force with eviction.force "
            "noexecute/delete",
        )
        return False

    async def _evict_pods(
        self, pods: list[PodRef], *, force: bool, label: str, retry_for: timedelta | None = None
    ) -> EvictPodsResult:
        result = await self._activity(
            ACT_EVICT_PODS,
            EvictPodsInput(
                pods=pods,
                workflow_id=workflow.info().workflow_id,
                reason=f"GPU {self._status.device} quarantined",
                delete_if_blocked=force,
                retry_blocked_for=retry_for,
            ),
            EvictPodsResult,
            start_to_close=EVICT_TIMEOUT + (retry_for or timedelta(0)),
            heartbeat=EVICT_HEARTBEAT,
            retry=WAIT_RETRY,
        )
        self._log(
            label,
            outcome=f"evicted {len(result.evicted)}, deleted {len(result.deleted)}, "
            f"blocked {len(result.blocked)}, gone {len(result.gone)}"
            + (f" after {result.attempts} tries" if result.attempts > 1 else ""),
            reason="; ".join(result.budgets),
        )
        return result

    async def _wait_eviction(self, pods: list[PodRef], limit: timedelta) -> EvictionReport:
        report = await self._activity(
            ACT_WAIT_EVICTION,
            WaitEvictionInput(pods=pods, timeout=limit),
            EvictionReport,
            start_to_close=limit + WAIT_MARGIN,
            heartbeat=WAIT_HEARTBEAT,
            retry=WAIT_RETRY,
        )
        self._log(
            "eviction wait",
            outcome=f"gone {len(report.gone)}, remaining {len(report.remaining)}",
            reason="timed out" if report.timed_out else "",
        )
        return report

    async def _replace(self) -> None:
        spec = self._spec
        owners = self._owners()
        if not owners:
            self._log("no owners", reason="bare pods: nothing will replace them")
            return
        self._enter(
            Phase.AWAITING_REPLACEMENT,
            awaiting="replacements Running (Pending deadline "
            f"{format_duration(spec.replacement.pending_deadline)})",
            until=spec.replacement.pending_deadline,
            next_action="hold the device; still Pending at the deadline: "
            + ("scale up the node pool" if spec.scale_up.enabled else "escalate"),
        )
        self._upsert()
        report = await self._wait_replacement(owners, spec.replacement.pending_deadline)
        if report.status == "running":
            await self._decision_event(
                "GPUReplacementRunning",
                "replacement(s) Running on healthy devices: "
                + ", ".join(f"{p.pod.namespace}/{p.pod.name}" for p in report.pods if p.phase),
                rule=False,
                node=False,
            )
        if report.status == "pending":
            if not spec.scale_up.enabled:
                await self._escalate(
                    "pending-deadline",
                    f"replacements still Pending after {spec.replacement.pending_deadline}: "
                    f"{report.unschedulable_message or 'unschedulable'}; scale-up is off",
                )
                return
            scaled = await self._scale_up(owners, report)
            if scaled is None:
                return
            report = scaled
        if report.status == "churn":
            diag = report.churn.diagnosis if report.churn else "repeated evictions"
            stopped = await self._stop_churn()
            await self._escalate("churn", f"eviction churn: {diag} {stopped}")
            return
        if report.status in ("running", "no-replacement-needed"):
            self._metrics.create_histogram_timedelta(
                "sickbay_time_to_recovery",
                "From the remediation's start to the workload Running on healthy devices",
            ).with_additional_attributes(
                {"workload_class": self._status.workload_class or ""}
            ).record(workflow.now() - workflow.info().start_time)

    async def _stop_churn(self) -> str:
        """End the allocate -> evict loop per `replacement.onChurn`; says what was done."""
        action = self._spec.replacement.on_churn
        device = self._device
        assert device is not None
        if action == "cordon":
            result = await self._local(
                ACT_CORDON,
                CordonInput(node=device.node, workflow_id=workflow.info().workflow_id),
                CordonResult,
                "cordon node (churn)",
            )
            if result.changed and self._quarantine is not None:
                self._quarantine = self._quarantine.model_copy(update={"node_cordoned": True})
            self._log("churn stopped: node cordoned", outcome=result.message)
            return (
                f"Sickbay stopped the loop by cordoning node {device.node} ({result.message}; "
                "replacements go to other nodes or stay Pending; uncordoned on release)."
            )
        if action == "noschedule":
            self._quarantine = await self._apply_quarantine(
                "NoSchedule", "rule to NoSchedule (churn)"
            )
            self._log("churn stopped: rule switched to NoSchedule")
            return (
                "Sickbay stopped the loop by switching the rule to NoSchedule: nothing is evicted "
                "any more, so a pod the scheduler puts on the device stays on it."
            )
        self._log("churn not stopped", reason="replacement.onChurn: none")
        return "replacement.onChurn is none: Sickbay did not stop the loop; it goes on."

    async def _wait_replacement(
        self, owners: list[OwnerRef], deadline: timedelta
    ) -> ReplacementReport:
        report = await self._activity(
            ACT_WAIT_REPLACEMENT,
            WaitReplacementInput(
                owners=owners,
                old_pods=[c.pod for c in self._consumers],
                tainted=self._device.devices if self._device else [],
                deadline=deadline,
                churn_evictions=self._spec.replacement.churn_evictions,
            ),
            ReplacementReport,
            start_to_close=deadline + WAIT_MARGIN,
            heartbeat=WAIT_HEARTBEAT,
            retry=WAIT_RETRY,
        )
        self._log(
            "replacement wait",
            outcome=report.status,
            reason=report.unschedulable_message or (report.churn.diagnosis if report.churn else ""),
        )
        self._live_pods = [p.pod for p in report.pods if p.phase in ("Pending", "Running")]
        return report

    async def _scale_up(
        self, owners: list[OwnerRef], report: ReplacementReport
    ) -> ReplacementReport | None:
        """The report after capacity arrived, or None once escalated."""
        policy = self._spec.scale_up
        device = self._device
        assert device is not None
        self._enter(
            Phase.SCALING,
            awaiting="node-pool capacity",
            next_action="approval of the scale-up" if policy.approval else "wait for capacity",
        )
        self._upsert()
        pool = policy.pool or NodePoolTarget(
            provider=policy.provider or "http",
            name=device.node_pool or device.node,
            node_pool_label=device.node_pool,
        )
        if policy.approval:
            self._decision = None
            await self._await_approval()
            self._enter(Phase.SCALING, awaiting="node-pool capacity")
        wf_id = workflow.info().workflow_id
        try:
            result = await self._activity(
                ACT_REQUEST_CAPACITY,
                CapacityRequest(
                    pool=pool,
                    need=1,
                    step=policy.step,
                    max_size=policy.max_size,
                    cooldown=policy.cooldown,
                    requester=wf_id,
                    idempotency_key=f"{wf_id}-{workflow.info().run_id}-scale",
                ),
                CapacityResult,
                start_to_close=CAPACITY_TIMEOUT,
                heartbeat=CAPACITY_HEARTBEAT,
                retry=CAPACITY_RETRY,
            )
        except ACTIVITY_FAILED as err:
            kind: EscalationReason = (
                "no-capacity" if _error_type(err) == ERR_POOL_AT_MAX else "scale-up-failed"
            )
            await self._escalate(kind, f"scale-up of pool {pool.name} failed: {_error_text(err)}")
            return None
        self._log(
            "capacity requested",
            outcome=result.status,
            reason=f"pool {pool.name} size {result.current_size} -> {result.target_size}"
            + (f"; {result.message}" if result.message else ""),
        )
        if result.status == "at-max":
            await self._escalate(
                "no-capacity",
                f"no healthy GPU free and pool {pool.name} is at its max size "
                f"({result.current_size or policy.max_size}); replacements Pending",
            )
            return None
        if result.status == "rejected":
            await self._escalate("scale-up-failed", f"pool {pool.name}: {result.message}")
            return None
        await self._decision_event(
            "GPUScaleUpRequested",
            f"no healthy GPU free: asked pool {pool.name} for capacity "
            f"(size {result.current_size} -> {result.target_size})",
            rule=False,
        )
        self._enter(
            Phase.SCALING,
            awaiting="replacements Running (capacity deadline "
            f"{format_duration(policy.capacity_deadline)})",
            until=policy.capacity_deadline,
            next_action="hold the device; still Pending at the deadline: escalate",
        )
        after = await self._wait_replacement(owners, policy.capacity_deadline)
        if after.status == "pending":
            await self._escalate(
                "no-capacity",
                f"replacements still Pending {policy.capacity_deadline} after the scale-up "
                f"request: {after.unschedulable_message or 'unschedulable'}",
            )
            return None
        return after

    async def _hold_and_release(self) -> tuple[Outcome, str]:
        release = self._spec.release
        auto = release.mode in ("healthy-cooldown", "either")
        # release.mode healthy-cooldown: only the device's health releases it; a `repaired`
        # mark is recorded and the device still has to stay Healthy for the cool-down.
        health_only = release.mode == "healthy-cooldown"
        if health_only:
            awaiting = f"Healthy for {format_duration(release.cooldown)}"
        else:
            awaiting = "marked repaired" + (
                f" or Healthy for {format_duration(release.cooldown)}" if auto else ""
            )
        self._enter(
            Phase.HOLDING,
            awaiting=awaiting,
            until=release.health_check_interval if auto else None,
            next_action="check the device's health" if auto else "release once marked repaired",
        )
        self._upsert()
        self._health_only = health_only
        if health_only and self._repaired is not None:  # marked before the hold began
            self._note_repair()
        while health_only or self._repaired is None:
            try:
                await self._wait(
                    lambda: not health_only and self._repaired is not None,
                    limit=release.health_check_interval if auto else None,
                    summary=f"health check ({format_duration(release.health_check_interval)})"
                    if auto
                    else None,
                )
                break  # marked repaired (never woken so when only health releases)
            except TimeoutError:
                pass
            try:
                health = await self._local(
                    ACT_CHECK_HEALTH,
                    CheckHealthInput(device=self._device),
                    HealthResult,
                    "check health",
                )
            except ACTIVITY_FAILED as err:
                # Not knowing is not Healthy: keep holding, try again next interval.
                health = HealthResult(health=None, message=_error_text(err))
                self._log("health check failed", outcome="unknown", reason=health.message)
            now = workflow.now()
            if health.health == "Healthy":
                if self._healthy_since is None:
                    self._healthy_since = now
                    self._log("device Healthy", reason=f"cool-down {release.cooldown} starts")
                if now - self._healthy_since >= release.cooldown:
                    self._log("healthy for the cool-down", outcome=str(release.cooldown))
                    return await self._release(by_health=True)
            elif self._healthy_since is not None:
                self._healthy_since = None
                self._log("device not Healthy again", outcome=health.health or "unknown")
            if self._history_full():
                await workflow.wait_condition(workflow.all_handlers_finished)
                workflow.continue_as_new(self._carry())
        return await self._release(by_health=False)

    def _note_repair(self) -> None:
        """Under release.mode healthy-cooldown a repair mark does not release the device."""
        assert self._repaired is not None
        self._log(
            "repair noted",
            actor=self._repaired.actor,
            client_identity=self._sent["repaired"][1],
            reason="release.mode healthy-cooldown: released once Healthy for "
            f"{self._spec.release.cooldown}",
        )

    @staticmethod
    def _history_full() -> bool:
        info = workflow.info()
        return (
            info.get_current_history_length() > HOLD_HISTORY_LIMIT
            or info.is_continue_as_new_suggested()
        )

    async def _release(self, by_health: bool) -> tuple[Outcome, str]:
        self._enter(
            Phase.RELEASING, awaiting="quarantine removal", next_action="release the budget lease"
        )
        reason = (
            "healthy for the cool-down"
            if by_health or self._repaired is None
            else f"repaired ({self._who('repaired')})"
        )
        await self._remove_quarantine(reason)
        await self._decision_event(
            "GPUQuarantineReleased", f"quarantine lifted: {reason}", rule=False, pods=False
        )
        await self._release_lease()
        if self._escalated:
            await self._notify_all("resolve", f"released: {reason}")
            return "escalated", f"escalated ({self._status.escalation_reason}); released: {reason}"
        return "released", reason

    async def _remove_quarantine(self, reason: str) -> None:
        if self._quarantine is None or self._device is None:
            return
        result = await self._local(
            ACT_RELEASE_QUARANTINE,
            ReleaseInput(
                device=self._device,
                rule_name=self._quarantine.rule_name,
                api_version=self._quarantine.api_version,
                node_tainted=self._quarantine.node_tainted,
                workflow_id=workflow.info().workflow_id,
                reason=reason,
                rule_uids=self._quarantine.rule_uids,
            ),
            ReleaseResult,
            "release quarantine",
        )
        self._log(
            "quarantine released",
            outcome="removed" if result.removed else "absent",
            reason=result.message,
        )
        if self._quarantine.node_cordoned:
            uncordon = await self._local(
                ACT_CORDON,
                CordonInput(
                    node=self._device.node, cordon=False, workflow_id=workflow.info().workflow_id
                ),
                CordonResult,
                "uncordon node",
            )
            self._log("node uncordoned", outcome=uncordon.message)
        self._quarantine = None

    async def _release_lease(self) -> None:
        if not self._lease_held or self._device is None:
            return
        await self._local(
            ACT_RELEASE_BUDGET,
            BudgetReleaseRequest(holder=workflow.info().workflow_id, device_key=self._device.key),
            BudgetDecision,
            "release budget lease",
            budget=True,
        )
        self._lease_held = False
        self._log("budget lease released")

    async def _undo_after_abort(self) -> tuple[Outcome, str]:
        req = self._abort
        assert req is not None
        self._undoing = True
        self._enter(Phase.RELEASING, awaiting="undo after abort")
        reason = f"aborted by {self._who('abort')}: {req.reason}"
        try:
            await self._remove_quarantine(reason)
        except ACTIVITY_FAILED as err:
            await self._escalate(
                "error", f"abort could not remove the quarantine: {_error_text(err)}"
            )
            await self._release_lease()
            return "escalated", f"{reason}; quarantine removal failed"
        await self._release_lease()
        return "aborted", reason

    # ---------------------------------------------------------------- notifications --------

    def _event_targets(
        self, *, pods: bool, rule: bool, node: bool, owners: bool
    ) -> list[EventTarget]:
        """Where a person looks (`kubectl describe`): Sickbay's DeviceTaintRule(s), the node,
        each consumer's top owner (Deployment / StatefulSet / Job / JobSet) and the pods that
        exist now (consumers still on the device, or live / Pending replacements), never an
        evicted one."""
        out: list[EventTarget] = []
        q = self._quarantine
        if rule and q is not None and q.mode == "rule" and q.api_version:
            version = q.api_version if "/" in q.api_version else f"resource.k8s.io/{q.api_version}"
            for name in sorted(q.rule_uids) or ([q.rule_name] if q.rule_name else []):
                out.append(
                    EventTarget(
                        api_version=version,
                        kind="DeviceTaintRule",
                        name=name,
                        uid=q.rule_uids.get(name),
                    )
                )
        if node and self._device is not None:
            out.append(EventTarget(api_version="v1", kind="Node", name=self._device.node))
        if owners:
            seen: set[tuple[str, str, str]] = set()
            for c in self._consumers:
                o = c.top_owner or c.owner
                if o is None or o.kind not in OWNER_API_VERSIONS:
                    continue
                if (o.kind, o.namespace, o.name) in seen:
                    continue
                seen.add((o.kind, o.namespace, o.name))
                out.append(
                    EventTarget(
                        api_version=OWNER_API_VERSIONS[o.kind],
                        kind=o.kind,
                        name=o.name,
                        namespace=o.namespace,
                        uid=o.uid,
                    )
                )
        if pods:
            live = self._live_pods
            if live is None:
                live = [c.pod for c in self._consumers if not c.terminating]
            for p in live:
                out.append(
                    EventTarget(
                        api_version="v1", kind="Pod", name=p.name, namespace=p.namespace, uid=p.uid
                    )
                )
        return out

    async def _decision_event(
        self,
        reason: str,
        message: str,
        *,
        etype: Literal["Normal", "Warning"] = "Normal",
        pods: bool = True,
        rule: bool = True,
        node: bool = True,
        owners: bool = True,
    ) -> None:
        """A Kubernetes Event for one decision on every object a person would describe,
        aggregated (a repeat raises its count); failing to write it never stops the
        remediation. Dry runs write none: they change nothing in the cluster."""
        if self._inp.dry_run or (self._runbook is not None and self._runbook.spec.dry_run):
            return
        counted: list[EventTarget] = []
        for t in self._event_targets(pods=pods, rule=rule, node=node, owners=owners):
            key = f"{reason}|{t.kind}|{t.namespace or ''}|{t.name}"
            self._event_counts[key] = self._event_counts.get(key, 0) + 1
            counted.append(t.model_copy(update={"count": self._event_counts[key]}))
        if not counted:
            return
        try:
            await self._local(
                ACT_RECORD_EVENT,
                RecordEventInput(
                    targets=counted,
                    reason=reason,
                    message=f"GPU {self._status.device}: {message}"[:1000],
                    type=etype,
                    workflow_id=workflow.info().workflow_id,
                    aggregate=True,
                    series=f"{workflow.info().workflow_id}/{workflow.info().first_execution_run_id}",
                ),
                type(None),
                f"event {reason}",
            )
        except ACTIVITY_FAILED as err:
            self._log("Event not recorded", outcome="failed", reason=_error_text(err))

    async def _notify_owner(self, failure_class: str, why: str) -> None:
        targets = [
            EventTarget(
                api_version="v1",
                kind="Pod",
                name=c.pod.name,
                namespace=c.pod.namespace,
                uid=c.pod.uid,
            )
            for c in self._consumers
        ]
        message = (
            f"GPU {self._status.device}: {why}. Sickbay classified this as {failure_class}: "
            "the device was NOT quarantined; check the workload."
        )
        if targets and self._dry:
            self._log(
                "dry run: would record Event",
                outcome=f"Warning on {len(targets)} pod(s)",
                reason=message,
            )
        elif targets:
            try:
                await self._local(
                    ACT_RECORD_EVENT,
                    RecordEventInput(
                        targets=targets,
                        reason="GPUApplicationError"
                        if failure_class == "application"
                        else "GPUFaultNotQuarantined",
                        message=message,
                        type="Warning",
                        workflow_id=workflow.info().workflow_id,
                    ),
                    type(None),
                    "record event",
                )
                self._log("owner notified (Event)", outcome=f"{len(targets)} pod(s)")
            except ACTIVITY_FAILED as err:
                self._log("owner Event failed", outcome="failed", reason=_error_text(err))
        await self._escalate("application-error", message, severity="warning")

    async def _escalate(
        self,
        reason: EscalationReason,
        summary: str,
        severity: str | None = None,
        awaiting: str = "people",
    ) -> None:
        if self._escalated:
            self._log("already escalated", reason=f"{reason}: {summary}")
            return
        if self._dry:
            return self._would_escalate(reason, summary)
        self._escalated = True
        self._status.escalation_reason = reason
        self._enter(Phase.ESCALATED, awaiting=awaiting, next_action=_NEEDED[reason])
        self._log("escalate", outcome=reason, reason=summary)
        self._upsert()
        if reason != "application-error":  # that path already put its own Event on the pods
            await self._decision_event(
                "GPURemediationEscalated", f"{summary}. Needed: {_NEEDED[reason]}", etype="Warning"
            )
        policy = self._spec.escalation
        if reason not in policy.on:
            self._log(
                "escalation not sent",
                reason=f"runbook {self._status.runbook} escalates only on {policy.on}",
            )
        elif not policy.channels:
            self._log("escalation not sent", reason="the runbook names no channels")
        else:
            await self._notify_all("trigger", summary, severity=severity, needed=_NEEDED[reason])
        self._metrics.create_counter(
            "sickbay_escalations", "Escalations, by reason"
        ).with_additional_attributes({"reason": reason}).add(1)

    def _would_escalate(self, reason: EscalationReason, summary: str) -> None:
        """A dry run never pages and writes no Event: it says what it would have done."""
        self._escalated = True  # once per incident, as for real
        self._would_have = reason
        policy = self._spec.escalation
        if reason not in policy.on:
            send = f"no page (runbook {self._status.runbook} escalates only on {policy.on})"
        elif not policy.channels:
            send = "no page (the runbook names no channels)"
        else:
            send = f"page {', '.join(policy.channels)} ({policy.severity})"
        pods = len(self._consumers)
        events = f", a Warning Event on {pods} pod(s)" if pods else ""
        self._log(
            "dry run: would escalate",
            outcome=reason,
            reason=f"{summary}; would send: {send}{events}; nothing was sent",
        )

    async def _notify_all(
        self, action: str, summary: str, severity: str | None = None, needed: str = ""
    ) -> None:
        policy = self._spec.escalation
        if action == "resolve" and not policy.channels:
            return
        if self._dry:  # never reached by the procedure; a last guard against paging
            self._log(f"dry run: would notify ({action})", reason=summary)
            return
        incident = Incident(
            id=workflow.info().workflow_id,
            device=self._status.device,
            node=self._status.node,
            workload=", ".join(f"{p.namespace}/{p.name}" for p in self._status.consumers) or None,
            phase=self._status.phase,
            severity=severity or policy.severity,  # type: ignore[arg-type]
            reason=self._status.escalation_reason,
            node_pool=self._device.node_pool if self._device else None,
            cluster=self._inp.cluster or None,
            summary=f"{_cluster_tag(self._inp.cluster)}GPU {self._status.device}: {summary}",
            done=[f"{e.action}: {e.outcome}".rstrip(": ") for e in self._timeline],
            needed=needed,
            timeline=self._timeline,
        )
        for channel in policy.channels:
            try:
                result = await self._activity(
                    ACT_NOTIFY,
                    NotifyInput(channel=channel, action=action, incident=incident),  # type: ignore[arg-type]
                    NotifyResult,
                    start_to_close=NOTIFY_TIMEOUT,
                    retry=NOTIFY_RETRY,
                    interruptible=False,
                )
            except ACTIVITY_FAILED as err:
                self._log(f"notify {channel} ({action})", outcome="failed", reason=_gave_up(err))
                continue
            tries = getattr(result, "attempt", 1)
            earlier = getattr(result, "earlier_failures", [])
            for i, failure in enumerate(earlier, start=1):
                self._log(f"notify {channel} ({action})", outcome=f"try {i} failed", reason=failure)
            self._log(
                f"notify {channel} ({action})",
                outcome=("delivered" if result.delivered else "not delivered") + f" (try {tries})",
                reason=result.detail,
            )

    # ---------------------------------------------------------------- helpers --------------

    @property
    def _spec(self) -> Any:
        # Before a runbook is chosen (a step failed early), `default` decides how to escalate.
        return (self._runbook or self._fallback).spec

    def _owners(self) -> list[OwnerRef]:
        seen: dict[tuple[str, str, str], OwnerRef] = {}
        for c in self._consumers:
            owner = c.top_owner or c.owner
            if owner is not None:
                seen.setdefault((owner.kind, owner.namespace, owner.name), owner)
        return list(seen.values())

    async def _paged_elsewhere(self, err: BaseException, why: str) -> str | None:
        """For an alert about a device the cluster does not have (made up, or gone): None when
        this run pages, else who already paged for that on this node within the window. Asked
        of the rejections workflow; when it cannot answer, this run pages (loud, not lost)."""
        if _error_type(err) != ERR_DEVICE_NOT_FOUND or self._inp.trigger != "alert":
            return None
        if self._dry:  # a dry run claims nothing: it must not suppress a real page later
            return None
        node = self._inp.device.node or "-"
        claim = EscalationClaim(
            cause="device-not-found",
            node=node,
            holder=workflow.info().workflow_id,
            window=UNRESOLVABLE_PAGE_WINDOW,
            detail=why[:300],
        )
        try:
            got = await self._activity(
                ACT_CLAIM_ESCALATION,
                claim,
                EscalationClaimResult,
                start_to_close=CLAIM_TIMEOUT,
                retry=CLAIM_RETRY,
                interruptible=False,
            )
        except ACTIVITY_FAILED as claim_err:
            self._log("escalation claim failed", reason=_error_text(claim_err))
            return None
        if got.granted:
            return None
        since = got.since.isoformat() if got.since else "earlier"
        return (
            f"not paged: {got.holder} paged for device-not-found on node {node} at {since} "
            f"({got.suppressed} such alerts since, within {UNRESOLVABLE_PAGE_WINDOW})"
        )

    def _handled_alerts(self) -> list[HandledAlert]:
        """Alertmanager alert instances this run and the ones before it handled."""
        seen: dict[tuple[str, str], HandledAlert] = {h.key(): h for h in self._inp.handled_before}
        for a in self._alerts:
            if a.source == "alertmanager" and a.fingerprint:
                h = HandledAlert(fingerprint=a.fingerprint, starts_at=a.starts_at)
                seen.setdefault(h.key(), h)
        return list(seen.values())[-MAX_HANDLED_ALERTS:]  # newest last: the oldest go first

    def _add_alerts(self, alerts: list[AlertEvidence], initial: bool = False) -> None:
        before = {h.key() for h in self._inp.handled_before}
        if before:  # an earlier run handled these: repeats, not evidence
            fresh = [a for a in alerts if instance_key(a.fingerprint, a.starts_at) not in before]
            self._status.duplicate_alerts += len(alerts) - len(fresh)
            alerts = fresh
        merged, added = merge_evidence(self._alerts, alerts)
        self._alerts = merged
        self._status.alerts = len(merged)
        self._status.duplicate_alerts += len(alerts) - len(added)
        for alert in added:
            self._log(
                "evidence" if initial else "alert received",
                outcome=f"Xid {alert.xid}" if alert.xid is not None else alert.alertname,
                actor=alert.source,
                reason=alert.summary,
                # The source is the sender's word too: beside it, who sent the signal.
                client_identity=sender_identity(),
            )

    def _log_sent(self, what: str, action: str, actor: str, reason: str) -> None:
        """A timeline entry for a person's signal / update: the actor it claims, and the
        Temporal client identity the server recorded with it (`workflows/identity.py`)."""
        identity = sender_identity() or "unknown"
        self._sent[what] = (actor, identity)
        self._log(action, actor=actor, reason=reason, client_identity=identity)

    def _who(self, what: str) -> str:
        """`<actor> (claimed; Temporal client <identity>)` of the abort / repaired / decision."""
        return claimed_by(*self._sent[what])

    def _log(
        self,
        action: str,
        outcome: str = "",
        actor: str = "sickbay",
        reason: str = "",
        replace_same: bool = False,
        client_identity: str | None = None,
    ) -> None:
        """Add a timeline entry; `replace_same`: it replaces the last entry when that one is
        the same action (a run of identical retries stays one entry, the latest)."""
        if replace_same and self._timeline and self._timeline[-1].action == action:
            self._timeline.pop()
        self._timeline.append(
            TimelineEntry(
                at=workflow.now(),
                phase=self._status.phase,
                action=action,
                outcome=outcome,
                actor=actor,
                reason=reason,
                client_identity=client_identity,
            )
        )

    def _enter(
        self,
        phase: Phase,
        awaiting: str,
        *,
        until: timedelta | None = None,
        next_action: str = "",
    ) -> None:
        """Change phase; `until`: the wait ends by itself that long from now (timeout,
        deadline, retry); `next_action`: what happens then, in words (current details)."""
        if phase is not self._status.phase:
            workflow.logger.info(
                "remediation %s: %s -> %s",
                self._status.device,
                self._status.phase.value,
                phase.value,
            )
            self._metrics.create_counter(
                "sickbay_remediation_phase_entered", "Remediations entering each phase"
            ).with_additional_attributes({"phase": phase.value}).add(1)
        self._status.phase = phase
        self._status.awaiting = awaiting
        self._status.updated_at = workflow.now()
        self._status.until = workflow.now() + until if until is not None else None
        self._status.next_action = next_action
        workflow.set_current_details(self._details())
        if phase is Phase.CLOSED:
            self._upsert()

    def _details(self) -> str:
        """The Web UI's current details: phase, what it waits for and until when, what comes
        next, the escalation (markdown)."""
        st = self._status
        lines = [f"**{st.phase.value}**" + (" (dry run: nothing is changed)" if self._dry else "")]
        lines.append(f"device {st.device}" + (f" on node {st.node}" if st.node else ""))
        if st.awaiting:
            until = f" until {st.until:%Y-%m-%d %H:%M:%S} UTC" if st.until else ""
            lines.append(f"waiting for: {st.awaiting}{until}")
        if st.next_action:
            lines.append(f"next: {st.next_action}")
        if st.escalation_reason:
            lines.append(f"escalated: {st.escalation_reason}")
        if st.runbook:
            lines.append(f"runbook: {st.runbook}, failure class {st.failure_class or '?'}")
        if st.outcome:
            lines.append(f"outcome: {st.outcome}")
        return "\n\n".join(lines)

    @property
    def _dry(self) -> bool:
        """A dry run (input or runbook): nothing is created, nobody is paged."""
        return self._inp.dry_run or bool(self._runbook and self._runbook.spec.dry_run)

    def _upsert(self) -> None:
        """Search attributes, only at durable waits and at the end (one event each)."""
        st = self._status
        if self._sa_phase is st.phase:
            return
        pairs: list[SearchAttributePair[str]] = [SearchAttributePair(SA_PHASE_KEY, st.phase.value)]
        if st.escalation_reason:
            pairs.append(SearchAttributePair(SA_ESCALATION_KEY, st.escalation_reason))
        if st.outcome:
            pairs.append(SearchAttributePair(SA_OUTCOME_KEY, st.outcome))
        if self._sa_phase is None:
            pairs.append(SearchAttributePair(SA_DEVICE_KEY, self._status.device))
            if self._inp.cluster:
                pairs.append(SearchAttributePair(SA_CLUSTER_KEY, self._inp.cluster))
            if self._status.node:
                pairs.append(SearchAttributePair(SA_NODE_KEY, self._status.node))
        if self._status.workload_class:
            pairs.append(SearchAttributePair(SA_WORKLOAD_KEY, self._status.workload_class))
        workflow.upsert_search_attributes([p.key.value_set(p.value) for p in pairs])
        self._sa_phase = self._status.phase

    async def _local(
        self, name: str, arg: Any, result_type: type[T], label: str, budget: bool = False
    ) -> T:
        if self._abort is not None and not self._undoing:
            raise _Aborted()
        return await workflow.execute_local_activity(
            name,
            *([arg] if arg is not None else []),
            result_type=result_type,
            start_to_close_timeout=BUDGET_TIMEOUT if budget else LOCAL_TIMEOUT,
            retry_policy=BUDGET_RETRY if budget else LOCAL_RETRY,
            summary=label,
        )

    async def _activity(
        self,
        name: str,
        arg: Any,
        result_type: type[T],
        *,
        start_to_close: timedelta,
        retry: RetryPolicy,
        heartbeat: timedelta | None = None,
        interruptible: bool = True,
        summary: str | None = None,
    ) -> T:
        interruptible = interruptible and not self._undoing
        if interruptible and self._abort is not None:
            raise _Aborted()
        call = workflow.execute_activity(
            name,
            arg,
            result_type=result_type,
            start_to_close_timeout=start_to_close,
            heartbeat_timeout=heartbeat,
            retry_policy=retry,
            summary=summary or name,
        )
        if not interruptible:
            return await call
        return await self._race(call)

    async def _race(self, awaitable: Awaitable[T]) -> T:
        """Await `awaitable` unless an abort arrives first (then cancel it, raise _Aborted)."""
        task: asyncio.Future[T] = asyncio.ensure_future(awaitable)
        stop: asyncio.Future[Any] = asyncio.ensure_future(
            workflow.wait_condition(lambda: self._abort is not None)
        )
        await workflow.wait([task, stop], return_when=asyncio.FIRST_COMPLETED)  # type: ignore[type-var]
        if task.done():
            stop.cancel()
            return task.result()
        task.cancel()
        raise _Aborted()

    async def _wait(
        self, done: Callable[[], bool], limit: timedelta | None, summary: str | None = None
    ) -> None:
        """wait_condition that also ends on abort; TimeoutError when `limit` passes.
        `summary` names the timer in the Web UI (instead of "1 (15m)")."""
        await workflow.wait_condition(
            lambda: done() or self._abort is not None, timeout=limit, timeout_summary=summary
        )
        if self._abort is not None:
            raise _Aborted()

    def _carry(self, waiting_for_budget: bool = False) -> RemediationInput:
        assert self._device is not None and self._runbook is not None
        return self._inp.model_copy(
            update={
                "alerts": [],
                "resume": RemediationCarry(
                    device=self._device,
                    runbook=self._runbook,
                    quarantine=self._quarantine,
                    lease_held=self._lease_held,
                    escalated=self._escalated,
                    status=self._status,
                    timeline=self._timeline,
                    alerts=self._alerts,
                    healthy_since=self._healthy_since,
                    waiting_for_budget=waiting_for_budget,
                    event_counts=self._event_counts,
                ),
            }
        )


_NEEDED: dict[str, str] = {
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
    "error": "look at the timeline: a step failed and automation stopped",
}
