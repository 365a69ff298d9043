"""Alert -> device mapping (worker/alerts.py) and the webhook's label settings.

Cases:
- dcgm-exporter defaults: Hostname + UUID -> workflow id, gpu index, Xid from err_code, pod
  from namespace/pod labels, modelName kept, summary from annotations
- a gpu index label that is not a small ASCII number is ignored (`²` would break int())
- Xid from the `value` annotation when no err_code label; `7.9e+01` -> 79; junk -> None
- relabelled series: node/uuid label names configured through SICKBAY_ env (JSON or commas)
- `*` accepts any alert name; an unconfigured name is unmatched
- missing node, missing UUID, punctuation-only or over-long ids -> unmatched with a reason
- resolved: AlertResolved with endsAt (the zero time of a firing alert becomes None)
- no fingerprint from the sender -> a stable one from the labels
"""

from __future__ import annotations

import copy
from datetime import UTC, datetime

import pytest

from contract.names import device_workflow_id
from tests.webhook.helpers import XID79_ALERT
from worker.alerts import AlertMapping, AmAlert, MappedAlert, Unmapped, map_alert, parse_xid
from worker.settings import Settings, WebhookSettings


def am(**label_changes: str | None) -> AmAlert:
    raw = copy.deepcopy(XID79_ALERT)
    for key, value in label_changes.items():
        if value is None:
            raw["labels"].pop(key, None)
        else:
            raw["labels"][key] = value
    return AmAlert.model_validate(raw)


def test_dcgm_defaults() -> None:
    got = map_alert(0, am(), AlertMapping())
    assert isinstance(got, MappedAlert) and got.status == "firing"
    labels = XID79_ALERT["labels"]
    assert got.workflow_id == device_workflow_id(labels["Hostname"], labels["UUID"])
    assert got.device.node == "gpu-node-1" and got.device.gpu_index == 3
    ev = got.evidence
    assert ev is not None
    assert ev.xid == 79 and ev.source == "alertmanager" and ev.alertname == "SickbayGpuXidError"
    assert ev.pod is not None and (ev.pod.namespace, ev.pod.name) == ("ml", "trainer-0")
    assert ev.labels["modelName"] == "NVIDIA H100 80GB HBM3"
    assert ev.summary == "GPU 3 on gpu-node-1 reported Xid 79"
    assert ev.starts_at == datetime(2026, 11, 29, 10, 0, tzinfo=UTC)


def test_xid_from_value_annotation() -> None:
    alert = am(err_code=None)
    raw = alert.model_dump(by_alias=True)
    raw["annotations"]["value"] = "7.9e+01"
    got = map_alert(0, AmAlert.model_validate(raw), AlertMapping())
    assert isinstance(got, MappedAlert) and got.evidence and got.evidence.xid == 79
    raw["annotations"]["value"] = "NaN"
    got = map_alert(0, AmAlert.model_validate(raw), AlertMapping())
    assert isinstance(got, MappedAlert) and got.evidence and got.evidence.xid is None


@pytest.mark.parametrize(
    ("text", "expected"),
    [("79", 79), ("79.0", 79), (" 48 ", 48), ("", None), ("x", None), ("-1", None), ("7.5", None)],
)
def test_parse_xid(text: str, expected: int | None) -> None:
    assert parse_xid(text) == expected


def test_relabelled_names_from_env(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SICKBAY_ALERT_NODE_LABELS", '["node", "Hostname"]')
    monkeypatch.setenv("SICKBAY_ALERT_UUID_LABELS", "gpu_uuid, UUID")
    monkeypatch.setenv("SICKBAY_ALERT_NAMES", "MyXid")
    mapping = Settings().webhook.mapping()
    got = map_alert(0, am(alertname="MyXid", node="k8s-node-7", gpu_uuid="GPU-abc"), mapping)
    assert isinstance(got, MappedAlert)
    assert got.workflow_id == device_workflow_id("k8s-node-7", "GPU-abc")
    # The default name is no longer accepted with this configuration.
    assert isinstance(map_alert(0, am(), mapping), Unmapped)


@pytest.mark.parametrize("gpu", ["²", "-1", "abc", "1234567", ""])
def test_odd_gpu_index_is_ignored(gpu: str) -> None:
    got = map_alert(0, am(gpu=gpu), AlertMapping())
    assert isinstance(got, MappedAlert) and got.device.gpu_index is None


def test_wildcard_and_unconfigured_names() -> None:
    assert isinstance(map_alert(0, am(alertname="Anything"), AlertMapping()), Unmapped)
    wildcard = AlertMapping(alert_names=frozenset({"*"}))
    assert isinstance(map_alert(0, am(alertname="Anything"), wildcard), MappedAlert)


@pytest.mark.parametrize(
    ("changes", "reason"),
    [
        ({"Hostname": None}, "missing-node"),
        ({"Hostname": "  "}, "missing-node"),
        ({"UUID": None}, "missing-uuid"),
        ({"UUID": "---"}, "invalid-label"),
        ({"Hostname": "n" * 300}, "invalid-label"),
        ({"alertname": "NodeDown"}, "alertname-not-configured"),
    ],
)
def test_unmapped_reasons(changes: dict[str, str | None], reason: str) -> None:
    got = map_alert(4, am(**changes), AlertMapping())
    assert isinstance(got, Unmapped)
    assert got.reason == reason and got.index == 4 and got.detail


def test_resolved_alert() -> None:
    raw = copy.deepcopy(XID79_ALERT)
    raw["status"] = "resolved"
    raw["endsAt"] = "2026-11-29T10:07:00Z"
    got = map_alert(0, AmAlert.model_validate(raw), AlertMapping())
    assert isinstance(got, MappedAlert) and got.status == "resolved" and got.evidence is None
    assert got.resolved is not None and got.resolved.fingerprint == raw["fingerprint"]
    assert got.resolved.ends_at == datetime(2026, 11, 29, 10, 7, tzinfo=UTC)
    raw["endsAt"] = "0001-01-01T00:00:00Z"
    got = map_alert(0, AmAlert.model_validate(raw), AlertMapping())
    assert isinstance(got, MappedAlert) and got.resolved and got.resolved.ends_at is None


def test_fingerprint_fallback_is_stable() -> None:
    raw = copy.deepcopy(XID79_ALERT)
    del raw["fingerprint"]
    a = map_alert(0, AmAlert.model_validate(raw), AlertMapping())
    raw["labels"] = dict(reversed(list(raw["labels"].items())))
    b = map_alert(0, AmAlert.model_validate(raw), AlertMapping())
    assert isinstance(a, MappedAlert) and isinstance(b, MappedAlert)
    assert a.evidence and b.evidence
    assert a.evidence.fingerprint == b.evidence.fingerprint
    assert a.evidence.fingerprint.startswith("sha256:")


# -- alert kinds, exported_* pod labels, node label spellings (issue: real alert streams) ------


def named(alertname: str, value: str, **labels: str | None) -> AmAlert:
    """One of the shipped rules' alerts without an Xid label, `value` = the series' value."""
    alert = am(alertname=alertname, err_code=None, err_msg=None, **labels)
    raw = alert.model_dump(by_alias=True)
    raw["annotations"]["value"] = value
    return AmAlert.model_validate(raw)


@pytest.mark.parametrize(
    ("alertname", "value", "failure_class"),
    [
        # Counts that happen to be Xid codes must not be read as Xids.
        ("SickbayGpuNvlinkErrors", "13", "degraded"),
        ("SickbayGpuNvlinkErrors", "79", "degraded"),
        ("SickbayGpuEccDoubleBitError", "2.0028987341772155", "unhealthy"),
        ("SickbayGpuEccDoubleBitError", "13", "unhealthy"),
        ("SickbayGpuRowRemapFailure", "1", "unhealthy"),
        ("SickbayGpuFellOffBus", "45", "unhealthy"),
    ],
)
def test_class_comes_from_the_alert_not_its_value(
    alertname: str, value: str, failure_class: str
) -> None:
    from workflows.classify import classify

    got = map_alert(0, named(alertname, value), AlertMapping())
    assert isinstance(got, MappedAlert) and got.evidence is not None
    assert got.evidence.xid is None  # a count is not an Xid
    assert got.evidence.failure_class == failure_class
    assert classify([got.evidence], None)[0] == failure_class


def test_every_shipped_rule_maps_to_a_class() -> None:
    """Each device-level alert of deploy/prometheus-rules.yaml has a class or is the Xid rule."""
    from pathlib import Path

    import yaml

    from worker.alerts import DEFAULT_ALERT_CLASSES

    rules = yaml.safe_load(
        (Path(__file__).resolve().parents[2] / "deploy" / "prometheus-rules.yaml").read_text()
    )
    device_rules = {
        r["alert"]
        for g in rules["groups"]
        for r in g["rules"]
        if r.get("labels", {}).get("sickbay") == "device"
    }
    assert device_rules and device_rules == set(DEFAULT_ALERT_CLASSES)
    assert DEFAULT_ALERT_CLASSES["SickbayGpuXidError"] == "xid"


def test_xid_rule_reads_its_code_and_user_alerts_map_through_settings(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from workflows.classify import classify

    got = map_alert(0, named("SickbayGpuXidError", "13"), AlertMapping())
    assert isinstance(got, MappedAlert) and got.evidence is not None
    assert got.evidence.xid == 13 and got.evidence.failure_class is None
    assert classify([got.evidence], None)[0] == "application"

    monkeypatch.setenv("SICKBAY_ALERT_CLASSES", '{"MyGpuMemoryDead": "unhealthy"}')
    mapping = Settings().webhook.mapping()
    mine = map_alert(0, named("MyGpuMemoryDead", "79"), mapping)
    assert isinstance(mine, MappedAlert) and mine.evidence is not None
    assert (mine.evidence.failure_class, mine.evidence.xid) == ("unhealthy", None)
    # The shipped names still map.
    assert isinstance(map_alert(0, named("SickbayGpuNvlinkErrors", "1"), mapping), MappedAlert)
    monkeypatch.setenv("SICKBAY_ALERT_CLASSES", '{"Mine": "broken"}')
    with pytest.raises(ValueError, match="broken"):
        Settings()
    # An accepted name without a class and without an Xid label: unknown, whatever its value.
    anything = AlertMapping(alert_names=frozenset({"*"}))
    other = map_alert(0, named("SomeCounter", "79"), anything)
    assert isinstance(other, MappedAlert) and other.evidence is not None
    assert other.evidence.xid is None and classify([other.evidence], None)[0] == "unknown"


def test_exported_pod_labels_win_over_the_scrape_target() -> None:
    """Prometheus Operator, honorLabels false: pod/namespace are the exporter's own."""
    got = map_alert(
        0,
        am(
            pod="nvidia-dcgm-exporter-x1",
            namespace="gpu-operator",
            container="nvidia-dcgm-exporter",
            exported_pod="trainer-7",
            exported_namespace="ml",
            exported_container="main",
        ),
        AlertMapping(),
    )
    assert isinstance(got, MappedAlert) and got.evidence is not None
    assert got.evidence.pod is not None
    assert (got.evidence.pod.namespace, got.evidence.pod.name) == ("ml", "trainer-7")


@pytest.mark.parametrize("label", ["Hostname", "hostname"])
def test_node_label_either_spelling(label: str) -> None:
    alert = am(**{"Hostname": None, label: "gpu-node-9"})
    got = map_alert(0, alert, AlertMapping())
    assert isinstance(got, MappedAlert) and got.device.node == "gpu-node-9"
    assert WebhookSettings(webhook_auth_disabled=True).mapping().node_labels[:2] == (
        "Hostname",
        "hostname",
    )


def test_figures_in_summaries_are_formatted() -> None:
    """A rule without printf puts the raw float into its summary; Sickbay's text does not."""
    alert = named("SickbayGpuEccDoubleBitError", "2.0028987341772155")
    raw = alert.model_dump(by_alias=True)
    raw["annotations"]["summary"] = (
        "GPU 3 on gpu-node-1: 2.0028987341772155 uncorrectable ECC errors in 10m, "
        "8.888888888888888 NVLink errors, link 1.5, Xid 79, UUID GPU-1.23456"
    )
    got = map_alert(0, AmAlert.model_validate(raw), AlertMapping())
    assert isinstance(got, MappedAlert) and got.evidence is not None
    assert got.evidence.summary == (
        "GPU 3 on gpu-node-1: 2 uncorrectable ECC errors in 10m, 8.89 NVLink errors, "
        "link 1.5, Xid 79, UUID GPU-1.23456"
    )


@pytest.mark.parametrize(
    ("alertname", "rule_xid"),
    [
        ("SickbayGpuEccDoubleBitError", 48),
        ("SickbayGpuRowRemapFailure", 64),
        ("SickbayGpuFellOffBus", 79),
        ("SickbayGpuNvlinkErrors", None),
    ],
)
def test_a_class_rule_names_the_xid_it_stands_for(alertname: str, rule_xid: int | None) -> None:
    """For the repair ladder only (an ECC double-bit error resets like Xid 48); the Xid field
    stays empty and the class still comes from the rule."""
    got = map_alert(0, named(alertname, "13"), AlertMapping())
    assert isinstance(got, MappedAlert) and got.evidence is not None
    assert got.evidence.xid is None and got.evidence.rule_xid == rule_xid
