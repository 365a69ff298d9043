"""The shared contract: workflow inputs/results, message payloads, activity inputs/outputs and
the Runbook schema.

Everything that crosses a Temporal boundary is one of these pydantic models and travels
through `temporalio.contrib.pydantic.pydantic_data_converter`. Rules:
- one `XxxInput` / `XxxResult` per boundary; new fields are always defaulted so recorded
  histories keep replaying;
- no secrets: credentials are read by activities from env or files, never carried here;
- this module imports only the stdlib, pydantic and `workflows.constants`, so workflows can
  import it inside the sandbox.
"""

from __future__ import annotations

import re
from datetime import UTC, datetime, timedelta
from enum import StrEnum
from typing import Annotated, Any, ClassVar, Literal

from pydantic import (
    AliasChoices,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    PlainSerializer,
    Strict,
    ValidationError,
    field_validator,
    model_validator,
)
from pydantic.alias_generators import to_camel
from pydantic_core import PydanticCustomError

from workflows.constants import TAINT_KEY, check_cluster_name, device_workflow_id

# --------------------------------------------------------------------------------------------
# Small types
# --------------------------------------------------------------------------------------------

_DURATION_PART = re.compile(r"(\d+(?:\.\d+)?)(ms|s|m|h|d)")


def parse_duration(value: Any) -> Any:
    """Accept `90`, `"90s"`, `"5m"`, `"1h30m"`, `"2d"` as well as ISO 8601 / timedelta."""
    if isinstance(value, timedelta):
        return value
    try:
        if isinstance(value, int | float) and not isinstance(value, bool):
            return timedelta(seconds=value)
        if isinstance(value, str):
            text = value.strip()
            if re.fullmatch(r"(?:\d+(?:\.\d+)?(?:ms|s|m|h|d))+", text):
                unit = {"ms": 0.001, "s": 1, "m": 60, "h": 3600, "d": 86400}
                total = sum(float(n) * unit[u] for n, u in _DURATION_PART.findall(text))
                return timedelta(seconds=total)
            if re.fullmatch(r"\d+(?:\.\d+)?", text):
                return timedelta(seconds=float(text))
    except OverflowError:  # e.g. 1e20 seconds: a validation error, not a crash
        raise ValueError(f"duration {value!r} is out of range") from None
    return value  # let pydantic try ISO 8601 and report a clear error


def _format_duration(value: timedelta) -> str:
    seconds = value.total_seconds()
    if seconds and seconds % 3600 == 0:
        return f"{int(seconds // 3600)}h"
    if seconds and seconds % 60 == 0:
        return f"{int(seconds // 60)}m"
    if seconds == int(seconds):
        return f"{int(seconds)}s"
    return f"{seconds}s"


format_duration = _format_duration  # `5m`, `1h`, `30s`: how durations read in the Web UI

Duration = Annotated[
    timedelta,
    BeforeValidator(parse_duration),
    PlainSerializer(_format_duration, return_type=str, when_used="json"),
]
"""A duration written as `30s`, `5m`, `1h30m` or seconds; serialised back as `5m`."""

Health = Literal["Healthy", "Unhealthy", "Unknown"]
FailureClass = Literal["unhealthy", "degraded", "application", "unknown"]
TaintEffect = Literal["None", "NoSchedule", "NoExecute"]
ClusterMode = Literal["dra", "device-plugin"]
Trigger = Literal["alert", "sweep", "watch", "manual", "ui", "maintenance"]
# A JSON boolean only: `"dry_run": "true"` (or "yes", 1) is refused with a clear error rather
# than coerced, so a launch typed by hand in the Web UI means exactly what it says.
StrictBool = Annotated[bool, Strict()]


class Phase(StrEnum):
    """Where a remediation is; also the `SickbayPhase` search attribute."""

    RECEIVED = "received"
    CONFIRMING = "confirming"
    GUARDING = "guarding"
    AWAITING_APPROVAL = "awaiting-approval"
    QUARANTINING = "quarantining"
    EVICTING = "evicting"
    AWAITING_REPLACEMENT = "awaiting-replacement"
    SCALING = "scaling"
    ESCALATED = "escalated"
    HOLDING = "holding"
    RELEASING = "releasing"
    CLOSED = "closed"


class Contract(BaseModel):
    """Base of every boundary model: JSON-friendly, strict about unknown fields."""

    model_config = ConfigDict(extra="forbid")


# --------------------------------------------------------------------------------------------
# Identity
# --------------------------------------------------------------------------------------------


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


# --------------------------------------------------------------------------------------------
# Messages into the remediation workflow
# --------------------------------------------------------------------------------------------


class AlertEvidence(Contract):
    """One alert (or sweep finding) about a device."""

    source: Literal["alertmanager", "sweep", "watch", "manual"] = "manual"
    alertname: str = ""
    fingerprint: str = ""
    xid: int | None = None
    starts_at: datetime | None = None
    received_at: datetime | None = None
    summary: str = ""
    labels: dict[str, str] = Field(default_factory=dict)
    pod: PodRef | None = None  # dcgm-exporter's pod mapping, when present
    # The class the alert itself stands for (its rule: ECC double-bit -> unhealthy, NVLink ->
    # degraded, ...); None: classified by `xid`. Never derived from a counter's value.
    failure_class: FailureClass | None = None


class HandledAlert(Contract):
    """One Alertmanager alert instance a run handled: its fingerprint and startsAt (constant
    over one firing episode; a new firing after resolution gets a new startsAt)."""

    fingerprint: str
    starts_at: datetime | None = None

    def key(self) -> tuple[str, str]:
        return instance_key(self.fingerprint, self.starts_at)


def instance_key(fingerprint: str, starts_at: datetime | None) -> tuple[str, str]:
    """(fingerprint, startsAt in UTC): one instant is one key, whatever offset it came in."""
    if starts_at is None:
        return (fingerprint, "")
    at = starts_at.astimezone(UTC) if starts_at.tzinfo is not None else starts_at
    return (fingerprint, at.isoformat())


class AlertResolved(Contract):
    fingerprint: str = ""
    alertname: str = ""
    ends_at: datetime | None = None


class AbortRequest(Contract):
    reason: str = Field(min_length=1)
    actor: str = "unknown"


class RepairedRequest(Contract):
    actor: str = "unknown"
    note: str = ""


class ApprovalDecision(Contract):
    approve: bool
    actor: str = Field(min_length=1)
    reason: str = ""


class ApprovalResult(Contract):
    accepted: bool
    phase: Phase


class MaintenanceSelector(Contract):
    """Devices chosen for a planned drain: every field set must match."""

    nodes: list[str] = Field(default_factory=list)
    node_labels: dict[str, str] = Field(default_factory=dict)
    driver: str | None = None
    device_attributes: dict[str, str] = Field(default_factory=dict)  # e.g. driverVersion

    @model_validator(mode="after")
    def _not_everything(self) -> MaintenanceSelector:
        if not (self.nodes or self.node_labels or self.device_attributes):
            raise ValueError(
                "a maintenance selector needs nodes, node_labels or device_attributes; "
                "it never selects every device in the cluster"
            )
        return self


# --------------------------------------------------------------------------------------------
# Workflow inputs and results
# --------------------------------------------------------------------------------------------


class RemediationInput(Contract):
    """Input of `remediate-gpu-device`. Only `device` is required, so the Web UI's
    "Start workflow" form can launch it with `{"device": {"node": "n1", "gpu_uuid": "GPU-..."}}`.
    """

    device: DeviceRef
    alerts: list[AlertEvidence] = Field(default_factory=list)
    trigger: Trigger = "ui"
    runbook: str | None = None  # pin a runbook by name; else matched from consumers
    dry_run: StrictBool = False
    requested_by: str = "unknown"
    reason: str = ""
    # The Sickbay cluster (SICKBAY_CLUSTER) the device is in; part of the workflow id and the
    # `SickbayCluster` search attribute. "" for the unnamed single-cluster deployment.
    cluster: str = ""
    # Set only by the workflow itself when it continues-as-new during a long hold.
    resume: RemediationCarry | None = None
    # Alert instances an earlier run of this device handled (the webhook reads them from that
    # run's result): never evidence again, and listed in this run's result too.
    handled_before: list[HandledAlert] = Field(default_factory=list)

    @field_validator("cluster")
    @classmethod
    def _cluster_name(cls, value: str) -> str:
        return check_cluster_name(value)


class MaintenanceInput(Contract):
    selector: MaintenanceSelector
    runbook: str = "maintenance"
    reason: str = Field(default="planned maintenance", min_length=1)
    requested_by: str = "unknown"
    dry_run: StrictBool = False


class LaunchRequest(Contract):
    """Input of the `signal-with-start-remediation` activity (sweep, maintenance): start the
    device's remediation or, when one runs, hand it the evidence."""

    remediation: RemediationInput
    evidence: AlertEvidence | None = None  # None: a manual-launch evidence entry is sent
    task_queue: str | None = None  # None: the worker's / caller's configured queue


class LaunchResult(Contract):
    workflow_id: str
    run_id: str | None = None
    started: bool  # True: a new run started; False: an existing run was signalled
    device: str = ""


class SelectDevicesInput(Contract):
    selector: MaintenanceSelector


class SelectedDevices(Contract):
    devices: list[ResolvedDevice] = Field(default_factory=list)


class AwaitRemediationInput(Contract):
    """Wait until a remediation reaches one of `phases` (or closes)."""

    workflow_id: str
    phases: list[Phase] = Field(default_factory=list)
    poll_interval: Duration = timedelta(seconds=5)


class AwaitRemediationResult(Contract):
    workflow_id: str
    phase: Phase | None = None
    closed: bool = False
    outcome: str | None = None


class MaintenanceResult(Contract):
    devices: list[str] = Field(default_factory=list)  # device keys selected
    launched: list[LaunchResult] = Field(default_factory=list)
    finished: list[AwaitRemediationResult] = Field(default_factory=list)
    dry_run: bool = False


class BudgetLease(Contract):
    holder: str  # remediation workflow id
    device_key: str
    node_pool: str | None = None
    acquired_at: datetime | None = None


class BudgetWaiter(Contract):
    """A remediation refused by the budget, told (signal) when a slot frees."""

    holder: str  # remediation workflow id
    node_pool: str | None = None


class BudgetState(Contract):
    """Input of the `sickbay-budget` workflow and its continue-as-new state."""

    leases: list[BudgetLease] = Field(default_factory=list)
    waiters: list[BudgetWaiter] = Field(default_factory=list)  # oldest first
    reconcile_interval: Duration = timedelta(minutes=5)
    max_updates_per_run: int = Field(default=500, ge=1)  # continue-as-new after this many


class RejectedAlerts(Contract):
    """Alerts a webhook process could not use since its last report (signal `rejected`)."""

    at: datetime
    counts: dict[str, int] = Field(default_factory=dict)  # reason -> alerts
    examples: dict[str, list[str]] = Field(default_factory=dict)  # reason -> a few, in words


class RejectionCount(Contract):
    reason: str
    count: int = 0
    first_at: datetime
    last_at: datetime
    examples: list[str] = Field(default_factory=list)  # the latest few


class EscalationClaim(Contract):
    """A remediation asking to page for a cause on a node (unresolvable devices): the first
    in `window` pages, the others are told who did."""

    cause: str
    node: str
    holder: str  # the asking workflow's id
    window: Duration = timedelta(minutes=30)
    detail: str = ""


class EscalationClaimRecord(Contract):
    cause: str
    node: str
    holder: str
    at: datetime
    window: Duration = timedelta(minutes=30)
    suppressed: int = 0
    detail: str = ""


class EscalationClaimResult(Contract):
    granted: bool
    holder: str = ""  # who pages (this caller when granted)
    since: datetime | None = None
    suppressed: int = 0  # pages not sent for this cause and node in the window so far


class RejectionsState(Contract):
    """Input of `sickbay-rejections` and its continue-as-new state."""

    reasons: list[RejectionCount] = Field(default_factory=list)
    claims: list[EscalationClaimRecord] = Field(default_factory=list)
    keep: Duration = timedelta(hours=24)  # a reason not seen for this long is forgotten
    max_events_per_run: int = Field(default=1000, ge=1)


class RejectionsSummary(Contract):
    reasons: list[RejectionCount] = Field(default_factory=list)
    claims: list[EscalationClaimRecord] = Field(default_factory=list)


class ReconcileLeasesInput(Contract):
    holders: list[str] = Field(default_factory=list)


class ReconcileLeasesResult(Contract):
    closed: list[str] = Field(default_factory=list)  # holders whose workflow is not running


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

    kind: Literal["pod-health", "slice-taint", "node-capacity"]
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


class TimelineEntry(Contract):
    at: datetime
    phase: Phase
    action: str
    outcome: str = ""
    # Who did it. For a person's abort / repaired / approve: the actor the request *claims*
    # (typed by the caller, never checked) and the Temporal client identity the server
    # recorded with the signal or update ("unknown" when the worker could not read it).
    actor: str = "sickbay"
    reason: str = ""
    client_identity: str | None = None

    def who(self) -> str:
        """`""` for Sickbay itself; else the actor, marked as claimed beside the client
        identity when the entry came from a person's signal or update."""
        if self.client_identity is not None:
            return f"claimed actor {self.actor}; Temporal client {self.client_identity}"
        return "" if self.actor == "sickbay" else self.actor


Outcome = Literal[
    "released",  # quarantined, then repaired/healthy and released
    "not-quarantined",  # application error, stale evidence, healthy device, ignore policy
    "escalated",  # automation stopped; people were told
    "aborted",
    "dry-run",
    "failed",
]


class RemediationStatus(Contract):
    workflow_id: str
    device: str
    node: str | None = None
    phase: Phase = Phase.RECEIVED
    failure_class: FailureClass | None = None
    workload_class: str | None = None
    runbook: str | None = None
    rule_name: str | None = None
    consumers: list[PodRef] = Field(default_factory=list)
    awaiting: str = ""  # what the workflow waits for, in words
    until: datetime | None = None  # when that wait ends by itself (timeout, deadline, retry)
    next_action: str = ""  # what the workflow does next, in words
    started_at: datetime | None = None
    updated_at: datetime | None = None
    outcome: Outcome | None = None
    alerts: int = 0  # distinct pieces of evidence (deduplicated by fingerprint)
    duplicate_alerts: int = 0  # repeats ignored
    escalation_reason: str | None = None
    dry_run: bool = False


class RemediationResult(Contract):
    outcome: Outcome
    reason: str = ""
    status: RemediationStatus
    timeline: list[TimelineEntry] = Field(default_factory=list)
    # Alertmanager alert instances this run (and the ones before it) handled: a repeat of one
    # of them never starts another run (the webhook answers `already-handled`).
    handled_alerts: list[HandledAlert] = Field(default_factory=list)


# --------------------------------------------------------------------------------------------
# Activity inputs and outputs
# --------------------------------------------------------------------------------------------


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
    node_pool: str | None = None


class DeviceCounts(Contract):
    pool_devices: int = 0  # physical GPUs in the pool
    cluster_devices: int = 0
    pool_quarantined: int = 0  # physical GPUs under a Sickbay quarantine
    cluster_quarantined: int = 0


class BudgetLeaseRequest(Contract):
    holder: str  # workflow id
    device_key: str
    node_pool: str | None = None
    pool_limit: int = Field(ge=0)
    cluster_limit: int = Field(ge=0)
    # Quarantines the cluster shows right now (count-devices): rules whose lease was lost
    # (budget workflow reset, terminated remediation) still count against the budget.
    observed_pool_quarantined: int = Field(default=0, ge=0)
    observed_cluster_quarantined: int = Field(default=0, ge=0)


class BudgetDecision(Contract):
    granted: bool
    reason: str = ""
    pool_in_use: int = 0
    cluster_in_use: int = 0


class BudgetReleaseRequest(Contract):
    holder: str
    device_key: str


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
    deadline: Duration = timedelta(minutes=30)
    churn_evictions: int = 3  # evictions of the same owner that mean "scheduler ignores taints"


class ChurnDiagnosis(Contract):
    owner: OwnerRef
    evictions: int
    diagnosis: str


class ReplacementReport(Contract):
    status: Literal["running", "pending", "churn", "no-replacement-needed"]
    pods: list[PodState] = Field(default_factory=list)
    unschedulable_message: str = ""
    churn: ChurnDiagnosis | None = None
    deadline_passed: bool = False


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


# --------------------------------------------------------------------------------------------
# Capacity (node pools) and notifications
# --------------------------------------------------------------------------------------------


class NodePoolTarget(Contract):
    """Where a node pool lives. Identifiers only; credentials come from the worker's env."""

    provider: Literal["gke", "aks", "cluster-api", "http", "sim"]
    name: str  # the pool's name at the provider
    node_pool_label: str | None = None  # value of the node label that marks the pool
    project: str | None = None  # GKE
    location: str | None = None  # GKE
    cluster: str | None = None  # GKE, AKS
    subscription: str | None = None  # AKS
    resource_group: str | None = None  # AKS
    namespace: str | None = None  # Cluster API MachineDeployment namespace
    endpoint: str | None = None  # http / sim: base URL (no credentials in it)
    profile: str | None = None  # http: name of a request profile configured on the worker


class CapacityRequest(Contract):
    pool: NodePoolTarget
    need: int = Field(default=1, ge=1)  # extra devices (or nodes, by step) needed
    step: int = Field(default=1, ge=1)
    max_size: int = Field(ge=0)
    cooldown: Duration = timedelta(minutes=10)
    requester: str  # workflow id
    idempotency_key: str


class CapacityResult(Contract):
    status: Literal["requested", "in-progress", "satisfied", "at-max", "cooldown", "rejected"]
    target_size: int | None = None
    current_size: int | None = None
    operation: str | None = None
    message: str = ""


class Incident(Contract):
    id: str  # workflow id; also the PagerDuty dedup key
    device: str
    node: str | None = None
    workload: str | None = None
    phase: Phase
    severity: Literal["critical", "error", "warning", "info"] = "error"
    # Why people are told (the escalation reason: budget-exhausted, no-capacity, ...) and the
    # device's node pool: what a channel can group a storm of incidents by.
    reason: str | None = None
    node_pool: str | None = None
    cluster: str | None = None  # SICKBAY_CLUSTER of the GPU (None: the unnamed cluster)
    summary: str
    done: list[str] = Field(default_factory=list)
    needed: str = ""
    ui_url: str | None = None
    timeline: list[TimelineEntry] = Field(default_factory=list)


class NotifyInput(Contract):
    channel: str  # name of a channel configured on the worker
    action: Literal["trigger", "acknowledge", "resolve"] = "trigger"
    incident: Incident


class NotifyResult(Contract):
    channel: str
    delivered: bool
    detail: str = ""
    attempt: int = 1  # which try delivered it (Temporal retries the activity)
    earlier_failures: list[str] = Field(default_factory=list)  # one line per failed try
    delivered_via: str | None = None  # set when a channel's fallback delivered it


# Node-pool providers (activities/cloud) and the pool scaler workflow (workflows/pool_scaler.py).
# CapacityResult.status, as the pool scaler replies to each need:
#   satisfied   - the provider finished resizing the pool to target_size (or a resize already
#                 in flight / just finished covers this need)
#   in-progress - the resize was requested but had not finished within the operation timeout
#   requested   - the provider accepted the new size and offers no operation to follow
#   at-max      - the pool is already at the runbook's (or provider's) max size; nothing asked
#   cooldown    - the pool was resized less than the cool-down ago; nothing asked
#   rejected    - the provider refused (quota, auth, invalid) or stayed unavailable; `message`
#                 carries the provider's words


class PoolOperation(Contract):
    """A provider's long-running resize operation."""

    id: str  # provider operation name / URL / synthetic id, opaque to the workflow
    done: bool = False
    error: str | None = None  # provider's message when the operation failed
    target_size: int | None = None


class PoolDescription(Contract):
    current_size: int = Field(ge=0)  # nodes the provider is asked to run now (target size)
    min_size: int | None = None  # provider-side autoscaling bounds, when it has them
    max_size: int | None = None
    pending_operation: PoolOperation | None = None  # a resize still running on the pool
    detail: str = ""


class DescribePoolInput(Contract):
    pool: NodePoolTarget


class ScalePoolInput(Contract):
    pool: NodePoolTarget
    target_size: int = Field(ge=0)
    max_size: int = Field(ge=0)  # checked again by the activity: never above it
    idempotency_key: str = Field(min_length=1)
    dry_run: bool = False


class ScalePoolResult(Contract):
    previous_size: int | None = None
    target_size: int  # the size actually asked for (providers may round per zone)
    operation: PoolOperation | None = None  # None: nothing to follow (no-op, dry run, sync API)
    adopted: bool = False  # `operation` was already running on the pool; nothing new was asked
    message: str = ""


class PoolOperationInput(Contract):
    pool: NodePoolTarget
    operation: str


class PoolScalerInput(Contract):
    """Input of `sickbay-pool-scaler`, one workflow per node pool; also its continue-as-new
    state. Operational knobs come from the worker that starts it (ACT_REQUEST_CAPACITY)."""

    pool: NodePoolTarget
    batch_window: Duration = timedelta(seconds=10)  # gather concurrent needs into one request
    poll_interval: Duration = timedelta(seconds=15)  # how often to look at a resize operation
    operation_timeout: Duration = timedelta(minutes=12)  # then reply in-progress
    idle_timeout: Duration = timedelta(hours=1)  # finish after this long with nothing to do
    dry_run: bool = False
    rounds_per_run: int = Field(default=100, ge=1)  # continue-as-new after this many rounds
    # carried across continue-as-new
    rounds: int = 0
    last_scaled_at: datetime | None = None
    last_cooldown: Duration = timedelta(0)
    last_target: int | None = None
    headroom: int = 0  # nodes of the last resize that no need has claimed yet
    refused_until: datetime | None = None  # provider refused (quota, auth): not asked again
    last_refusal: str = ""  # ... before this time; needs get this message instead
    recent: dict[str, CapacityResult] = Field(default_factory=dict)  # idempotency key -> reply


class PoolScalerStatus(Contract):
    pool: str
    state: Literal["idle", "batching", "describing", "scaling", "waiting-operation"] = "idle"
    waiting: int = 0  # needs waiting for a reply
    rounds: int = 0
    provider_requests: int = 0  # resize requests sent in this run
    last_scaled_at: datetime | None = None
    last_target: int | None = None
    last_result: CapacityResult | None = None


# --------------------------------------------------------------------------------------------
# Runbooks (YAML: apiVersion sickbay/v1, kind Runbook). Keys are camelCase in YAML.
# --------------------------------------------------------------------------------------------


class RunbookModel(BaseModel):
    model_config = ConfigDict(
        extra="forbid", frozen=True, alias_generator=to_camel, populate_by_name=True
    )


class SafeBound(BaseModel):
    """The range a runbook field may take without an acknowledgement: `low`..`high`
    inclusive (a count or a duration), and for a count-or-percent field `percent_high`."""

    model_config = ConfigDict(frozen=True)
    low: int | timedelta
    high: int | timedelta
    percent_high: int | None = None

    def describe(self) -> str:
        def text(v: int | timedelta) -> str:
            if isinstance(v, timedelta):
                days = v.total_seconds() / 86400
                return f"{int(days)}d" if days >= 1 and days.is_integer() else _format_duration(v)
            return str(v)

        out = f"{text(self.low)}..{text(self.high)}"
        return out if self.percent_high is None else f"{out} or 0%..{self.percent_high}%"

    def holds(self, value: Any) -> bool:
        if isinstance(value, str) and value.endswith("%"):
            return self.percent_high is not None and int(value[:-1]) <= self.percent_high
        return bool(self.low <= value <= self.high)


_MIN, _H, _D = timedelta(minutes=1), timedelta(hours=1), timedelta(days=1)
# Safe bounds per runbook field, keyed `block.fieldCamel` as in docs/runbooks.md ("Safe bounds",
# kept in step by tests/runbooks/test_reference_doc.py). A value outside them is refused unless
# the same block lists the field under `unsafe:`: a 0 s timeout, a 100 % budget or a pool grown
# by 1000 nodes must be a decision someone wrote down, never a typo.
SAFE_BOUNDS: dict[str, SafeBound] = {
    # Shorter: every alert about a flapping device is "stale"; longer: day-old alerts act.
    "confirm.staleAfter": SafeBound(low=_MIN, high=_D),
    # Shorter than a person can answer a page; longer leaves the device failing unattended.
    "approval.timeout": SafeBound(low=_MIN, high=_D),
    # Shorter than a pod's usual graceful termination (30 s) forces healthy shutdowns.
    "eviction.timeout": SafeBound(low=timedelta(seconds=30), high=6 * _H),
    # Shorter than one scheduling round + image pull scales up (or pages) for nothing.
    "replacement.pendingDeadline": SafeBound(low=_MIN, high=_D),
    "replacement.churnEvictions": SafeBound(low=2, high=20),
    # Nodes per request and the pool's ceiling: each one is a GPU node bought.
    "scaleUp.step": SafeBound(low=1, high=8),
    "scaleUp.maxSize": SafeBound(low=0, high=256),
    "scaleUp.cooldown": SafeBound(low=_MIN, high=_D),
    "scaleUp.capacityDeadline": SafeBound(low=_MIN, high=_D),
    # Blast radius: a storm must never quarantine a whole pool or cluster by default.
    "budget.maxPerPool": SafeBound(low=0, high=64, percent_high=50),
    "budget.maxPerCluster": SafeBound(low=0, high=256, percent_high=25),
    # Shorter than a device's health flapping period releases a still-broken GPU.
    "release.cooldown": SafeBound(low=_MIN, high=7 * _D),
    "release.healthCheckInterval": SafeBound(low=timedelta(seconds=10), high=_H),
    "fallback.nodeTaintBelowHealthy": SafeBound(low=0, high=8),
    "maintenance.maxParallel": SafeBound(low=1, high=16),
}


class BoundedRunbookModel(RunbookModel):
    """A runbook block whose fields have safe bounds (`SAFE_BOUNDS`); `unsafe` lists the
    camelCase fields of this block deliberately set outside them."""

    unsafe: list[str] = Field(default_factory=list)

    # The block's key under `spec` (e.g. "eviction"), set by each subclass.
    block: ClassVar[str] = ""

    @model_validator(mode="after")
    def _within_safe_bounds(self) -> Any:
        fields = {to_camel(name): name for name in type(self).model_fields if name != "unsafe"}
        for key in self.unsafe:
            if f"{self.block}.{key}" not in SAFE_BOUNDS:
                raise PydanticCustomError(
                    "unsafe_unknown",
                    "unsafe lists '{key}', which is not a bounded field of {block} (bounded: "
                    "{bounded})",
                    {
                        "key": key,
                        "block": self.block,
                        "bounded": ", ".join(
                            k.split(".", 1)[1]
                            for k in SAFE_BOUNDS
                            if k.startswith(self.block + ".")
                        ),
                        "field": "unsafe",
                    },
                )
        for key, name in fields.items():
            bound = SAFE_BOUNDS.get(f"{self.block}.{key}")
            value = getattr(self, name)
            if bound is None or key in self.unsafe or bound.holds(value):
                continue
            shown = _format_duration(value) if isinstance(value, timedelta) else str(value)
            raise PydanticCustomError(
                "unsafe_value",
                "{value} is outside the safe bounds {bounds}; if it is meant, acknowledge it "
                "with `unsafe: [{key}]` in spec.{block}",
                {
                    "value": shown,
                    "bounds": bound.describe(),
                    "key": key,
                    "block": self.block,
                    "field": key,
                },
            )
        return self


ClassAction = Literal["quarantine", "notify", "ignore"]
EscalationReason = Literal[
    "budget-exhausted",
    "approval-timeout",
    "approval-rejected",
    "eviction-timeout",
    "pending-deadline",
    "no-capacity",
    "scale-up-failed",
    "churn",
    "application-error",
    "error",
]
ALL_ESCALATION_REASONS: tuple[EscalationReason, ...] = EscalationReason.__args__  # type: ignore[attr-defined]


class RunbookMatch(RunbookModel):
    """All listed criteria must hold; an empty match matches nothing (except `default`)."""

    namespaces: list[str] = Field(default_factory=list)
    namespace_labels: dict[str, str] = Field(default_factory=dict)
    pod_labels: dict[str, str] = Field(default_factory=dict)
    owner_kinds: list[str] = Field(default_factory=list)
    priority_classes: list[str] = Field(default_factory=list)

    @property
    def empty(self) -> bool:
        return not (
            self.namespaces
            or self.namespace_labels
            or self.pod_labels
            or self.owner_kinds
            or self.priority_classes
        )


class ClassActions(RunbookModel):
    unhealthy: ClassAction = "quarantine"
    degraded: ClassAction = "quarantine"
    application: ClassAction = "notify"
    unknown: ClassAction = "quarantine"


class ConfirmPolicy(BoundedRunbookModel):
    block: ClassVar[str] = "confirm"
    stale_after: Duration = timedelta(minutes=30)  # alert older than this + Healthy = stale
    require_unhealthy_status: bool = False  # only act when pod status says Unhealthy


class QuarantinePolicy(RunbookModel):
    effect: Literal["NoExecute", "NoSchedule"] = "NoExecute"
    taint_key: str = TAINT_KEY
    # Every device of the physical GPU (MIG slices, vGPUs, time-slices) goes together: one
    # remediation per physical GPU, one budget unit. Only `true` is accepted; the field stays
    # so runbooks that spell it out keep loading.
    correlate_siblings: bool = True

    @field_validator("correlate_siblings")
    @classmethod
    def _siblings_together(cls, value: bool) -> bool:
        if not value:
            raise ValueError(
                "false is not supported: a failed GPU takes all its MIG slices / vGPUs with it, "
                "so Sickbay always quarantines every device of the physical GPU"
            )
        return value


class ApprovalPolicy(BoundedRunbookModel):
    block: ClassVar[str] = "approval"
    required: bool = False
    timeout: Duration = timedelta(minutes=15)
    on_timeout: Literal["proceed", "abort", "escalate"] = "escalate"


class EvictionPolicy(BoundedRunbookModel):
    block: ClassVar[str] = "eviction"
    mode: Literal["taint", "eviction-api"] = "taint"
    timeout: Duration = timedelta(minutes=5)
    force: Literal["none", "eviction-api", "noexecute", "delete"] = "none"


class ReplacementPolicy(BoundedRunbookModel):
    block: ClassVar[str] = "replacement"
    pending_deadline: Duration = timedelta(minutes=30)
    churn_evictions: int = Field(default=3, ge=2)
    # How churn (a scheduler ignoring the rule: allocate -> evict -> allocate ...) is stopped:
    # `cordon` the device's node (every scheduler honours a cordon; undone on release),
    # `noschedule` (switch the rule to NoSchedule: no more evictions), `none` (escalate only).
    on_churn: Literal["cordon", "noschedule", "none"] = "cordon"


class ScaleUpPolicy(BoundedRunbookModel):
    block: ClassVar[str] = "scaleUp"
    enabled: bool = False
    pool: NodePoolTarget | None = None
    step: int = Field(default=1, ge=1)
    max_size: int = Field(default=0, ge=0)
    cooldown: Duration = timedelta(minutes=10)
    capacity_deadline: Duration = timedelta(minutes=15)
    approval: bool = False
    # Without `pool`: the failed device's own node pool (ResolvedDevice.node_pool) at this
    # provider, so one shipped runbook serves every pool of a cluster.
    provider: Literal["gke", "aks", "cluster-api", "http", "sim"] | None = None

    @model_validator(mode="after")
    def _pool_when_enabled(self) -> ScaleUpPolicy:
        if self.enabled and self.pool is None and self.provider is None:
            raise ValueError("scaleUp.enabled needs scaleUp.pool or scaleUp.provider")
        if self.enabled and self.max_size < 1:
            raise ValueError("scaleUp.enabled needs scaleUp.maxSize >= 1")
        return self


BudgetLimit = Annotated[int | str, Field(union_mode="left_to_right")]


class BudgetPolicy(BoundedRunbookModel):
    """At most this many physical GPUs quarantined at once: a count (`4`) or a percent
    (`"25%"`) of the pool's / cluster's devices."""

    block: ClassVar[str] = "budget"

    max_per_pool: BudgetLimit = "50%"
    max_per_cluster: BudgetLimit = "10%"

    @field_validator("max_per_pool", "max_per_cluster")
    @classmethod
    def _limit(cls, value: int | str) -> int | str:
        if isinstance(value, int):
            if value < 0:
                raise ValueError("must be >= 0")
            return value
        if not re.fullmatch(r"\d{1,3}%", value) or int(value[:-1]) > 100:
            raise ValueError(f"'{value}' is neither a count nor a percent like '25%'")
        return value

    @staticmethod
    def limit(value: int | str, total: int) -> int:
        """Resolve a count or percent against `total` devices (percent rounds down, min 1
        when the percent is non-zero and total > 0)."""
        if isinstance(value, int):
            return value
        pct = int(value[:-1])
        if pct == 0 or total <= 0:
            return 0
        return max(1, total * pct // 100)


class EscalationPolicy(RunbookModel):
    channels: list[str] = Field(default_factory=list)  # names configured on the worker
    severity: Literal["critical", "error", "warning", "info"] = "error"
    on: list[EscalationReason] = Field(default_factory=lambda: list(ALL_ESCALATION_REASONS))


class ReleasePolicy(BoundedRunbookModel):
    block: ClassVar[str] = "release"
    mode: Literal["repaired", "healthy-cooldown", "either"] = "either"
    cooldown: Duration = timedelta(minutes=30)
    health_check_interval: Duration = timedelta(minutes=5)


class FallbackPolicy(BoundedRunbookModel):
    """When no DeviceTaintRule is served: evict consumers through the Eviction API and taint
    the node only when fewer than `node_taint_below_healthy` healthy GPUs remain on it."""

    block: ClassVar[str] = "fallback"

    node_taint_below_healthy: int = Field(default=1, ge=0)


class MaintenancePolicy(BoundedRunbookModel):
    block: ClassVar[str] = "maintenance"
    max_parallel: int = Field(default=1, ge=1)


class RunbookSpec(RunbookModel):
    precedence: int = 0  # with several consumers, the highest precedence wins
    match: RunbookMatch = Field(default_factory=RunbookMatch)
    on: ClassActions = Field(default_factory=ClassActions)
    confirm: ConfirmPolicy = Field(default_factory=ConfirmPolicy)
    quarantine: QuarantinePolicy = Field(default_factory=QuarantinePolicy)
    approval: ApprovalPolicy = Field(default_factory=ApprovalPolicy)
    eviction: EvictionPolicy = Field(default_factory=EvictionPolicy)
    replacement: ReplacementPolicy = Field(default_factory=ReplacementPolicy)
    scale_up: ScaleUpPolicy = Field(default_factory=ScaleUpPolicy)
    budget: BudgetPolicy = Field(default_factory=BudgetPolicy)
    escalation: EscalationPolicy = Field(default_factory=EscalationPolicy)
    release: ReleasePolicy = Field(default_factory=ReleasePolicy)
    fallback: FallbackPolicy = Field(default_factory=FallbackPolicy)
    maintenance: MaintenancePolicy = Field(default_factory=MaintenancePolicy)
    # Closed-loop repair (contract/repair.py, imported at the end of this module: it builds on
    # the runbook bases above).
    repair: _repair.RepairPolicy = Field(default_factory=lambda: _repair.RepairPolicy())
    validation: _repair.ValidationPolicy = Field(default_factory=lambda: _repair.ValidationPolicy())
    lemons: _repair.LemonPolicy = Field(default_factory=lambda: _repair.LemonPolicy())
    dry_run: bool = False


class RunbookMetadata(RunbookModel):
    name: str = Field(pattern=r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$", max_length=63)
    description: str = ""


class Runbook(RunbookModel):
    api_version: Literal["sickbay/v1"] = Field(
        validation_alias=AliasChoices("apiVersion", "api_version"), alias="apiVersion"
    )
    kind: Literal["Runbook"]
    metadata: RunbookMetadata
    spec: RunbookSpec = Field(default_factory=RunbookSpec)

    @property
    def name(self) -> str:
        return self.metadata.name


class RunbookSet(Contract):
    runbooks: list[Runbook]
    source: str = ""  # directory they came from

    def get(self, name: str) -> Runbook | None:
        return next((r for r in self.runbooks if r.name == name), None)


# --------------------------------------------------------------------------------------------
# Remediation continue-as-new state (defined last: it refers to the runbook schema)
# --------------------------------------------------------------------------------------------


class RemediationCarry(Contract):
    """What a remediation carries into its next run when it continues-as-new: during a long
    hold (the next run goes on holding), or while it waits for a budget slot
    (`waiting_for_budget`: the next run confirms afresh and asks again, without a new page)."""

    device: ResolvedDevice
    runbook: Runbook
    quarantine: QuarantineResult | None = None
    lease_held: bool = False
    escalated: bool = False
    status: RemediationStatus
    timeline: list[TimelineEntry] = Field(default_factory=list)
    alerts: list[AlertEvidence] = Field(default_factory=list)
    healthy_since: datetime | None = None
    waiting_for_budget: bool = False
    event_counts: dict[str, int] = Field(default_factory=dict)  # aggregated Events so far


# The repair blocks of RunbookSpec (a cycle: contract.repair subclasses the runbook bases above;
# when it is imported first, it completes these models itself once its classes exist).
import contract.repair as _repair  # noqa: E402

if hasattr(_repair, "RepairPolicy"):  # else contract.repair is mid-import: it rebuilds these
    for _model in (RunbookSpec, Runbook, RunbookSet, RemediationCarry, RemediationInput):
        _model.model_rebuild()


def input_problems(err: ValidationError, model: type[BaseModel] | None = None) -> str:
    """One line naming every bad field of a workflow input and its problem, e.g.
    `device: Field required; dryrun: unknown field (fields: device, alerts, ...)`."""
    problems = []
    for e in err.errors():
        where = ".".join(str(part) for part in e["loc"]) or "input"
        if e["type"] == "extra_forbidden":
            known = (
                f" (fields: {', '.join(f for f in model.model_fields if f != 'resume')})"
                if model and len(e["loc"]) == 1
                else ""
            )
            problems.append(f"{where}: unknown field{known}")
        elif e["type"] == "model_type" and not e["loc"]:
            problems.append(f"input: must be a JSON object, got {e.get('input')!r}")
        elif e["type"] in ("bool_type", "string_type", "int_type", "model_type", "dict_type"):
            problems.append(f"{where}: {e['msg']}, got {e.get('input')!r}")
        else:
            problems.append(f"{where}: {e['msg']}")
    return "; ".join(problems)
