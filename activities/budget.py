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
time (the rest queue on a semaphore), and a refused or transiently failed update is retried
inside the activity with full-jitter backoff until `deadline` passes, so a storm of 200+
acquirers all get an answer in a few seconds instead of running their local activity into its
timeout. Acquire and release are idempotent per holder, so a retry after a lost answer is safe.
"""

from __future__ import annotations

import asyncio
import logging
import random
import time
from typing import Any

from temporalio import activity
from temporalio.client import (
    Client,
    WithStartWorkflowOperation,
    WorkflowExecutionStatus,
    WorkflowUpdateRPCTimeoutOrCancelledError,
)
from temporalio.common import WorkflowIDConflictPolicy
from temporalio.service import RPCError, RPCStatusCode

from contract.budget import (
    BudgetDecision,
    BudgetLeaseRequest,
    BudgetReleaseRequest,
    BudgetState,
    ReconcileLeasesInput,
    ReconcileLeasesResult,
)
from contract.names import (
    ACT_ACQUIRE_BUDGET,
    ACT_RECONCILE_LEASES,
    ACT_RELEASE_BUDGET,
    UPD_BUDGET_ACQUIRE,
    UPD_BUDGET_RELEASE,
    WF_BUDGET,
    budget_task_queue,
    budget_workflow_id,
)

log = logging.getLogger(__name__)

# Transient answers worth another try: the per-workflow in-flight update limit and server
# overload (RESOURCE_EXHAUSTED), a frontend restart (UNAVAILABLE), a slow round trip
# (DEADLINE_EXCEEDED, CANCELLED by the server), a budget workflow between continue-as-new runs
# (NOT_FOUND / FAILED_PRECONDITION / ABORTED on the old run).
RETRYABLE_STATUS = frozenset(
    {
        RPCStatusCode.RESOURCE_EXHAUSTED,
        RPCStatusCode.UNAVAILABLE,
        RPCStatusCode.DEADLINE_EXCEEDED,
        RPCStatusCode.CANCELLED,
        RPCStatusCode.ABORTED,
        RPCStatusCode.NOT_FOUND,
        RPCStatusCode.FAILED_PRECONDITION,
        RPCStatusCode.INTERNAL,
        RPCStatusCode.UNKNOWN,
    }
)
# Temporal allows 10 in-flight updates per workflow: 4 per worker keeps the two worker replicas
# (deploy/worker.yaml) under it; measured: 200 acquirers answered in 1.5-2.1 s with 1-3 workers,
# against 40 s and 85 timeouts without the cap (the server refuses, the client backs off).
MAX_IN_FLIGHT = 4
# Full-jitter backoff: first retry within 50 ms, growing to at most 1 s, so 200 refused callers
# spread out over the budget workflow's ~10-per-task pace instead of retrying in lockstep.
BACKOFF_FIRST = 0.05
BACKOFF_MAX = 1.0
# How long one activity attempt keeps retrying: under the workflow's 30 s local-activity
# start-to-close for the lease call, so the attempt reports the last error itself.
RETRY_DEADLINE = 25.0


def is_retryable(exc: BaseException) -> bool:
    """A refused or lost update RPC that another try can fix (see RETRYABLE_STATUS)."""
    while exc is not None:
        if isinstance(exc, RPCError):
            return exc.status in RETRYABLE_STATUS
        if isinstance(exc, WorkflowUpdateRPCTimeoutOrCancelledError):
            return True
        exc = exc.__cause__  # type: ignore[assignment]
    return False


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
        self._task_queue = budget_task_queue(task_queue)
        self._workflow_id = workflow_id or budget_workflow_id(task_queue)
        self._initial = initial_state or BudgetState()
        self._slots = asyncio.Semaphore(max_in_flight)
        self._deadline = deadline
        self.retries = 0  # refused/transient update RPCs retried (tests, diagnostics)

    async def _update(self, update: str, arg: object) -> BudgetDecision:
        """One update, retried with jittered backoff while the server refuses it transiently."""
        give_up = time.monotonic() + self._deadline
        attempt = 0
        while True:
            try:
                async with self._slots:
                    return await self._update_once(update, arg)
            except Exception as exc:
                if not is_retryable(exc):
                    raise
                attempt += 1
                delay = random.uniform(0, min(BACKOFF_MAX, BACKOFF_FIRST * 2**attempt))
                if time.monotonic() + delay > give_up:
                    log.warning(
                        "budget %s still refused after %d tries, giving up: %s",
                        update,
                        attempt,
                        exc,
                    )
                    raise
                self.retries += 1
                if attempt in (1, 10, 50):
                    log.info("budget %s refused (%s), retry %d", update, exc, attempt)
                await asyncio.sleep(delay)

    async def _update_once(self, update: str, arg: object) -> BudgetDecision:
        start: WithStartWorkflowOperation[Any, Any] = WithStartWorkflowOperation(
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
