"""karpenter-capacity (activities/kube/karpenter.py) against the twin, which serves Karpenter's
NodePool (karpenter.sh/v1, cluster-scoped, with status) like the other custom resources.

Cases:
- a node labelled `karpenter.sh/nodepool` names its NodePool: found, with its nvidia.com/gpu
  limit and usage, under the limit -> not at_limit;
- a node without the label, or naming a NodePool that is gone: no NodePool (nothing raised);
- at the limit without raise_limits: reported, not raised;
- with raise_limits: the limit goes up by gpu_step, never past max_gpus, in one merge patch
  with the request's key; the same key again raises nothing more (a retry); maxGpus already
  reached: nothing raised, said so.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from kubernetes.client import CustomObjectsApi
from temporalio.testing import ActivityEnvironment

from activities.kube.activities import KubeActivities
from activities.kube.client import KubeSettings
from activities.kube.karpenter import ANN_RAISED_BY, GROUP, PLURAL, VERSION
from contract.capacity import KarpenterInput, KarpenterResult


@pytest.fixture
def karpenter(twin: Any) -> Iterator[tuple[KubeActivities, CustomObjectsApi, str, str]]:
    """(activities, custom objects API, the NodePool's name, a node labelled with it)."""
    custom = CustomObjectsApi(twin.api_client())
    name = f"gpu-{uuid.uuid4().hex[:6]}"
    custom.create_cluster_custom_object(
        GROUP,
        VERSION,
        PLURAL,
        {
            "apiVersion": f"{GROUP}/{VERSION}",
            "kind": "NodePool",
            "metadata": {"name": name},
            "spec": {
                "template": {"spec": {"nodeClassRef": {"group": "karpenter.k8s.aws",
                                                       "kind": "EC2NodeClass", "name": "gpu"}}},
                "limits": {"cpu": "1000", "nvidia.com/gpu": "16"},
            },
        },
    )  # fmt: skip
    custom.patch_cluster_custom_object_status(
        GROUP, VERSION, PLURAL, name, {"status": {"resources": {"nvidia.com/gpu": "8"}}}
    )
    node = twin.store.list("nodes").items[0]["metadata"]["name"]
    twin.store.mutate(
        "nodes", node, lambda n: n["metadata"].setdefault("labels", {}).update(
            {"karpenter.sh/nodepool": name}
        )
    )  # fmt: skip
    acts = KubeActivities(KubeSettings(kubeconfig=str(twin.kubeconfig_path)))
    try:
        yield acts, custom, name, node
    finally:

        def unlabel(n: dict[str, Any]) -> None:
            n["metadata"]["labels"].pop("karpenter.sh/nodepool", None)

        twin.store.mutate("nodes", node, unlabel)
        custom.delete_cluster_custom_object(GROUP, VERSION, PLURAL, name)
        acts.close()


async def ask(acts: KubeActivities, node: str, **kw: Any) -> KarpenterResult:
    inp = KarpenterInput(node=node, key=kw.pop("key", "wf-1-karpenter"), **kw)
    result: KarpenterResult = await ActivityEnvironment().run(acts.karpenter_capacity, inp)
    return result


def limit_of(custom: CustomObjectsApi, name: str) -> str:
    return str(custom.get_cluster_custom_object(GROUP, VERSION, PLURAL, name)["spec"]["limits"][
        "nvidia.com/gpu"])  # fmt: skip


async def test_the_nodepool_of_the_node_is_found(karpenter: Any) -> None:
    acts, _custom, name, node = karpenter
    found = await ask(acts, node, gpu_step=8)
    assert (found.node_pool, found.gpu_limit, found.gpus_used) == (name, 16, 8)
    assert not found.at_limit and found.raised_to is None


async def test_no_label_or_no_nodepool_is_no_karpenter(karpenter: Any, twin: Any) -> None:
    acts, custom, name, node = karpenter
    other = twin.store.list("nodes").items[1]["metadata"]["name"]
    assert (await ask(acts, other)).node_pool is None
    custom.delete_cluster_custom_object(GROUP, VERSION, PLURAL, name)
    gone = await ask(acts, node)
    assert gone.node_pool is None and "gone" in gone.message
    custom.create_cluster_custom_object(  # for the fixture's clean-up
        GROUP, VERSION, PLURAL, {"apiVersion": f"{GROUP}/{VERSION}", "kind": "NodePool",
                                 "metadata": {"name": name}, "spec": {}}
    )  # fmt: skip


async def test_at_the_limit_raised_only_when_asked_and_once(karpenter: Any) -> None:
    acts, custom, name, node = karpenter
    full = await ask(acts, node, gpu_step=9)  # 8 used + 9 > 16
    assert full.at_limit and full.raised_to is None and limit_of(custom, name) == "16"
    raised = await ask(acts, node, gpu_step=9, raise_limits=True, max_gpus=20)
    assert (raised.raised_from, raised.raised_to) == (16, 20)  # bounded by max_gpus
    assert limit_of(custom, name) == "20"
    meta = custom.get_cluster_custom_object(GROUP, VERSION, PLURAL, name)["metadata"]
    assert meta["annotations"][ANN_RAISED_BY] == "wf-1-karpenter"
    again = await ask(acts, node, gpu_step=9, raise_limits=True, max_gpus=40)  # the retry
    assert again.raised_to == 20 and limit_of(custom, name) == "20"
    other = await ask(acts, node, gpu_step=13, raise_limits=True, max_gpus=20, key="wf-2")
    assert other.raised_to is None and "allows no more" in other.message
