"""The twin's "after the upgrade the node forgot its GPU" story (twin/upgrade.py).

Cases:
- device plugin, `breaks=hook`: the node's kubelet version changes, `nvidia.com/gpu` capacity
  drops to 0, the plugin pod waits in CreateContainerError naming the toolkit hook, with the
  kubelet's Warning `Failed` Event; deleting the plugin pod (a restart) heals it;
- `breaks=nvml`, not healed by a restart: CrashLoopBackOff with exit 1 and the NVML message,
  a `BackOff` Event; the restarted pod breaks the same way and the GPUs stay gone;
- DRA, `breaks=socket`: the plugin pod stays Ready while the node's ResourceSlice loses every
  device; a restart republishes them;
- a plugin rollout on a running kubelet (device plugin): capacity 2 with allocatable 0 for the
  kubelet's grace, then 0; the rollout's new pod is no restart; a restart that heals within the
  grace offers the GPUs again; an upgrade (a kubelet restart) shows no grace;
- MIG, the device plugin's `mixed` strategy: a MIG-enabled GPU is offered as MIG instances,
  not as nvidia.com/gpu, and an upgrade that breaks the plugin takes both away;
- time-slicing with renameByDefault: the replicas offered as nvidia.com/gpu.shared, the old
  nvidia.com/gpu kept at 0;
- a routine kubelet restart (device plugin and DRA): the GPUs gone until the plugin registers
  again, then back, nothing recorded as broken;
- the HTTP routes refuse bad input with a 400 naming it.
"""

from __future__ import annotations

from typing import Any

from tests.twin_controllers.conftest import eventually
from twin.controllers.manager import TwinOptions
from twin.upgrade import NAMESPACE

OPTS = TwinOptions(pod_startup_seconds=1)


def _plugin(t: Any, node: str, app: str) -> dict[str, Any]:
    pods = t.core.list_namespaced_pod(
        NAMESPACE, label_selector=app, field_selector=f"spec.nodeName={node}"
    ).items
    live = [p for p in pods if p.metadata.deletion_timestamp is None]
    assert len(live) == 1, [p.metadata.name for p in pods]
    return t.api.sanitize_for_serialization(live[0])


def _capacity(t: Any, node: str) -> str | None:
    return (t.core.read_node(node).status.capacity or {}).get("nvidia.com/gpu")


def _events(t: Any, pod: dict[str, Any]) -> list[tuple[str, str, str]]:
    items = t.core.list_namespaced_event(
        NAMESPACE, field_selector=f"involvedObject.name={pod['metadata']['name']}"
    ).items
    return [(e.type, e.reason, e.message) for e in items]


def test_hook_failure_after_a_kubelet_upgrade_is_healed_by_a_restart(twin: Any) -> None:
    t = twin(OPTS, profile="device-plugin", nodes=2, gpus_per_node=2)
    node, other = t.rs.twin.seed_info["nodes"][:2]
    assert t.twin("POST", "/twin/gpu-plugins").status_code == 200
    app = "app=nvidia-device-plugin-daemonset"
    eventually(lambda: _plugin(t, node, app)["status"]["containerStatuses"][0]["ready"])
    assert _capacity(t, node) == "2"

    r = t.twin("POST", "/twin/upgrades", {"node": node, "kubelet": "v1.36.3", "breaks": "hook"})
    assert r.status_code == 201, r.text
    assert r.json()["kubelet"] == {"from": "v1.36.0", "to": "v1.36.3"}
    assert t.core.read_node(node).status.node_info.kubelet_version == "v1.36.3"
    eventually(lambda: _capacity(t, node) == "0")
    pod = _plugin(t, node, app)
    cs = pod["status"]["containerStatuses"][0]
    assert cs["ready"] is False and cs["restartCount"] == 0
    waiting = cs["state"]["waiting"]
    assert waiting["reason"] == "CreateContainerError"
    assert "error executing hook `/usr/bin/nvidia-container-toolkit`" in waiting["message"]
    assert pod["status"]["phase"] == "Pending"
    assert pod["spec"]["runtimeClassName"] == "nvidia"
    assert any(
        ty == "Warning" and reason == "Failed" and "nvidia-container-toolkit" in msg
        for ty, reason, msg in _events(t, pod)
    )
    assert _capacity(t, other) == "2"  # the other node was not upgraded

    t.core.delete_namespaced_pod(pod["metadata"]["name"], NAMESPACE)
    eventually(lambda: _capacity(t, node) == "2")
    fresh = eventually(lambda: _plugin(t, node, app))
    assert fresh["metadata"]["name"] != pod["metadata"]["name"]
    assert fresh["status"]["containerStatuses"][0]["ready"] is True
    assert t.twin("GET", "/twin/upgrades").json()["items"] == []


def test_missing_nvml_survives_a_restart_when_the_fault_says_so(twin: Any) -> None:
    t = twin(OPTS, profile="device-plugin", nodes=1, gpus_per_node=2)
    node = t.rs.twin.seed_info["nodes"][0]
    t.twin("POST", "/twin/gpu-plugins")
    app = "app=nvidia-device-plugin-daemonset"
    eventually(lambda: _plugin(t, node, app))
    body = {
        "node": node,
        "breaks": "nvml",
        "healsOnRestart": False,
        "runtime": "containerd://2.2.0",
    }
    assert t.twin("POST", "/twin/upgrades", body).status_code == 201
    eventually(lambda: _capacity(t, node) == "0")
    pod = _plugin(t, node, app)
    cs = pod["status"]["containerStatuses"][0]
    assert cs["state"]["waiting"]["reason"] == "CrashLoopBackOff"
    assert cs["lastState"]["terminated"]["exitCode"] == 1
    assert (
        "could not load NVML library: libnvidia-ml.so.1" in cs["lastState"]["terminated"]["message"]
    )
    assert cs["restartCount"] >= 1
    assert ("Warning", "BackOff") in {(ty, reason) for ty, reason, _ in _events(t, pod)}
    info = t.core.read_node(node).status.node_info
    assert info.container_runtime_version == "containerd://2.2.0"

    t.core.delete_namespaced_pod(pod["metadata"]["name"], NAMESPACE)

    def rebroken() -> bool:
        p = _plugin(t, node, app)
        return p["metadata"]["name"] != pod["metadata"]["name"] and (
            p["status"]["containerStatuses"][0]["state"].get("waiting", {}).get("reason")
            == "CrashLoopBackOff"
        )

    eventually(rebroken)
    assert _capacity(t, node) == "0"
    assert t.twin("GET", "/twin/upgrades").json()["items"][0]["restarts"] == 1
    assert t.twin("POST", "/twin/upgrades/recover", {"node": node}).status_code == 200
    eventually(lambda: _capacity(t, node) == "2")


def test_dra_socket_lost_leaves_the_plugin_ready_and_the_slice_empty(twin: Any) -> None:
    t = twin(OPTS, nodes=1, gpus_per_node=2)
    node = t.rs.twin.seed_info["nodes"][0]
    t.twin("POST", "/twin/gpu-plugins")
    app = "app.kubernetes.io/name=nvidia-dra-driver-gpu"
    eventually(lambda: _plugin(t, node, app))

    def devices() -> int:
        return sum(
            len(s.spec.devices or [])
            for s in t.dra.list_resource_slice().items
            if s.spec.node_name == node
        )

    assert devices() == 2
    assert t.twin("POST", "/twin/upgrades", {"node": node, "breaks": "socket"}).status_code == 201
    eventually(lambda: devices() == 0)
    pod = _plugin(t, node, app)
    assert pod["status"]["containerStatuses"][0]["ready"] is True
    t.core.delete_namespaced_pod(pod["metadata"]["name"], NAMESPACE)
    eventually(lambda: devices() == 2)


def test_a_controller_pass_inside_the_upgrade_does_not_heal_it(twin: Any, monkeypatch: Any) -> None:
    """The controller's pass may land between the upgrade's steps (it runs on its own thread;
    a busy machine widens the gap): it must never read the half-made upgrade as a reboot that
    republished the GPUs, which healed the fault before the GPUs vanished, so the one restart
    that should bring them back found nothing to heal (a bench round waited 180 s on CI)."""
    t = twin(OPTS, nodes=1, gpus_per_node=2)
    node = t.rs.twin.seed_info["nodes"][0]
    t.twin("POST", "/twin/gpu-plugins")
    app = "app.kubernetes.io/name=nvidia-dra-driver-gpu"
    eventually(lambda: _plugin(t, node, app))
    plugins, faults = t.manager.gpu_plugins, t.manager.faults
    real_fail = faults.fail

    def fail_after_a_pass(*args: Any, **kwargs: Any) -> Any:
        plugins._after_reboot(node)  # the controller's pass, at the worst moment
        return real_fail(*args, **kwargs)

    monkeypatch.setattr(faults, "fail", fail_after_a_pass)
    assert t.twin("POST", "/twin/upgrades", {"node": node, "breaks": "socket"}).status_code == 201
    monkeypatch.setattr(faults, "fail", real_fail)
    assert [f["node"] for f in t.twin("GET", "/twin/upgrades").json()["items"]] == [node]
    pod = _plugin(t, node, app)
    t.core.delete_namespaced_pod(pod["metadata"]["name"], NAMESPACE)
    eventually(
        lambda: (
            sum(
                len(s.spec.devices or [])
                for s in t.dra.list_resource_slice().items
                if s.spec.node_name == node
            )
            == 2
        )
    )


def test_upgrade_routes_refuse_bad_input(twin: Any) -> None:
    t = twin(OPTS, profile="device-plugin", nodes=1)
    node = t.rs.twin.seed_info["nodes"][0]
    r = t.twin("POST", "/twin/upgrades", {"node": node, "breaks": "solar-flare"})
    assert r.status_code == 400 and "breaks must be one of" in r.text
    r = t.twin("POST", "/twin/upgrades", {"node": "nope"})
    assert r.status_code == 404
    r = t.twin("POST", "/twin/upgrades", {"node": node, "color": "red"})
    assert r.status_code == 400 and "color" in r.text
    assert t.twin("POST", "/twin/upgrades", {}).status_code == 400


def _allocatable(t: Any, node: str) -> str | None:
    return (t.core.read_node(node).status.allocatable or {}).get("nvidia.com/gpu")


def test_a_plugin_rollout_keeps_the_capacity_for_the_kubelets_grace(twin: Any) -> None:
    """No kubelet restart: the kubelet's device manager marks the stopped plugin's GPUs
    unhealthy and keeps them for endpointStopGracePeriod (capacity 2, allocatable 0), then
    deletes the resource (capacity 0); the node's versions stay."""
    grace = 60.0  # simulated seconds (0.3 s at the fixture's time scale)
    t = twin(TwinOptions(pod_startup_seconds=1, plugin_stop_grace=grace), profile="device-plugin")
    node = t.rs.twin.seed_info["nodes"][0]
    t.twin("POST", "/twin/gpu-plugins")
    app = "app=nvidia-device-plugin-daemonset"
    old = eventually(lambda: _plugin(t, node, app))
    eventually(lambda: old["status"]["containerStatuses"][0]["ready"] or _plugin(t, node, app))
    before = t.core.read_node(node).status.node_info.kubelet_version
    mono = t.manager.clock.monotonic()
    r = t.twin("POST", "/twin/upgrades/rollout", {"node": node, "breaks": "nvml"})
    assert r.status_code == 201, r.text
    assert r.json()["kubeletRestarted"] is False
    assert r.json()["kubelet"] == {"from": before, "to": before}
    eventually(lambda: _allocatable(t, node) == "0")
    if t.manager.clock.monotonic() - mono < grace * 0.8:
        assert _capacity(t, node) == "2"  # in the grace: counted, none offered
    pod = eventually(lambda: _plugin(t, node, app))
    assert pod["metadata"]["name"] != old["metadata"]["name"]  # the rollout's new pod
    cs = pod["status"]["containerStatuses"][0]
    assert cs["state"]["waiting"]["reason"] == "CrashLoopBackOff"
    eventually(lambda: _capacity(t, node) == "0")  # the grace ended: the resource deleted
    assert t.manager.clock.monotonic() - mono >= grace
    assert _allocatable(t, node) == "0"
    assert t.core.read_node(node).status.node_info.kubelet_version == before
    faults = t.twin("GET", "/twin/upgrades").json()["items"]
    assert [f["restarts"] for f in faults] == [0]  # the rollout's replacement is no restart

    assert t.twin("POST", "/twin/upgrades/recover", {"node": node}).status_code == 200
    eventually(lambda: _capacity(t, node) == "2" and _allocatable(t, node) == "2")


def test_a_rollout_healed_within_the_grace_offers_the_gpus_again(twin: Any) -> None:
    t = twin(TwinOptions(pod_startup_seconds=1, plugin_stop_grace=1e6), profile="device-plugin")
    node = t.rs.twin.seed_info["nodes"][0]
    t.twin("POST", "/twin/gpu-plugins")
    app = "app=nvidia-device-plugin-daemonset"
    eventually(lambda: _plugin(t, node, app))
    body = {"node": node, "breaks": "hook", "healsOnRestart": True}
    assert t.twin("POST", "/twin/upgrades/rollout", body).status_code == 201
    eventually(lambda: _allocatable(t, node) == "0")
    assert _capacity(t, node) == "2"
    pod = eventually(lambda: _plugin(t, node, app))
    t.core.delete_namespaced_pod(pod["metadata"]["name"], NAMESPACE)  # a restart heals it
    eventually(lambda: _capacity(t, node) == "2" and _allocatable(t, node) == "2")
    assert t.manager.kubelet._plugin_stops == {}


def test_an_upgrade_after_a_rollout_shows_no_grace(twin: Any) -> None:
    """A kubelet restart reads the checkpoint: 0 until the plugin registers, no grace."""
    t = twin(TwinOptions(pod_startup_seconds=1, plugin_stop_grace=1e6), profile="device-plugin")
    node = t.rs.twin.seed_info["nodes"][0]
    t.twin("POST", "/twin/gpu-plugins")
    eventually(lambda: _plugin(t, node, "app=nvidia-device-plugin-daemonset"))
    t.twin("POST", "/twin/upgrades/rollout", {"node": node, "breaks": "nvml"})
    eventually(lambda: _allocatable(t, node) == "0")
    body = {"node": node, "kubelet": "v1.36.3", "breaks": "nvml", "healsOnRestart": False}
    assert t.twin("POST", "/twin/upgrades", body).status_code == 201
    eventually(lambda: _capacity(t, node) == "0")


def test_a_healthy_plugin_rollout_offers_no_gpu_until_the_new_pod_registers(twin: Any) -> None:
    """A DaemonSet update that breaks nothing: the old plugin pod goes, the kubelet keeps its
    GPUs in capacity with none allocatable while the new pod is ContainerCreating, then the
    new pod runs, registers, and offers them again; no restart counted, no fault left."""
    t = twin(TwinOptions(pod_startup_seconds=1, plugin_stop_grace=1e6), profile="device-plugin")
    node = t.rs.twin.seed_info["nodes"][0]
    t.twin("POST", "/twin/gpu-plugins")
    app = "app=nvidia-device-plugin-daemonset"
    old = eventually(lambda: _plugin(t, node, app))
    body = {"node": node, "startsAfter": 1e9}  # simulated seconds: until start_now
    assert t.twin("POST", "/twin/upgrades/plugin-restart", body).status_code == 202
    eventually(lambda: _allocatable(t, node) == "0")
    assert _capacity(t, node) == "2"
    new = eventually(lambda: _plugin(t, node, app))
    assert new["metadata"]["name"] != old["metadata"]["name"]
    cs = new["status"]["containerStatuses"][0]
    assert cs["state"]["waiting"]["reason"] == "ContainerCreating" and not cs["ready"]
    assert new["status"]["phase"] == "Pending"
    t.manager.gpu_plugins.start_now(node)
    eventually(lambda: _allocatable(t, node) == "2")
    assert _capacity(t, node) == "2"
    cs = _plugin(t, node, app)["status"]["containerStatuses"][0]
    assert cs["ready"] and "running" in cs["state"]
    assert t.twin("GET", "/twin/upgrades").json()["items"] == []
    assert t.manager.kubelet._plugin_stops == {}


def test_a_reboot_counts_no_gpu_until_the_new_plugin_pod_registers(twin: Any) -> None:
    """A reboot outside Sickbay: the kubelet comes back counting no GPU (no grace: its
    checkpoint); the same plugin pod's container ended with the node (restarted once, last
    state terminated Unknown, exit code 255) and is ContainerCreating; then it runs and every
    GPU is back."""
    t = twin(TwinOptions(pod_startup_seconds=1, plugin_stop_grace=1e6), profile="device-plugin")
    node = t.rs.twin.seed_info["nodes"][0]
    t.twin("POST", "/twin/gpu-plugins")
    app = "app=nvidia-device-plugin-daemonset"
    old = eventually(lambda: _plugin(t, node, app))
    eventually(lambda: _plugin(t, node, app)["status"]["containerStatuses"][0]["ready"])
    body = {"node": node, "startsAfter": 1e9}  # simulated seconds: until start_now
    assert t.twin("POST", "/twin/upgrades/reboot", body).status_code == 202
    eventually(lambda: _capacity(t, node) == "0" and _allocatable(t, node) == "0")
    pod = _plugin(t, node, app)
    assert pod["metadata"]["name"] == old["metadata"]["name"]  # the same pod
    cs = pod["status"]["containerStatuses"][0]
    assert cs["state"]["waiting"]["reason"] == "ContainerCreating" and not cs["ready"]
    assert cs["restartCount"] == 1
    ended = cs["lastState"]["terminated"]
    assert (ended["reason"], ended["exitCode"]) == ("Unknown", 255)
    t.manager.gpu_plugins.start_now(node)
    eventually(lambda: _capacity(t, node) == "2" and _allocatable(t, node) == "2")
    cs = _plugin(t, node, app)["status"]["containerStatuses"][0]
    assert cs["ready"] and cs["restartCount"] == 1
    assert cs["lastState"]["terminated"]["reason"] == "Unknown"
    assert t.twin("GET", "/twin/upgrades").json()["items"] == []


def test_plugin_restart_route_refuses_bad_input(twin: Any) -> None:
    t = twin(OPTS, profile="device-plugin", nodes=1)
    node = t.rs.twin.seed_info["nodes"][0]
    r = t.twin("POST", "/twin/upgrades/plugin-restart", {"node": node, "startsAfter": "soon"})
    assert r.status_code == 400
    r = t.twin("POST", "/twin/upgrades/plugin-restart", {"node": node, "breaks": "nvml"})
    assert r.status_code == 400 and "breaks" in r.text
    assert t.twin("POST", "/twin/upgrades/plugin-restart", {"node": "nope"}).status_code == 404
    assert t.twin("POST", "/twin/upgrades/plugin-restart", {}).status_code == 400
    r = t.twin("POST", "/twin/upgrades/reboot", {"node": node, "kubelet": "v1.99.0"})
    assert r.status_code == 400 and "kubelet" in r.text
    assert t.twin("POST", "/twin/upgrades/reboot", {"node": "nope"}).status_code == 404
    assert t.twin("POST", "/twin/upgrades/start-now", {"node": "nope"}).status_code == 404
    r = t.twin("POST", "/twin/upgrades/start-now", {"node": node, "at": 1})
    assert r.status_code == 400 and "at" in r.text
    assert t.twin("POST", "/twin/upgrades/start-now", {"node": node}).status_code == 200


def test_rollout_route_refuses_bad_input(twin: Any) -> None:
    t = twin(OPTS, profile="device-plugin", nodes=1)
    node = t.rs.twin.seed_info["nodes"][0]
    r = t.twin("POST", "/twin/upgrades/rollout", {"node": node, "breaks": "socket"})
    assert r.status_code == 400 and "kubelet restarts" in r.text
    r = t.twin("POST", "/twin/upgrades/rollout", {"node": "nope"})
    assert r.status_code == 404
    r = t.twin("POST", "/twin/upgrades/rollout", {"node": node, "kubelet": "v2"})
    assert r.status_code == 400 and "kubelet" in r.text


def test_mig_mixed_offers_the_partitioned_gpus_as_instances(twin: Any) -> None:
    """The device plugin's `mixed` strategy (GFD's own tests show the labels): a MIG-enabled
    GPU is offered as nvidia.com/mig-1g.10gb instances, not as nvidia.com/gpu, while the
    nvidia.com/gpu.count label still counts it; a plugin broken by an upgrade offers neither."""
    t = twin(OPTS, profile="device-plugin", nodes=1, gpus_per_node=2)
    node = t.rs.twin.seed_info["nodes"][0]
    t.manager.faults.enable_mig(node, [0])

    def offered() -> tuple[str | None, str | None]:
        status = t.core.read_node(node).status
        return status.capacity.get("nvidia.com/gpu"), status.capacity.get("nvidia.com/mig-1g.10gb")

    eventually(lambda: offered() == ("1", "7"))
    labels = t.core.read_node(node).metadata.labels
    assert labels["nvidia.com/mig.strategy"] == "mixed"
    assert labels["nvidia.com/gpu.count"] == "2"
    assert labels["nvidia.com/mig-1g.10gb.count"] == "7"
    assert t.manager.faults.plugin_device_ids(node) == [t.manager.faults.gpus(node)[1].uuid]

    t.twin("POST", "/twin/gpu-plugins")
    eventually(lambda: _plugin(t, node, "app=nvidia-device-plugin-daemonset"))
    t.twin("POST", "/twin/upgrades", {"node": node, "kubelet": "v1.36.3", "breaks": "hook"})
    eventually(lambda: offered() == ("0", "0"))
    t.twin("POST", "/twin/upgrades/recover", {"node": node})
    eventually(lambda: offered() == ("1", "7"))
    t.manager.faults.enable_mig(node, [])  # MIG off again: whole GPUs only
    eventually(lambda: offered() == ("2", "0"))


def test_time_slicing_renamed_offers_replicas_as_gpu_shared(twin: Any) -> None:
    """Time-slicing with renameByDefault (the device plugin's sharing config, GFD's labels):
    2 GPUs x 4 replicas offered as nvidia.com/gpu.shared; the nvidia.com/gpu the node had
    registered stays in capacity at 0; the count label still says 2."""
    t = twin(OPTS, profile="device-plugin", nodes=1, gpus_per_node=2)
    node = t.rs.twin.seed_info["nodes"][0]
    eventually(lambda: _capacity(t, node) == "2")
    t.manager.faults.share_gpus(node, 4, rename=True)

    def offered() -> tuple[str | None, str | None]:
        capacity = t.core.read_node(node).status.capacity
        return capacity.get("nvidia.com/gpu"), capacity.get("nvidia.com/gpu.shared")

    eventually(lambda: offered() == ("0", "8"))
    labels = t.core.read_node(node).metadata.labels
    assert labels["nvidia.com/gpu.replicas"] == "4" and labels["nvidia.com/gpu.count"] == "2"
    assert labels["nvidia.com/gpu.product"].endswith("-SHARED")
    t.manager.faults.share_gpus(node, 1)  # sharing off: whole GPUs again
    eventually(lambda: offered() == ("2", "0"))


def test_a_routine_kubelet_restart_hides_the_gpus_for_a_moment(twin: Any) -> None:
    """No upgrade, nothing broken: the restarted kubelet deletes the node's ResourceSlices
    (DRA) or counts the device plugin's GPUs 0 until the running plugin registers again."""
    t = twin(OPTS, profile="device-plugin", nodes=1, gpus_per_node=2)
    node = t.rs.twin.seed_info["nodes"][0]
    eventually(lambda: _capacity(t, node) == "2")
    t.manager.faults.fail(node, "1", xid=79)  # a dead GPU stays dead through the restart
    eventually(lambda: _allocatable(t, node) == "1")
    mono = t.manager.clock.monotonic()
    r = t.twin("POST", "/twin/upgrades/kubelet-restart", {"node": node, "republishAfter": 100})
    assert r.status_code == 202, r.text
    eventually(lambda: _capacity(t, node) == "1")  # the healthy GPU hidden, the dead one kept
    eventually(lambda: _capacity(t, node) == "2")
    assert t.manager.clock.monotonic() - mono >= 100
    assert _allocatable(t, node) == "1"
    assert [f.xid for f in t.manager.faults.faults()] == [79]
    assert t.twin("GET", "/twin/upgrades").json()["items"] == []  # nothing broke

    d = twin(OPTS, profile="1.36", nodes=1, gpus_per_node=2)
    dnode = d.rs.twin.seed_info["nodes"][0]

    def published() -> int:
        items = d.rs.twin.store.list("resourceslices").items
        return sum(
            len(p["spec"].get("devices") or []) for p in items if p["spec"]["nodeName"] == dnode
        )

    eventually(lambda: published() > 0)
    full = published()
    d.twin("POST", "/twin/upgrades/kubelet-restart", {"node": dnode, "republishAfter": 100})
    eventually(lambda: published() == 0)
    eventually(lambda: published() == full)
    r = d.twin("POST", "/twin/upgrades/kubelet-restart", {"node": "nope"})
    assert r.status_code == 404
