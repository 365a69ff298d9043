"""Runbook loader, classification and runbook matching (pure, no Temporal).

Cases:
- each shipped runbook loads, with the values the issue asks for (inference NoExecute / 5m /
  scale-up / page; training 30m, pages only without capacity; long-session NoSchedule,
  notify; batch 60m, no scale-up; maintenance by name only; default);
- broken YAML -> `file:line: (yaml): ...`; bad fields -> `file:line: dotted.field: problem`
  on the line of the offending key/value; unknown keys name the key; duplicate names;
- `on:` is a key, not YAML 1.1's boolean;
- the loader activity keeps the last good set when an edit breaks a file, and picks up a fix;
- Xid classification, Unhealthy pod status overriding an application Xid, evidence dedup,
  the stale-evidence rule;
- runbook matching: pod label pin, namespace label pin, unknown pin ignored with a note,
  match rules, strictest (highest precedence) across consumers, default, launch pin.
"""

from __future__ import annotations

import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from activities.runbooks import RunbookActivities, RunbookError, load_dir, load_text
from contract.kube import Consumer, Evidence, OwnerRef, PodRef
from contract.remediation import AlertEvidence
from workflows.classify import classify, classify_xid, is_stale, merge_evidence
from workflows.runbook_match import select_runbook

SHIPPED = Path(__file__).resolve().parents[2] / "runbooks"


def test_every_shipped_runbook_loads() -> None:
    loaded = {r.name: r for r in load_dir(SHIPPED).runbooks}
    assert set(loaded) == {
        "inference",
        "training",
        "long-session",
        "batch",
        "maintenance",
        "default",
    }
    inf = loaded["inference"].spec
    assert inf.quarantine.effect == "NoExecute"
    assert inf.replacement.pending_deadline == timedelta(minutes=5)
    assert inf.scale_up.enabled and inf.escalation.channels == ("pagerduty",)
    tr = loaded["training"].spec
    assert tr.quarantine.effect == "NoExecute" and tr.replacement.pending_deadline == timedelta(
        minutes=30
    )
    assert "budget-exhausted" not in tr.escalation.on and "no-capacity" in tr.escalation.on
    ls = loaded["long-session"].spec
    assert ls.quarantine.effect == "NoSchedule" and ls.on.application == "notify"
    ba = loaded["batch"].spec
    assert ba.replacement.pending_deadline == timedelta(minutes=60) and not ba.scale_up.enabled
    assert loaded["maintenance"].spec.match.empty  # only ever chosen by name
    assert loaded["maintenance"].spec.eviction.mode == "eviction-api"
    assert not loaded["default"].spec.scale_up.enabled
    assert loaded["default"].spec.eviction.force == "none"


@pytest.mark.parametrize("path", sorted(SHIPPED.glob("*.yaml")), ids=lambda p: p.stem)
def test_each_file_loads_alone(path: Path) -> None:
    (runbook,) = load_text(path.read_text(), str(path))
    assert runbook.name == path.stem


BAD = """\
apiVersion: sickbay/v1
kind: Runbook
metadata:
  name: Bad_Name
spec:
  eviction:
    timeout: ten minutes
    mode: evict
  budget:
    maxPerPool: 150%
  replacment: {}
"""


def test_bad_fields_give_file_line_field_problem() -> None:
    with pytest.raises(RunbookError) as err:
        load_text(BAD, "runbooks/bad.yaml")
    problems = err.value.problems
    assert "runbooks/bad.yaml:4: metadata.name: String should match pattern" in problems[0]
    by_field = {p.split(": ")[1]: p for p in problems}
    assert by_field["spec.eviction.timeout"].startswith("runbooks/bad.yaml:7:")
    assert by_field["spec.eviction.mode"].startswith("runbooks/bad.yaml:8:")
    assert by_field["spec.budget.maxPerPool"].startswith("runbooks/bad.yaml:10:")
    assert "150%" in by_field["spec.budget.maxPerPool"]
    assert by_field["spec.replacment"].startswith("runbooks/bad.yaml:11:")
    assert "unknown field" in by_field["spec.replacment"]


def test_broken_yaml_names_the_line() -> None:
    text = "apiVersion: sickbay/v1\nkind: Runbook\nmetadata: {name: x\nspec: {}\n"
    with pytest.raises(RunbookError) as err:
        load_text(text, "x.yaml")
    (problem,) = err.value.problems
    assert problem.startswith("x.yaml:4: (yaml):")


def test_scale_up_needs_a_pool_or_provider() -> None:
    text = "apiVersion: sickbay/v1\nkind: Runbook\nmetadata: {name: x}\nspec:\n  scaleUp:\n    enabled: true\n    maxSize: 3\n"
    with pytest.raises(
        RunbookError, match=r"x.yaml:6: spec.scaleUp: .*scaleUp.pool or scaleUp.provider"
    ):
        load_text(text, "x.yaml")


def test_siblings_always_go_together() -> None:
    """`quarantine.correlateSiblings: false` would be silently ignored (one remediation per
    physical GPU): it is refused by name instead; `true` still loads."""
    head = "apiVersion: sickbay/v1\nkind: Runbook\nmetadata: {name: x}\nspec:\n  quarantine:\n"
    (rb,) = load_text(head + "    correlateSiblings: true\n", "x.yaml")
    assert rb.spec.quarantine.correlate_siblings
    with pytest.raises(
        RunbookError, match=r"x.yaml:6: spec.quarantine.correlateSiblings: .*false is not supported"
    ):
        load_text(head + "    correlateSiblings: false\n", "x.yaml")


def test_on_is_a_key_not_a_boolean() -> None:
    text = "apiVersion: sickbay/v1\nkind: Runbook\nmetadata: {name: x}\nspec:\n  on:\n    degraded: ignore\n"
    (rb,) = load_text(text, "x.yaml")
    assert rb.spec.on.degraded == "ignore"


def test_duplicate_names_and_empty_dir(tmp_path: Path) -> None:
    for name in ("a.yaml", "b.yaml"):
        (tmp_path / name).write_text(
            "apiVersion: sickbay/v1\nkind: Runbook\nmetadata: {name: same}\n"
        )
    with pytest.raises(RunbookError, match="already defined"):
        load_dir(tmp_path)
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(RunbookError, match="no runbooks"):
        load_dir(empty)


def test_activity_keeps_last_good_set_and_reloads(tmp_path: Path) -> None:
    good = "apiVersion: sickbay/v1\nkind: Runbook\nmetadata: {name: default}\n"
    (tmp_path / "default.yaml").write_text(good)
    acts = RunbookActivities(tmp_path)
    assert [r.name for r in acts.load_runbooks().runbooks] == ["default"]
    time.sleep(0.01)
    (tmp_path / "broken.yaml").write_text("kind: [")
    assert [r.name for r in acts.load_runbooks().runbooks] == ["default"]  # last good set
    (tmp_path / "broken.yaml").write_text(good.replace("default", "extra"))
    assert sorted(r.name for r in acts.load_runbooks().runbooks) == ["default", "extra"]


def test_activity_without_a_good_set_is_non_retryable(tmp_path: Path) -> None:
    from temporalio.exceptions import ApplicationError

    (tmp_path / "x.yaml").write_text("kind: [")
    with pytest.raises(ApplicationError) as err:
        RunbookActivities(tmp_path).load_runbooks()
    assert err.value.non_retryable and err.value.type == "RunbookInvalid"
    assert "x.yaml:1:" in str(err.value)


# --- classification -----------------------------------------------------------------------


def _alert(xid: int | None, fp: str = "", **kw: object) -> AlertEvidence:
    return AlertEvidence(source="alertmanager", alertname="Xid", fingerprint=fp, xid=xid, **kw)


@pytest.mark.parametrize(
    ("xid", "cls"),
    [
        (79, "unhealthy"),
        (48, "unhealthy"),
        (95, "unhealthy"),
        (64, "unhealthy"),
        (119, "unhealthy"),
        (74, "degraded"),
        (92, "degraded"),
        (63, "degraded"),
        (13, "application"),
        (31, "application"),
        (43, "application"),
        (45, "application"),
        (999, "unknown"),
        (None, "unknown"),
    ],
)
def test_classify_xid(xid: int | None, cls: str) -> None:
    assert classify_xid(xid) == cls


def test_worst_alert_wins_and_status_overrides() -> None:
    assert (
        classify([_alert(13, "a"), _alert(79, "b")], Evidence(health="Healthy"))[0] == "unhealthy"
    )
    cls, why = classify([_alert(13)], Evidence(health="Unhealthy"))
    assert cls == "unhealthy" and "Unhealthy" in why
    assert classify([], Evidence(health="Healthy"))[0] == "unknown"
    assert classify([_alert(13)], Evidence(device_present=False))[0] == "unhealthy"


def test_merge_dedups_by_fingerprint() -> None:
    merged, added = merge_evidence([], [_alert(79, "fp1")] * 3 + [_alert(79, "fp2")])
    assert [a.fingerprint for a in merged] == ["fp1", "fp2"] and len(added) == 2
    merged2, added2 = merge_evidence(merged, [_alert(79, "fp1")])
    assert merged2 == merged and added2 == []


def test_stale_rule() -> None:
    now = datetime(2026, 11, 29, 12, 0, tzinfo=UTC)
    old = _alert(79, "o", starts_at=now - timedelta(hours=2))
    fresh = _alert(79, "f", starts_at=now - timedelta(minutes=5))
    healthy, sick = Evidence(health="Healthy"), Evidence(health="Unhealthy")
    window = timedelta(minutes=30)
    assert is_stale([old], healthy, now, window)[0]
    assert not is_stale([old], sick, now, window)[0]  # still broken: act
    assert not is_stale([old, fresh], healthy, now, window)[0]  # a fresh alert: act
    manual = AlertEvidence(source="manual", received_at=now - timedelta(days=1))
    assert not is_stale([manual], healthy, now, window)[0]  # people are never stale


# --- matching -----------------------------------------------------------------------------


def _consumer(
    ns: str = "ml",
    kind: str | None = None,
    labels: dict | None = None,
    ns_labels: dict | None = None,
    priority: str | None = None,
) -> Consumer:
    return Consumer(
        pod=PodRef(namespace=ns, name="p"),
        top_owner=OwnerRef(kind=kind, name="w", namespace=ns) if kind else None,
        labels=labels or {},
        namespace_labels=ns_labels or {},
        priority_class=priority,
    )


RUNBOOKS = load_dir(SHIPPED).runbooks


def test_match_rules_and_default() -> None:
    assert select_runbook(RUNBOOKS, [_consumer(kind="Deployment")]).runbook.name == "inference"
    assert select_runbook(RUNBOOKS, [_consumer(kind="JobSet")]).runbook.name == "training"
    assert select_runbook(RUNBOOKS, [_consumer(kind="Job")]).runbook.name == "batch"
    assert select_runbook(RUNBOOKS, [_consumer(kind="Pod")]).runbook.name == "default"
    assert select_runbook(RUNBOOKS, []).runbook.name == "default"


def test_label_pins_win_over_match_rules() -> None:
    pinned = _consumer(kind="Deployment", labels={"sickbay.dev/workload-class": "long-session"})
    sel = select_runbook(RUNBOOKS, [pinned])
    assert sel.runbook.name == "long-session" and "pod label" in sel.why
    ns_pinned = _consumer(kind="Deployment", ns_labels={"sickbay.dev/workload-class": "batch"})
    assert select_runbook(RUNBOOKS, [ns_pinned]).runbook.name == "batch"
    typo = _consumer(kind="Job", labels={"sickbay.dev/workload-class": "trainng"})
    sel = select_runbook(RUNBOOKS, [typo])
    assert sel.runbook.name == "batch" and "trainng" in sel.notes[0]


def test_strictest_wins_across_consumers() -> None:
    sel = select_runbook(RUNBOOKS, [_consumer(kind="Job"), _consumer(kind="Deployment")])
    assert sel.runbook.name == "inference" and "strictest" in sel.why
    assert {c.runbook for c in sel.per_consumer} == {"batch", "inference"}


def test_launch_pin() -> None:
    assert (
        select_runbook(RUNBOOKS, [_consumer(kind="Deployment")], "maintenance").runbook.name
        == "maintenance"
    )
    sel = select_runbook(RUNBOOKS, [_consumer(kind="Job")], "nope")
    assert sel.runbook.name == "batch" and "nope" in sel.notes[0]
