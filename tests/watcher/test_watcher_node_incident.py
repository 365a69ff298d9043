"""The health watcher and a node whose GPUs vanish after an upgrade (twin/upgrade.py), with a
recording launcher in place of Temporal.

Cases (device plugin, a pod on one of the node's GPUs):
- the kubelet upgrade breaks the device plugin: capacity 0 of 2 and the plugin pod in
  CreateContainerError -> exactly one node incident start (whichever the watch saw first),
  carrying what the node looked like before (the old kubelet version, 2 GPUs); the
  pod's device goes Unknown and, past `unknown_timeout`, is NOT launched as a per-GPU
  remediation (no quarantine for a GPU that merely vanished); no node notice either;
- the GPUs come back (a plugin restart) and vanish again: a second node incident start,
  which remembers the version the node healed on (no kubelet change to blame this time);
- a plugin rollout on a running kubelet (no upgrade): the kubelet keeps the capacity (2, none
  allocatable) for its grace, so only the crash-looping plugin pod says the GPUs vanished:
  still exactly one node incident, naming the pod, and the pod's Unknown GPU is left to it;
- a healthy plugin rollout (the new pod ContainerCreating, then registering): the node's
  notice reaches the sweep trigger, and the sweep it triggers says nothing (the plugin is
  starting); no node incident, and the pod's Unknown GPU is no remediation;
- MIG on the device plugin's `mixed` strategy (one GPU of a node MIG-enabled before the
  watch starts), and time-slicing renamed to nvidia.com/gpu.shared on the other while it
  runs: nvidia.com/gpu below the count label is no vanish: no node incident, no notice;
- the MIG manager repartitioning a node (`nvidia.com/mig.config.state` pending: nothing sent;
  rebooting, the kubelet counting no GPU): one node incident whose reason names the planned
  work (the incident waits for it, bounded), the pod's Unknown GPU left to it; `success`
  with the GPUs back: no longer vanished, nothing more sent.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client as k8s

from activities.kube.client import Kube, KubeSettings
from activities.sweep import SweepActivities
from contract.node_incident import NodeIncidentInput
from contract.sweep import SweepClusterInput
from tests.waiting import until
from tests.watcher.test_watcher_twin import NAMESPACE, Recorder, Running, config, kube_for
from twin.clock import Clock
from twin.controllers.manager import ControllerManager, TwinOptions
from twin.testing import RunningTwin, start_twin
from twin.upgrade import NAMESPACE as PLUGIN_NS
from worker.watcher import HealthWatcher


@pytest.fixture
def twin(tmp_path: Path) -> Iterator[tuple[RunningTwin, ControllerManager]]:
    # The kubelet's grace after a plugin stopped lasts the whole test (a rollout's case).
    manager = ControllerManager(TwinOptions(pod_startup_seconds=1, plugin_stop_grace=1e9))
    rs = start_twin(
        tmp_path,
        profile="device-plugin",
        nodes=2,
        gpus_per_node=2,
        node_prefix=f"u-{uuid.uuid4().hex[:5]}-",
        clock=Clock(time_scale=100.0),
        controllers=(manager,),
    )
    core = k8s.CoreV1Api(rs.api_client())
    core.create_namespace({"metadata": {"name": NAMESPACE}})
    manager.gpu_plugins.install()
    try:
        yield rs, manager
    finally:
        rs.stop()


def _watching(rs: RunningTwin) -> tuple[HealthWatcher, Recorder, list[NodeIncidentInput]]:
    """A watcher with a recording launcher, and the node incidents it starts."""
    rec = Recorder()
    incidents: list[NodeIncidentInput] = []

    async def on_vanished(inp: NodeIncidentInput) -> None:
        incidents.append(inp)

    watcher = HealthWatcher(
        kube_for(rs), rec.launch, config(), on_node=rec.node, on_vanished=on_vanished
    )
    return watcher, rec, incidents


def _tracked(watcher: HealthWatcher, node: str, *path: str) -> Any:
    """A field of `node` as the watcher's tracker holds it (None until it holds it)."""
    value: Any = watcher.tracker.nodes.get(node)
    for key in path:
        value = (value or {}).get(key)
    return value


async def _trainer_running(rs: RunningTwin, node: str) -> k8s.CoreV1Api:
    """A pod holding one of `node`'s GPUs, Running, and the GPU plugin pods up."""
    core = k8s.CoreV1Api(rs.api_client())
    core.create_namespace({"metadata": {"name": "ml"}})
    core.create_namespaced_pod(
        "ml",
        {
            "metadata": {"name": "trainer"},
            "spec": {
                "nodeName": node,
                "containers": [
                    {"name": "main", "image": "x", "resources": {"limits": {"nvidia.com/gpu": "1"}}}
                ],
            },
        },
    )
    await until(lambda: core.read_namespaced_pod("trainer", "ml").status.phase == "Running")
    await until(lambda: core.list_namespaced_pod(PLUGIN_NS).items)
    return core


async def test_vanished_gpus_are_one_node_incident_and_no_remediation(
    twin: tuple[RunningTwin, ControllerManager],
) -> None:
    rs, manager = twin
    node = rs.twin.seed_info["nodes"][0]
    core = await _trainer_running(rs, node)
    before = core.read_node(node).status.node_info.kubelet_version

    watcher, rec, incidents = _watching(rs)
    async with Running(watcher):
        assert await watcher.synced()
        manager.gpu_plugins.upgrade(node, kubelet="v1.99.1", breaks="hook")
        await until(lambda: incidents)
        [inc] = incidents
        assert inc.node == node and inc.trigger == "watch" and inc.expected_gpus == 2
        assert inc.recorded is not None and inc.recorded.kubelet_version == before
        # Whichever the watch saw first: the capacity drop or the plugin pod's error.
        assert "capacity nvidia.com/gpu 0 < 2" in inc.reason or (
            "CreateContainerError" in inc.reason and "nvidia-container-toolkit" in inc.reason
        )

        # The pod's GPU went Unknown; past unknown_timeout it is left to the node incident.
        await until(lambda: watcher.stats.left_to_node_incident == 1)
        assert rec.requests == [], "a vanished GPU must never become a per-GPU remediation"
        assert rec.nodes == []

        # A plugin restart heals it; the GPUs vanish again later: a second incident.
        [plugin] = [
            p
            for p in core.list_namespaced_pod(PLUGIN_NS).items
            if p.spec.node_name == node and "device-plugin" in p.metadata.name
        ]
        core.delete_namespaced_pod(plugin.metadata.name, PLUGIN_NS)
        await until(lambda: node not in watcher.tracker.vanished)
        manager.gpu_plugins.upgrade(node, breaks="socket")
        await until(lambda: len(incidents) == 2)
        # It healed on v1.99.1: the second vanish blames no kubelet change.
        assert incidents[1].recorded is not None
        assert incidents[1].recorded.kubelet_version == "v1.99.1"
        assert rec.requests == []


async def test_a_plugin_rollout_in_the_kubelets_grace_is_one_node_incident(
    twin: tuple[RunningTwin, ControllerManager],
) -> None:
    rs, manager = twin
    node = rs.twin.seed_info["nodes"][0]
    core = await _trainer_running(rs, node)
    version = core.read_node(node).status.node_info.kubelet_version
    watcher, rec, incidents = _watching(rs)
    async with Running(watcher):
        assert await watcher.synced()
        manager.gpu_plugins.rollout(node, breaks="nvml")
        await until(lambda: incidents)
        status = core.read_node(node).status
        assert (status.capacity["nvidia.com/gpu"], status.allocatable["nvidia.com/gpu"]) == (
            "2",
            "0",
        )
        await until(lambda: watcher.stats.left_to_node_incident == 1)
        [inc] = incidents
        assert inc.node == node and inc.expected_gpus == 2
        assert "CrashLoopBackOff" in inc.reason or "NVML" in inc.reason, inc.reason
        assert inc.recorded is not None and inc.recorded.kubelet_version == version
        assert rec.requests == [], "a GPU the plugin stopped offering is no GPU failure"


async def test_a_healthy_plugin_rollout_is_no_incident_and_no_notice(
    twin: tuple[RunningTwin, ControllerManager],
) -> None:
    rs, manager = twin
    node = rs.twin.seed_info["nodes"][0]
    core = await _trainer_running(rs, node)
    sweep = SweepActivities(Kube.from_settings(KubeSettings(kubeconfig=str(rs.kubeconfig_path))))
    watcher, rec, incidents = _watching(rs)
    async with Running(watcher):
        assert await watcher.synced()
        manager.gpu_plugins.roll_plugin(node, starts_after=1e9)  # until start_now below
        await until(lambda: rec.nodes)  # the notice: what triggers the sweep in production
        [notice] = rec.nodes
        assert notice.node == node and not notice.vanished
        report = await asyncio.to_thread(sweep.sweep, SweepClusterInput())
        assert report.plugins_starting == [node], "the sweep ran after the rollout's end"
        assert report.nodes == [] and report.findings == []
        await until(lambda: watcher.stats.left_to_node_incident >= 1)  # past unknown_timeout
        manager.gpu_plugins.start_now(node)
        await until(lambda: core.read_node(node).status.allocatable["nvidia.com/gpu"] == "2")
        assert incidents == [] and rec.requests == []
        assert node not in watcher.tracker.vanished


async def test_mig_and_time_slicing_are_no_node_incident(
    twin: tuple[RunningTwin, ControllerManager],
) -> None:
    rs, manager = twin
    first, second = rs.twin.seed_info["nodes"][:2]
    core = k8s.CoreV1Api(rs.api_client())

    def partitioned(node: str) -> bool:
        capacity = core.read_node(node).status.capacity
        return (capacity["nvidia.com/gpu"], capacity.get("nvidia.com/mig-1g.10gb")) == ("1", "7")

    manager.faults.enable_mig(first, [0])
    await until(lambda: partitioned(first))
    watcher, rec, incidents = _watching(rs)
    async with Running(watcher):
        assert await watcher.synced()
        manager.faults.share_gpus(second, 4, rename=True)  # time-slicing turned on
        await until(lambda: core.read_node(second).status.capacity["nvidia.com/gpu"] == "0")
        await until(
            lambda: _tracked(watcher, second, "status", "capacity", "nvidia.com/gpu") == "0"
        )
        await asyncio.sleep(1.0)  # what the watcher would send, it sends within this
        assert incidents == [] and rec.nodes == [] and rec.requests == []
        assert not watcher.tracker.vanished


async def test_gpus_gone_under_a_mig_repartition_are_one_incident_naming_it(
    twin: tuple[RunningTwin, ControllerManager],
) -> None:
    """The MIG manager's repartition as the API shows it: `nvidia.com/mig.config.state`
    pending (GPUs still offered: nothing sent, neither notice nor incident), then rebooting
    the node (the kubelet counts no GPU): one node incident, its reason naming the planned
    work, so the incident waits for it (bounded) instead of the watcher hiding the loss for as
    long as the label stays; the pod's Unknown GPU is left to it. Done (`success`, the GPUs
    offered again): the node is no longer vanished, and nothing more is sent."""
    rs, manager = twin
    node = rs.twin.seed_info["nodes"][0]
    core = await _trainer_running(rs, node)

    def state(value: str) -> None:
        core.patch_node(node, {"metadata": {"labels": {"nvidia.com/mig.config.state": value}}})

    watcher, rec, incidents = _watching(rs)
    async with Running(watcher):
        assert await watcher.synced()
        state("pending")
        await until(
            lambda: (
                _tracked(watcher, node, "metadata", "labels", "nvidia.com/mig.config.state")
                == "pending"
            )
        )
        await asyncio.sleep(0.5)  # what the watcher would send, it sends within this
        assert incidents == [] and rec.nodes == []
        state("rebooting")
        manager.gpu_plugins.reboot(node, starts_after=1e9)  # until start_now below
        await until(lambda: incidents)
        [inc] = incidents
        assert inc.node == node and inc.expected_gpus == 2
        assert (
            "the MIG manager is repartitioning its GPUs (nvidia.com/mig.config.state=rebooting)"
            in inc.reason
        ), inc.reason
        assert inc.planned == (
            "the MIG manager is repartitioning its GPUs (nvidia.com/mig.config.state=rebooting)"
        )
        await until(lambda: watcher.stats.left_to_node_incident >= 1)  # past unknown_timeout
        state("success")
        manager.gpu_plugins.start_now(node)
        await until(lambda: core.read_node(node).status.capacity["nvidia.com/gpu"] == "2")
        await until(lambda: node not in watcher.tracker.vanished)
        assert len(incidents) == 1 and rec.requests == [] and rec.nodes == []
