"""The node incident's activities (activities/kube/node_diagnosis.py) against the twin with its
controllers and its GPU plugin pods (twin/upgrade.py).

Cases:
- diagnose, device plugin, toolkit hook broken by a kubelet upgrade: capacity 0 of 2, the
  plugin pod's CreateContainerError and its `Failed` Event read, cause `toolkit-hook`, not
  restartable, the summary naming the kubelet change (from what Sickbay recorded) and the
  other nodes of the pool still on the old version; a healthy node: not vanished; a second
  node of the pool losing its GPUs too is named in `pool_vanished`;
- diagnose, DRA, lost socket: the slice lost its devices, the plugin is Ready: cause
  `driver-not-publishing`, restartable;
- diagnose, device plugin, a plugin rollout on a running kubelet (nvml), in the kubelet's
  grace (capacity 2, allocatable 0): vanished, cause `nvml-missing`, the summary saying 0 of 2
  GPUs offered and why the capacity still counts them, no kubelet change blamed; a second node
  of the pool in its grace is named in `pool_vanished`;
- diagnose, device plugin, MIG on the `mixed` strategy (one of two GPUs MIG-enabled: 1
  nvidia.com/gpu, 7 MIG instances, the count label 2): not vanished, nor is a second node so
  partitioned short of GPUs for the pool; the same node after an upgrade broke its plugin:
  vanished; while the MIG manager repartitions it (mig.config.state pending): not vanished,
  the planned work named (its GPUs are gone: the incident waits for it);
- diagnose, device plugin, a node whose plugin broke and which the Cluster Autoscaler is
  removing (its ToBeDeletedByClusterAutoscaler taint): not vanished, the summary says who is
  removing it (without the taint: vanished); a peer being removed is not in `pool_vanished`;
  the same while the GPU Operator upgrades its driver (nvidia.com/gpu-driver-upgrade-state
  pod-restart-required); once the upgrade failed: vanished, its cause named;
- diagnose, device plugin, time-slicing renamed to nvidia.com/gpu.shared (2 GPUs x 4, the old
  nvidia.com/gpu at 0): 8 replicas published, not vanished; the GPUs back counted once each;
- contain and release: the condition GPUDevicesAvailable=False with the reason, Sickbay's
  NoSchedule taint (annotated); release sets the condition True and removes only its taint;
  a taint someone else set is left alone;
- restart-gpu-plugin: deletes the plugin pod once per attempt: the same attempt run again (a
  retried activity) deletes nothing more, though the DaemonSet's new pod is there; the next
  attempt restarts again; wait-for-gpus-back answers StillWaiting, then the GPUs once back;
- find-gpu-pods-on-node: the pods asking for nvidia.com/gpu (or a MIG instance, or a
  time-slice replica as nvidia.com/gpu.shared), not the CPU pod nor the plugin;
  their top owners (a ReplicaSet's pod: its Deployment, read through the ReplicaSet; a
  StatefulSet's pod: the StatefulSet) once each, and the pod without an owner named apart;

Every case runs through a proxy enforcing the roles deploy/rbac*.yaml ship: nothing the node
incident asks is refused.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from temporalio.exceptions import ApplicationError

from activities.kube.node_diagnosis import NodeIncidentActivities
from contract.errors import ERR_STILL_WAITING
from contract.names import NODE_TAINT_KEY
from contract.node_incident import (
    ContainNodeInput,
    DiagnoseNodeInput,
    GpuPodsInput,
    GpusBackResult,
    RecordedNode,
    ReleaseNodeInput,
    RestartPluginInput,
    WaitGpusBackInput,
)
from tests.activities.kube.conftest import KubeTwin, twin
from tests.activities.kube.rbac_proxy import deploy_rules
from tests.waiting import until
from twin.clock import Clock
from twin.controllers.manager import ControllerManager, TwinOptions
from twin.upgrade import NAMESPACE

WAIT = 30.0


@pytest.fixture
def make(tmp_path: Path) -> Iterator[Any]:
    stack: list[Any] = []

    def start(
        profile: str, options: TwinOptions | None = None, **seed: Any
    ) -> tuple[KubeTwin, NodeIncidentActivities]:
        cm = twin(
            tmp_path,
            profile,
            controllers=ControllerManager(options or TwinOptions(pod_startup_seconds=1)),
            clock=Clock(time_scale=20),
            proxy_rules=deploy_rules(),
            **seed,
        )
        t = cm.__enter__()
        stack.append(cm)
        t.twin.extensions["gpu_plugins"].install()
        acts = NodeIncidentActivities(t.acts.kube)
        stack.append(acts)
        return t, acts

    yield start
    for item in reversed(stack):
        if isinstance(item, NodeIncidentActivities):
            item.close()
        else:
            item.__exit__(None, None, None)


def _plugin_pods(t: KubeTwin, node: str) -> list[dict[str, Any]]:
    return [
        p
        for p in t.store.list("pods", namespace=NAMESPACE).items
        if p["spec"].get("nodeName") == node
        and "validator" not in p["metadata"]["name"]
        and not p["metadata"].get("deletionTimestamp")
    ]


def _upgrade(t: KubeTwin, node: str, **kw: Any) -> Any:
    return t.twin.extensions["gpu_plugins"].upgrade(node, **kw)


async def test_diagnose_names_the_hook_and_the_kubelet_change(make: Any) -> None:
    t, acts = make("device-plugin", nodes=3)
    node = t.node(0)
    await until(lambda: len(_plugin_pods(t, node)) == 1)
    healthy = await t.run(acts.diagnose_node, DiagnoseNodeInput(node=node, expected_gpus=2))
    assert not healthy.vanished and healthy.capacity == 2

    before = t.store.get("nodes", node)["status"]["nodeInfo"]["kubeletVersion"]
    _upgrade(t, node, kubelet="v1.37.1", breaks="hook")
    await until(lambda: t.store.get("nodes", node)["status"]["capacity"]["nvidia.com/gpu"] == "0")
    d = await t.run(
        acts.diagnose_node,
        DiagnoseNodeInput(node=node, recorded=RecordedNode(kubelet_version=before, gpu_count=2)),
    )
    assert d.vanished and d.mode == "device-plugin"
    assert (d.capacity, d.expected_gpus) == (0, 2)
    assert d.cause == "toolkit-hook" and not d.restartable
    [plugin] = [p for p in d.plugin_pods if p.component == "device-plugin"]
    assert plugin.waiting_reason == "CreateContainerError"
    assert "/usr/bin/nvidia-container-toolkit" in plugin.waiting_message
    assert any(e.startswith("Failed: ") for e in plugin.events)
    assert plugin.runtime_class == "nvidia"
    assert d.kubelet_version == "v1.37.1"
    assert f"since its kubelet went from {before} to v1.37.1" in d.summary
    assert d.peers == {before: 2}
    assert f"2 other nodes of the pool run {before}" in d.summary
    assert "(0 of 2 GPUs published)" in d.summary
    assert d.pool_vanished == []

    # The rollout goes on: a second node of the pool loses its GPUs too (pool incident input).
    second = t.node(1)
    _upgrade(t, second, kubelet="v1.37.1", breaks="hook")
    await until(lambda: t.store.get("nodes", second)["status"]["capacity"]["nvidia.com/gpu"] == "0")
    d2 = await t.run(acts.diagnose_node, DiagnoseNodeInput(node=node))
    assert d2.pool_vanished == [second]
    assert d2.peers == {before: 1, "v1.37.1": 1}


async def test_diagnose_in_the_kubelets_grace_after_a_plugin_rollout(make: Any) -> None:
    grace = TwinOptions(pod_startup_seconds=1, plugin_stop_grace=1e6)
    t, acts = make("device-plugin", options=grace, nodes=3)
    node, second = t.node(0), t.node(1)
    await until(lambda: len(_plugin_pods(t, node)) == 1 and len(_plugin_pods(t, second)) == 1)
    plugins = t.twin.extensions["gpu_plugins"]
    before = t.store.get("nodes", node)["status"]["nodeInfo"]["kubeletVersion"]
    for n in (node, second):
        plugins.rollout(n, breaks="nvml")

    def in_grace(n: str) -> bool:
        st = t.store.get("nodes", n)["status"]
        return (st["capacity"]["nvidia.com/gpu"], st["allocatable"]["nvidia.com/gpu"]) == (
            "2",
            "0",
        )

    await until(lambda: in_grace(node) and in_grace(second))
    d = await t.run(
        acts.diagnose_node,
        DiagnoseNodeInput(node=node, recorded=RecordedNode(kubelet_version=before, gpu_count=2)),
    )
    assert d.vanished and d.mode == "device-plugin"
    assert (d.capacity, d.allocatable, d.expected_gpus) == (2, 0, 2)
    assert d.cause == "nvml-missing" and not d.restartable
    assert d.gpu_uuids == []
    assert "(0 of 2 GPUs offered" in d.summary, d.summary
    assert "published" not in d.summary.rsplit("(", 1)[-1], d.summary
    assert "kubelet went from" not in d.summary
    assert d.pool_vanished == [second]


async def test_diagnose_mig_mixed_partitioning_is_no_vanish(make: Any) -> None:
    t, acts = make("device-plugin", nodes=2)
    node, second = t.node(0), t.node(1)
    await until(lambda: len(_plugin_pods(t, node)) == 1)
    for n in (node, second):
        t.twin.extensions["faults"].enable_mig(n, [0])

    def partitioned(n: str) -> bool:
        capacity = t.store.get("nodes", n)["status"]["capacity"]
        return (capacity["nvidia.com/gpu"], capacity.get("nvidia.com/mig-1g.10gb")) == ("1", "7")

    await until(lambda: partitioned(node) and partitioned(second))
    d = await t.run(acts.diagnose_node, DiagnoseNodeInput(node=node))
    assert d.expected_gpus == 2 and d.capacity == 1
    assert not d.vanished, d.summary
    assert "1 whole GPU(s) and 7 MIG instance(s)" in d.summary
    assert d.pool_vanished == []

    _upgrade(t, node, kubelet="v1.37.1", breaks="hook")
    await until(lambda: t.store.get("nodes", node)["status"]["capacity"]["nvidia.com/gpu"] == "0")
    await until(
        lambda: t.store.get("nodes", node)["status"]["capacity"]["nvidia.com/mig-1g.10gb"] == "0"
    )
    d = await t.run(acts.diagnose_node, DiagnoseNodeInput(node=node))
    assert d.vanished and d.cause == "toolkit-hook"
    assert "(0 of 2 GPUs published)" in d.summary

    # The MIG manager repartitioning the node (its plugins stopped on purpose): no vanish.
    def pending(obj: dict[str, Any]) -> None:
        obj["metadata"]["labels"]["nvidia.com/mig.config.state"] = "pending"

    t.store.mutate("nodes", node, pending)
    d = await t.run(acts.diagnose_node, DiagnoseNodeInput(node=node))
    assert not d.vanished, d.summary
    assert "MIG manager is repartitioning" in d.summary
    # its GPUs gone under it: the planned work named (the incident waits for it, bounded)
    assert d.planned_work == (
        "the MIG manager is repartitioning its GPUs (nvidia.com/mig.config.state=pending)"
    )


async def test_diagnose_a_node_being_removed_is_no_vanish(make: Any) -> None:
    t, acts = make("device-plugin", nodes=3)
    node, second = t.node(0), t.node(1)
    await until(lambda: len(_plugin_pods(t, node)) == 1 and len(_plugin_pods(t, second)) == 1)
    for n in (node, second):
        _upgrade(t, n, kubelet="v1.37.1", breaks="hook")
    await until(
        lambda: all(
            t.store.get("nodes", n)["status"]["capacity"]["nvidia.com/gpu"] == "0"
            for n in (node, second)
        )
    )
    d = await t.run(acts.diagnose_node, DiagnoseNodeInput(node=node))
    assert d.vanished  # the control: broken, and nobody is removing it
    assert d.pool_vanished == [second]

    def removing(obj: dict[str, Any]) -> None:  # the Cluster Autoscaler scales it down
        taint = {"key": "ToBeDeletedByClusterAutoscaler", "value": "1", "effect": "NoSchedule"}
        obj.setdefault("spec", {}).setdefault("taints", []).append(taint)

    t.store.mutate("nodes", second, removing)  # a peer being removed is no pool incident
    d = await t.run(acts.diagnose_node, DiagnoseNodeInput(node=node))
    assert d.vanished and d.pool_vanished == []
    t.store.mutate("nodes", node, removing)
    d = await t.run(acts.diagnose_node, DiagnoseNodeInput(node=node))
    assert not d.vanished, d.summary
    assert "the Cluster Autoscaler is removing node" in d.summary, d.summary


async def test_diagnose_a_driver_upgrade_at_work_is_no_vanish(make: Any) -> None:
    t, acts = make("device-plugin", nodes=2)
    node = t.node(0)
    await until(lambda: len(_plugin_pods(t, node)) == 1)
    _upgrade(t, node, kubelet="v1.37.1", breaks="nvml")  # the driver unloaded, as mid-upgrade
    await until(lambda: t.store.get("nodes", node)["status"]["capacity"]["nvidia.com/gpu"] == "0")

    def state(value: str) -> Any:
        def label(obj: dict[str, Any]) -> None:
            obj["metadata"]["labels"]["nvidia.com/gpu-driver-upgrade-state"] = value

        return label

    t.store.mutate("nodes", node, state("pod-restart-required"))
    d = await t.run(acts.diagnose_node, DiagnoseNodeInput(node=node))
    assert not d.vanished, d.summary
    assert "the GPU Operator is upgrading the driver" in d.summary, d.summary
    t.store.mutate("nodes", node, state("upgrade-failed"))  # the upgrade left it broken
    d = await t.run(acts.diagnose_node, DiagnoseNodeInput(node=node))
    assert d.vanished and d.cause != "unknown", d.summary


async def test_diagnose_time_slicing_counts_gpus_not_replicas(make: Any) -> None:
    t, acts = make("device-plugin", nodes=1)
    node = t.node(0)
    await until(lambda: len(_plugin_pods(t, node)) == 1)
    t.twin.extensions["faults"].share_gpus(node, 4, rename=True)
    await until(
        lambda: t.store.get("nodes", node)["status"]["capacity"].get("nvidia.com/gpu.shared") == "8"
    )
    assert t.store.get("nodes", node)["status"]["capacity"]["nvidia.com/gpu"] == "0"
    d = await t.run(acts.diagnose_node, DiagnoseNodeInput(node=node))
    assert (d.capacity, d.allocatable, d.expected_gpus) == (8, 8, 2)  # replicas offered
    assert not d.vanished, d.summary
    assert "publishes 8 GPU replica(s) (4 per GPU)" in d.summary
    back = await t.run(acts.wait_for_gpus_back, WaitGpusBackInput(node=node, expected_gpus=2))
    assert len(back.gpu_uuids) == 2


async def test_diagnose_dra_lost_socket_is_restartable(make: Any) -> None:
    t, acts = make("1.36", nodes=1)
    node = t.node(0)
    await until(lambda: len(_plugin_pods(t, node)) == 1)
    _upgrade(t, node, breaks="socket")
    d = await t.run(acts.diagnose_node, DiagnoseNodeInput(node=node, expected_gpus=2))
    assert d.mode == "dra" and d.published == 0 and d.vanished
    assert d.cause == "driver-not-publishing" and d.restartable
    assert "publishes fewer GPUs" in d.summary


async def test_contain_and_release_touch_only_what_sickbay_set(make: Any) -> None:
    t, acts = make("device-plugin", nodes=2)
    node, other = t.node(0), t.node(1)
    inp = ContainNodeInput(
        node=node, workflow_id="sickbay-node-x", reason="ToolkitHook", message="the hook fails"
    )
    res = await t.run(acts.contain_node, inp)
    assert res.changed
    again = await t.run(acts.contain_node, inp)
    assert not again.changed
    obj = t.store.get("nodes", node)
    [cond] = [c for c in obj["status"]["conditions"] if c["type"] == "GPUDevicesAvailable"]
    assert (cond["status"], cond["reason"], cond["message"]) == (
        "False",
        "ToolkitHook",
        "the hook fails",
    )
    assert any(c["type"] == "Ready" for c in obj["status"]["conditions"])  # kubelet's stays
    assert {"key": NODE_TAINT_KEY, "value": "true", "effect": "NoSchedule"} in obj["spec"]["taints"]

    # Someone else's taint of the same key on the other node is never removed.
    t.store.mutate(
        "nodes",
        other,
        lambda o: o["spec"].update(taints=[{"key": NODE_TAINT_KEY, "effect": "NoSchedule"}]),
    )
    await t.run(acts.release_node, ReleaseNodeInput(node=other, workflow_id="sickbay-node-x"))
    assert t.store.get("nodes", other)["spec"]["taints"]

    rel = await t.run(acts.release_node, ReleaseNodeInput(node=node, workflow_id="sickbay-node-x"))
    assert rel.changed
    obj = t.store.get("nodes", node)
    assert not [x for x in obj["spec"].get("taints") or [] if x["key"] == NODE_TAINT_KEY]
    [cond] = [c for c in obj["status"]["conditions"] if c["type"] == "GPUDevicesAvailable"]
    assert cond["status"] == "True"


async def test_restart_once_per_attempt_then_gpus_back(make: Any) -> None:
    t, acts = make("device-plugin", nodes=1)
    node = t.node(0)
    await until(lambda: len(_plugin_pods(t, node)) == 1)
    _upgrade(t, node, breaks="socket")
    await until(lambda: t.store.get("nodes", node)["status"]["capacity"]["nvidia.com/gpu"] == "0")
    with pytest.raises(ApplicationError) as err:
        await t.run(acts.wait_for_gpus_back, WaitGpusBackInput(node=node, expected_gpus=2))
    assert err.value.type == ERR_STILL_WAITING and "0 of 2" in str(err.value)

    [old] = _plugin_pods(t, node)
    inp = RestartPluginInput(node=node, workflow_id="sickbay-node-x", attempt=1)
    first = await t.run(acts.restart_gpu_plugin, inp)
    assert first.restarted == [f"{NAMESPACE}/{old['metadata']['name']}"] and not first.already
    [new] = await until(
        lambda: [p for p in _plugin_pods(t, node) if p["metadata"]["uid"] != old["metadata"]["uid"]]
    )
    again = await t.run(acts.restart_gpu_plugin, inp)  # a retried activity
    assert again.already and again.restarted == []
    assert [p["metadata"]["uid"] for p in _plugin_pods(t, node)] == [new["metadata"]["uid"]]

    back: GpusBackResult | None = None
    deadline = time.monotonic() + WAIT
    while back is None:
        try:
            back = await t.run(
                acts.wait_for_gpus_back, WaitGpusBackInput(node=node, expected_gpus=2)
            )
        except ApplicationError as e:
            assert e.type == ERR_STILL_WAITING and time.monotonic() < deadline
            await asyncio.sleep(0.1)
    assert len(back.gpu_uuids) == 2 and back.mode == "device-plugin"

    nxt = await t.run(acts.restart_gpu_plugin, inp.model_copy(update={"attempt": 2}))
    assert nxt.restarted == [f"{NAMESPACE}/{new['metadata']['name']}"]


async def test_find_gpu_pods_lists_the_workloads_holding_gpus(make: Any) -> None:
    t, acts = make("device-plugin", nodes=1, gpus_per_node=4)
    node = t.node(0)
    ns = "ml"
    t.namespace(ns)

    def pod(name: str, gpus: int, resource: str = "nvidia.com/gpu") -> dict[str, Any]:
        res = {"limits": {resource: str(gpus)}} if gpus else {}
        return {
            "metadata": {"name": name, "namespace": ns},
            "spec": {
                "nodeName": node,
                "containers": [{"name": "m", "image": "x", "resources": res}],
            },
        }

    def workload(kind: str, name: str) -> dict[str, Any]:
        template = pod(name, 1)
        template["metadata"] = {"labels": {"app": name}}
        template["spec"].pop("nodeName")
        template["spec"]["nodeSelector"] = {"kubernetes.io/hostname": node}
        spec: dict[str, Any] = {
            "replicas": 1,
            "selector": {"matchLabels": {"app": name}},
            "template": template,
        }
        if kind == "statefulsets":
            spec["serviceName"] = name
        return {"metadata": {"name": name, "namespace": ns}, "spec": spec}

    t.store.create("pods", pod("trainer", 1), namespace=ns)
    t.store.create("pods", pod("web", 0), namespace=ns)
    t.store.create("pods", pod("mig", 1, "nvidia.com/mig-1g.10gb"), namespace=ns)
    t.store.create("pods", pod("shared", 1, "nvidia.com/gpu.shared"), namespace=ns)
    dep = t.store.create("deployments", workload("deployments", "infer"), namespace=ns)
    sts = t.store.create("statefulsets", workload("statefulsets", "llm"), namespace=ns)

    def on_node() -> list[str]:
        return sorted(
            p["metadata"]["name"]
            for p in t.store.list("pods", namespace=ns).items
            if (p.get("spec") or {}).get("nodeName") == node
        )

    names = await until(lambda: (lambda got: got if len(got) == 6 else None)(on_node()))
    infer = next(n for n in names if n.startswith("infer-"))
    await until(lambda: len(_plugin_pods(t, node)) == 1)  # the GPU plugin pod: never listed
    found = await t.run(acts.find_gpu_pods, GpuPodsInput(node=node))
    assert [(p.namespace, p.name) for p in found.pods] == [
        (ns, infer),
        (ns, "llm-0"),
        (ns, "mig"),  # a MIG instance, a time-slice replica: the node's GPUs too
        (ns, "shared"),
        (ns, "trainer"),
    ]
    assert [(o.kind, o.name, o.uid) for o in found.owners] == [
        ("Deployment", "infer", dep["metadata"]["uid"]),
        ("StatefulSet", "llm", sts["metadata"]["uid"]),
    ]
    assert [p.name for p in found.bare] == ["mig", "shared", "trainer"]


async def test_a_healed_break_s_events_do_not_name_today_s_cause(make: Any) -> None:
    """The hook broke and was fixed (the plugin pod Ready again, its Failed Events still
    listed); the next upgrade loses the socket: restartable, not `toolkit-hook`."""
    t, acts = make("device-plugin", nodes=1)
    node = t.node(0)
    await until(lambda: len(_plugin_pods(t, node)) == 1)
    _upgrade(t, node, breaks="hook")
    t.twin.extensions["gpu_plugins"].recover(node)
    await until(lambda: t.store.get("nodes", node)["status"]["capacity"]["nvidia.com/gpu"] == "2")
    _upgrade(t, node, breaks="socket")
    await until(lambda: t.store.get("nodes", node)["status"]["capacity"]["nvidia.com/gpu"] == "0")
    d = await t.run(acts.diagnose_node, DiagnoseNodeInput(node=node, expected_gpus=2))
    [plugin] = [p for p in d.plugin_pods if p.component == "device-plugin"]
    assert plugin.ready and any(e.startswith("Failed: ") for e in plugin.events)  # history
    assert d.cause == "plugin-not-registered" and d.restartable
