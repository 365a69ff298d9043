"""Name-matched fakes of the repair ladder's activities (GPU rungs, node rungs, validation),
scripted per test: `RepairScript` says what each answers, and every call is recorded in the
`FakeWorld`'s call list beside the procedure's other activities."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from temporalio.exceptions import ApplicationError

from activities.cloud.machines import MachineActivities
from activities.kube.repair_activities import KubeRepairActivities
from contract.errors import ERR_STILL_WAITING
from contract.kube import PodRef
from contract.names import (
    ACT_CHECK_GPU_HOLDERS,
    ACT_CLEAN_UP_REPAIR_JOB,
    ACT_FIND_DRAIN_PODS,
    ACT_FIND_RESET_GROUP,
    ACT_REBOOT_NODE,
    ACT_REPLACE_NODE,
    ACT_START_RESET_JOB,
    ACT_START_VALIDATION_JOB,
    ACT_WAIT_NODE_GPUS,
    ACT_WAIT_REPAIR_JOB,
)
from contract.repair_rungs import (
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
from tests.workflows.fakes import FakeWorld, fake_of


@dataclass
class RepairScript:
    group: list[str] = field(default_factory=list)  # empty: the GPU alone
    node_gpus: list[str] = field(default_factory=list)  # empty: the GPU alone
    node_pods: list[PodRef] = field(default_factory=list)  # what a node drain evicts
    reset_passes: bool = True  # the reset Job's outcome
    # Validation outcomes in order (one per rung that repaired); passes when exhausted.
    validations: list[bool] = field(default_factory=list)
    # Provider answer per action: an error to raise (non-retryable: not configured/refused).
    machine_errors: dict[str, ApplicationError] = field(default_factory=dict)
    node_back: bool = True
    new_node: str = "gpu-node-new"
    new_gpus: list[str] = field(default_factory=lambda: ["GPU-new-0"])  # the new node's GPUs
    new_gpu_holders: dict[str, list[PodRef]] = field(default_factory=dict)  # pods on new GPUs
    # A Job that cannot run, per kind ("reset" | "validation"): the error its wait raises
    # (RepairJobRefused) or, under "start-<kind>", its start raises (RepairNotAllowed).
    job_errors: dict[str, ApplicationError] = field(default_factory=dict)


def repair_activities(world: FakeWorld, script: RepairScript) -> list[Callable[..., Any]]:
    calls = world.calls
    jobs: dict[str, str] = {}  # job name -> "reset" | "validation"

    @fake_of(KubeRepairActivities.find_reset_group)
    async def find_reset_group(req: ResetGroupInput) -> ResetGroupResult:
        calls.append((ACT_FIND_RESET_GROUP, req))
        group = script.group or [req.gpu_uuid]
        return ResetGroupResult(gpu_uuids=group, source="attribute" if script.group else "single")

    @fake_of(KubeRepairActivities.find_drain_pods)
    async def find_drain_pods(req: DrainPodsInput) -> DrainPodsResult:
        calls.append((ACT_FIND_DRAIN_PODS, req))
        if req.node == script.new_node:
            held = [p for u in req.gpu_uuids for p in script.new_gpu_holders.get(u, [])]
            return DrainPodsResult(pods=held, node_gpu_uuids=list(script.new_gpus))
        return DrainPodsResult(
            pods=script.node_pods, node_gpu_uuids=script.node_gpus or [world.gpu_uuid]
        )

    @fake_of(KubeRepairActivities.check_gpu_holders)
    async def check_gpu_holders(req: GpuHoldersInput) -> GpuHoldersResult:
        calls.append((ACT_CHECK_GPU_HOLDERS, req))
        return GpuHoldersResult()

    @fake_of(KubeRepairActivities.start_reset_job)
    async def start_reset_job(req: RepairJobInput) -> RepairJobStarted:
        calls.append((ACT_START_RESET_JOB, req))
        if "start-reset" in script.job_errors:
            raise script.job_errors["start-reset"]
        name = f"sickbay-reset-{req.attempt}"
        jobs[name] = "reset"
        return RepairJobStarted(namespace="sickbay-repair", job_name=name, created=True)

    @fake_of(KubeRepairActivities.start_validation_job)
    async def start_validation_job(req: ValidationJobInput) -> RepairJobStarted:
        calls.append((ACT_START_VALIDATION_JOB, req))
        if "start-validation" in script.job_errors:
            raise script.job_errors["start-validation"]
        name = f"sickbay-validate-{req.attempt}"
        jobs[name] = "validation"
        return RepairJobStarted(namespace="sickbay-repair", job_name=name, created=True)

    @fake_of(KubeRepairActivities.wait_for_repair_job)
    async def wait_for_repair_job(req: WaitRepairJobInput) -> RepairJobOutcome:
        calls.append((ACT_WAIT_REPAIR_JOB, req))
        if jobs[req.job_name] in script.job_errors:
            raise script.job_errors[jobs[req.job_name]]
        if jobs[req.job_name] == "reset":
            ok = script.reset_passes
            return RepairJobOutcome(
                passed=ok, summary="GPU reset" if ok else "", reason="" if ok else "exit 3"
            )
        ok = script.validations.pop(0) if script.validations else True
        return RepairJobOutcome(
            passed=ok,
            summary="Diagnostic | PASS" if ok else "Memory | FAIL: ECC DBE",
            reason="" if ok else "BackoffLimitExceeded",
        )

    @fake_of(KubeRepairActivities.clean_up_repair_job)
    async def clean_up_repair_job(req: CleanUpRepairJobInput) -> None:
        calls.append((ACT_CLEAN_UP_REPAIR_JOB, req))

    async def machine(name: str, req: MachineActionInput) -> MachineActionResult:
        calls.append((name, req))
        err = script.machine_errors.get(req.action)
        if err is not None:
            raise err
        return MachineActionResult(
            action=req.action,
            node=req.node,
            operation="" if req.dry_run else f"op-{req.action}-{req.attempt}",
            asked=not req.dry_run,
            dry_run=req.dry_run,
            detail=f"would {req.action}" if req.dry_run else f"{req.action} asked",
        )

    @fake_of(MachineActivities.reboot_node)
    async def reboot_node(req: MachineActionInput) -> MachineActionResult:
        return await machine(ACT_REBOOT_NODE, req)

    @fake_of(MachineActivities.replace_node)
    async def replace_node(req: MachineActionInput) -> MachineActionResult:
        return await machine(ACT_REPLACE_NODE, req)

    @fake_of(KubeRepairActivities.wait_for_node_gpus)
    async def wait_for_node_gpus(req: WaitNodeGpusInput) -> NodeGpusResult:
        calls.append((ACT_WAIT_NODE_GPUS, req))
        if not script.node_back:
            raise ApplicationError("node NotReady", type=ERR_STILL_WAITING, non_retryable=True)
        if req.replaced:
            # The guard (Sickbay's cordon) goes on the new node the moment it is seen.
            return NodeGpusResult(
                node=script.new_node,
                gpu_uuids=list(script.new_gpus),
                cordoned=req.guard_workflow_id is not None,
            )
        return NodeGpusResult(node=req.node, gpu_uuids=script.node_gpus or [world.gpu_uuid])

    return [
        find_reset_group,
        find_drain_pods,
        check_gpu_holders,
        start_reset_job,
        start_validation_job,
        wait_for_repair_job,
        clean_up_repair_job,
        reboot_node,
        replace_node,
        wait_for_node_gpus,
    ]
