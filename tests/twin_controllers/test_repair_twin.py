"""The twin's model of repair (twin/controllers/repair_tools.py).

Cases:
- reset tool (`nvidia-smi -r -i <UUID>` in a privileged pod pinned to the node): Xid 48 is
  cleared and the pod Succeeds with nvidia-smi's words in its log; Xid 79 fails (exit 15, GPU
  lost) and stays; Xid 64 (row-remap failure) "resets" but the fault stays; an unprivileged
  pod gets exit 4; a pod holding the GPU (DRA claim, or a time-sliced sibling on the same
  physical GPU) makes the reset fail with exit 255 naming it;
- NVSwitch (HGX) pools: the slice devices carry `sickbay.dev/resetGroup`; resetting one GPU of
  the baseboard fails (exit 3), resetting every GPU of it succeeds; the device-plugin node
  carries the `sickbay.dev/gpu-reset-group: node` label;
- diag tool (`dcgmi diag -r N`): DRA, a claim selecting the device by uuid -> Pass on a healthy
  device, Fail (exit 1, FallbackToLogsOnError message) on a degraded one; device plugin, the
  GPU by `NVIDIA_VISIBLE_DEVICES` -> the same;
- reboot: NotReady with the slice withdrawn (DRA) / GPU capacity 0 (device plugin), then Ready
  with the devices back, Xid 79 cleared, Xid 64 not;
- replace: the node goes, the pool brings a new node under a new name with new GPU UUIDs.
"""

from __future__ import annotations

from typing import Any

import pytest
from kubernetes import client

from tests.twin_controllers.conftest import TIME_SCALE, eventually
from tests.twin_controllers.helpers import DRIVER, condition
from twin.controllers.manager import TwinOptions

OPTS = TwinOptions(pod_startup_seconds=1, reboot_seconds=20, provisioning_delay=10)


def _uuids(t: Any, node: str) -> list[str]:
    return [g.uuid for g in t.manager.faults.gpus(node)]


def _tool_pod(
    name: str,
    node: str,
    argv: list[str],
    privileged: bool = True,
    env: dict[str, str] | None = None,
    claim: str | None = None,
) -> dict[str, Any]:
    container: dict[str, Any] = {
        "name": "tool",
        "image": "nvcr.io/nvidia/cuda:12.8.1-base-ubuntu24.04",
        "command": argv,
        "securityContext": {"privileged": privileged},
        "terminationMessagePolicy": "FallbackToLogsOnError",
        "env": [{"name": k, "value": v} for k, v in (env or {}).items()],
    }
    spec: dict[str, Any] = {"restartPolicy": "Never", "nodeName": node, "containers": [container]}
    if claim:
        container["resources"] = {"claims": [{"name": "gpu"}]}
        spec["resourceClaims"] = [{"name": "gpu", "resourceClaimName": claim}]
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name}, "spec": spec}


def _finished(t: Any, ns: str, name: str) -> Any:
    def done() -> Any:
        pod = t.core.read_namespaced_pod(name, ns)
        return pod if pod.status.phase in ("Succeeded", "Failed") else None

    pod = eventually(done)
    term = pod.status.container_statuses[0].state.terminated
    return pod, term, t.core.read_namespaced_pod_log(name, ns)


def _claim_for(name: str, uuid: str) -> dict[str, Any]:
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"name": name},
        "spec": {
            "devices": {
                "requests": [
                    {
                        "name": "gpu",
                        "exactly": {
                            "deviceClassName": DRIVER,
                            "selectors": [
                                {
                                    "cel": {
                                        "expression": (
                                            f"device.attributes['{DRIVER}'].uuid == '{uuid}'"
                                        )
                                    }
                                }
                            ],
                            "tolerations": [{"key": "sickbay.dev/unhealthy", "operator": "Exists"}],
                        },
                    }
                ]
            }
        },
    }


@pytest.mark.parametrize("profile", ["1.36", "device-plugin"])
def test_reset_clears_a_resettable_fault(twin: Any, profile: str) -> None:
    t = twin(OPTS, profile=profile)
    ns, node = t.namespace(), t.rs.twin.seed_info["nodes"][0]
    uuid = _uuids(t, node)[0]
    t.manager.faults.fail(node, uuid, xid=48)
    t.core.create_namespaced_pod(ns, _tool_pod("reset", node, ["nvidia-smi", "-r", "-i", uuid]))
    pod, term, log = _finished(t, ns, "reset")
    assert (pod.status.phase, term.exit_code) == ("Succeeded", 0)
    assert "was successfully reset" in log
    assert not [f for f in t.manager.faults.faults() if f.gpu_uuid == uuid]


@pytest.mark.parametrize(("xid", "code"), [(79, 15), (64, 0)])
def test_reset_leaves_faults_it_cannot_clear(twin: Any, xid: int, code: int) -> None:
    t = twin(OPTS, profile="1.36")
    ns, node = t.namespace(), t.rs.twin.seed_info["nodes"][0]
    uuid = _uuids(t, node)[0]
    t.manager.faults.fail(node, uuid, xid=xid)
    t.core.create_namespaced_pod(ns, _tool_pod("reset", node, ["nvidia-smi", "-r", "-i", uuid]))
    _pod, term, log = _finished(t, ns, "reset")
    assert term.exit_code == code, log
    if xid == 79:
        assert "GPU is lost" in log and "GPU is lost" in term.message
    assert [f.xid for f in t.manager.faults.faults() if f.gpu_uuid == uuid] == [xid]


def test_reset_needs_a_privileged_container(twin: Any) -> None:
    t = twin(OPTS, profile="1.36")
    ns, node = t.namespace(), t.rs.twin.seed_info["nodes"][0]
    uuid = _uuids(t, node)[0]
    t.manager.faults.fail(node, uuid, xid=48)
    pod = _tool_pod("reset", node, ["sh", "-c", f"nvidia-smi -r -i {uuid}"], privileged=False)
    t.core.create_namespaced_pod(ns, pod)
    _pod, term, log = _finished(t, ns, "reset")
    assert term.exit_code == 4 and "Insufficient Permissions" in log
    assert [f.xid for f in t.manager.faults.faults()] == [48]


@pytest.mark.parametrize("topology", ["full", "timeslice"])
def test_reset_refuses_while_another_pod_holds_the_gpu(twin: Any, topology: str) -> None:
    t = twin(OPTS, profile="1.36", topology=topology)
    ns, node = t.namespace(), t.rs.twin.seed_info["nodes"][0]
    gpu = t.manager.faults.gpus(node)[0]
    t.manager.faults.fail(node, gpu.uuid, xid=48)
    # A consumer of the GPU (time-slicing: of one of its replicas, which share the uuid).
    t.dra.create_namespaced_resource_claim(ns, _claim_for("holder", gpu.uuid))
    holder = _tool_pod("holder", node, ["sleep", "infinity"], claim="holder")
    holder["spec"].pop("nodeName")
    holder["spec"]["restartPolicy"] = "Always"  # crash-looping on the dead GPU, still holding it
    t.core.create_namespaced_pod(ns, holder)
    eventually(lambda: t.core.read_namespaced_pod("holder", ns).status.phase == "Running")
    t.core.create_namespaced_pod(ns, _tool_pod("reset", node, ["nvidia-smi", "-r", "-i", gpu.uuid]))
    _pod, term, log = _finished(t, ns, "reset")
    assert term.exit_code == 255 and f"{ns}/holder" in log
    assert [f.xid for f in t.manager.faults.faults()] == [48]


def test_nvswitch_reset_group(twin: Any) -> None:
    t = twin(OPTS, profile="1.36", gpus_per_node=4, nvswitch=True)
    ns, node = t.namespace(), t.rs.twin.seed_info["nodes"][0]
    uuids = _uuids(t, node)
    slices = t.dra.list_resource_slice(field_selector=f"spec.nodeName={node}").items
    groups = {d.attributes["sickbay.dev/resetGroup"].string for d in slices[0].spec.devices}
    assert groups == {f"{node}/baseboard-0"}
    t.manager.faults.fail(node, uuids[1], xid=95)
    t.core.create_namespaced_pod(ns, _tool_pod("one", node, ["nvidia-smi", "-r", "-i", uuids[1]]))
    _pod, term, log = _finished(t, ns, "one")
    assert term.exit_code == 3 and "reset group" in log
    t.core.create_namespaced_pod(
        ns, _tool_pod("all", node, ["nvidia-smi", "-r", "-i", ",".join(uuids)])
    )
    _pod, term, log = _finished(t, ns, "all")
    assert term.exit_code == 0 and log.count("successfully reset") == 4
    assert t.manager.faults.faults() == []


def test_nvswitch_label_on_device_plugin_nodes(twin: Any) -> None:
    t = twin(OPTS, profile="device-plugin", nvswitch=True)
    node = t.core.read_node(t.rs.twin.seed_info["nodes"][0])
    assert node.metadata.labels["sickbay.dev/gpu-reset-group"] == "node"


def test_diag_on_dra_follows_the_device_health(twin: Any) -> None:
    t = twin(OPTS, profile="1.36")
    ns, node = t.namespace(), t.rs.twin.seed_info["nodes"][0]
    uuid = _uuids(t, node)[0]
    for name, degrade in (("healthy", None), ("degraded", "ecc-sbe")):
        if degrade:
            t.manager.faults.fail(node, uuid, degrade=degrade)
        t.dra.create_namespaced_resource_claim(ns, _claim_for(f"c-{name}", uuid))
        pod = _tool_pod(name, node, ["dcgmi", "diag", "-r", "2"], claim=f"c-{name}")
        pod["spec"].pop("nodeName")  # the scheduler places it where the claim's device is
        t.core.create_namespaced_pod(ns, pod)
        _pod, term, log = _finished(t, ns, name)
        if degrade:
            assert term.exit_code == 1 and "Fail" in log and "Result: Fail" in term.message
        else:
            assert term.exit_code == 0 and "Result: Pass" in log
        t.core.delete_namespaced_pod(name, ns, grace_period_seconds=0)
        eventually(
            lambda name=name: (
                not [p for p in t.core.list_namespaced_pod(ns).items if p.metadata.name == name]
            )
        )


def test_diag_on_device_plugin_uses_nvidia_visible_devices(twin: Any) -> None:
    t = twin(OPTS, profile="device-plugin")
    ns, node = t.namespace(), t.rs.twin.seed_info["nodes"][0]
    good, bad = _uuids(t, node)[:2]
    t.manager.faults.fail(node, bad, xid=64)
    for name, uuid, code in (("good", good, 0), ("bad", bad, 1)):
        argv = ["dcgmi", "diag", "-r", "1"]
        t.core.create_namespaced_pod(
            ns, _tool_pod(name, node, argv, env={"NVIDIA_VISIBLE_DEVICES": uuid})
        )
        _pod, term, log = _finished(t, ns, name)
        assert term.exit_code == code, log
        assert uuid in log


@pytest.mark.parametrize("profile", ["1.36", "device-plugin"])
def test_reboot(twin: Any, profile: str) -> None:
    t = twin(OPTS, profile=profile)
    node = t.rs.twin.seed_info["nodes"][0]
    first, second = _uuids(t, node)[:2]
    t.manager.faults.fail(node, first, xid=79)
    t.manager.faults.fail(node, second, xid=64)
    # At the suite's time scale the 20 s reboot lasts 0.1 s of real time, which a busy machine
    # spends before the next read: slow the clock while the test looks at the node down.
    t.manager.clock.set_time_scale(0.01)
    t.manager.repairs.reboot(node)

    def gpus_published() -> int:
        if profile == "device-plugin":
            return int(t.core.read_node(node).status.allocatable.get("nvidia.com/gpu", "0"))
        slices = t.dra.list_resource_slice(field_selector=f"spec.nodeName={node}").items
        return sum(len(s.spec.devices or []) for s in slices)

    assert condition(t.core.read_node(node), "Ready").status == "Unknown"
    assert gpus_published() == 0
    t.manager.clock.set_time_scale(TIME_SCALE)
    t.manager.poke()
    eventually(lambda: condition(t.core.read_node(node), "Ready").status == "True")
    eventually(lambda: gpus_published() >= 1)
    assert [(f.gpu_uuid, f.xid) for f in t.manager.faults.faults()] == [(second, 64)]
    assert t.manager.repairs.reboots == [node]


def test_replace_brings_a_new_node_with_new_uuids(twin: Any) -> None:
    t = twin(OPTS, profile="1.36", nodes=2)
    old = t.rs.twin.seed_info["nodes"][0]
    old_uuids = set(_uuids(t, old))
    t.manager.faults.fail(old, "0", xid=64)
    t.manager.repairs.replace(old)

    def new_node() -> str:
        names = {n.metadata.name for n in t.core.list_node().items}
        added = names - set(t.rs.twin.seed_info["nodes"])
        assert old not in names
        return added.pop() if added else ""

    fresh = eventually(new_node)
    assert eventually(lambda: set(_uuids(t, fresh)))
    assert not set(_uuids(t, fresh)) & old_uuids
    with pytest.raises(client.ApiException):
        t.core.read_node(old)


def test_each_recreate_of_a_same_name_vm_is_new_hardware(twin: Any) -> None:
    """A cloud VM recreated under its name (Compute Engine recreateInstances) gets new GPU
    UUIDs every time, not only the first two: the third recreate used to bring back the
    second's UUIDs, so a remediation following it never saw a new node."""
    t = twin(OPTS, profile="1.36", nodes=1)
    node = t.rs.twin.seed_info["nodes"][0]
    seen = [set(_uuids(t, node))]
    for _ in range(3):
        before = seen[-1]
        t.manager.repairs.replace(node, same_name=True)

        def renewed(before: set[str] = before) -> set[str]:
            now = set(_uuids(t, node))
            return now if now and not now & before else set()

        seen.append(eventually(renewed))
    assert len(set().union(*seen)) == 4 * len(seen[0])  # four generations, no UUID twice
