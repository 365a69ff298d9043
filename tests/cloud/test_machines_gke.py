"""Node rungs through GKE (activities/cloud/machines.py `GkeMachines`) against the twin's
Compute Engine endpoints (twin/cloudapi.py), wired to the twin's node rungs.

Cases:
- reboot: `instances.reset` of the node's VM (from its providerID); the twin reboots the node
  and it comes back with its GPUs; the retried call (same attempt, same requestId) is answered
  with the first operation and acts nowhere again: one reset, one reboot;
- replace: `recreateInstances` on the pool's instance group manager; the pool's new node (new
  UUIDs) is followed; the retry acts once;
- failure modes through the twin's injection: 500 and 409 retryable; 403 (quota, permission)
  non-retryable RepairProviderRefused with the provider's words; a node whose providerID is not
  a Compute Engine instance -> RepairProviderNotConfigured.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from kubernetes import config
from temporalio.exceptions import ApplicationError
from temporalio.testing import ActivityEnvironment

from activities.cloud.credentials import StaticToken
from activities.cloud.gke import GkeNodePools
from activities.cloud.machines import GkeMachines, MachineActivities
from activities.kube.repair_activities import KubeRepairActivities
from activities.outbound import SecretRef
from contract.capacity import NodePoolTarget
from contract.errors import (
    ERR_CLOUD_UNAVAILABLE,
    ERR_PROVIDER_NOT_CONFIGURED,
    ERR_PROVIDER_REFUSED,
    ERR_STILL_WAITING,
)
from contract.repair_rungs import MachineActionInput, WaitNodeGpusInput
from tests.activities.kube.conftest import twin
from twin.clock import Clock
from twin.cloudapi import CloudApi, CloudApiServer, TwinPool
from twin.controllers.manager import ControllerManager, TwinOptions

TOKEN = "gke-twin-token"
POOL = NodePoolTarget(
    provider="gke", name="gpu-pool", project="twin", location="local", cluster="twin"
)
WAIT = 30.0


@pytest.fixture
async def gke(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[Any]:
    monkeypatch.setenv("SICKBAY_TEST_GKE_TOKEN", TOKEN)
    cm = twin(
        tmp_path,
        "1.36",
        controllers=ControllerManager(
            TwinOptions(pod_startup_seconds=1, reboot_seconds=20, provisioning_delay=10)
        ),
        clock=Clock(time_scale=20),
    )
    t = cm.__enter__()
    repairs = t.twin.extensions["repairs"]

    def on_instance(action: str, instance: str) -> None:
        if action == "reset":
            repairs.reboot(instance)
        else:
            repairs.replace(instance, same_name=True)

    api = CloudApi(token=TOKEN, on_instance=on_instance)
    api.add_pool(TwinPool(name="gpu-pool", size=2, zone="us-central1-a"))
    server = await CloudApiServer(api).start()
    http = httpx.AsyncClient(timeout=10.0)
    kube_client = config.new_client_from_config(str(t.kubeconfig))
    pools = GkeNodePools(
        http, endpoint=server.url, token=StaticToken(SecretRef(env="SICKBAY_TEST_GKE_TOKEN"))
    )
    acts = MachineActivities({"gke": GkeMachines(pools, kube_client, server.url)})
    kube_repairs = KubeRepairActivities(t.acts.kube)
    try:
        yield t, api, acts, kube_repairs
    finally:
        kube_repairs.close()
        kube_client.close()
        await http.aclose()
        await server.stop()
        cm.__exit__(None, None, None)


async def _run(fn: Any, arg: Any) -> Any:
    return await ActivityEnvironment().run(fn, arg)


async def _back(repairs: KubeRepairActivities, inp: WaitNodeGpusInput) -> Any:
    deadline = time.monotonic() + WAIT
    while True:
        try:
            return await _run(repairs.wait_for_node_gpus, inp)
        except ApplicationError as err:
            if err.type != ERR_STILL_WAITING or time.monotonic() > deadline:
                raise
        await asyncio.sleep(0.1)


def _inp(node: str, action: str) -> MachineActionInput:
    return MachineActionInput(workflow_id="wf", action=action, node=node, pool=POOL)  # type: ignore[arg-type]


async def test_reset_once_and_the_node_comes_back(gke: Any) -> None:
    t, api, acts, repairs = gke
    node = t.node()
    t.twin.extensions["faults"].fail(node, "0", xid=79)
    asked_at = t.twin.clock.now()
    first = await _run(acts.reboot_node, _inp(node, "reboot"))
    retried = await _run(acts.reboot_node, _inp(node, "reboot"))
    assert first.operation and retried.operation == first.operation
    assert api.instance_calls == [("reset", node)]
    back = await _back(repairs, WaitNodeGpusInput(node=node, expected_gpus=2, asked_at=asked_at))
    assert back.node == node and t.twin.extensions["faults"].faults() == []
    assert t.twin.extensions["repairs"].reboots == [node]


async def test_recreate_once_and_the_new_node_is_followed(gke: Any) -> None:
    t, api, acts, repairs = gke
    node = t.node()
    uuids = [t.uuid_of(node, i) for i in range(2)]
    asked_at = t.twin.clock.now()
    await _run(acts.replace_node, _inp(node, "replace"))
    await _run(acts.replace_node, _inp(node, "replace"))  # the retry
    assert api.instance_calls == [("recreate", node)]
    fresh = await _back(
        repairs,
        WaitNodeGpusInput(
            node=node,
            replaced=True,
            node_pool="gpu-pool",
            previous_uuids=uuids,
            expected_gpus=2,
            asked_at=asked_at,
        ),
    )
    # A recreated VM keeps its name; its GPUs are new.
    assert fresh.node == node and not set(fresh.gpu_uuids) & set(uuids)
    assert api.instance_calls == [("recreate", node)]


@pytest.mark.parametrize(
    ("status", "kind", "retryable"),
    [
        (500, ERR_CLOUD_UNAVAILABLE, True),
        (409, ERR_CLOUD_UNAVAILABLE, True),
        (403, ERR_PROVIDER_REFUSED, False),
    ],
)
async def test_failure_modes(gke: Any, status: int, kind: str, retryable: bool) -> None:
    t, api, acts, _repairs = gke
    node = t.node()
    api.inject(status, message="Quota 'GPUS_ALL_REGIONS' exceeded" if status == 403 else "")
    with pytest.raises(ApplicationError) as err:
        await _run(acts.reboot_node, _inp(node, "reboot"))
    assert err.value.type == kind and err.value.non_retryable is (not retryable)
    if status == 403:
        assert "GPUS_ALL_REGIONS" in str(err.value)
    assert api.instance_calls == []
    await _run(acts.reboot_node, _inp(node, "reboot"))  # the next try goes through, once
    assert api.instance_calls == [("reset", node)]


async def test_a_node_that_is_no_compute_engine_instance(gke: Any) -> None:
    t, _api, acts, _repairs = gke
    node = t.node()
    t.store.mutate("nodes", node, lambda n: n["spec"].update(providerID="aws:///us-east-1a/i-0abc"))
    with pytest.raises(ApplicationError) as err:
        await _run(acts.reboot_node, _inp(node, "reboot"))
    assert err.value.type == ERR_PROVIDER_NOT_CONFIGURED and err.value.non_retryable
    assert "not a GKE/Compute Engine node" in str(err.value)
