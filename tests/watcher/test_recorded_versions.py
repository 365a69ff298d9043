"""What the watcher remembers of a node's versions before its GPUs vanished (the node
incident's "since its kubelet went from X to Y").

Cases (device plugin: the node's nvidia.com/gpu capacity says how many GPUs it has):
- an upgrade, then the GPUs vanish: the version before the upgrade;
- the node heals on the new version, then its GPUs vanish again with no upgrade: the version
  it healed on (no kubelet change to blame);
- the node heals on the new version, is upgraded again, and the watch sees its GPUs vanish
  before it sees the new version (a DRA driver's slice empties before the kubelet's status
  update arrives): the version it healed on, not the one of the earlier, healed upgrade;
- an upgrade the node survives for a moment, then the GPUs vanish: still the version before
  the upgrade (a healthy moment after an upgrade is not a recovery);
- the GPU plugin pod fails before the kubelet's new status arrives, and that status still
  shows the GPUs (their capacity drops later): the version before the upgrade (the node was
  never seen healthy on the new version, so nothing healed);
- the node's GPUs vanish before the watch sees the new version (its status, or its failing
  plugin pod, came first), then it heals on the new version and vanishes again later: the
  version it healed on (a recovery is a recovery, whichever the watch saw first).
"""

from __future__ import annotations

from typing import Any

from activities.sweep import SweepActivities
from worker.watcher import Tracker

NODE = "gpu-node-1"


def _node(kubelet: str, gpus: int) -> dict[str, Any]:
    return {
        "metadata": {"name": NODE, "labels": {"nvidia.com/gpu.count": "2"}},
        "status": {
            "capacity": {"nvidia.com/gpu": str(gpus)},
            "allocatable": {"nvidia.com/gpu": str(gpus)},
            "nodeInfo": {"kubeletVersion": kubelet, "containerRuntimeVersion": "containerd://2.1"},
        },
    }


def _tracker() -> Tracker:
    return Tracker(SweepActivities(object()), emit=lambda _f: None, emit_node=lambda _f: None)  # type: ignore[arg-type]


def test_the_version_before_the_upgrade_that_broke_it() -> None:
    t = _tracker()
    t.node(_node("v1.36.0", 2))
    t.node(_node("v1.36.3", 0))
    assert NODE in t.vanished
    assert t.recorded(NODE).kubelet_version == "v1.36.0"
    assert t.recorded(NODE).gpu_count == 2


def test_a_healed_node_vanishing_again_blames_no_earlier_upgrade() -> None:
    t = _tracker()
    t.node(_node("v1.36.0", 2))
    t.node(_node("v1.36.3", 0))
    t.node(_node("v1.36.3", 2))  # healed on v1.36.3
    assert NODE not in t.vanished
    t.node(_node("v1.36.3", 0))  # vanished again, no upgrade this time
    assert t.recorded(NODE).kubelet_version == "v1.36.3"


def test_a_vanish_seen_before_the_new_version_names_the_healed_one() -> None:
    t = _tracker()
    t.node(_node("v1.36.0", 2))
    t.node(_node("v1.36.3", 0))
    t.node(_node("v1.36.3", 2))  # healed on v1.36.3
    t.node(_node("v1.36.3", 0))  # the GPUs vanish; v1.36.9's status not seen yet
    assert t.recorded(NODE).kubelet_version == "v1.36.3"
    t.node(_node("v1.36.9", 0))
    assert t.recorded(NODE).kubelet_version == "v1.36.3"


def test_a_healthy_moment_after_an_upgrade_is_not_a_recovery() -> None:
    t = _tracker()
    t.node(_node("v1.36.0", 2))
    t.node(_node("v1.36.3", 2))  # upgraded; the plugin still serves for a moment
    t.node(_node("v1.36.3", 0))
    assert t.recorded(NODE).kubelet_version == "v1.36.0"


def _failing_plugin_pod() -> dict[str, Any]:
    return {
        "metadata": {
            "name": "nvidia-device-plugin-daemonset-x1",
            "namespace": "gpu-operator",
            "labels": {"app": "nvidia-device-plugin-daemonset"},
        },
        "spec": {"nodeName": NODE},
        "status": {
            "containerStatuses": [
                {"state": {"waiting": {"reason": "CreateContainerError", "message": "hook"}}}
            ]
        },
    }


def test_a_plugin_failure_seen_before_the_new_status_names_the_version_before() -> None:
    t = _tracker()
    t.node(_node("v1.36.0", 2))
    t.pod(_failing_plugin_pod())  # the upgrade broke the plugin; the node's status is behind
    assert NODE in t.vanished
    t.node(_node("v1.99.1", 2))  # the kubelet's new version, its GPUs not yet dropped
    assert t.recorded(NODE).kubelet_version == "v1.36.0"
    t.node(_node("v1.99.1", 0))
    assert t.recorded(NODE).kubelet_version == "v1.36.0"


def test_a_node_that_vanished_before_its_new_version_and_healed_on_it_blames_no_upgrade() -> None:
    t = _tracker()
    t.node(_node("v1.36.0", 2))
    t.node(_node("v1.36.0", 0))  # the GPUs vanish first
    t.node(_node("v1.99.1", 0))  # then the kubelet's new status
    assert t.recorded(NODE).kubelet_version == "v1.36.0"
    t.node(_node("v1.99.1", 2))  # healed on v1.99.1
    t.node(_node("v1.99.1", 0))  # vanished again, no upgrade this time
    assert t.recorded(NODE).kubelet_version == "v1.99.1"


def test_a_plugin_restart_that_heals_on_the_new_version_blames_no_upgrade_later() -> None:
    t = _tracker()
    t.node(_node("v1.36.0", 2))
    t.pod(_failing_plugin_pod())
    t.node(_node("v1.99.1", 2))  # the new status, its GPUs not yet dropped: no recovery
    assert NODE in t.vanished
    running = _failing_plugin_pod()
    running["status"] = {"containerStatuses": [{"state": {"running": {}}}]}
    t.pod(running)  # restarted: it runs on v1.99.1 with its GPUs
    assert NODE not in t.vanished
    t.node(_node("v1.99.1", 0))  # vanished again, no upgrade this time
    assert t.recorded(NODE).kubelet_version == "v1.99.1"
