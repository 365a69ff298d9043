"""One Temporal update to a long-lived workflow, started if it is not running: update-with-start,
or start-then-update on servers without multi-operation (the time-skipping test server). Shared by
the budget lease and GPU ledger activities."""

from __future__ import annotations

from typing import Any, TypeVar

from temporalio.client import Client, WithStartWorkflowOperation
from temporalio.common import WorkflowIDConflictPolicy
from temporalio.service import RPCError, RPCStatusCode

R = TypeVar("R")


async def update_with_start(
    client: Client,
    workflow: str,
    initial: Any,
    *,
    workflow_id: str,
    task_queue: str,
    update: str,
    arg: object,
    result_type: type[R],
) -> R:
    start: WithStartWorkflowOperation[Any, Any] = WithStartWorkflowOperation(
        workflow,
        initial,
        id=workflow_id,
        task_queue=task_queue,
        id_conflict_policy=WorkflowIDConflictPolicy.USE_EXISTING,
    )
    try:
        return await client.execute_update_with_start_workflow(
            update, arg, start_workflow_operation=start, result_type=result_type
        )
    except RPCError as exc:
        if exc.status != RPCStatusCode.UNIMPLEMENTED:
            raise
    handle = await client.start_workflow(
        workflow,
        initial,
        id=workflow_id,
        task_queue=task_queue,
        id_conflict_policy=WorkflowIDConflictPolicy.USE_EXISTING,
    )
    return await handle.execute_update(update, arg, result_type=result_type)
