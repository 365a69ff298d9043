"""`python -m bench --quick --only <sections>` as the smoke tests run it: one subprocess per
group of sections, so the groups run side by side on the suite's workers (`--dist loadfile`:
one file each) instead of one 6-minute run alone at the end of `make test`.

GROUPS splits bench.__main__.ALL in three of about two minutes each on an idle 2-core machine
(quick run, 2026-12-06: repair 104 s, cost 62 s, human_actions 41 s, timers 39 s, watch 27 s,
fleet 24 s, latency 14 s, node_upgrade 14 s, storm_replicas 12 s, memory 11 s, storm 10 s,
abuse 9 s, budget 1 s); test_bench_smoke_groups.py checks that every section is in one.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tests.drills.conftest import worker_argv

ROOT = Path(__file__).resolve().parents[2]

GROUPS: dict[str, tuple[str, ...]] = {
    "repair": ("repair", "storm", "budget"),
    "cost": ("cost", "human_actions", "latency", "burst"),
    "scale": ("timers", "watch", "fleet", "node_upgrade", "storm_replicas", "memory", "abuse"),
}


@dataclass(frozen=True)
class QuickRun:
    results: dict[str, Any]
    text: str  # the markdown it wrote
    plots: Path


def run_quick(tmp_path: Path, group: str) -> QuickRun:
    """Run one group's sections in quick mode; fails naming the failed benchmarks."""
    argv = worker_argv()
    env = dict(os.environ)
    if argv[0] != "-m":
        env["SICKBAY_BENCH_WORKER"] = argv[0]
    out = tmp_path / "BENCHMARKS.md"
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "bench",
            "--quick",
            "--only",
            ",".join(GROUPS[group]),
            "--out",
            str(out),
            "--plots",
            str(tmp_path / "plots"),
            "--results",
            str(tmp_path),
        ],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        # A group takes about 2 minutes on 2 cores (the repair rounds wait simulated minutes
        # at x30): a bound for a hung run, not a time the test judges.
        timeout=780,
        check=False,
    )
    raw = tmp_path / "results.json"
    results = json.loads(raw.read_text()) if raw.exists() else {}
    # The failed benchmarks' own words first: the process's tails may be cut by whoever reads.
    assert proc.returncode == 0 and "errors" not in results, (
        f"failed benchmarks: {json.dumps(results.get('errors'), indent=1)}\n"
        + proc.stdout[-2000:]
        + proc.stderr[-4000:]
    )
    return QuickRun(results, out.read_text(), tmp_path / "plots")


def assert_plots(run: QuickRun, *names: str) -> None:
    """Each named plot was drawn (a PNG) and the markdown shows it."""
    for name in names:
        png = run.plots / f"{name}.png"
        assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n", name
        assert f"plots/{name}.png" in run.text
