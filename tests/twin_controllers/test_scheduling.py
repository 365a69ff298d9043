"""Scheduler and device-taint eviction behaviour through the official client.

Cases:
- firstAvailable: with one H100 and two L4s, the first pod gets the H100 (`gpu/big`), the
  second falls back to an L4 (`gpu/small`), on the node that has it;
- a request toleration for the taint keeps the pod through a NoExecute rule (rule Completed
  with "0 pods evicted"; an effect None preview already says 0 pods would go), and is copied
  into the allocation result;
- tolerationSeconds: the pod stays until timeAdded + seconds, then is evicted;
- effect None and NoSchedule rules get the golden NoEffect / OtherEffect statuses, and a
  NoSchedule rule keeps new pods off the device without evicting the running one;
- known fault kubernetes#139651 (`ignoreDeviceTaintRules`, switched at run time over HTTP):
  replacements land on the tainted device again and are evicted again (a loop);
- known fault "expired toleration": with the switch on, a pod whose NoExecute toleration
  window already passed still gets the tainted device and is evicted at once; with it off,
  the pod stays Pending instead;
- bad fault requests get clear 4xx answers (unknown node/GPU, two fault kinds at once);
- a pod naming a missing ResourceClaimTemplate gets a FailedResourceClaimCreation warning and
  runs once the template exists;
- a shared ResourceClaim (resourceClaimName) serves two pods from one device (both in
  reservedFor); a NoExecute rule evicts both, then the claim is deallocated;
- a cordoned node takes only pods tolerating node.kubernetes.io/unschedulable:NoSchedule.
"""

from __future__ import annotations

import time
from typing import Any

from tests.twin_controllers.conftest import eventually
from tests.twin_controllers.helpers import (
    DRIVER,
    allocated_device,
    claim_of,
    claim_template,
    condition,
    deployment,
    pods,
    taint_rule,
)

NODE = "gpu-pool-node-0"
TOLERATE = {"key": "sickbay.dev/unhealthy", "operator": "Exists", "effect": "NoExecute"}


def _class(name: str, product: str) -> dict[str, Any]:
    expr = (
        f'device.driver == "{DRIVER}" && device.attributes["{DRIVER}"].productName == "{product}"'
    )
    return {"metadata": {"name": name}, "spec": {"selectors": [{"cel": {"expression": expr}}]}}


def _running(t: Any, ns: str, count: int) -> list[Any]:
    def check() -> list[Any]:
        live = [p for p in pods(t.core, ns) if p.metadata.deletion_timestamp is None]
        assert len(live) == count and all(p.status.phase == "Running" for p in live), [
            (p.metadata.name, p.status.phase) for p in live
        ]
        return live

    return eventually(check)


def test_first_available_falls_back_to_lesser_class(twin: Any) -> None:
    t = twin(
        pools=[
            {"name": "h100", "nodes": 1, "gpusPerNode": 1, "product": "NVIDIA H100 80GB HBM3"},
            {"name": "l4", "nodes": 1, "gpusPerNode": 2, "product": "NVIDIA L4"},
        ]
    )
    ns = t.namespace()
    t.dra.create_device_class(_class("h100.example", "NVIDIA H100 80GB HBM3"))
    t.dra.create_device_class(_class("l4.example", "NVIDIA L4"))
    request = {
        "name": "gpu",
        "firstAvailable": [
            {"name": "big", "deviceClassName": "h100.example"},
            {"name": "small", "deviceClassName": "l4.example"},
        ],
    }
    t.dra.create_namespaced_resource_claim_template(ns, claim_template("gpu", [request]))
    t.apps.create_namespaced_deployment(ns, deployment("infer", "gpu", replicas=2))
    live = _running(t, ns, 2)
    results = sorted(
        (claim_of(t.dra, p).status.allocation.devices.results[0].request, p.spec.node_name)
        for p in live
    )
    assert results == [("gpu/big", "h100-node-0"), ("gpu/small", "l4-node-0")]


def test_toleration_keeps_pod_and_is_copied(twin: Any) -> None:
    t = twin()
    ns = t.namespace()
    requests = [{"name": "gpu", "exactly": {"deviceClassName": DRIVER, "tolerations": [TOLERATE]}}]
    t.dra.create_namespaced_resource_claim_template(ns, claim_template("gpu", requests))
    t.apps.create_namespaced_deployment(ns, deployment("serve", "gpu"))
    (pod,) = _running(t, ns, 1)
    result = claim_of(t.dra, pod).status.allocation.devices.results[0]
    assert result.tolerations[0].key == "sickbay.dev/unhealthy"
    assert result.tolerations[0].effect == "NoExecute"
    t.dra_beta2.create_device_taint_rule(taint_rule("dry-run", None, None, effect="None"))

    def dry_run() -> bool:
        cond = t.dra_beta2.read_device_taint_rule("dry-run").status.conditions[0]
        assert cond.reason == "NoEffect"
        assert "1 allocated device selected. 0 pods would be evicted" in cond.message, cond.message
        return True

    eventually(dry_run)  # the preview knows the toleration would keep the pod
    t.dra_beta2.create_device_taint_rule(taint_rule("all-down", None, None))

    def completed() -> bool:
        cond = t.dra_beta2.read_device_taint_rule("all-down").status.conditions[0]
        assert (cond.reason, cond.message) == (
            "Completed",
            "0 pods evicted since starting the controller.",
        ), cond
        return True

    eventually(completed)
    time.sleep(0.3)  # 60 simulated seconds: the controller had every chance to evict
    (still,) = pods(t.core, ns)
    assert still.metadata.name == pod.metadata.name and still.metadata.deletion_timestamp is None


def test_toleration_seconds_delay_eviction(twin: Any) -> None:
    t = twin()
    ns = t.namespace()
    tol = {**TOLERATE, "tolerationSeconds": 300}
    requests = [{"name": "gpu", "exactly": {"deviceClassName": DRIVER, "tolerations": [tol]}}]
    t.dra.create_namespaced_resource_claim_template(ns, claim_template("gpu", requests))
    t.apps.create_namespaced_deployment(ns, deployment("serve", "gpu"))
    (pod,) = _running(t, ns, 1)
    created = time.monotonic()
    t.dra_beta2.create_device_taint_rule(
        taint_rule("gpu0", NODE, allocated_device(t.dra, pod).split("/")[-1])
    )

    def pending() -> bool:
        cond = t.dra_beta2.read_device_taint_rule("gpu0").status.conditions[0]
        return cond.reason == "PodsPendingEviction"

    eventually(pending)
    # 300 simulated seconds are 1.5 real seconds: still there well before that.
    assert t.core.read_namespaced_pod(pod.metadata.name, ns).metadata.deletion_timestamp is None

    def evicted() -> bool:
        p = t.core.read_namespaced_pod(pod.metadata.name, ns)
        return p.metadata.deletion_timestamp is not None

    eventually(evicted)
    assert time.monotonic() - created > 1.0  # the toleration window was honoured


def test_none_and_noschedule_rule_statuses(twin: Any) -> None:
    t = twin(nodes=2)
    ns = t.namespace()
    t.dra.create_namespaced_resource_claim_template(ns, claim_template("gpu"))
    t.apps.create_namespaced_deployment(ns, deployment("app", "gpu"))
    (pod,) = _running(t, ns, 1)
    pool = pod.spec.node_name
    t.dra_beta2.create_device_taint_rule(taint_rule("dry-run", pool, None, effect="None"))
    t.dra_beta2.create_device_taint_rule(taint_rule("no-new", pool, None, effect="NoSchedule"))

    def statuses() -> bool:
        none = t.dra_beta2.read_device_taint_rule("dry-run").status.conditions[0]
        assert (none.status, none.reason) == ("False", "NoEffect")
        assert none.message == (
            "2 published devices selected. 1 allocated device selected. 1 pod would be evicted "
            "in 1 namespace if the effect was NoExecute. This information will not be updated "
            "again. Recreate the DeviceTaintRule to trigger an update."
        )
        other = t.dra_beta2.read_device_taint_rule("no-new").status.conditions[0]
        assert (other.status, other.reason, other.message) == (
            "False",
            "OtherEffect",
            "Eviction only happens for the NoExecute effect.",
        )
        return True

    eventually(statuses)
    # NoSchedule: the running pod stays; a second replica must go to the other node.
    t.apps.patch_namespaced_deployment_scale("app", ns, {"spec": {"replicas": 2}})
    live = _running(t, ns, 2)
    assert pod.metadata.name in {p.metadata.name for p in live}
    other = next(p for p in live if p.metadata.name != pod.metadata.name)
    assert other.spec.node_name != pool


def test_known_fault_ignored_rules_evict_replace_loop(twin: Any) -> None:
    t = twin(gpus_per_node=1)
    ns = t.namespace()
    t.dra.create_namespaced_resource_claim_template(ns, claim_template("gpu"))
    switched = t.twin("PUT", "/twin/known-faults", {"ignoreDeviceTaintRules": True})
    assert switched.json() == {"ignoreDeviceTaintRules": True, "expiredTolerationBug": False}
    t.apps.create_namespaced_deployment(ns, deployment("app", "gpu"))
    _running(t, ns, 1)
    t.dra_beta2.create_device_taint_rule(taint_rule("gpu0", NODE, "gpu-0"))

    def churn() -> bool:
        events = t.core.list_namespaced_event(ns).items
        evictions = [e for e in events if e.reason == "DeviceTaintManagerEviction"]
        assert len(evictions) >= 3, len(evictions)
        return True

    eventually(churn)
    # Switched off again, the scheduler honours the rule: the next replacement stays Pending.
    t.twin("PUT", "/twin/known-faults", {"ignoreDeviceTaintRules": False})

    def settled() -> bool:
        live = [p for p in pods(t.core, ns) if p.metadata.deletion_timestamp is None]
        assert len(live) == 1 and live[0].spec.node_name is None
        cond = condition(live[0], "PodScheduled")
        return cond is not None and cond.reason == "Unschedulable"

    eventually(settled)


def test_known_fault_expired_toleration(twin: Any) -> None:
    t = twin(gpus_per_node=1)
    ns = t.namespace()
    t.dra_beta2.create_device_taint_rule(taint_rule("gpu0", NODE, "gpu-0"))
    time.sleep(0.1)  # 20 simulated seconds pass after the taint's timeAdded
    tol = {**TOLERATE, "tolerationSeconds": 5}
    requests = [{"name": "gpu", "exactly": {"deviceClassName": DRIVER, "tolerations": [tol]}}]
    t.dra.create_namespaced_resource_claim_template(ns, claim_template("gpu", requests))
    t.apps.create_namespaced_deployment(ns, deployment("app", "gpu"))

    def pending() -> bool:
        (p,) = pods(t.core, ns)
        cond = condition(p, "PodScheduled")
        return cond is not None and cond.reason == "Unschedulable"

    eventually(pending)
    t.twin("PUT", "/twin/known-faults", {"expiredTolerationBug": True})

    def looping() -> bool:
        events = t.core.list_namespaced_event(ns).items
        return len([e for e in events if e.reason == "DeviceTaintManagerEviction"]) >= 2

    eventually(looping)


def test_bad_fault_requests_are_4xx(twin: Any) -> None:
    t = twin()
    missing = t.twin("POST", "/twin/faults", {"node": "nope", "gpu": "0", "xid": 79})
    assert missing.status_code == 404 and 'node "nope" not found' in missing.json()["message"]
    bad_gpu = t.twin("POST", "/twin/faults", {"node": NODE, "gpu": "7", "xid": 79})
    assert bad_gpu.status_code == 404 and "it has: 0" in bad_gpu.json()["message"]
    both = t.twin(
        "POST", "/twin/faults", {"node": NODE, "gpu": "0", "xid": 79, "degrade": "nvlink"}
    )
    assert both.status_code == 400 and "exactly one" in both.json()["message"]
    wrong = t.twin("POST", "/twin/faults", {"node": NODE, "gpu": "0", "degrade": "fire"})
    assert wrong.status_code == 400
    no_pool = t.twin("POST", "/twin/pools/nope/resize", {"size": 1})
    assert no_pool.status_code == 404
    negative = t.twin("POST", "/twin/pools/gpu-pool/resize", {"size": -1})
    assert negative.status_code == 400
    assert t.twin("POST", "/twin/faults", b"not json").status_code in (400, 422)


def test_missing_claim_template_is_reported_then_recovered(twin: Any) -> None:
    t = twin()
    ns = t.namespace()
    t.apps.create_namespaced_deployment(ns, deployment("early", "later"))

    def warned() -> Any:
        events = t.core.list_namespaced_event(ns).items
        (event,) = [e for e in events if e.reason == "FailedResourceClaimCreation"]
        return event

    event = eventually(warned)
    assert event.type == "Warning" and '"later" not found' in event.message
    (pod,) = pods(t.core, ns)
    assert pod.status.phase == "Pending" and pod.spec.node_name is None
    t.dra.create_namespaced_resource_claim_template(ns, claim_template("later"))
    _running(t, ns, 1)


def test_shared_claim_two_pods_one_device(twin: Any) -> None:
    t = twin()
    ns = t.namespace()
    t.dra.create_namespaced_resource_claim(
        ns,
        {
            "apiVersion": "resource.k8s.io/v1",
            "kind": "ResourceClaim",
            "metadata": {"name": "shared"},
            "spec": {
                "devices": {"requests": [{"name": "gpu", "exactly": {"deviceClassName": DRIVER}}]}
            },
        },
    )
    for name in ("reader-a", "reader-b"):
        t.core.create_namespaced_pod(
            ns,
            {
                "metadata": {"name": name},
                "spec": {
                    "containers": [
                        {"name": "main", "image": "x", "resources": {"claims": [{"name": "gpu"}]}}
                    ],
                    "resourceClaims": [{"name": "gpu", "resourceClaimName": "shared"}],
                },
            },
        )
    _running(t, ns, 2)
    claim = t.dra.read_namespaced_resource_claim("shared", ns)
    assert len(claim.status.allocation.devices.results) == 1
    assert sorted(r.name for r in claim.status.reserved_for) == ["reader-a", "reader-b"]
    # Both consumers of the tainted device are evicted; the claim is released afterwards.
    device = claim.status.allocation.devices.results[0].device
    t.dra_beta2.create_device_taint_rule(taint_rule("shared-down", NODE, device))

    def released() -> bool:
        assert not pods(t.core, ns)
        current = t.dra.read_namespaced_resource_claim("shared", ns)
        return current.status is None or current.status.allocation is None

    eventually(released)
    events = t.core.list_namespaced_event(ns).items
    assert len([e for e in events if e.reason == "DeviceTaintManagerEviction"]) == 2


def test_a_cordoned_node_takes_only_pods_tolerating_the_cordon(twin: Any) -> None:
    """kube-scheduler's NodeUnschedulable filter: `spec.unschedulable` keeps pods off unless
    they tolerate node.kubernetes.io/unschedulable:NoSchedule (Sickbay's validation Job on a
    replace's cordoned new node)."""
    t = twin()
    ns = t.namespace()
    t.core.patch_node(NODE, {"spec": {"unschedulable": True}})

    def pod(name: str, tolerations: list[dict[str, Any]]) -> dict[str, Any]:
        container = {"name": "main", "image": "busybox", "command": ["sleep", "3600"]}
        spec = {"containers": [container], "tolerations": tolerations}
        return {"metadata": {"name": name}, "spec": spec}

    cordon = {"key": "node.kubernetes.io/unschedulable", "operator": "Exists"}
    t.core.create_namespaced_pod(ns, pod("plain", []))
    t.core.create_namespaced_pod(ns, pod("tolerant", [{**cordon, "effect": "NoSchedule"}]))

    def placed() -> bool:
        tolerant = t.core.read_namespaced_pod("tolerant", ns)
        assert tolerant.spec.node_name == NODE
        plain = t.core.read_namespaced_pod("plain", ns)
        scheduled = condition(plain, "PodScheduled")
        assert scheduled is not None and scheduled.status == "False"
        assert "unschedulable" in scheduled.message and plain.spec.node_name is None
        return True

    assert eventually(placed)
