"""Closed-loop repair: failure -> validated release on the twin, per rung.

An embedded stack with the shipped repair ladder on (harness StackConfig.repair) runs one
inference Deployment on a 1-node x 2-GPU stand. Each round fails the GPU under the pod with
Xid 48 (ECC: reset, then the validation Job), then with Xid 79 (off the bus: the node drained
and rebooted through the twin's Compute Engine endpoint, then validation), then with Xid 64
(row-remap failure: the shipped ladder's only rung for it is replace: the node drained, its
instance recreated through the same endpoint - same name, new GPU UUIDs - the new node
cordoned while it registers, one validation Job per new GPU, uncordoned), and times each
from the fault to the remediation closed `released` (harness.scenarios does the checks: no
person acted, the rung named, validation passed; for replace: closed "replaced", the new
GPUs validated). The replaced node starts for `harness.stack.NODE_STARTUP_SECONDS`
simulated seconds (kubelet, then the GPU driver) before it publishes its GPUs. Wall-clock seconds on the twin running
`time_scale` times faster with the demo runbooks' durations divided by the same factor; the
rung polls run every 5 s of real time (workflows/remediation/calls.py POLL_RETRY), which
dominates at this scale. Also counted: the human actions the runs needed (goal 0).

The lemons knob is off on this stand: the same two GPUs fail 2 x `rounds` times, and with the
shipped 3-in-7d the third failure of a GPU would retire it (the repair scenario's lemon part,
measured by bench/human_actions.py, plays that). Sends no signal: `Demo.people` stays empty.
"""

from __future__ import annotations

import logging
import time
from typing import Any

from bench.common import summary
from bench.stacks import open_stack
from harness.scenarios import Demo, Progress, _ns, _people_in, _repaired_without_people
from harness.stack import NODE_STARTUP_SECONDS

log = logging.getLogger("bench.closed_loop")

# (Xid, the shipped ladder's first rung for it) measured each round.
RUNGS = ((48, "reset"), (79, "reboot"), (64, "replace"))


async def run(rounds: int = 10, time_scale: float = 30.0) -> dict[str, Any]:
    stack = open_stack(time_scale=time_scale, repair=True, lemons=False)
    timings: dict[str, list[float]] = {"reset": [], "reboot": [], "replace": []}
    human = 0
    try:
        demo = await Demo.open(stack, Progress(lambda line: log.info("%s", line)))
        try:
            ns = _ns("bench-repair")
            await demo.namespace(ns)
            await demo.deployment(ns, "llm")
            for i in range(rounds):
                for xid, rung in RUNGS:
                    t = time.monotonic()
                    result = await _repaired_without_people(
                        demo, ns, "llm", xid, rung, f"round {i + 1}: Xid {xid} -> {rung}"
                    )
                    timings[rung].append(time.monotonic() - t)
                    human += len(_people_in(result.timeline))
            human += len(demo.people)
        finally:
            await demo.close()
    finally:
        stack.stop()
    return {
        "rounds": rounds,
        "time_scale": time_scale,
        "node_startup_seconds": NODE_STARTUP_SECONDS,
        "seconds": {rung: summary(values) for rung, values in timings.items()},
        "human_actions": human,
    }


def _s(v: float) -> str:
    return f"{v:.1f} s"


def summary_rows(r: dict[str, Any]) -> list[str]:
    rows = []
    for rung, s in r["seconds"].items():
        if s.get("n"):
            rows.append(
                f"| repair: failure -> validated release, {rung} (p50 / p99, {s['n']} runs, "
                f"twin x{r['time_scale']:g}) | {_s(s['p50'])} / {_s(s['p99'])} | | |"
            )
    rows.append(
        f"| repair: human actions in the repair runs | {r['human_actions']} | 0 | "
        f"{'met' if r['human_actions'] == 0 else '**missed**'} |"
    )
    return rows


def section(r: dict[str, Any]) -> list[str]:
    out = [
        "## 7. Closed-loop repair: failure -> validated release",
        "",
        f"`bench/closed_loop.py`: {r['rounds']} rounds on a 1-node x 2-GPU twin (x{r['time_scale']:g}, "
        "demo runbooks with the shipped ladder on); each round Xid 48 (reset, validation), "
        "Xid 79 (reset not applicable: node drained, rebooted, validation) and Xid 64 "
        "(replace only: node drained, its instance recreated with new GPUs, the new node "
        f"cordoned while it starts ({r.get('node_startup_seconds', 0):g} s simulated before its "
        "GPUs are published), one validation Job per new GPU, uncordoned), from the fault to "
        "the remediation closed `released`. No person acts. Lemons off on this stand (the same "
        "two GPUs fail every round; the lemon part is in the human-actions section).",
        "",
        "| rung | n | p50 | p99 | max |",
        "|---|---|---|---|---|",
    ]
    for rung, s in r["seconds"].items():
        if s.get("n"):
            out.append(f"| {rung} | {s['n']} | {_s(s['p50'])} | {_s(s['p99'])} | {_s(s['max'])} |")
    out += ["", f"Human actions needed: {r['human_actions']} (goal 0).", ""]
    return out
