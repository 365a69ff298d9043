"""What the controllers write has the shape a real Kubernetes 1.36 cluster gives it.

Replays the DRA scenario of tests/k8s_golden/ (Deployment with a claim template on 2 nodes x
2 GPUs, a NoExecute rule on the pod's device, None and NoSchedule rules, then a NoExecute rule
on every device) and compares, as raw JSON over HTTP, with the recorded responses: same keys
recursively and same reasons/types/statuses/messages where the golden has them (names, uids,
timestamps and resourceVersions aside).

Cases: generated claim metadata and status (32); the evicted pod's DisruptionTarget condition
(36); DeviceTaintRule status right after create (35), when Completed (41), for effect None
(48) and NoSchedule (50), and for the all-devices rule (55); the Unschedulable condition (52);
core/v1 events of the deployment, replicaset, scheduler and eviction controllers (42); the
FailedScheduling event through events.k8s.io/v1 (54).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import httpx

from tests.twin_controllers.conftest import eventually
from tests.twin_controllers.helpers import claim_template, deployment, taint_rule

GOLDEN = Path(__file__).resolve().parents[1] / "k8s_golden"
# Compared by value; everything else only by presence and type.
VALUES = frozenset({"reason", "type", "status", "kind", "action", "message", "note", "effect"})
VALUES_EXCEPT_TEXT = VALUES - {"message", "note"}
IGNORED = frozenset({"managedFields"})


def golden(number: int) -> Any:
    (path,) = GOLDEN.glob(f"{number:02d}-*.json")
    return json.loads(path.read_text())["response"]


def same_shape(
    actual: Any, expected: Any, values: frozenset[str] = VALUES, path: str = "$"
) -> None:
    if isinstance(expected, dict):
        assert isinstance(actual, dict), f"{path}: expected an object, got {actual!r}"
        missing = set(expected) - set(actual) - IGNORED
        extra = set(actual) - set(expected) - IGNORED
        assert not missing and not extra, (
            f"{path}: missing {sorted(missing)}, extra {sorted(extra)}"
        )
        for key in set(expected) - IGNORED:
            if key in values and not isinstance(expected[key], dict | list):
                assert actual[key] == expected[key], (
                    f"{path}.{key}: {actual[key]!r} != {expected[key]!r}"
                )
            else:
                same_shape(actual[key], expected[key], values, f"{path}.{key}")
    elif isinstance(expected, list):
        assert isinstance(actual, list) and len(actual) == len(expected), f"{path}: {actual!r}"
        for i, (a, e) in enumerate(zip(actual, expected, strict=True)):
            same_shape(a, e, values, f"{path}[{i}]")
    elif expected is None:
        assert actual is None, f"{path}: expected null, got {actual!r}"
    else:
        assert type(actual) is type(expected), f"{path}: {actual!r} vs {expected!r}"


def _condition(obj: dict[str, Any], ctype: str) -> dict[str, Any]:
    return next(c for c in obj["status"]["conditions"] if c["type"] == ctype)


def test_controller_output_matches_a_real_cluster(twin: Any) -> None:
    t = twin(nodes=2)
    http = httpx.Client(base_url=t.rs.url, timeout=10)

    def get(path: str) -> Any:
        response = http.get(path)
        assert response.status_code == 200, response.text
        return response.json()

    ns = t.namespace("golden-dra")
    t.dra.create_namespaced_resource_claim_template(ns, claim_template("gpu-template"))
    t.apps.create_namespaced_deployment(ns, deployment("gpu-app", "gpu-template"))

    def bound() -> Any:
        (pod,) = get(f"/api/v1/namespaces/{ns}/pods")["items"]
        assert pod["spec"].get("nodeName")
        return pod

    pod = eventually(bound)
    claim_name = pod["status"]["resourceClaimStatuses"][0]["resourceClaimName"]
    claim = get(f"/apis/resource.k8s.io/v1/namespaces/{ns}/resourceclaims/{claim_name}")
    expected = golden(32)
    for key in ("annotations", "finalizers", "generateName", "ownerReferences"):
        same_shape(claim["metadata"][key], expected["metadata"][key], VALUES, f"$.metadata.{key}")
    assert claim["metadata"]["ownerReferences"][0]["kind"] == "Pod"
    same_shape(claim["status"], expected["status"], VALUES_EXCEPT_TEXT, "$.status")
    same_shape(
        pod["status"]["resourceClaimStatuses"], golden(33)["status"]["resourceClaimStatuses"]
    )

    node, device = pod["spec"]["nodeName"], claim["status"]["allocation"]["devices"]["results"][0]
    rule_path = "/apis/resource.k8s.io/v1beta2/devicetaintrules"
    t.dra_beta2.create_device_taint_rule(taint_rule("golden-noexecute", node, device["device"]))

    def rule_status(name: str, reason: str | None = None) -> Any:
        def check() -> Any:
            current = get(f"{rule_path}/{name}")
            conditions = (current.get("status") or {}).get("conditions")
            assert conditions
            if reason is not None:  # None: any reason
                assert conditions[0]["reason"] == reason
            return current["status"]

        return eventually(check)

    same_shape(rule_status("golden-noexecute"), golden(35)["status"])

    # The taint controller evicts after the rule's first status (as a real cluster's does):
    # wait for the pod to be marked for deletion, never assume it already is.
    def being_evicted() -> Any:
        current = get(f"/api/v1/namespaces/{ns}/pods/{pod['metadata']['name']}")
        assert "deletionTimestamp" in current["metadata"], current["metadata"]
        return current

    evicted = eventually(being_evicted)
    assert evicted["metadata"]["deletionGracePeriodSeconds"] == 30
    same_shape(_condition(evicted, "DisruptionTarget"), _condition(golden(36), "DisruptionTarget"))

    same_shape(rule_status("golden-noexecute", "Completed"), golden(41)["status"])

    # effect None / NoSchedule on the pool of the node that now runs the replacement.
    def replacement() -> Any:
        live = [
            p
            for p in get(f"/api/v1/namespaces/{ns}/pods")["items"]
            if not p["metadata"].get("deletionTimestamp") and p["spec"].get("nodeName")
        ]
        assert len(live) == 1
        return live[0]

    new_pod = eventually(replacement)
    # Here the replacement may share a node with the evicted pod (the golden cluster put it on
    # the other node): let the old pod finish so the pool holds one allocated device, as there.
    eventually(lambda: len(get(f"/api/v1/namespaces/{ns}/pods")["items"]) == 1)
    pool = new_pod["spec"]["nodeName"]
    other_pool = "gpu-pool-node-1" if pool == "gpu-pool-node-0" else "gpu-pool-node-0"
    none_rule = taint_rule("golden-none", pool, None, "None")
    none_rule["spec"]["taint"] = {"key": "example.com/golden-none", "effect": "None"}
    t.dra_beta2.create_device_taint_rule(none_rule)
    t.dra_beta2.create_device_taint_rule(
        taint_rule("golden-noschedule", other_pool, None, "NoSchedule")
    )

    same_shape(rule_status("golden-none"), golden(48)["status"])
    same_shape(rule_status("golden-noschedule"), golden(50)["status"])
    t.dra_beta2.delete_device_taint_rule("golden-none")
    t.dra_beta2.delete_device_taint_rule("golden-noschedule")

    # Every device tainted: the next replacement cannot be scheduled.
    all_rule = taint_rule("golden-all-noexecute", None, None)
    t.dra_beta2.create_device_taint_rule(all_rule)

    def unschedulable() -> Any:
        pods = get(f"/api/v1/namespaces/{ns}/pods")["items"]
        pending = [p for p in pods if not p["spec"].get("nodeName")]
        assert len(pending) == 1
        cond = _condition(pending[0], "PodScheduled")
        assert cond["reason"] == "Unschedulable"
        return pending[0]

    stuck = eventually(unschedulable)
    expected_cond = dict(_condition(golden(52), "PodScheduled"))
    # Two nodes here as in the golden cluster: the message is word for word the same.
    same_shape(_condition(stuck, "PodScheduled"), expected_cond)
    same_shape(rule_status("golden-all-noexecute", "Completed"), golden(55)["status"])

    selector = f"regarding.name={stuck['metadata']['name']},reason=FailedScheduling"
    response = http.get(
        f"/apis/events.k8s.io/v1/namespaces/{ns}/events", params={"fieldSelector": selector}
    )
    events = response.json()["items"]
    assert events
    same_shape(events[0], golden(54)["items"][0])

    core_events = get(f"/api/v1/namespaces/{ns}/events")["items"]
    for expected_event in golden(42)["items"]:
        mine = [e for e in core_events if e["reason"] == expected_event["reason"]]
        assert mine, f"no {expected_event['reason']} event"
        same_shape(mine[0], expected_event, VALUES_EXCEPT_TEXT, f"$[{expected_event['reason']}]")
