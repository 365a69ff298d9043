"""The Kubernetes boundary: device identity (DeviceRef, ResolvedDevice, DraDevice, PodRef,
OwnerRef) and the inputs and results of the kube activities (resolve, evidence, consumers,
count, quarantine, evict, waits, release, health, events, cordon).
"""

from __future__ import annotations

from datetime import timedelta
from typing import Literal

from pydantic import Field, model_validator

from contract.activity import Activity
from contract.base import Contract, Duration
from contract.names import (
    ACT_CHECK_HEALTH,
    ACT_CORDON,
    ACT_COUNT_DEVICES,
    ACT_EVICT_PODS,
    ACT_FIND_CONSUMERS,
    ACT_GATHER_EVIDENCE,
    ACT_PREVIEW_QUARANTINE,
    ACT_QUARANTINE,
    ACT_RECORD_EVENT,
    ACT_RELEASE_QUARANTINE,
    ACT_RESOLVE_DEVICE,
    ACT_WAIT_EVICTION,
    ACT_WAIT_REPLACEMENT,
    TAINT_KEY,
    device_workflow_id,
)

Health = Literal["Healthy", "Unhealthy", "Unknown"]
TaintEffect = Literal["None", "NoSchedule", "NoExecute"]
ClusterMode = Literal["dra", "device-plugin"]


class DeviceRef(Contract):
    """What a trigger knows about a device. Any one of these forms is enough:

    - `node` + `gpu_uuid` (dcgm-exporter `Hostname` + `UUID`; device plugin: node + device ID);
    - `node` + `gpu_index` (resolved to a UUID by an activity);
    - `driver` + `pool` + `device` (a DRA device name).
    """

    node: str | None = None
    gpu_uuid: str | None = None
    gpu_index: int | None = Field(default=None, ge=0)
    driver: str | None = None
    pool: str | None = None
    device: str | None = None

    @model_validator(mode="after")
    def _enough_to_find(self) -> DeviceRef:
        dra = self.driver and self.pool and self.device
        physical = self.node and (self.gpu_uuid or self.gpu_index is not None)
        if not (dra or physical):
            raise ValueError(
                "a device needs node + gpu_uuid, node + gpu_index, or driver + pool + device"
            )
        return self

    @property
    def canonical(self) -> bool:
        """True when the workflow id can be computed without a cluster call."""
        return bool(self.node and self.gpu_uuid)

    @property
    def key(self) -> str:
        """`<node>/<gpu-uuid>` when known, else the DRA name or `<node>/index-<i>`."""
        if self.node and self.gpu_uuid:
            return f"{self.node}/{self.gpu_uuid}"
        if self.driver and self.pool and self.device:
            return f"{self.driver}/{self.pool}/{self.device}"
        return f"{self.node}/index-{self.gpu_index}"

    def workflow_id(self, cluster: str = "") -> str:
        if not (self.node and self.gpu_uuid):
            raise ValueError(
                f"device {self.key} must be resolved to node + GPU UUID before it has a workflow id"
            )
        return device_workflow_id(self.node, self.gpu_uuid, cluster)


class DraDevice(Contract):
    driver: str
    pool: str
    device: str

    @property
    def resource_id(self) -> str:
        """The `resourceID` form used in pod `allocatedResourcesStatus`."""
        return f"{self.driver}/{self.pool}/{self.device}"


class ResolvedDevice(Contract):
    """A physical GPU as the cluster knows it, with every device that shares it."""

    node: str
    gpu_uuid: str
    gpu_index: int | None = None
    product: str | None = None
    mode: ClusterMode = "dra"
    devices: list[DraDevice] = Field(default_factory=list)  # MIG slices / vGPUs / replicas
    device_class: str | None = None
    node_pool: str | None = None  # value of the node's pool label, if any
    taint_api_version: str | None = None  # "v1" | "v1beta2" | "v1alpha3" | None (not served)
    # Device plugin: the node's GPUs are shared by HAMi (hami.io/node-nvidia-register), whose
    # pod annotations say which pods hold this GPU (activities/kube/hami.py).
    hami: bool = False

    @property
    def key(self) -> str:
        return f"{self.node}/{self.gpu_uuid}"

    def workflow_id(self, cluster: str = "") -> str:
        return device_workflow_id(self.node, self.gpu_uuid, cluster)


class PodRef(Contract):
    namespace: str
    name: str
    uid: str | None = None


class OwnerRef(Contract):
    kind: str
    name: str
    namespace: str
    uid: str | None = None


class ResolveDeviceInput(Contract):
    device: DeviceRef


class HealthReport(Contract):
    namespace: str
    pod: str
    container: str
    resource_id: str  # as the kubelet wrote it: a device key, a CDI device id or a UUID
    health: Health
    message: str = ""
    device: str = ""  # driver/pool/device the entry was resolved to when the id is not one


class SliceTaint(Contract):
    key: str
    value: str = ""
    effect: TaintEffect
    device: str = ""

    @property
    def driver_health(self) -> bool:
        """A taint the driver's health checks put on the device (NVIDIA DRA driver: an Xid,
        a lost GPU): evidence that the device itself is sick, unlike a person's taint."""
        return self.key in DRIVER_HEALTH_TAINT_KEYS or self.key.endswith("/gpu-lost")


# Driver taints that mean the device itself is sick (NVIDIA DRA driver health checks).
DRIVER_HEALTH_TAINT_KEYS = ("gpu.nvidia.com/xid", "gpu.nvidia.com/gpu-lost")


class EvidenceInput(Contract):
    device: ResolvedDevice


class Evidence(Contract):
    """What the cluster says about a device right now."""

    health: Health | None = None  # worst report across consumers; None = nobody reports
    reports: list[HealthReport] = Field(default_factory=list)
    slice_taints: list[SliceTaint] = Field(default_factory=list)
    gpu_capacity: int | None = None  # device plugin: node capacity nvidia.com/gpu
    gpu_allocatable: int | None = None
    recent_events: list[str] = Field(default_factory=list)
    device_present: bool = True  # still published in a ResourceSlice / node capacity


class Consumer(Contract):
    pod: PodRef
    node: str | None = None
    phase: str = ""
    terminating: bool = False
    claim: str | None = None
    owner: OwnerRef | None = None  # direct owner (e.g. ReplicaSet)
    top_owner: OwnerRef | None = None  # top controller (Deployment, StatefulSet, Job, JobSet)
    labels: dict[str, str] = Field(default_factory=dict)
    namespace_labels: dict[str, str] = Field(default_factory=dict)
    priority_class: str | None = None


class FindConsumersInput(Contract):
    device: ResolvedDevice
    alert_pods: list[PodRef] = Field(default_factory=list)  # device plugin: from DCGM labels


class ConsumersResult(Contract):
    consumers: list[Consumer] = Field(default_factory=list)


class CountDevicesInput(Contract):
    """Count the pool `node_pool`, or (without it) the pool of `node` as the cluster's node
    list labels it: a remediation counts while it is still resolving the device."""

    node_pool: str | None = None
    node: str | None = None


class DeviceCounts(Contract):
    pool_devices: int = 0  # physical GPUs in the pool
    cluster_devices: int = 0
    pool_quarantined: int = 0  # physical GPUs under a Sickbay quarantine
    cluster_quarantined: int = 0
    node_pool: str | None = None  # the pool counted (None: no pool, or none asked for)


class QuarantineInput(Contract):
    device: ResolvedDevice
    effect: TaintEffect = "NoExecute"
    taint_key: str = TAINT_KEY
    taint_value: str = "unhealthy"
    workflow_id: str
    reason: str = ""
    consumers: list[PodRef] = Field(default_factory=list)  # for the fallback path
    fallback_node_threshold: int = 0  # taint the node when healthy GPUs < this
    dry_run: bool = False


class QuarantineResult(Contract):
    mode: Literal["rule", "fallback", "dry-run"]
    rule_name: str | None = None
    api_version: str | None = None
    action: Literal["created", "updated", "unchanged", "skipped"] = "created"
    evicted: list[PodRef] = Field(default_factory=list)  # fallback: pods evicted
    blocked: list[PodRef] = Field(default_factory=list)  # fallback: PDB refused
    node_tainted: bool = False
    node_cordoned: bool = False  # churn stopped by cordoning the node (undone on release)
    would_evict: list[PodRef] = Field(default_factory=list)  # preview
    message: str = ""
    # rule name -> uid of the rule(s) this quarantine made or adopted: release deletes with a
    # uid precondition (one request, only that very rule) instead of list-then-delete.
    rule_uids: dict[str, str] = Field(default_factory=dict)
    hami_cordon: bool = False  # HAMi: the GPU is in its node's hami.io/device-cordon
    # Set when the GPU alone could not be quarantined and its whole node was tainted instead
    # (HAMi without a per-GPU cordon): why, for the escalation that says so.
    node_level: str = ""


class EvictPodsInput(Contract):
    pods: list[PodRef]
    workflow_id: str
    reason: str = ""
    delete_if_blocked: bool = False  # force: delete pods the PDB protects
    dry_run: bool = False
    # Retry evictions a PodDisruptionBudget blocks (429), with backoff, for this long.
    retry_blocked_for: Duration | None = None


class EvictPodsResult(Contract):
    evicted: list[PodRef] = Field(default_factory=list)
    deleted: list[PodRef] = Field(default_factory=list)
    blocked: list[PodRef] = Field(default_factory=list)  # 429 from a PodDisruptionBudget
    gone: list[PodRef] = Field(default_factory=list)  # already absent
    # Why each still-blocked pod was refused: "<ns>/<pod>: The disruption budget X needs ...".
    budgets: list[str] = Field(default_factory=list)
    attempts: int = 1  # rounds of Eviction API calls (retries of blocked pods + 1)


class WaitEvictionInput(Contract):
    pods: list[PodRef]
    timeout: Duration = timedelta(minutes=5)


class EvictionReport(Contract):
    gone: list[PodRef] = Field(default_factory=list)
    remaining: list[PodRef] = Field(default_factory=list)
    timed_out: bool = False


class PodState(Contract):
    pod: PodRef
    phase: str
    node: str | None = None
    devices: list[str] = Field(default_factory=list)  # resource ids allocated
    message: str = ""  # Unschedulable message, CrashLoopBackOff, ...


class WaitReplacementInput(Contract):
    owners: list[OwnerRef]
    old_pods: list[PodRef] = Field(default_factory=list)
    tainted: list[DraDevice] = Field(default_factory=list)
    # HAMi: `<node>/<uuid>` of the quarantined GPU; a replacement HAMi's record places on it
    # counts as placed on a tainted device (the scheduler ignored the quarantine).
    hami_gpu: str = ""
    churn_evictions: int = 3  # evictions of the same owner that mean "scheduler ignores taints"
    # The effect of the rule on `tainted` now. NoExecute: the device-taint manager evicts a
    # pod the scheduler wrongly places there, so `churn_evictions` of them make churn.
    # NoSchedule (mode eviction-api before its backstop; onChurn noschedule): nothing evicts
    # it, it runs on the failed GPU, so one replacement bound to a tainted device is churn.
    rule_effect: TaintEffect = "NoExecute"
    # The watch has no deadline: it runs until the replacements run, churn is seen or no
    # owner needs one, and the workflow cancels it when its deadline timer fires. `look_once`:
    # list the pods once and report what is there (the workflow's look at its deadline).
    look_once: bool = False


class ChurnDiagnosis(Contract):
    owner: OwnerRef
    evictions: int
    diagnosis: str
    # Replacements bound to a tainted device and still there (under NoSchedule: nothing
    # evicts them; the churn stop moves them off the failed GPU).
    bound: list[PodRef] = Field(default_factory=list)


class ReplacementReport(Contract):
    status: Literal["running", "pending", "churn", "no-replacement-needed"]
    pods: list[PodState] = Field(default_factory=list)
    unschedulable_message: str = ""
    churn: ChurnDiagnosis | None = None


class ReleaseInput(Contract):
    device: ResolvedDevice
    rule_name: str | None = None
    api_version: str | None = None
    node_tainted: bool = False
    workflow_id: str
    reason: str = ""
    rule_uids: dict[str, str] = Field(default_factory=dict)  # from QuarantineResult


class ReleaseResult(Contract):
    removed: bool
    message: str = ""


class CheckHealthInput(Contract):
    device: ResolvedDevice


class HealthResult(Contract):
    health: Health | None = None
    message: str = ""


class EventTarget(Contract):
    api_version: str
    kind: str
    name: str
    namespace: str | None = None
    uid: str | None = None
    count: int = 1  # aggregated Events: how many times this reason was told about this object


class RecordEventInput(Contract):
    targets: list[EventTarget]
    reason: str
    message: str
    type: Literal["Normal", "Warning"] = "Normal"
    workflow_id: str
    # One Event per (workflow, object, reason), its `count` set from the target (PATCHed when
    # above 1), as the kubelet aggregates: a repeated decision raises the count, not the list.
    aggregate: bool = False
    # What aggregates: one remediation (its first run's id, kept across continue-as-new), so a
    # later incident of the same GPU (same workflow id) gets Events of its own.
    series: str = ""


class CordonInput(Contract):
    node: str
    cordon: bool = True
    workflow_id: str


class CordonResult(Contract):
    changed: bool
    message: str = ""


# --- activities (contract.activity): the name, the input model, the result model ------------
RESOLVE_DEVICE = Activity(ACT_RESOLVE_DEVICE, ResolveDeviceInput, ResolvedDevice)
GATHER_EVIDENCE = Activity(ACT_GATHER_EVIDENCE, EvidenceInput, Evidence)
FIND_CONSUMERS = Activity(ACT_FIND_CONSUMERS, FindConsumersInput, ConsumersResult)
COUNT_DEVICES = Activity(ACT_COUNT_DEVICES, CountDevicesInput, DeviceCounts)
QUARANTINE_DEVICE = Activity(ACT_QUARANTINE, QuarantineInput, QuarantineResult)
PREVIEW_QUARANTINE = Activity(ACT_PREVIEW_QUARANTINE, QuarantineInput, QuarantineResult)
EVICT_PODS = Activity(ACT_EVICT_PODS, EvictPodsInput, EvictPodsResult)
WAIT_FOR_EVICTION = Activity(ACT_WAIT_EVICTION, WaitEvictionInput, EvictionReport)
WAIT_FOR_REPLACEMENT = Activity(ACT_WAIT_REPLACEMENT, WaitReplacementInput, ReplacementReport)
RELEASE_QUARANTINE = Activity(ACT_RELEASE_QUARANTINE, ReleaseInput, ReleaseResult)
CHECK_DEVICE_HEALTH = Activity(ACT_CHECK_HEALTH, CheckHealthInput, HealthResult)
RECORD_EVENT = Activity(ACT_RECORD_EVENT, RecordEventInput, type(None))
CORDON_NODE = Activity(ACT_CORDON, CordonInput, CordonResult)
