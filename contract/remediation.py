"""The remediation workflow's contract: its input, messages (alerts, abort, repaired,
approval, deadline extension), status, result, timeline and continue-as-new carry.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from enum import StrEnum
from typing import Literal

from pydantic import Field, field_validator, model_validator

from contract.actors import VerifiedActor
from contract.base import (
    Contract,
    PersonDuration,
    PersonInput,
    PersonTime,
    StrictBool,
)
from contract.kube import DeviceRef, PodRef, QuarantineResult, ResolvedDevice
from contract.names import check_cluster_name
from contract.runbook import FailureClass, Runbook

Trigger = Literal["alert", "sweep", "watch", "manual", "ui", "maintenance"]


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
    REPAIRING = "repairing"  # a rung of the repair ladder (reset / reboot / replace)
    VALIDATING = "validating"  # the validation Job on the repaired device
    ESCALATED = "escalated"
    HOLDING = "holding"
    RELEASING = "releasing"
    CLOSED = "closed"


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
    # The Xid the alert's rule stands for (ECC double-bit: 48, row-remap failure: 64, fallen
    # off the bus: 79), for the repair ladder's choice only; never read for the class.
    rule_xid: int | None = None


class HandledAlert(Contract):
    """One Alertmanager alert instance a run handled: its fingerprint and startsAt (constant
    over one firing episode; a new firing after resolution gets a new startsAt), and the
    evidence it stood for (alert name and Xid), which outlives its label set."""

    fingerprint: str
    starts_at: datetime | None = None
    alertname: str = ""
    xid: int | None = None  # the Xid of an Xid-kind alert (a held gauge's value)

    def key(self) -> tuple[str, str]:
        return instance_key(self.fingerprint, self.starts_at)

    @classmethod
    def of(cls, alert: AlertEvidence) -> HandledAlert:
        return cls(
            fingerprint=alert.fingerprint,
            starts_at=alert.starts_at,
            alertname=alert.alertname,
            xid=alert.xid if alert.failure_class is None else None,
        )


def xid_evidence(alertname: str, xid: int | None) -> tuple[str, int] | None:
    """What an Xid alert says about its device, whatever its labels: (alert name, Xid).
    DCGM_FI_DEV_XID_ERRORS holds the last Xid until the driver reloads, so the rule keeps
    firing after a repair, and an exporter restart (`pod`), a pod mapping change
    (`exported_pod`) or a `Hostname` change makes a new series (new fingerprint, later
    startsAt) of the same evidence. None: not an Xid alert."""
    return (alertname, xid) if xid is not None else None


def already_handled(alert: AlertEvidence, handled: list[HandledAlert]) -> str:
    """Why `alert` is no new evidence for a device whose earlier run handled `handled` ("":
    it is new): "instance", the same Alertmanager instance (fingerprint + startsAt); or
    "evidence", an Xid alert of a series the run never saw (another label set: exporter
    restart, pod mapping, Hostname) carrying an Xid the run handled. New evidence after a
    repair: another Xid, or a series the run handled firing again (later startsAt: its value
    went and came back, a changed value); also pod health, a driver taint and a failed
    validation, which the sweep, the watcher and the repair ladder report."""
    if alert.source != "alertmanager":
        return ""
    key = instance_key(alert.fingerprint, alert.starts_at)
    if any(h.key() == key for h in handled):
        return "instance"
    if any(h.fingerprint == alert.fingerprint for h in handled):
        return ""  # the same series fired again after it resolved: a changed value
    same = xid_evidence(alert.alertname, alert.xid if alert.failure_class is None else None)
    if same is not None and any(xid_evidence(h.alertname, h.xid) == same for h in handled):
        return "evidence"
    return ""


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


class AbortRequest(PersonInput):
    reason: str = Field(min_length=1)
    actor: str = "unknown"
    # Set by the actions endpoint only (contract/actors.py); checked by the workflow.
    verified: VerifiedActor | None = None


class RepairedRequest(PersonInput):
    actor: str = "unknown"
    note: str = ""
    verified: VerifiedActor | None = None


class ApprovalDecision(PersonInput):
    """`approve` / `reject`: `approve` is a JSON boolean (`"yes"`, `"true"`, 1 are refused)."""

    approve: bool
    actor: str = Field(min_length=1)
    reason: str = ""
    verified: VerifiedActor | None = None


class ApprovalResult(Contract):
    accepted: bool
    phase: Phase


# A replacement wait (Pending deadline, or capacity deadline after a scale-up) lasts at most
# this long from its start, however often its deadline is extended (or its runbook deadline,
# if that is longer): a GPU whose workload cannot run for a week needs people, not a timer.
MAX_REPLACEMENT_WAIT = timedelta(days=7)


class ExtendDeadlineRequest(PersonInput):
    """`extend-deadline`: move the deadline of the running replacement wait later, by `by`
    (a string with its unit, e.g. `30m`; a bare number is refused) or to `until` (an ISO 8601
    string, UTC when no offset is given; a number is refused); exactly one."""

    by: PersonDuration | None = None
    until: PersonTime | None = None
    reason: str = Field(min_length=1)
    actor: str = Field(min_length=1)
    verified: VerifiedActor | None = None

    @model_validator(mode="after")
    def _one_target(self) -> ExtendDeadlineRequest:
        if (self.by is None) == (self.until is None):
            raise ValueError("give exactly one of `by` (a duration) or `until` (a time)")
        if self.by is not None and self.by <= timedelta(0):
            raise ValueError(f"`by` must be positive, not {self.by}")
        if self.until is not None and self.until.tzinfo is None:
            self.until = self.until.replace(tzinfo=UTC)
        return self


class ExtendDeadlineResult(Contract):
    phase: Phase
    deadline: datetime  # the wait's deadline now
    previous: datetime  # the deadline before this extension


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
    # A launch through the actions endpoint (`sickbay launch --via`): the verified person
    # (`requested_by`), signed over this input (contract/actors.py); checked by the workflow.
    verified: VerifiedActor | None = None
    # Alert instances an earlier run of this device handled (the webhook reads them from that
    # run's result): never evidence again, and listed in this run's result too.
    handled_before: list[HandledAlert] = Field(default_factory=list)

    @field_validator("cluster")
    @classmethod
    def _cluster_name(cls, value: str) -> str:
        return check_cluster_name(value)


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
    # A person's action: "verified" when the actions endpoint checked the person with the
    # cluster and the worker checked its signature (contract/actors.py), else "unverified";
    # "" for Sickbay's own entries and alerts.
    verification: Literal["", "verified", "unverified"] = ""
    groups: list[str] = Field(default_factory=list)  # of a verified actor
    via: str = ""  # of a verified actor: kubernetes | slack

    def who(self) -> str:
        """`""` for Sickbay itself; else the actor, marked verified (with how and the groups)
        or as an unverified claim beside the client identity."""
        if self.verification == "verified":
            groups = f"; groups {', '.join(self.groups)}" if self.groups else ""
            return f"verified user {self.actor} (via {self.via}{groups})"
        if self.verification == "unverified":
            identity = self.client_identity or "unknown"
            return f"unverified: claimed actor {self.actor}; Temporal client {identity}"
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
    # The running replacement wait's deadline (Pending or capacity deadline, as extended by
    # `extend-deadline`); None outside such a wait.
    deadline: datetime | None = None
    next_action: str = ""  # what the workflow does next, in words
    started_at: datetime | None = None
    updated_at: datetime | None = None
    outcome: Outcome | None = None
    alerts: int = 0  # distinct pieces of evidence (deduplicated by fingerprint)
    duplicate_alerts: int = 0  # repeats ignored
    escalation_reason: str | None = None
    # Held by `sickbay pause` ("paused by <actor> since <when>: <reason>"); None otherwise.
    paused: str | None = None
    dry_run: bool = False
    # The repair ladder: the rung running or last run, its attempt, and the last validation
    # (`passed: <summary>` / `failed: <summary>`).
    repair_rung: str | None = None
    repair_attempt: int = 0
    validation: str | None = None


class RemediationResult(Contract):
    outcome: Outcome
    reason: str = ""
    status: RemediationStatus
    timeline: list[TimelineEntry] = Field(default_factory=list)
    # Alertmanager alert instances this run (and the ones before it) handled: a repeat of one
    # of them never starts another run (the webhook answers `already-handled`).
    handled_alerts: list[HandledAlert] = Field(default_factory=list)


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
    retired: bool = False  # the GPU ledger retired the GPU (lemon): held until un-retired
    incident: str = ""  # the GPU ledger's key for this remediation: <workflow id>/<first run id>
    # A replace's new node, cordoned by Sickbay while (or because) its GPUs did not pass
    # validation: uncordoned on release or abort.
    guard_node: str | None = None


RemediationInput.model_rebuild()
