"""Alertmanager webhook payload (version 4) and the mapping of one alert to a GPU.

Alertmanager posts a *group* of alerts; each alert is either firing or resolved and carries
the labels of the Prometheus series that fired. dcgm-exporter labels its series with
`Hostname` (`hostname` on dcgm-exporter's main branch), `gpu` (index), `UUID`, `modelName`,
`err_code` (Xid, newer versions) and, with pod mapping, `pod` / `namespace` / `container`
(`exported_*` behind a Prometheus Operator scrape). What an alert *is* (its name) gives its
failure class; only the Xid rule's alerts are classified by their code. Which label names to read, and which alert names
are Sickbay's, is configuration (`AlertMapping`), because relabelling in Prometheus often
renames them (`Hostname` -> `node`, ...).

`map_alert()` never raises for a well-formed alert: it returns either a `MappedAlert` (device
+ evidence, or the resolution) or an `Unmapped` with a machine-readable reason, so the webhook
can report and count every alert it did not act on.
"""

from __future__ import annotations

import hashlib
import math
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, StringConstraints

from contract.kube import DeviceRef, PodRef
from contract.names import device_workflow_id
from contract.remediation import AlertEvidence, AlertResolved
from contract.runbook import FailureClass

# Alertmanager and Prometheus put no hard limit on label values; a workflow id must stay well
# under Temporal's 1,000-character limit, and evidence is stored in history, so keep both small.
MAX_LABEL_VALUE = 1024
MAX_ID_PART = 253  # a Kubernetes node name is a DNS subdomain (<= 253)
MAX_EVIDENCE_LABELS = 64

LabelValue = Annotated[str, StringConstraints(max_length=16 * MAX_LABEL_VALUE)]


# --------------------------------------------------------------------------------------------
# Payload (https://prometheus.io/docs/alerting/latest/configuration/#webhook_config)
# --------------------------------------------------------------------------------------------


class _AmModel(BaseModel):
    # Unknown fields are ignored: Alertmanager adds fields over time and a newer sender must
    # not be refused. Known fields are validated strictly enough to name every problem.
    model_config = ConfigDict(extra="ignore", populate_by_name=True, frozen=True)


class AmAlert(_AmModel):
    status: Literal["firing", "resolved"]
    labels: dict[str, LabelValue]
    annotations: dict[str, LabelValue] = Field(default_factory=dict)
    starts_at: datetime = Field(alias="startsAt")
    # Alertmanager sends 0001-01-01T00:00:00Z for firing alerts.
    ends_at: datetime | None = Field(default=None, alias="endsAt")
    generator_url: str = Field(default="", alias="generatorURL")
    fingerprint: str = Field(default="", max_length=256)


class AmPayload(_AmModel):
    version: Literal["4"]
    group_key: str = Field(default="", alias="groupKey")
    truncated_alerts: int = Field(default=0, ge=0, alias="truncatedAlerts")
    status: Literal["firing", "resolved"]
    receiver: str = ""
    group_labels: dict[str, str] = Field(default_factory=dict, alias="groupLabels")
    common_labels: dict[str, str] = Field(default_factory=dict, alias="commonLabels")
    common_annotations: dict[str, str] = Field(default_factory=dict, alias="commonAnnotations")
    external_url: str = Field(default="", alias="externalURL")
    alerts: list[AmAlert]


# --------------------------------------------------------------------------------------------
# Mapping configuration
# --------------------------------------------------------------------------------------------

# What an alert is decides its class (never a counter's value): each device-level rule of
# deploy/prometheus-rules.yaml maps to a failure class, or to `xid` (classified by its Xid code).
AlertKind = Literal["xid", "unhealthy", "degraded", "application", "unknown"]
DEFAULT_ALERT_CLASSES: dict[str, AlertKind] = {
    "SickbayGpuXidError": "xid",
    "SickbayGpuEccDoubleBitError": "unhealthy",  # uncorrectable ECC (Xid 48 class)
    "SickbayGpuRowRemapFailure": "unhealthy",  # out of spare rows (Xid 64 class)
    "SickbayGpuNvlinkErrors": "degraded",  # NVLink recovery errors (Xid 74 class)
    "SickbayGpuFellOffBus": "unhealthy",  # no longer reported (Xid 79 class)
}
# The Xid each class rule stands for: the repair ladder picks its rungs by it (an ECC
# double-bit error resets like Xid 48); the class still comes from the rule alone.
DEFAULT_RULE_XIDS: dict[str, int] = {
    "SickbayGpuEccDoubleBitError": 48,
    "SickbayGpuRowRemapFailure": 64,
    "SickbayGpuFellOffBus": 79,
}
# The alert names of deploy/prometheus-rules.yaml. Anything else is reported as unmatched.
DEFAULT_ALERT_NAMES: tuple[str, ...] = tuple(DEFAULT_ALERT_CLASSES)
# dcgm-exporter >= 4.0 labels `Hostname` (from NODE_NAME); its main branch renames it
# `hostname`. Either one names the node (or, without NODE_NAME, the exporter's pod).
DEFAULT_NODE_LABELS: tuple[str, ...] = ("Hostname", "hostname")


@dataclass(frozen=True, slots=True)
class AlertMapping:
    """Which alerts are Sickbay's and where the device is in their labels.

    Each `*_labels` tuple is tried in order; the first non-empty label wins. `alert_names`
    containing `*` accepts every alert that names a device.
    """

    alert_names: frozenset[str] = frozenset(DEFAULT_ALERT_NAMES)
    # alert name -> its class (or `xid`); accepted or not is `alert_names`' say.
    alert_classes: Mapping[str, AlertKind] = field(
        default_factory=lambda: dict(DEFAULT_ALERT_CLASSES)
    )
    node_labels: tuple[str, ...] = DEFAULT_NODE_LABELS
    uuid_labels: tuple[str, ...] = ("UUID",)
    index_labels: tuple[str, ...] = ("gpu",)
    model_labels: tuple[str, ...] = ("modelName",)
    xid_labels: tuple[str, ...] = ("err_code", "Xid", "xid")
    # Prometheus puts no sample value into an alert; the Xid rule copies the code into the
    # `xid` annotation (and `{{ $value }}`, the gauge's last Xid, into this one). Both are read
    # for alerts of the `xid` kind only: any other alert's value is a count, not a code.
    value_annotation: str = "value"
    xid_annotation: str = "xid"
    # Pod mapping: with a Prometheus Operator scrape (honorLabels: false) `pod`/`namespace`
    # are the exporter's own and dcgm-exporter's mapping moves to `exported_*`, read first.
    # Either way the pod is a hint: the consumer step checks it against the API.
    pod_labels: tuple[tuple[str, str], ...] = (
        ("exported_namespace", "exported_pod"),
        ("namespace", "pod"),
    )
    # Labels + annotations (names and values, UTF-8 bytes) past this: refused as `too-large`.
    max_alert_bytes: int = 16 * 1024
    cluster: str = ""  # SICKBAY_CLUSTER: part of the workflow id

    def accepts(self, alertname: str) -> bool:
        return "*" in self.alert_names or alertname in self.alert_names

    def kind(self, alertname: str) -> AlertKind | None:
        """The alert's kind; None for an accepted name with no class (only an Xid label
        classifies it)."""
        return self.alert_classes.get(alertname)


# --------------------------------------------------------------------------------------------
# Mapping
# --------------------------------------------------------------------------------------------

UnmappedReason = Literal[
    "alertname-not-configured",
    "missing-node",
    "missing-uuid",
    "invalid-label",
    "too-large",
]


@dataclass(frozen=True, slots=True)
class Unmapped:
    index: int
    alertname: str
    fingerprint: str
    status: str
    reason: UnmappedReason
    detail: str


@dataclass(frozen=True, slots=True)
class MappedAlert:
    index: int
    status: Literal["firing", "resolved"]
    device: DeviceRef
    workflow_id: str
    evidence: AlertEvidence | None = None  # firing
    resolved: AlertResolved | None = None  # resolved
    # Alertmanager's startsAt: constant over one firing episode, so repeats of the same alert
    # share it and a re-fire after resolution does not (the webhook's delivery key).
    starts_at: datetime | None = None

    @property
    def fingerprint(self) -> str:
        if self.evidence is not None:
            return self.evidence.fingerprint
        return self.resolved.fingerprint if self.resolved is not None else ""

    def delivery_key(self) -> tuple[str, str, str, str]:
        """What makes two alerts the same delivery: (workflow id, status, fingerprint,
        startsAt). Identical keys are one Alertmanager alert seen again (repeat notification,
        retry, overlapping groups); the workflow would ignore the second one anyway."""
        start = ""
        if self.starts_at is not None:  # one instant, one key, whatever offset it was sent in
            at = self.starts_at
            start = (at.astimezone(UTC) if at.tzinfo is not None else at).isoformat()
        return (self.workflow_id, self.status, self.fingerprint, start)


def _first(labels: dict[str, str], names: tuple[str, ...]) -> str:
    for name in names:
        value = labels.get(name, "").strip()
        if value:
            return value
    return ""


def parse_xid(text: str) -> int | None:
    """`79`, `79.0`, `7.9e+01` -> 79; anything else (empty, NaN, fractional, < 0) -> None."""
    text = text.strip()
    if not text:
        return None
    try:
        value = float(text)
    except ValueError:
        return None
    if not math.isfinite(value) or value < 0 or value != int(value) or value > 2**31:
        return None
    return int(value)


# A float as Prometheus prints `{{ $value }}` (2.0028987341772155), standing alone: not part
# of a word, a version or an id (GPU-1.23456).
_LONG_FIGURE = re.compile(r"(?<![\w.-])(\d+\.\d{3,})(?![\w.])")


def tidy_figures(text: str) -> str:
    """Long floats in a summary -> at most two decimals (`2.0028987341772155` -> `2`)."""

    def short(m: re.Match[str]) -> str:
        return f"{float(m.group(1)):.2f}".rstrip("0").rstrip(".")

    return _LONG_FIGURE.sub(short, text)


def alert_fingerprint(alert: AmAlert) -> str:
    """Alertmanager's fingerprint, or a stable hash of the labels when a sender omits it, so
    the workflow can still de-duplicate repeated notifications."""
    if alert.fingerprint:
        return alert.fingerprint
    canon = "\x00".join(f"{k}\x01{v}" for k, v in sorted(alert.labels.items()))
    return "sha256:" + hashlib.sha256(canon.encode()).hexdigest()[:16]


def map_alert(
    index: int,
    alert: AmAlert,
    mapping: AlertMapping,
    *,
    received_at: datetime | None = None,
) -> MappedAlert | Unmapped:
    """One alert -> the device workflow it concerns, or the reason it concerns none."""
    labels = alert.labels
    alertname = labels.get("alertname", "")
    fingerprint = alert_fingerprint(alert)

    def unmapped(reason: UnmappedReason, detail: str) -> Unmapped:
        return Unmapped(index, alertname, fingerprint, alert.status, reason, detail)

    if not mapping.accepts(alertname):
        return unmapped(
            "alertname-not-configured",
            f"alertname {alertname!r} is not one of the configured alert names",
        )
    node = _first(labels, mapping.node_labels)
    if not node:
        return unmapped("missing-node", f"no node label (looked for {list(mapping.node_labels)})")
    uuid = _first(labels, mapping.uuid_labels)
    if not uuid:
        return unmapped(
            "missing-uuid",
            f"no GPU UUID label (looked for {list(mapping.uuid_labels)}); the workflow id is "
            "derived from node + UUID",
        )
    if len(node) > MAX_ID_PART or len(uuid) > MAX_ID_PART:
        return unmapped("invalid-label", f"node or UUID label longer than {MAX_ID_PART} chars")
    if not _has_id_chars(node, uuid):
        return unmapped("invalid-label", "node or UUID label has no ASCII letters or digits")
    size = alert_bytes(alert)
    if size > mapping.max_alert_bytes:
        return unmapped(
            "too-large",
            f"labels and annotations are {size} bytes, over SICKBAY_WEBHOOK_MAX_ALERT_BYTES "
            f"({mapping.max_alert_bytes}); not acted on",
        )
    workflow_id = device_workflow_id(node, uuid, mapping.cluster)

    index_text = _first(labels, mapping.index_labels)
    # isascii(): str.isdigit() is also true for "²", which int() refuses.
    ok = index_text.isascii() and index_text.isdigit() and len(index_text) < 6
    gpu_index = int(index_text) if ok else None
    device = DeviceRef(node=node, gpu_uuid=uuid, gpu_index=gpu_index)

    if alert.status == "resolved":
        ends_at = alert.ends_at if alert.ends_at and alert.ends_at.year > 1 else None
        resolved = AlertResolved(fingerprint=fingerprint, alertname=alertname, ends_at=ends_at)
        return MappedAlert(
            index, "resolved", device, workflow_id, resolved=resolved, starts_at=alert.starts_at
        )

    kind = mapping.kind(alertname)
    failure_class: FailureClass | None = None
    xid: int | None = None
    if kind == "xid" or kind is None:
        xid = parse_xid(_first(labels, mapping.xid_labels))
    if kind == "xid":
        for annotation in (mapping.xid_annotation, mapping.value_annotation):
            if xid is None and annotation:
                xid = parse_xid(alert.annotations.get(annotation, ""))
    elif kind is not None:
        failure_class = kind
    pod = None
    for ns_label, pod_label in mapping.pod_labels:
        pod_name = labels.get(pod_label, "").strip()
        namespace = labels.get(ns_label, "").strip()
        if pod_name and namespace:
            pod = PodRef(namespace=namespace, name=pod_name)
            break
    summary = tidy_figures(
        alert.annotations.get("summary") or alert.annotations.get("description") or ""
    )
    kept = dict(sorted(labels.items())[:MAX_EVIDENCE_LABELS])
    model = _first(labels, mapping.model_labels)
    if model:
        kept.setdefault("modelName", model)
    evidence = AlertEvidence(
        source="alertmanager",
        alertname=alertname,
        fingerprint=fingerprint,
        xid=xid,
        starts_at=alert.starts_at,
        received_at=received_at or datetime.now(UTC),
        summary=summary[:MAX_LABEL_VALUE],
        labels={k: v[:MAX_LABEL_VALUE] for k, v in kept.items()},
        pod=pod,
        failure_class=failure_class,
        rule_xid=DEFAULT_RULE_XIDS.get(alertname) if failure_class is not None else None,
    )
    return MappedAlert(
        index, "firing", device, workflow_id, evidence=evidence, starts_at=alert.starts_at
    )


def alert_bytes(alert: AmAlert) -> int:
    """Bytes of an alert's labels and annotations: names and values, UTF-8."""
    return sum(
        len(k.encode()) + len(v.encode())
        for part in (alert.labels, alert.annotations)
        for k, v in part.items()
    )


def _has_id_chars(node: str, uuid: str) -> bool:
    return any(c.isalnum() and c.isascii() for c in node) and any(
        c.isalnum() and c.isascii() for c in uuid
    )
