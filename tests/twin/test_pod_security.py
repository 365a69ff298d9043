"""Pod Security admission and dry-run evictions on the twin, against what a real 1.36.2 API
server answered (the shared facts' "Pod Security admission and dry runs", 2026-12-04).

Cases: a direct create of the reset pod in an `enforce: restricted` namespace is 403 with the
server's exact text (privileged, allowPrivilegeEscalation, capabilities, runAsNonRoot,
seccompProfile, in that order); a pod with no securityContext fails the same four clauses
and not `privileged`; `enforce: privileged` admits both; a `warn` label answers 201 with a
`Warning` header and refuses nothing; baseline refuses privileged, host namespaces, hostPath
and added capabilities but admits a root pod with no extra privileges; a Job in a restricted
namespace is accepted, its pod is refused with a `FailedCreate` Warning Event on the Job
carrying the server's text, the Job never gets a pod and fails with `DeadlineExceeded` at
activeDeadlineSeconds; an Eviction whose body says `deleteOptions.dryRun: ["All"]` (what
`kubectl drain --dry-run=server` sends) answers 201 and evicts nothing; Events listed by
`involvedObject.uid` (with name, namespace and kind, as `kubectl describe` asks) leave out one
written without the uid.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import pytest

from tests.twin.helpers import raw
from twin.controllers.manager import ControllerManager, TwinOptions
from twin.testing import RunningTwin, start_twin

RESTRICTED = {
    "pod-security.kubernetes.io/enforce": "restricted",
    "pod-security.kubernetes.io/enforce-version": "latest",
}
# The text the real server wrote for Sickbay's reset pod (the facts file, word for word).
RESET_REFUSAL = (
    'violates PodSecurity "restricted:latest": privileged (container "reset" must not set '
    "securityContext.privileged=true), allowPrivilegeEscalation != false (container "
    '"reset" must set securityContext.allowPrivilegeEscalation=false), unrestricted '
    'capabilities (container "reset" must set securityContext.capabilities.drop=["ALL"]), '
    'runAsNonRoot != true (pod or container "reset" must set securityContext.runAsNonRoot=true), '
    'seccompProfile (pod or container "reset" must set securityContext.seccompProfile.type to '
    '"RuntimeDefault" or "Localhost")'
)


@pytest.fixture(scope="module")
def pst(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningTwin]:
    rs = start_twin(
        tmp_path_factory.mktemp("psa"),
        profile="1.36",
        nodes=1,
        gpus_per_node=1,
        controllers=(ControllerManager(TwinOptions()),),  # the Job controller
    )
    labels: dict[str, dict[str, str]] = {
        "psa-restricted": RESTRICTED,
        "psa-privileged": {"pod-security.kubernetes.io/enforce": "privileged"},
        "psa-baseline": {"pod-security.kubernetes.io/enforce": "baseline"},
        "psa-warn": {
            "pod-security.kubernetes.io/enforce": "privileged",
            "pod-security.kubernetes.io/warn": "restricted",
        },
        "psa-evict": {},
    }
    for name, ns_labels in labels.items():
        rs.store.create("namespaces", {"metadata": {"name": name, "labels": ns_labels}})
    yield rs
    rs.stop()


def _pod(name: str, container: dict[str, Any], **spec: Any) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name},
        "spec": {
            "containers": [{"name": "reset", "image": "registry.invalid/x:1", **container}],
            **spec,
        },
    }


PRIVILEGED = {"securityContext": {"privileged": True}}


def _wait(predicate: Any, timeout: float = 10.0) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.05)
    raise AssertionError("condition not met in time")


def test_direct_create_of_the_reset_pod_is_403_with_the_server_text(pst: RunningTwin) -> None:
    resp = raw(pst, "POST", "/api/v1/namespaces/psa-restricted/pods", _pod("r1", PRIVILEGED))
    assert resp.status_code == 403, resp.text
    body = resp.json()
    assert body["reason"] == "Forbidden" and body["code"] == 403
    assert body["message"] == f'pods "r1" is forbidden: {RESET_REFUSAL}'
    assert raw(pst, "GET", "/api/v1/namespaces/psa-restricted/pods/r1").status_code == 404


def test_pod_without_security_context_fails_four_clauses(pst: RunningTwin) -> None:
    resp = raw(pst, "POST", "/api/v1/namespaces/psa-restricted/pods", _pod("plain", {}))
    assert resp.status_code == 403
    message = resp.json()["message"]
    assert "privileged (" not in message
    for clause in (
        "allowPrivilegeEscalation != false",
        "unrestricted capabilities",
        "runAsNonRoot != true",
        "seccompProfile (",
    ):
        assert clause in message, clause


def test_restricted_admits_a_compliant_pod(pst: RunningTwin) -> None:
    ok = _pod(
        "compliant",
        {
            "securityContext": {
                "allowPrivilegeEscalation": False,
                "capabilities": {"drop": ["ALL"]},
            }
        },
        securityContext={"runAsNonRoot": True, "seccompProfile": {"type": "RuntimeDefault"}},
    )
    assert raw(pst, "POST", "/api/v1/namespaces/psa-restricted/pods", ok).status_code == 201


def test_enforce_privileged_admits_both(pst: RunningTwin) -> None:
    for name, container in (("p1", PRIVILEGED), ("p2", {})):
        resp = raw(pst, "POST", "/api/v1/namespaces/psa-privileged/pods", _pod(name, container))
        assert resp.status_code == 201, resp.text
        assert "Warning" not in resp.headers


def test_warn_label_adds_a_warning_header_and_refuses_nothing(pst: RunningTwin) -> None:
    resp = raw(pst, "POST", "/api/v1/namespaces/psa-warn/pods", _pod("w1", PRIVILEGED))
    assert resp.status_code == 201, resp.text
    warning = resp.headers["Warning"]
    assert warning.startswith(
        '299 - "would violate PodSecurity \\"restricted:latest\\": privileged'
    )


@pytest.mark.parametrize(
    ("name", "container", "spec", "clause"),
    [
        ("b-priv", PRIVILEGED, {}, 'privileged (container "reset" must not set'),
        ("b-hostnet", {}, {"hostNetwork": True}, "host namespaces (hostNetwork=true)"),
        (
            "b-hostpath",
            {},
            {"volumes": [{"name": "dev", "hostPath": {"path": "/dev"}}]},
            'hostPath volumes (volume "dev")',
        ),
        (
            "b-caps",
            {"securityContext": {"capabilities": {"add": ["SYS_ADMIN"]}}},
            {},
            'non-default capabilities (container "reset" must not include "SYS_ADMIN" in '
            "securityContext.capabilities.add)",
        ),
    ],
)
def test_baseline_refuses_host_access(
    pst: RunningTwin, name: str, container: dict[str, Any], spec: dict[str, Any], clause: str
) -> None:
    resp = raw(pst, "POST", "/api/v1/namespaces/psa-baseline/pods", _pod(name, container, **spec))
    assert resp.status_code == 403, resp.text
    assert resp.json()["message"].startswith(
        f'pods "{name}" is forbidden: violates PodSecurity "baseline:latest": '
    )
    assert clause in resp.json()["message"]


def test_baseline_admits_a_root_pod_without_extra_privileges(pst: RunningTwin) -> None:
    pod = _pod("b-root", {"securityContext": {"capabilities": {"drop": ["ALL"]}}})
    assert raw(pst, "POST", "/api/v1/namespaces/psa-baseline/pods", pod).status_code == 201


def test_job_pod_refused_gives_failed_create_then_deadline_exceeded(pst: RunningTwin) -> None:
    job = {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": "sickbay-reset-68f51e1ba79ab384"},
        "spec": {
            "backoffLimit": 0,
            "activeDeadlineSeconds": 2,
            "template": {"spec": {"restartPolicy": "Never", **_pod("x", PRIVILEGED)["spec"]}},
        },
    }
    resp = raw(pst, "POST", "/apis/batch/v1/namespaces/psa-restricted/jobs", job)
    assert resp.status_code == 201, resp.text
    # The server warns at the Job's create that its pods would be refused.
    assert "would violate PodSecurity" in resp.headers.get("Warning", "")

    def failed_create() -> list[dict[str, Any]]:
        events = raw(pst, "GET", "/api/v1/namespaces/psa-restricted/events").json()["items"]
        return [
            e
            for e in events
            if e["reason"] == "FailedCreate" and e["involvedObject"]["kind"] == "Job"
        ]

    event = _wait(failed_create)[0]
    assert event["type"] == "Warning"
    assert event["involvedObject"]["name"] == "sickbay-reset-68f51e1ba79ab384"
    assert event["involvedObject"]["uid"]
    prefix = 'Error creating: pods "sickbay-reset-68f51e1ba79ab384-'
    assert event["message"].startswith(prefix)
    assert event["message"].endswith(f'" is forbidden: {RESET_REFUSAL}')

    def failed() -> dict[str, Any] | None:
        body = raw(
            pst, "GET", f"/apis/batch/v1/namespaces/psa-restricted/jobs/{job['metadata']['name']}"
        )
        conds = body.json().get("status", {}).get("conditions") or []
        return next((c for c in conds if c["type"] == "Failed" and c["status"] == "True"), None)

    cond = _wait(failed)
    assert cond["reason"] == "DeadlineExceeded"
    assert cond["message"] == "Job was active longer than specified deadline"
    pods = raw(pst, "GET", "/api/v1/namespaces/psa-restricted/pods").json()["items"]
    assert not [p for p in pods if p["metadata"]["name"].startswith("sickbay-reset-")]


def test_eviction_with_dry_run_in_the_body_evicts_nothing(pst: RunningTwin) -> None:
    ns = "psa-evict"
    assert raw(pst, "POST", f"/api/v1/namespaces/{ns}/pods", _pod("victim", {})).status_code == 201
    body = {
        "apiVersion": "policy/v1",
        "kind": "Eviction",
        "metadata": {"name": "victim", "namespace": ns},
        "deleteOptions": {"dryRun": ["All"]},
    }
    resp = raw(pst, "POST", f"/api/v1/namespaces/{ns}/pods/victim/eviction", body)
    assert resp.status_code == 201, resp.text
    pod = raw(pst, "GET", f"/api/v1/namespaces/{ns}/pods/victim").json()
    assert "deletionTimestamp" not in pod["metadata"]
    assert not [
        c for c in pod.get("status", {}).get("conditions") or [] if c["type"] == "DisruptionTarget"
    ]
    # Without the dry run the same request evicts.
    del body["deleteOptions"]
    assert (
        raw(pst, "POST", f"/api/v1/namespaces/{ns}/pods/victim/eviction", body).status_code == 201
    )
    gone = raw(pst, "GET", f"/api/v1/namespaces/{ns}/pods/victim")
    # Evicted: Terminating, or already gone if the kubelet stand-in finished its grace period
    # first (a race the API allows); either way it was deleted, not left running.
    assert gone.status_code == 404 or "deletionTimestamp" in gone.json()["metadata"]


def test_events_listed_by_involved_object_uid_as_kubectl_describe_does(pst: RunningTwin) -> None:
    """`kubectl describe` lists a pod's Events with name, namespace, kind and uid: an Event
    written without the uid is not among them (it shows only in `kubectl get events`)."""
    ns = "psa-evict"
    created = raw(pst, "POST", f"/api/v1/namespaces/{ns}/pods", _pod("described", {})).json()
    uid = created["metadata"]["uid"]
    involved = {"apiVersion": "v1", "kind": "Pod", "name": "described", "namespace": ns}
    for name, ref in (("with-uid", {**involved, "uid": uid}), ("without-uid", involved)):
        event = {
            "apiVersion": "v1",
            "kind": "Event",
            "metadata": {"name": name},
            "involvedObject": ref,
            "reason": "GPUQuarantined",
            "message": name,
            "type": "Normal",
        }
        assert raw(pst, "POST", f"/api/v1/namespaces/{ns}/events", event).status_code == 201
    selector = (
        f"involvedObject.name=described,involvedObject.namespace={ns},"
        f"involvedObject.kind=Pod,involvedObject.uid={uid}"
    )
    listed = raw(pst, "GET", f"/api/v1/namespaces/{ns}/events?fieldSelector={selector}").json()
    names = {e["metadata"]["name"] for e in listed["items"]}  # the twin's own Events too
    assert "with-uid" in names and "without-uid" not in names
    assert all(e["involvedObject"]["uid"] == uid for e in listed["items"])
