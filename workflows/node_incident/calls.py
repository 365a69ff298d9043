"""Typed activity calls of the node incident: one method per activity (input model -> result
model, with its timeout and retry policy in one place), each through the activity's declaration
(`contract.activity.Activity`), and REQUIRED_ACTIVITIES (the declarations imported here), which
the worker checks at start. The rungs reuse the remediation's activities by name (budget lease,
reboot / replace, validation Jobs, Events, notifications): nothing of theirs is copied."""

from __future__ import annotations

from datetime import timedelta
from typing import TypeVar

from temporalio import workflow
from temporalio.common import RetryPolicy

with workflow.unsafe.imports_passed_through():
    from contract.activity import Activity, declared_in
    from contract.budget import (
        ACQUIRE_BUDGET_LEASE,
        RELEASE_BUDGET_LEASE,
        BudgetDecision,
        BudgetLeaseRequest,
        BudgetReleaseRequest,
    )
    from contract.capacity import REQUEST_CAPACITY, CapacityRequest, CapacityResult
    from contract.errors import ERR_CHANNEL_REJECTED, ERR_CONFIG, ERR_INVALID_INPUT
    from contract.failover import PROVIDER_HEARTBEAT
    from contract.kube import (
        CORDON_NODE,
        COUNT_DEVICES,
        EVICT_PODS,
        RECORD_EVENT,
        WAIT_FOR_EVICTION,
        WAIT_FOR_REPLACEMENT,
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
    from contract.node_incident import (
        CONTAIN_NODE_GPUS,
        DIAGNOSE_NODE_GPUS,
        FIND_GPU_PODS_ON_NODE,
        RELEASE_NODE_GPUS,
        RESTART_GPU_PLUGIN,
        WAIT_FOR_GPUS_BACK,
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
    from contract.notify import SEND_NOTIFICATION, NotifyInput, NotifyResult
    from contract.repair_rungs import (
        CLEAN_UP_REPAIR_JOB,
        FIND_DRAIN_PODS,
        REBOOT_NODE,
        REPLACE_NODE,
        START_VALIDATION_JOB,
        WAIT_FOR_NODE_GPUS,
        WAIT_FOR_REPAIR_JOB,
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
    from workflows.execute import execute

I = TypeVar("I")  # noqa: E741 - an activity's input model, as in Activity[I, R]
R = TypeVar("R")

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
MACHINE_HEARTBEAT = PROVIDER_HEARTBEAT  # it heartbeats while it asks (contract/failover.py)
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

# Following the evicted workloads' replacements and asking for capacity as the remediation
# does, with its options (workflows/call_options.py): the watch heartbeats; it has no deadline
# of its own, the workflow's timer cancels it (TRY_CANCEL, not waited for: it only reads).

# Every activity the node incident calls: the declarations this module imports (it imports
# none it does not call: lint). The worker refuses to start without one of them.
REQUIRED_ACTIVITIES = declared_in(globals())


async def _call(
    decl: Activity[I, R],
    arg: I,
    *,
    start_to_close: timedelta = CALL_TIMEOUT,
    retry: RetryPolicy = CALL_RETRY,
    limit: timedelta | None = None,
    heartbeat: timedelta | None = None,
) -> R:
    return await execute(
        decl,
        arg,
        start_to_close_timeout=start_to_close,
        schedule_to_close_timeout=limit,
        heartbeat_timeout=heartbeat,
        retry_policy=retry,
    )


class NodeCalls:
    async def load_runbooks(self) -> RunbookSet:
        return await _call(LOAD_RUNBOOKS, None)

    async def diagnose(self, inp: DiagnoseNodeInput) -> NodeDiagnosis:
        return await _call(DIAGNOSE_NODE_GPUS, inp)

    async def contain(self, inp: ContainNodeInput) -> ContainNodeResult:
        return await _call(CONTAIN_NODE_GPUS, inp)

    async def release(self, inp: ReleaseNodeInput) -> ContainNodeResult:
        return await _call(RELEASE_NODE_GPUS, inp)

    async def restart_plugin(self, inp: RestartPluginInput) -> RestartPluginResult:
        return await _call(RESTART_GPU_PLUGIN, inp, start_to_close=RESTART_TIMEOUT)

    async def wait_gpus_back(self, inp: WaitGpusBackInput, limit: timedelta) -> GpusBackResult:
        return await _call(
            WAIT_FOR_GPUS_BACK,
            inp,
            start_to_close=POLL_CALL_TIMEOUT,
            retry=POLL_RETRY,
            limit=limit,
        )

    async def find_gpu_pods(self, inp: GpuPodsInput) -> GpuPodsResult:
        return await _call(FIND_GPU_PODS_ON_NODE, inp)

    async def record_event(self, inp: RecordEventInput) -> None:
        await _call(RECORD_EVENT, inp)

    async def notify(self, inp: NotifyInput) -> NotifyResult:
        return await _call(
            SEND_NOTIFICATION, inp, start_to_close=NOTIFY_TIMEOUT, retry=NOTIFY_RETRY
        )

    async def count_devices(self, inp: CountDevicesInput) -> DeviceCounts:
        return await _call(COUNT_DEVICES, inp)

    async def acquire_budget(self, inp: BudgetLeaseRequest) -> BudgetDecision:
        return await _call(ACQUIRE_BUDGET_LEASE, inp)

    async def release_budget(self, inp: BudgetReleaseRequest) -> BudgetDecision:
        return await _call(RELEASE_BUDGET_LEASE, inp)

    async def cordon(self, inp: CordonInput) -> CordonResult:
        return await _call(CORDON_NODE, inp)

    async def find_drain_pods(self, inp: DrainPodsInput) -> DrainPodsResult:
        return await _call(FIND_DRAIN_PODS, inp)

    async def evict_pods(self, inp: EvictPodsInput) -> EvictPodsResult:
        return await _call(
            EVICT_PODS,
            inp,
            start_to_close=EVICT_TIMEOUT,
            heartbeat=EVICT_HEARTBEAT,
        )

    async def wait_eviction(self, inp: WaitEvictionInput) -> EvictionReport:
        return await _call(
            WAIT_FOR_EVICTION,
            inp,
            start_to_close=inp.timeout + timedelta(minutes=1),
            heartbeat=EVICT_HEARTBEAT,
        )

    async def reboot_node(self, inp: MachineActionInput) -> MachineActionResult:
        return await _call(
            REBOOT_NODE,
            inp,
            start_to_close=MACHINE_TIMEOUT,
            heartbeat=MACHINE_HEARTBEAT,
            retry=MACHINE_RETRY,
        )

    async def replace_node(self, inp: MachineActionInput) -> MachineActionResult:
        return await _call(
            REPLACE_NODE,
            inp,
            start_to_close=MACHINE_TIMEOUT,
            heartbeat=MACHINE_HEARTBEAT,
            retry=MACHINE_RETRY,
        )

    async def wait_node_gpus(self, inp: WaitNodeGpusInput, limit: timedelta) -> NodeGpusResult:
        return await _call(
            WAIT_FOR_NODE_GPUS,
            inp,
            start_to_close=POLL_CALL_TIMEOUT,
            retry=POLL_RETRY,
            limit=limit,
        )

    async def start_validation(self, inp: ValidationJobInput) -> RepairJobStarted:
        return await _call(START_VALIDATION_JOB, inp)

    async def wait_job(self, inp: WaitRepairJobInput, limit: timedelta) -> RepairJobOutcome:
        return await _call(
            WAIT_FOR_REPAIR_JOB,
            inp,
            start_to_close=POLL_CALL_TIMEOUT,
            retry=POLL_RETRY,
            limit=limit,
        )

    async def clean_up_job(self, inp: CleanUpRepairJobInput) -> None:
        await _call(CLEAN_UP_REPAIR_JOB, inp)

    async def wait_replacement(
        self, inp: WaitReplacementInput, limit: timedelta
    ) -> ReplacementReport:
        """The deadline-free watch (the workflow's timer cancels it), or with `look_once` one
        look; `limit`: the longest the wait may last, so the watch never times out first."""
        return await _call(
            WAIT_FOR_REPLACEMENT,
            inp,
            start_to_close=LOOK_TIMEOUT if inp.look_once else limit + WAIT_MARGIN,
            heartbeat=None if inp.look_once else WAIT_HEARTBEAT,
            retry=WAIT_RETRY,
        )

    async def request_capacity(self, inp: CapacityRequest) -> CapacityResult:
        return await _call(
            REQUEST_CAPACITY,
            inp,
            start_to_close=CAPACITY_TIMEOUT,
            heartbeat=CAPACITY_HEARTBEAT,
            retry=CAPACITY_RETRY,
        )
