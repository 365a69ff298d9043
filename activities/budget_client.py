"""Budget lease activities: the remediation's way to the `sickbay-budget` workflow.

Workflows cannot send updates to other workflows, so these activities do it with the Temporal
client: update-with-start (the budget workflow is created on first use, `USE_EXISTING`
afterwards), which also survives the budget workflow continuing-as-new between calls. The
budget workflow runs on its own task queue (`budget_task_queue`: `<queue>-budget`, polled by
every worker of `<queue>` with separate pollers), so a lease update is answered without waiting
for a poller busy with remediation workflow tasks; its id stays `budget_workflow_id(<queue>)`.
`reconcile-budget-leases` tells the budget workflow which lease holders have closed, so a
remediation that died without releasing (terminated, bug) does not hold a slot forever.

Bursts: Temporal accepts at most 10 in-flight updates per workflow and refuses the rest
(RESOURCE_EXHAUSTED). Each worker therefore sends at most `max_in_flight` lease updates at a
time, and the lease requests that arrive while those are on their way go together in the next
one (`acquire-many`, decided in arrival order by the budget workflow, at most MAX_BATCH), so
200 concurrent acquirers cost a handful of updates, not 200 round trips one slot after
another. Releases go one update each. A refused or transiently failed update is retried
inside the activity with full-jitter backoff until `deadline` passes, so a storm of 200+
acquirers all get an answer in a few seconds instead of running their local activity into its
timeout (activities/update_with_start.py: `UpdateSender`, `Batcher`, shared with the GPU
ledger). Acquire and release are idempotent per holder, so a retry after a lost answer is safe.
"""

from __future__ import annotations

import logging

from temporalio.client import Client, WorkflowExecutionStatus
from temporalio.service import RPCError, RPCStatusCode

from activities.defn import implements
from activities.update_with_start import (
    MAX_IN_FLIGHT,
    RETRY_DEADLINE,
    Batcher,
    UpdateSender,
)
from contract.budget import (
    ACQUIRE_BUDGET_LEASE,
    RECONCILE_BUDGET_LEASES,
    RELEASE_BUDGET_LEASE,
    BudgetDecision,
    BudgetDecisions,
    BudgetLeaseBatch,
    BudgetLeaseRequest,
    BudgetReleaseRequest,
    BudgetState,
    ReconcileLeasesInput,
    ReconcileLeasesResult,
)
from contract.names import (
    UPD_BUDGET_ACQUIRE,
    UPD_BUDGET_ACQUIRE_MANY,
    UPD_BUDGET_RELEASE,
    WF_BUDGET,
    budget_task_queue,
    budget_workflow_id,
)

log = logging.getLogger(__name__)


class BudgetActivities:
    def __init__(
        self,
        client: Client,
        task_queue: str,
        workflow_id: str | None = None,
        initial_state: BudgetState | None = None,
        *,
        max_in_flight: int = MAX_IN_FLIGHT,
        deadline: float = RETRY_DEADLINE,
    ) -> None:
        self._client = client
        # The id is keyed by the remediation queue; the workflow runs on its own queue, which
        # the same workers poll with their own pollers (worker.main.build_worker).
        self._sender = UpdateSender(
            client,
            WF_BUDGET,
            initial_state or BudgetState(),
            workflow_id=workflow_id or budget_workflow_id(task_queue),
            task_queue=budget_task_queue(task_queue),
            what="budget",
            max_in_flight=max_in_flight,
            deadline=deadline,
        )
        self._acquires: Batcher[BudgetLeaseRequest, BudgetDecision] = Batcher(
            self._sender,
            UPD_BUDGET_ACQUIRE_MANY,
            batch=lambda requests: BudgetLeaseBatch(requests=requests),
            result_type=BudgetDecisions,
            answers=lambda answer: answer.decisions,
        )

    @property
    def retries(self) -> int:
        """Refused/transient update RPCs retried (tests, diagnostics)."""
        return self._sender.retries

    @property
    def batches_sent(self) -> int:
        """acquire-many updates sent (tests, diagnostics)."""
        return self._acquires.batches_sent

    async def _acquire(self, req: BudgetLeaseRequest) -> BudgetDecision:
        """Join the next batch of this instance's lease requests and await its decision. A
        request that the budget's validator would refuse goes alone (the `acquire` update),
        so it fails with its own error and never takes a batch down with it."""
        if not req.holder.strip() or not req.device_key.strip():
            return await self._sender.send(UPD_BUDGET_ACQUIRE, req, BudgetDecision)
        return await self._acquires.submit(req)

    @implements(ACQUIRE_BUDGET_LEASE)
    async def acquire_budget_lease(self, req: BudgetLeaseRequest) -> BudgetDecision:
        decision = await self._acquire(req)
        log.info(
            "budget lease for %s: %s %s",
            req.holder,
            "granted" if decision.granted else "denied",
            decision.reason,
        )
        return decision

    @implements(RELEASE_BUDGET_LEASE)
    async def release_budget_lease(self, req: BudgetReleaseRequest) -> BudgetDecision:
        return await self._sender.send(UPD_BUDGET_RELEASE, req, BudgetDecision)

    @implements(RECONCILE_BUDGET_LEASES)
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
