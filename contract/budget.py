"""The blast-radius budget workflow: its state, leases, waiters, and the lease activities'
requests and decisions.
"""

from __future__ import annotations

from datetime import datetime, timedelta

from pydantic import Field

from contract.base import Contract, Duration


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


class BudgetState(Contract):
    """Input of the `sickbay-budget` workflow and its continue-as-new state."""

    leases: list[BudgetLease] = Field(default_factory=list)
    waiters: list[BudgetWaiter] = Field(default_factory=list)  # oldest first
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
