"""A device-plugin node whose GPUs are partly or wholly MIG-partitioned under the `mixed`
strategy is not a node whose GPUs vanished.

With `mig.strategy=mixed` the NVIDIA device plugin offers a MIG-enabled GPU's instances as
`nvidia.com/mig-<profile>` resources and only the whole GPUs as `nvidia.com/gpu`, while GPU
feature discovery's `nvidia.com/gpu.count` label still counts every physical GPU. Comparing
`nvidia.com/gpu` with that label would call a healthy node, half of whose GPUs were partitioned
by the MIG manager, "2 GPUs missing": a node incident, a plugin restart and a NoSchedule taint
on a node that lost nothing. Cases:

- 8 GPUs, 4 MIG-enabled (`nvidia.com/gpu` 4, `nvidia.com/mig-1g.10gb` 28): no vanished finding,
  from the sweep (whole Node) or the watcher (its node summary);
- every GPU MIG-enabled, `nvidia.com/gpu` 0 kept by the kubelet: no vanished finding;
- the same node with no GPU resource left at all (every MIG instance and whole GPU gone):
  vanished;
- the `single` strategy (`nvidia.com/gpu` counts MIG instances, and so does the label):
  compared as before, so a drop below the label is still a vanish;
- a whole GPU unhealthy on a mixed node (allocatable below capacity): still a notice.

A MIG reconfiguration in progress (the MIG manager's `nvidia.com/mig.config.state` pending or
rebooting) is never a notice, and GPUs gone under it are a vanish naming it (the node incident
waits for it, bounded).

Time-slicing (and MPS) shares each GPU `nvidia.com/gpu.replicas` ways: nvidia.com/gpu (or,
with `renameByDefault`, nvidia.com/gpu.shared) counts replicas; renamed, the old
nvidia.com/gpu stays at 0 and is no vanish; and the replicas label, which can lag the plugin,
never turns what a node offers into a vanish.
"""

from __future__ import annotations

from typing import Any

from activities.sweep import SweepActivities, SweepFinding
from worker.watcher import Tracker

NODE = "gpu-node-1"


def _node(
    whole: int,
    mig: int,
    *,
    strategy: str = "mixed",
    count: int = 8,
    whole_allocatable: int | None = None,
) -> dict[str, Any]:
    capacity = {"nvidia.com/gpu": str(whole)}
    allocatable = {"nvidia.com/gpu": str(whole if whole_allocatable is None else whole_allocatable)}
    if mig or strategy == "mixed":
        capacity["nvidia.com/mig-1g.10gb"] = str(mig)
        allocatable["nvidia.com/mig-1g.10gb"] = str(mig)
    return {
        "metadata": {
            "name": NODE,
            "labels": {
                "nvidia.com/gpu.count": str(count),
                "nvidia.com/mig.strategy": strategy,
                "nvidia.com/mig.capable": "true",
            },
        },
        "status": {"capacity": capacity, "allocatable": allocatable},
    }


def _swept(node: dict[str, Any]) -> SweepFinding | None:
    return SweepActivities(object()).node_finding(node, 0, False)  # type: ignore[arg-type]


def _watched(node: dict[str, Any]) -> list[SweepFinding]:
    sent: list[SweepFinding] = []
    t = Tracker(SweepActivities(object()), emit=lambda _f: None, emit_node=sent.append)  # type: ignore[arg-type]
    t.node(node)
    return sent


def test_half_the_gpus_partitioned_is_no_vanish() -> None:
    node = _node(whole=4, mig=28)
    assert _swept(node) is None
    assert _watched(node) == []


def test_every_gpu_partitioned_is_no_vanish() -> None:
    node = _node(whole=0, mig=56)
    assert _swept(node) is None
    assert _watched(node) == []


def test_a_mixed_node_with_no_gpu_resource_left_vanished() -> None:
    node = _node(whole=0, mig=0)
    found = _swept(node)
    assert found is not None and found.vanished
    assert "MIG" in found.message
    assert [f.vanished for f in _watched(node)] == [True]


def test_the_single_strategy_is_compared_as_before() -> None:
    node = _node(whole=49, mig=0, strategy="single", count=56)  # one GPU's 7 instances gone
    found = _swept(node)
    assert found is not None and found.vanished
    assert [f.vanished for f in _watched(node)] == [True]


def test_an_unhealthy_whole_gpu_on_a_mixed_node_is_a_notice() -> None:
    node = _node(whole=4, mig=28, whole_allocatable=3)
    found = _swept(node)
    assert found is not None and not found.vanished
    assert "allocatable nvidia.com/gpu 3 < capacity 4" in found.message
    assert [f.vanished for f in _watched(node)] == [False]


def _shared(offered: dict[str, str], allocatable: dict[str, str] | None = None) -> dict[str, Any]:
    """8 GPUs shared 4 ways (time-slicing, GFD's replicas label)."""
    return {
        "metadata": {
            "name": NODE,
            "labels": {"nvidia.com/gpu.count": "8", "nvidia.com/gpu.replicas": "4"},
        },
        "status": {"capacity": offered, "allocatable": allocatable or dict(offered)},
    }


def test_time_slicing_renamed_to_gpu_shared_is_no_vanish() -> None:
    """`renameByDefault`: the replicas are nvidia.com/gpu.shared; the old nvidia.com/gpu
    stays in capacity at 0 (the kubelet keeps a resource that was registered)."""
    node = _shared({"nvidia.com/gpu": "0", "nvidia.com/gpu.shared": "32"})
    assert _swept(node) is None
    assert _watched(node) == []


def test_time_slicing_is_never_a_vanish_on_a_lagging_replicas_label() -> None:
    """nvidia.com/gpu counts replicas; GFD relabels up to a minute after the plugin changed its
    sharing, so a node is compared by what it offers, never divided by the label: sharing
    just turned off (2 x 4 -> 8 whole GPUs, the label still 4) is no vanish. A shared node's
    partial loss is not seen from its status (its pods' health and the alerts say it)."""
    turned_off = _shared({"nvidia.com/gpu": "8"})
    assert _swept(turned_off) is None and _watched(turned_off) == []
    sick = _shared({"nvidia.com/gpu.shared": "32"}, {"nvidia.com/gpu.shared": "28"})
    found = _swept(sick)  # one GPU unhealthy: its 4 replicas not allocatable
    assert found is not None and not found.vanished
    assert (found.gpu_capacity, found.gpu_allocatable) == (32, 28)
    assert "nvidia.com/gpu + nvidia.com/gpu.shared" in found.message


def test_a_mig_reconfiguration_in_progress_is_no_notice_and_a_bounded_vanish() -> None:
    """The GPU Operator's MIG manager labels the node `nvidia.com/mig.config.state=pending`
    (then `rebooting` where it must) while it stops the GPU plugins and repartitions the GPUs:
    what the node offers meanwhile is the planned work, never a notice. GPUs gone under it
    are a vanish that names the work: the node incident waits for it (plannedGrace) and says
    so if it never ends, instead of a MIG manager stuck in `pending` hiding a lost node for
    ever. `success` and `failed` are judged as any node."""
    for state in ("pending", "rebooting"):
        sick = _node(whole=4, mig=28, whole_allocatable=2)  # a notice on any other node
        sick["metadata"]["labels"]["nvidia.com/mig.config.state"] = state
        assert _swept(sick) is None, state
        assert _watched(sick) == [], state
        node = _node(whole=0, mig=0)
        node["metadata"]["labels"]["nvidia.com/mig.config.state"] = state
        found = _swept(node)
        assert found is not None and found.vanished, state
        assert found.planned == (
            f"the MIG manager is repartitioning its GPUs (nvidia.com/mig.config.state={state})"
        )
        assert found.planned in found.message and "plannedGrace" in found.message
        assert [(f.vanished, f.planned) for f in _watched(node)] == [(True, found.planned)]
    for state in ("success", "failed"):
        node = _node(whole=0, mig=0)
        node["metadata"]["labels"]["nvidia.com/mig.config.state"] = state
        found = _swept(node)
        assert found is not None and found.vanished and not found.planned, state
