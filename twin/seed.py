"""Seed a cluster: namespaces, GPU nodes in node pools, DeviceClasses and ResourceSlices.

DRA profiles publish one ResourceSlice per node in the shape of the NVIDIA DRA driver
(driver `gpu.nvidia.com`, pool = node name, devices `gpu-<i>` with the attributes it publishes:
type, uuid "GPU-<uuid>", index, minor, productName, brand, architecture, cudaComputeCapability,
driverVersion, cudaDriverVersion, pcieBusID, and capacity memory). The device-plugin profile
instead gives nodes `nvidia.com/gpu` capacity/allocatable and no DRA objects; the GPU UUIDs
(the device plugin's device IDs) are listed in the node annotation `sickbay.dev/gpu-uuids`.
The `hami` profile adds HAMi's device plugin on top (twin/hami.py): nvidia.com/gpu counts
shares (GPUs x split count) and `hami.io/node-nvidia-register` registers the GPUs.

Topologies (several devices per physical GPU, each carrying `parentUUID` = the GPU's uuid):
- `full`      : one device per GPU (default).
- `mig`       : `slices_per_gpu` MIG devices `gpu-<i>-mig-<j>` (type "mig", uuid "MIG-<uuid>",
                profile, parentIndex) under DeviceClass `mig.nvidia.com`.
- `vgpu`      : `slices_per_gpu` devices `gpu-<i>-vgpu-<j>` (type "vgpu").
- `timeslice` : `slices_per_gpu` devices `gpu-<i>-ts-<j>` (type "gpu") sharing the GPU's uuid.
UUIDs are derived from node name and index (uuid5), so a seed is reproducible.

NVSwitch baseboards (`nvswitch: true`, HGX H100/H200/B200): a GPU cannot be reset alone, the
whole baseboard resets together. The NVIDIA DRA driver publishes no attribute saying so, so
the twin publishes Sickbay's convention: the device attribute `sickbay.dev/resetGroup` (string,
`<node>/baseboard-0`, the same on every device of the group) and, for the device plugin, the
node label `sickbay.dev/gpu-reset-group: node` (every GPU of the node is one group).

YAML description (`sickbay-dev twin up --seed FILE`)::

    pools:
      - name: h100-pool
        nodes: 2
        gpusPerNode: 8
        product: NVIDIA H100 80GB HBM3
        memory: 81559Mi
        topology: full          # full | mig | vgpu | timeslice
        slicesPerGpu: 2
        nvswitch: false         # true: HGX baseboard, every GPU of a node resets together
"""

from __future__ import annotations

import uuid
from pathlib import Path
from typing import Any

import yaml

from twin import hami
from twin.discovery import Profile
from twin.store import Store, format_time

DRIVER = "gpu.nvidia.com"
MIG_CLASS = "mig.nvidia.com"
POOL_LABEL = "sickbay.dev/node-pool"
GKE_POOL_LABEL = "cloud.google.com/gke-nodepool"
GPU_UUIDS_ANNOTATION = "sickbay.dev/gpu-uuids"
# Sickbay's reset-group convention (contract/repair_rungs.py has the same names).
RESET_GROUP_ATTRIBUTE = "sickbay.dev/resetGroup"
RESET_GROUP_LABEL = "sickbay.dev/gpu-reset-group"
SYSTEM_NAMESPACES = ("default", "kube-system", "kube-public", "kube-node-lease")
TOPOLOGIES = ("full", "mig", "vgpu", "timeslice")
_NS = uuid.UUID("6f1c54f4-5ad9-4a55-9c57-7f7b0c6e2a11")

_PRODUCTS = {
    "NVIDIA H100 80GB HBM3": ("Hopper", "9.0.0", "81559Mi", "a3-highgpu-8g"),
    "NVIDIA A100-SXM4-40GB": ("Ampere", "8.0.0", "40960Mi", "a2-highgpu-8g"),
    "Tesla T4": ("Turing", "7.5.0", "15360Mi", "n1-standard-8-t4"),
    "NVIDIA L4": ("Ada Lovelace", "8.9.0", "23034Mi", "g2-standard-8"),
}
DEFAULT_PRODUCT = "NVIDIA H100 80GB HBM3"
DRIVER_VERSION = "580.65.6"
CUDA_DRIVER_VERSION = "13.0.0"


def ensure_system_namespaces(store: Store) -> None:
    for name in SYSTEM_NAMESPACES:
        if store.try_get("namespaces", name) is None:
            store.create("namespaces", {"metadata": {"name": name}})
    if store.try_get("services", "kubernetes", "default") is None:
        store.create("services", kubernetes_service(), "default")


def kubernetes_service() -> dict[str, Any]:
    """The `default/kubernetes` Service every apiserver keeps (its first service IP)."""
    return {
        "metadata": {
            "name": "kubernetes",
            "labels": {"component": "apiserver", "provider": "kubernetes"},
        },
        "spec": {
            "type": "ClusterIP",
            "clusterIP": "10.96.0.1",
            "clusterIPs": ["10.96.0.1"],
            "ipFamilies": ["IPv4"],
            "ipFamilyPolicy": "SingleStack",
            "internalTrafficPolicy": "Cluster",
            "sessionAffinity": "None",
            "ports": [{"name": "https", "port": 443, "protocol": "TCP", "targetPort": 6443}],
        },
        "status": {"loadBalancer": {}},
    }


def gpu_uuid(node: str, index: int) -> str:
    return "GPU-" + str(uuid.uuid5(_NS, f"{node}/{index}"))


def _attr(kind: str, value: Any) -> dict[str, Any]:
    return {kind: value}


def _gpu_attributes(node: str, i: int, product: str, arch: str, cc: str) -> dict[str, Any]:
    return {
        "type": _attr("string", "gpu"),
        "uuid": _attr("string", gpu_uuid(node, i)),
        "index": _attr("int", i),
        "minor": _attr("int", i),
        "productName": _attr("string", product),
        "brand": _attr("string", "Nvidia"),
        "architecture": _attr("string", arch),
        "cudaComputeCapability": _attr("version", cc),
        "driverVersion": _attr("version", DRIVER_VERSION),
        "cudaDriverVersion": _attr("version", CUDA_DRIVER_VERSION),
        "pcieBusID": _attr("string", f"0000:{0x18 + i * 0x10 % 0xE0:02x}:00.0"),
        "resource.kubernetes.io/pcieRoot": _attr("string", f"pci0000:{i // 2:02x}"),
    }


def _devices(
    node: str,
    gpus: int,
    product: str,
    memory: str,
    topology: str,
    slices: int,
    nvswitch: bool = False,
    ident: str | None = None,
) -> list[dict[str, Any]]:
    arch, cc, _default_mem, _ = _PRODUCTS.get(product, ("Hopper", "9.0.0", memory, ""))
    devices: list[dict[str, Any]] = []
    ident = ident or node  # what the UUIDs derive from: a recreated VM has new GPUs
    for i in range(gpus):
        base = _gpu_attributes(ident, i, product, arch, cc)
        if nvswitch:
            base[RESET_GROUP_ATTRIBUTE] = _attr("string", f"{node}/baseboard-0")
        parent = gpu_uuid(ident, i)
        if topology == "full":
            devices.append(
                {"name": f"gpu-{i}", "attributes": base, "capacity": {"memory": {"value": memory}}}
            )
            continue
        for j in range(slices):
            attrs = dict(base)
            attrs["parentUUID"] = _attr("string", parent)
            attrs["parentIndex"] = _attr("int", i)
            if topology == "mig":
                name = f"gpu-{i}-mig-{j}"
                attrs["type"] = _attr("string", "mig")
                attrs["uuid"] = _attr(
                    "string", "MIG-" + str(uuid.uuid5(_NS, f"{ident}/{i}/mig/{j}"))
                )
                attrs["profile"] = _attr("string", f"{max(1, 7 // slices)}g.{80 // slices}gb")
            elif topology == "vgpu":
                name = f"gpu-{i}-vgpu-{j}"
                attrs["type"] = _attr("string", "vgpu")
                attrs["uuid"] = _attr("string", str(uuid.uuid5(_NS, f"{ident}/{i}/vgpu/{j}")))
            else:  # timeslice: replicas share the physical GPU's uuid
                name = f"gpu-{i}-ts-{j}"
            devices.append(
                {"name": name, "attributes": attrs, "capacity": {"memory": {"value": memory}}}
            )
    return devices


def node_object(
    name: str,
    pool: str,
    gpus: int,
    product: str,
    profile: Profile,
    zone: str = "us-central1-a",
    nvswitch: bool = False,
    ident: str | None = None,
) -> dict[str, Any]:
    _arch, _cc, _mem, instance = _PRODUCTS.get(product, ("", "", "", "gpu-node"))
    labels = {
        "kubernetes.io/hostname": name,
        "kubernetes.io/os": "linux",
        "kubernetes.io/arch": "amd64",
        "node.kubernetes.io/instance-type": instance or "gpu-node",
        "topology.kubernetes.io/zone": zone,
        POOL_LABEL: pool,
        GKE_POOL_LABEL: pool,
        "nvidia.com/gpu.present": "true",
        "nvidia.com/gpu.product": product.replace(" ", "-"),
        "nvidia.com/gpu.count": str(gpus),
    }
    if nvswitch:
        labels[RESET_GROUP_LABEL] = "node"
    capacity = {"cpu": "208", "memory": "1871Gi", "pods": "110", "ephemeral-storage": "500Gi"}
    allocatable = {"cpu": "207", "memory": "1850Gi", "pods": "110", "ephemeral-storage": "460Gi"}
    annotations: dict[str, str] = {}
    if not profile.dra:
        capacity["nvidia.com/gpu"] = str(gpus)
        allocatable["nvidia.com/gpu"] = str(gpus)
        annotations[GPU_UUIDS_ANNOTATION] = ",".join(
            gpu_uuid(ident or name, i) for i in range(gpus)
        )
    if profile.hami:
        _hami_node(labels, capacity, allocatable, annotations, name, gpus, product, ident)
    minor = profile.minor
    meta: dict[str, Any] = {"name": name, "labels": labels}
    if annotations:
        meta["annotations"] = annotations
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": meta,
        "spec": {"providerID": f"gce://sickbay-twin/{zone}/{name}"},
        "status": {
            "capacity": capacity,
            "allocatable": allocatable,
            "conditions": [
                {
                    "type": "Ready",
                    "status": "True",
                    "reason": "KubeletReady",
                    "message": "kubelet is posting ready status",
                }
            ],
            "addresses": [
                {"type": "InternalIP", "address": "10.0.0.1"},
                {"type": "Hostname", "address": name},
            ],
            "nodeInfo": {
                "kubeletVersion": f"v1.{minor}.0",
                "kubeProxyVersion": f"v1.{minor}.0",
                "containerRuntimeVersion": "containerd://2.1.0",
                "operatingSystem": "linux",
                "architecture": "amd64",
                "osImage": "Ubuntu 24.04 LTS",
                "kernelVersion": "6.8.0",
                "machineID": "",
                "systemUUID": "",
                # /proc/sys/kernel/random/boot_id of the first boot; a reboot brings a new one
                "bootID": str(uuid.uuid5(_NS, f"{ident or name}/boot")),
            },
        },
    }


def resource_slice(
    node: str, devices: list[dict[str, Any]], node_uid: str | None = None
) -> dict[str, Any]:
    """The driver's slice for one node; owned by the Node (as the kubelet plugin sets it), so
    deleting the node garbage-collects its slice."""
    meta: dict[str, Any] = {"name": f"{node}-{DRIVER}"}
    if node_uid:
        meta["ownerReferences"] = [
            {"apiVersion": "v1", "kind": "Node", "name": node, "uid": node_uid, "controller": True}
        ]
    return {
        "metadata": meta,
        "spec": {
            "driver": DRIVER,
            "nodeName": node,
            "pool": {"name": node, "generation": 1, "resourceSliceCount": 1},
            "devices": devices,
        },
    }


def ensure_device_classes(store: Store, mig: bool = False) -> None:
    classes = {
        DRIVER: f"device.driver == '{DRIVER}' && device.attributes['{DRIVER}'].type == 'gpu'",
    }
    if mig:
        classes[MIG_CLASS] = (
            f"device.driver == '{DRIVER}' && device.attributes['{DRIVER}'].type == 'mig'"
        )
    for name, expr in classes.items():
        if store.try_get("deviceclasses.resource.k8s.io", name) is None:
            store.create(
                "deviceclasses.resource.k8s.io",
                {
                    "metadata": {"name": name},
                    "spec": {"selectors": [{"cel": {"expression": expr}}]},
                },
            )


def product_memory_mb(product: str) -> int:
    """A product's memory in MB (HAMi registers MB; the table's Mi is close enough)."""
    mem = _PRODUCTS.get(product, ("", "", "81559Mi", ""))[2]
    return int(mem.removesuffix("Mi"))


def _hami_node(
    labels: dict[str, str],
    capacity: dict[str, str],
    allocatable: dict[str, str],
    annotations: dict[str, str],
    name: str,
    gpus: int,
    product: str,
    ident: str | None,
) -> None:
    """HAMi's device plugin on the node: `gpu=on`, every GPU split SPLIT_COUNT ways, and its
    first registration (the HAMi controller rewrites it every REGISTER_PERIOD)."""
    labels[hami.DEVICE_LABEL] = "on"
    shares = str(gpus * hami.SPLIT_COUNT)
    capacity["nvidia.com/gpu"] = allocatable["nvidia.com/gpu"] = shares
    annotations[hami.ANN_REGISTER] = hami.register_value(
        [
            {
                "uuid": gpu_uuid(ident or name, i),
                "index": i,
                "devmem": product_memory_mb(product),
                "type": f"NVIDIA-{product}",
                "healthy": True,
            }
            for i in range(gpus)
        ]
    )


def add_node(
    store: Store,
    profile: Profile,
    name: str,
    pool: str = "gpu-pool",
    gpus: int = 2,
    product: str = DEFAULT_PRODUCT,
    memory: str | None = None,
    topology: str = "full",
    slices_per_gpu: int = 2,
    nvswitch: bool = False,
    ident: str | None = None,
) -> dict[str, Any]:
    """Create one node (and its ResourceSlice on DRA profiles). Used by seeding and scale-up.
    `ident` (default the name) is what the GPU UUIDs derive from: a VM recreated under the
    same name has other GPUs."""
    if topology not in TOPOLOGIES:
        raise ValueError(f"unknown topology {topology!r}: choose one of {', '.join(TOPOLOGIES)}")
    mem = memory or _PRODUCTS.get(product, ("", "", "81559Mi", ""))[2]
    body = node_object(name, pool, gpus, product, profile, nvswitch=nvswitch, ident=ident)
    # A registered node has posted Ready once: its condition carries the times (a Ready
    # without lastTransitionTime would read as "Ready since its first heartbeat").
    stamp = format_time(store.now())
    for cond in body["status"]["conditions"]:
        cond.setdefault("lastHeartbeatTime", stamp)
        cond.setdefault("lastTransitionTime", stamp)
    node = store.create("nodes", body)
    if profile.dra and gpus > 0:
        devices = _devices(name, gpus, product, mem, topology, slices_per_gpu, nvswitch, ident)
        store.create(
            "resourceslices.resource.k8s.io",
            resource_slice(name, devices, node["metadata"]["uid"]),
        )
    return node


def seed_cluster(
    store: Store,
    profile: Profile,
    nodes: int = 2,
    gpus_per_node: int = 2,
    pool: str = "gpu-pool",
    product: str = DEFAULT_PRODUCT,
    memory: str | None = None,
    topology: str = "full",
    slices_per_gpu: int = 2,
    node_prefix: str | None = None,
    pools: list[dict[str, Any]] | None = None,
    nvswitch: bool = False,
) -> dict[str, Any]:
    """Seed nodes/slices; returns a summary {nodes: [...], devices: n, pools: {...}}."""
    ensure_system_namespaces(store)
    specs = pools or [
        {
            "name": pool,
            "nodes": nodes,
            "gpusPerNode": gpus_per_node,
            "product": product,
            "memory": memory,
            "topology": topology,
            "slicesPerGpu": slices_per_gpu,
            "nodePrefix": node_prefix,
            "nvswitch": nvswitch,
        }
    ]
    if profile.dra:
        ensure_device_classes(store, mig=any(p.get("topology") == "mig" for p in specs))
    names: list[str] = []
    summary: dict[str, Any] = {"nodes": names, "pools": {}, "profile": profile.name}
    for spec in specs:
        pname = str(spec.get("name") or "gpu-pool")
        prefix = spec.get("nodePrefix") or f"{pname}-node-"
        count = int(spec.get("nodes", 1))
        gpus = int(spec.get("gpusPerNode", spec.get("gpus_per_node", 1)))
        pool_nodes: list[str] = []
        i = 0
        while len(pool_nodes) < count:
            name = f"{prefix}{i}"
            i += 1
            if store.try_get("nodes", name) is not None:
                continue  # seeding again grows the pool with the next free names
            add_node(
                store,
                profile,
                name,
                pname,
                gpus,
                str(spec.get("product") or DEFAULT_PRODUCT),
                spec.get("memory"),
                str(spec.get("topology") or "full"),
                int(spec.get("slicesPerGpu", 2)),
                bool(spec.get("nvswitch", False)),
            )
            pool_nodes.append(name)
        names.extend(pool_nodes)
        summary["pools"][pname] = {"nodes": pool_nodes, "gpusPerNode": gpus}
    return summary


def seed_from_yaml(store: Store, profile: Profile, path: Path) -> dict[str, Any]:
    data = yaml.safe_load(path.read_text()) or {}
    if not isinstance(data, dict) or not isinstance(data.get("pools"), list):
        raise ValueError(f"{path}: expected a mapping with a 'pools' list")
    return seed_cluster(store, profile, pools=data["pools"])
