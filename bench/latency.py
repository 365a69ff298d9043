"""Benchmark 1: alert -> DeviceTaintRule created, Sickbay vs a straight-line script.

On one embedded stack (dev server + twin + `sickbay worker` + `sickbay webhook`) with a twin of
`nodes` x 8 GPUs and no workloads, for each of `pairs` GPUs:

1. POST one Alertmanager notification naming the GPU to Sickbay's webhook (time t0);
2. after `gap` seconds, POST the same notification to the peer (bench/peer.py: resolve the
   device with the same client calls, create the rule named `peer-<name>`) (time t1);
3. after `gap` seconds, the next GPU.

Latency = the twin's answer time of the successful DeviceTaintRule create (its request log)
minus the POST's send time; both clocks are this machine's. The ratio is taken per pair
(same GPU, same seconds of machine load).

Where the time goes (per remediation, from the workflow's history and the request log):
webhook -> WorkflowExecutionStarted, started -> first workflow task picked up, the task's
Kubernetes calls (count, summed server time) up to the create, and the rest (the worker's
own CPU: local-activity scheduling, budget lease round trip to Temporal, payload conversion).

The budget of every generated runbook is widened to 100% (a twin of `nodes` x 8 GPUs would
otherwise refuse quarantines past the shipped 10% per cluster): this measures the hot path,
the storm benchmark measures the budget.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import subprocess
import sys
import time
from typing import Any

import httpx
from temporalio.api.enums.v1 import EventType

from bench.common import (
    dcgm_alert,
    gpus,
    notification,
    requests_log,
    rule_creations,
    set_budget,
    summary,
    until,
)
from bench.stacks import open_stack, webhook_token
from worker.stack import free_port
from workflows.constants import device_workflow_id, taint_rule_name

log = logging.getLogger("bench.latency")

PEER_PREFIX = "peer-"
PEER_AGENT = "sickbay-bench-peer/1"


def _ts(event: Any) -> float:
    return float(event.event_time.ToDatetime().timestamp()) if event.HasField("event_time") else 0.0


async def breakdown(client: Any, wf_id: str) -> dict[str, float]:
    """Server-side timestamps of a remediation's first moments (epoch seconds)."""
    history = await client.get_workflow_handle(wf_id).fetch_history()
    out: dict[str, float] = {}
    for e in history.events:
        t = e.event_type
        if t == EventType.EVENT_TYPE_WORKFLOW_EXECUTION_STARTED and "started" not in out:
            out["started"] = _ts(e)
        elif t == EventType.EVENT_TYPE_WORKFLOW_TASK_STARTED and "task_started" not in out:
            out["task_started"] = _ts(e)
        elif t == EventType.EVENT_TYPE_WORKFLOW_TASK_COMPLETED and "task_completed" not in out:
            out["task_completed"] = _ts(e)
    return out


async def run(pairs: int = 200, nodes: int = 26, gap: float = 0.2) -> dict[str, Any]:
    from worker.settings import Settings
    from worker.temporal import connect

    stack = await asyncio.to_thread(open_stack, nodes=nodes, gpus_per_node=8, time_scale=1.0)
    peer: subprocess.Popen[bytes] | None = None
    try:
        info = stack.info
        assert info is not None
        set_budget(info.runbooks_dir, "100%", "100%")
        peer_port = free_port()
        peer = await asyncio.to_thread(
            subprocess.Popen,
            [
                sys.executable,
                "-m",
                "bench.peer",
                "--port",
                str(peer_port),
                "--kubeconfig",
                info.kubeconfig,
                "--prefix",
                PEER_PREFIX,
            ],
            env={**os.environ, "PYTHONPATH": str(stack.sickbay_env()["PYTHONPATH"])},
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        peer_url = f"http://127.0.0.1:{peer_port}"
        devices = gpus(info.kube_url)[:pairs]
        token = webhook_token(stack)
        client = await connect(
            Settings(temporal_address=info.temporal_address, temporal_namespace=info.namespace)
        )
        sent: dict[str, tuple[float, float]] = {}  # rule name -> (sickbay t0, peer t1)
        codes: list[int] = []
        async with httpx.AsyncClient(timeout=30.0) as http:

            async def peer_up() -> bool:
                try:
                    return (await http.get(peer_url)).status_code == 200
                except httpx.HTTPError:
                    return False

            await until("the peer script to listen", peer_up, 30.0, 0.1)
            # Warm both paths once (imports, connection pools, discovery) on a GPU not counted.
            warm = gpus(info.kube_url)[-1]
            warm_body = notification([dcgm_alert(warm["node"], warm["uuid"], warm["index"])])
            await http.post(
                info.webhook_url, json=warm_body, headers={"Authorization": f"Bearer {token}"}
            )
            await http.post(peer_url, json=warm_body)
            await asyncio.sleep(2.0)
            first_t0 = time.time()
            for gpu in devices:
                body = notification([dcgm_alert(gpu["node"], gpu["uuid"], gpu["index"])])
                t0 = time.time()
                r = await http.post(
                    info.webhook_url, json=body, headers={"Authorization": f"Bearer {token}"}
                )
                codes.append(r.status_code)
                await asyncio.sleep(gap)
                t1 = time.time()
                r = await http.post(peer_url, json=body)
                codes.append(r.status_code)
                sent[taint_rule_name(gpu["node"], gpu["uuid"])] = (t0, t1)
                await asyncio.sleep(gap)

        n = len(sent)

        def split() -> tuple[list[float], list[float]]:
            recs = [r for r in rule_creations(info.kube_url) if r["time"] >= first_t0]
            mine = [r["time"] for r in recs if r["user_agent"] != PEER_AGENT]
            theirs = [r["time"] for r in recs if r["user_agent"] == PEER_AGENT]
            return mine, theirs

        async def all_created() -> bool:
            mine, theirs = split()
            return len(mine) >= n and len(theirs) >= n

        with contextlib.suppress(TimeoutError):
            await until("every rule", all_created, 60.0, 0.5)
        mine, theirs = split()
        # Sends are sequential with `gap` between them, so the k-th create of each side
        # answers the k-th alert (checked: a create before its own send means a mismatch).
        sickbay_ms: list[float] = []
        peer_ms: list[float] = []
        ratios: list[float] = []
        mismatched = 0
        created: dict[str, float] = {}
        for (name, (t0, t1)), ts, tp in zip(sent.items(), mine, theirs, strict=False):
            if ts < t0 or tp < t1:
                mismatched += 1
                continue
            created[name] = ts
            s, p = (ts - t0) * 1000, (tp - t1) * 1000
            sickbay_ms.append(s)
            peer_ms.append(p)
            ratios.append(s / p if p > 0 else float("inf"))
        missing = n - min(len(mine), len(theirs))

        # Where the time goes.
        log_all = requests_log(info.kube_url)
        phases: dict[str, list[float]] = {
            "webhook_to_started": [],
            "started_to_task": [],
            "task_to_rule": [],
            "kube_calls": [],
            "kube_server_ms": [],
        }
        calls: dict[str, int] = {}
        steps: dict[str, list[float]] = {}
        order: dict[str, list[int]] = {}
        for gpu in devices:
            name = taint_rule_name(gpu["node"], gpu["uuid"])
            if name not in created:
                continue
            b = await breakdown(client, device_workflow_id(gpu["node"], gpu["uuid"]))
            if "started" not in b or "task_started" not in b:
                continue
            t0 = sent[name][0]
            phases["webhook_to_started"].append((b["started"] - t0) * 1000)
            phases["started_to_task"].append((b["task_started"] - b["started"]) * 1000)
            phases["task_to_rule"].append((created[name] - b["task_started"]) * 1000)
            window = [
                r
                for r in log_all
                if b["started"] <= r["time"] <= created[name] + 1e-6
                and r["user_agent"] != PEER_AGENT
                and not r["user_agent"].startswith("python-httpx")
            ]
            phases["kube_calls"].append(float(len(window)))

            phases["kube_server_ms"].append(sum(r["duration_ms"] for r in window))
            prev = b["task_started"]
            seen: dict[str, int] = {}
            pos = 0
            for r in sorted(window, key=lambda r: r["time"]):
                key = f"{r['verb']} {r['resource']}"
                calls[key] = calls.get(key, 0) + 1
                seen[key] = seen.get(key, 0) + 1
                # Time since the previous call answered (or the task started), server clock
                # of the twin's answer minus its own duration: the worker's time before it.
                began = r["time"] - r["duration_ms"] / 1000
                label = f"{key} #{seen[key]}"
                steps.setdefault(label, []).append((began - prev) * 1000)
                order.setdefault(label, []).append(pos)
                pos += 1
                prev = r["time"]
        return {
            "pairs": len(sent),
            "measured": len(sickbay_ms),
            "missing": missing,
            "mismatched": mismatched,
            "hot_path_calls": {k: round(v / max(1, len(created)), 2) for k, v in calls.items()},
            "non_2xx": sum(1 for c in codes if c >= 300),
            "twin": f"{nodes} nodes x 8 GPUs, no workloads",
            "sickbay_ms": sickbay_ms,
            "peer_ms": peer_ms,
            "ratio": ratios,
            "sickbay": summary(sickbay_ms),
            "peer": summary(peer_ms),
            "ratio_summary": summary(ratios),
            "breakdown": {k: summary(v) for k, v in phases.items()},
            # In hot-path order: by the median position at which each call is made.
            "gap_before_call_ms": {
                k: summary(steps[k])
                for k in sorted(steps, key=lambda k: sorted(order[k])[len(order[k]) // 2])
            },
        }
    finally:
        if peer is not None:
            peer.send_signal(signal.SIGTERM)
            try:
                peer.wait(10)
            except subprocess.TimeoutExpired:
                peer.kill()
        await asyncio.to_thread(stack.stop)
