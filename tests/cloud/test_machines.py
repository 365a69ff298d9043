"""Node rungs through Cluster API (activities/cloud/machines.py) against the twin's Machines and
its model of a MachineHealthCheck (twin/controllers/repair_tools.py), plus wait-for-node-gpus.

Cases:
- reboot: the Machine is annotated `cluster.x-k8s.io/remediate-machine` with the request's key;
  the twin reboots the node (NotReady, then Ready with its GPUs published, Xid 79 gone);
  wait-for-node-gpus returns the node; a retried call (same key) asks nothing again: one
  reboot in all; a new attempt asks again;
- replace: the Machine is deleted; the pool's new node (new name, new GPU UUIDs) is followed
  by wait-for-node-gpus; a retried call after the delete asks nothing again;
- the Machine found without the node annotations (by `status.nodeRef`);
- failures: no provider configured for the pool, a node without a Machine -> non-retryable
  RepairProviderNotConfigured; a 500 from the API -> retryable, and the retry asks once;
- dry run: nothing asked;
- wait-for-node-gpus: a node still Ready from before the request has not rebooted yet
  (StillWaiting); without `asked_at` the input is refused.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from kubernetes import config
from temporalio.exceptions import ApplicationError
from temporalio.testing import ActivityEnvironment

from activities.cloud.machines import (
    ANN_REMEDIATE,
    ANN_REPAIR_REQUEST,
    ClusterApiMachines,
    MachineActivities,
)
from activities.kube.repair_activities import KubeRepairActivities
from contract.capacity import NodePoolTarget
from contract.errors import ERR_CLOUD_UNAVAILABLE, ERR_PROVIDER_NOT_CONFIGURED, ERR_STILL_WAITING
from contract.repair_rungs import MachineActionInput, NodeGpusResult, WaitNodeGpusInput
from tests.activities.kube.conftest import KubeTwin, twin
from twin.clock import Clock
from twin.controllers.manager import ControllerManager, TwinOptions
from twin.testing import MACHINES, capi_machine

POOL = NodePoolTarget(provider="cluster-api", name="gpu-md", namespace="default")
WAIT = 30.0


@pytest.fixture
def setup(tmp_path: Path) -> Iterator[Any]:
    made: list[Any] = []

    def start(
        annotate_nodes: bool = True, profile: str = "1.36"
    ) -> tuple[KubeTwin, MachineActivities, KubeRepairActivities]:
        cm = twin(
            tmp_path,
            profile,
            controllers=ControllerManager(
                TwinOptions(pod_startup_seconds=1, reboot_seconds=20, provisioning_delay=10)
            ),
            clock=Clock(time_scale=20),
        )
        t = cm.__enter__()
        made.append(cm)
        for node in t.twin.seed_info["nodes"]:
            capi_machine(t.store, node)
            if annotate_nodes:
                t.store.mutate(
                    "nodes",
                    node,
                    lambda n, node=node: (
                        n["metadata"]
                        .setdefault("annotations", {})
                        .update(
                            {
                                "cluster.x-k8s.io/machine": f"m-{node}",
                                "cluster.x-k8s.io/cluster-namespace": "default",
                            }
                        )
                    ),
                )
        client = config.new_client_from_config(str(t.kubeconfig))
        made.append(client)
        kube_repairs = KubeRepairActivities(t.acts.kube)
        made.append(kube_repairs)
        return t, MachineActivities({"cluster-api": ClusterApiMachines(client)}), kube_repairs

    yield start
    for item in reversed(made):
        if isinstance(item, KubeRepairActivities):
            item.close()
        elif hasattr(item, "__exit__"):
            item.__exit__(None, None, None)
        else:
            item.close()


async def _run(fn: Any, arg: Any) -> Any:
    return await ActivityEnvironment().run(fn, arg)


async def _node_back(repairs: KubeRepairActivities, inp: WaitNodeGpusInput) -> NodeGpusResult:
    deadline = time.monotonic() + WAIT
    while True:
        try:
            return await _run(repairs.wait_for_node_gpus, inp)
        except ApplicationError as err:
            if err.type != ERR_STILL_WAITING or time.monotonic() > deadline:
                raise
        await asyncio.sleep(0.1)


def _inp(node: str, action: str, attempt: int = 1, **kw: Any) -> MachineActionInput:
    return MachineActionInput(
        workflow_id="wf",
        attempt=attempt,
        action=action,
        node=node,
        pool=POOL,
        **kw,  # type: ignore[arg-type]
    )


@pytest.mark.parametrize("annotate_nodes", [True, False])
async def test_reboot_is_asked_once_and_the_node_comes_back(
    setup: Any, annotate_nodes: bool
) -> None:
    t, acts, repairs = setup(annotate_nodes)
    node = t.node()
    uuids = [t.uuid_of(node, i) for i in range(2)]
    faults = t.twin.extensions["faults"]
    faults.fail(node, uuids[0], xid=79)
    asked_at = t.twin.clock.now()
    first = await _run(acts.reboot_node, _inp(node, "reboot"))
    retried = await _run(acts.reboot_node, _inp(node, "reboot"))  # the activity retried
    assert first.asked and not retried.asked and first.operation == f"default/m-{node}"
    machine = t.store.get(MACHINES, f"m-{node}", "default")
    assert machine["metadata"]["annotations"][ANN_REPAIR_REQUEST] == "wf/reboot/1"
    back = await _node_back(
        repairs, WaitNodeGpusInput(node=node, expected_gpus=2, asked_at=asked_at)
    )
    assert back.node == node and sorted(back.gpu_uuids) == sorted(uuids)
    assert faults.faults() == []
    assert t.twin.extensions["repairs"].reboots == [node]
    deadline = time.monotonic() + WAIT  # the remediator is done: its annotation goes
    while ANN_REMEDIATE in (
        t.store.get(MACHINES, f"m-{node}", "default")["metadata"].get("annotations") or {}
    ):
        assert time.monotonic() < deadline
        await asyncio.sleep(0.1)
    again = await _run(acts.reboot_node, _inp(node, "reboot", attempt=2))
    assert again.asked


async def test_replace_deletes_the_machine_and_follows_the_new_node(setup: Any) -> None:
    t, acts, repairs = setup()
    node = t.node()
    uuids = [t.uuid_of(node, i) for i in range(2)]
    asked_at = t.twin.clock.now()  # the cluster's time of the request
    result = await _run(acts.replace_node, _inp(node, "replace"))
    assert result.asked and t.store.try_get(MACHINES, f"m-{node}", "default") is None
    fresh = await _node_back(
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
    assert fresh.node != node and fresh.node not in t.twin.seed_info["nodes"]
    assert len(fresh.gpu_uuids) == 2 and not set(fresh.gpu_uuids) & set(uuids)
    retried = await _run(acts.replace_node, _inp(node, "replace"))
    assert not retried.asked
    assert t.twin.extensions["repairs"].replacements == [node]


async def test_not_configured_is_a_clear_non_retryable_error(setup: Any) -> None:
    t, acts, _repairs = setup()
    node = t.node()
    unknown = _inp(node, "reboot").model_copy(
        update={"pool": NodePoolTarget(provider="gke", name="p")}
    )
    with pytest.raises(ApplicationError) as err:
        await _run(acts.reboot_node, unknown)
    assert err.value.type == ERR_PROVIDER_NOT_CONFIGURED and err.value.non_retryable
    assert "'gke' is not configured" in str(err.value)
    t.store.delete(MACHINES, f"m-{t.node(1)}", "default")
    t.store.mutate("nodes", t.node(1), lambda n: n["metadata"].pop("annotations", None))
    with pytest.raises(ApplicationError) as err:
        await _run(acts.reboot_node, _inp(t.node(1), "reboot"))
    assert err.value.type == ERR_PROVIDER_NOT_CONFIGURED and "no Cluster API Machine" in str(
        err.value
    )


async def test_a_5xx_is_retried_and_the_retry_asks_once(setup: Any) -> None:
    t, acts, _repairs = setup()
    node = t.node()
    t.twin.extensions["api_faults"].add("500", verb="patch", resource="machines", count=1)
    with pytest.raises(ApplicationError) as err:
        await _run(acts.reboot_node, _inp(node, "reboot"))
    assert err.value.type == ERR_CLOUD_UNAVAILABLE and not err.value.non_retryable
    assert ANN_REMEDIATE not in (
        t.store.get(MACHINES, f"m-{node}", "default")["metadata"].get("annotations") or {}
    )
    retried = await _run(acts.reboot_node, _inp(node, "reboot"))
    assert retried.asked
    deadline = time.monotonic() + WAIT
    while not t.twin.extensions["repairs"].reboots:
        assert time.monotonic() < deadline
        await asyncio.sleep(0.1)
    assert t.twin.extensions["repairs"].reboots == [node]


async def test_dry_run_asks_nothing(setup: Any) -> None:
    t, acts, _repairs = setup()
    node = t.node()
    result = await _run(acts.replace_node, _inp(node, "replace", dry_run=True))
    assert result.dry_run and not result.asked
    assert t.store.try_get(MACHINES, f"m-{node}", "default") is not None


async def test_a_node_not_rebooted_yet_is_not_back(setup: Any) -> None:
    """Ready since before the request is not "back": the reboot has not happened yet."""
    t, _acts, repairs = setup()
    node = t.node()
    with pytest.raises(ApplicationError) as err:
        await _run(
            repairs.wait_for_node_gpus,
            WaitNodeGpusInput(node=node, expected_gpus=2, asked_at=t.twin.clock.now()),
        )
    assert err.value.type == ERR_STILL_WAITING and "not rebooted yet" in str(err.value)
    with pytest.raises(ApplicationError) as err:
        await _run(repairs.wait_for_node_gpus, WaitNodeGpusInput(node=node))
    assert err.value.non_retryable and "asked_at" in str(err.value)
