"""The twin's `hami` profile (twin/hami.py, twin/controllers/hami.py): HAMi's device plugin and
scheduler as HAMi v2.10 writes their annotations.

Cases:
- two binpacked pods share one GPU: the scheduler's choice is in `hami.io/vgpu-devices-allocated`
  (`UUID,NVIDIA,MB,cores:;`), `-to-allocate` is emptied and `bind-phase` is `success` once the
  container runs, and each pod's device id is a share (`<UUID>-<i>`) of the recorded GPU;
- a failed GPU is registered without `health` (omitempty false) at the next registration and
  new pods avoid it; a vanished GPU leaves the registration;
- a GPU in the node's `hami.io/device-cordon` takes no new share, and the cordon survives the
  device plugin's re-registration; `nvidia.com/nouse-gpuuuid` rules a GPU out for one pod.
"""

from __future__ import annotations

import json
from typing import Any

from tests.twin_controllers.conftest import eventually
from twin import hami

NODE = "gpu-pool-node-0"


def _pod(t: Any, ns: str, name: str, annotations: dict[str, str] | None = None) -> None:
    t.core.create_namespaced_pod(
        ns,
        {
            "metadata": {
                "name": name,
                "annotations": {hami.ANN_POLICY: "binpack", **(annotations or {})},
            },
            "spec": {
                "schedulerName": hami.SCHEDULER_NAME,
                "containers": [
                    {
                        "name": "main",
                        "image": "cuda:12",
                        "resources": {
                            "limits": {"nvidia.com/gpu": "1", hami.MEM_RESOURCE: "20000"}
                        },
                    }
                ],
            },
        },
    )


def _running(t: Any, ns: str, name: str) -> Any:
    def check() -> Any:
        pod = t.core.read_namespaced_pod(name, ns)
        assert pod.status.phase == "Running"
        assert pod.metadata.annotations.get(hami.ANN_BIND_PHASE) == "success"
        return pod

    return eventually(check)


def _register(t: Any) -> list[dict[str, Any]]:
    node = t.core.read_node(NODE)
    return list(json.loads(node.metadata.annotations[hami.ANN_REGISTER]))


def _uuids(t: Any) -> list[str]:
    return [g["id"] for g in _register(t)]


def test_binpacked_pods_share_one_gpu_recorded_as_hami_writes_it(twin: Any) -> None:
    t = twin(profile="hami")
    ns = t.namespace()
    first = _uuids(t)[0]
    for name in ("a", "b"):
        _pod(t, ns, name)
    for name in ("a", "b"):
        pod = _running(t, ns, name)
        ann = pod.metadata.annotations
        assert ann[hami.ANN_ALLOCATED] == f"{first},NVIDIA,20000,0:;"
        assert ann[hami.ANN_TO_ALLOCATE] == ";"  # the device plugin took the container's share
        assert ann[hami.ANN_ASSIGNED_NODE] == NODE and ann[hami.ANN_BIND_TIME].isdigit()
        [status] = pod.status.container_statuses[0].allocated_resources_status
        [res] = status.resources
        assert res.resource_id.rsplit("-", 1)[0] == first  # a share of the recorded GPU
    node = t.core.read_node(NODE)
    assert node.status.capacity["nvidia.com/gpu"] == str(2 * hami.SPLIT_COUNT)


def test_failed_gpu_registered_unhealthy_and_avoided_vanished_gpu_unregistered(twin: Any) -> None:
    t = twin(profile="hami")
    ns = t.namespace()
    first, second = _uuids(t)
    t.twin("POST", "/twin/faults", {"node": NODE, "gpu": "0", "xid": 79}).raise_for_status()

    def unhealthy() -> bool:
        by_id = {g["id"]: g for g in _register(t)}
        assert "health" not in by_id[first]  # Go omitempty: false is not written
        assert by_id[second]["health"] is True
        return True

    eventually(unhealthy)
    _pod(t, ns, "after")
    pod = _running(t, ns, "after")
    assert pod.metadata.annotations[hami.ANN_ALLOCATED].startswith(second + ",")
    t.twin("POST", "/twin/faults", {"node": NODE, "gpu": "1", "vanish": True}).raise_for_status()
    eventually(lambda: _uuids(t) == [first])


def test_device_cordon_is_honoured_and_survives_reregistration(twin: Any) -> None:
    t = twin(profile="hami")
    ns = t.namespace()
    first, second = _uuids(t)
    t.core.patch_node(NODE, {"metadata": {"annotations": {hami.ANN_DEVICE_CORDON: first}}})
    before = t.manager.hami.registrations[NODE]
    eventually(lambda: t.manager.hami.registrations[NODE] > before)  # the plugin rewrote it
    assert t.core.read_node(NODE).metadata.annotations[hami.ANN_DEVICE_CORDON] == first
    _pod(t, ns, "steered")
    assert (
        _running(t, ns, "steered").metadata.annotations[hami.ANN_ALLOCATED].startswith(second + ",")
    )
    # Per pod: ruling out the only uncordoned GPU leaves nothing.
    _pod(t, ns, "stuck", {hami.ANN_NOUSE_UUID: second})

    def unschedulable() -> str:
        pod = t.core.read_namespaced_pod("stuck", ns)
        [cond] = [c for c in pod.status.conditions if c.type == "PodScheduled"]
        assert cond.status == "False" and "CardInsufficient" in cond.message
        return str(cond.message)

    eventually(unschedulable)
    t.core.patch_node(NODE, {"metadata": {"annotations": {hami.ANN_DEVICE_CORDON: None}}})
    assert _running(t, ns, "stuck").metadata.annotations[hami.ANN_ALLOCATED].startswith(first + ",")
