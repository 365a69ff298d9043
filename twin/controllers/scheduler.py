"""kube-scheduler stand-in: binds pending pods, allocating DRA devices on the way.

For each pod without `spec.nodeName` (default scheduler, not being deleted) the scheduler
filters nodes like the real plugins do: node not cordoned, NoSchedule/NoExecute node taints
tolerated, `nodeSelector` and required node affinity matched, `nvidia.com/gpu` fitting the
node's allocatable (device-plugin profile), and every ResourceClaim allocatable on the node
(twin/controllers/allocator.py: DeviceClass and request selectors, firstAvailable,
device taints from slices and DeviceTaintRules, request tolerations). Claims that are already
allocated (shared claims) must be on the node and just gain the pod in `reservedFor`.

The first node (by name) that passes gets the pod: claims get their allocation, the
`resource.kubernetes.io/delete-protection` finalizer and `reservedFor`; the pod gets
`spec.nodeName` and `PodScheduled=True`, and a `Scheduled` event. When no node passes, the
pod gets `PodScheduled=False`, reason `Unschedulable`, and the scheduler's message, e.g.
`0/2 nodes are available: 2 cannot allocate all claims. still not schedulable, preemption:
0/2 nodes are available: 2 Preemption is not helpful for scheduling.` (the same wording whether
the devices are busy or tainted, tests/k8s_golden/52), and a `FailedScheduling` event (a new
one per attempt, golden 53/54). Unschedulable pods are retried when the cluster changes, with
kube-scheduler's backoff (1 s doubling to 10 s).

Known fault (TwinOptions / `set_known_fault`): `ignore_device_taint_rules` reproduces
kubernetes#139651, where the scheduler ignores DeviceTaintRules so tainted devices are
allocated and the eviction controller evicts the pod again: a loop.
"""

from __future__ import annotations

import logging
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from twin.controllers.allocator import (
    AllocationError,
    Allocator,
    DeviceId,
    Inventory,
    allocated_devices,
    allocation_node,
    untolerated,
)
from twin.controllers.common import (
    CLAIM_FINALIZER,
    CLAIMS,
    DEVICE_CLASSES,
    GPU_RESOURCE,
    NODES,
    PODS,
    SCHEDULER_NAME,
    SLICES,
    TAINT_RULES,
    get_condition,
    is_deleting,
    is_terminal,
    name_of,
    ns_of,
    pod_claim_name,
    pod_gpu_request,
    quantity_int,
    set_condition,
    uid_of,
)
from twin.errors import ApiError

log = logging.getLogger(__name__)

MANAGER = "kube-scheduler"
CANNOT_ALLOCATE = "cannot allocate all claims"
NOT_ON_NODE = "resourceclaim not available on the node"
# Unschedulable pods are retried at least this often (simulated seconds) even when nothing
# changed, like kube-scheduler's podMaxInUnschedulablePodsDuration (5 minutes).
UNSCHEDULABLE_FLUSH = 300.0


def unschedulable_message(total: int, reasons: Counter[str]) -> str:
    """kube-scheduler's FitError text, including the PostFilter (preemption) part."""
    if total == 0:
        return "no nodes available to schedule pods"
    parts = sorted(f"{count} {reason}" for reason, count in reasons.items())
    head = f"0/{total} nodes are available: {', '.join(parts)}."
    insufficient = any(r.startswith("Insufficient") for r in reasons)
    tail = (
        "No preemption victims found for incoming pod."
        if insufficient
        else ("Preemption is not helpful for scheduling.")
    )
    return (
        f"{head} still not schedulable, preemption: 0/{total} nodes are available: {total} {tail}"
    )


def _node_ready(node: dict[str, Any]) -> bool:
    cond = get_condition(node, "Ready")
    return cond is None or cond.get("status") == "True"


def _match_expression(expr: dict[str, Any], labels: dict[str, str]) -> bool:
    key, op, values = expr.get("key", ""), expr.get("operator"), expr.get("values") or []
    if op == "In":
        return labels.get(key) in values
    if op == "NotIn":
        return labels.get(key) not in values
    if op == "Exists":
        return key in labels
    if op == "DoesNotExist":
        return key not in labels
    if op in ("Gt", "Lt") and key in labels and values:
        try:
            left, right = int(labels[key]), int(values[0])
        except ValueError:
            return False
        return left > right if op == "Gt" else left < right
    return False


def _affinity_matches(pod: dict[str, Any], node: dict[str, Any]) -> bool:
    labels = node["metadata"].get("labels") or {}
    for key, value in (pod["spec"].get("nodeSelector") or {}).items():
        if labels.get(key) != value:
            return False
    required = ((pod["spec"].get("affinity") or {}).get("nodeAffinity") or {}).get(
        "requiredDuringSchedulingIgnoredDuringExecution"
    ) or {}
    terms = required.get("nodeSelectorTerms") or []
    if not terms:
        return True
    for term in terms:
        exprs = term.get("matchExpressions") or []
        fields = term.get("matchFields") or []
        ok = all(_match_expression(e, labels) for e in exprs)
        ok = ok and all(_match_expression(f, {"metadata.name": name_of(node)}) for f in fields)
        if ok and (exprs or fields):
            return True
    return False


@dataclass
class _PassState:
    nodes: list[dict[str, Any]]
    inventory: Inventory
    classes: dict[str, dict[str, Any]]
    in_use: set[DeviceId]
    pods_on: dict[str, int] = field(default_factory=dict)
    gpu_used: dict[str, int] = field(default_factory=dict)


class Scheduler:
    def __init__(self, manager: Any) -> None:
        self.manager = manager
        self._attempts: dict[str, tuple[int, float, float]] = {}  # uid -> (world, when, backoff)
        self._inventory_key: tuple[Any, ...] | None = None
        self._inventory: Inventory | None = None
        self._world = 0
        self._state: _PassState | None = None  # per pass, built on first use
        manager.store.subscribe(self._on_event)

    # -- world snapshot ------------------------------------------------------------------

    def invalidate(self) -> None:
        """Retry unschedulable pods now (a scheduler setting changed, e.g. a known fault)."""
        self._world += 1

    def _on_event(self, event: Any) -> None:
        """Count changes that can make an unschedulable pod schedulable (queueing hints)."""
        res, etype, obj, old = event.resource, event.type, event.object, event.old
        if res in (NODES, SLICES, TAINT_RULES, DEVICE_CLASSES):
            self._world += 1
        elif res == CLAIMS:
            had = bool(((old or {}).get("status") or {}).get("allocation"))
            has = bool((obj.get("status") or {}).get("allocation"))
            if etype != "MODIFIED" or (had and not has):
                self._world += 1
        elif res == PODS:
            if etype == "DELETED" or (is_terminal(obj) and not is_terminal(old or {})):
                self._world += 1

    def _inventory_for(
        self, ctx: Any, slices: list[dict[str, Any]], rules: list[dict[str, Any]]
    ) -> Inventory:
        key = (
            tuple((name_of(s), s["metadata"].get("resourceVersion")) for s in slices),
            tuple((name_of(r), r["metadata"].get("resourceVersion")) for r in rules),
        )
        if key != self._inventory_key or self._inventory is None:
            self._inventory = Inventory(slices, rules)
            self._inventory_key = key
        return self._inventory

    # -- pass ----------------------------------------------------------------------------

    def sync(self, ctx: Any) -> float | None:
        store = ctx.store
        self._state = None
        pending = [
            p
            for p in store.list(PODS, field_selector="spec.nodeName=", copy_objects=False).items
            if not is_deleting(p)
            and not is_terminal(p)
            and (p["spec"].get("schedulerName") or SCHEDULER_NAME) == SCHEDULER_NAME
        ]
        live = {uid_of(p) for p in pending}
        for uid in list(self._attempts):
            if uid not in live:
                del self._attempts[uid]
        if not pending:
            return None
        pending.sort(key=lambda p: (p["metadata"].get("creationTimestamp", ""), name_of(p)))
        earliest: float | None = None
        for pod in pending:
            last = self._attempts.get(uid_of(pod))
            if last is not None:
                seen_world, when, backoff = last
                if ctx.mono < when + backoff:
                    wait = when + backoff - ctx.mono
                    earliest = wait if earliest is None else min(earliest, wait)
                    continue
                if seen_world == self._world and ctx.mono < when + UNSCHEDULABLE_FLUSH:
                    wait = when + UNSCHEDULABLE_FLUSH - ctx.mono
                    earliest = wait if earliest is None else min(earliest, wait)
                    continue
            world = self._world
            if self._schedule(ctx, pod):
                self._attempts.pop(uid_of(pod), None)
                continue
            previous = last[2] if last else 0.0
            backoff = (
                ctx.options.schedule_backoff_initial
                if previous <= 0
                else min(previous * 2, ctx.options.schedule_backoff_max)
            )
            self._attempts[uid_of(pod)] = (world, ctx.mono, backoff)
            earliest = backoff if earliest is None else min(earliest, backoff)
        return earliest

    def _pass_state(self, ctx: Any) -> _PassState:
        """Cluster state shared by every pod of one pass, built on first use."""
        if self._state is not None:
            return self._state
        store = ctx.store
        rules: list[dict[str, Any]] = []
        if ctx.dra and not ctx.options.ignore_device_taint_rules:
            try:
                rules = store.list(TAINT_RULES, copy_objects=False).items
            except ApiError:
                rules = []
        slices = store.list(SLICES, copy_objects=False).items if ctx.dra else []
        state = _PassState(
            nodes=sorted(store.list(NODES, copy_objects=False).items, key=name_of),
            inventory=self._inventory_for(ctx, slices, rules),
            classes={name_of(c): c for c in store.list(DEVICE_CLASSES, copy_objects=False).items}
            if ctx.dra
            else {},
            in_use=allocated_devices(store.list(CLAIMS, copy_objects=False).items)
            if ctx.dra
            else set(),
        )
        for other in store.list(PODS, copy_objects=False).items:
            node_name = other["spec"].get("nodeName")
            if node_name and not is_terminal(other):
                state.pods_on[node_name] = state.pods_on.get(node_name, 0) + 1
                if not ctx.dra:
                    state.gpu_used[node_name] = state.gpu_used.get(node_name, 0) + pod_gpu_request(
                        other
                    )
        self._state = state
        return state

    def _schedule(self, ctx: Any, pod: dict[str, Any]) -> bool:
        store = ctx.store
        pod_claims: list[dict[str, Any]] = []
        for entry in pod["spec"].get("resourceClaims") or []:
            claim_name = pod_claim_name(pod, entry)
            claim = store.try_get(CLAIMS, claim_name, ns_of(pod)) if claim_name else None
            if claim is None or is_deleting(claim):
                return False  # the claim controller has not created it yet; try again later
            pod_claims.append(claim)
        state = self._pass_state(ctx)
        reasons: Counter[str] = Counter()
        gpu_need = pod_gpu_request(pod) if not ctx.dra else 0
        unallocated = [c for c in pod_claims if not (c.get("status") or {}).get("allocation")]
        allocator = Allocator(
            state.inventory,
            state.classes,
            state.in_use,
            ctx.now,
            expired_toleration_bug=ctx.options.expired_toleration_bug,
        )
        for node in state.nodes:
            node_name = name_of(node)
            reason = self._filter_node(pod, node, gpu_need, state, ctx.now)
            plan: dict[str, dict[str, Any]] | None = {}
            if reason is None and pod_claims:
                if any(
                    allocation_node(c) not in (None, node_name)
                    for c in pod_claims
                    if (c.get("status") or {}).get("allocation")
                ):
                    reason = NOT_ON_NODE
                else:
                    try:
                        plan = allocator.allocate(unallocated, node_name) if unallocated else {}
                    except AllocationError as err:
                        reason, plan = str(err), None
                    if plan is None:
                        reason = reason or CANNOT_ALLOCATE
            if reason is None and plan is not None:
                if not self._bind(ctx, pod, node, pod_claims, plan):
                    return False
                for allocation in plan.values():
                    for result in allocation["devices"]["results"]:
                        if not result.get("adminAccess"):
                            state.in_use.add(
                                DeviceId(result["driver"], result["pool"], result["device"])
                            )
                state.pods_on[node_name] = state.pods_on.get(node_name, 0) + 1
                state.gpu_used[node_name] = state.gpu_used.get(node_name, 0) + gpu_need
                return True
            assert reason is not None
            reasons[reason] += 1
        self._unschedulable(ctx, pod, unschedulable_message(len(state.nodes), reasons))
        return False

    @staticmethod
    def _filter_node(
        pod: dict[str, Any],
        node: dict[str, Any],
        gpu_need: int,
        state: _PassState,
        now: Any,
    ) -> str | None:
        if node["spec"].get("unschedulable") and not _tolerates_cordon(pod):
            # kube-scheduler's NodeUnschedulable filter: a cordoned node takes only pods that
            # tolerate node.kubernetes.io/unschedulable:NoSchedule (DaemonSets, Sickbay's
            # validation Job on a replace's new node).
            return "node(s) were unschedulable"
        allocatable = (node.get("status") or {}).get("allocatable") or {}
        max_pods = quantity_int(allocatable.get("pods")) if "pods" in allocatable else None
        if max_pods is not None and state.pods_on.get(name_of(node), 0) >= max_pods:
            return "Too many pods"
        if not _node_ready(node):
            return "node(s) had untolerated taint {node.kubernetes.io/not-ready: }"
        taints = node["spec"].get("taints") or []
        # The scheduler ignores tolerationSeconds: only the node lifecycle controller uses it.
        tolerations = pod["spec"].get("tolerations") or []
        blocking = untolerated(taints, tolerations, ("NoSchedule", "NoExecute"), now, False)
        if blocking:
            taint = blocking[0]
            return (
                f"node(s) had untolerated taint {{{taint.get('key')}: {taint.get('value') or ''}}}"
            )
        if not _affinity_matches(pod, node):
            return "node(s) didn't match Pod's node affinity/selector"
        if gpu_need:
            gpus = quantity_int(allocatable.get(GPU_RESOURCE))
            if state.gpu_used.get(name_of(node), 0) + gpu_need > gpus:
                return f"Insufficient {GPU_RESOURCE}"
        return None

    # -- outcomes ------------------------------------------------------------------------

    def _bind(
        self,
        ctx: Any,
        pod: dict[str, Any],
        node: dict[str, Any],
        claims: list[dict[str, Any]],
        plan: dict[str, dict[str, Any]],
    ) -> bool:
        store = ctx.store
        node_name = name_of(node)
        reservation = {"resource": "pods", "name": name_of(pod), "uid": uid_of(pod)}
        for claim in claims:
            allocation = plan.get(name_of(claim))

            def protect(obj: dict[str, Any]) -> None:
                finalizers = obj["metadata"].setdefault("finalizers", [])
                if CLAIM_FINALIZER not in finalizers:
                    finalizers.append(CLAIM_FINALIZER)

            def reserve(
                obj: dict[str, Any], allocation: dict[str, Any] | None = allocation
            ) -> None:
                status = obj.setdefault("status", {})
                if allocation is not None:
                    status["allocation"] = allocation
                reserved = status.setdefault("reservedFor", [])
                if all(r.get("uid") != reservation["uid"] for r in reserved):
                    reserved.append(dict(reservation))

            try:
                if allocation is not None:
                    store.mutate(CLAIMS, name_of(claim), protect, ns_of(claim), manager=MANAGER)
                store.mutate(
                    CLAIMS,
                    name_of(claim),
                    reserve,
                    ns_of(claim),
                    subresource="status",
                    manager=MANAGER,
                )
            except ApiError as err:
                log.warning(
                    "claim %s/%s not allocated: %s", ns_of(claim), name_of(claim), err.message
                )
                return False

        def bind(obj: dict[str, Any]) -> None:
            obj["spec"]["nodeName"] = node_name

        def scheduled(obj: dict[str, Any]) -> None:
            status = obj.setdefault("status", {})
            set_condition(status, "PodScheduled", "True", ctx.now, probe=True)
            status.setdefault("phase", "Pending")

        try:
            bound = store.mutate(PODS, name_of(pod), bind, ns_of(pod))
            store.mutate(PODS, name_of(pod), scheduled, ns_of(pod), subresource="status")
        except ApiError as err:
            log.warning("pod %s/%s not bound: %s", ns_of(pod), name_of(pod), err.message)
            return False
        ctx.events.scheduler(
            bound,
            "Scheduled",
            "Binding",
            f"Successfully assigned {ns_of(pod)}/{name_of(pod)} to {node_name}",
            "Normal",
        )
        log.info("scheduled %s/%s on %s", ns_of(pod), name_of(pod), node_name)
        return True

    def _unschedulable(self, ctx: Any, pod: dict[str, Any], message: str) -> None:
        store = ctx.store

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
            updated = store.mutate(PODS, name_of(pod), mark, ns_of(pod), subresource="status")
        except ApiError:
            return
        ctx.events.scheduler(updated, "FailedScheduling", "Scheduling", message, "Warning")


def _tolerates_cordon(pod: dict[str, Any]) -> bool:
    for t in pod["spec"].get("tolerations") or []:
        key, op, effect = t.get("key"), t.get("operator") or "Equal", t.get("effect")
        if effect not in (None, "", "NoSchedule"):
            continue
        if (key in (None, "") and op == "Exists") or (
            key == "node.kubernetes.io/unschedulable" and (op == "Exists" or not t.get("value"))
        ):
            return True
    return False
