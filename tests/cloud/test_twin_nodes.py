"""Scale-up through the whole twin: the cloud API wired to the twin's node-pool
controller (`attach_cloud_api`), the pool scaler on the dev server, two remediation-like
callers at once. New Nodes (and their ResourceSlices) appear in the twin's Kubernetes API.

Cases:
- two concurrent needs -> one setSize -> the pool grows 2 -> 4 Nodes with ResourceSlices,
  seen through the official kubernetes client;
- `sickbay-dev twin up` wiring: `add_twin_up_arguments` + `configure_twin` serve the API for the
  seeded pool with the token given on the command line.
- `PUT /twin/pools/<pool>/cloud {"latency"}` (drills: a slow resize): the next setSize
  operation stays RUNNING for that many simulated seconds, then is DONE; a bad latency or an
  unknown setting is 400, an unknown pool 404;
- `PUT /twin/pools/<pool>/cloud {"aks", "armAnswerDelay"}` (the AKS crash drill): the pool's
  nodes get VMSS providerIDs the ARM endpoints serve (a restart reboots that twin node), ARM's
  answer is held after it acted; a bad body is 400.
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from kubernetes import client as k8s
from temporalio.testing import WorkflowEnvironment

from activities.cloud import CloudActivities
from contract.capacity import NodePoolTarget
from tests.cloud.conftest import TWIN_TOKEN
from tests.cloud.test_twin_e2e import run_callers
from twin.clock import Clock
from twin.cloudapi import (
    POOL_LABEL,
    CloudApi,
    add_twin_up_arguments,
    attach_cloud_api,
    configure_twin,
)
from twin.controllers.manager import ControllerManager, TwinOptions
from twin.testing import RunningTwin, start_twin

TIME_SCALE = 200.0  # 30 s node provisioning passes in 0.15 s


def eventually(check: Any, timeout: float = 15.0) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = check()
        if value:
            return value
        time.sleep(0.05)
    raise AssertionError(f"not reached within {timeout}s")


@pytest.fixture
def twin(tmp_path: Any) -> Iterator[tuple[RunningTwin, CloudApi]]:
    manager = ControllerManager(TwinOptions())
    rs = start_twin(
        tmp_path,
        clock=Clock(time_scale=TIME_SCALE),
        controllers=(manager,),
        nodes=2,
        gpus_per_node=2,
    )
    try:
        api = attach_cloud_api(rs.twin, token=TWIN_TOKEN, max_size=6, latency=5.0)
        yield rs, api
    finally:
        rs.stop()


def pool_nodes(rs: RunningTwin, pool: str) -> list[str]:
    core = k8s.CoreV1Api(rs.api_client())
    return sorted(
        n.metadata.name for n in core.list_node(label_selector=f"{POOL_LABEL}={pool}").items
    )


async def test_scale_up_adds_nodes_to_the_twin(
    dev_env: WorkflowEnvironment,
    twin: tuple[RunningTwin, CloudApi],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    rs, api = twin
    monkeypatch.setenv("SICKBAY_TWIN_CLOUD_TOKEN", TWIN_TOKEN)
    (pool_name,) = api.pools
    before = pool_nodes(rs, pool_name)
    assert len(before) == 2
    cloud_url = rs.twin.extensions["cloud"].url
    pool = NodePoolTarget(provider="twin", name=pool_name, endpoint=cloud_url)
    cloud = CloudActivities()
    try:
        results = await run_callers(dev_env.client, pool, cloud)
    finally:
        await cloud.aclose()
    assert [r.status for r in results] == ["satisfied", "satisfied"]
    assert len(api.resize_requests(pool_name)) == 1
    after = eventually(lambda: (nodes := pool_nodes(rs, pool_name)) and len(nodes) == 4 and nodes)
    assert set(before) < set(after)
    new = set(after) - set(before)
    slices = k8s.ResourceV1Api(rs.api_client()).list_resource_slice().items
    assert new <= {s.spec.node_name for s in slices}  # each new node publishes its GPUs


def test_twin_up_serves_the_cloud_api(tmp_path: Any) -> None:
    parser = argparse.ArgumentParser()
    add_twin_up_arguments(parser)
    args = parser.parse_args(["--cloud-token", "cli-token", "--cloud-max-size", "5"])
    rs = start_twin(tmp_path, nodes=1, gpus_per_node=1)
    try:
        api = configure_twin(rs.twin, args)
        assert api is not None and api.token == "cli-token"
        (pool,) = api.pools.values()
        assert (pool.size, pool.max_size) == (1, 5)
        url = rs.twin.extensions["cloud"].url
        path = f"/v1/projects/twin/locations/local/clusters/twin/nodePools/{pool.name}"
        assert httpx.get(url + path).status_code == 401
        answer = httpx.get(url + path, headers={"Authorization": "Bearer cli-token"})
        assert answer.status_code == 200 and answer.json()["name"] == pool.name
    finally:
        rs.stop()


def test_slow_resize_knob(twin: tuple[RunningTwin, CloudApi]) -> None:
    rs, api = twin
    (pool_name,) = api.pools
    token = {"Authorization": f"Bearer {TWIN_TOKEN}"}

    def put(name: str, body: Any) -> httpx.Response:
        return httpx.put(f"{rs.url}/twin/pools/{name}/cloud", json=body, timeout=10)

    answer = put(pool_name, {"latency": 400})  # 400 simulated s = 2 real s at 200x
    assert answer.status_code == 200, answer.text
    assert answer.json()["latency"] == 400 and api.pools[pool_name].latency == 400
    assert put(pool_name, {"latency": -1}).status_code == 400
    assert put(pool_name, {"latency": "slow"}).status_code == 400
    assert put(pool_name, {"speed": 1}).status_code == 400
    assert put("no-such-pool", {"latency": 1}).status_code == 404
    url = rs.twin.extensions["cloud"].url
    base = f"{url}/v1/projects/twin/locations/local"
    op = httpx.post(
        f"{base}/clusters/twin/nodePools/{pool_name}:setSize",
        json={"nodeCount": 3},
        headers=token,
        timeout=10,
    ).json()
    time.sleep(0.5)  # 100 simulated s: the default latency (5 s) would be long over
    status = httpx.get(f"{base}/operations/{op['name']}", headers=token, timeout=10).json()
    assert status["status"] == "RUNNING"
    eventually(
        lambda: (
            httpx.get(f"{base}/operations/{op['name']}", headers=token, timeout=10).json()["status"]
            == "DONE"
        )
    )


def test_aks_pool_knobs(twin: tuple[RunningTwin, CloudApi]) -> None:
    rs, api = twin
    (pool_name,) = api.pools

    def put(body: Any) -> httpx.Response:
        return httpx.put(f"{rs.url}/twin/pools/{pool_name}/cloud", json=body, timeout=10)

    aks = {"subscription": "s", "resourceGroup": "mc_rg", "vmss": "aks-gpu-vmss"}
    assert put({"aks": {"subscription": "s"}}).status_code == 400
    assert put({"aks": {**aks, "vmss": "a/b"}}).status_code == 400
    assert put({"armAnswerDelay": -1}).status_code == 400
    answer = put({"aks": aks, "armAnswerDelay": 0.5})
    assert answer.status_code == 200, answer.text
    vms = answer.json()["vmssNodes"]
    assert sorted(vms.values()) == sorted(
        n["metadata"]["name"] for n in rs.twin.store.list("nodes").items
    )
    vm_key, node = sorted(vms.items())[0]
    provider_id = rs.twin.store.get("nodes", node)["spec"]["providerID"]
    assert provider_id == (
        "azure:///subscriptions/s/resourceGroups/mc_rg/providers/Microsoft.Compute/"
        f"virtualMachineScaleSets/{vm_key.replace('/', '/virtualMachines/')}"
    )
    url = rs.twin.extensions["cloud"].url + provider_id.removeprefix("azure://")
    headers = {"Authorization": f"Bearer {TWIN_TOKEN}"}
    restarted = httpx.post(f"{url}/restart", headers=headers, timeout=10)
    assert restarted.status_code == 202 and api.instance_calls == [("reset", node)]
    eventually(lambda: rs.twin.extensions["repairs"].reboots == [node])
