"""Heartbeat while a block runs: for activities that wait on one long call (a cloud request,
a Temporal update), so a worker that dies meanwhile is noticed within the heartbeat timeout."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator

from temporalio import activity

from contract.failover import PROVIDER_BEAT

# How often an activity waiting on one provider call heartbeats, in seconds
# (contract/failover.py: the workflows' heartbeat timeout for such a call is three of them).
HEARTBEAT_EVERY = PROVIDER_BEAT.total_seconds()


@contextlib.asynccontextmanager
async def heartbeating(every: float) -> AsyncIterator[None]:
    """Heartbeat now and every `every` seconds until the block ends (nothing outside an
    activity, e.g. a provider called directly in a test)."""
    if not activity.in_activity():
        yield
        return

    async def beat() -> None:
        while True:
            activity.heartbeat()
            await asyncio.sleep(every)

    task = asyncio.create_task(beat())
    try:
        yield
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
