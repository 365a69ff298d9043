"""Node pools: growth after a provisioning delay, idle-only shrink, MachineDeployments, and the
GKE-shaped cloud API (twin/cloudapi.py) calling `NodePools.resize`.

Cases:
- a MachineDeployment (cluster.x-k8s.io/v1beta1) with replicas 3 grows the pool labelled by
  its template to 3 nodes (each with a ResourceSlice) after the provisioning delay, and its
  status reports replicas/readyReplicas and phase Running;
- scaling it down removes only idle nodes, newest first; a node running a pod stays even
  when the target is 0, and goes once it is idle;
- `setSize` on the cloud API (bearer token, long-running operation) ends in
  `node_pools.resize`, and the new node registers only after the provisioning delay;
- pods bound to a node that is deleted are collected (pod GC) and replaced elsewhere.
"""

from __future__ import annotations

import time
from typing import Any

import httpx
from kubernetes import client

from tests.twin_controllers.conftest import eventually
from tests.twin_controllers.helpers import claim_template, deployment, pods
from twin.cloudapi import CloudApi, CloudApiServer, TwinPool
from twin.controllers.manager import TwinOptions

POOL = "gpu-pool"


def _nodes(t: Any) -> list[str]:
    items = t.core.list_node(label_selector=f"sickbay.dev/node-pool={POOL}").items
    return sorted(n.metadata.name for n in items)


def _machine_deployment(replicas: int) -> dict[str, Any]:
    return {
        "apiVersion": "cluster.x-k8s.io/v1beta1",
        "kind": "MachineDeployment",
        "metadata": {"name": "gpu-workers", "namespace": "default"},
        "spec": {
            "clusterName": "twin",
            "replicas": replicas,
            "selector": {"matchLabels": {"sickbay.dev/node-pool": POOL}},
            "template": {
                "metadata": {"labels": {"sickbay.dev/node-pool": POOL}},
                "spec": {"clusterName": "twin", "bootstrap": {"dataSecretName": "none"}},
            },
        },
    }


def test_machine_deployment_grows_and_shrinks_idle_nodes(twin: Any) -> None:
    # 200 simulated seconds = 1 s real: room to see the pool still provisioning on a busy box.
    t = twin(TwinOptions(provisioning_delay=200))
    custom = client.CustomObjectsApi(t.api)
    assert _nodes(t) == ["gpu-pool-node-0"]  # (also loads the client's API modules first)
    custom.create_namespaced_custom_object(
        "cluster.x-k8s.io", "v1beta1", "default", "machinedeployments", _machine_deployment(3)
    )
    time.sleep(0.2)  # 40 simulated seconds: still provisioning
    assert _nodes(t) == ["gpu-pool-node-0"]
    eventually(lambda: _nodes(t) == ["gpu-pool-node-0", "gpu-pool-node-1", "gpu-pool-node-2"])

    def slices_match_nodes() -> bool:
        # A new node is visible a moment before its driver publishes its ResourceSlices.
        slices = t.dra.list_resource_slice().items
        return sorted(s.spec.node_name for s in slices) == _nodes(t)

    eventually(slices_match_nodes)

    def md_running() -> bool:
        md = custom.get_namespaced_custom_object(
            "cluster.x-k8s.io", "v1beta1", "default", "machinedeployments", "gpu-workers"
        )
        status = md.get("status") or {}
        assert (status.get("replicas"), status.get("readyReplicas"), status.get("phase")) == (
            3,
            3,
            "Running",
        ), status
        return True

    eventually(md_running)

    # A pod on node-0 keeps that node; the idle ones go, newest first.
    ns = t.namespace()
    t.dra.create_namespaced_resource_claim_template(ns, claim_template("gpu"))
    t.apps.create_namespaced_deployment(ns, deployment("pinned", "gpu"))
    pod = eventually(lambda: pods(t.core, ns)[0].status.phase == "Running" and pods(t.core, ns)[0])
    busy = pod.spec.node_name
    custom.patch_namespaced_custom_object(
        "cluster.x-k8s.io",
        "v1beta1",
        "default",
        "machinedeployments",
        "gpu-workers",
        {"spec": {"replicas": 0}},
    )
    eventually(lambda: _nodes(t) == [busy])
    assert t.twin("GET", "/twin/pools").json()["items"][0]["removing"] == [busy]
    t.apps.delete_namespaced_deployment("pinned", ns)
    eventually(lambda: _nodes(t) == [])


async def test_cloud_api_set_size_adds_nodes(twin: Any) -> None:
    t = twin(TwinOptions(provisioning_delay=200))
    api = CloudApi(
        token="cloud-token", on_resize=t.manager.node_pools.resize, clock=t.manager.clock
    )
    api.add_pool(TwinPool(name=POOL, size=1, max_size=4, latency=20))
    server = await CloudApiServer(api).start()
    try:
        url = (
            f"{server.url}/v1/projects/twin/locations/local/clusters/twin/nodePools/{POOL}:setSize"
        )
        async with httpx.AsyncClient() as http:
            response = await http.post(
                url, json={"nodeCount": 2}, headers={"Authorization": "Bearer cloud-token"}
            )
        assert response.status_code == 200, response.text
        assert response.json()["operationType"] == "SET_NODE_POOL_SIZE"
        await api.wait_idle()  # the operation (20 simulated seconds) is done ...
        assert t.manager.node_pools.status(POOL).provisioning == 1  # ... the node not yet
        deadline = time.monotonic() + 15
        while _nodes(t) != ["gpu-pool-node-0", "gpu-pool-node-1"]:
            assert time.monotonic() < deadline, _nodes(t)
            await t.manager.clock.sleep(5)
    finally:
        await server.stop()
        await api.aclose()


def test_pods_on_a_deleted_node_are_collected(twin: Any) -> None:
    t = twin(nodes=2)
    ns = t.namespace()
    t.dra.create_namespaced_resource_claim_template(ns, claim_template("gpu"))
    t.apps.create_namespaced_deployment(ns, deployment("app", "gpu"))
    pod = eventually(lambda: pods(t.core, ns)[0].status.phase == "Running" and pods(t.core, ns)[0])
    t.core.delete_node(pod.spec.node_name)

    def moved() -> bool:
        (p,) = pods(t.core, ns)
        assert p.metadata.name != pod.metadata.name
        return p.status.phase == "Running" and p.spec.node_name != pod.spec.node_name

    eventually(moved)
