"""GPU ledger activities: the remediation's way to the `sickbay-gpu-ledger` workflow.

Like the budget lease activities (activities/budget_client.py): workflows cannot send updates to other
workflows, so these activities do it with the Temporal client, by update-with-start (the ledger
is created on first use, `USE_EXISTING` afterwards; a ledger between continue-as-new runs is
retried), with the same jittered retry of refused updates (activities/update_with_start.py).
The ledger runs on its own task queue (`ledger_task_queue`: `<queue>-ledger`, polled by every
worker of `<queue>` with separate pollers), so its updates never wait behind remediation
workflow tasks. Failure records that arrive together go as one `record-failures` update (at
most MAX_BATCH): 200 GPUs failing at once cost a handful of updates. Both updates are
idempotent (per incident, per incident and rung), so a retry after a lost answer records
nothing twice.
"""

from __future__ import annotations

import logging
from datetime import timedelta

from temporalio.client import Client
from temporalio.exceptions import ApplicationError

from activities.defn import implements
from activities.update_with_start import RETRY_DEADLINE, Batcher, UpdateSender
from contract.errors import ERR_INVALID_INPUT
from contract.ledger import (
    RECORD_GPU_FAILURE,
    RECORD_GPU_REPAIR,
    LedgerDecision,
    LedgerDecisions,
    LedgerState,
    RecordFailureBatch,
    RecordFailureInput,
    RecordRepairInput,
)
from contract.names import (
    UPD_LEDGER_FAILURE,
    UPD_LEDGER_FAILURES,
    UPD_LEDGER_REPAIR,
    WF_GPU_LEDGER,
    ledger_task_queue,
    ledger_workflow_id,
)

log = logging.getLogger(__name__)


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
        # The id is keyed by the remediation queue; the workflow runs on its own queue.
        self._sender = UpdateSender(
            client,
            WF_GPU_LEDGER,
            initial_state or LedgerState(),
            workflow_id=workflow_id or ledger_workflow_id(task_queue),
            task_queue=ledger_task_queue(task_queue),
            what="ledger",
            deadline=deadline,
        )
        self._failures: Batcher[RecordFailureInput, LedgerDecision] = Batcher(
            self._sender,
            UPD_LEDGER_FAILURES,
            batch=lambda requests: RecordFailureBatch(requests=requests),
            result_type=LedgerDecisions,
            answers=lambda answer: answer.decisions,
        )

    @property
    def workflow_id(self) -> str:
        return self._sender.workflow_id

    @property
    def batches_sent(self) -> int:
        """record-failures updates sent (tests, diagnostics)."""
        return self._failures.batches_sent

    async def _record(self, req: RecordFailureInput) -> LedgerDecision:
        """Join the next batch; a request the ledger's validator would refuse goes alone (the
        `record-failure` update), so it fails with its own error and never takes a batch
        down with it."""
        if not req.gpu_uuid.strip() or not req.incident.strip() or req.window <= timedelta(0):
            return await self._sender.send(UPD_LEDGER_FAILURE, req, LedgerDecision)
        return await self._failures.submit(req)

    @implements(RECORD_GPU_FAILURE)
    async def record_gpu_failure(self, req: RecordFailureInput) -> LedgerDecision:
        if not req.evidence.strip():
            # Refused here, not only by the ledger's validator: in a batch it would refuse
            # the other remediations' failures with it.
            raise ApplicationError(
                f"GPU {req.gpu_uuid}: a failure needs the device evidence that confirmed it "
                "(alert, pod health, driver taint or failed validation); not recorded",
                type=ERR_INVALID_INPUT,
                non_retryable=True,
            )
        decision = await self._record(req)
        log.info(
            "GPU %s failure recorded: %d in %s%s",
            req.gpu_uuid,
            decision.failures_in_window,
            req.window,
            ", retired" if decision.retired else "",
        )
        return decision

    @implements(RECORD_GPU_REPAIR)
    async def record_gpu_repair(self, req: RecordRepairInput) -> LedgerDecision:
        return await self._sender.send(UPD_LEDGER_REPAIR, req, LedgerDecision)
