"""Workflow ids derived from names.

Cases: the device workflow id is normalised and needs node + UUID; the budget workflow id is
`sickbay-budget` on the default task queue and scoped to any other queue, so two deployments
(or two test workers) on one namespace never share a budget that only one of them serves; the
budget's task queue is `<queue>-budget` (idempotent).
"""

from __future__ import annotations

from typing import Any

import pytest
from temporalio.service import RPCError, RPCStatusCode

from activities.budget_client import BudgetActivities
from contract.budget import BudgetDecision, BudgetDecisions, BudgetLeaseRequest
from contract.names import (
    DEFAULT_TASK_QUEUE,
    UPD_BUDGET_ACQUIRE_MANY,
    WF_BUDGET,
    budget_task_queue,
    budget_workflow_id,
    device_workflow_id,
)


def test_device_workflow_id_is_normalised() -> None:
    assert device_workflow_id("GPU_Node.1", "GPU-AB:cd") == "sickbay-gpu-gpu-node-1-gpu-ab-cd"
    with pytest.raises(ValueError):
        device_workflow_id("node-1", "")


def test_budget_workflow_id_is_scoped_to_the_task_queue() -> None:
    assert budget_workflow_id(DEFAULT_TASK_QUEUE) == "sickbay-budget"
    assert budget_workflow_id("gpu-east") == "sickbay-budget-gpu-east"
    assert budget_workflow_id("q1") != budget_workflow_id("q2")


class _StartRecorder:
    """A client without update-with-start (as the time-skipping server): records the start."""

    def __init__(self) -> None:
        self.started: dict[str, Any] = {}

    async def execute_update_with_start_workflow(self, *args: Any, **kwargs: Any) -> Any:
        raise RPCError("multi-operation", RPCStatusCode.UNIMPLEMENTED, b"")

    async def start_workflow(self, workflow: str, arg: Any, **kwargs: Any) -> Any:
        self.started = {"workflow": workflow, **kwargs}
        return self

    async def execute_update(self, update: str, arg: Any, **kwargs: Any) -> Any:
        if update == UPD_BUDGET_ACQUIRE_MANY:  # the activity batches concurrent acquires
            return BudgetDecisions(decisions=[BudgetDecision(granted=True) for _ in arg.requests])
        return BudgetDecision(granted=True)


async def test_budget_activities_default_to_their_queue_budget() -> None:
    client = _StartRecorder()
    acts = BudgetActivities(client=client, task_queue="tests-q")  # type: ignore[arg-type]
    req = BudgetLeaseRequest(
        holder="h", device_key="n/g", node_pool="p", pool_limit=1, cluster_limit=1
    )
    assert (await acts.acquire_budget_lease(req)).granted
    assert client.started["workflow"] == WF_BUDGET
    assert client.started["id"] == "sickbay-budget-tests-q"
    assert client.started["task_queue"] == budget_task_queue("tests-q") == "tests-q-budget"


def test_budget_task_queue_is_its_own_and_idempotent() -> None:
    assert budget_task_queue(DEFAULT_TASK_QUEUE) == "sickbay-budget"
    assert budget_task_queue("gpu-east") == "gpu-east-budget"
    assert budget_task_queue(budget_task_queue("gpu-east")) == "gpu-east-budget"
