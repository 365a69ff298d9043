"""Benchmark 2: what one incident costs in Temporal and Kubernetes, per procedure, and a fleet's
price from it.

One embedded stack (1 node x 2 GPUs, pool max 2 nodes, twin and runbooks 30x faster, the
shipped repair ladder and lemons knob on) plays three procedures one after the other, each on
an inference Deployment whose GPU fails:

- **repair with validation**: Xid 48 (double-bit ECC) -> quarantine -> eviction ->
  replacement on the other GPU -> the ladder's reset rung -> the validation Job passes ->
  released, nobody acting;
- **happy path** (the ladder off in the runbooks, as the demo plays it): Xid 79 -> quarantine
  -> eviction -> replacement on the other GPU -> a person marks the GPU repaired -> released;
- **Pending-deadline scale-up** (ladder still off): both GPUs busy (a second Deployment), one
  fails (Xid 48) -> quarantine -> eviction -> the replacement stays Pending past the runbook's
  deadline -> the node pool grows by one node through the twin's cloud API -> the replacement
  runs there -> a person marks the GPU repaired -> released.

Measured for each, over the window from the fault to the remediation closed (plus a second to
settle; nothing else runs on the stack meanwhile):

- Temporal history events and billable actions of every workflow the incident touched: the
  remediation's run, and the events the budget (`sickbay-budget`), GPU ledger and pool scaler
  workflows recorded inside the window (their share). Actions are estimated from the events
  with Temporal Cloud's published mapping (workflow started, each activity scheduled or
  retried, all local activities of one workflow task as one, timers started, signals
  received, search attribute upserts, updates accepted, child workflows started, external
  signals). Not in a history, so not counted: activity heartbeats sent to the server and
  queries (this script's status polls are queries; Sickbay's own path sends none);
- Kubernetes API requests Sickbay made (the twin's request log inside the window, minus this
  script's own), by verb and resource; the writes of its Kubernetes Events (one per decision
  and object) are reported apart from the procedure's.

The fleet table multiplies these by a failure rate from public data: Meta's Llama 3 training
run (The Llama 3 Herd of Models, 2024, section 3.3.4) saw 419 unexpected interruptions in 54
days on 16,384 H100 GPUs; every interruption is taken as one GPU incident (an upper bound: some
were not GPU faults) and the procedure mix is an assumption stated in the table.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import Counter
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import yaml
from temporalio.api.enums.v1 import EventType

from bench.common import requests_log
from bench.stacks import open_stack
from contract.remediation import Phase, RemediationResult

log = logging.getLogger("bench.cost")

_ONE_ACTION = {
    EventType.EVENT_TYPE_WORKFLOW_EXECUTION_STARTED,
    EventType.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED,
    EventType.EVENT_TYPE_TIMER_STARTED,
    EventType.EVENT_TYPE_WORKFLOW_EXECUTION_SIGNALED,
    EventType.EVENT_TYPE_UPSERT_WORKFLOW_SEARCH_ATTRIBUTES,
    EventType.EVENT_TYPE_WORKFLOW_EXECUTION_UPDATE_ACCEPTED,
    EventType.EVENT_TYPE_START_CHILD_WORKFLOW_EXECUTION_INITIATED,
    EventType.EVENT_TYPE_SIGNAL_EXTERNAL_WORKFLOW_EXECUTION_INITIATED,
    EventType.EVENT_TYPE_WORKFLOW_PROPERTIES_MODIFIED,
}

# The three procedures, in the order they run on the one stack: key -> title.
PROCEDURES = {
    "repair": "repair with validation",
    "happy_path": "happy path",
    "scale_up": "Pending-deadline scale-up",
}

# Public failure rate (see the module docstring) and the fleet it is applied to.
SOURCE_INTERRUPTIONS = 419
SOURCE_DAYS = 54
SOURCE_GPUS = 16_384
FLEET_GPUS = 10_000
DAYS_PER_MONTH = 30
# Assumed share of incidents per procedure (the shipped ladder covers the common Xids, so most
# incidents repair themselves; a person repairs the rest; some also run out of free GPUs).
MIX = {"repair": 0.7, "happy_path": 0.2, "scale_up": 0.1}
# Temporal Cloud's list price per million actions, first tier (temporal.io/pricing).
USD_PER_MILLION_ACTIONS = 50.0


def billable_actions(events: list[Any]) -> int:
    """Estimated Temporal Cloud actions of history events (see the module docstring)."""
    actions = 0
    marker_task = False  # local activities of one workflow task count once
    for e in events:
        t = e.event_type
        if t in _ONE_ACTION:
            actions += 1
        elif t == EventType.EVENT_TYPE_ACTIVITY_TASK_STARTED:
            attempt = e.activity_task_started_event_attributes.attempt
            actions += max(0, attempt - 1)  # retries are actions too
        elif t == EventType.EVENT_TYPE_MARKER_RECORDED and not marker_task:
            actions += 1
            marker_task = True
        elif t == EventType.EVENT_TYPE_WORKFLOW_TASK_COMPLETED:
            marker_task = False
    return actions


def _event_name(e: Any) -> str:
    return str(EventType.Name(e.event_type)).removeprefix("EVENT_TYPE_")


def _when(e: Any) -> float:
    return float(e.event_time.seconds + e.event_time.nanos / 1e9)


def set_ladder(runbooks_dir: str | Path, enabled: bool) -> None:
    """Turn the repair ladder on or off in every generated runbook that has one (the worker's
    load-runbooks activity reloads a changed file)."""
    for path in sorted(Path(runbooks_dir).glob("*.yaml")):
        doc = yaml.safe_load(path.read_text())
        ladder = (doc.get("spec") or {}).get("repair")
        if isinstance(ladder, dict) and "enabled" in ladder and ladder["enabled"] != enabled:
            ladder["enabled"] = enabled
            path.write_text(
                f"# Generated by the benchmark from {path.name}: repair ladder "
                f"{'on' if enabled else 'off'}.\n" + yaml.safe_dump(doc, sort_keys=False)
            )


async def _temporal(demo: Any, workflow_id: str, t0: float, t1: float) -> dict[str, Any]:
    """History events and actions of the incident's remediation run, and the share of every
    other workflow (events recorded between t0 and t1)."""
    client = demo.client
    remediation = await demo.handle(workflow_id).fetch_history()
    events = list(remediation.events)
    by_workflow: dict[str, dict[str, int]] = {}
    async for wf in client.list_workflows():
        if wf.id == workflow_id:
            continue
        history = await client.get_workflow_handle(wf.id, run_id=wf.run_id).fetch_history()
        inside = [e for e in history.events if t0 <= _when(e) <= t1]
        if not inside:
            continue
        row = by_workflow.setdefault(wf.workflow_type, {"events": 0, "actions": 0, "runs": 0})
        row["events"] += len(inside)
        row["actions"] += billable_actions(inside)
        row["runs"] += 1
    own_actions = billable_actions(events)
    return {
        "history_events": len(events),
        "events_by_type": dict(Counter(_event_name(e) for e in events).most_common()),
        "billable_actions": own_actions,
        "other_workflows": by_workflow,
        "total_events": len(events) + sum(r["events"] for r in by_workflow.values()),
        "total_actions": own_actions + sum(r["actions"] for r in by_workflow.values()),
    }


def _kube(kube_url: str, t0: float, t1: float) -> dict[str, Any]:
    reqs = [
        r
        for r in requests_log(kube_url)
        if t0 <= r["time"] <= t1
        and not r["user_agent"].startswith("python-httpx")  # this script's own checks
    ]
    kube = Counter(f"{r['verb']} {r['resource']}" for r in reqs)
    # Sickbay's Kubernetes Events (one per decision and object) are counted apart from the
    # requests of the procedure itself, whose goal they are not part of.
    event_writes = sum(n for call, n in kube.items() if call in ("create events", "patch events"))
    return {
        "kube_requests": len(reqs) - event_writes,
        "event_writes": event_writes,
        "kube_by_call": dict(kube.most_common()),
    }


async def _measure(
    demo: Any, title: str, procedure: Callable[[], Awaitable[tuple[str, RemediationResult]]]
) -> dict[str, Any]:
    """Run one procedure; its costs from the fault to its close (plus a second to settle)."""
    info = demo.stack.info
    log.info("cost: %s", title)
    t0 = time.time()
    workflow_id, result = await procedure()
    t_closed = time.time()
    await asyncio.sleep(1.0)  # the lease release and ledger record land around the close
    t1 = time.time()
    return {
        "title": title,
        "outcome": result.outcome,
        "reason": result.reason,
        "seconds": round(t_closed - t0, 1),
        **await _temporal(demo, workflow_id, t0, t1),
        **_kube(info.kube_url, t0, t1),
        "timeline": [f"{t.phase} {t.action} {t.outcome}".strip() for t in result.timeline],
    }


def fleet(procedures: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """Incidents and actions per month for FLEET_GPUS at the source's failure rate."""
    per_gpu_day = SOURCE_INTERRUPTIONS / SOURCE_DAYS / SOURCE_GPUS
    incidents = per_gpu_day * FLEET_GPUS * DAYS_PER_MONTH
    rows = {}
    for key, p in procedures.items():
        rows[key] = {
            "actions_per_incident": p["total_actions"],
            "actions_per_month_if_all": round(incidents * p["total_actions"]),
            "kube_requests_per_month_if_all": round(
                incidents * (p["kube_requests"] + p["event_writes"])
            ),
        }
    mixed = [k for k in MIX if k in procedures]
    actions = sum(MIX[k] * procedures[k]["total_actions"] for k in mixed) / sum(
        MIX[k] for k in mixed
    )
    kube = sum(
        MIX[k] * (procedures[k]["kube_requests"] + procedures[k]["event_writes"]) for k in mixed
    ) / sum(MIX[k] for k in mixed)
    return {
        "gpus": FLEET_GPUS,
        "days_per_month": DAYS_PER_MONTH,
        "source": f"{SOURCE_INTERRUPTIONS} interruptions in {SOURCE_DAYS} days on "
        f"{SOURCE_GPUS} GPUs",
        "incidents_per_gpu_year": round(per_gpu_day * 365, 4),
        "incidents_per_month": round(incidents, 1),
        "per_procedure": rows,
        "mix": {k: MIX[k] for k in mixed},
        "mixed_actions_per_incident": round(actions, 1),
        "mixed_actions_per_month": round(incidents * actions),
        "mixed_kube_requests_per_month": round(incidents * kube),
        "usd_per_million_actions": USD_PER_MILLION_ACTIONS,
        "mixed_usd_per_month": round(incidents * actions * USD_PER_MILLION_ACTIONS / 1e6, 2),
    }


async def run() -> dict[str, Any]:
    from harness.scenarios import Demo, DemoFailure, Progress, _repaired_without_people

    stack = await asyncio.to_thread(open_stack, time_scale=30.0, repair=True)
    demo = await Demo.open(stack, Progress(lambda line: log.info("%s", line)))
    failures: Counter[str] = Counter()  # per GPU uuid: the lemons knob retires at 3 in 7d
    try:
        info = stack.info
        assert info is not None
        ns = "bench-cost"
        await demo.namespace(ns)
        await demo.deployment(ns, "serve", replicas=1)

        async def repair() -> tuple[str, RemediationResult]:
            [(_, device)] = await demo.running(ns, "serve")
            failures[(await demo.gpu(device))["uuid"]] += 1
            result = await _repaired_without_people(
                demo, ns, "serve", 48, "reset", "benchmark: repair with validation"
            )
            return demo.incidents[-1].workflow_id, result

        async def failed(gpu: dict[str, Any], xid: int) -> tuple[dict[str, Any], Any]:
            failures[gpu["uuid"]] += 1
            await demo.fail(gpu, xid=xid)
            return gpu, await demo.incident(gpu, f"benchmark: Xid {xid}")

        async def happy_path() -> tuple[str, RemediationResult]:
            [(_, device)] = await demo.running(ns, "serve")
            gpu, incident = await failed(await demo.gpu(device), 79)
            await demo.phase(incident, {Phase.HOLDING}, within=120)
            await demo.running(ns, "serve")  # the replacement, on the other GPU
            await demo.repaired(incident, actor="bench")
            result = await demo.closed(incident, within=120)
            await demo.recover(gpu)  # the person's repair, for the next procedure
            return incident.workflow_id, result

        async def scale_up() -> tuple[str, RemediationResult]:
            nodes_before = set(await demo.nodes())
            # Both GPUs busy: the failed one's consumer has nowhere to go but a new node.
            [(_, d1)] = await demo.running(ns, "serve")
            [(_, d2)] = await demo.running(ns, "serve-2")
            gpus = [await demo.gpu(d) for d in (d1, d2)]
            target = min(gpus, key=lambda g: failures[g["uuid"]])
            # Xid 48 (double-bit ECC; the ladder is off): a different alert from the happy
            # path's, so its notification is not held back by that one's group interval.
            gpu, incident = await failed(target, 48)
            await demo.phase(incident, {Phase.HOLDING}, within=180)
            if not set(await demo.nodes()) - nodes_before:
                raise DemoFailure("holding after the Pending deadline, but no node was added")
            await demo.repaired(incident, actor="bench")
            result = await demo.closed(incident, within=120)
            await demo.recover(gpu)
            return incident.workflow_id, result

        procedures: dict[str, dict[str, Any]] = {}
        procedures["repair"] = await _measure(demo, PROCEDURES["repair"], repair)
        set_ladder(info.runbooks_dir, enabled=False)
        procedures["happy_path"] = await _measure(demo, PROCEDURES["happy_path"], happy_path)
        await demo.deployment(ns, "serve-2", replicas=1)
        await demo.running(ns, "serve-2")
        procedures["scale_up"] = await _measure(demo, PROCEDURES["scale_up"], scale_up)
        happy = procedures["happy_path"]
        return {
            "time_scale": 30.0,
            "procedures": procedures,
            "fleet": fleet(procedures),
            # The happy path's figures at the top level, as before the three procedures.
            **{
                k: happy[k]
                for k in (
                    "outcome",
                    "reason",
                    "history_events",
                    "events_by_type",
                    "billable_actions",
                    "kube_requests",
                    "event_writes",
                    "kube_by_call",
                    "timeline",
                )
            },
        }
    finally:
        await demo.close()
        await asyncio.to_thread(stack.stop)


def _n(v: float) -> str:
    return f"{v:,.0f}"


def _other(p: dict[str, Any], workflow_type: str, what: str) -> int:
    return int((p["other_workflows"].get(workflow_type) or {}).get(what, 0))


def summary_rows(r: dict[str, Any]) -> list[str]:
    if "procedures" not in r:
        return []
    happy = r["procedures"]["happy_path"]
    rows = [
        f"| history events, happy path (remediation) | {happy['history_events']} | <= 60 | "
        f"{'met' if happy['history_events'] <= 60 else '**missed**'} |",
        f"| Kubernetes API requests, happy path | {happy['kube_requests']} | <= 15 | "
        f"{'met' if happy['kube_requests'] <= 15 else '**missed**'} |",
    ]
    for p in r["procedures"].values():
        rows.append(
            f"| billable actions per incident, {p['title']} (est., every workflow) | "
            f"{p['total_actions']} | | |"
        )
    f = r["fleet"]
    rows.append(
        f"| actions per month, {_n(f['gpus'])} GPUs at {f['incidents_per_month']:g} incidents "
        f"(assumed mix) | {_n(f['mixed_actions_per_month'])} | | |"
    )
    return rows


def section(r: dict[str, Any]) -> list[str]:
    out = ["## 2. Cost per incident: Temporal and Kubernetes", ""]
    if "procedures" not in r:
        return out + ["(Results from before the three procedures: re-run `--only cost`.)", ""]
    procs = r["procedures"]
    titles = [p["title"] for p in procs.values()]
    others = sorted({t for p in procs.values() for t in p["other_workflows"]})
    out += [
        "`python -m bench --only cost` (`bench/cost.py`): one stack (1 node x 2 GPUs, pool max 2 "
        f"nodes, twin and runbooks x{r['time_scale']:g}, shipped repair ladder and lemons on) "
        "plays three incidents one after the other on inference Deployments: "
        "**repair with validation** (Xid 48 -> quarantine -> eviction -> replacement on the "
        "other GPU -> reset rung -> validation Job passed -> released, nobody acting); "
        "**happy path** (ladder off in the runbooks: Xid 79 -> quarantine -> eviction -> "
        "replacement -> a person marks it repaired -> released); **Pending-deadline scale-up** "
        "(ladder off; both GPUs busy: Xid 48 -> quarantine -> eviction -> replacement Pending "
        "past the deadline -> the pool grows by one node -> replacement runs there -> marked "
        "repaired -> released). Each is measured from the fault to its close (+1 s), with "
        "nothing else running: the remediation's history, the events every other workflow "
        "recorded in that window (its share of them), and the twin's API request log.",
        "",
        "| | " + " | ".join(titles) + " |",
        "|---|" + "---|" * len(titles),
        "| outcome | " + " | ".join(p["outcome"] for p in procs.values()) + " |",
        f"| fault -> closed (twin x{r['time_scale']:g}) | "
        + " | ".join(f"{p['seconds']:.1f} s" for p in procs.values())
        + " |",
        "| history events: remediation | "
        + " | ".join(str(p["history_events"]) for p in procs.values())
        + " |",
    ]
    for t in others:
        out.append(
            f"| history events: `{t}` (share) | "
            + " | ".join(str(_other(p, t, "events")) for p in procs.values())
            + " |"
        )
    out += [
        "| **history events, all workflows** | "
        + " | ".join(f"**{p['total_events']}**" for p in procs.values())
        + " |",
        "| billable actions: remediation | "
        + " | ".join(str(p["billable_actions"]) for p in procs.values())
        + " |",
    ]
    for t in others:
        out.append(
            f"| billable actions: `{t}` (share) | "
            + " | ".join(str(_other(p, t, "actions")) for p in procs.values())
            + " |"
        )
    out += [
        "| **billable actions, all workflows (est.)** | "
        + " | ".join(f"**{p['total_actions']}**" for p in procs.values())
        + " |",
        "| Kubernetes API requests (the procedure) | "
        + " | ".join(str(p["kube_requests"]) for p in procs.values())
        + " |",
        "| Kubernetes Event writes (one per decision and object) | "
        + " | ".join(str(p["event_writes"]) for p in procs.values())
        + " |",
        "",
        "Billable actions are estimated from the histories with Temporal Cloud's published "
        "mapping: workflow started, each activity scheduled or retried, the local activities of "
        "one workflow task as one, timers started, signals received, search-attribute upserts, "
        "updates accepted (the budget lease's acquire and release, the ledger's records, the "
        "scaler's need). Not in a history and so not counted: activity heartbeats and queries.",
        "",
    ]
    for p in procs.values():
        out += [
            f"- {p['title']}: history events of the remediation by type: "
            + ", ".join(f"{k} {v}" for k, v in p["events_by_type"].items())
            + "; Kubernetes requests by verb and resource: "
            + ", ".join(f"{k.strip() or '(discovery)'} x{v}" for k, v in p["kube_by_call"].items())
            + ".",
        ]
    f = r["fleet"]
    mix = ", ".join(f"{procs[k]['title']} {v:.0%}" for k, v in f["mix"].items())
    out += [
        "",
        f"### What a fleet costs: {_n(f['gpus'])} GPUs",
        "",
        f"Failure rate: {f['source']} (Meta, Llama 3 training, *The Llama 3 Herd of Models*, "
        f"2024, section 3.3.4), every interruption taken as one GPU incident (an upper bound: "
        f"some were not GPU faults): {f['incidents_per_gpu_year']:g} incidents per GPU-year, "
        f"**{f['incidents_per_month']:g} incidents per month** on {_n(f['gpus'])} GPUs "
        f"({f['days_per_month']}-day month). Actions from the measured incidents above.",
        "",
        "| incidents are | actions / incident | actions / month | Kubernetes requests / month "
        "(incl. Event writes) |",
        "|---|---|---|---|",
    ]
    for key, row in f["per_procedure"].items():
        out.append(
            f"| all {procs[key]['title']} | {row['actions_per_incident']} | "
            f"{_n(row['actions_per_month_if_all'])} | "
            f"{_n(row['kube_requests_per_month_if_all'])} |"
        )
    out += [
        f"| mixed: {mix} (assumed) | {f['mixed_actions_per_incident']:g} | "
        f"**{_n(f['mixed_actions_per_month'])}** | {_n(f['mixed_kube_requests_per_month'])} |",
        "",
        f"At Temporal Cloud's first-tier list price of ${f['usd_per_million_actions']:g} per "
        f"million actions (temporal.io/pricing; check the current one), the mixed fleet's "
        f"incidents cost about **${f['mixed_usd_per_month']:.2f} per month** in actions. "
        "Assumptions: the mix (the shipped ladder covers the common Xids, so most incidents "
        "repair themselves; a person repairs the rest; one in ten also finds no free GPU); one "
        "remediation per incident (MIG slices and alert repeats of one GPU join it); the "
        "singleton workflows' (budget, ledger, pool scaler) events counted only inside an "
        "incident's window (the scaler's idle close an hour later adds events, no actions); "
        "no retries of failed activities (a flaky API server or cloud adds one action per "
        "retry). Not included: the namespace's plan minimum, storage, heartbeats, and anything "
        "not caused by an incident (health-sweep Schedule runs, if enabled: priced per run).",
        "",
    ]
    return out
