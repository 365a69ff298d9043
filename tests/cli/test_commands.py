"""CLI commands against a real Temporal dev server (dev_env) and a worker with activity fakes.

Cases:
- `launch --node --uuid` starts the device's remediation; the same launch again signals it
  (started false, same workflow id): the dev server reports signal-with-start's `started`;
- `status` lists the open incident with its phase from the search attributes;
- `timeline node/uuid` prints the ordered entries (quarantined, ...), also for a closed
  remediation with no worker running (from the result in history);
- `approve` outside the approval phase is refused by the update validator (exit 1);
- `repaired node/uuid` releases the quarantine and the workflow closes `released`;
- `launch --select-node --select-attr --dry-run` starts a maintenance drain with that selector;
- `launch` with neither device nor selector, or with both, exits 2 before connecting;
- `runbooks validate` passes the shipped runbooks and reports file:line errors (exit 1);
- `runbooks explain` names the runbook and the steps for a Deployment.
"""

from __future__ import annotations

import asyncio
import json
import uuid
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from temporalio import activity
from temporalio.testing import WorkflowEnvironment
from temporalio.worker import Worker

from contract.maintenance import MaintenanceResult, SelectDevicesInput, SelectedDevices
from contract.names import ACT_SELECT_DEVICES, device_workflow_id
from contract.remediation import Phase, RemediationResult
from tests.workflows.fakes import FakeWorld, new_worker
from worker.cli import main as cli_main
from workflows.maintenance import MaintenanceWorkflow

pytestmark = pytest.mark.devserver

# The unnamed cluster, named: these runs have no cluster record to read (worker/cli_cluster.py).
UNNAMED = ("--cluster", "")
ZERO_UUID = "GPU-00000000-0000-0000-0000-000000000000"


async def _cli(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = await asyncio.to_thread(cli_main, list(argv))
    out = capsys.readouterr()
    return code, out.out, out.err


async def test_launch_status_timeline_repaired(
    dev_env: WorkflowEnvironment, capsys: pytest.CaptureFixture[str]
) -> None:
    client = dev_env.client
    address = client.service_client.config.target_host
    world = FakeWorld()
    queue = f"cli-{uuid.uuid4().hex[:8]}"
    conn = ["--address", address, "--task-queue", queue, *UNNAMED]
    device = f"{world.node}/{world.gpu_uuid}"
    async with new_worker(client, world, task_queue=queue):
        code, out, err = await _cli(
            capsys,
            "launch",
            *conn,
            "--node",
            world.node,
            "--uuid",
            world.gpu_uuid,
            "--reason",
            "Xid 79 seen by hand",
            "--json",
        )
        assert code == 0, err
        first = json.loads(out)
        assert first["started"] is True
        assert first["workflow_id"] == device_workflow_id(world.node, world.gpu_uuid)
        code, out, _ = await _cli(
            capsys, "launch", *conn, "--node", world.node, "--uuid", world.gpu_uuid, "--json"
        )
        assert code == 0 and json.loads(out)["started"] is False

        rows: list[dict[str, Any]] = []
        for _ in range(100):  # visibility is eventually consistent
            code, out, _ = await _cli(capsys, "status", *conn, "--json")
            rows = [r for r in json.loads(out) if r["workflow_id"] == first["workflow_id"]]
            if rows and rows[0]["phase"] == Phase.HOLDING.value:
                break
            await asyncio.sleep(0.1)
        assert rows and rows[0]["phase"] == "holding", rows
        assert rows[0]["workload_class"] == "inference" and rows[0]["node"] == world.node

        code, out, _ = await _cli(capsys, "timeline", *conn, device)
        assert code == 0
        assert "quarantined (NoExecute)" in out and "runbook chosen -> inference" in out

        code, _, err = await _cli(capsys, "approve", *conn, device, "--actor", "alice")
        assert code == 1 and "not awaiting-approval" in err

        code, out, _ = await _cli(capsys, "repaired", *conn, device, "--actor", "alice")
        assert code == 0
        handle = client.get_workflow_handle(first["workflow_id"], result_type=RemediationResult)
        result = await handle.result()
    assert result.outcome == "released"
    repaired = next(e for e in result.timeline if e.action == "marked repaired")
    assert repaired.actor == "alice"
    # Closed and no worker running: the timeline comes from the result in history.
    code, out, _ = await _cli(capsys, "timeline", *conn, device)
    assert code == 0 and "phase closed" in out and "closed -> released" in out


async def test_launch_argument_errors(capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = await _cli(capsys, "launch")
    assert code == 2 and "give a device" in err
    code, _, err = await _cli(
        capsys, "launch", "--node", "n", "--uuid", ZERO_UUID, "--select-node", "n"
    )
    assert code == 2
    code, _, err = await _cli(capsys, "launch", "--node", "n")
    assert code == 2 and "node + gpu_uuid" in err


async def test_runbooks_validate_and_explain(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, _ = await _cli(capsys, "runbooks", "validate")
    assert code == 0 and "ok  inference" in out
    bad = tmp_path / "bad.yaml"
    bad.write_text(
        "apiVersion: sickbay/v1\nkind: Runbook\nmetadata: {name: bad}\nspec:\n  eviction:\n    force: maybe\n"
    )
    code, _, err = await _cli(capsys, "runbooks", "validate", str(bad))
    assert code == 1 and f"{bad}:6: spec.eviction.force:" in err
    code, out, _ = await _cli(
        capsys,
        "runbooks",
        "explain",
        "--namespace",
        "serving",
        "--owner-kind",
        "Deployment",
        "--xid",
        "79",
        "--json",
    )
    explained = json.loads(out)
    assert explained["runbook"] == "inference" and explained["class"] == "unhealthy"
    assert any("DeviceTaintRule NoExecute" in s for s in explained["steps"])
    assert any("scale up" in s and "max 8" in s for s in explained["steps"])


async def test_launch_maintenance_selector(
    dev_env: WorkflowEnvironment, capsys: pytest.CaptureFixture[str]
) -> None:
    seen: list[SelectDevicesInput] = []

    @activity.defn(name=ACT_SELECT_DEVICES)
    async def select_devices(req: SelectDevicesInput) -> SelectedDevices:
        seen.append(req)
        return SelectedDevices()

    client = dev_env.client
    queue = f"cli-{uuid.uuid4().hex[:8]}"
    world = FakeWorld()
    conn = ["--address", client.service_client.config.target_host, "--task-queue", queue, *UNNAMED]
    async with Worker(
        client,
        task_queue=queue,
        workflows=[MaintenanceWorkflow],
        activities=[select_devices, *world.activities()],
    ):
        code, out, err = await _cli(
            capsys,
            "launch",
            *conn,
            "--select-node",
            "gpu-node-7",
            "--select-attr",
            "driverVersion=550.54",
            "--dry-run",
            "--json",
        )
        assert code == 0, err
        wf_id = json.loads(out)["workflow_id"]
        result = await client.get_workflow_handle(wf_id, result_type=MaintenanceResult).result()
    assert wf_id.startswith("sickbay-maintenance-") and result.dry_run and result.devices == []
    assert seen[0].selector.nodes == ["gpu-node-7"]
    assert seen[0].selector.device_attributes == {"driverVersion": "550.54"}


async def test_extend_deadline(
    dev_env: WorkflowEnvironment, capsys: pytest.CaptureFixture[str]
) -> None:
    """`extend-deadline node/uuid --by 30m --reason ...` moves the running wait's deadline;
    a bad duration or no target exits 2 before connecting; outside the wait it is refused
    (exit 1) naming the phase."""
    from contract.kube import ReplacementReport
    from contract.names import QRY_STATUS
    from contract.remediation import RemediationStatus
    from tests.workflows.fakes import start, wait_phase

    client = dev_env.client
    address = client.service_client.config.target_host
    world = FakeWorld(replacement_reports=[ReplacementReport(status="pending")])
    queue = f"cli-{uuid.uuid4().hex[:8]}"
    conn = ["--address", address, "--task-queue", queue, *UNNAMED]
    device = f"{world.node}/{world.gpu_uuid}"
    code, _, err = await _cli(capsys, "extend-deadline", *conn, device, "--reason", "r")
    assert code == 2 and "exactly one of --by" in err
    async with new_worker(client, world, task_queue=queue) as worker:
        handle = await start(client, worker, world)
        waiting = await wait_phase(handle, Phase.AWAITING_REPLACEMENT)
        assert waiting.deadline is not None
        code, out, err = await _cli(
            capsys,
            "extend-deadline",
            *conn,
            device,
            "--by",
            "30m",
            "--reason",
            "node at 16:00",
            "--actor",
            "erin",
        )
        assert code == 0, err
        assert "awaiting-replacement" in out
        status = await handle.query(QRY_STATUS, result_type=RemediationStatus)
        assert status.deadline is not None
        assert status.deadline - waiting.deadline == timedelta(minutes=30)
        code, _, err = await _cli(
            capsys,
            "extend-deadline",
            *conn,
            device,
            "--until",
            "2000-01-01T00:00:00",
            "--reason",
            "x",
        )
        assert code == 1 and "not after the current one" in err
        await handle.terminate("test over")
    code, _, err = await _cli(
        capsys, "extend-deadline", *conn, device, "--by", "30m", "--reason", "late"
    )
    assert code == 1 and "nothing sent" in err
