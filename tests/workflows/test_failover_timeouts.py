"""The budget's task held by a dead worker moves on after 5 s, not the server's default 10 s.

Case (the time-skipping server's describe, as the Web UI shows it): the budget workflow started
by its first lease request carries the 5 s workflow task timeout, and so does the run its
continue-as-new starts (the GPU ledger starts and continues the same way, through the same
update-with-start and the same constant). The benchmark of a fleet with a worker SIGKILLed
mid-burst (bench/fleet.py) measures what it buys; nothing here is timed.
"""

from __future__ import annotations

import asyncio
import uuid
from datetime import timedelta

from temporalio.client import Client
from temporalio.testing import WorkflowEnvironment
from temporalio.worker import Worker

from activities.budget_client import BudgetActivities
from contract.budget import BudgetLeaseRequest, BudgetState
from contract.failover import SHARED_TASK_TIMEOUT
from contract.names import budget_task_queue
from workflows.budget import BudgetWorkflow


async def _task_timeout(client: Client, workflow_id: str, run_id: str | None = None) -> timedelta:
    desc = await client.get_workflow_handle(workflow_id, run_id=run_id).describe()
    return desc.raw_description.execution_config.default_workflow_task_timeout.ToTimedelta()


async def test_the_budget_keeps_the_short_task_timeout_across_continue_as_new(
    time_skipping_env: WorkflowEnvironment,
) -> None:
    client = time_skipping_env.client
    queue = f"tq-{uuid.uuid4()}"
    budget_id = f"sickbay-budget-{uuid.uuid4().hex[:8]}"
    budget = BudgetActivities(
        client, queue, workflow_id=budget_id, initial_state=BudgetState(max_updates_per_run=2)
    )
    worker = Worker(client, task_queue=budget_task_queue(queue), workflows=[BudgetWorkflow])
    async with worker:
        for n in range(3):
            req = BudgetLeaseRequest(
                holder=f"wf-{n}",
                device_key=f"wf-{n}/gpu",
                node_pool=f"pool-{n}",
                pool_limit=1,
                cluster_limit=5,
            )
            assert (await budget.acquire_budget_lease(req)).granted
            if n == 0:
                first_run = (await client.get_workflow_handle(budget_id).describe()).run_id
        handle = client.get_workflow_handle(budget_id)
        give_up = asyncio.get_running_loop().time() + 60  # a deadline, not a count of polls
        while (await handle.describe()).run_id == first_run:
            assert asyncio.get_running_loop().time() < give_up, "never continued as new"
            await asyncio.sleep(0.02)
        first = await _task_timeout(client, budget_id, first_run)
        latest = await _task_timeout(client, budget_id)
        await handle.terminate("test done")
    assert first == latest == SHARED_TASK_TIMEOUT
