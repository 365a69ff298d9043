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
- a request without a valid token (none, or a wrong one) is answered 401 and closed at once,
  before its body is read, however long the body deadline is: a flood of such connections holds
  nothing open; a normal request is served meanwhile;
- one peer holds at most a quarter of SICKBAY_WEBHOOK_MAX_CONNECTIONS (at least 4): past that
  its own slowest connection gives way, or, all of its connections busy, the newcomer is
  answered 503; another peer (127.0.0.2) is still served;
- at the cap, a kept-alive connection that carried an answered POST (Alertmanager's) is the
  last to give way: slow newcomers evict each other (in-process server, a stand-in app);
- a token in the query string is never written to the access log;
- the settings are refused when out of range or when only half of the TLS pair is set.
"""

from __future__ import annotations

import itertools
import os
import selectors
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest
import uvicorn
from pydantic import ValidationError

from harness.stack import free_port
from tests.webhook.helpers import TOKEN
from worker.http_server import build_config
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
def _webhook(tmp_path: Path, *args: str, **env: str) -> Iterator[int]:
    port = free_port()
    log = tmp_path / "webhook.log"
    with log.open("wb") as out:
        proc = subprocess.Popen(
            [SICKBAY, "webhook", "--host", "127.0.0.1", "--port", str(port), *args],
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


_ADDRESSES = itertools.count()


def _connect(port: int, source: str = "") -> socket.socket:
    """A connection from `source`, by default from an address of its own (127.1.x.y: Linux
    answers the whole 127/8 on loopback), so the per-address cap only counts where a test
    means it to."""
    if not source:
        n = next(_ADDRESSES)
        source = f"127.1.{n // 250}.{n % 250 + 1}"
    sock = socket.create_connection(("127.0.0.1", port), timeout=5, source_address=(source, 0))
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


def _send_all(socks: list[socket.socket], data: bytes) -> None:
    for s in socks:
        s.setblocking(True)
        s.sendall(data)
        s.setblocking(False)


def _answers_then_closed(socks: list[socket.socket], within: float) -> list[bytes]:
    """What the server sent each socket before closing it; fails unless it closed all of them
    within `within` seconds."""
    received = {s: b"" for s in socks}
    sel = selectors.DefaultSelector()
    for s in socks:
        sel.register(s, selectors.EVENT_READ)
    deadline = time.monotonic() + within
    try:
        while sel.get_map():
            assert time.monotonic() < deadline, (
                f"{len(sel.get_map())} of {len(socks)} connections still open after {within} s"
            )
            for key, _ in sel.select(timeout=0.2):
                s = key.fileobj
                assert isinstance(s, socket.socket)
                try:
                    chunk = s.recv(4096)
                except (BlockingIOError, ConnectionResetError):
                    chunk = b""
                received[s] += chunk
                if not chunk:
                    sel.unregister(s)
    finally:
        sel.close()
        for s in socks:
            s.close()
    return [received[s] for s in socks]


def test_unauthenticated_requests_are_answered_and_closed_before_their_body(
    tmp_path: Path,
) -> None:
    # A body deadline far beyond the test's patience: only the early answer can close them.
    with _webhook(
        tmp_path, SICKBAY_WEBHOOK_BODY_TIMEOUT="600", SICKBAY_WEBHOOK_MAX_CONNECTIONS="64"
    ) as port:
        head = (
            b"POST /v1/alertmanager HTTP/1.1\r\nHost: sickbay\r\nContent-Length: 5000\r\n"
            b"Content-Type: application/json\r\n"
        )
        no_token = [_connect(port) for _ in range(6)]
        wrong_token = [_connect(port) for _ in range(6)]
        _send_all(no_token, head + b"\r\n{")  # headers and one body byte
        _send_all(wrong_token, head + b"Authorization: Bearer " + b"w" * 40 + b"\r\n\r\n{")
        assert httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=10).status_code == 200
        answers = _answers_then_closed(no_token + wrong_token, within=CLOSED_WITHIN)
        assert all(a.startswith(b"HTTP/1.1 401") for a in answers), answers
        # Closed with the answer, not by a deadline later on (keep-alive: 30 s).
        assert all(b"\r\nconnection: close\r\n" in a.lower() for a in answers), answers
        metrics = httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=10).text
        assert 'sickbay_webhook_requests_rejected_total{reason="unauthorized"} 12.0' in metrics


def test_one_peer_holds_at_most_a_quarter_of_the_connections(tmp_path: Path) -> None:
    per_peer = 4  # a quarter of 16
    with _webhook(
        tmp_path,
        SICKBAY_WEBHOOK_MAX_CONNECTIONS="16",
        SICKBAY_WEBHOOK_HEADER_TIMEOUT="600",
        SICKBAY_WEBHOOK_BODY_TIMEOUT="600",
    ) as port:
        # Slow ones: past its share, the peer's own oldest slow connection gives way.
        slow = [_connect(port, "127.0.0.1") for _ in range(per_peer)]
        _send_all(slow, HEADERS[:1])
        newer = [_connect(port, "127.0.0.1") for _ in range(2)]
        _send_all(newer, HEADERS[:1])
        evicted = _closed(slow + newer, within=CLOSED_WITHIN, at_least=2)
        assert set(evicted) == set(slow[:2]), "the peer's oldest slow connections give way"
        for s in slow + newer:
            s.close()
        # Busy ones (a request being read): past its share, the newcomer is refused with 503.
        deadline = time.monotonic() + CLOSED_WITHIN
        while True:  # until the server has let go of the closed ones
            busy = [_connect(port, "127.0.0.1") for _ in range(per_peer)]
            _send_all(
                busy,
                b"POST /v1/alertmanager HTTP/1.1\r\nHost: sickbay\r\nContent-Length: 100\r\n"
                + f"Authorization: Bearer {TOKEN}\r\nExpect: 100-continue\r\n\r\n".encode(),
            )
            try:
                _wait_continue(busy)
                break
            except AssertionError:
                for s in busy:
                    s.close()
                assert time.monotonic() < deadline, "the peer's slots never freed"
        extra = socket.create_connection(("127.0.0.1", port), timeout=10)
        try:
            extra.sendall(b"GET /healthz HTTP/1.1\r\nHost: sickbay\r\n\r\n")
            refused = extra.recv(4096)
        finally:
            extra.close()
        assert refused.startswith(b"HTTP/1.1 503"), refused
        # Another peer is served meanwhile.
        other = socket.create_connection(
            ("127.0.0.1", port), timeout=10, source_address=("127.0.0.2", 0)
        )
        try:
            other.sendall(b"GET /healthz HTTP/1.1\r\nHost: sickbay\r\n\r\n")
            assert other.recv(4096).startswith(b"HTTP/1.1 200")
        finally:
            other.close()
        assert _closed(busy, within=0.5, at_least=0) == [], "a busy connection was closed"
        for s in busy:
            s.close()


def test_a_token_in_the_query_string_never_reaches_the_access_log(tmp_path: Path) -> None:
    secret = "q" + "9f3c1a7e5b2d" * 4
    with _webhook(tmp_path, "--access-log") as port:
        for target in (f"/v1/alertmanager?token={secret}", f"/healthz?a=1&token={secret}"):
            httpx.post(f"http://127.0.0.1:{port}{target}", content=b"{}", timeout=10)
        log = (tmp_path / "webhook.log").read_text()
        deadline = time.monotonic() + CLOSED_WITHIN
        while "/healthz" not in log:  # the access log line of the last request
            assert time.monotonic() < deadline, log[-3000:]
            time.sleep(0.1)
            log = (tmp_path / "webhook.log").read_text()
    assert secret not in log
    assert "/v1/alertmanager?" in log, "the access log still names the request"


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


async def _accept_app(scope: dict[str, Any], receive: Any, send: Any) -> None:
    """A stand-in for the webhook app: reads the whole body, answers 202."""
    if scope["type"] != "http":
        return
    more = True
    while more and scope["method"] == "POST":
        more = (await receive()).get("more_body", False)
    headers = [(b"content-length", b"2")]
    await send({"type": "http.response.start", "status": 202, "headers": headers})
    await send({"type": "http.response.body", "body": b"ok"})


def test_a_proven_client_gives_way_last(tmp_path: Path) -> None:
    """At the cap, a kept-alive connection that carried an answered POST (Alertmanager's) stays;
    the slow newcomers give way to each other instead."""
    port = free_port()
    server_settings = ServerSettings(
        webhook_header_timeout=600, webhook_body_timeout=600, webhook_max_connections=8
    )
    config, _limits, _tls = build_config(_accept_app, "127.0.0.1", port, server_settings)
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    try:
        deadline = time.monotonic() + START_WITHIN
        while not server.started:
            assert time.monotonic() < deadline and thread.is_alive()
            time.sleep(0.05)
        post = b"POST /v1/alertmanager HTTP/1.1\r\nHost: sickbay\r\nContent-Length: 2\r\n\r\n{}"
        alertmanager = _connect(port)
        _send_all([alertmanager], post)
        assert _read_answer(alertmanager).startswith(b"HTTP/1.1 202")
        slow = [_connect(port) for _ in range(12)]  # 7 fill the cap, 5 more evict
        _send_all(slow, HEADERS[:1])
        evicted = _closed(slow, within=CLOSED_WITHIN, at_least=5)
        assert set(evicted) == set(slow[:5]), "the oldest slow connections give way first"
        _send_all([alertmanager], post)  # still open, still served
        assert _read_answer(alertmanager).startswith(b"HTTP/1.1 202")
        for s in [alertmanager, *slow]:
            s.close()
    finally:
        server.should_exit = True
        thread.join(timeout=30)


def _read_answer(sock: socket.socket) -> bytes:
    """One whole answer of the stand-in app (its body is `ok`), or what came before EOF."""
    got = b""
    sel = selectors.DefaultSelector()
    sel.register(sock, selectors.EVENT_READ)
    try:
        while not got.endswith(b"\r\n\r\nok"):
            assert sel.select(timeout=CLOSED_WITHIN), f"no whole answer: {got!r}"
            chunk = sock.recv(4096)
            if not chunk:
                break
            got += chunk
        return got
    finally:
        sel.close()
