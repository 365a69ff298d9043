"""The service behind the webhook's route: one notification's alerts to Temporal calls.

At most one Temporal call per *workflow* at a time, and one per *distinct* alert at most.
A delivery is identified by
(workflow id, status, fingerprint, startsAt): Alertmanager repeats an alert with the same
fingerprint and startsAt for as long as it fires, and a re-fire after resolution gets a new
startsAt. For each delivery key:

    accepted by Temporal <= SICKBAY_WEBHOOK_DEDUP_SECONDS ago (60 s)  -> acknowledged, no call
    queued or being delivered (any notification)      -> await that delivery, share its outcome
    otherwise                                         -> queued on its workflow's lane
and identical alerts inside one notification are one delivery. Each workflow id has a lane:
one call in flight at a time; deliveries arriving meanwhile (from this or any other
notification) wait and go together as ONE call when it finishes, so a storm costs about one
call per workflow per call time, not one per distinct alert. A lane's call sends every queued
firing delivery as one signal-with-start (`alert` for one, `alerts` with the list for more),
then the queued resolved ones as `alert-resolved` signals (firing first, so a resolved alert
finds the workflow its firing one started). Only a call Temporal accepted
is remembered (bounded: DEDUP_ENTRIES, oldest dropped first); a failed call
fails every alert waiting on it (503), and the sender's retry calls again. Skipping a repeat is
safe because the workflow de-duplicates evidence by fingerprint anyway; the window is
measured from acceptance (a hit does not extend it), so an alert that keeps firing reaches
Temporal again at least once per window. A lane's signal-with-start may not start a run after
a *completed* one (reuse policy ALLOW_DUPLICATE_FAILED_ONLY, decided by the server): a running
run is signalled, no run or a failed/terminated one starts a run, and after a completed run
the server refuses. Only then does the lane ask Temporal which alert instances (fingerprint +
startsAt) that run handled (describe + its result): those are answered `already-handled` and
start nothing, the rest go in a second signal-with-start that may start, so a repeat never
restarts a closed remediation, whichever replica or restart receives it, and a storm against
running runs costs one call per lane call, not two.

With a delivery spool (SICKBAY_WEBHOOK_SPOOL_DIR, worker/spool.py), a notification waits for
Temporal at most SICKBAY_WEBHOOK_ACK_SECONDS: the deliveries still on their way then are
journaled to disk (fsync) and acknowledged as `queued`; the spool keeps them wanted until
Temporal accepts them and sends failed ones again, also after a restart. Without one:
a POST is acknowledged (200) only when Temporal accepted every one of its alerts; a failed
call fails every delivery it carried (503/502 as above), and a queued delivery whose every
waiting notification gave up (deadline) before its call took a slot is dropped unsent, so an
overloaded server is not sent work nobody waits for (the sender's retry queues it again).
Per-alert work is small (pydantic parse, a dict lookup); calls of different workflows run
concurrently, bounded process-wide by `webhook_concurrency`, over one shared client.
"""

from __future__ import annotations

import asyncio
import dataclasses
import functools
import logging
import time
from collections.abc import Sequence
from datetime import UTC, datetime, timedelta
from typing import Any

from temporalio.client import Client
from temporalio.common import WorkflowIDReusePolicy
from temporalio.exceptions import WorkflowAlreadyStartedError
from temporalio.service import RPCError, RPCStatusCode

from activities.launch import closed_run_handled, report_rejected, signal_with_start
from contract.names import SIG_ALERT_RESOLVED
from contract.notify import RejectedAlerts
from contract.remediation import HandledAlert, RemediationInput, already_handled
from worker.alerts import AmPayload, MappedAlert, Unmapped, map_alert
from worker.settings import Settings, WebhookSettings
from worker.spool import Spool
from worker.temporal import connect, ensure_search_attributes
from worker.webhook.dedupe import RecentDeliveries
from worker.webhook.delivery import SpoolDelivery
from worker.webhook.lanes import (
    TRANSIENT,
    Delivery,
    DeliveryKey,
    Lane,
    NotificationReport,
    TemporalUnavailable,
)
from worker.webhook.metrics import WebhookMetrics

log = logging.getLogger(__name__)

DUPLICATE = "duplicate"  # result of an alert acknowledged through an identical delivery
QUEUED = "queued"  # result of an alert acknowledged through the spool (worker/spool.py)
# Result of a firing alert whose instance (fingerprint + startsAt) the device's last, closed
# run already handled: no new run, no page, no quarantine (decided from that run's result).
ALREADY_HANDLED = "already-handled"
# Results worth remembering: Temporal recorded the alert. "resolved-no-workflow" is not: a
# workflow may start in the meantime, and asking again is cheap.
CACHEABLE = frozenset({"started", "signalled", "resolved-signalled", ALREADY_HANDLED})


# Unusable alerts go to the rejections workflow (for `sickbay status`) this often, as one
# signal per webhook process whatever their number; a few examples per reason travel along.
# Remembered deliveries at most (~0.5 KB each): the oldest go first.
DEDUP_ENTRIES = 50_000
REJECTED_REPORT_SECONDS = 5.0
REJECTED_EXAMPLES = 5


def _repeat(m: MappedAlert, handled: list[HandledAlert]) -> str:
    """Why a firing alert is a repeat of what the closed run handled ("": it is not)."""
    return already_handled(m.evidence, handled) if m.evidence is not None else ""


class AlertService(SpoolDelivery):
    def __init__(
        self,
        settings: Settings,
        webhook: WebhookSettings,
        metrics: WebhookMetrics,
        client: Client | None,
    ) -> None:
        self.settings = settings
        self.webhook = webhook
        self.mapping = dataclasses.replace(webhook.mapping(), cluster=settings.cluster)
        self.metrics = metrics
        self._client = client
        self._lock = asyncio.Lock()
        self._slots = asyncio.Semaphore(webhook.webhook_concurrency)
        self.recent = RecentDeliveries(webhook.webhook_dedup_seconds, DEDUP_ENTRIES)
        self.lanes: dict[str, Lane] = {}  # workflow id -> its lane, while it has deliveries
        # The delivery spool (opened by create_app) and the spooled deliveries with a call on
        # its way, which the spool keeps wanted (a waiter) until the call ends.
        self.spool: Spool | None = None
        self._held: dict[DeliveryKey, Delivery] = {}
        self._refusals: dict[DeliveryKey, int] = {}
        self._unreachable_logged: float | None = None  # monotonic time of the last warning
        # Unusable alerts not yet reported to the rejections workflow: reason -> count, and a
        # few examples (report_rejected sends them every REJECTED_REPORT_SECONDS).
        self.rejected: dict[str, int] = {}
        self._rejected_examples: dict[str, list[str]] = {}

    def adopt_cluster(self, cluster: str) -> None:
        """Serve the recorded cluster name (SICKBAY_CLUSTER_FILE): its ids and its queue."""
        self.settings = self.settings.with_cluster(cluster)
        self.mapping = dataclasses.replace(self.mapping, cluster=cluster)

    @property
    def connected(self) -> bool:
        return self._client is not None

    async def client(self) -> Client:
        if self._client is not None:
            return self._client
        async with self._lock:
            if self._client is None:
                try:
                    client = await asyncio.wait_for(
                        connect(self.settings), self.webhook.webhook_temporal_timeout
                    )
                except (TimeoutError, RuntimeError, OSError, RPCError) as exc:
                    raise TemporalUnavailable(
                        f"cannot reach Temporal at {self.settings.temporal_address}: {exc}"
                    ) from exc
                try:
                    await asyncio.wait_for(
                        ensure_search_attributes(client, self.settings.temporal_namespace),
                        self.webhook.webhook_temporal_timeout,
                    )
                except TimeoutError:
                    log.warning("timed out checking search attributes; continuing")
                except RuntimeError as exc:  # Temporal Cloud: says what to run instead
                    log.warning("%s", exc)
                except RPCError as exc:
                    log.warning("could not check search attributes: %s", exc)
                self._client = client
                log.info("connected to Temporal at %s", self.settings.temporal_address)
        return self._client

    async def handle(self, payload: AmPayload) -> tuple[int, dict[str, Any]]:
        received_at = datetime.now(UTC)
        out = NotificationReport()
        # workflow id -> delivery key -> the alerts of this notification with that key
        by_workflow: dict[str, dict[DeliveryKey, list[MappedAlert]]] = {}
        for index, alert in enumerate(payload.alerts):
            self.metrics.alerts_received.labels(alert.status).inc()
            mapped = map_alert(index, alert, self.mapping, received_at=received_at)
            if isinstance(mapped, Unmapped):
                self.metrics.alerts_rejected.labels(mapped.reason).inc()
                out.unmatched.append(_unmapped_json(mapped))
                self._note_rejected(mapped)
                continue
            key = mapped.delivery_key()
            if self.recent.recent(key):  # fast path for a storm's repeats: no task, no call
                self._accepted(out, [mapped], None, via="recent")
                continue
            group = by_workflow.setdefault(mapped.workflow_id, {})
            group.setdefault(key, []).append(mapped)
        if payload.truncated_alerts:
            log.warning(
                "Alertmanager truncated %d alerts of group %s (raise max_alerts)",
                payload.truncated_alerts,
                payload.group_key,
            )

        if by_workflow:
            try:
                client = await self.client()
            except TemporalUnavailable as exc:
                log.warning("%s", exc)
                for group in by_workflow.values():
                    for same in group.values():
                        for m in same:
                            self._failed(out, m, "temporal-unavailable", str(exc))
                return 503, self._body(out, payload, "temporal unavailable")
            # Firing first, so a resolved alert in the same notification finds the workflow
            # the firing one started.
            groups = [
                sorted(g.values(), key=lambda same: same[0].status != "firing")
                for g in by_workflow.values()
            ]
            # Queued all at once (no await in between), so one workflow's alerts share a call.
            waitings = [self._enqueue(client, g, out) for g in groups]
            tasks: list[asyncio.Future[None]] = [
                asyncio.ensure_future(self._await_group(w, out)) for w in waitings
            ]
            loop = asyncio.get_running_loop()
            deadline = loop.time() + self.webhook.webhook_temporal_timeout
            pending: set[asyncio.Future[None]] = set(tasks)
            queued: set[DeliveryKey] = set()
            if self.spool is not None:
                _done, pending = await asyncio.wait(
                    tasks,
                    timeout=min(self.webhook.webhook_ack_seconds, deadline - loop.time()),
                )
                if pending:
                    queued = await self._spool_waiting(waitings, tasks)
            if pending and not queued:
                _done, pending = await asyncio.wait(
                    pending, timeout=max(0.0, deadline - loop.time())
                )
            for task in pending:
                task.cancel()
            if pending:
                await asyncio.gather(*pending, return_exceptions=True)
                handled = {r["index"] for r in out.results} | {f["index"] for f in out.failed}
                for waiting, task in zip(waitings, tasks, strict=True):
                    if task not in pending:
                        continue
                    for same, d, own in waiting:
                        todo = [m for m in same if m.index not in handled]
                        if not todo:
                            continue
                        call = d.call
                        if call.done() and not call.cancelled() and call.exception() is None:
                            self._record(out, todo, d, own)  # answered, not yet recorded
                        elif d.key in queued:
                            self._queued(out, todo)
                        elif call.done():
                            self._record(out, todo, d, own)
                        else:
                            for m in todo:
                                self._failed(out, m, "temporal-timeout", "Temporal did not answer")

        code = 200
        if out.failed:
            reasons = {f["reason"] for f in out.failed}
            transient = reasons & {"temporal-unavailable", "temporal-timeout"}
            code = 503 if transient else 502
        # One summary line per notification, also one that held only duplicates or signals
        # (what Alertmanager sent is always visible); WARNING when some alerts were not used.
        level = logging.WARNING if out.unmatched or out.failed else logging.INFO
        log.log(
            level,
            "notification %s: %d alerts, %d started, %d signalled, %d resolved, "
            "%d duplicates, %d already handled, %d spooled, %d unmatched, %d failed%s -> %d",
            payload.group_key or "-",
            len(payload.alerts),
            out.counts.get("started", 0),
            out.counts.get("signalled", 0),
            out.counts.get("resolved-signalled", 0),
            out.counts.get(DUPLICATE, 0),
            out.counts.get(ALREADY_HANDLED, 0),
            out.counts.get(QUEUED, 0),
            len(out.unmatched),
            len(out.failed),
            f" ({', '.join(sorted({f['reason'] for f in out.failed}))})" if out.failed else "",
            code,
        )
        if out.unmatched:
            _warn_unmatched(payload, out.unmatched)
        status = "ok" if code == 200 else "some alerts were not accepted by Temporal"
        return code, self._body(out, payload, status)

    def _note_rejected(self, u: Unmapped) -> None:
        self.rejected[u.reason] = self.rejected.get(u.reason, 0) + 1
        examples = self._rejected_examples.setdefault(u.reason, [])
        if len(examples) < REJECTED_EXAMPLES:
            examples.append(f"{u.alertname or '(no alertname)'} ({u.fingerprint}): {u.detail}")

    def _note_repeat(self, m: MappedAlert) -> None:
        """An Xid alert under new labels (exporter restart, pod mapping, Hostname) repeating
        what the device's last run handled: counted for `sickbay status`, nothing started."""
        reason = "already-handled (same Xid, new labels)"
        self.rejected[reason] = self.rejected.get(reason, 0) + 1
        examples = self._rejected_examples.setdefault(reason, [])
        if len(examples) < REJECTED_EXAMPLES and m.evidence is not None:
            examples.append(
                f"{m.evidence.alertname} Xid {m.evidence.xid} on {m.device.key} "
                f"({m.fingerprint}): {m.workflow_id}'s last run handled it"
            )

    async def report_rejected(self) -> int:
        """Hand the unusable alerts counted since the last report to the rejections workflow
        (so `sickbay status` shows them, whichever replica refused them). Kept for the next
        round when Temporal cannot take them. Returns how many were reported."""
        if not self.rejected:
            return 0
        counts, examples = self.rejected, self._rejected_examples
        self.rejected, self._rejected_examples = {}, {}
        batch = RejectedAlerts(at=datetime.now(UTC), counts=counts, examples=examples)
        try:
            client = await self.client()
            await asyncio.wait_for(
                report_rejected(client, self.settings.task_queue, batch),
                self.webhook.webhook_temporal_timeout,
            )
        except (TemporalUnavailable, RPCError, TimeoutError, RuntimeError) as exc:
            for reason, n in counts.items():  # not lost: next round
                self.rejected[reason] = self.rejected.get(reason, 0) + n
                kept = self._rejected_examples.setdefault(reason, [])
                kept[:0] = examples.get(reason, [])
                del kept[REJECTED_EXAMPLES:]
            log.debug("could not report %d rejected alert(s) yet: %s", sum(counts.values()), exc)
            return 0
        return sum(counts.values())

    async def report_rejected_forever(self) -> None:
        while True:
            await asyncio.sleep(REJECTED_REPORT_SECONDS)
            try:
                await self.report_rejected()
            except Exception:
                log.exception("reporting rejected alerts failed; trying again")

    async def _await_group(
        self, waiting: list[tuple[list[MappedAlert], Delivery, bool]], out: NotificationReport
    ) -> None:
        """Await the deliveries `_enqueue` queued or joined for one workflow of this
        notification, and record each one's outcome for its alerts. Only the call that carried
        a key succeeding acknowledges it."""
        try:
            for same, d, own in waiting:
                try:
                    await asyncio.shield(d.call)
                except asyncio.CancelledError:
                    if not d.call.cancelled():
                        raise  # this notification's deadline: handle() reports it
                except Exception:
                    pass  # the call's error: recorded just below
                self._record(out, same, d, own)
        finally:
            for _same, d, _own in waiting:
                d.waiters -= 1

    def _record(
        self, out: NotificationReport, same: Sequence[MappedAlert], d: Delivery, own: bool
    ) -> None:
        """Record the outcome of `d`'s finished call for this notification's alerts `same`
        (`own`: this notification queued it, so the first alert gets the call's result)."""
        call = d.call
        if call.cancelled():
            for a in same:  # dropped unsent, or cut off by shutdown
                self._failed(out, a, "temporal-unavailable", "delivery cancelled")
            return
        exc = call.exception()
        if isinstance(exc, RPCError):
            reason = "temporal-unavailable" if exc.status in TRANSIENT else "temporal-error"
            detail = f"{exc.status.name if exc.status else ''}: {exc}"
            for a in same:
                self._failed(out, a, reason, detail)
        elif exc is not None:  # the SDK raises RuntimeError on a dropped connection
            log.warning("Temporal call for %s failed: %r", same[0].workflow_id, exc)
            for a in same:
                self._failed(out, a, "temporal-unavailable", repr(exc))
        elif own:
            self._accepted(out, same[:1], call.result())
            self._accepted(out, same[1:], None, via="notification")
        else:
            self._accepted(out, same, None, via="in-flight")

    def _enqueue(
        self, client: Client, group: Sequence[list[MappedAlert]], out: NotificationReport
    ) -> list[tuple[list[MappedAlert], Delivery, bool]]:
        """Queue this notification's new deliveries for one workflow (firing first), all at
        once (no await in here, so they land in the same call), and join the ones already on
        their way.

        Each entry of `group` is one delivery key with every alert of this notification that
        has it. A key Temporal accepted within the dedup window is answered from memory; a key
        already queued or in flight (any notification) is joined, not sent twice; the rest are
        queued on the workflow's lane together, so they go in one call.
        Returns (alerts, delivery, queued by this notification) to await."""
        recent = self.recent
        waiting: list[tuple[list[MappedAlert], Delivery, bool]] = []
        lane: Lane | None = None
        for same in group:
            m = same[0]
            key = m.delivery_key()
            if recent.recent(key):
                self._accepted(out, same, None, via="recent")
                continue
            d = recent.inflight.get(key)
            if d is not None and d.call.done():
                # It just ended (its done callback has not run yet): join a success, but never
                # a failed or dropped one, which the sender's retry must send again.
                if d.call.cancelled() or d.call.exception() is not None:
                    d = None
            own = d is None
            if d is None:
                if lane is None:
                    lane = self.lanes.setdefault(m.workflow_id, Lane())
                d = Delivery(key, m, asyncio.get_running_loop().create_future())
                recent.inflight[key] = d
                d.call.add_done_callback(functools.partial(self._delivery_done, d))
                lane.queued[key] = d
            d.waiters += 1
            waiting.append((same, d, own))
        if lane is not None and lane.task is None:
            lane.task = asyncio.ensure_future(self._drive(client, group[0][0].workflow_id, lane))
        return waiting

    async def _drive(self, client: Client, workflow_id: str, lane: Lane) -> None:
        """Send the lane's queued deliveries, one call at a time, until none are left."""
        batch: list[Delivery] = []
        try:
            while lane.queued:
                batch = list(lane.queued.values())
                lane.queued = {}
                await self._send(client, batch)
        finally:
            # No await since the loop saw the queue empty: nothing was queued meanwhile.
            for d in [*batch, *lane.queued.values()]:
                if not d.call.done():  # cancelled (shutdown) part-way
                    d.call.cancel()
            lane.queued = {}
            if self.lanes.get(workflow_id) is lane:
                del self.lanes[workflow_id]

    async def _send(self, client: Client, batch: list[Delivery]) -> None:
        """One call for the batch's firing deliveries (signal-with-start), then one signal per
        resolved delivery; each delivery's future gets its own outcome."""
        queued_at = time.perf_counter()
        # Waiting for a slot is where an overloaded server sheds load: a delivery whose every
        # notification gave up meanwhile is dropped unsent (the sender's retry queues it again).
        async with self._slots:
            live = []
            for d in batch:
                if d.waiters > 0:
                    live.append(d)
                else:
                    self.metrics.deliveries_dropped.inc()
                    d.call.cancel()
            firing = [d for d in live if d.alert.status == "firing"]
            if firing:
                self.metrics.call_alerts.observe(len(firing))
                try:
                    repeats, fresh, result = await self._fire_firing(client, firing)
                except Exception as exc:
                    for d in firing:
                        d.call.set_exception(exc)
                else:
                    if repeats:
                        self.metrics.workflows.labels(ALREADY_HANDLED).inc(len(repeats))
                    for d in repeats:
                        d.call.set_result(ALREADY_HANDLED)
                    if result is not None:
                        self.metrics.workflows.labels(result).inc()
                    for i, d in enumerate(fresh):  # the first one started it, if this did
                        d.call.set_result(result if i == 0 and result else "signalled")
                finally:
                    self.metrics.call_latency.observe(time.perf_counter() - queued_at)
            for d in live:
                if d.alert.status == "firing":
                    continue
                started = time.perf_counter()
                self.metrics.call_alerts.observe(1)
                try:
                    result = await self._resolve(client, d.alert)
                except Exception as exc:
                    d.call.set_exception(exc)
                else:
                    self.metrics.workflows.labels(result).inc()
                    d.call.set_result(result)
                finally:
                    self.metrics.call_latency.observe(time.perf_counter() - started)

    async def _fire_firing(
        self, client: Client, firing: list[Delivery]
    ) -> tuple[list[Delivery], list[Delivery], str | None]:
        """Send one workflow's firing deliveries; returns (repeats of instances a completed
        run handled, deliveries sent, the call's result or None when nothing was sent).

        The first signal-with-start may not follow a *completed* run
        (ALLOW_DUPLICATE_FAILED_ONLY): the server decides atomically, so a running run is
        signalled (it de-duplicates evidence by fingerprint), a new or failed/terminated one
        is started, and only after a completed run is the call refused. Then, and only then,
        the lane asks Temporal which instances that run handled (describe + result) and sends
        the rest with a start allowed. One call per lane in the common case, two more only
        after a completed run; never a new run for a handled instance."""
        alerts = [d.alert for d in firing]
        try:
            return [], firing, await self._fire(client, alerts)
        except WorkflowAlreadyStartedError:
            pass  # the last run completed: which alert instances did it handle?
        except RPCError as exc:
            if exc.status != RPCStatusCode.ALREADY_EXISTS:
                raise
        handled = await self._handled_before(client, firing[0].alert.workflow_id)
        why = {id(d): _repeat(d.alert, handled) for d in firing}
        repeats = [d for d in firing if why[id(d)]]
        fresh = [d for d in firing if not why[id(d)]]
        for d in repeats:
            if why[id(d)] == "evidence":  # same Xid, new labels: say so in `sickbay status`
                self._note_repeat(d.alert)
        if not fresh:
            return repeats, [], None
        result = await self._fire(client, [d.alert for d in fresh], handled, after_closed=True)
        return repeats, fresh, result

    def _accepted(
        self,
        out: NotificationReport,
        alerts: Sequence[MappedAlert],
        result: str | None,
        via: str = "",
    ) -> None:
        """Record alerts Temporal has (`result`: this RPC's answer; None: a duplicate of a
        delivery that Temporal accepted, found `via` the notification, an in-flight call or
        the recent-delivery cache)."""
        for m in alerts:
            self.metrics.alerts_accepted.labels(m.status).inc()
            if result is None:
                self.metrics.alerts_deduplicated.labels(via).inc()
                out.result(m, DUPLICATE, via)
            else:
                out.result(m, result)

    def _queued(self, out: NotificationReport, alerts: Sequence[MappedAlert]) -> None:
        """Record alerts acknowledged through the spool: on disk, Temporal not told yet."""
        for m in alerts:
            out.result(m, QUEUED)

    def _delivery_done(self, d: Delivery, call: asyncio.Future[str]) -> None:
        if self.recent.inflight.get(d.key) is d:
            del self.recent.inflight[d.key]
        if call.cancelled():
            return
        # Retrieving the error marks it seen: the waiting requests reported it, or it came
        # after their deadline, when the sender is already retrying. A failure is never
        # remembered, so the retry sends again.
        if call.exception() is None and call.result() in CACHEABLE:
            self.recent.remember(d.key)

    async def shutdown(self, within: float) -> None:
        """On shutdown: with a spool, what it holds with no call on its way (a failed call
        waiting for the next redelivery round) is sent once more, since the directory may go
        with this process (an emptyDir goes with its pod); then the calls on their way finish,
        for a bounded time (`drain`). What Temporal has not taken by then stays journaled for
        the next webhook started on the directory, and the log says how many."""
        if self.spool is not None and self.spool.pending:
            try:
                await asyncio.wait_for(self.redeliver(), within)
            except Exception:  # the drain and the count below still run
                log.exception("webhook spool: last redelivery round before exit failed")
        await self.drain(within)
        if self.spool is not None and self.spool.pending:
            log.warning(
                "webhook spool: exiting with %d acknowledged alert(s) Temporal has not taken; "
                "they stay in %s for the next webhook started on it (lost if the directory "
                "goes with this process, as an emptyDir with its pod)",
                len(self.spool.pending),
                self.webhook.webhook_spool_dir,
            )

    async def drain(self, within: float) -> None:
        """On shutdown: let calls already queued or sent to Temporal finish, for a bounded
        time; what is left is cancelled (its senders get 503 and retry elsewhere)."""
        tasks = {lane.task for lane in self.lanes.values() if lane.task is not None}
        if tasks:
            _done, pending = await asyncio.wait(tasks, timeout=within)
            for task in pending:
                task.cancel()
            if pending:
                await asyncio.gather(*pending, return_exceptions=True)

    @property
    def _rpc_timeout(self) -> timedelta:
        # A call stuck on a half-dead connection must end (and its alerts be retried or
        # reported), not hold its workflow's lane until the connection's keepalive gives up.
        return timedelta(seconds=self.webhook.webhook_temporal_timeout)

    async def _handled_before(self, client: Client, workflow_id: str) -> list[HandledAlert]:
        """The alert instances (and evidence) the device's last, completed run handled."""
        return await closed_run_handled(
            client,
            workflow_id,
            self._rpc_timeout,
            lambda call: self.metrics.temporal_calls.labels(call).inc(),
        )

    async def _fire(
        self,
        client: Client,
        alerts: Sequence[MappedAlert],
        handled: Sequence[HandledAlert] = (),
        *,
        after_closed: bool = False,
    ) -> str:
        """One signal-with-start carrying every firing alert in `alerts` (one workflow);
        `handled`: what the closed run before handled (a new run carries it on).
        `after_closed` False: the call may not start a run after a completed one (the server
        refuses with WorkflowAlreadyStartedError); True: it may (`handled` was asked for)."""
        m = alerts[0]
        assert all(a.evidence is not None for a in alerts)
        inp = RemediationInput(
            device=m.device,
            trigger="alert",
            requested_by="alertmanager",
            reason=m.evidence.summary or m.evidence.alertname if m.evidence else "",
            handled_before=list(handled),
            cluster=self.settings.cluster,
        )
        # Every firing delivery is a signal-with-start (USE_EXISTING): a plain signal would
        # fail if the run closed since the previous one, and costs the server the same.
        self.metrics.temporal_calls.labels("signal-with-start").inc()
        res = await signal_with_start(
            client,
            inp,
            task_queue=self.settings.task_queue,
            evidence_list=[a.evidence for a in alerts if a.evidence is not None],
            rpc_timeout=self._rpc_timeout,
            id_reuse_policy=(
                WorkflowIDReusePolicy.ALLOW_DUPLICATE
                if after_closed
                else WorkflowIDReusePolicy.ALLOW_DUPLICATE_FAILED_ONLY
            ),
        )
        return "started" if res.started else "signalled"

    async def _resolve(self, client: Client, m: MappedAlert) -> str:
        assert m.resolved is not None
        handle = client.get_workflow_handle(m.workflow_id)
        self.metrics.temporal_calls.labels("signal").inc()
        try:
            await handle.signal(SIG_ALERT_RESOLVED, m.resolved, rpc_timeout=self._rpc_timeout)
        except RPCError as exc:
            if exc.status == RPCStatusCode.NOT_FOUND:  # none, or already closed: nothing to do
                return "resolved-no-workflow"
            raise
        return "resolved-signalled"

    def _failed(self, out: NotificationReport, m: MappedAlert, reason: str, detail: str) -> None:
        self.metrics.alerts_rejected.labels(reason).inc()
        out.failed.append(
            {
                "index": m.index,
                "fingerprint": m.fingerprint,
                "workflow_id": m.workflow_id,
                "reason": reason,
                "detail": detail[:500],
            }
        )

    @staticmethod
    def _body(out: NotificationReport, payload: AmPayload, status: str) -> dict[str, Any]:
        return {
            "status": status,
            "group_key": payload.group_key,
            "received": len(payload.alerts),
            "accepted": len(out.results),
            "started": out.counts.get("started", 0),
            "signalled": out.counts.get("signalled", 0),
            "resolved_signalled": out.counts.get("resolved-signalled", 0),
            "resolved_no_workflow": out.counts.get("resolved-no-workflow", 0),
            "duplicates": out.counts.get(DUPLICATE, 0),
            "already_handled": out.counts.get(ALREADY_HANDLED, 0),
            "queued": out.counts.get(QUEUED, 0),
            "unmatched": sorted(out.unmatched, key=lambda u: u["index"]),
            "failed": sorted(out.failed, key=lambda f: f["index"]),
            "results": sorted(out.results, key=lambda r: r["index"]),
            "truncated_alerts": payload.truncated_alerts,
        }


# At most this many unusable alerts are spelled out per notification (the rest are counted).
UNMATCHED_LOG_EXAMPLES = 3


def _warn_unmatched(payload: AmPayload, unmatched: list[dict[str, Any]]) -> None:
    """Alerts Sickbay cannot use are said loudly: by reason, with examples."""
    by_reason: dict[str, list[dict[str, Any]]] = {}
    for u in sorted(unmatched, key=lambda u: u["index"]):
        by_reason.setdefault(u["reason"], []).append(u)
    for reason, items in sorted(by_reason.items()):
        examples = "; ".join(
            f"{u['alertname'] or '(no alertname)'} ({u['fingerprint']}): {u['detail']}"
            for u in items[:UNMATCHED_LOG_EXAMPLES]
        )
        more = len(items) - UNMATCHED_LOG_EXAMPLES
        log.warning(
            "notification %s: %d alert(s) not used, %s: %s%s",
            payload.group_key or "-",
            len(items),
            reason,
            examples,
            f" (+{more} more)" if more > 0 else "",
        )


def _unmapped_json(u: Unmapped) -> dict[str, Any]:
    return {
        "index": u.index,
        "alertname": u.alertname,
        "fingerprint": u.fingerprint,
        "status": u.status,
        "reason": u.reason,
        "detail": u.detail,
    }
