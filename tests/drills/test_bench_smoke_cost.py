"""The benchmark code runs, part 2 of 3: `python -m bench --quick --only
cost,human_actions,latency,burst` (figures not judged; tests/drills/bench_quick.py runs it).

Case: 8 latency triples, one incident of each costed procedure (repair with validation, happy
path, Pending-deadline scale-up) and the human-actions scenario write their markdown, plot and
results.json; the latency triples were all matched, and so were the alerts on GPUs with a
consumer pod (whose owner was read), and the run timed its Temporal round trips; the three cost runs ended released with
their histories, actions and API requests counted, and the fleet table is priced from them;
the burst under workloads (6 GPUs with a pod each, half in budget, one activity slot) quarantined
the budget's GPUs and paged every refused one, none escalated for a failed step. Nothing is
timed.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.drills.bench_quick import assert_plots, run_quick

pytestmark = [pytest.mark.slow(seconds=120), pytest.mark.devserver, pytest.mark.timeout(840)]


def test_cost_human_actions_and_latency_benchmarks_run(tmp_path: Path) -> None:
    run = run_quick(tmp_path, "cost")
    results = run.results
    assert results["latency"]["measured"] == results["latency"]["pairs"] == 8
    consumers = results["latency"]["consumers"]  # the production path: a pod on each GPU
    assert consumers["measured"] == consumers["pods"] == 3 and consumers["missing"] == 0
    assert consumers["calls"]["get replicasets"] >= 1  # each pod's owner was looked up
    assert "With a consumer on the GPU" in run.text
    # The run's own Temporal round trips, back to back and after quiet, each timed 4 times.
    trips = results["latency"]["round_trips"]
    assert sorted(trips) == [
        f"{kind}_{rhythm}"
        for kind in ("describe", "query")
        for rhythm in ("after_idle", "back_to_back")
    ]
    assert all(t["n"] == 4 and t["min"] > 0 for t in trips.values())
    assert "One Temporal round trip on the same server" in run.text
    # Every remediation's task made a Kubernetes call before its rule: the first is timed.
    assert results["latency"]["breakdown"]["task_to_first_call"]["n"] == 8
    assert "from the task's start to its first Kubernetes call" in run.text
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
    assert results["human_actions"]
    assert "## 2. Cost per incident" in run.text and "### What a fleet costs" in run.text
    # More open waits than activity slots: the refused GPUs' pages still went out.
    burst = results["burst"]
    assert burst["consumers"] == 6 and burst["slots"] == 1
    assert burst["quarantined"] == 4 and burst["quarantined_both"] == 0
    assert burst["refused"] == burst["paged"] == 2 and burst["pages_missing"] == 0
    assert burst["escalated_beyond_refused"] == 0 and burst["non_2xx"] == 0
    assert "## 3d. A burst under running workloads" in run.text
    assert_plots(run, "latency")
