"""Watch through the official client: kubernetes.watch.Watch().stream.

Cases: ADDED/MODIFIED/DELETED arrive in order for create, patch, delete; a watch resumed from
a resourceVersion replays exactly the later events; a resourceVersion older than the watch
history raises ApiException 410 (Expired); a label-selector watch turns a label change into
ADDED/DELETED; field-selector watch on spec.nodeName; many concurrent watches all see an event;
the store's async watch delivers into an asyncio loop.
"""

from __future__ import annotations

import asyncio
import threading
from typing import Any

import pytest
from kubernetes import client, watch
from kubernetes.client.exceptions import ApiException

from tests.twin.helpers import JOIN_TIMEOUT
from twin.testing import RunningTwin

POD = {
    "metadata": {"name": "w", "labels": {"app": "w"}},
    "spec": {"containers": [{"name": "c", "image": "i"}]},
}


def _stream(
    core: client.CoreV1Api, ns: str, out: list[Any], ready: threading.Event, **kwargs: Any
) -> None:
    w = watch.Watch()
    ready.set()
    for ev in w.stream(core.list_namespaced_pod, ns, timeout_seconds=1, **kwargs):
        out.append((ev["type"], ev["object"].metadata.name, ev["object"].metadata.resource_version))


def _watch_while(core: client.CoreV1Api, ns: str, action: Any, **kwargs: Any) -> list[Any]:
    events: list[Any] = []
    ready = threading.Event()
    rv = core.list_namespaced_pod(ns).metadata.resource_version
    kwargs.setdefault("resource_version", rv)
    t = threading.Thread(target=_stream, args=(core, ns, events, ready), kwargs=kwargs)
    t.start()
    ready.wait(JOIN_TIMEOUT)
    action()
    t.join(JOIN_TIMEOUT)
    return events


def test_events_in_order_and_resume(core: client.CoreV1Api, ns: str) -> None:
    def action() -> None:
        core.create_namespaced_pod(ns, POD)
        core.patch_namespaced_pod("w", ns, {"metadata": {"labels": {"stage": "2"}}})
        core.delete_namespaced_pod("w", ns)

    events = _watch_while(core, ns, action)
    assert [e[0] for e in events] == ["ADDED", "MODIFIED", "MODIFIED", "DELETED"]
    rvs = [int(e[2]) for e in events]
    assert rvs == sorted(rvs) and len(set(rvs)) == 4

    # Resume after the first event: exactly the three later events come back.
    resumed: list[Any] = []
    for ev in watch.Watch().stream(
        core.list_namespaced_pod, ns, resource_version=events[0][2], timeout_seconds=1
    ):
        resumed.append(
            (ev["type"], ev["object"].metadata.name, ev["object"].metadata.resource_version)
        )
    assert resumed == events[1:]


def test_watch_without_resource_version_lists_current_objects_first(
    core: client.CoreV1Api, ns: str
) -> None:
    core.create_namespaced_pod(ns, POD)
    seen = [
        (e["type"], e["object"].metadata.name)
        for e in watch.Watch().stream(core.list_namespaced_pod, ns, timeout_seconds=1)
    ]
    assert seen == [("ADDED", "w")]


def test_too_old_resource_version_is_410(
    core: client.CoreV1Api, ns: str, twin: RunningTwin
) -> None:
    floor = twin.store.history_floor("pods")
    assert floor > 1
    with pytest.raises(ApiException) as gone:
        list(
            watch.Watch().stream(
                core.list_namespaced_pod, ns, resource_version="1", timeout_seconds=1
            )
        )
    assert gone.value.status == 410
    assert "too old resource version: 1" in gone.value.reason


def test_label_selector_watch_sees_objects_enter_and_leave(core: client.CoreV1Api, ns: str) -> None:
    core.create_namespaced_pod(ns, POD)

    def action() -> None:
        core.patch_namespaced_pod("w", ns, {"metadata": {"labels": {"tier": "gpu"}}})
        core.patch_namespaced_pod("w", ns, {"metadata": {"labels": {"tier": "cpu"}}})

    events = _watch_while(core, ns, action, label_selector="tier=gpu")
    assert [e[0] for e in events] == ["ADDED", "DELETED"]


def test_field_selector_watch_on_node_name(core: client.CoreV1Api, ns: str) -> None:
    def action() -> None:
        core.create_namespaced_pod(
            ns, {**POD, "spec": {**POD["spec"], "nodeName": "gpu-pool-node-1"}}
        )
        core.create_namespaced_pod(
            ns,
            {
                "metadata": {"name": "other"},
                "spec": {
                    "containers": [{"name": "c", "image": "i"}],
                    "nodeName": "gpu-pool-node-0",
                },
            },
        )

    events = _watch_while(core, ns, action, field_selector="spec.nodeName=gpu-pool-node-1")
    assert [(e[0], e[1]) for e in events] == [("ADDED", "w")]


def test_many_concurrent_watches_all_receive_the_event(
    core: client.CoreV1Api, ns: str, twin: RunningTwin
) -> None:
    n = 20
    results: list[list[Any]] = [[] for _ in range(n)]
    readies = [threading.Event() for _ in range(n)]
    rv = core.list_namespaced_pod(ns).metadata.resource_version
    api_clients = [twin.api_client() for _ in range(n)]  # one connection pool per watcher
    threads = [
        threading.Thread(
            target=_stream,
            args=(client.CoreV1Api(api_clients[i]), ns, results[i], readies[i]),
            kwargs={"resource_version": rv},
        )
        for i in range(n)
    ]
    for t in threads:
        t.start()
    for r in readies:
        r.wait(JOIN_TIMEOUT)
    core.create_namespaced_pod(ns, POD)
    for t in threads:
        t.join(JOIN_TIMEOUT)
    assert all([e[:2] for e in r] == [("ADDED", "w")] for r in results)


async def test_store_async_watch(twin: RunningTwin, ns: str) -> None:
    w = twin.store.watch_async("pods", namespace=ns, resource_version=twin.store.resource_version)
    twin.store.create(
        "pods",
        {"metadata": {"name": "a"}, "spec": {"containers": [{"name": "c", "image": "i"}]}},
        ns,
    )
    twin.store.delete("pods", "a", ns)
    got = []
    async for ev in w:
        got.append((ev.type, ev.object["metadata"]["name"]))
        if len(got) == 3:
            w.close()
    assert got == [("ADDED", "a"), ("MODIFIED", "a"), ("DELETED", "a")]
    assert await asyncio.wait_for(w.aget(), 1) is None
