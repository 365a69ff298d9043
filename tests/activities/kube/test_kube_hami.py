"""HAMi-shared GPUs (twin profile `hami`) through the real activities over HTTP.

Cases:
- resolve: a node HAMi registers is `hami`; UUID <-> index from the registration; a UUID it
  does not register (and no pod holds) is not found; an unreadable registration is refused;
- consumers: exactly the pods whose `hami.io/vgpu-devices-allocated` names the GPU (every
  share, also a second container's), not the node's other GPU pods nor an alert's hint; a
  record that does not parse stops the step (HamiAnnotationUnreadable), never a guess;
- evidence: HAMi's registered `health` false is a `hami.io/node-nvidia-register=health=false`
  entry (device evidence like a driver taint), check_health Unhealthy; a GPU no longer
  registered is not present (vanished);
- quarantine with the per-GPU cordon: the UUID in `hami.io/device-cordon`, consumers evicted,
  the node untainted, the budget counting physical GPUs (not shares); release takes out only
  Sickbay's UUID (an administrator's stays);
- quarantine without it: the node tainted NoSchedule with `node_level` saying why; release
  lifts the taint;
- repair holders: a HAMi pod holds only the GPU its record names; the node's GPUs are the
  registered ones;
- a replacement HAMi places on the quarantined GPU again is reported as on a tainted device;
- a node Volcano's vGPU plugin registers: consumers from `volcano.sh/vgpu-ids-new`, and the
  quarantine taints the node (Volcano has no per-GPU cordon) saying why.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from temporalio.exceptions import ApplicationError

from activities.kube import KubeActivities, KubeSettings, hami, repair_jobs
from contract.errors import ERR_DEVICE_NOT_FOUND, ERR_HAMI_UNREADABLE
from contract.kube import (
    CheckHealthInput,
    CountDevicesInput,
    DeviceRef,
    EvidenceInput,
    FindConsumersInput,
    OwnerRef,
    PodRef,
    QuarantineInput,
    ReleaseInput,
    ResolvedDevice,
    ResolveDeviceInput,
    WaitReplacementInput,
)
from contract.names import TAINT_KEY
from contract.repair_rungs import GpuHoldersInput
from tests.activities.kube.conftest import KubeTwin, twin

WF = "sickbay-remediate-hami"


async def _resolve(t: KubeTwin, **ref: Any) -> ResolvedDevice:
    result: ResolvedDevice = await t.run(
        t.acts.resolve_device, ResolveDeviceInput(device=DeviceRef(**ref))
    )
    return result


def _register(t: KubeTwin, node: str) -> list[dict[str, Any]]:
    return list(
        json.loads(t.store.get("nodes", node)["metadata"]["annotations"][hami.ANN_REGISTER])
    )


def _set_register(t: KubeTwin, node: str, value: str) -> None:
    t.store.mutate(
        "nodes", node, lambda n: n["metadata"]["annotations"].update({hami.ANN_REGISTER: value})
    )


def _holder(t: KubeTwin, ns: str, name: str, node: str, allocated: str) -> dict[str, Any]:
    """A running GPU pod whose HAMi placement record is `allocated`."""
    t.consumer_pod(ns, name, node, None)
    return t.store.mutate(
        "pods",
        name,
        lambda p: (
            p["metadata"]
            .setdefault("annotations", {})
            .update(
                {
                    hami.ANN_ALLOCATED: allocated,
                    hami.ANN_TO_ALLOCATE: ";",
                    hami.ANN_ASSIGNED_NODE: node,
                    hami.ANN_BIND_PHASE: "success",
                }
            )
        ),
        namespace=ns,
    )


async def test_resolve_from_hamis_registration(tmp_path: Path) -> None:
    with twin(tmp_path, "hami", nodes=1) as t:
        node = t.node(0)
        gpus = _register(t, node)
        by_uuid = await _resolve(t, node=node, gpu_uuid=gpus[1]["id"])
        by_index = await _resolve(t, node=node, gpu_index=1)
        assert by_uuid == by_index
        assert (by_uuid.gpu_uuid, by_uuid.gpu_index, by_uuid.hami) == (gpus[1]["id"], 1, True)
        assert by_uuid.mode == "device-plugin" and by_uuid.devices == []
        with pytest.raises(ApplicationError) as info:
            await _resolve(t, node=node, gpu_uuid="GPU-not-here")
        assert info.value.type == ERR_DEVICE_NOT_FOUND and "HAMi registers no GPU" in str(
            info.value
        )
        _set_register(t, node, "GPU-x,10,81559,100,NVIDIA-H100,0:")  # 6 fields
        with pytest.raises(ApplicationError) as info:
            await _resolve(t, node=node, gpu_uuid=gpus[1]["id"])
        assert info.value.type == ERR_HAMI_UNREADABLE and info.value.non_retryable
        assert f"node {node} annotation {hami.ANN_REGISTER}" in str(info.value)


async def test_consumers_are_the_pods_hamis_record_places_on_the_gpu(tmp_path: Path) -> None:
    with twin(tmp_path, "hami", nodes=1) as t:
        node = t.node(0)
        first, second = (g["id"] for g in _register(t, node))
        _holder(t, "vdi", "desk-a", node, f"{first},NVIDIA,20000,0:;")
        _holder(t, "vdi", "desk-b", node, f";{first},NVIDIA,10000,30:;")  # its 2nd container
        _holder(t, "vdi", "other", node, f"{second},NVIDIA,20000,0:;")
        device = await _resolve(t, node=node, gpu_uuid=first)
        hint = [PodRef(namespace="vdi", name="other")]  # an alert label naming the wrong pod
        result = await t.run(
            t.acts.find_consumers, FindConsumersInput(device=device, alert_pods=hint)
        )
        assert sorted(c.pod.name for c in result.consumers) == ["desk-a", "desk-b"]

        _holder(t, "vdi", "broken", node, f"{first},NVIDIA,20000:;")  # 3 fields
        t.acts.kube.forget(("node-pods", node))  # a later remediation reads the pods afresh
        with pytest.raises(ApplicationError) as info:
            await t.run(t.acts.find_consumers, FindConsumersInput(device=device))
        assert info.value.type == ERR_HAMI_UNREADABLE
        assert "pod vdi/broken" in str(info.value) and "3 fields" in str(info.value)


async def test_evidence_reads_hamis_health_flag_and_a_vanished_gpu(tmp_path: Path) -> None:
    with twin(tmp_path, "hami", nodes=1) as t:
        node = t.node(0)
        device = await _resolve(t, node=node, gpu_index=0)
        healthy = await t.run(t.acts.gather_evidence, EvidenceInput(device=device))
        assert healthy.device_present and healthy.slice_taints == []
        gpus = _register(t, node)
        gpus[0].pop("health")  # how HAMi v2.8+ writes an unhealthy GPU (omitempty false)
        _set_register(t, node, json.dumps(gpus))
        sick = await t.run(t.acts.gather_evidence, EvidenceInput(device=device))
        assert [(x.key, x.value, x.device) for x in sick.slice_taints] == [
            (hami.ANN_REGISTER, "health=false", device.gpu_uuid)
        ]
        health = await t.run(t.acts.check_device_health, CheckHealthInput(device=device))
        assert health.health == "Unhealthy" and "unhealthy" in health.message
        _set_register(t, node, json.dumps(gpus[1:]))
        gone = await t.run(t.acts.gather_evidence, EvidenceInput(device=device))
        assert not gone.device_present


async def test_quarantine_with_hamis_device_cordon(tmp_path: Path) -> None:
    with twin(tmp_path, "hami", nodes=1) as t:
        acts = KubeActivities(KubeSettings(kubeconfig=str(t.kubeconfig), hami_device_cordon=True))
        try:
            node = t.node(0)
            first, second = (g["id"] for g in _register(t, node))
            admin = "GPU-cordoned-by-an-admin"
            t.store.mutate(
                "nodes",
                node,
                lambda n: n["metadata"]["annotations"].update({hami.ANN_DEVICE_CORDON: admin}),
            )
            pod = _holder(t, "vdi", "desk", node, f"{first},NVIDIA,20000,0:;")
            device = await _resolve(t, node=node, gpu_uuid=first)
            ref = PodRef(namespace="vdi", name="desk", uid=pod["metadata"]["uid"])
            inp = QuarantineInput(device=device, workflow_id=WF, consumers=[ref])
            result = await t.run(acts.quarantine_device, inp)
            assert result.hami_cordon and not result.node_level and not result.node_tainted
            assert [p.name for p in result.evicted] == ["desk"]
            ann = t.store.get("nodes", node)["metadata"]["annotations"]
            assert ann[hami.ANN_DEVICE_CORDON] == f"{admin},{first}"
            assert not t.store.get("nodes", node)["spec"].get("taints")
            counts = await t.run(acts.count_devices, CountDevicesInput(node_pool="gpu-pool"))
            assert (counts.cluster_devices, counts.cluster_quarantined) == (2, 1)  # GPUs
            assert second not in ann[hami.ANN_DEVICE_CORDON]

            await t.run(acts.release_quarantine, ReleaseInput(device=device, workflow_id=WF))
            ann = t.store.get("nodes", node)["metadata"]["annotations"]
            assert ann[hami.ANN_DEVICE_CORDON] == admin  # not Sickbay's to lift
            assert hami.ANN_SICKBAY_CORDONED not in ann
        finally:
            acts.close()


async def test_quarantine_without_a_per_gpu_cordon_taints_the_node(tmp_path: Path) -> None:
    with twin(tmp_path, "hami", nodes=1) as t:
        node = t.node(0)
        device = await _resolve(t, node=node, gpu_index=0)
        preview = await t.run(
            t.acts.quarantine_device,
            QuarantineInput(device=device, workflow_id=WF, dry_run=True),
        )
        assert preview.mode == "dry-run" and f"would taint node {node}" in preview.message
        assert not t.store.get("nodes", node)["spec"].get("taints")  # a preview changes nothing
        result = await t.run(
            t.acts.quarantine_device, QuarantineInput(device=device, workflow_id=WF)
        )
        assert result.node_tainted and not result.hami_cordon
        assert "tainted NoSchedule" in result.node_level and "v2.10" in result.node_level
        node_obj = t.store.get("nodes", node)
        assert [x["key"] for x in node_obj["spec"]["taints"]] == [TAINT_KEY]
        assert hami.ANN_DEVICE_CORDON not in node_obj["metadata"]["annotations"]
        await t.run(
            t.acts.release_quarantine,
            ReleaseInput(device=device, node_tainted=True, workflow_id=WF),
        )
        assert not t.store.get("nodes", node)["spec"].get("taints")


def test_repair_holders_and_node_gpus_from_hamis_records(tmp_path: Path) -> None:
    """The repair ladder's holder check: a HAMi pod holds only the GPU its record names (no
    reset of GPU 1 waits for GPU 0's desktops); the node's GPUs are the registered ones."""
    with twin(tmp_path, "hami", nodes=1) as t:
        node = t.node(0)
        first, second = (g["id"] for g in _register(t, node))
        _holder(t, "vdi", "desk", node, f"{first},NVIDIA,20000,0:;")
        kube = t.acts.kube
        held = repair_jobs.gpu_holders(kube, GpuHoldersInput(node=node, gpu_uuids=[first]))
        assert held.holders == ["vdi/desk (HAMi share)"]
        free = repair_jobs.gpu_holders(kube, GpuHoldersInput(node=node, gpu_uuids=[second]))
        assert free.holders == []
        assert repair_jobs.node_gpus(kube, node) == [first, second]


async def test_volcano_vgpu_node_is_read_and_quarantined_at_node_level(tmp_path: Path) -> None:
    """A node Volcano's vGPU plugin registers (no hami.io keys): consumers from
    `volcano.sh/vgpu-ids-new`; Volcano's scheduler has no per-GPU cordon, so even with
    SICKBAY_HAMI_DEVICE_CORDON the node is tainted, and the result says why."""
    with twin(tmp_path, "hami", nodes=1) as t:
        acts = KubeActivities(KubeSettings(kubeconfig=str(t.kubeconfig), hami_device_cordon=True))
        try:
            node = t.node(0)
            first, second = (g["id"] for g in _register(t, node))
            register = f"{first},10,81559,NVIDIA-H100,true,hami-core:{second},10,81559,NVIDIA-H100,true,hami-core:"

            def volcano(n: dict[str, Any]) -> None:
                n["metadata"]["annotations"].pop(hami.ANN_REGISTER)
                n["metadata"]["annotations"][hami.VOLCANO_REGISTER] = register

            t.store.mutate("nodes", node, volcano)
            t.consumer_pod("vc", "job-0", node, None)
            t.store.mutate(
                "pods",
                "job-0",
                lambda p: (
                    p["metadata"]
                    .setdefault("annotations", {})
                    .update({hami.VOLCANO_ALLOCATED: f"{second},NVIDIA,4000,0:"})
                ),
                namespace="vc",
            )
            t.consumer_pod("vc", "job-1", node, None)
            t.store.mutate(
                "pods",
                "job-1",
                lambda p: (
                    p["metadata"]
                    .setdefault("annotations", {})
                    .update({hami.VOLCANO_ALLOCATED: f"{first},NVIDIA,4000,0:"})
                ),
                namespace="vc",
            )
            device = await _resolve(t, node=node, gpu_index=1)
            assert device.hami and device.gpu_uuid == second
            found = await t.run(acts.find_consumers, FindConsumersInput(device=device))
            assert [c.pod.name for c in found.consumers] == ["job-0"]
            result = await t.run(
                acts.quarantine_device, QuarantineInput(device=device, workflow_id=WF)
            )
            assert result.node_tainted and not result.hami_cordon
            assert "Volcano's vGPU scheduler has no per-GPU cordon" in result.node_level
            ann = t.store.get("nodes", node)["metadata"]["annotations"]
            assert hami.ANN_DEVICE_CORDON not in ann
        finally:
            acts.close()


async def test_replacement_placed_on_the_quarantined_gpu_is_not_a_replacement(
    tmp_path: Path,
) -> None:
    """A HAMi that ignores the cordon (the setting on an older HAMi) places the replacement
    on the quarantined GPU again: reported as on a tainted device, not as Running."""
    with twin(tmp_path, "hami", nodes=1) as t:
        node = t.node(0)
        first, second = (g["id"] for g in _register(t, node))
        rs = t.deployment_owner("vdi", "desk", replicas=1)
        old = _holder(t, "vdi", "desk-old", node, f"{first},NVIDIA,20000,0:;")
        t.store.mutate(
            "pods",
            "desk-old",
            lambda p: p["metadata"].update(ownerReferences=[rs], labels={"app": "desk"}),
            namespace="vdi",
        )
        again = _holder(t, "vdi", "desk-again", node, f"{first},NVIDIA,20000,0:;")
        t.store.mutate(
            "pods",
            "desk-again",
            lambda p: p["metadata"].update(ownerReferences=[rs], labels={"app": "desk"}),
            namespace="vdi",
        )
        device = await _resolve(t, node=node, gpu_uuid=first)
        inp = WaitReplacementInput(
            owners=[OwnerRef(kind="Deployment", name="desk", namespace="vdi")],
            old_pods=[PodRef(namespace="vdi", name="desk-old", uid=old["metadata"]["uid"])],
            hami_gpu=device.key,
            look_once=True,
        )
        report = await t.run(t.acts.wait_for_replacement, inp)
        assert report.status == "pending"
        [state] = report.pods
        assert state.pod.name == "desk-again" and "tainted" in state.message
        assert state.devices == [f"{node}/{first}"]
        assert again["metadata"]["uid"]  # the pod the watch judged
        assert second not in state.message
