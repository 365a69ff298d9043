"""The sweep and a node whose GPUs vanished after an upgrade (twin/upgrade.py), device plugin,
a pod on one of the node's GPUs.

Cases:
- the toolkit hook breaks the plugin: one `vanished` node finding for the node (capacity 0 <
  the count label: the node incident's), the pod's Unknown GPU is no finding (never a per-GPU
  remediation), the other node nothing;
- a GPU plugin pod that cannot run (CreateContainerError, CrashLoopBackOff) is a vanished node
  finding on its own; one that is merely starting (ContainerCreating), Ready, deleting or
  not a GPU plugin is none;
- a device plugin that offers none of its node's GPUs (allocatable 0, capacity kept): the
  node's Unknown GPUs are no per-GPU findings; another node's Unknown GPU still is;
- a healthy plugin rollout (the new pod ContainerCreating, the old one deleting): the node's
  "allocatable 0 < capacity" is no notice while it starts (the kubelet drops the capacity after
  its grace if the plugin never registers: a vanish); the same numbers with the plugin pod
  Ready, or with no plugin pod seen, still are;
- one finding per node: a failing plugin pod's (vanished) wins over the node's own finding
  that says only "allocatable < capacity" (the kubelet keeps a stopped plugin's capacity for a
  grace period, its devices unhealthy), and the node's own vanished finding wins over both.
"""

from __future__ import annotations

import time
import uuid
from pathlib import Path
from typing import Any

from kubernetes import client as k8s

from activities.kube.client import Kube, KubeSettings
from activities.kube.devices import withholds_every_gpu
from activities.sweep import (
    SweepActivities,
    one_per_node,
    plugin_pod_finding,
    plugin_pod_starting,
)
from contract.sweep import SweepClusterInput, SweepFinding
from tests.twin.helpers import plugin_silent_on_first_node
from twin.clock import Clock
from twin.controllers.manager import ControllerManager, TwinOptions
from twin.testing import start_twin


def _wait(check: Any, within: float = 30.0) -> Any:
    deadline = time.monotonic() + within
    while True:
        got = check()
        if got:
            return got
        assert time.monotonic() < deadline, "not reached"
        time.sleep(0.05)


def test_vanished_node_is_one_node_finding_and_no_device_finding(tmp_path: Path) -> None:
    manager = ControllerManager(TwinOptions(pod_startup_seconds=1))
    rs = start_twin(
        tmp_path,
        profile="device-plugin",
        nodes=2,
        gpus_per_node=2,
        node_prefix=f"s-{uuid.uuid4().hex[:5]}-",
        clock=Clock(time_scale=100.0),
        controllers=(manager,),
    )
    try:
        node, other = rs.twin.seed_info["nodes"]
        core = k8s.CoreV1Api(rs.api_client())
        core.create_namespace({"metadata": {"name": "ml"}})
        limits = {"nvidia.com/gpu": "1"}
        core.create_namespaced_pod(
            "ml",
            {
                "metadata": {"name": "trainer"},
                "spec": {
                    "nodeName": node,
                    "containers": [{"name": "m", "image": "x", "resources": {"limits": limits}}],
                },
            },
        )
        _wait(lambda: core.read_namespaced_pod("trainer", "ml").status.phase == "Running")
        manager.gpu_plugins.install()
        manager.gpu_plugins.upgrade(node, kubelet="v1.99.0", breaks="hook")

        def unknown() -> bool:
            pod = core.read_namespaced_pod("trainer", "ml")
            return any(
                r.health == "Unknown"
                for cs in pod.status.container_statuses or []
                for e in cs.allocated_resources_status or []
                for r in e.resources or []
            )

        _wait(unknown)
        sweep = SweepActivities(
            Kube.from_settings(KubeSettings(kubeconfig=str(rs.kubeconfig_path)))
        )
        report = _wait(lambda: (r := sweep.sweep(SweepClusterInput())).nodes and r)
        [finding] = report.nodes
        assert finding.node == node and finding.vanished and finding.expected_gpus == 2
        assert report.findings == [], "a vanished GPU must be no per-GPU finding"
        pod = core.read_namespaced_pod("trainer", "ml")
        [gpu] = [
            r.resource_id
            for cs in pod.status.container_statuses
            for e in cs.allocated_resources_status or []
            for r in e.resources or []
        ]
        # The workflow's re-check of Unknown devices drops it as well.
        again = sweep.sweep(SweepClusterInput(only_unknown=[f"{node}/{gpu}"]))
        assert again.findings == [] and again.nodes == []
    finally:
        rs.stop()


def _pod(reason: str = "", labels: dict[str, str] | None = None, **meta: Any) -> dict[str, Any]:
    state = {"waiting": {"reason": reason, "message": "boom"}} if reason else {"running": {}}
    return {
        "metadata": {
            "name": "p",
            "namespace": "gpu-operator",
            "labels": labels if labels is not None else {"app": "nvidia-device-plugin-daemonset"},
            **meta,
        },
        "spec": {"nodeName": "n1"},
        "status": {"containerStatuses": [{"name": "c", "state": state, "ready": not reason}]},
    }


def test_plugin_pod_that_cannot_run_is_a_vanished_node_finding() -> None:
    for reason in ("CreateContainerError", "CrashLoopBackOff"):
        f = plugin_pod_finding(_pod(reason))
        assert f is not None and f.vanished and f.node == "n1" and reason in f.message
    dra = _pod("CrashLoopBackOff", {"app.kubernetes.io/name": "nvidia-dra-driver-gpu"})
    assert plugin_pod_finding(dra) is not None
    assert plugin_pod_finding(_pod("ContainerCreating")) is None  # a rollout, not a failure
    assert plugin_pod_finding(_pod()) is None
    assert plugin_pod_finding(_pod("CrashLoopBackOff", {"app": "web"})) is None
    assert (
        plugin_pod_finding(_pod("CrashLoopBackOff", deletionTimestamp="2026-01-01T00:00:00Z"))
        is None
    )


def test_a_failing_plugin_pod_makes_its_node_vanished_whatever_its_status_counts() -> None:
    unhealthy = SweepFinding(
        kind="node-capacity",
        node="n1",
        message="node n1: allocatable nvidia.com/gpu 0 < capacity 2",
        gpu_capacity=2,
        gpu_allocatable=0,
    )
    plugin = plugin_pod_finding(_pod("CreateContainerError"))
    assert plugin is not None
    [chosen] = one_per_node([unhealthy], [plugin])
    assert chosen is plugin and chosen.vanished
    gone = unhealthy.model_copy(update={"vanished": True, "gpu_capacity": 0})
    [chosen] = one_per_node([gone], [plugin])
    assert chosen is gone  # the node's own count first
    assert one_per_node([unhealthy], []) == [unhealthy]
    other = plugin.model_copy(update={"node": "n2"})
    assert one_per_node([unhealthy], [plugin, other]) == [plugin, other]


def test_unknown_gpus_of_a_node_whose_plugin_offers_none_are_no_findings(tmp_path: Path) -> None:
    rs = start_twin(
        tmp_path, profile="device-plugin", nodes=2, gpus_per_node=2, node_prefix="w-"
    )  # no controllers: the node and pod statuses below stay as written
    try:
        silent, other, first = plugin_silent_on_first_node(rs)
        assert withholds_every_gpu(rs.twin.store.get("nodes", silent))
        assert not withholds_every_gpu(rs.twin.store.get("nodes", other))
        sweep = SweepActivities(
            Kube.from_settings(KubeSettings(kubeconfig=str(rs.kubeconfig_path)))
        )
        report = sweep.sweep(SweepClusterInput())
        assert [f.key for f in report.findings] == [f"{other}/{first[other]}"]
        [node_finding] = report.nodes  # the silent node's own: allocatable 0 < capacity 2
        assert node_finding.node == silent and not node_finding.vanished
    finally:
        rs.stop()


def test_a_starting_or_replaced_plugin_pod_is_a_restart_in_progress() -> None:
    assert plugin_pod_starting(_pod("ContainerCreating")) == "n1"
    assert plugin_pod_starting(_pod("PodInitializing")) == "n1"
    assert plugin_pod_starting(_pod(deletionTimestamp="2026-01-01T00:00:00Z")) == "n1"
    running_not_ready = _pod()
    running_not_ready["status"]["containerStatuses"][0]["ready"] = False
    assert plugin_pod_starting(running_not_ready) == "n1"
    assert plugin_pod_starting(_pod()) is None  # Ready: registered, its word stands
    assert plugin_pod_starting(_pod("CrashLoopBackOff")) is None  # cannot run: a vanish
    assert plugin_pod_starting(_pod("ContainerCreating", {"app": "web"})) is None
    validator = _pod("ContainerCreating", {"app": "nvidia-operator-validator"})
    assert plugin_pod_starting(validator) is None  # registers no GPU


def test_a_healthy_plugin_rollout_is_no_notice_while_the_new_pod_starts(tmp_path: Path) -> None:
    manager = ControllerManager(TwinOptions(pod_startup_seconds=1, plugin_stop_grace=1e6))
    rs = start_twin(
        tmp_path,
        profile="device-plugin",
        nodes=2,
        gpus_per_node=2,
        node_prefix=f"r-{uuid.uuid4().hex[:5]}-",
        clock=Clock(time_scale=100.0),
        controllers=(manager,),
    )
    try:
        node, _other = rs.twin.seed_info["nodes"]
        core = k8s.CoreV1Api(rs.api_client())
        manager.gpu_plugins.install()
        sweep = SweepActivities(
            Kube.from_settings(KubeSettings(kubeconfig=str(rs.kubeconfig_path)))
        )

        def plugin_ready() -> bool:
            pods = core.list_namespaced_pod(
                "gpu-operator", field_selector=f"spec.nodeName={node}"
            ).items
            return any(
                cs.ready and p.metadata.labels.get("app") == "nvidia-device-plugin-daemonset"
                for p in pods
                for cs in p.status.container_statuses or []
            )

        _wait(plugin_ready)
        # and registered: the kubelet offers its GPUs (a rollout before that, under load, had
        # no GPUs to keep for the grace, and the node counted 0 at once)
        _wait(lambda: (core.read_node(node).status.allocatable or {}).get("nvidia.com/gpu") == "2")
        manager.gpu_plugins.roll_plugin(node, starts_after=1e9)  # until start_now below
        _wait(lambda: core.read_node(node).status.allocatable["nvidia.com/gpu"] == "0")
        report = sweep.sweep(SweepClusterInput())
        assert core.read_node(node).status.allocatable["nvidia.com/gpu"] == "0"  # still
        assert not plugin_ready()
        assert report.nodes == [], [f.message for f in report.nodes]
        assert report.plugins_starting == [node]
        assert report.findings == []
        manager.gpu_plugins.start_now(node)
        _wait(plugin_ready)
        _wait(lambda: core.read_node(node).status.allocatable["nvidia.com/gpu"] == "2")
        again = sweep.sweep(SweepClusterInput())
        assert again.nodes == [] and again.plugins_starting == []
    finally:
        rs.stop()
