"""Benchmark 5: the blast-radius budget under a burst of lease requests.

On a Temporal dev server of its own (no twin, no worker process): the real `sickbay-budget`
workflow on its task queue, and `acquirers` lease requests sent at once through three
`BudgetActivities` instances (three workers' worth of in-flight caps, together above
Temporal's 10 in-flight updates per workflow), asking for one pool whose limit is `limit`.
Then every holder releases at once. Measured, per round:

- seconds until every acquirer had its answer, and until every release had its answer;
- leases granted and refused (exactly `limit` granted is the budget's contract; the tests
  check it, this only reports it);
- update RPCs refused by the server and retried with backoff (activities/budget_client.py).
"""

from __future__ import annotations

import asyncio
import logging
import sys
import time
import uuid
from pathlib import Path
from typing import Any

from temporalio.testing import WorkflowEnvironment
from temporalio.worker import Worker

from activities.budget_client import BudgetActivities
from bench.common import summary
from contract.budget import BudgetLeaseRequest, BudgetReleaseRequest
from contract.names import budget_task_queue
from worker.converter import DATA_CONVERTER
from workflows.budget import BudgetWorkflow

log = logging.getLogger("bench.budget_burst")

WORKERS = 3  # activity instances, each with its own in-flight cap


async def _round(env: WorkflowEnvironment, acquirers: int, limit: int) -> dict[str, Any]:
    queue = f"bench-budget-{uuid.uuid4().hex[:8]}"
    budget_id = f"sickbay-budget-{queue}"
    acts = [BudgetActivities(env.client, queue, workflow_id=budget_id) for _ in range(WORKERS)]
    async with Worker(env.client, task_queue=budget_task_queue(queue), workflows=[BudgetWorkflow]):
        started = time.monotonic()
        decisions = await asyncio.gather(
            *(
                acts[i % WORKERS].acquire_budget_lease(
                    BudgetLeaseRequest(
                        holder=f"burst-{i}",
                        device_key=f"node-{i}/gpu",
                        node_pool="pool-a",
                        pool_limit=limit,
                        cluster_limit=limit,
                    )
                )
                for i in range(acquirers)
            )
        )
        acquire_s = time.monotonic() - started
        started = time.monotonic()
        released = await asyncio.gather(
            *(
                acts[i % WORKERS].release_budget_lease(
                    BudgetReleaseRequest(holder=f"burst-{i}", device_key=f"node-{i}/gpu")
                )
                for i in range(acquirers)
            )
        )
        release_s = time.monotonic() - started
        await env.client.get_workflow_handle(budget_id).terminate("benchmark done")
    return {
        "acquire_s": round(acquire_s, 3),
        "release_s": round(release_s, 3),
        "granted": sum(d.granted for d in decisions),
        "refused": sum(not d.granted for d in decisions),
        "released": sum(r.granted for r in released),
        "retries": sum(a.retries for a in acts),
    }


async def run(acquirers: int = 100, limit: int = 30, rounds: int = 5) -> dict[str, Any]:
    env = await WorkflowEnvironment.start_local(
        data_converter=DATA_CONVERTER,
        dev_server_existing_path=str(Path(sys.executable).parent / "temporal"),
        dev_server_extra_args=["--log-level", "never"],
        ui=False,
    )
    try:
        per_round = []
        for n in range(rounds):
            one = await _round(env, acquirers, limit)
            log.info("budget burst round %d: %s", n + 1, one)
            per_round.append(one)
    finally:
        await env.shutdown()
    return {
        "acquirers": acquirers,
        "limit": limit,
        "workers": WORKERS,
        "rounds": per_round,
        "acquire_s": summary([r["acquire_s"] for r in per_round]),
        "release_s": summary([r["release_s"] for r in per_round]),
        "retries": summary([float(r["retries"]) for r in per_round]),
    }


if __name__ == "__main__":
    import json

    logging.basicConfig(level=logging.INFO)
    print(json.dumps(asyncio.run(run()), indent=1))
