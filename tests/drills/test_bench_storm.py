"""The storm benchmark's own parts, without a stack: its HTTP connections and its findings.

Cases:
- a `Connection` posts the pre-encoded body with the bearer token and reads the status and body of
  Content-Length and chunked answers, several requests on one keep-alive connection;
- a connection the server closed while idle (keep-alive timeout) is replaced and the request
  sent once on the new one; `Connection: close` closes the conn after the answer;
- a server that accepts the request and closes without answering is a failure, not a retry;
- the storm findings are computed from the figures: the goals' outcome, the CPU split naming
  the largest consumer, the inventory cost, the webhook's calls when p99 misses; an older
  result without the newer figures still renders.
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from bench.storm import Connection, findings


class _Server:
    """A loopback HTTP/1.1 server answering from a script, recording what it received."""

    def __init__(self, answers: list[bytes | None], close_after: set[int]) -> None:
        self.answers = answers  # per request; None: close without answering
        self.close_after = close_after  # request numbers after which the server hangs up
        self.received: list[tuple[bytes, bytes]] = []  # (head, body)
        self.connections = 0

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                length = int(
                    next(
                        line.split(b":", 1)[1]
                        for line in head.split(b"\r\n")
                        if line.lower().startswith(b"content-length:")
                    )
                )
                body = await reader.readexactly(length)
                n = len(self.received)
                self.received.append((head, body))
                answer = self.answers[n]
                if answer is None:
                    return
                writer.write(answer)
                await writer.drain()
                if n in self.close_after:
                    return
        except asyncio.IncompleteReadError:
            return
        finally:
            writer.close()


def _plain(status: int, body: bytes, extra: str = "") -> bytes:
    return f"HTTP/1.1 {status} X\r\ncontent-length: {len(body)}\r\n{extra}\r\n".encode() + body


def _chunked(body: bytes) -> bytes:
    half = len(body) // 2
    parts = b"".join(
        f"{len(p):x}\r\n".encode() + p + b"\r\n" for p in (body[:half], body[half:]) if p
    )
    return b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n" + parts + b"0\r\n\r\n"


async def _serve(server: _Server) -> tuple[asyncio.AbstractServer, str]:
    srv = await asyncio.start_server(server.handle, "127.0.0.1", 0)
    port = srv.sockets[0].getsockname()[1]
    return srv, f"http://127.0.0.1:{port}/v1/alertmanager"


def test_connection_keep_alive_chunked_and_reconnect() -> None:
    async def main() -> None:
        server = _Server(
            [
                _plain(200, b'{"a": 1}'),
                _chunked(b'{"chunked": true}'),  # then the server hangs up (idle timeout)
                _plain(503, b"busy", "connection: close\r\n"),
                _plain(200, b"{}"),
            ],
            close_after={1},
        )
        srv, url = await _serve(server)
        conn = Connection(url, "tok")
        try:
            assert await conn.post(b'{"n": 0}') == 200 and conn.body == b'{"a": 1}'
            assert await conn.post(b'{"n": 1}') == 200 and conn.body == b'{"chunked": true}'
            assert server.connections == 1  # keep-alive
            await asyncio.sleep(0.1)  # the server's close reaches the conn
            assert await conn.post(b'{"n": 2}') == 503  # on a new connection, sent once
            assert conn.writer is None  # `connection: close` honoured
            assert await conn.post(b'{"n": 3}') == 200
        finally:
            conn.close()
            srv.close()
            await srv.wait_closed()
        assert [b for _, b in server.received] == [b'{"n": %d}' % i for i in range(4)]
        head = server.received[0][0].decode()
        assert head.startswith("POST /v1/alertmanager HTTP/1.1\r\n")
        assert "Authorization: Bearer tok\r\n" in head
        assert server.connections == 3

    asyncio.run(main())


def test_connection_request_taken_then_dropped_is_a_failure() -> None:
    async def main() -> None:
        server = _Server([None], close_after=set())
        srv, url = await _serve(server)
        conn = Connection(url, "tok")
        try:
            with pytest.raises((asyncio.IncompleteReadError, ConnectionError)):
                await conn.post(b"{}")
        finally:
            conn.close()
            srv.close()
            await srv.wait_closed()
        assert len(server.received) == 1  # the fresh connection's request is not re-sent

    asyncio.run(main())


STORM: dict[str, Any] = {
    "budget_limit": 80,
    "devices": 200,
    "gpus_quarantined": 80,
    "quarantine_all_in_budget_s": 8.8,
    "webhook_ms": {"p50": 588.0, "p99": 3757.0},
    "achieved_rate": 1395,
    "offered_rate": 2000,
    "workflow_ids": 200,
    "workflow_runs": 200,
    "alerts_lost": 0,
    "alerts": 20000,
    "budget_exceeded": False,
    "escalation_notifications": 120,
    "settle_bound_s": 120.0,
    "worker_log": {"workflow task over 5 s": 109, "local activity timed out": 0},
    "worker_rss_peak_mb": 324.0,
    "cpu_window_s": 15.4,
    "cores": 2,
    "cpu_seconds": {"worker": 8.8, "temporal": 5.2, "webhook": 2.4},
    "slice_inventory_ms": 237,
    "slice_inventory_devices_ms": 373,
    "slice_inventory_devices": 16000,
    "slice_inventory_gpus": 8000,
    "webhook": {
        "temporal_calls": {"signal-with-start": 800},
        "deduplicated": {"recent": 18867, "in-flight": 317},
        "call_mean_ms": 263.0,
        "handling_mean_ms": 202.2,
        "handling_p99_s": 5.0,
    },
}


def test_findings_follow_the_figures() -> None:
    text = "\n".join(findings(STORM))
    assert "80 of the 80 GPUs within budget quarantined" in text
    assert "8.8 s after the first alert" in text and "p99 3757 ms" in text
    assert "never exceeded" in text and "still not quarantined" not in text
    assert "the largest share (54%) in the worker" in text
    assert "{'workflow task over 5 s': 109}" in text  # zero counts left out
    assert "237 ms" in text and "373 ms" in text
    assert "800 Temporal calls" in text and "inside the handler" in text

    worse = {
        **STORM,
        "gpus_quarantined": 74,
        "budget_exceeded": True,
        "workflow_runs": 320,
        "webhook_ms": {"p50": 5.0, "p99": 900.0},
    }
    text = "\n".join(findings(worse))
    assert "6 GPUs within budget were still not quarantined" in text
    assert "EXCEEDED" in text and "320 runs for 200 GPUs" in text
    assert "Temporal calls" not in text  # the webhook met its goal: no explanation needed

    old = {k: v for k, v in STORM.items() if k not in ("cpu_seconds", "webhook")}
    old.pop("slice_inventory_devices_ms")
    text = "\n".join(findings(old))
    assert "Storm CPU" not in text and "per-node GPU summary" not in text
