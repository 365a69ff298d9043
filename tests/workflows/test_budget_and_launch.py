"""Budget workflow (real) and the signal-with-start launch path, on the time-skipping server.

Cases:
- two remediations race for the last budget slot of a pool: exactly one taints, the other is
  escalated budget-exhausted without a taint and waits; the winner's release frees the slot,
  the budget workflow wakes the waiting one (budget-freed signal), which takes the slot at
  once and quarantines (one escalation in all);
- the budget workflow grants idempotently per holder, refuses over the pool and the cluster
  limits, counts quarantines the cluster shows without a lease, validates updates (empty
  holder rejected);
- leases and waiters (refused holders to wake) survive continue-as-new (after
  max_updates_per_run updates);
- the budget runs on its own task queue; one started on the remediation queue (before that
  queue existed) is still served there and moves to its own queue at its next continue-as-new;
- periodic reconcile drops a lease whose holder workflow no longer exists;
- 20 duplicate alerts through activities/launch.signal_with_start -> one workflow, one piece
  of evidence, 19 duplicates counted;
- a non-canonical device is refused by the launch path (clear ValueError).
"""

from __future__ import annotations

import asyncio
import uuid
from datetime import timedelta

import pytest
from temporalio.client import WorkflowUpdateFailedError
from temporalio.testing import WorkflowEnvironment
from temporalio.worker import Worker

from activities.budget_client import BudgetActivities
from activities.launch import signal_with_start
from contract.budget import (
    BudgetDecision,
    BudgetLease,
    BudgetLeaseRequest,
    BudgetReleaseRequest,
    BudgetState,
)
from contract.kube import DeviceCounts, DeviceRef
from contract.names import (
    ACT_QUARANTINE,
    ACT_RESOLVE_DEVICE,
    QRY_BUDGET_STATE,
    QRY_STATUS,
    QRY_TIMELINE,
    SIG_ABORT,
    SIG_REPAIRED,
    UPD_BUDGET_ACQUIRE,
    WF_BUDGET,
    WF_REMEDIATE,
    budget_task_queue,
    device_workflow_id,
)
from contract.remediation import (
    AbortRequest,
    Phase,
    RemediationInput,
    RemediationResult,
    RemediationStatus,
    RepairedRequest,
    TimelineEntry,
)
from tests.workflows.fakes import FakeWorld, new_worker, wait_phase, xid_alert
from tests.workflows.histories import patch_markers
from workflows.budget import BudgetWorkflow
from workflows.remediation import DeviceRemediationWorkflow


def _req(holder: str, pool: str = "pool-a", pool_limit: int = 1, cluster_limit: int = 5):
    return BudgetLeaseRequest(
        holder=holder,
        device_key=f"{holder}/gpu",
        node_pool=pool,
        pool_limit=pool_limit,
        cluster_limit=cluster_limit,
    )


async def test_two_workflows_race_for_the_last_slot(time_skipping_env: WorkflowEnvironment) -> None:
    client = time_skipping_env.client
    # 2 GPUs in the pool, 50% -> one quarantine at a time in this pool.
    world = FakeWorld(use_real_budget=True, counts=DeviceCounts(pool_devices=2, cluster_devices=40))
    queue = f"tq-{uuid.uuid4()}"
    budget_id = f"sickbay-budget-{uuid.uuid4().hex[:8]}"
    budget = BudgetActivities(client, queue, workflow_id=budget_id)
    async with (
        new_worker(
            client,
            world,
            extra_activities=[budget.acquire_budget_lease, budget.release_budget_lease],
            task_queue=queue,
        ),
        await _budget_worker(client, queue, budget),
    ):
        uuids = [f"GPU-{uuid.uuid4()}", f"GPU-{uuid.uuid4()}"]
        handles = await asyncio.gather(
            *(
                client.start_workflow(
                    WF_REMEDIATE,
                    RemediationInput(
                        device=DeviceRef(node=world.node, gpu_uuid=u),
                        alerts=[xid_alert(79, f"fp-{u}")],
                        trigger="alert",
                    ),
                    id=device_workflow_id(world.node, u),
                    task_queue=queue,
                    result_type=RemediationResult,
                )
                for u in uuids
            )
        )
        winner = loser = None
        phases: list[Phase] = []
        for _ in range(300):
            statuses = [await h.query(QRY_STATUS, result_type=RemediationStatus) for h in handles]
            phases = [s.phase for s in statuses]
            if Phase.ESCALATED in phases and Phase.HOLDING in phases:
                winner = handles[phases.index(Phase.HOLDING)]
                loser = handles[phases.index(Phase.ESCALATED)]
                loser_status = statuses[phases.index(Phase.ESCALATED)]
                break
            await asyncio.sleep(0.02)
        assert winner is not None and loser is not None, f"phases: {phases}"
        assert loser_status.escalation_reason == "budget-exhausted"
        assert "budget slot" in loser_status.awaiting  # open, waiting for the slot
        assert len(world.args(ACT_QUARANTINE)) == 1  # exactly one device tainted
        state = await client.get_workflow_handle(budget_id).query(
            QRY_BUDGET_STATE, result_type=BudgetState
        )
        assert [lease.holder for lease in state.leases] == [winner.id]

        await winner.signal(SIG_REPAIRED, RepairedRequest(actor="ops"))
        assert (await winner.result()).outcome == "released"
        # The budget workflow wakes the waiting remediation (budget-freed signal): it retries
        # at once, without waiting for its 1-minute retry, and takes the freed slot.
        await wait_phase(loser, Phase.HOLDING)
        timeline = await loser.query(QRY_TIMELINE, result_type=list[TimelineEntry])
        assert any(e.action == "budget slot freed" for e in timeline)
        assert len(world.args(ACT_QUARANTINE)) == 2
        state = await client.get_workflow_handle(budget_id).query(
            QRY_BUDGET_STATE, result_type=BudgetState
        )
        assert [lease.holder for lease in state.leases] == [loser.id]
        await loser.signal(SIG_REPAIRED, RepairedRequest(actor="ops"))
        loser_result = await loser.result()
        assert loser_result.outcome == "escalated" and "released" in loser_result.reason
        state = await client.get_workflow_handle(budget_id).query(
            QRY_BUDGET_STATE, result_type=BudgetState
        )
        assert state.leases == []
        await client.get_workflow_handle(budget_id).terminate("test done")


async def _budget_worker(client, queue: str, budget: BudgetActivities) -> Worker:
    """The budget's own queue for remediations on `queue` (as worker.main runs it)."""
    return Worker(
        client,
        task_queue=budget_task_queue(queue),
        workflows=[BudgetWorkflow],
        activities=[budget.reconcile_budget_leases],
    )


async def test_budget_limits_idempotence_and_validation(
    time_skipping_env: WorkflowEnvironment,
) -> None:
    client = time_skipping_env.client
    queue = f"tq-{uuid.uuid4()}"
    budget_id = f"sickbay-budget-{uuid.uuid4().hex[:8]}"
    budget = BudgetActivities(client, queue, workflow_id=budget_id)
    async with await _budget_worker(client, queue, budget):
        first = await budget.acquire_budget_lease(_req("wf-a"))
        again = await budget.acquire_budget_lease(_req("wf-a"))
        pool_full = await budget.acquire_budget_lease(_req("wf-b"))
        other_pool = await budget.acquire_budget_lease(_req("wf-c", pool="pool-b", cluster_limit=2))
        cluster_full = await budget.acquire_budget_lease(
            _req("wf-d", pool="pool-z", cluster_limit=2)
        )
        handle = client.get_workflow_handle(budget_id)
        with pytest.raises(WorkflowUpdateFailedError):
            await handle.execute_update(UPD_BUDGET_ACQUIRE, _req(" "), result_type=BudgetDecision)
        released = await budget.release_budget_lease(
            BudgetReleaseRequest(holder="wf-a", device_key="wf-a/gpu")
        )
        after = await budget.acquire_budget_lease(_req("wf-b"))
        # Two rules in pool-q that no lease knows about (lost budget state): still counted.
        orphaned = await budget.acquire_budget_lease(
            _req("wf-e", pool="pool-q", pool_limit=2, cluster_limit=9).model_copy(
                update={"observed_pool_quarantined": 2}
            )
        )
        await handle.terminate("test done")
    assert first.granted and again.granted and again.reason == "already held"
    assert not pool_full.granted and "pool pool-a" in pool_full.reason
    assert other_pool.granted
    assert not cluster_full.granted and "cluster" in cluster_full.reason
    assert released.granted and after.granted
    assert not orphaned.granted and orphaned.pool_in_use == 2


async def test_leases_survive_continue_as_new(time_skipping_env: WorkflowEnvironment) -> None:
    client = time_skipping_env.client
    queue = f"tq-{uuid.uuid4()}"
    budget_id = f"sickbay-budget-{uuid.uuid4().hex[:8]}"
    budget = BudgetActivities(
        client,
        queue,
        workflow_id=budget_id,
        initial_state=BudgetState(max_updates_per_run=2),
    )
    async with await _budget_worker(client, queue, budget):
        handle = client.get_workflow_handle(budget_id)
        assert (await budget.acquire_budget_lease(_req("wf-1", pool="wf-1"))).granted
        first_run = (await handle.describe()).run_id
        for holder in ("wf-2", "wf-3"):
            assert (await budget.acquire_budget_lease(_req(holder, pool=holder))).granted
        refused = await budget.acquire_budget_lease(_req("wf-4", pool="wf-1"))  # pool full
        assert not refused.granted
        for _ in range(100):
            desc = await handle.describe()
            if desc.run_id != first_run:
                break
            await asyncio.sleep(0.02)
        state = await handle.query(QRY_BUDGET_STATE, result_type=BudgetState)
        first = await client.get_workflow_handle(budget_id, run_id=first_run).fetch_history()
        await handle.terminate("test done")
    assert desc.run_id != first_run, "never continued as new"
    # Nothing is released: the waiter list and the move to the budget's own queue are the
    # code, not `workflow.patched` branches.
    assert patch_markers(first) == []
    assert sorted(lease.holder for lease in state.leases) == ["wf-1", "wf-2", "wf-3"]
    assert [w.holder for w in state.waiters] == ["wf-4"]  # the refused one, to wake later


async def test_budget_on_the_remediation_queue_moves_to_its_own(
    time_skipping_env: WorkflowEnvironment,
) -> None:
    """A budget started on the remediation queue (not its own) is still found and served
    there, and its next continue-as-new moves it, leases and all."""
    client = time_skipping_env.client
    queue = f"tq-{uuid.uuid4()}"
    wf_id = f"sickbay-budget-{uuid.uuid4().hex[:8]}"
    budget = BudgetActivities(client, queue, workflow_id=wf_id)
    legacy = Worker(client, task_queue=queue, workflows=[BudgetWorkflow])
    async with legacy, await _budget_worker(client, queue, budget):
        handle = await client.start_workflow(
            WF_BUDGET, BudgetState(max_updates_per_run=2), id=wf_id, task_queue=queue
        )
        assert (await budget.acquire_budget_lease(_req("wf-1", pool="p1"))).granted
        assert (await budget.acquire_budget_lease(_req("wf-2", pool="p2"))).granted
        desc = await handle.describe()
        for _ in range(100):
            desc = await client.get_workflow_handle(wf_id).describe()
            if desc.run_id != handle.result_run_id:
                break
            await asyncio.sleep(0.02)
        assert desc.run_id != handle.result_run_id, "never continued as new"
        assert desc.task_queue == budget_task_queue(queue)
        assert (await budget.acquire_budget_lease(_req("wf-3", pool="p3"))).granted
        state = await client.get_workflow_handle(wf_id).query(
            QRY_BUDGET_STATE, result_type=BudgetState
        )
        await client.get_workflow_handle(wf_id).terminate("test done")
    assert sorted(lease.holder for lease in state.leases) == ["wf-1", "wf-2", "wf-3"]


async def test_reconcile_drops_leases_of_closed_holders(
    time_skipping_env: WorkflowEnvironment,
) -> None:
    client = time_skipping_env.client
    queue = f"tq-{uuid.uuid4()}"
    wf_id = f"sickbay-budget-{uuid.uuid4().hex[:8]}"
    budget = BudgetActivities(client, queue, workflow_id=wf_id)
    async with await _budget_worker(client, queue, budget):
        handle = await client.start_workflow(
            WF_BUDGET,
            BudgetState(
                leases=[BudgetLease(holder=f"sickbay-gpu-gone-{uuid.uuid4().hex}", device_key="x")],
                reconcile_interval=timedelta(minutes=1),
            ),
            id=wf_id,
            task_queue=budget_task_queue(queue),
        )
        await time_skipping_env.sleep(timedelta(minutes=2))
        state = None
        for _ in range(100):
            state = await handle.query(QRY_BUDGET_STATE, result_type=BudgetState)
            if not state.leases:
                break
            await asyncio.sleep(0.02)
        await handle.terminate("test done")
    assert state is not None and state.leases == []


async def test_twenty_duplicate_alerts_one_workflow(time_skipping_env: WorkflowEnvironment) -> None:
    client = time_skipping_env.client
    world = FakeWorld()
    async with new_worker(client, world) as worker:
        inp = RemediationInput(
            device=DeviceRef(node=world.node, gpu_uuid=world.gpu_uuid), trigger="alert"
        )
        alert = xid_alert(79, "fp-storm")
        results = [
            await signal_with_start(client, inp, task_queue=worker.task_queue, evidence=alert)
            for _ in range(20)
        ]
        handle = client.get_workflow_handle(results[0].workflow_id)
        status = await wait_phase(handle, Phase.HOLDING)
        await handle.signal(SIG_ABORT, AbortRequest(reason="test done", actor="t"))
        await handle.result()
    assert {r.workflow_id for r in results} == {device_workflow_id(world.node, world.gpu_uuid)}
    assert len({r.run_id for r in results}) == 1  # one run, 19 signals
    assert status.alerts == 1 and status.duplicate_alerts == 19
    assert len(world.args(ACT_RESOLVE_DEVICE)) == 1
    assert len(world.args(ACT_QUARANTINE)) == 1


async def test_launch_refuses_non_canonical_device(time_skipping_env: WorkflowEnvironment) -> None:
    inp = RemediationInput(device=DeviceRef(node="n1", gpu_index=3))
    with pytest.raises(ValueError, match="resolve it before launching"):
        await signal_with_start(time_skipping_env.client, inp, task_queue="unused")


def test_workflow_class_name_is_stable() -> None:
    assert DeviceRemediationWorkflow.__temporal_workflow_definition.name == WF_REMEDIATE  # type: ignore[attr-defined]
