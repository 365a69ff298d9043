"""The health-sweep Temporal Schedule, installed by `sickbay worker` at start-up.

`ensure_sweep_schedule(client, settings)` creates the health-sweep Schedule, or brings an
existing one in line with the settings; every worker replica does the same harmless thing (and
`sickbay schedule install` does it by hand). The Schedule starts `sickbay-health-sweep` every
`SICKBAY_SWEEP_INTERVAL` (default 5m), skipping a run while the previous one still goes.
"""

from __future__ import annotations

import logging
from datetime import timedelta
from typing import Literal

from temporalio.client import (
    Client,
    Schedule,
    ScheduleActionStartWorkflow,
    ScheduleAlreadyRunningError,
    ScheduleIntervalSpec,
    ScheduleOverlapPolicy,
    SchedulePolicy,
    ScheduleSpec,
    ScheduleUpdate,
    ScheduleUpdateInput,
)

from contract.names import WF_SWEEP, sweep_schedule_id
from contract.sweep import SweepInput
from worker.settings import Settings, SweepSettings

log = logging.getLogger(__name__)


def sweep_schedule(settings: Settings, sweep: SweepSettings | None = None) -> Schedule:
    """The Schedule `settings` describe (`sweep`: instead of `settings.sweep`)."""
    sweep = sweep if sweep is not None else settings.sweep
    inp = SweepInput(
        unknown_timeout=sweep.sweep_unknown_timeout,
        notify_channels=sweep.sweep_notify_channels,
        task_queue=settings.task_queue,
        dry_run=sweep.sweep_dry_run,
        cluster=settings.cluster,
        watcher=settings.watch.watch_enabled,
    )
    return Schedule(
        action=ScheduleActionStartWorkflow(
            WF_SWEEP,
            inp,
            id=sweep_schedule_id(settings.cluster),  # the Schedule appends the scheduled time
            task_queue=settings.task_queue,
            # A sweep waits at most unknown_timeout, plus two listings and the launches; the
            # bound keeps a stuck run from blocking every later one (overlap policy SKIP).
            execution_timeout=sweep.sweep_unknown_timeout + timedelta(minutes=15),
        ),
        spec=ScheduleSpec(intervals=[ScheduleIntervalSpec(every=sweep.sweep_interval)]),
        policy=SchedulePolicy(
            overlap=ScheduleOverlapPolicy.SKIP,
            # After an outage, one catch-up run is enough: a sweep looks at the present.
            catchup_window=max(sweep.sweep_interval, timedelta(minutes=1)),
        ),
    )


async def ensure_sweep_schedule(
    client: Client, settings: Settings, sweep: SweepSettings | None = None
) -> Literal["created", "updated", "disabled"]:
    """Create the sweep Schedule, or update the existing one to these settings. Idempotent."""
    sweep = sweep if sweep is not None else settings.sweep
    if not sweep.sweep_enabled:
        return "disabled"
    schedule = sweep_schedule(settings, sweep)
    schedule_id = sweep_schedule_id(settings.cluster)  # one per cluster
    try:
        await client.create_schedule(schedule_id, schedule)
        log.info("created schedule %s every %s", schedule_id, sweep.sweep_interval)
        return "created"
    except ScheduleAlreadyRunningError:
        pass

    def update(current: ScheduleUpdateInput) -> ScheduleUpdate:
        # Keep the operator's state (paused, note): a worker restart must not un-pause it.
        schedule.state = current.description.schedule.state
        return ScheduleUpdate(schedule=schedule)

    await client.get_schedule_handle(schedule_id).update(update)
    log.info("updated schedule %s: every %s", schedule_id, sweep.sweep_interval)
    return "updated"
