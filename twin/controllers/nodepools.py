"""Node pools: nodes grouped by the `sickbay.dev/node-pool` label, resizable at run time.

**Resize a pool (the function the cloud API and MachineDeployments call)**::

    manager.node_pools.resize("gpu-pool", 3)      # -> PoolStatus (thread-safe, returns at once)

Growing schedules the missing nodes; each appears `provisioning_delay` simulated seconds later
(default 30 s; `delay=` overrides it per call) as a Node plus, on DRA profiles, its
ResourceSlice, built like the pool's existing nodes (GPU count, product, topology: see
twin/seed.py `add_node`). Shrinking removes *idle* nodes (no unfinished pod bound),
newest first; busy nodes stay, and the pool keeps trying as they become idle. A pool's shape
is learnt from its first node, or set with `configure_pool(name, gpus=8, product=...,
topology="mig")` for a pool that starts empty.

twin/cloudapi.py wires it as `CloudApi(on_resize=manager.node_pools.resize, ...)`: the
cloud operation models the API latency; this controller models node registration after it.

**MachineDeployment** (cluster.x-k8s.io/v1beta1): `spec.replicas` drives the pool named by
`spec.template.metadata.labels["sickbay.dev/node-pool"]` (else the MachineDeployment's own
label, else its name); status reports replicas/readyReplicas/availableReplicas and a phase
(ScalingUp, ScalingDown, Running).
"""

from __future__ import annotations

import logging
import threading
from dataclasses import asdict, dataclass, field
from typing import Any

from twin import seed as seed_names
from twin.controllers.common import (
    MACHINE_DEPLOYMENTS,
    NODES,
    PODS,
    SLICES,
    is_terminal,
    meta,
    name_of,
    ns_of,
)
from twin.errors import ApiError

log = logging.getLogger(__name__)

PRODUCT_LABEL = "nvidia.com/gpu.product"
COUNT_LABEL = "nvidia.com/gpu.count"


@dataclass
class PoolShape:
    gpus: int = 2
    product: str = "NVIDIA H100 80GB HBM3"
    memory: str | None = None
    topology: str = "full"
    slices_per_gpu: int = 2
    nvswitch: bool = False


@dataclass
class PoolStatus:
    name: str
    nodes: list[str]
    target: int | None
    provisioning: int
    removing: list[str] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def _product_from_label(label: str) -> str:
    from twin import seed

    for product in seed._PRODUCTS:  # the label is the product name with dashes for spaces
        if product.replace(" ", "-") == label:
            return product
    return label.replace("-", " ") or seed.DEFAULT_PRODUCT


class NodePools:
    def __init__(self, manager: Any) -> None:
        self.manager = manager
        self._lock = threading.RLock()
        self._targets: dict[str, int] = {}
        self._shapes: dict[str, PoolShape] = {}
        self._pending: list[tuple[float, str, str]] = []  # (due mono, pool, node name)
        self._retired: set[str] = set()  # names of replaced nodes: a new machine, a new name
        self._idents: dict[str, str] = {}  # node name -> what its GPU UUIDs derive from

    @property
    def label(self) -> str:
        return str(self.manager.options.pool_label)

    # -- public API ----------------------------------------------------------------------

    def configure_pool(self, name: str, **shape: Any) -> PoolShape:
        with self._lock:
            current = self._shapes.get(name) or PoolShape()
            for key, value in shape.items():
                if not hasattr(current, key):
                    raise ValueError(f"unknown pool setting {key!r}")
                setattr(current, key, value)
            self._shapes[name] = current
            return current

    def pool_nodes(self, pool: str) -> list[dict[str, Any]]:
        store = self.manager.store
        return store.list(NODES, label_selector=f"{self.label}={pool}").items

    def pools(self) -> list[PoolStatus]:
        names = set(self._targets) | set(self._shapes)
        for node in self.manager.store.list(NODES, copy_objects=False).items:
            pool = (meta(node).get("labels") or {}).get(self.label)
            if pool:
                names.add(pool)
        return [self.status(n) for n in sorted(names)]

    def status(self, pool: str) -> PoolStatus:
        with self._lock:
            nodes = sorted(name_of(n) for n in self.pool_nodes(pool))
            provisioning = sum(1 for _due, p, _n in self._pending if p == pool)
            target = self._targets.get(pool)
            removing = []
            if target is not None and len(nodes) > target:
                removing = nodes[target:]
            return PoolStatus(pool, nodes, target, provisioning, removing)

    def resize(self, pool: str, size: int, delay: float | None = None) -> PoolStatus:
        """Resize `pool` to `size` nodes. Thread-safe; returns the pool's status at once."""
        if isinstance(size, bool) or not isinstance(size, int) or size < 0:
            raise ValueError(f"pool size must be a non-negative integer, not {size!r}")
        wait = self.manager.options.provisioning_delay if delay is None else float(delay)
        with self._lock:
            nodes = self.pool_nodes(pool)
            if not nodes and pool not in self._shapes and pool not in self._targets:
                raise KeyError(f'node pool "{pool}" not found')
            self._learn_shape(pool, nodes)
            self._targets[pool] = size
            pending = [p for p in self._pending if p[1] == pool]
            missing = size - len(nodes) - len(pending)
            if missing < 0 and pending:
                # Cancel provisioning first: the newest requests go.
                cancel = min(-missing, len(pending))
                for item in sorted(pending, reverse=True)[:cancel]:
                    self._pending.remove(item)
                missing += cancel
            if missing > 0:
                due = self.manager.clock.monotonic() + max(0.0, wait)
                taken = {name_of(n) for n in nodes} | {n for _d, _p, n in self._pending}
                index = 0
                for _ in range(missing):
                    while (
                        f"{pool}-node-{index}" in taken
                        or f"{pool}-node-{index}" in self._retired
                        or self.manager.store.try_get(NODES, f"{pool}-node-{index}")
                    ):
                        index += 1
                    name = f"{pool}-node-{index}"
                    taken.add(name)
                    self._pending.append((due, pool, name))
            log.info("node pool %s: resize to %s (%s now)", pool, size, len(nodes))
        self.manager.poke()
        return self.status(pool)

    def replace_node(self, node: str, delay: float | None = None, same_name: bool = False) -> str:
        """Delete `node` (its machine is gone) and let its pool bring a new one, under a new
        name (`same_name`: under the same name, as a recreated cloud VM) and in both cases with
        new GPU UUIDs, `delay` simulated seconds later. Returns the pool."""
        obj = self.manager.store.try_get(NODES, node)
        if obj is None:
            raise KeyError(f'node "{node}" not found')
        pool = (meta(obj).get("labels") or {}).get(self.label)
        if not pool:
            raise KeyError(f'node "{node}" belongs to no node pool (label {self.label})')
        with self._lock:
            nodes = self.pool_nodes(pool)
            self._learn_shape(pool, nodes)
            target = self._targets.get(pool, len(nodes))
            if same_name:
                wait = self.manager.options.provisioning_delay if delay is None else delay
                # Each recreate is new hardware: node#1, node#2, ... (counted from the last).
                _, _, last = self._idents.get(node, "").rpartition("#")
                generation = int(last) if last.isdigit() else 0
                self._idents[node] = f"{node}#{generation + 1}"
                self._targets[pool] = target
                self._pending.append((self.manager.clock.monotonic() + wait, pool, node))
            else:
                self._retired.add(node)
        self.manager.store.delete(NODES, node)
        if same_name:
            self.manager.poke()
        else:
            self.resize(pool, target, delay=delay)
        return str(pool)

    # -- controller ----------------------------------------------------------------------

    def _learn_shape(self, pool: str, nodes: list[dict[str, Any]]) -> None:
        if pool in self._shapes or not nodes:
            return
        node = sorted(nodes, key=name_of)[0]
        labels = meta(node).get("labels") or {}
        shape = PoolShape()
        shape.gpus = int(labels.get(COUNT_LABEL, shape.gpus) or 0)
        shape.product = _product_from_label(labels.get(PRODUCT_LABEL, ""))
        shape.nvswitch = labels.get(seed_names.RESET_GROUP_LABEL) == "node"
        if self.manager.dra:
            slices = self.manager.store.list(
                SLICES, field_selector=f"spec.nodeName={name_of(node)}"
            ).items
            devices = [d for s in slices for d in (s.get("spec") or {}).get("devices") or []]
            names = [str(d.get("name", "")) for d in devices]
            for marker, topology in (("-mig-", "mig"), ("-vgpu-", "vgpu"), ("-ts-", "timeslice")):
                if any(marker in n for n in names):
                    shape.topology = topology
                    per_gpu = [n for n in names if n.startswith("gpu-0" + marker)]
                    shape.slices_per_gpu = max(1, len(per_gpu))
            if devices:
                memory = ((devices[0].get("capacity") or {}).get("memory") or {}).get("value")
                shape.memory = memory
        self._shapes[pool] = shape

    def sync(self, ctx: Any) -> float | None:
        from twin import seed

        earliest: float | None = None
        with self._lock:
            due_now = [p for p in self._pending if p[0] <= ctx.mono]
            later = [p[0] - ctx.mono for p in self._pending if p[0] > ctx.mono]
            for item in due_now:
                self._pending.remove(item)
            shapes = dict(self._shapes)
            targets = dict(self._targets)
        for _due, pool, name in due_now:
            shape = shapes.get(pool) or PoolShape()
            try:
                seed.add_node(
                    ctx.store,
                    self.manager.twin.profile,
                    name,
                    pool,
                    shape.gpus,
                    shape.product,
                    shape.memory,
                    shape.topology,
                    shape.slices_per_gpu,
                    shape.nvswitch,
                    self._idents.get(name),
                )
                log.info("node pool %s: node %s registered", pool, name)
                self.manager.repairs.registered(name, pool)
            except (ApiError, ValueError) as err:
                log.warning("node pool %s: node %s not created: %s", pool, name, err)
        if later:
            earliest = min(later)
        for pool, target in targets.items():
            self._shrink(ctx, pool, target)
        return earliest

    def _shrink(self, ctx: Any, pool: str, target: int) -> None:
        store = ctx.store
        nodes = self.pool_nodes(pool)
        excess = len(nodes) - target
        if excess <= 0:
            return
        busy = set()
        for pod in store.list(PODS, copy_objects=False).items:
            node = pod["spec"].get("nodeName")
            if node and not is_terminal(pod):
                busy.add(node)
        idle = [n for n in nodes if name_of(n) not in busy]
        idle.sort(key=lambda n: (meta(n).get("creationTimestamp", ""), name_of(n)), reverse=True)
        for node in idle[:excess]:
            for piece in store.list(SLICES, field_selector=f"spec.nodeName={name_of(node)}").items:
                try:
                    store.delete(SLICES, name_of(piece))
                except ApiError:
                    pass
            try:
                store.delete(NODES, name_of(node))
                log.info("node pool %s: idle node %s removed", pool, name_of(node))
            except ApiError:
                pass


class MachineDeploymentController:
    """Cluster API MachineDeployments drive node pools through `NodePools.resize`."""

    def __init__(self, manager: Any) -> None:
        self.manager = manager
        self._seen: dict[str, int] = {}  # uid -> replicas last applied

    def _pool(self, md: dict[str, Any]) -> str:
        label = self.manager.options.pool_label
        template_labels = (
            ((md.get("spec") or {}).get("template") or {}).get("metadata") or {}
        ).get("labels") or {}
        return str(
            template_labels.get(label) or (meta(md).get("labels") or {}).get(label) or name_of(md)
        )

    def sync(self, ctx: Any) -> float | None:
        store = ctx.store
        pools: NodePools = self.manager.node_pools
        try:
            items = store.list(MACHINE_DEPLOYMENTS, copy_objects=False).items
        except ApiError:
            return None
        for md in items:
            uid = meta(md).get("uid", "")
            pool = self._pool(md)
            replicas = (md.get("spec") or {}).get("replicas")
            if isinstance(replicas, int) and self._seen.get(uid) != replicas:
                try:
                    pools.resize(pool, replicas)
                    self._seen[uid] = replicas
                except (KeyError, ValueError) as err:
                    log.warning("machinedeployment %s: %s", name_of(md), err)
                    continue
            state = pools.status(pool)
            have = len(state.nodes)
            want = replicas if isinstance(replicas, int) else have
            ready = have
            phase = "Running" if have == want else ("ScalingUp" if have < want else "ScalingDown")
            status = {
                "observedGeneration": int(meta(md).get("generation", 1)),
                "replicas": have,
                "readyReplicas": ready,
                "availableReplicas": ready,
                "updatedReplicas": have,
                "unavailableReplicas": max(0, want - ready),
                "phase": phase,
                "selector": f"{self.manager.options.pool_label}={pool}",
            }
            if (md.get("status") or {}) == status:
                continue

            def update(obj: dict[str, Any], status: dict[str, Any] = status) -> None:
                obj["status"] = status

            try:
                store.mutate(
                    MACHINE_DEPLOYMENTS, name_of(md), update, ns_of(md), subresource="status"
                )
            except ApiError as err:
                log.debug("machinedeployment %s status: %s", name_of(md), err.message)
        return None
