"""Confirm and classify: Xid codes and health evidence -> failure class; evidence merging.

Pure functions (no I/O, no clocks: `now` is passed in), used inside the remediation workflow
and by `sickbay runbooks explain`.

Classes, from NVIDIA's Xid catalogue and the design notes:
- `unhealthy`: the GPU itself failed - 79 fell off the bus, 48/95 uncorrectable (DBE) ECC,
  64 row-remapping failure, 119/120 GSP RPC timeout / error, 61/62 internal micro-controller
  halt;
- `degraded`: still works, slower or at risk - 74 NVLink error, 92 high single-bit ECC rate,
  63 row remapping pending;
- `application`: usually the program's fault - 13 graphics engine exception, 31 MMU fault,
  43 GPU stopped processing (reset channel), 45 preemptive cleanup;
- `unknown`: any other code, or no code at all; follows the runbook's `on.unknown`.

An alert whose kind has a class (`AlertEvidence.failure_class`, set by the webhook from the
alert's name: the double-bit ECC rule is `unhealthy`, NVLink errors `degraded`, ...) counts as
that class; only alerts of the Xid kind are classified by their code. A counter's value is
never read as an Xid.

Pod `allocatedResourcesStatus` saying Unhealthy makes the class at least `unhealthy`: the
kubelet/driver's view overrides an application-looking Xid.
"""

from __future__ import annotations

from datetime import datetime, timedelta

from contract.kube import Evidence
from contract.remediation import AlertEvidence
from contract.runbook import FailureClass

UNHEALTHY_XIDS = frozenset({48, 61, 62, 64, 79, 95, 119, 120})
DEGRADED_XIDS = frozenset({63, 74, 92})
APPLICATION_XIDS = frozenset({13, 31, 43, 45})

# Worst first: with several alerts the worst class wins.
_SEVERITY: dict[FailureClass, int] = {
    "unhealthy": 3,
    "degraded": 2,
    "unknown": 1,
    "application": 0,
}


def classify_xid(xid: int | None) -> FailureClass:
    if xid is None:
        return "unknown"
    if xid in UNHEALTHY_XIDS:
        return "unhealthy"
    if xid in DEGRADED_XIDS:
        return "degraded"
    if xid in APPLICATION_XIDS:
        return "application"
    return "unknown"


def worst(classes: list[FailureClass]) -> FailureClass:
    return max(classes, key=_SEVERITY.__getitem__) if classes else "unknown"


def alert_class(alert: AlertEvidence) -> FailureClass | None:
    """What one alert says: the class of its kind (the rule it comes from), else its Xid's;
    None when it says neither."""
    if alert.failure_class is not None:
        return alert.failure_class
    return classify_xid(alert.xid) if alert.xid is not None else None


def _what(alert: AlertEvidence) -> str:
    if alert.failure_class is None:
        return f"Xid {alert.xid}"
    return alert.alertname or alert.source


def classify(alerts: list[AlertEvidence], evidence: Evidence | None) -> tuple[FailureClass, str]:
    """The failure class of a device and a one-line reason for the timeline."""
    known = [(a, c) for a in alerts if (c := alert_class(a)) is not None]
    by_alerts = worst([c for _a, c in known]) if known else None
    health = evidence.health if evidence else None
    what = ", ".join(sorted({_what(a) for a, _c in known}))
    if health == "Unhealthy" and by_alerts != "unhealthy":
        extra = f" ({what} alone: {by_alerts})" if by_alerts else ""
        return "unhealthy", f"pod status reports the device Unhealthy{extra}"
    if evidence is not None and not evidence.device_present and by_alerts != "unhealthy":
        return "unhealthy", "the device is no longer published by the node / ResourceSlice"
    if by_alerts is None:
        return "unknown", "no Xid code and no alert of a known kind in the evidence"
    return by_alerts, f"{what} -> {by_alerts}"


def evidence_key(alert: AlertEvidence) -> str:
    """De-duplication key: Alertmanager's fingerprint, else what identifies the finding.

    Manual launches without a fingerprint are keyed by who/why, so a person pressing twice
    adds one entry, not two."""
    if alert.fingerprint:
        return f"fp:{alert.fingerprint}"
    start = alert.starts_at.isoformat() if alert.starts_at else ""
    return f"{alert.source}:{alert.alertname}:{alert.xid}:{start}:{alert.summary}"


def merge_evidence(
    known: list[AlertEvidence], new: list[AlertEvidence]
) -> tuple[list[AlertEvidence], list[AlertEvidence]]:
    """Append the new alerts whose key is unseen. Returns (merged, actually added)."""
    seen = {evidence_key(a) for a in known}
    merged = list(known)
    added: list[AlertEvidence] = []
    for alert in new:
        key = evidence_key(alert)
        if key in seen:
            continue
        seen.add(key)
        merged.append(alert)
        added.append(alert)
    return merged, added


def is_stale(
    alerts: list[AlertEvidence],
    evidence: Evidence | None,
    now: datetime,
    stale_after: timedelta,
) -> tuple[bool, str]:
    """Stale: every piece of evidence is an Alertmanager alert that started longer ago than
    `stale_after`, and the device reports Healthy now.

    Replaying old alerts after an outage or a pause must not quarantine a GPU that recovered
    (or was replaced). A sweep finding or a person's launch is never stale.
    """
    if not alerts or evidence is None or evidence.health != "Healthy":
        return False, ""
    oldest_allowed = now - stale_after
    for alert in alerts:
        if alert.source != "alertmanager":
            return False, ""
        started = alert.starts_at or alert.received_at
        if started is None or started >= oldest_allowed:
            return False, ""
    newest = max(t for a in alerts if (t := a.starts_at or a.received_at) is not None)
    return True, (
        f"every alert started more than {stale_after} ago (newest {newest.isoformat()}) "
        "and the device reports Healthy now"
    )


# Where an alert comes from that can count as device evidence: Alertmanager's rules, the
# health sweep's and watcher's findings (pod health, driver taints). A person's launch (CLI,
# Web UI) or a maintenance drain is a request, never evidence by itself.
_EVIDENCE_SOURCES = frozenset({"alertmanager", "sweep", "watch"})


def device_evidence(
    trigger: str, alerts: list[AlertEvidence], evidence: Evidence | None
) -> tuple[bool, str]:
    """Whether this remediation counts as a GPU failure in the ledger, and why (or why not).

    Only confirmed device evidence counts: the device was resolved through the API (the caller
    asks after `resolve-device`), and an alert or finding classified unhealthy/degraded names
    it, or its pod device health says Unhealthy, or the driver tainted it. A maintenance drain
    never counts (planned work on healthy GPUs); neither does a hand launch that carries no
    such evidence. A failed validation counts later (the repair ladder records it)."""
    if trigger == "maintenance":
        return False, "a maintenance drain is planned work, not a GPU failure"
    if evidence is not None and evidence.health == "Unhealthy":
        return True, "pod status reports the device Unhealthy"
    sick = [t for t in (evidence.slice_taints if evidence else []) if t.driver_health]
    if sick:
        return True, "the driver tainted the device (" + ", ".join(t.key for t in sick) + ")"
    bad = [
        a
        for a in alerts
        if a.source in _EVIDENCE_SOURCES and alert_class(a) in ("unhealthy", "degraded")
    ]
    if bad:
        what = ", ".join(sorted({_what(a) for a in bad}))
        return True, f"{what} -> {worst([c for a in bad if (c := alert_class(a))])}"
    return False, (
        "no device evidence: no unhealthy/degraded alert, no Unhealthy pod status and no driver "
        "taint names the device (a launch alone is not a failure)"
    )
