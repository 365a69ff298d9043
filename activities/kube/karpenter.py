"""Karpenter (karpenter.sh/v1 NodePools): does one serve the failed node's workloads, and may
its GPU limit be raised?

Karpenter provisions a node for pods it finds unschedulable, from the NodePool whose
requirements they fit. The failed node was provisioned by the NodePool its
`karpenter.sh/nodepool` label names, for these same workloads: their Pending replacements
(same requests, same affinities) are that NodePool's to serve. Sickbay then never scales a
node group as well (two provisioners racing for one pod), and the Pending deadline measures
Karpenter's provisioning.

A NodePool stops provisioning at its `spec.limits`. Sickbay reads `nvidia.com/gpu` there and
in `status.resources`; with the runbook's `scaleUp.karpenter.raiseLimits` it raises that limit
by `gpuStep` (never past `maxGpus`) with one JSON merge patch that also writes
`sickbay.dev/limit-raised-by: <key>` and `sickbay.dev/limit-raised-from: <old limit>`: a retry
of the same request finds its key and raises nothing again.

RBAC: get on nodes; get, patch on nodepools.karpenter.sh (patch only for raiseLimits).
"""

from __future__ import annotations

from typing import Any

from activities.kube.client import ErrorKind, Kube, KubeError
from contract.capacity import KarpenterInput, KarpenterResult

GROUP, VERSION, PLURAL = "karpenter.sh", "v1", "nodepools"
LABEL_NODEPOOL = "karpenter.sh/nodepool"
GPU = "nvidia.com/gpu"
ANN_RAISED_BY = "sickbay.dev/limit-raised-by"
ANN_RAISED_FROM = "sickbay.dev/limit-raised-from"


def _count(value: Any) -> int | None:
    """A Kubernetes quantity of whole devices ("16", 16) as an int; None when absent/odd."""
    try:
        return int(str(value))
    except (TypeError, ValueError):
        return None


def _node_pool_of(kube: Kube, node: str) -> str | None:
    try:
        obj = kube.call(kube.core.read_node, node, verb="get", resource="nodes", name=node)
    except KubeError as err:
        if err.kind is ErrorKind.NOT_FOUND:
            return None
        raise
    labels = (obj.get("metadata") or {}).get("labels") or {}
    name = labels.get(LABEL_NODEPOOL)
    return str(name) if name else None


def karpenter_capacity(kube: Kube, inp: KarpenterInput) -> KarpenterResult:
    """Detect the NodePool serving `inp.node`'s workloads; raise its GPU limit if asked."""
    name = _node_pool_of(kube, inp.node)
    if name is None:
        return KarpenterResult(message=f"node {inp.node} was not provisioned by Karpenter")
    try:
        pool = kube.call(
            kube.custom.get_cluster_custom_object,
            GROUP,
            VERSION,
            PLURAL,
            name,
            verb="get",
            resource="nodepools.karpenter.sh",
            name=name,
        )
    except KubeError as err:
        if err.kind is ErrorKind.NOT_FOUND:
            return KarpenterResult(
                message=f"node {inp.node} names Karpenter NodePool {name}, which is gone"
            )
        raise
    limit = _count(((pool.get("spec") or {}).get("limits") or {}).get(GPU))
    used = _count(((pool.get("status") or {}).get("resources") or {}).get(GPU)) or 0
    # No room for one more step of GPUs (a node's worth, as the runbook says) under the limit.
    at_limit = limit is not None and used + inp.gpu_step > limit
    annotations = (pool.get("metadata") or {}).get("annotations") or {}
    result = KarpenterResult(node_pool=name, gpu_limit=limit, gpus_used=used, at_limit=at_limit)
    if annotations.get(ANN_RAISED_BY) == inp.key:  # this request raised it already
        return result.model_copy(
            update={
                "raised_from": _count(annotations.get(ANN_RAISED_FROM)),
                "raised_to": limit,
                "message": f"NodePool {name}: {GPU} limit already raised to {limit} under "
                "this request",
            }
        )
    words = f"NodePool {name}: {used} of {limit if limit is not None else 'unlimited'} {GPU} used"
    if not at_limit or not inp.raise_limits:
        return result.model_copy(update={"message": words})
    assert limit is not None
    new = min(limit + inp.gpu_step, inp.max_gpus)
    if new <= limit:
        return result.model_copy(
            update={"message": f"{words}; the runbook's maxGpus {inp.max_gpus} allows no more"}
        )
    body = {
        "metadata": {"annotations": {ANN_RAISED_BY: inp.key, ANN_RAISED_FROM: str(limit)}},
        "spec": {"limits": {GPU: str(new)}},
    }
    kube.call(
        kube.custom.patch_cluster_custom_object,
        GROUP,
        VERSION,
        PLURAL,
        name,
        body,
        verb="patch",
        resource="nodepools.karpenter.sh",
        name=name,
        _content_type="application/merge-patch+json",
    )
    return result.model_copy(
        update={
            "raised_from": limit,
            "raised_to": new,
            "message": f"{words}; raised the {GPU} limit {limit} -> {new}",
        }
    )
