"""Garbage collection the store does not do by itself.

The store deletes dependents when their owner is deleted (background propagation). This
controller covers the rest, as kube-controller-manager's garbage collector and pod GC do:
- objects whose every ownerReference names an owner that no longer exists (created with a
  stale owner, or left behind by an orphaning race) are deleted;
- pods bound to a node that no longer exists (a node-pool shrink) are force-deleted.
"""

from __future__ import annotations

import logging
from typing import Any

from twin.controllers.common import (
    CLAIMS,
    DEPLOYMENTS,
    JOBS,
    NODES,
    PODS,
    REPLICASETS,
    STATEFULSETS,
    is_deleting,
    is_terminal,
    meta,
    name_of,
    ns_of,
    set_condition,
    uid_of,
)
from twin.errors import ApiError

log = logging.getLogger(__name__)

# (kind, apiVersion group) of owners the twin knows -> store resource.
OWNER_RESOURCES = {
    ("Pod", ""): PODS,
    ("ReplicaSet", "apps"): REPLICASETS,
    ("Deployment", "apps"): DEPLOYMENTS,
    ("StatefulSet", "apps"): STATEFULSETS,
    ("Job", "batch"): JOBS,
}
DEPENDENTS = (PODS, REPLICASETS, CLAIMS)


class GarbageCollector:
    def __init__(self, manager: Any) -> None:
        self.manager = manager

    def sync(self, ctx: Any) -> float | None:
        store = ctx.store
        uids: dict[str, set[str]] = {}
        for key in set(OWNER_RESOURCES.values()):
            uids[key] = {uid_of(o) for o in store.list(key, copy_objects=False).items}
        for resource in DEPENDENTS:
            for obj in store.list(resource, copy_objects=False).items:
                refs = meta(obj).get("ownerReferences") or []
                if not refs or is_deleting(obj):
                    continue
                alive = False
                for ref in refs:
                    group = ref.get("apiVersion", "").rpartition("/")[0]
                    owner_res = OWNER_RESOURCES.get((ref.get("kind", ""), group))
                    if owner_res is None or ref.get("uid") in uids.get(owner_res, set()):
                        alive = True  # an owner kind we do not track counts as alive
                        break
                if not alive:
                    log.info("gc: %s %s/%s lost its owners", resource, ns_of(obj), name_of(obj))
                    try:
                        store.delete(resource, name_of(obj), ns_of(obj) or None)
                    except ApiError:
                        pass
        nodes = {name_of(n) for n in store.list(NODES, copy_objects=False).items}
        for pod in store.list(PODS, copy_objects=False).items:
            node = pod["spec"].get("nodeName")
            if node and node not in nodes:
                log.info("pod gc: %s/%s was on deleted node %s", ns_of(pod), name_of(pod), node)

                def fail(obj: dict[str, Any]) -> None:
                    status = obj.setdefault("status", {})
                    status["phase"] = "Failed"
                    set_condition(
                        status,
                        "DisruptionTarget",
                        "True",
                        ctx.now,
                        "DeletionByPodGC",
                        "PodGC: node no longer exists",
                        probe=True,
                    )

                try:
                    if not is_terminal(pod):
                        store.mutate(PODS, name_of(pod), fail, ns_of(pod), subresource="status")
                    store.delete(PODS, name_of(pod), ns_of(pod), grace_period_seconds=0)
                except ApiError:
                    pass
        return None
