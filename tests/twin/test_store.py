"""The store's Python API, which the controllers inside the twin use.

Cases: create/get/update with resourceVersion conflicts; generation bumps only on spec
changes; status subresource isolation; graceful deletion of a bound pod (deletionTimestamp
+ grace, finished by grace 0) vs immediate deletion of an unbound pod; finalizers block
removal until cleared; garbage collection of dependents (background) and orphaning;
namespace deletion purges its objects; subscribe() sees events in commit order; mutate();
delete_collection with a selector; pagination tokens; dependents() lookups.
"""

from __future__ import annotations

from typing import Any

import pytest

from twin.errors import ApiError
from twin.store import Store
from twin.testing import RunningTwin


def _pod(name: str, node: str | None = None, **meta: Any) -> dict[str, Any]:
    spec: dict[str, Any] = {"containers": [{"name": "c", "image": "i"}]}
    if node:
        spec["nodeName"] = node
    return {"metadata": {"name": name, **meta}, "spec": spec}


@pytest.fixture
def store(twin: RunningTwin) -> Store:
    return twin.store


def test_conflicts_generation_and_status(store: Store, ns: str) -> None:
    created = store.create(
        "deployments.apps",
        {
            "metadata": {"name": "d"},
            "spec": {
                "selector": {"matchLabels": {"a": "b"}},
                "template": {
                    "metadata": {"labels": {"a": "b"}},
                    "spec": {"containers": [{"name": "c", "image": "i"}]},
                },
            },
        },
        ns,
    )
    stale = dict(created)
    store.patch("deployments.apps", "d", {"metadata": {"labels": {"x": "y"}}}, ns)
    assert store.get("deployments.apps", "d", ns)["metadata"]["generation"] == 1  # metadata only
    with pytest.raises(ApiError) as conflict:
        store.update("deployments.apps", stale)
    assert conflict.value.code == 409 and conflict.value.reason == "Conflict"
    with pytest.raises(ApiError) as dup:
        store.create("deployments.apps", created, ns)
    assert dup.value.reason == "AlreadyExists"

    current = store.get("deployments.apps", "d", ns)
    current["spec"]["replicas"] = 3
    current["status"] = {"replicas": 99}  # ignored: status belongs to the subresource
    updated = store.update("deployments.apps", current)
    assert updated["metadata"]["generation"] == 2 and updated["status"] == {}
    updated["status"] = {"replicas": 3}
    updated["spec"]["replicas"] = 7  # ignored on a status write
    after = store.update_status("deployments.apps", updated)
    assert after["status"] == {"replicas": 3} and after["spec"]["replicas"] == 3
    assert after["metadata"]["generation"] == 2


def test_graceful_and_immediate_pod_deletion(store: Store, ns: str) -> None:
    store.create("pods", _pod("bound", "gpu-pool-node-0"), ns)
    store.create("pods", _pod("unbound"), ns)
    res = store.delete("pods", "bound", ns)
    assert not res.removed
    meta = store.get("pods", "bound", ns)["metadata"]
    assert meta["deletionGracePeriodSeconds"] == 30 and meta["deletionTimestamp"]
    again = store.delete("pods", "bound", ns, grace_period_seconds=60)  # longer grace: no change
    assert again.object["metadata"]["deletionTimestamp"] == meta["deletionTimestamp"]
    done = store.delete("pods", "bound", ns, grace_period_seconds=0)  # the kubelet's final delete
    assert done.removed and store.try_get("pods", "bound", ns) is None
    assert store.delete("pods", "unbound", ns).removed


def test_finalizers_block_removal(store: Store, ns: str) -> None:
    store.create("configmaps", {"metadata": {"name": "cm", "finalizers": ["sickbay.dev/hold"]}}, ns)
    res = store.delete("configmaps", "cm", ns)
    assert not res.removed
    held = store.get("configmaps", "cm", ns)
    assert held["metadata"]["deletionTimestamp"]
    held["metadata"]["finalizers"] = []
    store.update("configmaps", held)
    assert store.try_get("configmaps", "cm", ns) is None


def test_garbage_collection_and_orphans(store: Store, ns: str) -> None:
    owner = store.create("configmaps", {"metadata": {"name": "owner"}}, ns)
    ref = {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "name": "owner",
        "uid": owner["metadata"]["uid"],
        "controller": True,
    }
    store.create("pods", _pod("child-bound", "gpu-pool-node-0", ownerReferences=[ref]), ns)
    store.create("pods", _pod("child", ownerReferences=[ref]), ns)
    assert [d[2] for d in store.dependents(owner["metadata"]["uid"])] == ["child", "child-bound"]
    assert store.get_by_uid(owner["metadata"]["uid"])["metadata"]["name"] == "owner"
    store.delete("configmaps", "owner", ns)
    assert store.get_by_uid(owner["metadata"]["uid"]) is None
    assert store.try_get("pods", "child", ns) is None
    assert store.get("pods", "child-bound", ns)["metadata"]["deletionTimestamp"]  # graceful

    owner2 = store.create("configmaps", {"metadata": {"name": "owner2"}}, ns)
    ref2 = {**ref, "name": "owner2", "uid": owner2["metadata"]["uid"]}
    store.create("pods", _pod("kept", ownerReferences=[ref2]), ns)
    store.delete("configmaps", "owner2", ns, propagation_policy="Orphan")
    assert "ownerReferences" not in store.get("pods", "kept", ns)["metadata"]


def test_namespace_deletion_purges_contents(store: Store) -> None:
    store.create("namespaces", {"metadata": {"name": "doomed"}})
    store.create("pods", _pod("p", "gpu-pool-node-0"), "doomed")
    store.delete("namespaces", "doomed")
    assert store.try_get("pods", "p", "doomed") is None
    with pytest.raises(ApiError) as missing:
        store.create("pods", _pod("q"), "doomed")
    assert missing.value.code == 404


def test_subscribe_sees_commit_order_and_mutate(store: Store, ns: str) -> None:
    seen: list[tuple[str, str, str]] = []
    unsubscribe = store.subscribe(
        lambda ev: seen.append(
            (ev.type, ev.object["metadata"]["name"], ev.object["metadata"]["resourceVersion"])
        ),
        ["pods"],
    )
    try:
        store.create("pods", _pod("s"), ns)
        store.mutate(
            "pods", "s", lambda p: p["metadata"].setdefault("labels", {}).update(x="1"), ns
        )
        store.delete("pods", "s", ns)
    finally:
        unsubscribe()
    mine = [e for e in seen if e[1] == "s"]
    assert [e[0] for e in mine] == ["ADDED", "MODIFIED", "MODIFIED", "DELETED"]
    assert [int(e[2]) for e in mine] == sorted(int(e[2]) for e in mine)


def test_delete_collection_and_pagination(store: Store, ns: str) -> None:
    for i in range(5):
        store.create("pods", _pod(f"p{i}", labels={"batch": "a" if i < 3 else "b"}), ns)
    page = store.list("pods", ns, limit=2)
    assert [p["metadata"]["name"] for p in page.items] == [
        "p0",
        "p1",
    ] and page.remaining_item_count == 3
    rest = store.list("pods", ns, continue_token=page.continue_token)
    assert [p["metadata"]["name"] for p in rest.items] == ["p2", "p3", "p4"]
    deleted = store.delete_collection("pods", ns, label_selector="batch=a")
    assert sorted(p["metadata"]["name"] for p in deleted) == ["p0", "p1", "p2"]
    assert [p["metadata"]["name"] for p in store.list("pods", ns).items] == ["p3", "p4"]
    with pytest.raises(ApiError) as bad:
        store.list("pods", ns, continue_token="!!notbase64")
    assert bad.value.code == 400
