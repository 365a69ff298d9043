"""Node-level actions Sickbay undoes itself: the fallback node taint, the list of GPUs it
quarantined on a node (device plugin / no DeviceTaintRule), and cordon.

Ownership is recorded on the node in annotations, so release only ever undoes what Sickbay did:
- `sickbay.dev/quarantined-gpus`: comma-separated GPU UUIDs Sickbay quarantined there;
- `sickbay.dev/node-taint`: workflow id that added the `sickbay.dev/unhealthy` node taint;
- `sickbay.dev/cordoned-by`: workflow id that cordoned the node.
A taint or cordon present without its annotation belongs to someone else and is left alone.
Each change is one strategic-merge patch carrying the read resourceVersion (409 -> re-read).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from activities.kube.client import ErrorKind, Kube, KubeError
from activities.kube.pods import meta
from contract.names import TAINT_KEY

ANN_QUARANTINED = "sickbay.dev/quarantined-gpus"
ANN_NODE_TAINT = "sickbay.dev/node-taint"
ANN_CORDONED_BY = "sickbay.dev/cordoned-by"
CONFLICT_RETRIES = 3  # re-read-and-converge attempts on 409 before letting Temporal retry


def read_node(kube: Kube, name: str) -> dict[str, Any]:
    return kube.call(kube.core.read_node, name, verb="get", resource="nodes", name=name)


def quarantined_on(node: dict[str, Any]) -> list[str]:
    raw = (meta(node).get("annotations") or {}).get(ANN_QUARANTINED) or ""
    return [u for u in raw.split(",") if u]


def has_sickbay_taint(node: dict[str, Any]) -> bool:
    return any(t.get("key") == TAINT_KEY for t in (node.get("spec") or {}).get("taints") or [])


def converge_node(
    kube: Kube,
    name: str,
    change: Callable[[dict[str, Any]], dict[str, Any] | None],
    node: dict[str, Any] | None = None,
) -> tuple[dict[str, Any], bool]:
    """Apply `change(node) -> patch | None` with optimistic concurrency; returns (node, changed)."""
    for _ in range(CONFLICT_RETRIES):
        current = node if node is not None else read_node(kube, name)
        node = None
        patch = change(current)
        if patch is None:
            return current, False
        patch.setdefault("metadata", {})["resourceVersion"] = meta(current).get("resourceVersion")
        try:
            updated = kube.call(
                kube.core.patch_node, name, patch, verb="patch", resource="nodes", name=name
            )
            kube.forget("nodes")  # the shared node list (budget count) must see this mark
            return updated, True
        except KubeError as err:
            if err.kind is not ErrorKind.CONFLICT:
                raise
    raise KubeError(
        ErrorKind.CONFLICT,
        status=409,
        verb="patch",
        resource="nodes",
        name=name,
        message="node kept changing under Sickbay",
    )


def add_quarantined(uuid: str) -> Callable[[dict[str, Any]], dict[str, Any] | None]:
    def change(node: dict[str, Any]) -> dict[str, Any] | None:
        current = quarantined_on(node)
        if uuid in current:
            return None
        return {"metadata": {"annotations": {ANN_QUARANTINED: ",".join([*current, uuid])}}}

    return change


def set_node_taint(
    workflow_id: str, value: str, effect: str = "NoSchedule"
) -> Callable[[dict[str, Any]], dict[str, Any] | None]:
    def change(node: dict[str, Any]) -> dict[str, Any] | None:
        if has_sickbay_taint(node):
            return None
        taints = list((node.get("spec") or {}).get("taints") or [])
        taints.append({"key": TAINT_KEY, "value": value, "effect": effect})
        return {
            "metadata": {"annotations": {ANN_NODE_TAINT: workflow_id}},
            "spec": {"taints": taints},
        }

    return change


def release_gpu(uuid: str, untaint: bool) -> Callable[[dict[str, Any]], dict[str, Any] | None]:
    """Forget `uuid`; drop the node taint only if Sickbay added it and no other GPU on this
    node is still quarantined by Sickbay."""

    def change(node: dict[str, Any]) -> dict[str, Any] | None:
        current = quarantined_on(node)
        remaining = [u for u in current if u != uuid]
        annotations = meta(node).get("annotations") or {}
        patch: dict[str, Any] = {"metadata": {"annotations": {}}}
        if remaining != current:
            patch["metadata"]["annotations"][ANN_QUARANTINED] = ",".join(remaining) or None
        ours = ANN_NODE_TAINT in annotations and has_sickbay_taint(node)
        if untaint and ours and not remaining:
            taints = [
                t for t in (node.get("spec") or {}).get("taints") or [] if t.get("key") != TAINT_KEY
            ]
            patch["spec"] = {"taints": taints}
            patch["metadata"]["annotations"][ANN_NODE_TAINT] = None
        if not patch["metadata"]["annotations"] and "spec" not in patch:
            return None
        return patch

    return change


def cordon_change(
    cordon: bool, workflow_id: str, outcome: dict[str, str]
) -> Callable[[dict[str, Any]], dict[str, Any] | None]:
    def change(node: dict[str, Any]) -> dict[str, Any] | None:
        unschedulable = bool((node.get("spec") or {}).get("unschedulable"))
        ours = (meta(node).get("annotations") or {}).get(ANN_CORDONED_BY)
        if cordon:
            if unschedulable:
                outcome["message"] = (
                    f"already cordoned by Sickbay ({ours})"
                    if ours
                    else "already cordoned by someone else; Sickbay will not uncordon it"
                )
                return None
            outcome["message"] = "cordoned"
            return {
                "metadata": {"annotations": {ANN_CORDONED_BY: workflow_id}},
                "spec": {"unschedulable": True},
            }
        if not ours:
            outcome["message"] = (
                "cordoned by someone else; left as is" if unschedulable else "not cordoned"
            )
            return None
        outcome["message"] = "uncordoned"
        return {
            "metadata": {"annotations": {ANN_CORDONED_BY: None}},
            "spec": {"unschedulable": None},
        }

    return change
