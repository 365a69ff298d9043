"""Benchmark 1: alert -> DeviceTaintRule created: Sickbay, a straight-line script, the floor.

On one embedded stack (dev server + twin + `sickbay worker` + `sickbay webhook`) with a twin of
`nodes` x 8 GPUs and no workloads on them, for each of `pairs` GPUs (a triple of sends per GPU):

1. POST one Alertmanager notification naming the GPU to Sickbay's webhook (time t0);
2. after `gap` seconds, POST the same notification to the peer (bench/peer.py: resolve the
   device with the same client calls, create the rule named `peer-<name>`) (time t1);
3. after `gap` seconds, POST it to the floor (bench/floor.py: the peer's calls as one local
   activity of a tiny workflow, eagerly started by the receiving process on the stack's
   dev server, rule `floor-<name>`) (time t2);
4. after `gap` seconds, the next GPU.

Latency = the twin's answer time of the successful DeviceTaintRule create (its request log)
minus the POST's send time; both clocks are this machine's. Ratios are taken per triple
(same GPU, same seconds of machine load): Sickbay / script, floor / script (what any
Temporal-based pipeline costs at least, against the script) and Sickbay / floor (what
Sickbay adds on top of that floor).

Where the time goes (per remediation, from the workflow's history and the request log):
webhook -> WorkflowExecutionStarted, started -> first workflow task picked up, the task's
Kubernetes calls (count, summed server time) up to the create, and the rest (the worker's
own CPU: local-activity scheduling, budget lease round trip to Temporal, payload conversion).
Then one Temporal round trip on the same server (a describe, a query through the worker),
timed back to back and after the triples' quiet gap: what each crossing of the server costs
on this machine, which Sickbay's path makes more often than the floor's.

Then the production path (`consumers` > 0), on a stack of its own started after the triples'
stopped (a calm worker, as the triples had): a Deployment of `consumers` replicas, each holding
one GPU through a ResourceClaim, and one alert per replica's GPU to Sickbay alone (the script
and the floor read no consumers), measured and split as above: Sickbay reads the pod, its claim
and owner before the rule, and writes the GPUFailureConfirmed Event beside it.

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
from pathlib import Path
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
from bench.stacks import open_stack, run_consumers, webhook_token
from contract.names import (
    QRY_BUDGET_STATE,
    QRY_STATUS,
    budget_workflow_id,
    device_workflow_id,
    taint_rule_name,
)
from contract.remediation import RemediationResult, RemediationStatus
from harness.stack import free_port

log = logging.getLogger("bench.latency")

PEER_PREFIX = "peer-"
PEER_AGENT = "sickbay-bench-peer/1"
FLOOR_PREFIX = "floor-"
FLOOR_AGENT = "sickbay-bench-floor/1"
BENCH_AGENTS = (PEER_AGENT, FLOOR_AGENT)


def _ts(event: Any) -> float:
    return float(event.event_time.ToDatetime().timestamp()) if event.HasField("event_time") else 0.0


async def breakdown(client: Any, wf_id: str) -> dict[str, float]:
    """Server-side timestamps of a remediation's first moments (epoch seconds), and `eager`:
    1.0 when the server started its first workflow task in the start request."""
    history = await client.get_workflow_handle(wf_id).fetch_history()
    out: dict[str, float] = {}
    for e in history.events:
        t = e.event_type
        if t == EventType.EVENT_TYPE_WORKFLOW_EXECUTION_STARTED and "started" not in out:
            out["started"] = _ts(e)
            attrs = e.workflow_execution_started_event_attributes
            out["eager"] = 1.0 if attrs.eager_execution_accepted else 0.0
        elif t == EventType.EVENT_TYPE_WORKFLOW_TASK_STARTED and "task_started" not in out:
            out["task_started"] = _ts(e)
        elif t == EventType.EVENT_TYPE_WORKFLOW_TASK_COMPLETED and "task_completed" not in out:
            out["task_completed"] = _ts(e)
    return out


def _alert(gpu: dict[str, Any]) -> dict[str, Any]:
    """One Alertmanager notification: an Xid alert naming `gpu`."""
    return notification([dcgm_alert(gpu["node"], gpu["uuid"], gpu["index"])])


async def _to_sickbay(
    http: httpx.AsyncClient, url: str, token: str, body: dict[str, Any]
) -> httpx.Response:
    return await http.post(url, json=body, headers={"Authorization": f"Bearer {token}"})


def _spawn(argv: list[str], env: dict[str, str], log_path: Path) -> subprocess.Popen[bytes]:
    """A receiver process whose errors land next to the stack's own logs (one that never
    listens says why there)."""
    with open(log_path, "wb") as errors:
        return subprocess.Popen(argv, env=env, stdout=subprocess.DEVNULL, stderr=errors)


async def run(
    pairs: int = 200,
    nodes: int = 26,
    gap: float = 0.2,
    consumers: int = 48,
    rounds: int = 40,
) -> dict[str, Any]:
    result = await _triples(pairs, nodes, gap, rounds)
    # The production path on a stack of its own, started after the triples' stopped: the
    # same calm worker the triples had, not one still carrying their remediations.
    result["consumers"] = await _with_consumers(consumers, gap) if consumers else {}
    return result


async def _triples(pairs: int, nodes: int, gap: float, rounds: int) -> dict[str, Any]:
    from worker.settings import Settings
    from worker.temporal import connect

    stack = await asyncio.to_thread(open_stack, nodes=nodes, gpus_per_node=8, time_scale=1.0)
    procs: list[subprocess.Popen[bytes]] = []
    try:
        info = stack.info
        assert info is not None
        set_budget(info.runbooks_dir, "100%", "100%")

        async def spawn(module: str, *args: str) -> str:
            port = free_port()
            proc = await asyncio.to_thread(
                _spawn,
                [sys.executable, "-m", module, "--port", str(port), *args],
                {**os.environ, "PYTHONPATH": str(stack.sickbay_env()["PYTHONPATH"])},
                Path(stack.dir) / "logs" / f"{module}.log",
            )
            procs.append(proc)
            return f"http://127.0.0.1:{port}"

        peer_url = await spawn(
            "bench.peer", "--kubeconfig", info.kubeconfig, "--prefix", PEER_PREFIX
        )
        floor_url = await spawn(
            "bench.floor",
            "--kubeconfig",
            info.kubeconfig,
            "--temporal",
            info.temporal_address,
            "--namespace",
            info.namespace,
            "--prefix",
            FLOOR_PREFIX,
        )
        devices = gpus(info.kube_url)[:pairs]
        token = webhook_token(stack)
        client = await connect(
            Settings(temporal_address=info.temporal_address, temporal_namespace=info.namespace)
        )
        # rule name -> (sickbay t0, peer t1, floor t2)
        sent: dict[str, tuple[float, float, float]] = {}
        codes: list[int] = []
        async with httpx.AsyncClient(timeout=30.0) as http:

            def listening(url: str) -> Any:
                async def probe() -> bool:
                    try:
                        return (await http.get(url)).status_code == 200
                    except httpx.HTTPError:
                        return False

                return probe

            await until("the peer script to listen", listening(peer_url), 30.0, 0.1)
            await until("the floor receiver to listen", listening(floor_url), 60.0, 0.1)
            # Warm the three paths once (imports, connection pools, discovery) on a GPU not
            # counted.
            warm = gpus(info.kube_url)[-1]
            warm_body = _alert(warm)
            await _to_sickbay(http, info.webhook_url, token, warm_body)
            await http.post(peer_url, json=warm_body)
            await http.post(floor_url, json=warm_body)
            await asyncio.sleep(2.0)
            floor_before = (await http.get(floor_url)).json()
            first_t0 = time.time()
            for gpu in devices:
                body = _alert(gpu)
                t0 = time.time()
                r = await _to_sickbay(http, info.webhook_url, token, body)
                codes.append(r.status_code)
                await asyncio.sleep(gap)
                t1 = time.time()
                r = await http.post(peer_url, json=body)
                codes.append(r.status_code)
                await asyncio.sleep(gap)
                t2 = time.time()
                r = await http.post(floor_url, json=body)
                codes.append(r.status_code)
                sent[taint_rule_name(gpu["node"], gpu["uuid"])] = (t0, t1, t2)
                await asyncio.sleep(gap)
            floor_after = (await http.get(floor_url)).json()

        n = len(sent)

        def split() -> tuple[list[float], list[float], list[float]]:
            recs = [r for r in rule_creations(info.kube_url) if r["time"] >= first_t0]
            mine = [r["time"] for r in recs if r["user_agent"] not in BENCH_AGENTS]
            theirs = [r["time"] for r in recs if r["user_agent"] == PEER_AGENT]
            floors = [r["time"] for r in recs if r["user_agent"] == FLOOR_AGENT]
            return mine, theirs, floors

        async def all_created() -> bool:
            return all(len(side) >= n for side in split())

        with contextlib.suppress(TimeoutError):
            await until("every rule", all_created, 60.0, 0.5)
        mine, theirs, floors = split()
        # Sends are sequential with `gap` between them, so the k-th create of each side
        # answers the k-th alert (checked: a create before its own send means a mismatch).
        sickbay_ms: list[float] = []
        peer_ms: list[float] = []
        floor_ms: list[float] = []
        ratios: list[float] = []
        floor_ratios: list[float] = []
        over_floor: list[float] = []
        mismatched = 0
        created: dict[str, float] = {}
        floor_created: dict[str, float] = {}

        def ratio(a: float, b: float) -> float:
            return a / b if b > 0 else float("inf")

        for (name, (t0, t1, t2)), ts, tp, tf in zip(
            sent.items(), mine, theirs, floors, strict=False
        ):
            if ts < t0 or tp < t1 or tf < t2:
                mismatched += 1
                continue
            created[name] = ts
            floor_created[name] = tf
            s, p, f = (ts - t0) * 1000, (tp - t1) * 1000, (tf - t2) * 1000
            sickbay_ms.append(s)
            peer_ms.append(p)
            floor_ms.append(f)
            ratios.append(ratio(s, p))
            floor_ratios.append(ratio(f, p))
            over_floor.append(ratio(s, f))
        missing = n - min(len(mine), len(theirs), len(floors))

        # The floor's own moments, from its workflows' histories: eager start shows as the
        # first workflow task starting in the same instant as the execution.
        floor_phases: dict[str, list[float]] = {
            "post_to_started": [],
            "started_to_task": [],
            "task_to_rule": [],
        }
        floor_eager_histories = 0
        for gpu in devices:
            name = taint_rule_name(gpu["node"], gpu["uuid"])
            if name not in floor_created:
                continue
            b = await breakdown(client, FLOOR_PREFIX + name)
            floor_eager_histories += int(b.get("eager", 0.0))
            if "started" not in b or "task_started" not in b:
                continue
            floor_phases["post_to_started"].append((b["started"] - sent[name][2]) * 1000)
            floor_phases["started_to_task"].append((b["task_started"] - b["started"]) * 1000)
            floor_phases["task_to_rule"].append((floor_created[name] - b["task_started"]) * 1000)

        # Where the time goes.
        log_all = requests_log(info.kube_url)
        split_of = await _time_split(
            client,
            log_all,
            [
                (device_workflow_id(g["node"], g["uuid"]), sent[name][0], created[name])
                for g in devices
                if (name := taint_rule_name(g["node"], g["uuid"])) in created
            ],
        )
        # The same server's round trips, back to back and after the triples' idle gap.
        round_trips = await round_trip_probe(client, budget_workflow_id(), rounds, gap)
        return {
            "round_trips": round_trips,
            "pairs": len(sent),
            "gap_s": gap,
            "measured": len(sickbay_ms),
            "missing": missing,
            "mismatched": mismatched,
            "hot_path_calls": split_of["calls"],
            "non_2xx": sum(1 for c in codes if c >= 300),
            "twin": f"{nodes} nodes x 8 GPUs, no workloads",
            "sickbay_ms": sickbay_ms,
            "peer_ms": peer_ms,
            "ratio": ratios,
            "sickbay": summary(sickbay_ms),
            "peer": summary(peer_ms),
            "ratio_summary": summary(ratios),
            "floor_ms": floor_ms,
            "floor": summary(floor_ms),
            "floor_ratio": floor_ratios,
            "floor_ratio_summary": summary(floor_ratios),
            "sickbay_floor_ratio": over_floor,
            "sickbay_floor_ratio_summary": summary(over_floor),
            "floor_breakdown": {k: summary(v) for k, v in floor_phases.items()},
            # Starts in the measured loop, and how many the server started eagerly (the SDK's
            # flag on each start response, counted by the floor process).
            "floor_starts": int(floor_after["started"]) - int(floor_before["started"]),
            "floor_eager_starts": int(floor_after["eager"]) - int(floor_before["eager"]),
            # Measured floor workflows whose history says the server accepted eager execution
            # (eager_execution_accepted on WorkflowExecutionStarted).
            "floor_eager_histories": floor_eager_histories,
            "breakdown": split_of["breakdown"],
            "gap_before_call_ms": split_of["gap_before_call_ms"],
        }
    finally:
        for proc in procs:
            proc.send_signal(signal.SIGTERM)
            try:
                await asyncio.to_thread(proc.wait, 10)
            except subprocess.TimeoutExpired:
                proc.kill()
        await asyncio.to_thread(stack.stop)


async def round_trip_probe(
    client: Any, workflow_id: str, rounds: int, idle: float
) -> dict[str, dict[str, Any]]:
    """One Temporal round trip timed `rounds` times back to back and `rounds` times each after
    `idle` seconds of quiet (the rhythm of the triples): a describe of `workflow_id` (frontend
    and history only) and a query of it (also the worker's poll, activation and answer, the
    way a lease's update reaches the budget workflow). Milliseconds, per kind and rhythm."""
    handle = client.get_workflow_handle(workflow_id)
    calls = {
        "describe": handle.describe,
        "query": lambda: handle.query(QRY_BUDGET_STATE),
    }
    out: dict[str, dict[str, Any]] = {}
    for kind, call in calls.items():
        await call()  # warm: channels, the workflow in the worker's cache
        for rhythm, pause in (("back_to_back", 0.0), ("after_idle", idle)):
            times: list[float] = []
            for _ in range(rounds):
                if pause:
                    await asyncio.sleep(pause)
                t = time.perf_counter()
                await call()
                times.append((time.perf_counter() - t) * 1000)
            out[f"{kind}_{rhythm}"] = summary(times)
    return out


async def _time_split(
    client: Any, log_all: list[dict[str, Any]], items: list[tuple[str, float, float]]
) -> dict[str, Any]:
    """Where each remediation's time went (`items`: workflow id, alert sent, rule created):
    webhook -> WorkflowExecutionStarted -> first workflow task -> rule, the Kubernetes calls
    in that window (count, summed server time, calls per remediation), the worker's time from
    the task's start to its first call, and before each call (since the previous call
    answered, or the task started), in hot-path order."""
    phases: dict[str, list[float]] = {
        "webhook_to_started": [],
        "started_to_task": [],
        "task_to_rule": [],
        "task_to_first_call": [],
        "kube_calls": [],
        "kube_server_ms": [],
    }
    calls: dict[str, int] = {}
    steps: dict[str, list[float]] = {}
    order: dict[str, list[int]] = {}
    measured = 0
    for wf_id, t0, created in items:
        b = await breakdown(client, wf_id)
        if "started" not in b or "task_started" not in b:
            continue
        measured += 1
        phases["webhook_to_started"].append((b["started"] - t0) * 1000)
        phases["started_to_task"].append((b["task_started"] - b["started"]) * 1000)
        phases["task_to_rule"].append((created - b["task_started"]) * 1000)
        window = [
            r
            for r in log_all
            if b["started"] <= r["time"] <= created + 1e-6
            and r["user_agent"] not in BENCH_AGENTS
            and not r["user_agent"].startswith("python-httpx")
        ]
        phases["kube_calls"].append(float(len(window)))
        phases["kube_server_ms"].append(sum(r["duration_ms"] for r in window))
        prev = b["task_started"]
        if window:  # the worker's time from the task's start to its first Kubernetes call
            first = min(r["time"] - r["duration_ms"] / 1000 for r in window)
            phases["task_to_first_call"].append((first - prev) * 1000)
        seen: dict[str, int] = {}
        for pos, req in enumerate(sorted(window, key=lambda r: r["time"])):
            key = f"{req['verb']} {req['resource']}"
            calls[key] = calls.get(key, 0) + 1
            seen[key] = seen.get(key, 0) + 1
            # Time since the previous call answered (or the task started), server clock of
            # the twin's answer minus its own duration: the worker's time before it.
            began = req["time"] - req["duration_ms"] / 1000
            label = f"{key} #{seen[key]}"
            steps.setdefault(label, []).append((began - prev) * 1000)
            order.setdefault(label, []).append(pos)
            prev = req["time"]
    return {
        "calls": {k: round(v / max(1, measured), 2) for k, v in calls.items()},
        "breakdown": {k: summary(v) for k, v in phases.items()},
        # In hot-path order: by the median position at which each call is made.
        "gap_before_call_ms": {
            k: summary(steps[k])
            for k in sorted(steps, key=lambda k: sorted(order[k])[len(order[k]) // 2])
        },
    }


async def _with_consumers(consumers: int, gap: float) -> dict[str, Any]:
    """The production path, on a stack of its own with one free GPU per consumer and 8 more:
    a Deployment of `consumers` replicas, each holding one GPU (a ResourceClaim); then one
    alert per replica's GPU, `gap` * 3 apart (Sickbay alone: the peer and the floor read no
    consumers), measured as the triples are. Each rule then evicts its pod and the
    Deployment's replacement takes a free GPU or waits Pending (the remediations go on in the
    background of the next alerts, as in a cluster)."""
    stack = await asyncio.to_thread(
        open_stack, nodes=-(-consumers // 8) + 1, gpus_per_node=8, time_scale=1.0
    )
    try:
        return await _consumers_on(stack, consumers, gap)
    finally:
        await asyncio.to_thread(stack.stop)


async def _consumers_on(stack: Any, consumers: int, gap: float) -> dict[str, Any]:
    info = stack.info
    assert info is not None
    running = await run_consumers(stack, "bench-latency", consumers)
    client, token, targets = running.client, running.token, running.targets
    sent: dict[str, tuple[str, float]] = {}
    codes: list[int] = []
    async with httpx.AsyncClient(timeout=30.0) as http:
        # Warm the path once (imports, connection pools, discovery) on a GPU nobody holds.
        held = {g["uuid"] for g in targets}
        warm = next(g for g in gpus(info.kube_url) if g["uuid"] not in held)
        await _to_sickbay(http, info.webhook_url, token, _alert(warm))
        await asyncio.sleep(2.0)
        first = time.time()
        for gpu in targets:
            t0 = time.time()
            r = await _to_sickbay(http, info.webhook_url, token, _alert(gpu))
            codes.append(r.status_code)
            sent[taint_rule_name(gpu["node"], gpu["uuid"])] = (
                device_workflow_id(gpu["node"], gpu["uuid"]),
                t0,
            )
            await asyncio.sleep(gap * 3)

    def creates() -> dict[str, float]:
        return {
            r["created"]: r["time"]
            for r in rule_creations(info.kube_url)
            if r["time"] >= first and r.get("created") in sent
        }

    async def all_created() -> bool:
        return len(await asyncio.to_thread(creates)) >= len(sent)

    with contextlib.suppress(TimeoutError):
        await until("every consumer's rule", all_created, 60.0, 0.5)
    created = creates()
    ms = [(created[n] - t0) * 1000 for n, (_wf, t0) in sent.items() if n in created]
    split = await _time_split(
        client,
        requests_log(info.kube_url),
        [(wf, t0, created[n]) for n, (wf, t0) in sent.items() if n in created],
    )
    # A GPU without its rule: what its remediation says it is doing (the miss's cause).
    why: dict[str, int] = {}
    for name, (wf, _t0) in sent.items():
        if name in created:
            continue
        handle = client.get_workflow_handle(wf, result_type=RemediationResult)
        try:
            status = await handle.query(QRY_STATUS, result_type=RemediationStatus)
            said = f"{status.phase}: {status.awaiting or status.next_action}"
            if status.outcome is not None:
                result = await handle.result()
                said = f"{result.outcome}: {result.reason}"
        except Exception as err:  # reported, never raised
            said = f"no status ({type(err).__name__}: {err})"
        said = said[:200]
        why[said] = why.get(said, 0) + 1
    return {
        "pods": consumers,
        "measured": len(ms),
        "missing": len(sent) - len(ms),
        "missing_why": why,
        "non_2xx": sum(1 for c in codes if c >= 300),
        "sickbay_ms": ms,
        "sickbay": summary(ms),
        **split,
    }
