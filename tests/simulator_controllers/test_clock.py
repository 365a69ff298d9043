"""The time-scale clock.

Cases:
- at scale 60, one real second is a simulated minute (monotonic and now() agree);
- sleep(300) at scale 600 returns after about 0.5 real seconds;
- changing the scale at run time keeps simulated time continuous (no jump back or forward);
- a non-positive scale is refused; ManualClock only moves when advanced;
- Kubernetes timestamp formats round-trip through parse_time.
"""

from __future__ import annotations

import asyncio
import time

import pytest

from simulator.clock import Clock, ManualClock, parse_time, rfc3339, rfc3339_micro


def test_scaled_time_runs_faster() -> None:
    clock = Clock(time_scale=60)
    start_sim, start_now, start_real = clock.monotonic(), clock.now(), time.monotonic()
    time.sleep(0.1)
    real = time.monotonic() - start_real
    elapsed = clock.monotonic() - start_sim
    assert 60 * real * 0.8 <= elapsed <= 60 * real * 1.2
    assert abs((clock.now() - start_now).total_seconds() - elapsed) < 1.0
    assert clock.real_seconds(300) == 5.0


def test_sleep_is_scaled() -> None:
    clock = Clock(time_scale=600)
    start = time.monotonic()
    asyncio.run(clock.sleep(300))
    assert 0.45 <= time.monotonic() - start < 1.5


def test_scale_change_is_continuous() -> None:
    clock = Clock(time_scale=1000)
    time.sleep(0.05)
    before = clock.monotonic()
    clock.set_time_scale(1)
    after = clock.monotonic()
    assert 0 <= after - before < 1.0  # no jump
    time.sleep(0.05)
    assert clock.monotonic() - after < 1.0  # now at real speed
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
