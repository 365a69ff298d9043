"""The time-scale clock.

Cases:
- at scale 60, one real second is a simulated minute (monotonic and now() agree);
- sleep(300) at scale 600 sleeps 0.5 real seconds;
- changing the scale at run time keeps simulated time continuous (no jump back or forward);
- a non-positive scale is refused; ManualClock only moves when advanced;
- Kubernetes timestamp formats round-trip through parse_time.
Real time is a stand-in the tests move, so nothing here depends on the machine's speed.
"""

from __future__ import annotations

import asyncio

import pytest

from twin import clock as clock_module
from twin.clock import Clock, ManualClock, parse_time, rfc3339, rfc3339_micro


class RealTime:
    """Stands in for the `time` and `asyncio` modules the clock reads: real seconds move only
    when a test says so, and sleeps are recorded instead of slept (no wall-clock bounds)."""

    def __init__(self) -> None:
        self.now = 1000.0
        self.slept: list[float] = []

    def monotonic(self) -> float:
        return self.now

    async def sleep(self, seconds: float) -> None:
        self.slept.append(seconds)


@pytest.fixture
def real(monkeypatch: pytest.MonkeyPatch) -> RealTime:
    fake = RealTime()
    monkeypatch.setattr(clock_module, "time", fake)
    monkeypatch.setattr(clock_module, "asyncio", fake)
    return fake


def test_scaled_time_runs_faster(real: RealTime) -> None:
    clock = Clock(time_scale=60)
    start_twin, start_now = clock.monotonic(), clock.now()
    real.now += 0.1
    assert clock.monotonic() - start_twin == pytest.approx(6.0)  # 0.1 real s = 6 simulated
    assert (clock.now() - start_now).total_seconds() == pytest.approx(6.0)
    assert clock.real_seconds(300) == 5.0


def test_sleep_is_scaled(real: RealTime) -> None:
    clock = Clock(time_scale=600)
    asyncio.run(clock.sleep(300))
    assert real.slept == [0.5]  # 300 simulated seconds are half a real one


def test_scale_change_is_continuous(real: RealTime) -> None:
    clock = Clock(time_scale=1000)
    real.now += 0.05
    before = clock.monotonic()
    assert before == pytest.approx(50.0)
    clock.set_time_scale(1)
    assert clock.monotonic() == before  # no jump
    real.now += 0.05
    assert clock.monotonic() == pytest.approx(before + 0.05)  # now at real speed
    with pytest.raises(ValueError, match="positive"):
        Clock(time_scale=0)


def test_manual_clock_and_formats() -> None:
    clock = ManualClock()
    t0 = clock.now()
    asyncio.run(clock.sleep(3600))
    assert clock.now() == t0
    clock.advance(90)
    assert (clock.now() - t0).total_seconds() == 90
    assert rfc3339(t0) == "2026-11-29T10:00:00Z"
    assert parse_time(rfc3339_micro(clock.now())) == clock.now()
    assert parse_time("2026-11-29T10:07:56Z") == parse_time("2026-11-29T10:07:56.000000Z")
