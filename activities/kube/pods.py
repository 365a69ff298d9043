"""Reading pods: references, claims, device health, owners. Pure functions over API dicts,
plus the owner walk (which reads ReplicaSets and Jobs)."""

from __future__ import annotations

from typing import Any

from activities.kube.client import ErrorKind, Kube, KubeError
from activities.kube.devices import GPU_RESOURCE, MIG_RESOURCE_PREFIX, SHARED_RESOURCE
from activities.kube.health import ClaimLookup, is_claim_entry, resolve_entry
from contract.kube import HealthReport, OwnerRef, PodRef

TERMINAL_PHASES = ("Succeeded", "Failed")


def meta(obj: dict[str, Any]) -> dict[str, Any]:
    return obj.get("metadata") or {}


def pod_ref(pod: dict[str, Any]) -> PodRef:
    m = meta(pod)
    return PodRef(namespace=m.get("namespace", ""), name=m.get("name", ""), uid=m.get("uid"))


def same_pod(ref: PodRef, pod: dict[str, Any]) -> bool:
    """Same namespace/name and, when both know it, the same uid (a StatefulSet re-creates
    a pod under the same name: that is a replacement, not the old pod)."""
    m = meta(pod)
    if (m.get("namespace"), m.get("name")) != (ref.namespace, ref.name):
        return False
    return not (ref.uid and m.get("uid") and ref.uid != m.get("uid"))


def is_terminating(pod: dict[str, Any]) -> bool:
    return bool(meta(pod).get("deletionTimestamp"))


def is_terminal(pod: dict[str, Any]) -> bool:
    return (pod.get("status") or {}).get("phase") in TERMINAL_PHASES


def claim_names(pod: dict[str, Any]) -> list[str]:
    """ResourceClaim names the pod uses: generated ones from status.resourceClaimStatuses
    (never derived from the template name), direct ones from spec.resourceClaims."""
    names: list[str] = []
    for status in (pod.get("status") or {}).get("resourceClaimStatuses") or []:
        if status.get("resourceClaimName"):
            names.append(status["resourceClaimName"])
    for ref in (pod.get("spec") or {}).get("resourceClaims") or []:
        if ref.get("resourceClaimName"):
            names.append(ref["resourceClaimName"])
    return names


def health_reports(
    pod: dict[str, Any], resource_ids: set[str] | None, claims: ClaimLookup | None = None
) -> list[HealthReport]:
    """KEP-4680 allocatedResourcesStatus entries, optionally only for these resource IDs
    (DRA: driver/pool/device; device plugin: the device ID, i.e. the GPU UUID). With
    `claims`, a DRA entry whose resourceID is not one of them (a CDI device id, as the 1.36
    kubelet writes for drivers that return one) is resolved through the pod's ResourceClaim
    (activities/kube/health.py) and kept when its device is one of them."""
    m = meta(pod)
    out: list[HealthReport] = []
    status = pod.get("status") or {}
    wanted = {r.lower() for r in resource_ids} if resource_ids is not None else None
    for cs in (status.get("containerStatuses") or []) + (status.get("initContainerStatuses") or []):
        for entry in cs.get("allocatedResourcesStatus") or []:
            entry_name = str(entry.get("name", ""))
            for res in entry.get("resources") or []:
                rid = str(res.get("resourceID", ""))
                device = ""
                if wanted is not None and rid.lower() not in wanted:
                    if claims is None or not is_claim_entry(entry_name):
                        continue
                    device = resolve_entry(pod, entry_name, rid, claims).device or ""
                    if device.lower() not in wanted:
                        continue
                health = res.get("health") or "Unknown"
                if health not in ("Healthy", "Unhealthy", "Unknown"):
                    health = "Unknown"
                out.append(
                    HealthReport(
                        namespace=m.get("namespace", ""),
                        pod=m.get("name", ""),
                        container=cs.get("name", ""),
                        resource_id=rid,
                        health=health,
                        message=str(res.get("message") or ""),
                        device=device,
                    )
                )
    return out


def reports_any_status(pod: dict[str, Any]) -> bool:
    status = pod.get("status") or {}
    return any(cs.get("allocatedResourcesStatus") for cs in status.get("containerStatuses") or [])


def is_gpu_resource(name: str) -> bool:
    """A resource the NVIDIA device plugin offers a GPU (or a share of one) as: nvidia.com/gpu,
    nvidia.com/gpu.shared (time-slicing or MPS, renamed), nvidia.com/mig-<profile>."""
    return name in (GPU_RESOURCE, SHARED_RESOURCE) or name.startswith(MIG_RESOURCE_PREFIX)


def requests_gpu(pod: dict[str, Any]) -> bool:
    """The pod asks the device plugin for a GPU, a replica of one or a MIG instance (in a
    container or an init container)."""
    spec = pod.get("spec") or {}
    for c in list(spec.get("containers") or []) + list(spec.get("initContainers") or []):
        res = c.get("resources") or {}
        for section in ("limits", "requests"):
            for name, value in (res.get(section) or {}).items():
                if is_gpu_resource(str(name)) and value not in (None, "0", 0):
                    return True
    return False


WORST = {"Unhealthy": 2, "Unknown": 1, "Healthy": 0}


def worst_health(reports: list[HealthReport]) -> str | None:
    if not reports:
        return None
    return max((r.health for r in reports), key=lambda h: WORST[h])


def controller_ref(obj: dict[str, Any]) -> dict[str, Any] | None:
    refs = meta(obj).get("ownerReferences") or []
    return next((r for r in refs if r.get("controller")), refs[0] if refs else None)


def _owner(ref: dict[str, Any], namespace: str) -> OwnerRef:
    return OwnerRef(
        kind=ref.get("kind", ""), name=ref.get("name", ""), namespace=namespace, uid=ref.get("uid")
    )


class OwnerResolver:
    """Walks ownerReferences to the top controller, caching reads within one activity.

    ReplicaSet -> Deployment and Job -> JobSet/CronJob need one read of the middle object;
    the top object itself is never read (its kind/name/uid are in the reference).
    """

    def __init__(self, kube: Kube) -> None:
        self._kube = kube
        self._cache: dict[tuple[str, str, str], dict[str, Any] | None] = {}

    def _read(self, kind: str, namespace: str, name: str) -> dict[str, Any] | None:
        key = (kind, namespace, name)
        if key not in self._cache:
            kube = self._kube
            try:
                if kind == "ReplicaSet":
                    obj = kube.call(
                        kube.apps.read_namespaced_replica_set,
                        name,
                        namespace,
                        verb="get",
                        resource="replicasets.apps",
                        name=name,
                    )
                else:
                    obj = kube.call(
                        kube.batch.read_namespaced_job,
                        name,
                        namespace,
                        verb="get",
                        resource="jobs.batch",
                        name=name,
                    )
            except KubeError as err:
                if err.kind is not ErrorKind.NOT_FOUND:
                    raise
                obj = None
            self._cache[key] = obj
        return self._cache[key]

    def owners(self, pod: dict[str, Any]) -> tuple[OwnerRef | None, OwnerRef | None]:
        """(direct controller, top controller) of a pod."""
        ns = meta(pod).get("namespace", "")
        ref = controller_ref(pod)
        if ref is None:
            return None, None
        direct = _owner(ref, ns)
        top = direct
        if direct.kind in ("ReplicaSet", "Job"):
            middle = self._read(direct.kind, ns, direct.name)
            parent = controller_ref(middle) if middle else None
            if parent is not None:
                top = _owner(parent, ns)
        return direct, top
