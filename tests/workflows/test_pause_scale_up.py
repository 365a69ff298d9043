"""An open remediation told of a pause holds before its scale-up. Its own module (its own
time-skipping server): run after the real-budget tests of test_pause.py on one server it has
hung (not yet understood; see the branch's report).
"""

from __future__ import annotations

import asyncio
from typing import Any

from temporalio.api.enums.v1 import EventType
from temporalio.client import WorkflowHandle
from temporalio.service import RPCError
from temporalio.testing import WorkflowEnvironment

from contract.names import ACT_NOTIFY, QRY_TIMELINE, SIG_REPAIRED
from contract.remediation import Phase, RepairedRequest, TimelineEntry
from tests.workflows.fakes import FakeWorld, new_worker, wait_phase


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
        try:
            await handle.signal(SIG_CLUSTER_PAUSED, PauseNotice(pause=None))  # sickbay resume
        except RPCError as err:  # seen once under a full CI run: the run had closed. How?
            raise AssertionError(f"resume refused ({err}): {await _how_it_ended(handle)}") from err
        await wait_phase(handle, Phase.HOLDING)
        assert len(world.args(ACT_REQUEST_CAPACITY)) == 1
        await handle.signal(SIG_REPAIRED, RepairedRequest(actor="ops"))
        result = await handle.result()
    assert result.outcome == "released"
    assert any(e.action == "cluster resumed" for e in result.timeline)


async def _how_it_ended(handle: WorkflowHandle[Any, Any]) -> str:
    """The run's status and its last history events, for a failure message."""
    described = await handle.describe()
    events = [e async for e in handle.fetch_history_events()]
    tail = ", ".join(f"{e.event_id} {EventType.Name(e.event_type)}" for e in events[-12:])
    return f"status {described.status}, close time {described.close_time}; last events: {tail}"
