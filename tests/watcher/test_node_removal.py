"""A node an autoscaler is removing (or that is being deleted) loses its GPUs with it: the GPU
plugin stops as the node drains and shuts down. No node incident, no notice, in the watcher
and the sweep alike; the watcher still silences the node's Unknown GPUs as before.

Cases: the Cluster Autoscaler's ToBeDeletedByClusterAutoscaler taint, Karpenter's
karpenter.sh/disrupted (v1) and karpenter.sh/disruption (before v1), and a Node with a
deletionTimestamp (Karpenter's finalizer holds it while it drains): capacity 0 < the count
label is no vanished finding; nor is its GPU plugin pod failing. Without the mark, the same
node is vanished (the control).
"""

from __future__ import annotations

from typing import Any

import pytest

from activities.kube.devices import node_being_removed
from activities.sweep import SweepActivities, SweepFinding
from worker.watcher import Tracker

NODE = "gpu-node-9"


def _node(capacity: int, **mark: Any) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": NODE, "labels": {"nvidia.com/gpu.count": "2"}}
    spec: dict[str, Any] = {}
    if mark.get("deleting"):
        meta["deletionTimestamp"] = "2026-12-07T06:00:00Z"
        meta["finalizers"] = ["karpenter.sh/termination"]
    if mark.get("taint"):
        spec["taints"] = [{"key": mark["taint"], "effect": "NoSchedule"}]
    return {
        "metadata": meta,
        "spec": spec,
        "status": {
            "capacity": {"nvidia.com/gpu": str(capacity)},
            "allocatable": {"nvidia.com/gpu": str(capacity)},
            "nodeInfo": {"kubeletVersion": "v1.36.3", "containerRuntimeVersion": "c://2"},
        },
    }


def _failing_plugin() -> dict[str, Any]:
    state = {"waiting": {"reason": "CreateContainerError", "message": "hook"}}
    return {
        "metadata": {
            "name": "nvidia-device-plugin-daemonset-x1",
            "namespace": "gpu-operator",
            "labels": {"app": "nvidia-device-plugin-daemonset"},
        },
        "spec": {"nodeName": NODE},
        "status": {"containerStatuses": [{"state": state}]},
    }


MARKS = [
    {"taint": "ToBeDeletedByClusterAutoscaler"},
    {"taint": "karpenter.sh/disrupted"},
    {"taint": "karpenter.sh/disruption"},
    {"deleting": True},
]


def _tracker() -> tuple[Tracker, list[SweepFinding]]:
    sent: list[SweepFinding] = []
    t = Tracker(SweepActivities(object()), emit=lambda _f: None, emit_node=sent.append)  # type: ignore[arg-type]
    return t, sent


@pytest.mark.parametrize("mark", MARKS)
def test_a_node_being_removed_is_no_vanish_and_no_notice(mark: dict[str, Any]) -> None:
    assert node_being_removed(_node(2, **mark))
    t, sent = _tracker()
    t.node(_node(2, **mark))
    t.node(_node(0, **mark))  # the plugin stopped as the node drains and shuts down
    assert NODE not in t.vanished and sent == []
    t.pod(_failing_plugin())
    assert NODE not in t.vanished and sent == []
    sweep = SweepActivities(object())  # type: ignore[arg-type]
    assert sweep.node_finding(_node(0, **mark), 0, False) is None


def test_the_same_node_not_being_removed_is_vanished() -> None:
    assert node_being_removed(_node(2)) == ""
    assert node_being_removed(_node(2, taint="nvidia.com/gpu")) == ""
    t, sent = _tracker()
    t.node(_node(2))
    t.node(_node(0))
    assert NODE in t.vanished and [f.vanished for f in sent] == [True]


def test_a_failing_plugin_on_a_node_being_removed_is_no_vanish() -> None:
    t, sent = _tracker()
    t.node(_node(2, taint="ToBeDeletedByClusterAutoscaler"))
    t.pod(_failing_plugin())
    assert NODE not in t.vanished and sent == []
