"""Node rungs through AKS (activities/cloud/machines.py `AksMachines`) against the twin's Azure
Resource Manager VMSS endpoints (twin/cloudapi.py), wired to the twin's node rungs.

Cases:
- reboot: `virtualMachines/{id}/restart` of the node's VMSS VM (from its providerID), 202 with
  an Azure-AsyncOperation URL; the twin reboots the node and it comes back with its GPUs; the
  retried attempt (same key) asks nothing again: one restart, one reboot;
- replace: DELETE of the VM; the pool's new node (new name, new UUIDs) is followed; the retry
  reads the VM (404: gone) and deletes nothing again;
- failure modes through the twin's injection: 500, 429 and 409 retryable; 403 (quota,
  authorization) non-retryable RepairProviderRefused with the provider's words; a node whose
  providerID is no VMSS VM -> RepairProviderNotConfigured.
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

from activities.cloud.config import AksConfig
from activities.cloud.machines import AksMachines, MachineActivities
from activities.kube.repair_activities import KubeRepairActivities
from activities.outbound import SecretRef
from contract.capacity import NodePoolTarget
from contract.errors import (
    ERR_CLOUD_UNAVAILABLE,
    ERR_PROVIDER_NOT_CONFIGURED,
    ERR_PROVIDER_REFUSED,
    ERR_STILL_WAITING,
)
from contract.repair import MachineActionInput, WaitNodeGpusInput
from tests.activities.kube.conftest import twin
from twin.clock import Clock
from twin.cloudapi import CloudApi, CloudApiServer
from twin.controllers.manager import ControllerManager, TwinOptions

TOKEN = "aks-twin-token"
POOL = NodePoolTarget(
    provider="aks", name="gpupool", subscription="sub-1", resource_group="rg-1", cluster="aks1"
)
VMSS = "aks-gpupool-12345678-vmss"
WAIT = 30.0


def _provider_id(instance: str) -> str:
    return (
        "azure:///subscriptions/sub-1/resourceGroups/mc_rg-1_aks1_eastus/providers/"
        f"Microsoft.Compute/virtualMachineScaleSets/{VMSS}/virtualMachines/{instance}"
    )


@pytest.fixture
async def aks(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[Any]:
    monkeypatch.setenv("SICKBAY_TEST_AZURE_TOKEN", TOKEN)
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

    def on_instance(action: str, node: str) -> None:
        if action == "reset":
            repairs.reboot(node)
        else:
            repairs.replace(node)  # a deleted VMSS VM: the pool brings a new one (new name)

    api = CloudApi(token=TOKEN, on_instance=on_instance)
    for i, node in enumerate(t.store.list("nodes").items):
        name = node["metadata"]["name"]
        t.store.mutate(
            "nodes", name, lambda n, i=i: n["spec"].update(providerID=_provider_id(str(i)))
        )
        api.vmss_nodes[f"{VMSS}/{i}"] = name
    server = await CloudApiServer(api).start()
    http = httpx.AsyncClient(timeout=10.0)
    kube_client = config.new_client_from_config(str(t.kubeconfig))
    cfg = AksConfig(endpoint=server.url, token=SecretRef(env="SICKBAY_TEST_AZURE_TOKEN"))
    acts = MachineActivities({"aks": AksMachines(http, cfg, kube_client)})
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


def _inp(node: str, action: str, key: str = "wf") -> MachineActionInput:
    return MachineActionInput(workflow_id=key, action=action, node=node, pool=POOL)  # type: ignore[arg-type]


async def test_restart_once_and_the_node_comes_back(aks: Any) -> None:
    t, api, acts, repairs = aks
    node = t.node()
    t.twin.extensions["faults"].fail(node, "0", xid=79)
    asked_at = t.twin.clock.now()
    first = await _run(acts.reboot_node, _inp(node, "reboot"))
    retried = await _run(acts.reboot_node, _inp(node, "reboot"))
    assert first.asked and "/operations/" in first.operation
    assert not retried.asked and retried.operation == first.operation
    assert api.instance_calls == [("reset", node)]
    back = await _back(repairs, WaitNodeGpusInput(node=node, expected_gpus=2, asked_at=asked_at))
    assert back.node == node and t.twin.extensions["faults"].faults() == []
    assert t.twin.extensions["repairs"].reboots == [node]


async def test_delete_once_and_the_new_node_is_followed(aks: Any) -> None:
    t, api, acts, repairs = aks
    node = t.node()
    uuids = [t.uuid_of(node, i) for i in range(2)]
    asked_at = t.twin.clock.now()
    first = await _run(acts.replace_node, _inp(node, "replace"))
    retried = await _run(acts.replace_node, _inp(node, "replace"))  # the retry
    assert first.asked and not retried.asked
    assert api.instance_calls == [("delete", node)]
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
    assert not set(fresh.gpu_uuids) & set(uuids)
    assert api.instance_calls == [("delete", node)]


@pytest.mark.parametrize(
    ("status", "kind", "retryable"),
    [
        (500, ERR_CLOUD_UNAVAILABLE, True),
        (429, ERR_CLOUD_UNAVAILABLE, True),
        (409, ERR_CLOUD_UNAVAILABLE, True),
        (403, ERR_PROVIDER_REFUSED, False),
    ],
)
async def test_failure_modes(aks: Any, status: int, kind: str, retryable: bool) -> None:
    t, api, acts, _repairs = aks
    node = t.node()
    api.inject(
        status,
        message="Operation could not be completed as it results in exceeding "
        "approved standardNCADSH100v5Family Cores quota"
        if status == 403
        else "",
    )
    with pytest.raises(ApplicationError) as err:
        await _run(acts.reboot_node, _inp(node, "reboot"))
    assert err.value.type == kind and err.value.non_retryable is (not retryable)
    if status == 403:
        assert "Cores quota" in str(err.value)
    assert api.instance_calls == []
    await _run(acts.reboot_node, _inp(node, "reboot"))  # the next try goes through, once
    assert api.instance_calls == [("reset", node)]


async def test_a_node_that_is_no_vmss_vm(aks: Any) -> None:
    t, _api, acts, _repairs = aks
    node = t.node()
    t.store.mutate("nodes", node, lambda n: n["spec"].update(providerID="gce://p/z/i"))
    with pytest.raises(ApplicationError) as err:
        await _run(acts.replace_node, _inp(node, "replace"))
    assert err.value.type == ERR_PROVIDER_NOT_CONFIGURED and err.value.non_retryable
    assert "not an AKS VMSS node" in str(err.value)
