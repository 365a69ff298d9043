"""The node incident (`sickbay-node-incident`): a node whose GPUs vanished (after an upgrade,
most often), diagnosed, contained and healed as one procedure beside the per-GPU remediation.

One workflow per node (`contract.names.node_workflow_id`): the watcher, the sweep and a person
all reach the same run, so a node that lost eight GPUs is one incident, never eight.
"""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Literal

from pydantic import Field

from contract.activity import Activity
from contract.base import Contract, Duration
from contract.kube import OwnerRef, PodRef
from contract.names import (
    ACT_CONTAIN_NODE,
    ACT_DIAGNOSE_NODE,
    ACT_FIND_GPU_PODS,
    ACT_RELEASE_NODE,
    ACT_RESTART_GPU_PLUGIN,
    ACT_WAIT_GPUS_BACK,
)

NodeRungAction = Literal["restart-plugin", "reboot", "replace"]
NODE_RUNG_ACTIONS: tuple[NodeRungAction, ...] = ("restart-plugin", "reboot", "replace")

# The node condition Sickbay writes while a node incident runs (reason: the likely cause).
CONDITION_GPU_DEVICES = "GPUDevicesAvailable"

# What the diagnosis can name. `restartable`: a plugin restart may fix it.
Cause = Literal[
    "toolkit-hook",  # the container toolkit's OCI hook fails: CreateContainerError
    "nvml-missing",  # the plugin starts but cannot load NVML (libnvidia-ml.so.1)
    "plugin-crashloop",  # the plugin crashes for another reason
    "plugin-not-registered",  # plugin Running + Ready, GPUs gone: the kubelet lost its socket
    "plugin-not-ready",  # plugin pod not Ready, no clearer reason
    "plugin-missing",  # no plugin pod on the node
    "driver-not-publishing",  # DRA: the driver's ResourceSlices are gone or shrunk
    "unknown",
]
RESTARTABLE_CAUSES: frozenset[str] = frozenset(
    {"plugin-not-registered", "plugin-not-ready", "plugin-crashloop", "driver-not-publishing"}
)


class RecordedNode(Contract):
    """What Sickbay saw of the node before the GPUs vanished (the watcher's memory)."""

    kubelet_version: str = ""
    runtime_version: str = ""
    gpu_count: int | None = None
    seen_at: datetime | None = None


class NodeIncidentInput(Contract):
    node: str = Field(min_length=1)
    cluster: str = ""
    trigger: Literal["watch", "sweep", "manual"] = "sweep"
    reason: str = ""  # what the trigger saw, in words
    # The GPUs went while planned work holds them (the MIG manager repartitioning): what it
    # is, in words (the finding's `planned`); "" for any other vanish.
    planned: str = ""
    expected_gpus: int | None = Field(default=None, ge=1)  # the count label / count last seen
    recorded: RecordedNode | None = None
    dry_run: bool = False
    task_queue: str | None = None


class NodeFinding(Contract):
    """A detection signalled into a running node incident (and the start signal)."""

    source: Literal["watch", "sweep", "manual"] = "sweep"
    message: str = ""
    at: datetime | None = None
    planned: str = ""  # the planned work holding the GPUs, as NodeIncidentInput.planned


class PluginPod(Contract):
    namespace: str
    name: str
    component: Literal["device-plugin", "dra-kubelet-plugin", "validator", "other"]
    phase: str = ""
    ready: bool = False
    restarts: int = 0
    waiting_reason: str = ""
    waiting_message: str = ""
    last_terminated_reason: str = ""
    last_exit_code: int | None = None
    runtime_class: str = ""
    events: list[str] = Field(default_factory=list)  # "Reason: message (xN)", newest last


class DiagnoseNodeInput(Contract):
    node: str
    expected_gpus: int | None = None
    recorded: RecordedNode | None = None
    # Other nodes of the pool whose GPUs vanished within this window count for a pool incident.
    pool_window: Duration = timedelta(minutes=30)


class NodeDiagnosis(Contract):
    node: str
    node_pool: str | None = None
    mode: Literal["device-plugin", "dra", "unknown"] = "unknown"
    expected_gpus: int | None = None
    capacity: int | None = None  # nvidia.com/gpu capacity (device plugin)
    allocatable: int | None = None
    published: int | None = None  # physical GPUs in the node's ResourceSlices (DRA)
    gpu_uuids: list[str] = Field(default_factory=list)  # GPUs visible now
    kubelet_version: str = ""
    runtime_version: str = ""
    recorded: RecordedNode | None = None
    peers: dict[str, int] = Field(default_factory=dict)  # kubelet version -> other pool nodes
    # Other nodes of the pool short of GPUs now, or that Sickbay marked GPUDevicesAvailable=
    # False within the pool window (a rollout breaking node after node).
    pool_vanished: list[str] = Field(default_factory=list)
    plugin_pods: list[PluginPod] = Field(default_factory=list)
    runtime_class: str = ""
    runtime_class_found: bool | None = None  # the RuntimeClass the plugin names exists
    vanished: bool = False  # fewer GPUs than expected (or a plugin pod not Ready)
    # The GPUs are gone (as `vanished` says) while the MIG manager repartitions them: what it
    # is doing, in words. Not vanished then; the incident waits up to `plannedGrace`.
    planned_work: str = ""
    cause: Cause = "unknown"
    restartable: bool = False
    summary: str = ""  # the likely cause in plain words


class ContainNodeInput(Contract):
    node: str
    workflow_id: str
    mode: Literal["taint", "cordon", "none"] = "taint"
    reason: str  # condition reason (CamelCase cause)
    message: str  # the diagnosis summary
    dry_run: bool = False


class ContainNodeResult(Contract):
    changed: bool
    detail: str = ""


class ReleaseNodeInput(Contract):
    node: str
    workflow_id: str
    message: str = ""
    dry_run: bool = False


class RestartPluginInput(Contract):
    node: str
    workflow_id: str
    attempt: int = Field(default=1, ge=1)
    dry_run: bool = False


class RestartPluginResult(Contract):
    restarted: list[str] = Field(default_factory=list)  # ns/name deleted by this call
    already: bool = False  # this attempt had restarted them before (a retried activity)
    detail: str = ""


class GpuPodsInput(Contract):
    node: str
    ignore_namespaces: list[str] = Field(default_factory=lambda: ["sickbay"])


class GpuPodsResult(Contract):
    """The pods on the node that hold GPUs (nvidia.com/gpu or a ResourceClaim), the ones whose
    GPUs vanished; DaemonSet and mirror pods (the GPU plugin itself) are never listed."""

    pods: list[PodRef] = Field(default_factory=list)
    # Their top controllers (Deployment, StatefulSet, Job, JobSet...; one entry each): what
    # starts them elsewhere once evicted, and what the replacement watch follows.
    owners: list[OwnerRef] = Field(default_factory=list)
    # The ones without an owner: nothing starts them again once evicted.
    bare: list[PodRef] = Field(default_factory=list)


class WaitGpusBackInput(Contract):
    node: str
    expected_gpus: int = Field(ge=1)
    since: datetime | None = None  # plugin pods must be Ready and started after this


class GpusBackResult(Contract):
    node: str
    gpu_uuids: list[str] = Field(default_factory=list)
    mode: Literal["device-plugin", "dra", "unknown"] = "unknown"
    driver: str | None = None
    devices: dict[str, str] = Field(default_factory=dict)  # uuid -> pool/device (DRA)


class NodeIncidentStatus(Contract):
    node: str
    phase: str = "detected"
    cause: str = ""
    summary: str = ""
    rung: str = ""
    attempt: int = 0


class NodeIncidentResult(Contract):
    node: str
    outcome: Literal["recovered", "healed", "escalated", "dry-run", "aborted", "disabled"]
    cause: str = ""
    rung: str = ""  # the rung that brought the GPUs back
    summary: str = ""
    diagnosis: NodeDiagnosis | None = None
    timeline: list[str] = Field(default_factory=list)


class NodeLaunch(Contract):
    """The sweep's request to start (or signal) a node incident."""

    incident: NodeIncidentInput
    task_queue: str | None = None


# --- activities (contract.activity): the name, the input model, the result model ------------
DIAGNOSE_NODE_GPUS = Activity(ACT_DIAGNOSE_NODE, DiagnoseNodeInput, NodeDiagnosis)
CONTAIN_NODE_GPUS = Activity(ACT_CONTAIN_NODE, ContainNodeInput, ContainNodeResult)
RELEASE_NODE_GPUS = Activity(ACT_RELEASE_NODE, ReleaseNodeInput, ContainNodeResult)
RESTART_GPU_PLUGIN = Activity(ACT_RESTART_GPU_PLUGIN, RestartPluginInput, RestartPluginResult)
WAIT_FOR_GPUS_BACK = Activity(ACT_WAIT_GPUS_BACK, WaitGpusBackInput, GpusBackResult)
FIND_GPU_PODS_ON_NODE = Activity(ACT_FIND_GPU_PODS, GpuPodsInput, GpuPodsResult)
