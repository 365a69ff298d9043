"""The node incident's hands on the cluster: diagnose a node whose GPUs vanished, contain it,
restart its GPU plugin (once per attempt), wait for its GPUs to come back, release it.

What the diagnosis reads (all read-only, a handful of requests):
- the Node: `nvidia.com/gpu` capacity / allocatable, the `nvidia.com/gpu.count` label (GPU
  feature discovery), `status.nodeInfo` kubelet and container-runtime versions, its pool;
- the node's ResourceSlices (DRA): how many physical GPUs the driver still publishes;
- the GPU plugin pods on the node (any namespace, by their well-known labels): the NVIDIA
  device plugin, the NVIDIA DRA driver's kubelet plugin, the GPU Operator's validator; per
  pod its phase, readiness, restart count, waiting reason and message, last termination
  (reason, exit code, message) and its Events;
- the other nodes of the pool: which kubelet versions they run (peers);
- the RuntimeClass the plugin pod names (`spec.runtimeClassName`), when the API serves them.

From that it names the likely cause in plain words (`NodeDiagnosis.summary`), e.g. "the
container toolkit hook fails on this node since its kubelet went from v1.28.15 to v1.29.15;
3 other nodes of the pool still run v1.28.15", and whether a plugin restart may fix it
(`restartable`: not when the hook fails or NVML is missing: a restart runs the same hook
against the same runtime).

`find-gpu-pods-on-node` lists the workloads whose GPUs vanished (pods holding nvidia.com/gpu or
a ResourceClaim; never DaemonSet or mirror pods), which an escalated incident evicts.

Containment writes only what Sickbay owns: the node condition `GPUDevicesAvailable`, its
NoSchedule taint `sickbay.dev/gpus-vanished` (or a cordon), each marked with the workflow id,
so release never undoes what someone else did.

The plugin restart is once per attempt across retries and worker crashes: before deleting, it
records on the Node (`sickbay.dev/plugin-restart`) the attempt and the UIDs of the pods it is
about to delete; a retry of the same attempt deletes only those pods still there (never the
ones their DaemonSet brought back since).
"""

from __future__ import annotations

import asyncio
import contextvars
import json
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime, timedelta
from typing import Any, TypeVar

from temporalio import activity
from temporalio.exceptions import ApplicationError

from activities.defn import implements
from activities.kube.client import ErrorKind, Kube, KubeError, to_application_error
from activities.kube.devices import (
    REPLICAS_LABEL,
    list_slice_devices,
    mig_instances,
    mig_repartition,
    node_gpu_uuids,
    node_pool_of,
    offered_gpus,
    planned_outage,
    withholds_every_gpu,
)
from activities.kube.nodes import ANN_CORDONED_BY, converge_node, cordon_change, read_node
from activities.kube.pods import OwnerResolver, meta, requests_gpu
from activities.waiting import still_waiting
from contract.errors import ERR_INVALID_INPUT
from contract.kube import OwnerRef, PodRef
from contract.names import (
    ANN_PLUGIN_RESTART,
    NODE_TAINT_KEY,
)
from contract.node_incident import (
    CONDITION_GPU_DEVICES,
    CONTAIN_NODE_GPUS,
    DIAGNOSE_NODE_GPUS,
    FIND_GPU_PODS_ON_NODE,
    RELEASE_NODE_GPUS,
    RESTART_GPU_PLUGIN,
    RESTARTABLE_CAUSES,
    WAIT_FOR_GPUS_BACK,
    ContainNodeInput,
    ContainNodeResult,
    DiagnoseNodeInput,
    GpuPodsInput,
    GpuPodsResult,
    GpusBackResult,
    NodeDiagnosis,
    PluginPod,
    ReleaseNodeInput,
    RestartPluginInput,
    RestartPluginResult,
    WaitGpusBackInput,
)

T = TypeVar("T")

GPU_COUNT_LABEL = "nvidia.com/gpu.count"
ANN_NODE_TAINT_BY = "sickbay.dev/gpus-vanished-by"  # the workflow that set NODE_TAINT_KEY
# Label selectors of the pods that publish a node's GPUs (NVIDIA device plugin Helm chart and
# GPU Operator; NVIDIA DRA driver chart) and of the GPU Operator's validator.
PLUGIN_SELECTORS: tuple[tuple[str, str], ...] = (
    ("device-plugin", "app=nvidia-device-plugin-daemonset"),
    ("device-plugin", "app.kubernetes.io/name=nvidia-device-plugin"),
    ("dra-kubelet-plugin", "app.kubernetes.io/name=nvidia-dra-driver-gpu"),
    ("validator", "app=nvidia-operator-validator"),
)
RESTARTED_COMPONENTS = ("device-plugin", "dra-kubelet-plugin")
MAX_EVENTS = 5  # per pod, newest last: enough to name the error, short enough for a page


def _int(value: Any) -> int | None:
    try:
        return int(str(value)) if value is not None else None
    except ValueError:
        return None


def _short(version: str) -> str:
    return version or "?"


# ---- reading ------------------------------------------------------------------------------


def plugin_pods(kube: Kube, node: str) -> list[tuple[str, dict[str, Any]]]:
    """(component, pod) of every GPU plugin / validator pod bound to `node`."""
    seen: set[str] = set()
    out: list[tuple[str, dict[str, Any]]] = []
    for component, selector in PLUGIN_SELECTORS:
        body = kube.call(
            kube.core.list_pod_for_all_namespaces,
            verb="list",
            resource="pods",
            label_selector=selector,
            field_selector=f"spec.nodeName={node}",
        )
        for pod in body.get("items") or []:
            uid = meta(pod).get("uid", "")
            if uid in seen or meta(pod).get("deletionTimestamp"):
                continue
            seen.add(uid)
            out.append((component, pod))
    return out


def _pod_events(kube: Kube, pod: dict[str, Any]) -> list[str]:
    m = meta(pod)
    body = kube.call(
        kube.core.list_namespaced_event,
        m.get("namespace", ""),
        verb="list",
        resource="events",
        field_selector=f"involvedObject.name={m.get('name', '')}",
    )
    items = sorted(
        body.get("items") or [],
        key=lambda e: str(e.get("lastTimestamp") or e.get("eventTime") or ""),
    )
    out = []
    for e in items[-MAX_EVENTS:]:
        count = int(e.get("count") or 1)
        line = f"{e.get('reason', '')}: {e.get('message', '')}"
        out.append(line + (f" (x{count})" if count > 1 else ""))
    return out


def describe_pod(kube: Kube, component: str, pod: dict[str, Any]) -> PluginPod:
    m, spec, status = meta(pod), pod.get("spec") or {}, pod.get("status") or {}
    statuses = list(status.get("initContainerStatuses") or []) + list(
        status.get("containerStatuses") or []
    )
    ready = all(bool(cs.get("ready")) for cs in status.get("containerStatuses") or []) and bool(
        status.get("containerStatuses")
    )
    waiting_reason = waiting_message = last_reason = ""
    last_code: int | None = None
    restarts = 0
    for cs in statuses:
        restarts += int(cs.get("restartCount") or 0)
        waiting = (cs.get("state") or {}).get("waiting") or {}
        if waiting and not waiting_reason:
            waiting_reason = str(waiting.get("reason") or "")
            waiting_message = str(waiting.get("message") or "")
        term = (cs.get("lastState") or {}).get("terminated") or (cs.get("state") or {}).get(
            "terminated"
        )
        if term and last_code is None:
            last_reason = str(term.get("reason") or "")
            last_code = _int(term.get("exitCode"))
            if term.get("message"):
                waiting_message = waiting_message or str(term["message"]).strip()
                last_reason = f"{last_reason}: {str(term['message']).strip()}"
    return PluginPod(
        namespace=m.get("namespace", ""),
        name=m.get("name", ""),
        component=component,  # type: ignore[arg-type]
        phase=str(status.get("phase") or ""),
        ready=ready,
        restarts=restarts,
        waiting_reason=waiting_reason,
        waiting_message=waiting_message[:500],
        last_terminated_reason=last_reason[:500],
        last_exit_code=last_code,
        runtime_class=str(spec.get("runtimeClassName") or ""),
        events=[e[:300] for e in _pod_events(kube, pod)],
    )


def _published(kube: Kube, node: str) -> tuple[bool, list[str]]:
    """(DRA served, physical GPU UUIDs the node's ResourceSlices publish)."""
    try:
        devices = list_slice_devices(kube, node, fresh=True)
    except KubeError as err:
        if err.kind is ErrorKind.NOT_FOUND:
            return False, []
        raise
    return True, sorted({d.physical_uuid for d in devices if d.physical_uuid})


def _short_of_gpus(node: dict[str, Any], since: datetime) -> bool:
    """The node lacks GPUs now (capacity below its count label, with no MIG instances offered
    apart; or none of them offered: a stopped device plugin's in the kubelet's grace), or
    Sickbay marked it GPUDevicesAvailable=False at or after `since`; never while its GPUs are
    away on purpose (`planned_outage`: an autoscaler removing it, a driver upgrade at work) or
    the MIG manager repartitions them."""
    status = node.get("status") or {}
    if planned_outage(node) or mig_repartition(node):  # planned: no GPU lost
        return False
    capacity = offered_gpus(node)
    expected = _int((meta(node).get("labels") or {}).get(GPU_COUNT_LABEL))
    if capacity is not None and expected is not None and capacity < expected:
        if not mig_instances(node):  # MIG instances offered apart count GPUs not in capacity
            return True
    if withholds_every_gpu(node):
        return True
    for c in status.get("conditions") or []:
        if c.get("type") == CONDITION_GPU_DEVICES and c.get("status") == "False":
            try:
                at = datetime.fromisoformat(str(c.get("lastTransitionTime")).replace("Z", "+00:00"))
            except ValueError:
                return True
            return at >= since
    return False


def _peers(
    kube: Kube, node: dict[str, Any], pool: str | None, window: timedelta
) -> tuple[dict[str, int], list[str]]:
    """(kubelet version -> other nodes of the pool, the other nodes short of GPUs)."""
    if not pool:
        return {}, []
    body = kube.call(kube.core.list_node, verb="list", resource="nodes")
    versions: dict[str, int] = {}
    short: list[str] = []
    name = meta(node).get("name")
    since = datetime.now(UTC) - window
    for other in body.get("items") or []:
        other_name = meta(other).get("name")
        if other_name == name or node_pool_of(other) != pool:
            continue
        version = ((other.get("status") or {}).get("nodeInfo") or {}).get("kubeletVersion", "")
        versions[version] = versions.get(version, 0) + 1
        if _short_of_gpus(other, since):
            short.append(str(other_name))
    return versions, sorted(short)


def _runtime_class(kube: Kube, name: str) -> bool | None:
    """Whether RuntimeClass `name` exists; None when it cannot be read (not served, 403)."""
    if not name:
        return None
    try:
        kube.get_path(f"/apis/node.k8s.io/v1/runtimeclasses/{name}", resource="runtimeclasses")
    except KubeError as err:
        if err.kind is ErrorKind.NOT_FOUND and "runtimeclasses" in str(err.message or ""):
            return False
        return None
    return True


def _text(pods: list[PluginPod]) -> str:
    """What the pods that are not Ready say now: a Ready pod's Events and last termination are
    history (an earlier break, healed since) and must not name today's cause."""
    return " ".join(
        " ".join([p.waiting_reason, p.waiting_message, p.last_terminated_reason, *p.events])
        for p in pods
        if not p.ready
    ).lower()


def classify(d: NodeDiagnosis) -> tuple[str, bool, str]:
    """(cause, restartable, plain words) from what the diagnosis read."""
    plugins = [p for p in d.plugin_pods if p.component != "validator"]
    text = _text(d.plugin_pods)
    where = f"node {d.node}"
    change = ""
    rec = d.recorded
    if rec and rec.kubelet_version and rec.kubelet_version != d.kubelet_version:
        change = (
            f" since its kubelet went from {_short(rec.kubelet_version)} to "
            f"{_short(d.kubelet_version)}"
        )
    elif rec and rec.runtime_version and rec.runtime_version != d.runtime_version:
        change = (
            f" since its container runtime went from {_short(rec.runtime_version)} to "
            f"{_short(d.runtime_version)}"
        )
    others = sum(n for v, n in d.peers.items() if v != d.kubelet_version)
    if not change and others and d.kubelet_version:
        change = f" (its kubelet {d.kubelet_version} differs from the rest of its pool)"
    peers = ""
    if d.peers:
        parts = [
            f"{n} other node{'s' if n != 1 else ''} of the pool run{'s' if n == 1 else ''} {v}"
            for v, n in sorted(d.peers.items())
        ]
        peers = "; " + ", ".join(parts)
    if (
        "nvidia-container-toolkit" in text
        or "error running hook" in text
        or "error executing hook" in text
    ):
        cause, restartable = "toolkit-hook", False
        words = f"the NVIDIA container toolkit hook fails on {where}{change}{peers}: the GPU plugin cannot start (CreateContainerError)"
    elif "libnvidia-ml" in text or "nvml" in text or "incompatible platform" in text:
        cause, restartable = "nvml-missing", False
        words = f"the GPU plugin on {where} cannot load NVML (libnvidia-ml.so.1){change}{peers}: the driver libraries are not visible to containers"
    elif not plugins:
        cause, restartable = "plugin-missing", False
        words = f"no GPU device plugin or DRA kubelet plugin pod runs on {where}{change}{peers}"
    elif any(p.waiting_reason == "CrashLoopBackOff" for p in plugins):
        cause, restartable = "plugin-crashloop", True
        words = f"the GPU plugin on {where} crash-loops{change}{peers}"
    elif all(p.ready for p in plugins) and d.vanished:
        if d.mode == "dra":
            cause = "driver-not-publishing"
            words = f"the DRA driver on {where} is Ready but publishes fewer GPUs than the node has{change}{peers}: it lost its registration with the kubelet"
        else:
            cause = "plugin-not-registered"
            words = f"the device plugin on {where} is Ready but the kubelet lists no GPUs{change}{peers}: the plugin lost its kubelet socket and did not register again"
        restartable = True
    elif not all(p.ready for p in plugins):
        cause, restartable = "plugin-not-ready", True
        words = f"the GPU plugin on {where} is not Ready{change}{peers}"
    else:
        cause, restartable = "unknown", False
        words = f"{where} has fewer GPUs than expected and no GPU plugin problem shows in the API{change}{peers}"
    return cause, restartable and cause in RESTARTABLE_CAUSES, words


def diagnose_node(kube: Kube, inp: DiagnoseNodeInput) -> NodeDiagnosis:
    node = read_node(kube, inp.node)
    labels = meta(node).get("labels") or {}
    status = node.get("status") or {}
    info = status.get("nodeInfo") or {}
    capacity, allocatable = offered_gpus(node), offered_gpus(node, "allocatable")
    dra, uuids = _published(kube, inp.node)
    mode = "dra" if dra and (uuids or capacity is None) else "device-plugin"
    if capacity is None and not dra:
        mode = "unknown"
    expected = inp.expected_gpus or _int(labels.get(GPU_COUNT_LABEL))
    if expected is None and inp.recorded and inp.recorded.gpu_count:
        expected = inp.recorded.gpu_count
    pods = [describe_pod(kube, c, p) for c, p in plugin_pods(kube, inp.node)]
    plugins = [p for p in pods if p.component != "validator"]
    # The kubelet keeps a stopped device plugin's GPUs in capacity (none allocatable) for a
    # grace period: while its plugin is not Ready, the capacity counts GPUs nobody offers.
    withheld = (
        mode == "device-plugin" and withholds_every_gpu(node) and any(not p.ready for p in plugins)
    )
    # MIG instances offered apart (`mixed` strategy): nvidia.com/gpu counts only the whole
    # GPUs, so it is not compared with the count; only "nothing offered at all" is.
    mig = mig_instances(node) if mode == "device-plugin" else None
    if mode == "device-plugin":
        visible = allocatable if allocatable is not None else (capacity or 0)
        uuids = node_gpu_uuids(node)[:visible] if visible else []
        have = 0 if withheld else capacity or 0
    else:
        have = len(uuids)
    short = expected is not None and have < expected and not mig
    reconfiguring = mig_repartition(node)  # planned: the GPU plugins stopped on purpose
    planned = planned_outage(node)  # its GPUs go with the node, or a driver upgrade took them
    lost = short or any(not p.ready for p in plugins)
    vanished = lost and not reconfiguring and not planned
    pool = node_pool_of(node)
    peers, pool_vanished = _peers(kube, node, pool, inp.pool_window)
    d = NodeDiagnosis(
        node=inp.node,
        node_pool=pool,
        mode=mode,  # type: ignore[arg-type]
        expected_gpus=expected,
        capacity=capacity,
        allocatable=allocatable,
        published=len(uuids) if mode == "dra" else None,
        gpu_uuids=uuids,
        kubelet_version=str(info.get("kubeletVersion") or ""),
        runtime_version=str(info.get("containerRuntimeVersion") or ""),
        recorded=inp.recorded,
        peers=peers,
        pool_vanished=pool_vanished,
        plugin_pods=pods,
        vanished=vanished,
    )
    runtime_class = next((p.runtime_class for p in plugins if p.runtime_class), "")
    d = d.model_copy(
        update={
            "runtime_class": runtime_class,
            "runtime_class_found": _runtime_class(kube, runtime_class),
        }
    )
    published = f"{have} GPU(s)"
    replicas = str(labels.get(REPLICAS_LABEL) or "1")
    if mode == "device-plugin" and replicas != "1":  # time-slicing / MPS: replicas offered
        published = f"{have} GPU replica(s) ({replicas} per GPU)"
    if mig:
        published = f"{have} whole GPU(s) and {mig} MIG instance(s) (mig.strategy mixed)"
    if reconfiguring:
        return d.model_copy(
            update={
                "summary": f"node {inp.node}: {reconfiguring}; it publishes {published} meanwhile",
                # GPUs gone under it: the incident waits for it (bounded), never acts on it
                "planned_work": reconfiguring if lost and not planned else "",
            }
        )
    if planned:
        return d.model_copy(
            update={"summary": f"{planned}: it publishes {published} meanwhile; nothing to heal"}
        )
    if not vanished:
        return d.model_copy(
            update={"summary": f"node {inp.node} publishes {published} and its plugin is Ready"}
        )
    cause, restartable, words = classify(d)
    if d.runtime_class and d.runtime_class_found is False:
        words += f"; RuntimeClass {d.runtime_class} the plugin names does not exist"
    got = f"{have} of {expected}" if expected is not None else str(have)
    if mig:
        got = f"{published} published"
    elif withheld:
        got += (
            f" GPUs offered; the kubelet still counts {capacity} for up to 5 minutes after "
            "its plugin stopped"
        )
    else:
        got += " GPUs published"
    return d.model_copy(
        update={"cause": cause, "restartable": restartable, "summary": f"{words} ({got})"}
    )


# ---- containment --------------------------------------------------------------------------


def _condition(status: bool, reason: str, message: str) -> dict[str, Any]:
    now = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    return {
        "type": CONDITION_GPU_DEVICES,
        "status": "True" if status else "False",
        "reason": reason,
        "message": message[:1000],
        "lastHeartbeatTime": now,
        "lastTransitionTime": now,
    }


def _set_condition(kube: Kube, node: str, cond: dict[str, Any]) -> bool:
    current = read_node(kube, node)
    for c in (current.get("status") or {}).get("conditions") or []:
        if (
            c.get("type") == cond["type"]
            and c.get("status") == cond["status"]
            and c.get("reason") == cond["reason"]
            and c.get("message") == cond["message"]
        ):
            return False
    # Strategic merge on status.conditions merges by `type`: the kubelet's own stay.
    kube.call(
        kube.core.patch_node_status,
        node,
        {"status": {"conditions": [cond]}},
        verb="patch",
        resource="nodes/status",
        name=node,
    )
    return True


def _taint_change(workflow_id: str, add: bool) -> Callable[[dict[str, Any]], dict[str, Any] | None]:
    def change(node: dict[str, Any]) -> dict[str, Any] | None:
        taints = list((node.get("spec") or {}).get("taints") or [])
        has = any(t.get("key") == NODE_TAINT_KEY for t in taints)
        owner = (meta(node).get("annotations") or {}).get(ANN_NODE_TAINT_BY)
        if add:
            if has:
                return None
            taints.append({"key": NODE_TAINT_KEY, "value": "true", "effect": "NoSchedule"})
            return {
                "metadata": {"annotations": {ANN_NODE_TAINT_BY: workflow_id}},
                "spec": {"taints": taints},
            }
        if not has or owner != workflow_id:
            return None  # not ours: leave it
        return {
            "metadata": {"annotations": {ANN_NODE_TAINT_BY: None}},
            "spec": {"taints": [t for t in taints if t.get("key") != NODE_TAINT_KEY]},
        }

    return change


def contain_node(kube: Kube, inp: ContainNodeInput) -> ContainNodeResult:
    if inp.dry_run:
        return ContainNodeResult(changed=False, detail=f"dry run: would {inp.mode} {inp.node}")
    done: list[str] = []
    if _set_condition(kube, inp.node, _condition(False, inp.reason, inp.message)):
        done.append(f"condition {CONDITION_GPU_DEVICES}=False ({inp.reason})")
    if inp.mode == "taint":
        _, changed = converge_node(kube, inp.node, _taint_change(inp.workflow_id, add=True))
        if changed:
            done.append(f"taint {NODE_TAINT_KEY}:NoSchedule")
    elif inp.mode == "cordon":
        outcome: dict[str, str] = {}
        _, changed = converge_node(kube, inp.node, cordon_change(True, inp.workflow_id, outcome))
        if changed:
            done.append("cordoned")
    return ContainNodeResult(changed=bool(done), detail=", ".join(done) or "already contained")


def release_node(kube: Kube, inp: ReleaseNodeInput) -> ContainNodeResult:
    if inp.dry_run:
        return ContainNodeResult(changed=False, detail="dry run")
    done: list[str] = []
    node = read_node(kube, inp.node)
    conds = (node.get("status") or {}).get("conditions") or []
    if any(c.get("type") == CONDITION_GPU_DEVICES for c in conds):
        cond = _condition(True, "GPUsPublished", inp.message or "the node's GPUs are published")
        if _set_condition(kube, inp.node, cond):
            done.append(f"condition {CONDITION_GPU_DEVICES}=True")
    _, changed = converge_node(kube, inp.node, _taint_change(inp.workflow_id, add=False))
    if changed:
        done.append(f"taint {NODE_TAINT_KEY} removed")
    if (meta(read_node(kube, inp.node)).get("annotations") or {}).get(
        ANN_CORDONED_BY
    ) == inp.workflow_id:
        outcome: dict[str, str] = {}
        _, changed = converge_node(kube, inp.node, cordon_change(False, inp.workflow_id, outcome))
        if changed:
            done.append("uncordoned")
    return ContainNodeResult(changed=bool(done), detail=", ".join(done) or "nothing to undo")


# ---- the workloads whose GPUs vanished ---------------------------------------------------


def _holds_gpu(pod: dict[str, Any]) -> bool:
    """A ResourceClaim, or a device-plugin GPU, replica or MIG instance."""
    return bool((pod.get("spec") or {}).get("resourceClaims")) or requests_gpu(pod)


def gpu_pods(kube: Kube, inp: GpuPodsInput) -> GpuPodsResult:
    body = kube.call(
        kube.core.list_pod_for_all_namespaces,
        verb="list",
        resource="pods",
        field_selector=f"spec.nodeName={inp.node}",
    )
    refs: list[PodRef] = []
    owners: dict[tuple[str, str, str], OwnerRef] = {}
    bare: list[PodRef] = []
    resolver = OwnerResolver(kube)
    for pod in body.get("items") or []:
        m = meta(pod)
        phase = (pod.get("status") or {}).get("phase")
        if phase in ("Succeeded", "Failed") or m.get("deletionTimestamp"):
            continue
        if m.get("namespace") in inp.ignore_namespaces:
            continue
        if "kubernetes.io/config.mirror" in (m.get("annotations") or {}) or any(
            o.get("kind") == "DaemonSet" for o in m.get("ownerReferences") or []
        ):
            continue
        if _holds_gpu(pod):
            ref = PodRef(namespace=m.get("namespace", ""), name=m.get("name", ""), uid=m.get("uid"))
            refs.append(ref)
            direct, top = resolver.owners(pod)
            owner = top or direct
            if owner is None:
                bare.append(ref)
            else:
                owners.setdefault((owner.kind, owner.namespace, owner.name), owner)
    return GpuPodsResult(
        pods=sorted(refs, key=_pod_key),
        owners=sorted(owners.values(), key=lambda o: (o.namespace, o.kind, o.name)),
        bare=sorted(bare, key=_pod_key),
    )


def _pod_key(p: PodRef) -> tuple[str, str]:
    return p.namespace, p.name


# ---- the plugin restart -------------------------------------------------------------------


def restart_plugin(kube: Kube, inp: RestartPluginInput) -> RestartPluginResult:
    key = f"{inp.workflow_id}/{inp.attempt}"
    pods = [(c, p) for c, p in plugin_pods(kube, inp.node) if c in RESTARTED_COMPONENTS]
    if inp.dry_run:
        names = [f"{meta(p)['namespace']}/{meta(p)['name']}" for _, p in pods]
        return RestartPluginResult(detail=f"dry run: would delete {', '.join(names) or 'nothing'}")
    node = read_node(kube, inp.node)
    raw = (meta(node).get("annotations") or {}).get(ANN_PLUGIN_RESTART) or ""
    try:
        record = json.loads(raw) if raw else {}
    except ValueError:
        record = {}
    already = record.get("key") == key
    if already:
        # A retry of this attempt (a worker crashed mid-way): only the pods it chose, if any
        # of them is still there; a pod the DaemonSet brought back since is never deleted.
        chosen = set(record.get("uids") or [])
        pods = [(c, p) for c, p in pods if meta(p).get("uid") in chosen]
    else:
        record = {"key": key, "uids": [meta(p).get("uid") for _, p in pods]}
        value = json.dumps(record, separators=(",", ":"))
        converge_node(
            kube,
            inp.node,
            lambda n: {"metadata": {"annotations": {ANN_PLUGIN_RESTART: value}}},
            node=node,
        )
    deleted: list[str] = []
    for _, pod in pods:
        m = meta(pod)
        try:
            kube.call(
                kube.core.delete_namespaced_pod,
                m["name"],
                m["namespace"],
                verb="delete",
                resource="pods",
                name=m["name"],
                body={"preconditions": {"uid": m.get("uid")}},
            )
        except KubeError as err:
            if err.kind not in (ErrorKind.NOT_FOUND, ErrorKind.CONFLICT):
                raise
            continue
        deleted.append(f"{m['namespace']}/{m['name']}")
    if not record.get("uids"):
        detail = "no GPU plugin pod on the node to restart"
    elif deleted:
        detail = f"deleted {', '.join(deleted)} (its DaemonSet starts a new one)"
    else:
        detail = "this attempt's restart was already done"
    return RestartPluginResult(restarted=deleted, already=already, detail=detail)


def wait_gpus_back(kube: Kube, inp: WaitGpusBackInput) -> GpusBackResult:
    """The node publishes at least `expected_gpus` GPUs again and its plugin pods are Ready;
    a retryable StillWaiting until then (the workflow bounds it with schedule_to_close)."""
    node = read_node(kube, inp.node)
    dra, uuids = _published(kube, inp.node)
    capacity = offered_gpus(node)
    mode = "dra" if dra and uuids else ("device-plugin" if capacity is not None else "dra")
    if mode == "device-plugin":
        allocatable = offered_gpus(node, "allocatable", per_gpu=True)
        uuids = node_gpu_uuids(node)[: allocatable or 0]
        have = allocatable or 0
    else:
        have = len(uuids)
    pods = [describe_pod(kube, c, p) for c, p in plugin_pods(kube, inp.node)]
    not_ready = [
        f"{p.namespace}/{p.name}" for p in pods if p.component != "validator" and not p.ready
    ]
    if have < inp.expected_gpus or not_ready:
        waiting = f"{have} of {inp.expected_gpus} GPUs published"
        if not_ready:
            waiting += f"; plugin not Ready: {', '.join(not_ready)}"
        raise still_waiting(f"node {inp.node}: {waiting}")
    driver = None
    devices: dict[str, str] = {}
    if mode == "dra":
        for d in list_slice_devices(kube, inp.node, fresh=True):
            if d.physical_uuid and d.physical_uuid not in devices:
                devices[d.physical_uuid] = f"{d.pool}/{d.device}"
                driver = d.driver
    return GpusBackResult(
        node=inp.node,
        gpu_uuids=sorted(uuids),
        mode=mode,
        driver=driver,
        devices=devices,  # type: ignore[arg-type]
    )


# ---- activities ---------------------------------------------------------------------------


class NodeIncidentActivities:
    """The node incident's activities on one `Kube` client, with a small executor of its own
    so the blocking client never runs on the event loop."""

    def __init__(self, kube: Kube, max_threads: int = 4) -> None:
        self._kube = kube
        self._executor = ThreadPoolExecutor(max_workers=max_threads, thread_name_prefix="node")

    def all(self) -> list[Callable[..., Any]]:
        return [
            self.diagnose_node,
            self.contain_node,
            self.release_node,
            self.restart_gpu_plugin,
            self.wait_for_gpus_back,
            self.find_gpu_pods,
        ]

    def close(self) -> None:
        self._executor.shutdown(wait=False, cancel_futures=True)

    async def _run(self, fn: Callable[..., T], *args: Any) -> T:
        ctx = contextvars.copy_context()
        loop = asyncio.get_running_loop()
        try:
            return await loop.run_in_executor(self._executor, lambda: ctx.run(fn, *args))
        except KubeError as err:
            raise to_application_error(err) from err

    @staticmethod
    def _need_node(node: str) -> None:
        if not node:
            raise ApplicationError(
                "a node incident activity needs the node",
                type=ERR_INVALID_INPUT,
                non_retryable=True,
            )

    @implements(DIAGNOSE_NODE_GPUS)
    async def diagnose_node(self, inp: DiagnoseNodeInput) -> NodeDiagnosis:
        self._need_node(inp.node)
        d = await self._run(diagnose_node, self._kube, inp)
        activity.logger.info("node %s: %s", inp.node, d.summary)
        return d

    @implements(CONTAIN_NODE_GPUS)
    async def contain_node(self, inp: ContainNodeInput) -> ContainNodeResult:
        self._need_node(inp.node)
        return await self._run(contain_node, self._kube, inp)

    @implements(RELEASE_NODE_GPUS)
    async def release_node(self, inp: ReleaseNodeInput) -> ContainNodeResult:
        self._need_node(inp.node)
        return await self._run(release_node, self._kube, inp)

    @implements(RESTART_GPU_PLUGIN)
    async def restart_gpu_plugin(self, inp: RestartPluginInput) -> RestartPluginResult:
        self._need_node(inp.node)
        res = await self._run(restart_plugin, self._kube, inp)
        activity.logger.info("node %s: plugin restart: %s", inp.node, res.detail)
        return res

    @implements(FIND_GPU_PODS_ON_NODE)
    async def find_gpu_pods(self, inp: GpuPodsInput) -> GpuPodsResult:
        self._need_node(inp.node)
        return await self._run(gpu_pods, self._kube, inp)

    @implements(WAIT_FOR_GPUS_BACK)
    async def wait_for_gpus_back(self, inp: WaitGpusBackInput) -> GpusBackResult:
        self._need_node(inp.node)
        return await self._run(wait_gpus_back, self._kube, inp)
