"""`request-capacity` (contract.capacity.REQUEST_CAPACITY): the engine's way to ask a node pool
for more nodes.

The remediation workflow calls this activity; it sends the need to the pool's scaler workflow
(`sickbay-pool-scaler`, one per pool) with update-with-start, so the first need starts the
scaler and later ones join it, and waits for the scaler's answer (`CapacityResult`). The
scaler coalesces concurrent needs into one resize and replies to each caller.

The update id is the request's idempotency key: when this activity is retried, Temporal hands
back the same update's outcome instead of counting the need twice.

Callers: give it a start_to_close_timeout longer than the scaler's batch window plus its
operation timeout (defaults 10 s + 12 min; the engine uses 15 min), and optionally a
heartbeat_timeout of a minute or more: it heartbeats every `heartbeat_every` while it waits.
When an attempt times out anyway, the retry re-attaches to the same update (same id) and
gets the same answer; nothing is asked twice. After `operation_timeout` the scaler replies
`in-progress` rather than keep the caller waiting.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from temporalio import activity
from temporalio.client import (
    Client,
    WithStartWorkflowOperation,
    WorkflowUpdateFailedError,
)
from temporalio.common import WorkflowIDConflictPolicy
from temporalio.exceptions import ApplicationError
from temporalio.service import RPCError, RPCStatusCode

from activities.defn import implements
from activities.heartbeat import heartbeating
from contract.capacity import REQUEST_CAPACITY, CapacityRequest, CapacityResult, PoolScalerInput
from contract.errors import ERR_INVALID_INPUT
from contract.names import (
    UPD_POOL_NEED,
    WF_POOL_SCALER,
    pool_scaler_workflow_id,
)


class CapacityActivities:
    """Holds the worker's Temporal client and the scaler knobs it starts scalers with."""

    def __init__(
        self,
        client: Client,
        task_queue: str,
        *,
        batch_window: timedelta = timedelta(seconds=10),
        poll_interval: timedelta = timedelta(seconds=15),
        operation_timeout: timedelta = timedelta(minutes=12),
        idle_timeout: timedelta = timedelta(hours=1),
        dry_run: bool = False,
        rounds_per_run: int = 100,
        heartbeat_every: timedelta = timedelta(seconds=10),
        cluster: str = "",
    ) -> None:
        self._client = client
        self._task_queue = task_queue  # the worker's own (`Settings.task_queue`)
        self._cluster = cluster  # SICKBAY_CLUSTER: one pool scaler per (Sickbay cluster, pool)
        self._scaler = dict(
            batch_window=batch_window,
            poll_interval=poll_interval,
            operation_timeout=operation_timeout,
            idle_timeout=idle_timeout,
            dry_run=dry_run,
            rounds_per_run=rounds_per_run,
        )
        self._heartbeat_every = heartbeat_every.total_seconds()

    @implements(REQUEST_CAPACITY)
    async def request_capacity(self, req: CapacityRequest) -> CapacityResult:
        workflow_id = pool_scaler_workflow_id(req.pool.name, req.pool.cluster, self._cluster)
        start: WithStartWorkflowOperation[Any, Any] = WithStartWorkflowOperation(
            WF_POOL_SCALER,
            PoolScalerInput(pool=req.pool, **self._scaler),
            id=workflow_id,
            task_queue=self._task_queue,
            id_conflict_policy=WorkflowIDConflictPolicy.USE_EXISTING,
        )
        activity.logger.info(
            "asking pool scaler %s for %d node(s) for %s", workflow_id, req.need, req.requester
        )
        try:
            async with heartbeating(self._heartbeat_every):
                result: CapacityResult = await self._client.execute_update_with_start_workflow(
                    UPD_POOL_NEED,
                    req,
                    start_workflow_operation=start,
                    id=req.idempotency_key,
                    result_type=CapacityResult,
                )
        except WorkflowUpdateFailedError as exc:
            # The scaler's validator refused the need (wrong pool for that id): permanent.
            raise ApplicationError(
                f"pool scaler {workflow_id} refused the need: {exc.cause or exc}",
                type=ERR_INVALID_INPUT,
                non_retryable=True,
            ) from exc
        except RPCError as exc:
            if exc.status == RPCStatusCode.INVALID_ARGUMENT:
                raise ApplicationError(
                    f"pool scaler {workflow_id}: {exc.message}",
                    type=ERR_INVALID_INPUT,
                    non_retryable=True,
                ) from exc
            raise  # unavailable / deadline: retried by the caller's policy
        activity.logger.info(
            "pool scaler %s answered %s for %s: %s",
            workflow_id,
            result.status,
            req.requester,
            result.message,
        )
        return result
