"""GPU ledger activities: the remediation's way to the `sickbay-gpu-ledger` workflow.

Like the budget lease activities (activities/budget.py): workflows cannot send updates to other
workflows, so these activities do it with the Temporal client, by update-with-start (the ledger
is created on first use, `USE_EXISTING` afterwards; a ledger between continue-as-new runs is
retried), with the same jittered retry of refused updates. Both updates are idempotent (per
incident, per incident and rung), so a retry after a lost answer records nothing twice.
"""

from __future__ import annotations

import asyncio
import logging
import random
import time
from typing import TypeVar

from temporalio.client import Client

from activities.budget import (
    BACKOFF_FIRST,
    BACKOFF_MAX,
    MAX_IN_FLIGHT,
    RETRY_DEADLINE,
    is_retryable,
)
from activities.defn import defn
from activities.update_with_start import update_with_start
from contract.ledger import LedgerDecision, LedgerState, RecordFailureInput, RecordRepairInput
from contract.names import (
    ACT_RECORD_GPU_FAILURE,
    ACT_RECORD_GPU_REPAIR,
    UPD_LEDGER_FAILURE,
    UPD_LEDGER_REPAIR,
    WF_GPU_LEDGER,
    ledger_workflow_id,
)

log = logging.getLogger(__name__)

R = TypeVar("R")


class LedgerActivities:
    def __init__(
        self,
        client: Client,
        task_queue: str,
        workflow_id: str | None = None,
        initial_state: LedgerState | None = None,
        *,
        deadline: float = RETRY_DEADLINE,
    ) -> None:
        self._client = client
        self._task_queue = task_queue  # the ledger runs on the remediation queue
        self._workflow_id = workflow_id or ledger_workflow_id(task_queue)
        self._initial = initial_state or LedgerState()
        self._slots = asyncio.Semaphore(MAX_IN_FLIGHT)
        self._deadline = deadline

    @property
    def workflow_id(self) -> str:
        return self._workflow_id

    async def _update(self, update: str, arg: object, result_type: type[R]) -> R:
        give_up = time.monotonic() + self._deadline
        attempt = 0
        while True:
            try:
                async with self._slots:
                    return await self._update_once(update, arg, result_type)
            except Exception as exc:
                if not is_retryable(exc):
                    raise
                attempt += 1
                delay = random.uniform(0, min(BACKOFF_MAX, BACKOFF_FIRST * 2**attempt))
                if time.monotonic() + delay > give_up:
                    log.warning("ledger %s still refused after %d tries: %s", update, attempt, exc)
                    raise
                await asyncio.sleep(delay)

    async def _update_once(self, update: str, arg: object, result_type: type[R]) -> R:
        return await update_with_start(
            self._client,
            WF_GPU_LEDGER,
            self._initial,
            workflow_id=self._workflow_id,
            task_queue=self._task_queue,
            update=update,
            arg=arg,
            result_type=result_type,
        )

    @defn(ACT_RECORD_GPU_FAILURE)
    async def record_gpu_failure(self, req: RecordFailureInput) -> LedgerDecision:
        decision = await self._update(UPD_LEDGER_FAILURE, req, LedgerDecision)
        log.info(
            "GPU %s failure recorded: %d in %s%s",
            req.gpu_uuid,
            decision.failures_in_window,
            req.window,
            ", retired" if decision.retired else "",
        )
        return decision

    @defn(ACT_RECORD_GPU_REPAIR)
    async def record_gpu_repair(self, req: RecordRepairInput) -> LedgerDecision:
        return await self._update(UPD_LEDGER_REPAIR, req, LedgerDecision)
