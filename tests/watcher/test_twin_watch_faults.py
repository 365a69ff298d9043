"""The twin's watch faults and bookmarks, which the health watcher's tests rely on:

- a BOOKMARK carries the server's current resourceVersion (as kube-apiserver's watch cache
  does), not the last event of this watch: an idle watch on nodes moves on while pods change,
  so resuming it later never needs a relist;
- `POST /twin/api-faults/drop-watches` cuts open watch streams mid-way (no clean end of the
  chunked body); objects are untouched;
- `POST /twin/api-faults/restart` {downSeconds, compact}: requests are refused while down,
  then a watch from an older resourceVersion gets the recorded 410 ERROR event
  (k8s-golden 62-watch-too-old-resourceversion.json), and the current one works.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from twin.controllers.manager import ControllerManager, TwinOptions
from twin.testing import RunningTwin, start_twin

# Responses recorded from a real 1.36.2 API server (copied from ../shared/k8s-golden).
GOLDEN = Path(__file__).resolve().parents[1] / "k8s_golden"


@pytest.fixture
def twin(tmp_path: Path) -> Iterator[RunningTwin]:
    rs = start_twin(
        tmp_path,
        profile="1.36",
        nodes=1,
        gpus_per_node=1,
        controllers=(ControllerManager(TwinOptions()),),
    )
    try:
        yield rs
    finally:
        rs.stop()


def _rv(rs: RunningTwin) -> int:
    return int(
        httpx.get(f"{rs.twin.url}/api/v1/nodes", timeout=10).json()["metadata"]["resourceVersion"]
    )


def test_bookmark_carries_the_current_resource_version(twin: RunningTwin) -> None:
    start = _rv(twin)
    url = (
        f"{twin.twin.url}/api/v1/nodes?watch=true&allowWatchBookmarks=true"
        f"&resourceVersion={start}&timeoutSeconds=2"
    )
    lines: list[str] = []
    reader = threading.Thread(
        target=lambda: lines.extend(httpx.get(url, timeout=30).text.splitlines())
    )
    reader.start()
    made = httpx.post(
        f"{twin.twin.url}/api/v1/namespaces/default/configmaps",
        json={"metadata": {"name": "moves-the-clock"}},
        timeout=10,
    ).json()
    reader.join(timeout=30)
    events = [json.loads(line) for line in lines if line]
    marks = [e for e in events if e["type"] == "BOOKMARK"]
    assert marks, events
    assert int(marks[-1]["object"]["metadata"]["resourceVersion"]) >= int(
        made["metadata"]["resourceVersion"]
    )


def _stream(url: str, out: dict[str, Any]) -> None:
    try:
        with httpx.stream("GET", url, timeout=30) as resp:
            for line in resp.iter_lines():
                out.setdefault("lines", []).append(line)
        out["ended"] = "clean"
    except httpx.HTTPError as exc:
        out["ended"] = type(exc).__name__


def test_drop_watches_cuts_streams(twin: RunningTwin) -> None:
    url = f"{twin.twin.url}/api/v1/pods?watch=true&resourceVersion={_rv(twin)}&timeoutSeconds=20"
    out: dict[str, Any] = {}
    reader = threading.Thread(target=_stream, args=(url, out))
    reader.start()
    deadline = time.monotonic() + 10
    while twin.twin.store.watch_count == 0 and time.monotonic() < deadline:
        time.sleep(0.02)
    dropped = httpx.post(f"{twin.twin.url}/twin/api-faults/drop-watches", timeout=10).json()
    reader.join(timeout=30)
    assert dropped["dropped"] >= 1
    assert out["ended"] != "clean"  # no terminating chunk: the client sees a broken stream


def test_restart_refuses_then_expires_old_resource_versions(twin: RunningTwin) -> None:
    old = _rv(twin)
    httpx.post(
        f"{twin.twin.url}/api/v1/namespaces/default/configmaps",
        json={"metadata": {"name": "after-old"}},
        timeout=10,
    )
    answer = httpx.post(
        f"{twin.twin.url}/twin/api-faults/restart", json={"downSeconds": 1.0}, timeout=10
    )
    assert answer.status_code == 200
    with pytest.raises(httpx.HTTPError):  # down: the connection is reset
        httpx.get(f"{twin.twin.url}/api/v1/nodes", timeout=10)
    deadline = time.monotonic() + 30
    while True:
        try:
            current = _rv(twin)
            break
        except httpx.HTTPError:
            assert time.monotonic() < deadline, "the twin's API never came back"
            time.sleep(0.1)
    expired = httpx.get(
        f"{twin.twin.url}/api/v1/pods?watch=true&resourceVersion={old}&timeoutSeconds=1",
        timeout=10,
    )
    [event] = [json.loads(line) for line in expired.text.splitlines() if line]
    golden = json.loads((GOLDEN / "62-watch-too-old-resourceversion.json").read_text())
    [want] = golden["response"]
    assert expired.status_code == golden["status"] == 200
    assert event["type"] == want["type"] == "ERROR"
    for key in ("apiVersion", "kind", "code", "reason", "status"):
        assert event["object"][key] == want["object"][key]
    assert event["object"]["message"].startswith("too old resource version: ")
    fresh = httpx.get(
        f"{twin.twin.url}/api/v1/pods?watch=true&resourceVersion={current}&timeoutSeconds=1",
        timeout=10,
    )
    assert "ERROR" not in fresh.text
    bad = httpx.post(f"{twin.twin.url}/twin/api-faults/restart", json={"down": 1}, timeout=10)
    assert bad.status_code == 400 and "down" in bad.json()["message"]
