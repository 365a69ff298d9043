"""The health watcher against the cluster twin (scheduler, kubelet stand-in, fault injection),
with a recording launcher in place of Temporal (the real launch, through `sickbay worker` to a
DeviceTaintRule, is tests/demo/test_watch_scenario.py).

Cases:
- a killed GPU (Xid 79) under a pod (its health reported under a CDI device id, resolved
  through the pod's claim), a driver taint and a vanished GPU: each becomes the finding the
  sweep produces for the same cluster (same device key, same evidence fingerprint), one
  launch per device, a node notice for the vanished one;
- no missed and no doubled change across a dropped watch connection, an API-server restart
  (down for a while, watch cache compacted: 410 -> one relist) and the watcher's own restart;
- a node's slice deleted while the API server restarts (the relist is the only word of it):
  a node notice, as for the DELETE, and no per-GPU launch;
- idle: after the first LISTs, only watch requests (no LIST polling);
- Unknown health is launched only after `unknown_timeout`, never once Healthy again;
- through a proxy enforcing deploy/rbac.yaml nothing the watcher asks is refused;
- a Lease namespace that does not exist: no watching, an error naming the fix;
- a device-plugin cluster (no resource.k8s.io): slices noted as not served, nodes still watched;
- Lease: of two watchers one watches; a clean stop hands over at once, a dead holder (no
  renewals) after the lease expires.
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client as k8s

from activities.kube.client import Kube, KubeSettings
from activities.sweep import SweepActivities
from contract.launch import LaunchRequest, LaunchResult
from contract.sweep import SweepClusterInput, SweepFinding
from tests.twin.helpers import plugin_silent_on_first_node
from twin.clock import Clock
from twin.controllers.manager import ControllerManager, TwinOptions
from twin.testing import RunningTwin, start_twin
from worker.watcher import HealthWatcher, WatcherConfig
from workflows.sweep import finding_fingerprint

TIME_SCALE = 200.0
NAMESPACE = "sickbay"


class Recorder:
    def __init__(self) -> None:
        self.requests: list[LaunchRequest] = []
        self.nodes: list[SweepFinding] = []
        self.fail = 0  # the next N launches raise (Temporal unreachable)

    async def launch(self, req: LaunchRequest) -> LaunchResult:
        if self.fail:
            self.fail -= 1
            raise RuntimeError("temporal unreachable (test)")
        self.requests.append(req)
        return LaunchResult(workflow_id=req.remediation.device.workflow_id(), started=True)

    async def node(self, finding: SweepFinding) -> None:
        self.nodes.append(finding)

    def keys(self) -> list[str]:
        return sorted(r.remediation.device.key for r in self.requests)


@pytest.fixture
def twin(tmp_path: Path) -> Iterator[tuple[RunningTwin, ControllerManager]]:
    manager = ControllerManager(TwinOptions())
    rs = start_twin(
        tmp_path,
        profile="1.36",
        nodes=2,
        gpus_per_node=2,
        node_prefix=f"w-{uuid.uuid4().hex[:5]}-",
        clock=Clock(time_scale=TIME_SCALE),
        controllers=(manager,),
    )
    k8s.CoreV1Api(rs.api_client()).create_namespace({"metadata": {"name": NAMESPACE}})
    try:
        yield rs, manager
    finally:
        rs.stop()


def kube_for(rs: RunningTwin) -> Kube:
    return Kube.from_settings(KubeSettings(kubeconfig=str(rs.kubeconfig_path)))


def config(**kw: Any) -> WatcherConfig:
    base: dict[str, Any] = dict(
        namespace=NAMESPACE,
        identity=f"w-{uuid.uuid4().hex[:6]}",
        lease_duration=3.0,
        renew_deadline=2.0,
        retry_period=0.3,
        unknown_timeout=1.0,
        window=30,
    )
    base.update(kw)
    return WatcherConfig(**base)


class Running:
    def __init__(self, watcher: HealthWatcher) -> None:
        self.watcher = watcher
        self.stop = asyncio.Event()
        self.task: asyncio.Task[None] | None = None

    async def __aenter__(self) -> Running:
        self.task = asyncio.create_task(self.watcher.run(self.stop))
        return self

    async def __aexit__(self, *exc: object) -> None:
        self.stop.set()
        assert self.task is not None
        await asyncio.wait_for(self.task, timeout=60)


async def wait_for(check: Any, within: float = 30.0, what: str = "") -> Any:
    deadline = time.monotonic() + within
    while True:
        result = check()
        if result:
            return result
        if time.monotonic() > deadline:
            raise AssertionError(f"{what or check} not reached within {within}s")
        await asyncio.sleep(0.05)


def deploy(api: Any, replicas: int) -> None:
    core, apps, dra = k8s.CoreV1Api(api), k8s.AppsV1Api(api), k8s.ResourceV1Api(api)
    core.create_namespace({"metadata": {"name": "ml"}})
    dra.create_namespaced_resource_claim_template(
        "ml",
        {
            "metadata": {"name": "one-gpu"},
            "spec": {
                "spec": {
                    "devices": {
                        "requests": [
                            {"name": "gpu", "exactly": {"deviceClassName": "gpu.nvidia.com"}}
                        ]
                    }
                }
            },
        },
    )
    labels = {"app": "trainer"}
    apps.create_namespaced_deployment(
        "ml",
        {
            "metadata": {"name": "trainer"},
            "spec": {
                "replicas": replicas,
                "selector": {"matchLabels": labels},
                "template": {
                    "metadata": {"labels": labels},
                    "spec": {
                        "containers": [
                            {
                                "name": "main",
                                "image": "registry.invalid/trainer:1",
                                "resources": {"claims": [{"name": "gpu"}]},
                            }
                        ],
                        "resourceClaims": [{"name": "gpu", "resourceClaimTemplateName": "one-gpu"}],
                    },
                },
            },
        },
    )


def running_pods(api: Any) -> int:
    pods = k8s.CoreV1Api(api).list_namespaced_pod("ml").items
    return sum(1 for p in pods if p.status.phase == "Running" and p.status.resource_claim_statuses)


def allocated_gpus(rs: RunningTwin, manager: ControllerManager) -> list[tuple[str, int]]:
    """(node, gpu index) of every GPU a Running pod holds."""
    api = rs.api_client()
    out = []
    for pod in k8s.CoreV1Api(api).list_namespaced_pod("ml").items:
        if pod.status.phase != "Running" or not pod.status.resource_claim_statuses:
            continue
        claim = k8s.ResourceV1Api(api).read_namespaced_resource_claim(
            pod.status.resource_claim_statuses[0].resource_claim_name, "ml"
        )
        res = claim.status.allocation.devices.results[0]
        out.append((res.pool, int(res.device.rsplit("-", 1)[1])))
    return sorted(out)


def uuid_of(manager: ControllerManager, node: str, index: int) -> str:
    return {g.index: g for g in manager.faults.gpus(node)}[index].uuid


async def test_watch_finds_what_the_sweep_finds(
    twin: tuple[RunningTwin, ControllerManager],
) -> None:
    rs, manager = twin
    api = rs.api_client()
    deploy(api, replicas=2)
    await wait_for(lambda: running_pods(api) == 2, what="2 running pods")
    held = allocated_gpus(rs, manager)
    nodes = rs.twin.seed_info["nodes"]
    rec = Recorder()
    kube = kube_for(rs)
    watcher = HealthWatcher(kube, rec.launch, config(), on_node=rec.node)
    async with Running(watcher):
        assert await watcher.synced(), "first LISTs never finished"
        assert rec.requests == []  # a healthy cluster: nothing to do
        (n0, i0), (n1, i1) = held[0], held[1]
        manager.faults.fail(n0, str(i0), xid=79)  # pod health Unhealthy
        free = [(n, i) for n in nodes for i in (0, 1) if (n, i) not in held]
        manager.faults.fail(free[0][0], str(free[0][1]), xid=48, driver_taint=True)
        manager.faults.fail(free[1][0], str(free[1][1]), vanish=True)
        want = sorted(
            [f"{n0}/{uuid_of(manager, n0, i0)}", f"{free[0][0]}/{uuid_of(manager, *free[0])}"]
        )
        await wait_for(lambda: rec.keys() == want, what=f"launches for {want}")
        # The twin's kubelet writes CDI device ids, as NVIDIA's driver makes the 1.36 kubelet
        # do: the watcher mapped it to the GPU through the pod's claim, as the sweep does.
        reported = [
            r.resource_id
            for p in k8s.CoreV1Api(api).list_namespaced_pod("ml").items
            for cs in p.status.container_statuses or []
            for e in cs.allocated_resources_status or []
            for r in e.resources or []
            if r.health == "Unhealthy"
        ]
        assert reported and all("=" in rid for rid in reported), reported
        await wait_for(lambda: len(rec.nodes) == 1, what="node notice")
        assert rec.nodes[0].node == free[1][0] and "missing" in rec.nodes[0].message
        sweep = await asyncio.to_thread(SweepActivities(kube).sweep, SweepClusterInput())
        swept = {(f.key, finding_fingerprint(f)) for f in sweep.findings if f.health != "Unknown"}
        watched = {(r.remediation.device.key, r.evidence.fingerprint) for r in rec.requests}
        assert watched == swept
        assert {f.node for f in sweep.nodes} == {rec.nodes[0].node}
        for r in rec.requests:
            assert r.remediation.trigger == "watch" and r.evidence.source == "watch"
        await asyncio.sleep(1.0)  # more pod status updates arrive; nothing is sent again
        assert rec.keys() == want
    del n1, i1


async def test_no_missed_no_doubled_across_drops_restarts_and_watcher_restart(
    twin: tuple[RunningTwin, ControllerManager],
) -> None:
    rs, manager = twin
    api = rs.api_client()
    deploy(api, replicas=4)
    await wait_for(lambda: running_pods(api) == 4, what="4 running pods")
    held = allocated_gpus(rs, manager)
    assert len(held) == 4
    rec = Recorder()
    kube = kube_for(rs)
    watcher = HealthWatcher(kube, rec.launch, config(), on_node=rec.node)
    want: list[str] = []

    def expect(node: str, index: int) -> None:
        want.append(f"{node}/{uuid_of(manager, node, index)}")
        want.sort()

    async with Running(watcher):
        assert await watcher.synced()
        pods = watcher.reflectors[2]
        # 1. a dropped connection: the GPU fails while no watch is open; the reconnect
        #    resumes from the last resourceVersion and sees it.
        manager.faults.drop_watches()
        manager.faults.fail(held[0][0], str(held[0][1]), xid=79)
        expect(*held[0])
        await wait_for(lambda: rec.keys() == want, what="launch after a dropped connection")
        assert pods.stats.relists == 0  # resumed, not re-listed
        # 2. an API-server restart: down for a second, watch cache compacted; a GPU fails
        #    meanwhile. The watcher backs off, gets 410, re-lists once, launches it once.
        manager.faults.restart_api_server(down_seconds=1.0, compact=True)
        manager.faults.fail(held[1][0], str(held[1][1]), xid=79)
        expect(*held[1])
        await wait_for(lambda: rec.keys() == want, what="launch after an API restart")
        await wait_for(lambda: pods.stats.relists >= 1, what="pod relist after 410")
        assert pods.stats.errors >= 1  # the refused reconnects were seen and backed off
        # 3. a launch failing (Temporal away) is retried, not lost.
        rec.fail = 2
        manager.faults.fail(held[2][0], str(held[2][1]), xid=79)
        expect(*held[2])
        await wait_for(lambda: rec.keys() == want, what="launch after Temporal errors")
        assert watcher.stats.launch_errors == 2
        await asyncio.sleep(1.0)  # the behaviour: nothing more is sent meanwhile
        assert rec.keys() == want  # nothing doubled by the relist or the status updates
    # 4. the watcher's own restart: a GPU fails while none runs; the new one finds it, and
    #    re-sends the earlier ones with the same fingerprints (the workflow ignores repeats).
    first = {(r.remediation.device.key, r.evidence.fingerprint) for r in rec.requests}
    manager.faults.fail(held[3][0], str(held[3][1]), xid=79)
    expect(*held[3])
    rec2 = Recorder()
    watcher2 = HealthWatcher(kube, rec2.launch, config(), on_node=rec2.node)
    async with Running(watcher2):
        await wait_for(lambda: rec2.keys() == want, what="launches after a watcher restart")
        again = {(r.remediation.device.key, r.evidence.fingerprint) for r in rec2.requests}
        assert first < again  # same evidence for the same failures, plus the new one


async def test_idle_watcher_sends_no_list(twin: tuple[RunningTwin, ControllerManager]) -> None:
    rs, _manager = twin
    log = rs.twin.server.request_log
    rec = Recorder()
    watcher = HealthWatcher(kube_for(rs), rec.launch, config(window=2), on_node=rec.node)
    async with Running(watcher):
        assert await watcher.synced()
        before = log.count(verb="list")
        watches = log.count(verb="watch")
        await wait_for(lambda: log.count(verb="watch") >= watches + 3, what="watch windows")
        assert log.count(verb="list") == before  # windows ended and resumed: no LIST


async def test_lease_one_active_and_hand_over(twin: tuple[RunningTwin, ControllerManager]) -> None:
    rs, _manager = twin
    kube = kube_for(rs)
    a = HealthWatcher(kube, Recorder().launch, config(identity="replica-a"))
    b = HealthWatcher(kube, Recorder().launch, config(identity="replica-b"))
    ra, rb = Running(a), Running(b)
    await ra.__aenter__()
    await wait_for(lambda: a.stats.leader, what="a leads")
    await rb.__aenter__()
    try:
        await asyncio.sleep(1.0)  # several retry periods: b stays a standby
        assert a.stats.leader and not b.stats.leader and not b.reflectors
        # a clean stop releases the Lease: b takes over without waiting for the expiry
        await ra.__aexit__()
        await wait_for(lambda: b.stats.leader, within=2.5, what="b leads after a's release")
        # b dies without releasing (its renewals stop): a fresh a takes over after expiry
        assert b.elector is not None
        b.elector.try_acquire_or_renew = lambda now=None: False  # type: ignore[method-assign]
        b.elector.release = lambda: None  # type: ignore[method-assign]
        a2 = HealthWatcher(kube, Recorder().launch, config(identity="replica-a2"))
        async with Running(a2):
            await asyncio.sleep(0.5)  # the behaviour: a2 does not take an unexpired lease
            assert not a2.stats.leader  # b's lease has not expired yet
            await wait_for(lambda: a2.stats.leader, within=20, what="a2 takes the expired lease")
            await wait_for(lambda: not b.reflectors, what="b stopped watching")
    finally:
        await rb.__aexit__()


async def test_rbac_yaml_covers_the_watcher(twin: tuple[RunningTwin, ControllerManager]) -> None:
    """Through a proxy enforcing deploy/rbac.yaml, the watcher leads, lists, watches and
    launches with no request refused."""
    import yaml

    from tests.activities.kube.conftest import ROLES
    from tests.activities.kube.rbac_proxy import RbacProxy

    rs, manager = twin
    rules = [
        rule
        for doc in yaml.safe_load_all((Path(__file__).parents[2] / "deploy/rbac.yaml").read_text())
        if doc["kind"] == "ClusterRole"
        for rule in doc["rules"]
    ]
    api = rs.api_client()
    deploy(api, replicas=1)
    await wait_for(lambda: running_pods(api) == 1, what="a running pod")
    ((node, index),) = allocated_gpus(rs, manager)
    with RbacProxy(rs.twin.url, rules, roles=ROLES) as proxy:
        config_doc = yaml.safe_load(rs.kubeconfig_path.read_text())
        config_doc["clusters"][0]["cluster"]["server"] = proxy.url
        path = rs.kubeconfig_path.with_name("proxied.yaml")
        path.write_text(yaml.safe_dump(config_doc))
        rec = Recorder()
        kube = Kube.from_settings(KubeSettings(kubeconfig=str(path)))
        watcher = HealthWatcher(kube, rec.launch, config(), on_node=rec.node)
        async with Running(watcher):
            assert await watcher.synced()
            manager.faults.fail(node, str(index), xid=79)
            await wait_for(lambda: len(rec.requests) == 1, what="launch through the proxy")
        assert proxy.denied == []


def _health_pod(rs: RunningTwin, name: str, rid: str, health: str, create: bool = False) -> None:
    """A bound pod whose container reports `rid` with `health` (the twin without a kubelet)."""
    store, node = rs.twin.store, rid.split("/")[1]
    if create:
        store.create(
            "pods",
            {
                "metadata": {"name": name, "namespace": "default"},
                "spec": {"nodeName": node, "containers": [{"name": "main", "image": "x"}]},
            },
            "default",
        )

    def update(obj: dict[str, Any]) -> dict[str, Any]:
        res = {"resourceID": rid, "health": health, "message": "no update from the driver"}
        obj["status"] = {
            "phase": "Running",
            "containerStatuses": [
                {
                    "name": "main",
                    "allocatedResourcesStatus": [{"name": "claim:gpu", "resources": [res]}],
                }
            ],
        }
        return obj

    store.mutate("pods", name, update, "default", subresource="status")


async def test_unknown_waits_for_the_timeout(tmp_path: Path) -> None:
    """A device reported Unknown is launched only once Unknown outlasted `unknown_timeout`
    (as the sweep re-checks); one Healthy again before that is never launched."""
    rs = start_twin(tmp_path, profile="1.36", nodes=1, gpus_per_node=2)
    try:
        (node,) = rs.twin.seed_info["nodes"]
        a, b = f"gpu.nvidia.com/{node}/gpu-0", f"gpu.nvidia.com/{node}/gpu-1"
        _health_pod(rs, "a", a, "Healthy", create=True)
        _health_pod(rs, "b", b, "Healthy", create=True)
        k8s.CoreV1Api(rs.api_client()).create_namespace({"metadata": {"name": NAMESPACE}})
        rec = Recorder()
        watcher = HealthWatcher(kube_for(rs), rec.launch, config(unknown_timeout=3.0))
        async with Running(watcher):
            assert await watcher.synced()
            uuids = {rid: dev.uuid for rid, dev in watcher.tracker.index.items()}
            started = time.monotonic()
            _health_pod(rs, "a", a, "Unknown")
            _health_pod(rs, "b", b, "Unknown")
            await wait_for(lambda: len(watcher._unknown) == 2, what="two Unknown findings")
            _health_pod(rs, "b", b, "Healthy")
            await wait_for(lambda: len(rec.requests) == 1, what="the Unknown launch")
            assert time.monotonic() - started >= 3.0  # not before the timeout
            [req] = rec.requests
            assert req.remediation.device.key == f"{node}/{uuids[a]}"
            assert "Unknown for over 3s" in req.remediation.reason
            assert req.evidence is not None and req.evidence.fingerprint.endswith(":Unknown")
            await wait_for(lambda: not watcher._unknown, what="b dropped once Healthy")
            assert len(rec.requests) == 1
    finally:
        rs.stop()


async def test_missing_lease_namespace_is_said_loudly(
    twin: tuple[RunningTwin, ControllerManager], caplog: pytest.LogCaptureFixture
) -> None:
    """No namespace for the Lease: the watcher does not watch (it cannot know it is the only
    one) and says why, with the fix, instead of failing or watching anyway."""
    rs, _manager = twin
    watcher = HealthWatcher(kube_for(rs), Recorder().launch, config(namespace="nowhere"))
    with caplog.at_level(logging.ERROR, logger="worker.watcher"):
        async with Running(watcher):
            await wait_for(lambda: any("nowhere" in r.getMessage() for r in caplog.records))
            assert not watcher.reflectors and not watcher.stats.leader
    [first, *_] = [r.getMessage() for r in caplog.records if "nowhere" in r.getMessage()]
    assert "does not watch" in first and "SICKBAY_WATCH_NAMESPACE" in first


async def test_device_plugin_cluster_without_resource_slices(tmp_path: Path) -> None:
    """No resource.k8s.io (device plugin): the slice reflector notes the kind is not served
    and the pods and nodes are watched anyway; a node short of GPUs is still found."""
    manager = ControllerManager(TwinOptions())
    rs = start_twin(
        tmp_path, profile="device-plugin", nodes=1, gpus_per_node=2, controllers=(manager,)
    )
    try:
        k8s.CoreV1Api(rs.api_client()).create_namespace({"metadata": {"name": NAMESPACE}})
        rec = Recorder()
        watcher = HealthWatcher(kube_for(rs), rec.launch, config(), on_node=rec.node)
        async with Running(watcher):
            assert await watcher.synced()
            slices, nodes, _pods = watcher.reflectors
            assert slices.stats.not_served and slices.stats.errors == 0
            assert nodes.stats.lists == 1
            (node,) = rs.twin.seed_info["nodes"]
            manager.faults.fail(node, "0", vanish=True)  # capacity and allocatable drop
            await wait_for(lambda: len(rec.nodes) == 1, what="node notice")
            assert rec.nodes[0].node == node
    finally:
        rs.stop()


async def test_hami_registration_health_is_watched(tmp_path: Path) -> None:
    """HAMi (twin profile `hami`): the GPU's fault reaches HAMi's registration at the device
    plugin's next re-registration (`health` left out), and the watcher launches the same
    `hami-health` finding the sweep produces; the GPU vanishing from the registration is a
    node notice."""
    manager = ControllerManager(TwinOptions())
    clock = Clock(time_scale=120)  # HAMi re-registers every 30 simulated seconds: 0.25 s
    rs = start_twin(
        tmp_path, profile="hami", nodes=1, gpus_per_node=2, controllers=(manager,), clock=clock
    )
    try:
        k8s.CoreV1Api(rs.api_client()).create_namespace({"metadata": {"name": NAMESPACE}})
        rec = Recorder()
        watcher = HealthWatcher(kube_for(rs), rec.launch, config(), on_node=rec.node)
        async with Running(watcher):
            assert await watcher.synced()
            (node,) = rs.twin.seed_info["nodes"]
            gpu = manager.faults.resolve(node, "1")[0]
            manager.faults.fail(node, "1", xid=79)
            await wait_for(lambda: rec.requests, what="launch")
            [req] = rec.requests
            assert req.remediation.device.key == f"{node}/{gpu.uuid}"
            assert req.evidence is not None and req.evidence.alertname == "watch-hami-health"
            assert req.evidence.failure_class == "unhealthy"
            swept = SweepActivities(kube_for(rs)).sweep(SweepClusterInput())
            assert [f.key for f in swept.findings] == [req.remediation.device.key]
            assert swept.findings[0].kind == "hami-health"
            manager.faults.fail(node, "0", vanish=True)
            await wait_for(lambda: rec.nodes, what="node notice")
            assert "registered by HAMi" in rec.nodes[0].message
    finally:
        rs.stop()


async def test_unknown_on_a_node_whose_plugin_withholds_every_gpu_is_the_nodes(
    tmp_path: Path,
) -> None:
    """A device plugin that stopped (its socket lost, the plugin pod still Running): the
    kubelet keeps the node's nvidia.com/gpu capacity for a grace period and drops allocatable
    to 0. A GPU reported Unknown there is the plugin's silence, not the GPU's failure: past
    `unknown_timeout` it is left to the node (no per-GPU remediation), while an Unknown GPU
    of a node whose plugin still offers its GPUs is launched as before."""
    rs = start_twin(tmp_path, profile="device-plugin", nodes=2, gpus_per_node=2)
    try:
        silent, other, first = plugin_silent_on_first_node(rs)
        k8s.CoreV1Api(rs.api_client()).create_namespace({"metadata": {"name": NAMESPACE}})
        rec = Recorder()
        watcher = HealthWatcher(kube_for(rs), rec.launch, config(unknown_timeout=1.0))
        async with Running(watcher):
            assert await watcher.synced()
            await wait_for(lambda: len(rec.requests) == 1, what="the other node's Unknown launch")
            await wait_for(
                lambda: watcher.stats.left_to_node_incident == 1, what="the silent node's left"
            )
            await asyncio.sleep(1.5)  # past the timeout again: still nothing for the silent one
            [req] = rec.requests
            assert req.remediation.device.node == other
            assert req.remediation.device.key == f"{other}/{first[other]}"
    finally:
        rs.stop()


async def test_a_slice_deleted_while_the_api_server_restarts_is_a_vanish(
    twin: tuple[RunningTwin, ControllerManager],
) -> None:
    """The kubelet deletes a stopped DRA plugin's slices; if that happens while the watch is
    down and the relist has no watch history to resume from (410), the list's absence of the
    slice is the only word of it: the node's GPUs vanished, as if the DELETE had been seen."""
    rs, manager = twin
    node = rs.twin.seed_info["nodes"][0]
    rec = Recorder()
    watcher = HealthWatcher(kube_for(rs), rec.launch, config(), on_node=rec.node)
    async with Running(watcher):
        assert await watcher.synced()
        slices = watcher.reflectors[0]
        manager.faults.restart_api_server(down_seconds=1.0, compact=False)
        for piece in manager.store.list("resourceslices").items:
            if piece["spec"].get("nodeName") == node:
                manager.store.delete("resourceslices", piece["metadata"]["name"])
        manager.store.compact()  # the restarted watch cache begins after the delete: 410
        await wait_for(lambda: slices.stats.relists >= 1, what="slice relist after 410")
        await wait_for(lambda: [f.node for f in rec.nodes] == [node], what="node notice")
        assert "missing" in rec.nodes[0].message
        assert node in watcher.tracker.vanished
        assert all(d.node != node for d in watcher.tracker.index.values())
        assert rec.requests == []  # the node's incident, no per-GPU remediation
