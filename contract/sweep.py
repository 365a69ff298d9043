"""The health sweep workflow and the sweep-cluster activity: input, findings, report, result."""

from __future__ import annotations

from datetime import timedelta
from typing import Literal

from pydantic import Field

from contract.activity import Activity
from contract.base import Contract, Duration
from contract.kube import Health, PodRef, SliceTaint
from contract.names import ACT_SWEEP_CLUSTER


class SweepInput(Contract):
    """Input of the `sickbay-health-sweep` workflow (what the Schedule starts)."""

    unknown_timeout: Duration = timedelta(minutes=5)  # Unknown this long counts as Unhealthy
    check_pods: bool = True  # pod allocatedResourcesStatus
    check_slice_taints: bool = True  # driver-set ResourceSlice device taints
    check_nodes: bool = True  # allocatable nvidia.com/gpu below capacity
    notify_channels: list[str] = Field(default_factory=list)  # vanished-GPU notices
    task_queue: str | None = None  # where device workflows start; None: the worker's
    dry_run: bool = False  # passed to the remediations the sweep starts
    cluster: str = ""  # SICKBAY_CLUSTER: in the remediations' and node notices' ids
    # The health watcher runs: a device this sweep had to START a remediation for was missed
    # by the watch (SweepResult.missed_by_watch, metric sickbay_sweep_missed_by_watch).
    watcher: bool = False


class SweepClusterInput(Contract):
    check_pods: bool = True
    check_slice_taints: bool = True
    check_nodes: bool = True
    only_unknown: list[str] = Field(default_factory=list)  # re-check: device keys still Unknown


class SweepFinding(Contract):
    """One unhealthy device (or, for `node-capacity`, one node) the sweep found."""

    kind: Literal["pod-health", "slice-taint", "node-capacity", "hami-health"]
    node: str | None = None
    gpu_uuid: str | None = None
    resource_id: str = ""  # driver/pool/device (DRA) or the device plugin's device id
    health: Health | None = None
    xid: int | None = None
    message: str = ""
    pods: list[PodRef] = Field(default_factory=list)
    taint: SliceTaint | None = None
    gpu_capacity: int | None = None
    gpu_allocatable: int | None = None
    # node-capacity: the GPUs it should have (count label / last seen), and whether they
    # vanished (a node incident) rather than being reported unhealthy (a notice).
    expected_gpus: int | None = None
    vanished: bool = False
    # vanished while planned work holds the GPUs (the MIG manager repartitioning them): what
    # it is, in words; the node incident waits for it (nodeIncident.plannedGrace).
    planned: str = ""

    @property
    def key(self) -> str:
        if self.node and self.gpu_uuid:
            return f"{self.node}/{self.gpu_uuid}"
        return self.resource_id or f"{self.node}/nvidia.com/gpu"


class SweepReport(Contract):
    findings: list[SweepFinding] = Field(default_factory=list)  # mapped to node + UUID
    # Health entries no device could be found for (pod + id + why): a WARNING, notified.
    unresolved: list[SweepFinding] = Field(default_factory=list)
    nodes: list[SweepFinding] = Field(default_factory=list)  # node-capacity findings
    # Nodes whose GPU plugin pod is starting or being replaced (a rollout): that the plugin
    # offers none of their GPUs meanwhile is no notice.
    plugins_starting: list[str] = Field(default_factory=list)
    pods_checked: int = 0
    slices_checked: int = 0
    nodes_checked: int = 0


class SweepResult(Contract):
    devices: list[str] = Field(default_factory=list)  # device keys acted on
    started: list[str] = Field(default_factory=list)  # workflow ids started
    signalled: list[str] = Field(default_factory=list)  # workflow ids signalled
    notified_nodes: list[str] = Field(default_factory=list)
    unresolved: list[str] = Field(default_factory=list)
    notified_unresolved: list[str] = Field(default_factory=list)  # "<ns>/<pod> <resourceID>"
    unknown_cleared: list[str] = Field(default_factory=list)  # Unknown, then healthy again
    missed_by_watch: list[str] = Field(default_factory=list)  # started here, not by the watcher
    node_incidents: list[str] = Field(default_factory=list)  # node incident ids started/signalled


# --- activities (contract.activity): the name, the input model, the result model ------------
SWEEP_CLUSTER = Activity(ACT_SWEEP_CLUSTER, SweepClusterInput, SweepReport)
