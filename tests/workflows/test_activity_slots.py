"""Open waits never take the short calls' activity slots.

Before: one pool of `max_concurrent_activities` slots. With as many quarantined GPUs waiting for
their pods to leave as the worker had slots, a refused GPU's page (a short activity) queued
until a wait ended: minutes, in a cluster whose pods take their grace period.

Here, the production worker (`worker.main`'s remediation-queue Worker, its slots from
`worker.slots`) with 2 activity slots on the dev server; two remediations whose eviction waits
stay open (the fakes hold them until the test lets go), then a third GPU the budget refuses:
its escalation page goes out while both waits are still open. Also the supplier's counts on
their own: a wait's slot is given back to the short calls, waits beyond their share take a
short call's place, and a reservation blocked on a full pool is woken by a release.
"""

from __future__ import annotations

import asyncio
import uuid
from dataclasses import dataclass
from typing import Any

import pytest
from temporalio import activity
from temporalio.client import Client

from activities.budget_client import BudgetActivities
from activities.kube import KubeActivities
from activities.notify.activities import NotifyActivities
from contract.budget import BudgetDecision, BudgetLeaseRequest
from contract.kube import EvictionReport, WaitEvictionInput
from contract.names import device_workflow_id
from contract.notify import NotifyInput, NotifyResult
from tests.waiting import until
from tests.workflows.fakes import FakeWorld, fake_of, start
from worker.main import Built, _main_worker
from worker.settings import Settings
from worker.slots import LONG_WAITS, WaitAwareSlots


async def test_a_page_goes_out_while_every_regular_slot_could_be_a_wait(
    dev_client: Client,
) -> None:
    world = FakeWorld()
    open_waits: set[str] = set()
    let_go = asyncio.Event()
    refused = f"GPU-{uuid.uuid4()}"
    refused_id = device_workflow_id(world.node, refused)
    pages: list[NotifyInput] = []

    @fake_of(KubeActivities.wait_for_eviction)
    async def wait_eviction(req: WaitEvictionInput) -> EvictionReport:
        holder = activity.info().workflow_id
        open_waits.add(holder)
        try:
            while not let_go.is_set():  # a watch: heartbeats until its pods are gone
                activity.heartbeat()
                await asyncio.sleep(0.5)
        finally:
            open_waits.discard(holder)
        return EvictionReport(gone=req.pods)

    @fake_of(BudgetActivities.acquire_budget_lease)
    async def acquire(req: BudgetLeaseRequest) -> BudgetDecision:
        if req.holder == refused_id:
            return BudgetDecision(granted=False, reason="pool pool-a has 2 of 2 allowed")
        return BudgetDecision(granted=True, pool_in_use=1, cluster_in_use=1)

    @fake_of(NotifyActivities.notify)
    async def notify(req: NotifyInput) -> NotifyResult:
        pages.append(req)
        return NotifyResult(channel=req.channel, delivered=True, attempt=1)

    settings = Settings(
        task_queue=f"tq-slots-{uuid.uuid4()}", max_concurrent_activities=2, max_open_waits=4
    )
    built = Built(activities=world.activities(wait_eviction, acquire, notify))
    handles: list[Any] = []
    async with _main_worker(dev_client, settings, built) as worker:
        try:
            for _ in range(2):
                gpu = f"GPU-{uuid.uuid4()}"
                handles.append(await start(dev_client, worker, world, gpu_uuid=gpu))
            await until(lambda: len(open_waits) == 2, "both eviction waits open", within=60)
            handles.append(await start(dev_client, worker, world, gpu_uuid=refused))
            await until(
                lambda: any(p.incident.id == refused_id for p in pages),
                "the refused GPU's page sent",
                within=60,
            )
            assert len(open_waits) == 2, "the page went out while both waits were open"
        finally:
            let_go.set()
            for h in handles:
                await h.terminate("test done")


@dataclass
class _Info:
    activity_type: str


@dataclass
class _Used:
    slot_info: Any
    permit: Any


@dataclass
class _Released:
    slot_info: Any
    permit: Any


async def test_waits_are_counted_apart_from_the_short_calls() -> None:
    slots = WaitAwareSlots(regular=2, waits=1)
    ctx: Any = None
    wait_name = sorted(LONG_WAITS)[0]

    a = await slots.reserve_slot(ctx)
    b = await slots.reserve_slot(ctx)
    assert slots.try_reserve_slot(ctx) is None  # two reserved: the short calls' share
    slots.mark_slot_used(_Used(_Info(wait_name), a))  # type: ignore[arg-type]
    assert slots.in_use == (0, 1, 1)
    c = slots.try_reserve_slot(ctx)  # the wait gave its place back
    assert c is not None
    slots.mark_slot_used(_Used(_Info(wait_name), b))  # type: ignore[arg-type]
    assert slots.in_use == (0, 2, 1)  # a second wait: beyond `waits`, it takes a short place
    assert slots.try_reserve_slot(ctx) is None

    blocked = asyncio.ensure_future(slots.reserve_slot(ctx))
    await asyncio.sleep(0.05)
    assert not blocked.done()
    slots.release_slot(_Released(_Info(wait_name), a))  # type: ignore[arg-type]
    d = await asyncio.wait_for(blocked, timeout=5)
    slots.mark_slot_used(_Used(_Info("send-notification"), c))  # type: ignore[arg-type]
    slots.mark_slot_used(_Used(_Info("send-notification"), d))  # type: ignore[arg-type]
    assert slots.in_use == (2, 1, 0)
    slots.release_slot(_Released(_Info("send-notification"), d))  # type: ignore[arg-type]
    slots.release_slot(_Released(_Info("send-notification"), d))  # type: ignore[arg-type]
    assert slots.in_use == (1, 1, 0)  # a second release of one permit counts once


def test_slot_counts_must_make_sense() -> None:
    with pytest.raises(ValueError, match="regular 0"):
        WaitAwareSlots(regular=0, waits=1)
