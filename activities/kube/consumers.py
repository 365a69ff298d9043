"""Consumers of a physical GPU: claims allocated to any device of its group, the pods that
reserve or use them, their owners up to the top controller, and what runbook matching needs
(labels, namespace labels, priority class).

DRA requests: 1 list of claims (all namespaces; shared with the evidence step when both are
under way, or when one loaded it after the other was scheduled) + 1 list of the node's pods
+ 1 read per
distinct ReplicaSet/Job + 1 read per distinct namespace.
Device plugin: 1 list of the node's pods (alert-named pods count only when found there).
HAMi (device plugin with HAMi's annotations): the same list; a pod is a consumer when its
`hami.io/vgpu-devices-allocated` names the GPU, so every vGPU share of it is found at once.
"""

from __future__ import annotations

import logging
import time
from typing import Any

from activities.kube import hami
from activities.kube.client import ErrorKind, Kube, KubeError
from activities.kube.pods import (
    OwnerResolver,
    claim_names,
    health_reports,
    is_terminal,
    is_terminating,
    meta,
    pod_ref,
    reports_any_status,
    requests_gpu,
)
from contract.kube import Consumer, ConsumersResult, FindConsumersInput, ResolvedDevice

log = logging.getLogger(__name__)


def claim_devices(claim: dict[str, Any]) -> list[tuple[str, str, str]]:
    alloc = (claim.get("status") or {}).get("allocation") or {}
    results = (alloc.get("devices") or {}).get("results") or []
    return [(r.get("driver", ""), r.get("pool", ""), r.get("device", "")) for r in results]


# One remediation reads the node's pods in two consecutive local activities (evidence, then
# consumers, milliseconds apart in one workflow task): the second may reuse the first's list if
# it is at most this old. Waits and health checks always read fresh (max_age 0).
NODE_PODS_MAX_AGE = 2.0  # seconds


def list_node_pods(kube: Kube, node: str, *, max_age: float = 0.0) -> list[dict[str, Any]]:
    """Pods bound to `node`; with `max_age`, a list read by this worker at most that many
    seconds ago is reused (the list is always stored for the next reader). A fresh read
    (`max_age` 0) still joins a list of this node already being loaded: the evidence and
    consumer steps of one remediation run side by side and share one request."""

    def load() -> list[dict[str, Any]]:
        body = kube.call(
            kube.core.list_pod_for_all_namespaces,
            verb="list",
            resource="pods",
            field_selector=f"spec.nodeName={node}",
        )
        items = body.get("items") or []
        return [p for p in items if (p.get("spec") or {}).get("nodeName") == node]

    return list(kube.cached(("node-pods", node), max(max_age, 0.0), load))


def loaded_since(fresh_since: float | None) -> float:
    """The max age (seconds) of a list this worker loaded at or after `fresh_since` (epoch
    seconds, when the step asking for it was scheduled): such a list was read from the API
    after the workflow asked, so it is as fresh as the step needs. 0 (read now) when there is
    no usable schedule time: None, in the future, or more than NODE_PODS_MAX_AGE ago."""
    if fresh_since is None:
        return 0.0
    since = time.time() - fresh_since
    return since if 0.0 <= since <= NODE_PODS_MAX_AGE else 0.0


def list_claims(kube: Kube, *, max_age: float = 0.0) -> list[dict[str, Any]]:
    """Every ResourceClaim; a list already under way in this worker is joined (the evidence
    step, resolving CDI health ids, and find-consumers run side by side). Reused by age only
    with `max_age` from `loaded_since` (a list loaded since the asking step was scheduled,
    e.g. by the other step of the pair when they did not overlap); never a list older than
    the step: the cache is the worker's, and another remediation's list from a second ago can
    predate the very claim this one looks for (a replacement just allocated)."""

    def load() -> list[dict[str, Any]]:
        body = kube.call(
            kube.resource_v1.list_resource_claim_for_all_namespaces,
            verb="list",
            resource="resourceclaims.resource.k8s.io",
        )
        return body.get("items") or []

    return list(kube.cached(("claims",), max(max_age, 0.0), load))


def group_keys(device: ResolvedDevice) -> set[tuple[str, str, str]]:
    return {(d.driver, d.pool, d.device) for d in device.devices}


def _get_pod(kube: Kube, namespace: str, name: str) -> dict[str, Any] | None:
    try:
        return kube.call(
            kube.core.read_namespaced_pod, name, namespace, verb="get", resource="pods", name=name
        )
    except KubeError as err:
        if err.kind is ErrorKind.NOT_FOUND:
            return None
        raise


def _reports_gpu(pod: dict[str, Any], uuid: str) -> bool:
    """The pod reports device health for this GPU (the device plugin's id is the UUID;
    time-sliced replicas add `::<n>`)."""
    want = uuid.lower()
    return any(
        r.resource_id.lower() == want or r.resource_id.lower().startswith(want + "::")
        for r in health_reports(pod, None)
    )


def _may_hold(pod: dict[str, Any], uuid: str | None) -> bool:
    """False only when the pod reports device health and none of it is for this GPU."""
    if not uuid or not health_reports(pod, None):
        return True
    return _reports_gpu(pod, uuid)


def find_consumers(
    kube: Kube, inp: FindConsumersInput, *, fresh_since: float | None = None
) -> ConsumersResult:
    """`fresh_since` (epoch seconds, when the step was scheduled): the claim list may be one
    this worker loaded since then (`loaded_since`); otherwise it is read now."""
    device = inp.device
    pods_by_key: dict[tuple[str, str], dict[str, Any]] = {}
    claim_of: dict[tuple[str, str], str] = {}
    node_pods = list_node_pods(kube, device.node, max_age=NODE_PODS_MAX_AGE)
    index = {(meta(p).get("namespace"), meta(p).get("name")): p for p in node_pods}

    if device.mode == "dra" and device.devices:
        keys = group_keys(device)
        for claim in list_claims(kube, max_age=loaded_since(fresh_since)):
            if not keys.intersection(claim_devices(claim)):
                continue
            cm = meta(claim)
            ns, cname = cm.get("namespace", ""), cm.get("name", "")
            reserved = [
                r
                for r in (claim.get("status") or {}).get("reservedFor") or []
                if r.get("resource", "pods") == "pods"
            ]
            for r in reserved:
                key = (ns, r.get("name", ""))
                pod = index.get(key) or _get_pod(kube, *key)
                if pod is not None:
                    pods_by_key[key] = pod
                    claim_of[key] = cname
            # Pods naming the claim in their status (covers a reservedFor not yet written).
            for key, pod in index.items():
                if key[0] == ns and cname in claim_names(pod):
                    pods_by_key[key] = pod
                    claim_of.setdefault(key, cname)
    elif device.hami:
        pods_by_key.update(_hami_holders(index, device))
    else:
        uuid = device.gpu_uuid
        # Alert labels are hints only: a named pod is a consumer when the API shows it on
        # this node (the node's pod list, never a read by name), requesting a GPU, and not
        # reporting health for other GPUs only. dcgm-exporter's own pod (which a Prometheus
        # Operator scrape labels `pod`) requests no GPU, so it never qualifies.
        for ref in inp.alert_pods:
            key = (ref.namespace, ref.name)
            pod = index.get(key)
            if pod is not None and requests_gpu(pod) and _may_hold(pod, uuid):
                pods_by_key[key] = pod
        any_status = False
        for key, pod in index.items():
            if not requests_gpu(pod):
                continue
            any_status = any_status or reports_any_status(pod)
            if uuid and _reports_gpu(pod, uuid):
                pods_by_key[key] = pod
        if not pods_by_key and not any_status:
            # Nothing ties a pod to this GPU (no alert pod mapping, no allocatedResourcesStatus):
            # every GPU pod on the node may be using it.
            for key, pod in index.items():
                if requests_gpu(pod):
                    pods_by_key[key] = pod

    owners = OwnerResolver(kube)
    ns_labels: dict[str, dict[str, str]] = {}
    consumers: list[Consumer] = []
    for key, pod in sorted(pods_by_key.items()):
        if is_terminal(pod):
            continue  # a finished pod holds nothing
        ns = key[0]
        if ns not in ns_labels:
            ns_labels[ns] = _namespace_labels(kube, ns)
        direct, top = owners.owners(pod)
        m = meta(pod)
        consumers.append(
            Consumer(
                pod=pod_ref(pod),
                node=(pod.get("spec") or {}).get("nodeName"),
                phase=(pod.get("status") or {}).get("phase", ""),
                terminating=is_terminating(pod),
                claim=claim_of.get(key),
                owner=direct,
                top_owner=top,
                labels=dict(m.get("labels") or {}),
                namespace_labels=ns_labels[ns],
                priority_class=(pod.get("spec") or {}).get("priorityClassName"),
            )
        )
    return ConsumersResult(consumers=consumers)


def _hami_holders(index: dict[Any, dict[str, Any]], device: ResolvedDevice) -> dict[Any, Any]:
    """HAMi: the node's pods whose placement record names this GPU, every share of it (the
    record is the scheduler's own choice, so alert labels and guesses are not needed). A
    record that does not parse stops the step (never a guess); a GPU pod without any record
    cannot hold a HAMi share (HAMi's device plugin refuses it), so it is named in a warning."""
    want = device.gpu_uuid.lower()
    held: dict[Any, dict[str, Any]] = {}
    for key, pod in index.items():
        try:
            uuids = hami.pod_gpu_uuids(pod)
        except hami.HamiFormatError as err:
            raise err.application_error() from err
        if uuids is None:
            if requests_gpu(pod) and not is_terminal(pod):
                log.warning(
                    "HAMi node %s: pod %s/%s requests a GPU but carries no %s; not a consumer "
                    "of %s",
                    device.node,
                    key[0],
                    key[1],
                    hami.ANN_ALLOCATED,
                    device.gpu_uuid,
                )
            continue
        if want in uuids:
            held[key] = pod
    return held


NAMESPACE_TTL = 60.0  # seconds; runbook-matching labels on namespaces rarely change


def _namespace_labels(kube: Kube, namespace: str) -> dict[str, str]:
    return dict(
        kube.cached(("ns", namespace), NAMESPACE_TTL, lambda: _read_ns_labels(kube, namespace))
    )


def _read_ns_labels(kube: Kube, namespace: str) -> dict[str, str]:
    try:
        ns = kube.call(
            kube.core.read_namespace, namespace, verb="get", resource="namespaces", name=namespace
        )
    except KubeError as err:
        if err.kind is ErrorKind.NOT_FOUND:
            return {}
        raise
    return dict(meta(ns).get("labels") or {})
