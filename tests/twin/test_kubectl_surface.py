"""The API surface kubectl relies on, checked without kubectl (tests/kubectl runs the binary).

Cases:
- /openapi/v3 index as a real 1.36 server spells it (k8s_golden/112: text/plain, hash-pinned
  serverRelativeURLs for the same group-versions); each document carries the kinds' schemas
  with x-kubernetes-group-version-kind and PATCH operations accepting fieldValidation;
- fieldValidation: Strict refuses an unknown field (400, strict decoding error), Warn answers
  201 with a Warning header, no parameter accepts silently;
- impersonating a user without RBAC: the recorded 403 (k8s_golden/19), word for word;
- protobuf bodies: a Namespace decodes; an unknown field or kind is a 415 naming it;
- pods/log errors as the kubelet words them; reviews are create-only (405 on GET).
"""

from __future__ import annotations

import re
import uuid
from collections.abc import Iterator

import httpx
import pytest

from tests.twin.helpers import golden, raw, replay
from twin.resources import CUSTOM_GROUPS
from twin.testing import RunningTwin, start_twin

PB = "application/vnd.kubernetes.protobuf"


@pytest.fixture(scope="module")
def twin(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningTwin]:
    rs = start_twin(tmp_path_factory.mktemp("surface"), profile="1.36", nodes=1, gpus_per_node=2)
    try:
        yield rs
    finally:
        rs.stop()


def test_openapi_index_matches_the_recorded_one(twin: RunningTwin) -> None:
    resp = replay(twin, 112)
    recorded = golden(112)
    assert resp.status_code == 200
    assert resp.headers["content-type"] == recorded["responseHeaders"]["content-type"]
    ours = resp.json()["paths"]
    theirs = recorded["response"]["paths"]
    served = {p for p in ours if not any(p.startswith(f"apis/{g}/") for g in CUSTOM_GROUPS)}
    assert {"api/v1", "apis/apps/v1", "apis/resource.k8s.io/v1beta2"} <= served
    assert served <= set(theirs)
    for path, entry in ours.items():
        assert re.fullmatch(
            rf"/openapi/v3/{re.escape(path)}\?hash=[0-9A-F]{{128}}", entry["serverRelativeURL"]
        )
    doc = raw(twin, "GET", ours["apis/apps/v1"]["serverRelativeURL"]).json()
    assert doc["openapi"] == "3.0.0"
    kinds = {
        g["kind"]
        for s in doc["components"]["schemas"].values()
        for g in s.get("x-kubernetes-group-version-kind", [])
    }
    assert {"Deployment", "ReplicaSet", "StatefulSet"} <= kinds
    patch = doc["paths"]["/apis/apps/v1/namespaces/{namespace}/deployments/{name}"]["patch"]
    assert patch["x-kubernetes-group-version-kind"] == {
        "group": "apps",
        "version": "v1",
        "kind": "Deployment",
    }
    assert "fieldValidation" in {p["name"] for p in patch["parameters"]}
    assert raw(twin, "GET", "/openapi/v3/apis/nope/v1").status_code == 404


def _deployment(extra: dict[str, object]) -> dict[str, object]:
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": f"d-{uuid.uuid4().hex[:6]}"},
        "spec": {
            "selector": {"matchLabels": {"app": "x"}},
            "template": {
                "metadata": {"labels": {"app": "x"}},
                "spec": {"containers": [{"name": "c", "image": "i", **extra}]},
            },
        },
    }


def test_field_validation_modes(twin: RunningTwin) -> None:
    path = "/apis/apps/v1/namespaces/default/deployments"
    strict = raw(twin, "POST", path + "?fieldValidation=Strict", _deployment({"imag": "x"}))
    assert strict.status_code == 400
    assert strict.json()["message"] == (
        'Deployment in version "v1" cannot be handled as a Deployment: strict decoding error: '
        'unknown field "spec.template.spec.containers[0].imag"'
    )
    warn = raw(twin, "POST", path + "?fieldValidation=Warn", _deployment({"imag": "x"}))
    assert warn.status_code == 201
    assert (
        warn.headers["warning"]
        == '299 - "unknown field \\"spec.template.spec.containers[0].imag\\""'
    )
    assert raw(twin, "POST", path, _deployment({"imag": "x"})).status_code == 201
    known = raw(
        twin,
        "POST",
        path + "?fieldValidation=Strict",
        _deployment({"ports": [{"containerPort": 80}]}),
    )
    assert known.status_code == 201, known.text


def test_impersonated_user_without_rbac_is_forbidden_as_recorded(twin: RunningTwin) -> None:
    resp = replay(twin, 19)
    recorded = golden(19)
    assert resp.status_code == recorded["status"] == 403
    assert resp.json() == recorded["response"]


def _varint(n: int) -> bytes:
    out = b""
    while True:
        b, n = n & 0x7F, n >> 7
        out += bytes([b | (0x80 if n else 0)])
        if not n:
            return out


def _field(num: int, payload: bytes) -> bytes:
    return _varint(num << 3 | 2) + _varint(len(payload)) + payload


def _unknown(api_version: str, kind: str, raw_object: bytes) -> bytes:
    type_meta = _field(1, api_version.encode()) + _field(2, kind.encode())
    return b"k8s\x00" + _field(1, type_meta) + _field(2, raw_object)


def _post_pb(twin: RunningTwin, body: bytes) -> httpx.Response:
    return httpx.post(
        twin.url + "/api/v1/namespaces", content=body, headers={"Content-Type": PB}, timeout=15.0
    )


def test_protobuf_bodies(twin: RunningTwin) -> None:
    name = f"pb-{uuid.uuid4().hex[:6]}"
    meta = _field(1, name.encode()) + _field(11, _field(1, b"team") + _field(2, b"gpu"))
    ok = _post_pb(twin, _unknown("v1", "Namespace", _field(1, meta)))
    assert ok.status_code == 201, ok.text
    assert ok.json()["metadata"]["labels"]["team"] == "gpu"
    assert twin.store.get("namespaces", name)["status"]["phase"] == "Active"
    odd = _unknown("v1", "Namespace", _field(1, meta) + _field(9, b"?"))
    bad = _post_pb(twin, odd)
    assert bad.status_code == 415
    assert bad.json()["message"].startswith("the twin cannot decode protobuf field 9 of Namespace")
    alien = _unknown("v1", "PersistentVolume", _field(1, meta))
    no = _post_pb(twin, alien)
    assert no.status_code == 415 and "PersistentVolume" in no.json()["message"]


def test_pod_log_errors_and_reviews_are_create_only(twin: RunningTwin) -> None:
    pod = {
        "metadata": {"name": f"two-{uuid.uuid4().hex[:6]}"},
        "spec": {"containers": [{"name": "a", "image": "i"}, {"name": "b", "image": "i"}]},
    }
    twin.store.create("pods", pod, "default")
    name = pod["metadata"]["name"]
    resp = raw(twin, "GET", f"/api/v1/namespaces/default/pods/{name}/log")
    assert resp.status_code == 400
    assert (
        resp.json()["message"]
        == f"a container name must be specified for pod {name}, choose one of: [a b]"
    )
    waiting = raw(twin, "GET", f"/api/v1/namespaces/default/pods/{name}/log?container=a")
    assert (
        waiting.json()["message"]
        == f'container "a" in pod "{name}" is waiting to start: ContainerCreating'
    )
    review = raw(twin, "GET", "/apis/authorization.k8s.io/v1/selfsubjectaccessreviews")
    assert review.status_code == 405
