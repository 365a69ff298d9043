"""`sweep-cluster`: find unhealthy GPUs that no alert named, straight from the Kubernetes API.

Three read-only checks, each a paginated LIST (no watches: the sweep runs every few minutes):

1. Pods: `status.containerStatuses[].allocatedResourcesStatus[].resources[]` with health
   `Unhealthy` (or `Unknown`; the workflow re-checks those after a timeout). For DRA the
   kubelet writes the driver's first CDI device id as `resourceID` (NVIDIA's driver returns
   one) and `<driver>/<pool>/<device>` only without: an id that is no slice device is resolved
   through the entry's `claim:<claim>[/<request>]` name, the pod's ResourceClaim and its
   allocation (activities/kube/health.py; one claim list per sweep, only when needed), then
   mapped to node + GPU UUID through the ResourceSlice device's uuid attribute. For the device
   plugin it is the device id (the GPU UUID, with a `::<n>` suffix for time-sliced replicas)
   on the pod's node. An entry that still cannot be mapped is logged as a WARNING and
   reported as `unresolved` (naming the pod and the id), which the sweep workflow notifies.
2. ResourceSlices: device taints a DRA driver set (`spec.devices[].taints[]`, e.g. the NVIDIA
   driver's `gpu.nvidia.com/xid=79`). DeviceTaintRules are not written into slices, so
   Sickbay's own quarantines never show up here.
3. Nodes: capacity below the GPU feature discovery count label, or fewer GPUs in the node's
   ResourceSlices (GPUs vanished, most often after an upgrade broke the plugin: `vanished`,
   one node incident, workflows/node_incident/), or allocatable `nvidia.com/gpu` below
   capacity (notified). Node-level findings with no UUID: never a taint. A vanished node's
   pods report its GPUs Unknown (or name devices it no longer publishes): those are dropped,
   the node incident owns them, never a per-GPU remediation.
   On a HAMi node (`hami.io/node-nvidia-register`): a GPU its device plugin registers with
   `health` false is a device finding (`hami-health`, like a driver taint); fewer GPUs
   registered than the count label is a vanished GPU (the node incident's), and a
   registration Sickbay cannot read is a node-level finding.

Findings are merged per physical GPU (`node/uuid`; MIG and vGPU devices are folded into their
parent via the `parentUUID` attribute), worst health first, so one device = one finding.

The per-object steps (`slice_devices`, `check_pod`, `check_slice_taints`, `node_finding`) are
what the health watcher (worker/watcher.py) runs on every watch event, so a watched change and
a sweep produce the same finding for the same state.
"""

from __future__ import annotations

import asyncio
import logging
import re
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

from activities.defn import implements
from activities.kube import hami
from activities.kube.client import ErrorKind, Kube, KubeError, to_application_error
from activities.kube.devices import (
    GPU_RESOURCE,
    SHARED_RESOURCE,
    mig_instances,
    mig_repartition,
    offered_gpus,
    planned_outage,
    withholds_every_gpu,
)
from activities.kube.evidence import HAMI_UNHEALTHY
from activities.kube.health import (
    ClaimIndex,
    ClaimLookup,
    claim_of_pod,
    is_claim_entry,
    parse_entry_name,
    resolve_entry,
)
from contract.kube import PodRef, SliceTaint
from contract.names import TAINT_KEY
from contract.sweep import SWEEP_CLUSTER, SweepClusterInput, SweepFinding, SweepReport

log = logging.getLogger(__name__)

GPU_COUNT_LABEL = "nvidia.com/gpu.count"  # set by GPU feature discovery
POD_FIELD_SELECTOR = "spec.nodeName!=,status.phase!=Succeeded,status.phase!=Failed"
_XID = re.compile(r"xid\D{0,3}(\d{1,5})", re.IGNORECASE)
_RANK = {"Unhealthy": 2, "Unknown": 1}


@dataclass
class SliceDevice:
    node: str
    uuid: str  # the physical GPU's UUID (parent for MIG / vGPU devices)
    taints: list[dict[str, Any]] = field(default_factory=list)


def _attr_value(attr: Any) -> str:
    if isinstance(attr, dict):
        for kind in ("string", "version", "int", "bool"):
            if kind in attr and attr[kind] is not None:
                return str(attr[kind])
        return ""
    return str(attr) if attr is not None else ""


def _find_attr(attrs: dict[str, Any], names: tuple[str, ...]) -> str:
    """An attribute by bare name or qualified (`gpu.nvidia.com/uuid`), case-insensitive."""
    wanted = {n.lower() for n in names}
    for key, attr in attrs.items():
        bare = key.rsplit("/", 1)[-1].lower()
        if bare in wanted:
            value = _attr_value(attr).strip()
            if value:
                return value
    return ""


def _xid(text: str) -> int | None:
    match = _XID.search(text or "")
    return int(match.group(1)) if match else None


def _quantity(value: Any) -> int | None:
    try:
        return int(str(value))
    except (TypeError, ValueError):
        return None


class SweepActivities:
    def __init__(
        self,
        kube: Kube,
        *,
        uuid_attributes: tuple[str, ...] = ("uuid",),
        parent_uuid_attributes: tuple[str, ...] = ("parentUUID", "parent_uuid"),
        page_size: int = 500,
    ) -> None:
        self._kube = kube
        self._uuid_attributes = uuid_attributes
        self._parent_attributes = parent_uuid_attributes
        self._page_size = page_size

    @implements(SWEEP_CLUSTER)
    async def sweep_cluster(self, req: SweepClusterInput) -> SweepReport:
        # The client is blocking: run it on a thread so the worker's event loop stays free.
        try:
            return await asyncio.to_thread(self.sweep, req)
        except KubeError as err:
            raise to_application_error(err) from err

    # ----------------------------------------------------------------------------------------

    def sweep(self, req: SweepClusterInput) -> SweepReport:
        report = SweepReport()
        index: dict[str, SliceDevice] = {}
        if req.check_pods or req.check_slice_taints or req.check_nodes:
            index, report.slices_checked = self._slice_index()
        merged: dict[str, SweepFinding] = {}
        if req.check_pods:
            report.pods_checked = self._check_pods(index, merged, report)
        if req.check_slice_taints and not req.only_unknown:
            self.check_slice_taints(index, merged)
        vanished: set[str] = set()
        withheld: set[str] = set()
        plugins, report.nodes = report.nodes, []  # GPU plugin pods in error, from the pod list
        if req.check_nodes or req.only_unknown:
            checked, report.nodes_checked, withheld = self._check_nodes(index, merged)
            nodes = one_per_node(checked, plugins)
            vanished = {f.node for f in nodes if f.vanished and f.node}
            restarting = set(report.plugins_starting)
            for f in [f for f in nodes if _restart_in_progress(f, restarting)]:
                log.info(
                    "sweep: %s; not noticed: its GPU plugin pod is starting or being "
                    "replaced (a rollout), so none are offered until it registers (if it "
                    "never does, the kubelet drops them after its grace: a vanish)",
                    f.message,
                )
                nodes.remove(f)
            if not req.only_unknown:
                report.nodes = nodes
        findings = list(merged.values())
        if vanished or withheld:
            # A GPU that merely vanished with its node's plugin is the node incident's, never
            # a per-GPU remediation (nor a quarantine): its pods report it Unknown, or name a
            # device the node no longer publishes. So is an Unknown GPU of a node whose device
            # plugin offers none of its GPUs (stopped: the kubelet keeps the capacity for a
            # grace period, allocatable 0): the plugin's silence, not the GPU's failure.
            silent = vanished | withheld
            for f in findings:
                if f.node in withheld and f.health == "Unknown":
                    log.warning(
                        "sweep: %s Unknown on a node whose device plugin offers none of its "
                        "GPUs; not acting on it (the node's finding stands)",
                        f.key,
                    )
            findings = [f for f in findings if not (f.node in silent and f.health == "Unknown")]
            report.unresolved = [f for f in report.unresolved if f.node not in vanished]
        if req.only_unknown:
            keep = set(req.only_unknown)
            findings = [f for f in findings if f.key in keep]
        report.findings = sorted(findings, key=lambda f: f.key)
        log.info(
            "sweep: %d pods, %d slices, %d nodes checked; %d devices, %d unresolved, %d nodes",
            report.pods_checked,
            report.slices_checked,
            report.nodes_checked,
            len(report.findings),
            len(report.unresolved),
            len(report.nodes),
        )
        return report

    def _list(self, fn: Callable[..., Any], resource: str, **kwargs: Any) -> Iterator[dict]:
        token: str | None = None
        while True:
            body = self._kube.call(
                fn,
                verb="list",
                resource=resource,
                limit=self._page_size,
                _continue=token,
                **kwargs,
            )
            yield from body.get("items") or []
            token = (body.get("metadata") or {}).get("continue") or None
            if not token:
                return

    def _slice_index(self) -> tuple[dict[str, SliceDevice], int]:
        """resourceID `driver/pool/device` -> node + physical GPU UUID (+ driver taints)."""
        index: dict[str, SliceDevice] = {}
        count = 0
        try:
            for rs in self._list(self._kube.resource_v1.list_resource_slice, "resourceslices"):
                count += 1
                index.update(self.slice_devices(rs))
        except KubeError as err:
            if err.kind is ErrorKind.NOT_FOUND:  # resource.k8s.io/v1 not served: device plugin
                return {}, 0
            raise
        return index, count

    def slice_devices(self, rs: dict[str, Any]) -> dict[str, SliceDevice]:
        """One ResourceSlice's devices, by resourceID (the health watcher keeps these too)."""
        out: dict[str, SliceDevice] = {}
        spec = rs.get("spec") or {}
        driver = spec.get("driver") or ""
        pool = (spec.get("pool") or {}).get("name") or ""
        node = spec.get("nodeName") or pool
        for dev in spec.get("devices") or []:
            attrs = dev.get("attributes") or (dev.get("basic") or {}).get("attributes") or {}
            uuid = _find_attr(attrs, self._parent_attributes) or _find_attr(
                attrs, self._uuid_attributes
            )
            taints = dev.get("taints") or (dev.get("basic") or {}).get("taints") or []
            out[f"{driver}/{pool}/{dev.get('name', '')}"] = SliceDevice(
                node=node, uuid=uuid, taints=list(taints)
            )
        return out

    def _check_pods(
        self, index: dict[str, SliceDevice], merged: dict[str, SweepFinding], report: SweepReport
    ) -> int:
        pods = self._list(
            self._kube.core.list_pod_for_all_namespaces,
            "pods",
            # Only scheduled, non-terminal pods: health is not updated once a pod is terminal,
            # and an unscheduled pod holds no device. Cuts the listing on busy clusters.
            field_selector=POD_FIELD_SELECTOR,
        )
        # Read only when an entry's id is not a device key (CDI ids), once per sweep.
        return self.check_pods(pods, index, merged, report, ClaimIndex(self._claims))

    def check_pods(
        self,
        pods: Iterable[dict[str, Any]],
        index: dict[str, SliceDevice],
        merged: dict[str, SweepFinding],
        report: SweepReport,
        claims: ClaimLookup | None = None,
    ) -> int:
        """`check_pod` for each pod of one sweep run, with a WARNING per id it cannot map (a
        run reads every pod once; the health watcher, which sees a pod on every event, warns
        once per pod and id itself)."""
        count = 0
        for pod in pods:
            count += 1
            before = len(report.unresolved)
            self.check_pod(pod, index, merged, report, claims)
            plugin = plugin_pod_finding(pod)
            if plugin is not None:
                report.nodes.append(plugin)
            starting = plugin_pod_starting(pod)
            if starting is not None and starting not in report.plugins_starting:
                report.plugins_starting.append(starting)
            for u in report.unresolved[before:]:
                log.warning("sweep: %s", u.message)
        return count

    def _claims(self) -> list[dict[str, Any]]:
        return list(
            self._list(
                self._kube.resource_v1.list_resource_claim_for_all_namespaces,
                "resourceclaims.resource.k8s.io",
            )
        )

    def read_claim(self, namespace: str, name: str) -> dict[str, Any] | None:
        """One ResourceClaim, by a LIST selecting its name (the `list` grant the sweep has
        already; `metadata.name` is a field selector every resource serves)."""
        body = self._kube.call(
            self._kube.resource_v1.list_namespaced_resource_claim,
            namespace,
            verb="list",
            resource="resourceclaims.resource.k8s.io",
            field_selector=f"metadata.name={name}",
        )
        items = body.get("items") or []
        return items[0] if items else None

    def check_pod(
        self,
        pod: dict[str, Any],
        index: dict[str, SliceDevice],
        merged: dict[str, SweepFinding],
        report: SweepReport,
        claims: ClaimLookup | None = None,
    ) -> None:
        """One pod's unhealthy/unknown devices into `merged` (unmapped ids: `report.unresolved`).

        The sweep calls it for every listed pod (with one claim list shared by the sweep), the
        health watcher for every pod event (`claims` None: a CDI-shaped id's claim is read by
        name, only for an entry that is not Healthy)."""
        if claims is None:
            claims = self.read_claim
        meta, spec, status = (
            pod.get("metadata") or {},
            pod.get("spec") or {},
            pod.get("status") or {},
        )
        pod_node = spec.get("nodeName") or ""
        # Health is not updated once a pod is terminal, so its last report is stale.
        if not pod_node or status.get("phase") in ("Succeeded", "Failed"):
            return
        ref = PodRef(
            namespace=meta.get("namespace", ""), name=meta.get("name", ""), uid=meta.get("uid")
        )
        statuses = (status.get("containerStatuses") or []) + (
            status.get("initContainerStatuses") or []
        )
        for cs in statuses:
            for entry in cs.get("allocatedResourcesStatus") or []:
                entry_name = str(entry.get("name") or "")
                for res in entry.get("resources") or []:
                    health = res.get("health")
                    if health not in _RANK:
                        continue
                    rid = str(res.get("resourceID") or "")
                    finding, problem = self._pod_finding(
                        pod, entry_name, rid, health, res.get("message") or "", index, claims
                    )
                    if finding is None:
                        text = (
                            f"pod {ref.namespace}/{ref.name} reports {health} for "
                            f"{entry_name or '?'} resourceID {rid!r}, which Sickbay cannot "
                            f"map to a GPU: {problem}"
                        )
                        report.unresolved.append(
                            SweepFinding(
                                kind="pod-health",
                                resource_id=rid,
                                health=health,
                                node=pod_node,
                                message=text,
                                pods=[ref],
                            )
                        )
                        continue
                    finding.pods.append(ref)
                    merge_finding(merged, finding)

    def _pod_finding(
        self,
        pod: dict[str, Any],
        entry_name: str,
        rid: str,
        health: str,
        message: str,
        index: dict[str, SliceDevice],
        claims: ClaimLookup,
    ) -> tuple[SweepFinding | None, str]:
        """The GPU a health resource is about, or (None, why not)."""
        pod_node = (pod.get("spec") or {}).get("nodeName") or ""
        key = rid
        if (
            rid not in index
            and is_claim_entry(entry_name)
            and claim_of_pod(pod, parse_entry_name(entry_name)[0]) is not None
        ):
            # The 1.36 kubelet writes the driver's first CDI device id when it returned one
            # (NVIDIA's driver does): the claim's allocation says which device it is.
            resolved = resolve_entry(pod, entry_name, rid, claims)
            if resolved.device is None:
                return None, resolved.problem
            key = resolved.device
        dev = index.get(key)
        if dev is not None and dev.uuid:
            node, uuid = dev.node, dev.uuid
        elif dev is not None:
            return None, f"device {key} publishes no uuid attribute"
        elif rid.upper().startswith("MIG-") and "/" not in rid:
            # Device plugin, MIG: the id is the MIG instance's own UUID; no resource says
            # which GPU it is on (the DCGM alert names the GPU).
            return None, f"MIG instance {rid}: the device plugin's id names no GPU"
        elif "/" not in rid and rid:
            # Device plugin: the id is the GPU UUID; time-slicing appends `::<replica>`,
            # HAMi `-<share>`: its placement record says which GPU the share is of.
            node, uuid = pod_node, rid.split("::", 1)[0]
            try:
                shares = hami.pod_shares(pod)
            except hami.HamiFormatError as err:
                return None, str(err)
            if shares is not None:
                uuid = next((x.uuid for x in shares if hami.is_share_of(rid, x.uuid)), "")
                if not uuid:
                    return None, f"HAMi's record on the pod names no GPU of share {rid}"
        else:
            return None, f"device {key} is in no ResourceSlice"
        text = message or f"allocatedResourcesStatus {health}"
        return (
            SweepFinding(
                kind="pod-health",
                node=node,
                gpu_uuid=uuid,
                resource_id=key,
                health=health,  # type: ignore[arg-type]
                xid=_xid(message),
                message=text,
            ),
            "",
        )

    def check_slice_taints(
        self, index: dict[str, SliceDevice], merged: dict[str, SweepFinding]
    ) -> None:
        for rid, dev in index.items():
            for taint in dev.taints:
                effect = taint.get("effect")
                key = taint.get("key") or ""
                if effect not in ("NoSchedule", "NoExecute") or key == TAINT_KEY or not dev.uuid:
                    continue
                value = str(taint.get("value") or "")
                xid = _quantity(value) if key.endswith("/xid") else None
                merge_finding(
                    merged,
                    SweepFinding(
                        kind="slice-taint",
                        node=dev.node,
                        gpu_uuid=dev.uuid,
                        resource_id=rid,
                        health="Unhealthy",
                        xid=xid,
                        message=f"driver taint {key}={value}:{effect} on {rid}",
                        taint=SliceTaint(key=key, value=value, effect=effect, device=rid),
                    ),
                )

    def _check_nodes(
        self, index: dict[str, SliceDevice], merged: dict[str, SweepFinding]
    ) -> tuple[list[SweepFinding], int, set[str]]:
        """Node findings, how many nodes were read, and the nodes whose device plugin offers
        none of their GPUs (`withholds_every_gpu`)."""
        # Physical GPUs each node publishes in ResourceSlices (DRA clusters).
        published: dict[str, set[str]] = {}
        for dev in index.values():
            if dev.uuid:
                published.setdefault(dev.node, set()).add(dev.uuid)
        out: list[SweepFinding] = []
        withheld: set[str] = set()
        count = 0
        for node in self._list(self._kube.core.list_node, "nodes"):
            count += 1
            name = (node.get("metadata") or {}).get("name", "")
            finding = self.node_finding(node, len(published.get(name, ())), bool(index))
            if finding is not None:
                out.append(finding)
            if withholds_every_gpu(node):
                withheld.add(name)
            for device in self.hami_findings(node):
                merge_finding(merged, device)
        return out, count, withheld

    def hami_findings(self, node: dict[str, Any]) -> list[SweepFinding]:
        """HAMi's registration of a node's GPUs: one Unhealthy device finding per GPU its
        device plugin registers with `health` false (evidence like a driver taint)."""
        name = (node.get("metadata") or {}).get("name", "")
        key = hami.register_key(node)
        try:
            gpus = hami.node_gpus(node) or []
        except hami.HamiFormatError:
            return []  # node_finding reports the unreadable registration (never a guess)
        return [
            SweepFinding(
                kind="hami-health",
                node=name,
                gpu_uuid=g.uuid,
                resource_id=g.uuid,
                health="Unhealthy",
                message=f"HAMi registers GPU {g.uuid} on {name} unhealthy ({key})",
                taint=SliceTaint(key=key, value=HAMI_UNHEALTHY, effect="NoSchedule", device=g.uuid),
            )
            for g in gpus
            if not g.healthy
        ]

    def node_finding(
        self, node: dict[str, Any], seen: int, dra: bool, last_seen: int | None = None
    ) -> SweepFinding | None:
        """A node-capacity finding for one Node, or None. `seen`: physical GPUs the node
        publishes in ResourceSlices; `dra`: whether the cluster has any (the sweep's index);
        `last_seen`: the most GPUs the health watcher saw on it (the expected count where no
        `nvidia.com/gpu.count` label says it). `vanished`: fewer GPUs than expected (a node
        incident), as opposed to GPUs the device plugin reports unhealthy. A HAMi node: GPUs its
        device plugin registers below the expected count (vanished), or a registration Sickbay
        cannot read; its nvidia.com/gpu counts shares, so that is not compared."""
        name = (node.get("metadata") or {}).get("name", "")
        labels = (node.get("metadata") or {}).get("labels") or {}
        status = node.get("status") or {}
        if planned_outage(node):
            return None  # its GPUs go with the node, or the driver upgrade took them a while
        capacity, allocatable = offered_gpus(node), offered_gpus(node, "allocatable")
        offered = GPU_RESOURCE  # what the counts below are read from
        if (status.get("capacity") or {}).get(SHARED_RESOURCE) is not None:
            offered += f" + {SHARED_RESOURCE}"
        expected = _quantity(labels.get(GPU_COUNT_LABEL))
        source = GPU_COUNT_LABEL
        mig = mig_instances(node)
        if expected is None and last_seen:
            expected, source = last_seen, "the count Sickbay last saw"
        problem = ""
        vanished = False
        if hami.is_hami_node(node):
            try:
                registered = len(hami.node_gpus(node) or [])
            except hami.HamiFormatError as err:
                problem = f"HAMi's GPU registration is unreadable, not acting on a guess: {err}"
            else:
                if expected is not None and registered < expected:
                    vanished = True
                    problem = (
                        f"{registered} GPU(s) registered by HAMi ({hami.register_key(node)}) < "
                        f"{expected} ({source}): GPU(s) missing from the node"
                    )
        elif capacity is not None and expected is not None and capacity < expected and not mig:
            # Checked first: a plugin that lost its GPUs drops capacity (and allocatable).
            # Not with MIG instances offered apart (`mixed`): nvidia.com/gpu counts only the
            # whole GPUs, and how many GPUs the instances come from no resource says.
            vanished = True
            none = " and no MIG instance (nvidia.com/mig-*)" if mig == 0 else ""
            problem = (
                f"capacity {offered} {capacity}{none} < {expected} GPUs "
                f"({source}): GPU(s) missing from the node"
            )
        elif capacity is not None and allocatable is not None and allocatable < capacity:
            problem = (
                f"allocatable {offered} {allocatable} < capacity {capacity}: "
                f"{capacity - allocatable} GPU(s) unhealthy or gone per the device plugin"
            )
        elif capacity is None and dra and expected is not None:
            if seen < expected:
                vanished = True
                problem = (
                    f"{seen} GPU(s) in ResourceSlices < {expected} ({source}): "
                    "GPU(s) missing from the node or its DRA driver is not publishing"
                )
        if not problem:
            return None
        planned = mig_repartition(node)
        if planned and not vanished:
            return None  # what the node offers while the MIG manager works: no notice
        if planned:  # GPUs gone under it: the node incident waits for it, bounded
            problem += (
                f", while {planned}: the node incident waits for it for up to "
                "nodeIncident.plannedGrace before saying so"
            )
        return SweepFinding(
            kind="node-capacity",
            node=name,
            message=f"node {name}: {problem}",
            gpu_capacity=capacity,
            gpu_allocatable=allocatable,
            expected_gpus=expected,
            vanished=vanished,
            planned=planned,
        )


# The pods that publish a node's GPUs (NVIDIA device plugin chart / GPU Operator, NVIDIA DRA
# driver) and the GPU Operator's validator: (label, value).
PLUGIN_POD_LABELS = (
    ("app", "nvidia-device-plugin-daemonset"),
    ("app.kubernetes.io/name", "nvidia-device-plugin"),
    ("app.kubernetes.io/name", "nvidia-dra-driver-gpu"),
    ("app", "nvidia-operator-validator"),
)
VALIDATOR_APP = "nvidia-operator-validator"  # the GPU Operator's validator: registers nothing
# Waiting reasons of a container that cannot run (not the ContainerCreating of a rollout).
PLUGIN_ERROR_REASONS = frozenset(
    {
        "CreateContainerError",
        "CreateContainerConfigError",
        "RunContainerError",
        "CrashLoopBackOff",
        "ErrImagePull",
        "ImagePullBackOff",
        "StartError",
    }
)


def one_per_node(nodes: list[SweepFinding], plugins: list[SweepFinding]) -> list[SweepFinding]:
    """One finding per node, from its own (capacity, slices) and its GPU plugin pods' that
    cannot run: the first that says its GPUs vanished, else its own. A plugin pod that cannot
    run makes the node vanished even while its status still counts the GPUs (the kubelet keeps
    a stopped plugin's capacity for a grace period, its devices unhealthy: allocatable below
    capacity), so its Unknown GPUs stay the node incident's."""
    chosen: dict[str, SweepFinding] = {}
    for f in [*nodes, *plugins]:
        current = chosen.get(f.node or "")
        if current is None or (f.vanished and not current.vanished):
            chosen[f.node or ""] = f
    return list(chosen.values())


def plugin_pod_finding(pod: dict[str, Any]) -> SweepFinding | None:
    """A GPU plugin / validator pod whose container cannot run: its node's GPUs are (or are
    about to be) gone: a node finding (`vanished`, the node incident's), or None."""
    meta = pod.get("metadata") or {}
    labels = meta.get("labels") or {}
    if not any(labels.get(k) == v for k, v in PLUGIN_POD_LABELS) or meta.get("deletionTimestamp"):
        return None
    node = (pod.get("spec") or {}).get("nodeName")
    status = pod.get("status") or {}
    for cs in list(status.get("initContainerStatuses") or []) + list(
        status.get("containerStatuses") or []
    ):
        waiting = (cs.get("state") or {}).get("waiting") or {}
        reason = str(waiting.get("reason") or "")
        if node and reason in PLUGIN_ERROR_REASONS:
            text = str(waiting.get("message") or "").strip()
            return SweepFinding(
                kind="node-capacity",
                node=node,
                message=f"node {node}: GPU plugin pod {meta.get('namespace', '')}/"
                f"{meta.get('name', '')} {reason}" + (f": {text[:200]}" if text else ""),
                vanished=True,
            )
    return None


def _restart_in_progress(f: SweepFinding, restarting: set[str]) -> bool:
    """A node's own notice that its device plugin offers none of its GPUs (allocatable 0,
    capacity kept), while its plugin pod starts: the restart itself, not a GPU problem."""
    return (
        not f.vanished and f.node in restarting and f.gpu_allocatable == 0 and bool(f.gpu_capacity)
    )


def _plugin_pod_node(pod: dict[str, Any]) -> str | None:
    """The node of a GPU plugin / validator pod (PLUGIN_POD_LABELS), or None."""
    labels = (pod.get("metadata") or {}).get("labels") or {}
    if not any(labels.get(k) == v for k, v in PLUGIN_POD_LABELS):
        return None
    return (pod.get("spec") or {}).get("nodeName") or None


def plugin_pod_starting(pod: dict[str, Any]) -> str | None:
    """The node of a GPU plugin pod that is being replaced (deleting) or starting (a container
    not Ready that is no PLUGIN_ERROR_REASONS: ContainerCreating, init containers running),
    as in a rollout of its DaemonSet: its plugin has not registered (yet), so the kubelet
    counts the node's GPUs with none allocatable. None: not a plugin pod, Ready, or one that
    cannot run (`plugin_pod_finding`'s)."""
    node = _plugin_pod_node(pod)
    labels = (pod.get("metadata") or {}).get("labels") or {}
    if node is None or labels.get("app") == VALIDATOR_APP:  # the validator registers nothing
        return None
    if (pod.get("metadata") or {}).get("deletionTimestamp"):
        return node
    status = pod.get("status") or {}
    statuses = list(status.get("initContainerStatuses") or []) + list(
        status.get("containerStatuses") or []
    )
    for cs in statuses:
        waiting = (cs.get("state") or {}).get("waiting") or {}
        if str(waiting.get("reason") or "") in PLUGIN_ERROR_REASONS:
            return None
    main = status.get("containerStatuses") or []
    return node if not main or not all(cs.get("ready") for cs in main) else None


def merge_finding(merged: dict[str, SweepFinding], finding: SweepFinding) -> None:
    """Keep one finding per physical GPU: worst health wins, pods and messages accumulate."""
    current = merged.get(finding.key)
    if current is None:
        merged[finding.key] = finding
        return
    worse = _RANK.get(finding.health or "", 0) > _RANK.get(current.health or "", 0)
    base, other = (finding, current) if worse else (current, finding)
    pods = base.pods + [p for p in other.pods if p not in base.pods]
    merged[finding.key] = base.model_copy(
        update={
            "pods": pods,
            "xid": base.xid if base.xid is not None else other.xid,
            "taint": base.taint or other.taint,
        }
    )
