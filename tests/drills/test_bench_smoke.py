"""The benchmark code runs: `python -m bench --quick` end to end (figures not judged).

Case: the quick mode (small counts: 8 latency pairs, one incident of each costed procedure:
repair with validation, happy path, Pending-deadline scale-up; a 240-alert storm on a
20-node twin, a 400-alert storm through two webhook replicas with one killed mid-storm,
a fleet of two clusters on one Temporal (two workers and two webhooks each, one worker of
each killed mid-burst), 16 remediations in flight, a 20-request budget burst, two rounds of runbook timers, the
health watcher's cost at 400 and 800 pods) writes its markdown, six PNG plots and
results.json; every benchmark produced its figures (no `errors` entry), the latency pairs
were all matched, the three cost runs ended released with their histories, actions and API
requests counted (and the fleet table priced from them), the replica storm lost no alert, the
fleet lost, doubled and over-spent nothing and quarantined every in-budget GPU of each
cluster apart, and the burst granted the budget's limit. Nothing here is timed.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.drills.conftest import worker_argv

# The run's own bound is the subprocess timeout below; pytest-timeout's suite-wide 300 s would
# end it first on a loaded CI machine (it did: 300.04 s) and report a hang that was not one.
pytestmark = [pytest.mark.slow, pytest.mark.devserver, pytest.mark.timeout(840)]

ROOT = Path(__file__).resolve().parents[2]


def test_bench_quick_runs(tmp_path: Path) -> None:
    argv = worker_argv()
    env = dict(os.environ)
    if argv[0] != "-m":
        env["SICKBAY_BENCH_WORKER"] = argv[0]
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "bench",
            "--quick",
            "--out",
            str(tmp_path / "BENCHMARKS.md"),
            "--plots",
            str(tmp_path / "plots"),
            "--results",
            str(tmp_path),
        ],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        # The quick run takes 3-7 minutes on 2 cores (its repair rounds wait simulated minutes
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
    assert results["latency"]["measured"] == results["latency"]["pairs"] == 8
    cost = results["cost"]
    assert list(cost["procedures"]) == ["repair", "happy_path", "scale_up"]
    for procedure in cost["procedures"].values():
        assert procedure["outcome"] == "released"
        assert procedure["history_events"] > 0 and procedure["total_actions"] > 0
        assert procedure["kube_requests"] > 0 and procedure["kube_by_call"]
        assert "sickbay-budget" in procedure["other_workflows"]  # the lease's share
    assert "sickbay-pool-scaler" in cost["procedures"]["scale_up"]["other_workflows"]
    assert set(cost["fleet"]["per_procedure"]) == set(cost["procedures"])
    assert cost["fleet"]["mixed_actions_per_month"] > 0
    assert results["storm"]["alerts"] == 240
    # The storm through two webhook replicas, one killed mid-storm and restarted on its spool:
    # every notification answered in the end, and none of its alerts missing from Temporal.
    replicas = results["storm_replicas"]
    assert replicas["alerts"] == replicas["alerts_acked"] == 400
    assert replicas["failed_notifications"] == 0 and replicas["alerts_lost"] == 0
    assert replicas["distinct_alerts"] == 200  # 50 GPUs x 4 fingerprints
    assert replicas["answered_by"]["A"] > 0 and replicas["kill_s"] > 0
    # The fleet: two clusters on one Temporal, one worker of each killed mid-burst.
    fleet = results["fleet"]
    assert fleet["n_clusters"] == 2 and set(fleet["clusters"]) == {"fleet1", "fleet2"}
    assert (fleet["lost"], fleet["doubled"], fleet["exceeded"]) == (0, 0, 0)
    assert fleet["unquarantined_in_budget"] == 0
    assert fleet["queues_apart"] and fleet["budgets_apart"]
    for cluster in fleet["clusters"].values():
        assert cluster["quarantined"] == cluster["limit"] == 4  # 6 failed, 25% of 16 GPUs
        assert cluster["leases_of_other_clusters"] == 0
    assert results["memory"]["remediations"] == 16
    assert [r["granted"] for r in results["budget"]["rounds"]] == [6]  # the quick limit
    node = results["node_upgrade"]["seconds"]  # one round of each upgrade story
    assert node["socket: vanish -> diagnosis"]["n"] == node["socket: vanish -> GPUs back"]["n"] == 1
    assert node["hook: vanish -> page"]["n"] == 1
    curve = results["watch"]["curve"]  # the watcher's cost at two small sizes
    assert [p["pods"] for p in curve["points"]] == curve["sizes"] == [400, 800]
    for point in curve["points"]:
        assert "error" not in point and point["gpu_pods"] + point["cpu_pods"] == point["pods"]
        assert point["cpu_pods"] > 2 * point["gpu_pods"]  # most pods on CPU-only nodes
        assert point["detection_ms"]["n"] + point["detection_ms"]["lost"] == 4
        assert {"rss_mb_after_sync", "max_rss_mb", "kib_per_pod", "sync_seconds"} <= set(point)
        assert "cpu_seconds_per_idle_minute" in point
    lags = results["timers"]["lag_ms"]  # both rounds' timers measured (figures not judged)
    assert lags["approval timeout"]["n"] == lags["Pending deadline"]["n"] == 2
    text = (tmp_path / "BENCHMARKS.md").read_text()
    assert "## Summary" in text and "Quick mode" in text
    assert "## Node upgrade: GPUs that vanish" in text
    assert "### Watcher cost against cluster size" in text
    assert "## 2. Cost per incident" in text and "### What a fleet costs" in text
    assert "## 3b. Storm through two webhook replicas, one killed" in text
    assert "## 3c. A fleet on one Temporal" in text
    for name in ("latency", "storm", "storm_replicas", "fleet", "memory", "watch_curve"):
        png = tmp_path / "plots" / f"{name}.png"
        assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
        assert f"plots/{name}.png" in text
