"""CRUD for every kind through the official kubernetes client, unmodified, via a kubeconfig.

Cases: namespaces; nodes (+status); pods (create, generateName, get, list, replace with
stale resourceVersion -> 409, duplicate create -> 409, merge/strategic/JSON patch, status
subresource, binding, delete); core events read back through events.k8s.io/v1 with field
selectors; deployments/replicasets/statefulsets (+ scale subresource); jobs (generated
selector, 422 for restartPolicy Always); PodDisruptionBudgets; DeviceClass, ResourceSlice,
ResourceClaim (+status), ResourceClaimTemplate (v1 and v1beta2); DeviceTaintRule (create
v1beta2, read v1alpha3, replace status, delete; server-side apply through the client: create,
idempotent re-apply, 409 for another manager, force); MachineDeployment through CustomObjectsApi
(+scale); 422 causes for missing required fields; 404 for unknown names; dryRun=All.
"""

from __future__ import annotations

import json
from typing import Any

import pytest
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from twin.testing import RunningTwin

IMAGE = "registry.invalid/app:1"


def _pod(
    name: str | None = None, labels: dict[str, str] | None = None, **spec: Any
) -> dict[str, Any]:
    meta: dict[str, Any] = {"labels": labels or {"app": "demo"}}
    if name:
        meta["name"] = name
    else:
        meta["generateName"] = "demo-"
    return {"metadata": meta, "spec": {"containers": [{"name": "main", "image": IMAGE}], **spec}}


def _causes(exc: ApiException) -> list[tuple[str, str]]:
    body = json.loads(exc.body)
    return [(c["field"], c["reason"]) for c in body["details"]["causes"]]


def test_namespace_and_node_crud(api: client.ApiClient, twin: RunningTwin) -> None:
    v1 = client.CoreV1Api(api)
    ns = v1.create_namespace({"metadata": {"name": "crud-ns"}})
    assert ns.status.phase == "Active"
    assert v1.read_namespace("crud-ns").metadata.labels["kubernetes.io/metadata.name"] == "crud-ns"
    v1.patch_namespace("crud-ns", {"metadata": {"labels": {"team": "gpu"}}})
    assert "crud-ns" in [
        n.metadata.name for n in v1.list_namespace(label_selector="team=gpu").items
    ]
    v1.delete_namespace("crud-ns")
    with pytest.raises(ApiException) as missing:
        v1.read_namespace("crud-ns")
    assert missing.value.status == 404

    node = v1.create_node({"metadata": {"name": "crud-node", "labels": {"pool": "x"}}})
    node.status = client.V1NodeStatus(allocatable={"nvidia.com/gpu": "4"})
    v1.replace_node_status("crud-node", node)
    assert v1.read_node("crud-node").status.allocatable["nvidia.com/gpu"] == "4"
    v1.patch_node("crud-node", {"spec": {"unschedulable": True}})
    assert [
        n.metadata.name for n in v1.list_node(field_selector="spec.unschedulable=true").items
    ] == ["crud-node"]
    v1.delete_node("crud-node")
    seeded = v1.list_node(label_selector="sickbay.dev/node-pool=gpu-pool").items
    assert len(seeded) == 2


def test_pod_lifecycle(core: client.CoreV1Api, ns: str) -> None:
    created = core.create_namespaced_pod(ns, _pod("web"))
    assert created.metadata.uid and created.metadata.resource_version
    assert created.spec.restart_policy == "Always" and created.status.phase == "Pending"
    generated = core.create_namespaced_pod(ns, _pod())
    assert generated.metadata.name.startswith("demo-") and len(generated.metadata.name) == 10

    with pytest.raises(ApiException) as dup:
        core.create_namespaced_pod(ns, _pod("web"))
    assert dup.value.status == 409 and '"AlreadyExists"' in dup.value.body

    stale = core.read_namespaced_pod("web", ns)
    core.patch_namespaced_pod("web", ns, {"metadata": {"labels": {"rev": "2"}}})
    stale.metadata.labels["rev"] = "stale"
    with pytest.raises(ApiException) as conflict:
        core.replace_namespaced_pod("web", ns, stale)
    assert conflict.value.status == 409 and '"Conflict"' in conflict.value.body

    fresh = core.read_namespaced_pod("web", ns)
    fresh.metadata.labels["rev"] = "3"
    assert core.replace_namespaced_pod("web", ns, fresh).metadata.labels["rev"] == "3"
    patched = core.patch_namespaced_pod(
        "web", ns, [{"op": "replace", "path": "/metadata/labels/rev", "value": "4"}]
    )
    assert patched.metadata.labels["rev"] == "4"

    pod = core.read_namespaced_pod("web", ns)
    pod.status.phase = "Running"
    assert core.replace_namespaced_pod_status("web", ns, pod).status.phase == "Running"
    assert [
        p.metadata.name
        for p in core.list_namespaced_pod(ns, field_selector="status.phase=Running").items
    ] == ["web"]

    core.create_namespaced_pod_binding(
        generated.metadata.name,
        ns,
        {
            "apiVersion": "v1",
            "kind": "Binding",
            "metadata": {"name": generated.metadata.name},
            "target": {"kind": "Node", "name": "gpu-pool-node-0"},
        },
        _preload_content=False,  # a real server answers a Status, which V1Binding rejects
    )
    bound = core.read_namespaced_pod(generated.metadata.name, ns)
    assert bound.spec.node_name == "gpu-pool-node-0"
    assert [c.type for c in bound.status.conditions] == ["PodScheduled"]

    core.delete_namespaced_pod("web", ns)  # unbound: gone at once
    with pytest.raises(ApiException) as gone:
        core.read_namespaced_pod("web", ns)
    assert gone.value.status == 404


def test_pod_validation_and_dry_run(core: client.CoreV1Api, ns: str) -> None:
    with pytest.raises(ApiException) as bad:
        core.create_namespaced_pod(
            ns, {"metadata": {"name": "bad"}, "spec": {"containers": [{"name": "Main_1"}]}}
        )
    assert bad.value.status == 422
    assert _causes(bad.value) == [
        ("spec.containers[0].name", "FieldValueInvalid"),
        ("spec.containers[0].image", "FieldValueRequired"),
    ]
    with pytest.raises(ApiException) as noname:
        core.create_namespaced_pod(
            ns, {"metadata": {}, "spec": {"containers": [{"name": "a", "image": IMAGE}]}}
        )
    assert noname.value.status == 422
    assert _causes(noname.value) == [("metadata.name", "FieldValueRequired")]
    dry = core.create_namespaced_pod(ns, _pod("dry"), dry_run="All")
    assert dry.metadata.name == "dry"
    assert core.list_namespaced_pod(ns).items == []
    with pytest.raises(ApiException) as nons:
        core.create_namespaced_pod("no-such-namespace", _pod("x"))
    assert nons.value.status == 404


def test_events_core_and_events_k8s_io(
    api: client.ApiClient, core: client.CoreV1Api, ns: str
) -> None:
    pod = core.create_namespaced_pod(ns, _pod("ev-target"))
    core.create_namespaced_event(
        ns,
        {
            "metadata": {"name": "ev-target.1"},
            "involvedObject": {
                "kind": "Pod",
                "name": "ev-target",
                "namespace": ns,
                "uid": pod.metadata.uid,
                "apiVersion": "v1",
            },
            "reason": "FailedScheduling",
            "message": "0/2 nodes are available",
            "type": "Warning",
            "source": {"component": "default-scheduler"},
            "count": 1,
        },
    )
    core.create_namespaced_event(
        ns,
        {
            "metadata": {"name": "other.1"},
            "involvedObject": {"kind": "Pod", "name": "other", "namespace": ns},
            "reason": "Scheduled",
            "message": "ok",
        },
    )
    listed = core.list_namespaced_event(
        ns, field_selector="involvedObject.name=ev-target,reason=FailedScheduling"
    )
    assert [e.metadata.name for e in listed.items] == ["ev-target.1"]
    # Core-style events have eventTime null through events.k8s.io/v1, as on a real server
    # (golden 43); the generated EventsV1Event model rejects that, so read them raw.
    raw_list = client.EventsV1Api(api).list_namespaced_event(
        ns, field_selector="regarding.name=ev-target", _preload_content=False
    )
    items = json.loads(raw_list.data)["items"]
    assert [
        (e["note"], e["regarding"]["name"], e["deprecatedSource"]["component"], e["eventTime"])
        for e in items
    ] == [("0/2 nodes are available", "ev-target", "default-scheduler", None)]
    created = client.EventsV1Api(api).create_namespaced_event(
        ns,
        {
            "metadata": {"name": "v1-style"},
            "eventTime": "2026-11-29T10:00:00.000000Z",
            "reportingController": "sickbay",
            "reportingInstance": "sickbay-1",
            "action": "Quarantine",
            "reason": "DeviceTainted",
            "note": "tainted gpu-0",
            "type": "Normal",
            "regarding": {"kind": "Pod", "name": "ev-target", "namespace": ns},
        },
    )
    assert created.note == "tainted gpu-0"
    as_core = core.read_namespaced_event("v1-style", ns)
    assert (as_core.message, as_core.reporting_component, as_core.involved_object.name) == (
        "tainted gpu-0",
        "sickbay",
        "ev-target",
    )


def _workload(kind: str, name: str) -> dict[str, Any]:
    template = {
        "metadata": {"labels": {"app": name}},
        "spec": {"containers": [{"name": "main", "image": IMAGE}]},
    }
    spec: dict[str, Any] = {
        "replicas": 2,
        "selector": {"matchLabels": {"app": name}},
        "template": template,
    }
    if kind == "statefulset":
        spec["serviceName"] = name
    return {"metadata": {"name": name}, "spec": spec}


@pytest.mark.parametrize("kind", ["deployment", "replica_set", "stateful_set"])
def test_apps_workloads_with_scale(api: client.ApiClient, ns: str, kind: str) -> None:
    apps = client.AppsV1Api(api)
    name = kind.replace("_", "")
    create = getattr(apps, f"create_namespaced_{kind}")
    created = create(ns, _workload(name, name))
    assert created.spec.replicas == 2 and created.metadata.generation == 1
    scale = getattr(apps, f"read_namespaced_{kind}_scale")(name, ns)
    assert scale.spec.replicas == 2 and scale.status.selector == f"app={name}"
    getattr(apps, f"patch_namespaced_{kind}_scale")(name, ns, {"spec": {"replicas": 5}})
    after = getattr(apps, f"read_namespaced_{kind}")(name, ns)
    assert after.spec.replicas == 5 and after.metadata.generation == 2
    with pytest.raises(ApiException) as bad:
        bad_body = _workload(name, f"{name}-bad")
        bad_body["spec"]["selector"] = {"matchLabels": {"app": "other"}}
        create(ns, bad_body)
    assert bad.value.status == 422
    assert _causes(bad.value) == [("spec.template.metadata.labels", "FieldValueInvalid")]
    getattr(apps, f"delete_namespaced_{kind}")(name, ns)
    assert getattr(apps, f"list_namespaced_{kind}")(ns).items == []


def test_jobs_and_pdbs(api: client.ApiClient, ns: str) -> None:
    batch = client.BatchV1Api(api)
    job = batch.create_namespaced_job(
        ns,
        {
            "metadata": {"name": "train"},
            "spec": {
                "template": {
                    "spec": {
                        "restartPolicy": "Never",
                        "containers": [{"name": "main", "image": IMAGE}],
                    }
                }
            },
        },
    )
    uid = job.metadata.uid
    assert job.spec.selector.match_labels == {"batch.kubernetes.io/controller-uid": uid}
    assert job.spec.template.metadata.labels["job-name"] == "train"
    assert job.spec.backoff_limit == 6
    with pytest.raises(ApiException) as bad:
        batch.create_namespaced_job(
            ns,
            {
                "metadata": {"name": "bad"},
                "spec": {"template": {"spec": {"containers": [{"name": "m", "image": IMAGE}]}}},
            },
        )
    assert bad.value.status == 422
    assert _causes(bad.value) == [("spec.template.spec.restartPolicy", "FieldValueNotSupported")]
    batch.delete_namespaced_job("train", ns, propagation_policy="Background")

    policy = client.PolicyV1Api(api)
    pdb = policy.create_namespaced_pod_disruption_budget(
        ns,
        {
            "metadata": {"name": "pdb"},
            "spec": {"maxUnavailable": 1, "selector": {"matchLabels": {"app": "x"}}},
        },
    )
    assert pdb.status.disruptions_allowed == 0
    with pytest.raises(ApiException) as both:
        policy.create_namespaced_pod_disruption_budget(
            ns,
            {
                "metadata": {"name": "both"},
                "spec": {"minAvailable": 1, "maxUnavailable": 1, "selector": {}},
            },
        )
    assert both.value.status == 422


@pytest.mark.parametrize("version", ["V1", "V1beta2"])
def test_dra_kinds(api: client.ApiClient, ns: str, version: str) -> None:
    res = getattr(client, f"Resource{version}Api")(api)
    suffix = version.lower()
    dc = res.create_device_class(
        {
            "metadata": {"name": f"class-{suffix}"},
            "spec": {"selectors": [{"cel": {"expression": "true"}}]},
        }
    )
    assert dc.metadata.name == f"class-{suffix}"
    slice_name = f"slice-{suffix}"
    res.create_resource_slice(
        {
            "metadata": {"name": slice_name},
            "spec": {
                "driver": "gpu.example.com",
                "nodeName": "node-x",
                "pool": {"name": "node-x", "generation": 1, "resourceSliceCount": 1},
                "devices": [{"name": "gpu-0", "attributes": {"uuid": {"string": "GPU-1"}}}],
            },
        }
    )
    by_node = res.list_resource_slice(field_selector="spec.nodeName=node-x").items
    assert [s.metadata.name for s in by_node] == [slice_name]
    tmpl = res.create_namespaced_resource_claim_template(
        ns,
        {
            "metadata": {"name": "t"},
            "spec": {
                "spec": {
                    "devices": {
                        "requests": [
                            {"name": "gpu", "exactly": {"deviceClassName": "gpu.nvidia.com"}}
                        ]
                    }
                }
            },
        },
    )
    assert tmpl.spec.spec.devices.requests[0].exactly.count == 1
    claim = res.create_namespaced_resource_claim(
        ns,
        {
            "metadata": {"name": "c"},
            "spec": {
                "devices": {
                    "requests": [{"name": "gpu", "exactly": {"deviceClassName": "gpu.nvidia.com"}}]
                }
            },
        },
    )
    claim.status = {
        "allocation": {
            "devices": {
                "results": [
                    {
                        "request": "gpu",
                        "driver": "gpu.nvidia.com",
                        "pool": "node-x",
                        "device": "gpu-0",
                    }
                ]
            }
        }
    }
    updated = res.replace_namespaced_resource_claim_status("c", ns, claim)
    assert updated.status.allocation.devices.results[0].device == "gpu-0"
    with pytest.raises(ApiException) as immutable:
        res.patch_namespaced_resource_claim(
            "c",
            ns,
            {
                "spec": {
                    "devices": {"requests": [{"name": "x", "exactly": {"deviceClassName": "y"}}]}
                }
            },
        )
    assert immutable.value.status == 422
    with pytest.raises(ApiException) as bad_slice:
        res.create_resource_slice(
            {
                "metadata": {"name": "bad"},
                "spec": {
                    "driver": "",
                    "pool": {"name": "p", "generation": 1, "resourceSliceCount": 1},
                },
            }
        )
    assert bad_slice.value.status == 422
    assert ("spec.driver", "FieldValueRequired") in _causes(bad_slice.value)
    res.delete_resource_slice(slice_name)
    res.delete_device_class(f"class-{suffix}")


def test_device_taint_rule_across_versions(api: client.ApiClient) -> None:
    beta = client.ResourceV1beta2Api(api)
    rule = beta.create_device_taint_rule(
        {
            "metadata": {"name": "crud-rule"},
            "spec": {
                "deviceSelector": {
                    "driver": "gpu.nvidia.com",
                    "pool": "gpu-pool-node-0",
                    "device": "gpu-0",
                },
                "taint": {
                    "key": "sickbay.dev/unhealthy",
                    "value": "xid-79",
                    "effect": "NoSchedule",
                },
            },
        }
    )
    assert rule.spec.taint.time_added is not None and rule.metadata.generation == 1
    alpha = client.ResourceV1alpha3Api(api).read_device_taint_rule("crud-rule")
    assert alpha.spec.taint.value == "xid-79" and alpha.metadata.uid == rule.metadata.uid
    rule.status = {
        "conditions": [
            {
                "type": "EvictionInProgress",
                "status": "False",
                "reason": "OtherEffect",
                "message": "m",
                "lastTransitionTime": "2026-11-29T10:00:00Z",
                "observedGeneration": 1,
            }
        ]
    }
    with_status = beta.replace_device_taint_rule_status("crud-rule", rule)
    assert with_status.status.conditions[0].reason == "OtherEffect"
    changed = beta.patch_device_taint_rule(
        "crud-rule", {"spec": {"taint": {"effect": "NoExecute"}}}
    )
    assert changed.metadata.generation == 2 and changed.status.conditions[0].reason == "OtherEffect"
    assert [r.metadata.name for r in beta.list_device_taint_rule().items] == ["crud-rule"]
    beta.delete_device_taint_rule("crud-rule")
    with pytest.raises(ApiException) as missing:
        beta.read_device_taint_rule("crud-rule")
    assert missing.value.status == 404
    with pytest.raises(ApiException) as unserved:
        client.ResourceV1Api(api).list_device_taint_rule()
    assert unserved.value.status == 404  # 1.36 serves no v1 DeviceTaintRule


def test_machine_deployment_custom_objects(api: client.ApiClient, ns: str) -> None:
    custom = client.CustomObjectsApi(api)
    group, version, plural = "cluster.x-k8s.io", "v1beta1", "machinedeployments"
    body = {
        "apiVersion": "cluster.x-k8s.io/v1beta1",
        "kind": "MachineDeployment",
        "metadata": {"name": "gpu-md"},
        "spec": {
            "clusterName": "twin",
            "replicas": 2,
            "template": {"spec": {"clusterName": "twin", "bootstrap": {}, "infrastructureRef": {}}},
        },
    }
    created = custom.create_namespaced_custom_object(group, version, ns, plural, body)
    assert created["spec"]["replicas"] == 2
    custom.patch_namespaced_custom_object(
        group, version, ns, plural, "gpu-md", {"spec": {"replicas": 3}}
    )
    assert (
        custom.get_namespaced_custom_object(group, version, ns, plural, "gpu-md")["spec"][
            "replicas"
        ]
        == 3
    )
    scale = custom.get_namespaced_custom_object_scale(group, version, ns, plural, "gpu-md")
    assert scale["spec"]["replicas"] == 3
    custom.patch_namespaced_custom_object_scale(
        group, version, ns, plural, "gpu-md", {"spec": {"replicas": 4}}
    )
    assert (
        custom.get_namespaced_custom_object(group, version, ns, plural, "gpu-md")["spec"][
            "replicas"
        ]
        == 4
    )
    listed = custom.list_namespaced_custom_object(group, version, ns, plural)
    assert [i["metadata"]["name"] for i in listed["items"]] == ["gpu-md"]
    with pytest.raises(ApiException) as bad:
        custom.create_namespaced_custom_object(
            group,
            version,
            ns,
            plural,
            {
                "apiVersion": "cluster.x-k8s.io/v1beta1",
                "kind": "MachineDeployment",
                "metadata": {"name": "bad"},
                "spec": {},
            },
        )
    assert bad.value.status == 422
    custom.delete_namespaced_custom_object(group, version, ns, plural, "gpu-md")
    with pytest.raises(ApiException) as gone:
        custom.get_namespaced_custom_object(group, version, ns, plural, "gpu-md")
    assert gone.value.status == 404


def test_server_side_apply_through_the_client(api: client.ApiClient) -> None:
    beta = client.ResourceV1beta2Api(api)
    rule = {
        "apiVersion": "resource.k8s.io/v1beta2",
        "kind": "DeviceTaintRule",
        "metadata": {"name": "ssa-rule", "labels": {"sickbay.dev/workflow": "wf-1"}},
        "spec": {
            "deviceSelector": {
                "driver": "gpu.nvidia.com",
                "pool": "gpu-pool-node-1",
                "device": "gpu-1",
            },
            "taint": {"key": "sickbay.dev/unhealthy", "value": "xid-79", "effect": "NoSchedule"},
        },
    }
    created = beta.patch_device_taint_rule(
        "ssa-rule", rule, field_manager="sickbay", _content_type="application/apply-patch+yaml"
    )
    assert created.metadata.managed_fields[0].manager == "sickbay"
    assert created.metadata.managed_fields[0].operation == "Apply"
    again = beta.patch_device_taint_rule(
        "ssa-rule", rule, field_manager="sickbay", _content_type="application/apply-patch+yaml"
    )
    assert again.metadata.resource_version == created.metadata.resource_version  # idempotent
    rule["spec"]["taint"]["effect"] = "NoExecute"
    with pytest.raises(ApiException) as conflict:
        beta.patch_device_taint_rule(
            "ssa-rule",
            rule,
            field_manager="someone-else",
            _content_type="application/apply-patch+yaml",
        )
    assert conflict.value.status == 409
    forced = beta.patch_device_taint_rule(
        "ssa-rule",
        rule,
        field_manager="someone-else",
        force=True,
        _content_type="application/apply-patch+yaml",
    )
    assert forced.spec.taint.effect == "NoExecute"
    assert forced.spec.taint.time_added >= created.spec.taint.time_added
    beta.delete_device_taint_rule("ssa-rule")
