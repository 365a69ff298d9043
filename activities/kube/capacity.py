"""Free capacity, counted from the objects, never read from a scheduler message (which reads
the same for busy and for tainted devices).

DRA: devices of the class (driver + simple attribute equalities parsed from the class's CEL;
anything else in the expression is not evaluated, so the count may be high for exotic
classes) that are published, unallocated, untainted (slice taints and DeviceTaintRules with
NoSchedule/NoExecute) and on schedulable nodes without Sickbay's node taint, optionally in one
node pool. Device plugin: per schedulable node, allocatable `nvidia.com/gpu` minus what
non-terminal pods there request (a Terminating pod still holds its GPU).
"""

from __future__ import annotations

import re
from typing import Any

from activities.kube.client import Kube
from activities.kube.consumers import claim_devices, list_claims
from activities.kube.devices import SliceDevice, gpu_capacity, list_slice_devices, node_pool_of
from activities.kube.discovery import ClusterApis
from activities.kube.nodes import quarantined_on
from activities.kube.pods import gpu_request_count, is_terminal, meta
from activities.kube.quarantine import RULES, _api
from workflows.constants import TAINT_KEY
from workflows.models import FreeCapacity, FreeCapacityInput

_DRIVER = re.compile(r"device\.driver\s*==\s*[\"']([^\"']+)[\"']")
_ATTR = re.compile(
    r"device\.attributes\[[\"']([^\"']+)[\"']\](?:\.(\w+)|\[[\"'](\w+)[\"']\])\s*==\s*"
    r"(?:[\"']([^\"']*)[\"']|(\d+)|(true|false))"
)
BLOCKING = ("NoSchedule", "NoExecute")


def class_filter(device_class: dict[str, Any]) -> tuple[set[str], dict[str, Any]]:
    drivers: set[str] = set()
    attrs: dict[str, Any] = {}
    for sel in (device_class.get("spec") or {}).get("selectors") or []:
        expr = (sel.get("cel") or {}).get("expression") or ""
        drivers.update(_DRIVER.findall(expr))
        for _dom, a1, a2, s, i, b in _ATTR.findall(expr):
            name = (a1 or a2).lower()
            attrs[name] = s if s or not (i or b) else (int(i) if i else b == "true")
    return drivers, attrs


def _matches_class(dev: SliceDevice, drivers: set[str], attrs: dict[str, Any]) -> bool:
    if drivers and dev.driver not in drivers:
        return False
    return all(dev.attributes.get(k) == v for k, v in attrs.items())


def _rule_taints(kube: Kube, apis: ClusterApis) -> list[dict[str, Any]]:
    if not apis.taint_version:
        return []
    body = kube.call(
        _api(kube, apis.taint_version).list_device_taint_rule, verb="list", resource=RULES
    )
    return [
        (r.get("spec") or {}).get("deviceSelector") or {}
        for r in body.get("items") or []
        if ((r.get("spec") or {}).get("taint") or {}).get("effect") in BLOCKING
        and (r.get("spec") or {}).get("deviceSelector")
    ]


def _selected(sel: dict[str, Any], dev: SliceDevice) -> bool:
    return all(
        not sel.get(k) or sel.get(k) == getattr(dev, k) for k in ("driver", "pool", "device")
    )


def _node_usable(node: dict[str, Any], pool: str | None) -> bool:
    spec = node.get("spec") or {}
    if spec.get("unschedulable"):
        return False
    if any(t.get("key") == TAINT_KEY for t in spec.get("taints") or []):
        return False
    return not pool or node_pool_of(node) == pool


def free_capacity(kube: Kube, apis: ClusterApis, inp: FreeCapacityInput) -> FreeCapacity:
    nodes = kube.call(kube.core.list_node, verb="list", resource="nodes").get("items") or []
    usable = {meta(n).get("name") for n in nodes if _node_usable(n, inp.node_pool)}
    if not apis.dra:
        pods = kube.call(kube.core.list_pod_for_all_namespaces, verb="list", resource="pods")
        used: dict[str, int] = {}
        for pod in pods.get("items") or []:
            node = (pod.get("spec") or {}).get("nodeName")
            if isinstance(node, str) and node in usable and not is_terminal(pod):
                used[node] = used.get(node, 0) + gpu_request_count(pod)
        free = 0
        for n in nodes:
            name = meta(n).get("name")
            if isinstance(name, str) and name in usable:
                cap, alloc = gpu_capacity(n)
                healthy = min(alloc or 0, (cap or 0) - len(quarantined_on(n)))
                free += max(0, healthy - used.get(name, 0))
        return FreeCapacity(free_devices=free)
    drivers: set[str] = set()
    attrs: dict[str, Any] = {}
    if inp.device_class:
        cls = kube.call(
            kube.resource_v1.read_device_class,
            inp.device_class,
            verb="get",
            resource="deviceclasses.resource.k8s.io",
            name=inp.device_class,
        )
        drivers, attrs = class_filter(cls)
    all_devices = list_slice_devices(kube)
    devices = [d for d in all_devices if d.node in usable]
    # GPUs Sickbay quarantined without a DeviceTaintRule (fallback) are recorded on the node.
    held = {(meta(n).get("name"), u.lower()) for n in nodes for u in quarantined_on(n)}
    devices = [d for d in devices if (d.node, (d.physical_uuid or "").lower()) not in held]
    devices = [d for d in devices if _matches_class(d, drivers, attrs)]
    allocated = {dev for c in list_claims(kube) for dev in claim_devices(c)}
    selectors = _rule_taints(kube, apis)
    # Partitions share their GPU: the whole GPU is busy when any slice of it is allocated,
    # and every slice is busy when the whole GPU is.
    busy_whole: set[tuple[str | None, str | None]] = set()
    busy_any: set[tuple[str | None, str | None]] = set()
    for d in all_devices:
        if (d.driver, d.pool, d.device) in allocated:
            busy_any.add((d.node, d.physical_uuid))
            if not d.is_partition:
                busy_whole.add((d.node, d.physical_uuid))
    free = 0
    for d in devices:
        if (d.driver, d.pool, d.device) in allocated:
            continue
        group = (d.node, d.physical_uuid)
        if d.physical_uuid and (group in busy_whole or (not d.is_partition and group in busy_any)):
            continue
        if any(t.get("effect") in BLOCKING for t in d.taints):
            continue
        if any(_selected(sel, d) for sel in selectors):
            continue
        free += 1
    return FreeCapacity(free_devices=free)
