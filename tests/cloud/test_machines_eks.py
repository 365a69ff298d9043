"""Node rungs on EKS (activities/cloud/ec2.py `Ec2Machines`): EC2 and Auto Scaling through
boto3, pointed at the twin's AWS shapes (twin/awsapi.py), wired to the twin's node rungs.
Credentials are the test's own, in the environment (boto3's standard chain).

Cases:
- reboot: RebootInstances of the node's instance (from its providerID `aws:///<zone>/<id>`);
  the twin reboots the node and it comes back with its GPUs; the retried attempt (same key)
  asks nothing again: one reboot;
- the reboot's record on the node (`sickbay.dev/repair-request` + `sickbay.dev/restart-record`)
  is written before the call (state `asking`, bootID, Ready) and updated after EC2's answer;
- a worker killed before the call (recorded, never sent): the retry on another worker asks
  once; killed after EC2 acted and before the answer: the retry finds the evidence (the node's
  Ready condition changed) and asks nothing again; a 4xx refusal is recorded `refused` and the
  retry asks again;
- replace: TerminateInstanceInAutoScalingGroup with ShouldDecrementDesiredCapacity=false (the
  pool keeps its size and brings a new node, followed by its new GPUs); the retry, also after
  a worker killed between the termination and its answer, reads the instance's lifecycle state
  (Terminating) and terminates nothing again; an instance no group lists any more and EC2
  reports terminated is gone;
- an instance in no Auto Scaling group is never terminated (RepairProviderNotConfigured); a
  node that is no EC2 instance likewise; 403 refused, 503 retryable.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from kubernetes import config
from temporalio.exceptions import ApplicationError
from temporalio.testing import ActivityEnvironment

from activities.cloud.aws import AwsClients
from activities.cloud.ec2 import Ec2Machines
from activities.cloud.machines import ANN_REPAIR_REQUEST, ANN_RESTART_RECORD, MachineActivities
from activities.kube.permissions import ROLE_NODE_PATCH
from activities.kube.repair_activities import KubeRepairActivities
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
from tests.cloud.aws_twin import REGION, aws_config, aws_env
from twin.clock import Clock
from twin.cloudapi import CloudApi, CloudApiServer, TwinPool
from twin.controllers.manager import ControllerManager, TwinOptions

POOL = NodePoolTarget(provider="eks", name="gpu-pool", cluster="twin")
WAIT = 30.0


class WorkerKilled(BaseException):
    """The worker's process ends here (SIGKILL): nothing after it runs, nothing is recorded."""


@pytest.fixture
async def eks(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[Any]:
    """(twin, its cloud API, MachineActivities, KubeRepairActivities, a factory of new
    workers: (MachineActivities, its Ec2Machines) with their own boto3 clients)."""
    cm = twin(
        tmp_path,
        "1.36",
        controllers=ControllerManager(
            TwinOptions(pod_startup_seconds=1, reboot_seconds=20, provisioning_delay=10)
        ),
        clock=Clock(time_scale=20),
        proxy_rules=deploy_rules("sickbay", ROLE_NODE_PATCH),
    )
    t = cm.__enter__()
    repairs = t.twin.extensions["repairs"]

    def on_instance(action: str, node: str) -> None:
        if action == "reset":
            repairs.reboot(node)
        else:
            repairs.replace(node)  # the group launches a new instance: a new node

    api = CloudApi(token="unused", on_instance=on_instance)
    api.add_pool(TwinPool(name="gpu-pool", size=2, max_size=4))
    for i, node in enumerate(t.store.list("nodes").items):
        name, instance = node["metadata"]["name"], f"i-0{i:016x}"
        pid = f"aws:///{REGION}a/{instance}"
        t.store.mutate("nodes", name, lambda n, p=pid: n["spec"].update(providerID=p))
        api.aws.instances[instance] = name
        api.aws.instance_pool[instance] = "gpu-pool"
    aws_env(monkeypatch, api.aws.aws_access_key_id)
    server = await CloudApiServer(api).start()
    kube_client = config.new_client_from_config(str(t.kubeconfig))
    cfg = aws_config(server)

    def worker() -> tuple[MachineActivities, Ec2Machines]:
        machines = Ec2Machines(AwsClients(cfg), kube_client)
        return MachineActivities({"eks": machines}), machines

    acts, _ = worker()
    kube_repairs = KubeRepairActivities(t.acts.kube)
    try:
        yield t, api, acts, kube_repairs, worker
    finally:
        kube_repairs.close()
        kube_client.close()
        await server.stop()
        cm.__exit__(None, None, None)


def killed_around(machines: Ec2Machines, service: str, operation: str, when: str) -> None:
    """Kill the worker just before `operation` is sent (`when="request"`) or just after its
    answer arrived (`"response"`), through botocore's own event hooks."""

    def kill(**_: Any) -> None:
        raise WorkerKilled(f"killed {'before' if when == 'request' else 'after'} {operation}")

    client = machines._clients.client(service, REGION)
    event = "before-send" if when == "request" else "after-call"
    client.meta.events.register(f"{event}.{service}.{operation}", kill)


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


def record_of(t: Any, node: str) -> dict[str, Any]:
    annotations = t.store.get("nodes", node)["metadata"].get("annotations") or {}
    assert annotations.get(ANN_REPAIR_REQUEST) == "wf/reboot/1", annotations
    return dict(json.loads(annotations[ANN_RESTART_RECORD]))


async def test_reboot_once_and_the_node_comes_back(eks: Any) -> None:
    t, api, acts, repairs, _worker = eks
    node = t.node()
    t.twin.extensions["faults"].fail(node, "0", xid=79)
    asked_at = t.twin.clock.now()
    first = await _run(acts.reboot_node, _inp(node, "reboot"))
    retried = await _run(acts.reboot_node, _inp(node, "reboot"))
    assert first.asked and first.operation.startswith("i-0")
    assert not retried.asked and "already asked" in retried.detail
    assert api.instance_calls == [("reset", node)]
    back = await _back(repairs, WaitNodeGpusInput(node=node, expected_gpus=2, asked_at=asked_at))
    assert back.node == node and t.twin.extensions["faults"].faults() == []
    sent = [r for r in api.requests if r.path.startswith("/aws/ec2")]
    assert len(sent) == 1 and "Action=RebootInstances" in sent[0].body


async def test_the_reboot_is_recorded_before_and_after(eks: Any) -> None:
    t, api, _acts, _repairs, worker = eks
    node = t.node()
    before = t.store.get("nodes", node)["status"]["nodeInfo"]["bootID"]
    acts, machines = worker()
    killed_around(machines, "ec2", "RebootInstances", "request")
    with pytest.raises(WorkerKilled):
        await _run(acts.reboot_node, _inp(node, "reboot"))
    asking = record_of(t, node)
    assert asking["state"] == "asking" and asking["bootID"] == before
    assert asking["ready"].startswith("True@")
    assert api.instance_calls == []  # killed before the call: nothing was asked
    done = await _run(worker()[0].reboot_node, _inp(node, "reboot"))  # another worker's retry
    assert done.asked and api.instance_calls == [("reset", node)]
    assert record_of(t, node)["state"] == "asked"


async def test_killed_after_ec2_acted_the_retry_asks_nothing(eks: Any) -> None:
    t, api, _acts, _repairs, worker = eks
    node = t.node()
    acts, machines = worker()
    killed_around(machines, "ec2", "RebootInstances", "response")
    with pytest.raises(WorkerKilled):
        await _run(acts.reboot_node, _inp(node, "reboot"))
    assert api.instance_calls == [("reset", node)]  # EC2 acted; the answer was lost
    assert record_of(t, node)["state"] == "asking"
    retried = await _run(worker()[0].reboot_node, _inp(node, "reboot"))
    assert not retried.asked and "Ready condition changed" in retried.detail
    assert api.instance_calls == [("reset", node)]


async def test_a_refusal_is_recorded_and_asked_again(eks: Any) -> None:
    t, api, acts, _repairs, _worker = eks
    node = t.node()
    api.inject(403, message="You are not authorized to perform this operation.")
    with pytest.raises(ApplicationError) as err:
        await _run(acts.reboot_node, _inp(node, "reboot"))
    assert err.value.type == ERR_PROVIDER_REFUSED and err.value.non_retryable
    assert "not authorized" in str(err.value)
    assert record_of(t, node)["state"] == "refused"
    api.inject(503, message="Request limit exceeded.")
    with pytest.raises(ApplicationError) as err:
        await _run(acts.reboot_node, _inp(node, "reboot"))
    assert err.value.type == ERR_CLOUD_UNAVAILABLE and not err.value.non_retryable
    assert api.instance_calls == []
    done = await _run(acts.reboot_node, _inp(node, "reboot"))
    assert done.asked and api.instance_calls == [("reset", node)]


async def test_replace_terminates_once_keeping_desired_capacity(eks: Any) -> None:
    t, api, acts, repairs, _worker = eks
    node = t.node()
    uuids = [t.uuid_of(node, i) for i in range(2)]
    asked_at = t.twin.clock.now()
    first = await _run(acts.replace_node, _inp(node, "replace"))
    retried = await _run(acts.replace_node, _inp(node, "replace"))
    assert first.asked and "desired capacity kept" in first.detail
    assert not retried.asked and "gone" in retried.detail  # the twin removed the node at once
    assert api.instance_calls == [("terminate", node)]
    assert api.pools["gpu-pool"].size == 2  # not decremented
    terminate = [r for r in api.requests if r.body and "TerminateInstance" in r.body]
    assert len(terminate) == 1 and "ShouldDecrementDesiredCapacity=false" in terminate[0].body
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


async def test_replace_killed_after_the_termination_terminates_once(eks: Any) -> None:
    t, api, _acts, _repairs, worker = eks
    node = t.node()
    calls: list[tuple[str, str]] = []
    api.on_instance = lambda action, name: calls.append((action, name))  # the node stays a while
    acts, machines = worker()
    killed_around(machines, "autoscaling", "TerminateInstanceInAutoScalingGroup", "response")
    with pytest.raises(WorkerKilled):
        await _run(acts.replace_node, _inp(node, "replace"))
    retried = await _run(worker()[0].replace_node, _inp(node, "replace"))
    assert not retried.asked and "is Terminating in eks-gpu-pool-twin" in retried.detail
    assert api.instance_calls == [("terminate", node)] and calls == [("terminate", node)]


async def test_a_terminated_instance_is_gone(eks: Any) -> None:
    t, api, acts, _repairs, _worker = eks
    node = t.node()
    instance = str(t.store.get("nodes", node)["spec"]["providerID"]).rsplit("/", 1)[1]
    # terminated (by someone) a while ago: no group lists it, the node object outlives it
    api.aws._terminating[instance] = api.clock.now()
    again = await _run(acts.replace_node, _inp(node, "replace"))
    assert not again.asked and "terminated" in again.detail
    assert api.instance_calls == []


async def test_never_terminates_an_instance_outside_a_group(eks: Any) -> None:
    t, api, acts, _repairs, _worker = eks
    node = t.node()
    instance = str(t.store.get("nodes", node)["spec"]["providerID"]).rsplit("/", 1)[1]
    del api.aws.instance_pool[instance]  # a self-managed instance: no group would replace it
    with pytest.raises(ApplicationError) as err:
        await _run(acts.replace_node, _inp(node, "replace"))
    assert err.value.type == ERR_PROVIDER_NOT_CONFIGURED and "no Auto Scaling group" in str(
        err.value
    )
    assert api.instance_calls == []


async def test_a_node_that_is_no_ec2_instance(eks: Any) -> None:
    t, _api, acts, _repairs, _worker = eks
    node = t.node()
    t.store.mutate("nodes", node, lambda n: n["spec"].update(providerID="gce://p/z/i"))
    with pytest.raises(ApplicationError) as err:
        await _run(acts.reboot_node, _inp(node, "reboot"))
    assert err.value.type == ERR_PROVIDER_NOT_CONFIGURED and "not an EC2 node" in str(err.value)
