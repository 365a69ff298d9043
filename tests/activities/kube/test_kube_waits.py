"""Watch-based waits against the twin over HTTP, with the cluster's state changed through the
twin's store the way its controllers would (delete pods, create replacements, set statuses).

Cases:
- wait_for_eviction: a gracefully deleted (Terminating) pod is not gone, it still holds its
  device; once the object is gone it is; all gone -> report without timeout; a pod that stays
  -> timed_out with it in `remaining`; it costs one list + one watch (no polling);
- a restarted worker resumes from heartbeat details: the original deadline and the pods
  already gone are kept;
- wait_for_replacement: a Deployment's replacement Running on an untainted device ->
  "running"; the watch has no deadline: with a replacement Pending it heartbeats until it is
  cancelled (the workflow's timer), and one look (`look_once`) reports "pending" with the
  scheduler's message; replacements evicted again and again by the device-taint manager ->
  "churn" naming kubernetes#139651; a replacement allocated a tainted device counts as churn
  evidence; a restarted watch keeps the evictions seen (heartbeat details); no owner ->
  "no-replacement-needed".
"""

from __future__ import annotations

import asyncio
import dataclasses
import time
from datetime import timedelta
from pathlib import Path

from temporalio.testing import ActivityEnvironment

from contract.kube import (
    DeviceRef,
    DraDevice,
    OwnerRef,
    PodRef,
    ResolveDeviceInput,
    WaitEvictionInput,
    WaitReplacementInput,
)
from tests.activities.kube.conftest import KubeTwin, twin
from tests.waiting import until

UNSCHEDULABLE = (
    "0/2 nodes are available: 2 cannot allocate all claims. still not schedulable, "
    "preemption: 0/2 nodes are available: 2 Preemption is not helpful for scheduling."
)


def _ref(pod: dict) -> PodRef:
    return PodRef(
        namespace=pod["metadata"]["namespace"],
        name=pod["metadata"]["name"],
        uid=pod["metadata"]["uid"],
    )


def _watching_pods(t: KubeTwin) -> bool:
    return any(r.verb == "watch" and r.resource == "pods" for r in t.requests())


async def _later(delay: float, fn, *args, **kwargs) -> None:
    await asyncio.sleep(delay)
    await asyncio.to_thread(fn, *args, **kwargs)


async def test_wait_eviction_sees_pods_go(tmp_path: Path) -> None:
    with twin(tmp_path, "1.37", nodes=1) as t:
        node = t.node(0)
        a = t.consumer_pod("ml", "a", node, "gpu-0")
        b = t.consumer_pod("ml", "b", node, "gpu-1")
        t.clear_requests()
        task = asyncio.create_task(
            t.run(
                t.acts.wait_for_eviction,
                WaitEvictionInput(pods=[_ref(a), _ref(b)], timeout=timedelta(seconds=20)),
            )
        )
        await until(lambda: _watching_pods(t), "the pod watch open")
        await asyncio.to_thread(t.store.delete, "pods", "a", "ml", grace_period_seconds=30)
        await asyncio.sleep(0.3)  # the behaviour: no report while the pod is Terminating
        assert not task.done()  # Terminating: still holds the device
        await asyncio.to_thread(t.store.delete, "pods", "a", "ml", grace_period_seconds=0)
        await asyncio.to_thread(t.store.delete, "pods", "b", "ml", grace_period_seconds=0)
        report = await asyncio.wait_for(task, 10)
        assert [p.name for p in report.gone] == ["a", "b"]
        assert report.remaining == []
        assert not report.timed_out
        # One list, then one watch (the pods went while it was open): no polling.
        pod_calls = [r.verb for r in t.requests() if r.resource == "pods"]
        assert pod_calls == ["list", "watch"]


async def test_wait_eviction_times_out(tmp_path: Path) -> None:
    with twin(tmp_path, "1.37", nodes=1) as t:
        a = t.consumer_pod("ml", "stays", t.node(0), "gpu-0")
        started = time.monotonic()
        # The 2 s timeout ends the wait: a wait that ignored it would never return (the pod
        # stays), so a generous bound on the whole call tells the two apart on a busy machine.
        report = await asyncio.wait_for(
            t.run(
                t.acts.wait_for_eviction,
                WaitEvictionInput(
                    pods=[_ref(a), PodRef(namespace="ml", name="never-existed")],
                    timeout=timedelta(seconds=2),
                ),
            ),
            120,
        )
        assert report.timed_out
        assert [p.name for p in report.remaining] == ["stays"]
        assert [p.name for p in report.gone] == ["never-existed"]
        assert time.monotonic() - started > 1.5  # it did wait for the timeout


async def test_restart_resumes_from_heartbeat(tmp_path: Path) -> None:
    with twin(tmp_path, "1.37", nodes=1) as t:
        node = t.node(0)
        a = t.consumer_pod("ml", "a", node, "gpu-0")
        b = t.consumer_pod("ml", "b", node, "gpu-1")
        inp = WaitEvictionInput(pods=[_ref(a), _ref(b)], timeout=timedelta(minutes=10))
        details: list = []
        env = ActivityEnvironment()
        env.on_heartbeat = lambda *d: details.append(d)
        task = asyncio.create_task(env.run(t.acts.wait_for_eviction, inp))
        await until(lambda: _watching_pods(t), "the pod watch open")
        await asyncio.to_thread(t.store.delete, "pods", "a", "ml", grace_period_seconds=0)
        await until(lambda: details and details[-1][0]["gone"], "a heartbeat with `a` gone")
        env.cancel()  # the worker dies mid-wait
        try:
            await task
        except BaseException:
            pass
        last = details[-1][0]
        assert last["gone"] == [f"ml/a/{a['metadata']['uid']}"]
        assert last["deadline"] > time.time() + 500  # the original 10 min deadline
        # A new worker: same input, heartbeat details of the dead attempt, 1.5 s of deadline left.
        resumed = ActivityEnvironment()
        resumed.info = dataclasses.replace(
            resumed.info, heartbeat_details=[{**last, "deadline": time.time() + 1.5}]
        )
        t.store.create(  # a same-named successor appears; the recorded uid says it is not "a"
            "pods",
            {
                "metadata": {"name": "a", "namespace": "ml"},
                "spec": {"containers": [{"name": "c", "image": "x"}]},
            },
            namespace="ml",
        )
        # Kept the old deadline (1.5 s left): starting over would wait the input's 10 minutes,
        # far past this generous bound.
        report = await asyncio.wait_for(resumed.run(t.acts.wait_for_eviction, inp), 120)
        assert report.timed_out
        assert [p.name for p in report.gone] == ["a"] and [p.name for p in report.remaining] == [
            "b"
        ]


def _deployment_with_old_pod(t: KubeTwin) -> tuple[OwnerRef, dict]:
    node = t.node(0)
    rs = t.deployment_owner("ml", "web", replicas=1)
    old = t.consumer_pod("ml", "web-old", node, "gpu-0", rs, {"app": "web"})
    return OwnerRef(kind="Deployment", name="web", namespace="ml"), old


async def test_replacement_running_on_untainted_device(tmp_path: Path) -> None:
    with twin(tmp_path, "1.37", nodes=2) as t:
        owner, old = _deployment_with_old_pod(t)
        rs = t.store.get("replicasets.apps", "web-7d9c", "ml")
        owner_ref = {
            "apiVersion": "apps/v1",
            "kind": "ReplicaSet",
            "name": rs["metadata"]["name"],
            "uid": rs["metadata"]["uid"],
            "controller": True,
        }
        inp = WaitReplacementInput(
            owners=[owner],
            old_pods=[_ref(old)],
            tainted=[DraDevice(driver="gpu.nvidia.com", pool=t.node(0), device="gpu-0")],
        )
        task = asyncio.create_task(t.run(t.acts.wait_for_replacement, inp))
        await _later(
            0.3,
            t.consumer_pod,
            "ml",
            "web-new",
            t.node(1),
            "gpu-0",
            owner_ref,
            {"app": "web"},
            None,
            False,
        )
        await asyncio.sleep(0.3)  # the behaviour: no report while the replacement is not Running
        assert not task.done()  # bound, not Running yet
        await _later(
            0.1,
            t.store.mutate,
            "pods",
            "web-new",
            lambda p: p["status"].update(phase="Running"),
            namespace="ml",
            subresource="status",
        )
        report = await asyncio.wait_for(task, 10)
        assert report.status == "running"
        new = [p for p in report.pods if p.pod.name == "web-new"][0]
        assert new.phase == "Running" and new.devices == [f"gpu.nvidia.com/{t.node(1)}/gpu-0"]


async def test_replacement_pending_unschedulable(tmp_path: Path) -> None:
    with twin(tmp_path, "1.36", nodes=1) as t:
        owner, old = _deployment_with_old_pod(t)
        rs = t.store.get("replicasets.apps", "web-7d9c", "ml")
        t.store.create(
            "pods",
            {
                "metadata": {
                    "name": "web-pending",
                    "namespace": "ml",
                    "labels": {"app": "web"},
                    "ownerReferences": [
                        {
                            "apiVersion": "apps/v1",
                            "kind": "ReplicaSet",
                            "name": rs["metadata"]["name"],
                            "uid": rs["metadata"]["uid"],
                            "controller": True,
                        }
                    ],
                },
                "spec": {"containers": [{"name": "main", "image": "cuda:12"}]},
            },
            namespace="ml",
        )
        t.store.mutate(
            "pods",
            "web-pending",
            lambda p: p.update(
                status={
                    "phase": "Pending",
                    "conditions": [
                        {
                            "type": "PodScheduled",
                            "status": "False",
                            "reason": "Unschedulable",
                            "message": UNSCHEDULABLE,
                        }
                    ],
                }
            ),
            namespace="ml",
            subresource="status",
        )
        inp = WaitReplacementInput(owners=[owner], old_pods=[_ref(old)])
        # The watch: no deadline of its own, it heartbeats until the workflow cancels it.
        beats: list = []
        env = ActivityEnvironment()
        env.on_heartbeat = lambda *d: beats.append(d)
        watch = asyncio.create_task(env.run(t.acts.wait_for_replacement, inp))
        for _ in range(600):  # the first heartbeat follows the first list
            if beats or watch.done():
                break
            await asyncio.sleep(0.05)
        assert beats and not watch.done(), "the watch ended by itself with a Pending replacement"
        env.cancel()
        try:
            await asyncio.wait_for(watch, 60)
        except asyncio.CancelledError:
            pass
        else:
            raise AssertionError("a cancelled watch must not report (the workflow decides)")
        # The look at the deadline.
        report = await t.run(
            t.acts.wait_for_replacement, inp.model_copy(update={"look_once": True})
        )
        assert report.status == "pending"
        assert report.unschedulable_message == UNSCHEDULABLE
        assert [(p.pod.name, p.phase, p.message) for p in report.pods] == [
            ("web-pending", "Pending", UNSCHEDULABLE)
        ]


async def test_replacement_churn(tmp_path: Path) -> None:
    with twin(tmp_path, "1.36", nodes=1) as t:
        owner, old = _deployment_with_old_pod(t)
        node = t.node(0)
        rs = t.store.get("replicasets.apps", "web-7d9c", "ml")
        ref = {
            "apiVersion": "apps/v1",
            "kind": "ReplicaSet",
            "name": rs["metadata"]["name"],
            "uid": rs["metadata"]["uid"],
            "controller": True,
        }
        inp = WaitReplacementInput(
            owners=[owner],
            old_pods=[_ref(old)],
            tainted=[DraDevice(driver="gpu.nvidia.com", pool=node, device="gpu-0")],
            churn_evictions=3,
        )
        task = asyncio.create_task(t.run(t.acts.wait_for_replacement, inp))

        def evicted_replacement(i: int) -> None:
            # The buggy scheduler put it on the tainted device; the taint manager evicts it.
            t.consumer_pod("ml", f"web-r{i}", node, "gpu-0", ref, {"app": "web"})
            t.store.mutate(
                "pods",
                f"web-r{i}",
                lambda p: p["status"]["conditions"].append(
                    {
                        "type": "DisruptionTarget",
                        "status": "True",
                        "reason": "DeletionByDeviceTaintManager",
                        "message": "Device Taint manager: deleting due to NoExecute taint",
                    }
                ),
                namespace="ml",
                subresource="status",
            )
            t.store.delete("pods", f"web-r{i}", "ml", grace_period_seconds=0)

        for i in range(3):
            await _later(0.2, evicted_replacement, i)
        report = await asyncio.wait_for(task, 10)
        assert report.status == "churn"
        assert report.churn is not None and report.churn.evictions == 3
        assert "kubernetes#139651" in report.churn.diagnosis


async def test_replacement_on_tainted_device_is_churn_evidence(tmp_path: Path) -> None:
    with twin(tmp_path, "1.36", nodes=1) as t:
        owner, old = _deployment_with_old_pod(t)
        node = t.node(0)
        rs = t.store.get("replicasets.apps", "web-7d9c", "ml")
        ref = {
            "apiVersion": "apps/v1",
            "kind": "ReplicaSet",
            "name": rs["metadata"]["name"],
            "uid": rs["metadata"]["uid"],
            "controller": True,
        }
        t.consumer_pod("ml", "web-bad", node, "gpu-1", ref, {"app": "web"})  # Running, but tainted
        report = await t.run(
            t.acts.wait_for_replacement,
            WaitReplacementInput(
                owners=[owner],
                old_pods=[_ref(old)],
                tainted=[DraDevice(driver="gpu.nvidia.com", pool=node, device="gpu-1")],
                churn_evictions=2,
                look_once=True,
            ),
        )
        assert report.status == "pending"
        assert "tainted" in report.pods[0].message


async def test_restarted_replacement_watch_keeps_the_evictions_seen(tmp_path: Path) -> None:
    """Two taint-manager evictions seen by a dead attempt (its heartbeat details) and one more
    now make three: churn, although this attempt saw only one."""
    with twin(tmp_path, "1.36", nodes=1) as t:
        owner, old = _deployment_with_old_pod(t)
        node = t.node(0)
        rs = t.store.get("replicasets.apps", "web-7d9c", "ml")
        ref = {
            "apiVersion": "apps/v1",
            "kind": "ReplicaSet",
            "name": rs["metadata"]["name"],
            "uid": rs["metadata"]["uid"],
            "controller": True,
        }
        t.consumer_pod("ml", "web-r3", node, "gpu-0", ref, {"app": "web"})
        t.store.mutate(
            "pods",
            "web-r3",
            lambda p: p["status"]["conditions"].append(
                {
                    "type": "DisruptionTarget",
                    "status": "True",
                    "reason": "DeletionByDeviceTaintManager",
                    "message": "Device Taint manager: deleting due to NoExecute taint",
                }
            ),
            namespace="ml",
            subresource="status",
        )
        inp = WaitReplacementInput(
            owners=[owner],
            old_pods=[_ref(old)],
            tainted=[DraDevice(driver="gpu.nvidia.com", pool=node, device="gpu-0")],
            churn_evictions=3,
        )
        fresh = await t.run(t.acts.wait_for_replacement, inp.model_copy(update={"look_once": True}))
        assert fresh.status == "pending"  # one eviction alone is not churn
        resumed = ActivityEnvironment()
        beats: list = []
        resumed.on_heartbeat = lambda *d: beats.append(d)
        resumed.info = dataclasses.replace(
            resumed.info, heartbeat_details=[{"evicted": {"Deployment/web": ["u-r1", "u-r2"]}}]
        )
        report = await asyncio.wait_for(resumed.run(t.acts.wait_for_replacement, inp), 60)
        assert report.status == "churn" and report.churn is not None
        assert report.churn.evictions == 3
        assert "deadline" not in beats[-1][0]  # the watch keeps no deadline of its own
        assert set(beats[-1][0]["evicted"]["Deployment/web"]) >= {"u-r1", "u-r2"}


async def test_no_owner_needs_no_replacement(tmp_path: Path) -> None:
    with twin(tmp_path, "1.37", nodes=1) as t:
        report = await t.run(
            t.acts.wait_for_replacement,
            WaitReplacementInput(owners=[OwnerRef(kind="Deployment", name="gone", namespace="ml")]),
        )
        assert report.status == "no-replacement-needed"


async def test_api_server_gone_mid_wait_is_retryable(tmp_path: Path) -> None:
    """The API server disappears during the watch: one reconnect, then a retryable error
    (Temporal backs off; the heartbeat details keep the progress for the next attempt)."""
    from temporalio.exceptions import ApplicationError

    from contract.errors import ERR_KUBE_UNAVAILABLE

    with twin(tmp_path, "1.37", nodes=1) as t:
        a = t.consumer_pod("ml", "a", t.node(0), "gpu-0")
        task = asyncio.create_task(
            t.run(
                t.acts.wait_for_eviction,
                WaitEvictionInput(pods=[_ref(a)], timeout=timedelta(seconds=30)),
            )
        )
        await until(lambda: _watching_pods(t), "the pod watch open")
        await asyncio.to_thread(t.twin.stop)
        try:
            await asyncio.wait_for(task, 15)
        except ApplicationError as err:
            assert err.type == ERR_KUBE_UNAVAILABLE and not err.non_retryable
        else:
            raise AssertionError("the wait should fail retryably without an API server")
        assert t.heartbeats and t.heartbeats[-1][0]["deadline"]


async def test_open_waits_never_hold_up_the_hot_path(tmp_path: Path) -> None:
    """A burst of quarantined GPUs with consumers: as many eviction waits as the worker has
    threads for short Kubernetes calls (`max_threads`: 8 here), each holding its watch open.
    The next failing GPU's resolve and quarantine answer while every one of those waits is
    still open: the waits run on threads of their own. (Before, they shared the 32 threads
    of the hot path, and in the latency benchmark every GPU past the 32nd quarantined with a
    consumer timed out resolving and was escalated, not quarantined.)"""
    with twin(tmp_path, "1.37", nodes=3, gpus_per_node=4) as t:
        node, other = t.node(0), t.node(2)
        pods = [t.consumer_pod("ml", f"p{i}", node, f"gpu-{i % 4}") for i in range(8)]
        t.clear_requests()
        waits = [
            asyncio.create_task(
                ActivityEnvironment().run(
                    t.acts.wait_for_eviction,
                    WaitEvictionInput(pods=[_ref(p)], timeout=timedelta(seconds=60)),
                )
            )
            for p in pods
        ]

        def watches() -> int:
            return sum(r.verb == "watch" and r.resource == "pods" for r in t.requests())

        await until(lambda: watches() == len(pods), "every wait's pod watch open")
        resolved = await t.run(
            t.acts.resolve_device, ResolveDeviceInput(device=DeviceRef(node=other, gpu_index=1))
        )
        assert resolved.devices, resolved
        assert not any(w.done() for w in waits), "a wait ended before the resolve answered"
        for p in pods:
            await asyncio.to_thread(
                t.store.delete, "pods", p["metadata"]["name"], "ml", grace_period_seconds=0
            )
        reports = await asyncio.gather(*waits)
        assert all(not r.timed_out and len(r.gone) == 1 for r in reports)
