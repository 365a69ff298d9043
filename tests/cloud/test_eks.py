"""EKS managed node groups (activities/cloud/aws.py) through boto3, pointed at the twin's EKS
shapes (twin/awsapi.py) with `endpoint_url`, through the real CloudActivities in an
ActivityEnvironment. Credentials are the test's own, from the environment leg of boto3's
standard chain (never real ones); every request the twin sees is SigV4-signed by botocore.

Cases:
- describe: `desiredSize` is the size, `minSize` / `maxSize` the bounds, status ACTIVE;
- scale: one UpdateNodegroupConfig with `scalingConfig: {desiredSize}` only and a
  `clientRequestToken`; the update is followed with DescribeUpdate until Successful and the
  twin resizes the pool;
- idempotent across retries and worker crashes: the same request key on a fresh worker (new
  clients, no memory) while the update runs adopts the running update found through
  ListUpdates + DescribeUpdate, and `set_size` repeated with the same key gets the same update
  back from EKS: one update in the twin;
- bounded by the node group's `maxSize`: a target past it is refused before anything is asked;
- errors: 409 ResourceInUseException and 429 retryable, 403 refused, no credentials in the
  chain -> ERR_CONFIG naming the chain, a wrong key -> refused;
- a failed update carries EKS's errors.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import pytest
from temporalio.exceptions import ApplicationError
from temporalio.testing import ActivityEnvironment

from activities.cloud import CloudActivities
from activities.cloud.config import CloudConfig
from contract.capacity import DescribePoolInput, NodePoolTarget, PoolOperationInput, ScalePoolInput
from contract.errors import (
    ERR_CLOUD_REJECTED,
    ERR_CLOUD_UNAVAILABLE,
    ERR_CONFIG,
    ERR_STILL_WAITING,
)
from tests.cloud.aws_twin import aws_config, aws_env
from twin.cloudapi import CloudApi, CloudApiServer, TwinPool

POOL = NodePoolTarget(provider="eks", name="gpu-ng", cluster="twin")


@pytest.fixture
async def eks(monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[tuple[CloudApi, Any]]:
    resized: list[tuple[str, int]] = []
    api = CloudApi(token="unused", on_resize=lambda pool, size: resized.append((pool, size)))
    api.resized = resized  # type: ignore[attr-defined]
    api.add_pool(TwinPool(name="gpu-ng", size=2, max_size=4, latency=0.3))
    aws_env(monkeypatch, api.aws.aws_access_key_id)
    server = await CloudApiServer(api).start()
    workers: list[CloudActivities] = []

    def worker() -> CloudActivities:
        acts = CloudActivities(CloudConfig(aws=aws_config(server)))
        workers.append(acts)
        return acts

    try:
        yield api, worker
    finally:
        for acts in workers:
            await acts.aclose()
        await server.stop()


async def _run(fn: Any, arg: Any) -> Any:
    return await ActivityEnvironment().run(fn, arg)


def _updates(api: CloudApi) -> list[str]:
    return [r.path for r in api.requests if r.path.endswith("/update-config")]


async def _follow(acts: CloudActivities, operation: str) -> Any:
    for _ in range(100):
        try:
            return await _run(
                acts.wait_pool_operation, PoolOperationInput(pool=POOL, operation=operation)
            )
        except ApplicationError as err:
            if err.type != ERR_STILL_WAITING:
                raise
        await asyncio.sleep(0.05)
    raise AssertionError("the update never finished")


async def test_describe_reads_the_scaling_config(eks: Any) -> None:
    _api, worker = eks
    desc = await _run(worker().describe_pool, DescribePoolInput(pool=POOL))
    assert (desc.current_size, desc.min_size, desc.max_size) == (2, 0, 4)
    assert desc.pending_operation is None and "ACTIVE" in desc.detail


async def test_scale_asks_one_update_and_follows_it(eks: Any) -> None:
    api, worker = eks
    acts = worker()
    req = ScalePoolInput(pool=POOL, target_size=3, max_size=8, idempotency_key="wf-1-scale")
    result = await _run(acts.scale_pool, req)
    assert (result.previous_size, result.target_size, result.adopted) == (2, 3, False)
    assert result.operation is not None and result.operation.target_size == 3
    sent = [r for r in api.requests if r.path.endswith("/update-config")]
    assert len(sent) == 1 and '"desiredSize": 3' in sent[0].body
    assert '"clientRequestToken"' in sent[0].body and "minSize" not in sent[0].body
    op = await _follow(acts, result.operation.id)
    assert op.done and op.error is None
    assert api.resized == [("gpu-ng", 3)]  # type: ignore[attr-defined]


async def test_a_retry_on_another_worker_adopts_the_running_update(eks: Any) -> None:
    api, worker = eks
    api.pools["gpu-ng"].latency = 3600.0  # still running when the retry looks, however slow
    req = ScalePoolInput(pool=POOL, target_size=4, max_size=8, idempotency_key="wf-2-scale")
    first = await _run(worker().scale_pool, req)
    # the worker died before its answer reached the workflow: the retry runs elsewhere
    retried = await _run(worker().scale_pool, req)
    assert retried.adopted and retried.operation is not None
    assert retried.operation.id == first.operation.id and retried.operation.target_size == 4
    assert len(_updates(api)) == 1


async def test_the_same_request_token_gets_the_same_update(eks: Any) -> None:
    api, worker = eks
    one, two = worker().provider_for(POOL), worker().provider_for(POOL)
    a = await one.set_size(POOL, 3, 4, "wf-3-scale")
    b = await two.set_size(POOL, 3, 4, "wf-3-scale")  # a crash between the call and its answer
    assert a.operation is not None and b.operation is not None
    assert a.operation.id == b.operation.id
    assert len(api.aws.updates) == 1  # EKS acted once
    await api.wait_idle()
    assert api.resized == [("gpu-ng", 3)]  # type: ignore[attr-defined]


async def test_never_past_the_node_group_max(eks: Any) -> None:
    api, worker = eks
    req = ScalePoolInput(pool=POOL, target_size=5, max_size=8, idempotency_key="wf-4-scale")
    with pytest.raises(ApplicationError) as err:
        await _run(worker().scale_pool, req)
    assert err.value.type == ERR_CLOUD_REJECTED and "max for this pool is 4" in str(err.value)
    assert _updates(api) == []


async def test_retryable_and_refused_errors(eks: Any) -> None:
    api, worker = eks
    acts = worker()
    req = ScalePoolInput(pool=POOL, target_size=3, max_size=8, idempotency_key="wf-5-scale")
    for status, kind, retryable in (
        (429, ERR_CLOUD_UNAVAILABLE, True),
        (409, ERR_CLOUD_UNAVAILABLE, True),
        (500, ERR_CLOUD_UNAVAILABLE, True),
        (403, ERR_CLOUD_REJECTED, False),
    ):
        api.inject(status, message=f"injected {status}", method="POST")
        with pytest.raises(ApplicationError) as err:
            await _run(acts.scale_pool, req)
        assert err.value.type == kind and err.value.non_retryable is not retryable, status
        assert f"injected {status}" in str(err.value)


async def test_credentials_come_from_the_chain(eks: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    api, worker = eks
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "AKIAWRONGKEY00000000")
    with pytest.raises(ApplicationError) as err:
        await _run(worker().describe_pool, DescribePoolInput(pool=POOL))
    assert err.value.type == ERR_CLOUD_REJECTED and "UnrecognizedClientException" in str(err.value)
    monkeypatch.delenv("AWS_ACCESS_KEY_ID")
    monkeypatch.delenv("AWS_SECRET_ACCESS_KEY")
    with pytest.raises(ApplicationError) as err:
        await _run(worker().describe_pool, DescribePoolInput(pool=POOL))
    assert err.value.type == ERR_CONFIG and "IRSA" in str(err.value)
    assert all(r.status == 403 for r in api.requests)  # nothing unsigned reached the API


async def test_a_failed_update_carries_eks_errors(eks: Any) -> None:
    api, worker = eks
    acts = worker()

    def fail(pool: str, size: int) -> None:
        raise RuntimeError("Could not launch On-Demand Instances. InsufficientInstanceCapacity")

    api.on_resize = fail
    req = ScalePoolInput(pool=POOL, target_size=3, max_size=8, idempotency_key="wf-6-scale")
    result = await _run(acts.scale_pool, req)
    op = await _follow(acts, result.operation.id)
    assert op.done and op.error and "InsufficientInstanceCapacity" in op.error
    assert "AsgInstanceLaunchFailures" in op.error
