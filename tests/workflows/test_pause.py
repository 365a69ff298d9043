"""`sickbay pause` / `sickbay resume`: the budget workflow refuses every new lease while the
cluster is paused (the decision carries the pause), keeps the pause across continue-as-new,
and wakes every held remediation on resume; a remediation held by a pause records who paused
it and why, sends no page, and quarantines once resumed.
"""

from __future__ import annotations

import asyncio
import uuid
from datetime import timedelta

import pytest
from temporalio.client import WorkflowUpdateFailedError
from temporalio.service import RPCError
from temporalio.testing import WorkflowEnvironment
from temporalio.worker import Worker

from activities.budget_client import BudgetActivities
from contract.budget import (
    BudgetLeaseRequest,
    BudgetState,
    PauseAnswer,
    PauseRequest,
    ResumeRequest,
)
from contract.kube import DeviceCounts, DeviceRef
from contract.names import (
    ACT_CLAIM_ESCALATION,
    ACT_NOTIFY,
    ACT_QUARANTINE,
    QRY_BUDGET_STATE,
    QRY_TIMELINE,
    SIG_REPAIRED,
    UPD_BUDGET_PAUSE,
    UPD_BUDGET_RESUME,
    WF_REMEDIATE,
    budget_task_queue,
    device_workflow_id,
)
from contract.remediation import (
    Phase,
    RemediationInput,
    RemediationResult,
    RepairedRequest,
    TimelineEntry,
)
from tests.workflows.fakes import FakeWorld, new_worker, wait_phase, xid_alert
from workflows.budget import BudgetWorkflow


def _req(holder: str, pool: str = "pool-a") -> BudgetLeaseRequest:
    return BudgetLeaseRequest(
        holder=holder, device_key=f"{holder}/gpu", node_pool=pool, pool_limit=5, cluster_limit=9
    )


def _budget_worker(client, queue: str, budget: BudgetActivities) -> Worker:
    return Worker(
        client,
        task_queue=budget_task_queue(queue),
        workflows=[BudgetWorkflow],
        activities=[budget.reconcile_budget_leases],
    )


async def _state(handle) -> BudgetState:
    """The budget's state; a query that lands while the budget is continuing as new can go
    unanswered on the test server, so it is asked again (a deadline, not a count)."""
    give_up = asyncio.get_running_loop().time() + 60
    while True:
        try:
            return await handle.query(
                QRY_BUDGET_STATE, result_type=BudgetState, rpc_timeout=timedelta(seconds=5)
            )
        except RPCError:
            if asyncio.get_running_loop().time() > give_up:
                raise


async def test_pause_refuses_new_leases_and_survives_continue_as_new(
    time_skipping_env: WorkflowEnvironment,
) -> None:
    client = time_skipping_env.client
    queue = f"tq-{uuid.uuid4()}"
    budget_id = f"sickbay-budget-{uuid.uuid4().hex[:8]}"
    budget = BudgetActivities(
        client, queue, workflow_id=budget_id, initial_state=BudgetState(max_updates_per_run=3)
    )
    async with _budget_worker(client, queue, budget):
        handle = client.get_workflow_handle(budget_id)
        assert (await budget.acquire_budget_lease(_req("wf-held"))).granted
        first_run = (await handle.describe()).run_id
        paused = await handle.execute_update(
            UPD_BUDGET_PAUSE,
            PauseRequest(reason="bad driver rollout", actor="alice"),
            result_type=PauseAnswer,
        )
        assert paused.pause is not None and paused.pause.actor == "alice"
        refused = await budget.acquire_budget_lease(_req("wf-new"))
        again = await budget.acquire_budget_lease(_req("wf-held"))  # a lease kept stays
        # Blank reason or actor: refused by the validator, nothing recorded.
        with pytest.raises(WorkflowUpdateFailedError):
            await handle.execute_update(
                UPD_BUDGET_PAUSE, PauseRequest(reason=" ", actor="bob"), result_type=PauseAnswer
            )
        give_up = asyncio.get_running_loop().time() + 60  # a deadline, not a count of polls
        while asyncio.get_running_loop().time() < give_up:
            if (await handle.describe()).run_id != first_run:
                break
            await asyncio.sleep(0.02)
        assert (await handle.describe()).run_id != first_run, "never continued as new"
        state = await _state(handle)
        still = await budget.acquire_budget_lease(_req("wf-newer"))
        resumed = await handle.execute_update(
            UPD_BUDGET_RESUME, ResumeRequest(actor="bob"), result_type=PauseAnswer
        )
        after = await budget.acquire_budget_lease(_req("wf-new"))
        final = await _state(handle)
        await handle.terminate("test done")
    assert not refused.granted and refused.paused is not None
    assert "paused by alice" in refused.reason and "bad driver rollout" in refused.reason
    assert again.granted
    # The pause and who set it rode across continue-as-new; the refused holders are waiters.
    assert state.pause is not None and state.pause.reason == "bad driver rollout"
    assert [w.holder for w in state.waiters] == ["wf-new"]
    assert not still.granted and still.paused is not None
    assert resumed.previous is not None and resumed.pause is None
    assert sorted(resumed.held) == ["wf-new", "wf-newer"]
    assert after.granted and after.paused is None
    assert final.pause is None
    assert [(e.action, e.actor) for e in final.pause_log] == [("pause", "alice"), ("resume", "bob")]


async def test_paused_cluster_holds_without_page_and_resume_quarantines(
    time_skipping_env: WorkflowEnvironment,
) -> None:
    client = time_skipping_env.client
    world = FakeWorld(use_real_budget=True, counts=DeviceCounts(pool_devices=8, cluster_devices=40))
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
        _budget_worker(client, queue, budget),
    ):
        # Pausing a cluster with no budget workflow yet: the CLI's update-with-start.
        await budget._sender.send(
            UPD_BUDGET_PAUSE, PauseRequest(reason="driver rollout", actor="alice"), PauseAnswer
        )
        gpu = f"GPU-{uuid.uuid4()}"
        handle = await client.start_workflow(
            WF_REMEDIATE,
            RemediationInput(
                device=DeviceRef(node=world.node, gpu_uuid=gpu),
                alerts=[xid_alert(79, f"fp-{gpu}")],
                trigger="alert",
            ),
            id=device_workflow_id(world.node, gpu),
            task_queue=queue,
            result_type=RemediationResult,
        )
        held = await wait_phase(handle, Phase.GUARDING)
        for _ in range(200):
            timeline = await handle.query(QRY_TIMELINE, result_type=list[TimelineEntry])
            if any(e.action == "held: cluster paused" for e in timeline):
                break
            await asyncio.sleep(0.02)
            held = await wait_phase(handle, Phase.GUARDING)
        entry = next(e for e in timeline if e.action == "held: cluster paused")
        assert entry.actor == "alice"
        assert "driver rollout" in entry.reason and "not quarantined" in entry.reason
        assert held.paused is not None and "paused by alice" in held.paused
        assert "sickbay resume" in held.awaiting
        assert world.args(ACT_QUARANTINE) == []
        assert world.args(ACT_NOTIFY) == [] and world.args(ACT_CLAIM_ESCALATION) == []
        desc = await handle.describe()
        assert desc.search_attributes.get("SickbayPaused") == ["paused"]

        await budget._sender.send(UPD_BUDGET_RESUME, ResumeRequest(actor="bob"), PauseAnswer)
        status = await wait_phase(handle, Phase.HOLDING)
        assert status.paused is None
        assert len(world.args(ACT_QUARANTINE)) == 1
        timeline = await handle.query(QRY_TIMELINE, result_type=list[TimelineEntry])
        assert any(e.action == "cluster resumed" for e in timeline)
        # Unset (the time-skipping server shows an unset keyword as [None]).
        cleared = (await handle.describe()).search_attributes.get("SickbayPaused")
        assert cleared in (None, [], [None])
        await handle.signal(SIG_REPAIRED, RepairedRequest(actor="ops"))
        assert (await handle.result()).outcome == "released"
        await client.get_workflow_handle(budget_id).terminate("test done")
