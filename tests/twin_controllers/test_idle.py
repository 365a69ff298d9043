"""The controller loop at rest (twin/controllers/manager.py).

Cases:
- node heartbeats and Lease renewals (the kubelet stand-in's own writes, several a second on a
  big twin) do not make every controller pass over every pod: while nothing else changes the
  kubelet stand-in runs far fewer times than those writes happen;
- a change that matters is still acted on at once: a pod bound to a node afterwards runs.
"""

from __future__ import annotations

import time
from typing import Any

from tests.twin_controllers.conftest import ControllersTwin, eventually
from twin.controllers.kubelet import Kubelet
from twin.controllers.leases import LEASE_NAMESPACE, LEASES


def test_heartbeats_do_not_wake_every_controller(twin: Any) -> None:
    t: ControllersTwin = twin(nodes=20, gpus_per_node=1)
    store, manager = t.rs.store, t.manager
    eventually(lambda: len(store.list(LEASES, LEASE_NAMESPACE).items) == 20)
    kubelet = next(c for c in manager.controllers if isinstance(c, Kubelet))
    syncs = 0
    real_sync = kubelet.sync

    def counted(ctx: Any) -> Any:
        nonlocal syncs
        syncs += 1
        return real_sync(ctx)

    kubelet.sync = counted  # type: ignore[method-assign]
    writes = 0

    def on_change(event: Any) -> None:
        nonlocal writes
        if event.resource.startswith("leases") or event.resource == "nodes":
            writes += 1

    unsubscribe = store.subscribe(on_change)
    try:
        time.sleep(3.0)
    finally:
        unsubscribe()
    assert writes >= 10, f"only {writes} heartbeat writes: the test measures nothing"
    assert syncs * 3 < writes, f"{syncs} kubelet passes for {writes} heartbeat writes"

    store.create(
        "pods",
        {
            "metadata": {"name": "late", "namespace": "default"},
            "spec": {"nodeName": "gpu-pool-node-3", "containers": [{"name": "c", "image": "i"}]},
        },
        "default",
    )
    eventually(lambda: store.get("pods", "late", "default")["status"]["phase"] == "Running")
