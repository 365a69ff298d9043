"""Resolving devices against the cluster twin over HTTP, every profile (1.34-1.37, device plugin).

Cases:
- node + GPU UUID and node + GPU index resolve to the same physical GPU (uuid, index, node
  pool, device class, served DeviceTaintRule version per profile);
- DRA name driver/pool/device resolves to the same GPU (DRA profiles);
- MIG topology: the group holds every slice of the GPU; a MIG slice's own uuid resolves to
  its physical GPU;
- unknown UUID, unknown node, out-of-range index -> non-retryable ERR_DEVICE_NOT_FOUND whose
  message names what was looked for.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from temporalio.exceptions import ApplicationError

from contract.errors import ERR_DEVICE_NOT_FOUND
from contract.kube import DeviceRef, ResolveDeviceInput
from tests.activities.kube.conftest import KubeTwin, twin

EXPECTED_TAINT_VERSION = {
    "1.34": None,
    "1.35": "v1alpha3",
    "1.36": "v1beta2",
    "1.37": "v1",
    "device-plugin": None,
}


async def _resolve(t: KubeTwin, **ref: object):
    return await t.run(t.acts.resolve_device, ResolveDeviceInput(device=DeviceRef(**ref)))


async def test_resolve_by_uuid_and_index(cluster: KubeTwin) -> None:
    node = cluster.node(1)
    uuid = cluster.uuid_of(node, 1)
    by_uuid = await _resolve(cluster, node=node, gpu_uuid=uuid)
    by_index = await _resolve(cluster, node=node, gpu_index=1)
    assert by_uuid == by_index
    assert (by_uuid.node, by_uuid.gpu_uuid, by_uuid.gpu_index) == (node, uuid, 1)
    assert by_uuid.node_pool == "gpu-pool"
    assert by_uuid.taint_api_version == EXPECTED_TAINT_VERSION[cluster.twin.profile.name]
    if cluster.dra:
        assert by_uuid.mode == "dra"
        assert [d.resource_id for d in by_uuid.devices] == [f"gpu.nvidia.com/{node}/gpu-1"]
        assert by_uuid.device_class == "gpu.nvidia.com"
        by_name = await _resolve(cluster, driver="gpu.nvidia.com", pool=node, device="gpu-1")
        assert by_name == by_uuid
    else:
        assert by_uuid.mode == "device-plugin" and by_uuid.devices == []


async def test_unknown_devices_are_not_found(cluster: KubeTwin) -> None:
    node = cluster.node(0)
    for ref, words in (
        ({"node": node, "gpu_uuid": "GPU-does-not-exist"}, "GPU-does-not-exist"),
        ({"node": "no-such-node", "gpu_uuid": "GPU-x"}, "no-such-node"),
        ({"node": node, "gpu_index": 7}, "7"),
    ):
        with pytest.raises(ApplicationError) as info:
            await _resolve(cluster, **ref)
        assert info.value.type == ERR_DEVICE_NOT_FOUND
        assert info.value.non_retryable
        assert words in str(info.value)


async def test_mig_group(tmp_path: Path) -> None:
    with twin(tmp_path, "1.36", nodes=1, gpus_per_node=2, topology="mig", slices_per_gpu=3) as t:
        node = t.node(0)
        physical = t.slice_device(node, "gpu-1-mig-0")["attributes"]["parentUUID"]["string"]
        resolved = await _resolve(t, node=node, gpu_uuid=physical)
        assert [d.device for d in resolved.devices] == [f"gpu-1-mig-{j}" for j in range(3)]
        assert resolved.gpu_index == 1
        assert resolved.device_class == "mig.nvidia.com"
        slice_uuid = t.slice_device(node, "gpu-1-mig-2")["attributes"]["uuid"]["string"]
        assert (await _resolve(t, node=node, gpu_uuid=slice_uuid)) == resolved
        assert (await _resolve(t, node=node, gpu_index=1)) == resolved


@pytest.mark.parametrize("profile", ["1.36", "device-plugin"])
async def test_exporter_pod_name_resolves_to_its_node(tmp_path: Path, profile: str) -> None:
    """dcgm-exporter without NODE_NAME labels `Hostname` with its own pod's name: a name that
    is no node but is a pod resolves to that pod's spec.nodeName; two pods of that name on
    different nodes are ambiguous (not found, both named)."""
    with twin(tmp_path, profile) as t:
        node = t.node(1)
        uuid = t.uuid_of(node, 0)
        t.namespace("gpu-operator")
        exporter = "nvidia-dcgm-exporter-7xk2p"
        t.store.create(
            "pods",
            {
                "metadata": {"name": exporter, "namespace": "gpu-operator"},
                "spec": {"nodeName": node, "containers": [{"name": "exporter", "image": "d"}]},
                "status": {"phase": "Running"},
            },
            namespace="gpu-operator",
        )
        got = await _resolve(t, node=exporter, gpu_uuid=uuid)
        assert (got.node, got.gpu_uuid) == (node, uuid)

        t.namespace("monitoring")
        t.store.create(
            "pods",
            {
                "metadata": {"name": exporter, "namespace": "monitoring"},
                "spec": {"nodeName": t.node(0), "containers": [{"name": "e", "image": "d"}]},
                "status": {"phase": "Running"},
            },
            namespace="monitoring",
        )
        with pytest.raises(ApplicationError) as info:
            await _resolve(t, node=exporter, gpu_uuid=uuid)
        assert info.value.type == ERR_DEVICE_NOT_FOUND
        assert "gpu-operator" in str(info.value) and "monitoring" in str(info.value)
