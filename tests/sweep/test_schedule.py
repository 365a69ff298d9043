"""The health-sweep Temporal Schedule on the dev server.

Cases:
- the Schedule's input says whether the health watcher runs (SICKBAY_WATCH_ENABLED)
- first `ensure_sweep_schedule` creates it: interval, workflow type, task queue, overlap SKIP,
  and a SweepInput carrying the configured Unknown timeout and notify channels
- calling it again (another worker replica starting) updates in place: still one schedule,
  new interval applied
- an operator's pause survives the update a restarting worker makes
- disabled in settings: nothing created
- `sickbay schedule install` does the same; `trigger` starts a sweep now; `delete` removes it
"""

from __future__ import annotations

import asyncio
import uuid
from datetime import timedelta

import pytest
from temporalio.client import Client, ScheduleActionStartWorkflow, ScheduleOverlapPolicy
from temporalio.service import RPCError
from temporalio.testing import WorkflowEnvironment

from contract.names import SWEEP_SCHEDULE_ID, WF_SWEEP
from tests.webhook.helpers import count_runs
from worker.schedules import ensure_sweep_schedule
from worker.settings import Settings, SweepSettings

pytestmark = pytest.mark.devserver  # the session's Temporal dev server (dev_env)


async def _delete(client: Client) -> None:
    try:
        await client.get_schedule_handle(SWEEP_SCHEDULE_ID).delete()
    except RPCError:
        pass


async def _count_schedules(client: Client) -> int:
    count = 0
    async for entry in await client.list_schedules():
        if entry.id == SWEEP_SCHEDULE_ID:
            count += 1
    return count


@pytest.fixture
async def clean(dev_env: WorkflowEnvironment):
    await _delete(dev_env.client)
    yield dev_env.client
    await _delete(dev_env.client)


def _settings(env: WorkflowEnvironment) -> Settings:
    return Settings(
        temporal_address=env.client.service_client.config.target_host, task_queue="sweep-sched"
    )


async def test_create_then_update_idempotently(dev_env: WorkflowEnvironment, clean: Client) -> None:
    settings = _settings(dev_env)
    sweep = SweepSettings(
        sweep_interval="3m", sweep_unknown_timeout="90s", sweep_notify_channels="ops, pager"
    )
    assert await ensure_sweep_schedule(clean, settings, sweep) == "created"
    desc = await clean.get_schedule_handle(SWEEP_SCHEDULE_ID).describe()
    assert [i.every for i in desc.schedule.spec.intervals] == [timedelta(minutes=3)]
    action = desc.schedule.action
    assert isinstance(action, ScheduleActionStartWorkflow)
    assert action.workflow == WF_SWEEP and action.task_queue == "sweep-sched"
    assert desc.schedule.policy.overlap == ScheduleOverlapPolicy.SKIP
    args = await clean.data_converter.decode(action.args)  # raw JSON payload of SweepInput
    assert args[0]["unknown_timeout"] == "1m30s"  # format_duration: compound, exact
    assert args[0]["notify_channels"] == ["ops", "pager"]

    faster = SweepSettings(sweep_interval="1m")
    assert await ensure_sweep_schedule(clean, settings, faster) == "updated"
    for _ in range(40):  # the schedule's own workflow applies the update asynchronously
        desc = await clean.get_schedule_handle(SWEEP_SCHEDULE_ID).describe()
        if [i.every for i in desc.schedule.spec.intervals] == [timedelta(minutes=1)]:
            break
        await asyncio.sleep(0.05)
    assert [i.every for i in desc.schedule.spec.intervals] == [timedelta(minutes=1)]
    for _ in range(40):  # list_schedules reads visibility, which lags a little
        if await _count_schedules(clean) == 1:
            break
        await asyncio.sleep(0.05)
    assert await _count_schedules(clean) == 1


async def test_disabled_creates_nothing(dev_env: WorkflowEnvironment, clean: Client) -> None:
    result = await ensure_sweep_schedule(
        clean, _settings(dev_env), SweepSettings(sweep_enabled=False)
    )
    assert result == "disabled"
    with pytest.raises(RPCError):
        await clean.get_schedule_handle(SWEEP_SCHEDULE_ID).describe()


async def test_update_keeps_pause(dev_env: WorkflowEnvironment, clean: Client) -> None:
    settings = _settings(dev_env)
    assert await ensure_sweep_schedule(clean, settings, SweepSettings()) == "created"
    handle = clean.get_schedule_handle(SWEEP_SCHEDULE_ID)
    await handle.pause(note="maintenance window")
    assert await ensure_sweep_schedule(clean, settings, SweepSettings(sweep_interval="7m")) == (
        "updated"
    )
    for _ in range(40):  # the schedule's own workflow applies the update asynchronously
        desc = await handle.describe()
        if [i.every for i in desc.schedule.spec.intervals] == [timedelta(minutes=7)]:
            break
        await asyncio.sleep(0.05)
    assert [i.every for i in desc.schedule.spec.intervals] == [timedelta(minutes=7)]
    assert desc.schedule.state.paused and desc.schedule.state.note == "maintenance window"


def test_interval_floor() -> None:
    with pytest.raises(ValueError, match="at least 10s"):
        SweepSettings(sweep_interval="1s")


async def test_cli_install(
    dev_env: WorkflowEnvironment, clean: Client, monkeypatch: pytest.MonkeyPatch
) -> None:
    from worker.webhook_cli import _schedule

    monkeypatch.setenv("SICKBAY_TEMPORAL_ADDRESS", dev_env.client.service_client.config.target_host)
    monkeypatch.setenv("SICKBAY_SWEEP_INTERVAL", "2m")
    queue = f"sched-cli-{uuid.uuid4().hex[:8]}"
    monkeypatch.setenv("SICKBAY_TASK_QUEUE", queue)
    monkeypatch.setenv("SICKBAY_CLUSTER", "")  # the unnamed cluster (no record to read here)
    assert await _schedule("install") == 0
    desc = await clean.get_schedule_handle(SWEEP_SCHEDULE_ID).describe()
    assert [i.every for i in desc.schedule.spec.intervals] == [timedelta(minutes=2)]
    assert await _schedule("install") == 0  # second run: update, no error
    assert await _schedule("trigger") == 0
    query = f"WorkflowType = '{WF_SWEEP}' AND TaskQueue = '{queue}'"
    assert await count_runs(clean, query, expect=1) == 1  # a sweep started now
    assert await _schedule("delete") == 0
    with pytest.raises(RPCError):
        await clean.get_schedule_handle(SWEEP_SCHEDULE_ID).describe()


def test_schedule_tells_the_sweep_whether_the_watcher_runs(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The sweep counts `missed_by_watch` only when the worker runs the health watcher."""
    from worker.schedules import sweep_schedule
    from worker.settings import Settings

    def watcher_flag() -> bool:
        action = sweep_schedule(Settings(), SweepSettings()).action
        (inp,) = action.args  # type: ignore[attr-defined]
        return bool(inp.watcher)

    monkeypatch.delenv("SICKBAY_WATCH_ENABLED", raising=False)
    assert watcher_flag() is True
    monkeypatch.setenv("SICKBAY_WATCH_ENABLED", "false")
    assert watcher_flag() is False
