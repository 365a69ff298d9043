"""Pool scaler workflow logic, on the Temporal dev server, driven the way the engine drives
it: caller workflows run the real ACT_REQUEST_CAPACITY activity (update-with-start), the real
CloudActivities run against an in-memory provider (`FakeNodePool`). The dev server, not the
time-skipping one: the time-skipping server jumps to the scaler's idle timer between two
callers (ending it), and cannot skip time while the callers' activities run anyway; so the
scaler gets sub-second knobs (batch 0.5 s, polls 0.2 s, operation timeout 2 s) and real time.

Cases:
- two concurrent needs -> ONE resize, target = current + both needs, both satisfied;
- step rounding: need 1 with step 2 asks +2; the spare node serves the next need without
  another request;
- max cap: needs beyond max -> the first gets the node, the second at-max; never above max;
- pool already at max -> at-max, no request;
- cool-down: a new need right after a resize -> cooldown, no request;
- quota (provider 4xx) -> every waiter gets rejected with the provider's message; a later
  need inside the cool-down gets the same answer without a second request;
- provider unavailable past the retry bound -> rejected, nobody waits forever;
- failed operation -> rejected with the operation's error (and held for the cool-down);
- a resize already running on the pool is followed first, then one resize;
- operation outliving the timeout -> in-progress;
- the same idempotency key twice -> counted once;
- a need for another pool -> refused by the validator (non-retryable for the caller);
- continue-as-new after `rounds_per_run` rounds carries the state: a retried key gets its
  old answer, the cool-down still holds;
- idle scaler completes; status query;
- a resize whose worker died (no answer, no heartbeat) is retried after the scaler's
  heartbeat timeout, not its 2-minute start-to-close, and the retry asks nothing twice; the
  describe and resize activities heartbeat while the provider answers;
- the remembered replies stay bounded without dropping one a waiter has not read (unit).
"""

from __future__ import annotations

import asyncio
import contextlib
import uuid
from collections.abc import AsyncIterator, Callable
from datetime import timedelta
from typing import Any

import pytest
from temporalio import activity
from temporalio.client import Client, WorkflowFailureError
from temporalio.service import RPCError
from temporalio.testing import ActivityEnvironment, WorkflowEnvironment
from temporalio.worker import UnsandboxedWorkflowRunner, Worker

from activities.capacity import CapacityActivities
from activities.cloud import CloudActivities
from activities.cloud import activities as cloud_module
from contract.capacity import (
    DESCRIBE_NODE_POOL,
    SCALE_NODE_POOL,
    CapacityRequest,
    CapacityResult,
    DescribePoolInput,
    NodePoolTarget,
    PoolDescription,
    PoolOperation,
    PoolScalerInput,
    PoolScalerStatus,
    ScalePoolInput,
    ScalePoolResult,
)
from contract.names import QRY_POOL_SCALER_STATUS, pool_scaler_workflow_id
from tests.cloud.callers import CapacityCaller
from tests.cloud.fakes import FakeNodePool
from tests.workflows.histories import scheduled_heartbeats
from workflows import pool_scaler
from workflows.pool_scaler import MAX_RECENT, PoolScalerWorkflow

POOL = NodePoolTarget(provider="gke", name="h100", project="p", location="l", cluster="c1")


class Harness:
    def __init__(self, client: Client, task_queue: str, fake: FakeNodePool) -> None:
        self.client, self.task_queue, self.fake = client, task_queue, fake
        # a pool of its own per test: its own scaler workflow on the shared dev server
        self.pool = POOL.model_copy(update={"name": f"h100-{uuid.uuid4().hex[:8]}"})
        self.scaler_id = pool_scaler_workflow_id(self.pool.name, self.pool.cluster)

    def request(self, key: str, need: int = 1, **kw: object) -> CapacityRequest:
        fields: dict[str, object] = dict(
            pool=self.pool,
            need=need,
            step=1,
            max_size=6,
            requester=f"wf-{key}",
            idempotency_key=key,
        )
        fields.update(kw)
        return CapacityRequest.model_validate(fields)

    async def ask(self, req: CapacityRequest) -> CapacityResult:
        return await self.client.execute_workflow(
            CapacityCaller.run,
            req,
            id=f"caller-{req.idempotency_key}-{uuid.uuid4().hex[:6]}",
            task_queue=self.task_queue,
        )

    async def status(self) -> PoolScalerStatus:
        handle = self.client.get_workflow_handle(self.scaler_id)
        return await handle.query(QRY_POOL_SCALER_STATUS, result_type=PoolScalerStatus)


def capacity_activities(client: Client, task_queue: str, **knobs: object) -> CapacityActivities:
    settings: dict[str, object] = dict(
        batch_window=timedelta(seconds=0.5),  # callers started together land in one batch
        poll_interval=timedelta(seconds=0.2),
        operation_timeout=timedelta(seconds=2),
        idle_timeout=timedelta(minutes=10),  # terminated at teardown
    )
    settings.update(knobs)
    return CapacityActivities(client, task_queue, **settings)  # type: ignore[arg-type]


def scaler_worker(
    client: Client,
    task_queue: str,
    cloud: list[Callable[..., Any]],
    capacity: CapacityActivities,
    **kw: Any,
) -> Worker:
    """A worker of the pool scaler and the test's callers: the `cloud` activities (describe,
    scale, wait-operation) and the capacity activity the callers run."""
    return Worker(
        client,
        task_queue=task_queue,
        workflows=[PoolScalerWorkflow, CapacityCaller],
        activities=[*cloud, capacity.request_capacity],
        **kw,
    )


@pytest.fixture
async def harness(
    dev_env: WorkflowEnvironment, request: pytest.FixtureRequest
) -> AsyncIterator[Harness]:
    fake = FakeNodePool(size=2)
    task_queue = f"scaler-{uuid.uuid4()}"
    client = dev_env.client
    cloud = CloudActivities(providers={"gke": fake})
    marker = request.node.get_closest_marker("scaler")
    capacity = capacity_activities(client, task_queue, **(marker.kwargs if marker else {}))
    async with scaler_worker(
        client,
        task_queue,
        [cloud.describe_pool, cloud.scale_pool, cloud.wait_pool_operation],
        capacity,
        max_cached_workflows=0,  # every task replays: determinism checked on each step
    ):
        harness = Harness(client, task_queue, fake)
        yield harness
        handle = client.get_workflow_handle(harness.scaler_id)
        with contextlib.suppress(RPCError):
            await handle.terminate("test over")
    await cloud.aclose()


async def test_two_concurrent_needs_make_one_request(harness: Harness) -> None:
    a, b = await asyncio.gather(
        harness.ask(harness.request("a")), harness.ask(harness.request("b"))
    )
    assert harness.fake.set_size_calls == [4]
    assert (a.status, b.status) == ("satisfied", "satisfied")
    assert a.target_size == b.target_size == 4
    assert a.operation == b.operation == "op-1"
    status = await harness.status()
    assert status.provider_requests == 1 and status.rounds == 1


async def test_step_rounding_leaves_headroom_for_the_next_need(harness: Harness) -> None:
    first = await harness.ask(harness.request("a", step=2))
    assert first.status == "satisfied" and first.target_size == 4
    second = await harness.ask(harness.request("b", step=2))
    assert second.status == "satisfied"
    assert "covered by the resize to 4" in second.message
    assert harness.fake.set_size_calls == [4]
    third = await harness.ask(harness.request("c", step=2))
    assert third.status == "cooldown"  # spare node used up, still inside the cool-down
    assert harness.fake.set_size_calls == [4]


async def test_cap_at_max_serves_needs_in_arrival_order(harness: Harness) -> None:
    harness.fake.size = 3
    a, b = await asyncio.gather(
        harness.ask(harness.request("a", max_size=4)),
        harness.ask(harness.request("b", max_size=4)),
    )
    assert harness.fake.set_size_calls == [4]
    assert sorted([a.status, b.status]) == ["at-max", "satisfied"]
    assert a.target_size == b.target_size == 4


async def test_pool_at_max_asks_nothing(harness: Harness) -> None:
    harness.fake.size = 6
    result = await harness.ask(harness.request("a", max_size=6))
    assert result.status == "at-max" and result.current_size == 6
    assert harness.fake.set_size_calls == []


async def test_provider_max_lower_than_runbook_max_wins(harness: Harness) -> None:
    harness.fake.provider_max = 3
    result = await harness.ask(harness.request("a", need=3, max_size=10))
    assert harness.fake.set_size_calls == [3]
    assert result.status == "at-max"  # only one of three nodes possible: need not met


async def test_cooldown_blocks_a_second_resize(harness: Harness) -> None:
    first = await harness.ask(harness.request("a", cooldown="10m"))
    assert first.status == "satisfied"
    second = await harness.ask(harness.request("b", cooldown="10m"))
    assert second.status == "cooldown" and "cool-down until" in second.message
    assert harness.fake.set_size_calls == [3]


async def test_quota_rejection_reaches_every_waiter(harness: Harness) -> None:
    harness.fake.reject = 'HTTP 403: Insufficient regional quota: resource "NVIDIA_H100_GPUS"'
    a, b = await asyncio.gather(
        harness.ask(harness.request("a")), harness.ask(harness.request("b"))
    )
    assert a.status == b.status == "rejected"
    assert "NVIDIA_H100_GPUS" in a.message and "NVIDIA_H100_GPUS" in b.message
    assert harness.fake.set_size_calls == [4]  # one try: a 4xx is never retried
    later = await harness.ask(harness.request("c"))  # same cool-down: not asked again
    assert later.status == "rejected" and "not asked again before" in later.message
    assert "NVIDIA_H100_GPUS" in later.message
    assert harness.fake.set_size_calls == [4]


@pytest.mark.scaler(poll_interval=timedelta(seconds=0.1))
async def test_provider_unavailable_past_retries_is_rejected(harness: Harness) -> None:
    harness.fake.unavailable = 10
    result = await harness.ask(harness.request("a"))
    assert result.status == "rejected" and "503" in result.message
    assert harness.fake.unavailable == 5  # API_ATTEMPTS: five tries, then give up


async def test_failed_operation_is_rejected(harness: Harness) -> None:
    harness.fake.op_error = "Insufficient quota to satisfy the request"
    result = await harness.ask(harness.request("a"))
    assert result.status == "rejected" and "Insufficient quota" in result.message
    again = await harness.ask(harness.request("b"))
    assert again.status == "rejected" and len(harness.fake.set_size_calls) == 1


async def test_running_resize_is_followed_before_asking(harness: Harness) -> None:
    harness.fake.pending = PoolOperation(id="foreign-op")
    harness.fake.pending_target = 3
    result = await harness.ask(harness.request("a", need=2))
    # the foreign resize took the pool to 3; ours asks for 3 + 2
    assert harness.fake.set_size_calls == [5]
    assert result.status == "satisfied" and result.target_size == 5


async def test_operation_outliving_timeout_is_in_progress(harness: Harness) -> None:
    harness.fake.polls_until_done = 1000  # operation_timeout 2 s at 0.2 s polls: ~10 looks
    result = await harness.ask(harness.request("a"))
    assert result.status == "in-progress" and result.operation == "op-1"


async def test_same_idempotency_key_counts_once(harness: Harness) -> None:
    a, b = await asyncio.gather(
        harness.ask(harness.request("same", need=2)), harness.ask(harness.request("same", need=2))
    )
    assert a == b and a.status == "satisfied"
    assert harness.fake.set_size_calls == [4]  # 2 + 2, not 2 + 4


async def test_need_for_another_pool_is_refused(harness: Harness) -> None:
    await harness.ask(harness.request("a"))  # scaler for POOL now running
    other = harness.pool.model_copy(update={"provider": "aks"})
    with pytest.raises(WorkflowFailureError) as info:
        await harness.ask(harness.request("b", pool=other))
    assert "refused the need" in str(info.value.cause.cause)  # type: ignore[union-attr]


@pytest.mark.scaler(idle_timeout=timedelta(seconds=1))
async def test_idle_scaler_completes(harness: Harness) -> None:
    await harness.ask(harness.request("a", cooldown="1s"))
    handle = harness.client.get_workflow_handle(harness.scaler_id, result_type=PoolScalerStatus)
    status = await handle.result()  # idle 1 s, past cool-down
    assert status.state == "idle" and status.provider_requests == 1


@pytest.mark.scaler(rounds_per_run=1)
async def test_continue_as_new_carries_replies_and_cooldown(harness: Harness) -> None:
    first = await harness.ask(harness.request("a", cooldown="10m"))
    assert first.status == "satisfied"
    handle = harness.client.get_workflow_handle(harness.scaler_id)
    desc = await handle.describe()
    runs = {desc.run_id}
    # a retried caller (same idempotency key) reaches the new run: same answer, no request
    again = await harness.ask(harness.request("a", cooldown="10m"))
    assert again == first
    later = await harness.ask(harness.request("b", cooldown="10m"))
    assert later.status == "cooldown"  # last_scaled_at survived continue-as-new
    runs.add((await handle.describe()).run_id)
    assert len(runs) == 2
    assert harness.fake.set_size_calls == [3]


async def test_a_resize_on_a_dead_worker_is_retried_after_the_heartbeat_timeout(
    dev_env: WorkflowEnvironment, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The first scale-node-pool attempt hangs without heartbeating (its worker was killed
    mid-call): the heartbeat timeout ends it and the retry resizes, instead of every waiter
    (and the Pending pods behind them) waiting out the 2-minute start-to-close. Shortened to
    2 s here (unsandboxed runner, patched constant); the shipped value is checked (30 s, three
    of the activity's 10 s beats)."""
    assert pool_scaler.API_HEARTBEAT == timedelta(seconds=30)
    assert pool_scaler.API_HEARTBEAT >= 3 * timedelta(seconds=cloud_module.HEARTBEAT_EVERY)
    monkeypatch.setattr(pool_scaler, "API_HEARTBEAT", timedelta(seconds=2))
    client = dev_env.client
    fake = FakeNodePool(size=2)
    cloud = CloudActivities(providers={"gke": fake})
    task_queue = f"scaler-dead-{uuid.uuid4()}"
    capacity = capacity_activities(client, task_queue)
    attempts: list[int] = []

    @activity.defn(name=SCALE_NODE_POOL.name)
    async def dies_first(req: ScalePoolInput) -> ScalePoolResult:
        attempts.append(activity.info().attempt)
        if activity.info().attempt == 1:
            await asyncio.sleep(3600)  # a dead worker: no heartbeat, no answer
        return await cloud.scale_pool(req)

    harness = Harness(client, task_queue, fake)
    async with scaler_worker(
        client,
        task_queue,
        [cloud.describe_pool, dies_first, cloud.wait_pool_operation],
        capacity,
        workflow_runner=UnsandboxedWorkflowRunner(),
        max_heartbeat_throttle_interval=timedelta(milliseconds=20),
    ):
        try:
            # Bounded well under the 2-minute start-to-close the retry must not wait for.
            result = await asyncio.wait_for(harness.ask(harness.request("a")), 60.0)
            history = await client.get_workflow_handle(harness.scaler_id).fetch_history()
        finally:
            with contextlib.suppress(RPCError):
                await client.get_workflow_handle(harness.scaler_id).terminate("test over")
    await cloud.aclose()
    assert result.status == "satisfied" and result.target_size == 3
    assert attempts == [1, 2] and fake.set_size_calls == [3]  # asked once
    beats = scheduled_heartbeats(history)
    assert beats[SCALE_NODE_POOL.name] == timedelta(seconds=2)
    assert beats[DESCRIBE_NODE_POOL.name] == timedelta(seconds=2)


class _SlowPool(FakeNodePool):
    async def describe(self, pool: NodePoolTarget) -> PoolDescription:
        await asyncio.sleep(0.3)  # a slow provider API
        return await super().describe(pool)


async def test_describe_and_resize_heartbeat_while_the_provider_answers(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(cloud_module, "HEARTBEAT_EVERY", 0.05)
    cloud = CloudActivities(providers={"gke": _SlowPool(size=2)})
    for call, arg in [
        (cloud.describe_pool, DescribePoolInput(pool=POOL)),
        (
            cloud.scale_pool,
            ScalePoolInput(pool=POOL, target_size=3, max_size=6, idempotency_key="k"),
        ),
    ]:
        beats: list[object] = []
        env = ActivityEnvironment()
        env.on_heartbeat = lambda *d, into=beats: into.append(d)
        await env.run(call, arg)
        assert len(beats) >= 3, f"{call.__name__}: {len(beats)} heartbeats in 0.3 s"
    await cloud.aclose()


def test_remembered_replies_are_bounded_but_never_drop_an_unread_one() -> None:
    """More waiters in one round than MAX_RECENT: every waiter still finds its answer; once
    read, the oldest answers are forgotten down to the bound."""
    scaler = PoolScalerWorkflow(PoolScalerInput(pool=POOL))
    keys = [f"k{i}" for i in range(MAX_RECENT + 5)]
    for key in keys:
        scaler._reply(key, CapacityResult(status="satisfied"))
    assert all(key in scaler._results for key in keys)  # nobody has read theirs yet
    scaler._unread.clear()  # every handler returned
    scaler._reply("late", CapacityResult(status="cooldown"))
    assert len(scaler._results) == MAX_RECENT
    assert "late" in scaler._results and "k0" not in scaler._results
