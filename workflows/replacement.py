"""Following evicted workloads to their replacements, shared by the per-GPU remediation
(`workflows.remediation.replace`) and the node incident (`workflows.node_incident`): one
version of the deadline race and of the scale-up's request and answer, called by both.

- `watch_replacements`: the deadline-free `wait-replacement` watch raced against a durable
  workflow timer (named in the Web UI); the watch ends when the replacements run, churn is
  seen or no owner needs one; the timer firing cancels it (TRY_CANCEL: not waited for, the
  watch only reads) and one look (`look_once`) says what is Pending, and why.
- `pool_target`, `capacity_request`, `capacity_refusal`, `capacity_error`: the runbook's
  `scaleUp` pool, the request to the pool scaler and what its answer means (an escalation
  reason and its words, or None: capacity is coming).
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from datetime import datetime, timedelta

from temporalio import workflow

with workflow.unsafe.imports_passed_through():
    from contract.capacity import CapacityRequest, CapacityResult, NodePoolTarget
    from contract.errors import ERR_POOL_AT_MAX
    from contract.kube import ReplacementReport, WaitReplacementInput
    from contract.runbook import EscalationReason, ScaleUpPolicy
    from workflows.execute import abandon

WaitCall = Callable[[WaitReplacementInput, timedelta], Awaitable[ReplacementReport]]


def _never() -> bool:
    return False


async def watch_replacements(
    wait: WaitCall,
    inp: WaitReplacementInput,
    limit: timedelta,
    deadline: Callable[[], datetime],
    name: str,
    *,
    moved: Callable[[], bool] = _never,
    tell: Callable[[], Awaitable[None]] | None = None,
    before_look: Callable[[], None] | None = None,
) -> ReplacementReport:
    """The replacements' report: the watch's own when it ends first, else one look when the
    `name` deadline timer fires. `limit`: the longest the watch may last (its activity
    timeout); `deadline()`: the timer's current end, re-read when `moved()` says an update
    moved it (after `tell()` told about it); `before_look`: raises when the look must not
    happen (an abort that arrived while waiting)."""
    watch = asyncio.ensure_future(wait(inp, limit))
    try:
        while not watch.done():
            if tell is not None:
                await tell()
            if moved():
                continue
            left = deadline() - workflow.now()
            if left <= timedelta(0):
                break
            try:
                await workflow.wait_condition(
                    lambda: watch.done() or moved(),
                    timeout=left,
                    timeout_summary=f"{name} deadline",
                )
            except TimeoutError:
                break
        if watch.done():
            return watch.result()  # raises the activity's failure (or the caller's abort)
        # The deadline fired: stop watching (not waited for), look once at the pods.
        abandon(watch)
        if before_look is not None:
            before_look()
        return await wait(inp.model_copy(update={"look_once": True}), timedelta(0))
    finally:
        if not watch.done():
            abandon(watch)


def pool_target(policy: ScaleUpPolicy, node: str, node_pool: str | None) -> NodePoolTarget:
    """The pool a scale-up asks: the runbook's `scaleUp.pool`, else the failed node's own
    pool at `scaleUp.provider` (the node's name when it carries no pool label)."""
    return policy.pool or NodePoolTarget(
        provider=policy.provider or "http", name=node_pool or node, node_pool_label=node_pool
    )


def capacity_request(
    policy: ScaleUpPolicy, pool: NodePoolTarget, requester: str, key: str
) -> CapacityRequest:
    """The request to the pool scaler: one more unit of capacity (rounded up to `step`
    nodes), never past `maxSize`; `key` makes a retried call the same request."""
    return CapacityRequest(
        pool=pool,
        need=1,
        step=policy.step,
        max_size=policy.max_size,
        cooldown=policy.cooldown,
        requester=requester,
        idempotency_key=key,
    )


def capacity_refusal(
    result: CapacityResult, pool: NodePoolTarget, policy: ScaleUpPolicy
) -> tuple[EscalationReason, str] | None:
    """What the pool scaler's answer means: an escalation (reason, words), or None when
    capacity was asked for or is on its way (wait for it under the capacity deadline)."""
    if result.status == "at-max":
        return (
            "no-capacity",
            f"no healthy GPU free and pool {pool.name} is at its max size "
            f"({result.current_size or policy.max_size}); replacements Pending",
        )
    if result.status == "rejected":
        return "scale-up-failed", f"pool {pool.name}: {result.message}"
    return None


def capacity_error(error_type: str | None) -> EscalationReason:
    """The escalation of a failed `request-capacity` call, by its error type."""
    return "no-capacity" if error_type == ERR_POOL_AT_MAX else "scale-up-failed"
