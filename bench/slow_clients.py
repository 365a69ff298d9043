"""Benchmark: slow clients against `sickbay webhook` (not a test; run it by hand, it prints JSON).

    .venv/bin/python -m bench.slow_clients [--connections 800] [--interval 5] [--seconds 40]

The attack of issue 17: `--connections` connections open at once, each trickling one header
byte every `--interval` seconds and never finishing its request. Starts `sickbay webhook` with
its default limits (SICKBAY_WEBHOOK_HEADER_TIMEOUT 10 s, SICKBAY_WEBHOOK_MAX_CONNECTIONS 256)
on a free loopback port, Temporal pointed at a closed port (alerts would get 503; /healthz
answers), and reports:
- how each slow connection ended: answered 503 at once (past the connection cap), 408 and
  closed (headers not complete in time), or still open when the run ends;
- seconds from the first connection until the server had closed every one of them;
- a normal client's `GET /healthz` during the attack: answered or refused, and its latency;
- the webhook's RSS at the attack's peak and after.
Everything it starts is stopped at the end.
"""

from __future__ import annotations

import argparse
import json
import os
import selectors
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx
import psutil

from harness.stack import free_port

SICKBAY = str(Path(sys.executable).parent / "sickbay")
TOKEN = "bench-slow-clients-" + "0123456789abcdef" * 2
REQUEST = b"POST /v1/alertmanager HTTP/1.1\r\nHost: sickbay\r\nX-Slow: " + b"a" * 4000


def _probe(port: int) -> tuple[int | None, float]:
    started = time.perf_counter()
    try:
        status = httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=10).status_code
    except httpx.HTTPError:
        status = None
    return status, (time.perf_counter() - started) * 1000


def run(connections: int, interval: float, seconds: float) -> dict[str, Any]:
    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("SICKBAY_")}
    env.update(SICKBAY_TEMPORAL_ADDRESS=f"127.0.0.1:{free_port()}", SICKBAY_WEBHOOK_TOKEN=TOKEN)
    proc = subprocess.Popen(
        [SICKBAY, "webhook", "--host", "127.0.0.1", "--port", str(port)],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    socks: list[socket.socket] = []
    try:
        deadline = time.monotonic() + 30
        while _probe(port)[0] != 200:
            if time.monotonic() > deadline or proc.poll() is not None:
                raise SystemExit("the webhook did not start")
            time.sleep(0.2)
        rss_idle = psutil.Process(proc.pid).memory_info().rss
        sel = selectors.DefaultSelector()
        started = time.monotonic()
        for _ in range(connections):
            s = socket.create_connection(("127.0.0.1", port), timeout=10)
            s.setblocking(False)
            s.send(REQUEST[:1])
            sel.register(s, selectors.EVENT_READ)
            socks.append(s)
        sent = dict.fromkeys(socks, 1)
        received = {s: b"" for s in socks}
        closed_at: dict[socket.socket, float] = {}
        probes: list[tuple[int | None, float]] = []
        rss_peak = 0
        next_byte = started + interval
        next_probe = started + 1.0
        while time.monotonic() - started < seconds and len(closed_at) < len(socks):
            for key, _ in sel.select(timeout=0.2):
                conn = key.fileobj
                assert isinstance(conn, socket.socket)
                try:
                    chunk = conn.recv(4096)
                except (BlockingIOError, ConnectionResetError):
                    chunk = b""
                received[conn] += chunk
                if not chunk:
                    closed_at[conn] = time.monotonic() - started
                    sel.unregister(conn)
            now = time.monotonic()
            if now >= next_byte:
                next_byte += interval
                for s in socks:
                    if s in closed_at:
                        continue
                    try:
                        s.send(REQUEST[sent[s] : sent[s] + 1])
                        sent[s] += 1
                    except OSError:
                        closed_at[s] = now - started
                        sel.unregister(s)
            if now >= next_probe:
                next_probe += 1.0
                probes.append(_probe(port))
                rss_peak = max(rss_peak, psutil.Process(proc.pid).memory_info().rss)
        sel.close()
        busy = sum(1 for r in received.values() if r.startswith(b"HTTP/1.1 503"))
        slow = sum(1 for r in received.values() if r.startswith(b"HTTP/1.1 408"))
        served = [ms for status, ms in probes if status == 200]
        return {
            "connections": connections,
            "interval_s": interval,
            "answered_503_at_once": busy,
            "answered_408_and_closed": slow,
            "closed_otherwise": len(closed_at) - busy - slow,
            "still_open_at_end": len(socks) - len(closed_at),
            "all_closed_after_s": round(max(closed_at.values()), 1)
            if len(closed_at) == len(socks)
            else None,
            "healthz_during_attack": {
                "probes": len(probes),
                "answered_200": len(served),
                "max_ms": round(max(served), 1) if served else None,
            },
            "rss_mib": {
                "idle": round(rss_idle / 2**20, 1),
                "peak": round(rss_peak / 2**20, 1),
                "after": round(psutil.Process(proc.pid).memory_info().rss / 2**20, 1),
            },
        }
    finally:
        for s in socks:
            s.close()
        proc.terminate()
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=5)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n", 1)[0])
    parser.add_argument("--connections", type=int, default=800)
    parser.add_argument("--interval", type=float, default=5.0)
    parser.add_argument("--seconds", type=float, default=40.0)
    args = parser.parse_args()
    print(json.dumps(run(args.connections, args.interval, args.seconds), indent=2))


if __name__ == "__main__":
    main()
