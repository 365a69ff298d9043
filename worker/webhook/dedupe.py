"""Deliveries Temporal accepted recently, and the ones in flight (single-flight per delivery key)."""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Callable

from worker.webhook.lanes import Delivery, DeliveryKey


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
