"""ConfigMap `kube-root-ca.crt` in every namespace: kube-controller-manager's root CA publisher.

Every real cluster keeps one in each namespace (key `ca.crt`, the cluster CA bundle, with the
annotation `kubernetes.io/description`); a pod's projected ServiceAccount volume takes its
`ca.crt` from it, so a pod started in a new namespace finds it there. The twin publishes it
when it serves TLS (there is no CA to publish otherwise), for existing and new namespaces,
and puts it back when it is deleted or its data changed, as the controller does.
"""

from __future__ import annotations

import logging
import queue
import threading
from typing import Any

from twin import errors
from twin.store import StoreEvent

log = logging.getLogger(__name__)

NAME = "kube-root-ca.crt"
DESCRIPTION = (
    "Contains a CA bundle that can be used to verify the kube-apiserver when using internal "
    "endpoints such as the internal service IP or kubernetes.default.svc. No other usage is "
    "guaranteed across distributions of Kubernetes clusters."
)


class RootCaPublisher:
    """A worker thread fed by namespace and ConfigMap events."""

    def __init__(self, ca_pem: bytes) -> None:
        self.ca = ca_pem.decode()
        self._queue: queue.SimpleQueue[str | None] = queue.SimpleQueue()
        self._thread: threading.Thread | None = None
        self._unsubscribe: Any = None
        self._store: Any = None

    def start(self, twin: Any) -> None:
        self._store = twin.store
        self._unsubscribe = twin.store.subscribe(self._on_event, ["namespaces", "configmaps"])
        for ns in twin.store.list("namespaces", copy_objects=False).items:
            self._queue.put(ns["metadata"]["name"])
        self._thread = threading.Thread(target=self._run, name="twin-root-ca", daemon=True)
        self._thread.start()

    def _on_event(self, ev: StoreEvent) -> None:
        meta = ev.object["metadata"]
        if ev.resource == "namespaces" and ev.type != "DELETED":
            self._queue.put(meta["name"])
        elif ev.resource == "configmaps" and meta["name"] == NAME:
            self._queue.put(meta.get("namespace") or "")

    def publish(self, namespace: str) -> None:
        store = self._store
        namespace_obj = store.try_get("namespaces", namespace)
        if namespace_obj is None or namespace_obj["metadata"].get("deletionTimestamp"):
            return
        current = store.try_get("configmaps", NAME, namespace)
        if current is None:
            store.create(
                "configmaps",
                {
                    "metadata": {
                        "name": NAME,
                        "annotations": {"kubernetes.io/description": DESCRIPTION},
                    },
                    "data": {"ca.crt": self.ca},
                },
                namespace,
                manager="kube-controller-manager",
            )
        elif (current.get("data") or {}) != {"ca.crt": self.ca}:
            current["data"] = {"ca.crt": self.ca}
            store.update("configmaps", current, manager="kube-controller-manager")

    def _run(self) -> None:
        while True:
            namespace = self._queue.get()
            if namespace is None:
                return
            try:
                self.publish(namespace)
            except errors.ApiError as exc:  # a race with a deletion or another writer
                log.debug("root CA in %s: %s", namespace, exc.message)
            except Exception:  # the controller thread must outlive one bad namespace
                log.exception("root CA in %s failed", namespace)

    def stop(self) -> None:
        if self._unsubscribe is not None:
            self._unsubscribe()
        self._queue.put(None)
        if self._thread is not None:
            self._thread.join(timeout=5)  # the loop exits at once on the sentinel
