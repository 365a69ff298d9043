"""Human actions in the shipped repair scenario (goal 0): `sickbay-dev demo --scenario repair`
(harness/scenarios.py `repair_ladder`, all of `REPAIR_PARTS`: Xid 48 -> reset; Xid 79 ->
reboot; the same GPU failing until its third failure in the lemons window retires it, one RMA
page) on the embedded stack with the shipped ladder on, counted two ways:

- what the scenario sent: every repaired/abort signal and approve/un-retire update goes
  through `Demo`, which counts it (`Demo.people`);
- what the incidents' timelines show: `marked repaired`, `abort requested`, `approved` /
  `rejected`, `GPU un-retired` by anyone.

The clean-up afterwards (un-retire the lemon, release it, so the stand is left as found) is
not part of the scenario; it is counted apart (`Demo.cleanup_people`), as are the timeline
entries it causes (from the un-retire on).
"""

from __future__ import annotations

import time
from typing import Any

from bench.stacks import open_stack
from harness.scenarios import Demo, Progress, _people_in, repair_ladder

SCENARIOS = {"repair": repair_ladder}


async def run(time_scale: float = 60.0, **_: Any) -> dict[str, Any]:
    out: dict[str, Any] = {"scenarios": {}}
    stack = open_stack(time_scale=time_scale, repair=True)
    try:
        demo = await Demo.open(stack, Progress(lambda _line: None))
        try:
            for name, scenario in SCENARIOS.items():
                before = len(demo.incidents)
                t = time.monotonic()
                await scenario(demo)
                seconds = time.monotonic() - t
                in_timelines = cleanup = 0
                for incident in demo.incidents[before:]:
                    # Each closed incident's own timeline (its result), not the latest run's:
                    # the incidents of one GPU share a workflow id.
                    assert incident.result is not None
                    entries = incident.result.timeline
                    cut = next(
                        (i for i, e in enumerate(entries) if e.action == "GPU un-retired"),
                        len(entries),
                    )
                    in_timelines += len(_people_in(entries[:cut]))
                    cleanup += len(_people_in(entries[cut:]))
                retired = [
                    i
                    for i in demo.incidents[before:]
                    if i.result is not None and i.result.status.escalation_reason == "gpu-retired"
                ]
                out["scenarios"][name] = {
                    "human_actions": len(demo.people) + in_timelines,
                    "sent": len(demo.people),
                    "in_timelines": in_timelines,
                    "cleanup_actions": len(demo.cleanup_people),
                    "cleanup_in_timelines": cleanup,
                    "incidents": len(demo.incidents) - before,
                    "retired": len(retired),
                    "seconds": round(seconds, 1),
                }
                demo.people.clear()
                demo.cleanup_people.clear()
        finally:
            await demo.close()
    finally:
        stack.stop()
    out["time_scale"] = time_scale
    return out


def summary_rows(h: dict[str, Any]) -> list[str]:
    return [
        f"| human actions, scenario {name} ({s['incidents']} incidents, {s['retired']} retired) "
        f"| {s['human_actions']} | 0 | {'met' if s['human_actions'] == 0 else '**missed**'} |"
        for name, s in h["scenarios"].items()
    ]


def section(h: dict[str, Any]) -> list[str]:
    rows = [
        f"| {name} | {s['incidents']} | {s['retired']} | {s['sent']} | {s['in_timelines']} | "
        f"{s['cleanup_actions']} | {s['seconds']:.0f} s |"
        for name, s in h["scenarios"].items()
    ]
    return [
        "## 8. Human actions in the repair scenario",
        "",
        "`bench/human_actions.py`: `sickbay-dev demo --scenario repair` on the embedded stack "
        f"(twin x{h.get('time_scale', 60):g}, shipped ladder and lemons on): Xid 48 -> reset -> "
        "validation -> released; Xid 79 -> reboot -> validation -> released; the same GPU failing "
        "(Xid 48) until its third failure in the window: the earlier ones repaired by reset, the "
        "third retires it with one RMA page. Counted: the signals and updates the scenario sent "
        "(repaired, abort, approve, un-retire) and the people's entries in the incidents' "
        "timelines. Goal: 0. The clean-up afterwards (un-retire the lemon and release it, to leave "
        "the stand as found) is counted apart.",
        "",
        "| scenario | incidents | retired | sent by the scenario | in the timelines | "
        "clean-up actions | wall time |",
        "|---|---|---|---|---|---|---|",
        *rows,
        "",
    ]
