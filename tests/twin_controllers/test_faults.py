"""Device faults, topologies, the device-plugin profile, API fault injection and the CLI.

Cases:
- MIG / vGPU / time-sliced topologies: two pods on two devices of one physical GPU; failing
  the GPU (by index, or by one sibling's device name) marks every sibling Unhealthy in
  /twin/gpus and in both pods' allocatedResourcesStatus;
- DRA health ids as the 1.36 kubelet writes them: the NVIDIA driver's first CDI device id
  (`k8s.gpu.nvidia.com/claim=<claim uid>-<device>`), or `driver/pool/device` when the driver
  returns none (`TwinOptions.cdi_device_ids=False`);
- `--degrade nvlink`: health Unhealthy "XID 74" but the container keeps running; an
  application Xid (13) leaves health Healthy and the container running;
- `--vanish` (DRA): the devices leave the ResourceSlice, the pod's health reads Unknown;
  `recover` publishes them again and health is Healthy;
- device-plugin profile: a pod asking for nvidia.com/gpu runs with health under
  `nvidia.com/gpu` (resourceID = the GPU UUID from the node annotation); a dead GPU lowers the
  node's allocatable nvidia.com/gpu and crash-loops the pod; `--vanish` drops capacity to 0;
- API fault injection switched at run time: 429 (with Retry-After) on list pods once, 500 on
  create, 409 on patch, a reset connection, a timeout answered 504; removing the rules
  restores normal answers; the request log still records the injected failures;
- an API fault with `match` fires only on requests whose decoded path + query contain the text
  (one node's pod list, one object by name); other requests of the same verb go through;
- `sickbay-dev twin fail / recover / gpus / api-fault` run against the twin over HTTP;
- `driverTaint`: the DRA driver publishes gpu.nvidia.com/xid=79:NoSchedule on the device in its
  ResourceSlice, new pods avoid it; recovery removes the taint and the Pending pod runs.
"""

from __future__ import annotations

import argparse
import time
from typing import Any

import httpx
import pytest
from kubernetes import client

from tests.twin_controllers.conftest import eventually
from tests.twin_controllers.helpers import DRIVER, claim_of, claim_template, deployment, pods
from twin.controllers.manager import TwinOptions
from twin.fault_cli import register_fault_commands

NODE = "gpu-pool-node-0"


def _health(pod: Any) -> list[tuple[str, str, str]]:
    """(entry name, device, health); a CDI id (`…/claim=<claim uid>-<device>`, what the
    kubelet reports for the NVIDIA driver) is turned back into driver/pool/device."""
    out = []
    for status in pod.status.container_statuses[0].allocated_resources_status or []:
        for res in status.resources:
            rid = res.resource_id
            if "/claim=" in rid:
                rid = f"{DRIVER}/{pod.spec.node_name}/{rid.split('=', 1)[1][37:]}"
            out.append((status.name, rid, res.health))
    return out


@pytest.mark.parametrize("topology", ["mig", "vgpu", "timeslice"])
def test_physical_fault_marks_all_siblings(twin: Any, topology: str) -> None:
    t = twin(gpus_per_node=1, topology=topology, slices_per_gpu=2)
    ns = t.namespace()
    cls = {"mig": "mig.nvidia.com", "timeslice": DRIVER, "vgpu": "vgpu.example"}[topology]
    if topology == "vgpu":
        expr = f"device.driver == '{DRIVER}' && device.attributes['{DRIVER}'].type == 'vgpu'"
        t.dra.create_device_class(
            {"metadata": {"name": cls}, "spec": {"selectors": [{"cel": {"expression": expr}}]}}
        )
    requests = [{"name": "gpu", "exactly": {"deviceClassName": cls}}]
    t.dra.create_namespaced_resource_claim_template(ns, claim_template("gpu", requests))
    t.apps.create_namespaced_deployment(ns, deployment("shared", "gpu", replicas=2))

    def both_running() -> list[Any]:
        ps = pods(t.core, ns)
        assert len(ps) == 2 and all(p.status.phase == "Running" for p in ps)
        return ps

    both_running_pods = eventually(both_running)
    devices = sorted(_health(p)[0][1] for p in both_running_pods)
    assert len(set(devices)) == 2  # two different devices ...
    sibling = devices[1].rsplit("/", 1)[-1]
    # ... of one physical GPU: failing it through one sibling's name marks both.
    made = t.twin("POST", "/twin/faults", {"node": NODE, "gpu": sibling, "xid": 48})
    assert made.status_code == 201, made.text
    assert sorted(made.json()["items"][0]["devices"]) == devices
    gpus = t.twin("GET", f"/twin/gpus?node={NODE}").json()["items"]
    assert len(gpus) == 1 and {d["health"] for d in gpus[0]["devices"]} == {"Unhealthy"}

    def all_unhealthy() -> bool:
        return all(_health(p)[0][2] == "Unhealthy" for p in pods(t.core, ns))

    eventually(all_unhealthy)


@pytest.mark.parametrize("cdi", [True, False])
def test_health_resource_id_is_the_cdi_id_or_the_device_key(twin: Any, cdi: bool) -> None:
    """The 1.36 kubelet reports the driver's first CDI device id; driver/pool/device only when
    the driver returned none (TwinOptions.cdi_device_ids=False)."""
    t = twin(TwinOptions(cdi_device_ids=cdi))
    ns = t.namespace()
    t.dra.create_namespaced_resource_claim_template(ns, claim_template("gpu"))
    t.apps.create_namespaced_deployment(ns, deployment("app", "gpu"))

    def reported() -> tuple[Any, str]:
        (p,) = pods(t.core, ns)
        (entry,) = p.status.container_statuses[0].allocated_resources_status
        assert entry.name == "claim:gpu"
        return p, entry.resources[0].resource_id

    pod, rid = eventually(reported)
    claim = claim_of(t.dra, pod)
    result = claim.status.allocation.devices.results[0]
    if cdi:
        assert rid == f"k8s.gpu.nvidia.com/claim={claim.metadata.uid}-{result.device}"
    else:
        assert rid == f"{result.driver}/{result.pool}/{result.device}"


def test_degrade_and_application_xid_keep_running(twin: Any) -> None:
    t = twin()
    ns = t.namespace()
    t.dra.create_namespaced_resource_claim_template(ns, claim_template("gpu"))
    t.apps.create_namespaced_deployment(ns, deployment("app", "gpu", replicas=2))

    def both_running() -> list[Any]:
        ps = pods(t.core, ns)
        assert len(ps) == 2 and all(p.status.phase == "Running" for p in ps)
        return ps

    on = {_health(p)[0][1].rsplit("/", 1)[-1]: p.metadata.name for p in eventually(both_running)}
    assert (
        t.twin(
            "POST", "/twin/faults", {"node": NODE, "gpu": "gpu-0", "degrade": "nvlink"}
        ).status_code
        == 201
    )
    assert (
        t.twin("POST", "/twin/faults", {"node": NODE, "gpu": "gpu-1", "xid": 13}).status_code == 201
    )

    def degraded() -> bool:
        p = t.core.read_namespaced_pod(on["gpu-0"], ns)
        res = p.status.container_statuses[0].allocated_resources_status[0].resources[0]
        assert res.health == "Unhealthy" and getattr(res, "message", "XID 74") == "XID 74"
        return True

    eventually(degraded)
    time.sleep(0.3)  # a minute of simulated time: no crash
    for name in on.values():
        p = t.core.read_namespaced_pod(name, ns)
        assert p.status.container_statuses[0].restart_count == 0
        assert p.status.container_statuses[0].state.running is not None
    app = t.core.read_namespaced_pod(on["gpu-1"], ns)
    assert _health(app)[0][2] == "Healthy"


def test_vanish_and_recover_dra(twin: Any) -> None:
    t = twin()
    ns = t.namespace()
    t.dra.create_namespaced_resource_claim_template(ns, claim_template("gpu"))
    t.apps.create_namespaced_deployment(ns, deployment("app", "gpu"))
    eventually(lambda: pods(t.core, ns)[0].status.phase == "Running")
    assert t.twin("POST", "/twin/faults", {"node": NODE, "vanish": True}).status_code == 201
    (piece,) = t.dra.list_resource_slice().items
    assert not piece.spec.devices  # no devices published (an empty list, or none at all)
    eventually(lambda: _health(pods(t.core, ns)[0])[0][2] == "Unknown")
    assert len(t.twin("GET", f"/twin/gpus?node={NODE}").json()["items"]) == 2
    recovered = t.twin("POST", "/twin/faults/recover", {"node": NODE})
    assert recovered.status_code == 200 and len(recovered.json()["items"]) == 2
    (piece,) = t.dra.list_resource_slice().items
    assert [d.name for d in piece.spec.devices] == ["gpu-0", "gpu-1"]
    eventually(lambda: _health(pods(t.core, ns)[0])[0][2] == "Healthy")
    assert t.twin("GET", "/twin/faults").json()["items"] == []


def test_device_plugin_profile(twin: Any) -> None:
    t = twin(profile="device-plugin")
    ns = t.namespace()
    uuids = t.core.read_node(NODE).metadata.annotations["sickbay.dev/gpu-uuids"].split(",")
    body = deployment("plugin-app", None)
    body["spec"]["template"]["spec"]["containers"][0]["resources"] = {
        "limits": {"nvidia.com/gpu": "1"}
    }
    t.apps.create_namespaced_deployment(ns, body)

    def running() -> Any:
        (p,) = pods(t.core, ns)
        assert p.status.phase == "Running"
        return p

    pod = running_pod = eventually(running)
    name, resource_id, health = _health(running_pod)[0]
    assert (name, health) == ("nvidia.com/gpu", "Healthy") and resource_id in uuids
    made = t.twin("POST", "/twin/faults", {"node": NODE, "gpu": resource_id, "xid": 79})
    assert made.status_code == 201

    def lowered() -> bool:
        node = t.core.read_node(NODE)
        assert node.status.allocatable["nvidia.com/gpu"] == "1"
        assert node.status.capacity["nvidia.com/gpu"] == "2"
        p = t.core.read_namespaced_pod(pod.metadata.name, ns)
        assert _health(p)[0][2] == "Unhealthy"
        assert p.status.container_statuses[0].restart_count >= 1
        return True

    eventually(lowered)
    t.twin("POST", "/twin/faults", {"node": NODE, "vanish": True})
    eventually(lambda: t.core.read_node(NODE).status.capacity["nvidia.com/gpu"] == "0")
    t.twin("POST", "/twin/faults/recover", {"node": NODE})
    eventually(lambda: t.core.read_node(NODE).status.allocatable["nvidia.com/gpu"] == "2")


def test_api_fault_injection(twin: Any) -> None:
    t = twin()
    ns = t.namespace()
    # 429 on a create (urllib3 itself retries a GET that carries Retry-After).
    rule = t.twin(
        "POST",
        "/twin/api-faults",
        {"kind": "429", "verb": "create", "resource": "configmaps", "count": 1},
    )
    assert rule.status_code == 201, rule.text
    with pytest.raises(client.ApiException) as caught:
        t.core.create_namespaced_config_map(ns, {"metadata": {"name": "c"}})
    assert caught.value.status == 429
    assert caught.value.headers["Retry-After"] == "1"
    t.core.create_namespaced_config_map(ns, {"metadata": {"name": "c"}})  # count 1: goes through
    t.twin("POST", "/twin/api-faults", {"kind": "500", "verb": "list", "resource": "pods"})
    with pytest.raises(client.ApiException) as caught:
        t.core.list_namespaced_pod(ns)
    assert caught.value.status == 500
    t.twin("POST", "/twin/api-faults", {"kind": "409", "verb": "patch", "resource": "namespaces"})
    with pytest.raises(client.ApiException) as caught:
        t.core.patch_namespace(ns, {"metadata": {"labels": {"a": "b"}}})
    assert caught.value.status == 409
    t.twin("POST", "/twin/api-faults", {"kind": "reset", "verb": "get", "resource": "nodes"})
    with pytest.raises(httpx.TransportError):
        httpx.get(f"{t.rs.url}/api/v1/nodes/{NODE}", timeout=5)
    t.twin(
        "POST",
        "/twin/api-faults",
        {"kind": "timeout", "verb": "list", "resource": "nodes", "timeoutSeconds": 0.2},
    )
    slow = httpx.get(f"{t.rs.url}/api/v1/nodes", timeout=5)
    assert slow.status_code == 504 and slow.json()["reason"] == "Timeout"
    listed = t.twin("GET", "/twin/api-faults").json()
    assert listed["injected"] == 5 and len(listed["items"]) == 5
    assert t.twin("DELETE", "/twin/api-faults").json() == {"removed": 5}
    assert t.core.read_node(NODE).metadata.name == NODE
    assert t.rs.requests(verb="create", resource="configmaps", status=429)
    bad = t.twin("POST", "/twin/api-faults", {"kind": "418"})
    assert bad.status_code == 400 and "kind must be one of" in bad.json()["message"]


def test_api_fault_match_narrows_a_rule(twin: Any) -> None:
    t = twin(nodes=2)
    ns = t.namespace()
    made = t.twin(
        "POST",
        "/twin/api-faults",
        {"kind": "500", "verb": "list", "resource": "pods", "match": f"spec.nodeName={NODE}"},
    )
    assert made.status_code == 201 and made.json()["match"] == f"spec.nodeName={NODE}"
    with pytest.raises(client.ApiException) as caught:
        t.core.list_pod_for_all_namespaces(field_selector=f"spec.nodeName={NODE}")
    assert caught.value.status == 500
    other = "gpu-pool-node-1"
    assert t.core.list_pod_for_all_namespaces(field_selector=f"spec.nodeName={other}").items == []
    assert t.core.list_namespaced_pod(ns).items == []
    t.twin("POST", "/twin/api-faults", {"kind": "409", "verb": "patch", "match": "/nodes/" + other})
    with pytest.raises(client.ApiException) as caught:
        t.core.patch_node(other, {"metadata": {"labels": {"a": "b"}}})
    assert caught.value.status == 409
    t.core.patch_node(NODE, {"metadata": {"labels": {"a": "b"}}})  # not matched: applied
    listed = t.twin("GET", "/twin/api-faults").json()
    assert [r["injected"] for r in listed["items"]] == [1, 1]


def test_cli_commands(twin: Any, capsys: pytest.CaptureFixture[str]) -> None:
    t = twin()
    parser = argparse.ArgumentParser()
    register_fault_commands(parser.add_subparsers())

    def run(*argv: str) -> int:
        args = parser.parse_args([*argv, "--url", t.rs.url])
        return int(args.func(args))

    assert run("fail", NODE, "1", "--xid", "79") == 0
    assert "GPU 1" in capsys.readouterr().out
    assert run("gpus", NODE) == 0
    lines = capsys.readouterr().out.strip().splitlines()
    assert len(lines) == 2 and lines[1].endswith("Unhealthy") and lines[0].endswith("Healthy")
    assert run("recover", NODE, "1") == 0
    assert "recovered" in capsys.readouterr().out
    assert run("fail", NODE, "9", "--xid", "79") == 1
    assert "not found" in capsys.readouterr().err
    assert run("api-fault", "add", "500", "--verb", "delete") == 0
    assert run("api-fault", "add", "409", "--verb", "patch", "--match", "/nodes/x") == 0
    rules = t.twin("GET", "/twin/api-faults").json()["items"]
    assert [r["match"] for r in rules] == ["", "/nodes/x"]
    assert run("api-fault", "clear") == 0
    assert run("resize", "gpu-pool", "2") == 0
    eventually(lambda: len(t.core.list_node().items) == 2)


def test_driver_taint_on_slice_blocks_new_pods(twin: Any) -> None:
    t = twin()
    ns = t.namespace()
    made = t.twin(
        "POST", "/twin/faults", {"node": NODE, "gpu": "0", "xid": 79, "driverTaint": True}
    )
    assert made.status_code == 201 and made.json()["items"][0]["driver_taint"] is True
    (piece,) = t.dra.list_resource_slice().items
    taints = {d.name: d.taints for d in piece.spec.devices}
    assert [(x.key, x.value, x.effect) for x in taints["gpu-0"]] == [
        ("gpu.nvidia.com/xid", "79", "NoSchedule")
    ]
    assert not taints["gpu-1"]
    t.dra.create_namespaced_resource_claim_template(ns, claim_template("gpu"))
    t.apps.create_namespaced_deployment(ns, deployment("app", "gpu", replicas=2))

    def one_running_one_pending() -> bool:
        ps = pods(t.core, ns)
        phases = sorted((p.spec.node_name is not None, p.status.phase) for p in ps)
        assert phases == [(False, "Pending"), (True, "Running")], phases
        running = next(p for p in ps if p.spec.node_name)
        assert _health(running)[0][1].endswith("/gpu-1")
        return True

    eventually(one_running_one_pending)
    t.twin("POST", "/twin/faults/recover", {"node": NODE, "gpu": "0"})
    (piece,) = t.dra.list_resource_slice().items
    assert not any(d.taints for d in piece.spec.devices)
    eventually(lambda: [p.status.phase for p in pods(t.core, ns)] == ["Running", "Running"])


def test_fault_batch_is_checked_whole_before_any_is_made(twin: Any) -> None:
    """`{"items": [...]}`: several faults in one request (a burst within one second); a bad
    item refuses the whole batch, naming it, and makes none."""
    t = twin()
    bad = t.twin(
        "POST",
        "/twin/faults",
        {"items": [{"node": NODE, "gpu": "0", "xid": 79}, {"node": NODE, "gpu": "1"}]},
    )
    assert bad.status_code == 400 and "fault 1: give exactly one of" in bad.json()["message"]
    unknown = t.twin("POST", "/twin/faults", {"items": [{"node": "nope", "gpu": "0", "xid": 79}]})
    assert unknown.status_code == 404 and "fault 0" in unknown.json()["message"]
    assert t.twin("POST", "/twin/faults", {"items": []}).status_code == 400
    assert t.twin("GET", "/twin/faults").json()["items"] == []
    made = t.twin(
        "POST",
        "/twin/faults",
        {
            "items": [
                {"node": NODE, "gpu": "0", "xid": 79, "driverTaint": True},
                {"node": NODE, "gpu": "1", "xid": 48},
            ]
        },
    )
    assert made.status_code == 201
    assert [(f["xid"], f["driver_taint"]) for f in made.json()["items"]] == [
        (79, True),
        (48, False),
    ]
    (piece,) = t.dra.list_resource_slice().items
    taints = {d.name: [(x.key, x.value) for x in d.taints or []] for d in piece.spec.devices}
    assert taints == {"gpu-0": [("gpu.nvidia.com/xid", "79")], "gpu-1": []}
    assert len(t.twin("GET", "/twin/faults").json()["items"]) == 2
