"""Benchmark: a burst of GPU failures under running workloads, with more open waits than
activity slots.

`consumers` GPUs, each held by one replica of a Deployment (a ResourceClaim), fail at once: one
Xid alert per GPU, sent together (at most `concurrency` POSTs in flight). The budget lets
`budget` of the cluster's GPUs be quarantined; the others are refused and each pages once. The
runbooks run in real time (the twin at x1), so every quarantined GPU keeps its remediation's
eviction and then replacement wait open (the cluster has `free` GPUs beyond the consumers', so
most replacements wait Pending until the runbook's deadline, minutes away). The worker runs with
`slots` activity slots (`SICKBAY_MAX_CONCURRENT_ACTIVITIES`), fewer than the GPUs in budget: the
open waits outnumber the short activities' slots, as the shipped 200 would with a few thousand
GPUs in budget on one worker. Measured:

- GPUs quarantined (distinct rules) against the budget, and the last rule after the first alert;
- each refused GPU's page (the sink's PagerDuty event naming its remediation) after its alert:
  p50 / p99 / max, and pages missing after `settle` seconds;
- the remediations in their eviction and replacement waits when the last page arrived (the
  waits open meanwhile), and those that ended escalated for a failed step (a wait that found
  no slot and timed out would: 0 expected), with every remediation's phase at the end.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
from datetime import UTC
from typing import Any

import httpx
from temporalio.api.enums.v1 import EventType

from bench.common import dcgm_alert, notification, rule_creations, summary, until
from bench.stacks import open_stack, run_consumers
from contract.names import (
    ACT_ACQUIRE_BUDGET,
    ACT_NOTIFY,
    WF_REMEDIATE,
    device_workflow_id,
    taint_rule_name,
)
from contract.remediation import Phase

log = logging.getLogger(__name__)

WAIT_PHASES = (Phase.EVICTING, Phase.AWAITING_REPLACEMENT)


async def run(
    consumers: int = 200,
    free: int = 8,
    budget: str = "40%",
    slots: int = 32,
    concurrency: int = 16,
    settle: float = 120.0,
) -> dict[str, Any]:
    gpus_per_node = 8
    nodes = -(-(consumers + free) // gpus_per_node)
    stack = await asyncio.to_thread(
        open_stack,
        nodes=nodes,
        gpus_per_node=gpus_per_node,
        time_scale=1.0,
        worker_env={"SICKBAY_MAX_CONCURRENT_ACTIVITIES": str(slots)},
    )
    try:
        result = await _burst(stack, consumers, budget, concurrency, settle)
    finally:
        await asyncio.to_thread(stack.stop)
    total = nodes * gpus_per_node
    return {
        "twin": f"{nodes} nodes x {gpus_per_node} GPUs ({total}), runbooks in real time",
        "gpus": total,
        "consumers": consumers,
        "budget": budget,
        "slots": slots,
        "concurrency": concurrency,
        **result,
    }


async def _burst(
    stack: Any, consumers: int, budget: str, concurrency: int, settle: float
) -> dict[str, Any]:
    info = stack.info
    assert info is not None
    running = await run_consumers(stack, "bench-burst", consumers, (budget, budget))
    client, demo, token, targets = running.client, running.demo, running.token, running.targets
    pages_before = len(await demo.notifications())

    sent: dict[str, float] = {}  # workflow id -> its alert's send time
    rules: dict[str, str] = {}  # rule name -> workflow id
    codes: list[int] = []
    gate = asyncio.Semaphore(concurrency)
    async with httpx.AsyncClient(timeout=60.0) as http:

        async def fire(gpu: dict[str, Any]) -> None:
            wf = device_workflow_id(gpu["node"], gpu["uuid"])
            body = notification([dcgm_alert(gpu["node"], gpu["uuid"], gpu["index"])])
            async with gate:
                sent[wf] = time.time()
                r = await http.post(
                    info.webhook_url, json=body, headers={"Authorization": f"Bearer {token}"}
                )
            codes.append(r.status_code)
            rules[taint_rule_name(gpu["node"], gpu["uuid"])] = wf

        first = time.time()
        await asyncio.gather(*(fire(g) for g in targets))
        sent_s = time.time() - first

    def created() -> dict[str, float]:
        return {
            rules[r["created"]]: r["time"]
            for r in rule_creations(info.kube_url)
            if r["time"] >= first and r.get("created") in rules
        }

    async def pages() -> dict[str, float]:
        """Each remediation's first PagerDuty trigger since the burst (its dedup key starts
        with the workflow id), by the sink's receive time."""
        out: dict[str, float] = {}
        for n in await demo.notifications(pages_before):
            if n["kind"] != "pagerduty" or n["body"].get("event_action") != "trigger":
                continue
            key = n["body"].get("dedup_key", "")
            wf = next((w for w in sent if key.startswith(w[:60])), None)
            if wf is not None and wf not in out:
                out[wf] = _epoch(n["received_at"])
        return out

    async def settled() -> bool:
        quarantined = await asyncio.to_thread(created)
        paged = await pages()
        return len(quarantined) + len(paged) >= len(sent)

    with contextlib.suppress(TimeoutError):
        await until("every GPU quarantined or paged", settled, settle, 0.5)
    phases: dict[str, int] = {}
    for phase in Phase:
        c = await client.count_workflows(
            f"WorkflowType = '{WF_REMEDIATE}' AND SickbayPhase = '{phase}'"
        )
        if c.count:
            phases[str(phase)] = c.count
    quarantined = await asyncio.to_thread(created)
    paged = await pages()
    refused = [wf for wf in sent if wf not in quarantined]
    page_s = [paged[wf] - sent[wf] for wf in refused if wf in paged]
    rule_s = [quarantined[wf] - sent[wf] for wf in quarantined]
    split = await _page_split(client, {wf: sent[wf] for wf in refused if wf in paged})
    return {
        "sent_seconds": round(sent_s, 2),
        "non_2xx": sum(1 for c in codes if c >= 300),
        "quarantined": len(quarantined),
        "quarantined_both": len(set(quarantined) & set(paged)),
        "last_rule_s": round(max(quarantined.values()) - first, 2) if quarantined else None,
        "rule_s": summary(rule_s),
        "refused": len(refused),
        "paged": len(page_s),
        "pages_missing": len(refused) - len(page_s),
        "page_s": summary(page_s),
        "last_page_s": round(max(paged[w] for w in refused if w in paged) - first, 2)
        if page_s
        else None,
        "page_split": split,
        "waits_open": {str(p): phases.get(str(p), 0) for p in WAIT_PHASES},
        "phases": phases,
        # A refused GPU waits escalated; any other escalation is a failed step.
        "escalated_beyond_refused": max(0, phases.get(str(Phase.ESCALATED), 0) - len(refused)),
    }


async def _page_split(client: Any, refused: dict[str, float]) -> dict[str, Any]:
    """Where a refused GPU's time to its page went, from its history (seconds after its alert,
    server clock): started; the budget's refusal recorded (a local activity, asked while
    confirming: recorded when the workflow task that ran it ends, with the confirm step's other
    local activities and the escalation's Kubernetes Events); the page activity scheduled;
    started by a worker (its wait for a slot and a poller); done."""
    marks: dict[str, list[float]] = {
        "started": [],
        "budget refusal recorded": [],
        "page scheduled": [],
        "page started": [],
        "page done": [],
    }
    for wf, t0 in refused.items():
        history = await client.get_workflow_handle(wf).fetch_history()
        seen: dict[str, float] = {}
        page_id: int | None = None
        for e in history.events:
            t = e.event_time.ToDatetime(tzinfo=UTC).timestamp() - t0
            kind = e.event_type
            if kind == EventType.EVENT_TYPE_WORKFLOW_EXECUTION_STARTED:
                seen.setdefault("started", t)
            elif kind == EventType.EVENT_TYPE_MARKER_RECORDED:
                if _local_activity(e) == ACT_ACQUIRE_BUDGET:
                    seen.setdefault("budget refusal recorded", t)
            elif kind == EventType.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED:
                attrs = e.activity_task_scheduled_event_attributes
                if attrs.activity_type.name == ACT_NOTIFY and page_id is None:
                    page_id = e.event_id
                    seen["page scheduled"] = t
            elif kind == EventType.EVENT_TYPE_ACTIVITY_TASK_STARTED:
                if e.activity_task_started_event_attributes.scheduled_event_id == page_id:
                    seen.setdefault("page started", t)
            elif kind == EventType.EVENT_TYPE_ACTIVITY_TASK_COMPLETED:
                if e.activity_task_completed_event_attributes.scheduled_event_id == page_id:
                    seen.setdefault("page done", t)
        for name, at in seen.items():
            marks[name].append(at)
    return {k: summary(v) for k, v in marks.items()}


def _local_activity(event: Any) -> str:
    """The activity type a local activity's marker records ("" for other markers)."""
    attrs = event.marker_recorded_event_attributes
    data = attrs.details.get("data")
    if attrs.marker_name != "core_local_activity" or data is None or not data.payloads:
        return ""
    try:
        return str(json.loads(data.payloads[0].data).get("activity_type", ""))
    except ValueError:
        return ""


def _epoch(iso: str) -> float:
    from datetime import datetime

    return datetime.fromisoformat(iso).timestamp()


def _s(stats: dict[str, float], key: str, digits: int = 2) -> str:
    return f"{stats[key]:.{digits}f}" if stats.get("n") else "—"


def summary_rows(r: dict[str, Any]) -> list[str]:
    p = r["page_s"]
    waits = sum(r["waits_open"].values())
    return [
        f"| burst under workloads: {r['consumers']} GPUs with a pod each, {r['slots']} activity "
        f"slots: GPUs quarantined (budget {r['budget']}) / refused GPUs paged | "
        f"{r['quarantined']} / {r['paged']} of {r['refused']} | all | "
        f"{'met' if r['pages_missing'] == 0 and r['quarantined'] else '**missed**'} |",
        f"| burst under workloads: refused GPU's page after its alert, p50 / p99 (waits open "
        f"meanwhile) | {_s(p, 'p50', 1)} s / {_s(p, 'p99', 1)} s ({waits}) | | |",
    ]


def section(r: dict[str, Any]) -> list[str]:
    p, q = r["page_s"], r["rule_s"]
    waits = ", ".join(f"{k} {v}" for k, v in r["waits_open"].items())
    last_page = "—" if r["last_page_s"] is None else f"{r['last_page_s']} s"
    return [
        "## 3d. A burst under running workloads: open waits beside the short activities",
        "",
        f"`python -m bench --only burst` (`bench/consumer_burst.py`). Twin: {r['twin']}; a "
        f"Deployment of {r['consumers']} replicas, each holding one GPU through a ResourceClaim; "
        f"one Xid alert per replica's GPU, all sent at once ({r['concurrency']} POSTs in "
        f"flight, sent in {r['sent_seconds']} s, non-2xx answers {r['non_2xx']}). Budget "
        f"{r['budget']} of the cluster. The worker runs with {r['slots']} activity slots "
        "(`SICKBAY_MAX_CONCURRENT_ACTIVITIES`), fewer than the GPUs in budget: each quarantined "
        "GPU keeps an eviction wait and then a replacement wait open (its replacement waits "
        "Pending for a free GPU until the runbook's deadline, minutes away), so the open waits "
        "outnumber the slots, as the shipped 200 would with a few thousand GPUs in budget on "
        "one worker. The waits have slots of their own (`SICKBAY_MAX_OPEN_WAITS`); a refused "
        "GPU's page is a short activity and must not queue behind them.",
        "",
        "| | figure |",
        "|---|---|",
        f"| GPUs quarantined (distinct rules) | {r['quarantined']} |",
        f"| alert -> rule, p50 / p99 / max | {_s(q, 'p50')} / {_s(q, 'p99')} / {_s(q, 'max')} s |",
        f"| last rule after the first alert | {r['last_rule_s'] or '—'} s |",
        f"| GPUs refused by the budget / paged / pages missing | {r['refused']} / "
        f"{r['paged']} / {r['pages_missing']} |",
        f"| refused GPU: alert -> page, p50 / p99 / max | {_s(p, 'p50')} / "
        f"{_s(p, 'p99')} / {_s(p, 'max')} s |",
        f"| last page after the first alert | {last_page} |",
        f"| remediations in their waits when the last page arrived | {waits} |",
        f"| GPUs both quarantined and paged / escalated beyond the refused | "
        f"{r['quarantined_both']} / {r['escalated_beyond_refused']} |",
        f"| phases at the end | {r['phases']} |",
        "",
        "Where a refused GPU's time to its page went (s after its alert, from its history; "
        "local activities are recorded when the workflow task that ran them ends, so the "
        "refusal's row is the end of the task that confirmed, asked the budget and wrote the "
        "escalation's Kubernetes Events):",
        "",
        "| | p50 | p99 |",
        "|---|---|---|",
        *(
            f"| {name} | {_s(st, 'p50')} | {_s(st, 'p99')} |"
            for name, st in r["page_split"].items()
        ),
        "",
    ]
