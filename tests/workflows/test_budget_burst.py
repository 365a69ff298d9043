"""Budget lease activities under a burst, against the real budget workflow on the dev server.

Cases:
- 100 acquirers at once spread over three "workers" (three activity instances, 12 updates in
  flight > Temporal's 10 per workflow): every acquirer is answered, exactly `pool_limit` are
  granted, the rest refused with the pool reason; one worker's concurrent requests travel as
  one `acquire-many` update (at most two per worker here, not 33) and are decided in its
  arrival order; then 100 concurrent releases are all
  answered and free exactly the granted leases (how long that takes is bench/budget_burst.py's
  figure in BENCHMARKS.md, not a test's);
- the retry loop: an update refused with RESOURCE_EXHAUSTED / UNAVAILABLE is retried with
  backoff until it succeeds; a non-retryable error (INVALID_ARGUMENT) is raised at once; a
  refusal that outlasts the deadline is raised (the workflow then escalates) while refusals
  were still queued, so the deadline ended the loop, not the errors running out;
- is_retryable: RESOURCE_EXHAUSTED / UNAVAILABLE retried, INVALID_ARGUMENT and a plain error not.
"""

from __future__ import annotations

import asyncio
import uuid
from typing import Any

import pytest
from temporalio.service import RPCError, RPCStatusCode
from temporalio.testing import WorkflowEnvironment
from temporalio.worker import Worker

from activities.budget_client import BudgetActivities
from activities.update_with_start import is_retryable
from contract.budget import (
    BudgetDecision,
    BudgetDecisions,
    BudgetLeaseRequest,
    BudgetReleaseRequest,
)
from contract.names import UPD_BUDGET_ACQUIRE_MANY, budget_task_queue
from workflows.budget import BudgetWorkflow

BURST = 100
LIMIT = 30


def _req(i: int, limit: int = LIMIT) -> BudgetLeaseRequest:
    return BudgetLeaseRequest(
        holder=f"burst-{i}",
        device_key=f"node-{i}/gpu",
        node_pool="pool-a",
        pool_limit=limit,
        cluster_limit=limit,
    )


async def test_hundred_concurrent_acquirers_all_answered(dev_env: WorkflowEnvironment) -> None:
    queue = f"budget-burst-{uuid.uuid4().hex[:8]}"
    budget_id = f"sickbay-budget-{queue}"
    workers = [BudgetActivities(dev_env.client, queue, workflow_id=budget_id) for _ in range(3)]
    async with Worker(
        dev_env.client, task_queue=budget_task_queue(queue), workflows=[BudgetWorkflow]
    ):
        decisions = await asyncio.gather(
            *(workers[i % 3].acquire_budget_lease(_req(i)) for i in range(BURST))
        )
        assert sum(d.granted for d in decisions) == LIMIT
        refused = [d for d in decisions if not d.granted]
        assert len(refused) == BURST - LIMIT
        assert all(d.reason == f"pool pool-a has {LIMIT} of {LIMIT} allowed" for d in refused)
        # One worker's concurrent requests go together (acquire-many), decided in arrival
        # order: a handful of updates for 100 requests, and each worker's grants are the
        # first of its requests.
        assert sum(w.batches_sent for w in workers) <= 2 * len(workers)
        for k in range(3):
            mine = [d.granted for i, d in enumerate(decisions) if i % 3 == k]
            assert mine == sorted(mine, reverse=True), mine

        released = await asyncio.gather(
            *(
                workers[i % 3].release_budget_lease(
                    BudgetReleaseRequest(holder=f"burst-{i}", device_key=f"node-{i}/gpu")
                )
                for i in range(BURST)
            )
        )
        assert sum(r.granted for r in released) == LIMIT
        # Each freeing release reports the leases left: LIMIT-1 down to 0, each count once.
        left = sorted(r.cluster_in_use for r in released if r.granted)
        assert left == list(range(LIMIT))
        await dev_env.client.get_workflow_handle(budget_id).terminate("test done")


class _FlakyClient:
    """Answers update-with-start with the given errors first, then a grant."""

    def __init__(self, errors: list[BaseException]) -> None:
        self.errors = errors
        self.calls = 0

    async def execute_update_with_start_workflow(self, *args: Any, **kwargs: Any) -> Any:
        self.calls += 1
        if self.errors:
            raise self.errors.pop(0)
        if args[0] == UPD_BUDGET_ACQUIRE_MANY:
            return BudgetDecisions(
                decisions=[BudgetDecision(granted=True) for _ in args[1].requests]
            )
        return BudgetDecision(granted=True)


def _acts(client: _FlakyClient, deadline: float = 5.0) -> BudgetActivities:
    return BudgetActivities(client, "q", deadline=deadline)  # type: ignore[arg-type]


async def test_refused_updates_are_retried_until_answered() -> None:
    client = _FlakyClient(
        [
            RPCError("limit on in-flight updates (10)", RPCStatusCode.RESOURCE_EXHAUSTED, b""),
            RPCError("frontend restarting", RPCStatusCode.UNAVAILABLE, b""),
            RPCError("limit on in-flight updates (10)", RPCStatusCode.RESOURCE_EXHAUSTED, b""),
        ]
    )
    acts = _acts(client)
    decision = await acts.acquire_budget_lease(_req(1))
    assert decision.granted and client.calls == 4 and acts.retries == 3


async def test_non_retryable_and_deadline_errors_are_raised() -> None:
    bad = _FlakyClient([RPCError("bad request", RPCStatusCode.INVALID_ARGUMENT, b"")])
    with pytest.raises(RPCError, match="bad request"):
        await _acts(bad).acquire_budget_lease(_req(1))
    assert bad.calls == 1

    # More refusals than the backoff could try before the (short) deadline: the loop must stop
    # at the deadline with refusals left, not when the fake runs out and grants.
    always = _FlakyClient(
        [RPCError("limit", RPCStatusCode.RESOURCE_EXHAUSTED, b"") for _ in range(1000)]
    )
    with pytest.raises(RPCError, match="limit"):
        await _acts(always, deadline=0.5).release_budget_lease(
            BudgetReleaseRequest(holder="h", device_key="d")
        )
    assert 1 < always.calls < 1000 and always.errors


def test_is_retryable() -> None:
    assert is_retryable(RPCError("limit", RPCStatusCode.RESOURCE_EXHAUSTED, b""))
    assert is_retryable(RPCError("down", RPCStatusCode.UNAVAILABLE, b""))
    assert not is_retryable(RPCError("bad", RPCStatusCode.INVALID_ARGUMENT, b""))
    assert not is_retryable(ValueError("bad holder"))
