"""One workflow id's lane: the deliveries (distinct alerts) queued for its next Temporal call."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field

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
