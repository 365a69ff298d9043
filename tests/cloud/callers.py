"""A remediation-like caller: a workflow that asks for capacity the way the engine does,
through the ACT_REQUEST_CAPACITY activity (update-with-start on the pool scaler)."""

from __future__ import annotations

from datetime import timedelta

from temporalio import workflow
from temporalio.common import RetryPolicy

with workflow.unsafe.imports_passed_through():
    from contract.capacity import CapacityRequest, CapacityResult
    from contract.names import ACT_REQUEST_CAPACITY


@workflow.defn(name="test-capacity-caller")
class CapacityCaller:
    @workflow.run
    async def run(self, req: CapacityRequest) -> CapacityResult:
        return await workflow.execute_activity(
            ACT_REQUEST_CAPACITY,
            req,
            # The scaler may batch, resize and follow the operation: minutes in real life.
            start_to_close_timeout=timedelta(minutes=40),
            heartbeat_timeout=timedelta(minutes=1),
            retry_policy=RetryPolicy(maximum_attempts=3),
            result_type=CapacityResult,
        )
