"""Typed activity calls of the node incident: one method per activity (input model -> result
model, with its timeout and retry policy in one place), and REQUIRED_ACTIVITIES, which the
worker checks at start. The rungs reuse the remediation's activities by name (budget lease,
reboot / replace, validation Jobs, Events, notifications): nothing of theirs is copied."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from datetime import timedelta
from typing import Any, TypeVar

from temporalio import workflow
from temporalio.common import RetryPolicy

with workflow.unsafe.imports_passed_through():
    from contract.budget import BudgetDecision, BudgetLeaseRequest, BudgetReleaseRequest
    from contract.capacity import CapacityRequest, CapacityResult
    from contract.errors import ERR_CHANNEL_REJECTED, ERR_CONFIG, ERR_INVALID_INPUT
    from contract.kube import (
        CordonInput,
        CordonResult,
        CountDevicesInput,
        DeviceCounts,
        EvictionReport,
        EvictPodsInput,
        EvictPodsResult,
        RecordEventInput,
        ReplacementReport,
        WaitEvictionInput,
        WaitReplacementInput,
    )
    from contract.names import (
        ACT_ACQUIRE_BUDGET,
        ACT_CLEAN_UP_REPAIR_JOB,
        ACT_CONTAIN_NODE,
        ACT_CORDON,
        ACT_COUNT_DEVICES,
        ACT_DIAGNOSE_NODE,
        ACT_EVICT_PODS,
        ACT_FIND_DRAIN_PODS,
        ACT_FIND_GPU_PODS,
        ACT_LOAD_RUNBOOKS,
        ACT_NOTIFY,
        ACT_REBOOT_NODE,
        ACT_RECORD_EVENT,
        ACT_RELEASE_BUDGET,
        ACT_RELEASE_NODE,
        ACT_REPLACE_NODE,
        ACT_REQUEST_CAPACITY,
        ACT_RESTART_GPU_PLUGIN,
        ACT_START_VALIDATION_JOB,
        ACT_WAIT_EVICTION,
        ACT_WAIT_GPUS_BACK,
        ACT_WAIT_NODE_GPUS,
        ACT_WAIT_REPAIR_JOB,
        ACT_WAIT_REPLACEMENT,
    )
    from contract.node_incident import (
        ContainNodeInput,
        ContainNodeResult,
        DiagnoseNodeInput,
        GpuPodsInput,
        GpuPodsResult,
        GpusBackResult,
        NodeDiagnosis,
        ReleaseNodeInput,
        RestartPluginInput,
        RestartPluginResult,
        WaitGpusBackInput,
    )
    from contract.notify import NotifyInput, NotifyResult
    from contract.repair import (
        CleanUpRepairJobInput,
        DrainPodsInput,
        DrainPodsResult,
        MachineActionInput,
        MachineActionResult,
        NodeGpusResult,
        RepairJobOutcome,
        RepairJobStarted,
        ValidationJobInput,
        WaitNodeGpusInput,
        WaitRepairJobInput,
    )
    from contract.runbook import RunbookSet

T = TypeVar("T")
F = TypeVar("F", bound=Callable[..., Awaitable[Any]])

# One Kubernetes or Temporal request each (diagnosis: a handful of LISTs). 30 s covers a slow
# API server; 5 attempts with backoff up to 10 s ride out an API-server restart, then the step
# counts as failed and the incident escalates with what it knows.
CALL_TIMEOUT = timedelta(seconds=30)
CALL_RETRY = RetryPolicy(
    initial_interval=timedelta(seconds=1),
    backoff_coefficient=2.0,
    maximum_interval=timedelta(seconds=10),
    maximum_attempts=5,
    non_retryable_error_types=[ERR_INVALID_INPUT],
)
# Polls (GPUs back, a validation Job ended, a rebooted node back): the activity answers a
# retryable StillWaiting until done, so the retry policy is the poll, every 2 s (a restarted
# plugin registers within seconds), bounded by the rung's timeout as schedule_to_close.
POLL_CALL_TIMEOUT = timedelta(seconds=30)
POLL_RETRY = RetryPolicy(initial_interval=timedelta(seconds=2), backoff_coefficient=1.0)
# A reboot / replace request: one provider call, asked once per attempt (its key), so a lost
# answer is retried without asking twice; as the remediation's rung.
MACHINE_TIMEOUT = timedelta(minutes=2)
MACHINE_RETRY = RetryPolicy(
    initial_interval=timedelta(seconds=5),
    backoff_coefficient=2.0,
    maximum_interval=timedelta(minutes=1),
    maximum_attempts=5,
    non_retryable_error_types=[ERR_CONFIG, ERR_INVALID_INPUT],
)
# The plugin restart: a pod list, a node patch, a delete or two. 15 s: a worker killed mid-way
# is retried elsewhere soon, and the retry deletes only the pods this attempt chose.
RESTART_TIMEOUT = timedelta(seconds=15)
# A page: retried for about a minute; a configuration error or a rejecting channel is final.
NOTIFY_TIMEOUT = timedelta(seconds=30)
NOTIFY_RETRY = RetryPolicy(
    initial_interval=timedelta(seconds=2),
    maximum_attempts=6,
    non_retryable_error_types=[ERR_CONFIG, ERR_CHANNEL_REJECTED],
)
# Eviction for a reboot / replace drain: the activity retries PDB refusals itself.
EVICT_TIMEOUT = timedelta(minutes=15)
EVICT_HEARTBEAT = timedelta(seconds=30)

# Following the evicted workloads' replacements, as the remediation does: the watch
# heartbeats (a dead worker is noticed within a minute); it has no deadline of its own, the
# workflow's timer cancels it (TRY_CANCEL, not waited for: it only reads), so its timeout is
# the deadline plus a margin. One look when the timer fires: a list and a few reads.
WAIT_HEARTBEAT = timedelta(seconds=60)
WAIT_MARGIN = timedelta(minutes=2)
LOOK_TIMEOUT = timedelta(minutes=1)
WAIT_RETRY = RetryPolicy(
    initial_interval=timedelta(seconds=5),
    backoff_coefficient=2.0,
    maximum_interval=timedelta(seconds=30),
    maximum_attempts=3,
)
# A capacity request: the pool scaler may hold the call while it batches needs and follows
# the provider's operation (15 min, heartbeats every 10 s, noticed dead after 45 s); a retry
# re-attaches to the same request (its key), so nothing is asked twice. Four attempts (as the
# remediation's), then the incident's page says the scale-up failed.
CAPACITY_TIMEOUT = timedelta(minutes=15)
CAPACITY_HEARTBEAT = timedelta(seconds=45)
CAPACITY_RETRY = RetryPolicy(
    initial_interval=timedelta(seconds=10),
    backoff_coefficient=2.0,
    maximum_interval=timedelta(minutes=1),
    maximum_attempts=4,
)

REQUIRED_ACTIVITIES: list[str] = []


def calls(name: str) -> Callable[[F], F]:
    def mark(fn: F) -> F:
        REQUIRED_ACTIVITIES.append(name)
        return fn

    return mark


async def _call(
    name: str,
    arg: Any,
    result_type: type[T],
    *,
    start_to_close: timedelta = CALL_TIMEOUT,
    retry: RetryPolicy = CALL_RETRY,
    limit: timedelta | None = None,
    heartbeat: timedelta | None = None,
) -> T:
    args = [] if arg is None else [arg]
    return await workflow.execute_activity(
        name,
        args=args,
        start_to_close_timeout=start_to_close,
        schedule_to_close_timeout=limit,
        heartbeat_timeout=heartbeat,
        retry_policy=retry,
        result_type=result_type,
    )


class NodeCalls:
    @calls(ACT_LOAD_RUNBOOKS)
    async def load_runbooks(self) -> RunbookSet:
        return await _call(ACT_LOAD_RUNBOOKS, None, RunbookSet)

    @calls(ACT_DIAGNOSE_NODE)
    async def diagnose(self, inp: DiagnoseNodeInput) -> NodeDiagnosis:
        return await _call(ACT_DIAGNOSE_NODE, inp, NodeDiagnosis)

    @calls(ACT_CONTAIN_NODE)
    async def contain(self, inp: ContainNodeInput) -> ContainNodeResult:
        return await _call(ACT_CONTAIN_NODE, inp, ContainNodeResult)

    @calls(ACT_RELEASE_NODE)
    async def release(self, inp: ReleaseNodeInput) -> ContainNodeResult:
        return await _call(ACT_RELEASE_NODE, inp, ContainNodeResult)

    @calls(ACT_RESTART_GPU_PLUGIN)
    async def restart_plugin(self, inp: RestartPluginInput) -> RestartPluginResult:
        return await _call(
            ACT_RESTART_GPU_PLUGIN, inp, RestartPluginResult, start_to_close=RESTART_TIMEOUT
        )

    @calls(ACT_WAIT_GPUS_BACK)
    async def wait_gpus_back(self, inp: WaitGpusBackInput, limit: timedelta) -> GpusBackResult:
        return await _call(
            ACT_WAIT_GPUS_BACK,
            inp,
            GpusBackResult,
            start_to_close=POLL_CALL_TIMEOUT,
            retry=POLL_RETRY,
            limit=limit,
        )

    @calls(ACT_FIND_GPU_PODS)
    async def find_gpu_pods(self, inp: GpuPodsInput) -> GpuPodsResult:
        return await _call(ACT_FIND_GPU_PODS, inp, GpuPodsResult)

    @calls(ACT_RECORD_EVENT)
    async def record_event(self, inp: RecordEventInput) -> None:
        await _call(ACT_RECORD_EVENT, inp, type(None))

    @calls(ACT_NOTIFY)
    async def notify(self, inp: NotifyInput) -> NotifyResult:
        return await _call(
            ACT_NOTIFY, inp, NotifyResult, start_to_close=NOTIFY_TIMEOUT, retry=NOTIFY_RETRY
        )

    @calls(ACT_COUNT_DEVICES)
    async def count_devices(self, inp: CountDevicesInput) -> DeviceCounts:
        return await _call(ACT_COUNT_DEVICES, inp, DeviceCounts)

    @calls(ACT_ACQUIRE_BUDGET)
    async def acquire_budget(self, inp: BudgetLeaseRequest) -> BudgetDecision:
        return await _call(ACT_ACQUIRE_BUDGET, inp, BudgetDecision)

    @calls(ACT_RELEASE_BUDGET)
    async def release_budget(self, inp: BudgetReleaseRequest) -> BudgetDecision:
        return await _call(ACT_RELEASE_BUDGET, inp, BudgetDecision)

    @calls(ACT_CORDON)
    async def cordon(self, inp: CordonInput) -> CordonResult:
        return await _call(ACT_CORDON, inp, CordonResult)

    @calls(ACT_FIND_DRAIN_PODS)
    async def find_drain_pods(self, inp: DrainPodsInput) -> DrainPodsResult:
        return await _call(ACT_FIND_DRAIN_PODS, inp, DrainPodsResult)

    @calls(ACT_EVICT_PODS)
    async def evict_pods(self, inp: EvictPodsInput) -> EvictPodsResult:
        return await _call(
            ACT_EVICT_PODS,
            inp,
            EvictPodsResult,
            start_to_close=EVICT_TIMEOUT,
            heartbeat=EVICT_HEARTBEAT,
        )

    @calls(ACT_WAIT_EVICTION)
    async def wait_eviction(self, inp: WaitEvictionInput) -> EvictionReport:
        return await _call(
            ACT_WAIT_EVICTION,
            inp,
            EvictionReport,
            start_to_close=inp.timeout + timedelta(minutes=1),
            heartbeat=EVICT_HEARTBEAT,
        )

    @calls(ACT_REBOOT_NODE)
    async def reboot_node(self, inp: MachineActionInput) -> MachineActionResult:
        return await _call(
            ACT_REBOOT_NODE,
            inp,
            MachineActionResult,
            start_to_close=MACHINE_TIMEOUT,
            retry=MACHINE_RETRY,
        )

    @calls(ACT_REPLACE_NODE)
    async def replace_node(self, inp: MachineActionInput) -> MachineActionResult:
        return await _call(
            ACT_REPLACE_NODE,
            inp,
            MachineActionResult,
            start_to_close=MACHINE_TIMEOUT,
            retry=MACHINE_RETRY,
        )

    @calls(ACT_WAIT_NODE_GPUS)
    async def wait_node_gpus(self, inp: WaitNodeGpusInput, limit: timedelta) -> NodeGpusResult:
        return await _call(
            ACT_WAIT_NODE_GPUS,
            inp,
            NodeGpusResult,
            start_to_close=POLL_CALL_TIMEOUT,
            retry=POLL_RETRY,
            limit=limit,
        )

    @calls(ACT_START_VALIDATION_JOB)
    async def start_validation(self, inp: ValidationJobInput) -> RepairJobStarted:
        return await _call(ACT_START_VALIDATION_JOB, inp, RepairJobStarted)

    @calls(ACT_WAIT_REPAIR_JOB)
    async def wait_job(self, inp: WaitRepairJobInput, limit: timedelta) -> RepairJobOutcome:
        return await _call(
            ACT_WAIT_REPAIR_JOB,
            inp,
            RepairJobOutcome,
            start_to_close=POLL_CALL_TIMEOUT,
            retry=POLL_RETRY,
            limit=limit,
        )

    @calls(ACT_CLEAN_UP_REPAIR_JOB)
    async def clean_up_job(self, inp: CleanUpRepairJobInput) -> None:
        await _call(ACT_CLEAN_UP_REPAIR_JOB, inp, type(None))

    @calls(ACT_WAIT_REPLACEMENT)
    async def wait_replacement(
        self, inp: WaitReplacementInput, limit: timedelta
    ) -> ReplacementReport:
        """The deadline-free watch (the workflow's timer cancels it), or with `look_once` one
        look; `limit`: the longest the wait may last, so the watch never times out first."""
        return await _call(
            ACT_WAIT_REPLACEMENT,
            inp,
            ReplacementReport,
            start_to_close=LOOK_TIMEOUT if inp.look_once else limit + WAIT_MARGIN,
            heartbeat=None if inp.look_once else WAIT_HEARTBEAT,
            retry=WAIT_RETRY,
        )

    @calls(ACT_REQUEST_CAPACITY)
    async def request_capacity(self, inp: CapacityRequest) -> CapacityResult:
        return await _call(
            ACT_REQUEST_CAPACITY,
            inp,
            CapacityResult,
            start_to_close=CAPACITY_TIMEOUT,
            heartbeat=CAPACITY_HEARTBEAT,
            retry=CAPACITY_RETRY,
        )
