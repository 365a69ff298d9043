"""The controller loop at rest (twin/controllers/manager.py).

Cases:
- node heartbeats and Lease renewals (the kubelet stand-in's own writes, several a second on a
  big twin) do not make every controller pass over every pod: while nothing else changes the
  kubelet stand-in runs far fewer times than those writes happen;
- a change that matters is still acted on at once: a pod bound to a node afterwards runs;
- a stream of API writes does not keep the loop passing back to back: after a pass that took S
  seconds the next waits about S (at most 0.25 s), so on a big twin (a pass over 8,000 pods
  takes ~150 ms) the controllers take at most about half a core and the API server's GIL
  while clients write, and what changed meanwhile is handled in that next pass;
- a DeviceTaintRule change wakes only the controllers that read rules (device-taint eviction,
  scheduler), not the kubelet stand-in's pass over every pod; the rules still get their status.
"""

from __future__ import annotations

import threading
import time
from typing import Any

from tests.twin_controllers.conftest import ControllersTwin, eventually
from tests.twin_controllers.helpers import taint_rule
from twin.controllers.common import TAINT_RULES
from twin.controllers.kubelet import Kubelet
from twin.controllers.leases import LEASE_NAMESPACE, LEASES
from twin.controllers.taints import DeviceTaintEviction


def _bound_pod_runs(store: Any, name: str, node: str) -> None:
    """A pod bound to `node` now is acted on: it runs."""
    store.create(
        "pods",
        {
            "metadata": {"name": name, "namespace": "default"},
            "spec": {"nodeName": node, "containers": [{"name": "c", "image": "i"}]},
        },
        "default",
    )
    eventually(lambda: store.get("pods", name, "default")["status"]["phase"] == "Running")


def _counting(controller: Any, pause: float = 0.0) -> list[int]:
    """Count the controller's passes from now on (a one-item list, read as [0]); with `pause`,
    each pass takes that many seconds longer."""
    calls = [0]
    real = controller.sync

    def counted(ctx: Any) -> Any:
        calls[0] += 1
        time.sleep(pause)
        return real(ctx)

    controller.sync = counted
    return calls


def test_heartbeats_do_not_wake_every_controller(twin: Any) -> None:
    t: ControllersTwin = twin(nodes=20, gpus_per_node=1)
    store, manager = t.rs.store, t.manager
    eventually(lambda: len(store.list(LEASES, LEASE_NAMESPACE).items) == 20)
    syncs = _counting(next(c for c in manager.controllers if isinstance(c, Kubelet)))
    writes = 0

    def on_change(event: Any) -> None:
        nonlocal writes
        if event.resource.startswith("leases") or event.resource == "nodes":
            writes += 1

    unsubscribe = store.subscribe(on_change)
    try:
        # Until there are enough heartbeat writes to measure against (about 3 s when idle).
        eventually(lambda: writes >= 10)
    finally:
        unsubscribe()
    assert syncs[0] * 3 < writes, f"{syncs[0]} kubelet passes for {writes} heartbeat writes"

    _bound_pod_runs(store, "late", "gpu-pool-node-3")


def test_a_stream_of_writes_leaves_the_loop_time_to_rest(twin: Any) -> None:
    t: ControllersTwin = twin(nodes=2, gpus_per_node=1)
    store, manager = t.rs.store, t.manager
    pass_seconds = 0.05  # a slow pass, as one over 8,000 pods is
    kubelet = next(c for c in manager.controllers if isinstance(c, Kubelet))
    syncs = _counting(kubelet, pause=pass_seconds)
    stop = threading.Event()

    def writer() -> None:  # a client writing all the time (ConfigMaps: a change that wakes)
        n = 0
        while not stop.is_set():
            n += 1
            store.create("configmaps", {"metadata": {"name": f"cm-{n}"}, "data": {}}, "default")
            time.sleep(0.005)

    thread = threading.Thread(target=writer, daemon=True)
    started = time.monotonic()
    syncs[0] = 0
    thread.start()
    try:
        time.sleep(2.0)  # the behaviour: the window the passes are counted over
    finally:
        stop.set()
        thread.join()
    elapsed = time.monotonic() - started
    # Back to back (before): one pass every 50 ms, ~40 in 2 s. Resting: at most one per 100 ms.
    # Load only makes passes slower and fewer, so the bound holds on a busy machine too.
    most = elapsed / (2 * pass_seconds) + 2
    assert 0 < syncs[0] <= most, f"{syncs[0]} passes in {elapsed:.2f} s (at most {most:.0f})"

    _bound_pod_runs(store, "late", "gpu-pool-node-1")


def test_a_rule_change_wakes_only_the_controllers_that_read_rules(twin: Any) -> None:
    t: ControllersTwin = twin(nodes=2, gpus_per_node=2)
    store, manager = t.rs.store, t.manager
    node = "gpu-pool-node-0"
    _bound_pod_runs(store, "busy", node)
    time.sleep(0.5)  # the pod's start-up timers are spent
    kubelet = _counting(next(c for c in manager.controllers if isinstance(c, Kubelet)))
    taints = _counting(next(c for c in manager.controllers if isinstance(c, DeviceTaintEviction)))
    for n in range(20):
        store.create(TAINT_RULES, taint_rule(f"r-{n}", node, "gpu-1", effect="NoSchedule"))
        time.sleep(0.02)
    eventually(lambda: taints[0] >= 1)
    time.sleep(0.3)
    assert kubelet[0] <= 2, f"the kubelet stand-in passed {kubelet[0]} times for 20 rule creates"
    # Still acted on: the eviction controller writes each rule's status. (Evictions through
    # the running loop: test_scheduling.py and test_seed_story.py.)
    eventually(lambda: (store.get(TAINT_RULES, "r-19").get("status") or {}).get("conditions"))
