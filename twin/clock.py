"""Simulated time for the cluster twin: a clock with a time-scale factor.

`sickbay-dev twin up --time-scale 60` makes one real second count as sixty simulated seconds, so a
5-minute grace period or node provisioning delay passes in 5 s. Every controller, fault and
alert timer in the twin reads time from one `Clock` and sleeps through it; nothing in the
twin calls `time.time()` or `asyncio.sleep()` for simulated durations directly.

Python API:

    clock = Clock(time_scale=60)
    clock.now()              # aware UTC datetime, simulated
    clock.monotonic()        # simulated seconds since the clock started (never goes back)
    await clock.sleep(300)   # returns after 300 simulated seconds (5 real seconds at 60x)
    clock.real_seconds(300)  # 5.0: how long 300 simulated seconds take in real time
    clock.set_time_scale(1)  # change the factor at run time; simulated time stays continuous

`ManualClock` has the same interface but only moves when told (`advance(seconds)`); unit tests
use it to step controllers through grace periods without waiting.
"""

from __future__ import annotations

import asyncio
import threading
import time
from datetime import UTC, datetime, timedelta

# Below this many real seconds a sleep is just a yield: timers shorter than the event loop's
# resolution would otherwise spin.
_MIN_REAL_SLEEP = 0.0


class Clock:
    """Simulated wall and monotonic time running `time_scale` times faster than real time."""

    def __init__(self, time_scale: float = 1.0, start: datetime | None = None) -> None:
        if time_scale <= 0:
            raise ValueError(f"time scale must be positive, got {time_scale}")
        self._lock = threading.Lock()
        self._scale = float(time_scale)
        self._origin_wall = start or datetime.now(UTC)
        self._origin_real = time.monotonic()
        self._origin_twin = 0.0  # simulated seconds elapsed at _origin_real

    @property
    def time_scale(self) -> float:
        return self._scale

    def set_time_scale(self, time_scale: float) -> None:
        """Change the factor without a jump: simulated time continues from where it is."""
        if time_scale <= 0:
            raise ValueError(f"time scale must be positive, got {time_scale}")
        with self._lock:
            now_real = time.monotonic()
            self._origin_twin += (now_real - self._origin_real) * self._scale
            self._origin_real = now_real
            self._scale = float(time_scale)

    def monotonic(self) -> float:
        """Simulated seconds since the clock started."""
        with self._lock:
            return self._origin_twin + (time.monotonic() - self._origin_real) * self._scale

    def now(self) -> datetime:
        """Simulated time of day (aware, UTC)."""
        return self._origin_wall + timedelta(seconds=self.monotonic())

    def real_seconds(self, simulated_seconds: float) -> float:
        """Real seconds that `simulated_seconds` take at the current factor."""
        return max(0.0, simulated_seconds) / self._scale

    async def sleep(self, simulated_seconds: float) -> None:
        """Sleep for a simulated duration (0 or less just yields to the loop)."""
        await asyncio.sleep(max(_MIN_REAL_SLEEP, self.real_seconds(simulated_seconds)))

    def sleep_sync(self, simulated_seconds: float) -> None:
        """Blocking sleep for threads that are not on an event loop."""
        time.sleep(self.real_seconds(simulated_seconds))


class ManualClock(Clock):
    """A clock that stands still until `advance()`; `sleep()` only yields. For unit tests."""

    def __init__(self, start: datetime | None = None) -> None:
        super().__init__(time_scale=1.0, start=start or datetime(2026, 11, 29, 10, 0, tzinfo=UTC))
        self._elapsed = 0.0

    def set_time_scale(self, time_scale: float) -> None:
        raise TypeError("a ManualClock has no time scale; use advance()")

    def monotonic(self) -> float:
        return self._elapsed

    def advance(self, seconds: float) -> None:
        if seconds < 0:
            raise ValueError("time only moves forward")
        self._elapsed += seconds

    def real_seconds(self, simulated_seconds: float) -> float:
        return 0.0

    async def sleep(self, simulated_seconds: float) -> None:
        await asyncio.sleep(0)

    def sleep_sync(self, simulated_seconds: float) -> None:
        return None


def rfc3339(moment: datetime) -> str:
    """Kubernetes timestamp form: second precision, `Z` suffix (metadata timestamps)."""
    return moment.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def rfc3339_micro(moment: datetime) -> str:
    """MicroTime form used by events.k8s.io eventTime: `2026-11-29T10:07:56.773011Z`."""
    return moment.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def parse_time(value: str) -> datetime:
    """Parse a Kubernetes timestamp (`...Z`, with or without fraction)."""
    text = value.strip()
    if text.endswith("Z"):
        text = text[:-1] + "+00:00"
    return datetime.fromisoformat(text)
