"""Updates to the cluster's long-lived workflows (the blast-radius budget, the GPU ledger), sent
by the remediation's activities: workflows cannot send updates to other workflows.

- `update_with_start`: one update, the workflow started if it is not running (update-with-start,
  or start-then-update on servers without multi-operation: the time-skipping test server).
- `UpdateSender`: Temporal accepts at most 10 in-flight updates per workflow and refuses the
  rest (RESOURCE_EXHAUSTED). A sender lets at most `max_in_flight` updates go at a time from
  this process, and retries a refused or transiently failed one with full-jitter backoff until
  its deadline passes, so a storm of callers all get an answer in a few seconds instead of
  running their activity into its timeout.
- `Batcher`: requests that arrive while every in-flight slot is busy go together in the next
  update (at most `max_batch`), decided in arrival order by the workflow, so 200 concurrent
  callers cost a handful of updates, not 200 round trips one slot after another.
"""

from __future__ import annotations

import asyncio
import logging
import random
import time
from collections.abc import Callable, Sequence
from typing import Any, Generic, TypeVar

from temporalio.client import (
    Client,
    WithStartWorkflowOperation,
    WorkflowUpdateRPCTimeoutOrCancelledError,
)
from temporalio.common import WorkflowIDConflictPolicy
from temporalio.service import RPCError, RPCStatusCode

from contract.failover import SHARED_TASK_TIMEOUT

log = logging.getLogger(__name__)

R = TypeVar("R")
Q = TypeVar("Q")  # one request of a batch
A = TypeVar("A")  # its answer

# Transient answers worth another try: the per-workflow in-flight update limit and server
# overload (RESOURCE_EXHAUSTED), a frontend restart (UNAVAILABLE), a slow round trip
# (DEADLINE_EXCEEDED, CANCELLED by the server), a workflow between continue-as-new runs
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
# spread out over the workflow's ~10-per-task pace instead of retrying in lockstep.
BACKOFF_FIRST = 0.05
BACKOFF_MAX = 1.0
# How long one activity attempt keeps retrying: under the workflow's 30 s local-activity
# start-to-close for these calls, so the attempt reports the last error itself.
RETRY_DEADLINE = 25.0
# At most this many requests in one batched update (its payload stays small).
MAX_BATCH = 50


def is_retryable(exc: BaseException) -> bool:
    """A refused or lost update RPC that another try can fix (see RETRYABLE_STATUS)."""
    while exc is not None:
        if isinstance(exc, RPCError):
            return exc.status in RETRYABLE_STATUS
        if isinstance(exc, WorkflowUpdateRPCTimeoutOrCancelledError):
            return True
        exc = exc.__cause__  # type: ignore[assignment]
    return False


async def update_with_start(
    client: Client,
    workflow: str,
    initial: Any,
    *,
    workflow_id: str,
    task_queue: str,
    update: str,
    arg: object,
    result_type: type[R],
) -> R:
    # The same start either way: started once, kept on its task timeout (contract.failover).
    options: dict[str, Any] = {
        "id": workflow_id,
        "task_queue": task_queue,
        "id_conflict_policy": WorkflowIDConflictPolicy.USE_EXISTING,
        "task_timeout": SHARED_TASK_TIMEOUT,
    }
    start: WithStartWorkflowOperation[Any, Any] = WithStartWorkflowOperation(
        workflow, initial, **options
    )
    try:
        return await client.execute_update_with_start_workflow(
            update, arg, start_workflow_operation=start, result_type=result_type
        )
    except RPCError as exc:
        if exc.status != RPCStatusCode.UNIMPLEMENTED:
            raise
    handle = await client.start_workflow(workflow, initial, **options)
    return await handle.execute_update(update, arg, result_type=result_type)


class UpdateSender:
    """Updates to one workflow (`workflow_id`, started on `task_queue` with `initial` when it
    is not running), at most `max_in_flight` at a time, each retried while refused."""

    def __init__(
        self,
        client: Client,
        workflow: str,
        initial: Any,
        *,
        workflow_id: str,
        task_queue: str,
        what: str,
        max_in_flight: int = MAX_IN_FLIGHT,
        deadline: float = RETRY_DEADLINE,
    ) -> None:
        self._client = client
        self._workflow = workflow
        self._initial = initial
        self.workflow_id = workflow_id
        self.task_queue = task_queue
        self._what = what  # "budget", "ledger": in the log lines
        self.slots = asyncio.Semaphore(max_in_flight)
        self._deadline = deadline
        self.retries = 0  # refused/transient update RPCs retried (tests, diagnostics)

    async def send(
        self, update: str, arg: object, result_type: type[R], *, slot_held: bool = False
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
                        return await self._once(update, arg, result_type)
                    finally:
                        self.slots.release()
                async with self.slots:
                    return await self._once(update, arg, result_type)
            except Exception as exc:
                if not is_retryable(exc):
                    raise
                attempt += 1
                delay = random.uniform(0, min(BACKOFF_MAX, BACKOFF_FIRST * 2**attempt))
                if time.monotonic() + delay > give_up:
                    log.warning(
                        "%s %s still refused after %d tries, giving up: %s",
                        self._what,
                        update,
                        attempt,
                        exc,
                    )
                    raise
                self.retries += 1
                if attempt in (1, 10, 50):
                    log.info("%s %s refused (%s), retry %d", self._what, update, exc, attempt)
                await asyncio.sleep(delay)

    async def _once(self, update: str, arg: object, result_type: type[R]) -> R:
        return await update_with_start(
            self._client,
            self._workflow,
            self._initial,
            workflow_id=self.workflow_id,
            task_queue=self.task_queue,
            update=update,
            arg=arg,
            result_type=result_type,
        )


class Batcher(Generic[Q, A]):
    """Requests for one batched update (`update`: `batch(requests)` in, `answers(result)` out,
    one answer per request, in order). `submit` joins the next batch and awaits its answer."""

    def __init__(
        self,
        sender: UpdateSender,
        update: str,
        *,
        batch: Callable[[list[Q]], object],
        result_type: type[Any],
        answers: Callable[[Any], Sequence[A]],
        max_batch: int = MAX_BATCH,
    ) -> None:
        self._sender = sender
        self._update = update
        self._batch = batch
        self._result_type = result_type
        self._answers = answers
        self._max_batch = max_batch
        # Requests waiting for the next batch, the task sending them, the batches on their way.
        self._pending: list[tuple[Q, asyncio.Future[A]]] = []
        self._sending: asyncio.Future[None] | None = None
        self._batches: set[asyncio.Future[None]] = set()
        self.batches_sent = 0  # batched updates sent (tests, diagnostics)

    async def submit(self, req: Q) -> A:
        answer: asyncio.Future[A] = asyncio.get_running_loop().create_future()
        self._pending.append((req, answer))
        if self._sending is None or self._sending.done():
            self._sending = asyncio.ensure_future(self._send_pending())
        # Shielded: this request's activity ending early must not cancel the batch it is in.
        return await asyncio.shield(answer)

    async def _send_pending(self) -> None:
        """While requests are pending: take a free in-flight slot, then send everything
        pending at that moment (at most max_batch) as one update. Requests arriving while
        every slot is busy gather into the next batch."""
        while self._pending:
            await self._sender.slots.acquire()
            batch = self._pending[: self._max_batch]
            self._pending = self._pending[self._max_batch :]
            task = asyncio.ensure_future(self._send_batch(batch))
            self._batches.add(task)
            task.add_done_callback(self._batches.discard)

    async def _send_batch(self, batch: list[tuple[Q, asyncio.Future[A]]]) -> None:
        self.batches_sent += 1
        try:
            result = await self._sender.send(
                self._update,
                self._batch([req for req, _ in batch]),
                self._result_type,
                slot_held=True,
            )
            answers = list(self._answers(result))
            if len(answers) != len(batch):
                raise RuntimeError(
                    f"{self._update} answered {len(answers)} times for {len(batch)} requests"
                )
        except BaseException as exc:
            for _, answer in batch:
                if not answer.done():
                    answer.set_exception(exc)
            if not isinstance(exc, Exception):
                raise
            return
        for (_, future), one in zip(batch, answers, strict=True):
            if not future.done():
                future.set_result(one)
