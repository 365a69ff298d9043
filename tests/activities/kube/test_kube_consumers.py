"""Finding a GPU's consumers against the twin over HTTP, every profile.

Cases:
- a Deployment's pod (ReplicaSet -> Deployment) and a Job's pod on the GPU are found with
  direct and top owners, labels, namespace labels, priority class, claim name (DRA);
- pods on other GPUs of the same node are not consumers (DRA: claims; device plugin:
  allocatedResourcesStatus names the UUID);
- device plugin: the pods the alert names are consumers even without health status, but only
  when the API shows them on the failed GPU's node, requesting a GPU, and (where the pod reports
  device health) holding that GPU: a pod elsewhere, one without a GPU (dcgm-exporter's own pod)
  or one holding another GPU is never a consumer because an alert named it;
- a Succeeded pod holds nothing; a Terminating pod is still a consumer (marked terminating);
- evidence: the consumer's allocatedResourcesStatus health, slice presence, node
  capacity/allocatable in device-plugin mode; recent Events are listed only when no pod
  status says Unhealthy (context for an inconclusive status; no Event list on the hot path);
- find_consumers reuses the pod list evidence read moments before (one pod list for both).
"""

from __future__ import annotations

from contract.kube import (
    DeviceRef,
    EvidenceInput,
    FindConsumersInput,
    OwnerRef,
    PodRef,
    ResolveDeviceInput,
)
from tests.activities.kube.conftest import KubeTwin

SHARED = "nvidia.com/gpu.shared"
MIG = "nvidia.com/mig-1g.10gb"


async def test_consumers_through_deployment_and_job(cluster: KubeTwin) -> None:
    t = cluster
    node = t.node(0)
    uuid0, uuid1 = t.uuid_of(node, 0), t.uuid_of(node, 1)
    t.namespace("ml", labels={"team": "vision"})
    rs = t.deployment_owner("ml", "trainer")
    job = t.job_owner("ml", "batch")
    t.consumer_pod(
        "ml", "trainer-abc", node, "gpu-0", rs, {"app": "trainer"}, uuid0, priority_class="high"
    )
    t.consumer_pod("ml", "batch-xyz", node, "gpu-0", job, {"job-name": "batch"}, uuid0)
    t.consumer_pod("ml", "other", node, "gpu-1", None, {"app": "other"}, uuid1)
    done = t.consumer_pod("ml", "finished", node, "gpu-0", job, {"job-name": "batch"}, uuid0)
    t.store.mutate(
        "pods",
        done["metadata"]["name"],
        lambda p: p["status"].update(phase="Succeeded"),
        namespace="ml",
        subresource="status",
    )
    device = await t.run(
        t.acts.resolve_device, ResolveDeviceInput(device=DeviceRef(node=node, gpu_uuid=uuid0))
    )
    result = await t.run(t.acts.find_consumers, FindConsumersInput(device=device))
    by_name = {c.pod.name: c for c in result.consumers}
    assert sorted(by_name) == ["batch-xyz", "trainer-abc"]
    trainer = by_name["trainer-abc"]
    assert trainer.owner == OwnerRef(
        kind="ReplicaSet", name=rs["name"], namespace="ml", uid=rs["uid"]
    )
    assert trainer.top_owner is not None
    assert (trainer.top_owner.kind, trainer.top_owner.name) == ("Deployment", "trainer")
    assert trainer.namespace_labels["team"] == "vision"
    assert trainer.labels == {"app": "trainer"}
    assert trainer.priority_class == "high"
    assert trainer.phase == "Running" and trainer.node == node and not trainer.terminating
    batch = by_name["batch-xyz"]
    assert (batch.top_owner.kind, batch.top_owner.name) == ("Job", "batch")
    if t.dra:
        assert trainer.claim and trainer.claim.startswith("trainer-abc-gpu-")


async def test_device_plugin_alert_pods(tmp_path) -> None:
    from tests.activities.kube.conftest import twin

    with twin(tmp_path, "device-plugin") as t:
        node = t.node(0)
        uuid = t.uuid_of(node, 0)
        t.consumer_pod("ml", "named", node, None, None, {"app": "x"}, gpu_uuid=None)
        t.consumer_pod(
            "ml", "unrelated", node, None, None, {"app": "y"}, gpu_uuid=t.uuid_of(node, 1)
        )
        device = await t.run(
            t.acts.resolve_device, ResolveDeviceInput(device=DeviceRef(node=node, gpu_uuid=uuid))
        )
        result = await t.run(
            t.acts.find_consumers,
            FindConsumersInput(device=device, alert_pods=[PodRef(namespace="ml", name="named")]),
        )
        assert [c.pod.name for c in result.consumers] == ["named"]


async def test_device_plugin_shared_and_mig_pods_are_consumers(tmp_path) -> None:
    """Time-slicing renamed (nvidia.com/gpu.shared, device ids `<UUID>::<n>`) and MIG
    instances hold the GPU too: its consumers, evicted after the quarantine like the rest."""
    from tests.activities.kube.conftest import twin

    with twin(tmp_path, "device-plugin") as t:
        node = t.node(0)
        uuid = t.uuid_of(node, 0)
        t.consumer_pod(
            "ml", "sliced", node, None, None, {"app": "s"}, f"{uuid}::1", resource=SHARED
        )
        t.consumer_pod(
            "ml",
            "other",
            node,
            None,
            None,
            {"app": "o"},
            f"{t.uuid_of(node, 1)}::0",
            resource=SHARED,
        )
        device = await t.run(
            t.acts.resolve_device, ResolveDeviceInput(device=DeviceRef(node=node, gpu_uuid=uuid))
        )
        result = await t.run(t.acts.find_consumers, FindConsumersInput(device=device))
        assert [c.pod.name for c in result.consumers] == ["sliced"]
    with twin(tmp_path / "mig", "device-plugin") as t:
        node = t.node(0)
        uuid = t.uuid_of(node, 0)
        # No device health names it: every GPU pod of the node may be using the GPU.
        t.consumer_pod("ml", "instance", node, None, None, {"app": "m"}, resource=MIG)
        device = await t.run(
            t.acts.resolve_device, ResolveDeviceInput(device=DeviceRef(node=node, gpu_uuid=uuid))
        )
        result = await t.run(t.acts.find_consumers, FindConsumersInput(device=device))
        assert [c.pod.name for c in result.consumers] == ["instance"]


async def test_device_plugin_alert_pods_are_hints_only(tmp_path) -> None:
    """Alert labels name pods; the API decides whether they consume the failed GPU."""
    from tests.activities.kube.conftest import twin

    with twin(tmp_path, "device-plugin") as t:
        node, other = t.node(0), t.node(1)
        uuid = t.uuid_of(node, 0)
        t.consumer_pod("ml", "trainer", node, None, None, {"app": "t"}, gpu_uuid=uuid)
        # On another node, no GPU: the reproduction (it was evicted).
        t.namespace("victim")
        t.store.create(
            "pods",
            {
                "metadata": {"name": "payments-db-0", "namespace": "victim"},
                "spec": {"nodeName": other, "containers": [{"name": "db", "image": "pg"}]},
                "status": {"phase": "Running"},
            },
            namespace="victim",
        )
        # On the node, without a GPU request: dcgm-exporter's own pod (honorLabels: false).
        t.namespace("gpu-operator")
        t.store.create(
            "pods",
            {
                "metadata": {"name": "nvidia-dcgm-exporter-x1", "namespace": "gpu-operator"},
                "spec": {"nodeName": node, "containers": [{"name": "exporter", "image": "d"}]},
                "status": {"phase": "Running"},
            },
            namespace="gpu-operator",
        )
        # On the node with a GPU, but its device health names the node's other GPU.
        t.consumer_pod("ml", "neighbour", node, None, None, {"app": "n"}, t.uuid_of(node, 1))
        # On another node with a GPU.
        t.consumer_pod("ml", "far", other, None, None, {"app": "f"}, gpu_uuid=None)
        device = await t.run(
            t.acts.resolve_device, ResolveDeviceInput(device=DeviceRef(node=node, gpu_uuid=uuid))
        )
        named = [
            PodRef(namespace="victim", name="payments-db-0"),
            PodRef(namespace="gpu-operator", name="nvidia-dcgm-exporter-x1"),
            PodRef(namespace="ml", name="neighbour"),
            PodRef(namespace="ml", name="far"),
        ]
        result = await t.run(
            t.acts.find_consumers, FindConsumersInput(device=device, alert_pods=named)
        )
        # Only the pod whose status says it holds this GPU; none of the named ones.
        assert [c.pod.name for c in result.consumers] == ["trainer"]


async def test_evidence_reports_health_and_presence(cluster: KubeTwin) -> None:
    t = cluster
    node = t.node(0)
    uuid = t.uuid_of(node, 0)
    pod = t.consumer_pod("ml", "sick", node, "gpu-0", None, {"app": "x"}, uuid)

    def unhealthy(p: dict) -> None:
        res = p["status"]["containerStatuses"][0]["allocatedResourcesStatus"][0]["resources"][0]
        res.update(health="Unhealthy", message="XID 79")

    t.store.mutate("pods", pod["metadata"]["name"], unhealthy, namespace="ml", subresource="status")
    t.store.create(
        "events",
        {
            "metadata": {"name": "sick.1", "namespace": "ml"},
            "involvedObject": {"kind": "Pod", "name": "sick", "namespace": "ml"},
            "reason": "BackOff",
            "message": "Back-off restarting failed container",
            "type": "Warning",
        },
        namespace="ml",
    )
    device = await t.run(
        t.acts.resolve_device, ResolveDeviceInput(device=DeviceRef(node=node, gpu_uuid=uuid))
    )
    ev = await t.run(t.acts.gather_evidence, EvidenceInput(device=device))
    assert ev.health == "Unhealthy"
    assert [(r.pod, r.health, r.message) for r in ev.reports] == [("sick", "Unhealthy", "XID 79")]
    assert ev.device_present
    assert ev.recent_events == []  # the pod status is conclusive: no Event lists
    if t.dra:
        assert ev.gpu_capacity is None
    else:
        assert (ev.gpu_capacity, ev.gpu_allocatable) == (2, 2)

    def unknown(p: dict) -> None:
        res = p["status"]["containerStatuses"][0]["allocatedResourcesStatus"][0]["resources"][0]
        res.update(health="Unknown", message="")

    t.store.mutate("pods", pod["metadata"]["name"], unknown, namespace="ml", subresource="status")
    ev = await t.run(t.acts.gather_evidence, EvidenceInput(device=device))
    assert ev.health == "Unknown"
    assert any("BackOff" in e for e in ev.recent_events)  # inconclusive: Events for context
    if t.dra:  # the driver's own health taint on the slice is conclusive too: no Event lists
        (piece,) = [
            s
            for s in t.store.list("resourceslices.resource.k8s.io").items
            if s["spec"].get("nodeName") == node
        ]

        def driver_taint(obj: dict) -> None:
            for d in obj["spec"]["devices"]:
                if d["name"] == "gpu-0":
                    taint = {"key": "gpu.nvidia.com/xid", "value": "79", "effect": "NoSchedule"}
                    d.get("basic", d)["taints"] = [taint]

        t.store.mutate("resourceslices.resource.k8s.io", piece["metadata"]["name"], driver_taint)
        for key in ("resourceslices", ("resourceslices", node)):
            t.acts.kube.forget(key)  # the slice list resolve read moments ago
        ev = await t.run(t.acts.gather_evidence, EvidenceInput(device=device))
        assert [(x.key, x.value) for x in ev.slice_taints] == [("gpu.nvidia.com/xid", "79")]
        assert ev.recent_events == []

    before = len([r for r in t.requests() if r.resource == "pods" and r.verb == "list"])
    result = await t.run(t.acts.find_consumers, FindConsumersInput(device=device, alert_pods=[]))
    after = len([r for r in t.requests() if r.resource == "pods" and r.verb == "list"])
    assert "sick" in [c.pod.name for c in result.consumers]
    assert after == before  # the evidence's pod list, moments old, was reused


async def test_statefulset_and_jobset_owners(tmp_path) -> None:
    """StatefulSet is a top controller itself; a Job created by a JobSet reports the JobSet."""
    from tests.activities.kube.conftest import twin

    with twin(tmp_path, "1.37", nodes=1) as t:
        node = t.node(0)
        t.namespace("train")
        sts = {
            "apiVersion": "apps/v1",
            "kind": "StatefulSet",
            "name": "db",
            "uid": "uid-sts",
            "controller": True,
        }
        t.consumer_pod("train", "db-0", node, "gpu-0", sts, {"app": "db"})
        job = t.job_owner("train", "js-workers-0")
        t.store.mutate(
            "jobs.batch",
            "js-workers-0",
            lambda j: j["metadata"].update(
                ownerReferences=[
                    {
                        "apiVersion": "jobset.x-k8s.io/v1alpha2",
                        "kind": "JobSet",
                        "name": "js",
                        "uid": "uid-js",
                        "controller": True,
                    }
                ]
            ),
            namespace="train",
        )
        t.consumer_pod("train", "js-workers-0-0", node, "gpu-0", job, {"job-name": "js-workers-0"})
        device = await t.run(
            t.acts.resolve_device,
            ResolveDeviceInput(
                device=DeviceRef(driver="gpu.nvidia.com", pool=node, device="gpu-0")
            ),
        )
        result = await t.run(t.acts.find_consumers, FindConsumersInput(device=device))
        tops = {c.pod.name: (c.top_owner.kind, c.top_owner.name) for c in result.consumers}
        assert tops == {"db-0": ("StatefulSet", "db"), "js-workers-0-0": ("JobSet", "js")}
