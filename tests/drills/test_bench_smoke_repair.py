"""The benchmark code runs, part 1 of 3: `python -m bench --quick --only repair,storm,budget`
(figures not judged; tests/drills/bench_quick.py runs it).

Case: the closed repair loop's quick rounds, a 240-alert storm on a 20-node twin and a
20-request budget burst write their markdown, plot and results.json; every benchmark produced
its figures (no `errors` entry) and the burst granted the budget's limit. Nothing is timed.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.drills.bench_quick import assert_plots, run_quick

# The run's own bound is the subprocess timeout in bench_quick; pytest-timeout's suite-wide
# 300 s could end it first on a loaded CI machine and report a hang that was not one. The
# `seconds` hint puts this file among the first the suite's workers take (tests/conftest.py).
pytestmark = [pytest.mark.slow(seconds=120), pytest.mark.devserver, pytest.mark.timeout(840)]


def test_repair_storm_and_budget_benchmarks_run(tmp_path: Path) -> None:
    run = run_quick(tmp_path, "repair")
    results = run.results
    assert results["repair"]  # the closed loop's rounds ran (its errors would be listed)
    assert results["storm"]["alerts"] == 240
    assert [r["granted"] for r in results["budget"]["rounds"]] == [6]  # the quick limit
    assert "## Summary" in run.text and "Quick mode" in run.text
    assert_plots(run, "storm")
