"""Eviction through the official client, plus server extras.

Cases: PolicyV1 eviction is 429 while a PodDisruptionBudget allows no disruption and 201 once
it does (PDB status tracks Running+Ready pods); eviction of a pod no PDB covers is 201 and
leaves the pod Terminating with DisruptionTarget; two PDBs on one pod is 500;
delete_collection with a label selector; delete with dryRun and with a stale precondition;
watch with sendInitialEvents + allowWatchBookmarks; JSON/YAML bodies, 415 and 400 for others;
wrongly typed fields give 400/422, never 500;
request interceptors injecting 500/429 and connection resets; /twin/<name> extension handlers.
"""

from __future__ import annotations

import json
import time
from typing import Any

import httpx
import pytest
import urllib3
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from tests.twin.helpers import HTTP_TIMEOUT
from twin.errors import ApiError
from twin.server import RequestInfo
from twin.testing import RunningTwin


def _pod(name: str, labels: dict[str, str], node: str = "gpu-pool-node-0") -> dict[str, Any]:
    return {
        "metadata": {"name": name, "labels": labels},
        "spec": {"nodeName": node, "containers": [{"name": "c", "image": "i"}]},
    }


def _ready(twin: RunningTwin, ns: str, name: str) -> None:
    def kubelet(pod: dict[str, Any]) -> None:
        pod["status"]["phase"] = "Running"
        pod["status"]["conditions"] = [{"type": "Ready", "status": "True"}]

    twin.store.mutate("pods", name, kubelet, ns, subresource="status")


def _evict(core: client.CoreV1Api, ns: str, name: str) -> None:
    body = client.V1Eviction(
        api_version="policy/v1",
        kind="Eviction",
        metadata=client.V1ObjectMeta(name=name, namespace=ns),
    )
    core.create_namespaced_pod_eviction(name, ns, body)


def _wait_pdb(policy: client.PolicyV1Api, ns: str, healthy: int) -> client.V1PodDisruptionBudget:
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline:
        pdb = policy.read_namespaced_pod_disruption_budget("pdb", ns)
        if pdb.status.current_healthy == healthy:
            return pdb
        time.sleep(0.02)  # the disruption controller reacts within milliseconds
    raise AssertionError("PDB status never caught up")


def test_eviction_honours_pdb(
    twin: RunningTwin, api: client.ApiClient, core: client.CoreV1Api, ns: str
) -> None:
    policy = client.PolicyV1Api(api)
    for name in ("a", "b"):
        core.create_namespaced_pod(ns, _pod(name, {"app": "train"}))
        _ready(twin, ns, name)
    policy.create_namespaced_pod_disruption_budget(
        ns,
        {
            "metadata": {"name": "pdb"},
            "spec": {"minAvailable": 2, "selector": {"matchLabels": {"app": "train"}}},
        },
    )
    pdb = _wait_pdb(policy, ns, 2)
    assert (pdb.status.desired_healthy, pdb.status.disruptions_allowed) == (2, 0)
    assert pdb.status.conditions[0].reason == "InsufficientPods"
    with pytest.raises(ApiException) as refused:
        _evict(core, ns, "a")
    assert refused.value.status == 429
    body = json.loads(refused.value.body)
    assert (
        body["reason"] == "TooManyRequests"
        and body["details"]["causes"][0]["reason"] == "DisruptionBudget"
    )
    assert core.read_namespaced_pod("a", ns).metadata.deletion_timestamp is None

    policy.patch_namespaced_pod_disruption_budget("pdb", ns, {"spec": {"minAvailable": 1}})
    deadline = time.monotonic() + 5
    while policy.read_namespaced_pod_disruption_budget("pdb", ns).status.disruptions_allowed != 1:
        assert time.monotonic() < deadline
        time.sleep(0.02)
    _evict(core, ns, "a")
    evicted = core.read_namespaced_pod("a", ns)
    assert (
        evicted.metadata.deletion_timestamp is not None
        and evicted.metadata.deletion_grace_period_seconds == 30
    )
    assert [
        (c.type, c.reason) for c in evicted.status.conditions if c.type == "DisruptionTarget"
    ] == [("DisruptionTarget", "EvictionByEvictionAPI")]
    with pytest.raises(ApiException) as second:
        _evict(core, ns, "b")  # one disruption used up, and a is no longer healthy
    assert second.value.status == 429


def test_eviction_without_pdb_and_with_two(
    twin: RunningTwin, api: client.ApiClient, core: client.CoreV1Api, ns: str
) -> None:
    core.create_namespaced_pod(ns, _pod("free", {"app": "free"}))
    _ready(twin, ns, "free")
    _evict(core, ns, "free")
    assert core.read_namespaced_pod("free", ns).metadata.deletion_timestamp is not None
    policy = client.PolicyV1Api(api)
    core.create_namespaced_pod(ns, _pod("double", {"app": "double"}))
    _ready(twin, ns, "double")
    for name in ("p1", "p2"):
        policy.create_namespaced_pod_disruption_budget(
            ns,
            {
                "metadata": {"name": name},
                "spec": {"maxUnavailable": 1, "selector": {"matchLabels": {"app": "double"}}},
            },
        )
    with pytest.raises(ApiException) as two:
        _evict(core, ns, "double")
    assert two.value.status == 500


def test_delete_collection_dry_run_and_preconditions(core: client.CoreV1Api, ns: str) -> None:
    for i in range(3):
        core.create_namespaced_pod(ns, _pod(f"p{i}", {"batch": "x" if i < 2 else "y"}))
    core.delete_namespaced_pod("p2", ns, dry_run="All")
    assert core.read_namespaced_pod("p2", ns).metadata.deletion_timestamp is None
    with pytest.raises(ApiException) as stale:
        core.delete_namespaced_pod(
            "p2",
            ns,
            body=client.V1DeleteOptions(preconditions=client.V1Preconditions(resource_version="1")),
        )
    assert stale.value.status == 409
    core.delete_collection_namespaced_pod(ns, label_selector="batch=x", grace_period_seconds=0)
    assert [p.metadata.name for p in core.list_namespaced_pod(ns).items] == ["p2"]


def test_watch_initial_events_and_bookmark(
    twin: RunningTwin, core: client.CoreV1Api, ns: str
) -> None:
    core.create_namespaced_pod(ns, _pod("existing", {"a": "b"}))
    url = f"{twin.url}/api/v1/namespaces/{ns}/pods?watch=true&sendInitialEvents=true&allowWatchBookmarks=true&resourceVersionMatch=NotOlderThan&timeoutSeconds=1"
    events = [
        json.loads(line) for line in httpx.get(url, timeout=HTTP_TIMEOUT).text.splitlines() if line
    ]
    assert [e["type"] for e in events] == ["ADDED", "BOOKMARK", "BOOKMARK"]
    assert events[1]["object"]["metadata"]["annotations"] == {"k8s.io/initial-events-end": "true"}
    bad = httpx.get(url.replace("&allowWatchBookmarks=true", ""), timeout=HTTP_TIMEOUT)
    assert bad.status_code == 422


def test_request_interceptors_and_extension_handlers(twin_factory: Any) -> None:
    rs = twin_factory(nodes=1)
    core = client.CoreV1Api(rs.api_client())

    def fail_pod_creates(info: RequestInfo) -> ApiError | None:
        if info.verb == "create" and info.resource == "pods":
            return ApiError(500, "InternalError", "injected")
        if info.verb == "list" and info.resource == "nodes":
            return ApiError(429, "TooManyRequests", "slow down")
        return None

    rs.twin.add_request_interceptor(fail_pod_creates)
    with pytest.raises(ApiException) as injected:
        core.create_namespaced_pod("default", _pod("x", {}))
    assert injected.value.status == 500
    with pytest.raises(ApiException) as throttled:
        core.list_node()
    assert throttled.value.status == 429
    rs.twin.remove_request_interceptor(fail_pod_creates)
    assert len(core.list_node().items) == 1

    rs.twin.add_request_interceptor(lambda info: "reset" if info.verb == "get" else None)
    with pytest.raises((urllib3.exceptions.HTTPError, OSError)):
        core.api_client.rest_client.pool_manager.request(
            "GET", f"{rs.url}/api/v1/nodes/gpu-pool-node-0", retries=False
        )
    rs.twin.request_interceptors.clear()

    rs.twin.add_http_handler(
        "echo",
        lambda method, parts, query, body: (
            200,
            {"method": method, "parts": parts, "query": query},
        ),
    )
    assert httpx.post(f"{rs.url}/twin/echo/a/b?x=1", timeout=HTTP_TIMEOUT).json() == {
        "method": "POST",
        "parts": ["a", "b"],
        "query": {"x": "1"},
    }
    assert httpx.get(f"{rs.url}/twin/nothing", timeout=HTTP_TIMEOUT).status_code == 404


def test_create_content_types(twin: RunningTwin, ns: str) -> None:
    url = f"{twin.url}/api/v1/namespaces/{ns}/pods"
    as_yaml = "metadata:\n  name: from-yaml\nspec:\n  containers:\n  - {name: c, image: i}\n"
    created = httpx.post(
        url, content=as_yaml, headers={"Content-Type": "application/yaml"}, timeout=HTTP_TIMEOUT
    )
    assert created.status_code == 201 and created.json()["metadata"]["name"] == "from-yaml"
    wrong = httpx.post(
        url, content=as_yaml, headers={"Content-Type": "text/plain"}, timeout=HTTP_TIMEOUT
    )
    assert wrong.status_code == 415 and wrong.json()["reason"] == "UnsupportedMediaType"
    garbage = httpx.post(
        url,
        content=b"{not json",
        headers={"Content-Type": "application/json"},
        timeout=HTTP_TIMEOUT,
    )
    assert garbage.status_code == 400 and garbage.json()["reason"] == "BadRequest"
    wrong_kind = httpx.post(
        url,
        json={"apiVersion": "v1", "kind": "Node", "metadata": {"name": "n"}},
        timeout=HTTP_TIMEOUT,
    )
    assert wrong_kind.status_code == 400


@pytest.mark.parametrize(
    ("path", "body"),
    [
        (
            "/api/v1/namespaces/{ns}/pods",
            {
                "metadata": {"name": "x", "labels": ["a"]},
                "spec": {"containers": [{"name": "c", "image": "i"}]},
            },
        ),
        ("/api/v1/namespaces/{ns}/pods", {"metadata": "x", "spec": {}}),
        ("/api/v1/namespaces/{ns}/pods", {"metadata": {"name": "x"}, "spec": "containers"}),
        (
            "/api/v1/namespaces/{ns}/pods",
            {
                "metadata": {"name": "x"},
                "spec": {"containers": [{"name": "c", "image": "i", "resources": []}]},
            },
        ),
        (
            "/apis/apps/v1/namespaces/{ns}/deployments",
            {"metadata": {"name": "x"}, "spec": {"template": "t", "selector": {}}},
        ),
        (
            "/apis/resource.k8s.io/v1beta2/devicetaintrules",
            {"metadata": {"name": "x"}, "spec": {"taint": "NoExecute"}},
        ),
        (
            "/apis/policy/v1/namespaces/{ns}/poddisruptionbudgets",
            {"metadata": {"name": "x"}, "spec": {"selector": ["a"], "minAvailable": [1]}},
        ),
    ],
)
def test_wrongly_typed_bodies_are_client_errors(
    twin: RunningTwin, ns: str, path: str, body: dict[str, Any]
) -> None:
    resp = httpx.post(twin.url + path.format(ns=ns), json=body, timeout=HTTP_TIMEOUT)
    assert resp.status_code in (400, 422), resp.text
    assert resp.json()["kind"] == "Status"
