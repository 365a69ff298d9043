"""Benchmark 2: what one happy-path remediation costs.

On the demo stack (1 node x 2 GPUs, twin and runbooks 30x faster, as `sickbay-dev demo`): an
inference Deployment runs on GPU A; GPU A fails in the twin (Xid 79), the twin's Alertmanager
stand-in notifies the webhook, Sickbay quarantines A, the pod is evicted and its replacement
runs on GPU B; a person marks A repaired; Sickbay releases it and closes. Measured:

- Temporal history events of the remediation, by type, and billable actions estimated from
  them with Temporal Cloud's published mapping (workflow started, each activity scheduled or
  retried, all local activities of one workflow task as one, timers, signals received, search
  attribute upserts, updates accepted) plus the budget lease's share (its update to the
  budget workflow);
- Kubernetes API requests Sickbay made for it (the twin's request log between the failure and
  the close, minus this script's own requests), by verb and resource; the writes of its
  Kubernetes Events (one per decision and object) are reported apart from the procedure's.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import Counter
from typing import Any

from temporalio.api.enums.v1 import EventType

from bench.common import requests_log
from bench.stacks import open_stack
from contract.remediation import Phase

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


def billable_actions(events: list[Any]) -> int:
    """Estimated Temporal Cloud actions of one history (see the module docstring)."""
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


async def run() -> dict[str, Any]:
    from harness.scenarios import Demo, Progress

    stack = await asyncio.to_thread(open_stack, time_scale=30.0)
    demo = await Demo.open(stack, Progress(lambda line: log.info("%s", line)))
    try:
        info = stack.info
        assert info is not None
        ns = "bench-cost"
        await demo.namespace(ns)
        await demo.deployment(ns, "serve", replicas=1)
        [(_, device)] = await demo.running(ns, "serve")
        gpu = await demo.gpu(device)
        t_fail = time.time()
        await demo.fail(gpu)
        incident = await demo.incident(gpu, "benchmark: happy path")
        await demo.phase(incident, {Phase.HOLDING}, within=120)
        await demo.running(ns, "serve")  # the replacement, on the other GPU
        await demo.repaired(incident, actor="bench")
        result = await demo.closed(incident, within=120)
        t_closed = time.time()
        history = await demo.handle(incident.workflow_id).fetch_history()
        events = list(history.events)
        by_type = Counter(EventType.Name(e.event_type).removeprefix("EVENT_TYPE_") for e in events)
        reqs = [
            r
            for r in requests_log(info.kube_url)
            if t_fail <= r["time"] <= t_closed + 0.5
            and not r["user_agent"].startswith("python-httpx")  # this script's own checks
        ]
        kube = Counter(f"{r['verb']} {r['resource']}" for r in reqs)
        # Sickbay's Kubernetes Events (one per decision and object) are counted apart from
        # the requests of the procedure itself, whose goal they are not part of.
        event_writes = sum(
            n for call, n in kube.items() if call in ("create events", "patch events")
        )
        return {
            "outcome": result.outcome,
            "reason": result.reason,
            "history_events": len(events),
            "events_by_type": dict(by_type.most_common()),
            "billable_actions": billable_actions(events),
            "budget_update_actions": 2,  # acquire + release updates on sickbay-budget
            "kube_requests": len(reqs) - event_writes,
            "event_writes": event_writes,
            "kube_by_call": dict(kube.most_common()),
            "timeline": [f"{t.phase} {t.action} {t.outcome}".strip() for t in result.timeline],
        }
    finally:
        await demo.close()
        await asyncio.to_thread(stack.stop)
