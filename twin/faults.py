"""Device faults and API fault injection for the cluster twin.

Python API (the HTTP routes in fault_routes.py and the `sickbay-dev twin fail|recover` commands in
fault_cli.py are thin layers over it)::

    faults = manager.faults                       # twin.controllers.manager.ControllerManager
    faults.gpus("node-0")                         # physical GPUs with their devices
    faults.fail("node-0", "0", xid=79)            # GPU by index, UUID or device name
    faults.fail("node-0", "gpu-1", degrade="nvlink")
    faults.fail("node-0", "all", vanish=True)     # device plugin / driver lost every GPU
    faults.recover("node-0", "0")                 # or recover("node-0") for the whole node
    faults.enable_mig("node-0", [0])              # device plugin, MIG `mixed`: GPU 0 as 7
                                                  # nvidia.com/mig-1g.10gb instances
    faults.share_gpus("node-0", 4, rename=True)   # time-slicing: nvidia.com/gpu.shared x4
    faults.set_known_faults(ignore_device_taint_rules=True, expired_toleration_bug=True)
    manager.api_faults.add(verb="patch", resource="pods", kind="429", rate=0.5)

A fault marks a *physical* GPU: every device that shares it (MIG slices, vGPUs, time-sliced
replicas, identified by the ResourceSlice attribute `parentUUID`, else `uuid`) is marked
together. What a fault does:

| fault                         | health (pod status)  | containers           | alert            |
|-------------------------------|----------------------|----------------------|------------------|
| `--xid N` (fatal: 79, 48, ...) | Unhealthy "XID N"    | crash loop           | yes, err_code N  |
| `--xid N` (13 31 43 45 68 109) | Healthy (app error)  | keep running         | yes, err_code N  |
| `--degrade nvlink`            | Unhealthy "XID 74"   | keep running         | yes, err_code 74 |
| `--degrade ecc-sbe`           | Unhealthy "XID 92"   | keep running         | yes, err_code 92 |
| `--vanish`                    | Unknown              | keep running         | no (plugin issue)|

`--vanish` removes the devices from the node's ResourceSlice (DRA) or drops the node's
`nvidia.com/gpu` capacity and allocatable (device plugin), as after a broken driver or plugin
upgrade; `recover` publishes them again. `driver_taint=True` also makes the DRA driver publish
a `gpu.nvidia.com/xid=<code>` NoSchedule taint on the devices, like the NVIDIA driver's
alpha health check. Alerts go through twin/alerts.py with dcgm-exporter's labels and
resolve on recovery.

API fault injection (`ApiFaults`): rules of (verb, resource, kind, rate, count) where kind is
`500`, `429` (with Retry-After), `409` (Conflict), `timeout` (the request hangs, then 504),
`delay` (the request is held `timeoutSeconds`, then served as usual) or `reset` (the connection
is closed without an answer). A rule's optional `match` narrows it to
requests whose URL-decoded path and query contain that text (one node's pod list:
`spec.nodeName=<node>`; one object: its name), so a drill can hold one remediation's request
while the others go through. The API server calls, once it knows the
verb and resource of a request (see `ApiFaults.intercept` for the exact hook)::

    api_faults = twin.extensions.get("api_faults")
    if api_faults is not None:
        api_faults.intercept(self, verb, resource)   # self = the request handler
"""

from __future__ import annotations

import logging
import random
import re
import socket
import threading
import time
import uuid as uuidlib
from dataclasses import asdict, dataclass, field
from typing import Any
from urllib.parse import unquote

from twin import errors, hami
from twin.alerts import (
    ALERT_ECC_DBE,
    ALERT_FELL_OFF_BUS,
    ALERT_NVLINK,
    ALERT_ROW_REMAP,
    ALERT_XID,
)
from twin.clock import rfc3339
from twin.controllers.allocator import claim_devices
from twin.controllers.common import (
    CLAIMS,
    GPU_RESOURCE,
    NODES,
    PODS,
    SLICES,
    meta,
    name_of,
    ns_of,
    pod_claim_name,
    uid_of,
)

log = logging.getLogger(__name__)

APPLICATION_XIDS = frozenset({13, 31, 43, 45, 68, 109})
DEGRADE_XIDS = {"nvlink": 74, "ecc-sbe": 92}
XID_TEXT = {
    13: "Graphics Engine Exception",
    31: "GPU memory page fault",
    43: "GPU stopped processing",
    45: "Preemptive cleanup, due to previous errors",
    48: "Double Bit ECC Error",
    63: "ECC page retirement or row remapping recording event",
    64: "ECC page retirement or row remapper recording failure",
    68: "NVDEC0 Exception",
    74: "NVLINK Error",
    79: "GPU has fallen off the bus",
    92: "High single-bit ECC error rate",
    94: "Contained ECC error",
    95: "Uncontained ECC error",
    109: "Context Switch Timeout Error",
    119: "GSP RPC timeout",
    120: "GSP error",
}
GPU_UUIDS_ANNOTATION = "sickbay.dev/gpu-uuids"  # seed.py: the device plugin's device IDs
REPLICAS_LABEL = "nvidia.com/gpu.replicas"  # GPU feature discovery: time-slicing replicas
# MIG under the device plugin's `mixed` strategy: the indices of a node's MIG-enabled GPUs
# (what the MIG manager configured). Each is offered as MIG_PER_GPU instances of MIG_RESOURCE,
# not as nvidia.com/gpu.
MIG_GPUS_ANNOTATION = "twin.sickbay.dev/mig-gpus"
MIG_RESOURCE = "nvidia.com/mig-1g.10gb"
MIG_PER_GPU = 7
# Time-slicing with `renameByDefault`: the replicas are offered as this resource instead. (The
# kubelet's grace for the resource name given up is not modelled: it shows 0 at once.)
RENAMED_ANNOTATION = "twin.sickbay.dev/shared-resource"
SHARED_RESOURCE = "nvidia.com/gpu.shared"
DRIVER_TAINT_KEY = "gpu.nvidia.com/xid"


def alert_name(xid: int) -> str:
    if xid == 79:
        return ALERT_FELL_OFF_BUS
    if xid in (48, 94, 95):
        return ALERT_ECC_DBE
    if xid == 64:
        return ALERT_ROW_REMAP
    if xid == 74:
        return ALERT_NVLINK
    return ALERT_XID


def pci_bus_id(index: int) -> str:
    """The PCI address seed.py gives GPU `index` (the device plugin profile has no slice)."""
    return f"0000:{0x18 + index * 0x10 % 0xE0:02x}:00.0"


@dataclass
class Gpu:
    """One physical GPU and the devices (resource IDs) that share it."""

    node: str
    index: int
    uuid: str
    model: str
    pci_bus_id: str
    devices: list[str] = field(default_factory=list)  # driver/pool/device, or plugin IDs
    device_names: list[str] = field(default_factory=list)  # DRA device names
    mig: bool = False  # device plugin, `mixed` strategy: offered as MIG instances


@dataclass
class Fault:
    node: str
    gpu_uuid: str
    index: int
    model: str
    pci_bus_id: str
    kind: str  # xid | degrade | vanish
    xid: int | None
    degrade: str | None
    health: str  # Unhealthy | Unknown | Healthy
    message: str
    fatal: bool
    since: str
    devices: list[str]
    driver_taint: bool = False
    alerts: list[str] = field(default_factory=list)
    removed: list[tuple[str, dict[str, Any]]] = field(default_factory=list)  # (slice, device)

    @property
    def key(self) -> str:
        return f"{self.node}/{self.gpu_uuid}"

    def to_json(self) -> dict[str, Any]:
        out = asdict(self)
        out.pop("removed")
        out["key"] = self.key
        return out


class FaultError(ValueError):
    """A fault request that names nothing or asks for something impossible (HTTP 4xx)."""

    def __init__(self, message: str, code: int = 400) -> None:
        super().__init__(message)
        self.code = code


class FaultInjector:
    def __init__(self, manager: Any) -> None:
        self.manager = manager
        self._lock = threading.RLock()
        self._faults: dict[str, Fault] = {}  # key -> fault
        self._by_resource: dict[tuple[str, str], Fault] = {}  # (node, resource id) -> fault
        self.epoch = 0  # bumped on every fail/recover: lets the kubelet skip unchanged pods
        self.api = ApiFaults()
        extensions = getattr(manager.twin, "extensions", None)
        if isinstance(extensions, dict):
            extensions["api_faults"] = self.api

    @property
    def store(self) -> Any:
        return self.manager.store

    # -- inventory ---------------------------------------------------------------------------

    def gpus(self, node: str) -> list[Gpu]:
        """Physical GPUs of a node (vanished ones included), ordered by index."""
        if self.manager.dra:
            return self._dra_gpus(node)
        return self._plugin_gpus(node)

    def _dra_gpus(self, node: str) -> list[Gpu]:
        found: dict[str, Gpu] = {}
        entries: list[tuple[str, str, dict[str, Any]]] = []
        for piece in self.store.list(SLICES, field_selector=f"spec.nodeName={node}").items:
            spec = piece.get("spec") or {}
            pool = (spec.get("pool") or {}).get("name", node)
            for dev in spec.get("devices") or []:
                entries.append((spec.get("driver", ""), pool, dev))
        with self._lock:
            for fault in self._faults.values():
                if fault.node == node:
                    for _slice, dev in fault.removed:
                        entries.append((dev.get("__driver", ""), dev.get("__pool", node), dev))
        for driver, pool, dev in entries:
            attrs = (dev.get("basic", dev)).get("attributes") or {}

            def attr(name: str, attrs: dict[str, Any] = attrs, driver: str = driver) -> Any:
                raw = attrs.get(name) or attrs.get(f"{driver}/{name}") or {}
                return next(iter(raw.values()), None) if isinstance(raw, dict) else None

            physical = attr("parentUUID") or attr("uuid") or f"{node}/{dev.get('name')}"
            index = attr("parentIndex")
            if index is None:
                index = attr("index")
            gpu = found.get(physical)
            if gpu is None:
                gpu = found[physical] = Gpu(
                    node=node,
                    index=int(index) if index is not None else len(found),
                    uuid=str(physical),
                    model=str(attr("productName") or ""),
                    pci_bus_id=str(attr("pcieBusID") or ""),
                )
            resource_id = f"{driver}/{pool}/{dev.get('name')}"
            if resource_id not in gpu.devices:
                gpu.devices.append(resource_id)
                gpu.device_names.append(str(dev.get("name")))
        return sorted(found.values(), key=lambda g: g.index)

    def _plugin_gpus(self, node: str, obj: dict[str, Any] | None = None) -> list[Gpu]:
        obj = obj if obj is not None else self.store.try_get(NODES, node)
        if obj is None:
            return []
        labels = meta(obj).get("labels") or {}
        uuids = [
            u
            for u in ((meta(obj).get("annotations") or {}).get(GPU_UUIDS_ANNOTATION) or "").split(
                ","
            )
            if u
        ]
        if not uuids:
            count = int(str((obj.get("status") or {}).get("capacity", {}).get(GPU_RESOURCE, "0")))
            ns = uuidlib.UUID("6f1c54f4-5ad9-4a55-9c57-7f7b0c6e2a11")
            uuids = ["GPU-" + str(uuidlib.uuid5(ns, f"{node}/{i}")) for i in range(count)]
        replicas = int(labels.get(REPLICAS_LABEL, "1") or 1)
        shared = hami.ANN_REGISTER in (meta(obj).get("annotations") or {})
        model = labels.get("nvidia.com/gpu.product", "").replace("-", " ")
        mig = (meta(obj).get("annotations") or {}).get(MIG_GPUS_ANNOTATION) or ""
        mig_indices = {int(i) for i in mig.split(",") if i.strip().isdigit()}
        gpus = []
        for i, gpu_uuid in enumerate(uuids):
            ids = [gpu_uuid] if replicas <= 1 else [f"{gpu_uuid}::{r}" for r in range(replicas)]
            if shared:  # HAMi's plugin: `<UUID>-<i>`, one per share
                ids = hami.device_ids(gpu_uuid)
            if i in mig_indices:
                ids = [gpu_uuid]  # its instances are not modelled one by one
            gpus.append(Gpu(node, i, gpu_uuid, model, pci_bus_id(i), ids, ids, i in mig_indices))
        return gpus

    def mig_gpus(self, node: str, obj: dict[str, Any] | None = None) -> list[Gpu]:
        """The node's MIG-enabled GPUs (device plugin, `mixed` strategy)."""
        if self.manager.dra:
            return []
        return [g for g in self._plugin_gpus(node, obj) if g.mig]

    def enable_mig(self, node: str, gpus: list[int]) -> dict[str, Any]:
        """What the MIG manager and GPU feature discovery do for a device-plugin node on the
        `mixed` strategy: MIG mode on for GPUs `gpus` (by index), each then offered as
        MIG_PER_GPU `nvidia.com/mig-1g.10gb` instances instead of one `nvidia.com/gpu`; the
        labels `nvidia.com/mig.strategy=mixed`, `nvidia.com/mig.capable=true` and
        `nvidia.com/mig-1g.10gb.count`; `nvidia.com/gpu.count` still counts every GPU. An
        empty list turns MIG off again. Returns the node."""
        if self.manager.dra:
            raise FaultError("MIG under the device plugin's mixed strategy: not a DRA twin")
        known = {g.index for g in self._plugin_gpus(node)}
        if not known:
            raise FaultError(f'node "{node}" has no GPUs', 404)
        unknown = sorted(set(gpus) - known)
        if unknown:
            raise FaultError(f"node {node} has no GPU {unknown[0]} (it has {sorted(known)})")
        instances = MIG_PER_GPU * len(set(gpus))
        profile = MIG_RESOURCE.split("/", 1)[1]

        def change(obj: dict[str, Any]) -> dict[str, Any]:
            m = obj.setdefault("metadata", {})
            annotations, labels = m.setdefault("annotations", {}), m.setdefault("labels", {})
            annotations[MIG_GPUS_ANNOTATION] = ",".join(str(i) for i in sorted(set(gpus)))
            labels["nvidia.com/mig.capable"] = "true"
            labels["nvidia.com/mig.strategy"] = "mixed"
            labels[f"nvidia.com/{profile}.count"] = str(instances)
            return obj

        changed = self.store.mutate(NODES, node, change)
        self.epoch += 1
        self.manager.poke()
        return changed

    def share_gpus(self, node: str, replicas: int, *, rename: bool = False) -> dict[str, Any]:
        """The device plugin's time-slicing on a node, as its config and GPU feature discovery
        show it: each GPU offered `replicas` times (device ids `<UUID>::<n>`), the label
        `nvidia.com/gpu.replicas`, the product label's `-SHARED` suffix; with `rename`
        (`renameByDefault`) the replicas are nvidia.com/gpu.shared, and an nvidia.com/gpu the
        node had stays in capacity at 0, as the kubelet keeps a resource once registered.
        `nvidia.com/gpu.count` still counts the GPUs. Returns the node."""
        if self.manager.dra:
            raise FaultError("time-slicing under the device plugin: not a DRA twin")
        if replicas < 1:
            raise FaultError("replicas must be at least 1")
        if not self._plugin_gpus(node):
            raise FaultError(f'node "{node}" has no GPUs', 404)

        def change(obj: dict[str, Any]) -> dict[str, Any]:
            m = obj.setdefault("metadata", {})
            annotations, labels = m.setdefault("annotations", {}), m.setdefault("labels", {})
            labels[REPLICAS_LABEL] = str(replicas)
            product = labels.get("nvidia.com/gpu.product", "").removesuffix("-SHARED")
            if product:
                labels["nvidia.com/gpu.product"] = product + ("-SHARED" if replicas > 1 else "")
            if rename:
                annotations[RENAMED_ANNOTATION] = SHARED_RESOURCE
            else:
                annotations.pop(RENAMED_ANNOTATION, None)
            return obj

        changed = self.store.mutate(NODES, node, change)
        self.epoch += 1
        self.manager.poke()
        return changed

    def plugin_resource(self, obj: dict[str, Any]) -> str:
        """The resource a device-plugin node's nvidia.com/gpu devices are offered as."""
        return str((meta(obj).get("annotations") or {}).get(RENAMED_ANNOTATION) or GPU_RESOURCE)

    def plugin_device_ids(
        self, node: str, include_vanished: bool = True, obj: dict[str, Any] | None = None
    ) -> list[str]:
        """Device-plugin nvidia.com/gpu device IDs of a node (the kubelet stand-in allocates
        from these); a MIG-enabled GPU is offered as MIG instances instead."""
        ids = [d for g in self._plugin_gpus(node, obj) if not g.mig for d in g.devices]
        if include_vanished:
            return ids
        return [d for d in ids if self.health(node, d)[0] != "Unknown"]

    def resolve(self, node: str, gpu: str | int | None) -> list[Gpu]:
        """GPUs named by index, UUID, device name, resource ID, or `all`/None (whole node)."""
        gpus = self.gpus(node)
        if not gpus:
            if self.store.try_get(NODES, node) is None:
                raise FaultError(f'node "{node}" not found', 404)
            raise FaultError(f'node "{node}" has no GPUs')
        if gpu is None or str(gpu) in ("all", "*"):
            return gpus
        text = str(gpu)
        for g in gpus:
            if (
                text == str(g.index)
                or text == g.uuid
                or text in g.devices
                or text in g.device_names
            ):
                return [g]
        known = ", ".join(f"{g.index} ({g.uuid})" for g in gpus)
        raise FaultError(f'GPU "{text}" not found on node "{node}"; it has: {known}', 404)

    # -- fail / recover ----------------------------------------------------------------------

    def fail(
        self,
        node: str,
        gpu: str | int | None,
        xid: int | None = None,
        degrade: str | None = None,
        vanish: bool = False,
        driver_taint: bool = False,
    ) -> list[Fault]:
        targets = self._checked(node, gpu, xid, degrade, vanish)
        made = self._fail(node, targets, xid, degrade, vanish, driver_taint)
        self.manager.poke()
        return made

    def fail_many(self, faults: list[dict[str, Any]]) -> list[Fault]:
        """Several faults at once (`fail`'s keyword arguments each): all are checked before
        any is made, so a bad one makes none."""
        checked = []
        for n, spec in enumerate(faults):
            try:
                targets = self._checked(
                    spec["node"],
                    spec.get("gpu"),
                    spec.get("xid"),
                    spec.get("degrade"),
                    bool(spec.get("vanish")),
                )
            except FaultError as err:
                raise FaultError(f"fault {n}: {err}", err.code) from err
            checked.append((spec, targets))
        made: list[Fault] = []
        for spec, targets in checked:
            made += self._fail(
                spec["node"],
                targets,
                spec.get("xid"),
                spec.get("degrade"),
                bool(spec.get("vanish")),
                bool(spec.get("driver_taint")),
            )
        self.manager.poke()
        return made

    def _checked(
        self, node: str, gpu: str | int | None, xid: int | None, degrade: str | None, vanish: bool
    ) -> list[Gpu]:
        chosen = [
            k
            for k, v in (("xid", xid), ("degrade", degrade), ("vanish", vanish or None))
            if v is not None
        ]
        if len(chosen) != 1:
            raise FaultError("give exactly one of xid, degrade or vanish")
        if degrade is not None and degrade not in DEGRADE_XIDS:
            raise FaultError(f"degrade must be one of {', '.join(DEGRADE_XIDS)}, not {degrade!r}")
        if xid is not None and (not isinstance(xid, int) or isinstance(xid, bool) or xid <= 0):
            raise FaultError(f"xid must be a positive integer, not {xid!r}")
        return self.resolve(node, gpu)

    def _fail(
        self,
        node: str,
        targets: list[Gpu],
        xid: int | None,
        degrade: str | None,
        vanish: bool,
        driver_taint: bool,
    ) -> list[Fault]:
        now = rfc3339(self.manager.clock.now())
        made: list[Fault] = []
        with self._lock:
            for g in targets:
                if g.uuid and f"{node}/{g.uuid}" in self._faults:
                    self._clear(self._faults[f"{node}/{g.uuid}"])
                code = DEGRADE_XIDS[degrade] if degrade else xid
                if vanish:
                    health, message, fatal = (
                        "Unknown",
                        "device no longer reported by the driver",
                        False,
                    )
                elif code in APPLICATION_XIDS:
                    health, message, fatal = "Healthy", "", False
                else:
                    health, message, fatal = "Unhealthy", f"XID {code}", degrade is None
                fault = Fault(
                    node=node,
                    gpu_uuid=g.uuid,
                    index=g.index,
                    model=g.model,
                    pci_bus_id=g.pci_bus_id,
                    kind="vanish" if vanish else ("degrade" if degrade else "xid"),
                    xid=code,
                    degrade=degrade,
                    health=health,
                    message=message,
                    fatal=fatal,
                    since=now,
                    devices=list(g.devices),
                    driver_taint=driver_taint and self.manager.dra and code is not None,
                )
                self._faults[fault.key] = fault
                self.epoch += 1
                for resource_id in fault.devices:
                    self._by_resource[(node, resource_id)] = fault
                if vanish and self.manager.dra:
                    self._unpublish(fault, g)
                if fault.driver_taint:
                    self._slice_taints(fault, add=True)
                if code is not None and not vanish:
                    fault.alerts = self._fire_alerts(fault)
                made.append(fault)
                log.info("fault on %s GPU %s (%s): %s", node, g.index, g.uuid, fault.kind)
        return made

    def recover(self, node: str, gpu: str | int | None = None) -> list[Fault]:
        with self._lock:
            if gpu is None or str(gpu) in ("all", "*"):
                targets = [f for f in self._faults.values() if f.node == node]
            else:
                wanted = {g.uuid for g in self.resolve(node, gpu)}
                targets = [
                    f for f in self._faults.values() if f.node == node and f.gpu_uuid in wanted
                ]
            for fault in targets:
                self._clear(fault)
        self.manager.poke()
        return targets

    def forget_node(self, node: str) -> list[Fault]:
        """The node's machine is gone (replaced): its GPUs' faults go with it, nothing is
        republished for it, and their alerts resolve (the exporter on it stopped)."""
        with self._lock:
            targets = [f for f in self._faults.values() if f.node == node]
            for fault in targets:
                self._faults.pop(fault.key, None)
                self.epoch += 1
                for resource_id in fault.devices:
                    if self._by_resource.get((fault.node, resource_id)) is fault:
                        del self._by_resource[(fault.node, resource_id)]
                alerts = self.manager.alerts
                if alerts is not None and fault.alerts:
                    alerts.resolve(fault.alerts)
        self.manager.poke()
        return targets

    def _clear(self, fault: Fault) -> None:
        self._faults.pop(fault.key, None)
        self.epoch += 1
        for resource_id in fault.devices:
            if self._by_resource.get((fault.node, resource_id)) is fault:
                del self._by_resource[(fault.node, resource_id)]
        if fault.removed:
            self._republish(fault)
        if fault.driver_taint:
            self._slice_taints(fault, add=False)
        alerts = self.manager.alerts
        if alerts is not None and fault.alerts:
            alerts.resolve(fault.alerts)
        log.info("recovered %s GPU %s", fault.node, fault.index)

    def faults(self) -> list[Fault]:
        with self._lock:
            return list(self._faults.values())

    def health(self, node: str, resource_id: str) -> tuple[str, str, bool]:
        """(health, message, fatal) of a device as its driver / device plugin reports it."""
        fault = self._by_resource.get((node, resource_id))
        if fault is None and "/" in resource_id:
            # DRA resource IDs carry the pool (= node) themselves.
            pool = resource_id.split("/")[1] if resource_id.count("/") >= 2 else node
            fault = self._by_resource.get((pool, resource_id))
        if fault is None:
            return "Healthy", "", False
        return fault.health, fault.message, fault.fatal

    def set_known_faults(
        self,
        ignore_device_taint_rules: bool | None = None,
        expired_toleration_bug: bool | None = None,
    ) -> dict[str, bool]:
        opts = self.manager.options
        if ignore_device_taint_rules is not None:
            opts.ignore_device_taint_rules = bool(ignore_device_taint_rules)
        if expired_toleration_bug is not None:
            opts.expired_toleration_bug = bool(expired_toleration_bug)
        scheduler = getattr(self.manager, "scheduler", None)
        if scheduler is not None:
            scheduler.invalidate()  # both switches change what the scheduler may allocate
        self.manager.poke()
        return self.known_faults()

    def known_faults(self) -> dict[str, bool]:
        opts = self.manager.options
        return {
            "ignoreDeviceTaintRules": opts.ignore_device_taint_rules,
            "expiredTolerationBug": opts.expired_toleration_bug,
        }

    # -- API server faults (watches) ---------------------------------------------------------

    def drop_watches(self) -> int:
        """Cut every open watch connection mid-stream (a network drop); objects are untouched.
        Returns how many were cut."""
        return int(self.store.drop_watches(abort=True))

    def restart_api_server(self, down_seconds: float = 0.0, compact: bool = True) -> int:
        """Act as a kube-apiserver restart: open watches are cut, requests are refused
        (connection reset) for `down_seconds`, and with `compact` the watch cache starts again
        at the current resourceVersion, so resuming from an older one answers 410 Expired (a
        client must re-list). Stored objects survive, as they do in etcd. Returns the watches cut.
        """
        if down_seconds < 0:
            raise FaultError("downSeconds must not be negative")
        self.api.down_until = time.monotonic() + float(down_seconds)
        cut = int(self.store.drop_watches(abort=True))
        if compact:
            self.store.compact()
        return cut

    # -- API-side effects --------------------------------------------------------------------

    def _slices_of(self, node: str) -> list[dict[str, Any]]:
        return self.store.list(SLICES, field_selector=f"spec.nodeName={node}").items

    def _unpublish(self, fault: Fault, gpu: Gpu) -> None:
        names = set(gpu.device_names)
        for piece in self._slices_of(fault.node):
            spec = piece.get("spec") or {}
            kept: list[dict[str, Any]] = []
            gone: list[dict[str, Any]] = []
            for dev in spec.get("devices") or []:
                (gone if dev.get("name") in names else kept).append(dev)
            if not gone:
                continue
            for dev in gone:
                stored = dict(dev)
                stored["__driver"] = spec.get("driver", "")
                stored["__pool"] = (spec.get("pool") or {}).get("name", fault.node)
                fault.removed.append((name_of(piece), stored))

            def update(obj: dict[str, Any], kept: list[dict[str, Any]] = kept) -> None:
                obj["spec"]["devices"] = kept
                pool = obj["spec"].setdefault("pool", {})
                pool["generation"] = int(pool.get("generation", 1)) + 1

            self.store.mutate(SLICES, name_of(piece), update)

    def _republish(self, fault: Fault) -> None:
        by_slice: dict[str, list[dict[str, Any]]] = {}
        for slice_name, dev in fault.removed:
            clean = {k: v for k, v in dev.items() if not k.startswith("__")}
            by_slice.setdefault(slice_name, []).append(clean)
        fault.removed = []
        for slice_name, devices in by_slice.items():
            if self.store.try_get(SLICES, slice_name) is None:
                continue

            def update(obj: dict[str, Any], devices: list[dict[str, Any]] = devices) -> None:
                present = {d.get("name") for d in obj["spec"].get("devices") or []}
                merged = list(obj["spec"].get("devices") or []) + [
                    d for d in devices if d.get("name") not in present
                ]
                obj["spec"]["devices"] = sorted(merged, key=lambda d: _natural(d.get("name", "")))
                pool = obj["spec"].setdefault("pool", {})
                pool["generation"] = int(pool.get("generation", 1)) + 1

            self.store.mutate(SLICES, slice_name, update)

    def _slice_taints(self, fault: Fault, add: bool) -> None:
        names = {rid.rsplit("/", 1)[-1] for rid in fault.devices}
        taint = {
            "key": DRIVER_TAINT_KEY,
            "value": str(fault.xid),
            "effect": "NoSchedule",
            "timeAdded": fault.since,
        }
        for piece in self._slices_of(fault.node):

            def update(obj: dict[str, Any]) -> None:
                for dev in obj["spec"].get("devices") or []:
                    if dev.get("name") not in names:
                        continue
                    taints = [
                        t for t in dev.get("taints") or [] if t.get("key") != DRIVER_TAINT_KEY
                    ]
                    if add:
                        taints.append(dict(taint))
                    if taints:
                        dev["taints"] = taints
                    else:
                        dev.pop("taints", None)

            self.store.mutate(SLICES, name_of(piece), update)

    # -- alerts ------------------------------------------------------------------------------

    def consumers(self, fault: Fault) -> list[tuple[dict[str, Any], str]]:
        """(pod, container) pairs using any device of the faulted GPU right now."""
        devices = set(fault.devices)
        out: list[tuple[dict[str, Any], str]] = []
        if self.manager.dra:
            for claim in self.store.list(CLAIMS, copy_objects=False).items:
                if not any(str(d) in devices for d, _ in claim_devices(claim)):
                    continue
                for ref in (claim.get("status") or {}).get("reservedFor") or []:
                    pod = self.store.try_get(PODS, ref.get("name", ""), ns_of(claim))
                    if pod is None or uid_of(pod) != ref.get("uid"):
                        continue
                    for container in _containers_using(pod, name_of(claim)):
                        out.append((pod, container))
            return out
        kubelet = getattr(self.manager, "kubelet", None)
        runtimes = getattr(kubelet, "_pods", {}) if kubelet else {}
        by_uid = {
            uid_of(p): p
            for p in self.store.list(PODS, field_selector=f"spec.nodeName={fault.node}").items
        }
        for uid, runtime in list(runtimes.items()):  # the controller thread may change it
            if uid in by_uid and devices.intersection(runtime.gpu_ids):
                pod = by_uid[uid]
                for container in pod["spec"].get("containers") or []:
                    limits = (container.get("resources") or {}).get("limits") or {}
                    if GPU_RESOURCE in limits:
                        out.append((pod, container["name"]))
        return out

    def _fire_alerts(self, fault: Fault) -> list[str]:
        alerts = self.manager.alerts
        if alerts is None or fault.xid is None:
            return []
        base = {
            "alertname": alert_name(fault.xid),
            "Hostname": fault.node,
            "gpu": str(fault.index),
            "UUID": fault.gpu_uuid,
            "modelName": fault.model,
            "pci_bus_id": fault.pci_bus_id,
            "device": f"nvidia{fault.index}",
            "err_code": str(fault.xid),
            "err_msg": XID_TEXT.get(fault.xid, "Xid error"),
            "instance": f"{fault.node}:9400",
            "job": "dcgm-exporter",
            "severity": "warning" if not fault.fatal else "critical",
        }
        annotations = {
            "summary": f"GPU {fault.index} on {fault.node} reported Xid {fault.xid}",
            "description": f"{XID_TEXT.get(fault.xid, 'Xid error')} (Xid {fault.xid}) on GPU "
            f"{fault.gpu_uuid} ({fault.model}) of node {fault.node}.",
            "value": str(fault.xid),
        }
        fingerprints = []
        consumers = self.consumers(fault)
        seen: set[tuple[str, str, str]] = set()
        for pod, container in consumers:
            ident = (ns_of(pod), name_of(pod), container)
            if ident in seen:
                continue
            seen.add(ident)
            labels = {**base, "namespace": ident[0], "pod": ident[1], "container": container}
            fingerprints.append(alerts.fire(labels, annotations))
        if not consumers:
            fingerprints.append(alerts.fire(base, annotations))
        return fingerprints


def _containers_using(pod: dict[str, Any], claim_name: str) -> list[str]:
    entries = [
        e.get("name")
        for e in pod["spec"].get("resourceClaims") or []
        if pod_claim_name(pod, e) == claim_name
    ]
    out = []
    for container in pod["spec"].get("containers") or []:
        refs = {r.get("name") for r in (container.get("resources") or {}).get("claims") or []}
        if refs.intersection(entries):
            out.append(container["name"])
    return out


def _natural(name: str) -> list[Any]:
    return [int(part) if part.isdigit() else part for part in re.split(r"(\d+)", name)]


# --------------------------------------------------------------------------------------------
# API fault injection
# --------------------------------------------------------------------------------------------

API_FAULT_KINDS = ("500", "429", "409", "timeout", "reset", "delay")


@dataclass
class ApiFaultRule:
    kind: str
    verb: str = "*"  # get list watch create update patch delete deletecollection, or *
    resource: str = "*"  # plural, optionally with /subresource ("pods/eviction"), or *
    rate: float = 1.0  # probability per matching request
    count: int | None = None  # stop after this many injections (None: unlimited)
    timeout_seconds: float = 30.0  # real seconds a `timeout` request hangs before its 504
    injected: int = 0
    id: int = 0
    match: str = ""  # text the URL-decoded path + query must contain ("" = any request)

    def matches(self, verb: str, resource: str, target: str = "") -> bool:
        if self.verb not in ("*", verb):
            return False
        if self.match and self.match not in target:
            return False
        return self.resource in ("*", resource)


class ApiFaults:
    """Rules for failing API requests on purpose, switchable at run time (thread-safe)."""

    def __init__(self, seed: int | None = None) -> None:
        self._lock = threading.Lock()
        self._rules: list[ApiFaultRule] = []
        self._next_id = 1
        self._random = random.Random(seed)
        self.injected = 0
        # Until this monotonic time every request's connection is reset: the API server is
        # down (restart_api_server); 0 = up.
        self.down_until = 0.0

    def add(
        self,
        kind: str,
        verb: str = "*",
        resource: str = "*",
        rate: float = 1.0,
        count: int | None = None,
        timeout_seconds: float = 30.0,
        match: str = "",
    ) -> ApiFaultRule:
        kind = str(kind)
        if kind not in API_FAULT_KINDS:
            raise FaultError(f"kind must be one of {', '.join(API_FAULT_KINDS)}, not {kind!r}")
        if not 0.0 <= float(rate) <= 1.0:
            raise FaultError(f"rate must be between 0 and 1, not {rate!r}")
        if count is not None and int(count) < 1:
            raise FaultError("count must be at least 1")
        with self._lock:
            rule = ApiFaultRule(
                kind,
                verb or "*",
                resource or "*",
                float(rate),
                None if count is None else int(count),
                float(timeout_seconds),
                id=self._next_id,
                match=str(match or ""),
            )
            self._next_id += 1
            self._rules.append(rule)
            return rule

    def remove(self, rule_id: int | None = None) -> int:
        """Remove one rule, or all of them (None); returns how many went."""
        with self._lock:
            before = len(self._rules)
            self._rules = [r for r in self._rules if rule_id is not None and r.id != rule_id]
            return before - len(self._rules)

    def rules(self) -> list[dict[str, Any]]:
        with self._lock:
            return [asdict(r) for r in self._rules]

    def decide(self, verb: str, resource: str, target: str = "") -> ApiFaultRule | None:
        """The rule that fires for this request, if any (counts it); `target` is the request's
        URL-decoded path and query, for rules with a `match`."""
        with self._lock:
            if time.monotonic() < self.down_until:
                self.injected += 1
                return ApiFaultRule("reset", id=0)
            for rule in self._rules:
                if not rule.matches(verb, resource, target):
                    continue
                if rule.count is not None and rule.injected >= rule.count:
                    continue
                if self._random.random() >= rule.rate:
                    continue
                rule.injected += 1
                self.injected += 1
                return rule
        return None

    def intercept(self, handler: Any, verb: str, resource: str, name: str | None = None) -> None:
        """Server hook: raise/act if a rule fires; return normally otherwise.

        `verb` is the Kubernetes verb (get, list, watch, create, update, patch, delete,
        deletecollection), `resource` the plural with an optional `/subresource`. Raises
        `errors.ApiError` (500 / 429 with Retry-After / 409 / 504 after the hang), or, for
        `reset`, shuts the socket and raises ConnectionResetError so the handler stops.
        """
        # Once per request, even if both the server and a hook call this (the server makes a
        # fresh `_info` dict for every request it handles).
        marker = id(getattr(handler, "_info", None)) if hasattr(handler, "_info") else None
        if marker is not None:
            if getattr(handler, "_sickbay_fault_checked", None) == marker:
                return
            handler._sickbay_fault_checked = marker
        rule = self.decide(verb, resource, unquote(str(getattr(handler, "path", "") or "")))
        if rule is None:
            return
        plural = resource.split("/")[0]
        log.info("api fault %s injected on %s %s", rule.kind, verb, resource)
        if rule.kind == "delay":
            # A slow API server: the request is held, then served as usual (even if its client
            # went away meanwhile, as a real server finishes a request it started).
            time.sleep(rule.timeout_seconds)
            return
        if rule.kind == "500":
            raise errors.ApiError(
                500, "InternalError", "Internal error occurred: injected by the cluster twin"
            )
        if rule.kind == "429":
            headers = getattr(handler, "_extra_headers", None)
            if isinstance(headers, dict):
                headers["Retry-After"] = "1"
            raise errors.ApiError(
                429,
                "TooManyRequests",
                "Too many requests, please try again later.",
                {"retryAfterSeconds": 1},
            )
        if rule.kind == "409":
            raise errors.conflict(plural, name or "", "")
        if rule.kind == "timeout":
            time.sleep(rule.timeout_seconds)
            raise errors.ApiError(
                504,
                "Timeout",
                "the server was unable to return a response in the time allotted, but may still "
                "be processing the request",
            )
        conn = getattr(handler, "connection", None)
        if conn is not None:
            try:
                conn.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
        if hasattr(handler, "close_connection"):
            handler.close_connection = True
        raise ConnectionResetError("connection reset injected by the cluster twin")


def register_twin_commands(twin_subparsers: Any) -> None:
    """twin/cli.py extension hook: `sickbay-dev twin fail|recover|...` (fault_cli.py)."""
    from twin.fault_cli import register_fault_commands

    register_fault_commands(twin_subparsers)
