"""Benchmark: Alertmanager's notifications while clients without the token hold connections.

    python -m bench --only abuse

On the embedded stack (dev server, twin, worker, `sickbay webhook` with its default limits:
256 connections, a quarter of them per client address), `connections` attacker connections
from `addresses` loopback addresses each send a POST's headers without a valid token and one
byte of a 5,000-byte body, then wait; every connection the server closes is opened again a
second later, so about `connections` are held or being opened the whole time. Meanwhile a
client with the token (Alertmanager's shape: one kept-alive connection) POSTs a firing DCGM
alert every `every` seconds for `seconds` seconds. Reports the good POSTs' latency and answers,
and how the attackers' connections ended (401 and closed, 503 past a cap, 408, still open).
"""

from __future__ import annotations

import asyncio
import selectors
import socket
import threading
import time
from typing import Any

import httpx

from bench.common import dcgm_alert, gpus, notification, summary
from bench.stacks import open_stack, webhook_token

BODY_BYTES = 5000
REOPEN_AFTER = 1.0  # seconds before an attacker slot opens a new connection


def _attack(
    port: int, connections: int, addresses: int, stop: threading.Event, out: dict[str, Any]
) -> None:
    head = (
        b"POST /v1/alertmanager HTTP/1.1\r\nHost: sickbay\r\nContent-Type: application/json\r\n"
        + f"Content-Length: {BODY_BYTES}\r\n\r\n".encode()
        + b"{"
    )
    sel = selectors.DefaultSelector()
    answers = {"401": 0, "503": 0, "408": 0, "other": 0, "refused": 0}
    held_for: list[float] = []
    reopen: list[tuple[float, int]] = [(0.0, slot) for slot in range(connections)]
    opened = 0
    peak = 0

    def open_slot(slot: int) -> None:
        nonlocal opened
        source = f"127.2.0.{slot % addresses + 1}"
        try:
            s = socket.create_connection(("127.0.0.1", port), timeout=5, source_address=(source, 0))
            s.sendall(head)
        except OSError:
            answers["refused"] += 1
            reopen.append((time.monotonic() + REOPEN_AFTER, slot))
            return
        s.setblocking(False)
        opened += 1
        sel.register(s, selectors.EVENT_READ, (slot, time.monotonic(), bytearray()))

    while not stop.is_set():
        now = time.monotonic()
        due = [slot for at, slot in reopen if at <= now]
        reopen[:] = [(at, slot) for at, slot in reopen if at > now]
        for slot in due:
            open_slot(slot)
        peak = max(peak, len(sel.get_map()))
        for key, _ in sel.select(timeout=0.05):
            s = key.fileobj
            assert isinstance(s, socket.socket)
            slot, since, got = key.data
            try:
                chunk = s.recv(4096)
            except (BlockingIOError, ConnectionResetError):
                chunk = b""
            got += chunk
            if chunk:
                continue
            sel.unregister(s)
            s.close()
            code = bytes(got[9:12]).decode("latin-1")
            answers[code if code in answers else "other"] += 1
            held_for.append(time.monotonic() - since)
            reopen.append((time.monotonic() + REOPEN_AFTER, slot))
    still_open = len(sel.get_map())
    for key in list(sel.get_map().values()):
        key.fileobj.close()  # type: ignore[union-attr]
    sel.close()
    out.update(
        opened=opened,
        peak_open=peak,
        answered=answers,
        still_open_at_end=still_open,
        held_s=summary(held_for) if held_for else None,
    )


async def run(
    connections: int = 800, seconds: float = 20.0, addresses: int = 16, every: float = 0.2
) -> dict[str, Any]:
    stack = open_stack()
    try:
        assert stack.info is not None
        kube_url, webhook_url = stack.info.kube_url, stack.info.webhook_url
        port = httpx.URL(webhook_url).port
        assert port is not None
        gpu = gpus(kube_url)[0]
        body = notification([dcgm_alert(gpu["node"], gpu["uuid"], gpu["index"], xid=79)])
        headers = {"Authorization": f"Bearer {webhook_token(stack)}"}
        stop, attack = threading.Event(), dict[str, Any]()
        attacker = threading.Thread(
            target=_attack, args=(port, connections, addresses, stop, attack), daemon=True
        )
        attacker.start()
        await asyncio.sleep(2.0)  # the attackers' connections are open before the first POST
        latencies: list[float] = []
        codes: dict[str, int] = {}
        async with httpx.AsyncClient(timeout=10) as client:
            t_end = time.monotonic() + seconds
            while time.monotonic() < t_end:
                started = time.perf_counter()
                try:
                    resp = await client.post(webhook_url, json=body, headers=headers)
                    code = str(resp.status_code)
                except httpx.HTTPError as exc:
                    code = type(exc).__name__
                latencies.append((time.perf_counter() - started) * 1000)
                codes[code] = codes.get(code, 0) + 1
                await asyncio.sleep(every)
        stop.set()
        attacker.join(timeout=30)
        return {
            "attackers": connections,
            "attacker_addresses": addresses,
            "seconds": seconds,
            "good_posts": len(latencies),
            "good_answers": codes,
            "good_latency_ms": summary(latencies),
            "over_1s": sum(1 for ms in latencies if ms > 1000),
            "attack": attack,
        }
    finally:
        stack.__exit__(None, None, None)


def summary_rows(a: dict[str, Any]) -> list[str]:
    lat = a["good_latency_ms"]
    ok = a["over_1s"] == 0 and set(a["good_answers"]) <= {"200", "202"}
    return [
        f"| webhook: good POSTs while {a['attackers']} connections without the token are held, "
        f"p99 (max) | {lat['p99']:.0f} ms ({lat['max']:.0f} ms), {a['over_1s']} over 1 s, "
        f"answers {a['good_answers']} | <= 1 s, all 2xx | {'met' if ok else '**missed**'} |"
    ]


def section(a: dict[str, Any]) -> list[str]:
    att, lat = a["attack"], a["good_latency_ms"]
    held = att.get("held_s") or {}
    return [
        "## 9. The webhook under clients without the token",
        "",
        f"`bench/webhook_abuse.py` (`python -m bench --only abuse`): {a['attackers']} attacker "
        f"connections from {a['attacker_addresses']} loopback addresses each send a POST's "
        "headers without a valid token and one byte of its body, and open again 1 s after the "
        f"server closes them; meanwhile Alertmanager's shape POSTs a firing alert every 0.2 s "
        f"for {a['seconds']:g} s over one kept-alive connection, on the embedded stack with "
        "the webhook's default limits.",
        "",
        "| | measured |",
        "|---|---|",
        f"| good POSTs | {a['good_posts']}, answers {a['good_answers']} |",
        f"| good POST latency p50 / p99 / max | {lat['p50']:.0f} / {lat['p99']:.0f} / "
        f"{lat['max']:.0f} ms |",
        f"| attacker connections opened (peak open at once) | {att['opened']} "
        f"({att['peak_open']}) |",
        f"| how they ended | {att['answered']} |",
        f"| an attacker connection stayed open p50 / p99 | "
        f"{held.get('p50', 0) * 1000:.0f} / {held.get('p99', 0) * 1000:.0f} ms |",
        "",
    ]
