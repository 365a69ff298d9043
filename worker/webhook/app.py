"""Alertmanager webhook receiver: `POST /v1/alertmanager`, `GET /healthz`, `GET /metrics`;
and people's verified actions, `POST /v1/actions` and `POST /v1/slack/actions`
(worker/webhook/actions.py, on when SICKBAY_ACTIONS_KEY(_FILE) is set).

One request = one Alertmanager notification (payload version 4). For each alert:

    firing + configured alert name + node + UUID  -> signal-with-start of the device workflow
                                                     (activities.launch.signal_with_start),
                                                     unless its last, closed run handled this
                                                     alert instance (`already-handled`)
    resolved + node + UUID                        -> signal `alert-resolved` to a *running*
                                                     workflow (never starts one)
    anything else                                 -> reported under `unmatched`, counted,
                                                     logged at WARNING and reported to the
                                                     sickbay-rejections workflow

Status codes, so that Alertmanager's retry does the right thing:

    200  Temporal accepted every start/signal (unmatched alerts are listed, not retried)
    400  body is not JSON            422  JSON, but not an Alertmanager v4 payload (problems listed)
    401  missing/wrong bearer token  413  body or alert count over the limit
    503  Temporal unreachable or too slow: Alertmanager retries the whole notification, which
         is harmless because the workflow de-duplicates evidence by alert fingerprint
    502  Temporal refused a call for another reason (also retried)

The package: auth.py (the bearer token), metrics.py, service.py (alerts to Temporal calls,
with dedupe.py, lanes.py and delivery.py: the spool), app.py (this file: the FastAPI app and
its lifespan); its settings are `Settings.webhook` (worker/settings.py). Served by
`sickbay webhook` (worker/webhook_cli.py).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from pydantic import ValidationError
from starlette.requests import ClientDisconnect
from temporalio.client import Client

from worker.alerts import AmPayload
from worker.settings import Settings, WebhookSettings
from worker.webhook.actions import (
    ACTION_BODY_LIMIT,
    ActionBody,
    Actions,
    ClusterReviews,
    DeviceCheck,
    Refused,
    SlackUsers,
    SlackVerifier,
)
from worker.webhook.auth import TokenSource, Unauthorized, authorized
from worker.webhook.metrics import WebhookMetrics
from worker.webhook.service import AlertService, TemporalUnavailable

log = logging.getLogger(__name__)


class _TooLarge(Exception):
    pass


async def _read_body(request: Request, limit: int) -> bytes:
    declared = request.headers.get("content-length")
    if declared is not None:
        if not declared.strip().isdigit():
            raise ValueError("Content-Length is not a number")
        if int(declared) > limit:
            raise _TooLarge
    body = bytearray()
    async for chunk in request.stream():  # a lying or absent Content-Length is caught here
        body += chunk
        if len(body) > limit:
            raise _TooLarge
    return bytes(body)


def _problems(exc: ValidationError, limit: int = 50) -> list[dict[str, str]]:
    return [
        {
            "loc": ".".join(str(p) for p in err.get("loc", ())) or "(body)",
            "msg": str(err.get("msg", "")),
            "type": str(err.get("type", "")),
        }
        for err in exc.errors(include_url=False, include_context=False, include_input=False)[:limit]
    ]


WORKER_GRACE_SECONDS = 30.0  # a worker started beside the webhook polls well within it


async def warn_without_worker(
    client: Client, settings: Settings, grace: float = WORKER_GRACE_SECONDS
) -> None:
    """Say so loudly when no worker of this cluster polls the queue alerts start work on: after
    `grace` seconds, so that one starting beside the webhook (a rollout, the demo) is not a
    false alarm; once one polls after the warning, say that too."""
    from worker.cluster import missing_worker_warning

    loop = asyncio.get_running_loop()
    warn_at = loop.time() + grace
    warned = False
    while True:
        try:
            warning = await asyncio.wait_for(  # a slow Temporal must not hold the check
                missing_worker_warning(client, settings.task_queue, settings.cluster), 5.0
            )
        except Exception as exc:  # a check only: never stops the webhook
            log.info("could not list the pollers of %s: %s", settings.task_queue, exc)
            return
        if warning is None:
            if warned:
                log.info(
                    "a Sickbay worker of this cluster polls task queue %s now: the "
                    "remediations started meanwhile run",
                    settings.task_queue,
                )
            return
        if not warned and loop.time() >= warn_at:
            log.warning("%s", warning)
            warned = True
        await asyncio.sleep(10.0 if warned else min(1.0, grace))


CLUSTER_FILE_POLL_SECONDS = 2.0


class ClusterName:
    """The webhook's cluster name: SICKBAY_CLUSTER, or with SICKBAY_CLUSTER_FILE the name the
    worker recorded (worker/cluster_name.py), unknown until that file exists. While unknown
    (or refused) alerts are answered 503: nothing starts under a guessed name."""

    def __init__(self, settings: Settings, service: AlertService) -> None:
        self.path = settings.cluster_file
        self.explicit = settings.cluster if settings.cluster_explicit else None
        self.service = service
        self.known = self.path is None
        self.problem: str | None = None

    def check(self) -> bool:
        """Read the file once; True once the name is known. Raises ClusterNameError when the
        file names another cluster than SICKBAY_CLUSTER, or is invalid."""
        from worker.cluster_name import check_agrees, read_cluster_file

        if self.known or self.path is None:
            return True
        name = read_cluster_file(self.path)
        if name is None:
            return False
        check_agrees(self.explicit, name, f"SICKBAY_CLUSTER_FILE {self.path}")
        self.service.adopt_cluster(name)
        self.known = True
        log.info("cluster name %r (from %s)", name, self.path)
        return True

    async def wait(self) -> None:
        """Until the name is known; a refusal is kept in `problem` (and logged) for good."""
        from worker.cluster_name import ClusterNameError

        logged = False
        while True:
            try:
                if self.check():
                    return
            except ClusterNameError as exc:
                self.problem = str(exc)
                log.error("%s", exc)
                return
            if not logged:
                log.warning(
                    "cluster name not recorded yet (%s absent): answering 503 until the worker "
                    "records it",
                    self.path,
                )
                logged = True
            await asyncio.sleep(CLUSTER_FILE_POLL_SECONDS)

    def refusal(self) -> str | None:
        if self.known:
            return None
        return self.problem or (
            f"the cluster name is not known yet ({self.path} absent: no Sickbay worker has "
            "recorded it): nothing is started under a guessed name"
        )


def _actions(settings: Settings, service: AlertService, api_client: Any) -> Actions:
    """The verified-actions path: on when the actions key is set (the webhook then needs the
    Kubernetes API for TokenReview / SubjectAccessReview); Slack when its secret is set."""
    key = settings.actions_key_bytes()  # unreadable or weak: refuse to start
    if key is None:
        return Actions(None, service, None)
    if api_client is None:
        from activities.kube.client import load_api_client

        api_client = load_api_client(settings.kube_settings())
    secret = settings.slack_signing_secret_bytes()
    return Actions(
        key,
        service,
        ClusterReviews(api_client),
        SlackVerifier(secret) if secret is not None else None,
        SlackUsers.load(settings.slack_users_file),
        DeviceCheck(api_client),
    )


def _slack_text(code: int, answer: dict[str, Any]) -> str:
    if code == 200:
        return f"{answer.get('status')} {answer.get('workflow_id')} by {answer.get('actor')} (verified)"
    return str(answer.get("error") or answer.get("status") or code)


def create_app(
    settings: Settings,
    temporal: Client | None = None,
    *,
    webhook: WebhookSettings | None = None,
    kube_api_client: Any = None,
) -> FastAPI:
    """The webhook app. `temporal` is a connected client (tests, embedding); without one the
    lifespan connects with `settings`, and requests retry the connection while it is down."""
    wh = webhook if webhook is not None else settings.webhook
    tokens = TokenSource(wh)
    if tokens.current() is None:
        log.warning("webhook authentication is DISABLED (SICKBAY_WEBHOOK_AUTH_DISABLED)")
    metrics = WebhookMetrics()
    service = AlertService(settings, wh, metrics, temporal)
    cluster = ClusterName(settings, service)
    actions = _actions(settings, service, kube_api_client)

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        app.state.service = service
        # A recorded name that disagrees with SICKBAY_CLUSTER stops the start (ClusterNameError).
        cluster.check()
        redelivery: asyncio.Task[None] | None = None
        checking: asyncio.Task[None] | None = None
        if wh.webhook_spool_dir is not None:
            # Locked for this process (SpoolError: another webhook uses it) and replayed: what a
            # previous process acknowledged but never got into Temporal goes out first.
            service.spool = wh.new_spool()
            left = service.spool.open()
            metrics.spool_pending.set(len(left))
            log.info(
                "webhook spool %s: acknowledging after %.2f s at most, %d alert(s) pending",
                wh.webhook_spool_dir,
                wh.webhook_ack_seconds,
                len(left),
            )
        try:
            client = await service.client()
        except TemporalUnavailable as exc:
            # Keep serving: requests answer 503 until Temporal is back, and Alertmanager retries.
            log.warning("%s; will retry on the next notification", exc)
        else:
            if cluster.known:
                checking = asyncio.ensure_future(warn_without_worker(client, service.settings))

        async def background() -> None:
            # Spooled alerts and rejections carry the cluster's ids and queue: only once known.
            nonlocal redelivery
            await cluster.wait()
            if not cluster.known:
                return
            if service.spool is not None:
                redelivery = asyncio.ensure_future(service.redeliver_forever())
            await service.report_rejected_forever()

        reporting = asyncio.ensure_future(background())
        try:
            yield
        finally:
            reporting.cancel()
            await asyncio.gather(reporting, return_exceptions=True)
            if checking is not None:
                checking.cancel()
                await asyncio.gather(checking, return_exceptions=True)
            if redelivery is not None:
                redelivery.cancel()
                await asyncio.gather(redelivery, return_exceptions=True)
            await service.shutdown(wh.webhook_temporal_timeout)
            if cluster.known:
                with contextlib.suppress(Exception):  # the last ones, if Temporal takes them
                    await service.report_rejected()
            if service.spool is not None:
                service.spool.close()

    app = FastAPI(
        title="Sickbay Alertmanager webhook",
        lifespan=lifespan,
        docs_url=None,
        redoc_url=None,
        openapi_url=None,
    )
    app.state.service = service

    unauthorized = Unauthorized()

    def reply(code: int, body: dict[str, Any], reason: str | None = None) -> JSONResponse:
        metrics.requests.labels(str(code)).inc()
        if reason:
            metrics.requests_rejected.labels(reason).inc()
        headers = {"WWW-Authenticate": "Bearer"} if code == 401 else None
        return JSONResponse(body, status_code=code, headers=headers)

    @app.post("/v1/alertmanager")
    async def alertmanager(request: Request) -> JSONResponse:
        started = time.perf_counter()
        try:
            if not authorized(request, tokens.current()):
                unauthorized.note(request)
                return reply(401, {"error": "missing or wrong bearer token"}, "unauthorized")
            try:
                raw = await _read_body(request, wh.webhook_max_body_bytes)
            except _TooLarge:
                return reply(
                    413,
                    {"error": f"body larger than {wh.webhook_max_body_bytes} bytes"},
                    "too-large",
                )
            except ValueError as exc:
                return reply(400, {"error": str(exc)}, "bad-request")
            except ClientDisconnect:  # gone, or cut off by the body deadline (http_server.py)
                return reply(408, {"error": "the body did not arrive in time"}, "body-timeout")
            try:
                payload = AmPayload.model_validate_json(raw)
            except ValidationError as exc:
                problems = _problems(exc)
                if any(p["type"] == "json_invalid" for p in problems):
                    return reply(
                        400, {"error": "body is not valid JSON", "problems": problems}, "bad-json"
                    )
                return reply(
                    422,
                    {"error": "not an Alertmanager v4 webhook payload", "problems": problems},
                    "invalid-payload",
                )
            if len(payload.alerts) > wh.webhook_max_alerts:
                return reply(
                    413,
                    {"error": f"more than {wh.webhook_max_alerts} alerts in one notification"},
                    "too-many-alerts",
                )
            refused = cluster.refusal()
            if refused is not None:
                return reply(503, {"error": refused}, "cluster-unknown")
            code, body = await service.handle(payload)
            return reply(code, body)
        finally:
            metrics.latency.observe(time.perf_counter() - started)

    @app.post("/v1/actions")
    async def verified_action(request: Request) -> JSONResponse:
        """A person's action with their Kubernetes credentials (worker/webhook/actions.py)."""
        try:
            # Authenticated before the body is read: a bad token is answered 401 and closed.
            person = await actions.authenticate(request.headers.get("authorization", ""))
            raw = await _read_body(request, ACTION_BODY_LIMIT)
            try:
                body = ActionBody.model_validate_json(raw)
            except ValidationError as exc:
                return reply(422, {"error": "not an action", "problems": _problems(exc)})
            refused = cluster.refusal()
            if refused is not None:
                return reply(503, {"error": refused})
            code, answer = await actions.perform(person, body)
            return reply(code, answer)
        except Refused as exc:
            if exc.code in (401, 403):
                log.warning("refused an action with %d: %s", exc.code, exc.message)
            return reply(exc.code, {"error": exc.message})
        except _TooLarge:
            return reply(413, {"error": f"body larger than {ACTION_BODY_LIMIT} bytes"})
        except (ValueError, ClientDisconnect) as exc:
            return reply(400, {"error": str(exc) or "the body did not arrive"})
        except TemporalUnavailable as exc:
            return reply(503, {"error": str(exc)})

    @app.post("/v1/slack/actions")
    async def slack_action(request: Request) -> JSONResponse:
        """A Slack button (the app's interactivity request URL): signed by Slack."""
        try:
            raw = await _read_body(request, ACTION_BODY_LIMIT)
            person, body = actions.slack_person(request.headers, raw)
            refused = cluster.refusal()
            if refused is not None:
                return reply(503, {"error": refused})
            code, answer = await actions.perform(person, body)
            return reply(code, {**answer, "text": _slack_text(code, answer)})
        except Refused as exc:
            if exc.code in (401, 403):
                log.warning("refused a Slack action with %d: %s", exc.code, exc.message)
            return reply(exc.code, {"error": exc.message, "text": exc.message})
        except _TooLarge:
            return reply(413, {"error": f"body larger than {ACTION_BODY_LIMIT} bytes"})
        except (ValueError, ClientDisconnect) as exc:
            return reply(400, {"error": str(exc) or "the body did not arrive"})
        except TemporalUnavailable as exc:
            return reply(503, {"error": str(exc)})

    @app.get("/healthz")
    async def healthz() -> JSONResponse:
        # Liveness: the process serves. Temporal's state is reported, not judged: restarting
        # the webhook would not bring Temporal back.
        body: dict[str, Any] = {"status": "ok", "temporal_connected": service.connected}
        if cluster.path is not None:  # the recorded name, once the file is there
            body["cluster"] = service.settings.cluster if cluster.known else None
        if service.spool is not None:  # acknowledged alerts Temporal does not have yet
            body["spool_pending"] = len(service.spool.pending)
        return JSONResponse(body)

    @app.get("/metrics")
    async def prometheus_metrics() -> Response:
        return Response(generate_latest(metrics.registry), media_type=CONTENT_TYPE_LATEST)

    return app
