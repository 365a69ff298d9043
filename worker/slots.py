"""The worker's activity slots: long waits never take the slots of the short calls.

A remediation holds one long activity at a time while its GPU's pods leave and their
replacement starts: the eviction and replacement watches, evict-pods (a PodDisruptionBudget may
refuse it for minutes), a capacity request the pool scaler holds, a maintenance drain's wait
for its remediations. With one pool of `max_concurrent_activities` slots, enough quarantined
GPUs with consumers hold every slot for minutes, and everything else a worker runs — a refused
GPU's page, a repair rung, a verified action's check — queues behind them.

`WaitAwareSlots` keeps two counts behind one activity slot supplier of the SDK (a task's type is
known only once it is polled, so a slot is reserved first and counted as a wait when the task
turns out to be one): the short calls get `regular` slots that waits never take; waits get up
to `waits` more. A wait polled while the waits are full still runs (it was polled) and takes a
regular slot's place until one ends, so the worker never holds more than `regular + waits`.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import Collection

from temporalio.worker import (
    CustomSlotSupplier,
    FixedSizeSlotSupplier,
    SlotMarkUsedContext,
    SlotPermit,
    SlotReleaseContext,
    SlotReserveContext,
    WorkerTuner,
)

from contract.capacity import REQUEST_CAPACITY
from contract.kube import EVICT_PODS, WAIT_FOR_EVICTION, WAIT_FOR_REPLACEMENT
from contract.maintenance import AWAIT_REMEDIATION_PHASE

# Activities that may stay open for minutes; each has a heartbeat timeout.
LONG_WAITS: frozenset[str] = frozenset(
    a.name
    for a in (
        EVICT_PODS,
        WAIT_FOR_EVICTION,
        WAIT_FOR_REPLACEMENT,
        REQUEST_CAPACITY,
        AWAIT_REMEDIATION_PHASE,
    )
)


class _Permit(SlotPermit):
    """One reserved slot; `wait`: the task it carries is a long wait."""

    def __init__(self) -> None:
        self.used = False
        self.wait = False
        self.released = False


class WaitAwareSlots(CustomSlotSupplier):
    """Activity slots: `regular` for short calls, and up to `waits` more for `long_waits`.

    The SDK may call `mark_slot_used` and `release_slot` from threads of its own, so the counts
    are under a lock and a blocked `reserve_slot` is woken on its own event loop."""

    def __init__(self, regular: int, waits: int, long_waits: Collection[str] = LONG_WAITS):
        if regular < 1 or waits < 0:
            raise ValueError(f"slots: regular {regular} must be >= 1 and waits {waits} >= 0")
        self.regular = regular
        self.waits = waits
        self._long = frozenset(long_waits)
        self._lock = threading.Lock()
        self._unused = 0  # reserved, no task yet (a poll in progress)
        self._short = 0  # carrying a short call
        self._waiting = 0  # carrying a long wait
        self._sleepers: list[tuple[asyncio.AbstractEventLoop, asyncio.Future[None]]] = []

    # -- what the counts say ---------------------------------------------------------------

    @property
    def in_use(self) -> tuple[int, int, int]:
        """(short calls, long waits, reserved for a poll)."""
        with self._lock:
            return self._short, self._waiting, self._unused

    def _free(self) -> bool:
        # A wait beyond `waits` takes a regular slot's place; the reserved ones may turn out
        # to be short calls, so they count as such until their task is known.
        over = max(0, self._waiting - self.waits)
        return self._short + over + self._unused < self.regular

    def _take(self) -> _Permit | None:
        with self._lock:
            if not self._free():
                return None
            self._unused += 1
            return _Permit()

    def _wake(self) -> None:
        with self._lock:
            sleepers, self._sleepers = self._sleepers, []
        for loop, fut in sleepers:
            # A loop already closed (the worker stopped) has nobody left to wake.
            with contextlib.suppress(RuntimeError):
                loop.call_soon_threadsafe(_settle, fut)

    # -- the SDK's supplier ------------------------------------------------------------------

    async def reserve_slot(self, ctx: SlotReserveContext) -> SlotPermit:
        loop = asyncio.get_running_loop()
        while True:
            permit = self._take()
            if permit is not None:
                return permit
            fut: asyncio.Future[None] = loop.create_future()
            with self._lock:
                if self._free():  # freed between the look and the sleep
                    continue
                self._sleepers.append((loop, fut))
            await fut

    def try_reserve_slot(self, ctx: SlotReserveContext) -> SlotPermit | None:
        return self._take()

    def mark_slot_used(self, ctx: SlotMarkUsedContext) -> None:
        permit = ctx.permit
        if not isinstance(permit, _Permit):
            return
        wait = getattr(ctx.slot_info, "activity_type", "") in self._long
        with self._lock:
            if permit.used or permit.released:
                return
            permit.used, permit.wait = True, wait
            self._unused -= 1
            if wait:
                self._waiting += 1
            else:
                self._short += 1
        if wait:
            self._wake()  # its slot is not a short call's any more

    def release_slot(self, ctx: SlotReleaseContext) -> None:
        permit = ctx.permit
        if not isinstance(permit, _Permit):
            return
        with self._lock:
            if permit.released:
                return
            permit.released = True
            if not permit.used:
                self._unused -= 1
            elif permit.wait:
                self._waiting -= 1
            else:
                self._short -= 1
        self._wake()


def _settle(fut: asyncio.Future[None]) -> None:
    if not fut.done():
        fut.set_result(None)


def tuner(
    *,
    workflow_tasks: int,
    activities: int,
    open_waits: int,
    local_activities: int,
) -> WorkerTuner:
    """The main worker's slots: fixed for workflow tasks and local activities (the hot path);
    for activities, `activities` short calls beside up to `open_waits` long waits."""
    return WorkerTuner.create_composite(
        workflow_supplier=FixedSizeSlotSupplier(workflow_tasks),
        activity_supplier=WaitAwareSlots(activities, open_waits),
        local_activity_supplier=FixedSizeSlotSupplier(local_activities),
        nexus_supplier=FixedSizeSlotSupplier(1),
    )
