"""An Alertmanager stand-in: device faults become webhook notifications (payload version 4).

A real chain is dcgm-exporter -> Prometheus rule -> Alertmanager -> webhook. The twin skips the
middle: `faults.py` calls `AlertmanagerTwin.fire()` with the labels dcgm-exporter would put on
the series (`Hostname`, `gpu`, `UUID`, `modelName`, `pci_bus_id`, `device`, `err_code` = the
Xid, and `pod` / `namespace` / `container` of the consumer), and `resolve()` on recovery. The
notifier then behaves like Alertmanager's dispatcher with `send_resolved: true`:

- alerts are grouped by `group_by` labels (default `alertname`, `Hostname`);
- a new group is sent after `group_wait`; a changed group (new or resolved alerts) at the next
  `group_interval` tick; an unchanged firing group again every `repeat_interval`;
- a resolved alert is sent once with `status: resolved` and `endsAt`, then dropped;
- a failed POST is retried at the next tick, like Alertmanager's notification retries;
- the receiver gets `Authorization: Bearer <token>` when a token is configured (the token is
  never logged or kept in `sent`).

All intervals are simulated seconds on the twin's `Clock`, so `--time-scale 60` sends a
5-minute `group_interval` every 5 real seconds. `build_payload()` is the pure part: it turns a
group into the JSON body that Alertmanager would post.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

import httpx

from twin.clock import Clock, rfc3339_micro

log = logging.getLogger(__name__)

ZERO_TIME = "0001-01-01T00:00:00Z"  # Alertmanager's endsAt for a firing alert

# Alert names, as in the Prometheus rules that ship with Sickbay (worker/alerts.py accepts these).
ALERT_XID = "SickbayGpuXidError"
ALERT_FELL_OFF_BUS = "SickbayGpuFellOffBus"
ALERT_NVLINK = "SickbayGpuNvlinkErrors"
ALERT_ECC_DBE = "SickbayGpuEccDoubleBitError"
ALERT_ROW_REMAP = "SickbayGpuRowRemapFailure"


@dataclass(frozen=True)
class AlertConfig:
    """Where and how often to notify. `url=None` disables notifications (alerts still kept)."""

    url: str | None = None  # None: alerts are kept, nothing is sent until a URL is set
    token: str | None = field(default=None, repr=False)
    receiver: str = "sickbay"
    group_by: tuple[str, ...] = ("alertname", "Hostname")
    group_wait: float = 30.0  # Alertmanager's default
    group_interval: float = 300.0  # Alertmanager's default
    repeat_interval: float = 4 * 3600.0  # Alertmanager's default
    external_url: str = "http://alertmanager.sickbay-twin.invalid:9093"
    # Real seconds: a receiver that hangs must not stall the notifier for long.
    timeout: float = 5.0


def fingerprint(labels: dict[str, str]) -> str:
    """Prometheus' label-set fingerprint: FNV-1a 64 over sorted names and values."""
    value = 0xCBF29CE484222325
    for name in sorted(labels):
        for part in (name, labels[name]):
            for byte in part.encode() + b"\xff":
                value ^= byte
                value = (value * 0x100000001B3) & 0xFFFFFFFFFFFFFFFF
    return f"{value:016x}"


@dataclass
class Alert:
    labels: dict[str, str]
    annotations: dict[str, str]
    starts_at: datetime
    ends_at: datetime | None = None
    generator_url: str = "http://prometheus.sickbay-twin.invalid:9090/graph"

    @property
    def fingerprint(self) -> str:
        return fingerprint(self.labels)

    @property
    def status(self) -> str:
        return "resolved" if self.ends_at is not None else "firing"

    def to_json(self) -> dict[str, Any]:
        return {
            "status": self.status,
            "labels": dict(self.labels),
            "annotations": dict(self.annotations),
            "startsAt": rfc3339_micro(self.starts_at),
            "endsAt": rfc3339_micro(self.ends_at) if self.ends_at else ZERO_TIME,
            "generatorURL": self.generator_url,
            "fingerprint": self.fingerprint,
        }


def group_labels_of(labels: dict[str, str], group_by: Iterable[str]) -> dict[str, str]:
    return {k: labels[k] for k in group_by if k in labels}


def group_key(group_labels: dict[str, str]) -> str:
    """Alertmanager's key for a group under the root route: `{}:{a="x", b="y"}`."""
    inner = ", ".join(f'{k}="{group_labels[k]}"' for k in sorted(group_labels))
    return "{}:{" + inner + "}"


def _common(maps: list[dict[str, str]]) -> dict[str, str]:
    if not maps:
        return {}
    common = dict(maps[0])
    for other in maps[1:]:
        common = {k: v for k, v in common.items() if other.get(k) == v}
    return common


def build_payload(
    alerts: list[Alert], group_labels: dict[str, str], config: AlertConfig
) -> dict[str, Any]:
    """The webhook body (version 4) for one group, alerts ordered by their labels."""
    ordered = sorted(alerts, key=lambda a: sorted(a.labels.items()))
    firing = any(a.status == "firing" for a in ordered)
    return {
        "version": "4",
        "groupKey": group_key(group_labels),
        "truncatedAlerts": 0,
        "status": "firing" if firing else "resolved",
        "receiver": config.receiver,
        "groupLabels": dict(group_labels),
        "commonLabels": _common([a.labels for a in ordered]),
        "commonAnnotations": _common([a.annotations for a in ordered]),
        "externalURL": config.external_url,
        "alerts": [a.to_json() for a in ordered],
    }


@dataclass
class _Group:
    labels: dict[str, str]
    alerts: dict[str, Alert] = field(default_factory=dict)
    created: float = 0.0  # clock.monotonic() when the first alert arrived
    last_sent: float | None = None
    next_tick: float = 0.0
    dirty: bool = True


class AlertmanagerTwin:
    """Keeps alert groups and posts them to the configured receiver on Alertmanager's cadence."""

    def __init__(self, clock: Clock, config: AlertConfig | None = None) -> None:
        self.clock = clock
        self.config = config or AlertConfig()
        self._groups: dict[str, _Group] = {}
        self._lock = asyncio.Lock()
        # fire/resolve come from API threads while the notifier runs on the controller loop.
        self._state = threading.RLock()
        self.sent: list[dict[str, Any]] = []  # payloads posted (newest last, capped)
        self.failures = 0
        self._client: httpx.AsyncClient | None = None

    def configure(self, config: AlertConfig) -> None:
        self.config = config

    # -- alert state -------------------------------------------------------------------------

    def fire(self, labels: dict[str, str], annotations: dict[str, str]) -> str:
        """Start (or keep) a firing alert; returns its fingerprint."""
        with self._state:
            alert = Alert(dict(labels), dict(annotations), self.clock.now())
            key = group_key(group_labels_of(alert.labels, self.config.group_by))
            group = self._groups.get(key)
            if group is None:
                now = self.clock.monotonic()
                group = _Group(group_labels_of(alert.labels, self.config.group_by), created=now)
                group.next_tick = now + self.config.group_wait
                self._groups[key] = group
            existing = group.alerts.get(alert.fingerprint)
            if existing is not None and existing.ends_at is None:
                return alert.fingerprint
            group.alerts[alert.fingerprint] = alert
            group.dirty = True
            log.info("alert firing: %s %s", alert.labels.get("alertname"), alert.fingerprint)
            return alert.fingerprint

    def resolve(self, fingerprints: Iterable[str]) -> int:
        """Mark alerts resolved (sent once more with endsAt); returns how many changed."""
        with self._state:
            wanted = set(fingerprints)
            changed = 0
            for group in self._groups.values():
                for fp, alert in group.alerts.items():
                    if fp in wanted and alert.ends_at is None:
                        alert.ends_at = self.clock.now()
                        group.dirty = True
                        changed += 1
            return changed

    def active(self) -> list[dict[str, Any]]:
        """Alerts as Alertmanager's API would list them (firing and not yet sent resolved)."""
        with self._state:
            return [a.to_json() for g in self._groups.values() for a in g.alerts.values()]

    # -- notification ------------------------------------------------------------------------

    def due(self) -> list[tuple[str, dict[str, Any]]]:
        """Groups to send now, as (group key, payload). Pure with respect to I/O."""
        with self._state:
            now = self.clock.monotonic()
            out: list[tuple[str, dict[str, Any]]] = []
            for key, group in self._groups.items():
                if now < group.next_tick or not group.alerts:
                    continue
                repeat = (
                    group.last_sent is not None
                    and now - group.last_sent >= self.config.repeat_interval
                    and any(a.ends_at is None for a in group.alerts.values())
                )
                if group.dirty or repeat:
                    out.append(
                        (key, build_payload(list(group.alerts.values()), group.labels, self.config))
                    )
                else:
                    group.next_tick = now + self.config.group_interval
            return out

    def mark_sent(self, key: str, payload: dict[str, Any]) -> None:
        with self._state:
            group = self._groups.get(key)
            if group is None:
                return
            now = self.clock.monotonic()
            group.last_sent = now
            group.next_tick = now + self.config.group_interval
            sent = {a["fingerprint"] for a in payload["alerts"] if a["status"] == "resolved"}
            for fp in sent:
                alert = group.alerts.get(fp)
                if alert is not None and alert.ends_at is not None:
                    del group.alerts[fp]
            # Dirty again only if something changed after this payload was built.
            seen = {(a["fingerprint"], a["status"]) for a in payload["alerts"]}
            group.dirty = any((fp, a.status) not in seen for fp, a in group.alerts.items())
            if not group.alerts:
                del self._groups[key]
            self.sent.append(payload)
            del self.sent[:-200]

    async def flush(self) -> int:
        """Send every due group once; returns how many posts succeeded."""
        ok = 0
        if self.config.url is None:
            return 0  # no receiver yet: groups wait, and go out once one is configured
        for key, payload in self.due():
            if await self._post(payload):
                self.mark_sent(key, payload)
                ok += 1
            else:
                with self._state:
                    self.failures += 1
                    group = self._groups.get(key)
                    if group is not None:  # retry at the next tick, not in a tight loop
                        group.next_tick = self.clock.monotonic() + min(10.0, self.config.group_wait)
        return ok

    async def _post(self, payload: dict[str, Any]) -> bool:
        assert self.config.url is not None
        headers = {"Content-Type": "application/json", "User-Agent": "Alertmanager/0.28.1"}
        if self.config.token:
            headers["Authorization"] = f"Bearer {self.config.token}"
        if self._client is None:
            self._client = httpx.AsyncClient(timeout=self.config.timeout)
        try:
            response = await self._client.post(self.config.url, json=payload, headers=headers)
        except httpx.HTTPError as err:
            log.warning("alert webhook %s unreachable: %s", self.config.url, type(err).__name__)
            return False
        if response.status_code >= 300:
            log.warning("alert webhook %s answered %s", self.config.url, response.status_code)
            return False
        log.info("alert group %s sent (%s)", payload["groupKey"], payload["status"])
        return True

    async def run(self, stop: asyncio.Event | None = None) -> None:
        """Notify until cancelled or `stop` is set. Ticks every simulated second."""
        try:
            while stop is None or not stop.is_set():
                async with self._lock:
                    try:
                        await self.flush()
                    except Exception:  # keep notifying: one bad group must not stop the rest
                        log.exception("alert notification failed")
                # At least 20 ms real between ticks so a huge time scale does not spin.
                await asyncio.sleep(max(0.02, self.clock.real_seconds(1.0)))
        finally:
            await self.aclose()

    async def aclose(self) -> None:
        if self._client is not None:
            with contextlib.suppress(Exception):
                await self._client.aclose()
            self._client = None
