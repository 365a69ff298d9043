"""Seeding, the request log, health and the `sickbay-dev twin` command.

Cases: seeded nodes carry node-pool labels and ResourceSlices shaped like the NVIDIA DRA
driver's (uuid, index, productName, driverVersion, memory capacity); MIG / vGPU / time-slice
topologies give several devices per physical GPU with parentUUID; a YAML description seeds
several pools and seeding again grows a pool; the request log records method/verb/resource/status and the object a create made, sums up the RBAC rules the
calls needed, and is readable and clearable over HTTP; /twin/healthz; `sickbay-dev twin up --detach`
then `sickbay-dev twin down`; `sickbay-dev twin up` on a port in use.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

import httpx
from kubernetes import client

from tests.twin.helpers import HTTP_TIMEOUT
from twin.testing import RunningTwin

SICKBAY_DEV = [sys.executable, "-m", "harness.cli"]  # `sickbay-dev`, without a re-install

ROOT = Path(__file__).resolve().parents[2]


def _attrs(dev: dict[str, Any]) -> dict[str, Any]:
    return {k: next(iter(v.values())) for k, v in dev["attributes"].items()}


def test_seeded_cluster_shape(twin: RunningTwin, api: client.ApiClient) -> None:
    nodes = client.CoreV1Api(api).list_node(label_selector="sickbay.dev/node-pool=gpu-pool").items
    assert [n.metadata.labels["cloud.google.com/gke-nodepool"] for n in nodes] == [
        "gpu-pool",
        "gpu-pool",
    ]
    slices = twin.store.list(
        "resourceslices.resource.k8s.io", field_selector=f"spec.nodeName={nodes[0].metadata.name}"
    ).items
    assert len(slices) == 1
    spec = slices[0]["spec"]
    assert spec["driver"] == "gpu.nvidia.com" and spec["pool"]["name"] == nodes[0].metadata.name
    assert [d["name"] for d in spec["devices"]] == ["gpu-0", "gpu-1"]
    attrs = _attrs(spec["devices"][1])
    assert attrs["type"] == "gpu" and attrs["index"] == 1 and attrs["uuid"].startswith("GPU-")
    assert attrs["productName"] == "NVIDIA H100 80GB HBM3" and attrs["driverVersion"]
    assert spec["devices"][1]["capacity"]["memory"]["value"] == "81559Mi"
    classes = client.ResourceV1Api(api).list_device_class().items
    assert [c.metadata.name for c in classes] == ["gpu.nvidia.com"]


def test_shared_gpu_topologies(twin_factory: Any) -> None:
    for topology, kind in (("mig", "mig"), ("vgpu", "vgpu"), ("timeslice", "gpu")):
        rs = twin_factory(nodes=1, gpus_per_node=2, topology=topology, slices_per_gpu=3)
        devices = rs.store.list("resourceslices.resource.k8s.io").items[0]["spec"]["devices"]
        assert len(devices) == 6
        parents = {_attrs(d)["parentUUID"] for d in devices}
        assert len(parents) == 2
        assert {_attrs(d)["type"] for d in devices} == {kind}
        if topology == "timeslice":
            assert all(_attrs(d)["uuid"] == _attrs(d)["parentUUID"] for d in devices)
        else:
            assert len({_attrs(d)["uuid"] for d in devices}) == 6


def test_yaml_seed(tmp_path: Path) -> None:
    from twin.runtime import Twin

    desc = tmp_path / "cluster.yaml"
    desc.write_text(
        "pools:\n"
        "  - {name: h100, nodes: 2, gpusPerNode: 8}\n"
        "  - {name: t4, nodes: 1, gpusPerNode: 1, product: Tesla T4, topology: timeslice, slicesPerGpu: 4}\n"
    )
    twin = Twin(profile="1.36")
    info = twin.seed_file(desc)
    assert info["pools"]["h100"]["nodes"] == ["h100-node-0", "h100-node-1"]
    t4 = twin.store.get("resourceslices.resource.k8s.io", "t4-node-0-gpu.nvidia.com")
    assert len(t4["spec"]["devices"]) == 4
    assert (
        twin.store.get("nodes", "t4-node-0")["metadata"]["labels"][
            "node.kubernetes.io/instance-type"
        ]
        == "n1-standard-8-t4"
    )
    twin.store.delete("nodes", "h100-node-0")
    assert (
        twin.store.try_get("resourceslices.resource.k8s.io", "h100-node-0-gpu.nvidia.com") is None
    )
    grown = twin.seed(pool="h100", nodes=2, gpus_per_node=8)  # scale-up fills the free names
    assert grown["pools"]["h100"]["nodes"] == ["h100-node-0", "h100-node-2"]


def test_request_log_and_health(twin: RunningTwin, core: client.CoreV1Api, ns: str) -> None:
    core.create_namespaced_pod(
        ns, {"metadata": {"name": "logged"}, "spec": {"containers": [{"name": "c", "image": "i"}]}}
    )
    core.read_namespaced_pod("logged", ns)
    try:
        core.read_namespaced_pod("missing", ns)
    except client.ApiException:
        pass
    mine = twin.requests(namespace=ns)
    assert [(r.verb, r.resource, r.name, r.status) for r in mine] == [
        ("create", "pods", "", 201),
        ("get", "pods", "logged", 200),
        ("get", "pods", "missing", 404),
    ]
    assert mine[0].user_agent.startswith("OpenAPI-Generator/") and mine[0].duration_ms > 0
    over_http = httpx.get(
        f"{twin.url}/twin/requests", params={"namespace": ns, "verb": "get"}, timeout=HTTP_TIMEOUT
    ).json()["items"]
    assert [r["name"] for r in over_http] == ["logged", "missing"]
    assert twin.twin.requests.rbac_rules(namespace=ns) == [
        {"apiGroups": [""], "resources": ["pods"], "verbs": ["create", "get"]}
    ]
    health = httpx.get(f"{twin.url}/twin/healthz", timeout=HTTP_TIMEOUT).json()
    assert health["status"] == "ok" and health["profile"] == "1.36" and health["nodes"] >= 2


def test_request_log_names_what_a_create_made(
    twin: RunningTwin, core: client.CoreV1Api, ns: str
) -> None:
    # A create's path names no object: the record names the object it made (generateName
    # resolved, as the answer has it), and a refused create made none.
    pod = {"spec": {"containers": [{"name": "c", "image": "i"}]}}
    made = core.create_namespaced_pod(ns, {"metadata": {"generateName": "made-"}, **pod})
    core.create_namespaced_pod(ns, {"metadata": {"name": "twice"}, **pod})
    try:
        core.create_namespaced_pod(ns, {"metadata": {"name": "twice"}, **pod})
    except client.ApiException as exc:
        assert exc.status == 409
    creates = twin.requests(namespace=ns, verb="create")
    assert [(r.name, r.created, r.status) for r in creates] == [
        ("", made.metadata.name, 201),
        ("", "twice", 201),
        ("", "", 409),
    ]
    over_http = httpx.get(
        f"{twin.url}/twin/requests",
        params={"namespace": ns, "verb": "create"},
        timeout=HTTP_TIMEOUT,
    ).json()["items"]
    assert [r["created"] for r in over_http] == [made.metadata.name, "twice", ""]


def test_request_log_clear(twin_factory: Any) -> None:
    rs = twin_factory(nodes=1)
    client.CoreV1Api(rs.api_client()).list_node()
    assert rs.requests(verb="list", resource="nodes")
    assert httpx.delete(f"{rs.url}/twin/requests", timeout=HTTP_TIMEOUT).status_code == 200
    assert rs.requests() == []


def test_cli_up_detach_and_down(tmp_path: Path) -> None:
    env = {**os.environ, "SICKBAY_STATE_DIR": str(tmp_path)}
    cmd = [*SICKBAY_DEV, "twin"]
    kubeconfig = tmp_path / "kc.yaml"
    # 60 s: a cold interpreter imports the kubernetes client and seeds before answering.
    up = subprocess.run(
        cmd
        + [
            "up",
            "--profile",
            "1.37",
            "--nodes",
            "1",
            "--gpus-per-node",
            "2",
            "--kubeconfig",
            str(kubeconfig),
            "--detach",
        ],
        env=env,
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert up.returncode == 0, up.stderr
    state = json.loads((tmp_path / "twin.json").read_text())
    try:
        from kubernetes import config

        api = config.new_client_from_config(str(kubeconfig))
        assert client.VersionApi(api).get_code().minor == "37"
        assert len(client.ResourceV1Api(api).list_resource_slice().items) == 1
    finally:
        down = subprocess.run(
            # 30 s: down waits up to 10 s for the process, plus interpreter start-up.
            cmd + ["down"],
            env=env,
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=30,
        )
    assert down.returncode == 0, down.stderr
    assert not (tmp_path / "twin.json").exists()
    try:
        os.kill(state["pid"], 0)
        alive = True
    except ProcessLookupError:
        alive = False
    assert not alive


def test_cli_up_on_a_port_in_use_says_so_in_one_line(tmp_path: Path) -> None:
    """A port another program listens on: exit 2 and one line naming the address, for the
    Kubernetes API and for the cloud API, never a traceback or a twin left half-started."""
    env = {**os.environ, "SICKBAY_STATE_DIR": str(tmp_path)}
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        for flag, what in (("--port", "Kubernetes API"), ("--cloud-port", "127.0.0.1")):
            up = subprocess.run(
                [*SICKBAY_DEV, "twin", "up", "--nodes", "1", flag, str(port)],
                env=env,
                cwd=ROOT,
                capture_output=True,
                text=True,
                timeout=60,  # a cold interpreter imports the kubernetes client first
            )
            assert up.returncode == 2, up.stdout + up.stderr
            last = up.stderr.strip().splitlines()[-1]
            assert last.startswith("sickbay-dev twin up: "), up.stderr
            assert what in last and f"127.0.0.1:{port}" in last, last
            assert "Traceback" not in up.stderr
            assert not (tmp_path / "twin.json").exists()
