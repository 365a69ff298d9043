"""Budget lease activities: the remediation's way to the `sickbay-budget` workflow.

Workflows cannot send updates to other workflows, so these activities do it with the Temporal
client: update-with-start (the budget workflow is created on first use, `USE_EXISTING`
afterwards), which also survives the budget workflow continuing-as-new between calls.
`reconcile-budget-leases` tells the budget workflow which lease holders have closed, so a
remediation that died without releasing (terminated, bug) does not hold a slot forever.
"""

from __future__ import annotations

import logging

from temporalio import activity
from temporalio.client import (
    Client,
    WithStartWorkflowOperation,
    WorkflowExecutionStatus,
)
from temporalio.common import WorkflowIDConflictPolicy
from temporalio.service import RPCError, RPCStatusCode

from workflows.constants import (
    ACT_ACQUIRE_BUDGET,
    ACT_RECONCILE_LEASES,
    ACT_RELEASE_BUDGET,
    BUDGET_WORKFLOW_ID,
    UPD_BUDGET_ACQUIRE,
    UPD_BUDGET_RELEASE,
    WF_BUDGET,
)
from workflows.models import (
    BudgetDecision,
    BudgetLeaseRequest,
    BudgetReleaseRequest,
    BudgetState,
    ReconcileLeasesInput,
    ReconcileLeasesResult,
)

log = logging.getLogger(__name__)


class BudgetActivities:
    def __init__(
        self,
        client: Client,
        task_queue: str,
        workflow_id: str = BUDGET_WORKFLOW_ID,
        initial_state: BudgetState | None = None,
    ) -> None:
        self._client = client
        self._task_queue = task_queue
        self._workflow_id = workflow_id
        self._initial = initial_state or BudgetState()

    async def _update(self, update: str, arg: object) -> BudgetDecision:
        start = WithStartWorkflowOperation(
            WF_BUDGET,
            self._initial,
            id=self._workflow_id,
            task_queue=self._task_queue,
            id_conflict_policy=WorkflowIDConflictPolicy.USE_EXISTING,
        )
        try:
            return await self._client.execute_update_with_start_workflow(
                update, arg, start_workflow_operation=start, result_type=BudgetDecision
            )
        except RPCError as exc:
            if exc.status != RPCStatusCode.UNIMPLEMENTED:
                raise
        # Servers without multi-operation (the time-skipping test server): start, then update.
        handle = await self._client.start_workflow(
            WF_BUDGET,
            self._initial,
            id=self._workflow_id,
            task_queue=self._task_queue,
            id_conflict_policy=WorkflowIDConflictPolicy.USE_EXISTING,
        )
        return await handle.execute_update(update, arg, result_type=BudgetDecision)

    @activity.defn(name=ACT_ACQUIRE_BUDGET)
    async def acquire_budget_lease(self, req: BudgetLeaseRequest) -> BudgetDecision:
        decision = await self._update(UPD_BUDGET_ACQUIRE, req)
        log.info(
            "budget lease for %s: %s %s",
            req.holder,
            "granted" if decision.granted else "denied",
            decision.reason,
        )
        return decision

    @activity.defn(name=ACT_RELEASE_BUDGET)
    async def release_budget_lease(self, req: BudgetReleaseRequest) -> BudgetDecision:
        return await self._update(UPD_BUDGET_RELEASE, req)

    @activity.defn(name=ACT_RECONCILE_LEASES)
    async def reconcile_budget_leases(self, req: ReconcileLeasesInput) -> ReconcileLeasesResult:
        closed: list[str] = []
        for holder in req.holders:
            try:
                desc = await self._client.get_workflow_handle(holder).describe()
            except RPCError as exc:
                if exc.status == RPCStatusCode.NOT_FOUND:
                    closed.append(holder)  # gone from retention: certainly not running
                    continue
                raise
            if desc.status != WorkflowExecutionStatus.RUNNING:
                closed.append(holder)
        if closed:
            log.info("budget leases held by closed workflows: %s", closed)
        return ReconcileLeasesResult(closed=closed)
