"""`sickbay webhook` and `sickbay schedule install|trigger|delete`, plus the sweep Schedule.

`ensure_sweep_schedule(client, settings)` creates the health-sweep Schedule, or brings an
existing one in line with the settings; `sickbay worker` calls it at start-up, so every worker
replica does the same harmless thing. The Schedule starts `sickbay-health-sweep` every
`SICKBAY_SWEEP_INTERVAL` (default 5m), skipping a run while the previous one still goes.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
from datetime import timedelta
from typing import Annotated, Literal

from pydantic import Field, field_validator
from pydantic_settings import BaseSettings, NoDecode, SettingsConfigDict
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

from worker.settings import Settings
from workflows.constants import WF_SWEEP, sweep_schedule_id
from workflows.models import Duration, SweepInput

log = logging.getLogger(__name__)


class SweepSettings(BaseSettings):
    """Health-sweep Schedule settings (`SICKBAY_SWEEP_*`)."""

    model_config = SettingsConfigDict(env_prefix="SICKBAY_", extra="ignore")

    sweep_enabled: bool = True  # False: `sickbay worker` does not create the Schedule
    sweep_interval: Duration = timedelta(minutes=5)
    sweep_unknown_timeout: Duration = timedelta(minutes=5)
    sweep_notify_channels: Annotated[list[str], NoDecode] = Field(default_factory=list)
    sweep_dry_run: bool = False

    @field_validator("sweep_notify_channels", mode="before")
    @classmethod
    def _split(cls, value: object) -> object:
        if isinstance(value, str):
            text = value.strip()
            if text.startswith("["):
                return json.loads(text)
            return [p.strip() for p in text.split(",") if p.strip()]
        return value

    @field_validator("sweep_interval")
    @classmethod
    def _min_interval(cls, value: timedelta) -> timedelta:
        if value < timedelta(seconds=10):
            raise ValueError("the sweep interval must be at least 10s")
        return value


def _watcher_enabled() -> bool:
    from worker.watcher import WatchSettings

    return WatchSettings().watch_enabled


def sweep_schedule(settings: Settings, sweep: SweepSettings) -> Schedule:
    inp = SweepInput(
        unknown_timeout=sweep.sweep_unknown_timeout,
        notify_channels=sweep.sweep_notify_channels,
        task_queue=settings.task_queue,
        dry_run=sweep.sweep_dry_run,
        cluster=settings.cluster,
        watcher=_watcher_enabled(),
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
    sweep = sweep if sweep is not None else SweepSettings()
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


# --------------------------------------------------------------------------------------------
# CLI
# --------------------------------------------------------------------------------------------


def _run_webhook(args: argparse.Namespace) -> int:
    import uvicorn
    from pydantic import ValidationError

    from worker.http_server import ServerSettings, build_config
    from worker.temporal import freeze_startup_heap
    from worker.webhook.app import create_app
    from worker.webhook.settings import WebhookSettings

    settings = Settings()
    overrides: dict[str, object] = {}
    if args.host:
        overrides["webhook_host"] = args.host
    if args.port is not None:
        overrides["webhook_port"] = args.port
    if args.no_auth:
        overrides["webhook_auth_disabled"] = True
    webhook = WebhookSettings(**overrides)  # type: ignore[arg-type]
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s %(message)s")
    try:
        app = create_app(settings, webhook=webhook)
        if webhook.webhook_spool_dir is not None:
            # Fail here with one clear line rather than in the server's start-up (a traceback):
            # the directory must be writable and not in use by another webhook.
            from worker.spool import Spool

            Spool(webhook.webhook_spool_dir).check()
        # Slow-client bounds and TLS (worker/http_server.py); bad TLS files stop it here.
        config, _limits, tls = build_config(
            app,
            webhook.webhook_host,
            webhook.webhook_port,
            ServerSettings(),
            access_log=args.access_log,
        )
    except ValidationError as exc:
        log.error("invalid webhook setting: %s", exc)
        return 2
    except RuntimeError as exc:  # e.g. no or a weak token, spool in use, TLS files unreadable
        log.error("%s", exc)
        return 2
    if tls is None:
        log.info("serving plain HTTP (set SICKBAY_WEBHOOK_TLS_CERT_FILE/_KEY_FILE for HTTPS)")
    log.info("start-up heap frozen: %d objects out of full collections", freeze_startup_heap())
    uvicorn.Server(config).run()
    return 0


async def _schedule(action: str) -> int:
    from worker.temporal import connect

    settings = Settings()
    client = await connect(settings)
    schedule_id = sweep_schedule_id(settings.cluster)
    if action == "install":
        result = await ensure_sweep_schedule(client, settings)
        sweep = SweepSettings()
        print(f"schedule {schedule_id}: {result} (every {sweep.sweep_interval})")
    elif action == "trigger":
        await client.get_schedule_handle(schedule_id).trigger()
        print(f"schedule {schedule_id}: triggered a sweep now")
    elif action == "delete":
        await client.get_schedule_handle(schedule_id).delete()
        print(f"schedule {schedule_id}: deleted")
    return 0


def _run_schedule(args: argparse.Namespace) -> int:
    try:
        return asyncio.run(_schedule(args.action))
    except (RuntimeError, ValueError) as exc:
        print(f"error: {exc}")
        return 1


def register(subparsers: argparse._SubParsersAction) -> None:
    wh = subparsers.add_parser(
        "webhook",
        help="run the Alertmanager webhook receiver",
        description="Serve POST /v1/alertmanager, GET /healthz and GET /metrics. Bearer token "
        "from SICKBAY_WEBHOOK_TOKEN or SICKBAY_WEBHOOK_TOKEN_FILE.",
    )
    wh.add_argument("--host", help="listen address (default SICKBAY_WEBHOOK_HOST or 127.0.0.1)")
    wh.add_argument("--port", type=int, help="listen port (default SICKBAY_WEBHOOK_PORT or 8080)")
    wh.add_argument(
        "--no-auth",
        action="store_true",
        help="accept notifications without a bearer token (loopback demos only)",
    )
    wh.add_argument("--access-log", action="store_true", help="log every request")
    wh.set_defaults(func=_run_webhook)

    sc = subparsers.add_parser(
        "schedule",
        help="manage the health-sweep Temporal Schedule",
        description="install: create or update the sweep Schedule (SICKBAY_SWEEP_INTERVAL, "
        "SICKBAY_SWEEP_UNKNOWN_TIMEOUT, SICKBAY_SWEEP_NOTIFY_CHANNELS); trigger: sweep now; "
        "delete: remove the Schedule.",
    )
    sc.add_argument("action", choices=["install", "trigger", "delete"])
    sc.set_defaults(func=_run_schedule)
