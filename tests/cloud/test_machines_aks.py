"""Node rungs through AKS (activities/cloud/machines.py `AksMachines`) against the twin's Azure
Resource Manager VMSS endpoints (twin/cloudapi.py), wired to the twin's node rungs.

Cases:
- reboot: `virtualMachines/{id}/restart` of the node's VMSS VM (from its providerID), 202 with
  an Azure-AsyncOperation URL; the twin reboots the node and it comes back with its GPUs; the
  retried attempt (same key) asks nothing again: one restart, one reboot;
- the restart's record on the node (`sickbay.dev/repair-request` + `sickbay.dev/restart-record`,
  written before the POST and updated after ARM's answer) carries the node's bootID, its Ready
  condition and the VM's provisioning status;
- a worker killed in the window (ARM's 202 arrived, the activity's answer never did): the retry
  on another worker (a fresh `AksMachines`, so no memory) asks nothing again, from the evidence:
  the VM's instanceView shows the restart running, the node's Ready condition changed, or its
  bootID changed after the reboot; exactly one restart in the twin's record;
- killed before the POST (recorded, never sent): the retry asks once; ARM's 4xx refusal is
  recorded (`refused`) and the retry asks again; a 5xx leaves the record `asking`, and with no
  evidence the retry asks;
- the twin's ARM VM GET / instanceView answer as ARM does (Updating with no time while the
  restart runs, then succeeded with its end time; Deleting, then 404); a reboot gives the node
  a new bootID;
- replace: DELETE of the VM; the pool's new node (new name, new UUIDs) is followed; the retry
  reads the VM (Deleting, or 404: gone) and deletes nothing again, also when the worker was
  killed between ARM's 202 and the answer;
- the worker's Kubernetes calls pass through an RBAC proxy holding deploy/'s `sickbay` and
  `sickbay-repair-machines` roles (nodes patch for the record);
- without deploy/'s `sickbay-repair-machines` (no nodes patch) the reboot is refused before
  anything is asked, naming the forbidden patch;
- failure modes through the twin's injection: 500, 429 and 409 retryable; 403 (quota,
  authorization) non-retryable RepairProviderRefused with the provider's words; a node whose
  providerID is no VMSS VM -> RepairProviderNotConfigured.
"""

from __future__ import annotations

import asyncio
import json
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
from activities.cloud.machines import (
    ANN_REPAIR_REQUEST,
    ANN_RESTART_RECORD,
    AksMachines,
    MachineActivities,
)
from activities.kube.permissions import ROLE_NODE_PATCH
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
from tests.activities.kube.rbac_proxy import deploy_rules
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
async def aks(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, request: pytest.FixtureRequest
) -> AsyncIterator[Any]:
    """(twin, its cloud API, MachineActivities, KubeRepairActivities, a factory of new
    MachineActivities: another worker, with its own HTTP client and no memory)."""
    monkeypatch.setenv("SICKBAY_TEST_AZURE_TOKEN", TOKEN)
    cm = twin(
        tmp_path,
        "1.36",
        controllers=ControllerManager(
            TwinOptions(pod_startup_seconds=1, reboot_seconds=20, provisioning_delay=10)
        ),
        clock=Clock(time_scale=20),
        # the worker's Kubernetes calls go through deploy/'s roles (RBAC-enforcing proxy)
        proxy_rules=deploy_rules(*getattr(request, "param", ("sickbay", ROLE_NODE_PATCH))),
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
    clients: list[httpx.AsyncClient] = [http]

    def worker(hooks: dict[str, list[Any]] | None = None) -> MachineActivities:
        client = httpx.AsyncClient(timeout=10.0, event_hooks=hooks or {})
        clients.append(client)
        return MachineActivities({"aks": AksMachines(client, cfg, kube_client)})

    try:
        yield t, api, acts, kube_repairs, worker
    finally:
        kube_repairs.close()
        kube_client.close()
        for client in clients:
            await client.aclose()
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
    t, api, acts, repairs, _worker = aks
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
    t, api, acts, repairs, _worker = aks
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
    t, api, acts, _repairs, _worker = aks
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
    t, _api, acts, _repairs, _worker = aks
    node = t.node()
    t.store.mutate("nodes", node, lambda n: n["spec"].update(providerID="gce://p/z/i"))
    with pytest.raises(ApplicationError) as err:
        await _run(acts.replace_node, _inp(node, "replace"))
    assert err.value.type == ERR_PROVIDER_NOT_CONFIGURED and err.value.non_retryable
    assert "not an AKS VMSS node" in str(err.value)


class WorkerKilled(BaseException):
    """The worker's process ends here (SIGKILL): nothing after it runs, nothing is recorded."""


def killed_around(method: str, path_end: str, when: str) -> dict[str, list[Any]]:
    """httpx event hooks that kill the worker just before the first `method ...path_end` is
    sent (`when="request"`) or just after its answer arrived (`when="response"`)."""
    fired: list[bool] = []

    async def hook(obj: Any) -> None:
        request = obj if when == "request" else obj.request
        if fired or request.method != method or not request.url.path.endswith(path_end):
            return
        fired.append(True)
        if when == "response":
            await obj.aread()
        raise WorkerKilled(f"killed {'before' if when == 'request' else 'after'} {method}")

    return {when: [hook]}


def instance_of(t: Any, node: str) -> str:
    return str(t.store.get("nodes", node)["spec"]["providerID"]).rsplit("/", 1)[1]


def record_of(t: Any, node: str) -> dict[str, Any]:
    annotations = t.store.get("nodes", node)["metadata"].get("annotations") or {}
    assert annotations.get(ANN_REPAIR_REQUEST) == "wf/reboot/1", annotations
    return dict(json.loads(annotations[ANN_RESTART_RECORD]))


async def test_the_restart_is_recorded_on_the_node_before_and_after(aks: Any) -> None:
    t, api, _acts, _repairs, worker = aks
    node = t.node()
    before = t.store.get("nodes", node)["status"]["nodeInfo"]["bootID"]
    assert before  # a node has a bootID
    with pytest.raises(WorkerKilled):
        await _run(
            worker(killed_around("POST", "/restart", "request")).reboot_node, _inp(node, "reboot")
        )
    asking = record_of(t, node)
    assert asking["state"] == "asking" and asking["bootID"] == before
    assert asking["ready"].startswith("True@")
    assert asking["vm"].startswith("ProvisioningState/succeeded@")
    assert api.instance_calls == []  # killed before the POST: nothing was asked
    done = await _run(worker().reboot_node, _inp(node, "reboot"))  # another worker's retry
    assert done.asked and api.instance_calls == [("reset", node)]
    asked = record_of(t, node)
    assert asked["state"] == "asked" and asked["operation"] == done.operation


async def test_worker_killed_after_arms_answer_the_retry_asks_nothing(aks: Any) -> None:
    t, api, _acts, _repairs, worker = aks
    node = t.node()
    with pytest.raises(WorkerKilled):
        await _run(
            worker(killed_around("POST", "/restart", "response")).reboot_node, _inp(node, "reboot")
        )
    assert api.instance_calls == [("reset", node)]  # ARM acted; the answer was lost
    retried = await _run(worker().reboot_node, _inp(node, "reboot"))
    assert not retried.asked, retried
    assert "Ready condition changed" in retried.detail  # the node went down for the restart
    assert api.instance_calls == [("reset", node)]


async def test_killed_after_the_answer_before_the_vm_went_down(aks: Any) -> None:
    """ARM accepted the restart but the node has not noticed yet: the VM's instanceView (its
    provisioning state Updating) is the evidence."""
    t, api, _acts, _repairs, worker = aks
    node = t.node()
    api.on_instance = None  # the restart has not reached the node (yet)
    with pytest.raises(WorkerKilled):
        await _run(
            worker(killed_around("POST", "/restart", "response")).reboot_node, _inp(node, "reboot")
        )
    retried = await _run(worker().reboot_node, _inp(node, "reboot"))
    assert not retried.asked and "ProvisioningState/updating" in retried.detail, retried
    assert api.instance_calls == [("reset", node)]


async def test_killed_after_the_answer_retried_once_the_node_is_back(aks: Any) -> None:
    """The retry comes late (the activity's timeout): the reboot is over, the bootID changed."""
    t, api, _acts, repairs, worker = aks
    node = t.node()
    api.vm_operation_seconds = 0.0
    before = t.store.get("nodes", node)["status"]["nodeInfo"]["bootID"]
    asked_at = t.twin.clock.now()
    with pytest.raises(WorkerKilled):
        await _run(
            worker(killed_around("POST", "/restart", "response")).reboot_node, _inp(node, "reboot")
        )
    await _back(repairs, WaitNodeGpusInput(node=node, expected_gpus=2, asked_at=asked_at))
    after = t.store.get("nodes", node)["status"]["nodeInfo"]["bootID"]
    assert after and after != before
    retried = await _run(worker().reboot_node, _inp(node, "reboot"))
    assert not retried.asked and "booted again" in retried.detail, retried
    assert api.instance_calls == [("reset", node)]


@pytest.mark.parametrize(("status", "state"), [(403, "refused"), (409, "refused"), (500, "asking")])
async def test_an_answered_failure_is_asked_again_by_the_retry(
    aks: Any, status: int, state: str
) -> None:
    t, api, _acts, _repairs, worker = aks
    node = t.node()
    api.inject(status, method="POST")
    with pytest.raises(ApplicationError):
        await _run(worker().reboot_node, _inp(node, "reboot"))
    assert record_of(t, node)["state"] == state  # a 5xx may have acted: left to the evidence
    retried = await _run(worker().reboot_node, _inp(node, "reboot"))
    assert retried.asked and api.instance_calls == [("reset", node)]


async def test_the_twin_vm_answers_as_arm(aks: Any) -> None:
    t, api, _acts, _repairs, _worker = aks
    node = t.node()
    api.on_instance = None
    vm = (
        f"{api.base_url}/subscriptions/sub-1/resourceGroups/rg/providers/Microsoft.Compute/"
        f"virtualMachineScaleSets/{VMSS}/virtualMachines/{instance_of(t, node)}"
    )
    auth = {"Authorization": f"Bearer {TOKEN}"}
    async with httpx.AsyncClient(headers=auth) as http:
        view = (await http.get(f"{vm}/instanceView")).json()
        assert [s["code"] for s in view["statuses"]] == [
            "ProvisioningState/succeeded",
            "PowerState/running",
        ]
        assert view["statuses"][0]["time"].endswith("+00:00") and view["computerName"] == node
        restarted = await http.post(f"{vm}/restart")
        assert restarted.status_code == 202
        operation = restarted.headers["azure-asyncoperation"]
        vm_now = (await http.get(vm, params={"$expand": "instanceView"})).json()
        assert vm_now["properties"]["provisioningState"] == "Updating"
        running = vm_now["properties"]["instanceView"]["statuses"][0]
        assert running["code"] == "ProvisioningState/updating" and "time" not in running
        assert (await http.get(operation)).json()["status"] == "InProgress"
        assert (await http.post(f"{vm}/restart")).status_code == 202  # no request ids: acts
        assert api.vm_restarts(node) == 2
        api.vm_operation_seconds = 0.0
        await http.post(f"{vm}/restart")
        done = (await http.get(f"{vm}/instanceView")).json()["statuses"][0]
        assert (
            done["code"] == "ProvisioningState/succeeded"
            and done["time"] > view["statuses"][0]["time"]
        )


async def test_replace_killed_after_arms_answer_deletes_once(aks: Any) -> None:
    t, api, _acts, _repairs, worker = aks
    node = t.node()
    with pytest.raises(WorkerKilled):
        await _run(
            worker(
                killed_around("DELETE", f"/virtualMachines/{instance_of(t, node)}", "response")
            ).replace_node,
            _inp(node, "replace"),
        )
    assert api.instance_calls == [("delete", node)]
    retried = await _run(worker().replace_node, _inp(node, "replace"))
    assert not retried.asked, retried
    assert api.instance_calls == [("delete", node)]


@pytest.mark.parametrize("aks", [("sickbay",)], indirect=True)  # components/node-patch not applied
async def test_without_the_node_patch_grant_nothing_is_asked(aks: Any) -> None:
    t, api, acts, _repairs, _worker = aks
    node = t.node()
    with pytest.raises(ApplicationError) as err:
        await _run(acts.reboot_node, _inp(node, "reboot"))
    assert err.value.type == ERR_PROVIDER_REFUSED and err.value.non_retryable
    assert f"patch node {node}: HTTP 403" in str(err.value)
    assert api.instance_calls == []
