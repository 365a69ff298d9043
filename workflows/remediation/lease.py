"""The budget lease of one remediation: asked of the `sickbay-budget` workflow (early, while the
evidence is still coming), given back on release or when the procedure decides not to
quarantine. Shared by the confirm, guard and hold steps; owns the lease's part of the state
(held, and how many GPUs it counts: `extended` for a repair rung)."""

from __future__ import annotations

from typing import NamedTuple

from temporalio import workflow

with workflow.unsafe.imports_passed_through():
    from contract.budget import (
        BudgetDecision,
        BudgetLeaseRequest,
        BudgetReleaseRequest,
    )
    from contract.kube import CountDevicesInput, DeviceCounts, ResolvedDevice
    from contract.runbook import BudgetPolicy
    from workflows.remediation.calls import ACTIVITY_FAILED, error_text
    from workflows.remediation.context import Remediation


class EarlyLease(NamedTuple):
    """A budget lease request already answered: the decision and what it was computed from."""

    device_key: str
    decision: BudgetDecision | None = None
    counts: DeviceCounts | None = None
    pool_limit: int = 0
    cluster_limit: int = 0
    error: BaseException | None = None  # the request failed (counts or budget unreachable)


def limits(budget: BudgetPolicy, counts: DeviceCounts) -> tuple[int, int]:
    """A runbook's budget against the counted devices: (pool limit, cluster limit)."""
    return (
        BudgetPolicy.limit(budget.max_per_pool, counts.pool_devices),
        BudgetPolicy.limit(budget.max_per_cluster, counts.cluster_devices),
    )


async def ask_lease(
    r: Remediation,
    device: ResolvedDevice,
    budget: BudgetPolicy | tuple[int, int],
    counts: DeviceCounts | None,
    gpus: int = 1,
) -> EarlyLease:
    """Count the devices (unless `counts` given) and ask the budget for a lease counting `gpus`
    physical GPUs (one; a repair rung asks again for every GPU it takes out of service) within
    `budget` (a runbook's, or limits already resolved); marks the lease held as soon as it is
    granted (so every way out gives it back)."""
    if counts is None:
        counts = await r.act.count_devices(CountDevicesInput(node_pool=device.node_pool))
    pool_limit, cluster_limit = budget if isinstance(budget, tuple) else limits(budget, counts)
    decision = await r.act.acquire_budget(
        BudgetLeaseRequest(
            holder=r.s.workflow_id,
            device_key=device.key,
            node_pool=device.node_pool,
            pool_limit=pool_limit,
            cluster_limit=cluster_limit,
            observed_pool_quarantined=counts.pool_quarantined,
            observed_cluster_quarantined=counts.cluster_quarantined,
            gpus=gpus,
        )
    )
    if decision.granted:
        r.s.lease.held = True
    return EarlyLease(device.key, decision, counts, pool_limit, cluster_limit)


def extended(r: Remediation, gpus: int) -> None:
    """The budget granted the lease grown to `gpus` (a repair rung takes the node's GPUs)."""
    r.s.lease.held = True
    r.s.lease.gpus = gpus


async def release_lease(r: Remediation) -> None:
    """Give the lease back (nothing when none is held)."""
    s = r.s
    if not s.lease.held or s.confirm.device is None:
        return
    await r.act.release_budget(
        BudgetReleaseRequest(holder=s.workflow_id, device_key=s.confirm.device.key)
    )
    s.lease.held = False
    r.j.log("budget lease released")


async def give_back(r: Remediation, early: EarlyLease | None) -> None:
    """Not quarantining after all: a lease taken early is given back (a refused early request
    is withdrawn too, so the budget does not keep this run as a waiter to wake)."""
    if early is None or early.error is not None:
        return
    try:
        if r.s.lease.held:
            await release_lease(r)
        else:
            await r.act.release_budget(
                BudgetReleaseRequest(holder=r.s.workflow_id, device_key=early.device_key),
                "withdraw budget request",
            )
    except ACTIVITY_FAILED as err:
        # Nothing was tainted: no page for this. The budget's reconcile drops the lease (or
        # waiter) of a closed remediation within its interval.
        r.s.lease.held = False
        r.j.log(
            "budget lease not given back",
            outcome="reconcile will drop it",
            reason=error_text(err),
        )
