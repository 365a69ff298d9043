"""A mistyped launch (the Web UI's *Start Workflow* JSON) never wedges a device.

Cases:
- input with `device` missing, `"dry_run": "yes"` / `"true"` (a string, not a JSON boolean),
  a typo'd field (`"dryrun"`), a JSON array, or no input at all: the run fails at once (no
  activity called) with an `InvalidInput` error naming the field and the problem, and the
  list view's `SickbayOutcome` says `invalid-input`;
- the next trigger for that device (signal-with-start, as the webhook, sweep and CLI do)
  starts a fresh run under the same id, which remediates;
- the documented input (README) still starts a remediation.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from typing import Any

import pytest
from temporalio.client import Client, WorkflowExecutionStatus, WorkflowFailureError, WorkflowHandle
from temporalio.exceptions import ApplicationError
from temporalio.testing import WorkflowEnvironment

from activities.launch import signal_with_start
from contract.errors import ERR_INVALID_INPUT
from contract.kube import DeviceRef
from contract.names import SA_OUTCOME, SIG_ABORT, WF_REMEDIATE, device_workflow_id
from contract.remediation import AbortRequest, Phase, RemediationInput
from tests.workflows.fakes import FakeWorld, new_worker, wait_phase, xid_alert

# Generous: a wedged run (the bug) would never close; a healthy one closes in milliseconds.
CLOSE_DEADLINE_S = 60.0


async def wait_closed(handle: WorkflowHandle[Any, Any]) -> WorkflowExecutionStatus:
    """Poll describe() until the run is no longer Running (or the deadline passes)."""
    deadline = time.monotonic() + CLOSE_DEADLINE_S
    while True:
        desc = await handle.describe()
        if desc.status != WorkflowExecutionStatus.RUNNING:
            assert desc.status is not None
            return desc.status
        if time.monotonic() > deadline:
            raise AssertionError(
                f"{handle.id} still Running after {CLOSE_DEADLINE_S} s: the input wedged it"
            )
        await asyncio.sleep(0.05)


def device_input(world: FakeWorld, **extra: Any) -> dict[str, Any]:
    return {"device": {"node": world.node, "gpu_uuid": world.gpu_uuid}, **extra}


BAD_INPUTS: dict[str, tuple[Any, list[str]]] = {
    "device-missing": ({"trigger": "ui", "reason": "Xid 79"}, ["device", "Field required"]),
    "dry-run-yes": ("DEVICE+dry_run=yes", ["dry_run", "valid boolean", "'yes'"]),
    "dry-run-true-string": ("DEVICE+dry_run=true", ["dry_run", "valid boolean", "'true'"]),
    "typo-dryrun": ("DEVICE+dryrun", ["dryrun: unknown field", "dry_run"]),
    "array": ([], ["input: must be a JSON object"]),
    "no-input": (None, ["input: must be a JSON object, got None"]),
}


def _raw(world: FakeWorld, spec: Any) -> Any:
    if spec == "DEVICE+dry_run=yes":
        return device_input(world, dry_run="yes")
    if spec == "DEVICE+dry_run=true":
        return device_input(world, dry_run="true")
    if spec == "DEVICE+dryrun":
        return device_input(world, dryrun=True)
    return spec


async def _start_raw(client: Client, queue: str, world: FakeWorld, raw: Any) -> WorkflowHandle:
    wf_id = device_workflow_id(world.node, world.gpu_uuid)
    args = [] if raw is None else [raw]
    return await client.start_workflow(WF_REMEDIATE, args=args, id=wf_id, task_queue=queue)


@pytest.mark.parametrize("case", sorted(BAD_INPUTS), ids=str)
async def test_bad_input_fails_the_run_at_once(
    time_skipping_env: WorkflowEnvironment, case: str
) -> None:
    client = time_skipping_env.client
    world = FakeWorld()
    spec, expected = BAD_INPUTS[case]
    async with new_worker(client, world) as worker:
        handle = await _start_raw(client, worker.task_queue, world, _raw(world, spec))
        assert await wait_closed(handle) == WorkflowExecutionStatus.FAILED
        with pytest.raises(WorkflowFailureError) as failed:
            await handle.result()
        desc = await handle.describe()
    cause = failed.value.cause
    assert isinstance(cause, ApplicationError)
    assert cause.type == ERR_INVALID_INPUT and cause.non_retryable
    assert cause.message.startswith(f"invalid input for {WF_REMEDIATE}: ")
    for text in expected:
        assert text in cause.message, cause.message
    assert world.names() == []  # nothing was looked up, tainted or paged
    assert desc.search_attributes.get(SA_OUTCOME) == ["invalid-input"]


async def test_next_trigger_after_bad_input_starts_a_fresh_run(
    time_skipping_env: WorkflowEnvironment,
) -> None:
    client = time_skipping_env.client
    world = FakeWorld()
    queue = f"tq-{uuid.uuid4()}"
    async with new_worker(client, world, task_queue=queue):
        bad = await _start_raw(client, queue, world, device_input(world, dryrun=True))
        assert await wait_closed(bad) == WorkflowExecutionStatus.FAILED
        launched = await signal_with_start(
            client,
            RemediationInput(device=DeviceRef(node=world.node, gpu_uuid=world.gpu_uuid)),
            task_queue=queue,
            evidence=xid_alert(79, "fp-after-bad-input"),
        )
        assert launched.workflow_id == bad.id and launched.run_id != bad.result_run_id
        fresh = client.get_workflow_handle(bad.id, run_id=launched.run_id)
        status = await wait_phase(fresh, Phase.HOLDING)
        await fresh.signal(SIG_ABORT, AbortRequest(reason="test done", actor="t"))
        await fresh.result()
    assert status.alerts == 1 and status.phase is Phase.HOLDING


async def test_documented_ui_input_still_starts(time_skipping_env: WorkflowEnvironment) -> None:
    """The README's input shape, typed as JSON: a dry run that previews and changes nothing."""
    client = time_skipping_env.client
    world = FakeWorld()
    async with new_worker(client, world) as worker:
        raw = device_input(
            world, trigger="ui", requested_by="alice", reason="Xid 79 on GPU 3", dry_run=True
        )
        handle = await _start_raw(client, worker.task_queue, world, raw)
        assert await wait_closed(handle) == WorkflowExecutionStatus.COMPLETED
        result = await handle.result()
    assert result["outcome"] == "dry-run"


async def test_bad_maintenance_input_fails_the_run_at_once(
    time_skipping_env: WorkflowEnvironment,
) -> None:
    """The drain's Web UI input too: `"dry_run": "yes"` and a missing selector name the fields."""
    from temporalio.worker import Worker

    from contract.names import WF_MAINTENANCE
    from workflows.maintenance import MaintenanceWorkflow

    client = time_skipping_env.client
    queue = f"tq-{uuid.uuid4()}"
    async with Worker(client, task_queue=queue, workflows=[MaintenanceWorkflow]):
        handle = await client.start_workflow(
            WF_MAINTENANCE,
            {"runbook": "maintenance", "dry_run": "yes"},
            id=f"maintenance-{uuid.uuid4().hex[:8]}",
            task_queue=queue,
        )
        assert await wait_closed(handle) == WorkflowExecutionStatus.FAILED
        with pytest.raises(WorkflowFailureError) as failed:
            await handle.result()
    cause = failed.value.cause
    assert isinstance(cause, ApplicationError) and cause.type == ERR_INVALID_INPUT
    assert "selector: Field required" in cause.message
    assert "dry_run: Input should be a valid boolean, got 'yes'" in cause.message
