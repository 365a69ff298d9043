"""The blast-radius budget workflow: its state, leases, waiters, and the lease activities'
requests and decisions.
"""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Literal

from pydantic import Field

from contract.activity import Activity
from contract.actors import Verification, VerifiedActor
from contract.base import Contract, Duration
from contract.names import ACT_ACQUIRE_BUDGET, ACT_RECONCILE_LEASES, ACT_RELEASE_BUDGET


class BudgetLease(Contract):
    holder: str  # remediation workflow id
    device_key: str
    node_pool: str | None = None
    acquired_at: datetime | None = None
    gpus: int = Field(default=1, ge=1)  # physical GPUs it takes out (a node rung: the node's)


class BudgetWaiter(Contract):
    """A remediation refused by the budget, told (signal) when a slot frees."""

    holder: str  # remediation workflow id
    node_pool: str | None = None


class BudgetPause(Contract):
    """The cluster is paused: no new lease (quarantine, node-level repair rung, scale-up) is
    granted until someone resumes it (`sickbay pause` / `sickbay resume`)."""

    reason: str = Field(min_length=1)
    actor: str = Field(min_length=1)
    since: datetime | None = None  # set by the budget workflow (workflow.now())
    # "verified": sent through the actions endpoint and its signature checked by the worker
    # (contract/actors.py); "unverified": the actor is only the sender's claim.
    verification: Verification = ""
    via: str = ""  # of a verified actor: kubernetes | slack

    def who(self) -> str:
        """`alice (verified via kubernetes)` or `alice (unverified)`."""
        return actor_words(self.actor, self.verification, self.via)

    def describe(self) -> str:
        when = f" since {self.since:%Y-%m-%d %H:%M:%S}Z" if self.since else ""
        return f"paused by {self.who()}{when}: {self.reason}"


def actor_words(actor: str, verification: str, via: str = "") -> str:
    """How a pause's or resume's actor reads: marked verified (and how) or unverified."""
    if verification == "verified":
        return f"{actor} (verified via {via or 'kubernetes'})"
    if verification == "unverified":
        return f"{actor} (unverified)"
    return actor


class PauseRequest(Contract):
    """Update `pause` of the budget workflow: a reason is required, and who asks."""

    reason: str = Field(min_length=1, max_length=500)
    actor: str = Field(min_length=1, max_length=200)
    # Set by the actions endpoint only (contract/actors.py); checked by the budget workflow.
    verified: VerifiedActor | None = None


class ResumeRequest(Contract):
    """Update `resume` of the budget workflow."""

    actor: str = Field(min_length=1, max_length=200)
    reason: str = Field(default="", max_length=500)
    verified: VerifiedActor | None = None


class PauseNotice(Contract):
    """Signal `cluster-paused` from the budget workflow to every lease holder when the cluster
    is paused (`pause` set) or resumed (None): an open remediation holds before its next
    eviction force, scale-up or repair rung."""

    pause: BudgetPause | None = None


class PauseRecord(Contract):
    """One pause or resume, as the budget workflow recorded it (who, when, why)."""

    action: Literal["pause", "resume"]
    actor: str
    reason: str = ""
    at: datetime
    verification: Verification = ""
    via: str = ""

    def who(self) -> str:
        return actor_words(self.actor, self.verification, self.via)


class PauseAnswer(Contract):
    """What `pause` / `resume` / `pause-state` answer: the pause in force now (None: running),
    the one it replaced or lifted, and the remediations held by it (woken on resume)."""

    pause: BudgetPause | None = None
    previous: BudgetPause | None = None
    held: list[str] = Field(default_factory=list)
    verification: Verification = ""  # how the budget recorded this pause's / resume's actor


PAUSE_LOG_KEEP = 20  # pauses and resumes kept in the budget's state (Events keep the rest)


class BudgetState(Contract):
    """Input of the `sickbay-budget` workflow and its continue-as-new state."""

    leases: list[BudgetLease] = Field(default_factory=list)
    pause: BudgetPause | None = None  # carried across continue-as-new
    pause_log: list[PauseRecord] = Field(default_factory=list)  # the latest PAUSE_LOG_KEEP
    waiters: list[BudgetWaiter] = Field(default_factory=list)  # oldest first
    # Nonces of the verified pauses / resumes of the last ATTESTATION_TTL (replays refused).
    seen_nonces: dict[str, datetime] = Field(default_factory=dict)
    reconcile_interval: Duration = timedelta(minutes=5)
    max_updates_per_run: int = Field(default=500, ge=1)  # continue-as-new after this many


class ReconcileLeasesInput(Contract):
    holders: list[str] = Field(default_factory=list)


class ReconcileLeasesResult(Contract):
    closed: list[str] = Field(default_factory=list)  # holders whose workflow is not running


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
    # Physical GPUs the holder takes out of service: 1 for the device itself; a repair rung
    # asks again with its whole scope (the reset group, every GPU of the node). A holder's
    # larger request extends its lease when the rest still fits, else it is refused and the
    # lease stays as it was.
    gpus: int = Field(default=1, ge=1)


class BudgetDecision(Contract):
    granted: bool
    reason: str = ""
    # Refused because the cluster is paused (not over budget): the holder holds without a
    # page and is woken (`budget-freed`) when the cluster is resumed.
    paused: BudgetPause | None = None
    pool_in_use: int = 0
    cluster_in_use: int = 0


class BudgetLeaseBatch(Contract):
    """Lease requests decided one after the other, in this order, in one update."""

    requests: list[BudgetLeaseRequest] = Field(default_factory=list)


class BudgetDecisions(Contract):
    """The decisions for a BudgetLeaseBatch, in its order."""

    decisions: list[BudgetDecision] = Field(default_factory=list)


class BudgetReleaseRequest(Contract):
    holder: str
    device_key: str


# --- activities (contract.activity): the name, the input model, the result model ------------
ACQUIRE_BUDGET_LEASE = Activity(ACT_ACQUIRE_BUDGET, BudgetLeaseRequest, BudgetDecision)
RELEASE_BUDGET_LEASE = Activity(ACT_RELEASE_BUDGET, BudgetReleaseRequest, BudgetDecision)
RECONCILE_BUDGET_LEASES = Activity(
    ACT_RECONCILE_LEASES, ReconcileLeasesInput, ReconcileLeasesResult
)
