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

from tests.webhook.helpers import XID79_ALERT
from worker.alerts import AlertMapping, AmAlert, MappedAlert, Unmapped, map_alert, parse_xid
from worker.webhook import WebhookSettings
from workflows.constants import device_workflow_id


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
    mapping = WebhookSettings(webhook_auth_disabled=True).mapping()
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
