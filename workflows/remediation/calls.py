"""Typed activity calls of the remediation: one method per activity, taking its input model
and returning its result model, with the activity's name, result type, timeout and retry
policy in one place, so mypy checks name, input and result together.

Each method is registered in `REQUIRED_ACTIVITIES` (the worker refuses to start without one
of them). Every call ends on `abort` (raises `Aborted`), except the notifications and the
calls made while undoing after an abort.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from datetime import datetime, timedelta
from typing import Any, TypeVar

from temporalio import workflow
from temporalio.common import RetryPolicy
from temporalio.exceptions import ActivityError, ApplicationError
from temporalio.exceptions import TimeoutError as TemporalTimeoutError

with workflow.unsafe.imports_passed_through():
    from contract.actors import ActorCheck, ActorVerdict
    from contract.budget import BudgetDecision, BudgetLeaseRequest, BudgetReleaseRequest
    from contract.capacity import (
        CapacityRequest,
        CapacityResult,
        KarpenterInput,
        KarpenterResult,
    )
    from contract.errors import ERR_CHANNEL_REJECTED, ERR_CONFIG
    from contract.kube import (
        CheckHealthInput,
        ConsumersResult,
        CordonInput,
        CordonResult,
        CountDevicesInput,
        DeviceCounts,
        EvictionReport,
        EvictPodsInput,
        EvictPodsResult,
        Evidence,
        EvidenceInput,
        FindConsumersInput,
        HealthResult,
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
    from contract.ledger import LedgerDecision, RecordFailureInput, RecordRepairInput
    from contract.names import (
        ACT_ACQUIRE_BUDGET,
        ACT_CHECK_GPU_HOLDERS,
        ACT_CHECK_HEALTH,
        ACT_CLAIM_ESCALATION,
        ACT_CLEAN_UP_REPAIR_JOB,
        ACT_CORDON,
        ACT_COUNT_DEVICES,
        ACT_EVICT_PODS,
        ACT_FIND_CONSUMERS,
        ACT_FIND_DRAIN_PODS,
        ACT_FIND_RESET_GROUP,
        ACT_GATHER_EVIDENCE,
        ACT_KARPENTER_CAPACITY,
        ACT_LOAD_RUNBOOKS,
        ACT_NOTIFY,
        ACT_PREVIEW_QUARANTINE,
        ACT_QUARANTINE,
        ACT_REBOOT_NODE,
        ACT_RECORD_EVENT,
        ACT_RECORD_GPU_FAILURE,
        ACT_RECORD_GPU_REPAIR,
        ACT_RELEASE_BUDGET,
        ACT_RELEASE_QUARANTINE,
        ACT_REPLACE_NODE,
        ACT_REQUEST_CAPACITY,
        ACT_RESOLVE_DEVICE,
        ACT_SIGNAL_WITH_START,
        ACT_START_RESET_JOB,
        ACT_START_VALIDATION_JOB,
        ACT_VERIFY_ACTOR,
        ACT_WAIT_EVICTION,
        ACT_WAIT_NODE_GPUS,
        ACT_WAIT_REPAIR_JOB,
        ACT_WAIT_REPLACEMENT,
    )
    from contract.notify import EscalationClaim, EscalationClaimResult, NotifyInput, NotifyResult
    from contract.repair import (
        CleanUpRepairJobInput,
        DrainPodsInput,
        DrainPodsResult,
        GpuHoldersInput,
        GpuHoldersResult,
        MachineActionInput,
        MachineActionResult,
        NodeGpusResult,
        RepairJobInput,
        RepairJobOutcome,
        RepairJobStarted,
        ResetGroupInput,
        ResetGroupResult,
        ValidationJobInput,
        WaitNodeGpusInput,
        WaitRepairJobInput,
    )
    from contract.runbook import RunbookSet
    from workflows.remediation.state import RemediationState

T = TypeVar("T")
F = TypeVar("F", bound=Callable[..., Awaitable[Any]])

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
# Long waits (watch-based activities): they heartbeat, so a dead worker is noticed within a
# minute and another worker resumes from the heartbeat details; 3 attempts, then escalate.
WAIT_HEARTBEAT = timedelta(seconds=60)
WAIT_MARGIN = timedelta(minutes=2)  # the activity's own deadline fires first and reports
# One look at the replacements (a list, a few claim reads) when the deadline timer fires.
LOOK_TIMEOUT = timedelta(minutes=1)
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
# The rejections workflow's claim update answers in milliseconds; 3 tries, then this run
# pages rather than stay silent.
CLAIM_TIMEOUT = timedelta(seconds=10)
CLAIM_RETRY = RetryPolicy(initial_interval=timedelta(seconds=1), maximum_attempts=3)

# Repair rungs. One Kubernetes call each (the Job starts, the reset group, the drain list):
# 30 s covers a slow API server; LOCAL_RETRY-like attempts, then the rung counts as failed.
REPAIR_CALL_TIMEOUT = timedelta(seconds=30)
REPAIR_CALL_RETRY = RetryPolicy(
    initial_interval=timedelta(seconds=1),
    backoff_coefficient=2.0,
    maximum_interval=timedelta(seconds=10),
    maximum_attempts=5,
)
# Polls (holders free, Job ended, node back with its GPUs): the activity answers a retryable
# StillWaiting / GpuStillHeld until done, so the retry policy is the poll (every 5 s, the
# twin's time-scaled rungs end in seconds; a real reboot in minutes), bounded by the rung's
# own timeout as schedule_to_close.
POLL_CALL_TIMEOUT = timedelta(seconds=30)
POLL_RETRY = RetryPolicy(initial_interval=timedelta(seconds=5), backoff_coefficient=1.0)
# A reboot / replace request: one provider call. Asked for once per attempt (the request key
# is the attempt's), so retrying a lost answer (503, a killed worker) asks nothing twice;
# not configured / refused are non-retryable and escalate.
MACHINE_TIMEOUT = timedelta(minutes=2)
# The activity heartbeats while it asks: a worker killed mid-request is retried elsewhere
# within this, and the retry asks nothing twice (the provider's record, docs/cloud.md).
MACHINE_HEARTBEAT = timedelta(seconds=30)
MACHINE_RETRY = RetryPolicy(
    initial_interval=timedelta(seconds=5),
    backoff_coefficient=2.0,
    maximum_interval=timedelta(minutes=1),
    maximum_attempts=5,
)

# What a failed activity raises in the workflow: ActivityError wrapping the cause for regular
# activities; local activity failures surface as their cause (ApplicationError / timeout).
ACTIVITY_FAILED = (ActivityError, ApplicationError, TemporalTimeoutError)

# Every activity the remediation calls, in the order of the methods below.
REQUIRED_ACTIVITIES: list[str] = []


def calls(name: str) -> Callable[[F], F]:
    """Marks a `Calls` method as the call of activity `name` (for REQUIRED_ACTIVITIES)."""

    def mark(fn: F) -> F:
        REQUIRED_ACTIVITIES.append(name)
        return fn

    return mark


class Aborted(Exception):
    """Raised inside the workflow when an `abort` signal interrupts a wait."""


def error_text(err: BaseException) -> str:
    cause = err.cause if isinstance(err, ActivityError) else err
    if isinstance(cause, ApplicationError):
        return f"{cause.type or 'error'}: {cause.message}"
    if isinstance(cause, TemporalTimeoutError) and isinstance(cause.cause, ApplicationError):
        # A poll that ran out of time: its last answer says what it was still waiting for.
        last = cause.cause
        return f"TimeoutError: {cause}; last: {last.type or 'error'}: {last.message}"
    if cause is not None:
        return f"{type(cause).__name__}: {cause}"
    return str(err)


def error_type(err: BaseException) -> str | None:
    cause = err.cause if isinstance(err, ActivityError) else err
    return cause.type if isinstance(cause, ApplicationError) else None


def gave_up(err: BaseException) -> str:
    """Why a notification was given up: a permanent error (configuration, rejected) is tried
    once, not NOTIFY_RETRY's six times, and the timeline says so."""
    cause = err.cause if isinstance(err, ActivityError) else err
    permanent = NOTIFY_RETRY.non_retryable_error_types or []
    if isinstance(cause, ApplicationError) and (cause.non_retryable or cause.type in permanent):
        return f"not retried: {error_text(err)}"
    return f"gave up after {NOTIFY_RETRY.maximum_attempts} tries: {error_text(err)}"


async def gather_all(*calls: Awaitable[Any]) -> list[Any]:
    """Run `calls` side by side; every one finishes (none left running behind a failure,
    e.g. a lease still being granted) before the first error, in call order, is raised."""
    tasks: list[asyncio.Task[Any]] = [asyncio.ensure_future(c) for c in calls]
    await workflow.wait(tasks)
    for task in tasks:
        err = task.exception()
        if err is not None:
            raise err
    return [task.result() for task in tasks]


class Calls:
    """The remediation's activity calls; `state` tells whether an abort interrupts them."""

    def __init__(self, state: RemediationState) -> None:
        self._state = state

    # ------------------------------------------------------------ local activities ---------

    @calls(ACT_LOAD_RUNBOOKS)
    async def load_runbooks(self) -> RunbookSet:
        return await self._local(ACT_LOAD_RUNBOOKS, None, RunbookSet, "load runbooks")

    @calls(ACT_RESOLVE_DEVICE)
    async def resolve_device(self, inp: ResolveDeviceInput) -> ResolvedDevice:
        return await self._local(ACT_RESOLVE_DEVICE, inp, ResolvedDevice, "resolve")

    @calls(ACT_GATHER_EVIDENCE)
    async def gather_evidence(self, inp: EvidenceInput) -> Evidence:
        return await self._local(ACT_GATHER_EVIDENCE, inp, Evidence, "gather evidence")

    @calls(ACT_FIND_CONSUMERS)
    async def find_consumers(self, inp: FindConsumersInput) -> ConsumersResult:
        return await self._local(ACT_FIND_CONSUMERS, inp, ConsumersResult, "find consumers")

    @calls(ACT_COUNT_DEVICES)
    async def count_devices(self, inp: CountDevicesInput) -> DeviceCounts:
        return await self._local(ACT_COUNT_DEVICES, inp, DeviceCounts, "count devices")

    @calls(ACT_ACQUIRE_BUDGET)
    async def acquire_budget(self, inp: BudgetLeaseRequest) -> BudgetDecision:
        return await self._local(
            ACT_ACQUIRE_BUDGET, inp, BudgetDecision, "acquire budget lease", budget=True
        )

    @calls(ACT_RELEASE_BUDGET)
    async def release_budget(
        self, inp: BudgetReleaseRequest, label: str = "release budget lease"
    ) -> BudgetDecision:
        return await self._local(ACT_RELEASE_BUDGET, inp, BudgetDecision, label, budget=True)

    @calls(ACT_QUARANTINE)
    async def quarantine(self, inp: QuarantineInput, label: str) -> QuarantineResult:
        return await self._local(ACT_QUARANTINE, inp, QuarantineResult, label)

    @calls(ACT_PREVIEW_QUARANTINE)
    async def preview_quarantine(self, inp: QuarantineInput) -> QuarantineResult:
        return await self._local(
            ACT_PREVIEW_QUARANTINE, inp, QuarantineResult, "preview quarantine"
        )

    @calls(ACT_RELEASE_QUARANTINE)
    async def release_quarantine(self, inp: ReleaseInput) -> ReleaseResult:
        return await self._local(ACT_RELEASE_QUARANTINE, inp, ReleaseResult, "release quarantine")

    @calls(ACT_CORDON)
    async def cordon(self, inp: CordonInput, label: str) -> CordonResult:
        return await self._local(ACT_CORDON, inp, CordonResult, label)

    @calls(ACT_KARPENTER_CAPACITY)
    async def karpenter_capacity(self, inp: KarpenterInput, label: str) -> KarpenterResult:
        return await self._local(ACT_KARPENTER_CAPACITY, inp, KarpenterResult, label)

    @calls(ACT_CHECK_HEALTH)
    async def check_health(self, inp: CheckHealthInput) -> HealthResult:
        return await self._local(ACT_CHECK_HEALTH, inp, HealthResult, "check health")

    @calls(ACT_RECORD_EVENT)
    async def record_event(self, inp: RecordEventInput, label: str) -> None:
        await self._local(ACT_RECORD_EVENT, inp, type(None), label)

    @calls(ACT_SIGNAL_WITH_START)
    async def signal_with_start(self, inp: LaunchRequest) -> LaunchResult:
        return await self._local(ACT_SIGNAL_WITH_START, inp, LaunchResult, "hand over")

    # The GPU ledger's updates retry a refused update inside the activity, as the lease's do.
    @calls(ACT_RECORD_GPU_FAILURE)
    async def record_gpu_failure(self, inp: RecordFailureInput) -> LedgerDecision:
        return await self._local(
            ACT_RECORD_GPU_FAILURE, inp, LedgerDecision, "record GPU failure", budget=True
        )

    @calls(ACT_RECORD_GPU_REPAIR)
    async def record_gpu_repair(self, inp: RecordRepairInput) -> LedgerDecision:
        return await self._local(
            ACT_RECORD_GPU_REPAIR, inp, LedgerDecision, "record GPU repair", budget=True
        )

    # ------------------------------------------------------------ regular activities -------

    @calls(ACT_EVICT_PODS)
    async def evict_pods(self, inp: EvictPodsInput) -> EvictPodsResult:
        # The activity retries what a PodDisruptionBudget refuses for `retry_blocked_for`.
        return await self._activity(
            ACT_EVICT_PODS,
            inp,
            EvictPodsResult,
            start_to_close=EVICT_TIMEOUT + (inp.retry_blocked_for or timedelta(0)),
            heartbeat=EVICT_HEARTBEAT,
            retry=WAIT_RETRY,
        )

    @calls(ACT_WAIT_EVICTION)
    async def wait_eviction(self, inp: WaitEvictionInput) -> EvictionReport:
        return await self._activity(
            ACT_WAIT_EVICTION,
            inp,
            EvictionReport,
            start_to_close=inp.timeout + WAIT_MARGIN,
            heartbeat=WAIT_HEARTBEAT,
            retry=WAIT_RETRY,
        )

    @calls(ACT_WAIT_REPLACEMENT)
    async def wait_replacement(
        self, inp: WaitReplacementInput, limit: timedelta
    ) -> ReplacementReport:
        """The deadline-free watch (the workflow's deadline timer cancels it), or with
        `look_once` one look; `limit`: the longest the wait may still last (extensions
        included), so the watch never times out before the timer fires."""
        return await self._activity(
            ACT_WAIT_REPLACEMENT,
            inp,
            ReplacementReport,
            start_to_close=LOOK_TIMEOUT if inp.look_once else limit + WAIT_MARGIN,
            heartbeat=None if inp.look_once else WAIT_HEARTBEAT,
            retry=WAIT_RETRY,
            # Cancelled at the deadline without waiting for it to stop (TRY_CANCEL, the
            # default): the watch only reads, so the look at the pods and the scale-up or
            # escalation start when the timer fires, not when the cancel reaches the watch
            # with its next heartbeat (up to 48 s later).
        )

    @calls(ACT_REQUEST_CAPACITY)
    async def request_capacity(self, inp: CapacityRequest) -> CapacityResult:
        return await self._activity(
            ACT_REQUEST_CAPACITY,
            inp,
            CapacityResult,
            start_to_close=CAPACITY_TIMEOUT,
            heartbeat=CAPACITY_HEARTBEAT,
            retry=CAPACITY_RETRY,
        )

    @calls(ACT_NOTIFY)
    async def notify(self, inp: NotifyInput) -> NotifyResult:
        # Not interrupted by an abort: a page already on its way is delivered (or resolved).
        return await self._activity(
            ACT_NOTIFY,
            inp,
            NotifyResult,
            start_to_close=NOTIFY_TIMEOUT,
            retry=NOTIFY_RETRY,
            interruptible=False,
        )

    @calls(ACT_CLAIM_ESCALATION)
    async def claim_escalation(self, inp: EscalationClaim) -> EscalationClaimResult:
        return await self._activity(
            ACT_CLAIM_ESCALATION,
            inp,
            EscalationClaimResult,
            start_to_close=CLAIM_TIMEOUT,
            retry=CLAIM_RETRY,
            interruptible=False,
        )

    # ------------------------------------------------------------ repair rungs --------------

    @calls(ACT_FIND_RESET_GROUP)
    async def find_reset_group(self, inp: ResetGroupInput) -> ResetGroupResult:
        return await self._repair(ACT_FIND_RESET_GROUP, inp, ResetGroupResult)

    @calls(ACT_FIND_DRAIN_PODS)
    async def find_drain_pods(self, inp: DrainPodsInput) -> DrainPodsResult:
        return await self._repair(ACT_FIND_DRAIN_PODS, inp, DrainPodsResult)

    @calls(ACT_CHECK_GPU_HOLDERS)
    async def check_gpu_holders(self, inp: GpuHoldersInput, limit: timedelta) -> GpuHoldersResult:
        return await self._repair(ACT_CHECK_GPU_HOLDERS, inp, GpuHoldersResult, poll=limit)

    @calls(ACT_START_RESET_JOB)
    async def start_reset_job(self, inp: RepairJobInput) -> RepairJobStarted:
        return await self._repair(ACT_START_RESET_JOB, inp, RepairJobStarted)

    @calls(ACT_START_VALIDATION_JOB)
    async def start_validation_job(self, inp: ValidationJobInput) -> RepairJobStarted:
        return await self._repair(ACT_START_VALIDATION_JOB, inp, RepairJobStarted)

    @calls(ACT_WAIT_REPAIR_JOB)
    async def wait_for_repair_job(
        self, inp: WaitRepairJobInput, limit: timedelta
    ) -> RepairJobOutcome:
        return await self._repair(ACT_WAIT_REPAIR_JOB, inp, RepairJobOutcome, poll=limit)

    @calls(ACT_CLEAN_UP_REPAIR_JOB)
    async def clean_up_repair_job(self, inp: CleanUpRepairJobInput) -> None:
        await self._repair(ACT_CLEAN_UP_REPAIR_JOB, inp, type(None))

    @calls(ACT_REBOOT_NODE)
    async def reboot_node(self, inp: MachineActionInput) -> MachineActionResult:
        return await self._machine(ACT_REBOOT_NODE, inp)

    @calls(ACT_REPLACE_NODE)
    async def replace_node(self, inp: MachineActionInput) -> MachineActionResult:
        return await self._machine(ACT_REPLACE_NODE, inp)

    @calls(ACT_VERIFY_ACTOR)
    async def verify_actor(self, check: ActorCheck) -> ActorVerdict:
        # Called from a signal/update handler: never raises Aborted (an abort in flight must
        # not fail the handler); a pure HMAC check, so LOCAL_TIMEOUT/LOCAL_RETRY are ample.
        return await workflow.execute_local_activity(
            ACT_VERIFY_ACTOR,
            check,
            result_type=ActorVerdict,
            start_to_close_timeout=LOCAL_TIMEOUT,
            retry_policy=LOCAL_RETRY,
            summary=f"verify {check.action} by {check.actor.user}",
        )

    @calls(ACT_WAIT_NODE_GPUS)
    async def wait_for_node_gpus(self, inp: WaitNodeGpusInput, limit: timedelta) -> NodeGpusResult:
        return await self._repair(ACT_WAIT_NODE_GPUS, inp, NodeGpusResult, poll=limit)

    async def _repair(
        self, name: str, arg: Any, result_type: type[T], poll: timedelta | None = None
    ) -> T:
        if self._state.abort is not None:
            raise Aborted()
        call = workflow.execute_activity(
            name,
            arg,
            result_type=result_type,
            start_to_close_timeout=POLL_CALL_TIMEOUT if poll else REPAIR_CALL_TIMEOUT,
            schedule_to_close_timeout=poll,
            retry_policy=POLL_RETRY if poll else REPAIR_CALL_RETRY,
            summary=name,
        )
        return await self._race(call)

    async def _machine(self, name: str, inp: MachineActionInput) -> MachineActionResult:
        # Not interrupted by an abort once asked: the request's answer (or its failure) is
        # recorded in the timeline, never left unknown.
        return await workflow.execute_activity(
            name,
            inp,
            result_type=MachineActionResult,
            start_to_close_timeout=MACHINE_TIMEOUT,
            heartbeat_timeout=MACHINE_HEARTBEAT,
            retry_policy=MACHINE_RETRY,
            summary=f"{name} {inp.node} (attempt {inp.attempt})",
        )

    # ------------------------------------------------------------ waits ---------------------

    async def wait(
        self, done: Callable[[], bool], limit: timedelta | None, summary: str | None = None
    ) -> None:
        """wait_condition that also ends on abort; TimeoutError when `limit` passes.
        `summary` names the timer in the Web UI (instead of "1 (15m)")."""
        st = self._state
        await workflow.wait_condition(
            lambda: done() or st.abort is not None, timeout=limit, timeout_summary=summary
        )
        if st.abort is not None:
            raise Aborted()

    async def within(self, call: Awaitable[T], deadline: datetime, summary: str) -> T | None:
        """`call` (an activity), unless the runbook timer at `deadline` fires first: then None
        at once. The activity is cancelled without waiting for it to stop (TRY_CANCEL: its
        cancel reaches it with its next heartbeat, up to 0.8 x its heartbeat timeout later),
        so the step after the timer starts when the timer fires; only read-only waits and
        the idempotent Eviction API go through here (docs/architecture.md, "Runbook timers").
        Raises Aborted on abort, and the call's own failure when it ends first."""
        task: asyncio.Task[T] = asyncio.ensure_future(call)
        try:
            left = deadline - workflow.now()
            if left > timedelta(0):
                await self.wait(task.done, limit=left, summary=summary)
        except TimeoutError:
            pass
        finally:
            if not task.done():
                task.cancel()
        if not task.done() or task.cancelled():
            return None
        return task.result()

    # ------------------------------------------------------------ plumbing ------------------

    async def _local(
        self, name: str, arg: Any, result_type: type[T], label: str, budget: bool = False
    ) -> T:
        if self._state.abort is not None and not self._state.undoing:
            raise Aborted()
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
        cancellation: workflow.ActivityCancellationType = (
            workflow.ActivityCancellationType.TRY_CANCEL
        ),
    ) -> T:
        interruptible = interruptible and not self._state.undoing
        if interruptible and self._state.abort is not None:
            raise Aborted()
        call = workflow.execute_activity(
            name,
            arg,
            result_type=result_type,
            start_to_close_timeout=start_to_close,
            heartbeat_timeout=heartbeat,
            retry_policy=retry,
            cancellation_type=cancellation,
            summary=name,
        )
        if not interruptible:
            return await call
        return await self._race(call)

    async def _race(self, awaitable: Awaitable[T]) -> T:
        """Await `awaitable` unless an abort arrives first (then cancel it, raise Aborted)."""
        st = self._state
        task: asyncio.Task[T] = asyncio.ensure_future(awaitable)
        stop: asyncio.Task[None] = asyncio.ensure_future(
            workflow.wait_condition(lambda: st.abort is not None)
        )
        pending: list[asyncio.Task[Any]] = [task, stop]
        try:
            await workflow.wait(pending, return_when=asyncio.FIRST_COMPLETED)
        except asyncio.CancelledError:  # the caller cancelled the call: cancel the activity
            stop.cancel()
            task.cancel()
            await workflow.wait([task])  # until it stopped, per its cancellation type
            raise
        if task.done():
            stop.cancel()
            return task.result()
        task.cancel()
        raise Aborted()
