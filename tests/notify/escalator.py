"""A remediation-like escalation step: notify each channel with a bounded retry policy, the
way the engine does, and return what each channel reported."""

from __future__ import annotations

from datetime import timedelta

from temporalio import workflow
from temporalio.common import RetryPolicy

with workflow.unsafe.imports_passed_through():
    from contract.names import ACT_NOTIFY
    from contract.notify import NotifyInput, NotifyResult


@workflow.defn(name="test-escalator")
class Escalator:
    @workflow.run
    async def run(self, requests: list[NotifyInput]) -> list[NotifyResult]:
        results = []
        for req in requests:
            results.append(
                await workflow.execute_activity(
                    ACT_NOTIFY,
                    req,
                    start_to_close_timeout=timedelta(seconds=15),  # one HTTP call, 10 s max
                    retry_policy=RetryPolicy(
                        initial_interval=timedelta(milliseconds=100),  # test speed
                        maximum_attempts=5,
                    ),
                    result_type=NotifyResult,
                )
            )
        return results
