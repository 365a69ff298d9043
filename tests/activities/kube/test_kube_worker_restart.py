"""A worker restart mid-wait, with a real Temporal dev server, a real worker and the twin.

Case: a workflow runs wait-for-eviction (heartbeat timeout 3 s) on worker A; one of two pods
goes, A heartbeats that, then A is shut down mid-wait. The next attempt runs on worker B and
resumes from A's heartbeat details: same deadline (it does not start a fresh wait) and the pod
already seen gone is reported gone; when the second pod goes, the workflow completes.
"""

from __future__ import annotations

import asyncio
import uuid
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from temporalio import workflow
from temporalio.client import Client
from temporalio.common import RetryPolicy
from temporalio.worker import UnsandboxedWorkflowRunner, Worker

from contract.kube import EvictionReport, PodRef, WaitEvictionInput
from contract.names import ACT_WAIT_EVICTION
from tests.activities.kube.conftest import twin
from tests.activities.kube.test_kube_waits import _watching_pods
from tests.waiting import until

pytestmark = pytest.mark.devserver


@workflow.defn(name="test-wait-eviction")
class WaitWorkflow:
    @workflow.run
    async def run(self, inp: WaitEvictionInput) -> EvictionReport:
        return await workflow.execute_activity(
            ACT_WAIT_EVICTION,
            inp,
            result_type=EvictionReport,
            start_to_close_timeout=inp.timeout + timedelta(minutes=1),
            heartbeat_timeout=timedelta(seconds=3),  # short: the test kills worker A
            retry_policy=RetryPolicy(
                initial_interval=timedelta(milliseconds=200), maximum_attempts=5
            ),
        )


async def test_restart_mid_wait_resumes(tmp_path: Path, dev_client: Client) -> None:
    with twin(tmp_path, "1.37", nodes=1) as t:
        node = t.node(0)
        pods = [t.consumer_pod("ml", n, node, f"gpu-{i}") for i, n in enumerate(("a", "b"))]
        refs = [
            PodRef(namespace="ml", name=p["metadata"]["name"], uid=p["metadata"]["uid"])
            for p in pods
        ]
        queue = f"kube-restart-{uuid.uuid4().hex[:8]}"

        def worker() -> Worker:
            return Worker(
                dev_client,
                task_queue=queue,
                workflows=[WaitWorkflow],
                activities=[t.acts.wait_for_eviction],
                workflow_runner=UnsandboxedWorkflowRunner(),
            )

        a = worker()
        run_a = asyncio.create_task(a.run())
        handle = await dev_client.start_workflow(
            WaitWorkflow.run,
            WaitEvictionInput(pods=refs, timeout=timedelta(minutes=5)),
            id=f"restart-{uuid.uuid4().hex[:8]}",
            task_queue=queue,
        )
        await until(lambda: _watching_pods(t), "worker A's eviction wait watching the pods")
        t.store.delete("pods", "a", "ml", grace_period_seconds=0)
        details = None
        for _ in range(300):  # until A's heartbeat with "a gone" reached the server
            desc = await handle.describe()
            pending = desc.raw_description.pending_activities
            if pending and pending[0].heartbeat_details.payloads:
                details = await dev_client.data_converter.decode(
                    pending[0].heartbeat_details.payloads
                )
                if details and details[0].get("gone"):
                    break
            await asyncio.sleep(0.1)
        assert details and details[0]["gone"] == [f"ml/a/{refs[0].uid}"]
        deadline = details[0]["deadline"]
        await a.shutdown()
        await run_a

        started_b = datetime.now(UTC).replace(tzinfo=None)
        b = worker()
        async with b:
            resumed = None
            for _ in range(400):  # B's attempt started and heartbeated its own details
                desc = await handle.describe()
                pending = desc.raw_description.pending_activities
                if (
                    pending
                    and pending[0].attempt >= 2
                    and pending[0].last_heartbeat_time.ToDatetime() > started_b
                ):
                    resumed = await dev_client.data_converter.decode(
                        pending[0].heartbeat_details.payloads
                    )
                    break
                await asyncio.sleep(0.1)
            assert resumed is not None, "worker B never heartbeated"
            assert resumed[0]["deadline"] == deadline  # kept A's deadline
            assert resumed[0]["gone"] == details[0]["gone"]  # and what A had seen
            t.store.delete("pods", "b", "ml", grace_period_seconds=0)
            report = await asyncio.wait_for(handle.result(), 30)
            desc = await handle.describe()
        assert [p.name for p in report.gone] == ["a", "b"] and not report.timed_out
        history = [e async for e in handle.fetch_history_events()]
        started = [e for e in history if e.HasField("activity_task_started_event_attributes")]
        assert started[-1].activity_task_started_event_attributes.attempt >= 2
