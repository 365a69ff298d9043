"""Benchmark 3: an alert storm on a 1,000-node x 8-GPU twin.

`alerts` firing alerts in `seconds` seconds (2,000/s by default) over `devices` distinct
physical GPUs, as Alertmanager would deliver them: `per_notification` alerts per POST, paced
evenly, at most `concurrency` POSTs in flight, a 5xx answer retried with backoff (Alertmanager
re-sends the whole notification). Per GPU the alerts cycle through four label sets: the
whole GPU (repeated: same fingerprint), two MIG slices of it (dcgm-exporter labels a MIG
series with the parent GPU's UUID plus GPU_I_ID, so they are siblings of one physical GPU) and
a second alert rule naming the same GPU. The twin is seeded with the `mig` topology.

The blast-radius budget is made binding: every generated runbook gets maxPerCluster 1%
(80 of the 8,000 GPUs), so the storm races 200 remediations for 80 leases. Measured:

- workflows started (goal: exactly one per physical GPU), alerts lost (every (workflow,
  fingerprint) pair must be recorded as an `alert` signal in the workflow's history),
- webhook latency per POST (p50/p99), notifications retried (the stack's webhook runs with
  its delivery spool: past SICKBAY_WEBHOOK_ACK_SECONDS, what Temporal has not accepted is
  journaled to disk and acknowledged, then delivered; the lost-alert check covers those too),
- time from the first alert until every GPU within budget is quarantined (the twin's request
  log), and the number of rules ever created vs the budget (never exceeded),
- progress over time (alerts acknowledged, workflows started, rules created) for the plot,
- where the machine's time went: CPU seconds of every process of the stack (and of this load
  generator) from the first alert until the storm settled, the webhook's own counters (Temporal
  calls per kind, alerts deduplicated, server-side handling time vs what the sender saw), and
  the worker's CPU for one budget-count inventory (the per-node summary count_devices reads)
  next to a full device conversion, so the findings can name the bottleneck from figures.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import random
import time
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import httpx
from temporalio.api.enums.v1 import EventType
from temporalio.service import RPCError

from bench.common import (
    dcgm_alert,
    gpus,
    notification,
    rss_mb,
    rule_creations,
    set_budget,
    summary,
    until,
    worker_log_signs,
)
from bench.stacks import open_stack, webhook_token, worker_pid
from contract.names import (
    ANN_DEVICE_KEY,
    BUDGET_WORKFLOW_ID,
    LABEL_MANAGED_BY,
    MANAGED_BY_VALUE,
    QRY_BUDGET_STATE,
    WF_REMEDIATE,
    device_workflow_id,
)

log = logging.getLogger("bench.storm")

RETRIES = 5  # Alertmanager keeps retrying; five re-sends with backoff cover a 10 s storm
POST_TIMEOUT = 30.0  # seconds per POST; a webhook answer slower than that counts as a failure


def storm_alerts(devices: list[dict[str, Any]], total: int) -> list[dict[str, Any]]:
    out = []
    for k in range(total):
        g = devices[k % len(devices)]
        variant = (k // len(devices)) % 4
        node, uuid, index = g["node"], g["uuid"], g["index"]
        if variant == 0:
            out.append(dcgm_alert(node, uuid, index, fingerprint=f"{node}-{uuid}-gpu"))
        elif variant in (1, 2):
            out.append(
                dcgm_alert(
                    node,
                    uuid,
                    index,
                    fingerprint=f"{node}-{uuid}-mig{variant}",
                    mig_instance=variant,
                )
            )
        else:
            a = dcgm_alert(node, uuid, index, xid=48, fingerprint=f"{node}-{uuid}-ecc")
            a["labels"]["alertname"] = "SickbayGpuEccDoubleBitError"
            out.append(a)
    random.Random(7).shuffle(out)
    return out


def slice_inventory_cost(info: Any) -> dict[str, Any]:
    """CPU of the cluster-wide ResourceSlice reads, measured with the worker's own client code
    against the same twin (best of 3, process CPU time so other processes do not count):
    `summary_ms` for the per-node GPU summary count-devices reads (activities/kube/devices.py
    `gpu_inventory`), `devices_ms` for converting every device (`list_slice_devices`, what the
    count read before), `devices` and `gpus` found."""
    from activities.kube.client import Kube, KubeSettings
    from activities.kube.devices import gpu_inventory, list_slice_devices

    kube = Kube.from_settings(KubeSettings(kubeconfig=info.kubeconfig))

    def cpu_ms(fn: Any) -> tuple[float, Any]:
        best, value = float("inf"), None
        for _ in range(3):
            t0 = time.process_time()
            value = fn()
            best = min(best, (time.process_time() - t0) * 1000)
        return best, value

    devices_ms, devices = cpu_ms(lambda: list_slice_devices(kube, fresh=True))
    summary_ms, per_node = cpu_ms(lambda: gpu_inventory(kube, max_age=0))
    return {
        "devices_ms": round(devices_ms),
        "summary_ms": round(summary_ms),
        "devices": len(devices),
        "gpus": sum(per_node.values()),
    }


def cpu_seconds(pid: int) -> float | None:
    """User + system CPU seconds of one process so far (/proc), None once it is gone."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def cpu_snapshot(pids: dict[str, int]) -> dict[str, float]:
    out = {name: cpu_seconds(pid) for name, pid in pids.items()}
    t = os.times()
    out["load generator"] = t.user + t.system
    return {k: v for k, v in out.items() if v is not None}


def webhook_metrics(url: str) -> dict[str, Any]:
    """The webhook's Prometheus counters that explain its latency: Temporal calls by kind,
    alerts deduplicated by route, mean call time, and the server-side handling-time histogram
    (cumulative counts per upper bound in seconds)."""
    try:
        text = httpx.get(url, timeout=10.0).text
    except httpx.HTTPError:
        return {}
    calls: dict[str, float] = {}
    dedup: dict[str, float] = {}
    handled: dict[str, float] = {}
    sums: dict[str, float] = {}
    for line in text.splitlines():
        if line.startswith("#") or " " not in line:
            continue
        name, value = line.rsplit(" ", 1)
        label = name.split('"')[1] if '"' in name else ""
        if name.startswith("sickbay_webhook_temporal_calls_total"):
            calls[label] = float(value)
        elif name.startswith("sickbay_webhook_alerts_deduplicated_total"):
            dedup[label] = float(value)
        elif name.startswith("sickbay_webhook_request_seconds_bucket"):
            handled[label] = float(value)
        elif name.split("{")[0] in (
            "sickbay_webhook_alerts_spooled_total",
            "sickbay_webhook_spool_pending",
            "sickbay_webhook_spool_redelivered_total",
            "sickbay_webhook_temporal_call_seconds_sum",
            "sickbay_webhook_temporal_call_seconds_count",
            "sickbay_webhook_request_seconds_sum",
            "sickbay_webhook_request_seconds_count",
        ):
            sums[name.split("{")[0]] = float(value)
    n_calls = sums.get("sickbay_webhook_temporal_call_seconds_count", 0.0)
    n_req = sums.get("sickbay_webhook_request_seconds_count", 0.0)
    return {
        "temporal_calls": {k: int(v) for k, v in calls.items()},
        "deduplicated": {k: int(v) for k, v in dedup.items()},
        "call_mean_ms": round(
            1000 * sums.get("sickbay_webhook_temporal_call_seconds_sum", 0.0) / n_calls, 1
        )
        if n_calls
        else None,
        "handling_mean_ms": round(
            1000 * sums.get("sickbay_webhook_request_seconds_sum", 0.0) / n_req, 1
        )
        if n_req
        else None,
        "handling_buckets": {k: int(v) for k, v in handled.items()},
        # Delivery spool: alerts acknowledged before Temporal took them (journaled on disk),
        # still pending when read, and sent again after a failed call.
        "spooled": int(sums.get("sickbay_webhook_alerts_spooled_total", 0)),
        "spool_pending": int(sums.get("sickbay_webhook_spool_pending", 0)),
        "spool_redelivered": int(sums.get("sickbay_webhook_spool_redelivered_total", 0)),
    }


def bucket_percentile(buckets: dict[str, int], q: float) -> float | None:
    """Upper bound (seconds) of the histogram bucket holding the q-quantile."""
    total = buckets.get("+Inf", 0)
    if not total:
        return None
    for bound, count in sorted(
        ((float(k), v) for k, v in buckets.items() if k != "+Inf"), key=lambda kv: kv[0]
    ):
        if count >= q * total:
            return bound
    return float("inf")


def quarantined_gpus(kube_url: str, creates: list[dict[str, Any]]) -> int:
    """Distinct physical GPUs with a Sickbay DeviceTaintRule (a MIG GPU gets one rule per
    slice, so rules outnumber GPUs)."""
    if not creates:
        return 0
    body = httpx.get(kube_url + creates[0]["path"], timeout=60.0).json()
    keys = {
        (r["metadata"].get("annotations") or {}).get(ANN_DEVICE_KEY)
        for r in body.get("items", [])
        if (r["metadata"].get("labels") or {}).get(LABEL_MANAGED_BY) == MANAGED_BY_VALUE
    }
    return len(keys - {None})


class Connection:
    """One keep-alive HTTP/1.1 connection to the webhook: the load generator's own minimal
    client. Alertmanager does not run on Sickbay's cores, but this generator does: httpx's
    pool re-checks every one of its 64 connections on each request (a socket poll each), which
    cost the generator ~5 CPU-s per storm that the webhook and Temporal then lacked. Requests
    are written pre-encoded and the answer read by Content-Length (or chunked)."""

    def __init__(self, url: str, token: str) -> None:
        parts = urlsplit(url)
        self.host = parts.hostname or "127.0.0.1"
        self.port = parts.port or 80
        self.head = (
            f"POST {parts.path or '/'} HTTP/1.1\r\nHost: {self.host}:{self.port}\r\n"
            f"Authorization: Bearer {token}\r\nContent-Type: application/json\r\n"
            "Content-Length: "
        ).encode()
        self.reader: asyncio.StreamReader | None = None
        self.writer: asyncio.StreamWriter | None = None
        self.body = b""  # the last answer's body

    async def connect(self) -> None:
        self.close()
        self.reader, self.writer = await asyncio.open_connection(self.host, self.port)

    def close(self) -> None:
        if self.writer is not None:
            self.writer.close()
        self.reader = self.writer = None

    async def post(self, body: bytes) -> int:
        """Status code of one POST (at most POST_TIMEOUT); raises OSError, TimeoutError,
        EOFError or ValueError on a failure."""
        reused = self.writer is not None
        if not reused:
            await self.connect()
        try:
            return await asyncio.wait_for(self._exchange(body), POST_TIMEOUT)
        except (ConnectionError, asyncio.IncompleteReadError) as exc:
            self.close()
            dropped = not isinstance(exc, asyncio.IncompleteReadError) or not exc.partial
            if not (reused and dropped):
                raise
        # A connection opened before this request failed before any answer: the server closed
        # it while idle (keep-alive timeout). Send once more on a new one, as Alertmanager
        # would; a repeat is deduplicated by the webhook.
        await self.connect()
        return await asyncio.wait_for(self._exchange(body), POST_TIMEOUT)

    async def _exchange(self, body: bytes) -> int:
        assert self.reader is not None and self.writer is not None
        self.writer.write(self.head + str(len(body)).encode() + b"\r\n\r\n" + body)
        await self.writer.drain()
        status = int((await self.reader.readuntil(b"\r\n")).split()[1])
        length, chunked, close = 0, False, False
        while (line := await self.reader.readuntil(b"\r\n")) != b"\r\n":
            name, _, value = line.decode("latin-1").partition(":")
            name, value = name.strip().lower(), value.strip().lower()
            if name == "content-length":
                length = int(value)
            elif name == "transfer-encoding" and "chunked" in value:
                chunked = True
            elif name == "connection" and value == "close":
                close = True
        if chunked:
            chunks = []
            while size := int((await self.reader.readuntil(b"\r\n")).split(b";")[0], 16):
                chunks.append((await self.reader.readexactly(size + 2))[:-2])
            await self.reader.readuntil(b"\r\n")
            self.body = b"".join(chunks)
        else:
            self.body = await self.reader.readexactly(length)
        if close:
            self.close()
        return status


async def recorded_fingerprints(client: Any, wf_id: str, run_id: str | None = None) -> set[str]:
    history = await client.get_workflow_handle(wf_id, run_id=run_id).fetch_history()
    seen: set[str] = set()
    for e in history.events:
        if e.event_type == EventType.EVENT_TYPE_WORKFLOW_EXECUTION_SIGNALED:
            for p in e.workflow_execution_signaled_event_attributes.input.payloads:
                with contextlib.suppress(ValueError, KeyError, TypeError):
                    data = json.loads(p.data)  # one alert, or a batched 'alerts' list
                    for ev in data if isinstance(data, list) else [data]:
                        seen.add(ev["fingerprint"])
        elif e.event_type == EventType.EVENT_TYPE_WORKFLOW_EXECUTION_STARTED:
            for p in e.workflow_execution_started_event_attributes.input.payloads:
                with contextlib.suppress(ValueError, KeyError, TypeError):
                    for a in json.loads(p.data).get("alerts") or []:
                        seen.add(a["fingerprint"])
    return seen


async def run(
    nodes: int = 1000,
    gpus_per_node: int = 8,
    devices: int = 200,
    alerts: int = 20_000,
    seconds: float = 10.0,
    per_notification: int = 20,
    concurrency: int = 64,
    cluster_budget: str = "1%",
    settle: float = 120.0,
) -> dict[str, Any]:
    from contract.runbook import BudgetPolicy
    from worker.settings import Settings
    from worker.temporal import connect

    # The runbook's own validation and rounding (a whole percent, rounded down): a budget the
    # worker would refuse must not silently leave the generated runbooks' default in force.
    policy = BudgetPolicy.model_validate({"maxPerPool": "50%", "maxPerCluster": cluster_budget})
    budget_limit = BudgetPolicy.limit(policy.max_per_cluster, nodes * gpus_per_node)
    signs: dict[str, int] = {}  # filled from the worker's log when the stack stops
    t_boot = time.monotonic()
    stack = await asyncio.to_thread(
        open_stack,
        nodes=nodes,
        gpus_per_node=gpus_per_node,
        topology="mig",
        slices_per_gpu=2,
        time_scale=1.0,
    )
    boot_s = time.monotonic() - t_boot
    try:
        info = stack.info
        assert info is not None
        set_budget(info.runbooks_dir, "50%", cluster_budget)
        inventory = await asyncio.to_thread(slice_inventory_cost, info)
        all_gpus = gpus(info.kube_url)
        chosen = random.Random(11).sample(all_gpus, devices)
        storm = storm_alerts(chosen, alerts)
        batches = [storm[i : i + per_notification] for i in range(0, len(storm), per_notification)]
        interval = seconds / len(batches)
        pid = worker_pid(stack)
        rss: list[tuple[float, float]] = []
        t_origin = time.time()

        async def sample_rss() -> None:
            while True:
                with contextlib.suppress(OSError):
                    rss.append((time.time() - t_origin, rss_mb(pid)))
                await asyncio.sleep(1.0)

        rss_task = asyncio.create_task(sample_rss())
        token = webhook_token(stack)
        post_ms: list[float] = []
        acked: list[tuple[float, int]] = []  # (time, alerts) of each 200
        codes: dict[int, int] = {}
        retried = 0
        failed_batches = 0
        webhook_base = info.webhook_url.rsplit("/v1/", 1)[0]
        connections: asyncio.Queue[Connection] = asyncio.Queue()
        for _ in range(concurrency):
            conn = Connection(info.webhook_url, token)
            await conn.connect()  # Alertmanager's connections are open before a storm
            connections.put_nowait(conn)
        async with httpx.AsyncClient(timeout=30.0) as http:
            await http.get(webhook_base + "/healthz")
        bodies = [json.dumps(notification(b)).encode() for b in batches]
        cpu_before = cpu_snapshot(info.pids)
        t_start = time.time()

        async def send(i: int, batch: list[dict[str, Any]]) -> None:
            nonlocal retried, failed_batches
            await asyncio.sleep(max(0.0, t_start + i * interval - time.time()))
            conn = await connections.get()  # at most `concurrency` notifications in flight
            try:
                for attempt in range(RETRIES + 1):
                    t0 = time.time()
                    try:
                        code = await conn.post(bodies[i])
                    except (OSError, EOFError, ValueError, IndexError, TimeoutError):
                        conn.close()  # reconnects on the next use
                        code = 599
                    t1 = time.time()
                    post_ms.append((t1 - t0) * 1000)
                    codes[code] = codes.get(code, 0) + 1
                    if code == 200:
                        acked.append((t1, len(batch)))
                        return
                    if attempt < RETRIES:
                        retried += 1
                        await asyncio.sleep(0.5 * 2**attempt)
                failed_batches += 1
            finally:
                connections.put_nowait(conn)

        await asyncio.gather(*(send(i, b) for i, b in enumerate(batches)))
        t_sent = time.time()
        while not connections.empty():
            connections.get_nowait().close()

        client = await connect(
            Settings(temporal_address=info.temporal_address, temporal_namespace=info.namespace)
        )
        ids = sorted({device_workflow_id(g["node"], g["uuid"]) for g in chosen})

        async def settled() -> bool:
            # Every remediation has left guarding (quarantined or refused by the budget).
            count = await client.count_workflows(
                f"WorkflowType = '{WF_REMEDIATE}' AND SickbayPhase IN "
                "('holding', 'evicting', 'awaiting-replacement', 'closed', 'escalated')"
            )
            return count.count >= len(ids)

        with contextlib.suppress(TimeoutError):
            await until("every remediation past the budget guard", settled, settle, 1.0)
        t_settled = time.time()
        cpu_after = cpu_snapshot(info.pids)
        hook = await asyncio.to_thread(webhook_metrics, webhook_base + "/metrics")
        await asyncio.sleep(2.0)  # stragglers: a late create would show a budget breach
        creates = [r for r in rule_creations(info.kube_url) if r["time"] >= t_start]
        started = (await client.count_workflows(f"WorkflowType = '{WF_REMEDIATE}'")).count
        # Alerts lost: every (workflow, fingerprint) pair must be in that workflow's history.
        expected: dict[str, set[str]] = {}
        for a in storm:
            wid = device_workflow_id(a["labels"]["Hostname"], a["labels"]["UUID"])
            expected.setdefault(wid, set()).add(a["fingerprint"])
        lost = 0
        start_times: list[float] = []
        runs_total = 0
        for wid in ids:
            got: set[str] = set()
            runs = [r async for r in client.list_workflows(f"WorkflowId = '{wid}'")]
            runs_total += len(runs)
            for run_ in runs:
                got |= await recorded_fingerprints(client, wid, run_.run_id)
            if runs:
                start_times.append(min(r.start_time.timestamp() for r in runs))
            lost += len(expected.get(wid, set()) - got)
        quarantined = quarantined_gpus(info.kube_url, creates)
        pages = len(stack.notifications())
        try:
            state = await client.get_workflow_handle(BUDGET_WORKFLOW_ID).query(QRY_BUDGET_STATE)
            leases = len(state.get("leases", [])) if isinstance(state, dict) else None
        except RPCError:  # no remediation reached the budget guard
            leases = None
        rss_task.cancel()
        outcomes: dict[str, int] = {}
        for phase in ("holding", "closed", "escalated", "guarding", "confirming", "quarantining"):
            c = await client.count_workflows(
                f"WorkflowType = '{WF_REMEDIATE}' AND SickbayPhase = '{phase}'"
            )
            if c.count:
                outcomes[phase] = c.count
        failed_runs = (
            await client.count_workflows(
                f"WorkflowType = '{WF_REMEDIATE}' AND ExecutionStatus = 'Failed'"
            )
        ).count
        quarantine_s = (max(r["time"] for r in creates) - t_start) if creates else None
        return {
            "twin": f"{nodes} nodes x {gpus_per_node} GPUs (mig, 2 slices each)",
            "boot_seconds": round(boot_s, 1),
            "alerts": alerts,
            "devices": devices,
            "notifications": len(batches),
            "per_notification": per_notification,
            "send_seconds": round(t_sent - t_start, 2),
            "offered_rate": round(alerts / seconds),
            "achieved_rate": round(sum(n for _, n in acked) / max(1e-9, t_sent - t_start)),
            "codes": codes,
            "retried": retried,
            "failed_notifications": failed_batches,
            "webhook_ms": summary(post_ms),
            "workflow_ids": len([1 for t in start_times]),
            "workflow_runs": runs_total,
            "runs_visible": started,
            "escalation_notifications": pages,
            "alerts_lost": lost,
            "distinct_alerts": sum(len(v) for v in expected.values()),
            "budget": f"maxPerCluster {cluster_budget} = {budget_limit} GPUs",
            "budget_limit": budget_limit,
            "rules_created": len(creates),
            "gpus_quarantined": quarantined,
            "budget_leases_held": leases,
            "budget_exceeded": quarantined > budget_limit,
            "phases": outcomes,
            "failed_runs": failed_runs,
            "quarantine_all_in_budget_s": quarantine_s,
            "settle_bound_s": settle,
            "slice_inventory_ms": inventory["summary_ms"],
            "slice_inventory_devices_ms": inventory["devices_ms"],
            "slice_inventory_devices": inventory["devices"],
            "slice_inventory_gpus": inventory["gpus"],
            # CPU seconds per process from the first alert until every remediation was past
            # the budget guard (or the settle bound), over `cpu_window_s` wall seconds.
            "cpu_window_s": round(t_settled - t_start, 1),
            "cpu_seconds": {
                k: round(cpu_after[k] - cpu_before[k], 1)
                for k in sorted(cpu_after, key=lambda k: cpu_before.get(k, 0.0) - cpu_after[k])
                if k in cpu_before
            },
            "cores": os.cpu_count(),
            "webhook": {
                **hook,
                "handling_p50_s": bucket_percentile(hook.get("handling_buckets", {}), 0.5),
                "handling_p99_s": bucket_percentile(hook.get("handling_buckets", {}), 0.99),
            },
            "worker_log": signs,
            "worker_rss_peak_mb": round(max((v for _, v in rss), default=0.0), 1),
            "worker_rss": [(round(t - (t_start - t_origin), 1), round(v, 1)) for t, v in rss],
            "progress": {
                "acked": sorted((t - t_start, n) for t, n in acked),
                "started": sorted(t - t_start for t in start_times),
                "rules": sorted(r["time"] - t_start for r in creates),
            },
        }
    finally:
        signs.update(worker_log_signs(stack.dir))
        await asyncio.to_thread(stack.stop)


def findings(st: dict[str, Any]) -> list[str]:
    """Plain statements of what the storm's figures say against its goals, and where the time
    went, all computed from the measured results (older results lack some figures: those
    statements are left out)."""
    from activities.kube.devices import SLICE_TTL

    out: list[str] = []
    in_budget = min(st["budget_limit"], st["devices"])
    q_s = st.get("quarantine_all_in_budget_s")
    w = st.get("webhook_ms") or {}
    quarantined = st.get("gpus_quarantined", 0)
    when = f"the last in-budget rule {q_s:.1f} s after the first alert" if q_s else "no rule"
    out.append(
        f"Storm: {quarantined} of the {in_budget} GPUs within budget quarantined, {when} "
        f"(goal 30 s); the webhook acknowledged {st['achieved_rate']} alerts/s of the "
        f"{st['offered_rate']}/s offered, p50 {w.get('p50', 0):.0f} ms / p99 "
        f"{w.get('p99', 0):.0f} ms per notification (goal p99 1 s); {st['workflow_ids']} "
        f"workflow ids, {st['workflow_runs']} runs, {st['alerts_lost']} alerts lost; budget "
        f"{'EXCEEDED' if st.get('budget_exceeded') else 'never exceeded'}."
    )
    if quarantined < in_budget:
        out.append(
            f"Storm: {in_budget - quarantined} GPUs within budget were still not quarantined "
            f"{st.get('settle_bound_s', 0):.0f} s after the last alert."
        )
    cpu = st.get("cpu_seconds") or {}
    window = st.get("cpu_window_s") or 0
    if cpu and window:
        cores = st.get("cores") or 2
        used = sum(cpu.values())
        parts = ", ".join(f"{k} {v:.1f} s" for k, v in cpu.items())
        top = next(iter(cpu))
        out.append(
            f"Storm CPU, first alert until every remediation was past the budget guard "
            f"({window:.0f} s, {cores} cores = {cores * window:.0f} CPU-s): {parts}; "
            f"{100 * used / (cores * window):.0f}% of the machine, the largest share "
            f"({100 * cpu[top] / max(used, 1e-9):.0f}%) in the {top}."
        )
    signs = {k: v for k, v in (st.get("worker_log") or {}).items() if v}
    if signs:
        out.append(
            f"Storm: worker overload signs in its log: {signs}; worker RSS peak "
            f"{st.get('worker_rss_peak_mb', 0):.0f} MiB."
        )
    if st.get("slice_inventory_devices_ms") is not None:
        out.append(
            f"Storm: one budget count reads a per-node GPU summary of the cluster's "
            f"ResourceSlices: {st['slice_inventory_ms']} ms of worker CPU to list, parse and "
            f"summarise {st['slice_inventory_devices']} devices "
            f"({st.get('slice_inventory_gpus')} GPUs), against "
            f"{st['slice_inventory_devices_ms']} ms to list them as device objects; loaded at "
            f"most once per {SLICE_TTL:.0f} s and shared by concurrent counts."
        )
    hook = st.get("webhook") or {}
    if hook.get("spooled"):
        out.append(
            f"Storm webhook: {hook['spooled']} alerts Temporal had not accepted within the "
            "webhook's ack deadline (SICKBAY_WEBHOOK_ACK_SECONDS) were journaled to its "
            "delivery spool (flushed to disk) and acknowledged, then delivered in the "
            f"background ({hook.get('spool_redelivered', 0)} sent again after a failed call, "
            f"{hook.get('spool_pending', 0)} still pending when the run ended); the "
            "alerts-lost check above counts them in the workflows' histories."
        )
    if w.get("p99", 0) > 1000 and hook.get("temporal_calls") is not None:
        calls = hook["temporal_calls"]
        dedup = hook.get("deduplicated") or {}
        served = sum(calls.values())
        text = (
            f"Storm webhook: {served} Temporal calls ({calls}) for {st['alerts']} alerts; "
            f"{sum(dedup.values())} alerts answered without a call of their own ({dedup}); "
            f"mean call {hook.get('call_mean_ms')} ms including the wait for a call slot. "
        )
        hp99 = hook.get("handling_p99_s")
        if hp99 is not None:
            inside = hp99 * 1000 >= 0.5 * w["p99"]
            text += (
                f"Handling inside the webhook: mean {hook.get('handling_mean_ms')} ms, p99 "
                f"<= {hp99:g} s (histogram bucket) against the {w['p99'] / 1000:.1f} s the "
                "sender saw: "
                + (
                    "the time is spent inside the handler, waiting for Temporal's answers."
                    if inside
                    else "most of it passes before the handler runs (connection accept and "
                    "the event loop of a process sharing the cores)."
                )
            )
        out.append(text)
    if st["workflow_runs"] > st["workflow_ids"]:
        out.append(
            f"Storm: {st['workflow_runs']} runs for {st['workflow_ids']} GPUs and "
            f"{st['escalation_notifications']} escalations: a remediation refused by the "
            "budget closes, and the next repeat of its alert starts a new run that is "
            "refused and escalates again (one escalation per incident is not kept)."
        )
    return out
