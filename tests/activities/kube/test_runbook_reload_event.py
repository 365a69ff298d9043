"""A runbook edit that does not load is loud: an Event on the runbooks ConfigMap, a metric, a
log line; the last good set stays in use.

Cases:
- RunbookActivities: a bad edit keeps the last good set, is reported once (not at every
  activity call), a fixed edit loads, a second bad edit is reported again;
- report_runbooks_invalid against the twin: a Warning Event `RunbookReloadFailed` on ConfigMap
  sickbay-runbooks carrying its uid (what `kubectl describe configmap` lists by), the same
  report twice is one Event; without the ConfigMap (runbooks from elsewhere) nothing is posted;
- deploy/rbac.yaml lets the worker read that ConfigMap, and nothing else of its kind but the
  cluster-name one;
- the metrics: `sickbay_runbook_reload_failures` counts the refused edit and
  `sickbay_runbooks_valid` reads 0, on the process's Prometheus endpoint (a subprocess with its
  own Temporal runtime).
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import httpx
import yaml

from activities.kube.events import report_runbooks_invalid
from activities.runbooks import RunbookActivities
from contract.names import RUNBOOKS_CONFIGMAP
from harness.stack import free_port
from tests.activities.kube.conftest import twin

ROOT = Path(__file__).resolve().parents[3]


def _copy_runbooks(tmp_path: Path) -> Path:
    target = tmp_path / "runbooks"
    target.mkdir()
    for f in (ROOT / "runbooks").glob("*.yaml"):
        shutil.copy(f, target / f.name)
    return target


def _break(path: Path, field: str) -> None:
    text = path.read_text()
    path.write_text(text.replace("spec:\n", f"spec:\n  {field}: 1\n", 1))


def test_a_bad_edit_is_reported_once_and_the_last_good_set_stays(tmp_path: Path) -> None:
    folder = _copy_runbooks(tmp_path)
    told: list[str] = []
    acts = RunbookActivities(folder, on_invalid=told.append)
    good = acts.current()
    _break(folder / "batch.yaml", "typo_field")
    assert acts.current() is good and acts.current() is good
    assert len(told) == 1 and "typo_field" in told[0] and "batch.yaml" in told[0]
    shutil.copy(ROOT / "runbooks" / "batch.yaml", folder / "batch.yaml")
    fixed = acts.current()
    assert fixed is not good and [r.name for r in fixed.runbooks] == [r.name for r in good.runbooks]
    _break(folder / "inference.yaml", "another_typo")
    assert acts.current() is fixed
    assert len(told) == 2 and "another_typo" in told[1]
    assert acts.failed_reloads == 2


def test_the_event_lands_on_the_runbooks_configmap(tmp_path: Path) -> None:
    with twin(tmp_path, "1.36") as t:
        kube = t.acts.kube
        assert report_runbooks_invalid(kube, "sickbay", "batch.yaml:3: spec.x: unknown") is False
        kube.core.create_namespace({"metadata": {"name": "sickbay"}})
        cm = kube.core.create_namespaced_config_map(
            "sickbay", {"metadata": {"name": RUNBOOKS_CONFIGMAP}, "data": {"a.yaml": "x"}}
        )
        for _ in range(2):  # the same report again: one Event
            assert report_runbooks_invalid(kube, "sickbay", "batch.yaml:3: spec.x: unknown")
        events = kube.core.list_namespaced_event(
            "sickbay", field_selector=f"involvedObject.name={RUNBOOKS_CONFIGMAP}"
        ).items
        assert len(events) == 1
        event = events[0]
        assert (event.reason, event.type) == ("RunbookReloadFailed", "Warning")
        assert event.involved_object.kind == "ConfigMap"
        assert event.involved_object.uid == cm.metadata.uid
        assert "spec.x: unknown" in event.message and "last good set" in event.message


def test_the_worker_may_read_the_runbooks_configmap() -> None:
    docs = list(yaml.safe_load_all((ROOT / "deploy" / "rbac.yaml").read_text()))
    names = {
        name
        for d in docs
        if d and d.get("kind") == "Role"
        for rule in d.get("rules", [])
        if "configmaps" in rule.get("resources", []) and "get" in rule.get("verbs", [])
        for name in rule.get("resourceNames", ["*"])
    }
    assert names == {"sickbay-cluster", RUNBOOKS_CONFIGMAP}


def test_the_reload_metrics(tmp_path: Path) -> None:
    folder = _copy_runbooks(tmp_path)
    port = free_port()
    script = textwrap.dedent(
        f"""
        import sys, time
        from pathlib import Path
        from temporalio.runtime import PrometheusConfig, Runtime, TelemetryConfig
        from activities.runbooks import RunbookActivities
        Runtime.set_default(Runtime(telemetry=TelemetryConfig(
            metrics=PrometheusConfig(bind_address="127.0.0.1:{port}"))))
        acts = RunbookActivities(Path({str(folder)!r}))
        acts.current()
        p = Path({str(folder / "batch.yaml")!r})
        p.write_text(p.read_text().replace("spec:\\n", "spec:\\n  typo_field: 1\\n", 1))
        acts.current()
        print("ready", flush=True)
        sys.stdin.read()
        """
    )
    proc = subprocess.Popen(
        [sys.executable, "-c", script],
        cwd=ROOT,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stdout is not None and proc.stdout.readline().strip() == "ready"
        deadline = time.monotonic() + 60
        text = ""
        while "sickbay_runbooks_valid" not in text:
            assert time.monotonic() < deadline, text
            try:
                text = httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=5).text
            except httpx.TransportError:
                time.sleep(0.2)
        lines = {
            line.split("{")[0].split(" ")[0]: line.rsplit(" ", 1)[1]
            for line in text.splitlines()
            if line.startswith("sickbay_runbook")
        }
        assert float(lines["sickbay_runbooks_valid"]) == 0, text
        failures = next(k for k in lines if k.startswith("sickbay_runbook_reload_failures"))
        assert float(lines[failures]) == 1, text
    finally:
        proc.kill()
        proc.wait(timeout=10)


def test_pause_and_resume_events_land_on_the_cluster_configmap(tmp_path: Path) -> None:
    from datetime import UTC, datetime

    from activities.kube.events import report_pause
    from contract.budget import PauseRecord
    from contract.names import CLUSTER_CONFIGMAP

    at = datetime(2026, 12, 5, 8, 0, tzinfo=UTC)
    paused = PauseRecord(
        action="pause",
        actor="alice",
        reason="driver rollout",
        at=at,
        verification="verified",
        via="kubernetes",
    )
    resumed = PauseRecord(
        action="resume", actor="bob", at=at.replace(minute=30), verification="unverified"
    )
    with twin(tmp_path, "1.36") as t:
        kube = t.acts.kube
        kube.core.create_namespace({"metadata": {"name": "sickbay"}})
        cm = kube.core.create_namespaced_config_map(
            "sickbay", {"metadata": {"name": CLUSTER_CONFIGMAP}, "data": {"name": "c1"}}
        )
        for _ in range(2):  # two replicas (or a restart) posting the same record: one Event
            report_pause(kube, "sickbay", paused, budget_id="sickbay-c1-budget")
        report_pause(kube, "sickbay", resumed, budget_id="sickbay-c1-budget")
        events = kube.core.list_namespaced_event(
            "sickbay", field_selector=f"involvedObject.name={CLUSTER_CONFIGMAP}"
        ).items
    by_reason = {e.reason: e for e in events}
    assert len(events) == 2 and set(by_reason) == {"SickbayPaused", "SickbayResumed"}
    pause_event = by_reason["SickbayPaused"]
    assert pause_event.type == "Warning" and pause_event.involved_object.uid == cm.metadata.uid
    # The pauser as the budget recorded it: verified through the actions endpoint, or not.
    assert "paused by alice (verified via kubernetes): driver rollout" in pause_event.message
    assert by_reason["SickbayResumed"].type == "Normal"
    assert "resumed by bob (unverified)" in by_reason["SickbayResumed"].message
