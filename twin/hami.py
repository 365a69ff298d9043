"""HAMi (Project-HAMi vGPU sharing) in the twin: the annotation formats its device plugin and
scheduler write, shared by the seed, the kubelet stand-in, the fault injector and the HAMi
controller (twin/controllers/hami.py).

What the `hami` profile serves, as HAMi v2.10 writes it:
- nodes advertise `nvidia.com/gpu` = GPUs x split count (HAMi's plugin lists `<UUID>-<i>`
  device ids, `SPLIT_COUNT` per GPU) and carry `hami.io/node-nvidia-register`, a JSON list of
  the GPUs (Go `omitempty`: zero numbers and a false `health` are left out), rewritten every
  `REGISTER_PERIOD` simulated seconds with each GPU's health (a vanished GPU is left out);
- a pod with `schedulerName: hami-scheduler` gets the scheduler's choice in
  `hami.io/vgpu-devices-to-allocate` and `hami.io/vgpu-devices-allocated`
  (`UUID,NVIDIA,memory MB,cores:` per GPU, `;` after each container), `hami.io/vgpu-node`,
  `hami.io/vgpu-time`, then `hami.io/bind-phase: allocating` and `hami.io/bind-time` when it
  is bound; the device plugin empties `-to-allocate` and sets `bind-phase: success` when the
  container starts;
- the scheduler skips GPUs registered unhealthy, GPUs in the node's `hami.io/device-cordon`
  (v2.10) and GPUs a pod's `nvidia.com/use-gpuuuid` / `nvidia.com/nouse-gpuuuid` rule out.
"""

from __future__ import annotations

import json
from typing import Any

SCHEDULER_NAME = "hami-scheduler"
SPLIT_COUNT = 10  # HAMi's default deviceSplitCount
REGISTER_PERIOD = 30.0  # simulated seconds between the device plugin's registrations
VENDOR = "NVIDIA"
MODE = "hami-core"

ANN_ALLOCATED = "hami.io/vgpu-devices-allocated"
ANN_TO_ALLOCATE = "hami.io/vgpu-devices-to-allocate"
ANN_ASSIGNED_NODE = "hami.io/vgpu-node"
ANN_ASSIGNED_TIME = "hami.io/vgpu-time"
ANN_BIND_PHASE = "hami.io/bind-phase"
ANN_BIND_TIME = "hami.io/bind-time"
ANN_REGISTER = "hami.io/node-nvidia-register"
ANN_DEVICE_CORDON = "hami.io/device-cordon"
ANN_USE_UUID = "nvidia.com/use-gpuuuid"
ANN_NOUSE_UUID = "nvidia.com/nouse-gpuuuid"
ANN_POLICY = "hami.io/gpu-scheduler-policy"  # per pod: binpack | spread (default spread)
MEM_RESOURCE = "nvidia.com/gpumem"  # MB per GPU share
CORES_RESOURCE = "nvidia.com/gpucores"  # percent of the GPU's cores per share
DEVICE_LABEL = "gpu"  # HAMi's device-plugin DaemonSet selects nodes labelled gpu=on


def device_ids(uuid: str, count: int = SPLIT_COUNT) -> list[str]:
    """The device ids HAMi's plugin lists for one GPU (kubelet allocates from these)."""
    return [f"{uuid}-{i}" for i in range(count)]


def uuid_of_device_id(device_id: str) -> str:
    return device_id.rsplit("-", 1)[0]


def register_value(gpus: list[dict[str, Any]]) -> str:
    """The v2.8+ JSON registration of `gpus` ({uuid, index, devmem, type, healthy}), with
    Go's omitempty: zero numbers, empty strings and false booleans are not written."""
    out = []
    for g in gpus:
        entry: dict[str, Any] = {
            "id": g["uuid"],
            "index": g.get("index", 0),
            "count": g.get("count", SPLIT_COUNT),
            "devmem": g["devmem"],
            "devcore": g.get("devcore", 100),
            "type": g["type"],
            "numa": g.get("numa", 0),
            "mode": MODE,
            "health": bool(g["healthy"]),
        }
        out.append({k: v for k, v in entry.items() if v not in (0, "", False)})
    return json.dumps(out, separators=(",", ":"))


def registered_gpus(node: dict[str, Any]) -> list[dict[str, Any]]:
    """The GPUs in a node's registration, as the scheduler reads them (missing keys are the
    Go zero values)."""
    raw = ((node.get("metadata") or {}).get("annotations") or {}).get(ANN_REGISTER)
    if not raw:
        return []
    try:
        data = json.loads(raw)
    except ValueError:
        return []
    return (
        [d for d in data if isinstance(d, dict) and d.get("id")] if isinstance(data, list) else []
    )


def encode_allocation(containers: list[list[tuple[str, int, int]]]) -> str:
    """`UUID,NVIDIA,memory,cores:` per GPU, `;` after each container (also an empty one)."""
    return "".join(
        "".join(f"{uuid},{VENDOR},{mem},{cores}:" for uuid, mem, cores in devices) + ";"
        for devices in containers
    )


def allocation(value: str) -> list[tuple[str, int, int]]:
    """(uuid, memory, cores) of every GPU share in an allocation annotation."""
    out = []
    for segment in value.split(";"):
        for entry in segment.split(":"):
            fields = entry.split(",")
            if len(fields) == 4 and fields[0]:
                try:
                    out.append((fields[0], int(fields[2]), int(fields[3])))
                except ValueError:
                    continue
    return out


def allocated_uuids(pod: dict[str, Any]) -> set[str]:
    value = ((pod.get("metadata") or {}).get("annotations") or {}).get(ANN_ALLOCATED) or ""
    return {uuid for uuid, _, _ in allocation(value)}


def uuid_list(value: str | None) -> set[str]:
    return {u.strip() for u in (value or "").split(",") if u.strip()}
