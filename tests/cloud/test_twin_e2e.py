"""End to end against the twin's cloud node-pool API (twin/cloudapi.py) over real
loopback HTTP: the `twin` provider is the GKE provider pointed at the twin.

Cases (activities, ActivityEnvironment):
- scale-up: setSize moves the pool's size, the operation finishes, the twin's resize hook
  (the node-pool controller's `resize`) receives the new size;
- quota (twin's max size) -> ERR_CLOUD_REJECTED, non-retryable, with the quota message;
- wrong token -> 401 -> rejected; injected 503 -> retryable;
- a second resize while one runs -> the running one is adopted, no second POST;
- the twin provider refuses a non-loopback endpoint (the token stays local).
Cases (pool scaler on the dev server, real worker, real activities, twin over HTTP):
- two remediation-like callers at once -> ONE setSize reaches the twin, pool 2 -> 4, both
  satisfied; the resize hook ran once;
- quota hit inside the operation (GKE-style async failure) -> both callers get rejected with
  the provider's message.
"""

from __future__ import annotations

import asyncio
import uuid
from datetime import timedelta
from pathlib import Path

import pytest
from temporalio.exceptions import ApplicationError
from temporalio.testing import ActivityEnvironment, WorkflowEnvironment
from temporalio.worker import Worker

from activities.capacity import CapacityActivities
from activities.cloud import CloudActivities
from contract.capacity import (
    CapacityRequest,
    CapacityResult,
    DescribePoolInput,
    NodePoolTarget,
    PoolOperationInput,
    ScalePoolInput,
)
from contract.errors import ERR_CLOUD_REJECTED, ERR_CLOUD_UNAVAILABLE, ERR_CONFIG
from tests.cloud.callers import CapacityCaller
from twin.cloudapi import CloudApiServer, TwinPool
from worker.settings import Settings
from workflows.pool_scaler import PoolScalerWorkflow


async def wait_done(acts: CloudActivities, pool: NodePoolTarget, op: str) -> object:
    env = ActivityEnvironment()
    for _ in range(100):
        try:
            return await env.run(
                acts.wait_pool_operation, PoolOperationInput(pool=pool, operation=op)
            )
        except ApplicationError:
            await asyncio.sleep(0.05)
    raise AssertionError("operation never finished")


async def test_scale_up_resizes_the_twin(
    cloud_twin: CloudApiServer, twin_pool: NodePoolTarget, cloud_activities: CloudActivities
) -> None:
    env = ActivityEnvironment()
    result = await env.run(
        cloud_activities.scale_pool,
        ScalePoolInput(pool=twin_pool, target_size=3, max_size=4, idempotency_key="k"),
    )
    assert result.previous_size == 2 and result.target_size == 3
    assert result.operation is not None and not result.operation.done
    op = await wait_done(cloud_activities, twin_pool, result.operation.id)
    assert op.done and op.error is None  # type: ignore[attr-defined]
    desc = await env.run(cloud_activities.describe_pool, DescribePoolInput(pool=twin_pool))
    assert desc.current_size == 3 and desc.pending_operation is None
    assert cloud_twin.api.resized == [("gpu-pool", 3)]  # type: ignore[attr-defined]
    assert len(cloud_twin.api.resize_requests()) == 1


async def test_quota_is_rejected_for_good(
    cloud_twin: CloudApiServer, twin_pool: NodePoolTarget, cloud_activities: CloudActivities
) -> None:
    with pytest.raises(ApplicationError) as info:
        await ActivityEnvironment().run(
            cloud_activities.scale_pool,
            ScalePoolInput(pool=twin_pool, target_size=6, max_size=8, idempotency_key="k"),
        )
    assert info.value.type == ERR_CLOUD_REJECTED and info.value.non_retryable
    assert "Insufficient regional quota" in str(info.value)
    assert cloud_twin.api.pools["gpu-pool"].size == 2


async def test_wrong_token_is_rejected(
    cloud_twin: CloudApiServer,
    twin_pool: NodePoolTarget,
    cloud_activities: CloudActivities,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("SICKBAY_TWIN_CLOUD_TOKEN", "not-the-token")
    with pytest.raises(ApplicationError) as info:
        await ActivityEnvironment().run(
            cloud_activities.describe_pool, DescribePoolInput(pool=twin_pool)
        )
    assert info.value.type == ERR_CLOUD_REJECTED and "UNAUTHENTICATED" in str(info.value)


async def test_injected_outage_is_retryable(
    cloud_twin: CloudApiServer, twin_pool: NodePoolTarget, cloud_activities: CloudActivities
) -> None:
    cloud_twin.api.inject(503)
    with pytest.raises(ApplicationError) as info:
        await ActivityEnvironment().run(
            cloud_activities.describe_pool, DescribePoolInput(pool=twin_pool)
        )
    assert info.value.type == ERR_CLOUD_UNAVAILABLE and not info.value.non_retryable
    desc = await ActivityEnvironment().run(
        cloud_activities.describe_pool, DescribePoolInput(pool=twin_pool)
    )
    assert desc.current_size == 2  # the next try goes through


async def test_running_resize_is_adopted(
    cloud_twin: CloudApiServer, twin_pool: NodePoolTarget, cloud_activities: CloudActivities
) -> None:
    cloud_twin.api.pools["gpu-pool"].latency = 5.0
    env = ActivityEnvironment()
    first = await env.run(
        cloud_activities.scale_pool,
        ScalePoolInput(pool=twin_pool, target_size=3, max_size=4, idempotency_key="a"),
    )
    second = await env.run(
        cloud_activities.scale_pool,
        ScalePoolInput(pool=twin_pool, target_size=4, max_size=4, idempotency_key="b"),
    )
    assert second.adopted and second.operation is not None and first.operation is not None
    assert second.operation.id == first.operation.id
    assert len(cloud_twin.api.resize_requests()) == 1


async def test_twin_provider_stays_on_loopback(cloud_activities: CloudActivities) -> None:
    pool = NodePoolTarget(provider="twin", name="gpu-pool", endpoint="http://10.0.0.5:8080")
    with pytest.raises(ApplicationError) as info:
        await ActivityEnvironment().run(
            cloud_activities.describe_pool, DescribePoolInput(pool=pool)
        )
    assert info.value.type == ERR_CONFIG and "loopback" in str(info.value)


async def run_callers(
    client: object, pool: NodePoolTarget, cloud: CloudActivities, n: int = 2
) -> list[CapacityResult]:
    task_queue = f"twin-{uuid.uuid4()}"
    capacity = CapacityActivities(
        client,  # type: ignore[arg-type]
        task_queue,
        batch_window=timedelta(seconds=0.5),  # both callers land in one batch
        poll_interval=timedelta(seconds=0.1),
        operation_timeout=timedelta(seconds=10),
    )
    async with Worker(
        client,  # type: ignore[arg-type]
        task_queue=task_queue,
        workflows=[PoolScalerWorkflow, CapacityCaller],
        activities=[
            cloud.describe_pool,
            cloud.scale_pool,
            cloud.wait_pool_operation,
            capacity.request_capacity,
        ],
    ):
        run = uuid.uuid4().hex[:6]
        return list(
            await asyncio.gather(
                *(
                    client.execute_workflow(  # type: ignore[attr-defined]
                        CapacityCaller.run,
                        CapacityRequest(
                            pool=pool,
                            need=1,
                            max_size=6,
                            requester=f"sickbay-gpu-node-{i}-{run}",
                            idempotency_key=f"sickbay-gpu-node-{i}-{run}-scale-1",
                        ),
                        id=f"caller-{i}-{run}",
                        task_queue=task_queue,
                    )
                    for i in range(n)
                )
            )
        )


async def test_two_concurrent_needs_one_request_to_the_twin(
    dev_env: WorkflowEnvironment, cloud_twin: CloudApiServer, cloud_activities: CloudActivities
) -> None:
    # a pool name of its own: its own scaler workflow on the shared dev server
    name = f"gpu-{uuid.uuid4().hex[:6]}"
    cloud_twin.api.add_pool(TwinPool(name=name, size=2, max_size=6, latency=0.3))
    pool = NodePoolTarget(provider="twin", name=name, endpoint=cloud_twin.url)
    results = await run_callers(dev_env.client, pool, cloud_activities)
    assert [r.status for r in results] == ["satisfied", "satisfied"]
    assert {r.target_size for r in results} == {4}
    assert len(cloud_twin.api.resize_requests(name)) == 1
    assert cloud_twin.api.pools[name].size == 4
    assert cloud_twin.api.resized == [(name, 4)]  # type: ignore[attr-defined]


async def test_quota_inside_the_operation_rejects_every_caller(
    dev_env: WorkflowEnvironment, cloud_twin: CloudApiServer, cloud_activities: CloudActivities
) -> None:
    name = f"gpu-{uuid.uuid4().hex[:6]}"
    cloud_twin.api.add_pool(
        TwinPool(name=name, size=2, max_size=3, latency=0.2, quota_error="operation")
    )
    pool = NodePoolTarget(provider="twin", name=name, endpoint=cloud_twin.url)
    results = await run_callers(dev_env.client, pool, cloud_activities)
    assert [r.status for r in results] == ["rejected", "rejected"]
    assert all("Insufficient quota" in r.message for r in results)
    assert len(cloud_twin.api.resize_requests(name)) == 1
    assert cloud_twin.api.pools[name].size == 2
    assert cloud_twin.api.resized == []  # type: ignore[attr-defined]


async def test_provider_only_runbook_uses_the_workers_twin_url(
    cloud_twin: CloudApiServer, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """`scaleUp.provider: twin` without a pool: the engine names the failed node's pool and
    the worker knows where the twin is (`twin.endpoint` of its cloud file)."""
    cloud_file = tmp_path / "cloud.yaml"
    cloud_file.write_text(f"twin:\n  endpoint: {cloud_twin.url}\n")
    monkeypatch.setenv("SICKBAY_CLOUD_FILE", str(cloud_file))
    acts = CloudActivities(Settings().cloud.cloud_config())  # as the worker builds it
    try:
        desc = await ActivityEnvironment().run(
            acts.describe_pool,
            DescribePoolInput(pool=NodePoolTarget(provider="twin", name="gpu-pool")),
        )
    finally:
        await acts.aclose()
    assert desc.current_size == 2
