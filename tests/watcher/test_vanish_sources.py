"""Whose word keeps a node's GPUs vanished in the watcher: each source on its own.

Two things tell the watcher a node's GPUs vanished: the node itself (capacity, or the slices
it publishes, below the GPUs expected) and a GPU plugin pod that cannot run on it. A GPU that
goes Unknown on such a node is the node incident's, never a per-GPU remediation. So the node
stays vanished while either source says so, and only what said it takes it back.

Cases:
- the plugin pod fails, and the node's next status still counts its GPUs (the kubelet keeps
  a stopped plugin's capacity for a grace period, its devices unhealthy): still vanished;
  the plugin pod runs again: no longer;
- the failing plugin pod is deleted, or a relist no longer has it: no longer vanished;
- the capacity drops too; the plugin pod runs again: still vanished (the capacity says so);
  the capacity comes back: no longer;
- two plugin pods of one node fail (the plugin and the validator); one runs again: still
  vanished.

And what the watcher sends on (a vanished node finding starts the node incident): a node
first seen short of offered GPUs (allocatable below capacity: a notice), whose GPUs then
vanish, by its failing plugin pod (the kubelet writes allocatable 0 before the new plugin pod
fails: the order a plugin rollout shows) or by its capacity, sends the vanished finding too.
"""

from __future__ import annotations

from typing import Any

from activities.sweep import SweepActivities, SweepFinding
from worker.watcher import Tracker

NODE = "gpu-node-1"


def _node(capacity: int, allocatable: int | None = None) -> dict[str, Any]:
    alloc = capacity if allocatable is None else allocatable
    return {
        "metadata": {"name": NODE, "labels": {"nvidia.com/gpu.count": "2"}},
        "status": {
            "capacity": {"nvidia.com/gpu": str(capacity)},
            "allocatable": {"nvidia.com/gpu": str(alloc)},
            "nodeInfo": {
                "kubeletVersion": "v1.36.3",
                "containerRuntimeVersion": "containerd://2.1",
            },
        },
    }


def _plugin_pod(failing: bool, name: str = "nvidia-device-plugin-daemonset-x1") -> dict[str, Any]:
    app = name.rsplit("-", 1)[0]
    state = (
        {"waiting": {"reason": "CreateContainerError", "message": "hook"}}
        if failing
        else {"running": {"startedAt": "2026-12-07T00:00:00Z"}}
    )
    return {
        "metadata": {"name": name, "namespace": "gpu-operator", "labels": {"app": app}},
        "spec": {"nodeName": NODE},
        "status": {"containerStatuses": [{"state": state}]},
    }


def _tracker() -> Tracker:
    return Tracker(SweepActivities(object()), emit=lambda _f: None, emit_node=lambda _f: None)  # type: ignore[arg-type]


def test_a_failing_plugin_keeps_the_node_vanished_until_it_runs_again() -> None:
    t = _tracker()
    t.node(_node(2))
    t.pod(_plugin_pod(failing=True))
    assert NODE in t.vanished
    t.node(_node(2, allocatable=0))  # capacity kept for the grace period, devices unhealthy
    assert NODE in t.vanished
    t.pod(_plugin_pod(failing=True))  # the pod updated, still failing
    t.node(_node(2, allocatable=0))
    assert NODE in t.vanished
    t.pod(_plugin_pod(failing=False))  # restarted and running
    assert NODE not in t.vanished


def test_a_deleted_failing_plugin_pod_no_longer_holds_the_node() -> None:
    t = _tracker()
    t.node(_node(2))
    t.pod(_plugin_pod(failing=True))
    t.pod(_plugin_pod(failing=True), deleted=True)
    assert NODE not in t.vanished


def test_a_relist_without_the_failing_plugin_pod_no_longer_holds_the_node() -> None:
    t = _tracker()
    t.node(_node(2))
    t.pod(_plugin_pod(failing=True))
    t.begin("pod")
    t.end("pod")  # the relist did not contain it
    assert NODE not in t.vanished


def test_the_capacity_keeps_the_node_vanished_after_the_plugin_runs_again() -> None:
    t = _tracker()
    t.node(_node(2))
    t.pod(_plugin_pod(failing=True))
    t.node(_node(0))
    t.pod(_plugin_pod(failing=False))
    assert NODE in t.vanished
    t.node(_node(2))
    assert NODE not in t.vanished


def test_every_failing_plugin_pod_of_the_node_holds_it() -> None:
    t = _tracker()
    t.node(_node(2))
    t.pod(_plugin_pod(failing=True))
    t.pod(_plugin_pod(failing=True, name="nvidia-operator-validator-x2"))
    t.pod(_plugin_pod(failing=False))
    assert NODE in t.vanished
    t.pod(_plugin_pod(failing=False, name="nvidia-operator-validator-x2"))
    assert NODE not in t.vanished


def _recording() -> tuple[Tracker, list[SweepFinding]]:
    sent: list[SweepFinding] = []
    t = Tracker(SweepActivities(object()), emit=lambda _f: None, emit_node=sent.append)  # type: ignore[arg-type]
    return t, sent


def test_a_notice_then_a_failing_plugin_pod_sends_the_vanish() -> None:
    t, sent = _recording()
    t.node(_node(2))
    t.node(_node(2, allocatable=0))  # the plugin stopped: the kubelet's grace
    assert [f.vanished for f in sent] == [False]
    t.pod(_plugin_pod(failing=True))  # its new pod cannot run
    assert [f.vanished for f in sent] == [False, True]
    assert "GPU plugin pod" in sent[1].message


def test_a_notice_then_a_capacity_drop_sends_the_vanish() -> None:
    t, sent = _recording()
    t.node(_node(2))
    t.node(_node(2, allocatable=1))  # one GPU unhealthy per the device plugin
    t.node(_node(0))  # then every GPU vanished
    assert [f.vanished for f in sent] == [False, True]
    t.node(_node(0))  # the same vanish, seen again: nothing more
    assert len(sent) == 2
