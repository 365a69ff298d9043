"""The CLI reports what really happened (real Temporal dev server, worker with activity fakes).

Cases:
- a launch refused for bad input (typo'd field) under the device's id: `abort` says nothing
  was sent and why (closed, failed: invalid input naming the field), `timeline` says the same
  (exit 1, no traceback), `launch` then starts a fresh run, and `abort` of that one is
  confirmed from the workflow's own timeline;
- a run whose workflow task keeps failing (a run started by an older build): `abort`,
  `repaired` and `launch` refuse to claim success, `timeline` explains, none prints a traceback;
- `timeline` of a workflow that is not a remediation names its type (exit 1);
- `status`: escalated-then-holding incidents show phase holding AND the escalation reason;
  columns stay aligned with device keys longer than 50 characters; `--all` shows closed runs
  with their outcome;
- `launch` prints the UI link of SICKBAY_TEMPORAL_UI_URL, and no localhost:8233 guess when the
  UI's address is unknown.
"""

from __future__ import annotations

import asyncio
import json
import uuid
from pathlib import Path
from typing import Any

import pytest
from temporalio import workflow
from temporalio.client import WorkflowExecutionStatus
from temporalio.testing import WorkflowEnvironment
from temporalio.worker import Worker

from contract.capacity import CapacityResult
from contract.kube import ReplacementReport
from contract.names import WF_REMEDIATE, device_workflow_id
from contract.runbook import Runbook
from tests.workflows.fakes import FakeWorld, new_worker, shipped_runbooks, without_repair
from worker.cli import main as cli_main

pytestmark = pytest.mark.devserver

# The unnamed cluster, named: these runs have no cluster record to read (worker/cli_cluster.py).
UNNAMED = ("--cluster", "")

README = Path(__file__).resolve().parents[2] / "README.md"
DEADLINE_S = 60.0  # generous: every wait below ends in well under a second when healthy


def _short_pending_deadline(runbooks: list[Runbook]) -> list[Runbook]:
    """Each runbook with a 1 s Pending deadline and capacity deadline (validated as YAML would
    be: the bounds need their `unsafe` acknowledgement)."""
    out = []
    for rb in runbooks:
        data = rb.model_dump(mode="json", by_alias=True, exclude_none=True)
        replacement = data["spec"].setdefault("replacement", {})
        replacement.update(pendingDeadline="1s", unsafe=["pendingDeadline"])
        out.append(Runbook.model_validate(data))
    return out


async def _cli(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = await asyncio.to_thread(cli_main, list(argv))
    out = capsys.readouterr()
    assert "Traceback" not in out.err + out.out, out.err
    return code, out.out, out.err


async def _eventually(check: Any, what: str) -> Any:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + DEADLINE_S
    while True:
        value = await check()
        if value:
            return value
        if loop.time() > deadline:
            raise AssertionError(f"never: {what}")
        await asyncio.sleep(0.1)


@workflow.defn(name=WF_REMEDIATE, sandboxed=False)
class _WedgedRemediation:
    """Stands in for a run whose workflow task fails on every attempt."""

    @workflow.run
    async def run(self, raw: Any = None) -> None:
        raise RuntimeError("cannot decode this run's input (older build)")


@pytest.fixture
def no_stack(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SICKBAY_STATE_DIR", str(tmp_path / "no-stack"))
    monkeypatch.delenv("SICKBAY_TEMPORAL_UI_URL", raising=False)


async def test_bad_input_run_then_fresh_launch(
    dev_env: WorkflowEnvironment, capsys: pytest.CaptureFixture[str], no_stack: None
) -> None:
    client = dev_env.client
    world = FakeWorld()
    queue = f"cli-{uuid.uuid4().hex[:8]}"
    conn = ["--address", client.service_client.config.target_host, "--task-queue", queue, *UNNAMED]
    device = f"{world.node}/{world.gpu_uuid}"
    wf_id = device_workflow_id(world.node, world.gpu_uuid)
    async with new_worker(client, world, task_queue=queue):
        bad = await client.start_workflow(
            WF_REMEDIATE,
            {"device": {"node": world.node, "gpu_uuid": world.gpu_uuid}, "dryrun": True},
            id=wf_id,
            task_queue=queue,
        )

        async def failed() -> bool:
            return (await bad.describe()).status == WorkflowExecutionStatus.FAILED

        await _eventually(failed, "the bad-input run failed")
        code, _, err = await _cli(capsys, "abort", *conn, device, "--reason", "x")
        assert code == 1 and "nothing sent" in err
        assert "closed (failed: invalid input" in err and "dryrun: unknown field" in err
        code, _, err = await _cli(capsys, "timeline", *conn, device)
        assert code == 1 and "dryrun: unknown field" in err

        code, out, err = await _cli(
            capsys, "launch", *conn, "--node", world.node, "--uuid", world.gpu_uuid, "--json"
        )
        assert code == 0, err
        launched = json.loads(out)
        assert launched["started"] is True and launched["run_id"] != bad.result_run_id
        code, out, err = await _cli(
            capsys, "abort", *conn, device, "--reason", "done", "--actor", "t"
        )
        assert code == 0 and "taken in by the workflow" in out, err


async def test_wedged_run_is_reported_not_signalled(
    dev_env: WorkflowEnvironment, capsys: pytest.CaptureFixture[str], no_stack: None
) -> None:
    client = dev_env.client
    world = FakeWorld()
    queue = f"cli-{uuid.uuid4().hex[:8]}"
    conn = ["--address", client.service_client.config.target_host, "--task-queue", queue, *UNNAMED]
    device = f"{world.node}/{world.gpu_uuid}"
    async with Worker(client, task_queue=queue, workflows=[_WedgedRemediation]):
        handle = await client.start_workflow(
            WF_REMEDIATE,
            {"device": "?"},
            id=device_workflow_id(world.node, world.gpu_uuid),
            task_queue=queue,
        )

        async def retrying() -> bool:
            raw = (await handle.describe()).raw_description
            return raw.HasField("pending_workflow_task") and raw.pending_workflow_task.attempt > 1

        await _eventually(retrying, "the workflow task failed and is retried")
        for argv in (
            ["abort", *conn, device, "--reason", "x"],
            ["repaired", *conn, device],
            ["timeline", *conn, device],
            ["launch", *conn, "--node", world.node, "--uuid", world.gpu_uuid],
        ):
            code, out, err = await _cli(capsys, *argv)
            assert code == 1, (argv, out)
            assert "workflow task has failed" in err, (argv, err)
            assert "sent to" not in out and "taken in" not in out
        await handle.terminate("test done")


async def test_timeline_of_another_workflow_type(
    dev_env: WorkflowEnvironment, capsys: pytest.CaptureFixture[str]
) -> None:
    client = dev_env.client
    conn = ["--address", client.service_client.config.target_host, *UNNAMED]
    handle = await client.start_workflow(
        "sickbay-budget", id=f"sickbay-not-a-remediation-{uuid.uuid4().hex[:6]}", task_queue="none"
    )
    try:
        code, _, err = await _cli(capsys, "timeline", *conn, handle.id)
        assert code == 1 and "is a sickbay-budget workflow, not a remediation" in err
    finally:
        await handle.terminate("test done")


async def test_status_shows_escalation_and_aligns(
    dev_env: WorkflowEnvironment,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    client = dev_env.client
    # Pending past the deadline, pool at max: escalated (no-capacity), then holding.
    # The Pending deadline is a durable timer and this dev server's clock is real: a 1 s
    # deadline (acknowledged as unsafe) instead of the shipped one.
    world = FakeWorld(
        replacement_reports=[ReplacementReport(status="pending", unschedulable_message="no GPU")],
        capacity=CapacityResult(status="at-max", current_size=2, target_size=2),
        runbooks=_short_pending_deadline(without_repair(shipped_runbooks())),
    )
    queue = f"cli-{uuid.uuid4().hex[:8]}"
    conn = ["--address", client.service_client.config.target_host, "--task-queue", queue, *UNNAMED]
    device = f"{world.node}/{world.gpu_uuid}"
    assert len(device) > 50
    monkeypatch.setenv("SICKBAY_TEMPORAL_UI_URL", "http://ui.example:18233/")
    async with new_worker(client, world, task_queue=queue):
        code, out, err = await _cli(
            capsys, "launch", *conn, "--node", world.node, "--uuid", world.gpu_uuid
        )
        assert code == 0, err
        wf_id = device_workflow_id(world.node, world.gpu_uuid)
        assert f"UI: http://ui.example:18233/namespaces/default/workflows/{wf_id}" in out

        async def holding_row() -> str | None:
            _, text, _ = await _cli(capsys, "status", *conn)
            line = next((ln for ln in text.splitlines() if wf_id in ln), None)
            return text if line and line.startswith("holding ") else None

        text = await _eventually(holding_row, "status shows the incident holding")
        header = text.splitlines()[0]
        row = next(ln for ln in text.splitlines() if wf_id in ln)
        for column in ("PHASE", "OUTCOME", "ESCALATED", "SINCE (UTC)", "DEVICE", "WORKFLOW"):
            assert column in header
        assert row.index(wf_id) == header.index("WORKFLOW")
        assert row.index(device) == header.index("DEVICE")
        assert row[header.index("ESCALATED") :].startswith("no-capacity")
        code, _, _ = await _cli(capsys, "abort", *conn, device, "--reason", "done")
        assert code == 0

    async def closed_row() -> dict[str, Any] | None:
        _, text, _ = await _cli(capsys, "status", *conn, "--all", "--json")
        rows = [r for r in json.loads(text) if r["workflow_id"] == wf_id]
        return rows[0] if rows and rows[0]["outcome"] == "aborted" else None

    row_json = await _eventually(closed_row, "status --all shows the aborted outcome")
    assert row_json["escalation"] == "no-capacity" and row_json["phase"] == "closed"

    # The README's list-view queries for escalated incidents find it.
    readme = README.read_text()
    assert "`SickbayEscalation IS NOT NULL`" in readme
    for query in (
        f"WorkflowType = '{WF_REMEDIATE}' AND SickbayEscalation IS NOT NULL",
        f"WorkflowType = '{WF_REMEDIATE}' AND SickbayOutcome = 'aborted'",
    ):

        async def found(q: str = query) -> bool:
            return any([wf.id == wf_id async for wf in client.list_workflows(q)])

        await _eventually(found, f"the list view query {query!r} finds the incident")


async def test_launch_without_known_ui_prints_no_guess(
    dev_env: WorkflowEnvironment, capsys: pytest.CaptureFixture[str], no_stack: None
) -> None:
    client = dev_env.client
    world = FakeWorld()
    queue = f"cli-{uuid.uuid4().hex[:8]}"
    conn = ["--address", client.service_client.config.target_host, "--task-queue", queue, *UNNAMED]
    async with new_worker(client, world, task_queue=queue):
        code, out, err = await _cli(
            capsys, "launch", *conn, "--node", world.node, "--uuid", world.gpu_uuid, "--dry-run"
        )
        assert code == 0, err
        assert "localhost:8233" not in out and "set SICKBAY_TEMPORAL_UI_URL" in out
        handle = client.get_workflow_handle(device_workflow_id(world.node, world.gpu_uuid))
        await handle.result()


async def test_launch_sets_static_summary_details_and_memo(
    dev_env: WorkflowEnvironment, capsys: pytest.CaptureFixture[str], no_stack: None
) -> None:
    client = dev_env.client
    world = FakeWorld()
    queue = f"cli-{uuid.uuid4().hex[:8]}"
    conn = ["--address", client.service_client.config.target_host, "--task-queue", queue, *UNNAMED]
    argv = ["--node", world.node, "--uuid", world.gpu_uuid, "--runbook", "inference"]
    async with new_worker(client, world, task_queue=queue):
        code, _, err = await _cli(
            capsys, "launch", *conn, *argv, "--reason", "Xid 79 by hand", "--requested-by", "bob"
        )
        assert code == 0, err
        handle = client.get_workflow_handle(device_workflow_id(world.node, world.gpu_uuid))
        desc = await handle.describe()
        summary, details, memo = (
            await desc.static_summary(),
            await desc.static_details(),
            await desc.memo(),
        )
        await handle.signal("abort", {"reason": "test done", "actor": "t"})
        await handle.result()
    device = f"{world.node}/{world.gpu_uuid}"
    assert summary == f"GPU {device}: manual - Xid 79 by hand"
    assert details is not None
    assert f"`{device}`" in details and "requested by bob" in details
    assert "runbook: inference (pinned)" in details and "dry run: no" in details
    assert (
        memo["device"] == device and memo["trigger"] == "manual" and memo["runbook"] == "inference"
    )


def test_ui_url_comes_from_the_running_stack(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`sickbay-dev up` moved the UI off 8233: the CLI links to where it really is, for the stack
    on this Temporal address only (localhost and 127.0.0.1 are the same address)."""
    import os

    from worker.commands import ui_url
    from worker.settings import Settings

    monkeypatch.setenv("SICKBAY_STATE_DIR", str(tmp_path))
    monkeypatch.delenv("SICKBAY_TEMPORAL_UI_URL", raising=False)
    stack = {"pgid": os.getpgrp(), "ui_url": "http://localhost:28233", "temporal_address": ""}
    stack["temporal_address"] = "127.0.0.1:7233"
    (tmp_path / "stack.json").write_text(json.dumps(stack))
    assert ui_url(Settings(temporal_address="localhost:7233")) == "http://localhost:28233"
    assert ui_url(Settings(temporal_address="127.0.0.1:17233")) is None  # another server
    monkeypatch.setenv("SICKBAY_TEMPORAL_UI_URL", "https://temporal.example/")
    assert ui_url(Settings(temporal_address="localhost:7233")) == "https://temporal.example"
