"""The webhook's delivery spool, coordinated with the lanes (`SpoolDelivery`, a base of
`AlertService`).

Past the ack deadline a notification's deliveries still on their way are journaled to the spool
(worker/spool.py, flushed to disk) and acknowledged as `queued`; the spool keeps each one wanted
(a waiter) until its call ends and forgets it once Temporal accepted it. Redelivery rounds send
every spooled alert with no call on its way (its call failed, or a previous process left it);
one Temporal keeps refusing for a non-transient reason is dropped after SPOOL_GIVE_UP tries.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import time
from collections.abc import Sequence

from temporalio.client import Client
from temporalio.service import RPCError

from worker.alerts import MappedAlert
from worker.settings import WebhookSettings
from worker.spool import Spool, SpoolFull
from worker.webhook.dedupe import RecentDeliveries
from worker.webhook.lanes import (
    TRANSIENT,
    Delivery,
    DeliveryKey,
    NotificationReport,
    TemporalUnavailable,
)
from worker.webhook.metrics import WebhookMetrics

log = logging.getLogger(__name__)

# A spooled alert Temporal refuses this many times for a non-transient reason (e.g. invalid
# argument) is dropped with an ERROR log; transient failures (Temporal down) retry forever.
SPOOL_GIVE_UP = 5
# While Temporal stays unreachable, the redelivery rounds (every few seconds) say so at most
# this often; the first round that reaches it again says so once.
SPOOL_WAIT_LOG_SECONDS = 60.0


class SpoolDelivery:
    """The spool side of `AlertService`: journal, hold, forget, redeliver."""

    # Set up by AlertService.__init__ (the spool is opened by the app's lifespan).
    spool: Spool | None
    webhook: WebhookSettings
    metrics: WebhookMetrics
    recent: RecentDeliveries
    _held: dict[DeliveryKey, Delivery]
    _refusals: dict[DeliveryKey, int]
    _unreachable_logged: float | None  # monotonic time of the last "waiting" warning

    async def client(self) -> Client:
        raise NotImplementedError  # AlertService.client

    def _enqueue(
        self, client: Client, group: Sequence[list[MappedAlert]], out: NotificationReport
    ) -> list[tuple[list[MappedAlert], Delivery, bool]]:
        raise NotImplementedError  # AlertService._enqueue

    async def _spool_waiting(
        self,
        waitings: list[list[tuple[list[MappedAlert], Delivery, bool]]],
        tasks: list[asyncio.Future[None]],
    ) -> set[DeliveryKey]:
        """The ack deadline passed: journal the deliveries this notification still waits for
        (flushed to disk) and keep them wanted until Temporal accepts them. Returns their keys;
        empty when nothing could be spooled (full, disk error): the notification then waits for
        Temporal as without a spool."""
        assert self.spool is not None
        todo: dict[DeliveryKey, Delivery] = {}
        for waiting, task in zip(waitings, tasks, strict=True):
            if task.done():
                continue
            for _same, d, _own in waiting:
                if not d.call.done():
                    todo[d.key] = d
        if not todo:
            return set()
        try:
            added = await asyncio.to_thread(self.spool.add, [d.alert for d in todo.values()])
        except SpoolFull as exc:
            self.metrics.spool_refused.labels(exc.reason).inc()
            log.warning("webhook spool full (%s): waiting for Temporal instead", exc)
            return set()
        except OSError as exc:
            self.metrics.spool_refused.labels("disk").inc()
            log.error(
                "webhook spool: cannot journal %d alert(s), waiting for Temporal instead: %s",
                len(todo),
                exc,
            )
            return set()
        self.metrics.spooled.inc(added)  # alerts another notification spooled count once
        for d in todo.values():
            self._hold(d)
        self.metrics.spool_pending.set(len(self.spool.pending))
        return set(todo)

    def _hold(self, d: Delivery) -> None:
        """The spool stands in for the notifications already answered: `d` stays wanted (never
        dropped unsent) until its call ends, and leaves the spool if Temporal accepted it."""
        if self._held.get(d.key) is d:
            return
        if d.call.done():
            self._spool_outcome(d, d.call)
            return
        self._held[d.key] = d
        d.waiters += 1
        d.call.add_done_callback(functools.partial(self._unhold, d))

    def _unhold(self, d: Delivery, call: asyncio.Future[str]) -> None:
        if self._held.get(d.key) is d:
            del self._held[d.key]
        d.waiters -= 1
        self._spool_outcome(d, call)

    def _spool_outcome(self, d: Delivery, call: asyncio.Future[str]) -> None:
        assert self.spool is not None
        if not call.cancelled():
            exc = call.exception()
            if exc is None:
                self._refusals.pop(d.key, None)
                self.spool.done(d.key)
            elif isinstance(exc, RPCError) and exc.status not in TRANSIENT:
                refused = self._refusals[d.key] = self._refusals.get(d.key, 0) + 1
                if refused >= SPOOL_GIVE_UP:
                    log.error(
                        "webhook spool: Temporal refused alert %s for %s %d times (%s); "
                        "dropping it",
                        d.alert.fingerprint,
                        d.alert.workflow_id,
                        refused,
                        exc,
                    )
                    del self._refusals[d.key]
                    self.spool.done(d.key)
                    self.metrics.spool_given_up.inc()
        # Otherwise (failed, cancelled by shutdown) it stays for the next redelivery round.
        self.metrics.spool_pending.set(len(self.spool.pending))

    async def redeliver(self) -> int:
        """One round: send every spooled alert that has no call on its way (its call failed,
        or a previous process left it). Returns how many were sent."""
        assert self.spool is not None
        todo = [(k, m) for k, m in self.spool.pending.items() if k not in self._held]
        if not todo:
            return 0
        try:
            client = await self.client()
        except TemporalUnavailable as exc:
            now = time.monotonic()
            last = self._unreachable_logged
            if last is None or now - last >= SPOOL_WAIT_LOG_SECONDS:
                self._unreachable_logged = now
                log.warning(
                    "webhook spool: %d alert(s) wait for Temporal (trying every %g s; said "
                    "again every %g s while it lasts): %s",
                    len(todo),
                    self.webhook.webhook_spool_retry_seconds,
                    SPOOL_WAIT_LOG_SECONDS,
                    exc,
                )
            return 0
        if self._unreachable_logged is not None:
            self._unreachable_logged = None
            log.info("webhook spool: Temporal reachable again; sending %d alert(s)", len(todo))
        by_workflow: dict[str, list[list[MappedAlert]]] = {}
        for key, m in todo:
            if self.recent.recent(key):
                self.spool.done(key)
                continue
            by_workflow.setdefault(m.workflow_id, []).append([m])
        sent = 0
        for group in by_workflow.values():
            group.sort(key=lambda same: same[0].status != "firing")
            for _same, d, own in self._enqueue(client, group, NotificationReport()):
                self._hold(d)
                d.waiters -= 1  # _enqueue counted a waiter; the hold is the one that stays
                sent += own  # joining a call already on its way (being spooled) sends nothing
        self.metrics.spool_redelivered.inc(sent)
        self.metrics.spool_pending.set(len(self.spool.pending))
        return sent

    async def redeliver_forever(self) -> None:
        assert self.spool is not None
        while True:
            try:
                sent = await self.redeliver()
                if sent:
                    log.info("webhook spool: sent %d spooled alert(s) again", sent)
            except Exception:
                log.exception("webhook spool: redelivery round failed; trying again")
            await asyncio.sleep(self.webhook.webhook_spool_retry_seconds)
