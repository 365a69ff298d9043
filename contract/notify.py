"""Telling people: incidents and notification channels' input/result, and the rejections
workflow (alerts Sickbay could not use; one page per cause and node).
"""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Literal

from pydantic import Field

from contract.activity import Activity
from contract.base import Contract, Duration
from contract.names import ACT_CLAIM_ESCALATION, ACT_NOTIFY
from contract.remediation import Phase, TimelineEntry


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


class Incident(Contract):
    id: str  # workflow id (the Web UI link)
    # The PagerDuty dedup key: one per incident (the remediation's workflow id and its first
    # run's id), so a later incident of the same GPU is a new alert, not a repeat of a
    # resolved one; "" -> `id`.
    dedup_key: str = ""
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


# --- activities (contract.activity): the name, the input model, the result model ------------
SEND_NOTIFICATION = Activity(ACT_NOTIFY, NotifyInput, NotifyResult)
CLAIM_ESCALATION = Activity(ACT_CLAIM_ESCALATION, EscalationClaim, EscalationClaimResult)
