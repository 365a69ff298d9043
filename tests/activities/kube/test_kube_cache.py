"""The Kubernetes client's per-worker cache and ResourceSlice reads.

Cases:
- concurrent readers of an expired key share one load (single flight), and its result;
- a failing load fails every waiter and is not cached: the next reader loads again;
- with `stale`, readers of an expired entry that one reader is reloading get the entry it
  replaces at once (none holds a thread waiting), the reloader the new one; past
  `ttl + stale`, or without `stale`, they wait for the load;
- one node's devices are read with a `spec.nodeName` field selector: one request, only that
  node's slices (against the cluster twin);
- a young cluster-wide list serves a node's devices without another request;
- the budget's GPU inventory (`gpus_per_node`, read without building devices) finds exactly
  the physical GPUs `physical_gpus` finds in the converted devices: on a twin mixing MIG,
  vGPU, time-sliced and whole GPUs, and on hand-written slices (driver-domain and upper-case
  attribute names, the v1beta1 `basic` shape, GPU-UUID parents, devices without a uuid,
  a slice without nodeName, empty values);
- count_devices against that twin: cluster and pool totals per physical GPU;
- a storm of concurrent counts lists the ResourceSlices once, a count within the TTL not at
  all, and a young cluster-wide device list is reused without a request;
- evidence and consumers running side by side share one node pod list (held 1 s by the twin);
  a later fresh read lists again;
- Sickbay's DeviceTaintRules are cached a second at most for a count: concurrent counts share the list
  one of them has under way (held 1 s by the twin here), and a count after a quarantine (or
  a release) sees the change, applied to the young list without listing every rule again.
"""

from __future__ import annotations

import asyncio
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any
from urllib.parse import unquote

import pytest
from kubernetes.client import ApiClient
from temporalio.testing import ActivityEnvironment

from activities.kube import KubeActivities
from activities.kube.client import Kube, KubeSettings
from activities.kube.devices import (
    count_by_node,
    gpu_inventory,
    gpus_per_node,
    list_slice_devices,
    node_pool_of,
    physical_gpus,
    slice_devices,
)
from activities.kube.quarantine import count_devices
from contract.kube import (
    CountDevicesInput,
    DeviceRef,
    QuarantineInput,
    ReleaseInput,
    ResolveDeviceInput,
)
from twin.testing import RunningTwin


def _kube(twin: RunningTwin) -> Kube:
    return Kube.from_settings(KubeSettings(kubeconfig=str(twin.kubeconfig_path)))


def test_concurrent_readers_share_one_load() -> None:
    kube = Kube(ApiClient())  # the loads below are the test's own: no API call is made
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


def test_readers_get_the_replaced_entry_while_one_reloads() -> None:
    kube = Kube(ApiClient())
    assert kube.cached("k", 0.05, lambda: "old", stale=60.0) == "old"
    assert kube.cached("plain", 0.05, lambda: "old") == "old"
    time.sleep(0.1)  # both expired
    release = threading.Event()

    def reload() -> str:
        release.wait(5)
        return "new"

    with ThreadPoolExecutor(8) as pool:
        leader = pool.submit(kube.cached, "k", 0.05, reload, stale=60.0)
        time.sleep(0.1)  # the reload is under way
        readers = [pool.submit(kube.cached, "k", 0.05, reload, stale=60.0) for _ in range(4)]
        answered = [f.result(timeout=2) for f in readers]  # without waiting for the reload
        plain_leader = pool.submit(kube.cached, "plain", 0.05, reload)
        time.sleep(0.1)
        plain = pool.submit(kube.cached, "plain", 0.05, reload)
        time.sleep(0.1)
        assert not plain.done(), "a reader without `stale` must wait for the load"
        release.set()
        assert leader.result(timeout=5) == "new" and plain.result(timeout=5) == "new"
        assert plain_leader.result(timeout=5) == "new"
    assert answered == ["old"] * 4
    assert kube.cached("k", 60.0, lambda: "never") == "new"
    # Older than ttl + stale: a reader waits, as without `stale`.
    release.clear()
    time.sleep(0.1)
    with ThreadPoolExecutor(2) as pool:
        first = pool.submit(kube.cached, "k", 0.01, reload, stale=0.02)
        time.sleep(0.1)
        second = pool.submit(kube.cached, "k", 0.01, reload, stale=0.02)
        time.sleep(0.1)
        assert not second.done()
        release.set()
        assert first.result(timeout=5) == second.result(timeout=5) == "new"


def test_failed_load_fails_waiters_and_is_not_cached() -> None:
    kube = Kube(ApiClient())
    calls = 0

    def broken() -> str:
        nonlocal calls
        calls += 1
        raise ConnectionResetError("reset by peer")

    with pytest.raises(ConnectionResetError):
        kube.cached("k", 10.0, broken)
    assert kube.cached("k", 10.0, lambda: "ok") == "ok"
    assert calls == 1


def test_node_devices_read_with_field_selector(twin: RunningTwin) -> None:
    kube = _kube(twin)
    node = sorted(d.node for d in list_slice_devices(kube, fresh=True))[0]
    twin.clear_requests()
    devices = list_slice_devices(kube, node, fresh=True)
    reads = twin.requests(resource="resourceslices")
    assert len(reads) == 1
    assert f"fieldSelector=spec.nodeName={node}" in unquote(reads[0].query)
    assert devices and {d.node for d in devices} == {node}


def test_young_cluster_list_serves_a_node_without_a_request(twin: RunningTwin) -> None:
    kube = _kube(twin)
    everything = list_slice_devices(kube, fresh=True)
    node = everything[0].node
    twin.clear_requests()
    devices = list_slice_devices(kube, node)
    assert twin.requests(resource="resourceslices") == []
    assert devices == [d for d in everything if d.node == node]


# Pools of every shape the twin seeds: MIG (slices name their parent), vGPU, time-sliced
# replicas sharing the GPU's uuid, whole GPUs. 3*2 + 2*4 + 1*2 + 2*3 = 22 physical GPUs.
MIXED = [
    {"name": "mig", "nodes": 3, "gpusPerNode": 2, "topology": "mig", "slicesPerGpu": 3},
    {"name": "vgpu", "nodes": 2, "gpusPerNode": 4, "topology": "vgpu", "slicesPerGpu": 2},
    {"name": "ts", "nodes": 1, "gpusPerNode": 2, "topology": "timeslice", "slicesPerGpu": 4},
    {"name": "full", "nodes": 2, "gpusPerNode": 3, "topology": "full"},
]


def _slices(kube: Kube) -> list[dict[str, Any]]:
    body = kube.call(kube.resource_v1.list_resource_slice, verb="list", resource="resourceslices")
    return body["items"]


def test_inventory_matches_device_semantics_on_mixed_twin(twin_factory: Any) -> None:
    twin = twin_factory(profile="1.36", pools=MIXED)
    kube = _kube(twin)
    items = _slices(kube)
    light = gpus_per_node(items)
    assert light == count_by_node(slice_devices(items))
    assert sum(light.values()) == len(physical_gpus(slice_devices(items))) == 22
    assert light["mig-node-0"] == 2 and light["vgpu-node-1"] == 4 and light["ts-node-0"] == 2


def _dev(name: str, **attrs: Any) -> dict[str, Any]:
    return {"name": name, "attributes": attrs}


def test_inventory_matches_device_semantics_on_odd_slices() -> None:
    items = [
        {  # domain-qualified and upper-case names; a MIG slice naming its parent
            "spec": {
                "driver": "gpu.nvidia.com",
                "nodeName": "n1",
                "pool": {"name": "n1"},
                "devices": [
                    _dev("gpu-0", **{"gpu.nvidia.com/UUID": {"string": "GPU-A"}}),
                    _dev(
                        "gpu-0-mig-0",
                        uuid={"string": "MIG-1"},
                        **{"gpu.nvidia.com/parentUUID": {"string": "GPU-A"}},
                    ),
                    _dev("mig-orphan", uuid={"string": "MIG-2"}, gpuUUID={"string": "GPU-B"}),
                    _dev("no-uuid", index={"int": 3}),  # counts as its own GPU
                    _dev("empty", uuid={"string": ""}),  # empty counts as absent
                    _dev("int-uuid", uuid={"int": 7}),
                    {"name": "beta", "basic": {"attributes": {"uuid": {"string": "GPU-C"}}}},
                    _dev("dup", uuid={"string": "GPU-C"}),  # same GPU as "beta"
                ],
            }
        },
        {  # a network-attached pool: no nodeName, keyed by the pool
            "spec": {
                "driver": "gpu.example.com",
                "pool": {"name": "fabric"},
                "devices": [_dev("x", uuid={"string": "GPU-X"}), _dev("y")],
            }
        },
        {"spec": {"driver": "d", "nodeName": "n2", "pool": {"name": "n2"}, "devices": []}},
        {"spec": {}},
    ]
    light = gpus_per_node(items)
    assert light == count_by_node(slice_devices(items))
    assert light == {"n1": 6, "fabric": 2}


def test_count_devices_on_mixed_twin(twin_factory: Any) -> None:
    twin = twin_factory(profile="1.36", pools=MIXED)
    acts = KubeActivities(KubeSettings(kubeconfig=str(twin.kubeconfig_path)))
    env = ActivityEnvironment()
    counts = asyncio.run(env.run(acts.count_devices, CountDevicesInput(node_pool="vgpu")))
    assert (counts.cluster_devices, counts.pool_devices) == (22, 8)
    assert (counts.cluster_quarantined, counts.pool_quarantined) == (0, 0)
    counts = asyncio.run(env.run(acts.count_devices, CountDevicesInput(node_pool=None)))
    assert (counts.cluster_devices, counts.pool_devices) == (22, 0)
    assert counts.node_pool is None


def test_count_devices_by_node_counts_the_nodes_pool(twin_factory: Any) -> None:
    """A remediation counts while it still resolves the device: by the alert's node, whose
    pool the node list labels; the counts name the pool they counted."""
    twin = twin_factory(profile="1.36", pools=MIXED)
    acts = KubeActivities(KubeSettings(kubeconfig=str(twin.kubeconfig_path)))
    kube = acts.kube
    nodes = kube.call(kube.core.list_node, verb="list", resource="nodes")["items"]
    pools = {n["metadata"]["name"]: node_pool_of(n) for n in nodes}
    node = next(name for name, pool in pools.items() if pool == "vgpu")
    env = ActivityEnvironment()
    counts = asyncio.run(env.run(acts.count_devices, CountDevicesInput(node=node)))
    assert (counts.node_pool, counts.cluster_devices, counts.pool_devices) == ("vgpu", 22, 8)
    asked = asyncio.run(env.run(acts.count_devices, CountDevicesInput(node_pool="vgpu")))
    assert asked == counts
    # A pool given wins over the node; a node the cluster has not got counts no pool.
    other = asyncio.run(env.run(acts.count_devices, CountDevicesInput(node_pool="mig", node=node)))
    assert (other.node_pool, other.pool_devices) == ("mig", 6)
    gone = asyncio.run(env.run(acts.count_devices, CountDevicesInput(node="no-such-node")))
    assert (gone.node_pool, gone.cluster_devices, gone.pool_devices) == (None, 22, 0)


def test_concurrent_counts_list_slices_once(twin_factory: Any) -> None:
    twin = twin_factory(profile="1.36", pools=MIXED)
    acts = KubeActivities(KubeSettings(kubeconfig=str(twin.kubeconfig_path)))
    kube, apis = acts.kube, acts._apis()
    twin.clear_requests()
    with ThreadPoolExecutor(12) as pool:
        results = list(pool.map(lambda _: count_devices(kube, apis, "mig"), range(12)))
    assert {(c.cluster_devices, c.pool_devices) for c in results} == {(22, 6)}
    assert len(twin.requests(resource="resourceslices")) == 1
    twin.clear_requests()
    assert count_devices(kube, apis, "mig").cluster_devices == 22  # within the TTL
    assert twin.requests(resource="resourceslices") == []
    assert sum(gpu_inventory(kube, max_age=0).values()) == 22  # max_age 0 reads now
    assert len(twin.requests(resource="resourceslices")) == 1


def test_inventory_reuses_young_device_list(twin: RunningTwin) -> None:
    kube = _kube(twin)
    everything = list_slice_devices(kube, fresh=True)
    twin.clear_requests()
    assert gpu_inventory(kube) == count_by_node(everything)
    assert twin.requests(resource="resourceslices") == []


def test_counts_share_a_young_rule_list_and_see_their_own_writes(twin_factory: Any) -> None:
    twin = twin_factory(profile="1.36", pools=MIXED)
    acts = KubeActivities(KubeSettings(kubeconfig=str(twin.kubeconfig_path)))
    kube, apis = acts.kube, acts._apis()
    env = ActivityEnvironment()
    node = "mig-node-1"
    device = asyncio.run(
        env.run(acts.resolve_device, ResolveDeviceInput(device=DeviceRef(node=node, gpu_index=1)))
    )
    assert count_devices(kube, apis, "mig").cluster_quarantined == 0
    twin.clear_requests()
    held = asyncio.run(
        env.run(acts.quarantine_device, QuarantineInput(device=device, workflow_id="wf-1"))
    )
    after = count_devices(kube, apis, "mig")  # right after its own create: it is counted
    assert (after.cluster_quarantined, after.pool_quarantined) == (1, 1)
    # ... from the young list with the create applied, not from a second list of every rule
    # (under a burst each create used to make every count list them all again).
    assert twin.requests(verb="list", resource="devicetaintrules") == []

    def slow_rule_list(info: Any) -> float | None:
        listing = info.verb == "list" and info.resource == "devicetaintrules"
        return 1.0 if listing else None

    twin.twin.add_request_interceptor(slow_rule_list)
    twin.clear_requests()
    callers = 12
    with ThreadPoolExecutor(callers) as pool:
        results = list(pool.map(lambda _: count_devices(kube, apis, "mig"), range(callers)))
    assert {(c.cluster_quarantined, c.pool_quarantined) for c in results} == {(1, 1)}
    # Without sharing every count lists once; each list is held 1 s, so they overlap.
    assert len(twin.requests(verb="list", resource="devicetaintrules")) < callers // 2
    twin.twin.remove_request_interceptor(slow_rule_list)
    assert count_devices(kube, apis, "mig").cluster_quarantined == 1  # a young list, kept
    asyncio.run(
        env.run(
            acts.release_quarantine,
            ReleaseInput(
                device=device,
                rule_name=held.rule_name,
                api_version=held.api_version,
                workflow_id="wf-1",
                rule_uids=held.rule_uids,
            ),
        )
    )
    twin.clear_requests()
    gone = count_devices(kube, apis, "mig")  # its own delete applied to the young list
    assert (gone.cluster_quarantined, gone.pool_quarantined) == (0, 0)


def test_evidence_and_consumers_side_by_side_share_one_pod_list(twin_factory: Any) -> None:
    """The workflow runs gather-evidence (a fresh read) and find-consumers (a read of at most
    a few seconds) at once: while one node's pod list is under way (held 1 s by the twin),
    the other joins it instead of listing again; a later fresh read lists again."""
    from activities.kube.consumers import find_consumers
    from activities.kube.evidence import gather_evidence
    from contract.kube import FindConsumersInput

    twin = twin_factory(profile="1.36", pools=MIXED)
    acts = KubeActivities(KubeSettings(kubeconfig=str(twin.kubeconfig_path)))
    kube = acts.kube
    env = ActivityEnvironment()
    device = asyncio.run(
        env.run(
            acts.resolve_device,
            ResolveDeviceInput(device=DeviceRef(node="mig-node-1", gpu_index=1)),
        )
    )

    def slow_pod_list(info: Any) -> float | None:
        return 1.0 if info.verb == "list" and info.resource == "pods" else None

    twin.twin.add_request_interceptor(slow_pod_list)
    twin.clear_requests()
    with ThreadPoolExecutor(2) as pool:
        evidence = pool.submit(gather_evidence, kube, device)
        time.sleep(0.2)  # the evidence list is under way (held 1 s)
        consumers = pool.submit(find_consumers, kube, FindConsumersInput(device=device))
        evidence.result(), consumers.result()
    assert len(twin.requests(verb="list", resource="pods")) == 1
    gather_evidence(kube, device)  # fresh: never served from the cache
    assert len(twin.requests(verb="list", resource="pods")) == 2


def test_evidence_reuses_a_pod_list_loaded_since_it_was_scheduled(twin_factory: Any) -> None:
    """find-consumers finished its list before gather-evidence (scheduled with it) started:
    the evidence uses that list, loaded after the step was scheduled, instead of listing
    again; a list loaded before the step was scheduled is never used."""
    from activities.kube.consumers import find_consumers
    from activities.kube.evidence import gather_evidence
    from contract.kube import FindConsumersInput

    twin = twin_factory(profile="1.36", pools=MIXED)
    acts = KubeActivities(KubeSettings(kubeconfig=str(twin.kubeconfig_path)))
    kube = acts.kube
    device = asyncio.run(
        ActivityEnvironment().run(
            acts.resolve_device,
            ResolveDeviceInput(device=DeviceRef(node="mig-node-1", gpu_index=1)),
        )
    )
    twin.clear_requests()
    scheduled = time.time()
    find_consumers(kube, FindConsumersInput(device=device))
    assert len(twin.requests(verb="list", resource="pods")) == 1
    gather_evidence(kube, device, fresh_since=scheduled)
    assert len(twin.requests(verb="list", resource="pods")) == 1  # reused
    gather_evidence(kube, device, fresh_since=time.time())  # scheduled after that list
    assert len(twin.requests(verb="list", resource="pods")) == 2
    gather_evidence(kube, device, fresh_since=0.0)  # no usable schedule time: a fresh read
    assert len(twin.requests(verb="list", resource="pods")) == 3


def test_derived_values_follow_their_source_object() -> None:
    """A summary of a cached list is computed once per list object, and again for a new
    list (a node write drops the node list, so the next count summarizes the new one)."""
    kube = Kube(ApiClient(), 5.0)
    calls: list[int] = []

    def summarize(items: list[int]) -> int:
        calls.append(len(items))
        return sum(items)

    first, second = [1, 2], [1, 2]
    assert kube.derived("sum", first, summarize) == 3
    assert kube.derived("sum", first, summarize) == 3
    assert calls == [2]
    assert kube.derived("sum", second, summarize) == 3  # equal but not the same list
    assert calls == [2, 2]
