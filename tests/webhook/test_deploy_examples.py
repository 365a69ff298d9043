"""deploy/prometheus-rules.yaml and deploy/alertmanager.yaml agree with the webhook.

Cases:
- every rule has an alert name, an expression and `sickbay: device|node`; the device alerts
  are exactly the webhook's default alert names (and the twin's), node alerts are not
- every expression is valid PromQL (promql-parser)
- device alerts carry a summary; the Xid alert copies the code into the `xid` annotation (and
  `{{ $value }}` into `value`), which the webhook reads for that alert only
- a sample firing device alert shaped like these rules' output maps to a GPU
- the Alertmanager example routes `sickbay="device"` to a webhook receiver that posts to the
  webhook Service's `/v1/alertmanager`, with `send_resolved` and the token from a file only
"""

from __future__ import annotations

from pathlib import Path
from urllib.parse import urlparse

import promql_parser
import yaml

from twin import alerts as twin_alerts
from worker.alerts import DEFAULT_ALERT_NAMES, AlertMapping, AmAlert, MappedAlert, map_alert

DEPLOY = Path(__file__).resolve().parents[2] / "deploy"


def _rules() -> list[dict]:
    doc = yaml.safe_load((DEPLOY / "prometheus-rules.yaml").read_text())
    return [rule for group in doc["groups"] for rule in group["rules"]]


def test_rules_match_webhook_alert_names() -> None:
    rules = _rules()
    for rule in rules:
        assert rule["alert"] and rule["expr"].strip(), rule
        assert rule["labels"]["sickbay"] in ("device", "node"), rule["alert"]
    device = {r["alert"] for r in rules if r["labels"]["sickbay"] == "device"}
    node = {r["alert"] for r in rules if r["labels"]["sickbay"] == "node"}
    assert device == set(DEFAULT_ALERT_NAMES)
    assert node and not node & set(DEFAULT_ALERT_NAMES)
    twin = {
        twin_alerts.ALERT_XID,
        twin_alerts.ALERT_FELL_OFF_BUS,
        twin_alerts.ALERT_NVLINK,
        twin_alerts.ALERT_ECC_DBE,
        twin_alerts.ALERT_ROW_REMAP,
    }
    assert twin <= device


def test_rule_expressions_parse() -> None:
    # The PromQL parser promtool uses, as a Rust port: a typo fails here, not in Prometheus.
    for rule in _rules():
        try:
            promql_parser.parse(rule["expr"])
        except ValueError as exc:
            raise AssertionError(f"{rule['alert']}: {exc}") from exc


def test_device_rules_annotations() -> None:
    mapping = AlertMapping()
    for rule in _rules():
        if rule["labels"]["sickbay"] != "device":
            continue
        assert "summary" in rule["annotations"], rule["alert"]
        assert "$labels.UUID" in rule["annotations"]["summary"]
    xid = next(r for r in _rules() if r["alert"] == "SickbayGpuXidError")
    assert xid["annotations"][mapping.value_annotation] == "{{ $value }}"
    # The code itself: err_code, else the windowed counter's `xid` label, else the gauge.
    assert "$labels.err_code" in xid["annotations"][mapping.xid_annotation]
    # No other device alert carries an annotation the webhook would read as an Xid code.
    for rule in _rules():
        if rule["alert"] != "SickbayGpuXidError":
            assert mapping.xid_annotation not in rule.get("annotations", {}), rule["alert"]


def test_rule_shaped_alert_maps_to_gpu() -> None:
    # What Alertmanager would send for the Xid rule on a dcgm-exporter series without err_code.
    alert = AmAlert.model_validate(
        {
            "status": "firing",
            "labels": {
                "alertname": "SickbayGpuXidError",
                "sickbay": "device",
                "severity": "critical",
                "Hostname": "gpu-node-1",
                "UUID": "GPU-1234",
                "gpu": "0",
                "modelName": "NVIDIA H100 80GB HBM3",
            },
            "annotations": {"summary": "...", "value": "79"},
            "startsAt": "2026-11-29T10:00:00Z",
            "fingerprint": "abc",
        }
    )
    got = map_alert(0, alert, AlertMapping())
    assert isinstance(got, MappedAlert) and got.evidence and got.evidence.xid == 79


def test_alertmanager_example_targets_the_webhook() -> None:
    doc = yaml.safe_load((DEPLOY / "alertmanager.yaml").read_text())
    route = next(r for r in doc["route"]["routes"] if r["receiver"] == "sickbay")
    assert 'sickbay="device"' in route["matchers"]
    receiver = next(r for r in doc["receivers"] if r["name"] == "sickbay")
    (hook,) = receiver["webhook_configs"]
    url = urlparse(hook["url"])
    assert url.path == "/v1/alertmanager"
    assert url.hostname == "sickbay-webhook.sickbay.svc" and url.port == 8080
    assert hook["send_resolved"] is True
    auth = hook["http_config"]["authorization"]
    assert auth["type"] == "Bearer" and auth["credentials_file"]
    assert "credentials" not in auth  # never an inline token
    # The Service the example posts to exists with that port (deploy/webhook.yaml).
    services = [
        d
        for d in yaml.safe_load_all((DEPLOY / "webhook.yaml").read_text())
        if d and d.get("kind") == "Service"
    ]
    assert any(
        s["metadata"]["name"] == "sickbay-webhook"
        and s["metadata"]["namespace"] == "sickbay"
        and any(p["port"] == 8080 for p in s["spec"]["ports"])
        for s in services
    )
