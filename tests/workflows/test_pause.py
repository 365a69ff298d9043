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

from activities.budget import BudgetActivities
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


async def _scrape(port: int, want: str) -> str:
    """The Prometheus page once it holds `want` (a deadline, not a count)."""
    import urllib.request

    give_up = asyncio.get_running_loop().time() + 60
    text = ""
    while asyncio.get_running_loop().time() < give_up:
        try:
            text = await asyncio.to_thread(
                lambda: urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics").read().decode()
            )
        except OSError:  # the exporter not listening yet
            text = ""
        if want in text:
            return text
        await asyncio.sleep(0.05)
    raise AssertionError(f"{want!r} never exported:\n{text}")


async def test_pause_gauge_and_records_for_events(time_skipping_env: WorkflowEnvironment) -> None:
    from temporalio.runtime import PrometheusConfig, Runtime, TelemetryConfig

    from contract.budget import PauseRecord
    from harness.stack import free_port
    from worker.gauges import report_pause

    client = time_skipping_env.client
    queue = f"tq-{uuid.uuid4()}"
    budget_id = f"sickbay-budget-{uuid.uuid4().hex[:8]}"
    budget = BudgetActivities(client, queue, workflow_id=budget_id)
    port = free_port()
    runtime = Runtime(  # kept referenced: its exporter lives as long as it does
        telemetry=TelemetryConfig(metrics=PrometheusConfig(bind_address=f"127.0.0.1:{port}"))
    )
    records: list[PauseRecord] = []
    stop = asyncio.Event()
    async with _budget_worker(client, queue, budget):
        await budget._sender.send(
            UPD_BUDGET_PAUSE, PauseRequest(reason="earlier", actor="carol"), PauseAnswer
        )
        await budget._sender.send(UPD_BUDGET_RESUME, ResumeRequest(actor="carol"), PauseAnswer)
        await budget._sender.send(
            UPD_BUDGET_PAUSE, PauseRequest(reason="driver rollout", actor="alice"), PauseAnswer
        )
        task = asyncio.create_task(
            report_pause(
                client,
                budget_id,
                "c1",
                stop,
                on_record=records.append,
                meter=runtime.metric_meter,
                every=0.05,
            )
        )
        await _scrape(
            port, 'sickbay_cluster_paused{cluster="c1",service_name="temporal-core-sdk"} 1'
        )
        await budget._sender.send(UPD_BUDGET_RESUME, ResumeRequest(actor="bob"), PauseAnswer)
        await _scrape(
            port, 'sickbay_cluster_paused{cluster="c1",service_name="temporal-core-sdk"} 0'
        )
        stop.set()
        await task
        await client.get_workflow_handle(budget_id).terminate("test done")
    # At start only the latest record (older ones had their Events from the worker then);
    # afterwards every new one.
    assert [(r.action, r.actor) for r in records] == [("pause", "alice"), ("resume", "bob")]


async def test_paused_open_remediation_does_not_scale_up_until_resumed(
    time_skipping_env: WorkflowEnvironment,
) -> None:
    """An open remediation (quarantined, lease held) told of a pause holds at the Pending
    deadline instead of scaling the pool, says so, pages nobody, and scales once resumed."""
    from contract.budget import BudgetPause, PauseNotice
    from contract.kube import ReplacementReport
    from contract.names import ACT_REQUEST_CAPACITY, SIG_CLUSTER_PAUSED
    from tests.workflows.fakes import past_deadline, start

    client = time_skipping_env.client
    world = FakeWorld(
        replacement_reports=[
            ReplacementReport(status="pending"),
            ReplacementReport(status="running"),
        ]
    )
    async with new_worker(client, world) as worker:
        handle = await start(client, worker, world)
        await wait_phase(handle, Phase.AWAITING_REPLACEMENT)
        # What the budget workflow sends its lease holders on `sickbay pause`.
        await handle.signal(
            SIG_CLUSTER_PAUSED,
            PauseNotice(pause=BudgetPause(reason="capacity freeze", actor="alice")),
        )
        await past_deadline(time_skipping_env, handle, world, Phase.AWAITING_REPLACEMENT)
        status = await wait_phase(handle, Phase.SCALING)
        give_up = asyncio.get_running_loop().time() + 60
        while status.paused is None and asyncio.get_running_loop().time() < give_up:
            await asyncio.sleep(0.02)
            status = await wait_phase(handle, Phase.SCALING)
        assert status.paused is not None and "capacity freeze" in status.paused
        assert "sickbay resume" in status.awaiting
        timeline = await handle.query(QRY_TIMELINE, result_type=list[TimelineEntry])
        held = next(e for e in timeline if e.action == "held: cluster paused")
        assert held.actor == "alice" and "scale-up" in held.outcome
        assert ACT_REQUEST_CAPACITY not in world.names()
        assert ACT_NOTIFY not in world.names()
        await handle.signal(SIG_CLUSTER_PAUSED, PauseNotice(pause=None))  # sickbay resume
        await wait_phase(handle, Phase.HOLDING)
        assert len(world.args(ACT_REQUEST_CAPACITY)) == 1
        await handle.signal(SIG_REPAIRED, RepairedRequest(actor="ops"))
        result = await handle.result()
    assert result.outcome == "released"
    assert any(e.action == "cluster resumed" for e in result.timeline)
