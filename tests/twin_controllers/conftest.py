"""Fixtures for the controller tests: a running twin with the controller manager, fast clock.

- `twin(**kwargs)`: factory starting a twin (twin.testing.start_twin) with a
  `ControllerManager` on a `Clock(time_scale=TIME_SCALE)`; returns a `ControllersTwin` with the official
  client's APIs, the manager, and `twin(method, path, body)` for the /twin fault routes. Every
  twin started in a test is stopped after it.
- `eventually(check, timeout)`: polls `check()` until it returns a truthy value or raises
  nothing (assertion, API, lookup and attribute errors are retried), failing with the last error after `timeout` real seconds.
- `Receiver`: a loopback HTTP server that records posted JSON bodies and headers (the alert
  receiver).
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import httpx
import pytest
from kubernetes import client

from twin.clock import Clock
from twin.controllers.manager import ControllerManager, TwinOptions
from twin.testing import RunningTwin, start_twin

# 200 simulated seconds per real second: a 30 s grace period takes 0.15 s, the 10 s
# DeviceTaintRule status period 0.05 s, and a 5-minute CrashLoopBackOff cap 1.5 s.
TIME_SCALE = 200.0
# Real seconds to wait for an expected state before failing (generous for a shared 2-CPU box).
WAIT = 15.0


def eventually(check: Callable[[], Any], timeout: float = WAIT, interval: float = 0.02) -> Any:
    deadline = time.monotonic() + timeout
    last: BaseException | None = None
    while time.monotonic() < deadline:
        try:
            result = check()
            if result:
                return result
            last = AssertionError(f"{getattr(check, '__name__', 'check')} returned {result!r}")
        except (
            AssertionError,
            AttributeError,  # e.g. a condition not set yet: `condition(...)` is None
            client.ApiException,
            KeyError,
            IndexError,
            TypeError,
            ValueError,
        ) as err:
            last = err
        time.sleep(interval)
    raise AssertionError(f"not reached within {timeout}s: {last}") from last


@dataclass
class ControllersTwin:
    rs: RunningTwin
    manager: ControllerManager
    api: Any

    @property
    def core(self) -> client.CoreV1Api:
        return client.CoreV1Api(self.api)

    @property
    def apps(self) -> client.AppsV1Api:
        return client.AppsV1Api(self.api)

    @property
    def batch(self) -> client.BatchV1Api:
        return client.BatchV1Api(self.api)

    @property
    def dra(self) -> client.ResourceV1Api:
        return client.ResourceV1Api(self.api)

    @property
    def dra_beta2(self) -> client.ResourceV1beta2Api:
        return client.ResourceV1beta2Api(self.api)

    @property
    def events(self) -> client.EventsV1Api:
        return client.EventsV1Api(self.api)

    def twin(self, method: str, path: str, body: Any = None) -> httpx.Response:
        headers = {}
        if self.rs.twin.token:
            headers["Authorization"] = f"Bearer {self.rs.twin.token}"
        if isinstance(body, bytes):
            return httpx.request(
                method, self.rs.url + path, content=body, headers=headers, timeout=10.0
            )
        return httpx.request(method, self.rs.url + path, json=body, headers=headers, timeout=10.0)

    def namespace(self, name: str = "demo") -> str:
        self.core.create_namespace({"metadata": {"name": name}})
        return name


@pytest.fixture
def twin() -> Iterator[Callable[..., ControllersTwin]]:
    started: list[ControllersTwin] = []

    def start(options: TwinOptions | None = None, **kwargs: Any) -> ControllersTwin:
        kwargs.setdefault("nodes", 1)
        kwargs.setdefault("gpus_per_node", 2)
        manager = ControllerManager(options or TwinOptions())
        rs = start_twin(clock=Clock(time_scale=TIME_SCALE), controllers=(manager,), **kwargs)
        t = ControllersTwin(rs, manager, rs.api_client())
        started.append(t)
        return t

    yield start
    for t in started:
        t.rs.stop()


@dataclass
class Receiver:
    """Records POSTs: (path, headers, JSON body). `url` is the webhook address."""

    server: ThreadingHTTPServer
    posts: list[tuple[str, dict[str, str], Any]] = field(default_factory=list)
    status: int = 200

    @property
    def url(self) -> str:
        host, port = self.server.server_address[:2]
        return f"http://{host}:{port}/alerts"


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    holder: dict[str, Receiver] = {}

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, format: str, *args: Any) -> None:
            return None

        def do_POST(self) -> None:
            length = int(self.headers.get("Content-Length") or 0)
            body = json.loads(self.rfile.read(length) or b"null")
            rec = holder["r"]
            rec.posts.append((self.path, dict(self.headers), body))
            self.send_response(rec.status)
            self.send_header("Content-Length", "0")
            self.end_headers()

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.daemon_threads = True
    rec = Receiver(server)
    holder["r"] = rec
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield rec
    server.shutdown()
    server.server_close()
