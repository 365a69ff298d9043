"""Evidence and health of a physical GPU: pod allocatedResourcesStatus (KEP-4680), the
ResourceSlice entry and its driver taints, node capacity vs allocatable for `nvidia.com/gpu`
(device plugin), recent Events.

Requests: DRA 1 slice list (shared with resolve) + 1 pod list (reused by find-consumers)
+ 1 claim list only when a pod reports health under a CDI device id (activities/kube/health.py;
shared with find-consumers, scheduled with it)
+ 0-3 event lists; device plugin 1 node read + 1 pod list + 0-3 event lists. HAMi: the GPU's
entry in `hami.io/node-nvidia-register` (same node read): registered `health` false is an
entry `hami.io/node-nvidia-register=health=false` among the taints, like a driver taint; not
registered any more is a vanished device (`device_present` false). Events are
context only (no decision reads them): they are listed only when neither a pod status nor a
driver health taint on the slice says the device is Unhealthy, i.e. when a person reading the
evidence needs more than that.
check_health skips the events.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from activities.kube import hami
from activities.kube.client import Kube
from activities.kube.consumers import list_claims, list_node_pods, loaded_since
from activities.kube.devices import (
    get_node,
    gpu_capacity,
    list_slice_devices,
    node_gpu_uuids,
)
from activities.kube.health import ClaimIndex, ClaimLookup
from activities.kube.pods import health_reports, meta, worst_health
from contract.kube import Evidence, HealthReport, HealthResult, ResolvedDevice, SliceTaint

MAX_EVENTS = 10
EVIDENCE_SLICE_MAX_AGE = 2.0  # seconds
MAX_POD_EVENT_READS = 2  # event lists for the unhealthy pods (keeps the request count low)


def resource_ids(device: ResolvedDevice) -> set[str]:
    if device.mode == "dra" and device.devices:
        return {d.resource_id for d in device.devices}
    return {device.gpu_uuid}


def _reports(
    pods: list[dict[str, Any]],
    device: ResolvedDevice,
    ids: set[str],
    claims: ClaimLookup | None,
) -> list[HealthReport]:
    """The pods' health entries for this device; HAMi's plugin names each share
    `<UUID>-<i>`, so there every share of the GPU counts."""
    if device.hami:
        return [
            r
            for p in pods
            for r in health_reports(p, None)
            if hami.is_share_of(r.resource_id, device.gpu_uuid)
        ]
    return [r for p in pods for r in health_reports(p, ids, claims)]


def claim_lookup(kube: Kube, device: ResolvedDevice, *, max_age: float = 0.0) -> ClaimLookup | None:
    """DRA: ResourceClaims for health entries whose id is a CDI device id (one list, read
    only when such an entry turns up; `max_age` from `loaded_since`: a list loaded since the
    step was scheduled may serve)."""
    if device.mode == "dra" and device.devices:
        return ClaimIndex(lambda: list_claims(kube, max_age=max_age))
    return None


def _slice_state(kube: Kube, device: ResolvedDevice) -> tuple[bool, list[SliceTaint]]:
    # Driver health taints matter here: reuse the inventory only if it was read moments ago
    # (by resolve, in the same remediation), never the 10 s inventory window.
    published = list_slice_devices(kube, device.node, max_age=EVIDENCE_SLICE_MAX_AGE)
    wanted = {(d.driver, d.pool, d.device) for d in device.devices}
    present = [d for d in published if (d.driver, d.pool, d.device) in wanted]
    taints: list[SliceTaint] = []
    for d in present:
        for t in d.taints:
            effect = t.get("effect", "NoSchedule")
            if effect not in ("None", "NoSchedule", "NoExecute"):
                continue
            taints.append(
                SliceTaint(
                    key=t.get("key", ""),
                    value=str(t.get("value") or ""),
                    effect=effect,
                    device=d.resource_id,
                )
            )
    return bool(present), taints


# HAMi's registration entry of a GPU registered unhealthy, told like a driver's health taint
# (the sweep and the health watcher report it with the same key and value).
HAMI_HEALTH_KEYS = (hami.ANN_REGISTER, hami.VOLCANO_REGISTER)
HAMI_UNHEALTHY = "health=false"


def _hami_state(node: dict[str, Any], device: ResolvedDevice) -> tuple[bool, list[SliceTaint]]:
    """(registered, [unhealthy entry]) from HAMi's registration of the GPU on its node; an
    unreadable registration stops the step (never a guess)."""
    try:
        gpu = hami.registered(node, device.gpu_uuid)
    except hami.HamiFormatError as err:
        raise err.application_error() from err
    if gpu is None:
        return False, []
    if gpu.healthy:
        return True, []
    taint = SliceTaint(
        key=hami.register_key(node), value=HAMI_UNHEALTHY, effect="NoSchedule", device=gpu.uuid
    )
    return True, [taint]


def _event_time(ev: dict[str, Any]) -> str:
    return str(
        ev.get("lastTimestamp")
        or ev.get("eventTime")
        or ev.get("firstTimestamp")
        or meta(ev).get("creationTimestamp")
        or ""
    )


def _events_about(kube: Kube, name: str, namespace: str | None) -> list[dict[str, Any]]:
    selector = f"involvedObject.name={name}"
    if namespace:
        body = kube.call(
            kube.core.list_namespaced_event,
            namespace,
            verb="list",
            resource="events",
            field_selector=selector,
        )
    else:
        body = kube.call(
            kube.core.list_event_for_all_namespaces,
            verb="list",
            resource="events",
            field_selector=selector,
        )
    return body.get("items") or []


def _format_event(ev: dict[str, Any]) -> str:
    obj = ev.get("involvedObject") or {}
    count = ev.get("count") or 1
    times = f" (x{count})" if count and int(count) > 1 else ""
    return (
        f"{_event_time(ev)} {ev.get('type', 'Normal')} {ev.get('reason', '')} "
        f"{obj.get('kind', '')}/{obj.get('name', '')}: {ev.get('message', '')}{times}"
    ).strip()


def gather_evidence(
    kube: Kube, device: ResolvedDevice, *, fresh_since: float | None = None
) -> Evidence:
    """`fresh_since` (epoch seconds, when the step was scheduled): a pod list of the node, and
    a claim list, this worker loaded since then are used instead of listing again. None, or a
    time more than NODE_PODS_MAX_AGE ago or in the future (no usable schedule time): fresh
    reads (joining one under way)."""
    ids = resource_ids(device)
    max_age = loaded_since(fresh_since)
    pods = list_node_pods(kube, device.node, max_age=max_age)
    claims = claim_lookup(kube, device, max_age=max_age)
    reports = _reports(pods, device, ids, claims)
    present = True
    taints: list[SliceTaint] = []
    capacity = allocatable = None
    if device.mode == "dra" and device.devices:
        present, taints = _slice_state(kube, device)
    else:
        node = get_node(kube, device.node)
        if node is None:
            present = False
        elif device.hami:
            capacity, allocatable = gpu_capacity(node)
            present, taints = _hami_state(node, device)
        else:
            capacity, allocatable = gpu_capacity(node)
            known = node_gpu_uuids(node)
            present = bool(capacity) and (
                not known or device.gpu_uuid.lower() in {u.lower() for u in known}
            )
    health = worst_health(reports)
    events: list[dict[str, Any]] = []
    if health != "Unhealthy" and not _sick(taints):
        events = _events_about(kube, device.node, None)
        unhealthy = sorted({(r.namespace, r.pod) for r in reports if r.health != "Healthy"})
        for ns, pod in unhealthy[:MAX_POD_EVENT_READS]:
            events += _events_about(kube, pod, ns)
    events.sort(key=_event_time, reverse=True)
    return Evidence(
        health=health,
        reports=reports,
        slice_taints=taints,
        gpu_capacity=capacity,
        gpu_allocatable=allocatable,
        recent_events=[_format_event(e) for e in events[:MAX_EVENTS]],
        device_present=present,
    )


def _sick(taints: list[SliceTaint]) -> list[SliceTaint]:
    return [t for t in taints if t.driver_health or t.key in HAMI_HEALTH_KEYS]


def check_health(kube: Kube, device: ResolvedDevice) -> HealthResult:
    """Worst health any consumer reports; without consumers (they were evicted), the
    ResourceSlice (device published, no driver health taint) or node allocatable."""
    ids = resource_ids(device)
    claims = claim_lookup(kube, device)
    reports = _reports(list_node_pods(kube, device.node), device, ids, claims)
    if reports:
        worst = worst_health(reports)
        detail = "; ".join(
            f"{r.pod}/{r.container} {r.resource_id}"
            + (f" ({r.device})" if r.device else "")
            + f": {r.health}"
            + (f" ({r.message})" if r.message else "")
            for r in reports
        )
        return HealthResult(health=worst, message=f"pod status reports {detail}")  # type: ignore[arg-type]
    now = datetime.now(UTC).isoformat(timespec="seconds")
    if device.mode == "dra" and device.devices:
        present, taints = _slice_state(kube, device)
        if not present:
            return HealthResult(
                health="Unhealthy", message="the driver no longer publishes the device"
            )
        sick = _sick(taints)
        if sick:
            return HealthResult(
                health="Unhealthy",
                message="driver taint " + ", ".join(f"{t.key}={t.value}" for t in sick),
            )
        return HealthResult(
            health=None,
            message=f"no pod reports this device's health at {now}; it is published without "
            "driver health taints",
        )
    node = get_node(kube, device.node)
    if node is None:
        return HealthResult(health="Unhealthy", message=f"node {device.node} is gone")
    if device.hami:
        registered, taints = _hami_state(node, device)
        if not registered:
            return HealthResult(health="Unhealthy", message="HAMi no longer registers the GPU")
        if taints:
            return HealthResult(health="Unhealthy", message="HAMi registers the GPU unhealthy")
        return HealthResult(
            health=None,
            message=f"no pod reports this GPU's health at {now}; HAMi registers it healthy",
        )
    capacity, allocatable = gpu_capacity(node)
    if capacity is not None and allocatable is not None and allocatable < capacity:
        return HealthResult(
            health="Unhealthy",
            message=f"node allocatable nvidia.com/gpu {allocatable} < capacity {capacity}",
        )
    return HealthResult(
        health=None,
        message=f"no pod reports this GPU's health at {now}; node allocatable equals capacity",
    )
