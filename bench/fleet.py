"""Benchmark 3c: a fleet on one Temporal: several clusters, two workers and two webhooks each,
a burst in every cluster at once, one worker of each cluster SIGKILLed in the middle.

One Temporal dev server (the first stack's) and `clusters` embedded stacks sharing it
(`StackConfig.shared_temporal`), each with its own twin of `nodes` x `gpus_per_node` GPUs and
its own cluster name (`SICKBAY_CLUSTER`: its task queue, workflow ids, budget workflow and
`SickbayCluster` search attribute). Each cluster gets a second worker (the first one's command
and environment, its own metrics port: both poll the cluster's task queue, as two replicas of
a Deployment do) and a second webhook (the same, its own port and spool directory). The
blast-radius budget binds: `cluster_budget` of each twin's GPUs (the pool limit is lifted so
the cluster's is the one that counts), so each burst races `devices` remediations for fewer
leases.

The burst: in every cluster at once, one Xid 79 alert per GPU for `devices` GPUs within
`seconds`, each notification sent to one of the cluster's two webhooks in turn and re-sent
(as Alertmanager does) when the answer is not a 2xx or the connection fails. At `kill_at` of
the burst the stack's own worker of every cluster is SIGKILLed; its twin keeps the second.

Checked per cluster, from Temporal and the cluster's own twin:
- lost: alerts whose fingerprint is not recorded in their GPU's remediation (start input or
  an `alert` signal);
- doubled: GPUs with more than one remediation run, and remediations of another cluster's id
  or search attribute seen in this cluster's list;
- budget exceeded: DeviceTaintRules the twin created beyond the cluster's limit;
- every in-budget GPU quarantined (min(limit, devices) rules), and the time from a GPU's
  alert being first sent to its rule created: p50 / p99 / max per cluster (goal: the last
  within 15 s of its fault), beside the single-cluster storm's figure;
- the clusters' budget workflows and task queues apart (one per cluster, each holding only
  its own cluster's leases).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import random
import signal
import statistics
import sys
import time
from datetime import UTC
from pathlib import Path
from typing import Any

import httpx
from temporalio.api.enums.v1 import EventType
from temporalio.client import Client
from temporalio.service import RPCError

from bench.common import dcgm_alert, gpus, notification, rule_creations, set_budget, summary, until
from bench.stacks import open_stack, webhook_token, worker_argv
from bench.storm import cpu_seconds, quarantined_gpus, recorded_fingerprints
from bench.storm_replicas import healthz, webhook_env
from contract.names import (
    ANN_WORKFLOW_ID,
    LABEL_MANAGED_BY,
    MANAGED_BY_VALUE,
    QRY_BUDGET_STATE,
    SA_CLUSTER,
    WF_REMEDIATE,
    budget_workflow_id,
    device_workflow_id,
)
from contract.runbook import BudgetPolicy
from harness.stack import Stack, free_port

log = logging.getLogger("bench.fleet")

GOAL_LAST_S = 15.0
RETRY_FOR = 120.0


def _cpu_by_kind(stacks: dict[str, Stack]) -> dict[str, float]:
    """CPU seconds so far of every process of the clusters' stacks, summed by kind (the two
    workers of a cluster are `worker`, its webhooks `webhook`, ...), and this process's (the
    load generator and its checks). A killed worker counts what it used before it died."""
    out: dict[str, float] = {}
    for stack in stacks.values():
        for child in stack.children:
            used = cpu_seconds(child.pid)
            if used is not None:
                kind = child.name.removesuffix("-b")
                out[kind] = out.get(kind, 0.0) + used
    t = os.times()
    out["this benchmark (sender, checks)"] = t.user + t.system
    return out


def _spawn_like(stack: Stack, name: str, pid: int, argv: list[str], **env: str) -> Any:
    """Start `argv` with the environment of the stack's process `pid`, `env` overriding."""
    return stack._spawn(name, argv, {**webhook_env(pid), **env})


async def _burst(
    cluster: str,
    urls: list[str],
    token: str,
    bodies: list[tuple[list[str], bytes]],
    seconds: float,
    t0: float,
    first_sent: dict[str, float],
    stats: dict[str, int],
) -> None:
    """Send `bodies` ((workflow ids, notification)) evenly over `seconds`, alternating the two
    webhooks; a failed POST is re-sent (the other webhook first) with backoff."""
    interval = seconds / max(1, len(bodies))
    async with httpx.AsyncClient(timeout=10.0) as http:

        async def send(i: int, wids: list[str], body: bytes) -> None:
            await asyncio.sleep(max(0.0, t0 + i * interval - time.time()))
            for wid in wids:
                first_sent.setdefault(wid, time.time())
            attempt, deadline = 0, time.time() + RETRY_FOR
            while True:
                url = urls[(i + attempt) % len(urls)]
                try:
                    r = await http.post(
                        url,
                        content=body,
                        headers={
                            "Authorization": f"Bearer {token}",
                            "Content-Type": "application/json",
                        },
                    )
                    if r.status_code < 300:
                        stats["delivered"] += 1
                        return
                except httpx.HTTPError:
                    pass
                attempt += 1
                stats["resent"] += 1
                if time.time() > deadline:
                    stats["given_up"] += 1
                    log.warning("%s: notification %d given up after %d tries", cluster, i, attempt)
                    return
                await asyncio.sleep(min(2.0, 0.1 * 2**attempt) * random.uniform(0.5, 1.0))

        await asyncio.gather(*(send(i, w, b) for i, (w, b) in enumerate(bodies)))


async def run(
    clusters: int = 4,
    nodes: int = 50,
    gpus_per_node: int = 8,
    devices: int = 200,
    cluster_budget: str = "25%",
    seconds: float = 5.0,
    per_notification: int = 10,
    kill_at: float = 0.3,
    settle: float = 240.0,
) -> dict[str, Any]:
    from worker.settings import Settings
    from worker.temporal import connect

    names = [f"fleet{i + 1}" for i in range(clusters)]
    load_before = os.getloadavg()[0]
    stacks: dict[str, Stack] = {}
    t_boot = time.monotonic()
    try:
        common = {"nodes": nodes, "gpus_per_node": gpus_per_node, "time_scale": 1.0}
        stacks[names[0]] = await asyncio.to_thread(open_stack, cluster=names[0], **common)
        first = stacks[names[0]].info
        assert first is not None
        shared = (first.temporal_address, first.temporal_http)
        for name in names[1:]:
            stacks[name] = await asyncio.to_thread(
                open_stack, cluster=name, shared_temporal=shared, **common
            )
        client = await connect(
            Settings(temporal_address=first.temporal_address, temporal_namespace=first.namespace)
        )
        per: dict[str, dict[str, Any]] = {}
        for name, stack in stacks.items():
            info = stack.info
            assert info is not None
            set_budget(info.runbooks_dir, "100%", cluster_budget)
            total = len(gpus(info.kube_url))
            chosen = random.Random(name).sample(gpus(info.kube_url), devices)
            # A second worker and a second webhook, as a second replica of each Deployment.
            worker_b = _spawn_like(
                stack,
                "worker-b",
                info.pids["worker"],
                [sys.executable, *worker_argv()],
                SICKBAY_METRICS_PORT=str(free_port()),
            )
            port_b = free_port()
            _spawn_like(
                stack,
                "webhook-b",
                info.pids["webhook"],
                [sys.executable, "-m", "worker.cli", "webhook", "--port", str(port_b)],
                SICKBAY_WEBHOOK_SPOOL_DIR=str(Path(stack.dir) / "webhook-spool-b"),
            )
            await until(f"{name}'s second webhook", lambda p=port_b: healthz(p), 60.0, 0.1)
            alerts = [dcgm_alert(g["node"], g["uuid"], g["index"]) for g in chosen]
            bodies = []
            for i in range(0, len(alerts), per_notification):
                batch = alerts[i : i + per_notification]
                wids = [
                    device_workflow_id(a["labels"]["Hostname"], a["labels"]["UUID"], name)
                    for a in batch
                ]
                bodies.append((wids, json.dumps(notification(batch)).encode()))
            per[name] = {
                "info": info,
                "stack": stack,
                "total_gpus": total,
                "limit": BudgetPolicy.limit(cluster_budget, total),
                "alerts": alerts,
                "bodies": bodies,
                "urls": [info.webhook_url, f"http://127.0.0.1:{port_b}/v1/alertmanager"],
                "token": webhook_token(stack),
                "worker_b": worker_b.pid,
                "first_sent": {},
                "stats": {"delivered": 0, "resent": 0, "given_up": 0},
            }
        boot_s = time.monotonic() - t_boot
        # Both workers of every cluster poll before the burst (the second needs its start-up).
        await asyncio.sleep(5.0)  # the second workers' start-up: connect, register, poll

        t0 = time.time() + 0.5
        kills: dict[str, float] = {}
        cpu_before = _cpu_by_kind(stacks)

        async def killer() -> None:
            await asyncio.sleep(max(0.0, t0 + kill_at * seconds - time.time()))
            for name, p in per.items():
                os.kill(p["info"].pids["worker"], signal.SIGKILL)
                kills[name] = time.time() - t0
            log.info("killed one worker in each of %d clusters", len(per))

        await asyncio.gather(
            killer(),
            *(
                _burst(
                    n,
                    p["urls"],
                    p["token"],
                    p["bodies"],
                    seconds,
                    t0,
                    p["first_sent"],
                    p["stats"],
                )
                for n, p in per.items()
            ),
        )

        async def all_in_budget() -> bool:
            for p in per.values():
                want = min(p["limit"], devices)
                creates = rule_creations(p["info"].kube_url)
                if quarantined_gpus(p["info"].kube_url, creates) < want:
                    return False
            return True

        with contextlib.suppress(TimeoutError):
            await until("every in-budget GPU of every cluster quarantined", all_in_budget, settle)
        cpu_after, cpu_window = _cpu_by_kind(stacks), time.time() - t0
        await asyncio.sleep(3.0)  # stragglers: a late create would show a budget breach

        out: dict[str, Any] = {}
        for name, p in per.items():
            info = p["info"]
            creates = [r for r in rule_creations(info.kube_url) if r["time"] >= t0 - 1]
            quarantined = quarantined_gpus(info.kube_url, creates)
            rules = _managed_rules(info.kube_url, creates)
            rule_wids = [_workflow_id(r) for r in rules]
            lost = 0
            doubled = 0
            foreign = 0
            for a in p["alerts"]:
                wid = device_workflow_id(a["labels"]["Hostname"], a["labels"]["UUID"], name)
                runs = [r async for r in client.list_workflows(f"WorkflowId = '{wid}'")]
                doubled += max(0, len(runs) - 1)
                got: set[str] = set()
                for run_ in runs:
                    got |= await recorded_fingerprints(client, wid, run_.run_id)
                lost += a["fingerprint"] not in got
            listed = [
                w
                async for w in client.list_workflows(
                    f"WorkflowType = '{WF_REMEDIATE}' AND {SA_CLUSTER} = '{name}'"
                )
            ]
            foreign = sum(1 for w in listed if not w.id.startswith(f"sickbay-{name}-"))
            budget_tasks = await _task_times(client, budget_workflow_id(info.task_queue, name), t0)
            # Each rule's create answered at `time` (the twin's request log). The burst's
            # start bounds every GPU's fault from below; the GPU's own fault is its alert's
            # first send (`first_sent`), found through the rule the create made.
            after_start = sorted(r["time"] - t0 for r in creates)
            traced, unmatched = fault_to_rule(creates, rules, p["first_sent"], t0)
            after_fault = [seconds for seconds, _ in traced]
            slowest = max(traced, default=None)
            slowest_story = await _slowest_story(client, slowest[1] if slowest else "", t0)
            # The GPUs whose remediation had a workflow task time out (the killed worker held
            # it), and fault -> rule of the others: what the surviving workers' pace alone gave.
            retry_waits = {w: await _retry_waits(client, w) for _, w in traced if w}
            held = {w for w, waits in retry_waits.items() if waits}
            unheld = [seconds for seconds, w in traced if w not in held]
            try:
                budget_id = budget_workflow_id(info.task_queue, name)
                state = await client.get_workflow_handle(budget_id).query(QRY_BUDGET_STATE)
                lease_holders: list[str] | None = [
                    ls.get("holder", "") for ls in state.get("leases", [])
                ]
            except RPCError as exc:  # no remediation of it reached the budget
                log.warning("%s: budget query failed: %s", name, exc)
                lease_holders = None
            out[name] = {
                "total_gpus": p["total_gpus"],
                "devices": devices,
                "limit": p["limit"],
                "in_budget": min(p["limit"], devices),
                "rules_created": len(creates),
                "quarantined": quarantined,
                "exceeded": max(0, quarantined - p["limit"]),
                "lost": lost,
                "doubled": doubled,
                "foreign_ids": foreign
                + sum(1 for w in rule_wids if not w.startswith(f"sickbay-{name}-")),
                "remediations_listed": len(listed),
                "leases_held": None if lease_holders is None else len(lease_holders),
                "leases_of_other_clusters": None
                if lease_holders is None
                else sum(1 for h in lease_holders if not h.startswith(f"sickbay-{name}-")),
                "task_queue": info.task_queue,
                "budget_workflow": budget_workflow_id(info.task_queue, name),
                "last_rule_after_start_s": after_start[-1] if after_start else None,
                "rules_after_start_s": summary(after_start) if after_start else {"n": 0},
                "fault_to_rule_s": summary(after_fault) if after_fault else {"n": 0},
                "fault_to_rule_unmatched": unmatched,
                "held_by_killed_worker": len(held),
                "fault_to_rule_not_held_s": summary(unheld) if unheld else {"n": 0},
                "retry_waits_s": sorted(x for waits in retry_waits.values() for x in waits),
                "fault_curve": [round(t, 3) for t in sorted(after_fault)],
                "kill_s": kills.get(name),
                "notifications": p["stats"],
                "curve": [round(t, 3) for t in after_start],
                "slowest_story": slowest_story,
                "budget_tasks": budget_tasks,
            }
        queues = {r["task_queue"] for r in out.values()}
        budgets = {r["budget_workflow"] for r in out.values()}
        last = max((r["fault_to_rule_s"].get("max", 0.0) for r in out.values()), default=0.0)
        last_after_start = max(
            (r["last_rule_after_start_s"] or 0.0 for r in out.values()), default=0.0
        )
        return {
            "clusters": out,
            "n_clusters": clusters,
            "workers_per_cluster": 2,
            "webhooks_per_cluster": 2,
            "devices_per_cluster": devices,
            "gpus_per_cluster": nodes * gpus_per_node,
            "cluster_budget": cluster_budget,
            "burst_seconds": seconds,
            "kill_at_s": kill_at * seconds,
            "queues_apart": len(queues) == clusters,
            "budgets_apart": len(budgets) == clusters,
            "lost": sum(r["lost"] for r in out.values()),
            "doubled": sum(r["doubled"] + r["foreign_ids"] for r in out.values()),
            "exceeded": sum(r["exceeded"] for r in out.values()),
            "unquarantined_in_budget": sum(
                max(0, r["in_budget"] - r["quarantined"]) for r in out.values()
            ),
            "last_fault_to_rule_s": last,
            "last_rule_after_start_s": last_after_start,
            "boot_s": boot_s,
            "load_before": load_before,
            "load_after": os.getloadavg()[0],
            # CPU seconds by kind of process from the burst until every in-budget GPU was
            # quarantined (`cpu_window_s` wall seconds; the machine has os.cpu_count() cores).
            "cpu_window_s": round(cpu_window, 1),
            "cpu_seconds": {
                k: round(cpu_after[k] - cpu_before.get(k, 0.0), 1)
                for k in sorted(cpu_after, key=lambda k: cpu_before.get(k, 0.0) - cpu_after[k])
            },
            "cores": os.cpu_count(),
        }
    finally:
        for stack in reversed(list(stacks.values())):
            stack.stop()


TASK_ENDS = (
    EventType.EVENT_TYPE_WORKFLOW_TASK_COMPLETED,
    EventType.EVENT_TYPE_WORKFLOW_TASK_TIMED_OUT,
    EventType.EVENT_TYPE_WORKFLOW_TASK_FAILED,
)


def _task_spans(history: Any) -> list[tuple[float, float, float, bool]]:
    """Each workflow task of a history that ended: (scheduled, started, ended, timed out),
    epoch seconds."""
    spans: list[tuple[float, float, float, bool]] = []
    scheduled = started = None
    for e in history.events:
        at = e.event_time.ToDatetime().replace(tzinfo=UTC).timestamp()
        if e.event_type == EventType.EVENT_TYPE_WORKFLOW_TASK_SCHEDULED:
            scheduled = at
        elif e.event_type == EventType.EVENT_TYPE_WORKFLOW_TASK_STARTED:
            started = at
        elif e.event_type in TASK_ENDS and started is not None:
            timed_out = e.event_type == EventType.EVENT_TYPE_WORKFLOW_TASK_TIMED_OUT
            spans.append((scheduled if scheduled is not None else started, started, at, timed_out))
            scheduled = started = None
    return spans


async def _retry_waits(client: Client, wid: str) -> list[float]:
    """For each workflow task of the run that timed out (a worker held it and died, or
    overran), the seconds until a worker started it again: its wait for a live poller of the
    shared queue. Empty: no task timed out."""
    spans = _task_spans(await client.get_workflow_handle(wid).fetch_history())
    # Each task's successor's start; now for the last (no later task ended by the check).
    starts = [started for _, started, _, _ in spans[1:]] + [time.time()]
    return [
        round(again - ended, 3)
        for (_, _, ended, timed_out), again in zip(spans, starts, strict=False)
        if timed_out
    ]


QUARANTINE_STEP = "quarantine-device"
# How long the slowest quarantine's story waits for the task that made its rule to end.
STORY_WAIT = 30.0


def _local_steps(history: Any) -> list[tuple[str, float]]:
    """The local activities up to the quarantine, each with when it ended (its marker's
    complete_time, the worker's clock) after the start of the workflow task that ran it."""
    steps: list[tuple[str, float]] = []
    started: float | None = None
    for e in history.events:
        if e.event_type == EventType.EVENT_TYPE_WORKFLOW_TASK_STARTED:
            started = e.event_time.ToDatetime().replace(tzinfo=UTC).timestamp()
        elif e.event_type == EventType.EVENT_TYPE_MARKER_RECORDED and started is not None:
            data = e.marker_recorded_event_attributes.details.get("data")
            if data is None or not data.payloads:
                continue
            meta = json.loads(data.payloads[0].data)
            done = meta.get("complete_time") or {}
            ended = done.get("seconds", 0) + done.get("nanos", 0) / 1e9
            kind = str(meta.get("activity_type", "?"))
            steps.append((kind, round(ended - started, 3)))
            if kind == QUARANTINE_STEP:
                break
    return steps


async def _slowest_story(client: Client, wid: str, t0: float, wait: float = 30.0) -> dict[str, Any]:
    """Where the time of the cluster's slowest quarantine (fault -> rule) went, from its
    remediation's history: seconds its workflow tasks waited in a queue, ran, and when one
    timed out (a worker held it and died, or overran the timeout), each after the burst
    began; and when each local activity up to the quarantine ended, after its task began.
    History records a task's local activities when the task ends, which may be after its
    rule exists (its Events and the GPU ledger's update come next): up to `wait` seconds for
    that."""
    if not wid:
        return {}
    handle = client.get_workflow_handle(wid)
    deadline = time.monotonic() + wait
    while True:
        history = await handle.fetch_history()
        steps = _local_steps(history)
        if (steps and steps[-1][0] == QUARANTINE_STEP) or time.monotonic() > deadline:
            break
        await asyncio.sleep(0.5)
    spans = _task_spans(history)
    return {
        "workflow_id": wid,
        "queued_s": round(sum(started - sched for sched, started, _, _ in spans), 2),
        "in_tasks_s": round(sum(ended - started for _, started, ended, _ in spans), 2),
        "task_timed_out_at_s": [round(ended - t0, 2) for *_, ended, out in spans if out],
        "local_steps": steps,
    }


def fault_to_rule(
    creates: list[dict[str, Any]],
    rules: list[dict[str, Any]],
    first_sent: dict[str, float],
    t0: float,
) -> tuple[list[tuple[float, str]], int]:
    """(Seconds from the GPU's fault (its alert's first send) to its rule's create, its
    remediation's id) per create, and how many creates could not be traced to their GPU's
    alert (the rule gone, or no workflow id on it): those count from the burst's start, the
    bound from above."""
    wid_of = {r["metadata"]["name"]: _workflow_id(r) for r in rules}
    out: list[tuple[float, str]] = []
    unmatched = 0
    for c in creates:
        wid = wid_of.get(c.get("created", ""), "")
        sent = first_sent.get(wid)
        if sent is None:
            unmatched += 1
            sent = t0
        out.append((c["time"] - sent, wid))
    return out, unmatched


async def _task_times(client: Client, wid: str, t0: float) -> dict[str, Any]:
    """The workflow tasks of every run of `wid` that started after `t0`: how many, how long
    each ran (started -> completed, ms), and when one timed out (seconds after `t0`)."""
    ran: list[float] = []
    timed_out: list[float] = []
    async for run_ in client.list_workflows(f"WorkflowId = '{wid}'"):
        history = await client.get_workflow_handle(wid, run_id=run_.run_id).fetch_history()
        for _, started, ended, out in _task_spans(history):
            if started < t0:
                continue
            if out:
                timed_out.append(round(ended - t0, 2))
            else:
                ran.append((ended - started) * 1000.0)
    return {"ran_ms": summary(ran), "timed_out_at_s": sorted(timed_out)}


def _managed_rules(kube_url: str, creates: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The twin's DeviceTaintRules that Sickbay manages (none when none was created)."""
    if not creates:
        return []
    body = httpx.get(kube_url + creates[0]["path"], timeout=60.0).json()
    return [
        r
        for r in body.get("items", [])
        if (r["metadata"].get("labels") or {}).get(LABEL_MANAGED_BY) == MANAGED_BY_VALUE
    ]


def _workflow_id(rule: dict[str, Any]) -> str:
    """The workflow id a Sickbay rule is annotated with."""
    return str((rule["metadata"].get("annotations") or {}).get(ANN_WORKFLOW_ID, ""))


def met(r: dict[str, Any]) -> dict[str, bool]:
    leases = [c["leases_of_other_clusters"] for c in r["clusters"].values()]
    return {
        "lost": r["lost"] == 0,
        "doubled": r["doubled"] == 0,
        "exceeded": r["exceeded"] == 0,
        "quarantined": r["unquarantined_in_budget"] == 0,
        "last": r["last_fault_to_rule_s"] <= GOAL_LAST_S and r["unquarantined_in_budget"] == 0,
        "apart": r["queues_apart"]
        and r["budgets_apart"]
        and all(n == 0 for n in leases),  # None: the budget was not read
    }


def _clusters_text(r: dict[str, Any]) -> str:
    """How many clusters met the goal, and how many of those that missed it had their
    slowest GPU's task held by the killed worker (it timed out)."""
    clusters = r["clusters"].values()
    missed = [c for c in clusters if c["fault_to_rule_s"].get("max", 0.0) > GOAL_LAST_S]
    held = sum(1 for c in missed if (c.get("slowest_story") or {}).get("task_timed_out_at_s"))
    return (
        f"{len(clusters) - len(missed)} of {len(clusters)} clusters quarantined every in-budget "
        f"GPU within {GOAL_LAST_S:g} s of its fault"
        + (
            f"; of the {len(missed)} that did not, {held} had that GPU's first workflow task "
            "held by the killed worker (it waited out the task timeout)"
            if missed
            else ""
        )
    )


def _max_text(q: dict[str, Any]) -> str:
    return f"{q['max']:.1f} s" if q.get("n") else "none"


def _waits_text(name: str, waits: list[float] | None) -> str:
    if not waits:
        return f"{name}: none timed out"
    return f"{name}: {len(waits)}, p50 {statistics.median(waits):.1f} s, max {max(waits):.1f} s"


def _not_held_max(r: dict[str, Any]) -> float:
    """The slowest fault -> rule of the GPUs no killed worker held, over every cluster."""
    return max(
        (c["fault_to_rule_not_held_s"].get("max", 0.0) for c in r["clusters"].values()),
        default=0.0,
    )


def findings(r: dict[str, Any]) -> list[str]:
    m = met(r)
    return [
        f"Fleet: {r['n_clusters']} clusters on one Temporal, 2 workers and 2 webhooks each, "
        f"{r['devices_per_cluster']} GPUs failing in every cluster at once, one worker of each "
        f"SIGKILLed {r['kill_at_s']:.1f} s in: {r['lost']} alerts lost, {r['doubled']} "
        f"workflows doubled or crossed, {r['exceeded']} over budget, "
        f"{r['unquarantined_in_budget']} in-budget GPUs not quarantined; the slowest "
        f"quarantine {r['last_fault_to_rule_s']:.1f} s after its GPU's fault (goal "
        f"{GOAL_LAST_S:g} s: {'met' if m['last'] else 'missed'}), the last rule "
        f"{r['last_rule_after_start_s']:.1f} s after the burst began; "
        + _clusters_text(r)
        + "; the slowest of the GPUs whose tasks no killed worker held: "
        + f"{_not_held_max(r):.1f} s."
    ]


def section(r: dict[str, Any], plot: str | None, single_s: float | None) -> list[str]:
    m = met(r)

    def ok(flag: bool) -> str:
        return "met" if flag else "**missed**"

    rows = []
    for name, c in r["clusters"].items():
        q = c["rules_after_start_s"]
        f = c["fault_to_rule_s"]
        rows.append(
            f"| {name} | {c['devices']} of {c['total_gpus']} | {c['limit']} | "
            f"{c['quarantined']} | {c['exceeded']} | {c['lost']} | "
            f"{c['doubled'] + c['foreign_ids']} | {c['leases_held']} ({c['leases_of_other_clusters']}) | "
            f"{f.get('p50', 0):.1f} / {f.get('max', 0):.1f} s | "
            f"{c['held_by_killed_worker']} ({_max_text(c['fault_to_rule_not_held_s'])}) | "
            f"{q.get('p50', 0):.1f} / {q.get('max', 0):.1f} s | "
            f"{c['notifications']['resent']} | `{c['task_queue']}`, `{c['budget_workflow']}` |"
        )
    beside = (
        f" The single-cluster storm of section 3 (one worker, one webhook, nobody killed) "
        f"quarantined its in-budget GPUs {single_s:.1f} s after its first alert."
        if single_s is not None
        else ""
    )
    out = [
        "## 3c. A fleet on one Temporal: clusters, workers and webhooks, one worker killed each",
        "",
        f"{r['n_clusters']} clusters (an embedded stack each: its own twin of "
        f"{r['gpus_per_cluster']} GPUs and cluster name) on one Temporal dev server and "
        f"namespace; {r['workers_per_cluster']} `sickbay worker` and "
        f"{r['webhooks_per_cluster']} `sickbay webhook` processes per cluster. In every "
        f"cluster at once, {r['devices_per_cluster']} GPUs fail (one Xid 79 alert each, sent "
        f"within {r['burst_seconds']:g} s, alternating the cluster's two webhooks, re-sent "
        "as Alertmanager does when a POST fails); the blast-radius budget allows "
        f"{r['cluster_budget']} of each cluster's GPUs. {r['kill_at_s']:.1f} s into the "
        "burst one worker of every cluster gets SIGKILL (the other keeps polling the "
        "cluster's queue). Reproduce: `python -m bench --only fleet`.",
        "",
        "| goal | figure | |",
        "|---|---|---|",
        f"| 0 alerts lost | {r['lost']} | {ok(m['lost'])} |",
        f"| 0 workflows doubled (or of another cluster) | {r['doubled']} | {ok(m['doubled'])} |",
        f"| 0 budgets exceeded | {r['exceeded']} GPUs over | {ok(m['exceeded'])} |",
        f"| every in-budget GPU quarantined | {r['unquarantined_in_budget']} not | "
        f"{ok(m['quarantined'])} |",
        f"| the last within {GOAL_LAST_S:g} s of its fault | "
        f"{r['last_fault_to_rule_s']:.1f} s (the last rule "
        f"{r['last_rule_after_start_s']:.1f} s after the burst began) | {ok(m['last'])} |",
        f"| budgets and ids apart | {'yes' if m['apart'] else 'no'} | {ok(m['apart'])} |",
        "",
        "| cluster | GPUs failed | budget | quarantined | over | lost | doubled | "
        "leases held (of others) | fault -> rule p50 / last | quarantined GPUs whose task the "
        "killed worker held (last fault -> rule of the others) | rule after burst start p50 / "
        "last | re-sends | queue, budget |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|",
        *rows,
        "",
        *([f"![fleet]({plot})", ""] if plot else []),
        "- Time: a GPU's fault is its alert's first send; its fault -> rule is the twin's "
        "answer to the create of its rule (the request log names the rule a create made, "
        "the rule names its remediation, whose GPU's alert the burst sent) minus that send. "
        "The slowest GPU's is the figure against the goal. The burst spreads its alerts over "
        f"{r['burst_seconds']:g} s, so a rule's time after the burst began bounds its GPU's "
        "fault -> rule from above, up to that much more"
        + (
            f" ({unmatched} creates not traced to their alert count from the burst's start)"
            if (unmatched := sum(c["fault_to_rule_unmatched"] for c in r["clusters"].values()))
            else ""
        )
        + f".{beside}",
        f"- {_clusters_text(r)}.",
        "- Where the slowest quarantine's time went (its remediation's history): "
        + "; ".join(
            _story_text(name, c.get("slowest_story") or {}) for name, c in r["clusters"].items()
        )
        + ". A task the killed worker held waits out its workflow task timeout (remediations: "
        "the server's 10 s; the budget and the GPU ledger: 5 s, contract/failover.py), a task "
        "for its sticky queue 3 s, and then the queue of the surviving worker, which runs its "
        "cluster's burst alone on the machine's shared cores.",
        "- A quarantined GPU's timed-out task, from its timeout until a live worker started it "
        "again (the surviving worker's pollers of the shared queue; contract/failover.py): "
        + "; ".join(_waits_text(name, c.get("retry_waits_s")) for name, c in r["clusters"].items())
        + ".",
        "- The budget workflow's tasks from the burst on (every run of each cluster's): "
        + "; ".join(
            _budget_text(name, c.get("budget_tasks") or {}) for name, c in r["clusters"].items()
        )
        + ".",
        f"- Load average (1 min) before / after: {r['load_before']:.2f} / "
        f"{r['load_after']:.2f}; the stacks took {r['boot_s']:.0f} s to start.",
    ]
    cpu = r.get("cpu_seconds") or {}
    if cpu:
        window, cores = r["cpu_window_s"], r.get("cores") or 1
        used = sum(cpu.values())
        out.append(
            f"- CPU from the burst until every in-budget GPU was quarantined ({window:.1f} s, "
            f"{cores} cores = {window * cores:.0f} CPU-s): "
            + ", ".join(f"{k} {v:.1f} s" for k, v in cpu.items())
            + f"; {used / max(window * cores, 1e-9) * 100:.0f} % of the machine. Every "
            "cluster's two workers, webhooks and twin and the one Temporal server share these "
            "cores: the surviving workers' queues wait on them."
        )
    out.append("")
    return out


def _story_text(name: str, story: dict[str, Any]) -> str:
    if not story:
        return f"{name}: no history"
    timeouts = story["task_timed_out_at_s"]
    held = (
        "a task timed out at " + ", ".join(f"{t:.1f}" for t in timeouts) + " s"
        if timeouts
        else "no task timed out"
    )
    steps = story.get("local_steps") or []
    ended = (
        " (its local activities ended, after their task began: "
        + ", ".join(f"{kind} {at:.2f}" for kind, at in steps)
        + " s)"
        if steps
        else f" (the task that quarantined it had not ended {STORY_WAIT:g} s after the check)"
    )
    return (
        f"{name}: {held}, {story['queued_s']:.1f} s waiting in queues, "
        f"{story['in_tasks_s']:.1f} s in its tasks{ended}"
    )


def _budget_text(name: str, tasks: dict[str, Any]) -> str:
    ran = tasks.get("ran_ms") or {}
    if not ran.get("n"):
        return f"{name}: none completed"
    out = (
        f"{name}: {ran['n']} completed, p50 / p99 / max {ran['p50']:.0f} / {ran['p99']:.0f} / "
        f"{ran['max']:.0f} ms"
    )
    timeouts = tasks.get("timed_out_at_s") or []
    if timeouts:
        out += ", timed out at " + ", ".join(f"{t:.1f}" for t in timeouts) + " s"
    return out


def plot(r: dict[str, Any], path: Path) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax, bx) = plt.subplots(1, 2, figsize=(13, 5))
    for name, c in r["clusters"].items():
        ts = c["curve"]
        if ts:
            ax.step(ts, range(1, len(ts) + 1), where="post", label=f"{name} (budget {c['limit']})")
        fs = c.get("fault_curve") or []
        if fs:
            bx.step(fs, range(1, len(fs) + 1), where="post", label=name)
    ax.axvline(
        r["kill_at_s"], color="tab:red", linestyle="--", label="one worker per cluster killed"
    )
    ax.set_xlabel("seconds since the burst began")
    ax.set_ylabel("GPUs quarantined (DeviceTaintRules created)")
    ax.set_title(
        f"{r['n_clusters']} clusters x {r['devices_per_cluster']} failing GPUs on one "
        f"Temporal; lost {r['lost']}, doubled {r['doubled']}, over budget {r['exceeded']}",
        fontsize=10,
    )
    ax.legend(loc="lower right", fontsize=8)
    ax.grid(True, alpha=0.3)
    bx.axvline(GOAL_LAST_S, color="grey", linewidth=1, label=f"goal: last within {GOAL_LAST_S:g} s")
    bx.set_xlabel("seconds from the GPU's fault (its alert's first send) to its rule")
    bx.set_ylabel("GPUs quarantined, fastest first")
    bx.set_title("Each quarantined GPU: fault -> DeviceTaintRule", fontsize=10)
    bx.legend(loc="lower right", fontsize=8)
    bx.grid(True, alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
