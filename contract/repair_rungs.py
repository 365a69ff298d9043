"""The closed-loop repair activities' inputs and results (reset and validation Jobs, holders,
reset groups, node reboot/replace through a provider). The runbook's `repair:`, `validation:`
and `lemons:` blocks and the ladder choice (`ladder_for`) are in contract.runbook; the activity
names and labels in contract.names, the error types in contract.errors.

The ladder is a fixed order of rungs, each a bigger hammer than the last:

    reset (the GPU, or its reset group)  ->  reboot (the node)  ->  replace (the node)

A rung applies to a failure when it lists the failure's Xid; a failure whose Xid no rung lists
(or that has none) goes by its failure class (`classes`). A reset can never apply to an Xid that
means the GPU is off the bus (79): a reset goes through the driver, which cannot reach it.

Pure: stdlib + pydantic + the contract, no I/O, so workflows may import it inside the sandbox.
"""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Literal

from pydantic import Field

from contract.activity import Activity
from contract.base import Contract, Duration
from contract.capacity import NodePoolTarget
from contract.kube import ClusterMode, PodRef
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


class GpuHoldersInput(Contract):
    node: str
    gpu_uuids: list[str]  # the physical GPUs (a reset group may hold several)
    ignore_pods: list[str] = Field(default_factory=list)  # `ns/name`: Sickbay's own Jobs


class GpuHoldersResult(Contract):
    holders: list[str] = Field(default_factory=list)  # `ns/name (why)`, empty = free


class DrainPodsInput(Contract):
    """What a rung must drain first: the pods holding any of `gpu_uuids` (a reset group), or
    with `gpu_uuids` empty every pod of the node (a reboot / replace), DaemonSet and mirror
    pods and Sickbay's own Jobs excepted, as `kubectl drain` leaves them."""

    node: str
    gpu_uuids: list[str] = Field(default_factory=list)
    # Besides these, the worker's repair namespace (the activity adds it).
    ignore_namespaces: list[str] = Field(default_factory=list)


class DrainPodsResult(Contract):
    pods: list[PodRef] = Field(default_factory=list)
    node_gpu_uuids: list[str] = Field(default_factory=list)  # every physical GPU of the node


class ResetGroupInput(Contract):
    node: str
    gpu_uuid: str


class ResetGroupResult(Contract):
    gpu_uuids: list[str]  # every GPU that resets together with the asked one, itself included
    source: Literal["attribute", "label", "single"] = "single"


class RepairJobInput(Contract):
    """A reset Job: pinned to `node`, privileged, one try."""

    workflow_id: str
    # The incident (`<workflow id>/<id of its first run>`): with the attempt it names the Job, so a Job
    # an earlier incident of the same GPU left behind is never read as this attempt's.
    incident: str = Field(min_length=1)
    attempt: int = Field(default=1, ge=1)  # the rung attempt: a new attempt, a new Job
    node: str
    gpu_uuids: list[str] = Field(min_length=1)
    # The runbook's choice, checked against the worker's allowlist by the activity (None: the
    # allowlist's first reset image).
    image: str | None = None
    command: list[str] = Field(default_factory=list)  # empty: DEFAULT_RESET_COMMAND
    namespace: str | None = None  # None: the worker's repair namespace (SICKBAY_REPAIR_NAMESPACE)
    timeout: Duration = timedelta(minutes=5)
    dry_run: bool = False


class ValidationJobInput(Contract):
    """A validation Job on the repaired device itself."""

    workflow_id: str
    incident: str = Field(min_length=1)  # as RepairJobInput.incident
    attempt: int = Field(default=1, ge=1)
    mode: ClusterMode = "dra"
    node: str
    gpu_uuid: str
    driver: str | None = None  # DRA: the device the claim selects
    pool: str | None = None
    device: str | None = None
    device_class: str = "gpu.nvidia.com"
    taint_key: str = "sickbay.dev/unhealthy"  # Sickbay's own taint, tolerated by the claim
    image: str | None = None  # as RepairJobInput.image (the validation allowlist)
    command: list[str] = Field(default_factory=list)  # empty: DEFAULT_VALIDATION_COMMAND
    level: int = Field(default=2, ge=1, le=4)
    namespace: str | None = None  # as RepairJobInput.namespace
    timeout: Duration = timedelta(minutes=15)
    dry_run: bool = False


class RepairJobStarted(Contract):
    namespace: str
    job_name: str
    created: bool  # False: the Job of this attempt existed already (a retried activity)
    claim_name: str | None = None
    dry_run: bool = False
    manifest: dict[str, object] = Field(default_factory=dict)  # with dry_run: what it would create


class WaitRepairJobInput(Contract):
    namespace: str
    job_name: str


class RepairJobOutcome(Contract):
    passed: bool
    summary: str  # the last lines of the pod's log (or the Job's failure reason)
    reason: str = ""
    # The Job could not run at all (its pod refused or never started, or its image / command
    # not allowlisted): `reason` is the API's (or the allowlist's) text. Not a verdict on the
    # GPU: the remediation escalates instead of trying the next rung.
    refused: bool = False


class CleanUpRepairJobInput(Contract):
    namespace: str
    job_name: str
    claim_name: str | None = None


class MachineActionInput(Contract):
    """Reboot or replace one node through its provider, asked for once per attempt."""

    workflow_id: str
    attempt: int = Field(default=1, ge=1)
    action: Literal["reboot", "replace"]
    node: str
    pool: NodePoolTarget | None = None  # where the node's machine lives (provider + ids)
    dry_run: bool = False

    @property
    def idempotency_key(self) -> str:
        return f"{self.workflow_id}/{self.action}/{self.attempt}"


class MachineActionResult(Contract):
    action: Literal["reboot", "replace"]
    node: str
    operation: str = ""  # the provider's id of the request, to follow or look up
    asked: bool = True  # False: found already asked for under this key (a retried activity)
    detail: str = ""
    dry_run: bool = False


class WaitNodeGpusInput(Contract):
    node: str  # the node rebooted, or the node replaced
    replaced: bool = False  # follow the pool's new node instead of the old one
    node_pool: str | None = None  # the pool label value, to find a replacement node
    previous_uuids: list[str] = Field(default_factory=list)  # a replacement has others
    # When the rung was asked for (required): after a reboot the node must be Ready again
    # since then (Ready's lastTransitionTime later: a node still Ready from before has not
    # rebooted yet); after a replace only a node created after it is the replacement (another
    # node of the pool is not, however healthy).
    asked_at: datetime | None = None
    expected_gpus: int = Field(default=1, ge=1)
    # After a replace whose new GPUs are validated: cordon the replacement (Sickbay's cordon
    # for this workflow id) the first time it is seen, before its GPUs are published, so no
    # workload lands on an unvalidated GPU; None: no guard.
    guard_workflow_id: str | None = None


class NodeGpusResult(Contract):
    node: str
    gpu_uuids: list[str]
    cordoned: bool = False  # the guard: Sickbay's cordon (this workflow's) is on the node
    guard_note: str = ""  # how the guard went (already cordoned by someone else, ...)


# --- activities (contract.activity): the name, the input model, the result model ------------
CHECK_GPU_HOLDERS = Activity(ACT_CHECK_GPU_HOLDERS, GpuHoldersInput, GpuHoldersResult)
FIND_RESET_GROUP = Activity(ACT_FIND_RESET_GROUP, ResetGroupInput, ResetGroupResult)
FIND_DRAIN_PODS = Activity(ACT_FIND_DRAIN_PODS, DrainPodsInput, DrainPodsResult)
START_RESET_JOB = Activity(ACT_START_RESET_JOB, RepairJobInput, RepairJobStarted)
START_VALIDATION_JOB = Activity(ACT_START_VALIDATION_JOB, ValidationJobInput, RepairJobStarted)
WAIT_FOR_REPAIR_JOB = Activity(ACT_WAIT_REPAIR_JOB, WaitRepairJobInput, RepairJobOutcome)
CLEAN_UP_REPAIR_JOB = Activity(ACT_CLEAN_UP_REPAIR_JOB, CleanUpRepairJobInput, type(None))
REBOOT_NODE = Activity(ACT_REBOOT_NODE, MachineActionInput, MachineActionResult)
REPLACE_NODE = Activity(ACT_REPLACE_NODE, MachineActionInput, MachineActionResult)
WAIT_FOR_NODE_GPUS = Activity(ACT_WAIT_NODE_GPUS, WaitNodeGpusInput, NodeGpusResult)
