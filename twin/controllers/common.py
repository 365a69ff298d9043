"""Helpers shared by the twin's controllers: resource names, conditions, owner references,
pod predicates, and an event recorder that writes Events the way each real component does.

Two event styles exist in a real cluster (tests/k8s_golden/42, 43, 53, 54):
- kube-scheduler writes through events.k8s.io/v1: in core/v1 form `eventTime` is set,
  `firstTimestamp`/`lastTimestamp` are null, `source` is `{}`, `action` is set, and
  `reportingInstance` is `default-scheduler-<host>`;
- controller-manager controllers write core/v1 events: `count`, `firstTimestamp`,
  `lastTimestamp`, `source.component`, `eventTime` null, `reportingInstance` "".
"""

from __future__ import annotations

import logging
import time
from datetime import datetime
from typing import Any

from twin.clock import rfc3339, rfc3339_micro
from twin.errors import ApiError

log = logging.getLogger(__name__)

# Store resource names (kubectl spelling, as twin/store.py takes them).
PODS = "pods"
NODES = "nodes"
EVENTS = "events"
DEPLOYMENTS = "deployments.apps"
REPLICASETS = "replicasets.apps"
STATEFULSETS = "statefulsets.apps"
JOBS = "jobs.batch"
CLAIMS = "resourceclaims.resource.k8s.io"
CLAIM_TEMPLATES = "resourceclaimtemplates.resource.k8s.io"
SLICES = "resourceslices.resource.k8s.io"
DEVICE_CLASSES = "deviceclasses.resource.k8s.io"
TAINT_RULES = "devicetaintrules.resource.k8s.io"
MACHINE_DEPLOYMENTS = "machinedeployments.cluster.x-k8s.io"
MACHINES = "machines.cluster.x-k8s.io"

GPU_RESOURCE = "nvidia.com/gpu"
POD_CLAIM_NAME_ANN = "resource.kubernetes.io/pod-claim-name"
CLAIM_FINALIZER = "resource.kubernetes.io/delete-protection"
SCHEDULER_NAME = "default-scheduler"
SCHEDULER_INSTANCE = "default-scheduler-sickbay-twin"

# Simulation knobs a workload can set on its pod template (documented in the manager).
ANN_RUN_SECONDS = "twin.sickbay.dev/run-seconds"  # container exits after this long
ANN_EXIT_CODE = "twin.sickbay.dev/exit-code"  # ... with this exit code (default 0)


def meta(obj: dict[str, Any]) -> dict[str, Any]:
    return obj.get("metadata") or {}


def name_of(obj: dict[str, Any]) -> str:
    return str(meta(obj).get("name", ""))


def ns_of(obj: dict[str, Any]) -> str:
    return str(meta(obj).get("namespace", ""))


def uid_of(obj: dict[str, Any]) -> str:
    return str(meta(obj).get("uid", ""))


def is_deleting(obj: dict[str, Any]) -> bool:
    return bool(meta(obj).get("deletionTimestamp"))


def phase(pod: dict[str, Any]) -> str:
    return str((pod.get("status") or {}).get("phase") or "Pending")


def is_terminal(pod: dict[str, Any]) -> bool:
    return phase(pod) in ("Succeeded", "Failed")


def is_active(pod: dict[str, Any]) -> bool:
    """Counts toward a controller's replicas: not finished and not being deleted."""
    return not is_terminal(pod) and not is_deleting(pod)


def controller_ref(obj: dict[str, Any]) -> dict[str, Any] | None:
    for ref in meta(obj).get("ownerReferences") or []:
        if ref.get("controller"):
            return ref
    return None


def owned_by(obj: dict[str, Any], owner_uid: str) -> bool:
    ref = controller_ref(obj)
    return ref is not None and ref.get("uid") == owner_uid


def owner_reference(owner: dict[str, Any], api_version: str, kind: str) -> dict[str, Any]:
    return {
        "apiVersion": api_version,
        "kind": kind,
        "name": name_of(owner),
        "uid": uid_of(owner),
        "controller": True,
        "blockOwnerDeletion": True,
    }


def get_condition(obj: dict[str, Any], ctype: str) -> dict[str, Any] | None:
    for cond in (obj.get("status") or {}).get("conditions") or []:
        if cond.get("type") == ctype:
            return cond
    return None


def set_condition(
    status: dict[str, Any],
    ctype: str,
    cstatus: str,
    now: datetime,
    reason: str | None = None,
    message: str | None = None,
    probe: bool = False,
    observed_generation: int | None = None,
) -> bool:
    """Upsert a condition; keeps lastTransitionTime unless the status flips. True if changed."""
    conditions = status.setdefault("conditions", [])
    new: dict[str, Any] = {"type": ctype, "status": cstatus}
    if probe:
        new["lastProbeTime"] = None
    if reason:
        new["reason"] = reason
    if message:
        new["message"] = message
    if observed_generation is not None:
        new["observedGeneration"] = observed_generation
    for i, cond in enumerate(conditions):
        if cond.get("type") != ctype:
            continue
        same_status = cond.get("status") == cstatus
        new["lastTransitionTime"] = cond.get("lastTransitionTime") if same_status else rfc3339(now)
        if not same_status or any(cond.get(k) != v for k, v in new.items()):
            conditions[i] = new
            return True
        return False
    new["lastTransitionTime"] = rfc3339(now)
    conditions.append(new)
    return True


def selector_matches(selector: dict[str, Any] | None, labels: dict[str, str] | None) -> bool:
    """metav1.LabelSelector (matchLabels + matchExpressions) against labels."""
    if not selector:
        return False
    labels = labels or {}
    for key, value in (selector.get("matchLabels") or {}).items():
        if labels.get(key) != value:
            return False
    for expr in selector.get("matchExpressions") or []:
        key, op, values = expr.get("key"), expr.get("operator"), expr.get("values") or []
        if op == "In" and labels.get(key) not in values:
            return False
        if op == "NotIn" and key in labels and labels[key] in values:
            return False
        if op == "Exists" and key not in labels:
            return False
        if op == "DoesNotExist" and key in labels:
            return False
    return True


def quantity_int(value: Any) -> int:
    """Integer quantities (`nvidia.com/gpu: "2"`); anything unparsable counts as 0."""
    try:
        return int(str(value))
    except (TypeError, ValueError):
        return 0


def pod_gpu_request(pod: dict[str, Any]) -> int:
    """nvidia.com/gpu a pod asks for (device-plugin profile): limits, else requests."""
    total = 0
    for container in (pod.get("spec") or {}).get("containers") or []:
        resources = container.get("resources") or {}
        value = (resources.get("limits") or {}).get(GPU_RESOURCE)
        if value is None:
            value = (resources.get("requests") or {}).get(GPU_RESOURCE)
        total += quantity_int(value)
    return total


def pod_claim_name(pod: dict[str, Any], entry: dict[str, Any]) -> str | None:
    """The ResourceClaim name a pod.spec.resourceClaims entry resolves to (None: not yet)."""
    if entry.get("resourceClaimName"):
        return str(entry["resourceClaimName"])
    for status in (pod.get("status") or {}).get("resourceClaimStatuses") or []:
        if status.get("name") == entry.get("name"):
            return status.get("resourceClaimName")
    return None


class EventRecorder:
    """Writes Events into the store in the style of the component that reports them."""

    def __init__(self, store: Any, clock: Any) -> None:
        self.store = store
        self.clock = clock

    def _involved(self, obj: dict[str, Any]) -> dict[str, Any]:
        m = meta(obj)
        ref = {
            "apiVersion": obj.get("apiVersion", "v1"),
            "kind": obj.get("kind", ""),
            "name": m.get("name"),
            "namespace": m.get("namespace"),
            "uid": m.get("uid"),
        }
        if m.get("resourceVersion"):
            ref["resourceVersion"] = m["resourceVersion"]
        return {k: v for k, v in ref.items() if v is not None}

    def _name(self, obj: dict[str, Any]) -> str:
        return f"{name_of(obj)}.{time.time_ns():x}"

    def _create(self, event: dict[str, Any], namespace: str) -> None:
        try:
            self.store.create(EVENTS, event, namespace=namespace)
        except ApiError as err:  # a namespace being deleted, say: events are best effort
            log.debug("event %s not recorded: %s", event.get("reason"), err.message)

    def controller(
        self,
        obj: dict[str, Any],
        component: str,
        reason: str,
        message: str,
        etype: str = "Normal",
        with_version: bool = True,
        host: str | None = None,
    ) -> None:
        """A core/v1 event as kube-controller-manager's (or a kubelet's, with `host`) recorders
        write it."""
        now = rfc3339(self.clock.now())
        involved = self._involved(obj)
        if not with_version:
            involved.pop("resourceVersion", None)
        namespace = ns_of(obj) or "default"
        self._create(
            {
                "apiVersion": "v1",
                "kind": "Event",
                "metadata": {"name": self._name(obj), "namespace": namespace},
                "involvedObject": involved,
                "reason": reason,
                "message": message,
                "type": etype,
                "count": 1,
                "firstTimestamp": now,
                "lastTimestamp": now,
                "eventTime": None,
                "source": {"component": component, **({"host": host} if host else {})},
                "reportingComponent": component,
                "reportingInstance": host or "",
            },
            namespace,
        )

    def scheduler(
        self, pod: dict[str, Any], reason: str, action: str, message: str, etype: str
    ) -> None:
        """An events.k8s.io/v1 event from kube-scheduler, stored in core/v1 form."""
        namespace = ns_of(pod) or "default"
        self._create(
            {
                "apiVersion": "v1",
                "kind": "Event",
                "metadata": {"name": self._name(pod), "namespace": namespace},
                "involvedObject": self._involved(pod),
                "reason": reason,
                "message": message,
                "type": etype,
                "action": action,
                "eventTime": rfc3339_micro(self.clock.now()),
                "firstTimestamp": None,
                "lastTimestamp": None,
                "source": {},
                "reportingComponent": SCHEDULER_NAME,
                "reportingInstance": SCHEDULER_INSTANCE,
            },
            namespace,
        )
