"""`sickbay-pool-scaler`: one workflow per node pool that turns many capacity needs into one
resize request.

Remediation workflows that run out of healthy devices call `request-capacity`, which sends
the `need-capacity` update to this workflow with update-with-start (so the first need starts
it). Each update waits here until its need is answered.

    idle --need--> batching (batch_window: gather needs arriving together)
                      |
                      v
       covered by the last resize's spare nodes? --yes--> reply satisfied
                      | no
       refused by the provider within the cool-down? --yes--> reply rejected (same words)
                      | no
       inside the cool-down of the last resize?  --yes--> reply cooldown
                      | no
       describing: size, bounds, running resize (follow it first)
                      |
       at max? --yes--> reply at-max
                      | no
       scaling: target = current + ceil(total need / step) * step, capped at max
                      |
       waiting-operation: poll the provider's operation
                      |
       reply every waiter: satisfied (nodes given in arrival order; those left over
       get at-max when the cap cut the request), in-progress (operation timeout),
       rejected (4xx: quota, auth; or the provider stayed unavailable)
                      |
                      v
    idle ... after idle_timeout with nothing to do (and past the cool-down) -> complete;
    long history -> continue-as-new carrying cool-down, spare nodes and recent replies.

Never above the smallest max size among the batch (and the provider's own bound). One
request per round, however many needs the round serves. Replies are kept by idempotency key
so a retried caller gets the same answer instead of a second resize.
"""

from __future__ import annotations

import math
from datetime import timedelta

from temporalio import workflow
from temporalio.common import RetryPolicy
from temporalio.exceptions import ActivityError, ApplicationError, RetryState
from temporalio.exceptions import TimeoutError as ActivityTimeoutError

with workflow.unsafe.imports_passed_through():
    from contract.activity import declared_in
    from contract.base import format_duration
    from contract.capacity import (
        DESCRIBE_NODE_POOL,
        SCALE_NODE_POOL,
        WAIT_NODE_POOL_OPERATION,
        CapacityRequest,
        CapacityResult,
        DescribePoolInput,
        PoolDescription,
        PoolOperation,
        PoolOperationInput,
        PoolScalerInput,
        PoolScalerStatus,
        ScalePoolInput,
        ScalePoolResult,
    )
    from contract.errors import ERR_CLOUD_REJECTED, ERR_CONFIG, ERR_INVALID_INPUT
    from contract.failover import PROVIDER_HEARTBEAT
    from contract.names import (
        QRY_POOL_SCALER_STATUS,
        UPD_POOL_NEED,
        WF_POOL_SCALER,
    )
    from workflows.execute import execute

# The activities this workflow calls: the declarations imported here (the worker checks them).
REQUIRED_ACTIVITIES = declared_in(globals())

_PERMANENT = [ERR_CLOUD_REJECTED, ERR_CONFIG, ERR_INVALID_INPUT]

# Describe is two or three GETs; 60 s covers a slow API. A resize is a describe plus one
# POST/PUT; 2 minutes is generous.
DESCRIBE_TIMEOUT = timedelta(seconds=60)
SCALE_TIMEOUT = timedelta(minutes=2)
# Both heartbeat while the provider answers: a worker killed mid-call is retried elsewhere
# within this, and the retry adopts the resize it finds running (contract/failover.py).
API_HEARTBEAT = PROVIDER_HEARTBEAT
API_ATTEMPTS = 5  # then the waiters hear "rejected" with the provider's last words
# One look at an operation is one GET.
WAIT_OP_TIMEOUT = timedelta(seconds=30)
MAX_RECENT = 200  # replies remembered by idempotency key (carried across continue-as-new)
MAX_ADOPTIONS = 3  # follow at most this many foreign resizes in one round before giving up


def _poll_policy(interval: timedelta) -> RetryPolicy:
    # The retry policy *is* the polling loop (ERR_STILL_WAITING is retryable); the bound is the
    # activity's schedule_to_close = operation_timeout.
    return RetryPolicy(
        initial_interval=interval,
        backoff_coefficient=1.0,
        maximum_interval=interval,
        non_retryable_error_types=_PERMANENT,
    )


def _api_retry(poll_interval: timedelta) -> RetryPolicy:
    # Five tries with doubling backoff from the polling cadence (at most 2 s): with the default
    # 15 s polls that is 2, 4, 8, 16 s, riding out a short outage. Bounded, and 4xx never retried.
    # Retrying a resize never stacks two: the activity adopts a resize its lost attempt started.
    return RetryPolicy(
        initial_interval=min(poll_interval, timedelta(seconds=2)),
        backoff_coefficient=2.0,
        maximum_interval=timedelta(seconds=60),
        maximum_attempts=API_ATTEMPTS,
        non_retryable_error_types=_PERMANENT,
    )


def _cause_type(err: ActivityError) -> str | None:
    cause = err.cause
    return cause.type if isinstance(cause, ApplicationError) else None


def _cause_message(err: ActivityError) -> str:
    cause: BaseException | None = err.cause
    while cause is not None and not isinstance(cause, ApplicationError):
        cause = getattr(cause, "cause", None)
    return str(cause or err)[:500]


@workflow.defn(name=WF_POOL_SCALER)
class PoolScalerWorkflow:
    @workflow.init
    def __init__(self, inp: PoolScalerInput) -> None:
        self._inp = inp
        self._waiting: dict[str, CapacityRequest] = {}
        self._results: dict[str, CapacityResult] = dict(inp.recent)
        self._unread: set[str] = set()  # replied, handler not yet returned: never pruned
        self._rounds = inp.rounds
        self._rounds_this_run = 0
        self._last_scaled_at = inp.last_scaled_at
        self._last_cooldown = inp.last_cooldown
        self._last_target = inp.last_target
        self._headroom = inp.headroom
        self._refused_until = inp.refused_until
        self._last_refusal = inp.last_refusal
        self._status = PoolScalerStatus(
            pool=inp.pool.name,
            rounds=inp.rounds,
            last_scaled_at=inp.last_scaled_at,
            last_target=inp.last_target,
        )

    # --- messages ----------------------------------------------------------------------------

    @workflow.update(name=UPD_POOL_NEED)
    async def need_capacity(self, req: CapacityRequest) -> CapacityResult:
        key = req.idempotency_key
        if key in self._results:
            return self._results[key]  # a retried caller: same answer, no second resize
        self._waiting.setdefault(key, req)
        self._status.waiting = len(self._waiting)
        await workflow.wait_condition(lambda: key in self._results)
        self._unread.discard(key)
        return self._results[key]

    @need_capacity.validator
    def _validate_need(self, req: CapacityRequest) -> None:
        mine, theirs = self._inp.pool, req.pool
        if (mine.provider, mine.name, mine.cluster) != (
            theirs.provider,
            theirs.name,
            theirs.cluster,
        ):
            raise ValueError(
                f"this scaler serves {mine.provider} pool {mine.name!r} (cluster "
                f"{mine.cluster!r}), not {theirs.provider} pool {theirs.name!r} "
                f"(cluster {theirs.cluster!r})"
            )

    @workflow.query(name=QRY_POOL_SCALER_STATUS)
    def status(self) -> PoolScalerStatus:
        return self._status

    # --- main loop ---------------------------------------------------------------------------

    @workflow.run
    async def run(self, inp: PoolScalerInput) -> PoolScalerStatus:
        while True:
            try:
                await workflow.wait_condition(lambda: bool(self._waiting), timeout=inp.idle_timeout)
            except TimeoutError:
                if not self._in_cooldown():
                    await workflow.wait_condition(workflow.all_handlers_finished)
                    if not self._waiting:
                        workflow.logger.info("pool %s: idle, scaler done", inp.pool.name)
                        return self._status
                continue
            await self._round()
            self._rounds_this_run += 1
            long_history = workflow.info().is_continue_as_new_suggested()
            if (long_history or self._rounds_this_run >= inp.rounds_per_run) and not self._waiting:
                await workflow.wait_condition(workflow.all_handlers_finished)
                if not self._waiting:
                    workflow.continue_as_new(self._carry())

    def _carry(self) -> PoolScalerInput:
        workflow.logger.info("pool %s: continuing as new", self._inp.pool.name)
        recent = dict(list(self._results.items())[-MAX_RECENT:])
        return self._inp.model_copy(
            update={
                "rounds": self._rounds,
                "last_scaled_at": self._last_scaled_at,
                "last_cooldown": self._last_cooldown,
                "last_target": self._last_target,
                "headroom": self._headroom,
                "refused_until": self._refused_until,
                "last_refusal": self._last_refusal,
                "recent": recent,
            }
        )

    def _in_cooldown(self, cooldown: timedelta = timedelta(0)) -> bool:
        if self._last_scaled_at is None:
            return False
        until = self._last_scaled_at + max(cooldown, self._last_cooldown)
        return workflow.now() < until

    def _enter(self, state: str) -> None:
        if self._status.state != state:
            workflow.logger.info("pool %s: %s", self._inp.pool.name, state)
        self._status.state = state  # type: ignore[assignment]

    def _reply(self, key: str, result: CapacityResult) -> None:
        self._results[key] = result
        self._unread.add(key)
        if len(self._results) > MAX_RECENT:
            # forget the oldest answers, but never one a waiting handler has yet to read
            for old in [k for k in self._results if k not in self._unread]:
                if len(self._results) <= MAX_RECENT:
                    break
                del self._results[old]
        self._waiting.pop(key, None)
        self._status.waiting = len(self._waiting)
        self._status.last_result = result

    def _reply_all(self, keys: list[str], result: CapacityResult) -> None:
        for key in keys:
            self._reply(key, result)

    # --- one round -------------------------------------------------------------------------

    async def _round(self) -> None:
        inp = self._inp
        self._enter("batching")
        await workflow.sleep(inp.batch_window)
        batch = dict(self._waiting)  # later needs wait for the next round
        self._rounds += 1
        self._status.rounds = self._rounds
        try:
            await self._serve(batch)
        except ActivityError as err:
            # The provider stayed unavailable past the retry bound (or refused): nobody waits
            # forever, and the caller escalates with the provider's words.
            message = _cause_message(err)
            workflow.logger.warning("pool %s: round failed: %s", inp.pool.name, message)
            if _cause_type(err) == ERR_CLOUD_REJECTED:
                self._refused(message, max(r.cooldown for r in batch.values()))
            self._reply_all(
                [k for k in batch if k in self._waiting],
                CapacityResult(status="rejected", message=message),
            )
        finally:
            self._enter("idle")

    def _refused(self, message: str, cooldown: timedelta) -> None:
        """A refusal (quota, auth) holds for the cool-down: asking again at once would only be
        refused again, once per failed GPU."""
        self._refused_until = workflow.now() + cooldown
        self._last_refusal = message

    async def _serve(self, batch: dict[str, CapacityRequest]) -> None:
        inp = self._inp
        reqs = list(batch.items())
        cooldown = max(r.cooldown for _, r in reqs)
        max_size = min(r.max_size for _, r in reqs)
        step = max(r.step for _, r in reqs)

        # 1. Spare nodes of the last resize (step rounding) serve small needs without a request.
        if self._headroom > 0 and self._in_cooldown(cooldown):
            left = []
            for key, req in reqs:
                if req.need <= self._headroom:
                    self._headroom -= req.need
                    self._reply(
                        key,
                        CapacityResult(
                            status="satisfied",
                            target_size=self._last_target,
                            current_size=self._last_target,
                            message=f"covered by the resize to {self._last_target} at "
                            f"{self._last_scaled_at:%H:%M:%S}Z",
                        ),
                    )
                else:
                    left.append((key, req))
            reqs = left
            if not reqs:
                return

        # 2. A recent refusal holds: same answer, no new request.
        if self._refused_until is not None and workflow.now() < self._refused_until:
            self._reply_all(
                [k for k, _ in reqs],
                CapacityResult(
                    status="rejected",
                    message=f"{self._last_refusal} (not asked again before "
                    f"{self._refused_until:%H:%M:%S}Z)",
                ),
            )
            return

        # 3. Cool-down: no new resize shortly after the last one.
        if self._in_cooldown(cooldown):
            assert self._last_scaled_at is not None
            until = self._last_scaled_at + max(cooldown, self._last_cooldown)
            self._reply_all(
                [k for k, _ in reqs],
                CapacityResult(
                    status="cooldown",
                    target_size=self._last_target,
                    message=f"pool resized at {self._last_scaled_at:%H:%M:%S}Z; cool-down "
                    f"until {until:%H:%M:%S}Z",
                ),
            )
            return

        for _ in range(MAX_ADOPTIONS + 1):
            # 4. Describe; a resize already running (ours from a lost attempt, or someone
            # else's) is followed before anything new is asked.
            self._enter("describing")
            desc: PoolDescription = await execute(
                DESCRIBE_NODE_POOL,
                DescribePoolInput(pool=inp.pool),
                start_to_close_timeout=DESCRIBE_TIMEOUT,
                heartbeat_timeout=API_HEARTBEAT,
                retry_policy=_api_retry(inp.poll_interval),
            )
            if desc.pending_operation is not None and not desc.pending_operation.done:
                op = await self._follow(desc.pending_operation.id)
                if op is None:
                    break  # still running after the timeout: fall through to in-progress
                continue

            limit = max_size if desc.max_size is None else min(max_size, desc.max_size)
            current = desc.current_size
            if current >= limit:
                self._reply_all(
                    [k for k, _ in reqs],
                    CapacityResult(
                        status="at-max",
                        target_size=current,
                        current_size=current,
                        message=f"pool has {current} node(s); its max is {limit}",
                    ),
                )
                return
            total_need = sum(r.need for _, r in reqs)
            target = min(current + math.ceil(total_need / step) * step, limit)

            # 5. One resize for the whole batch.
            self._enter("scaling")
            result: ScalePoolResult = await execute(
                SCALE_NODE_POOL,
                ScalePoolInput(
                    pool=inp.pool,
                    target_size=target,
                    max_size=limit,
                    idempotency_key=f"{workflow.info().workflow_id}-round-{self._rounds}",
                    dry_run=inp.dry_run,
                ),
                start_to_close_timeout=SCALE_TIMEOUT,
                heartbeat_timeout=API_HEARTBEAT,
                retry_policy=_api_retry(inp.poll_interval),
            )
            if result.adopted and result.operation is not None:
                if await self._follow(result.operation.id) is None:
                    break
                continue
            if not result.adopted and result.operation is not None:
                self._status.provider_requests += 1
            self._last_scaled_at = workflow.now()
            self._last_cooldown = cooldown
            self._last_target = result.target_size
            self._status.last_scaled_at = self._last_scaled_at
            self._status.last_target = result.target_size

            # 6. Follow the operation.
            status = "satisfied"
            message = result.message
            if result.operation is not None and not result.operation.done:
                op = await self._follow(result.operation.id)
                if op is None:
                    self._reply_all(
                        [k for k, _ in reqs],
                        CapacityResult(
                            status="in-progress",
                            target_size=result.target_size,
                            current_size=current,
                            operation=result.operation.id,
                            message=f"resize to {result.target_size} still running after "
                            f"{format_duration(inp.operation_timeout)}",
                        ),
                    )
                    return
                if op.error:
                    self._last_target = current
                    self._refused(op.error, cooldown)
                    self._reply_all(
                        [k for k, _ in reqs],
                        CapacityResult(
                            status="rejected",
                            target_size=result.target_size,
                            current_size=current,
                            operation=op.id,
                            message=op.error,
                        ),
                    )
                    return
            elif result.operation is None and result.target_size > current:
                status = "requested"  # accepted, nothing to follow

            # 7. Hand out the new nodes in arrival order.
            added = max(0, result.target_size - current)
            op_id = result.operation.id if result.operation else None
            for key, req in reqs:
                if req.need <= added:
                    added -= req.need
                    self._reply(
                        key,
                        CapacityResult(
                            status=status,  # type: ignore[arg-type]
                            target_size=result.target_size,
                            current_size=result.target_size,
                            operation=op_id,
                            message=message,
                        ),
                    )
                else:
                    self._reply(
                        key,
                        CapacityResult(
                            status="at-max",
                            target_size=result.target_size,
                            current_size=result.target_size,
                            operation=op_id,
                            message=f"resize capped at max {limit}; the new nodes went to "
                            "needs that came first",
                        ),
                    )
            self._headroom = added
            return

        # Several foreign resizes in a row, or one that outlived the timeout.
        self._reply_all(
            [k for k, _ in reqs if k in self._waiting],
            CapacityResult(
                status="in-progress",
                message="another resize kept running on the pool; nothing new was asked",
            ),
        )

    async def _follow(self, operation: str) -> PoolOperation | None:
        """Poll an operation until it is done; None when it outlives operation_timeout."""
        self._enter("waiting-operation")
        try:
            return await execute(
                WAIT_NODE_POOL_OPERATION,
                PoolOperationInput(pool=self._inp.pool, operation=operation),
                start_to_close_timeout=WAIT_OP_TIMEOUT,
                schedule_to_close_timeout=self._inp.operation_timeout,
                retry_policy=_poll_policy(self._inp.poll_interval),
            )
        except ActivityError as err:
            if isinstance(err.cause, ActivityTimeoutError) or err.retry_state == RetryState.TIMEOUT:
                return None
            raise
