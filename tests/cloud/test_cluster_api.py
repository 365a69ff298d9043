"""Cluster API provider against the twin's MachineDeployment (cluster.x-k8s.io/v1beta1),
through the official kubernetes client and a kubeconfig, over loopback HTTP.

Cases:
- describe: spec.replicas is the size, autoscaler min/max annotations are the bounds, a
  MachineDeployment with fewer ready replicas than wanted has a running resize;
- scale: merge patch of spec.replicas (+ the scale-request annotation) lands in the twin;
  the operation is still running until the MachineDeployment reports the replicas ready
  (the twin's MachineDeployment controller does that when it runs; here the status is
  written through the status subresource as a controller would), then done;
- phase Failed -> the operation fails with the MachineDeployment's failure message;
- a missing MachineDeployment -> ERR_CLOUD_REJECTED (404), non-retryable;
- with the twin's controllers running, the MachineDeployment controller adds the Node and
  reports it ready: the operation finishes by itself and the pool has one more Node.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from kubernetes.client import CoreV1Api, CustomObjectsApi
from temporalio.exceptions import ApplicationError
from temporalio.testing import ActivityEnvironment

from activities.cloud import CloudActivities
from activities.cloud.cluster_api import ANN_MAX, ANN_MIN, ANN_SCALE_REQUEST, GROUP, PLURAL, VERSION
from contract.capacity import DescribePoolInput, NodePoolTarget, PoolOperationInput, ScalePoolInput
from contract.errors import ERR_CLOUD_REJECTED, ERR_STILL_WAITING
from twin.clock import Clock
from twin.controllers.manager import ControllerManager, TwinOptions
from twin.testing import start_twin

NS = "default"


@pytest.fixture
def capi(twin: Any) -> Iterator[tuple[CloudActivities, CustomObjectsApi, NodePoolTarget]]:
    api_client = twin.api_client()
    custom = CustomObjectsApi(api_client)
    name = f"gpu-md-{uuid.uuid4().hex[:6]}"
    custom.create_namespaced_custom_object(
        GROUP,
        VERSION,
        NS,
        PLURAL,
        {
            "apiVersion": f"{GROUP}/{VERSION}",
            "kind": "MachineDeployment",
            "metadata": {"name": name, "annotations": {ANN_MIN: "1", ANN_MAX: "5"}},
            "spec": {
                "clusterName": "twin",
                "replicas": 2,
                "selector": {"matchLabels": {"pool": name}},
                "template": {
                    "metadata": {"labels": {"pool": name}},
                    "spec": {
                        "clusterName": "twin",
                        "bootstrap": {"dataSecretName": "b"},
                        "infrastructureRef": {"kind": "DockerMachineTemplate", "name": "t"},
                    },
                },
            },
        },
    )
    set_ready(custom, name, 2)
    acts = CloudActivities(kube_api=api_client)
    try:
        yield acts, custom, NodePoolTarget(provider="cluster-api", name=name, namespace=NS)
    finally:
        custom.delete_namespaced_custom_object(GROUP, VERSION, NS, PLURAL, name)


def set_ready(custom: CustomObjectsApi, name: str, ready: int, **status: object) -> None:
    """What the MachineDeployment controller writes once machines are up."""
    custom.patch_namespaced_custom_object_status(
        GROUP,
        VERSION,
        NS,
        PLURAL,
        name,
        {"status": {"replicas": ready, "readyReplicas": ready, "phase": "Running", **status}},
        _content_type="application/merge-patch+json",
    )


async def test_describe(capi: tuple[CloudActivities, CustomObjectsApi, NodePoolTarget]) -> None:
    acts, _, pool = capi
    desc = await ActivityEnvironment().run(acts.describe_pool, DescribePoolInput(pool=pool))
    assert (desc.current_size, desc.min_size, desc.max_size) == (2, 1, 5)
    assert desc.pending_operation is None


async def test_scale_patches_replicas_and_waits_for_ready(
    capi: tuple[CloudActivities, CustomObjectsApi, NodePoolTarget],
) -> None:
    acts, custom, pool = capi
    env = ActivityEnvironment()
    result = await env.run(
        acts.scale_pool,
        ScalePoolInput(pool=pool, target_size=3, max_size=5, idempotency_key="wf-1-round-1"),
    )
    md = custom.get_namespaced_custom_object(GROUP, VERSION, NS, PLURAL, pool.name)
    assert md["spec"]["replicas"] == 3
    assert md["metadata"]["annotations"][ANN_SCALE_REQUEST] == "wf-1-round-1"
    assert md["metadata"]["annotations"][ANN_MAX] == "5"  # merge patch kept the rest
    assert result.operation is not None and result.previous_size == 2

    desc = await env.run(acts.describe_pool, DescribePoolInput(pool=pool))
    assert desc.pending_operation is not None  # 2 of 3 ready
    req = PoolOperationInput(pool=pool, operation=result.operation.id)
    with pytest.raises(ApplicationError) as info:
        await env.run(acts.wait_pool_operation, req)
    assert info.value.type == ERR_STILL_WAITING

    set_ready(custom, pool.name, 3)
    op = await env.run(acts.wait_pool_operation, req)
    assert op.done and op.error is None


async def test_failed_machine_deployment_fails_the_operation(
    capi: tuple[CloudActivities, CustomObjectsApi, NodePoolTarget],
) -> None:
    acts, custom, pool = capi
    env = ActivityEnvironment()
    result = await env.run(
        acts.scale_pool, ScalePoolInput(pool=pool, target_size=4, max_size=5, idempotency_key="k")
    )
    set_ready(custom, pool.name, 2, phase="Failed", failureMessage="InsufficientCapacity in zone")
    assert result.operation is not None
    op = await env.run(
        acts.wait_pool_operation, PoolOperationInput(pool=pool, operation=result.operation.id)
    )
    assert op.done and op.error == "InsufficientCapacity in zone"


async def test_missing_machine_deployment_is_rejected(
    capi: tuple[CloudActivities, CustomObjectsApi, NodePoolTarget],
) -> None:
    acts, _, pool = capi
    with pytest.raises(ApplicationError) as info:
        await ActivityEnvironment().run(
            acts.describe_pool,
            DescribePoolInput(pool=pool.model_copy(update={"name": "no-such-md"})),
        )
    assert info.value.type == ERR_CLOUD_REJECTED and info.value.non_retryable
    assert "404" in str(info.value)


async def test_machine_deployment_controller_brings_the_nodes(tmp_path: Any) -> None:
    """With the twin's controllers running, the MachineDeployment controller grows the node
    pool and reports readyReplicas; the operation finishes on its own."""
    manager = ControllerManager(TwinOptions())
    rs = start_twin(tmp_path, clock=Clock(time_scale=200.0), controllers=(manager,), nodes=2)
    try:
        api_client = rs.api_client()
        custom = CustomObjectsApi(api_client)
        core = CoreV1Api(api_client)
        pool_name = core.list_node().items[0].metadata.labels["sickbay.dev/node-pool"]
        custom.create_namespaced_custom_object(
            GROUP,
            VERSION,
            NS,
            PLURAL,
            {
                "apiVersion": f"{GROUP}/{VERSION}",
                "kind": "MachineDeployment",
                "metadata": {"name": "gpu-md"},
                "spec": {
                    "clusterName": "twin",
                    "replicas": 2,
                    "selector": {"matchLabels": {"sickbay.dev/node-pool": pool_name}},
                    "template": {
                        "metadata": {"labels": {"sickbay.dev/node-pool": pool_name}},
                        "spec": {
                            "clusterName": "twin",
                            "bootstrap": {"dataSecretName": "b"},
                            "infrastructureRef": {"kind": "DockerMachineTemplate", "name": "t"},
                        },
                    },
                },
            },
        )
        acts = CloudActivities(kube_api=api_client)
        pool = NodePoolTarget(provider="cluster-api", name="gpu-md", namespace=NS)
        env = ActivityEnvironment()
        result = await env.run(
            acts.scale_pool,
            ScalePoolInput(pool=pool, target_size=3, max_size=4, idempotency_key="k"),
        )
        assert result.operation is not None
        req = PoolOperationInput(pool=pool, operation=result.operation.id)
        op = None
        for _ in range(200):
            try:
                op = await env.run(acts.wait_pool_operation, req)
                break
            except ApplicationError as err:
                assert err.type == ERR_STILL_WAITING
                await asyncio.sleep(0.05)
        assert op is not None and op.done and op.error is None
        nodes = core.list_node(label_selector=f"sickbay.dev/node-pool={pool_name}").items
        assert len(nodes) == 3
    finally:
        rs.stop()
