"""Manifest builders and small readers shared by the controller tests."""

from __future__ import annotations

from typing import Any

from kubernetes import client

DRIVER = "gpu.nvidia.com"


def claim_template(name: str, requests: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaimTemplate",
        "metadata": {"name": name},
        "spec": {
            "spec": {
                "devices": {
                    "requests": requests
                    or [{"name": "gpu", "exactly": {"deviceClassName": DRIVER}}]
                }
            }
        },
    }


def pod_template(
    labels: dict[str, str], claim_template_name: str | None, **spec: Any
) -> dict[str, Any]:
    container: dict[str, Any] = {"name": "main", "image": "registry.invalid/trainer:1"}
    pod_spec: dict[str, Any] = {"containers": [container], **spec}
    if claim_template_name:
        container["resources"] = {"claims": [{"name": "gpu"}]}
        pod_spec["resourceClaims"] = [
            {"name": "gpu", "resourceClaimTemplateName": claim_template_name}
        ]
    return {"metadata": {"labels": labels}, "spec": pod_spec}


def deployment(name: str, claim_template_name: str | None, replicas: int = 1) -> dict[str, Any]:
    labels = {"app": name}
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": name},
        "spec": {
            "replicas": replicas,
            "selector": {"matchLabels": labels},
            "template": pod_template(labels, claim_template_name),
        },
    }


def taint_rule(
    name: str, pool: str | None, device: str | None, effect: str = "NoExecute"
) -> dict[str, Any]:
    selector = {"driver": DRIVER}
    if pool:
        selector["pool"] = pool
    if device:
        selector["device"] = device
    return {
        "apiVersion": "resource.k8s.io/v1beta2",
        "kind": "DeviceTaintRule",
        "metadata": {"name": name},
        "spec": {
            "deviceSelector": selector,
            "taint": {"key": "sickbay.dev/unhealthy", "value": "xid-79", "effect": effect},
        },
    }


def pods(core: client.CoreV1Api, namespace: str, **kwargs: Any) -> list[Any]:
    return list(core.list_namespaced_pod(namespace, **kwargs).items)


def claim_of(dra: client.ResourceV1Api, pod: Any) -> Any:
    name = pod.status.resource_claim_statuses[0].resource_claim_name
    return dra.read_namespaced_resource_claim(name, pod.metadata.namespace)


def allocated_device(dra: client.ResourceV1Api, pod: Any) -> str:
    claim = claim_of(dra, pod)
    result = claim.status.allocation.devices.results[0]
    return f"{result.driver}/{result.pool}/{result.device}"


def condition(obj: Any, ctype: str) -> Any:
    for cond in (obj.status.conditions or []) if obj.status else []:
        if cond.type == ctype:
            return cond
    return None
