"""PodDisruptionBudget status (the disruption controller) and the pods/eviction subresource.

The controller recomputes a budget's status whenever pods or budgets in its namespace change:
expectedPods, currentHealthy (Running and Ready, not terminating), desiredHealthy (from
minAvailable / maxUnavailable, percentages rounded up), disruptionsAllowed and the
DisruptionAllowed condition (SufficientPods / InsufficientPods), as kube-controller-manager does.

`evict()` implements POST pods/{name}/eviction as kube-apiserver does: a body naming another
pod (or no pod) is 400 BadRequest; Pending (and terminal)
pods are evicted regardless of budgets; otherwise the one matching budget must allow a
disruption or the answer is 429 TooManyRequests with a DisruptionBudget cause; more than one
matching budget is a 500. An evicted pod gets DisruptionTarget=True (EvictionByEvictionAPI)
and is deleted gracefully.
"""

from __future__ import annotations

import logging
import math
import queue
import threading
from typing import Any

from twin import errors
from twin.selectors import selector_from_label_selector_object
from twin.store import Store, StoreEvent, format_time

log = logging.getLogger(__name__)

PDBS = "poddisruptionbudgets.policy"


def pod_healthy(pod: dict[str, Any]) -> bool:
    if pod["metadata"].get("deletionTimestamp"):
        return False
    status = pod.get("status") or {}
    if status.get("phase") != "Running":
        return False
    return any(
        c.get("type") == "Ready" and c.get("status") == "True"
        for c in status.get("conditions") or []
    )


def _matching_pods(store: Store, pdb: dict[str, Any]) -> list[dict[str, Any]]:
    sel = selector_from_label_selector_object((pdb.get("spec") or {}).get("selector"))
    if sel is None:
        return []
    ns = pdb["metadata"]["namespace"]
    pods = store.list("pods", ns, copy_objects=False).items
    return [
        p
        for p in pods
        if sel.matches(p["metadata"].get("labels"))
        and (p.get("status") or {}).get("phase") not in ("Succeeded", "Failed")
    ]


def _scaled(value: Any, total: int) -> int:
    if isinstance(value, str) and value.endswith("%"):
        return math.ceil(int(value[:-1]) * total / 100)
    return int(value)


def compute_status(store: Store, pdb: dict[str, Any]) -> dict[str, Any]:
    spec = pdb.get("spec") or {}
    pods = _matching_pods(store, pdb)
    expected = len(pods)
    healthy = sum(1 for p in pods if pod_healthy(p))
    if "maxUnavailable" in spec:
        desired = max(0, expected - _scaled(spec["maxUnavailable"], expected))
    else:
        desired = _scaled(spec.get("minAvailable", 1), expected)
    allowed = max(0, healthy - desired)
    old = pdb.get("status") or {}
    generation = pdb["metadata"].get("generation", 1)
    cond_status = "True" if allowed > 0 else "False"
    reason = "SufficientPods" if allowed > 0 else "InsufficientPods"
    prev = next(
        (c for c in old.get("conditions") or [] if c.get("type") == "DisruptionAllowed"), None
    )
    transition = (
        prev["lastTransitionTime"]
        if prev and prev.get("status") == cond_status and prev.get("lastTransitionTime")
        else format_time(store.now())
    )
    status: dict[str, Any] = {
        "observedGeneration": generation,
        "expectedPods": expected,
        "currentHealthy": healthy,
        "desiredHealthy": desired,
        "disruptionsAllowed": allowed,
        "conditions": [
            {
                "type": "DisruptionAllowed",
                "status": cond_status,
                "reason": reason,
                "message": "",
                "observedGeneration": generation,
                "lastTransitionTime": transition,
            }
        ],
    }
    disrupted = {
        name: t
        for name, t in (old.get("disruptedPods") or {}).items()
        if any(
            p["metadata"]["name"] == name and not p["metadata"].get("deletionTimestamp")
            for p in pods
        )
    }
    if disrupted:
        status["disruptedPods"] = disrupted
        status["disruptionsAllowed"] = max(0, allowed - len(disrupted))
    return status


def refresh(store: Store, namespace: str, name: str) -> dict[str, Any] | None:
    """Recompute one budget's status and store it if it changed; returns the budget."""
    with store.lock:
        pdb = store.try_get(PDBS, name, namespace)
        if pdb is None:
            return None
        status = compute_status(store, pdb)
        if status == pdb.get("status"):
            return pdb
        pdb["status"] = status
        return store.update_status(PDBS, pdb, manager="kube-controller-manager")


def evict(
    store: Store, namespace: str, name: str, body: dict[str, Any] | None, dry_run: bool = False
) -> None:
    """POST pods/{name}/eviction. Raises ApiError (404, 429, 500) or returns once evicted."""
    delete_options = (body or {}).get("deleteOptions") or {}
    # `kubectl drain --dry-run=server` says it in the body, not the query: nothing is evicted.
    dry_run = dry_run or "All" in (delete_options.get("dryRun") or [])
    body_meta = (body or {}).get("metadata") or {}
    # The create handler checks the namespace, then EvictionREST.Create the name (an empty
    # one too), both before the pod is read: a mismatch evicts nothing.
    if body_meta.get("namespace") not in (None, "", namespace):
        raise errors.bad_request(
            "the namespace of the provided object does not match the namespace sent on the request"
        )
    if body_meta.get("name") != name:
        raise errors.bad_request("name in URL does not match name in Eviction object")
    with store.lock:
        pod = store.get("pods", name, namespace)
        phase = (pod.get("status") or {}).get("phase")
        if not pod["metadata"].get("deletionTimestamp") and phase not in (
            "Pending",
            "Succeeded",
            "Failed",
        ):
            pdbs = []
            for pdb in store.list(PDBS, namespace, copy_objects=False).items:
                sel = selector_from_label_selector_object((pdb.get("spec") or {}).get("selector"))
                if sel is not None and sel.matches(pod["metadata"].get("labels")):
                    pdbs.append(pdb)
            if len(pdbs) > 1:
                raise errors.ApiError(
                    500,
                    "InternalError",
                    "This pod has more than one PodDisruptionBudget, which the eviction "
                    "subresource does not support.",
                )
            if pdbs:
                pdb = refresh(store, namespace, pdbs[0]["metadata"]["name"]) or pdbs[0]
                status = pdb.get("status") or {}
                healthy = pod_healthy(pod)
                blocked = status.get("disruptionsAllowed", 0) <= 0
                if not healthy:
                    # IfHealthyBudget: an unhealthy pod may go while the budget is met.
                    blocked = status.get("currentHealthy", 0) < status.get("desiredHealthy", 0)
                if blocked:
                    raise errors.ApiError(
                        429,
                        "TooManyRequests",
                        "Cannot evict pod as it would violate the pod's disruption budget.",
                        {
                            "causes": [
                                {
                                    "reason": "DisruptionBudget",
                                    "message": (
                                        f"The disruption budget {pdb['metadata']['name']} needs "
                                        f"{status.get('desiredHealthy', 0)} healthy pods and has "
                                        f"{status.get('currentHealthy', 0)} currently"
                                    ),
                                }
                            ]
                        },
                    )
                if healthy and not dry_run:
                    pdb = store.get(PDBS, pdb["metadata"]["name"], namespace)
                    st = pdb.setdefault("status", {})
                    st["disruptionsAllowed"] = max(0, st.get("disruptionsAllowed", 0) - 1)
                    st.setdefault("disruptedPods", {})[name] = format_time(store.now())
                    store.update_status(PDBS, pdb)
        if dry_run:
            return
        if not pod["metadata"].get("deletionTimestamp"):
            now = format_time(store.now())

            def mark(p: dict[str, Any]) -> None:
                conds = [
                    c
                    for c in (p.setdefault("status", {}).get("conditions") or [])
                    if c.get("type") != "DisruptionTarget"
                ]
                conds.append(
                    {
                        "type": "DisruptionTarget",
                        "status": "True",
                        "reason": "EvictionByEvictionAPI",
                        "message": "Eviction API: evicting",
                        "lastProbeTime": None,
                        "lastTransitionTime": now,
                    }
                )
                p["status"]["conditions"] = conds

            store.mutate("pods", name, mark, namespace, subresource="status")
        store.delete(
            "pods",
            name,
            namespace,
            grace_period_seconds=delete_options.get("gracePeriodSeconds"),
            preconditions=delete_options.get("preconditions"),
        )


class DisruptionController:
    """Keeps PDB status current from pod and budget events (a worker thread)."""

    def __init__(self) -> None:
        self._queue: queue.SimpleQueue[str | None] = queue.SimpleQueue()
        self._thread: threading.Thread | None = None
        self._unsubscribe: Any = None
        self._store: Store | None = None

    def start(self, twin: Any) -> None:
        self._store = twin.store
        self._unsubscribe = twin.store.subscribe(self._on_event, ["pods", PDBS])
        self._thread = threading.Thread(target=self._run, name="twin-disruption", daemon=True)
        self._thread.start()

    def _on_event(self, ev: StoreEvent) -> None:
        ns = ev.object["metadata"].get("namespace")
        if ns:
            self._queue.put(ns)

    def _run(self) -> None:
        assert self._store is not None
        while True:
            ns = self._queue.get()
            if ns is None:
                return
            pending = {ns}
            while True:  # coalesce a burst of events into one pass per namespace
                try:
                    more = self._queue.get_nowait()
                except queue.Empty:
                    break
                if more is None:
                    return
                pending.add(more)
            for namespace in sorted(pending):
                try:
                    for pdb in self._store.list(PDBS, namespace, copy_objects=False).items:
                        refresh(self._store, namespace, pdb["metadata"]["name"])
                except errors.ApiError as exc:
                    log.debug("pdb refresh in %s failed: %s", namespace, exc.message)
                except Exception:  # the controller thread must outlive one bad budget
                    log.exception("pdb refresh in %s failed", namespace)

    def stop(self) -> None:
        if self._unsubscribe is not None:
            self._unsubscribe()
        self._queue.put(None)
        if self._thread is not None:
            self._thread.join(timeout=5)  # the loop exits at once on the sentinel
