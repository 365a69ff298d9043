"""The twin served as a cluster's API server is reached from a pod: TLS, ServiceAccount tokens,
the root CA ConfigMap, NetworkPolicies. Checked against tests/k8s_golden where a response was
recorded from a real 1.36 control plane (discovery 03/04, 401 in 18, 403 in 19).

Cases:
- https with a throwaway CA: the official client trusts it through the kubeconfig; a client
  that does not trust the CA is refused at the handshake; a plain-HTTP request gets no API;
- TokenRequest (`serviceaccounts/<name>/token`): listed in discovery exactly as recorded;
  answers a token, the defaults filled in; under 10 minutes is 422; a missing account is 404;
- the token is the account: SelfSubjectReview names it and its groups; RBAC decides (the
  recorded 403 shape, then allowed once bound); `bearer` in lower case (the Python client's
  in-cluster configuration) authenticates like `Bearer`; an unknown token and a token whose
  account was deleted get the recorded 401; the account cannot impersonate (403);
- the ServiceAccount volume of a pod follows its account's automountServiceAccountToken;
- ConfigMap kube-root-ca.crt (key ca.crt, the CA) in existing and new namespaces, put back
  after a deletion;
- NetworkPolicy: networking.k8s.io in the group list (recorded order), server-side apply of
  deploy/networkpolicy.yaml's objects.
"""

from __future__ import annotations

import json
import ssl
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from tests.twin.helpers import assert_shape, golden
from twin.runtime import Twin
from twin.tls import throwaway_pki

ROOT = Path(__file__).resolve().parents[2]
# The root CA publisher is a controller thread: its ConfigMaps appear within milliseconds;
# the bound only turns a hang into a failure.
WAIT = 10.0


@pytest.fixture(scope="module")
def secure(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Twin, str, Path]]:
    pki = throwaway_pki(dns=["kubernetes.default.svc"], ips=["127.0.0.1", "10.96.0.1"])
    twin = Twin(profile="1.36", token="admin-token", tls=pki)
    twin.seed(nodes=1, gpus_per_node=1)
    twin.start()
    directory = tmp_path_factory.mktemp("tls")
    ca = directory / "ca.crt"
    ca.write_bytes(pki.ca_pem)
    try:
        yield twin, "admin-token", ca
    finally:
        twin.stop()


def _client(twin: Twin, ca: Path, token: str, scheme: str = "Bearer") -> httpx.Client:
    return httpx.Client(
        base_url=twin.url,
        headers={"Authorization": f"{scheme} {token}"},
        verify=ssl.create_default_context(cafile=str(ca)),
        timeout=10,
    )


def _until(what: str, probe: Any) -> Any:
    deadline = time.monotonic() + WAIT
    while time.monotonic() < deadline:
        value = probe()
        if value:
            return value
        time.sleep(0.05)
    pytest.fail(f"{what}: not within {WAIT} s")


def test_https_with_the_cluster_ca(secure: tuple[Twin, str, Path], tmp_path: Path) -> None:
    from kubernetes import client, config

    twin, _admin, ca = secure
    assert twin.url.startswith("https://127.0.0.1:")
    api = config.new_client_from_config(str(twin.write_kubeconfig(tmp_path / "kubeconfig")))
    assert len(client.CoreV1Api(api).list_node().items) == 1
    with pytest.raises(httpx.ConnectError, match="CERTIFICATE_VERIFY_FAILED"):
        httpx.get(twin.url + "/version", timeout=5)  # the system trust store lacks the CA
    with pytest.raises(httpx.TransportError):
        httpx.get(twin.url.replace("https", "http") + "/version", timeout=5)


def _account(http: httpx.Client, ns: str, name: str) -> None:
    if http.get(f"/api/v1/namespaces/{ns}").status_code == 404:
        assert http.post("/api/v1/namespaces", json={"metadata": {"name": ns}}).status_code == 201
    created = http.post(
        f"/api/v1/namespaces/{ns}/serviceaccounts", json={"metadata": {"name": name}}
    )
    assert created.status_code == 201, created.text


def _token(http: httpx.Client, ns: str, name: str, **spec: Any) -> httpx.Response:
    return http.post(
        f"/api/v1/namespaces/{ns}/serviceaccounts/{name}/token",
        json={"apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest", "spec": spec},
    )


def test_token_request_in_discovery_as_recorded(secure: tuple[Twin, str, Path]) -> None:
    twin, admin, ca = secure
    with _client(twin, ca, admin) as http:
        listed = http.get("/api/v1").json()["resources"]
    (ours,) = [r for r in listed if r["name"] == "serviceaccounts/token"]
    (real,) = [
        r for r in golden(3)["response"]["resources"] if r["name"] == "serviceaccounts/token"
    ]
    assert ours == real
    with _client(twin, ca, admin) as http:
        groups = [g["name"] for g in http.get("/apis").json()["groups"]]
    recorded = [g["name"] for g in golden(4)["response"]["groups"]]
    assert "networking.k8s.io" in groups
    # Served groups keep the recorded server's order.
    assert groups == [g for g in recorded if g in groups] + [g for g in groups if g not in recorded]


def test_token_request_answers_a_token(secure: tuple[Twin, str, Path]) -> None:
    twin, admin, ca = secure
    with _client(twin, ca, admin) as http:
        _account(http, "tokens", "runner")
        answer = _token(http, "tokens", "runner")
        assert answer.status_code == 201, answer.text
        body = answer.json()
        assert body["kind"] == "TokenRequest" and body["apiVersion"] == "authentication.k8s.io/v1"
        assert body["spec"]["expirationSeconds"] == 3600
        assert body["spec"]["audiences"]
        assert body["status"]["token"] and body["status"]["expirationTimestamp"].endswith("Z")
        short = _token(http, "tokens", "runner", expirationSeconds=60)
        assert short.status_code == 422
        assert short.json()["details"]["causes"][0]["field"] == "spec.expirationSeconds"
        assert _token(http, "tokens", "nobody").status_code == 404


def test_the_token_is_its_service_account(secure: tuple[Twin, str, Path]) -> None:
    twin, admin, ca = secure
    with _client(twin, ca, admin) as http:
        _account(http, "tokened", "reader")
        token = _token(http, "tokened", "reader").json()["status"]["token"]
    with _client(twin, ca, token) as http:
        review = http.post(
            "/apis/authentication.k8s.io/v1/selfsubjectreviews",
            json={"apiVersion": "authentication.k8s.io/v1", "kind": "SelfSubjectReview"},
        ).json()["status"]["userInfo"]
        assert review["username"] == "system:serviceaccount:tokened:reader"
        assert review["groups"] == [
            "system:serviceaccounts",
            "system:serviceaccounts:tokened",
            "system:authenticated",
        ]
        denied = http.get("/api/v1/namespaces/tokened/pods")
        assert denied.status_code == 403
        assert_shape(denied.json(), golden(19)["response"])
        assert denied.json()["message"] == (
            'pods is forbidden: User "system:serviceaccount:tokened:reader" cannot list '
            'resource "pods" in API group "" in the namespace "tokened"'
        )
        impersonating = http.get(
            "/api/v1/namespaces/tokened/pods", headers={"Impersonate-User": "kubernetes-admin"}
        )
        assert impersonating.status_code == 403
    with _client(twin, ca, admin) as http:
        role = {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "Role",
            "metadata": {"name": "pod-reader"},
            "rules": [{"apiGroups": [""], "resources": ["pods"], "verbs": ["list"]}],
        }
        binding = {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "RoleBinding",
            "metadata": {"name": "pod-reader"},
            "roleRef": {
                "apiGroup": "rbac.authorization.k8s.io",
                "kind": "Role",
                "name": "pod-reader",
            },
            "subjects": [{"kind": "ServiceAccount", "name": "reader", "namespace": "tokened"}],
        }
        rbac = "/apis/rbac.authorization.k8s.io/v1/namespaces/tokened"
        assert http.post(f"{rbac}/roles", json=role).status_code == 201
        assert http.post(f"{rbac}/rolebindings", json=binding).status_code == 201
    # The official client's in-cluster configuration sends the scheme in lower case.
    with _client(twin, ca, token, scheme="bearer") as http:
        assert http.get("/api/v1/namespaces/tokened/pods").status_code == 200
    with _client(twin, ca, "not-a-token") as http:
        refused = http.get("/api/v1/namespaces/tokened/pods")
        assert refused.status_code == 401
        assert refused.json() == golden(18)["response"]
    with _client(twin, ca, admin) as http:
        assert http.delete("/api/v1/namespaces/tokened/serviceaccounts/reader").status_code == 200
    with _client(twin, ca, token) as http:
        assert http.get("/api/v1/namespaces/tokened/pods").status_code == 401


def test_root_ca_configmap_in_every_namespace(secure: tuple[Twin, str, Path]) -> None:
    twin, admin, ca = secure
    path = "/api/v1/namespaces/{}/configmaps/kube-root-ca.crt"

    def published(http: httpx.Client, ns: str) -> dict[str, Any] | None:
        got = http.get(path.format(ns))
        return got.json() if got.status_code == 200 else None

    with _client(twin, ca, admin) as http:
        existing = _until("kube-root-ca.crt in default", lambda: published(http, "default"))
        assert existing["data"] == {"ca.crt": ca.read_text()}
        assert "kubernetes.io/description" in existing["metadata"]["annotations"]
        assert (
            http.post("/api/v1/namespaces", json={"metadata": {"name": "fresh"}}).status_code == 201
        )
        _until("kube-root-ca.crt in a new namespace", lambda: published(http, "fresh"))
        assert http.delete(path.format("fresh")).status_code == 200
        _until("kube-root-ca.crt put back", lambda: published(http, "fresh"))


def test_network_policies_apply_server_side(secure: tuple[Twin, str, Path]) -> None:
    twin, admin, ca = secure
    docs = [d for d in yaml.safe_load_all((ROOT / "deploy/networkpolicy.yaml").read_text()) if d]
    with _client(twin, ca, admin) as http:
        if http.get("/api/v1/namespaces/sickbay").status_code == 404:
            http.post("/api/v1/namespaces", json={"metadata": {"name": "sickbay"}})
        for doc in docs:
            name = doc["metadata"]["name"]
            url = f"/apis/networking.k8s.io/v1/namespaces/sickbay/networkpolicies/{name}"
            applied = http.patch(
                url,
                params={"fieldManager": "tests", "fieldValidation": "Strict"},
                content=json.dumps(doc),
                headers={"Content-Type": "application/apply-patch+yaml"},
            )
            assert applied.status_code == 201, applied.text
            got = http.get(url).json()
            assert got["spec"] == doc["spec"]
            assert got["metadata"]["managedFields"][0]["operation"] == "Apply"


def test_service_account_volume_follows_the_account(secure: tuple[Twin, str, Path]) -> None:
    """The ServiceAccount admission plugin: a pod of an account with
    `automountServiceAccountToken: false` gets no token volume unless the pod asks for it."""
    twin, admin, ca = secure

    def pod(name: str, **spec: Any) -> dict[str, Any]:
        body = {
            "metadata": {"name": name},
            "spec": {
                "serviceAccountName": "quiet",
                "containers": [{"name": "c", "image": "registry.invalid/c:1"}],
                **spec,
            },
        }
        with _client(twin, ca, admin) as http:
            created = http.post("/api/v1/namespaces/quiet/pods", json=body)
        assert created.status_code == 201, created.text
        return dict(created.json())

    def token_volumes(p: dict[str, Any]) -> list[str]:
        return [v["name"] for v in p["spec"].get("volumes") or [] if "projected" in v]

    with _client(twin, ca, admin) as http:
        _account(http, "quiet", "quiet")
        account = "/api/v1/namespaces/quiet/serviceaccounts/quiet"
        http.patch(
            account,
            json={"automountServiceAccountToken": False},
            headers={"Content-Type": "application/merge-patch+json"},
        )
    assert token_volumes(pod("silent")) == []
    (asked,) = token_volumes(pod("asks", automountServiceAccountToken=True))
    assert asked.startswith("kube-api-access-")
