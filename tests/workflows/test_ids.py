"""Workflow ids derived from names.

Cases: the device workflow id is normalised and needs node + UUID; the budget workflow id is
`sickbay-budget` on the default task queue and scoped to any other queue, so two deployments
(or two test workers) on one namespace never share a budget that only one of them serves; the
budget's task queue is `<queue>-budget` (idempotent).
"""

from __future__ import annotations

import pytest

from activities.budget import BudgetActivities
from workflows.constants import (
    DEFAULT_TASK_QUEUE,
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


def test_budget_activities_default_to_their_queue_budget() -> None:
    acts = BudgetActivities(client=None, task_queue="tests-q")  # type: ignore[arg-type]
    assert acts._workflow_id == "sickbay-budget-tests-q"
    assert acts._task_queue == budget_task_queue("tests-q") == "tests-q-budget"


def test_budget_task_queue_is_its_own_and_idempotent() -> None:
    assert budget_task_queue(DEFAULT_TASK_QUEUE) == "sickbay-budget"
    assert budget_task_queue("gpu-east") == "gpu-east-budget"
    assert budget_task_queue(budget_task_queue("gpu-east")) == "gpu-east-budget"
