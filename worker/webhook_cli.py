"""`sickbay webhook` and `sickbay schedule install|trigger|delete`.

The webhook is worker/webhook/ served by worker/http_server.py; the sweep Schedule's code is
worker/schedules.py (which `sickbay worker` also runs at start-up).
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import sys

from contract.names import sweep_schedule_id
from worker.schedules import ensure_sweep_schedule
from worker.settings import Settings

log = logging.getLogger(__name__)


# --------------------------------------------------------------------------------------------
# CLI
# --------------------------------------------------------------------------------------------


def _run_webhook(args: argparse.Namespace) -> int:
    import uvicorn
    from pydantic import ValidationError

    from worker.http_server import build_config
    from worker.settings import WebhookSettings
    from worker.temporal import freeze_startup_heap
    from worker.webhook.app import create_app

    overrides: dict[str, object] = {}
    if args.host:
        overrides["webhook_host"] = args.host
    if args.port is not None:
        overrides["webhook_port"] = args.port
    if args.no_auth:
        overrides["webhook_auth_disabled"] = True
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s %(message)s")
    try:
        settings = Settings()
        # Flags over the environment, validated as the variables are.
        webhook = WebhookSettings.model_validate({**dict(settings.webhook), **overrides})
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
            settings.server,
            access_log=args.access_log,
        )
    except ValidationError as exc:
        log.error("invalid setting: %s", exc)
        return 2
    except RuntimeError as exc:  # e.g. no or a weak token, spool in use, TLS files unreadable
        log.error("%s", exc)
        return 2
    if tls is None:
        log.info("serving plain HTTP (set SICKBAY_WEBHOOK_TLS_CERT_FILE/_KEY_FILE for HTTPS)")
    log.info("start-up heap frozen: %d objects out of full collections", freeze_startup_heap())
    uvicorn.Server(config).run()
    return 0


async def _schedule(action: str, cluster: str | None = None) -> int:
    from worker.cli_cluster import cluster_settings
    from worker.temporal import connect

    # The Schedule's id and queue carry the cluster's name: the recorded one unless given.
    settings, _ = await asyncio.to_thread(
        cluster_settings, Settings(), cluster, f"schedule {action}", acting=True
    )
    client = await connect(settings)
    schedule_id = sweep_schedule_id(settings.cluster)
    if action == "install":
        result = await ensure_sweep_schedule(client, settings)
        print(f"schedule {schedule_id}: {result} (every {settings.sweep.sweep_interval})")
    elif action == "trigger":
        await client.get_schedule_handle(schedule_id).trigger()
        print(f"schedule {schedule_id}: triggered a sweep now")
    elif action == "delete":
        await client.get_schedule_handle(schedule_id).delete()
        print(f"schedule {schedule_id}: deleted")
    return 0


def _run_schedule(args: argparse.Namespace) -> int:
    try:
        return asyncio.run(_schedule(args.action, args.cluster))
    except (RuntimeError, ValueError) as exc:
        print(f"error: {exc}", file=sys.stderr)
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
    sc.add_argument("--cluster", help="the Sickbay cluster (else as for every command)")
    sc.set_defaults(func=_run_schedule)
