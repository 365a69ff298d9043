"""The node incident workflow (`sickbay-node-incident`) on the time-skipping server with fake
activities (the node ladder's own and the remediation's it reuses, by name).

Cases:
- a plugin that lost its socket (restartable): diagnosed, contained (condition + taint), one
  GPUDevicesVanished Event, the plugin restarted once (attempt 1), the GPUs back after a few
  StillWaiting answers, each GPU validated -> released, GPUDevicesRestored, closed `healed`;
  no page;
- the toolkit hook fails (a restart cannot fix it): no restart at all, one page at once with
  the diagnosis, its GPU workload evicted within the budget (a lease for the node's GPUs),
  held contained; the GPUs come back (a fix by hand) -> validated, released, the page
  resolved, the lease given back; the budget refusing: the workloads stay, named;
- a restart that does not bring the GPUs back within gpusBackTimeout, reboot/replace off
  (repair disabled): exactly one restart, escalated, held; `abort` undoes the containment;
- a validation failure after the GPUs came back is no heal: escalated;
- pool incident: two other nodes of the pool lost their GPUs too -> one page whose id is the
  pool's and which names every node;
- dry run: diagnosed, nothing contained, nothing restarted; GPUs already back: `recovered`;
- the plugin Ready and the GPUs gone (a kubelet restart's first seconds): diagnosed again
  after `settle`; back by then -> `recovered`, nothing touched; a failing plugin pod is
  contained at once, without settling;
- the plugin pod starting (ContainerCreating, init containers: a node back from a reboot, a
  rollout): diagnosed again every `settle` while it starts, for up to `startGrace`; back ->
  `recovered`, nothing touched; still starting after it -> acted on as before, saying so;
  one that starts failing meanwhile -> contained at once;
- the MIG manager repartitioning the node (GPUs gone on purpose): diagnosed again every
  `plannedGrace` / 30 while it lasts; done and back -> `recovered`, nothing touched; done
  `failed` with the GPUs gone -> acted on as any vanish (a finding naming no planned work:
  looked at at once); still under way after `plannedGrace` -> one page and a Warning Event
  saying so, the node never touched, held open (hourly looks, no second page) until it is
  done: back -> `recovered`, the page resolved;
- the evicted workloads followed (the shared replacement race): their replacements Running
  on another node -> logged, the page left alone, held as before; still Pending at the
  Pending deadline with scaleUp on -> the budget lease extended to the node's GPUs, capacity
  asked of the node's pool (once, keyed), Running after it -> logged; still Pending with
  scale-up off -> the one page updated (same id, no second page) naming the Pending
  workload and the scheduler's words; the budget refusing the scale-up's lease -> nothing
  asked, the page says so; a pod without an owner -> said, nothing followed.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import logging
import uuid
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

import pytest
from temporalio import activity
from temporalio.client import Client
from temporalio.exceptions import ApplicationError
from temporalio.service import RPCError
from temporalio.testing import WorkflowEnvironment
from temporalio.worker import Worker

from contract.budget import BudgetDecision, BudgetLeaseRequest, BudgetReleaseRequest
from contract.capacity import CapacityRequest, CapacityResult
from contract.errors import ERR_STILL_WAITING
from contract.kube import (
    CordonInput,
    CordonResult,
    CountDevicesInput,
    DeviceCounts,
    EvictionReport,
    EvictPodsInput,
    EvictPodsResult,
    OwnerRef,
    PodRef,
    PodState,
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
    ACT_REQUEST_CAPACITY,
    ACT_RESTART_GPU_PLUGIN,
    ACT_START_VALIDATION_JOB,
    ACT_WAIT_EVICTION,
    ACT_WAIT_GPUS_BACK,
    ACT_WAIT_NODE_GPUS,
    ACT_WAIT_REPAIR_JOB,
    ACT_WAIT_REPLACEMENT,
    QRY_NODE_STATUS,
    QRY_TIMELINE,
    SIG_ABORT,
    SIG_NODE_FINDING,
    node_workflow_id,
)
from contract.node_incident import (
    ContainNodeInput,
    ContainNodeResult,
    DiagnoseNodeInput,
    GpuPodsInput,
    GpuPodsResult,
    GpusBackResult,
    NodeDiagnosis,
    NodeFinding,
    NodeIncidentInput,
    NodeIncidentResult,
    NodeIncidentStatus,
    PluginPod,
    ReleaseNodeInput,
    RestartPluginInput,
    RestartPluginResult,
    WaitGpusBackInput,
)
from contract.notify import NotifyInput, NotifyResult
from contract.remediation import AbortRequest
from contract.repair_rungs import (
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
from harness.stack import free_port
from tests.waiting import until
from tests.workflows.fakes import (
    result_skipping_watches,
    shipped_runbooks,
    watch_until_cancelled,
    without_repair,
)
from tests.workflows.histories import save_history, scheduled_heartbeats
from worker.converter import DATA_CONVERTER
from workflows.node_incident.workflow import NodeIncidentWorkflow

NODE = "gpu-node-3"
UUIDS = ["GPU-aaaa", "GPU-bbbb"]


def diagnosis(
    cause: str = "plugin-not-registered", restartable: bool = True, **kw: Any
) -> NodeDiagnosis:
    return NodeDiagnosis(
        node=NODE,
        node_pool="a100",
        mode="device-plugin",
        expected_gpus=2,
        capacity=0,
        allocatable=0,
        kubelet_version="v1.29.15",
        peers={"v1.28.15": 3},
        plugin_pods=[
            PluginPod(
                namespace="gpu-operator",
                name="nvidia-device-plugin-daemonset-x1",
                component="device-plugin",
                phase="Pending",
                waiting_reason="CreateContainerError" if cause == "toolkit-hook" else "",
                waiting_message="error executing hook /usr/bin/nvidia-container-toolkit"
                if cause == "toolkit-hook"
                else "",
                ready=cause != "toolkit-hook",
            )
        ],
        vanished=True,
        cause=cause,  # type: ignore[arg-type]
        restartable=restartable,
        summary=f"{cause}: the container toolkit hook fails on node {NODE} since its kubelet "
        "went from v1.28.15 to v1.29.15; 3 other nodes of the pool run v1.28.15",
        **kw,
    )


@dataclass
class World:
    diag: NodeDiagnosis = field(default_factory=diagnosis)
    # The diagnoses after the first, one per call (then `diag` again).
    later: list[NodeDiagnosis] = field(default_factory=list)
    waits_before_back: int = 2  # StillWaiting answers before the GPUs are back; -1: never
    validation_passes: bool = True
    runbooks: RunbookSet = field(
        default_factory=lambda: RunbookSet(runbooks=without_repair(shipped_runbooks()))
    )
    calls: list[tuple[str, Any]] = field(default_factory=list)
    waits: int = 0
    gpu_pods: list[PodRef] = field(
        default_factory=lambda: [PodRef(namespace="ml", name="trainer-0", uid="u1")]
    )
    owners: list[OwnerRef] = field(
        default_factory=lambda: [OwnerRef(kind="StatefulSet", name="trainer", namespace="ml")]
    )
    bare: list[PodRef] = field(default_factory=list)
    budget_grants: bool = True
    watching: bool = False
    heartbeats: int = 0
    watch_cancelled: int = 0
    stepping: bool = False
    # Budget grants per lease asked (by the GPUs asked); missing: `budget_grants`.
    grants_by_gpus: dict[int, bool] = field(default_factory=dict)
    # The replacements: Running elsewhere, or Pending (the watch never ends: the timer does);
    # `running_after_capacity`: Running once capacity was asked for.
    replacements: str = "running"
    running_after_capacity: bool = False
    capacity: CapacityResult = field(
        default_factory=lambda: CapacityResult(status="requested", current_size=3, target_size=4)
    )

    def names(self) -> list[str]:
        return [n for n, _ in self.calls]

    def of(self, name: str) -> list[Any]:
        return [a for n, a in self.calls if n == name]

    def activities(self) -> list[Callable[..., Any]]:
        w = self

        @activity.defn(name=ACT_LOAD_RUNBOOKS)
        async def load() -> RunbookSet:
            return w.runbooks

        @activity.defn(name=ACT_DIAGNOSE_NODE)
        async def diagnose(inp: DiagnoseNodeInput) -> NodeDiagnosis:
            first = not w.of(ACT_DIAGNOSE_NODE)
            w.calls.append((ACT_DIAGNOSE_NODE, inp))
            return w.later.pop(0) if w.later and not first else w.diag

        @activity.defn(name=ACT_CONTAIN_NODE)
        async def contain(inp: ContainNodeInput) -> ContainNodeResult:
            w.calls.append((ACT_CONTAIN_NODE, inp))
            return ContainNodeResult(changed=True, detail="condition, taint")

        @activity.defn(name=ACT_RELEASE_NODE)
        async def release(inp: ReleaseNodeInput) -> ContainNodeResult:
            w.calls.append((ACT_RELEASE_NODE, inp))
            return ContainNodeResult(changed=True, detail="undone")

        @activity.defn(name=ACT_RESTART_GPU_PLUGIN)
        async def restart(inp: RestartPluginInput) -> RestartPluginResult:
            w.calls.append((ACT_RESTART_GPU_PLUGIN, inp))
            return RestartPluginResult(restarted=["gpu-operator/p"], detail="deleted")

        @activity.defn(name=ACT_WAIT_GPUS_BACK)
        async def wait_back(inp: WaitGpusBackInput) -> GpusBackResult:
            w.calls.append((ACT_WAIT_GPUS_BACK, inp))
            w.waits += 1
            if w.waits_before_back < 0 or w.waits <= w.waits_before_back:
                raise ApplicationError("0 of 2 GPUs published", type=ERR_STILL_WAITING)
            return GpusBackResult(node=NODE, gpu_uuids=UUIDS, mode="device-plugin")

        @activity.defn(name=ACT_START_VALIDATION_JOB)
        async def start_validation(inp: ValidationJobInput) -> RepairJobStarted:
            w.calls.append((ACT_START_VALIDATION_JOB, inp))
            return RepairJobStarted(namespace="sickbay", job_name=f"v-{inp.gpu_uuid}", created=True)

        @activity.defn(name=ACT_WAIT_REPAIR_JOB)
        async def wait_job(inp: WaitRepairJobInput) -> RepairJobOutcome:
            w.calls.append((ACT_WAIT_REPAIR_JOB, inp))
            return RepairJobOutcome(
                passed=w.validation_passes, summary="Pass" if w.validation_passes else "Fail"
            )

        @activity.defn(name=ACT_CLEAN_UP_REPAIR_JOB)
        async def clean(inp: CleanUpRepairJobInput) -> None:
            w.calls.append((ACT_CLEAN_UP_REPAIR_JOB, inp))

        @activity.defn(name=ACT_RECORD_EVENT)
        async def event(inp: RecordEventInput) -> None:
            w.calls.append((ACT_RECORD_EVENT, inp))

        @activity.defn(name=ACT_NOTIFY)
        async def notify(inp: NotifyInput) -> NotifyResult:
            w.calls.append((ACT_NOTIFY, inp))
            return NotifyResult(channel=inp.channel, delivered=True)

        return [
            load,
            diagnose,
            contain,
            release,
            restart,
            wait_back,
            start_validation,
            wait_job,
            clean,
            event,
            notify,
            *w.relocation(),
        ]

    def relocation(self) -> list[Callable[..., Any]]:
        w = self

        @activity.defn(name=ACT_FIND_GPU_PODS)
        async def find_pods(inp: GpuPodsInput) -> GpuPodsResult:
            w.calls.append((ACT_FIND_GPU_PODS, inp))
            return GpuPodsResult(pods=w.gpu_pods, owners=w.owners, bare=w.bare)

        @activity.defn(name=ACT_COUNT_DEVICES)
        async def count(inp: CountDevicesInput) -> DeviceCounts:
            w.calls.append((ACT_COUNT_DEVICES, inp))
            return DeviceCounts(pool_devices=8, cluster_devices=16)

        @activity.defn(name=ACT_ACQUIRE_BUDGET)
        async def acquire(inp: BudgetLeaseRequest) -> BudgetDecision:
            w.calls.append((ACT_ACQUIRE_BUDGET, inp))
            granted = w.grants_by_gpus.get(inp.gpus, w.budget_grants)
            return BudgetDecision(granted=granted, reason="" if granted else "pool at 4 of 4")

        @activity.defn(name=ACT_RELEASE_BUDGET)
        async def release_budget(inp: BudgetReleaseRequest) -> BudgetDecision:
            w.calls.append((ACT_RELEASE_BUDGET, inp))
            return BudgetDecision(granted=True)

        @activity.defn(name=ACT_EVICT_PODS)
        async def evict(inp: EvictPodsInput) -> EvictPodsResult:
            w.calls.append((ACT_EVICT_PODS, inp))
            return EvictPodsResult(evicted=inp.pods)

        @activity.defn(name=ACT_WAIT_EVICTION)
        async def wait_evicted(inp: WaitEvictionInput) -> EvictionReport:
            w.calls.append((ACT_WAIT_EVICTION, inp))
            return EvictionReport(gone=inp.pods)

        @activity.defn(name=ACT_WAIT_REPLACEMENT)
        async def wait_replacement(inp: WaitReplacementInput) -> ReplacementReport:
            w.calls.append((ACT_WAIT_REPLACEMENT, inp))
            asked = bool(w.of(ACT_REQUEST_CAPACITY))
            if w.replacements == "running" or (asked and w.running_after_capacity):
                return ReplacementReport(
                    status="running",
                    pods=[
                        PodState(
                            pod=PodRef(namespace="ml", name="trainer-0", uid="u2"),
                            phase="Running",
                            node="gpu-node-7",
                        )
                    ],
                )
            pending = ReplacementReport(
                status="pending",
                pods=[
                    PodState(
                        pod=PodRef(namespace="ml", name="trainer-0", uid="u2"),
                        phase="Pending",
                        message="0/8 nodes are available: 8 Insufficient nvidia.com/gpu.",
                    )
                ],
                unschedulable_message="0/8 nodes are available: 8 Insufficient nvidia.com/gpu.",
            )
            if inp.look_once:
                return pending
            await watch_until_cancelled(w)  # the deadline timer cancels it
            return pending

        @activity.defn(name=ACT_REQUEST_CAPACITY)
        async def request_capacity(inp: CapacityRequest) -> CapacityResult:
            w.calls.append((ACT_REQUEST_CAPACITY, inp))
            return w.capacity

        return [
            find_pods,
            count,
            acquire,
            release_budget,
            evict,
            wait_evicted,
            wait_replacement,
            request_capacity,
        ]


async def run(
    env: WorkflowEnvironment,
    world: World,
    *,
    dry_run: bool = False,
    then: Any = None,
    history: str | None = None,
    planned: str = "",
) -> NodeIncidentResult:
    client: Client = env.client
    tq = f"tq-{uuid.uuid4()}"
    async with Worker(
        client,
        task_queue=tq,
        workflows=[NodeIncidentWorkflow],
        activities=world.activities(),
        # Heartbeats reach the server at once: the watch hears of its cancellation within
        # milliseconds, so the test stops moving time as the workflow moves on.
        max_heartbeat_throttle_interval=timedelta(milliseconds=20),
    ):
        handle = await client.start_workflow(
            NodeIncidentWorkflow.run,
            NodeIncidentInput(
                node=NODE,
                trigger="watch",
                reason="capacity 0 < 2",
                dry_run=dry_run,
                planned=planned,
            ),
            id=node_workflow_id(NODE),
            task_queue=tq,
        )
        try:
            if then is not None:
                await then(handle)
            result = await result_skipping_watches(env, handle, world)
        except BaseException:
            # Every test's incident has the node's one id in the module's shared server: a
            # failed test must not leave its run open for the next test's start to collide with.
            with contextlib.suppress(RPCError):
                await handle.terminate("the test failed")
            raise
        if history is not None:  # recorded for the replay tests (tests/histories/)
            save_history(history, await handle.fetch_history())
        return result


def reasons(world: World) -> list[str]:
    return [e.reason for e in world.of(ACT_RECORD_EVENT)]


async def test_restartable_cause_is_healed_by_one_plugin_restart(
    time_skipping_env: WorkflowEnvironment,
) -> None:
    world = World()
    result = await run(time_skipping_env, world, history="node_incident_restart_healed")
    assert result.outcome == "healed" and result.rung == "restart-plugin"
    [restart] = world.of(ACT_RESTART_GPU_PLUGIN)
    assert restart.attempt == 1 and restart.workflow_id.startswith(node_workflow_id(NODE) + "/")
    [contain] = world.of(ACT_CONTAIN_NODE)
    assert contain.mode == "taint" and contain.reason == "PluginNotRegistered"
    assert contain.message == world.diag.summary
    assert [v.gpu_uuid for v in world.of(ACT_START_VALIDATION_JOB)] == UUIDS
    assert all(
        v.taint_key == "sickbay.dev/gpus-vanished" for v in world.of(ACT_START_VALIDATION_JOB)
    )
    assert len(world.of(ACT_CLEAN_UP_REPAIR_JOB)) == 2
    assert reasons(world) == ["GPUDevicesVanished", "GPUDevicesRestored"]
    assert world.of(ACT_NOTIFY) == []
    assert len(world.of(ACT_RELEASE_NODE)) == 1
    # The release comes after the validations.
    names = world.names()
    assert names.index(ACT_RELEASE_NODE) > max(
        i for i, n in enumerate(names) if n == ACT_WAIT_REPAIR_JOB
    )
    assert any("diagnosed" in line and "toolkit hook" in line for line in result.timeline)


async def test_gpus_back_within_the_settle_time_touch_nothing(
    time_skipping_env: WorkflowEnvironment,
) -> None:
    """The plugin Ready and the GPUs gone is what a kubelet restart shows for seconds: looked
    at again after `settle` (30 s), back: closed `recovered`, the node never touched."""
    world = World(later=[diagnosis().model_copy(update={"vanished": False})])
    result = await run(time_skipping_env, world)
    assert result.outcome == "recovered" and "back within 30s" in result.summary
    assert world.names() == [ACT_DIAGNOSE_NODE, ACT_DIAGNOSE_NODE]
    assert any("settling" in line for line in result.timeline)


async def test_abort_while_settling_touches_nothing(
    time_skipping_env: WorkflowEnvironment,
) -> None:
    world = World()

    async def then(handle: Any) -> None:
        for _ in range(400):
            timeline = await handle.query(QRY_TIMELINE, result_type=list[str])
            if any("settling" in line for line in timeline):
                break
            await asyncio.sleep(0.02)
        await handle.signal(SIG_ABORT, AbortRequest(reason="a planned restart", actor="sre"))

    result = await run(time_skipping_env, world, then=then)
    assert result.outcome == "aborted" and result.summary == "a planned restart"
    assert world.names() == [ACT_DIAGNOSE_NODE]


def starting(reason: str = "PodInitializing", **pod: Any) -> NodeDiagnosis:
    """The plugin pod starting: not Ready, waiting on no error (its init containers run)."""
    d = diagnosis("plugin-not-ready")
    plugin = d.plugin_pods[0].model_copy(
        update={"ready": False, "waiting_reason": reason, "phase": "Pending", **pod}
    )
    return d.model_copy(update={"plugin_pods": [plugin]})


# The same pod after a node reboot (its containers ended with the node: exit 255, reason
# Unknown, restarted once), and a GPU Operator plugin pod whose init container completed.
REBOOTED = {"restarts": 1, "last_terminated_reason": "Unknown", "last_exit_code": 255}
INIT_DONE = {"last_terminated_reason": "Completed", "last_exit_code": 0}


async def test_a_starting_plugin_is_waited_for_and_touches_nothing(
    time_skipping_env: WorkflowEnvironment,
) -> None:
    back = diagnosis().model_copy(update={"vanished": False})
    world = World(diag=starting(), later=[starting("ContainerCreating"), back])
    result = await run(time_skipping_env, world, history="node_incident_plugin_starting")
    assert result.outcome == "recovered", result.summary
    assert world.names() == [ACT_DIAGNOSE_NODE] * 3  # nothing contained, nothing restarted
    assert sum("plugin starting" in line for line in result.timeline) == 2
    for pod in (REBOOTED, INIT_DONE):
        world = World(diag=starting("ContainerCreating", **pod), later=[back])
        result = await run(time_skipping_env, world)
        assert result.outcome == "recovered", (pod, result.summary)
        assert world.names() == [ACT_DIAGNOSE_NODE] * 2


async def test_a_plugin_still_starting_after_the_start_grace_is_acted_on(
    time_skipping_env: WorkflowEnvironment,
) -> None:
    world = World(diag=starting(), waits_before_back=1)
    result = await run(time_skipping_env, world)
    names = world.names()
    first_contain = names.index(ACT_CONTAIN_NODE)
    assert names[:first_contain] == [ACT_DIAGNOSE_NODE] * first_contain
    assert first_contain == 11  # 5m startGrace / 30s settle, and the first look
    assert any("still starting after 5m" in line for line in result.timeline)
    assert len(world.of(ACT_RESTART_GPU_PLUGIN)) == 1 and result.outcome == "healed"


async def test_no_plugin_pod_at_all_is_looked_at_once_more(
    time_skipping_env: WorkflowEnvironment,
) -> None:
    """No GPU plugin pod on the node: a DaemonSet between deleting the old pod and creating
    the new one shows that too. One more look after `settle`; still none: acted on."""
    none = diagnosis("plugin-missing", restartable=False).model_copy(update={"plugin_pods": []})
    back = none.model_copy(update={"vanished": False})
    world = World(diag=none, later=[back])
    result = await run(time_skipping_env, world)
    assert result.outcome == "recovered" and world.names() == [ACT_DIAGNOSE_NODE] * 2
    world = World(diag=none, waits_before_back=0)
    await run(time_skipping_env, world)
    names = world.names()
    assert names[:3] == [ACT_DIAGNOSE_NODE, ACT_DIAGNOSE_NODE, ACT_CONTAIN_NODE]


async def test_a_starting_plugin_that_fails_is_contained_at_once(
    time_skipping_env: WorkflowEnvironment,
) -> None:
    crashing = diagnosis("plugin-crashloop")
    crashing = crashing.model_copy(
        update={
            "plugin_pods": [
                crashing.plugin_pods[0].model_copy(
                    update={"ready": False, "waiting_reason": "CrashLoopBackOff", "restarts": 3}
                )
            ]
        }
    )
    world = World(diag=starting(), later=[crashing], waits_before_back=0)
    await run(time_skipping_env, world)
    names = world.names()
    assert names[:3] == [ACT_DIAGNOSE_NODE, ACT_DIAGNOSE_NODE, ACT_CONTAIN_NODE]


def repartitioning(state: str = "pending") -> NodeDiagnosis:
    """The MIG manager repartitioning the node (its GPU plugins stopped on purpose): GPUs gone,
    not vanished, the planned work named."""
    return diagnosis().model_copy(
        update={
            "vanished": False,
            "planned_work": f"the MIG manager is repartitioning its GPUs "
            f"(nvidia.com/mig.config.state={state})",
            "summary": f"node {NODE}: the MIG manager is repartitioning its GPUs",
        }
    )


async def test_gpus_gone_under_a_mig_repartition_are_waited_for_and_touch_nothing(
    time_skipping_env: WorkflowEnvironment,
) -> None:
    """The MIG manager stops the GPU plugins and repartitions (pending, then rebooting): the
    incident diagnoses again every minute (plannedGrace 30m / 30) and closes `recovered` once
    it is done and the GPUs are back: nothing contained, nobody paged."""
    back = diagnosis().model_copy(update={"vanished": False})
    world = World(diag=repartitioning(), later=[repartitioning("rebooting"), back])
    result = await run(time_skipping_env, world, history="node_incident_mig_repartition")
    assert result.outcome == "recovered", result.summary
    assert world.names() == [ACT_DIAGNOSE_NODE] * 3
    assert sum(" planned work -> " in line for line in result.timeline) == 1
    assert any(" planned work done -> " in line for line in result.timeline)
    assert "after the planned work" in result.summary


async def test_a_mig_repartition_that_never_ends_is_said_loudly_and_touches_nothing(
    time_skipping_env: WorkflowEnvironment,
) -> None:
    """A MIG manager stuck in `pending` (its pod gone, a failed script) with the GPUs gone
    hides a real loss: after plannedGrace (30m) the incident pages once and writes a Warning
    Event on the Node, the node never contained (the planned work may still be someone's), no
    plugin restarted; it stays open, looking hourly (no second page), and closes `recovered`
    with the page resolved when the work is done and the GPUs are back."""
    back = diagnosis().model_copy(update={"vanished": False})
    world = World(diag=repartitioning(), later=[repartitioning()] * 32 + [back])
    result = await run(time_skipping_env, world)
    assert result.outcome == "recovered", result.summary
    names = world.names()
    assert ACT_CONTAIN_NODE not in names and ACT_RESTART_GPU_PLUGIN not in names
    # the first look, every minute for 30m, two hourly looks after the page, then back
    assert names.count(ACT_DIAGNOSE_NODE) == 34
    pages = world.of(ACT_NOTIFY)
    assert [(p.action, p.incident.reason) for p in pages] == [
        ("trigger", "planned-work-stuck"),
        ("resolve", "planned-work-stuck"),
    ]
    assert "30m" in pages[0].incident.summary and "mig.config.state=pending" in (
        pages[0].incident.summary
    )
    assert "not touched" in pages[0].incident.summary
    assert reasons(world) == ["GPUsMissingUnderPlannedWork"]
    assert names.index(ACT_RECORD_EVENT) == names.index(ACT_NOTIFY) + 1


async def test_a_finding_without_planned_work_is_looked_at_at_once(
    time_skipping_env: WorkflowEnvironment,
) -> None:
    """Waiting for a MIG repartition, the incident hears a finding that names no planned work
    (the MIG manager finished `failed`, its label gone): it diagnoses at once, not at the next
    look, and acts on the vanish."""
    world = World(diag=repartitioning(), later=[diagnosis()] * 2, waits_before_back=0)

    async def told(handle: Any) -> None:
        async def waiting() -> bool:
            status = await handle.query(QRY_NODE_STATUS, result_type=NodeIncidentStatus)
            return status.phase == "waiting"

        await until(waiting, "the incident waiting for the planned work")
        await handle.signal(SIG_NODE_FINDING, NodeFinding(source="sweep", message="capacity 0"))

    result = await run(time_skipping_env, world, then=told)
    assert result.outcome == "healed", result.summary
    looks = [line.split(" ", 1)[0] for line in result.timeline if " diagnosed -> " in line]
    first, second = (datetime.strptime(t, "%H:%M:%S") for t in looks[:2])
    assert (second - first).total_seconds() < 60, result.timeline  # not the 1-minute look


async def test_a_mig_repartition_that_fails_is_acted_on_as_any_vanish(
    time_skipping_env: WorkflowEnvironment,
) -> None:
    """The MIG manager finishes `failed` with the GPUs still gone: no planned work any more,
    so the node is handled as any vanish (its plugin Ready: looked at once more after
    `settle`, then contained, the ladder)."""
    world = World(diag=repartitioning(), later=[diagnosis()] * 2, waits_before_back=0)
    result = await run(time_skipping_env, world)
    names = world.names()
    assert names[:4] == [ACT_DIAGNOSE_NODE] * 3 + [ACT_CONTAIN_NODE]
    assert result.outcome == "healed", result.summary


def _procedure_off() -> RunbookSet:
    runbooks = []
    for rb in without_repair(shipped_runbooks()):
        off = rb.spec.node_incident.model_copy(update={"enabled": False})
        runbooks.append(
            rb.model_copy(update={"spec": rb.spec.model_copy(update={"node_incident": off})})
        )
    return RunbookSet(runbooks=runbooks)


async def test_with_the_node_procedure_off_a_mig_repartition_is_waited_for_before_telling(
    time_skipping_env: WorkflowEnvironment,
) -> None:
    """`nodeIncident.enabled: false`: a vanish is only told (one notice, nothing diagnosed or
    touched), but GPUs gone under a MIG repartition (the finding names it) are first waited
    for as with the procedure on: done and back -> `recovered`, nobody told; not done within
    plannedGrace -> the one page, resolved once it is done and the GPUs are back."""
    world = World(runbooks=_procedure_off())
    result = await run(time_skipping_env, world)
    assert result.outcome == "disabled" and world.names() == [ACT_NOTIFY]
    back = diagnosis().model_copy(update={"vanished": False})
    world = World(runbooks=_procedure_off(), diag=repartitioning(), later=[back])
    result = await run(time_skipping_env, world, planned=repartitioning().planned_work)
    assert result.outcome == "recovered", result.summary
    assert world.names() == [ACT_DIAGNOSE_NODE] * 2
    world = World(
        runbooks=_procedure_off(), diag=repartitioning(), later=[repartitioning()] * 31 + [back]
    )
    result = await run(time_skipping_env, world, planned=repartitioning().planned_work)
    assert result.outcome == "recovered" and ACT_CONTAIN_NODE not in world.names()
    assert [(n.action, n.incident.reason) for n in world.of(ACT_NOTIFY)] == [
        ("trigger", "planned-work-stuck"),
        ("resolve", "planned-work-stuck"),
    ]


async def test_a_failing_plugin_is_contained_without_settling(
    time_skipping_env: WorkflowEnvironment,
) -> None:
    world = World(diag=diagnosis("toolkit-hook", restartable=False), waits_before_back=0)
    result = await run(time_skipping_env, world)
    names = world.names()
    assert names.count(ACT_DIAGNOSE_NODE) == 1 and names[1] == ACT_CONTAIN_NODE
    assert not any("settling" in line for line in result.timeline)


async def test_a_hook_failure_escalates_at_once_and_is_held_until_fixed(
    time_skipping_env: WorkflowEnvironment,
) -> None:
    world = World(diag=diagnosis("toolkit-hook", restartable=False), waits_before_back=3)
    result = await run(time_skipping_env, world, history="node_incident_hook_escalated")
    assert world.of(ACT_RESTART_GPU_PLUGIN) == []  # a restart cannot fix it: never tried
    [page] = [n for n in world.of(ACT_NOTIFY) if n.action == "trigger"]
    assert page.incident.id == node_workflow_id(NODE)
    assert (
        "toolkit hook fails" in page.incident.summary
        and "v1.28.15 to v1.29.15" in page.incident.summary
    )
    assert page.incident.reason == "gpus-vanished"
    names = world.names()
    assert names.index(ACT_NOTIFY) < names.index(ACT_WAIT_GPUS_BACK)  # paged before any wait
    assert result.outcome == "healed" and result.rung == "a fix by hand"
    assert [n.action for n in world.of(ACT_NOTIFY)] == ["trigger", "resolve"]
    assert reasons(world) == [
        "GPUDevicesVanished",
        "GPUNodeIncidentEscalated",
        "GPUDevicesRestored",
    ]
    assert world.of(ACT_CONTAIN_NODE)[0].reason == "ContainerToolkitHookFailed"
    # The node stays broken: its GPU workload is evicted within the budget (a lease of one
    # GPU per pod moved), after the page; the lease is given back on release.
    [lease] = world.of(ACT_ACQUIRE_BUDGET)
    assert lease.gpus == 1 and lease.node_pool == "a100" and lease.holder == node_workflow_id(NODE)
    [evict] = world.of(ACT_EVICT_PODS)
    assert [p.name for p in evict.pods] == ["trainer-0"] and evict.delete_if_blocked is False
    assert names.index(ACT_NOTIFY) < names.index(ACT_EVICT_PODS) < names.index(ACT_WAIT_GPUS_BACK)
    assert len(world.of(ACT_RELEASE_BUDGET)) == 1
    assert any("workloads evicted -> 1 gone" in line for line in result.timeline)


async def test_workloads_stay_when_the_budget_refuses(
    time_skipping_env: WorkflowEnvironment,
) -> None:
    world = World(
        diag=diagnosis("toolkit-hook", restartable=False), waits_before_back=0, budget_grants=False
    )
    result = await run(time_skipping_env, world)
    assert world.of(ACT_EVICT_PODS) == []
    assert any("workloads left in place -> ml/trainer-0" in line for line in result.timeline)
    assert world.of(ACT_RELEASE_BUDGET) == []  # no lease was held


async def test_restart_that_does_not_help_is_not_retried_and_abort_undoes(
    time_skipping_env: WorkflowEnvironment,
) -> None:
    world = World(waits_before_back=-1)

    async def then(handle: Any) -> None:
        # Bounded in real time, not by a count of skips: on a busy machine the workflow's
        # tasks take longer while each skip takes no less.
        loop = asyncio.get_running_loop()
        give_up = loop.time() + 120.0
        while True:
            st = await handle.query(QRY_NODE_STATUS, result_type=NodeIncidentStatus)
            if st.phase == "held" or loop.time() > give_up:
                break
            await time_skipping_env.sleep(timedelta(minutes=1))
        assert st.phase == "held"
        await handle.signal(SIG_ABORT, AbortRequest(reason="rolling back the upgrade", actor="sre"))

    result = await run(time_skipping_env, world, then=then)
    assert len(world.of(ACT_RESTART_GPU_PLUGIN)) == 1  # pluginRestarts: 1, nothing forever
    assert any("reboot skipped" in line for line in result.timeline)
    assert result.outcome == "aborted"
    assert len(world.of(ACT_RELEASE_NODE)) == 1
    assert world.of(ACT_START_VALIDATION_JOB) == []


async def test_failed_validation_is_no_heal(time_skipping_env: WorkflowEnvironment) -> None:
    world = World(validation_passes=False)

    async def then(handle: Any) -> None:
        for _ in range(400):
            st = await handle.query(QRY_NODE_STATUS, result_type=NodeIncidentStatus)
            if st.phase == "held" and world.of(ACT_NOTIFY):
                break
            await time_skipping_env.sleep(timedelta(minutes=1))
        await handle.signal(SIG_ABORT, AbortRequest(reason="done looking"))

    result = await run(time_skipping_env, world, then=then)
    assert any("validation of GPU-aaaa failed" in line for line in result.timeline)
    assert world.of(ACT_NOTIFY), "a GPU that fails validation escalates"
    assert result.outcome == "aborted"


async def test_pool_incident_names_every_node(time_skipping_env: WorkflowEnvironment) -> None:
    runbooks = without_repair(shipped_runbooks())
    out = []
    for rb in runbooks:
        ni = rb.spec.node_incident.model_copy(update={"pool_incident": True})
        out.append(rb.model_copy(update={"spec": rb.spec.model_copy(update={"node_incident": ni})}))
    world = World(
        diag=diagnosis(
            "toolkit-hook", restartable=False, pool_vanished=["gpu-node-1", "gpu-node-2"]
        ),
        runbooks=RunbookSet(runbooks=out),
        waits_before_back=0,
    )
    await run(time_skipping_env, world)
    [page] = [n for n in world.of(ACT_NOTIFY) if n.action == "trigger"]
    assert page.incident.id == "sickbay-pool-gpus-a100"
    assert "3 nodes lost their GPUs (gpu-node-1, gpu-node-2, gpu-node-3)" in page.incident.summary


@pytest.mark.parametrize("case", ["dry-run", "recovered"])
async def test_dry_run_and_recovered_touch_nothing(
    time_skipping_env: WorkflowEnvironment, case: str
) -> None:
    diag = diagnosis() if case == "dry-run" else diagnosis().model_copy(update={"vanished": False})
    world = World(diag=diag)
    result = await run(time_skipping_env, world, dry_run=case == "dry-run")
    assert result.outcome == case
    # A dry run settles too (the plugin is Ready): it says what the second look would do.
    assert world.names() == [ACT_DIAGNOSE_NODE] * (2 if case == "dry-run" else 1)
    if case == "dry-run":
        assert "would contain (taint) and heal (restart-plugin, reboot, replace)" in result.summary


async def test_restart_not_enough_then_reboot_heals(time_skipping_env: WorkflowEnvironment) -> None:
    """The ladder goes on: the restart does not bring the GPUs back within gpusBackTimeout, so
    the existing reboot rung runs (repair enabled, provider configured): a budget lease for
    the node's 2 GPUs, the node cordoned and drained (PDBs honoured), the reboot asked once,
    the node back, the GPUs published and validated -> released (uncordoned), `healed`."""
    out = []
    for rb in shipped_runbooks():
        spec = rb.spec
        scale = spec.scale_up.model_copy(update={"provider": "cluster-api"})
        rep = spec.repair.model_copy(update={"enabled": True})
        out.append(
            rb.model_copy(
                update={"spec": spec.model_copy(update={"scale_up": scale, "repair": rep})}
            )
        )
    world = World(runbooks=RunbookSet(runbooks=out), waits_before_back=10**6, gpu_pods=[])
    rebooted: list[MachineActionInput] = []

    @activity.defn(name=ACT_FIND_DRAIN_PODS)
    async def drain(inp: DrainPodsInput) -> DrainPodsResult:
        world.calls.append((ACT_FIND_DRAIN_PODS, inp))
        return DrainPodsResult(pods=[PodRef(namespace="ml", name="web-0")], node_gpu_uuids=UUIDS)

    @activity.defn(name=ACT_CORDON)
    async def cordon(inp: CordonInput) -> CordonResult:
        world.calls.append((ACT_CORDON, inp))
        return CordonResult(changed=True, message="cordoned")

    @activity.defn(name=ACT_REBOOT_NODE)
    async def reboot(inp: MachineActionInput) -> MachineActionResult:
        world.calls.append((ACT_REBOOT_NODE, inp))
        rebooted.append(inp)
        world.waits_before_back = world.waits  # the node comes back with its GPUs
        return MachineActionResult(action="reboot", node=inp.node, operation="op-1")

    @activity.defn(name=ACT_WAIT_NODE_GPUS)
    async def node_back(inp: WaitNodeGpusInput) -> NodeGpusResult:
        world.calls.append((ACT_WAIT_NODE_GPUS, inp))
        return NodeGpusResult(node=inp.node, gpu_uuids=UUIDS)

    client = time_skipping_env.client
    tq = f"tq-{uuid.uuid4()}"
    acts = [*world.activities(), drain, cordon, reboot, node_back]
    async with Worker(client, task_queue=tq, workflows=[NodeIncidentWorkflow], activities=acts):
        handle = await client.start_workflow(
            NodeIncidentWorkflow.run,
            NodeIncidentInput(node=NODE, trigger="sweep", reason="capacity 0 < 2"),
            id=node_workflow_id(NODE),
            task_queue=tq,
        )
        result = await handle.result()
        history = await handle.fetch_history()
    assert result.outcome == "healed" and result.rung == "reboot", result.timeline
    # The reboot request heartbeats while the provider answers (activities/cloud/machines.py):
    # a worker killed mid-request is retried after the heartbeat timeout, as in the per-GPU
    # remediation's rung, not after the 2-minute start-to-close.
    assert scheduled_heartbeats(history)[ACT_REBOOT_NODE] == timedelta(seconds=30)
    assert len(world.of(ACT_RESTART_GPU_PLUGIN)) == 1
    [lease] = world.of(ACT_ACQUIRE_BUDGET)
    assert lease.gpus == 2
    [req] = rebooted
    assert req.action == "reboot" and req.attempt == 1 and req.pool is not None
    assert req.pool.provider == "cluster-api"
    names = world.names()
    assert names.index(ACT_CORDON) < names.index(ACT_EVICT_PODS) < names.index(ACT_REBOOT_NODE)
    assert [p.name for p in world.of(ACT_EVICT_PODS)[0].pods] == ["web-0"]
    assert len(world.of(ACT_START_VALIDATION_JOB)) == 2
    assert len(world.of(ACT_RELEASE_BUDGET)) == 1 and len(world.of(ACT_RELEASE_NODE)) == 1


def _follow_runbooks(*, scale: bool, approval: bool = False) -> RunbookSet:
    """The shipped runbooks (repair off) with `scaleUp` on (provider cluster-api, the node's
    pool) or off; Pending and capacity deadlines of a minute (the safe bounds' least): `run`
    moves the server's time on while the fake watch waits, to the deadline timer."""
    out = []
    for rb in without_repair(shipped_runbooks()):
        rep = rb.spec.replacement.model_copy(update={"pending_deadline": timedelta(minutes=1)})
        su = rb.spec.scale_up.model_copy(
            update={
                "enabled": scale,
                "provider": "cluster-api",
                "max_size": 6,
                "approval": approval,
                "capacity_deadline": timedelta(minutes=1),
            }
        )
        spec = rb.spec.model_copy(update={"scale_up": su, "replacement": rep})
        out.append(rb.model_copy(update={"spec": spec}))
    return RunbookSet(runbooks=out)


@pytest.fixture
async def own_env(temporal_test_server_path: str) -> AsyncIterator[WorkflowEnvironment]:
    """A time-skipping server of the test's own, for the tests whose watches wait for a
    deadline: a watch the worker has not yet cancelled when its workflow ends holds that
    server's time still until the worker stops; the module's shared server stays apart."""
    env = await WorkflowEnvironment.start_time_skipping(
        port=free_port(),
        data_converter=DATA_CONVERTER,
        test_server_existing_path=temporal_test_server_path,
    )
    try:
        yield env
    finally:
        await env.shutdown()


def _hook_world(**kw: Any) -> World:
    return World(diag=diagnosis("toolkit-hook", restartable=False), waits_before_back=3, **kw)


async def test_replacements_running_elsewhere_are_logged(
    time_skipping_env: WorkflowEnvironment,
) -> None:
    world = _hook_world()
    result = await run(time_skipping_env, world, history="node_incident_replacements_running")
    [watch] = world.of(ACT_WAIT_REPLACEMENT)
    assert [(o.kind, o.name) for o in watch.owners] == [("StatefulSet", "trainer")]
    assert [p.name for p in watch.old_pods] == ["trainer-0"] and not watch.look_once
    names = world.names()
    assert names.index(ACT_WAIT_EVICTION) < names.index(ACT_WAIT_REPLACEMENT)
    assert names.index(ACT_WAIT_REPLACEMENT) < names.index(ACT_WAIT_GPUS_BACK)  # then held
    assert any(
        "replacements Running elsewhere -> ml/trainer-0 on gpu-node-7" in line
        for line in result.timeline
    ), result.timeline
    assert [n.action for n in world.of(ACT_NOTIFY)] == ["trigger", "resolve"]  # page untouched
    assert world.of(ACT_REQUEST_CAPACITY) == []
    assert result.outcome == "healed"


async def test_pending_replacements_get_a_scale_up_within_the_budget(
    own_env: WorkflowEnvironment, caplog: pytest.LogCaptureFixture
) -> None:
    world = _hook_world(
        runbooks=_follow_runbooks(scale=True),
        replacements="pending",
        running_after_capacity=True,
    )
    with caplog.at_level(logging.ERROR):
        result = await run(own_env, world)
        gc.collect()  # a task's unretrieved exception is reported when the task is collected
    # The watch the deadline cancelled ended as expected: no "Task exception was never
    # retrieved" at ERROR in the worker's log.
    assert not [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR]
    # The relocation's lease (1 GPU: one pod moved), then the scale-up's: the node's 2 GPUs.
    assert [lease.gpus for lease in world.of(ACT_ACQUIRE_BUDGET)] == [1, 2]
    [ask] = world.of(ACT_REQUEST_CAPACITY)
    assert ask.pool.provider == "cluster-api" and ask.pool.name == "a100"
    assert ask.need == 1 and ask.max_size == 6 and ask.requester == node_workflow_id(NODE)
    names = world.names()
    assert names.index(ACT_ACQUIRE_BUDGET, names.index(ACT_EVICT_PODS)) < names.index(
        ACT_REQUEST_CAPACITY
    )
    watches = world.of(ACT_WAIT_REPLACEMENT)
    # Pending deadline: the watch cancelled at the timer, one look; then the capacity wait.
    assert [w.look_once for w in watches] == [False, True, False]
    assert any(
        "capacity requested -> requested: pool a100 size 3 -> 4" in x for x in result.timeline
    )
    assert any("replacements Running elsewhere" in line for line in result.timeline)
    assert [n.action for n in world.of(ACT_NOTIFY)] == ["trigger", "resolve"]
    assert len(world.of(ACT_RELEASE_BUDGET)) == 1


async def test_pending_with_scale_up_off_updates_the_one_page(
    own_env: WorkflowEnvironment,
) -> None:
    world = _hook_world(
        runbooks=_follow_runbooks(scale=False),
        replacements="pending",
        bare=[PodRef(namespace="ml", name="notebook")],
        gpu_pods=[
            PodRef(namespace="ml", name="notebook"),
            PodRef(namespace="ml", name="trainer-0", uid="u1"),
        ],
    )
    result = await run(
        own_env,
        world,
        history="node_incident_replacements_pending",
    )
    assert world.of(ACT_REQUEST_CAPACITY) == []
    pages = [n for n in world.of(ACT_NOTIFY) if n.action == "trigger"]
    assert len(pages) == 2 and {p.incident.id for p in pages} == {node_workflow_id(NODE)}
    update = pages[1].incident
    assert "pending-deadline" in update.summary and "ml/trainer-0" in update.summary
    assert "scale-up is off" in update.summary
    assert "8 Insufficient nvidia.com/gpu" in update.summary
    assert update.summary.startswith(pages[0].incident.summary)
    assert any("no owner: nothing starts them again -> ml/notebook" in x for x in result.timeline)
    # The resolve closes the updated page.
    [resolve] = [n for n in world.of(ACT_NOTIFY) if n.action == "resolve"]
    assert resolve.incident.summary == update.summary


async def test_budget_refusing_the_scale_up_is_said(
    own_env: WorkflowEnvironment,
) -> None:
    world = _hook_world(
        runbooks=_follow_runbooks(scale=True),
        replacements="pending",
        grants_by_gpus={1: True, 2: False},
    )
    result = await run(own_env, world)
    assert world.of(ACT_REQUEST_CAPACITY) == []
    assert any("the scale-up refused by the blast-radius budget" in x for x in result.timeline)
    update = [n for n in world.of(ACT_NOTIFY) if n.action == "trigger"][1].incident
    assert "refused by the blast-radius budget" in update.summary
    assert "ml/trainer-0" in update.summary
