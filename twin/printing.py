"""Server-side printing: the meta.k8s.io/v1 `Table` that `kubectl get` asks for.

kubectl sends `Accept: application/json;as=Table;v=v1;g=meta.k8s.io` for get, list and watch,
and prints the server's columns as they come (upper-cased, priority > 0 only with `-o wide`).
The columns and cells below are kube-apiserver's (pkg/printers/internalversion) for every kind
the twin serves; kinds without a printer there get the apiserver's default convertor: Name and
Created At. Ages use apimachinery's `HumanDuration` spelling (`45s`, `3m12s`, `5h`, `2d3h`).
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime
from typing import Any

from twin import errors
from twin.resources import ResourceType
from twin.store import parse_time

Obj = dict[str, Any]
# column: (name, type, format, priority)
Column = tuple[str, str, str, int]

_NAME: Column = ("Name", "string", "name", 0)
_AGE: Column = ("Age", "string", "", 0)
_DESCRIPTIONS = {
    "Name": "Name must be unique within a namespace. Is required when creating resources, "
    "although some resources may allow a client to request the generation of an appropriate "
    "name automatically. Name is primarily intended for creation idempotence and configuration "
    "definition. Cannot be updated. More info: "
    "https://kubernetes.io/docs/concepts/overview/working-with-objects/names#names",
    "Age": "CreationTimestamp is a timestamp representing the server time when this object was "
    "created. It is not guaranteed to be set in happens-before order across separate "
    "operations. Clients may not set this value. It is represented in RFC3339 form and is in "
    "UTC.\n\nPopulated by the system. Read-only. Null for lists. More info: "
    "https://git.k8s.io/community/contributors/devel/sig-architecture/api-conventions.md#metadata",
    "Ready": "The aggregate readiness state of this pod for accepting traffic.",
    "Status": "The aggregate status of the containers in this pod.",
    "Restarts": "The number of times the containers in this pod have been restarted and when "
    "the last container in this pod has restarted.",
}


def human_duration(seconds: float) -> str:
    """apimachinery's duration.HumanDuration."""
    if seconds < -1:
        return "<invalid>"
    s = max(0, int(seconds))
    if s < 120:
        return f"{s}s"
    m = s // 60
    if m < 10:
        return f"{m}m{s % 60}s" if s % 60 else f"{m}m"
    if m < 180:
        return f"{m}m"
    h = s // 3600
    if h < 8:
        return f"{h}h{m % 60}m" if m % 60 else f"{h}h"
    if h < 48:
        return f"{h}h"
    if h < 24 * 8:
        return f"{h // 24}d{h % 24}h" if h % 24 else f"{h // 24}d"
    if h < 24 * 365 * 2:
        return f"{h // 24}d"
    if h < 24 * 365 * 8:
        y = h // (24 * 365)
        return f"{y}y{(h // 24) % 365}d"
    return f"{h // (24 * 365)}y"


def since(now: datetime, stamp: str | None) -> str:
    if not stamp:
        return "<unknown>"
    return human_duration((now - parse_time(stamp)).total_seconds())


def _labels(selector: dict[str, Any] | None) -> str:
    """metav1.FormatLabelSelector."""
    if not selector:
        return "<none>"
    parts = [f"{k}={v}" for k, v in sorted((selector.get("matchLabels") or {}).items())]
    for expr in selector.get("matchExpressions") or []:
        op, key, values = expr.get("operator"), expr.get("key"), expr.get("values") or []
        if op == "In":
            parts.append(f"{key} in ({','.join(values)})")
        elif op == "NotIn":
            parts.append(f"{key} notin ({','.join(values)})")
        elif op == "Exists":
            parts.append(str(key))
        elif op == "DoesNotExist":
            parts.append(f"!{key}")
    return ",".join(parts) or "<none>"


def _containers(obj: Obj) -> tuple[str, str]:
    spec = ((obj.get("spec") or {}).get("template") or {}).get("spec") or {}
    containers = spec.get("containers") or []
    return (
        ",".join(c.get("name", "") for c in containers),
        ",".join(c.get("image", "") for c in containers),
    )


# ---- per kind ------------------------------------------------------------------------------


def _pod(pod: Obj, now: datetime) -> list[Any]:
    spec, status = pod.get("spec") or {}, pod.get("status") or {}
    statuses = status.get("containerStatuses") or []
    restarts = sum(int(c.get("restartCount", 0)) for c in statuses)
    reason = status.get("reason") or status.get("phase") or ""
    ready = 0
    last_restart = ""
    for c in reversed(statuses):
        state = c.get("state") or {}
        finished = ((c.get("lastState") or {}).get("terminated") or {}).get("finishedAt")
        if finished and finished > last_restart:
            last_restart = finished
        if (state.get("waiting") or {}).get("reason"):
            reason = state["waiting"]["reason"]
        elif (state.get("terminated") or {}).get("reason"):
            reason = state["terminated"]["reason"]
        elif "terminated" in state:
            reason = f"ExitCode:{state['terminated'].get('exitCode', 0)}"
        elif c.get("ready") and "running" in state:
            ready += 1
    if pod["metadata"].get("deletionTimestamp") and status.get("phase") not in (
        "Succeeded",
        "Failed",
    ):
        reason = "Terminating"
    shown_restarts = str(restarts)
    if restarts and last_restart:
        shown_restarts = f"{restarts} ({since(now, last_restart)} ago)"
    gates = spec.get("readinessGates") or []
    conds = {c.get("type"): c.get("status") for c in status.get("conditions") or []}
    gates_cell = "<none>"
    if gates:
        true = sum(1 for g in gates if conds.get(g.get("conditionType")) == "True")
        gates_cell = f"{true}/{len(gates)}"
    ips = status.get("podIPs") or []
    return [
        f"{ready}/{len(spec.get('containers') or [])}",
        reason,
        shown_restarts,
        since(now, pod["metadata"].get("creationTimestamp")),
        (ips[0].get("ip") if ips else status.get("podIP")) or "<none>",
        spec.get("nodeName") or "<none>",
        status.get("nominatedNodeName") or "<none>",
        gates_cell,
    ]


def _node(node: Obj, now: datetime) -> list[Any]:
    spec, status = node.get("spec") or {}, node.get("status") or {}
    ready = next((c for c in status.get("conditions") or [] if c.get("type") == "Ready"), None)
    states = []
    if ready is None:
        states.append("Unknown")
    elif ready.get("status") == "True":
        states.append("Ready")
    else:
        states.append("NotReady")
    if spec.get("unschedulable"):
        states.append("SchedulingDisabled")
    labels = node["metadata"].get("labels") or {}
    roles = sorted(
        {k.split("/", 1)[1] for k in labels if k.startswith("node-role.kubernetes.io/")}
        | ({labels["kubernetes.io/role"]} if labels.get("kubernetes.io/role") else set())
    )
    info = status.get("nodeInfo") or {}
    addresses = status.get("addresses") or []

    def address(kind: str) -> str:
        return next((a["address"] for a in addresses if a.get("type") == kind), "<none>")

    return [
        ",".join(states),
        ",".join(r for r in roles if r) or "<none>",
        since(now, node["metadata"].get("creationTimestamp")),
        info.get("kubeletVersion", ""),
        address("InternalIP"),
        address("ExternalIP"),
        info.get("osImage") or "<unknown>",
        info.get("kernelVersion") or "<unknown>",
        info.get("containerRuntimeVersion") or "<unknown>",
    ]


def _deployment(obj: Obj, now: datetime) -> list[Any]:
    spec, status = obj.get("spec") or {}, obj.get("status") or {}
    names, images = _containers(obj)
    return [
        f"{status.get('readyReplicas', 0)}/{spec.get('replicas', 0)}",
        int(status.get("updatedReplicas", 0)),
        int(status.get("availableReplicas", 0)),
        since(now, obj["metadata"].get("creationTimestamp")),
        names,
        images,
        _labels(spec.get("selector")),
    ]


def _replicaset(obj: Obj, now: datetime) -> list[Any]:
    spec, status = obj.get("spec") or {}, obj.get("status") or {}
    names, images = _containers(obj)
    return [
        int(spec.get("replicas", 0)),
        int(status.get("replicas", 0)),
        int(status.get("readyReplicas", 0)),
        since(now, obj["metadata"].get("creationTimestamp")),
        names,
        images,
        _labels(spec.get("selector")),
    ]


def _statefulset(obj: Obj, now: datetime) -> list[Any]:
    spec, status = obj.get("spec") or {}, obj.get("status") or {}
    names, images = _containers(obj)
    return [
        f"{status.get('readyReplicas', 0)}/{spec.get('replicas', 0)}",
        since(now, obj["metadata"].get("creationTimestamp")),
        names,
        images,
    ]


def _job(obj: Obj, now: datetime) -> list[Any]:
    spec, status = obj.get("spec") or {}, obj.get("status") or {}
    conds = {c.get("type"): c.get("status") for c in status.get("conditions") or []}
    if conds.get("Complete") == "True":
        state = "Complete"
    elif conds.get("Failed") == "True":
        state = "Failed"
    elif obj["metadata"].get("deletionTimestamp"):
        state = "Terminating"
    elif conds.get("Suspended") == "True":
        state = "Suspended"
    elif conds.get("FailureTarget") == "True":
        state = "FailureTarget"
    elif conds.get("SuccessCriteriaMet") == "True":
        state = "SuccessCriteriaMet"
    else:
        state = "Running"
    completions = spec.get("completions")
    succeeded = status.get("succeeded", 0)
    if completions is not None:
        shown = f"{succeeded}/{completions}"
    else:
        parallelism = spec.get("parallelism", 0)
        shown = f"{succeeded}/1 of {parallelism}" if parallelism > 1 else f"{succeeded}/1"
    start, end = status.get("startTime"), status.get("completionTime")
    duration = ""
    if start:
        stop = parse_time(end) if end else now
        duration = human_duration((stop - parse_time(start)).total_seconds())
    names, images = _containers(obj)
    return [
        state,
        shown,
        duration,
        since(now, obj["metadata"].get("creationTimestamp")),
        names,
        images,
        _labels(spec.get("selector")),
    ]


def _event(ev: Obj, now: datetime) -> list[Any]:
    """Core/v1 spelling (the store's); events.k8s.io reads are converted before printing."""
    first = ev.get("firstTimestamp") or ev.get("eventTime")
    last = ev.get("lastTimestamp") or (ev.get("series") or {}).get("lastObservedTime") or first
    count = ev.get("count") or (ev.get("series") or {}).get("count") or 1
    last_seen = since(now, last)
    if count > 1:
        last_seen = f"{last_seen} (x{count} over {since(now, first)})"
    obj = ev.get("involvedObject") or {}
    source = ev.get("source") or {}
    src = source.get("component") or ev.get("reportingComponent") or ""
    if source.get("host"):
        src = f"{src}, {source['host']}"
    return [
        last_seen,
        ev.get("type", ""),
        ev.get("reason", ""),
        f"{str(obj.get('kind', '')).lower()}/{obj.get('name', '')}",
        obj.get("fieldPath", ""),
        src,
        (ev.get("message") or "").strip(),
        since(now, first),
        int(count),
        ev["metadata"]["name"],
    ]


def _claim_state(claim: Obj) -> str:
    states = []
    status = claim.get("status") or {}
    deleted = bool(claim["metadata"].get("deletionTimestamp"))
    if deleted:
        states.append("deleted")
    if not status.get("allocation"):
        if not deleted:
            states.append("pending")
    else:
        states.append("allocated")
        if status.get("reservedFor"):
            states.append("reserved")
    return ",".join(states)


def _service(svc: Obj, now: datetime) -> list[Any]:
    spec = svc.get("spec") or {}
    ports = ",".join(
        f"{p.get('port')}/{p.get('protocol', 'TCP')}"
        if not p.get("nodePort")
        else f"{p.get('port')}:{p['nodePort']}/{p.get('protocol', 'TCP')}"
        for p in spec.get("ports") or []
    )
    external = ",".join(spec.get("externalIPs") or []) or "<none>"
    selector = spec.get("selector") or {}
    return [
        spec.get("type", "ClusterIP"),
        spec.get("clusterIP") or "<none>",
        external,
        ports or "<none>",
        since(now, svc["metadata"].get("creationTimestamp")),
        ",".join(f"{k}={v}" for k, v in sorted(selector.items())) or "<none>",
    ]


def _pdb(pdb: Obj, now: datetime) -> list[Any]:
    spec, status = pdb.get("spec") or {}, pdb.get("status") or {}
    return [
        str(spec["minAvailable"]) if "minAvailable" in spec else "N/A",
        str(spec["maxUnavailable"]) if "maxUnavailable" in spec else "N/A",
        int(status.get("disruptionsAllowed", 0)),
        since(now, pdb["metadata"].get("creationTimestamp")),
    ]


def _binding(obj: Obj, now: datetime) -> list[Any]:
    ref = obj.get("roleRef") or {}
    subjects = obj.get("subjects") or []

    def names(kind: str) -> str:
        if kind == "ServiceAccount":
            return ", ".join(
                f"{s.get('namespace', '')}/{s.get('name', '')}"
                for s in subjects
                if s.get("kind") == kind
            )
        return ", ".join(s.get("name", "") for s in subjects if s.get("kind") == kind)

    return [
        f"{ref.get('kind', '')}/{ref.get('name', '')}",
        since(now, obj["metadata"].get("creationTimestamp")),
        names("User"),
        names("Group"),
        names("ServiceAccount"),
    ]


def _age_only(obj: Obj, now: datetime) -> list[Any]:
    return [since(now, obj["metadata"].get("creationTimestamp"))]


def _created_at(obj: Obj, now: datetime) -> list[Any]:
    return [obj["metadata"].get("creationTimestamp")]


def _with_age(cell: Callable[[Obj], Any]) -> Callable[[Obj, datetime], list[Any]]:
    def cells(obj: Obj, now: datetime) -> list[Any]:
        return [cell(obj), since(now, obj["metadata"].get("creationTimestamp"))]

    return cells


def _slice(obj: Obj, now: datetime) -> list[Any]:
    spec = obj.get("spec") or {}
    return [
        spec.get("nodeName", ""),
        spec.get("driver", ""),
        (spec.get("pool") or {}).get("name", ""),
        since(now, obj["metadata"].get("creationTimestamp")),
    ]


def _s(name: str, priority: int = 0) -> Column:
    return (name, "string", "", priority)


def _i(name: str, priority: int = 0) -> Column:
    return (name, "integer", "", priority)


_WIDE_TEMPLATE = [_s("Containers", 1), _s("Images", 1), _s("Selector", 1)]

# storage key -> (columns after Name (or all, for events), cells function)
PRINTERS: dict[str, tuple[list[Column], Callable[[Obj, datetime], list[Any]]]] = {
    "pods": (
        [_s("Ready"), _s("Status"), _s("Restarts"), _AGE, _s("IP", 1), _s("Node", 1)]
        + [_s("Nominated Node", 1), _s("Readiness Gates", 1)],
        _pod,
    ),
    "nodes": (
        [_s("Status"), _s("Roles"), _AGE, _s("Version"), _s("Internal-IP", 1)]
        + [_s("External-IP", 1), _s("OS-Image", 1), _s("Kernel-Version", 1)]
        + [_s("Container-Runtime", 1)],
        _node,
    ),
    "namespaces": (
        [_s("Status"), _AGE],
        _with_age(lambda o: (o.get("status") or {}).get("phase", "")),
    ),
    "configmaps": (
        [_s("Data"), _AGE],
        _with_age(lambda o: len(o.get("data") or {}) + len(o.get("binaryData") or {})),
    ),
    "secrets": (
        [_s("Type"), _s("Data"), _AGE],
        lambda o, now: [
            o.get("type", ""),
            len(o.get("data") or {}),
            since(now, o["metadata"].get("creationTimestamp")),
        ],
    ),
    "serviceaccounts": (
        [_s("Secrets"), _AGE],
        _with_age(lambda o: len(o.get("secrets") or [])),
    ),
    "services": (
        [_s("Type"), _s("Cluster-IP"), _s("External-IP"), _s("Port(s)"), _AGE]
        + [_s("Selector", 1)],
        _service,
    ),
    "leases.coordination.k8s.io": (
        [_s("Holder"), _AGE],
        _with_age(lambda o: (o.get("spec") or {}).get("holderIdentity", "")),
    ),
    "deployments.apps": (
        [_s("Ready"), _s("Up-to-date"), _s("Available"), _AGE, *_WIDE_TEMPLATE],
        _deployment,
    ),
    "replicasets.apps": (
        [_i("Desired"), _i("Current"), _i("Ready"), _AGE, *_WIDE_TEMPLATE],
        _replicaset,
    ),
    "statefulsets.apps": (
        [_s("Ready"), _AGE, _s("Containers", 1), _s("Images", 1)],
        _statefulset,
    ),
    "jobs.batch": (
        [_s("Status"), _s("Completions"), _s("Duration"), _AGE, *_WIDE_TEMPLATE],
        _job,
    ),
    "poddisruptionbudgets.policy": (
        [_s("Min Available"), _s("Max Unavailable"), _i("Allowed Disruptions"), _AGE],
        _pdb,
    ),
    "events": (
        [_s("Last Seen"), _s("Type"), _s("Reason"), _s("Object"), _s("Subobject", 1)]
        + [_s("Source", 1), _s("Message"), _s("First Seen", 1), _s("Count", 1)]
        + [("Name", "string", "name", 1)],
        _event,
    ),
    "rolebindings.rbac.authorization.k8s.io": (
        [_s("Role"), _AGE, _s("Users", 1), _s("Groups", 1), _s("ServiceAccounts", 1)],
        _binding,
    ),
    "clusterrolebindings.rbac.authorization.k8s.io": (
        [_s("Role"), _AGE, _s("Users", 1), _s("Groups", 1), _s("ServiceAccounts", 1)],
        _binding,
    ),
    "deviceclasses.resource.k8s.io": ([_AGE], _age_only),
    "resourceclaimtemplates.resource.k8s.io": ([_AGE], _age_only),
    "resourceclaims.resource.k8s.io": ([_s("State"), _AGE], _with_age(_claim_state)),
    "resourceslices.resource.k8s.io": (
        [_s("Node"), _s("Driver"), _s("Pool"), _AGE],
        _slice,
    ),
}
# The apiserver's default table convertor (no printer registered for the kind).
DEFAULT: tuple[list[Column], Callable[[Obj, datetime], list[Any]]] = (
    [("Created At", "date", "", 0)],
    _created_at,
)


def _printer(rt: ResourceType) -> tuple[list[Column], Callable[[Obj, datetime], list[Any]]]:
    return PRINTERS.get(rt.storage, DEFAULT)


def columns(rt: ResourceType) -> list[dict[str, Any]]:
    cols, _cells = _printer(rt)
    if rt.storage != "events":
        cols = [_NAME, *cols]
    return [
        {
            "name": name,
            "type": kind,
            "format": fmt,
            "description": _DESCRIPTIONS.get(name, name),
            "priority": priority,
        }
        for name, kind, fmt, priority in cols
    ]


INCLUDE_OBJECT = ("None", "Metadata", "Object")  # the `includeObject` query parameter


def row(
    rt: ResourceType, obj: Obj, now: datetime, shown: Obj, include: str = "Metadata"
) -> dict[str, Any]:
    """One TableRow; `shown` is the object as the client's API version presents it, carried
    whole (`includeObject=Object`: kubectl get --sort-by), as metadata (default) or not."""
    _cols, cells = _printer(rt)
    values = cells(obj, now)
    if rt.storage != "events":
        values = [obj["metadata"]["name"], *values]
    out: dict[str, Any] = {"cells": values}
    if include == "Object":
        out["object"] = shown
    elif include == "Metadata":
        out["object"] = {
            "kind": "PartialObjectMetadata",
            "apiVersion": "meta.k8s.io/v1",
            "metadata": shown["metadata"],
        }
    phase = (obj.get("status") or {}).get("phase") if rt.storage == "pods" else None
    if phase in ("Succeeded", "Failed"):
        out["conditions"] = [
            {
                "type": "Completed",
                "status": "True",
                "reason": phase,
                "message": "The pod has completed successfully."
                if phase == "Succeeded"
                else "The pod failed.",
            }
        ]
    return out


def table(
    rt: ResourceType,
    items: list[Obj],
    now: datetime,
    resource_version: str,
    present: Callable[[Obj], Obj],
    with_columns: bool = True,
    include: str = "Metadata",
) -> dict[str, Any]:
    if include not in INCLUDE_OBJECT:
        raise errors.bad_request(
            f'includeObject must be one of {", ".join(INCLUDE_OBJECT)}, not "{include}"'
        )
    doc: dict[str, Any] = {
        "kind": "Table",
        "apiVersion": "meta.k8s.io/v1",
        "metadata": {"resourceVersion": resource_version},
        "columnDefinitions": columns(rt) if with_columns else None,
        "rows": [row(rt, o, now, present(o), include) for o in items],
    }
    return doc
