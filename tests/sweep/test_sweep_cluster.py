"""`sweep-cluster` against the cluster twin (official client over loopback HTTP), and the whole
sweep on the Temporal dev server.

The twin's kubelet stand-in may not report health yet, so each test writes the pod status the
kubelet would (`allocatedResourcesStatus`) through the API's status subresource.

Cases:
- DRA (1.36): an Unhealthy resourceID `gpu.nvidia.com/<node>/gpu-1` maps to the node and the
  GPU UUID of the ResourceSlice device; Xid parsed from the message; Healthy entries ignored
- a driver-set ResourceSlice taint is a finding; a pod of a Succeeded phase is ignored
- Unknown health is reported as Unknown; `only_unknown` narrows a re-check to those devices
- a resourceID in no ResourceSlice is reported as unresolved, not dropped
- CDI device ids (what the 1.36 kubelet writes for NVIDIA's driver): resolved through the
  entry's claim name, the pod's ResourceClaim and its allocation, also to one of several
  devices of a request when the id names it; an id naming none of several devices is an
  unresolved WARNING naming the pod and the id, never a guess
- MIG: two slices of one GPU reporting Unhealthy are one finding for the parent UUID
- a GPU gone from a node's ResourceSlice (fewer than its gpu.count label) is a node finding
- device plugin: allocatable nvidia.com/gpu below capacity is a node finding; a pod's
  Unhealthy device id `GPU-...::1` (time-slicing) maps to the pod's node and the GPU UUID; a
  MIG instance's id (`MIG-...`) names no GPU: unresolved, never a remediation of a "GPU"
  `MIG-...`
- HAMi: a GPU its registration marks unhealthy (no `health` key) is a `hami-health` device
  finding; fewer GPUs registered than gpu.count, or an unreadable registration, is a node
  finding (HAMi's nvidia.com/gpu counts shares and is not compared); a pod's Unhealthy share
  id `<UUID>-<i>` maps to the GPU its HAMi record names
- end to end: the sweep workflow on the dev server, real activities, finds the Unhealthy
  device and starts exactly one remediation; a second sweep signals it, still one workflow
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client as k8s
from temporalio.testing import WorkflowEnvironment
from temporalio.worker import Worker

from activities.kube.client import Kube, KubeSettings
from activities.kube.hami import ANN_REGISTER as HAMI_REGISTER
from activities.launch import LaunchActivities
from activities.sweep import SweepActivities
from contract.names import device_workflow_id
from contract.sweep import SweepClusterInput, SweepInput, SweepResult
from tests.webhook.helpers import count_runs, history_counts
from twin.seed import gpu_uuid
from twin.testing import RunningTwin, running_twin
from workflows.sweep import HealthSweepWorkflow

DRIVER = "gpu.nvidia.com"


@pytest.fixture
def dra(tmp_path: Path) -> Iterator[RunningTwin]:
    with running_twin(tmp_path, profile="1.36", nodes=2, gpus_per_node=2) as rs:
        yield rs


def kube_for(rs: RunningTwin) -> Kube:
    return Kube.from_settings(KubeSettings(kubeconfig=str(rs.kubeconfig_path)))


def make_pod(
    rs: RunningTwin,
    name: str,
    node: str,
    resources: list[dict[str, Any]],
    *,
    namespace: str = "ml",
    phase: str = "Running",
) -> None:
    api = k8s.CoreV1Api(rs.api_client())
    try:
        api.create_namespace({"metadata": {"name": namespace}})
    except k8s.ApiException as exc:
        if exc.status != 409:
            raise
    api.create_namespaced_pod(
        namespace,
        {
            "metadata": {"name": name},
            "spec": {"nodeName": node, "containers": [{"name": "main", "image": "cuda"}]},
        },
    )
    # What the kubelet writes (KEP-4680): per container, per claim, per device.
    api.patch_namespaced_pod_status(
        name,
        namespace,
        {
            "status": {
                "phase": phase,
                "containerStatuses": [
                    {
                        "name": "main",
                        "image": "cuda",
                        "imageID": "",
                        "ready": phase == "Running",
                        "restartCount": 0,
                        "allocatedResourcesStatus": [{"name": "claim:gpu", "resources": resources}],
                    }
                ],
            }
        },
    )


def node_names(rs: RunningTwin) -> list[str]:
    return list(rs.twin.seed_info["nodes"])


def sweep(rs: RunningTwin, **kwargs: Any):
    return SweepActivities(kube_for(rs)).sweep(SweepClusterInput(**kwargs))


def test_unhealthy_dra_device_maps_to_node_and_uuid(dra: RunningTwin) -> None:
    n0, _ = node_names(dra)
    make_pod(
        dra,
        "trainer-0",
        n0,
        [
            {"resourceID": f"{DRIVER}/{n0}/gpu-0", "health": "Healthy"},
            {"resourceID": f"{DRIVER}/{n0}/gpu-1", "health": "Unhealthy", "message": "XID 79"},
        ],
    )
    report = sweep(dra)
    assert report.pods_checked == 1 and report.slices_checked == 2 and report.nodes_checked == 2
    assert len(report.findings) == 1, report.findings
    (f,) = report.findings
    assert (f.kind, f.node, f.gpu_uuid, f.health, f.xid) == (
        "pod-health",
        n0,
        gpu_uuid(n0, 1),
        "Unhealthy",
        79,
    )
    assert f.resource_id == f"{DRIVER}/{n0}/gpu-1"
    assert [(p.namespace, p.name) for p in f.pods] == [("ml", "trainer-0")]
    assert report.unresolved == [] and report.nodes == []


def test_slice_taint_found_terminal_pod_ignored(dra: RunningTwin) -> None:
    n0, n1 = node_names(dra)
    make_pod(
        dra,
        "done-job",
        n0,
        [{"resourceID": f"{DRIVER}/{n0}/gpu-0", "health": "Unhealthy"}],
        phase="Succeeded",
    )
    res = k8s.ResourceV1Api(dra.api_client())
    name = f"{n1}-{DRIVER}"
    slice_ = res.read_resource_slice(name, _preload_content=False)
    body = json.loads(slice_.data)
    body["spec"]["devices"][0]["taints"] = [
        {"key": f"{DRIVER}/xid", "value": "48", "effect": "NoSchedule"}
    ]
    res.replace_resource_slice(name, body)
    report = sweep(dra)
    assert [(f.kind, f.node, f.gpu_uuid, f.xid) for f in report.findings] == [
        ("slice-taint", n1, gpu_uuid(n1, 0), 48)
    ]
    assert report.findings[0].taint is not None
    assert report.findings[0].taint.effect == "NoSchedule"


def test_unknown_and_recheck_filter(dra: RunningTwin) -> None:
    n0, n1 = node_names(dra)
    make_pod(dra, "a", n0, [{"resourceID": f"{DRIVER}/{n0}/gpu-0", "health": "Unknown"}])
    make_pod(dra, "b", n1, [{"resourceID": f"{DRIVER}/{n1}/gpu-1", "health": "Unknown"}])
    report = sweep(dra)
    assert sorted((f.node, f.health) for f in report.findings) == [
        (n0, "Unknown"),
        (n1, "Unknown"),
    ]
    again = sweep(
        dra, check_nodes=False, check_slice_taints=False, only_unknown=[f"{n1}/{gpu_uuid(n1, 1)}"]
    )
    assert [f.key for f in again.findings] == [f"{n1}/{gpu_uuid(n1, 1)}"]


def test_unresolved_resource_id_reported(dra: RunningTwin) -> None:
    n0, _ = node_names(dra)
    make_pod(dra, "x", n0, [{"resourceID": f"{DRIVER}/{n0}/gpu-7", "health": "Unhealthy"}])
    report = sweep(dra)
    assert report.findings == []
    assert [u.resource_id for u in report.unresolved] == [f"{DRIVER}/{n0}/gpu-7"]


def claim_pod(
    rs: RunningTwin,
    name: str,
    node: str,
    devices: list[tuple[str, str]],
    resources: list[dict[str, Any]],
    *,
    entry: str = "claim:gpu",
) -> str:
    """A pod whose generated claim `<name>-gpu-x7k2p` holds `devices` ((request, device) on
    `node`), with the health the kubelet writes under `entry`. Returns the claim's uid."""
    res = k8s.ResourceV1Api(rs.api_client())
    make_pod(rs, name, node, resources)
    claim_name = f"{name}-gpu-x7k2p"  # generated names are random: never derived from the pod
    claim = res.create_namespaced_resource_claim(
        "ml",
        {
            "metadata": {"name": claim_name},
            "spec": {
                "devices": {
                    "requests": [
                        {"name": r, "exactly": {"deviceClassName": f"{DRIVER}"}}
                        for r in sorted({req.split("/")[0] for req, _ in devices})
                    ]
                }
            },
        },
        _preload_content=False,
    )
    uid = json.loads(claim.data)["metadata"]["uid"]
    res.patch_namespaced_resource_claim_status(
        claim_name,
        "ml",
        {
            "status": {
                "allocation": {
                    "devices": {
                        "results": [
                            {"request": req, "driver": DRIVER, "pool": node, "device": dev}
                            for req, dev in devices
                        ]
                    }
                },
                "reservedFor": [{"resource": "pods", "name": name, "uid": "u"}],
            }
        },
    )
    api = k8s.CoreV1Api(rs.api_client())
    api.patch_namespaced_pod_status(
        name,
        "ml",
        {
            "status": {
                "resourceClaimStatuses": [{"name": "gpu", "resourceClaimName": claim_name}],
                "containerStatuses": [
                    {
                        "name": "main",
                        "image": "cuda",
                        "imageID": "",
                        "ready": True,
                        "restartCount": 0,
                        "allocatedResourcesStatus": [{"name": entry, "resources": resources}],
                    }
                ],
            }
        },
    )
    return str(uid)


def test_cdi_device_id_resolved_through_the_claim(dra: RunningTwin) -> None:
    """The 1.36 kubelet writes the NVIDIA driver's CDI id, not driver/pool/device."""
    n0, _ = node_names(dra)
    cdi = "k8s.gpu.nvidia.com/claim=0c3e4b1a-5f6d-4e8b-9a7c-2d1e0f9b8a77-gpu-1"
    claim_pod(
        dra,
        "server-0",
        n0,
        [("gpu", "gpu-1")],
        [{"resourceID": cdi, "health": "Unhealthy", "message": "XID 79"}],
    )
    report = sweep(dra)
    assert report.unresolved == []
    assert [(f.node, f.gpu_uuid, f.xid, f.resource_id) for f in report.findings] == [
        (n0, gpu_uuid(n0, 1), 79, f"{DRIVER}/{n0}/gpu-1")
    ]
    assert [p.name for p in report.findings[0].pods] == ["server-0"]


def test_cdi_id_picks_its_device_among_several_of_one_request(dra: RunningTwin) -> None:
    n0, _ = node_names(dra)
    claim_pod(
        dra,
        "pair-0",
        n0,
        [("gpus", "gpu-0"), ("gpus", "gpu-1")],
        [
            {"resourceID": "k8s.gpu.nvidia.com/claim=abc-gpu-0", "health": "Healthy"},
            {"resourceID": "k8s.gpu.nvidia.com/claim=abc-gpu-1", "health": "Unhealthy"},
        ],
        entry="claim:gpu/gpus",
    )
    report = sweep(dra)
    assert [(f.node, f.gpu_uuid) for f in report.findings] == [(n0, gpu_uuid(n0, 1))]


def test_cdi_id_that_names_no_device_is_a_loud_unresolved(
    dra: RunningTwin, caplog: pytest.LogCaptureFixture
) -> None:
    n0, _ = node_names(dra)
    opaque = "vendor.example/gpu=common"
    claim_pod(
        dra,
        "pair-1",
        n0,
        [("gpus", "gpu-0"), ("gpus", "gpu-1")],
        [{"resourceID": opaque, "health": "Unhealthy"}],
    )
    with caplog.at_level("WARNING", logger="activities.sweep"):
        report = sweep(dra)
    # Two devices, an id naming neither: guessing could quarantine a healthy GPU.
    assert report.findings == []
    (u,) = report.unresolved
    assert u.resource_id == opaque and [p.name for p in u.pods] == ["pair-1"]
    assert "ml/pair-1" in u.message and opaque in u.message and "does not tell which" in u.message
    warnings = [r for r in caplog.records if r.levelname == "WARNING"]
    assert any("ml/pair-1" in r.getMessage() and opaque in r.getMessage() for r in warnings)


def test_mig_slices_fold_into_parent(tmp_path: Path) -> None:
    with running_twin(
        tmp_path, profile="1.36", nodes=1, gpus_per_node=1, topology="mig", slices_per_gpu=2
    ) as rs:
        (n0,) = node_names(rs)
        make_pod(
            rs, "m0", n0, [{"resourceID": f"{DRIVER}/{n0}/gpu-0-mig-0", "health": "Unhealthy"}]
        )
        make_pod(
            rs, "m1", n0, [{"resourceID": f"{DRIVER}/{n0}/gpu-0-mig-1", "health": "Unhealthy"}]
        )
        report = sweep(rs)
        assert len(report.findings) == 1
        assert report.findings[0].gpu_uuid == gpu_uuid(n0, 0)
        assert sorted(p.name for p in report.findings[0].pods) == ["m0", "m1"]


def test_gpu_missing_from_dra_node(dra: RunningTwin) -> None:
    _, n1 = node_names(dra)
    res = k8s.ResourceV1Api(dra.api_client())
    name = f"{n1}-{DRIVER}"
    body = json.loads(res.read_resource_slice(name, _preload_content=False).data)
    body["spec"]["devices"] = body["spec"]["devices"][:1]
    res.replace_resource_slice(name, body)
    report = sweep(dra)
    assert [n.node for n in report.nodes] == [n1]
    assert "1 GPU(s) in ResourceSlices < 2" in report.nodes[0].message
    assert report.findings == []  # a node finding is never a device to quarantine


def test_device_plugin_node_and_time_sliced_pod(tmp_path: Path) -> None:
    with running_twin(tmp_path, profile="device-plugin", nodes=2, gpus_per_node=2) as rs:
        n0, n1 = node_names(rs)
        api = k8s.CoreV1Api(rs.api_client())
        api.patch_node_status(n1, {"status": {"allocatable": {"nvidia.com/gpu": "1"}}})
        make_pod(
            rs,
            "ts",
            n0,
            [{"resourceID": f"{gpu_uuid(n0, 1)}::1", "health": "Unhealthy", "message": "Xid 48"}],
        )
        # MIG under the device plugin: the id is the MIG instance's UUID, which names no GPU.
        mig = "MIG-5c4b1e0a-7d4f-5a53-9d0e-2f1a9d7b4c11"
        make_pod(rs, "slice", n1, [{"resourceID": mig, "health": "Unhealthy", "message": "x"}])
        report = sweep(rs)
        assert report.slices_checked == 0
        assert [(f.node, f.gpu_uuid, f.xid) for f in report.findings] == [(n0, gpu_uuid(n0, 1), 48)]
        assert [(n.node, n.gpu_capacity, n.gpu_allocatable) for n in report.nodes] == [(n1, 2, 1)]
        assert [u.resource_id for u in report.unresolved] == [mig]
        assert "MIG instance" in report.unresolved[0].message


def test_hami_registration_health_and_vanished_gpu(tmp_path: Path) -> None:
    with running_twin(tmp_path, profile="hami", nodes=2, gpus_per_node=2) as rs:
        n0, n1 = node_names(rs)
        api = k8s.CoreV1Api(rs.api_client())

        def register(node: str) -> list[dict[str, Any]]:
            annotations = api.read_node(node).metadata.annotations
            return list(json.loads(annotations["hami.io/node-nvidia-register"]))

        sick = register(n0)
        sick[1].pop("health")  # HAMi v2.8+ leaves a false health out (omitempty)
        api.patch_node(n0, {"metadata": {"annotations": {HAMI_REGISTER: json.dumps(sick)}}})
        vanished = register(n1)[:1]
        api.patch_node(n1, {"metadata": {"annotations": {HAMI_REGISTER: json.dumps(vanished)}}})
        report = sweep(rs)
        assert [(f.kind, f.node, f.gpu_uuid, f.health) for f in report.findings] == [
            ("hami-health", n0, gpu_uuid(n0, 1), "Unhealthy")
        ]
        assert report.findings[0].taint is not None
        assert report.findings[0].taint.key == HAMI_REGISTER
        # HAMi's nvidia.com/gpu counts shares (20 per node): never compared with the 2 GPUs.
        assert [n.node for n in report.nodes] == [n1]
        assert "1 GPU(s) registered by HAMi" in report.nodes[0].message

        # A pod's share id `<UUID>-<i>` (HAMi's plugin) is of the GPU its record names.
        make_pod(rs, "desk", n1, [{"resourceID": f"{gpu_uuid(n1, 0)}-3", "health": "Unhealthy"}])
        allocated = {"hami.io/vgpu-devices-allocated": f"{gpu_uuid(n1, 0)},NVIDIA,1000,0:;"}
        api.patch_namespaced_pod("desk", "ml", {"metadata": {"annotations": allocated}})
        report = sweep(rs)
        assert sorted((f.kind, f.gpu_uuid) for f in report.findings) == sorted(
            [("hami-health", gpu_uuid(n0, 1)), ("pod-health", gpu_uuid(n1, 0))]
        )

        api.patch_node(n1, {"metadata": {"annotations": {HAMI_REGISTER: "GPU-1,10:"}}})
        report = sweep(rs)
        assert [n.node for n in report.nodes] == [n1]
        assert "unreadable, not acting on a guess" in report.nodes[0].message


@pytest.fixture
def dra_unique(tmp_path: Path) -> Iterator[RunningTwin]:
    """Node names no other test uses, so the device workflow id is fresh on the shared server."""
    prefix = f"sweep-{uuid.uuid4().hex[:6]}-"
    with running_twin(tmp_path, profile="1.36", nodes=2, gpus_per_node=2, node_prefix=prefix) as rs:
        yield rs


@pytest.mark.devserver
async def test_sweep_workflow_starts_exactly_one(
    dra_unique: RunningTwin, dev_env: WorkflowEnvironment
) -> None:
    dra = dra_unique
    n0, _ = node_names(dra)
    make_pod(
        dra,
        "trainer-0",
        n0,
        [{"resourceID": f"{DRIVER}/{n0}/gpu-1", "health": "Unhealthy", "message": "XID 79"}],
    )
    # A second pod on the same (time-shared) device: still one device, one workflow.
    make_pod(
        dra,
        "trainer-1",
        n0,
        [{"resourceID": f"{DRIVER}/{n0}/gpu-1", "health": "Unhealthy", "message": "XID 79"}],
    )
    client = dev_env.client
    sweep_queue = f"sweep-e2e-{uuid.uuid4().hex[:8]}"
    device_queue = f"devices-{uuid.uuid4().hex[:8]}"  # no worker: the remediation just waits
    wid = device_workflow_id(n0, gpu_uuid(n0, 1))
    assert await count_runs(client, f"WorkflowId = '{wid}'") == 0
    async with Worker(
        client,
        task_queue=sweep_queue,
        workflows=[HealthSweepWorkflow],
        activities=[
            SweepActivities(kube_for(dra)).sweep_cluster,
            LaunchActivities(client, device_queue).signal_with_start_remediation,
        ],
    ):
        results = []
        for i in range(2):
            results.append(
                await client.execute_workflow(
                    HealthSweepWorkflow.run,
                    SweepInput(task_queue=device_queue),
                    id=f"sweep-e2e-{uuid.uuid4().hex[:8]}-{i}",
                    task_queue=sweep_queue,
                    result_type=SweepResult,
                )
            )
    first, second = results
    assert first.started == [wid] and first.signalled == []
    assert second.started == [] and second.signalled == [wid]
    assert await count_runs(client, f"TaskQueue = '{device_queue}'", expect=1) == 1
    assert await history_counts(client, wid) == {"started": 1, "signaled": 2}
    desc = await client.get_workflow_handle(wid).describe()
    assert desc.workflow_type == "remediate-gpu-device"
    await client.get_workflow_handle(wid).terminate("test done")
