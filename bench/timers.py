"""Runbook timer -> next step: how long after a runbook timer fires the remediation's next step
starts, p99 per timer, on the embedded stack (twin + dev server + `sickbay worker`).

Each round fails the GPU under an inference Deployment whose namespace a bench runbook
matches (written into the stack's runbooks directory, which the worker reloads): approval
required with a short timeout (`onTimeout: proceed`), then, the only other GPU busy with a
filler, the replacement Pending until a short Pending deadline (scale-up off), which escalates
`pending-deadline`. The GPU is then recovered and marked repaired, and the next round starts.

Measured from each closed run's history (the server's event times): for every TimerFired of a
runbook timer (named by its summary: `approval timeout ...`, `Pending deadline`), the time to
the first command of the next step (an activity scheduled, a local activity's marker, a
timer started, the run closed). The eviction timeout is not a timer on this path (evict-pods
retries inside the activity until the deadline) and the repair timeouts need a Job that hangs:
both are asserted by tests/workflows/test_timers_on_time.py instead.
"""

from __future__ import annotations

import logging
from datetime import UTC
from pathlib import Path
from typing import Any

import yaml
from temporalio.api.enums.v1 import EventType

from bench.common import summary
from bench.stacks import open_stack
from contract.remediation import Phase
from harness.scenarios import Demo, Progress

log = logging.getLogger("bench.timers")

NS = "bench-timers"
NEXT_STEP = {
    EventType.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED,
    EventType.EVENT_TYPE_MARKER_RECORDED,
    EventType.EVENT_TYPE_TIMER_STARTED,
    EventType.EVENT_TYPE_WORKFLOW_EXECUTION_COMPLETED,
    EventType.EVENT_TYPE_WORKFLOW_EXECUTION_CONTINUED_AS_NEW,
}
TIMERS = {
    "approval timeout": "approval timeout",
    "Pending deadline": "Pending deadline",
    "capacity deadline": "capacity deadline",
}


def bench_runbook(approval_s: float, pending_s: float) -> dict[str, Any]:
    return {
        "apiVersion": "sickbay/v1",
        "kind": "Runbook",
        "metadata": {"name": "bench-timers"},
        "spec": {
            "precedence": 900,
            "match": {"namespaces": [NS]},
            "approval": {
                "required": True,
                "timeout": f"{approval_s}s",
                "onTimeout": "proceed",
                "unsafe": ["timeout"],
            },
            "replacement": {"pendingDeadline": f"{pending_s}s", "unsafe": ["pendingDeadline"]},
            "scaleUp": {"enabled": False},
            "release": {"mode": "repaired"},
            # The same GPU fails every round: the third would retire it (a lemon).
            "lemons": {"enabled": False},
            "escalation": {"channels": []},
        },
    }


def lags(history: Any) -> list[tuple[str, float]]:
    """(timer, ms from its TimerFired to the next step's first command) for each runbook timer
    that fired in `history`."""
    names: dict[int, str] = {}
    out: list[tuple[str, float]] = []
    events = list(history.events)
    for i, e in enumerate(events):
        if e.event_type == EventType.EVENT_TYPE_TIMER_STARTED:
            text = ""
            if e.user_metadata.HasField("summary"):
                text = e.user_metadata.summary.data.decode(errors="replace")
            timer = next((name for key, name in TIMERS.items() if key in text), None)
            if timer is not None:
                names[e.event_id] = timer
        if e.event_type != EventType.EVENT_TYPE_TIMER_FIRED:
            continue
        timer = names.get(e.timer_fired_event_attributes.started_event_id)
        if timer is None:
            continue
        fired = e.event_time.ToDatetime().replace(tzinfo=UTC)
        nxt = next((n for n in events[i + 1 :] if n.event_type in NEXT_STEP), None)
        if nxt is not None:
            at = nxt.event_time.ToDatetime().replace(tzinfo=UTC)
            out.append((timer, (at - fired).total_seconds() * 1000))
    return out


async def run(rounds: int = 10, approval_s: float = 3.0, pending_s: float = 8.0) -> dict[str, Any]:
    stack = open_stack(time_scale=30.0, lemons=False)
    samples: dict[str, list[float]] = {name: [] for name in TIMERS.values()}
    outcomes: list[str] = []
    try:
        assert stack.info is not None
        path = Path(stack.info.runbooks_dir) / "bench-timers.yaml"
        path.write_text(yaml.safe_dump(bench_runbook(approval_s, pending_s), sort_keys=False))
        demo = await Demo.open(stack, Progress(lambda line: log.info("%s", line)))
        try:
            await demo.namespace(NS)
            await demo.deployment(NS, "llm")
            for i in range(rounds):
                [(_pod, device)] = await demo.running(NS, "llm")
                gpu = await demo.gpu(device)
                gpus = len((await demo.k("GET", "/twin/gpus"))["items"])
                if gpus > 1:  # every other GPU busy: the replacement stays Pending
                    await demo.deployment(NS, f"filler-{i}", replicas=gpus - 1)
                    await demo.running(NS, f"filler-{i}", count=gpus - 1)
                await demo.fail(gpu, xid=48)
                incident = await demo.incident(gpu, f"round {i + 1}: timers")
                status = await demo.phase(incident, {Phase.HOLDING}, within=120.0)
                outcomes.append(status.escalation_reason or "")
                await demo.k("DELETE", f"/apis/apps/v1/namespaces/{NS}/deployments/filler-{i}")
                await demo.recover(gpu)
                await demo.repaired(incident)
                result = await demo.closed(incident)
                handle = demo.client.get_workflow_handle(incident.workflow_id)
                for timer, ms in lags(await handle.fetch_history()):
                    samples[timer].append(ms)
                log.info("round %d: %s, %s", i + 1, status.escalation_reason, result.outcome)
        finally:
            await demo.close()
    finally:
        stack.stop()
    return {
        "rounds": rounds,
        "approval_timeout_s": approval_s,
        "pending_deadline_s": pending_s,
        "escalations": outcomes,
        "lag_ms": {name: summary(values) for name, values in samples.items()},
    }


def summary_rows(t: dict[str, Any]) -> list[str]:
    return [
        f"| timer -> next step, {name} (p99) | {s['p99']:.0f} ms | 1000 ms | "
        f"{'met' if s['p99'] <= 1000 else '**missed**'} |"
        for name, s in t["lag_ms"].items()
        if s.get("n")
    ]


def section(t: dict[str, Any]) -> list[str]:
    rows = [
        f"| {name} | {s.get('n', 0)} | {s.get('p50', 0):.0f} ms | {s.get('p99', 0):.0f} ms | "
        f"{s.get('max', 0):.0f} ms |"
        for name, s in t["lag_ms"].items()
        if s.get("n")  # the capacity deadline fires only when a scale-up brings nothing
    ]
    return [
        "## 9. Runbook timer -> next step",
        "",
        "`bench/timers.py`: on the embedded stack, each round fails the GPU of an inference "
        f"Deployment under a bench runbook (approval timeout {t['approval_timeout_s']:g} s, "
        f"onTimeout proceed; Pending deadline {t['pending_deadline_s']:g} s with the other GPU "
        "busy, scale-up off) and reads the closed run's history: from each runbook timer's "
        "TimerFired to the first command of the next step (server event times). Goal: 1 s. "
        "The eviction timeout and the repair rung / validation timeouts are asserted by "
        "tests/workflows/test_timers_on_time.py (by order of events), not measured here.",
        "",
        "| timer | fired | p50 | p99 | max |",
        "|---|---|---|---|---|",
        *rows,
        "",
    ]
