"""Alertmanager webhook receiver: `POST /v1/alertmanager`, `GET /healthz`, `GET /metrics`.

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

At most one Temporal call per *workflow* at a time, and one per *distinct* alert at most.
A delivery is identified by
(workflow id, status, fingerprint, startsAt): Alertmanager repeats an alert with the same
fingerprint and startsAt for as long as it fires, and a re-fire after resolution gets a new
startsAt. For each delivery key:

    accepted by Temporal <= SICKBAY_WEBHOOK_DEDUP_SECONDS ago (60 s)  -> acknowledged, no call
    queued or being delivered (any notification)      -> await that delivery, share its outcome
    otherwise                                         -> queued on its workflow's lane
and identical alerts inside one notification are one delivery. Each workflow id has a lane:
one call in flight at a time; deliveries arriving meanwhile (from this or any other
notification) wait and go together as ONE call when it finishes, so a storm costs about one
call per workflow per call time, not one per distinct alert. A lane's call sends every queued
firing delivery as one signal-with-start (`alert` for one, `alerts` with the list for more),
then the queued resolved ones as `alert-resolved` signals (firing first, so a resolved alert
finds the workflow its firing one started). Only a call Temporal accepted
is remembered (bounded: SICKBAY_WEBHOOK_DEDUP_ENTRIES, oldest dropped first); a failed call
fails every alert waiting on it (503), and the sender's retry calls again. Skipping a repeat is
safe because the workflow de-duplicates evidence by fingerprint anyway; the window is
measured from acceptance (a hit does not extend it), so an alert that keeps firing reaches
Temporal again at least once per window. Before each signal-with-start the lane asks Temporal
whether the GPU's last run is closed and, if so, which alert instances (fingerprint +
startsAt) it handled (its result): those are answered `already-handled` and start nothing, so
a repeat never restarts a closed remediation, whichever replica or restart receives it.

With a delivery spool (SICKBAY_WEBHOOK_SPOOL_DIR, worker/spool.py), a notification waits for
Temporal at most SICKBAY_WEBHOOK_ACK_SECONDS: the deliveries still on their way then are
journaled to disk (fsync) and acknowledged as `queued`; the spool keeps them wanted until
Temporal accepts them and sends failed ones again, also after a restart. Without one:
a POST is acknowledged (200) only when Temporal accepted every one of its alerts; a failed
call fails every delivery it carried (503/502 as above), and a queued delivery whose every
waiting notification gave up (deadline) before its call took a slot is dropped unsent, so an
overloaded server is not sent work nobody waits for (the sender's retry queues it again).
Per-alert work is small (pydantic parse, a dict lookup); calls of different workflows run
concurrently, bounded process-wide by `webhook_concurrency`, over one shared client.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import functools
import hmac
import json
import logging
import time
from collections import OrderedDict
from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Annotated, Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response
from prometheus_client import (
    CONTENT_TYPE_LATEST,
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    generate_latest,
)
from pydantic import Field, SecretStr, ValidationError, field_validator
from pydantic_settings import BaseSettings, NoDecode, SettingsConfigDict
from starlette.requests import ClientDisconnect
from temporalio.client import Client, WorkflowExecutionStatus
from temporalio.service import RPCError, RPCStatusCode

from activities.launch import report_rejected, signal_with_start
from contract.names import SIG_ALERT_RESOLVED
from contract.notify import RejectedAlerts
from contract.remediation import HandledAlert, RemediationInput, RemediationResult, instance_key
from worker.alerts import (
    DEFAULT_ALERT_CLASSES,
    DEFAULT_ALERT_NAMES,
    DEFAULT_NODE_LABELS,
    AlertKind,
    AlertMapping,
    AmPayload,
    MappedAlert,
    Unmapped,
    map_alert,
)
from worker.security import check_webhook_token
from worker.settings import Settings
from worker.spool import DEFAULT_MAX_BYTES as DEFAULT_SPOOL_BYTES
from worker.spool import Spool, SpoolFull
from worker.temporal import connect, ensure_search_attributes

log = logging.getLogger(__name__)

StrList = Annotated[list[str], NoDecode]


class WebhookSettings(BaseSettings):
    """Webhook-only settings (`SICKBAY_` prefix); Temporal settings come from `Settings`.

    List settings take JSON (`["a","b"]`) or a comma-separated string (`a,b`).
    """

    model_config = SettingsConfigDict(env_prefix="SICKBAY_", extra="ignore")

    webhook_host: str = "127.0.0.1"
    webhook_port: int = Field(default=8080, ge=0, le=65535)
    webhook_token: SecretStr | None = None
    webhook_token_file: Path | None = None
    webhook_auth_disabled: bool = False  # only for a loopback demo; never in a cluster
    webhook_max_body_bytes: int = Field(default=4 * 1024 * 1024, ge=1024)
    webhook_max_alerts: int = Field(default=5000, ge=1)
    # In-flight Temporal calls for the whole process: enough to keep a frontend busy during
    # an alert storm without opening thousands of concurrent RPCs on one connection.
    webhook_concurrency: int = Field(default=64, ge=1, le=4096)
    # Upper bound for all Temporal calls of one notification. Past it we answer 503 and
    # Alertmanager retries; below Alertmanager's usual 10 s+ webhook timeout.
    webhook_temporal_timeout: float = Field(default=8.0, gt=0)
    # Recent-delivery window: an alert identical to one Temporal accepted this many seconds ago
    # or less (same workflow, status, fingerprint, startsAt) is acknowledged without another
    # call. Covers Alertmanager's retries and overlapping groups during a storm; 0 turns the
    # cache off (identical alerts in flight at the same moment still share one call).
    webhook_dedup_seconds: float = Field(default=60.0, ge=0)
    # At most this many remembered deliveries (~0.5 KB each): the oldest go first.
    webhook_dedup_entries: int = Field(default=50_000, ge=1)
    # Delivery spool (worker/spool.py). Set: a notification waits for Temporal at most
    # webhook_ack_seconds; the alerts Temporal has not accepted by then are journaled to this
    # directory (flushed to disk) before the 200, and delivered in the background, across
    # restarts. One directory per webhook process (locked). Unset: a notification is answered
    # only once Temporal accepted every alert (or 503 past webhook_temporal_timeout).
    webhook_spool_dir: Path | None = None
    # 0.5 s: well under Alertmanager's webhook timeout and the 1 s a storm's sender should
    # wait; a healthy Temporal answers in milliseconds, so only a slow one reaches the spool.
    webhook_ack_seconds: float = Field(default=0.5, gt=0)
    # Past this many pending alerts the spool takes no more: notifications wait for Temporal
    # (503 past the deadline) as without a spool, so a long outage cannot fill the disk.
    webhook_spool_max: int = Field(default=100_000, ge=1)
    # ... and past this many bytes of journal (worker/spool.py): a disk or emptyDir that
    # fills up loses the alerts already acknowledged. deploy/webhook.yaml sizes its emptyDir
    # from it (spool_disk_bytes: twice this plus slack, for a compaction's copy).
    webhook_spool_max_bytes: int = Field(default=DEFAULT_SPOOL_BYTES, ge=64 * 1024)
    # An alert whose labels and annotations (names and values, UTF-8) are larger than this is
    # refused as `too-large`: a real DCGM alert is ~2 KB, and every accepted alert is kept in
    # history and, when Temporal is slow, in the spool.
    webhook_max_alert_bytes: int = Field(default=16 * 1024, ge=1024)
    # How often spooled alerts whose call failed are sent again (Temporal down: every round).
    webhook_spool_retry_seconds: float = Field(default=2.0, gt=0)
    # Mapping alert labels to a device (defaults: dcgm-exporter, deploy/prometheus-rules.yaml)
    alert_names: StrList = Field(default_factory=lambda: list(DEFAULT_ALERT_NAMES))
    # Your own alert names -> failure class (or `xid`), JSON: {"MyGpuDead": "unhealthy"};
    # merged over the shipped rules' classes, and accepted like `alert_names`.
    alert_classes: dict[str, AlertKind] = Field(default_factory=dict)
    alert_node_labels: StrList = Field(default_factory=lambda: list(DEFAULT_NODE_LABELS))
    alert_uuid_labels: StrList = Field(default_factory=lambda: ["UUID"])
    alert_index_labels: StrList = Field(default_factory=lambda: ["gpu"])
    alert_model_labels: StrList = Field(default_factory=lambda: ["modelName"])
    alert_xid_labels: StrList = Field(default_factory=lambda: ["err_code", "Xid", "xid"])
    alert_value_annotation: str = "value"

    @field_validator(
        "alert_names",
        "alert_node_labels",
        "alert_uuid_labels",
        "alert_index_labels",
        "alert_model_labels",
        "alert_xid_labels",
        mode="before",
    )
    @classmethod
    def _split(cls, value: object) -> object:
        if isinstance(value, str):
            text = value.strip()
            if text.startswith("["):
                return json.loads(text)
            return [part.strip() for part in text.split(",") if part.strip()]
        return value

    def mapping(self) -> AlertMapping:
        return AlertMapping(
            alert_names=frozenset(self.alert_names) | frozenset(self.alert_classes),
            alert_classes={**DEFAULT_ALERT_CLASSES, **self.alert_classes},
            node_labels=tuple(self.alert_node_labels),
            uuid_labels=tuple(self.alert_uuid_labels),
            index_labels=tuple(self.alert_index_labels),
            model_labels=tuple(self.alert_model_labels),
            xid_labels=tuple(self.alert_xid_labels),
            value_annotation=self.alert_value_annotation,
            max_alert_bytes=self.webhook_max_alert_bytes,
        )

    def new_spool(self) -> Spool:
        """The delivery spool these settings describe (not opened); needs webhook_spool_dir."""
        assert self.webhook_spool_dir is not None
        return Spool(self.webhook_spool_dir, self.webhook_spool_max, self.webhook_spool_max_bytes)

    def token_bytes(self) -> bytes | None:
        """The bearer token, or None when auth is explicitly disabled.

        Raises RuntimeError when neither a token nor the explicit opt-out is configured, so a
        misconfigured receiver refuses to start instead of accepting anyone.
        """
        if self.webhook_token is not None:
            token = self.webhook_token.get_secret_value().strip()
        elif self.webhook_token_file is not None:
            try:
                token = self.webhook_token_file.read_text().strip()
            except OSError as exc:
                raise RuntimeError(
                    f"cannot read SICKBAY_WEBHOOK_TOKEN_FILE {self.webhook_token_file}: {exc}"
                ) from exc
        elif self.webhook_auth_disabled:
            return None
        else:
            raise RuntimeError(
                "the webhook needs a bearer token: set SICKBAY_WEBHOOK_TOKEN or "
                "SICKBAY_WEBHOOK_TOKEN_FILE (or SICKBAY_WEBHOOK_AUTH_DISABLED=true / "
                "--no-auth for a loopback demo)"
            )
        source = (
            "SICKBAY_WEBHOOK_TOKEN"
            if self.webhook_token is not None
            else f"SICKBAY_WEBHOOK_TOKEN_FILE {self.webhook_token_file}"
        )
        check_webhook_token(token, source)  # WeakTokenError (a RuntimeError) names the problem
        return token.encode()


# --------------------------------------------------------------------------------------------
# Metrics
# --------------------------------------------------------------------------------------------


class WebhookMetrics:
    """Prometheus metrics in a registry of their own (one per app, so tests can build many)."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        r = self.registry
        self.alerts_received = Counter(
            "sickbay_webhook_alerts_received",
            "Alerts received in well-formed notifications",
            ["status"],
            registry=r,
        )
        self.alerts_accepted = Counter(
            "sickbay_webhook_alerts_accepted",
            "Alerts handed to Temporal (or resolved with no workflow to tell)",
            ["status"],
            registry=r,
        )
        self.alerts_rejected = Counter(
            "sickbay_webhook_alerts_rejected",
            "Alerts not acted on, by reason (unmatched, temporal-unavailable, ...)",
            ["reason"],
            registry=r,
        )
        self.workflows = Counter(
            "sickbay_webhook_workflows",
            "Workflow calls by result: started, signalled, resolved-signalled, "
            "resolved-no-workflow",
            ["result"],
            registry=r,
        )
        self.requests = Counter(
            "sickbay_webhook_requests", "Notifications by HTTP status", ["code"], registry=r
        )
        self.requests_rejected = Counter(
            "sickbay_webhook_requests_rejected",
            "Notifications refused before any alert was handled, by reason",
            ["reason"],
            registry=r,
        )
        self.latency = Histogram(
            "sickbay_webhook_request_seconds",
            "Time to handle one notification, from first byte read to response",
            buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10),
            registry=r,
        )
        self.alerts_deduplicated = Counter(
            "sickbay_webhook_alerts_deduplicated",
            "Alerts acknowledged without a Temporal call of their own, because an identical "
            "delivery was in the same notification, in flight, or accepted recently",
            ["via"],
            registry=r,
        )
        self.temporal_calls = Counter(
            "sickbay_webhook_temporal_calls",
            "Temporal RPCs issued for alerts, by kind (signal-with-start, signal)",
            ["call"],
            registry=r,
        )
        self.call_latency = Histogram(
            "sickbay_webhook_temporal_call_seconds",
            "Time of one signal-with-start / signal call, including the wait for a slot",
            buckets=(0.002, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5),
            registry=r,
        )
        self.call_alerts = Histogram(
            "sickbay_webhook_temporal_call_alerts",
            "Distinct alerts (delivery keys) carried by one Temporal call",
            buckets=(1, 2, 3, 4, 6, 8, 12, 16, 32, 64),
            registry=r,
        )
        self.deliveries_dropped = Counter(
            "sickbay_webhook_deliveries_dropped",
            "Queued deliveries not sent because every notification waiting for them gave up",
            registry=r,
        )
        self.spooled = Counter(
            "sickbay_webhook_alerts_spooled",
            "Alerts acknowledged before Temporal accepted them: journaled to the spool",
            registry=r,
        )
        self.spool_pending = Gauge(
            "sickbay_webhook_spool_pending",
            "Spooled alerts Temporal has not accepted yet",
            registry=r,
        )
        self.spool_redelivered = Counter(
            "sickbay_webhook_spool_redelivered",
            "Spooled alerts sent again (after a failed call, or left by a previous process)",
            registry=r,
        )
        self.spool_refused = Counter(
            "sickbay_webhook_spool_refused",
            "Times the spool took no more alerts, by reason (count, bytes, disk): the "
            "notification waited for Temporal instead (503 past the deadline)",
            ["reason"],
            registry=r,
        )
        self.spool_given_up = Counter(
            "sickbay_webhook_spool_given_up",
            "Spooled alerts dropped after Temporal refused them for good (logged at ERROR)",
            registry=r,
        )


# --------------------------------------------------------------------------------------------
# The service behind the routes
# --------------------------------------------------------------------------------------------


DeliveryKey = tuple[str, str, str, str]  # MappedAlert.delivery_key()
DUPLICATE = "duplicate"  # result of an alert acknowledged through an identical delivery
QUEUED = "queued"  # result of an alert acknowledged through the spool (worker/spool.py)
# A spooled alert Temporal refuses this many times for a non-transient reason (e.g. invalid
# argument) is dropped with an ERROR log; transient failures (Temporal down) retry forever.
SPOOL_GIVE_UP = 5
# While Temporal stays unreachable, the redelivery rounds (every few seconds) say so at most
# this often; the first round that reaches it again says so once.
SPOOL_WAIT_LOG_SECONDS = 60.0
# Result of a firing alert whose instance (fingerprint + startsAt) the device's last, closed
# run already handled: no new run, no page, no quarantine (decided from that run's result).
ALREADY_HANDLED = "already-handled"
# Results worth remembering: Temporal recorded the alert. "resolved-no-workflow" is not: a
# workflow may start in the meantime, and asking again is cheap.
CACHEABLE = frozenset({"started", "signalled", "resolved-signalled", ALREADY_HANDLED})


# Unusable alerts go to the rejections workflow (for `sickbay status`) this often, as one
# signal per webhook process whatever their number; a few examples per reason travel along.
REJECTED_REPORT_SECONDS = 5.0
REJECTED_EXAMPLES = 5


def _instance(m: MappedAlert) -> tuple[str, str]:
    return instance_key(m.fingerprint, m.starts_at)


class RecentDeliveries:
    """Deliveries Temporal accepted in the last `ttl` seconds, and the ones in flight.

    - `inflight`: delivery key -> the one delivery queued or being sent now (single-flight: an
      identical alert arriving meanwhile awaits it and shares its outcome, success or failure).
    - accepted keys, oldest first: `recent(key)` is true for `ttl` seconds after Temporal
      accepted it (a hit does not extend the window, so an alert that keeps firing reaches
      Temporal again at least once per window). At most `max_entries` keys; past that the
      oldest are forgotten, which only costs a repeated, harmless call.
    A failed call is never remembered: the sender's retry calls Temporal again.
    """

    def __init__(
        self, ttl: float, max_entries: int, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.ttl = ttl
        self.max_entries = max_entries
        self._clock = clock
        self._accepted: OrderedDict[DeliveryKey, float] = OrderedDict()
        self.inflight: dict[DeliveryKey, Delivery] = {}

    def __len__(self) -> int:
        return len(self._accepted)

    def recent(self, key: DeliveryKey) -> bool:
        at = self._accepted.get(key)
        if at is None:
            return False
        if self._clock() - at >= self.ttl:
            del self._accepted[key]
            return False
        return True

    def remember(self, key: DeliveryKey) -> None:
        if self.ttl <= 0:
            return
        now = self._clock()
        self._accepted[key] = now
        self._accepted.move_to_end(key)
        # Oldest first, so expiry and the size bound both trim from the front.
        while self._accepted:
            oldest_key, oldest_at = next(iter(self._accepted.items()))
            if len(self._accepted) <= self.max_entries and now - oldest_at < self.ttl:
                break
            del self._accepted[oldest_key]


@dataclass(eq=False)
class Delivery:
    """One distinct alert on its way to Temporal. `call` resolves to the result for this key
    (started, signalled, resolved-signalled, resolved-no-workflow) or the call's error;
    `waiters`: notifications awaiting it now (0 before its call: nobody wants it sent)."""

    key: DeliveryKey
    alert: MappedAlert
    call: asyncio.Future[str]
    waiters: int = 0


@dataclass(eq=False)
class Lane:
    """One workflow id's deliveries: `queued` wait for the next call; `task` sends them, one
    call at a time, until none are left (then the lane is dropped)."""

    queued: dict[DeliveryKey, Delivery] = field(default_factory=dict)
    task: asyncio.Future[None] | None = None


class TemporalUnavailable(Exception):
    """No client could be had (connect failed)."""


_TRANSIENT = {
    RPCStatusCode.UNAVAILABLE,
    RPCStatusCode.DEADLINE_EXCEEDED,
    RPCStatusCode.RESOURCE_EXHAUSTED,
    RPCStatusCode.ABORTED,
    RPCStatusCode.CANCELLED,
    RPCStatusCode.INTERNAL,
    RPCStatusCode.UNKNOWN,
}


@dataclass
class Outcome:
    results: list[dict[str, Any]] = field(default_factory=list)
    unmatched: list[dict[str, Any]] = field(default_factory=list)
    failed: list[dict[str, Any]] = field(default_factory=list)
    counts: dict[str, int] = field(default_factory=dict)

    def bump(self, key: str) -> None:
        self.counts[key] = self.counts.get(key, 0) + 1

    def result(self, m: MappedAlert, result: str, via: str = "") -> None:
        """Count and list one acknowledged alert (`via`: how a duplicate was answered)."""
        self.bump(result)
        entry: dict[str, Any] = {
            "index": m.index,
            "fingerprint": m.fingerprint,
            "device": m.device.key,
            "workflow_id": m.workflow_id,
            "result": result,
        }
        if via:
            entry["via"] = via
        self.results.append(entry)


class AlertService:
    def __init__(
        self,
        settings: Settings,
        webhook: WebhookSettings,
        metrics: WebhookMetrics,
        client: Client | None,
    ) -> None:
        self.settings = settings
        self.webhook = webhook
        self.mapping = dataclasses.replace(webhook.mapping(), cluster=settings.cluster)
        self.metrics = metrics
        self._client = client
        self._lock = asyncio.Lock()
        self._slots = asyncio.Semaphore(webhook.webhook_concurrency)
        self.recent = RecentDeliveries(webhook.webhook_dedup_seconds, webhook.webhook_dedup_entries)
        self.lanes: dict[str, Lane] = {}  # workflow id -> its lane, while it has deliveries
        # The delivery spool (opened by create_app) and the spooled deliveries with a call on
        # its way, which the spool keeps wanted (a waiter) until the call ends.
        self.spool: Spool | None = None
        self._held: dict[DeliveryKey, Delivery] = {}
        self._refusals: dict[DeliveryKey, int] = {}
        self._unreachable_logged: float | None = None  # monotonic time of the last warning
        # Unusable alerts not yet reported to the rejections workflow: reason -> count, and a
        # few examples (report_rejected sends them every REJECTED_REPORT_SECONDS).
        self.rejected: dict[str, int] = {}
        self._rejected_examples: dict[str, list[str]] = {}

    @property
    def connected(self) -> bool:
        return self._client is not None

    async def client(self) -> Client:
        if self._client is not None:
            return self._client
        async with self._lock:
            if self._client is None:
                try:
                    client = await asyncio.wait_for(
                        connect(self.settings), self.webhook.webhook_temporal_timeout
                    )
                except (TimeoutError, RuntimeError, OSError, RPCError) as exc:
                    raise TemporalUnavailable(
                        f"cannot reach Temporal at {self.settings.temporal_address}: {exc}"
                    ) from exc
                try:
                    await asyncio.wait_for(
                        ensure_search_attributes(client, self.settings.temporal_namespace),
                        self.webhook.webhook_temporal_timeout,
                    )
                except TimeoutError:
                    log.warning("timed out checking search attributes; continuing")
                except RuntimeError as exc:  # Temporal Cloud: says what to run instead
                    log.warning("%s", exc)
                except RPCError as exc:
                    log.warning("could not check search attributes: %s", exc)
                self._client = client
                log.info("connected to Temporal at %s", self.settings.temporal_address)
        return self._client

    async def handle(self, payload: AmPayload) -> tuple[int, dict[str, Any]]:
        received_at = datetime.now(UTC)
        out = Outcome()
        # workflow id -> delivery key -> the alerts of this notification with that key
        by_workflow: dict[str, dict[DeliveryKey, list[MappedAlert]]] = {}
        for index, alert in enumerate(payload.alerts):
            self.metrics.alerts_received.labels(alert.status).inc()
            mapped = map_alert(index, alert, self.mapping, received_at=received_at)
            if isinstance(mapped, Unmapped):
                self.metrics.alerts_rejected.labels(mapped.reason).inc()
                out.unmatched.append(_unmapped_json(mapped))
                self._note_rejected(mapped)
                continue
            key = mapped.delivery_key()
            if self.recent.recent(key):  # fast path for a storm's repeats: no task, no call
                self._accepted(out, [mapped], None, via="recent")
                continue
            group = by_workflow.setdefault(mapped.workflow_id, {})
            group.setdefault(key, []).append(mapped)
        if payload.truncated_alerts:
            log.warning(
                "Alertmanager truncated %d alerts of group %s (raise max_alerts)",
                payload.truncated_alerts,
                payload.group_key,
            )

        if by_workflow:
            try:
                client = await self.client()
            except TemporalUnavailable as exc:
                log.warning("%s", exc)
                for group in by_workflow.values():
                    for same in group.values():
                        for m in same:
                            self._failed(out, m, "temporal-unavailable", str(exc))
                return 503, self._body(out, payload, "temporal unavailable")
            # Firing first, so a resolved alert in the same notification finds the workflow
            # the firing one started.
            groups = [
                sorted(g.values(), key=lambda same: same[0].status != "firing")
                for g in by_workflow.values()
            ]
            # Queued all at once (no await in between), so one workflow's alerts share a call.
            waitings = [self._enqueue(client, g, out) for g in groups]
            tasks: list[asyncio.Future[None]] = [
                asyncio.ensure_future(self._await_group(w, out)) for w in waitings
            ]
            loop = asyncio.get_running_loop()
            deadline = loop.time() + self.webhook.webhook_temporal_timeout
            pending: set[asyncio.Future[None]] = set(tasks)
            queued: set[DeliveryKey] = set()
            if self.spool is not None:
                _done, pending = await asyncio.wait(
                    tasks,
                    timeout=min(self.webhook.webhook_ack_seconds, deadline - loop.time()),
                )
                if pending:
                    queued = await self._spool_waiting(waitings, tasks)
            if pending and not queued:
                _done, pending = await asyncio.wait(
                    pending, timeout=max(0.0, deadline - loop.time())
                )
            for task in pending:
                task.cancel()
            if pending:
                await asyncio.gather(*pending, return_exceptions=True)
                handled = {r["index"] for r in out.results} | {f["index"] for f in out.failed}
                for waiting, task in zip(waitings, tasks, strict=True):
                    if task not in pending:
                        continue
                    for same, d, own in waiting:
                        todo = [m for m in same if m.index not in handled]
                        if not todo:
                            continue
                        call = d.call
                        if call.done() and not call.cancelled() and call.exception() is None:
                            self._record(out, todo, d, own)  # answered, not yet recorded
                        elif d.key in queued:
                            self._queued(out, todo)
                        elif call.done():
                            self._record(out, todo, d, own)
                        else:
                            for m in todo:
                                self._failed(out, m, "temporal-timeout", "Temporal did not answer")

        code = 200
        if out.failed:
            reasons = {f["reason"] for f in out.failed}
            transient = reasons & {"temporal-unavailable", "temporal-timeout"}
            code = 503 if transient else 502
        # One summary line per notification, also one that held only duplicates or signals
        # (what Alertmanager sent is always visible); WARNING when some alerts were not used.
        level = logging.WARNING if out.unmatched or out.failed else logging.INFO
        log.log(
            level,
            "notification %s: %d alerts, %d started, %d signalled, %d resolved, "
            "%d duplicates, %d already handled, %d spooled, %d unmatched, %d failed%s -> %d",
            payload.group_key or "-",
            len(payload.alerts),
            out.counts.get("started", 0),
            out.counts.get("signalled", 0),
            out.counts.get("resolved-signalled", 0),
            out.counts.get(DUPLICATE, 0),
            out.counts.get(ALREADY_HANDLED, 0),
            out.counts.get(QUEUED, 0),
            len(out.unmatched),
            len(out.failed),
            f" ({', '.join(sorted({f['reason'] for f in out.failed}))})" if out.failed else "",
            code,
        )
        if out.unmatched:
            _warn_unmatched(payload, out.unmatched)
        status = "ok" if code == 200 else "some alerts were not accepted by Temporal"
        return code, self._body(out, payload, status)

    def _note_rejected(self, u: Unmapped) -> None:
        self.rejected[u.reason] = self.rejected.get(u.reason, 0) + 1
        examples = self._rejected_examples.setdefault(u.reason, [])
        if len(examples) < REJECTED_EXAMPLES:
            examples.append(f"{u.alertname or '(no alertname)'} ({u.fingerprint}): {u.detail}")

    async def report_rejected(self) -> int:
        """Hand the unusable alerts counted since the last report to the rejections workflow
        (so `sickbay status` shows them, whichever replica refused them). Kept for the next
        round when Temporal cannot take them. Returns how many were reported."""
        if not self.rejected:
            return 0
        counts, examples = self.rejected, self._rejected_examples
        self.rejected, self._rejected_examples = {}, {}
        batch = RejectedAlerts(at=datetime.now(UTC), counts=counts, examples=examples)
        try:
            client = await self.client()
            await asyncio.wait_for(
                report_rejected(client, self.settings.task_queue, batch),
                self.webhook.webhook_temporal_timeout,
            )
        except (TemporalUnavailable, RPCError, TimeoutError, RuntimeError) as exc:
            for reason, n in counts.items():  # not lost: next round
                self.rejected[reason] = self.rejected.get(reason, 0) + n
                kept = self._rejected_examples.setdefault(reason, [])
                kept[:0] = examples.get(reason, [])
                del kept[REJECTED_EXAMPLES:]
            log.debug("could not report %d rejected alert(s) yet: %s", sum(counts.values()), exc)
            return 0
        return sum(counts.values())

    async def report_rejected_forever(self) -> None:
        while True:
            await asyncio.sleep(REJECTED_REPORT_SECONDS)
            try:
                await self.report_rejected()
            except Exception:
                log.exception("reporting rejected alerts failed; trying again")

    async def _await_group(
        self, waiting: list[tuple[list[MappedAlert], Delivery, bool]], out: Outcome
    ) -> None:
        """Await the deliveries `_enqueue` queued or joined for one workflow of this
        notification, and record each one's outcome for its alerts. Only the call that carried
        a key succeeding acknowledges it."""
        try:
            for same, d, own in waiting:
                try:
                    await asyncio.shield(d.call)
                except asyncio.CancelledError:
                    if not d.call.cancelled():
                        raise  # this notification's deadline: handle() reports it
                except Exception:
                    pass  # the call's error: recorded just below
                self._record(out, same, d, own)
        finally:
            for _same, d, _own in waiting:
                d.waiters -= 1

    def _record(self, out: Outcome, same: Sequence[MappedAlert], d: Delivery, own: bool) -> None:
        """Record the outcome of `d`'s finished call for this notification's alerts `same`
        (`own`: this notification queued it, so the first alert gets the call's result)."""
        call = d.call
        if call.cancelled():
            for a in same:  # dropped unsent, or cut off by shutdown
                self._failed(out, a, "temporal-unavailable", "delivery cancelled")
            return
        exc = call.exception()
        if isinstance(exc, RPCError):
            reason = "temporal-unavailable" if exc.status in _TRANSIENT else "temporal-error"
            detail = f"{exc.status.name if exc.status else ''}: {exc}"
            for a in same:
                self._failed(out, a, reason, detail)
        elif exc is not None:  # the SDK raises RuntimeError on a dropped connection
            log.warning("Temporal call for %s failed: %r", same[0].workflow_id, exc)
            for a in same:
                self._failed(out, a, "temporal-unavailable", repr(exc))
        elif own:
            self._accepted(out, same[:1], call.result())
            self._accepted(out, same[1:], None, via="notification")
        else:
            self._accepted(out, same, None, via="in-flight")

    def _enqueue(
        self, client: Client, group: Sequence[list[MappedAlert]], out: Outcome
    ) -> list[tuple[list[MappedAlert], Delivery, bool]]:
        """Queue this notification's new deliveries for one workflow (firing first), all at
        once (no await in here, so they land in the same call), and join the ones already on
        their way.

        Each entry of `group` is one delivery key with every alert of this notification that
        has it. A key Temporal accepted within the dedup window is answered from memory; a key
        already queued or in flight (any notification) is joined, not sent twice; the rest are
        queued on the workflow's lane together, so they go in one call.
        Returns (alerts, delivery, queued by this notification) to await."""
        recent = self.recent
        waiting: list[tuple[list[MappedAlert], Delivery, bool]] = []
        lane: Lane | None = None
        for same in group:
            m = same[0]
            key = m.delivery_key()
            if recent.recent(key):
                self._accepted(out, same, None, via="recent")
                continue
            d = recent.inflight.get(key)
            if d is not None and d.call.done():
                # It just ended (its done callback has not run yet): join a success, but never
                # a failed or dropped one, which the sender's retry must send again.
                if d.call.cancelled() or d.call.exception() is not None:
                    d = None
            own = d is None
            if d is None:
                if lane is None:
                    lane = self.lanes.setdefault(m.workflow_id, Lane())
                d = Delivery(key, m, asyncio.get_running_loop().create_future())
                recent.inflight[key] = d
                d.call.add_done_callback(functools.partial(self._delivery_done, d))
                lane.queued[key] = d
            d.waiters += 1
            waiting.append((same, d, own))
        if lane is not None and lane.task is None:
            lane.task = asyncio.ensure_future(self._drive(client, group[0][0].workflow_id, lane))
        return waiting

    async def _drive(self, client: Client, workflow_id: str, lane: Lane) -> None:
        """Send the lane's queued deliveries, one call at a time, until none are left."""
        batch: list[Delivery] = []
        try:
            while lane.queued:
                batch = list(lane.queued.values())
                lane.queued = {}
                await self._send(client, batch)
        finally:
            # No await since the loop saw the queue empty: nothing was queued meanwhile.
            for d in [*batch, *lane.queued.values()]:
                if not d.call.done():  # cancelled (shutdown) part-way
                    d.call.cancel()
            lane.queued = {}
            if self.lanes.get(workflow_id) is lane:
                del self.lanes[workflow_id]

    async def _send(self, client: Client, batch: list[Delivery]) -> None:
        """One call for the batch's firing deliveries (signal-with-start), then one signal per
        resolved delivery; each delivery's future gets its own outcome."""
        queued_at = time.perf_counter()
        # Waiting for a slot is where an overloaded server sheds load: a delivery whose every
        # notification gave up meanwhile is dropped unsent (the sender's retry queues it again).
        async with self._slots:
            live = []
            for d in batch:
                if d.waiters > 0:
                    live.append(d)
                else:
                    self.metrics.deliveries_dropped.inc()
                    d.call.cancel()
            firing = [d for d in live if d.alert.status == "firing"]
            if firing:
                self.metrics.call_alerts.observe(len(firing))
                try:
                    handled = await self._handled_before(client, firing[0].alert.workflow_id)
                    done = {h.key() for h in handled}
                    repeats = [d for d in firing if _instance(d.alert) in done]
                    fresh = [d for d in firing if _instance(d.alert) not in done]
                    result = (
                        await self._fire(client, [d.alert for d in fresh], handled)
                        if fresh
                        else None
                    )
                except Exception as exc:
                    for d in firing:
                        d.call.set_exception(exc)
                else:
                    if repeats:
                        self.metrics.workflows.labels(ALREADY_HANDLED).inc(len(repeats))
                    for d in repeats:
                        d.call.set_result(ALREADY_HANDLED)
                    if result is not None:
                        self.metrics.workflows.labels(result).inc()
                    for i, d in enumerate(fresh):  # the first one started it, if this did
                        d.call.set_result(result if i == 0 and result else "signalled")
                finally:
                    self.metrics.call_latency.observe(time.perf_counter() - queued_at)
            for d in live:
                if d.alert.status == "firing":
                    continue
                started = time.perf_counter()
                self.metrics.call_alerts.observe(1)
                try:
                    result = await self._resolve(client, d.alert)
                except Exception as exc:
                    d.call.set_exception(exc)
                else:
                    self.metrics.workflows.labels(result).inc()
                    d.call.set_result(result)
                finally:
                    self.metrics.call_latency.observe(time.perf_counter() - started)

    def _accepted(
        self, out: Outcome, alerts: Sequence[MappedAlert], result: str | None, via: str = ""
    ) -> None:
        """Record alerts Temporal has (`result`: this RPC's answer; None: a duplicate of a
        delivery that Temporal accepted, found `via` the notification, an in-flight call or
        the recent-delivery cache)."""
        for m in alerts:
            self.metrics.alerts_accepted.labels(m.status).inc()
            if result is None:
                self.metrics.alerts_deduplicated.labels(via).inc()
                out.result(m, DUPLICATE, via)
            else:
                out.result(m, result)

    def _queued(self, out: Outcome, alerts: Sequence[MappedAlert]) -> None:
        """Record alerts acknowledged through the spool: on disk, Temporal not told yet."""
        for m in alerts:
            out.result(m, QUEUED)

    # ------------------------------------------------------------------ spool ----------------

    async def _spool_waiting(
        self,
        waitings: list[list[tuple[list[MappedAlert], Delivery, bool]]],
        tasks: list[asyncio.Future[None]],
    ) -> set[DeliveryKey]:
        """The ack deadline passed: journal the deliveries this notification still waits for
        (flushed to disk) and keep them wanted until Temporal accepts them. Returns their keys;
        empty when nothing could be spooled (full, disk error): the notification then waits for
        Temporal as without a spool."""
        assert self.spool is not None
        todo: dict[DeliveryKey, Delivery] = {}
        for waiting, task in zip(waitings, tasks, strict=True):
            if task.done():
                continue
            for _same, d, _own in waiting:
                if not d.call.done():
                    todo[d.key] = d
        if not todo:
            return set()
        try:
            added = await asyncio.to_thread(self.spool.add, [d.alert for d in todo.values()])
        except SpoolFull as exc:
            self.metrics.spool_refused.labels(exc.reason).inc()
            log.warning("webhook spool full (%s): waiting for Temporal instead", exc)
            return set()
        except OSError as exc:
            self.metrics.spool_refused.labels("disk").inc()
            log.error(
                "webhook spool: cannot journal %d alert(s), waiting for Temporal instead: %s",
                len(todo),
                exc,
            )
            return set()
        self.metrics.spooled.inc(added)  # alerts another notification spooled count once
        for d in todo.values():
            self._hold(d)
        self.metrics.spool_pending.set(len(self.spool.pending))
        return set(todo)

    def _hold(self, d: Delivery) -> None:
        """The spool stands in for the notifications already answered: `d` stays wanted (never
        dropped unsent) until its call ends, and leaves the spool if Temporal accepted it."""
        if self._held.get(d.key) is d:
            return
        if d.call.done():
            self._spool_outcome(d, d.call)
            return
        self._held[d.key] = d
        d.waiters += 1
        d.call.add_done_callback(functools.partial(self._unhold, d))

    def _unhold(self, d: Delivery, call: asyncio.Future[str]) -> None:
        if self._held.get(d.key) is d:
            del self._held[d.key]
        d.waiters -= 1
        self._spool_outcome(d, call)

    def _spool_outcome(self, d: Delivery, call: asyncio.Future[str]) -> None:
        assert self.spool is not None
        if not call.cancelled():
            exc = call.exception()
            if exc is None:
                self._refusals.pop(d.key, None)
                self.spool.done(d.key)
            elif isinstance(exc, RPCError) and exc.status not in _TRANSIENT:
                refused = self._refusals[d.key] = self._refusals.get(d.key, 0) + 1
                if refused >= SPOOL_GIVE_UP:
                    log.error(
                        "webhook spool: Temporal refused alert %s for %s %d times (%s); "
                        "dropping it",
                        d.alert.fingerprint,
                        d.alert.workflow_id,
                        refused,
                        exc,
                    )
                    del self._refusals[d.key]
                    self.spool.done(d.key)
                    self.metrics.spool_given_up.inc()
        # Otherwise (failed, cancelled by shutdown) it stays for the next redelivery round.
        self.metrics.spool_pending.set(len(self.spool.pending))

    async def redeliver(self) -> int:
        """One round: send every spooled alert that has no call on its way (its call failed,
        or a previous process left it). Returns how many were sent."""
        assert self.spool is not None
        todo = [(k, m) for k, m in self.spool.pending.items() if k not in self._held]
        if not todo:
            return 0
        try:
            client = await self.client()
        except TemporalUnavailable as exc:
            now = time.monotonic()
            last = self._unreachable_logged
            if last is None or now - last >= SPOOL_WAIT_LOG_SECONDS:
                self._unreachable_logged = now
                log.warning(
                    "webhook spool: %d alert(s) wait for Temporal (trying every %g s; said "
                    "again every %g s while it lasts): %s",
                    len(todo),
                    self.webhook.webhook_spool_retry_seconds,
                    SPOOL_WAIT_LOG_SECONDS,
                    exc,
                )
            return 0
        if self._unreachable_logged is not None:
            self._unreachable_logged = None
            log.info("webhook spool: Temporal reachable again; sending %d alert(s)", len(todo))
        by_workflow: dict[str, list[list[MappedAlert]]] = {}
        for key, m in todo:
            if self.recent.recent(key):
                self.spool.done(key)
                continue
            by_workflow.setdefault(m.workflow_id, []).append([m])
        sent = 0
        for group in by_workflow.values():
            group.sort(key=lambda same: same[0].status != "firing")
            for _same, d, own in self._enqueue(client, group, Outcome()):
                self._hold(d)
                d.waiters -= 1  # _enqueue counted a waiter; the hold is the one that stays
                sent += own  # joining a call already on its way (being spooled) sends nothing
        self.metrics.spool_redelivered.inc(sent)
        self.metrics.spool_pending.set(len(self.spool.pending))
        return sent

    async def redeliver_forever(self) -> None:
        assert self.spool is not None
        while True:
            try:
                sent = await self.redeliver()
                if sent:
                    log.info("webhook spool: sent %d spooled alert(s) again", sent)
            except Exception:
                log.exception("webhook spool: redelivery round failed; trying again")
            await asyncio.sleep(self.webhook.webhook_spool_retry_seconds)

    def _delivery_done(self, d: Delivery, call: asyncio.Future[str]) -> None:
        if self.recent.inflight.get(d.key) is d:
            del self.recent.inflight[d.key]
        if call.cancelled():
            return
        # Retrieving the error marks it seen: the waiting requests reported it, or it came
        # after their deadline, when the sender is already retrying. A failure is never
        # remembered, so the retry sends again.
        if call.exception() is None and call.result() in CACHEABLE:
            self.recent.remember(d.key)

    async def drain(self, within: float) -> None:
        """On shutdown: let calls already queued or sent to Temporal finish, for a bounded
        time; what is left is cancelled (its senders get 503 and retry elsewhere)."""
        tasks = {lane.task for lane in self.lanes.values() if lane.task is not None}
        if tasks:
            _done, pending = await asyncio.wait(tasks, timeout=within)
            for task in pending:
                task.cancel()
            if pending:
                await asyncio.gather(*pending, return_exceptions=True)

    @property
    def _rpc_timeout(self) -> timedelta:
        # A call stuck on a half-dead connection must end (and its alerts be retried or
        # reported), not hold its workflow's lane until the connection's keepalive gives up.
        return timedelta(seconds=self.webhook.webhook_temporal_timeout)

    async def _handled_before(self, client: Client, workflow_id: str) -> list[HandledAlert]:
        """The alert instances the device's last run handled, when that run is closed (a
        running one de-duplicates its own evidence). Asked of Temporal, not of this process's
        memory, so every webhook replica and restart answers the same. A run that closed
        without a result (terminated, failed) lists nothing: its alerts may start a new one."""
        handle = client.get_workflow_handle(workflow_id)
        self.metrics.temporal_calls.labels("describe").inc()
        try:
            desc = await handle.describe(rpc_timeout=self._rpc_timeout)
        except RPCError as exc:
            if exc.status == RPCStatusCode.NOT_FOUND:  # never ran (or its history expired)
                return []
            raise
        if desc.status != WorkflowExecutionStatus.COMPLETED:
            return []
        last = client.get_workflow_handle(
            workflow_id, run_id=desc.run_id, result_type=RemediationResult
        )
        self.metrics.temporal_calls.labels("result").inc()
        result = await last.result(follow_runs=False, rpc_timeout=self._rpc_timeout)
        return list(result.handled_alerts)

    async def _fire(
        self,
        client: Client,
        alerts: Sequence[MappedAlert],
        handled: Sequence[HandledAlert] = (),
    ) -> str:
        """One signal-with-start carrying every firing alert in `alerts` (one workflow);
        `handled`: what the closed run before handled (a new run carries it on)."""
        m = alerts[0]
        assert all(a.evidence is not None for a in alerts)
        inp = RemediationInput(
            device=m.device,
            trigger="alert",
            requested_by="alertmanager",
            reason=m.evidence.summary or m.evidence.alertname if m.evidence else "",
            handled_before=list(handled),
            cluster=self.settings.cluster,
        )
        # Every firing delivery is a signal-with-start (USE_EXISTING): a plain signal would
        # fail if the run closed since the previous one, and costs the server the same.
        self.metrics.temporal_calls.labels("signal-with-start").inc()
        res = await signal_with_start(
            client,
            inp,
            task_queue=self.settings.task_queue,
            evidence_list=[a.evidence for a in alerts if a.evidence is not None],
            rpc_timeout=self._rpc_timeout,
        )
        return "started" if res.started else "signalled"

    async def _resolve(self, client: Client, m: MappedAlert) -> str:
        assert m.resolved is not None
        handle = client.get_workflow_handle(m.workflow_id)
        self.metrics.temporal_calls.labels("signal").inc()
        try:
            await handle.signal(SIG_ALERT_RESOLVED, m.resolved, rpc_timeout=self._rpc_timeout)
        except RPCError as exc:
            if exc.status == RPCStatusCode.NOT_FOUND:  # none, or already closed: nothing to do
                return "resolved-no-workflow"
            raise
        return "resolved-signalled"

    def _failed(self, out: Outcome, m: MappedAlert, reason: str, detail: str) -> None:
        self.metrics.alerts_rejected.labels(reason).inc()
        out.failed.append(
            {
                "index": m.index,
                "fingerprint": m.fingerprint,
                "workflow_id": m.workflow_id,
                "reason": reason,
                "detail": detail[:500],
            }
        )

    @staticmethod
    def _body(out: Outcome, payload: AmPayload, status: str) -> dict[str, Any]:
        return {
            "status": status,
            "group_key": payload.group_key,
            "received": len(payload.alerts),
            "accepted": len(out.results),
            "started": out.counts.get("started", 0),
            "signalled": out.counts.get("signalled", 0),
            "resolved_signalled": out.counts.get("resolved-signalled", 0),
            "resolved_no_workflow": out.counts.get("resolved-no-workflow", 0),
            "duplicates": out.counts.get(DUPLICATE, 0),
            "already_handled": out.counts.get(ALREADY_HANDLED, 0),
            "queued": out.counts.get(QUEUED, 0),
            "unmatched": sorted(out.unmatched, key=lambda u: u["index"]),
            "failed": sorted(out.failed, key=lambda f: f["index"]),
            "results": sorted(out.results, key=lambda r: r["index"]),
            "truncated_alerts": payload.truncated_alerts,
        }


# At most this many unusable alerts are spelled out per notification (the rest are counted).
UNMATCHED_LOG_EXAMPLES = 3


def _warn_unmatched(payload: AmPayload, unmatched: list[dict[str, Any]]) -> None:
    """Alerts Sickbay cannot use are said loudly: by reason, with examples."""
    by_reason: dict[str, list[dict[str, Any]]] = {}
    for u in sorted(unmatched, key=lambda u: u["index"]):
        by_reason.setdefault(u["reason"], []).append(u)
    for reason, items in sorted(by_reason.items()):
        examples = "; ".join(
            f"{u['alertname'] or '(no alertname)'} ({u['fingerprint']}): {u['detail']}"
            for u in items[:UNMATCHED_LOG_EXAMPLES]
        )
        more = len(items) - UNMATCHED_LOG_EXAMPLES
        log.warning(
            "notification %s: %d alert(s) not used, %s: %s%s",
            payload.group_key or "-",
            len(items),
            reason,
            examples,
            f" (+{more} more)" if more > 0 else "",
        )


def _unmapped_json(u: Unmapped) -> dict[str, Any]:
    return {
        "index": u.index,
        "alertname": u.alertname,
        "fingerprint": u.fingerprint,
        "status": u.status,
        "reason": u.reason,
        "detail": u.detail,
    }


# --------------------------------------------------------------------------------------------
# HTTP
# --------------------------------------------------------------------------------------------


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


class TokenSource:
    """The bearer token; a token file is re-read when it changes (a rotated Kubernetes Secret
    shows up in the mounted file without a restart). One stat() per request."""

    def __init__(self, webhook: WebhookSettings) -> None:
        self._webhook = webhook
        self._token = webhook.token_bytes()  # fail at start-up, not at the first alert
        self._stamp = self._file_stamp()

    def _file_stamp(self) -> tuple[int, int] | None:
        path = self._webhook.webhook_token_file
        if self._webhook.webhook_token is not None or path is None:
            return None
        try:
            st = path.stat()
        except OSError:
            return None
        return (st.st_mtime_ns, st.st_size)

    def current(self) -> bytes | None:
        stamp = self._file_stamp()
        if stamp is not None and stamp != self._stamp:
            try:
                self._token = self._webhook.token_bytes()
                self._stamp = stamp
                log.info("webhook token file changed; using the new token")
            except RuntimeError as exc:  # mid-write or emptied: keep the last good token
                log.warning("%s; keeping the previous token", exc)
        return self._token


# A wrong token is said at most once per this many seconds (Alertmanager retries every flush).
UNAUTHORIZED_LOG_SECONDS = 60.0


class _Unauthorized:
    """Logs refused notifications (401), rate-limited: the first at once, then at most one
    line per UNAUTHORIZED_LOG_SECONDS with how many were refused meanwhile. Never the token."""

    def __init__(self) -> None:
        self._last: float | None = None
        self._quiet = 0

    def note(self, request: Request) -> None:
        now = time.monotonic()
        if self._last is not None and now - self._last < UNAUTHORIZED_LOG_SECONDS:
            self._quiet += 1
            return
        header = request.headers.get("authorization", "")
        scheme = header.partition(" ")[0] or "no Authorization header"
        peer = request.client.host if request.client else "unknown"
        since = f" ({self._quiet} more since the last line)" if self._quiet else ""
        log.warning(
            "refused a notification from %s with 401: missing or wrong bearer token (%s); "
            "check the receiver's credentials_file%s",
            peer,
            scheme,
            since,
        )
        self._last, self._quiet = now, 0


def _authorized(request: Request, token: bytes | None) -> bool:
    if token is None:
        return True
    header = request.headers.get("authorization", "")
    scheme, _, given = header.partition(" ")
    if scheme.lower() != "bearer":
        return False
    # Headers arrive latin-1 decoded; compare bytes (compare_digest refuses non-ASCII str).
    return hmac.compare_digest(given.strip().encode("latin-1"), token)


def _problems(exc: ValidationError, limit: int = 50) -> list[dict[str, str]]:
    return [
        {
            "loc": ".".join(str(p) for p in err.get("loc", ())) or "(body)",
            "msg": str(err.get("msg", "")),
            "type": str(err.get("type", "")),
        }
        for err in exc.errors(include_url=False, include_context=False, include_input=False)[:limit]
    ]


async def _warn_without_worker(client: Client, settings: Settings) -> None:
    """Say so loudly when no worker of this cluster polls the queue alerts start work on."""
    from worker.cluster import missing_worker_warning

    try:
        warning = await asyncio.wait_for(  # a slow Temporal must not hold the start-up
            missing_worker_warning(client, settings.task_queue, settings.cluster), 5.0
        )
    except Exception as exc:  # a check only: never stops the webhook
        log.info("could not list the pollers of %s: %s", settings.task_queue, exc)
        return
    if warning is not None:
        log.warning("%s", warning)


def create_app(
    settings: Settings,
    temporal: Client | None = None,
    *,
    webhook: WebhookSettings | None = None,
) -> FastAPI:
    """The webhook app. `temporal` is a connected client (tests, embedding); without one the
    lifespan connects with `settings`, and requests retry the connection while it is down."""
    wh = webhook if webhook is not None else WebhookSettings()
    tokens = TokenSource(wh)
    if tokens.current() is None:
        log.warning("webhook authentication is DISABLED (SICKBAY_WEBHOOK_AUTH_DISABLED)")
    metrics = WebhookMetrics()
    service = AlertService(settings, wh, metrics, temporal)

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        app.state.service = service
        redelivery: asyncio.Task[None] | None = None
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
            await _warn_without_worker(client, settings)
        if service.spool is not None:
            redelivery = asyncio.ensure_future(service.redeliver_forever())
        reporting = asyncio.ensure_future(service.report_rejected_forever())
        try:
            yield
        finally:
            reporting.cancel()
            await asyncio.gather(reporting, return_exceptions=True)
            if redelivery is not None:
                redelivery.cancel()
                await asyncio.gather(redelivery, return_exceptions=True)
            await service.drain(wh.webhook_temporal_timeout)
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

    unauthorized = _Unauthorized()

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
            if not _authorized(request, tokens.current()):
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
            code, body = await service.handle(payload)
            return reply(code, body)
        finally:
            metrics.latency.observe(time.perf_counter() - started)

    @app.get("/healthz")
    async def healthz() -> JSONResponse:
        # Liveness: the process serves. Temporal's state is reported, not judged: restarting
        # the webhook would not bring Temporal back.
        body: dict[str, Any] = {"status": "ok", "temporal_connected": service.connected}
        if service.spool is not None:  # acknowledged alerts Temporal does not have yet
            body["spool_pending"] = len(service.spool.pending)
        return JSONResponse(body)

    @app.get("/metrics")
    async def prometheus_metrics() -> Response:
        return Response(generate_latest(metrics.registry), media_type=CONTENT_TYPE_LATEST)

    return app
