"""Devices: read ResourceSlices, resolve what an alert names to a physical GPU and its group.

A physical GPU is `<node>/<uuid>`. Every device sharing it (MIG slices, vGPUs, time-sliced
replicas) is in its group: a slice device belongs to GPU P when its `uuid` attribute is P or
its parent attribute (`parentUUID`, as the NVIDIA DRA driver publishes for MIG) is P.
Attribute names may carry the driver's domain (`gpu.nvidia.com/uuid`); they are compared
without it and case-insensitively.

Device-plugin clusters publish no devices: a node advertising `nvidia.com/gpu` plus the UUID
from the alert (the plugin's device ID) is the device.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from temporalio.exceptions import ApplicationError

from activities.kube import hami
from activities.kube.client import ErrorKind, Kube, KubeError
from activities.kube.discovery import ClusterApis
from contract.errors import ERR_DEVICE_NOT_FOUND
from contract.kube import DeviceRef, DraDevice, ResolvedDevice

GPU_RESOURCE = "nvidia.com/gpu"
# The device plugin's `mixed` MIG strategy: a MIG-enabled GPU's instances are resources of
# their own (`nvidia.com/mig-<profile>`), nvidia.com/gpu counts only the whole GPUs.
MIG_RESOURCE_PREFIX = "nvidia.com/mig-"
MIG_STRATEGY_LABEL = "nvidia.com/mig.strategy"
# The GPU Operator's MIG manager: pending / rebooting while it repartitions the node's GPUs
# (the GPU plugins stopped), then success or failed.
MIG_CONFIG_STATE_LABEL = "nvidia.com/mig.config.state"
# Time-slicing / MPS sharing: each GPU offered `nvidia.com/gpu.replicas` times (GPU feature
# discovery's label), as nvidia.com/gpu or, with `renameByDefault`, nvidia.com/gpu.shared.
SHARED_RESOURCE = "nvidia.com/gpu.shared"
REPLICAS_LABEL = "nvidia.com/gpu.replicas"
# Node labels naming a node pool, most specific first (Sickbay's own, then clouds).
NODE_POOL_LABELS = (
    "sickbay.dev/node-pool",
    "cloud.google.com/gke-nodepool",
    "kubernetes.azure.com/agentpool",
    "eks.amazonaws.com/nodegroup",
    "karpenter.sh/nodepool",
    "node.kubernetes.io/pool",
    "pool",
)
UUID_ATTRS = ("uuid",)
PARENT_UUID_ATTRS = ("parentuuid", "parent_uuid", "parent-uuid", "gpuuuid")
INDEX_ATTRS = ("index", "minor")
PARENT_INDEX_ATTRS = ("parentindex", "parent_index", "parentminor")
PRODUCT_ATTRS = ("productname", "product", "model")
# DRA driver health taints (NVIDIA: gpu.nvidia.com/xid, gpu.nvidia.com/gpu-lost).
EFFECTS = ("NoSchedule", "NoExecute", "None")
DEVICE_CLASS_TTL = 300.0  # seconds; classes come with a driver install, not per incident


def _attr_value(raw: Any) -> Any:
    if isinstance(raw, dict):
        for key in ("string", "int", "bool", "version"):
            if key in raw:
                return raw[key]
        return None
    return raw


# Attribute name as a driver spells it -> the short lower-case form devices are compared by.
# A cluster has a few dozen distinct names across thousands of devices, so each is worked out
# once per worker (bounded, in case a driver invents names per device).
_SHORT_NAMES: dict[str, str] = {}
_SHORT_NAMES_MAX = 4096


def _short_name(name: str) -> str:
    short = _SHORT_NAMES.get(name)
    if short is None:
        short = name.rsplit("/", 1)[-1].lower()
        if len(_SHORT_NAMES) < _SHORT_NAMES_MAX:
            _SHORT_NAMES[name] = short
    return short


def _normalise_attrs(attrs: dict[str, Any] | None) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for name, raw in (attrs or {}).items():
        out[_short_name(name)] = _attr_value(raw)
    return out


def _first(attrs: dict[str, Any], names: tuple[str, ...]) -> Any:
    for name in names:
        value = attrs.get(name)
        if value not in (None, ""):
            return value
    return None


@dataclass
class SliceDevice:
    driver: str
    pool: str
    device: str
    node: str | None
    attributes: dict[str, Any]
    taints: list[dict[str, Any]] = field(default_factory=list)

    @property
    def ref(self) -> DraDevice:
        return DraDevice(driver=self.driver, pool=self.pool, device=self.device)

    @property
    def resource_id(self) -> str:
        return f"{self.driver}/{self.pool}/{self.device}"

    @property
    def uuid(self) -> str | None:
        value = _first(self.attributes, UUID_ATTRS)
        return str(value) if value is not None else None

    @property
    def parent_uuid(self) -> str | None:
        value = _first(self.attributes, PARENT_UUID_ATTRS)
        return str(value) if value is not None else None

    @property
    def physical_uuid(self) -> str | None:
        """The physical GPU this device lives on."""
        return self.parent_uuid or self.uuid

    @property
    def is_partition(self) -> bool:
        return self.parent_uuid is not None and self.parent_uuid != self.uuid

    @property
    def index(self) -> int | None:
        names = PARENT_INDEX_ATTRS if self.is_partition else INDEX_ATTRS
        value = _first(self.attributes, names)
        try:
            return int(value) if value is not None else None
        except (TypeError, ValueError):
            return None

    @property
    def product(self) -> str | None:
        value = _first(self.attributes, PRODUCT_ATTRS)
        return str(value) if value is not None else None


def slice_devices(slices: list[dict[str, Any]]) -> list[SliceDevice]:
    out: list[SliceDevice] = []
    for item in slices:
        spec = item.get("spec") or {}
        driver = spec.get("driver", "")
        pool = (spec.get("pool") or {}).get("name", "")
        node = spec.get("nodeName")
        for dev in spec.get("devices") or []:
            basic = dev.get("basic") or {}  # v1beta1 shape, in case a driver still writes it
            out.append(
                SliceDevice(
                    driver=driver,
                    pool=pool,
                    device=dev.get("name", ""),
                    node=node,
                    attributes=_normalise_attrs(dev.get("attributes") or basic.get("attributes")),
                    taints=list(dev.get("taints") or basic.get("taints") or []),
                )
            )
    return out


# ResourceSlices are inventory: they change when nodes come and go or a driver flips a health
# taint. A remediation reads them in several consecutive activities (resolve, evidence, budget
# count), so one cluster-wide list is shared for a few seconds. Anything that would conclude
# "not found" from a cached list re-reads first (`fresh=True`).
SLICE_TTL = 10.0  # seconds
# While one caller reloads the GPU inventory (the budget's denominator) or the node list,
# others use the one it replaces if it is at most this much older than its max age (Kube.cached):
# the inventory changes when nodes come and go, and the budget workflow's leases, not these
# observed counts, are what keeps two remediations from taking one slot.
INVENTORY_STALE = 300.0
NODES_STALE = 30.0


def list_slice_devices(
    kube: Kube, node: str | None = None, *, fresh: bool = False, max_age: float = SLICE_TTL
) -> list[SliceDevice]:
    """Devices published in ResourceSlices, all or one node's, from a list at most `max_age`
    seconds old (0 or `fresh`: read now).

    One node's devices come from a cluster-wide list still young enough, else from a list of
    that node's slices only (field selector `spec.nodeName`, served by every API server that
    serves ResourceSlices): on a 1,000-node cluster that is milliseconds instead of a list of
    every slice. Concurrent readers share one load (`Kube.cached` is single-flight)."""
    if fresh or max_age <= 0:
        max_age = 0.0
    if node is None:
        key: Any = "resourceslices"
        selector = None
    else:
        whole = kube.peek("resourceslices", max_age) if max_age > 0 else None
        if whole is not None:
            return [d for d in whole if d.node == node]
        key = ("resourceslices", node)
        selector = f"spec.nodeName={node}"

    def load() -> list[SliceDevice]:
        kwargs: dict[str, Any] = {"field_selector": selector} if selector else {}
        body = kube.call(
            kube.resource_v1.list_resource_slice,
            verb="list",
            resource="resourceslices",
            **kwargs,
        )
        return slice_devices(body.get("items") or [])

    if max_age <= 0:
        devices = load()
        kube.store_cached(key, devices)
    else:
        devices = kube.cached(key, max_age, load)
    return list(devices)


def group_of(devices: list[SliceDevice], node: str | None, physical_uuid: str) -> list[SliceDevice]:
    want = physical_uuid.lower()
    return [
        d
        for d in devices
        if (node is None or d.node == node)
        and ((d.physical_uuid or "").lower() == want or (d.uuid or "").lower() == want)
    ]


def physical_gpus(devices: list[SliceDevice]) -> set[tuple[str, str]]:
    """{(node, physical uuid)}; devices without a uuid count as their own GPU."""
    out: set[tuple[str, str]] = set()
    for d in devices:
        out.add((d.node or d.pool, d.physical_uuid or d.resource_id))
    return out


_KEY_ATTRS = frozenset(UUID_ATTRS + PARENT_UUID_ATTRS)


def _physical_id(driver: str, pool: str, dev: dict[str, Any]) -> str:
    """`SliceDevice.physical_uuid or SliceDevice.resource_id` of one raw slice device, without
    building the device: only the uuid attributes are normalised."""
    basic = dev.get("basic") or {}
    keys: dict[str, Any] = {}
    for name, raw in (dev.get("attributes") or basic.get("attributes") or {}).items():
        short = _short_name(name)
        if short in _KEY_ATTRS:
            keys[short] = _attr_value(raw)
    value = _first(keys, PARENT_UUID_ATTRS)
    if value is None:
        value = _first(keys, UUID_ATTRS)
    if value is not None:
        return str(value)
    return f"{driver}/{pool}/{dev.get('name', '')}"


def gpus_per_node(slices: list[dict[str, Any]]) -> dict[str, int]:
    """{node: physical GPUs} from raw ResourceSlices: the same GPUs `physical_gpus` finds in
    their devices (keyed by node, or pool for a slice without one), a fraction of the CPU."""
    found: dict[str, set[str]] = {}
    for item in slices:
        spec = item.get("spec") or {}
        driver = spec.get("driver", "")
        pool = (spec.get("pool") or {}).get("name", "")
        ids = found.setdefault(spec.get("nodeName") or pool, set())
        for dev in spec.get("devices") or []:
            ids.add(_physical_id(driver, pool, dev))
    return {node: len(ids) for node, ids in found.items() if ids}


def count_by_node(devices: list[SliceDevice]) -> dict[str, int]:
    """`gpus_per_node` of devices already converted."""
    out: dict[str, int] = {}
    for node, _ in physical_gpus(devices):
        out[node] = out.get(node, 0) + 1
    return out


def gpu_inventory(kube: Kube, *, max_age: float = SLICE_TTL) -> dict[str, int]:
    """{node: physical GPUs} across the cluster, at most `max_age` seconds old: the budget's
    denominator. A young cluster-wide device list is reused; otherwise one ResourceSlice list
    is reduced to this summary (no device objects) and cached single-flight, so a storm of
    remediations counting at once pays for one list per `max_age`."""
    whole = kube.peek("resourceslices", max_age) if max_age > 0 else None
    if whole is not None:
        return count_by_node(whole)

    def load() -> dict[str, int]:
        body = kube.call(
            kube.resource_v1.list_resource_slice, verb="list", resource="resourceslices"
        )
        return gpus_per_node(body.get("items") or [])

    if max_age <= 0:
        summary = load()
        kube.store_cached("gpu-inventory", summary)
        return dict(summary)
    return dict(kube.cached("gpu-inventory", max_age, load))


def node_pool_of(node: dict[str, Any]) -> str | None:
    labels = (node.get("metadata") or {}).get("labels") or {}
    for key in NODE_POOL_LABELS:
        if labels.get(key):
            return str(labels[key])
    return None


def _not_found(message: str) -> ApplicationError:
    return ApplicationError(message, type=ERR_DEVICE_NOT_FOUND, non_retryable=True)


def get_node(kube: Kube, name: str) -> dict[str, Any] | None:
    try:
        return kube.call(kube.core.read_node, name, verb="get", resource="nodes", name=name)
    except KubeError as err:
        if err.kind is ErrorKind.NOT_FOUND:
            return None
        raise


# Resolve needs one node's pool label and the budget count, a few milliseconds later in the
# same workflow task, needs every node: one list serves both if it is at most this old (a
# quarantine made meanwhile by another remediation is covered by its budget lease; Sickbay's
# own node writes drop the list; a node missing from it is read on its own). 10 s, not 2:
# under a burst of 200 failures each reload of a 1,000-node list cost about a second of the
# worker's time (last DeviceTaintRule 11-12 s with 2 s, 8-10 s with 10 s, cold worker).
NODES_MAX_AGE = 10.0  # seconds


def list_nodes(kube: Kube, *, max_age: float = 0.0) -> list[dict[str, Any]]:
    """Every node; with `max_age`, this worker's list from at most that long ago."""
    return list(shared_nodes(kube, max_age=max_age))


def shared_nodes(kube: Kube, *, max_age: float = 0.0) -> list[dict[str, Any]]:
    """`list_nodes`' list itself, shared with other callers: read it, never change it."""

    def load() -> list[dict[str, Any]]:
        return kube.call(kube.core.list_node, verb="list", resource="nodes").get("items") or []

    if max_age <= 0:
        nodes = load()
        kube.store_cached("nodes", nodes)
        return nodes
    return kube.cached("nodes", max_age, load, stale=NODES_STALE)  # type: ignore[no-any-return]


def node_from_list(kube: Kube, name: str) -> dict[str, Any] | None:
    """One node out of a fresh (or seconds-old) node list, stored for the budget count."""
    for node in list_nodes(kube, max_age=NODES_MAX_AGE):
        if (node.get("metadata") or {}).get("name") == name:
            return node
    return get_node(kube, name)  # not in a list that may be old: ask for it directly


def device_classes(kube: Kube) -> dict[str, Any]:
    """The DeviceClass list, cached DEVICE_CLASS_TTL (the worker warms it at start)."""
    return kube.cached(
        "deviceclasses",
        DEVICE_CLASS_TTL,
        lambda: kube.call(
            kube.resource_v1.list_device_class, verb="list", resource="deviceclasses"
        ),
    )


def _device_class_for(kube: Kube, driver: str, partition: bool) -> str | None:
    """The DeviceClass whose selector names this driver (prefers the MIG class for slices)."""
    body = device_classes(kube)
    candidates: list[tuple[int, str]] = []
    for item in body.get("items") or []:
        name = (item.get("metadata") or {}).get("name", "")
        exprs = " ".join(
            ((sel.get("cel") or {}).get("expression") or "")
            for sel in (item.get("spec") or {}).get("selectors") or []
        )
        if f'"{driver}"' not in exprs and f"'{driver}'" not in exprs and name != driver:
            continue
        mig = "mig" in name.lower() or "'mig'" in exprs or '"mig"' in exprs
        score = 0 if mig == partition else 1
        candidates.append((score, name))
    return sorted(candidates)[0][1] if candidates else None


def resolve(kube: Kube, apis: ClusterApis, ref: DeviceRef) -> ResolvedDevice:
    """DeviceRef -> ResolvedDevice, or ERR_DEVICE_NOT_FOUND (non-retryable).

    A `node` that is no node but a pod's name (dcgm-exporter without NODE_NAME labels
    `Hostname` with its own pod's name) is resolved to that pod's spec.nodeName; asked only
    once the device was not found, so the usual path costs nothing more."""
    try:
        return _resolve(kube, apis, ref)
    except ApplicationError as err:
        if err.type != ERR_DEVICE_NOT_FOUND or not ref.node or get_node(kube, ref.node):
            raise
        node = _node_of_pod_named(kube, ref.node)
        if node is None:
            raise
    return _resolve(kube, apis, ref.model_copy(update={"node": node}))


def _node_of_pod_named(kube: Kube, name: str) -> str | None:
    """The node of the one bound pod called `name` (any namespace); None when there is none;
    ERR_DEVICE_NOT_FOUND naming them when several pods of that name run on different nodes."""
    body = kube.call(
        kube.core.list_pod_for_all_namespaces,
        verb="list",
        resource="pods",
        field_selector=f"metadata.name={name}",
    )
    pods = [
        p
        for p in body.get("items") or []
        if (p.get("metadata") or {}).get("name") == name and (p.get("spec") or {}).get("nodeName")
    ]
    nodes = {p["spec"]["nodeName"] for p in pods}
    if len(nodes) > 1:
        where = ", ".join(
            sorted(
                f"{p['metadata'].get('namespace', '')}/{name} on {p['spec']['nodeName']}"
                for p in pods
            )
        )
        raise _not_found(
            f"{name!r} is no node; pods of that name run on several nodes ({where}): set "
            "NODE_NAME on dcgm-exporter (or relabel Hostname) so alerts name the node"
        )
    return next(iter(nodes), None)


def _resolve(kube: Kube, apis: ClusterApis, ref: DeviceRef) -> ResolvedDevice:
    if not apis.dra:
        return _resolve_device_plugin(kube, apis, ref)
    try:
        return _resolve_dra(kube, apis, ref, list_slice_devices(kube, ref.node))
    except ApplicationError as err:
        if err.type != ERR_DEVICE_NOT_FOUND:
            raise
    # Never conclude "not found" from a cached list: a node may have just joined.
    return _resolve_dra(kube, apis, ref, list_slice_devices(kube, ref.node, fresh=True))


def _resolve_dra(
    kube: Kube, apis: ClusterApis, ref: DeviceRef, devices: list[SliceDevice]
) -> ResolvedDevice:
    node_name = ref.node
    target: SliceDevice | None = None
    if ref.driver and ref.pool and ref.device:
        target = next(
            (
                d
                for d in devices
                if (d.driver, d.pool, d.device) == (ref.driver, ref.pool, ref.device)
            ),
            None,
        )
        if target is None:
            raise _not_found(
                f"no ResourceSlice publishes device {ref.driver}/{ref.pool}/{ref.device}"
                + (f" on node {node_name}" if node_name else "")
            )
    elif ref.gpu_uuid:
        want = ref.gpu_uuid.lower()
        matches = [d for d in devices if (d.uuid or "").lower() == want]
        matches = matches or [d for d in devices if (d.physical_uuid or "").lower() == want]
        if not matches:
            raise _not_found(
                f"no ResourceSlice device on node {node_name} has uuid {ref.gpu_uuid}"
                f" ({len(devices)} devices published there)"
            )
        target = next((d for d in matches if not d.is_partition), matches[0])
    else:
        matches = [d for d in devices if d.index == ref.gpu_index]
        whole = [d for d in matches if not d.is_partition]
        if not matches:
            raise _not_found(
                f"no ResourceSlice device on node {node_name} has GPU index {ref.gpu_index}"
                f" ({len(devices)} devices published there)"
            )
        target = (whole or matches)[0]
    physical = target.physical_uuid
    if not physical:
        raise _not_found(
            f"device {target.resource_id} publishes no uuid attribute; Sickbay needs it to key "
            "the physical GPU"
        )
    node_name = target.node or node_name or target.pool
    group = group_of(devices, target.node, physical) or [target]
    group.sort(key=lambda d: (d.is_partition, d.driver, d.pool, d.device))
    node = node_from_list(kube, node_name) if node_name else None
    index = next((d.index for d in group if not d.is_partition), None)
    if index is None:
        index = target.index
    return ResolvedDevice(
        node=node_name,
        gpu_uuid=physical,
        gpu_index=index,
        product=next((d.product for d in group if d.product), None),
        mode="dra",
        devices=[d.ref for d in group],
        device_class=_device_class_for(kube, target.driver, target.is_partition),
        node_pool=node_pool_of(node) if node else None,
        taint_api_version=apis.taint_version,
    )


def gpu_capacity(node: dict[str, Any]) -> tuple[int | None, int | None]:
    status = node.get("status") or {}
    cap = (status.get("capacity") or {}).get(GPU_RESOURCE)
    alloc = (status.get("allocatable") or {}).get(GPU_RESOURCE)
    return (int(cap) if cap is not None else None, int(alloc) if alloc is not None else None)


def _resolve_device_plugin(kube: Kube, apis: ClusterApis, ref: DeviceRef) -> ResolvedDevice:
    if not ref.node:
        raise _not_found(
            f"device {ref.key}: this cluster serves no DRA ResourceSlices (device-plugin mode); "
            "name the device by node + GPU UUID"
        )
    node = get_node(kube, ref.node)
    if node is None:
        raise _not_found(f"node {ref.node} does not exist")
    capacity, _ = gpu_capacity(node)
    if not capacity:
        raise _not_found(f"node {ref.node} advertises no {GPU_RESOURCE}")
    uuid = ref.gpu_uuid
    if hami.is_hami_node(node):
        return _resolve_hami(kube, apis, ref, node)
    known = node_gpu_uuids(node)
    if uuid is None:
        # An index maps to a UUID only where the node publishes its GPU list.
        if ref.gpu_index is None or ref.gpu_index >= len(known):
            raise _not_found(
                f"node {ref.node}: GPU index {ref.gpu_index} cannot be mapped to a UUID in "
                "device-plugin mode; give the GPU UUID (dcgm-exporter label UUID)"
            )
        uuid = known[ref.gpu_index]
    elif known and uuid.lower() not in {u.lower() for u in known}:
        raise _not_found(f"node {ref.node} has no GPU {uuid} (it lists {', '.join(known)})")
    index = ref.gpu_index
    if index is None and uuid in known:
        index = known.index(uuid)
    return ResolvedDevice(
        node=ref.node,
        gpu_uuid=uuid,
        gpu_index=index,
        mode="device-plugin",
        devices=[],
        node_pool=node_pool_of(node),
        taint_api_version=apis.taint_version,
    )


def _resolve_hami(
    kube: Kube, apis: ClusterApis, ref: DeviceRef, node: dict[str, Any]
) -> ResolvedDevice:
    """A HAMi node: its GPUs are the ones HAMi's device plugin registers. A UUID no longer
    registered still resolves while a pod on the node holds it by HAMi's record (the GPU
    vanished under its consumers: the evidence says so); otherwise it is not found."""
    assert ref.node is not None
    try:
        gpus = hami.node_gpus(node) or []
    except hami.HamiFormatError as err:
        raise err.application_error() from err
    by_index = sorted(gpus, key=lambda g: (g.index is None, g.index or 0))
    uuid, index = ref.gpu_uuid, ref.gpu_index
    if uuid is None:
        match = next(
            (g for i, g in enumerate(by_index) if (g.index if g.index is not None else i) == index),
            None,
        )
        if match is None:
            raise _not_found(
                f"node {ref.node}: HAMi registers no GPU with index {index} "
                f"({len(gpus)} registered)"
            )
        uuid = match.uuid
    want = uuid.lower()
    found = next((i for i, g in enumerate(by_index) if g.uuid.lower() == want), None)
    if found is None:
        from activities.kube.consumers import list_node_pods  # consumers imports this module

        try:
            held = any(
                want in (hami.pod_gpu_uuids(p) or set()) for p in list_node_pods(kube, ref.node)
            )
        except hami.HamiFormatError as err:
            raise err.application_error() from err
        if not held:
            raise _not_found(
                f"node {ref.node}: HAMi registers no GPU {uuid} and no pod holds it (registered: "
                f"{', '.join(g.uuid for g in by_index) or 'none'})"
            )
    elif index is None:
        gpu = by_index[found]
        index = gpu.index if gpu.index is not None else found
    return ResolvedDevice(
        node=ref.node,
        gpu_uuid=by_index[found].uuid if found is not None else uuid,
        gpu_index=index,
        product=by_index[found].type or None if found is not None else None,
        mode="device-plugin",
        devices=[],
        node_pool=node_pool_of(node),
        taint_api_version=apis.taint_version,
        hami=True,
    )


# Annotations where a node may list its GPU UUIDs in index order (the cluster twin, and
# GPU-feature-discovery-like tooling); absent on most clusters.
GPU_UUIDS_ANNOTATIONS = ("sickbay.dev/gpu-uuids", "nvidia.com/gpu.uuids")


def node_gpu_uuids(node: dict[str, Any]) -> list[str]:
    meta = node.get("metadata") or {}
    for source in (meta.get("annotations") or {}, meta.get("labels") or {}):
        for key in GPU_UUIDS_ANNOTATIONS:
            raw = source.get(key)
            if raw:
                return [u.strip() for u in str(raw).split(",") if u.strip()]
    return []


def offered_gpus(
    node: dict[str, Any], part: str = "capacity", *, per_gpu: bool = False
) -> int | None:
    """What the device plugin offers on the node as nvidia.com/gpu and nvidia.com/gpu.shared
    together (time-slicing or MPS under `renameByDefault`), from its `part` (capacity or
    allocatable); None when the node has neither. Shared GPUs are counted once per replica:
    an upper bound on the GPUs, which a "GPUs vanished" verdict needs. With `per_gpu`, divided
    by GPU feature discovery's `nvidia.com/gpu.replicas` and rounded down: a lower bound, which
    a "GPUs back" verdict needs (the label can lag the plugin's sharing config by a GFD run,
    so it is never trusted in the direction that acts). (HAMi's nvidia.com/gpu counts its own
    shares: not for HAMi nodes.)"""
    offered = (node.get("status") or {}).get(part) or {}
    counts = []
    for resource in (GPU_RESOURCE, SHARED_RESOURCE):
        try:
            counts.append(int(str(offered[resource])))
        except (KeyError, ValueError):
            continue
    if not counts:
        return None
    if not per_gpu:
        return sum(counts)
    labels = (node.get("metadata") or {}).get("labels") or {}
    try:
        replicas = max(1, int(str(labels.get(REPLICAS_LABEL) or 1)))
    except ValueError:
        replicas = 1
    return sum(counts) // replicas


def withholds_every_gpu(node: dict[str, Any]) -> bool:
    """The node's device plugin offers none of its GPUs: nvidia.com/gpu allocatable 0 while
    capacity still counts them, as the kubelet shows for a grace period (5 min) after the
    plugin stopped, before it drops the capacity too (or every GPU is unhealthy). HAMi's
    nvidia.com/gpu counts shares: never."""
    if hami.is_hami_node(node):
        return False
    capacity, allocatable = offered_gpus(node), offered_gpus(node, "allocatable")
    return bool(capacity) and allocatable == 0


def mig_instances(node: dict[str, Any]) -> int | None:
    """The MIG instances a device-plugin node offers as resources of their own (`mixed`
    strategy: the sum of its `nvidia.com/mig-<profile>` capacity); None when the node is not
    on that strategy, so that nvidia.com/gpu counts every GPU (or, under `single`, every MIG
    instance, as the `nvidia.com/gpu.count` label then does)."""
    labels = (node.get("metadata") or {}).get("labels") or {}
    capacity = (node.get("status") or {}).get("capacity") or {}
    keys = [k for k in capacity if str(k).startswith(MIG_RESOURCE_PREFIX)]
    if labels.get(MIG_STRATEGY_LABEL) != "mixed" and not keys:
        return None
    total = 0
    for key in keys:
        try:
            total += int(str(capacity[key]))
        except ValueError:
            continue
    return total


# Taints an autoscaler puts on a node it is about to remove (then drains and deletes it):
# the Cluster Autoscaler's, Karpenter's since v1, and Karpenter's before it (v0.32-v0.37).
REMOVAL_TAINTS = {
    "ToBeDeletedByClusterAutoscaler": "the Cluster Autoscaler",
    "karpenter.sh/disrupted": "Karpenter",
    "karpenter.sh/disruption": "Karpenter",
}


def node_being_removed(node: dict[str, Any]) -> str:
    """Why the node is on its way out (deleted, or tainted by an autoscaler removing it), in
    plain words, or "": GPUs it stops offering meanwhile go with the node, no GPU problem."""
    meta = node.get("metadata") or {}
    if meta.get("deletionTimestamp"):
        return f"node {meta.get('name', '')} is being deleted"
    for taint in (node.get("spec") or {}).get("taints") or []:
        who = REMOVAL_TAINTS.get(str(taint.get("key") or ""))
        if who:
            return f"{who} is removing node {meta.get('name', '')} (taint {taint.get('key')})"
    return ""


# The GPU Operator's driver upgrade controller (k8s-operator-libs) marks each node's step in
# this label; in these states it cordons, drains, unloads the driver and restarts its pods on
# purpose. `upgrade-required` (nothing done yet), `upgrade-done` and `upgrade-failed` are not:
# a driver the upgrade left broken is a vanish like any other, and loud.
DRIVER_UPGRADE_LABEL = "nvidia.com/gpu-driver-upgrade-state"
DRIVER_UPGRADE_AT_WORK = frozenset(
    {
        "cordon-required",
        "wait-for-jobs-required",
        "pod-deletion-required",
        "drain-required",
        "node-maintenance-required",
        "post-maintenance-required",
        "pod-restart-required",
        "validation-required",
        "uncordon-required",
    }
)


def driver_upgrading(node: dict[str, Any]) -> str:
    """The GPU Operator is upgrading the node's driver right now, in plain words, or ""."""
    meta = node.get("metadata") or {}
    state = str((meta.get("labels") or {}).get(DRIVER_UPGRADE_LABEL) or "")
    if state not in DRIVER_UPGRADE_AT_WORK:
        return ""
    return (
        f"the GPU Operator is upgrading the driver of node {meta.get('name', '')} "
        f"({DRIVER_UPGRADE_LABEL}={state})"
    )


def planned_outage(node: dict[str, Any]) -> str:
    """Why the node's GPUs are away on purpose right now (removed by an autoscaler or deleted,
    its driver upgraded by the GPU Operator), in plain words, or "": no GPU problem then."""
    return node_being_removed(node) or driver_upgrading(node)


def mig_repartition(node: dict[str, Any]) -> str:
    """What the MIG manager is doing to the node's GPUs right now, in words (its state label
    pending or rebooting: what the node offers meanwhile is that planned work), or ""."""
    labels = (node.get("metadata") or {}).get("labels") or {}
    state = labels.get(MIG_CONFIG_STATE_LABEL)
    if state not in ("pending", "rebooting"):
        return ""
    return f"the MIG manager is repartitioning its GPUs ({MIG_CONFIG_STATE_LABEL}={state})"
