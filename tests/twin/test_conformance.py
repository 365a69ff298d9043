"""Conformance with responses recorded from a real Kubernetes 1.36 control plane (tests/k8s_golden).

Each test replays the recorded request (same method, path, body, headers) against a twin set
up like the recording cluster and compares status code and shape: same keys, reasons, codes,
causes and kinds; Status bodies for errors compare byte-for-byte where names coincide.

Cases: discovery (01-09: version, /api, /api/v1, /apis, resource.k8s.io group and versions,
apps/v1, policy/v1); errors (10-18: 404 get, 409 AlreadyExists, 409 stale PUT, 422 pod without
containers, 422 DeviceTaintRule bad effect and missing key, 404 unknown resource, text 404
unknown group, 401 bad token); PDB and eviction (20-28: status computed, 429 with
DisruptionBudget cause, 201 unprotected, Pending pod evicted regardless, 404 missing pod);
DRA create responses (30, 31, 34) and the v1alpha3 view with its Warning header (46); watches
(60 unbound pod, 61 bound pod graceful then force delete, 62 410 Expired); lists (70-84:
label/field selectors, pagination, 400 selector errors, PartialObjectMetadataList, Table);
patches (90-95: strategic, merge, JSON patch, failed test 422, 415, 404); server-side apply
(96-104: create, re-apply, 409 conflict, force, 422 without fieldManager, dry-run conflict,
dry-run force leaves the object unchanged); differences found with the same requests on a real
1.36.2 API (eviction naming another pod is 400, `unschedulable: false` reads back absent, a core
Event carries `eventTime: null`, a DRA resource's unknown field selector names the supported ones).
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from tests.twin.helpers import JOIN_TIMEOUT, assert_shape, golden, raw, replay
from twin.resources import CUSTOM_GROUPS
from twin.testing import RunningTwin, start_twin

NAMESPACES = (
    "golden-errors",
    "golden-evict",
    "golden-dra",
    "golden-watch",
    "golden-lists",
    "golden-patch",
)


@pytest.fixture(scope="module")
def gtwin(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningTwin]:
    rs = start_twin(tmp_path_factory.mktemp("golden"), profile="1.36", nodes=2, gpus_per_node=2)
    for name in NAMESPACES:
        rs.store.create("namespaces", {"metadata": {"name": name}})
    yield rs
    rs.stop()


def _pod(
    name: str, labels: dict[str, str], node: str | None = None, scheduler: str | None = None
) -> dict[str, Any]:
    spec: dict[str, Any] = {
        "containers": [{"name": "main", "image": "registry.invalid/pause:never-pulled"}]
    }
    if node:
        spec["nodeName"] = node
    if scheduler:
        spec["schedulerName"] = scheduler
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "labels": labels},
        "spec": spec,
    }


def _running_ready(rs: RunningTwin, ns: str, name: str) -> None:
    def fake_kubelet(pod: dict[str, Any]) -> None:
        pod["status"]["phase"] = "Running"
        pod["status"]["conditions"] = [{"type": "Ready", "status": "True"}]

    rs.store.mutate("pods", name, fake_kubelet, ns, subresource="status")


# ---- discovery ---------------------------------------------------------------------------


def test_version_and_api_shapes(gtwin: RunningTwin) -> None:
    for n in (1, 2):
        resp = replay(gtwin, n)
        assert resp.status_code == 200
        assert_shape(resp.json(), golden(n)["response"])
    assert gtwin.store is not None
    assert replay(gtwin, 1).json()["minor"] == "36"


def _entries(doc: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {r["name"]: r for r in doc["resources"]}


@pytest.mark.parametrize("number", [3, 6, 7, 8, 9])
def test_resource_lists_match_recorded_entries(gtwin: RunningTwin, number: int) -> None:
    resp = replay(gtwin, number)
    assert resp.status_code == 200
    ours, recorded = resp.json(), golden(number)["response"]
    assert set(ours) == set(recorded)
    assert ours["groupVersion"] == recorded["groupVersion"]
    mine, theirs = _entries(ours), _entries(recorded)
    if number in (6, 7, 9):  # DRA and policy: exactly the same resources
        assert set(mine) == set(theirs)
    else:
        assert set(mine) <= set(theirs) | {"configmaps"}
    for name, entry in mine.items():
        if name not in theirs:
            continue
        expected = {k: v for k, v in theirs[name].items() if k != "storageVersionHash"}
        assert entry == expected, name


def test_group_list_and_resource_group(gtwin: RunningTwin) -> None:
    groups = {g["name"]: g for g in replay(gtwin, 4).json()["groups"]}
    recorded = {g["name"]: g for g in golden(4)["response"]["groups"]}
    for name, group in groups.items():
        if name not in CUSTOM_GROUPS:  # the twin's CRDs (Cluster API, Karpenter)
            assert group == recorded[name]
    assert replay(gtwin, 5).json() == golden(5)["response"]


def test_aggregated_discovery_matches_recorded_entries(gtwin: RunningTwin) -> None:
    for n in (110, 111):
        req = golden(n)["request"]
        resp = raw(gtwin, "GET", req["path"], headers=req.get("headers"))
        assert resp.status_code == 200
        assert resp.headers["content-type"] == golden(n)["responseHeaders"]["content-type"]
        doc, recorded = resp.json(), golden(n)["response"]
        assert set(doc) == set(recorded)
        theirs = {
            (i["metadata"].get("name", ""), v["version"], r["resource"]): r
            for i in recorded["items"]
            for v in i["versions"]
            for r in v["resources"]
        }
        compared = 0
        for item in doc["items"]:
            for version in item["versions"]:
                for entry in version["resources"]:
                    key = (item["metadata"].get("name", ""), version["version"], entry["resource"])
                    if key[0] in CUSTOM_GROUPS:
                        continue
                    expected = dict(theirs[key])
                    subs = {s["subresource"]: s for s in expected.pop("subresources", [])}
                    mine = dict(entry)
                    for sub in mine.pop("subresources", []):
                        assert sub == subs[sub["subresource"]], key
                    assert mine == expected, key
                    compared += 1
        assert compared >= 5


# ---- errors ------------------------------------------------------------------------------


def test_error_statuses_match_exactly(gtwin: RunningTwin) -> None:
    existing = golden(11)["request"]["body"]
    assert raw(gtwin, "POST", "/api/v1/namespaces/golden-errors/pods", existing).status_code == 201
    for n in (10, 11, 12, 13, 14, 15, 16):
        resp = replay(gtwin, n)
        expected = golden(n)
        assert resp.status_code == expected["status"], (n, resp.text)
        assert resp.headers["content-type"] == "application/json"
        assert resp.json() == expected["response"], n


def test_unknown_group_is_plain_text_404(gtwin: RunningTwin) -> None:
    resp = replay(gtwin, 17)
    assert resp.status_code == 404
    assert resp.text == golden(17)["response"]
    assert resp.headers["content-type"] == "text/plain; charset=utf-8"


def test_bad_token_401(twin_factory: Any) -> None:
    rs = twin_factory(profile="1.36", token="s3cret", nodes=1)
    rs.store.create("namespaces", {"metadata": {"name": "golden-errors"}})
    bad = replay(rs, 18, token="wrong")
    assert bad.status_code == 401
    assert bad.json() == golden(18)["response"]
    assert raw(rs, "GET", "/api/v1/namespaces/golden-errors/pods").status_code == 401
    assert (
        raw(rs, "GET", "/api/v1/namespaces/golden-errors/pods", token="s3cret").status_code == 200
    )


# ---- PDB and eviction ----------------------------------------------------------------------


def _wait(predicate: Any, timeout: float = 5.0) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.02)  # the disruption controller reacts within milliseconds
    raise AssertionError("condition not met in time")


def test_pdb_and_eviction_sequence(gtwin: RunningTwin) -> None:
    ns = "golden-evict"
    for pod in (
        _pod("protected", {"app": "protected"}, "node-b"),
        _pod("protected-pending", {"app": "protected"}, "node-a"),
        _pod("unprotected", {"app": "unprotected"}, "node-b"),
    ):
        assert raw(gtwin, "POST", f"/api/v1/namespaces/{ns}/pods", pod).status_code == 201
    created = replay(gtwin, 20)
    assert created.status_code == 201
    assert_shape(created.json(), golden(20)["response"])
    _running_ready(gtwin, ns, "protected")

    def observed() -> dict[str, Any] | None:
        body = replay(gtwin, 21).json()
        return body if body["status"].get("currentHealthy") == 1 else None

    pdb = _wait(observed)
    assert_shape(pdb, golden(21)["response"])
    for key in ("currentHealthy", "desiredHealthy", "disruptionsAllowed", "expectedPods"):
        assert pdb["status"][key] == golden(21)["response"]["status"][key], key

    refused = replay(gtwin, 22)
    assert refused.status_code == 429
    assert refused.json() == golden(22)["response"]
    after = replay(gtwin, 23).json()
    assert "deletionTimestamp" not in after["metadata"]
    assert not [c for c in after["status"].get("conditions", []) if c["type"] == "DisruptionTarget"]

    for evict_n, after_n in ((24, 25), (26, 27)):
        resp = replay(gtwin, evict_n)
        assert resp.status_code == 201
        assert resp.json() == golden(evict_n)["response"]
        pod = replay(gtwin, after_n).json()
        assert_shape(pod["metadata"], golden(after_n)["response"]["metadata"])
        assert pod["metadata"]["deletionGracePeriodSeconds"] == 30
        target = [c for c in pod["status"]["conditions"] if c["type"] == "DisruptionTarget"]
        expected = [
            c
            for c in golden(after_n)["response"]["status"]["conditions"]
            if c["type"] == "DisruptionTarget"
        ]
        assert_shape(target, expected)
        assert target[0]["reason"] == "EvictionByEvictionAPI"
        assert target[0]["message"] == expected[0]["message"]

    missing = replay(gtwin, 28)
    assert missing.status_code == 404
    assert missing.json() == golden(28)["response"]


# ---- DRA objects -------------------------------------------------------------------------


@pytest.mark.parametrize("number", [30, 31, 34])
def test_create_responses_have_recorded_shape(gtwin: RunningTwin, number: int) -> None:
    resp = replay(gtwin, number)
    assert resp.status_code == 201, resp.text
    assert_shape(resp.json(), golden(number)["response"])


def test_v1alpha3_view_carries_deprecation_warning(gtwin: RunningTwin) -> None:
    if gtwin.store.try_get("devicetaintrules.resource.k8s.io", "golden-noexecute") is None:
        assert replay(gtwin, 34).status_code == 201
    resp = replay(gtwin, 46)
    assert resp.status_code == 200
    assert resp.headers["warning"] == golden(46)["responseHeaders"]["warning"]
    body = resp.json()
    assert body["apiVersion"] == "resource.k8s.io/v1alpha3"
    assert body["spec"]["taint"]["effect"] == "NoExecute"
    beta = raw(gtwin, "GET", "/apis/resource.k8s.io/v1beta2/devicetaintrules/golden-noexecute")
    assert "warning" not in beta.headers


# ---- watch ---------------------------------------------------------------------------------


def _collect_watch(
    rs: RunningTwin, path: str, events: list[dict[str, Any]], ready: threading.Event
) -> None:
    with httpx.stream("GET", rs.url + path, timeout=15.0) as resp:  # watch ends by timeoutSeconds
        ready.set()
        for line in resp.iter_lines():
            if line:
                events.append(json.loads(line))


def _watch_during(rs: RunningTwin, ns: str, actions: Any) -> list[dict[str, Any]]:
    rv = raw(rs, "GET", f"/api/v1/namespaces/{ns}/pods").json()["metadata"]["resourceVersion"]
    events: list[dict[str, Any]] = []
    ready = threading.Event()
    t = threading.Thread(
        target=_collect_watch,
        args=(
            rs,
            f"/api/v1/namespaces/{ns}/pods?watch=true&resourceVersion={rv}&timeoutSeconds=2",
            events,
            ready,
        ),
    )
    t.start()
    ready.wait(JOIN_TIMEOUT)
    actions()
    t.join(JOIN_TIMEOUT)
    return events


def test_watch_unbound_pod_create_label_delete(gtwin: RunningTwin) -> None:
    ns = "golden-watch"
    base = f"/api/v1/namespaces/{ns}/pods"

    def actions() -> None:
        assert (
            raw(
                gtwin,
                "POST",
                base,
                _pod("watched", {"app": "watched"}, scheduler="golden-unscheduled"),
            ).status_code
            == 201
        )
        patch = {"metadata": {"labels": {"stage": "labelled"}}}
        assert (
            raw(
                gtwin,
                "PATCH",
                f"{base}/watched",
                patch,
                {"Content-Type": "application/merge-patch+json"},
            ).status_code
            == 200
        )
        assert raw(gtwin, "DELETE", f"{base}/watched").status_code == 200

    events = _watch_during(gtwin, ns, actions)
    recorded = golden(60)["response"]
    assert [e["type"] for e in events] == [e["type"] for e in recorded]
    for ours, theirs in zip(events, recorded, strict=True):
        assert_shape(ours, theirs)
    assert events[2]["object"]["metadata"]["deletionGracePeriodSeconds"] == 0


def test_watch_bound_pod_graceful_then_force_delete(gtwin: RunningTwin) -> None:
    ns = "golden-watch"
    base = f"/api/v1/namespaces/{ns}/pods"

    def actions() -> None:
        assert (
            raw(gtwin, "POST", base, _pod("bound", {"app": "bound"}, node="node-a")).status_code
            == 201
        )
        patch = {"metadata": {"labels": {"stage": "labelled"}}}
        assert (
            raw(
                gtwin,
                "PATCH",
                f"{base}/bound",
                patch,
                {"Content-Type": "application/merge-patch+json"},
            ).status_code
            == 200
        )
        graceful = raw(gtwin, "DELETE", f"{base}/bound")
        assert graceful.status_code == 200
        assert graceful.json()["metadata"]["deletionGracePeriodSeconds"] == 30
        assert raw(gtwin, "DELETE", f"{base}/bound?gracePeriodSeconds=0").status_code == 200

    events = _watch_during(gtwin, ns, actions)
    recorded = golden(61)["response"]
    assert [e["type"] for e in events] == [e["type"] for e in recorded]
    for ours, theirs in zip(events, recorded, strict=True):
        assert_shape(ours, theirs)


def test_watch_too_old_resource_version_is_410_event(gtwin: RunningTwin) -> None:
    resp = replay(gtwin, 62)
    assert resp.status_code == 200
    events = [json.loads(line) for line in resp.text.splitlines() if line]
    recorded = golden(62)["response"]
    assert len(events) == 1
    assert_shape(events[0], recorded[0])
    assert events[0]["object"]["message"].startswith("too old resource version: 1 (")


# ---- lists ---------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def list_pods(gtwin: RunningTwin) -> None:
    for item in golden(70)["response"]["items"]:
        spec = item["spec"]
        pod = _pod(
            item["metadata"]["name"],
            item["metadata"]["labels"],
            spec.get("nodeName"),
            spec.get("schedulerName"),
        )
        assert raw(gtwin, "POST", "/api/v1/namespaces/golden-lists/pods", pod).status_code == 201
        if item["status"].get("phase") == "Running":
            _running_ready(gtwin, "golden-lists", item["metadata"]["name"])


def _names(body: dict[str, Any]) -> list[str]:
    return [i["metadata"]["name"] for i in body["items"]]


@pytest.mark.parametrize("number", [70, 71, 72, 73, 74, 75, 76, 77, 82])
def test_list_selectors_select_the_recorded_pods(
    gtwin: RunningTwin, list_pods: None, number: int
) -> None:
    resp = replay(gtwin, number)
    assert resp.status_code == 200
    body, recorded = resp.json(), golden(number)["response"]
    assert set(body) == set(recorded)
    if number != 82:  # 82 lists the recording cluster's rules; here only the kind matters
        assert _names(body) == _names(recorded)
    assert body["kind"] == recorded["kind"]


def test_pagination_with_continue(gtwin: RunningTwin, list_pods: None) -> None:
    first = replay(gtwin, 78).json()
    recorded = golden(78)["response"]
    assert set(first["metadata"]) == set(recorded["metadata"])
    assert first["metadata"]["remainingItemCount"] == 2
    assert _names(first) == _names(recorded)
    token = first["metadata"]["continue"]
    second = raw(
        gtwin, "GET", f"/api/v1/namespaces/golden-lists/pods?limit=2&continue={token}"
    ).json()
    assert set(second["metadata"]) == set(golden(79)["response"]["metadata"])
    assert _names(second) == _names(golden(79)["response"])
    assert second["metadata"]["resourceVersion"] == first["metadata"]["resourceVersion"]


@pytest.mark.parametrize("number", [80, 81])
def test_selector_errors_are_400(gtwin: RunningTwin, number: int) -> None:
    resp = replay(gtwin, number)
    assert resp.status_code == 400
    assert resp.json() == golden(number)["response"]


def test_metadata_only_and_table_lists(gtwin: RunningTwin, list_pods: None) -> None:
    partial = replay(gtwin, 83).json()
    recorded = golden(83)["response"]
    assert set(partial) == set(recorded)
    assert partial["kind"] == "PartialObjectMetadataList"
    assert_shape(
        partial["items"][0]["metadata"]["labels"], recorded["items"][0]["metadata"]["labels"]
    )
    table, recorded_table = replay(gtwin, 84).json(), golden(84)["response"]
    assert set(table) == set(recorded_table)
    columns = [(c["name"], c["priority"]) for c in table["columnDefinitions"]]
    assert columns == [(c["name"], c["priority"]) for c in recorded_table["columnDefinitions"]]
    recorded_cells = [r["cells"] for r in recorded_table["rows"]]
    # Every cell but the age matches the real server's printing.
    assert [r["cells"][:4] + r["cells"][5:] for r in table["rows"]] == [
        c[:4] + c[5:] for c in recorded_cells
    ]


# ---- patches -------------------------------------------------------------------------------


def test_patch_sequence(gtwin: RunningTwin) -> None:
    target = _pod("patch-target", {"app": "patch-target", "tier": "web"})
    assert raw(gtwin, "POST", "/api/v1/namespaces/golden-patch/pods", target).status_code == 201
    for n in (90, 91, 92):
        resp = replay(gtwin, n)
        assert resp.status_code == 200, resp.text
        assert resp.json()["metadata"]["labels"] == golden(n)["response"]["metadata"]["labels"], n
    for n in (93, 94, 95):
        resp = replay(gtwin, n)
        assert resp.status_code == golden(n)["status"], n
        assert resp.json() == golden(n)["response"], n


# ---- server-side apply ---------------------------------------------------------------------


def _managers(obj: dict[str, Any]) -> dict[tuple[str, str | None], dict[str, Any]]:
    return {(m["manager"], m.get("subresource")): m for m in obj["metadata"]["managedFields"]}


def test_server_side_apply_sequence(gtwin: RunningTwin) -> None:
    created = replay(gtwin, 96)
    assert created.status_code == 201
    body = created.json()
    assert_shape(body, golden(96)["response"])
    assert (
        body["metadata"]["managedFields"][0]["fieldsV1"]
        == golden(96)["response"]["metadata"]["managedFields"][0]["fieldsV1"]
    )
    time_added = body["spec"]["taint"]["timeAdded"]

    again = replay(gtwin, 97).json()
    assert again["metadata"]["generation"] == 2
    assert again["spec"]["taint"]["value"] == "v2"
    assert again["spec"]["taint"]["timeAdded"] == time_added

    conflict = replay(gtwin, 98)
    assert conflict.status_code == 409
    assert conflict.json() == golden(98)["response"]

    forced = replay(gtwin, 99)
    assert forced.status_code == 200
    fb = forced.json()
    assert fb["spec"]["taint"]["value"] == "from-other-manager"
    assert fb["metadata"]["generation"] == 3
    ours, theirs = _managers(fb), _managers(golden(99)["response"])
    assert ours[("other-manager", None)]["fieldsV1"] == theirs[("other-manager", None)]["fieldsV1"]
    assert ours[("golden-ssa", None)]["fieldsV1"] == theirs[("golden-ssa", None)]["fieldsV1"]

    missing = replay(gtwin, 100)
    assert missing.status_code == 422
    assert missing.json() == golden(100)["response"]

    dry_conflict = replay(gtwin, 101)
    assert dry_conflict.status_code == 409
    assert dry_conflict.json() == golden(101)["response"]

    before = raw(gtwin, "GET", "/apis/resource.k8s.io/v1beta2/devicetaintrules/golden-ssa").json()
    dry_force = replay(gtwin, 103)
    assert dry_force.status_code == 200
    would_be = dry_force.json()
    assert would_be["spec"]["taint"]["value"] == "dry"
    assert would_be["metadata"]["labels"] == golden(103)["response"]["metadata"]["labels"]
    assert would_be["metadata"]["generation"] == 4
    assert would_be["metadata"]["resourceVersion"] == before["metadata"]["resourceVersion"]
    after = replay(gtwin, 104).json()
    assert after == before


# ---- differences found on a real 1.36.2 API (dra-facts.md, "Real 1.36.2 API vs the twin") ---


def test_eviction_naming_another_pod_is_400_and_evicts_nothing(gtwin: RunningTwin) -> None:
    ns = "golden-evict"
    for name in ("named-a", "named-b"):
        assert (
            raw(gtwin, "POST", f"/api/v1/namespaces/{ns}/pods", _pod(name, {})).status_code == 201
        )
    body = {"apiVersion": "policy/v1", "kind": "Eviction", "metadata": {"name": "named-b"}}
    resp = raw(gtwin, "POST", f"/api/v1/namespaces/{ns}/pods/named-a/eviction", body)
    assert resp.status_code == 400, resp.text
    assert resp.json() == {
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Failure",
        "message": "name in URL does not match name in Eviction object",
        "reason": "BadRequest",
        "code": 400,
    }
    for name in ("named-a", "named-b"):
        pod = raw(gtwin, "GET", f"/api/v1/namespaces/{ns}/pods/{name}").json()
        assert "deletionTimestamp" not in pod["metadata"], name


def test_strategic_patch_unschedulable_false_reads_back_absent(gtwin: RunningTwin) -> None:
    smp = {"Content-Type": "application/strategic-merge-patch+json"}
    path = "/api/v1/nodes/gpu-pool-node-0"
    on = raw(gtwin, "PATCH", path, {"spec": {"unschedulable": True}}, smp)
    assert on.status_code == 200 and on.json()["spec"]["unschedulable"] is True
    off = raw(gtwin, "PATCH", path, {"spec": {"unschedulable": False}}, smp)
    assert off.status_code == 200
    assert "unschedulable" not in off.json()["spec"]
    assert "unschedulable" not in raw(gtwin, "GET", path).json()["spec"]


def test_core_event_create_answers_with_null_event_time(gtwin: RunningTwin) -> None:
    event = {
        "apiVersion": "v1",
        "kind": "Event",
        "metadata": {"name": "conformance-event"},
        "involvedObject": {"kind": "Node", "name": "gpu-pool-node-0", "apiVersion": "v1"},
        "reason": "Checked",
        "message": "twin conformance",
        "type": "Normal",
    }
    resp = raw(gtwin, "POST", "/api/v1/namespaces/golden-errors/events", event)
    assert resp.status_code == 201, resp.text
    created = resp.json()
    # Go's omitempty does not drop zero structs: a core Event always carries these keys.
    assert "eventTime" in created and created["eventTime"] is None
    assert created["source"] == {}
    assert created["reportingComponent"] == "" and created["reportingInstance"] == ""
    assert created["firstTimestamp"] is None and created["lastTimestamp"] is None


def test_unknown_field_selector_on_a_dra_resource_names_the_supported_ones(
    gtwin: RunningTwin,
) -> None:
    resp = raw(
        gtwin,
        "GET",
        "/apis/resource.k8s.io/v1/namespaces/golden-dra/resourceclaims"
        "?fieldSelector=status.allocation%3Dx",
    )
    assert resp.status_code == 400
    assert resp.json()["message"] == (
        '"status.allocation" is not a known field selector: only "metadata.name", '
        '"metadata.namespace"'
    )
    assert resp.json()["reason"] == "BadRequest"
