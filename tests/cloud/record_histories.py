"""Record the pool-scaler histories replayed by test_pool_scaler_replay.py.

Run by hand after a deliberate change to the scaler's command sequence (which also needs a
`workflow.patched(...)` for running scalers): `.venv/bin/python -m tests.cloud.record_histories`.
Starts its own Temporal dev server; uses the in-memory FakeNodePool, so no secrets land in
the recorded histories.
"""

import asyncio
import sys
import uuid
from datetime import timedelta
from pathlib import Path

from temporalio.testing import WorkflowEnvironment
from temporalio.worker import Worker

from activities.capacity import CapacityActivities
from activities.cloud import CloudActivities
from contract.capacity import CapacityRequest, NodePoolTarget, PoolScalerStatus
from contract.names import pool_scaler_workflow_id
from tests.cloud.callers import CapacityCaller
from tests.cloud.fakes import FakeNodePool
from tests.conftest import dev_server_args
from worker.converter import DATA_CONVERTER
from workflows.pool_scaler import PoolScalerWorkflow

OUT = Path(__file__).resolve().parent / "histories"


async def scenario(env, name, fake, asks, knobs):
    tq = f"rec-{uuid.uuid4()}"
    cloud = CloudActivities(providers={"gke": fake})
    cap = CapacityActivities(env.client, tq, **knobs)
    pool = NodePoolTarget(
        provider="gke", name=f"h100-{name}", project="p", location="l", cluster="c1"
    )
    async with Worker(
        env.client,
        task_queue=tq,
        workflows=[PoolScalerWorkflow, CapacityCaller],
        activities=[
            cloud.describe_pool,
            cloud.scale_pool,
            cloud.wait_pool_operation,
            cap.request_capacity,
        ],
    ):
        for group in asks:
            await asyncio.gather(
                *(
                    env.client.execute_workflow(
                        CapacityCaller.run,
                        CapacityRequest(
                            pool=pool,
                            need=1,
                            step=s,
                            max_size=mx,
                            requester=k,
                            idempotency_key=k,
                            cooldown="1s",
                        ),
                        id=f"caller-{k}-{uuid.uuid4().hex[:4]}",
                        task_queue=tq,
                    )
                    for k, s, mx in group
                )
            )
        wid = pool_scaler_workflow_id(pool.name, pool.cluster)
        handle = env.client.get_workflow_handle(wid, result_type=PoolScalerStatus)
        status = await handle.result()
        hist = await handle.fetch_history()
        (OUT / f"{name}.json").write_text(hist.to_json())
        print(name, status.provider_requests, len(hist.events))
    await cloud.aclose()


async def main():
    env = await WorkflowEnvironment.start_local(
        data_converter=DATA_CONVERTER,
        dev_server_existing_path=str(Path(sys.executable).parent / "temporal"),
        dev_server_extra_args=dev_server_args(),
        ui=False,
    )
    knobs = dict(
        batch_window=timedelta(seconds=0.5),
        poll_interval=timedelta(seconds=0.2),
        operation_timeout=timedelta(seconds=2),
        idle_timeout=timedelta(seconds=2),
    )
    try:
        await scenario(
            env,
            "pool_scaler_coalesce_then_headroom",
            FakeNodePool(size=2),
            [[("a", 2, 6), ("b", 2, 6), ("c", 2, 6)], [("d", 2, 6)]],
            knobs,
        )
        await scenario(
            env,
            "pool_scaler_quota_refused",
            FakeNodePool(size=2, reject="HTTP 403: Insufficient regional quota"),
            [[("a", 1, 6), ("b", 1, 6)], [("c", 1, 6)]],
            knobs,
        )
        await scenario(
            env, "pool_scaler_at_max_cap", FakeNodePool(size=3), [[("a", 1, 4), ("b", 1, 4)]], knobs
        )
    finally:
        await env.shutdown()


if __name__ == "__main__":
    asyncio.run(main())
