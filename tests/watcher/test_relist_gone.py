"""What a relist tells the watcher about objects deleted while its watch was down.

A watch that breaks (an API server restart, a 410 Gone) is followed by a fresh LIST: the
reflector hands the watcher one replace, and whatever the list no longer has was deleted
meanwhile. The watcher must then forget it exactly as if it had seen the DELETE event:

- a node's ResourceSlice deleted during the gap (a DRA driver that stopped publishing; the
  kubelet deletes a stopped plugin's slices): the node's GPUs vanished, as they do when the
  DELETE is seen, and the slice's devices no longer map pod health to a GPU;
- a Node deleted during the gap (scaled down): its summary goes, so its slices deleted after
  it start no node incident for a node that is not there.

And a deleted node, by either path, is no longer vanished; what it looked like (versions, GPU
count) is kept a day for a node that joins again under its name, then forgotten.
"""

from __future__ import annotations

from typing import Any

from activities.sweep import SweepActivities, SweepFinding
from worker import watcher
from worker.watcher import Tracker

NODE = "gpu-node-1"
OTHER = "gpu-node-2"


def _node(name: str = NODE) -> dict[str, Any]:
    # DRA: the node counts no nvidia.com/gpu; its slice says how many GPUs it has.
    return {
        "metadata": {"name": name, "labels": {}},
        "status": {"nodeInfo": {"kubeletVersion": "v1.36.3"}},
    }


def _slice(node: str = NODE) -> dict[str, Any]:
    return {
        "metadata": {"name": f"{node}-gpu.nvidia.com-abcde"},
        "spec": {
            "driver": "gpu.nvidia.com",
            "nodeName": node,
            "pool": {"name": node},
            "devices": [
                {"name": f"gpu-{i}", "attributes": {"uuid": {"string": f"GPU-{node}-{i}"}}}
                for i in range(2)
            ],
        },
    }


def _tracker(node_findings: list[SweepFinding]) -> Tracker:
    """Two DRA nodes with 2 GPUs each in their slices."""
    t = Tracker(
        SweepActivities(object()),  # type: ignore[arg-type]
        emit=lambda _f: None,
        emit_node=node_findings.append,
    )
    for name in (NODE, OTHER):
        t.node(_node(name))
        t.slice(_slice(name))
    return t


def _relist(t: Tracker, kind: str, objs: list[dict[str, Any]]) -> None:
    apply = {"slice": t.slice, "node": t.node, "pod": t.pod}[kind]
    t.begin(kind)
    for obj in objs:
        apply(obj)
    t.end(kind)


def test_a_slice_deleted_while_the_watch_was_down_vanishes_the_nodes_gpus() -> None:
    seen: list[SweepFinding] = []
    t = _tracker(seen)
    assert NODE not in t.vanished
    _relist(t, "slice", [_slice(OTHER)])  # NODE's slice was deleted during the gap
    assert NODE in t.vanished
    assert {d.node for d in t.index.values()} == {OTHER}, (
        "the deleted slice's devices still map pod health to GPUs"
    )
    assert not t.node_rids.get(NODE)
    assert [f.node for f in seen if f.vanished] == [NODE]


def test_a_slice_deleted_while_the_watch_was_down_is_as_if_its_delete_was_seen() -> None:
    by_event: list[SweepFinding] = []
    t = _tracker(by_event)
    t.slice(_slice(), deleted=True)
    by_relist: list[SweepFinding] = []
    r = _tracker(by_relist)
    _relist(r, "slice", [_slice(OTHER)])
    assert [f.message for f in by_relist] == [f.message for f in by_event]
    assert (r.index, r.slice_rids, r.node_rids, r.vanished) == (
        t.index,
        t.slice_rids,
        t.node_rids,
        t.vanished,
    )


def test_a_slice_the_relist_still_has_is_kept() -> None:
    seen: list[SweepFinding] = []
    t = _tracker(seen)
    _relist(t, "slice", [_slice(NODE), _slice(OTHER)])
    assert NODE not in t.vanished
    assert len(t.index) == 4
    assert not seen


def test_a_node_deleted_while_the_watch_was_down_starts_no_incident_later() -> None:
    seen: list[SweepFinding] = []
    t = _tracker(seen)
    _relist(t, "node", [_node(OTHER)])  # NODE was scaled down during the gap
    assert NODE not in t.nodes
    t.slice(_slice(), deleted=True)  # its slice goes after it (garbage collection)
    assert not seen, "a node incident for a node that is gone"
    assert NODE not in t.vanished


def test_a_deleted_node_is_no_longer_vanished() -> None:
    seen: list[SweepFinding] = []
    t = _tracker(seen)
    t.slice(_slice(), deleted=True)
    assert NODE in t.vanished
    t.node(_node(), deleted=True)
    assert NODE not in t.vanished


def test_a_deleted_nodes_record_is_kept_a_day_then_forgotten(monkeypatch: Any) -> None:
    """A node deleted and joined again under its name (reinstalled) is still compared with
    what it was; a cluster whose nodes come and go does not grow the watcher for ever."""
    now = [1_000_000.0]
    monkeypatch.setattr(watcher.time, "time", lambda: now[0])
    t = _tracker([])
    t.node(_node(), deleted=True)
    joined = _node()
    joined["status"]["nodeInfo"]["kubeletVersion"] = "v1.37.0"
    t.node(joined)  # joined again, reinstalled with a new kubelet
    assert t.recorded(NODE).kubelet_version == "v1.36.3"
    assert t.recorded(NODE).gpu_count == 2
    t.node(_node(), deleted=True)
    now[0] += watcher.RECENT_CHANGE + 1
    t.node(_node(OTHER), deleted=True)  # any later deletion forgets the old ones
    assert NODE not in t.versions and NODE not in t.max_gpus
    assert OTHER in t.versions


def test_a_node_deleted_while_vanished_keeps_the_version_before_its_upgrade() -> None:
    """Deleted after an upgrade broke it, joined again under its name: the upgrade is still
    the change to blame (a deletion is no recovery)."""
    t = _tracker([])
    upgraded = _node()
    upgraded["status"]["nodeInfo"]["kubeletVersion"] = "v1.37.0"
    t.node(upgraded)
    t.slice(_slice(), deleted=True)  # its GPUs vanished after the upgrade
    assert NODE in t.vanished
    t.node(upgraded, deleted=True)
    assert NODE not in t.vanished
    t.node(upgraded)  # joined again
    assert t.recorded(NODE).kubelet_version == "v1.36.3"
