"""Human actions in the shipped repair scenarios (goal 0): each scenario runs on the embedded
stack (`harness/stack.py`) and every step a person took is counted from the incidents'
timelines: `marked repaired`, `abort requested`, `approved` / `rejected` sent by an actor
other than Sickbay, and the GPU ledger's un-retirements.

Scenarios counted: `lemon` (harness/scenarios.py). Until the repair ladder releases repaired
GPUs by itself, its first two failures are released by a repair mark (2 actions); the
retirement and its RMA page take none; the un-retire at the end only leaves the stand as found
and is counted apart. The repair ladder's scenario adds its own row when it exists.
"""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Any

from harness.scenarios import Demo, Progress, lemon_gpu
from harness.stack import Stack, StackConfig, free_port

HUMAN = {"marked repaired", "abort requested", "approved", "rejected"}
SCENARIOS = {"lemon": lemon_gpu}


async def run(**_: Any) -> dict[str, Any]:
    out: dict[str, Any] = {"scenarios": {}}
    with tempfile.TemporaryDirectory() as tmp:
        config = StackConfig(
            time_scale=60.0, temporal_port=free_port(), ui=False, state_dir=Path(tmp)
        )
        with Stack(config) as stack:
            demo = await Demo.open(stack, Progress(lambda _line: None))
            try:
                for name, scenario in SCENARIOS.items():
                    before = len(demo.incidents)
                    await scenario(demo)
                    actions = cleanup = 0
                    for incident in demo.incidents[before:]:
                        # Each closed incident's own timeline (its result), not the latest
                        # run's: the incidents of one GPU share a workflow id.
                        assert incident.result is not None
                        after_unretire = False
                        for entry in incident.result.timeline:
                            if entry.action == "GPU un-retired":
                                after_unretire = True
                                cleanup += 1
                            elif entry.action in HUMAN and entry.actor != "sickbay":
                                # A release after the un-retire only leaves the stand as found.
                                if after_unretire:
                                    cleanup += 1
                                else:
                                    actions += 1
                    out["scenarios"][name] = {
                        "human_actions": actions,
                        "cleanup_actions": cleanup,
                        "incidents": len(demo.incidents) - before,
                    }
            finally:
                await demo.close()
    return out


def summary_rows(h: dict[str, Any]) -> list[str]:
    return [
        f"| human actions, scenario {name} (incidents) | {s['human_actions']} "
        f"({s['incidents']}) | 0 | {'met' if s['human_actions'] == 0 else '**missed**'} |"
        for name, s in h["scenarios"].items()
    ]


def section(h: dict[str, Any]) -> list[str]:
    rows = [
        f"| {name} | {s['incidents']} | {s['human_actions']} | {s['cleanup_actions']} |"
        for name, s in h["scenarios"].items()
    ]
    return [
        "## Human actions in the repair scenarios",
        "",
        "`bench/human_actions.py`: each shipped repair scenario on the embedded stack; the people's "
        "steps counted from the incidents' timelines (repair marks, aborts, approvals, "
        "un-retirements). Goal: 0. The lemon scenario still needs a repair mark for each of its "
        "first two failures (the repair ladder is not wired into the remediation yet); the "
        "retirement and its one RMA page need nobody. Clean-up (un-retire and release at the end) "
        "is counted apart.",
        "",
        "| scenario | incidents | human actions | clean-up actions |",
        "|---|---|---|---|",
        *rows,
        "",
    ]
