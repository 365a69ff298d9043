"""Waits and preview against the twin's real controllers (scheduler with DRA allocation,
Deployment/ReplicaSet, device-taint eviction, kubelet stand-in), on a time-scaled clock.

Cases:
- a NoExecute rule: wait_for_eviction watches the pod through Terminating (it still holds
  the device) until it is gone; wait_for_replacement sees the Deployment's new pod Running on
  an untainted device;
- every GPU quarantined: the replacement stays Pending; a look (the workflow's, at its
  deadline) reports "pending" with the scheduler's Unschedulable message;
- the 1.36 scheduler fault (kubernetes#139651: rule taints ignored): replacements are placed
  on the tainted device and evicted again and again -> "churn" with that diagnosis;
- the same fault in mode eviction-api (NoSchedule rule, Eviction API): the replacement is
  placed on the tainted device and nothing evicts it -> "churn" at once, naming the bug and
  the replacement bound to the device;
- preview: the controller's effect-None verdict ("1 pod would be evicted") and the pod named.
"""

from __future__ import annotations

import asyncio
from datetime import timedelta
from pathlib import Path

from contract.kube import (
    DeviceRef,
    OwnerRef,
    PodRef,
    QuarantineInput,
    ResolveDeviceInput,
    WaitEvictionInput,
    WaitReplacementInput,
)
from tests.activities.kube.conftest import twin
from tests.activities.kube.test_kube_e2e import RULES, _gpu_of, _running_pod, _workload
from tests.waiting import until
from twin.clock import Clock
from twin.controllers.manager import ControllerManager, TwinOptions

OWNER = OwnerRef(kind="Deployment", name="trainer", namespace="ml")


async def _setup(t, grace: int = 2):
    _workload(t, grace=grace)
    pod = await _running_pod(t)
    node, index = _gpu_of(t, pod)
    device = await t.run(
        t.acts.resolve_device,
        ResolveDeviceInput(device=DeviceRef(node=node, gpu_uuid=t.uuid_of(node, index))),
    )
    ref = PodRef(namespace="ml", name=pod["metadata"]["name"], uid=pod["metadata"]["uid"])
    return device, ref


async def test_eviction_and_replacement_watched(tmp_path: Path) -> None:
    # 30 s grace at 10x: the pod is Terminating for ~3 s of real time.
    with twin(
        tmp_path,
        "1.37",
        controllers=ControllerManager(TwinOptions(pod_startup_seconds=1)),
        clock=Clock(time_scale=10),
    ) as t:
        device, ref = await _setup(t, grace=30)
        await t.run(t.acts.quarantine_device, QuarantineInput(device=device, workflow_id="wf"))

        def terminating() -> bool:
            pod = t.store.try_get("pods", ref.name, "ml")
            assert pod is not None, "the pod is gone before it was seen Terminating"
            return bool(pod["metadata"].get("deletionTimestamp"))

        await until(terminating, "the taint manager to evict the pod (Terminating)")
        report = await t.run(
            t.acts.wait_for_eviction, WaitEvictionInput(pods=[ref], timeout=timedelta(seconds=30))
        )
        assert report.gone == [ref] and not report.timed_out
        assert any(h[0].get("gone") == [] for h in t.heartbeats)  # heartbeated while Terminating
        replaced = await t.run(
            t.acts.wait_for_replacement,
            WaitReplacementInput(
                owners=[OWNER],
                old_pods=[ref],
                tainted=device.devices,
            ),
        )
        assert replaced.status == "running"
        tainted = {d.resource_id for d in device.devices}
        running = [p for p in replaced.pods if p.phase == "Running"]
        assert running and not tainted & {d for p in running for d in p.devices}


async def test_replacement_pending_unschedulable_when_every_gpu_is_tainted(tmp_path: Path) -> None:
    with twin(
        tmp_path,
        "1.36",
        nodes=1,
        gpus_per_node=1,
        controllers=ControllerManager(TwinOptions(pod_startup_seconds=0.5)),
        clock=Clock(time_scale=10),
    ) as t:
        device, ref = await _setup(t)
        await t.run(t.acts.quarantine_device, QuarantineInput(device=device, workflow_id="wf"))
        await t.run(
            t.acts.wait_for_eviction, WaitEvictionInput(pods=[ref], timeout=timedelta(seconds=30))
        )
        look = WaitReplacementInput(
            owners=[OWNER], old_pods=[ref], tainted=device.devices, look_once=True
        )
        # Looks (what the workflow does at its deadline) until the scheduler has had its say.
        give_up = asyncio.get_running_loop().time() + 60
        report = await t.run(t.acts.wait_for_replacement, look)
        while not report.unschedulable_message and asyncio.get_running_loop().time() < give_up:
            await asyncio.sleep(0.1)
            report = await t.run(t.acts.wait_for_replacement, look)
        assert report.status == "pending"
        assert "cannot allocate all claims" in report.unschedulable_message
        assert all(p.phase == "Pending" for p in report.pods)


async def test_scheduler_ignoring_rules_is_churn(tmp_path: Path) -> None:
    options = TwinOptions(pod_startup_seconds=0.5, ignore_device_taint_rules=True)
    with twin(
        tmp_path,
        "1.36",
        nodes=1,
        gpus_per_node=1,
        controllers=ControllerManager(options),
        clock=Clock(time_scale=10),
    ) as t:
        device, ref = await _setup(t, grace=1)
        await t.run(t.acts.quarantine_device, QuarantineInput(device=device, workflow_id="wf"))
        report = await t.run(
            t.acts.wait_for_replacement,
            WaitReplacementInput(
                owners=[OWNER],
                old_pods=[ref],
                tainted=device.devices,
                churn_evictions=3,
            ),
        )
        assert report.status == "churn", report
        assert report.churn is not None and report.churn.evictions >= 3
        assert "kubernetes#139651" in report.churn.diagnosis


async def test_scheduler_ignoring_a_noschedule_rule_is_churn(tmp_path: Path) -> None:
    """Mode eviction-api on the stock 1.36.2 scheduler: the consumer leaves through the
    Eviction API, its replacement binds to the tainted device and stays (no NoExecute: no
    taint manager). The watch reports churn for that one replacement, not "pending"."""
    from contract.kube import EvictPodsInput

    options = TwinOptions(pod_startup_seconds=0.5, ignore_device_taint_rules=True)
    with twin(
        tmp_path,
        "1.36",
        nodes=1,
        gpus_per_node=1,
        controllers=ControllerManager(options),
        clock=Clock(time_scale=10),
    ) as t:
        device, ref = await _setup(t, grace=1)
        await t.run(
            t.acts.quarantine_device,
            QuarantineInput(device=device, workflow_id="wf", effect="NoSchedule", consumers=[ref]),
        )
        evicted = await t.run(t.acts.evict_pods, EvictPodsInput(pods=[ref], workflow_id="wf"))
        assert evicted.evicted == [ref]
        watch = t.run(
            t.acts.wait_for_replacement,
            WaitReplacementInput(
                owners=[OWNER],
                old_pods=[ref],
                tainted=device.devices,
                churn_evictions=3,
                rule_effect="NoSchedule",
            ),
        )
        report = await asyncio.wait_for(watch, timeout=90)  # before: watched on, "pending"
        assert report.status == "churn", report
        assert report.churn is not None and report.churn.evictions < 3  # none was evicted
        (bound,) = report.churn.bound
        assert bound.name != ref.name
        pod = t.store.get("pods", bound.name, "ml")
        assert not pod["metadata"].get("deletionTimestamp")  # nothing evicts it
        assert "kubernetes#139651" in report.churn.diagnosis
        assert f"ml/{bound.name}" in report.churn.diagnosis
        assert device.devices[0].resource_id in report.churn.diagnosis


async def test_preview_reads_the_controller_verdict(tmp_path: Path) -> None:
    with twin(
        tmp_path,
        "1.36",
        controllers=ControllerManager(TwinOptions(pod_startup_seconds=0.5)),
        clock=Clock(time_scale=10),
        proxy_rules=RULES,
    ) as t:
        device, ref = await _setup(t)
        result = await t.run(
            t.acts.preview_quarantine, QuarantineInput(device=device, workflow_id="wf")
        )
        assert result.mode == "dry-run" and result.would_evict == [
            PodRef(namespace="ml", name=ref.name, uid=ref.uid)
        ]
        assert "1 pod would be evicted" in result.message
        assert t.store.list("devicetaintrules.resource.k8s.io").items == []
        assert t.store.get("pods", ref.name, "ml")["metadata"].get("deletionTimestamp") is None
        assert t.proxy is not None and t.proxy.denied == []  # deploy/rbac.yaml covers it


async def test_eviction_api_mode_pieces(tmp_path: Path) -> None:
    """Runbook mode `eviction-api`: NoSchedule rule (nothing evicted), Eviction API (a PDB
    allowing no disruption blocks it), then NoExecute as the backstop (evicts, PDB ignored)."""
    from contract.kube import EvictPodsInput

    with twin(
        tmp_path,
        "1.37",
        controllers=ControllerManager(TwinOptions(pod_startup_seconds=0.5)),
        clock=Clock(time_scale=10),
        proxy_rules=RULES,
    ) as t:
        device, ref = await _setup(t)
        t.store.create(
            "poddisruptionbudgets.policy",
            {
                "metadata": {"name": "trainer", "namespace": "ml"},
                "spec": {"minAvailable": 1, "selector": {"matchLabels": {"app": "trainer"}}},
            },
            namespace="ml",
        )
        for _ in range(300):  # the disruption controller must have computed the PDB status
            if (
                t.store.get("poddisruptionbudgets.policy", "trainer", "ml").get("status") or {}
            ).get("observedGeneration"):
                break
            await asyncio.sleep(0.05)
        base = QuarantineInput(device=device, workflow_id="wf", consumers=[ref])
        first = await t.run(
            t.acts.quarantine_device, base.model_copy(update={"effect": "NoSchedule"})
        )
        assert first.action == "created"
        await asyncio.sleep(0.5)  # the behaviour: a NoSchedule taint evicts nothing meanwhile
        assert not t.store.get("pods", ref.name, "ml")["metadata"].get("deletionTimestamp")
        evicted = await t.run(t.acts.evict_pods, EvictPodsInput(pods=[ref], workflow_id="wf"))
        assert evicted.blocked == [ref] and not evicted.evicted
        backstop = await t.run(t.acts.quarantine_device, base)  # NoExecute
        assert backstop.action == "updated"
        report = await t.run(
            t.acts.wait_for_eviction, WaitEvictionInput(pods=[ref], timeout=timedelta(seconds=20))
        )
        assert report.gone == [ref]
        assert t.proxy is not None and t.proxy.denied == []  # deploy/rbac.yaml covers it


async def test_evidence_and_health_from_an_injected_fault(tmp_path: Path) -> None:
    """The twin's fault injector kills the GPU (Xid 79, driver taint): the kubelet stand-in
    reports it Unhealthy in the pod's allocatedResourcesStatus and the driver taints the slice
    device; evidence and check_device_health read both, under the NVIDIA driver's CDI device
    id (what the 1.36 kubelet writes) and under driver/pool/device (a driver returning no CDI
    id). Device plugin: allocatable drops."""
    from contract.kube import CheckHealthInput, EvidenceInput

    for profile, cdi in (("1.36", True), ("1.36", False), ("device-plugin", True)):
        manager = ControllerManager(TwinOptions(pod_startup_seconds=0.5, cdi_device_ids=cdi))
        with twin(tmp_path, profile, controllers=manager, clock=Clock(time_scale=10)) as t:
            device, ref = await _setup(t)
            manager.faults.fail(device.node, device.gpu_uuid, xid=79, driver_taint=True)
            evidence = None
            for _ in range(120):
                evidence = await t.run(t.acts.gather_evidence, EvidenceInput(device=device))
                if evidence.health == "Unhealthy" and (evidence.slice_taints or not t.dra):
                    break
                await asyncio.sleep(0.25)
            assert evidence is not None and evidence.health == "Unhealthy", evidence
            assert any(r.pod == ref.name and "79" in r.message for r in evidence.reports)
            if t.dra:
                assert evidence.slice_taints, evidence
                (report,) = [r for r in evidence.reports if r.pod == ref.name]
                (dev,) = device.devices
                if cdi:
                    assert report.resource_id.startswith("k8s.gpu.nvidia.com/claim=")
                    assert report.device == dev.resource_id  # resolved through the claim
                else:
                    assert report.resource_id == dev.resource_id
            else:
                assert evidence.gpu_allocatable is not None
                assert evidence.gpu_allocatable < (evidence.gpu_capacity or 0)
            health = await t.run(t.acts.check_device_health, CheckHealthInput(device=device))
            assert health.health == "Unhealthy"


async def test_evidence_and_consumers_share_a_claim_list_loaded_since_scheduled(
    tmp_path: Path,
) -> None:
    """The workflow schedules gather-evidence and find-consumers together. With the pod's
    health under a CDI device id, evidence lists the claims to resolve it; find-consumers,
    finishing after it (no overlap), uses that list, loaded after its own step was
    scheduled, instead of listing again, and still finds the consumer in it. A list loaded
    before a step was scheduled, or no usable schedule time, means a fresh read."""
    import time

    from activities.kube.consumers import find_consumers
    from activities.kube.evidence import gather_evidence
    from contract.kube import FindConsumersInput

    manager = ControllerManager(TwinOptions(pod_startup_seconds=0.5, cdi_device_ids=True))
    with twin(tmp_path, "1.36", controllers=manager, clock=Clock(time_scale=10)) as t:
        device, ref = await _setup(t)
        manager.faults.fail(device.node, device.gpu_uuid, xid=79, driver_taint=True)
        kube = t.acts.kube
        for _ in range(120):
            if gather_evidence(kube, device).health == "Unhealthy":
                break
            await asyncio.sleep(0.25)

        def claim_lists() -> int:
            return len(t.twin.requests.entries(verb="list", resource="resourceclaims"))

        before = claim_lists()
        scheduled = time.time()  # both steps scheduled in one workflow task
        evidence = gather_evidence(kube, device, fresh_since=scheduled)
        assert evidence.health == "Unhealthy"
        assert any(r.device for r in evidence.reports)  # resolved through the claim list
        assert claim_lists() == before + 1
        found = find_consumers(kube, FindConsumersInput(device=device), fresh_since=scheduled)
        assert [c.pod.name for c in found.consumers] == [ref.name]
        assert claim_lists() == before + 1  # the evidence's list, loaded since scheduled
        # Scheduled after that list was loaded: read again; no schedule time: read again.
        find_consumers(kube, FindConsumersInput(device=device), fresh_since=time.time())
        assert claim_lists() == before + 2
        find_consumers(kube, FindConsumersInput(device=device))
        assert claim_lists() == before + 3
