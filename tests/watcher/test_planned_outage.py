"""GPUs away on purpose are no vanish: a node an autoscaler is removing (or that is being
deleted) loses its GPUs with it, its plugin stopping as the node drains and shuts down; the
GPU Operator's driver upgrade unloads the driver and restarts the plugin on purpose. No node
incident, no notice, in the watcher and the sweep alike.

Cases: the Cluster Autoscaler's ToBeDeletedByClusterAutoscaler taint, Karpenter's
karpenter.sh/disrupted (v1) and karpenter.sh/disruption (before v1), a Node with a
deletionTimestamp (Karpenter's finalizer holds it while it drains), and the GPU Operator's
nvidia.com/gpu-driver-upgrade-state in a state of the upgrade at work (pod-restart-required,
drain-required, validation-required): capacity 0 < the count label is no vanished finding;
nor is its GPU plugin pod failing. Without the mark, or with the upgrade failed or done, the
same node is vanished (the controls).
"""

from __future__ import annotations

from typing import Any

import pytest

from activities.kube.devices import planned_outage
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
    if mark.get("upgrade"):
        meta["labels"]["nvidia.com/gpu-driver-upgrade-state"] = mark["upgrade"]
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
    {"upgrade": "pod-restart-required"},
    {"upgrade": "drain-required"},
    {"upgrade": "validation-required"},
]


def _tracker() -> tuple[Tracker, list[SweepFinding]]:
    sent: list[SweepFinding] = []
    t = Tracker(SweepActivities(object()), emit=lambda _f: None, emit_node=sent.append)  # type: ignore[arg-type]
    return t, sent


@pytest.mark.parametrize("mark", MARKS)
def test_a_planned_outage_is_no_vanish_and_no_notice(mark: dict[str, Any]) -> None:
    assert planned_outage(_node(2, **mark))
    t, sent = _tracker()
    t.node(_node(2, **mark))
    t.node(_node(0, **mark))  # the plugin stopped as the node drains and shuts down
    assert NODE not in t.vanished and sent == []
    t.pod(_failing_plugin())
    assert NODE not in t.vanished and sent == []
    sweep = SweepActivities(object())  # type: ignore[arg-type]
    assert sweep.node_finding(_node(0, **mark), 0, False) is None


@pytest.mark.parametrize(
    "mark",
    [{}, {"taint": "nvidia.com/gpu"}, {"upgrade": "upgrade-failed"}, {"upgrade": "upgrade-done"}],
)
def test_the_same_node_without_a_planned_outage_is_vanished(mark: dict[str, Any]) -> None:
    assert planned_outage(_node(2, **mark)) == ""
    t, sent = _tracker()
    t.node(_node(2, **mark))
    t.node(_node(0, **mark))
    assert NODE in t.vanished and [f.vanished for f in sent] == [True]


def test_a_failing_plugin_in_a_planned_outage_is_no_vanish() -> None:
    t, sent = _tracker()
    t.node(_node(2, taint="ToBeDeletedByClusterAutoscaler"))
    t.pod(_failing_plugin())
    assert NODE not in t.vanished and sent == []
    t.node(_node(2, upgrade="pod-restart-required"))  # now the driver upgrade
    t.pod(_failing_plugin())
    assert NODE not in t.vanished and sent == []
