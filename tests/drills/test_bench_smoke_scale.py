"""The benchmark code runs, part 3 of 3: `python -m bench --quick --only timers,watch,fleet,
node_upgrade,storm_replicas,memory,abuse` (figures not judged; tests/drills/bench_quick.py).

Case: two rounds of runbook timers, the health watcher's cost at 400 and 800 pods, a fleet of
two clusters on one Temporal (two workers and two webhooks each, one worker of each killed
mid-burst), one round of each node-upgrade story, a 400-alert storm through two webhook
replicas with one killed mid-storm, 16 remediations in flight and the webhook under abuse
write their markdown, plots and results.json; every benchmark produced its figures, the
replica storm lost no alert, and the fleet lost, doubled and over-spent nothing and
quarantined every in-budget GPU of each cluster apart. Nothing is timed.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.drills.bench_quick import assert_plots, run_quick

pytestmark = [pytest.mark.slow(seconds=130), pytest.mark.devserver, pytest.mark.timeout(840)]


def test_scale_benchmarks_run(tmp_path: Path) -> None:
    run = run_quick(tmp_path, "scale")
    results = run.results
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
    # where the machine's time went: the surviving workers and the one Temporal server
    assert fleet["cpu_seconds"]["worker"] > 0 and fleet["cpu_seconds"]["temporal"] > 0
    for cluster in fleet["clusters"].values():
        assert cluster["quarantined"] == cluster["limit"] == 4  # 6 failed, 25% of 16 GPUs
        assert cluster["leases_of_other_clusters"] == 0
        # Every rule traced to its GPU's alert: fault -> rule is measured from that alert's
        # send, which came at or after the burst began.
        assert cluster["fault_to_rule_s"]["n"] == cluster["rules_created"] == 4
        assert cluster["fault_to_rule_unmatched"] == 0
        assert 0 < cluster["fault_to_rule_s"]["max"] <= cluster["last_rule_after_start_s"]
        assert cluster["budget_tasks"]["ran_ms"]["n"] > 0  # its budget's tasks, timed
        # Each quarantined GPU either had a task the killed worker held, or counts among the
        # others' fault -> rule.
        assert cluster["held_by_killed_worker"] + cluster["fault_to_rule_not_held_s"]["n"] == 4
        # The slowest quarantine's local activities, read from its history, up to the rule's
        # create, the budget lease among them.
        steps = cluster["slowest_story"]["local_steps"]
        assert steps[-1][0] == "quarantine-device" and "acquire-budget-lease" in dict(steps)
    assert fleet["last_fault_to_rule_s"] <= fleet["last_rule_after_start_s"]
    assert results["memory"]["remediations"] == 16
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
    assert results["abuse"]
    text = run.text
    assert "## Node upgrade: GPUs that vanish" in text
    assert "### Watcher cost against cluster size" in text
    assert "## 3b. Storm through two webhook replicas, one killed" in text
    assert "## 3c. A fleet on one Temporal" in text
    assert_plots(run, "storm_replicas", "fleet", "memory", "watch_curve")
