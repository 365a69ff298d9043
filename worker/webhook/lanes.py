"""One workflow id's lane: the deliveries (distinct alerts) queued for its next Temporal call,
and what a notification records about each of its alerts (`NotificationReport`)."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import Any

from temporalio.service import RPCStatusCode

from worker.alerts import MappedAlert

DeliveryKey = tuple[str, str, str, str]  # MappedAlert.delivery_key()


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


TRANSIENT = {
    RPCStatusCode.UNAVAILABLE,
    RPCStatusCode.DEADLINE_EXCEEDED,
    RPCStatusCode.RESOURCE_EXHAUSTED,
    RPCStatusCode.ABORTED,
    RPCStatusCode.CANCELLED,
    RPCStatusCode.INTERNAL,
    RPCStatusCode.UNKNOWN,
}


@dataclass
class NotificationReport:
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
