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
timeout. Acquire and release are idempotent per holder, so a retry after a lost answer is safe.
"""

from __future__ import annotations

import asyncio
import logging
import random
import time
from typing import TypeVar

from temporalio.client import (
    Client,
    WorkflowExecutionStatus,
    WorkflowUpdateRPCTimeoutOrCancelledError,
)
from temporalio.service import RPCError, RPCStatusCode

from activities.defn import defn
from activities.update_with_start import update_with_start
from contract.budget import (
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
    ACT_ACQUIRE_BUDGET,
    ACT_RECONCILE_LEASES,
    ACT_RELEASE_BUDGET,
    UPD_BUDGET_ACQUIRE,
    UPD_BUDGET_ACQUIRE_MANY,
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
# At most this many lease requests in one acquire-many update (its payload stays small).
MAX_BATCH = 50

R = TypeVar("R")


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
        # Lease requests waiting for the next `acquire-many` batch, the task sending them,
        # and the batches on their way.
        self._pending: list[tuple[BudgetLeaseRequest, asyncio.Future[BudgetDecision]]] = []
        self._sender: asyncio.Future[None] | None = None
        self._batches: set[asyncio.Future[None]] = set()
        self.batches_sent = 0  # acquire-many updates sent (tests, diagnostics)

    async def _update(
        self,
        update: str,
        arg: object,
        result_type: type[R] = BudgetDecision,  # type: ignore[assignment]
        *,
        slot_held: bool = False,
    ) -> R:
        """One update, retried with jittered backoff while the server refuses it transiently.
        `slot_held`: the caller already holds one of the in-flight slots for the first try
        (released here after it); retries take a slot again."""
        give_up = time.monotonic() + self._deadline
        attempt = 0
        while True:
            try:
                if slot_held:
                    slot_held = False
                    try:
                        return await self._update_once(update, arg, result_type)
                    finally:
                        self._slots.release()
                async with self._slots:
                    return await self._update_once(update, arg, result_type)
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

    async def _update_once(self, update: str, arg: object, result_type: type[R]) -> R:
        return await update_with_start(
            self._client,
            WF_BUDGET,
            self._initial,
            workflow_id=self._workflow_id,
            task_queue=self._task_queue,
            update=update,
            arg=arg,
            result_type=result_type,
        )

    async def _acquire(self, req: BudgetLeaseRequest) -> BudgetDecision:
        """Join the next batch of this instance's lease requests and await its decision. A
        request that the budget's validator would refuse goes alone (the `acquire` update),
        so it fails with its own error and never takes a batch down with it."""
        if not req.holder.strip() or not req.device_key.strip():
            return await self._update(UPD_BUDGET_ACQUIRE, req)
        decided: asyncio.Future[BudgetDecision] = asyncio.get_running_loop().create_future()
        self._pending.append((req, decided))
        if self._sender is None or self._sender.done():
            self._sender = asyncio.ensure_future(self._send_pending())
        # Shielded: this request's activity ending early must not cancel the batch it is in.
        return await asyncio.shield(decided)

    async def _send_pending(self) -> None:
        """While requests are pending: take a free in-flight slot, then send everything
        pending at that moment (at most MAX_BATCH) as one `acquire-many` update. Requests
        arriving while every slot is busy gather into the next batch, so a burst costs about
        one update per slot per round trip instead of one per request."""
        while self._pending:
            await self._slots.acquire()
            batch, self._pending = self._pending[:MAX_BATCH], self._pending[MAX_BATCH:]
            task = asyncio.ensure_future(self._send_batch(batch))
            self._batches.add(task)
            task.add_done_callback(self._batches.discard)

    async def _send_batch(
        self, batch: list[tuple[BudgetLeaseRequest, asyncio.Future[BudgetDecision]]]
    ) -> None:
        self.batches_sent += 1
        try:
            answer = await self._update(
                UPD_BUDGET_ACQUIRE_MANY,
                BudgetLeaseBatch(requests=[req for req, _ in batch]),
                BudgetDecisions,
                slot_held=True,
            )
            if len(answer.decisions) != len(batch):
                raise RuntimeError(
                    f"the budget answered {len(answer.decisions)} decisions for "
                    f"{len(batch)} lease requests"
                )
        except BaseException as exc:
            for _, decided in batch:
                if not decided.done():
                    decided.set_exception(exc)
            if not isinstance(exc, Exception):
                raise
            return
        for (_, decided), decision in zip(batch, answer.decisions, strict=True):
            if not decided.done():
                decided.set_result(decision)

    @defn(ACT_ACQUIRE_BUDGET)
    async def acquire_budget_lease(self, req: BudgetLeaseRequest) -> BudgetDecision:
        decision = await self._acquire(req)
        log.info(
            "budget lease for %s: %s %s",
            req.holder,
            "granted" if decision.granted else "denied",
            decision.reason,
        )
        return decision

    @defn(ACT_RELEASE_BUDGET)
    async def release_budget_lease(self, req: BudgetReleaseRequest) -> BudgetDecision:
        return await self._update(UPD_BUDGET_RELEASE, req)

    @defn(ACT_RECONCILE_LEASES)
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
