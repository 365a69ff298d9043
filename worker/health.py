"""The worker's health endpoint: healthy only while it polls Temporal.

The Prometheus port is served by the Temporal runtime for as long as the process lives, so a
probe on it passes while the worker cannot reach Temporal (the SDK retries its polls
forever) or its pollers have stopped. `GET /healthz` here answers 200 only while a check run
every sixth of `SICKBAY_HEALTH_STALE_SECONDS` has passed within the last
`SICKBAY_HEALTH_STALE_SECONDS`; else 503 with the reason. A check passes when:

- the worker's run task is alive (a fatal poll error ends it);
- Temporal answers `DescribeTaskQueue` for the remediation queue (workflow tasks) within the
  check's timeout;
- the server lists this worker's identity among that queue's pollers, and the newest
  `last_access_time` under that identity moved within `POLL_SILENCE` (a poller that stopped
  stays listed for minutes, so being listed alone proves nothing).

Only this process's monotonic clock measures age; the server's timestamps are compared only
with earlier values of themselves. Served by the stdlib's threading HTTP server on
`SICKBAY_HEALTH_PORT` (at `SICKBAY_METRICS_HOST`), so a busy event loop does not make the
probe time out; the state it reads is a snapshot the check task writes.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from temporalio.api.enums.v1 import TaskQueueType
from temporalio.api.taskqueue.v1 import TaskQueue
from temporalio.api.workflowservice.v1 import DescribeTaskQueueRequest
from temporalio.client import Client
from temporalio.service import RPCError

log = logging.getLogger(__name__)
# An idle queue's long polls last about 70 s each and every poller re-polls at once, so the
# newest poll of this identity is never older than that while polling goes on; 150 s is more
# than two long polls.
POLL_SILENCE = 150.0  # seconds


@dataclass
class Snapshot:
    healthy: bool
    reason: str


class PollingHealth:
    """What the last checks found; read by the HTTP server's threads."""

    def __init__(self, stale_after: float, clock: Callable[[], float] = time.monotonic) -> None:
        self.stale_after = stale_after
        self._clock = clock
        self._lock = threading.Lock()
        self._last_ok: float | None = None
        self._reason = "starting: not seen polling yet"
        self._access: Any = None  # newest last_access_time seen for this identity
        self._access_changed = clock()

    def passed(self, detail: str) -> None:
        with self._lock:
            self._last_ok = self._clock()
            self._reason = detail

    def failed(self, reason: str) -> None:
        with self._lock:
            self._reason = reason

    def saw_access(self, access: Any) -> float:
        """Record the newest poll time the server shows; returns seconds since it moved."""
        with self._lock:
            now = self._clock()
            if access != self._access:
                self._access, self._access_changed = access, now
            return now - self._access_changed

    def snapshot(self) -> Snapshot:
        with self._lock:
            if self._last_ok is None:
                return Snapshot(False, self._reason)
            age = self._clock() - self._last_ok
            if age > self.stale_after:
                return Snapshot(False, f"no passing check for {age:.0f} s: {self._reason}")
            return Snapshot(True, self._reason)


async def check_once(
    client: Client,
    task_queue: str,
    identity: str,
    running: Callable[[], bool],
    health: PollingHealth,
    limit: float,
) -> None:
    """One check; `limit` bounds the Temporal call (seconds)."""
    if not running():
        health.failed("the worker stopped running")
        return
    try:
        described = await asyncio.wait_for(
            client.workflow_service.describe_task_queue(
                DescribeTaskQueueRequest(
                    namespace=client.namespace,
                    task_queue=TaskQueue(name=task_queue),
                    task_queue_type=TaskQueueType.TASK_QUEUE_TYPE_WORKFLOW,
                )
            ),
            limit,
        )
    except (RPCError, TimeoutError) as exc:
        health.failed(f"Temporal does not answer: {type(exc).__name__}: {exc}")
        return
    ours = [p.last_access_time.ToNanoseconds() for p in described.pollers if p.identity == identity]
    if not ours:
        health.failed(f"not among the pollers of task queue {task_queue!r}")
        return
    silent = health.saw_access(max(ours))
    if silent > POLL_SILENCE:
        health.failed(f"no new poll of task queue {task_queue!r} for {silent:.0f} s")
        return
    health.passed(f"polling task queue {task_queue!r}")


async def monitor(
    client: Client,
    task_queue: str,
    identity: str,
    running: Callable[[], bool],
    health: PollingHealth,
    interval: float,
    stop: asyncio.Event,
) -> None:
    """Check every `interval` seconds until `stop` is set."""
    was = True
    while not stop.is_set():
        # The check's timeout: an interval, so checks never pile up behind a hung call.
        await check_once(client, task_queue, identity, running, health, limit=interval)
        now = health.snapshot().healthy
        if now != was:
            (log.info if now else log.warning)("health: %s", health.snapshot().reason)
            was = now
        try:
            await asyncio.wait_for(stop.wait(), interval)
        except TimeoutError:
            pass


def serve(health: PollingHealth, host: str, port: int) -> ThreadingHTTPServer:
    """`GET /healthz` on `host:port` in a daemon thread; `shutdown()` stops it."""

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            if self.path.split("?", 1)[0] != "/healthz":
                self.send_error(404)
                return
            snap = health.snapshot()
            body = (("ok: " if snap.healthy else "unhealthy: ") + snap.reason + "\n").encode()
            self.send_response(200 if snap.healthy else 503)
            self.send_header("Content-Type", "text/plain; charset=utf-8")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: Any) -> None:  # probes every few seconds
            return

    server = ThreadingHTTPServer((host, port), Handler)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, name="sickbay-health", daemon=True).start()
    return server
