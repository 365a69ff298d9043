"""`sickbay_cluster_paused{cluster}` from the budget workflow's state, and the pause/resume
records handed on for Kubernetes Events (the latest at start, every new one afterwards). Its
own module: the Prometheus runtime it creates gets its own time-skipping server.
"""

from __future__ import annotations

import asyncio
import uuid

from temporalio.testing import WorkflowEnvironment

from activities.budget_client import BudgetActivities
from contract.budget import PauseAnswer, PauseRequest, ResumeRequest
from contract.names import UPD_BUDGET_PAUSE, UPD_BUDGET_RESUME
from tests.workflows.test_pause import _budget_worker


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
