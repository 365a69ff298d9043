"""Waiting for a condition instead of sleeping a fixed time.

A test that sleeps "long enough" for something to happen is slow when the machine is idle and
flaky when it is busy; `until` returns as soon as the condition holds and fails with what was
awaited when it does not within `within` real seconds.
"""

from __future__ import annotations

import asyncio
import inspect
import time
from collections.abc import Awaitable, Callable
from typing import TypeVar

T = TypeVar("T")

# Real seconds to wait before failing: generous for a shared 2-CPU machine.
WAIT = 30.0
# Real seconds between two looks: the poll interval of the wait, not a wait for anything.
EVERY = 0.05


async def until(
    check: Callable[[], T | Awaitable[T]],
    what: str = "",
    within: float = WAIT,
    every: float = EVERY,
) -> T:
    """Call `check` (a function, or a coroutine function) until it returns something truthy;
    return that. An AssertionError after `within` s names `what` (or the check)."""
    deadline = time.monotonic() + within
    while True:
        got = check()
        if inspect.isawaitable(got):
            got = await got
        if got:
            return got  # type: ignore[return-value]
        assert time.monotonic() < deadline, (
            f"{what or getattr(check, '__name__', check)} not reached within {within:.0f} s"
        )
        await asyncio.sleep(every)
