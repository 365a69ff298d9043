"""The shipped monitoring files, checked by the real Prometheus and Alertmanager tools.

Cases:
- `promtool check rules` accepts deploy/prometheus-rules.yaml, and `promtool test rules` runs
  tests/monitoring/rules.test.yaml green; every shipped rule is made to fire there;
- `amtool check-config` (Alertmanager 0.25, Debian 12's, and later) accepts
  deploy/alertmanager.yaml: no field newer than 0.25 (the webhook `timeout`) is required;
- the Prometheus Operator copies (deploy/monitoring/): the PrometheusRule's groups are the
  plain rule file's, and `promtool check rules` accepts them; the AlertmanagerConfig routes
  `sickbay="device"` to the same webhook URL with the same grouping, the token from a Secret;
- deploy/monitoring/dcgm-counters.csv enables every DCGM metric the rules read.
"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import yaml

from tests.monitoring.conftest import binary

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy"
RULES = DEPLOY / "prometheus-rules.yaml"
RULE_TESTS = Path(__file__).with_name("rules.test.yaml")


def run(*argv: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(argv, capture_output=True, text=True, timeout=120, check=False)


def _rule_names(doc: dict) -> set[str]:
    return {r["alert"] for g in doc["groups"] for r in g["rules"] if "alert" in r}


def test_promtool_checks_and_unit_tests_the_rules() -> None:
    promtool = binary("promtool")
    checked = run(promtool, "check", "rules", str(RULES))
    assert checked.returncode == 0, checked.stdout + checked.stderr
    tested = run(promtool, "test", "rules", str(RULE_TESTS))
    assert tested.returncode == 0, tested.stdout + tested.stderr
    # Every rule is made to fire at least once by the unit tests.
    fired = {
        case["alertname"]
        for test in yaml.safe_load(RULE_TESTS.read_text())["tests"]
        for case in test.get("alert_rule_test", [])
        if case.get("exp_alerts")
    }
    assert _rule_names(yaml.safe_load(RULES.read_text())) <= fired


def test_amtool_accepts_the_alertmanager_example() -> None:
    amtool = binary("amtool")
    checked = run(amtool, "check-config", str(DEPLOY / "alertmanager.yaml"))
    assert checked.returncode == 0, checked.stdout + checked.stderr
    hook = next(
        r
        for r in yaml.safe_load((DEPLOY / "alertmanager.yaml").read_text())["receivers"]
        if r["name"] == "sickbay"
    )["webhook_configs"][0]
    assert "timeout" not in hook  # 0.28+ only: documented as optional, never required


def test_prometheus_operator_rule_is_the_rule_file(tmp_path: Path) -> None:
    promtool = binary("promtool")
    rule = yaml.safe_load((DEPLOY / "monitoring" / "prometheus-rule.yaml").read_text())
    assert (rule["apiVersion"], rule["kind"]) == ("monitoring.coreos.com/v1", "PrometheusRule")
    assert rule["spec"]["groups"] == yaml.safe_load(RULES.read_text())["groups"]
    assert rule["metadata"]["labels"].get("release")  # kube-prometheus-stack's ruleSelector
    plain = tmp_path / "rules.yaml"
    plain.write_text(yaml.safe_dump({"groups": rule["spec"]["groups"]}))
    checked = run(promtool, "check", "rules", str(plain))
    assert checked.returncode == 0, checked.stdout + checked.stderr


def test_alertmanager_config_matches_the_example() -> None:
    amc = yaml.safe_load((DEPLOY / "monitoring" / "alertmanager-config.yaml").read_text())
    assert (amc["apiVersion"], amc["kind"]) == (
        "monitoring.coreos.com/v1alpha1",
        "AlertmanagerConfig",
    )
    example = yaml.safe_load((DEPLOY / "alertmanager.yaml").read_text())
    route = next(r for r in example["route"]["routes"] if r["receiver"] == "sickbay")
    hook = next(r for r in example["receivers"] if r["name"] == "sickbay")["webhook_configs"][0]
    spec = amc["spec"]
    assert spec["route"]["receiver"] == "sickbay"
    assert spec["route"]["matchers"] == [{"name": "sickbay", "value": "device", "matchType": "="}]
    assert spec["route"]["groupBy"] == route["group_by"]
    (receiver,) = spec["receivers"]
    (amc_hook,) = receiver["webhookConfigs"]
    assert amc_hook["url"] == hook["url"]
    assert amc_hook["sendResolved"] is hook["send_resolved"] is True
    credentials = amc_hook["httpConfig"]["authorization"]["credentials"]
    assert credentials == {"name": "sickbay-webhook-token", "key": "token"}


def test_counters_file_enables_what_the_rules_read() -> None:
    text = (DEPLOY / "monitoring" / "dcgm-counters.csv").read_text()
    enabled = {
        line.split(",")[0].strip()
        for line in text.splitlines()
        if line.strip() and not line.lstrip().startswith("#")
    }
    exprs = " ".join(
        r["expr"] for g in yaml.safe_load(RULES.read_text())["groups"] for r in g["rules"]
    )
    # DCGM_EXP_* come from dcgm-exporter itself (not DCGM fields); kube_* from kube-state-metrics.
    read = set(re.findall(r"\bDCGM_FI_[A-Z0-9_]+", exprs))
    assert read and read <= enabled, sorted(read - enabled)
