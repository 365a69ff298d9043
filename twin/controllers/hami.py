"""HAMi's device plugin and scheduler in the twin (`hami` profile; formats in twin/hami.py).

Device plugin: every REGISTER_PERIOD simulated seconds each HAMi node's
`hami.io/node-nvidia-register` is rewritten from the node's GPUs as the twin's faults leave
them: a GPU with an Unhealthy share is registered `health` false (left out, omitempty), a
vanished one is not registered at all. The rewrite is a merge of that one annotation, as
HAMi's `PatchNodeAnnotations` does: the node's other annotations (`hami.io/device-cordon`)
stay. When a bound pod's container has started, its `hami.io/vgpu-devices-to-allocate` is
emptied (one empty segment per container) and `hami.io/bind-phase` becomes `success`.

Scheduler (`schedulerName: hami-scheduler`): for each pending pod, the first node (by name)
that is Ready, not cordoned, whose taints the pod tolerates, whose labels match the pod's
node selector/affinity and whose *registered* GPUs fit every container's request
(`nvidia.com/gpu` shares on distinct GPUs, `nvidia.com/gpumem` MB or the whole memory,
`nvidia.com/gpucores` percent). A GPU fits when registered healthy, not in the node's
`hami.io/device-cordon`, allowed by the pod's `nvidia.com/use-gpuuuid` /
`nvidia.com/nouse-gpuuuid`, and it has a free share, memory and cores left after the pods
the annotations already place on it. `hami.io/gpu-scheduler-policy: binpack` fills the most
used GPU first; the default (spread) the least used. The choice is written to the pod's
annotations, then the pod is bound; a pod nothing fits is marked Unschedulable and tried
again after `RETRY_SECONDS`.
"""

from __future__ import annotations

import logging
from collections import Counter
from typing import Any

from twin import hami
from twin.controllers.allocator import untolerated
from twin.controllers.common import (
    GPU_RESOURCE,
    NODES,
    PODS,
    is_deleting,
    is_terminal,
    meta,
    name_of,
    ns_of,
    quantity_int,
    set_condition,
    uid_of,
)
from twin.controllers.scheduler import _affinity_matches, _node_ready, _tolerates_cordon
from twin.errors import ApiError
from twin.seed import GPU_UUIDS_ANNOTATION, product_memory_mb

log = logging.getLogger(__name__)

RETRY_SECONDS = 1.0  # simulated; an unschedulable HAMi pod is looked at again this often


class _Usage:
    def __init__(self) -> None:
        self.shares: Counter[str] = Counter()
        self.memory: Counter[str] = Counter()
        self.cores: Counter[str] = Counter()

    def add(self, uuid: str, memory: int, cores: int) -> None:
        self.shares[uuid] += 1
        self.memory[uuid] += memory
        self.cores[uuid] += cores


class HamiController:
    def __init__(self, manager: Any) -> None:
        self.manager = manager
        self._registered: dict[str, float] = {}  # node -> monotonic time of its registration
        self.registrations: Counter[str] = Counter()  # node -> registrations written (tests)
        self._tried: dict[str, float] = {}  # pod uid -> monotonic time of its last attempt

    def sync(self, ctx: Any) -> float | None:
        waits = [self._register(ctx), self._allocated(ctx), self._schedule(ctx)]
        due = [w for w in waits if w is not None]
        return min(due) if due else None

    # -- device plugin ---------------------------------------------------------------------

    def _register(self, ctx: Any) -> float | None:
        earliest: float | None = None
        for node in ctx.store.list(NODES, copy_objects=False).items:
            name = name_of(node)
            annotations = meta(node).get("annotations") or {}
            if hami.ANN_REGISTER not in annotations:
                continue
            last = self._registered.get(name)
            if last is not None and ctx.mono < last + hami.REGISTER_PERIOD:
                wait = last + hami.REGISTER_PERIOD - ctx.mono
                earliest = wait if earliest is None else min(earliest, wait)
                continue
            self._registered[name] = ctx.mono
            value = self._registration(node)

            def write(obj: dict[str, Any], value: str = value) -> None:
                obj["metadata"].setdefault("annotations", {})[hami.ANN_REGISTER] = value

            try:
                ctx.store.mutate(NODES, name, write)
                self.registrations[name] += 1
            except ApiError as err:
                log.debug("hami: register %s: %s", name, err.message)
            earliest = (
                hami.REGISTER_PERIOD if earliest is None else min(earliest, hami.REGISTER_PERIOD)
            )
        return earliest

    def _registration(self, node: dict[str, Any]) -> str:
        name = name_of(node)
        labels = meta(node).get("labels") or {}
        annotations = meta(node).get("annotations") or {}
        product = labels.get("nvidia.com/gpu.product", "").replace("-", " ")
        uuids = [u for u in (annotations.get(GPU_UUIDS_ANNOTATION) or "").split(",") if u]
        faults = self.manager.faults
        gpus = []
        for index, uuid in enumerate(uuids):
            health = [faults.health(name, d)[0] for d in hami.device_ids(uuid)]
            if all(h == "Unknown" for h in health):
                continue  # vanished: the plugin no longer sees it
            gpus.append(
                {
                    "uuid": uuid,
                    "index": index,
                    "devmem": product_memory_mb(product),
                    "type": f"NVIDIA-{product}",
                    "healthy": all(h == "Healthy" for h in health),
                }
            )
        return hami.register_value(gpus)

    def _allocated(self, ctx: Any) -> float | None:
        """Allocate (the device plugin, at container start): `-to-allocate` emptied."""
        for pod in ctx.store.list(PODS, copy_objects=False).items:
            annotations = meta(pod).get("annotations") or {}
            if annotations.get(hami.ANN_BIND_PHASE) != "allocating":
                continue
            if (pod.get("status") or {}).get("phase") != "Running":
                continue
            containers = len(pod["spec"].get("containers") or [])

            def done(obj: dict[str, Any], containers: int = containers) -> None:
                ann = obj["metadata"].setdefault("annotations", {})
                ann[hami.ANN_TO_ALLOCATE] = ";" * containers
                ann[hami.ANN_BIND_PHASE] = "success"

            try:
                ctx.store.mutate(PODS, name_of(pod), done, ns_of(pod))
            except ApiError:
                pass
        return None

    # -- scheduler -------------------------------------------------------------------------

    def _schedule(self, ctx: Any) -> float | None:
        store = ctx.store
        pending = [
            p
            for p in store.list(PODS, field_selector="spec.nodeName=", copy_objects=False).items
            if p["spec"].get("schedulerName") == hami.SCHEDULER_NAME
            and not is_deleting(p)
            and not is_terminal(p)
        ]
        live = {uid_of(p) for p in pending}
        self._tried = {k: v for k, v in self._tried.items() if k in live}
        if not pending:
            return None
        pending.sort(key=lambda p: (p["metadata"].get("creationTimestamp", ""), name_of(p)))
        nodes = sorted(store.list(NODES, copy_objects=False).items, key=name_of)
        usage = self._usage(store)
        earliest: float | None = None
        for pod in pending:
            last = self._tried.get(uid_of(pod))
            if last is not None and ctx.mono < last + RETRY_SECONDS:
                wait = last + RETRY_SECONDS - ctx.mono
                earliest = wait if earliest is None else min(earliest, wait)
                continue
            self._tried[uid_of(pod)] = ctx.mono
            if not self._place(ctx, pod, nodes, usage):
                earliest = RETRY_SECONDS if earliest is None else min(earliest, RETRY_SECONDS)
        return earliest

    @staticmethod
    def _usage(store: Any) -> dict[str, _Usage]:
        usage: dict[str, _Usage] = {}
        for pod in store.list(PODS, copy_objects=False).items:
            annotations = meta(pod).get("annotations") or {}
            node = pod["spec"].get("nodeName") or annotations.get(hami.ANN_ASSIGNED_NODE)
            if not node or is_terminal(pod):
                continue
            for uuid, memory, cores in hami.allocation(annotations.get(hami.ANN_ALLOCATED) or ""):
                usage.setdefault(node, _Usage()).add(uuid, memory, cores)
        return usage

    def _place(
        self, ctx: Any, pod: dict[str, Any], nodes: list[dict[str, Any]], usage: dict[str, _Usage]
    ) -> bool:
        reasons: Counter[str] = Counter()
        for node in nodes:
            reason = self._node_reason(pod, node, ctx.now)
            choice: list[list[tuple[str, int, int]]] | None = None
            if reason is None:
                choice = self._fit(pod, node, usage.get(name_of(node)) or _Usage())
                if choice is None:
                    reason = "CardInsufficient"
            if reason is not None:
                reasons[reason] += 1
                continue
            assert choice is not None
            if not self._bind(ctx, pod, node, choice):
                return False
            for devices in choice:
                for uuid, memory, cores in devices:
                    usage.setdefault(name_of(node), _Usage()).add(uuid, memory, cores)
            return True
        detail = ", ".join(f"{n} {r}" for r, n in sorted(reasons.items()))
        self._unschedulable(ctx, pod, f"0/{len(nodes)} nodes are available: {detail}.")
        return False

    @staticmethod
    def _node_reason(pod: dict[str, Any], node: dict[str, Any], now: Any) -> str | None:
        if hami.ANN_REGISTER not in (meta(node).get("annotations") or {}):
            return "node unregistered"
        if node["spec"].get("unschedulable") and not _tolerates_cordon(pod):
            return "node(s) were unschedulable"
        if not _node_ready(node):
            return "node(s) were not ready"
        taints = node["spec"].get("taints") or []
        tolerations = pod["spec"].get("tolerations") or []
        if untolerated(taints, tolerations, ("NoSchedule", "NoExecute"), now, False):
            return "node(s) had untolerated taint"
        if not _affinity_matches(pod, node):
            return "node(s) didn't match Pod's node affinity/selector"
        return None

    @staticmethod
    def _fit(
        pod: dict[str, Any], node: dict[str, Any], used: _Usage
    ) -> list[list[tuple[str, int, int]]] | None:
        annotations = meta(pod).get("annotations") or {}
        use = hami.uuid_list(annotations.get(hami.ANN_USE_UUID))
        nouse = hami.uuid_list(annotations.get(hami.ANN_NOUSE_UUID))
        cordon = hami.uuid_list((meta(node).get("annotations") or {}).get(hami.ANN_DEVICE_CORDON))
        binpack = annotations.get(hami.ANN_POLICY) == "binpack"
        gpus = [
            g
            for g in hami.registered_gpus(node)
            if g.get("health", False)  # omitempty: no key is unhealthy
            and g["id"] not in cordon
            and (not use or g["id"] in use)
            and g["id"] not in nouse
        ]
        shares = Counter(used.shares)
        memory = Counter(used.memory)
        cores = Counter(used.cores)
        choice: list[list[tuple[str, int, int]]] = []
        for container in pod["spec"].get("containers") or []:
            limits = (container.get("resources") or {}).get("limits") or {}
            want = quantity_int(limits.get(GPU_RESOURCE))
            picked: list[tuple[str, int, int]] = []
            if want:
                ask_cores = quantity_int(limits.get(hami.CORES_RESOURCE))
                order = sorted(
                    gpus,
                    key=lambda g: (
                        -memory[g["id"]] if binpack else memory[g["id"]],
                        g.get("index", 0),
                    ),
                )
                for g in order:
                    uuid, total = g["id"], int(g.get("devmem", 0))
                    ask_mem = quantity_int(limits.get(hami.MEM_RESOURCE)) or total
                    if (
                        shares[uuid] < int(g.get("count", 0))
                        and memory[uuid] + ask_mem <= total
                        and cores[uuid] + ask_cores <= int(g.get("devcore", 0))
                    ):
                        picked.append((uuid, ask_mem, ask_cores))
                        if len(picked) == want:
                            break
                if len(picked) < want:
                    return None
                for uuid, mem, core in picked:
                    shares[uuid] += 1
                    memory[uuid] += mem
                    cores[uuid] += core
            choice.append(picked)
        return choice

    def _bind(
        self,
        ctx: Any,
        pod: dict[str, Any],
        node: dict[str, Any],
        choice: list[list[tuple[str, int, int]]],
    ) -> bool:
        store, node_name = ctx.store, name_of(node)
        value = hami.encode_allocation(choice)
        stamp = str(int(ctx.now.timestamp()))

        def decide(obj: dict[str, Any]) -> None:  # the extender's Filter
            ann = obj["metadata"].setdefault("annotations", {})
            ann[hami.ANN_TO_ALLOCATE] = value
            ann[hami.ANN_ALLOCATED] = value
            ann[hami.ANN_ASSIGNED_NODE] = node_name
            ann[hami.ANN_ASSIGNED_TIME] = stamp
            obj["metadata"].setdefault("labels", {})[hami.ANN_ASSIGNED_NODE] = node_name

        def bind(obj: dict[str, Any]) -> None:  # its Bind: lock phase, then the binding
            ann = obj["metadata"].setdefault("annotations", {})
            ann[hami.ANN_BIND_PHASE] = "allocating"
            ann[hami.ANN_BIND_TIME] = stamp
            obj["spec"]["nodeName"] = node_name

        def scheduled(obj: dict[str, Any]) -> None:
            status = obj.setdefault("status", {})
            set_condition(status, "PodScheduled", "True", ctx.now, probe=True)
            status.setdefault("phase", "Pending")

        try:
            store.mutate(PODS, name_of(pod), decide, ns_of(pod))
            bound = store.mutate(PODS, name_of(pod), bind, ns_of(pod))
            store.mutate(PODS, name_of(pod), scheduled, ns_of(pod), subresource="status")
        except ApiError as err:
            log.warning("hami: pod %s/%s not bound: %s", ns_of(pod), name_of(pod), err.message)
            return False
        ctx.events.scheduler(
            bound,
            "Scheduled",
            "Binding",
            f"Successfully assigned {ns_of(pod)}/{name_of(pod)} to {node_name}",
            "Normal",
        )
        log.info("hami: scheduled %s/%s on %s: %s", ns_of(pod), name_of(pod), node_name, value)
        return True

    def _unschedulable(self, ctx: Any, pod: dict[str, Any], message: str) -> None:
        condition = next(
            (
                c
                for c in (pod.get("status") or {}).get("conditions") or []
                if c.get("type") == "PodScheduled"
            ),
            None,
        )
        if condition is not None and condition.get("message") == message:
            return  # said already

        def mark(obj: dict[str, Any]) -> None:
            status = obj.setdefault("status", {})
            status.setdefault("phase", "Pending")
            set_condition(
                status,
                "PodScheduled",
                "False",
                ctx.now,
                reason="Unschedulable",
                message=message,
                probe=True,
                observed_generation=int(obj["metadata"].get("generation", 1)),
            )

        try:
            updated = ctx.store.mutate(PODS, name_of(pod), mark, ns_of(pod), subresource="status")
        except ApiError:
            return
        ctx.events.scheduler(updated, "FailedScheduling", "Scheduling", message, "Warning")
