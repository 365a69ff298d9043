"""The Kubernetes client's per-worker cache and ResourceSlice reads.

Cases:
- concurrent readers of an expired key share one load (single flight), and its result;
- a failing load fails every waiter and is not cached: the next reader loads again;
- one node's devices are read with a `spec.nodeName` field selector: one request, only that
  node's slices (against the cluster twin);
- a young cluster-wide list serves a node's devices without another request.
"""

from __future__ import annotations

import threading
import time
from concurrent.futures import ThreadPoolExecutor
from urllib.parse import unquote

import pytest

from activities.kube.client import Kube, KubeSettings
from activities.kube.devices import list_slice_devices
from simulator.testing import RunningSim


def _kube(sim: RunningSim) -> Kube:
    return Kube.from_settings(KubeSettings(kubeconfig=str(sim.kubeconfig_path)))


def test_concurrent_readers_share_one_load() -> None:
    kube = Kube.__new__(Kube)  # no API client needed for the cache
    kube._cache, kube._cache_lock, kube._inflight = {}, threading.Lock(), {}
    loads = 0
    release = threading.Event()

    def load() -> str:
        nonlocal loads
        loads += 1
        release.wait(5)
        return "inventory"

    with ThreadPoolExecutor(16) as pool:
        futures = [pool.submit(kube.cached, "k", 10.0, load) for _ in range(16)]
        time.sleep(0.2)  # let every reader arrive while the first load is still running
        release.set()
        results = [f.result(timeout=5) for f in futures]
    assert results == ["inventory"] * 16
    assert loads == 1


def test_failed_load_fails_waiters_and_is_not_cached() -> None:
    kube = Kube.__new__(Kube)
    kube._cache, kube._cache_lock, kube._inflight = {}, threading.Lock(), {}
    calls = 0

    def broken() -> str:
        nonlocal calls
        calls += 1
        raise ConnectionResetError("reset by peer")

    with pytest.raises(ConnectionResetError):
        kube.cached("k", 10.0, broken)
    assert kube.cached("k", 10.0, lambda: "ok") == "ok"
    assert calls == 1


def test_node_devices_read_with_field_selector(sim: RunningSim) -> None:
    kube = _kube(sim)
    node = sorted(d.node for d in list_slice_devices(kube, fresh=True))[0]
    sim.clear_requests()
    devices = list_slice_devices(kube, node, fresh=True)
    reads = sim.requests(resource="resourceslices")
    assert len(reads) == 1
    assert f"fieldSelector=spec.nodeName={node}" in unquote(reads[0].query)
    assert devices and {d.node for d in devices} == {node}


def test_young_cluster_list_serves_a_node_without_a_request(sim: RunningSim) -> None:
    kube = _kube(sim)
    everything = list_slice_devices(kube, fresh=True)
    node = everything[0].node
    sim.clear_requests()
    devices = list_slice_devices(kube, node)
    assert sim.requests(resource="resourceslices") == []
    assert devices == [d for d in everything if d.node == node]
