"""A remediation's phase lines carry its device, node and phase for `--log-format json`.

Cases:
- a remediation run (time-skipping, fake activities) logs each phase change with its device,
  node and phase, and its workflow id, as JSON lines of worker.logs.JsonFormatter.
"""

from __future__ import annotations

import json
import logging

import pytest
from temporalio.testing import WorkflowEnvironment

from contract.names import SIG_REPAIRED
from contract.remediation import Phase, RepairedRequest
from tests.workflows.fakes import FakeWorld, new_worker, start, wait_phase
from worker.logs import JsonFormatter


async def test_a_remediation_logs_its_phases_as_json(
    time_skipping_env: WorkflowEnvironment, caplog: pytest.LogCaptureFixture
) -> None:
    client = time_skipping_env.client
    world = FakeWorld()
    caplog.set_level(logging.INFO)
    async with new_worker(client, world) as worker:
        handle = await start(client, worker, world)
        await wait_phase(handle, Phase.HOLDING)
        await handle.signal(SIG_REPAIRED, RepairedRequest(actor="alice", note="reseated"))
        await handle.result()
    fmt = JsonFormatter()
    phases = [
        json.loads(fmt.format(r))
        for r in caplog.records
        if getattr(r, "sickbay", None) and r.name.startswith("temporalio.workflow")
    ]
    assert phases, "no phase change was logged"
    assert {p["phase"] for p in phases} >= {Phase.HOLDING.value, Phase.CLOSED.value}
    assert all(
        p["node"] == world.node and p["device"] == f"{world.node}/{world.gpu_uuid}" for p in phases
    )
    assert all(p["workflow_id"] == handle.id for p in phases)
