"""Typed activity calls of the remediation: one method per activity, taking its input model
and returning its result model, with its timeout and retry policy. Each calls through the
activity's declaration (`contract.activity.Activity`, e.g. `contract.kube.QUARANTINE_DEVICE`),
which the activity implements too, so mypy holds the method, the declaration and the
implementation to the same input and result.

`REQUIRED_ACTIVITIES`: the declarations imported here (the worker refuses to start without
one of them). Every call ends on `abort` (raises `Aborted`), except the notifications and the
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
    from contract.activity import Activity, declared_in
    from contract.actors import VERIFY_ACTOR, ActorCheck, ActorVerdict
    from contract.budget import (
        ACQUIRE_BUDGET_LEASE,
        RELEASE_BUDGET_LEASE,
        BudgetDecision,
        BudgetLeaseRequest,
        BudgetReleaseRequest,
    )
    from contract.capacity import (
        KARPENTER_CAPACITY,
        REQUEST_CAPACITY,
        CapacityRequest,
        CapacityResult,
        KarpenterInput,
        KarpenterResult,
    )
    from contract.errors import ERR_CHANNEL_REJECTED, ERR_CONFIG
    from contract.failover import PROVIDER_HEARTBEAT
    from contract.kube import (
        CHECK_DEVICE_HEALTH,
        CORDON_NODE,
        COUNT_DEVICES,
        EVICT_PODS,
        FIND_CONSUMERS,
        GATHER_EVIDENCE,
        PREVIEW_QUARANTINE,
        QUARANTINE_DEVICE,
        RECORD_EVENT,
        RELEASE_QUARANTINE,
        RESOLVE_DEVICE,
        WAIT_FOR_EVICTION,
        WAIT_FOR_REPLACEMENT,
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
    from contract.launch import SIGNAL_WITH_START_REMEDIATION, LaunchRequest, LaunchResult
    from contract.ledger import (
        RECORD_GPU_FAILURE,
        RECORD_GPU_REPAIR,
        LedgerDecision,
        RecordFailureInput,
        RecordRepairInput,
    )
    from contract.notify import (
        CLAIM_ESCALATION,
        SEND_NOTIFICATION,
        EscalationClaim,
        EscalationClaimResult,
        NotifyInput,
        NotifyResult,
    )
    from contract.repair_rungs import (
        CHECK_GPU_HOLDERS,
        CLEAN_UP_REPAIR_JOB,
        FIND_DRAIN_PODS,
        FIND_RESET_GROUP,
        REBOOT_NODE,
        REPLACE_NODE,
        START_RESET_JOB,
        START_VALIDATION_JOB,
        WAIT_FOR_NODE_GPUS,
        WAIT_FOR_REPAIR_JOB,
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
    from contract.runbook import LOAD_RUNBOOKS, RunbookSet
    from workflows.call_options import (
        CAPACITY_HEARTBEAT,
        CAPACITY_RETRY,
        CAPACITY_TIMEOUT,
        EVICT_HEARTBEAT,
        LOOK_TIMEOUT,
        WAIT_HEARTBEAT,
        WAIT_MARGIN,
        WAIT_RETRY,
    )
    from workflows.execute import abandon, execute, execute_local
    from workflows.remediation.state import RemediationState

T = TypeVar("T")
I = TypeVar("I")  # noqa: E741 - an activity's input model, as in Activity[I, R]
R = TypeVar("R")

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
# Long waits, the eviction's heartbeat and capacity requests: workflows/call_options.py
# (shared with the node incident). Eviction through the API: each pod gets a few 429 (PDB)
# retries inside the activity.
EVICT_TIMEOUT = timedelta(minutes=2)
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
MACHINE_HEARTBEAT = PROVIDER_HEARTBEAT  # it heartbeats while it asks (contract/failover.py)
MACHINE_RETRY = RetryPolicy(
    initial_interval=timedelta(seconds=5),
    backoff_coefficient=2.0,
    maximum_interval=timedelta(minutes=1),
    maximum_attempts=5,
)

# What a failed activity raises in the workflow: ActivityError wrapping the cause for regular
# activities; local activity failures surface as their cause (ApplicationError / timeout).
ACTIVITY_FAILED = (ActivityError, ApplicationError, TemporalTimeoutError)

# Every activity the remediation calls: the declarations this module imports (it imports none
# it does not call: lint). The worker refuses to start without one of them.
REQUIRED_ACTIVITIES = declared_in(globals())


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

    async def load_runbooks(self) -> RunbookSet:
        return await self._local(LOAD_RUNBOOKS, None, "load runbooks")

    async def resolve_device(self, inp: ResolveDeviceInput) -> ResolvedDevice:
        return await self._local(RESOLVE_DEVICE, inp, "resolve")

    async def gather_evidence(self, inp: EvidenceInput) -> Evidence:
        return await self._local(GATHER_EVIDENCE, inp, "gather evidence")

    async def find_consumers(self, inp: FindConsumersInput) -> ConsumersResult:
        return await self._local(FIND_CONSUMERS, inp, "find consumers")

    async def count_devices(self, inp: CountDevicesInput) -> DeviceCounts:
        return await self._local(COUNT_DEVICES, inp, "count devices")

    async def acquire_budget(self, inp: BudgetLeaseRequest) -> BudgetDecision:
        return await self._local(ACQUIRE_BUDGET_LEASE, inp, "acquire budget lease", budget=True)

    async def release_budget(
        self, inp: BudgetReleaseRequest, label: str = "release budget lease"
    ) -> BudgetDecision:
        return await self._local(RELEASE_BUDGET_LEASE, inp, label, budget=True)

    async def quarantine(self, inp: QuarantineInput, label: str) -> QuarantineResult:
        return await self._local(QUARANTINE_DEVICE, inp, label)

    async def preview_quarantine(self, inp: QuarantineInput) -> QuarantineResult:
        return await self._local(PREVIEW_QUARANTINE, inp, "preview quarantine")

    async def release_quarantine(self, inp: ReleaseInput) -> ReleaseResult:
        return await self._local(RELEASE_QUARANTINE, inp, "release quarantine")

    async def cordon(self, inp: CordonInput, label: str) -> CordonResult:
        return await self._local(CORDON_NODE, inp, label)

    async def karpenter_capacity(self, inp: KarpenterInput, label: str) -> KarpenterResult:
        return await self._local(KARPENTER_CAPACITY, inp, label)

    async def check_health(self, inp: CheckHealthInput) -> HealthResult:
        return await self._local(CHECK_DEVICE_HEALTH, inp, "check health")

    async def record_event(self, inp: RecordEventInput, label: str) -> None:
        await self._local(RECORD_EVENT, inp, label)

    async def signal_with_start(self, inp: LaunchRequest) -> LaunchResult:
        return await self._local(SIGNAL_WITH_START_REMEDIATION, inp, "hand over")

    # The GPU ledger's updates retry a refused update inside the activity, as the lease's do.
    async def record_gpu_failure(self, inp: RecordFailureInput) -> LedgerDecision:
        return await self._local(RECORD_GPU_FAILURE, inp, "record GPU failure", budget=True)

    async def record_gpu_repair(self, inp: RecordRepairInput) -> LedgerDecision:
        return await self._local(RECORD_GPU_REPAIR, inp, "record GPU repair", budget=True)

    # ------------------------------------------------------------ regular activities -------

    async def evict_pods(self, inp: EvictPodsInput) -> EvictPodsResult:
        # The activity retries what a PodDisruptionBudget refuses for `retry_blocked_for`.
        return await self._activity(
            EVICT_PODS,
            inp,
            start_to_close=EVICT_TIMEOUT + (inp.retry_blocked_for or timedelta(0)),
            heartbeat=EVICT_HEARTBEAT,
            retry=WAIT_RETRY,
        )

    async def wait_eviction(self, inp: WaitEvictionInput) -> EvictionReport:
        return await self._activity(
            WAIT_FOR_EVICTION,
            inp,
            start_to_close=inp.timeout + WAIT_MARGIN,
            heartbeat=WAIT_HEARTBEAT,
            retry=WAIT_RETRY,
        )

    async def wait_replacement(
        self, inp: WaitReplacementInput, limit: timedelta
    ) -> ReplacementReport:
        """The deadline-free watch (the workflow's deadline timer cancels it), or with
        `look_once` one look; `limit`: the longest the wait may still last (extensions
        included), so the watch never times out before the timer fires."""
        return await self._activity(
            WAIT_FOR_REPLACEMENT,
            inp,
            start_to_close=LOOK_TIMEOUT if inp.look_once else limit + WAIT_MARGIN,
            heartbeat=None if inp.look_once else WAIT_HEARTBEAT,
            retry=WAIT_RETRY,
            # Cancelled at the deadline without waiting for it to stop (TRY_CANCEL, the
            # default): the watch only reads, so the look at the pods and the scale-up or
            # escalation start when the timer fires, not when the cancel reaches the watch
            # with its next heartbeat (up to 48 s later).
        )

    async def request_capacity(self, inp: CapacityRequest) -> CapacityResult:
        return await self._activity(
            REQUEST_CAPACITY,
            inp,
            start_to_close=CAPACITY_TIMEOUT,
            heartbeat=CAPACITY_HEARTBEAT,
            retry=CAPACITY_RETRY,
        )

    async def notify(self, inp: NotifyInput) -> NotifyResult:
        # Not interrupted by an abort: a page already on its way is delivered (or resolved).
        return await self._activity(
            SEND_NOTIFICATION,
            inp,
            start_to_close=NOTIFY_TIMEOUT,
            retry=NOTIFY_RETRY,
            interruptible=False,
        )

    async def claim_escalation(self, inp: EscalationClaim) -> EscalationClaimResult:
        return await self._activity(
            CLAIM_ESCALATION,
            inp,
            start_to_close=CLAIM_TIMEOUT,
            retry=CLAIM_RETRY,
            interruptible=False,
        )

    # ------------------------------------------------------------ repair rungs --------------

    async def find_reset_group(self, inp: ResetGroupInput) -> ResetGroupResult:
        return await self._repair(FIND_RESET_GROUP, inp)

    async def find_drain_pods(self, inp: DrainPodsInput) -> DrainPodsResult:
        return await self._repair(FIND_DRAIN_PODS, inp)

    async def check_gpu_holders(self, inp: GpuHoldersInput, limit: timedelta) -> GpuHoldersResult:
        return await self._repair(CHECK_GPU_HOLDERS, inp, poll=limit)

    async def start_reset_job(self, inp: RepairJobInput) -> RepairJobStarted:
        return await self._repair(START_RESET_JOB, inp)

    async def start_validation_job(self, inp: ValidationJobInput) -> RepairJobStarted:
        return await self._repair(START_VALIDATION_JOB, inp)

    async def wait_for_repair_job(
        self, inp: WaitRepairJobInput, limit: timedelta
    ) -> RepairJobOutcome:
        return await self._repair(WAIT_FOR_REPAIR_JOB, inp, poll=limit)

    async def clean_up_repair_job(self, inp: CleanUpRepairJobInput) -> None:
        await self._repair(CLEAN_UP_REPAIR_JOB, inp)

    async def reboot_node(self, inp: MachineActionInput) -> MachineActionResult:
        return await self._machine(REBOOT_NODE, inp)

    async def replace_node(self, inp: MachineActionInput) -> MachineActionResult:
        return await self._machine(REPLACE_NODE, inp)

    async def verify_actor(self, check: ActorCheck) -> ActorVerdict:
        # Called from a signal/update handler: never raises Aborted (an abort in flight must
        # not fail the handler); a pure HMAC check, so LOCAL_TIMEOUT/LOCAL_RETRY are ample.
        return await execute_local(
            VERIFY_ACTOR,
            check,
            start_to_close_timeout=LOCAL_TIMEOUT,
            retry_policy=LOCAL_RETRY,
            summary=f"verify {check.action} by {check.actor.user}",
        )

    async def wait_for_node_gpus(self, inp: WaitNodeGpusInput, limit: timedelta) -> NodeGpusResult:
        return await self._repair(WAIT_FOR_NODE_GPUS, inp, poll=limit)

    async def _repair(self, decl: Activity[I, R], arg: I, poll: timedelta | None = None) -> R:
        if self._state.abort is not None:
            raise Aborted()
        call = execute(
            decl,
            arg,
            start_to_close_timeout=POLL_CALL_TIMEOUT if poll else REPAIR_CALL_TIMEOUT,
            schedule_to_close_timeout=poll,
            retry_policy=POLL_RETRY if poll else REPAIR_CALL_RETRY,
            summary=decl.name,
        )
        return await self._race(call)

    async def _machine(
        self, decl: Activity[MachineActionInput, MachineActionResult], inp: MachineActionInput
    ) -> MachineActionResult:
        # Not interrupted by an abort once asked: the request's answer (or its failure) is
        # recorded in the timeline, never left unknown.
        return await execute(
            decl,
            inp,
            start_to_close_timeout=MACHINE_TIMEOUT,
            heartbeat_timeout=MACHINE_HEARTBEAT,
            retry_policy=MACHINE_RETRY,
            summary=f"{decl.name} {inp.node} (attempt {inp.attempt})",
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
                abandon(task)
        if not task.done() or task.cancelled():
            return None
        return task.result()

    # ------------------------------------------------------------ plumbing ------------------

    async def _local(self, decl: Activity[I, R], arg: I, label: str, budget: bool = False) -> R:
        if self._state.abort is not None and not self._state.undoing:
            raise Aborted()
        return await execute_local(
            decl,
            arg,
            start_to_close_timeout=BUDGET_TIMEOUT if budget else LOCAL_TIMEOUT,
            retry_policy=BUDGET_RETRY if budget else LOCAL_RETRY,
            summary=label,
        )

    async def _activity(
        self,
        decl: Activity[I, R],
        arg: I,
        *,
        start_to_close: timedelta,
        retry: RetryPolicy,
        heartbeat: timedelta | None = None,
        interruptible: bool = True,
        cancellation: workflow.ActivityCancellationType = (
            workflow.ActivityCancellationType.TRY_CANCEL
        ),
    ) -> R:
        interruptible = interruptible and not self._state.undoing
        if interruptible and self._state.abort is not None:
            raise Aborted()
        call = execute(
            decl,
            arg,
            start_to_close_timeout=start_to_close,
            heartbeat_timeout=heartbeat,
            retry_policy=retry,
            cancellation_type=cancellation,
            summary=decl.name,
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
            abandon(task)
            await workflow.wait([task])  # until it stopped, per its cancellation type
            raise
        if task.done():
            stop.cancel()
            return task.result()
        abandon(task)
        raise Aborted()
