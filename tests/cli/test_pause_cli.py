"""`sickbay pause` / `sickbay resume` against a real Temporal dev server and the budget
workflow's own worker: a pause is shown at the top of `sickbay status` (since when, by whom,
why), recorded in the budget's pause log, and lifted by `resume`; `--all-clusters` reaches every
running budget workflow of the namespace; a pause without a reason is refused before connecting.
"""

from __future__ import annotations

import asyncio
import json
import uuid

import pytest
from temporalio.testing import WorkflowEnvironment
from temporalio.worker import Worker

from contract.budget import BudgetState
from contract.names import QRY_BUDGET_STATE, budget_task_queue, budget_workflow_id
from tests.cli.test_commands import UNNAMED, _cli
from workflows.budget import BudgetWorkflow

pytestmark = pytest.mark.devserver


def _budget_worker(client, queue: str) -> Worker:
    return Worker(client, task_queue=budget_task_queue(queue), workflows=[BudgetWorkflow])


async def test_pause_status_resume(
    dev_env: WorkflowEnvironment, capsys: pytest.CaptureFixture[str]
) -> None:
    client = dev_env.client
    address = client.service_client.config.target_host
    queue = f"cli-{uuid.uuid4().hex[:8]}"
    conn = ["--address", address, "--task-queue", queue, *UNNAMED]
    budget_id = budget_workflow_id(queue)
    async with _budget_worker(client, queue):
        code, out, err = await _cli(capsys, "status", *conn)
        assert code == 0, err
        assert "PAUSED" not in out
        code, out, err = await _cli(
            capsys, "pause", *conn, "--reason", "driver rollout", "--actor", "alice"
        )
        assert code == 0, err
        assert "paused by alice" in out and "driver rollout" in out
        code, out, err = await _cli(capsys, "status", *conn)
        assert code == 0, err
        first = out.splitlines()[0]
        assert (
            first.startswith("PAUSED since ") and "by alice (unverified) (driver rollout)" in first
        )
        code, out, err = await _cli(capsys, "status", *conn, "--json")
        assert code == 0 and isinstance(json.loads(out), list)  # stdout: the rows only
        assert "PAUSED since " in err and "by alice (unverified) (driver rollout)" in err
        code, out, err = await _cli(capsys, "resume", *conn, "--actor", "bob")
        assert code == 0, err
        assert "resumed by bob" in out
        code, out, err = await _cli(capsys, "status", *conn)
        assert code == 0 and "PAUSED" not in out
        state = await client.get_workflow_handle(budget_id).query(
            QRY_BUDGET_STATE, result_type=BudgetState
        )
        await client.get_workflow_handle(budget_id).terminate("test done")
    assert state.pause is None
    assert [(e.action, e.actor, e.reason) for e in state.pause_log] == [
        ("pause", "alice", "driver rollout"),
        ("resume", "bob", ""),
    ]


async def test_pause_all_clusters(
    dev_env: WorkflowEnvironment, capsys: pytest.CaptureFixture[str]
) -> None:
    client = dev_env.client
    address = client.service_client.config.target_host
    queue = f"cli-{uuid.uuid4().hex[:8]}"
    conn = ["--address", address, "--task-queue", queue]
    budget_id = budget_workflow_id(queue)
    async with _budget_worker(client, queue):
        code, _, err = await _cli(capsys, "resume", *conn, *UNNAMED)  # starts the budget
        assert code == 0, err
        out = ""
        for _ in range(100):  # visibility is eventually consistent
            code, out, err = await _cli(
                capsys, "pause", *conn, "--all-clusters", "--reason", "fleet freeze"
            )
            if budget_id in out:
                break
            await asyncio.sleep(0.1)
        assert code == 0 and f"{budget_id}: paused by" in out, (out, err)
        state = await client.get_workflow_handle(budget_id).query(
            QRY_BUDGET_STATE, result_type=BudgetState
        )
        assert state.pause is not None and state.pause.reason == "fleet freeze"
        code, out, err = await _cli(capsys, "resume", *conn, "--all-clusters")
        assert code == 0 and f"{budget_id}: resumed by" in out, (out, err)
        code, _, err = await _cli(
            capsys, "pause", *conn, "--all-clusters", *UNNAMED, "--reason", "x"
        )
        assert code == 2 and "exclude each other" in err
        await client.get_workflow_handle(budget_id).terminate("test done")


async def test_pause_needs_a_reason(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exited:  # argparse: required option missing
        await _cli(capsys, "pause", *UNNAMED)
    assert exited.value.code == 2 and "--reason" in capsys.readouterr().err
