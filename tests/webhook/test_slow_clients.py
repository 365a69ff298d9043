"""Slow and surplus clients cannot hold `sickbay webhook` open: the real CLI process, small
limits from SICKBAY_WEBHOOK_HEADER_TIMEOUT / _BODY_TIMEOUT / _MAX_CONNECTIONS, Temporal down.

Cases:
- connections trickling header bytes (one every 0.3 s, never finishing) are answered 408 and
  closed by the server, as are connections that open and send nothing;
- a request whose headers are complete but whose body trickles is closed too (with or without
  the token: the deadline is the server's, not the route's); the route that was reading the
  body counts it (`requests_rejected{reason="body-timeout"}`) and logs no traceback;
- while they are held, and after, a normal request is served;
- at SICKBAY_WEBHOOK_MAX_CONNECTIONS open connections that are slow (headers not in), a new
  client is served and the oldest slow connection gives way (408, closed);
- at the cap with every connection busy (a request being read), one more is answered 503 at
  once and closed, no busy one is touched; once they are gone, new connections are served;
- the settings are refused when out of range or when only half of the TLS pair is set.
"""

from __future__ import annotations

import os
import selectors
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx
import pytest
from pydantic import ValidationError

from harness.stack import free_port
from tests.webhook.helpers import TOKEN
from worker.settings import ServerSettings

SICKBAY = str(Path(sys.executable).parent / "sickbay")
START_WITHIN = 30.0
# Generous against a busy 2-core machine; the bounds under test are 1 s.
CLOSED_WITHIN = 45.0
MAX_CONNECTIONS = 12


def _env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("SICKBAY_")}
    env.update(
        SICKBAY_TEMPORAL_ADDRESS=f"127.0.0.1:{free_port()}",  # nothing listens: Temporal down
        SICKBAY_WEBHOOK_TEMPORAL_TIMEOUT="1",
        SICKBAY_WEBHOOK_TOKEN=TOKEN,
        SICKBAY_WEBHOOK_HEADER_TIMEOUT="1",
        SICKBAY_WEBHOOK_BODY_TIMEOUT="1",
        SICKBAY_WEBHOOK_MAX_CONNECTIONS=str(MAX_CONNECTIONS),
    )
    env.update(extra)
    return env


@contextmanager
def _webhook(tmp_path: Path, **env: str) -> Iterator[int]:
    port = free_port()
    log = tmp_path / "webhook.log"
    with log.open("wb") as out:
        proc = subprocess.Popen(
            [SICKBAY, "webhook", "--host", "127.0.0.1", "--port", str(port)],
            env=_env(**env),
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    try:
        deadline = time.monotonic() + START_WITHIN
        while True:
            assert proc.poll() is None, log.read_text()[-3000:]
            try:
                httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=2)
                break
            except httpx.TransportError:
                assert time.monotonic() < deadline, log.read_text()[-3000:]
                time.sleep(0.2)
        yield port
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=5)


def _connect(port: int) -> socket.socket:
    sock = socket.create_connection(("127.0.0.1", port), timeout=5)
    sock.setblocking(False)
    return sock


def _trickle_until_closed(
    socks: dict[socket.socket, bytes], within: float = CLOSED_WITHIN
) -> dict[socket.socket, bytes]:
    """Send each socket the next byte of its bytes every 0.3 s (never the whole request) until
    the server closed every one; returns what each received. Fails past `within`."""
    received = {s: b"" for s in socks}
    sent = dict.fromkeys(socks, 0)
    open_ = set(socks)
    sel = selectors.DefaultSelector()
    for s in socks:
        sel.register(s, selectors.EVENT_READ)
    deadline = time.monotonic() + within
    try:
        while open_:
            assert time.monotonic() < deadline, (
                f"{len(open_)} of {len(socks)} slow connections still open after {within:.0f} s"
            )
            for key, _ in sel.select(timeout=0.3):
                s = key.fileobj
                assert isinstance(s, socket.socket)
                try:
                    chunk = s.recv(4096)
                except (ConnectionResetError, BlockingIOError):
                    chunk = b""
                received[s] += chunk
                if not chunk:
                    open_.discard(s)
                    sel.unregister(s)
            for s in list(open_):
                data = socks[s]
                if data and sent[s] < len(data) - 1:  # never the last byte
                    try:
                        s.send(data[sent[s] : sent[s] + 1])
                        sent[s] += 1
                    except (BrokenPipeError, ConnectionResetError):
                        open_.discard(s)
                        sel.unregister(s)
    finally:
        sel.close()
        for s in socks:
            s.close()
    return received


HEADERS = (
    b"POST /v1/alertmanager HTTP/1.1\r\nHost: sickbay\r\nContent-Type: application/json\r\n"
    b"X-Padding: " + b"a" * 200 + b"\r\n\r\n"
)


def test_slow_headers_silent_and_slow_bodies_are_closed(tmp_path: Path) -> None:
    with _webhook(tmp_path) as port:
        body_head = (
            b"POST /v1/alertmanager HTTP/1.1\r\nHost: sickbay\r\nContent-Length: 5000\r\n"
            b"Content-Type: application/json\r\n"
        )
        with_token = body_head + f"Authorization: Bearer {TOKEN}\r\n\r\n".encode()
        socks: dict[socket.socket, bytes] = {}
        for _ in range(4):
            socks[_connect(port)] = HEADERS  # header bytes, one at a time
        for _ in range(2):
            socks[_connect(port)] = b""  # opens, says nothing
        # Complete headers at once, then a body that trickles.
        for head in (body_head + b"\r\n", with_token):
            s = _connect(port)
            s.sendall(head)
            socks[s] = b"{" + b" " * 4000
        assert len(socks) < MAX_CONNECTIONS
        # While they are held, a normal request is served.
        assert httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=10).status_code == 200
        received = _trickle_until_closed(socks)
        slow_headers = [r for s, r in received.items() if socks[s] == HEADERS]
        assert all(r.startswith(b"HTTP/1.1 408") for r in slow_headers), slow_headers
        assert httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=10).status_code == 200
        metrics = httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=10).text
        # The authenticated slow body reached the route: counted, not a traceback.
        assert 'sickbay_webhook_requests_rejected_total{reason="body-timeout"} 1.0' in metrics
    assert "Traceback" not in (tmp_path / "webhook.log").read_text()


def test_at_the_cap_slow_connections_give_way_to_new_ones(tmp_path: Path) -> None:
    # A header deadline long enough that only the cap can close the held connections.
    with _webhook(tmp_path, SICKBAY_WEBHOOK_HEADER_TIMEOUT="60") as port:
        held = [_connect(port) for _ in range(MAX_CONNECTIONS)]
        for s in held:
            s.send(HEADERS[:1])
        # Accepted in order: the held ones before each client below.
        # Each new client is served (and kept open); the oldest slow connection makes room
        # for it (408, closed).
        clients = []
        for _ in range(3):
            c = socket.create_connection(("127.0.0.1", port), timeout=10)
            c.sendall(b"GET /healthz HTTP/1.1\r\nHost: sickbay\r\n\r\n")
            answer = c.recv(4096)
            assert answer.startswith(b"HTTP/1.1 200"), answer
            clients.append(c)
        evicted = _closed(held, within=CLOSED_WITHIN, at_least=3)
        assert set(evicted) == set(held[:3]), "the oldest slow connections give way first"
        for s in held + clients:
            s.close()


def test_past_the_cap_of_busy_connections_new_ones_get_503(tmp_path: Path) -> None:
    # Busy: headers complete, the body on its way (a request in progress is never evicted).
    with _webhook(tmp_path, SICKBAY_WEBHOOK_BODY_TIMEOUT="60") as port:
        held = [_connect(port) for _ in range(MAX_CONNECTIONS)]
        for s in held:
            s.sendall(
                b"POST /v1/alertmanager HTTP/1.1\r\nHost: sickbay\r\nContent-Length: 100\r\n"
                + f"Authorization: Bearer {TOKEN}\r\nExpect: 100-continue\r\n\r\n".encode()
            )
        _wait_continue(held)
        for s in held:
            s.send(b"{")
        extra = socket.create_connection(("127.0.0.1", port), timeout=10)
        try:
            extra.sendall(b"GET /healthz HTTP/1.1\r\nHost: sickbay\r\n\r\n")
            refused = extra.recv(4096)
        finally:
            extra.close()
        assert refused.startswith(b"HTTP/1.1 503") and b"too many open connections" in refused
        assert _closed(held, within=0.5, at_least=0) == [], "a busy connection was closed"
        for s in held:
            s.close()
        deadline = time.monotonic() + CLOSED_WITHIN
        while True:  # the server notices the closed sockets as they go: wait for a 200
            resp = httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=10)
            if resp.status_code == 200:
                break
            assert time.monotonic() < deadline, resp.text
            time.sleep(0.2)


def _wait_continue(held: list[socket.socket]) -> None:
    """Until the server answered every held request's `Expect: 100-continue`: it then has
    read their headers and is reading their bodies (busy)."""
    waiting = set(held)
    deadline = time.monotonic() + CLOSED_WITHIN
    sel = selectors.DefaultSelector()
    for s in held:
        sel.register(s, selectors.EVENT_READ)
    try:
        while waiting:
            assert time.monotonic() < deadline, f"{len(waiting)} requests never got 100 Continue"
            for key, _ in sel.select(timeout=0.2):
                s = key.fileobj
                assert isinstance(s, socket.socket)
                chunk = s.recv(4096)
                assert chunk.startswith(b"HTTP/1.1 100"), chunk
                waiting.discard(s)
                sel.unregister(s)
    finally:
        sel.close()


def _closed(socks: list[socket.socket], within: float, at_least: int) -> list[socket.socket]:
    """The sockets of `socks` the server closed, in the order it closed them, waiting up to
    `within` seconds for at least `at_least` of them."""
    closed: list[socket.socket] = []
    sel = selectors.DefaultSelector()
    for s in socks:
        sel.register(s, selectors.EVENT_READ)
    deadline = time.monotonic() + within
    try:
        while time.monotonic() < deadline:
            for key, _ in sel.select(timeout=0.1):
                s = key.fileobj
                assert isinstance(s, socket.socket)
                try:
                    chunk = s.recv(4096)
                except (BlockingIOError, ConnectionResetError):
                    chunk = b""
                if not chunk or chunk.startswith(b"HTTP/1.1 408"):
                    closed.append(s)
                    sel.unregister(s)
            if at_least and len(closed) >= at_least:
                break
    finally:
        sel.close()
    assert len(closed) >= at_least, f"only {len(closed)} of {at_least} closed in {within} s"
    return closed


@pytest.mark.parametrize(
    "bad",
    [
        {"webhook_header_timeout": 0},
        {"webhook_body_timeout": -1},
        {"webhook_max_connections": 0},
        {"webhook_tls_cert_file": "/etc/tls.crt"},
        {"webhook_tls_key_file": "/etc/tls.key"},
    ],
    ids=lambda d: next(iter(d)),
)
def test_bad_server_settings_are_refused(bad: dict[str, object]) -> None:
    with pytest.raises(ValidationError):
        ServerSettings(**bad)  # type: ignore[arg-type]
