"""The health watcher: detects failed GPUs from Kubernetes watches within seconds.

    Lease (one active replica per cluster) ──> reflectors: ResourceSlices, Nodes, Pods
        (list once, then watch: resourceVersion, bookmarks, relist on 410, backoff)
    each event ──> the sweep's own finding functions (activities/sweep.py) ──> Tracker
        (per pod / device / node summaries, never whole objects)
    a finding that appears ──> signal-with-start of the device's workflow (same evidence
        fingerprint as the sweep: a repeat is harmless); Unknown only after `unknown_timeout`;
    a node whose GPUs vanished ──> `on_vanished`: its node incident (one per node, with what
        the node looked like before: kubelet / runtime versions, most GPUs seen); GPUs it
        reports Unknown are left to that incident, never a per-GPU remediation;
    another node short of GPUs ──> `on_node` (the worker triggers the sweep, which notifies)

Runs inside `sickbay worker` (`SICKBAY_WATCH_ENABLED`, default on). With
several replicas only the Lease holder watches; a replica that cannot renew within the renew
deadline stops watching, and a standby takes over when the Lease expires (or at once when the
holder stopped cleanly and released it). The health sweep keeps running as the safety net and
counts what the watcher missed (`missed_by_watch`).
"""

from __future__ import annotations

import asyncio
import logging
import os
import socket
import threading
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from activities.kube import hami
from activities.kube.client import ErrorKind, Kube, KubeError
from activities.kube.devices import (
    DRIVER_UPGRADE_LABEL,
    MIG_CONFIG_STATE_LABEL,
    MIG_RESOURCE_PREFIX,
    MIG_STRATEGY_LABEL,
    REMOVAL_TAINTS,
    REPLICAS_LABEL,
    SHARED_RESOURCE,
    offered_gpus,
    planned_outage,
    withholds_every_gpu,
)
from activities.kube.hami import ANN_REGISTER, VOLCANO_REGISTER
from activities.kube.lease import LeaseConfig, LeaseElector
from activities.kube.reflector import Reflector
from activities.sweep import (
    POD_FIELD_SELECTOR,
    SliceDevice,
    SweepActivities,
    plugin_pod_finding,
)
from contract.launch import LaunchRequest
from contract.node_incident import NodeIncidentInput, RecordedNode
from contract.sweep import SweepFinding, SweepReport
from worker.settings import Settings
from workflows.sweep import finding_fingerprint, finding_launch

log = logging.getLogger(__name__)

HAMI_REGISTERS = (ANN_REGISTER, VOLCANO_REGISTER)  # node annotations the findings read

Pair = tuple[str, str]  # (device key, evidence fingerprint)
# A launch that fails (Temporal unreachable) is retried this long before it is given up and
# left to the sweep (which then counts it as missed_by_watch).
LAUNCH_GIVE_UP = 600.0  # seconds
LAUNCH_BACKOFF_MAX = 30.0
# How often a replica that does not hold the Lease tries to take it (and the holder renews it).
LEASE_RETRY_SECONDS = 2.0
LEASE_WARN_EVERY = 60.0  # seconds between errors about a Lease it cannot take or renew
# A kubelet / runtime change this recent is "the upgrade" a node incident names (seconds).
RECENT_CHANGE = 24 * 3600.0


def default_identity() -> str:
    return f"{socket.gethostname()}-{os.getpid()}"


@dataclass(frozen=True)
class WatcherConfig:
    cluster: str = ""  # SICKBAY_CLUSTER: in the launches' ids, and one Lease per cluster
    namespace: str = "sickbay"  # where the Lease lives: Sickbay's own namespace
    identity: str = field(default_factory=default_identity)
    lease_duration: float = 15.0
    renew_deadline: float = 10.0
    retry_period: float = 2.0
    unknown_timeout: float = 300.0  # Unknown health this long counts as Unhealthy (as the sweep)
    dry_run: bool = False
    task_queue: str | None = None
    window: int = 300  # seconds per watch request
    launch_concurrency: int = 32

    @property
    def lease_name(self) -> str:
        return f"sickbay-health-watcher-{self.cluster or 'default'}"


@dataclass
class WatcherStats:
    findings: int = 0  # device findings that appeared
    launched: int = 0  # signal-with-start calls that succeeded
    started: int = 0
    signalled: int = 0
    launch_errors: int = 0
    given_up: int = 0
    node_findings: int = 0
    node_incidents: int = 0  # node incidents started / signalled (GPUs vanished)
    # Unknown GPUs of such a node, or of one whose device plugin offers none: no per-GPU
    # remediation.
    left_to_node_incident: int = 0
    unresolved: int = 0  # pod device ids no ResourceSlice maps
    leader: bool = False
    leader_transitions: int = 0
    detected: dict[str, float] = field(default_factory=dict)  # device key -> monotonic time


class Tracker:
    """Per pod / device / node summaries and the findings they currently produce.

    Every source (a pod, a slice device, a node) contributes a set of (device key, fingerprint)
    pairs; a pair that gains its first source is a new finding (`emit`), a pair that loses its
    last one is forgotten, so the same failure is reported once while it lasts, however often
    the pod is updated or the watch re-lists, and again if it comes back after healing."""

    def __init__(
        self,
        finder: SweepActivities,
        emit: Callable[[SweepFinding], None],
        emit_node: Callable[[SweepFinding], None],
    ) -> None:
        self._finder = finder
        self._emit = emit
        self._emit_node = emit_node
        self.lock = threading.RLock()
        self.index: dict[str, SliceDevice] = {}  # resourceID -> node, uuid, driver taints
        self.slice_rids: dict[str, set[str]] = {}  # slice name -> its resourceIDs
        self.nodes: dict[str, dict[str, Any]] = {}  # node name -> the few fields findings read
        self.node_rids: dict[str, set[str]] = {}  # node name -> resourceIDs it publishes
        self._sources: dict[Pair, set[str]] = {}
        self._by_source: dict[str, set[Pair]] = {}
        self.unresolved: set[tuple[str, str]] = set()
        self._replacing: dict[str, set[str]] = {}  # kind -> sources seen in this relist
        self._listed: dict[str, set[str]] = {}  # kind -> slices / nodes named in this relist
        # Node incidents (workflows/node_incident/): what each node looked like before its
        # GPUs vanished. Versions: (kubelet, runtime) now and the ones before the last change
        # with when it changed (forgotten once the node recovers); the most GPUs seen (the expected count without a count label).
        self.versions: dict[str, tuple[tuple[str, str], tuple[str, str] | None, float]] = {}
        self.max_gpus: dict[str, int] = {}
        # Nodes whose GPUs vanished, right now, by either source: the node itself (capacity
        # or slices below the GPUs expected), or a GPU plugin pod on it that cannot run. Each
        # source takes back only its own word: a node status that still counts the GPUs (the
        # kubelet keeps a stopped plugin's capacity for a while) does not end a vanish a
        # failing plugin pod began.
        self.vanished: set[str] = set()
        self._node_says_vanished: set[str] = set()
        self._failing_plugins: dict[str, str] = {}  # plugin pod source -> its node
        # Deleted nodes, when: their versions and GPU count are kept for RECENT_CHANGE (a node
        # deleted and joined again under its name, reinstalled, is still compared with what it
        # was), then forgotten, so a cluster whose nodes come and go does not grow the watcher.
        self._deleted_at: dict[str, float] = {}

    # ---- generic bookkeeping ------------------------------------------------------------

    def set_source(self, source: str, findings: list[SweepFinding]) -> None:
        with self.lock:
            kind = source.split(":", 1)[0]
            seen = self._replacing.get(kind)
            if seen is not None:
                seen.add(source)
            new = {(f.key, finding_fingerprint(f)): f for f in findings}
            old = self._by_source.get(source, set())
            for pair in old - new.keys():
                holders = self._sources.get(pair)
                if holders is not None:
                    holders.discard(source)
                    if not holders:
                        del self._sources[pair]
            fresh: list[SweepFinding] = []
            for pair, finding in new.items():
                holders = self._sources.setdefault(pair, set())
                if not holders:
                    fresh.append(finding)
                holders.add(source)
            if new:
                self._by_source[source] = set(new)
            else:
                self._by_source.pop(source, None)
        for finding in fresh:
            (self._emit_node if finding.kind == "node-capacity" else self._emit)(finding)

    def present(self, finding: SweepFinding) -> bool:
        with self.lock:
            return bool(self._sources.get((finding.key, finding_fingerprint(finding))))

    def begin(self, kind: str) -> None:
        with self.lock:
            self._replacing[kind] = set()
            self._listed[kind] = set()

    def _listing(self, kind: str, name: str) -> None:
        """A relist of `kind` named object `name` (under the lock)."""
        listed = self._listed.get(kind)
        if listed is not None:
            listed.add(name)

    def end(self, kind: str) -> list[str]:
        """End a relist: the slices and nodes the list did not contain were deleted while the
        watch was down, and go as if their DELETE had been seen; then any source of `kind` the
        list did not contain is gone."""
        with self.lock:
            listed = self._listed.pop(kind, set())
            held = self.slice_rids if kind == "slice" else self.nodes if kind == "node" else {}
            deleted = [name for name in held if name not in listed]
        for name in deleted:
            (self.slice if kind == "slice" else self.node)({"metadata": {"name": name}}, True)
        with self.lock:
            seen = self._replacing.pop(kind, set())
            gone = [s for s in self._by_source if s.split(":", 1)[0] == kind and s not in seen]
            for source in gone:
                self._plugin_runs(source)
            if kind == "pod":
                self.unresolved = {m for m in self.unresolved if m[0] in seen}
        for source in gone:
            self.set_source(source, [])
        return gone

    def pairs(self) -> int:
        with self.lock:
            return len(self._sources)

    # ---- pods ---------------------------------------------------------------------------

    def pod(self, obj: dict[str, Any], deleted: bool = False) -> None:
        meta = obj.get("metadata") or {}
        source = f"pod:{meta.get('namespace', '')}/{meta.get('name', '')}"
        if deleted:
            with self.lock:
                self._plugin_runs(source)
                if self.unresolved:  # a pod created again under its name is a new pod
                    self.unresolved = {m for m in self.unresolved if m[0] != source}
            self.set_source(source, [])
            return
        merged: dict[str, SweepFinding] = {}
        report = SweepReport()
        with self.lock:
            index = self.index
            self._finder.check_pod(obj, index, merged, report)
            for u in report.unresolved:
                marker = (source, u.resource_id)
                if marker not in self.unresolved:
                    self.unresolved.add(marker)
                    log.warning(
                        "watch: %s reports %s %s, which no ResourceSlice maps to a GPU; "
                        "not acting on it",
                        source,
                        u.resource_id,
                        u.health,
                    )
        plugin = plugin_pod_finding(obj)  # a GPU plugin pod that cannot run: its node's
        with self.lock:
            if plugin is not None and plugin.node:
                planned = planned_outage(self.nodes.get(plugin.node) or {})
                if planned:  # its GPUs are away on purpose: no GPU problem
                    log.info("watch: %s; not acting on it: %s", plugin.message, planned)
                    plugin = None
            if plugin is not None and plugin.node:
                self._failing_plugins[source] = plugin.node
                self._vanish(plugin.node)
            else:
                self._plugin_runs(source)
        self.set_source(source, list(merged.values()) + ([plugin] if plugin else []))

    # ---- slices -------------------------------------------------------------------------

    def slice(self, obj: dict[str, Any], deleted: bool = False) -> None:
        name = (obj.get("metadata") or {}).get("name", "")
        devices = {} if deleted else self._finder.slice_devices(obj)
        with self.lock:
            if not deleted:
                self._listing("slice", name)
            before = self.slice_rids.get(name, set())
            nodes = {self.index[r].node for r in before if r in self.index}
            for rid in before:
                old_dev = self.index.get(rid)
                if old_dev is not None:
                    self.node_rids.get(old_dev.node, set()).discard(rid)
            for rid in before - devices.keys():
                self.index.pop(rid, None)
            self.index.update(devices)
            for rid, dev in devices.items():
                self.node_rids.setdefault(dev.node, set()).add(rid)
            if devices:
                self.slice_rids[name] = set(devices)
            else:
                self.slice_rids.pop(name, None)
            nodes |= {d.node for d in devices.values()}
        for rid in before - devices.keys():
            self.set_source(f"slice:{rid}", [])
        for rid, dev in devices.items():
            merged: dict[str, SweepFinding] = {}
            self._finder.check_slice_taints({rid: dev}, merged)
            self.set_source(f"slice:{rid}", list(merged.values()))
        for node in nodes:  # a vanished device changes the node's published GPU count
            self._node_check(node)

    # ---- nodes --------------------------------------------------------------------------

    def node(self, obj: dict[str, Any], deleted: bool = False) -> None:
        meta = obj.get("metadata") or {}
        name = meta.get("name", "")
        if deleted:
            with self.lock:
                self._node_deleted(name)
            self.set_source(f"node:{name}", [])
            return
        status = obj.get("status") or {}
        gpu = "nvidia.com/gpu"
        count = "nvidia.com/gpu.count"
        summary: dict[str, Any] = {
            "metadata": {"name": name, "labels": {}},
            "status": {"capacity": {}, "allocatable": {}},
        }
        if meta.get("deletionTimestamp"):
            summary["metadata"]["deletionTimestamp"] = meta["deletionTimestamp"]
        removal = [
            t for t in (obj.get("spec") or {}).get("taints") or [] if t.get("key") in REMOVAL_TAINTS
        ]
        if removal:  # an autoscaler is removing the node
            summary["spec"] = {"taints": removal}
        for label in (
            count,
            MIG_STRATEGY_LABEL,
            MIG_CONFIG_STATE_LABEL,
            REPLICAS_LABEL,
            DRIVER_UPGRADE_LABEL,
        ):
            if label in (meta.get("labels") or {}):
                summary["metadata"]["labels"][label] = meta["labels"][label]
        annotations = meta.get("annotations") or {}
        registers = {k: annotations[k] for k in HAMI_REGISTERS if k in annotations}
        if registers:  # HAMi: its GPUs' registration (health, vanished GPUs)
            summary["metadata"]["annotations"] = registers
        for part in ("capacity", "allocatable"):
            for resource, value in (status.get(part) or {}).items():
                if resource in (gpu, SHARED_RESOURCE) or str(resource).startswith(
                    MIG_RESOURCE_PREFIX
                ):
                    summary["status"][part][resource] = value
        info = status.get("nodeInfo") or {}
        now_versions = (
            str(info.get("kubeletVersion") or ""),
            str(info.get("containerRuntimeVersion") or ""),
        )
        with self.lock:
            self._listing("node", name)
            self._deleted_at.pop(name, None)
            self.nodes[name] = summary
            current = self.versions.get(name)
            if current is None:
                self.versions[name] = (now_versions, None, 0.0)
            elif current[0] != now_versions:
                self.versions[name] = (now_versions, current[0], time.time())
        self._node_check(name)

    def _node_check(self, name: str) -> None:
        with self.lock:
            summary = self.nodes.get(name)
            if summary is None:
                return
            devs = (self.index.get(r) for r in self.node_rids.get(name, ()))
            seen = len({d.uuid for d in devs if d is not None and d.uuid})
            offered = offered_gpus(summary)
            have = offered if offered is not None else seen
            if hami.is_hami_node(summary):  # nvidia.com/gpu counts HAMi's shares, not GPUs
                try:
                    have = len(hami.node_gpus(summary) or [])
                except hami.HamiFormatError:
                    have = 0  # unreadable: node_finding says so; nothing learnt
            finding = self._finder.node_finding(
                summary, seen, bool(self.index), last_seen=self.max_gpus.get(name)
            )
            if finding is not None and finding.vanished:
                self._node_says_vanished.add(name)
                self._vanish(name)
            else:
                self._node_says_vanished.discard(name)
                self._unvanish(name)
                if have:
                    self.max_gpus[name] = max(have, self.max_gpus.get(name, 0))
            findings = [finding] if finding else []
            findings += self._finder.hami_findings(summary)
        self.set_source(f"node:{name}", findings)

    def _node_deleted(self, name: str) -> None:
        """The Node is gone (under the lock): its own word on its GPUs goes with it; its
        versions and GPU count stay for RECENT_CHANGE, and those of nodes deleted longer ago
        are forgotten."""
        self.nodes.pop(name, None)
        self._node_says_vanished.discard(name)
        if name not in self._failing_plugins.values():
            self.vanished.discard(name)  # gone, not recovered: what it ran before is kept
        now = time.time()
        self._deleted_at[name] = now
        for old in [n for n, at in self._deleted_at.items() if now - at > RECENT_CHANGE]:
            del self._deleted_at[old]
            self.versions.pop(old, None)
            self.max_gpus.pop(old, None)

    def _vanish(self, name: str) -> None:
        """The node's GPUs vanished (under the lock)."""
        self.vanished.add(name)

    def _plugin_runs(self, source: str) -> None:
        """The pod `source` is no failing GPU plugin pod (any more): if it was, its node's
        vanish loses that word (under the lock)."""
        node = self._failing_plugins.pop(source, None)
        if node is not None:
            self._unvanish(node)

    def _unvanish(self, name: str) -> None:
        """A source took its word back (under the lock): the node recovers when no source
        says its GPUs vanished any more."""
        if name not in self.vanished or name in self._node_says_vanished:
            return
        if name in self._failing_plugins.values():
            return
        # Recovered (no source says otherwise): it runs well on its versions now, so a later
        # vanish blames no change from before this recovery, whichever the watch saw first.
        current = self.versions.get(name)
        if current is not None:
            self.versions[name] = (current[0], None, 0.0)
        self.vanished.discard(name)

    def withheld(self, name: str) -> bool:
        """The node's device plugin offers none of its GPUs: nvidia.com/gpu allocatable 0
        while capacity still counts them, as the kubelet shows for a grace period after the
        plugin stopped (HAMi's nvidia.com/gpu counts shares: never)."""
        with self.lock:
            summary = self.nodes.get(name)
        return summary is not None and withholds_every_gpu(summary)

    def recorded(self, name: str) -> RecordedNode:
        """What the node looked like before its GPUs vanished: the versions before its last
        kubelet / runtime change (when that change came within RECENT_CHANGE and the node has
        not recovered since), the most GPUs seen on it."""
        with self.lock:
            now, before, changed = self.versions.get(name, (("", ""), None, 0.0))
            old = before if before is not None and time.time() - changed < RECENT_CHANGE else now
            return RecordedNode(
                kubelet_version=old[0],
                runtime_version=old[1],
                gpu_count=self.max_gpus.get(name),
            )


class _KindHandler:
    """Adapts one kind's reflector callbacks to the Tracker."""

    def __init__(self, tracker: Tracker, kind: str, apply: Callable[..., None]) -> None:
        self._tracker, self._kind, self._apply = tracker, kind, apply

    def begin_replace(self) -> None:
        self._tracker.begin(self._kind)

    def upsert(self, obj: dict[str, Any]) -> None:
        self._apply(obj)

    def delete(self, obj: dict[str, Any]) -> None:
        self._apply(obj, deleted=True)

    def end_replace(self) -> None:
        self._tracker.end(self._kind)


Launcher = Callable[[LaunchRequest], Awaitable[Any]]


class HealthWatcher:
    """Leader election + three reflectors + the launch queue. `await run(stop)`."""

    def __init__(
        self,
        kube: Kube,
        launch: Launcher,
        config: WatcherConfig | None = None,
        *,
        finder: SweepActivities | None = None,
        on_node: Callable[[SweepFinding], Awaitable[Any]] | None = None,
        use_lease: bool = True,
        on_vanished: Callable[[NodeIncidentInput], Awaitable[Any]] | None = None,
    ) -> None:
        self.config = config or WatcherConfig()
        self._kube = kube
        self._launch = launch
        self._on_node = on_node
        self._on_vanished = on_vanished  # starts the node's incident (signal-with-start)
        self.elector = (
            LeaseElector(
                kube,
                LeaseConfig(
                    name=self.config.lease_name,
                    namespace=self.config.namespace,
                    identity=self.config.identity,
                    lease_duration=self.config.lease_duration,
                    renew_deadline=self.config.renew_deadline,
                    retry_period=self.config.retry_period,
                ),
            )
            if use_lease
            else None
        )
        self.stats = WatcherStats()
        self.tracker = Tracker(finder or SweepActivities(kube), self._found, self._found_node)
        self.reflectors: list[Reflector] = []
        self._threads: list[threading.Thread] = []
        self._loop: asyncio.AbstractEventLoop | None = None
        self._queue: asyncio.Queue[tuple[str, SweepFinding]] | None = None
        self._unknown: dict[Pair, tuple[float, SweepFinding]] = {}
        self.watching = asyncio.Event()

    # ---- findings (reflector threads) ---------------------------------------------------

    def _put(self, what: str, finding: SweepFinding) -> None:
        loop, queue = self._loop, self._queue
        if loop is None or queue is None:
            return
        try:
            loop.call_soon_threadsafe(queue.put_nowait, (what, finding))
        except RuntimeError:  # the loop closed: we are stopping
            pass

    def _found(self, finding: SweepFinding) -> None:
        if not (finding.node and finding.gpu_uuid):
            return
        self.stats.findings += 1
        self.stats.detected.setdefault(finding.key, time.monotonic())
        if finding.health == "Unknown":
            log.info(
                "watch: %s Unknown; acting if still so in %ss",
                finding.key,
                self.config.unknown_timeout,
            )
            self._put("unknown", finding)
            return
        log.info("watch: %s %s (%s)", finding.key, finding.health, finding.message)
        self._put("device", finding)

    def _found_node(self, finding: SweepFinding) -> None:
        self.stats.node_findings += 1
        log.warning("watch: %s", finding.message)
        self._put("node", finding)

    # ---- leadership and reflectors ------------------------------------------------------

    def _start_reflectors(self) -> None:
        kube, tracker = self._kube, self.tracker
        window = self.config.window
        slices = Reflector(
            kube,
            kube.resource_v1.list_resource_slice,
            resource="resourceslices",
            handler=_KindHandler(tracker, "slice", tracker.slice),
            window=window,
        )
        nodes = Reflector(
            kube,
            kube.core.list_node,
            resource="nodes",
            handler=_KindHandler(tracker, "node", tracker.node),
            window=window,
        )
        pods = Reflector(
            kube,
            kube.core.list_pod_for_all_namespaces,
            resource="pods",
            handler=_KindHandler(tracker, "pod", tracker.pod),
            field_selector=POD_FIELD_SELECTOR,
            window=window,
        )
        self.reflectors = [slices, nodes, pods]

        def run_all() -> None:
            # Slices first: pod health is mapped to GPUs through them.
            first = threading.Thread(target=slices.run, name="sickbay-watch-slices", daemon=True)
            first.start()
            self._threads.append(first)
            slices.synced.wait(timeout=60.0)
            for r in (nodes, pods):
                if slices.stopped:
                    return
                t = threading.Thread(target=r.run, name=f"sickbay-watch-{r.resource}", daemon=True)
                t.start()
                self._threads.append(t)

        starter = threading.Thread(target=run_all, name="sickbay-watch-start", daemon=True)
        starter.start()
        self._threads.append(starter)
        self.watching.set()
        log.info("health watcher %s: watching pods, resourceslices, nodes", self.config.identity)

    def _stop_reflectors(self) -> None:
        for r in self.reflectors:
            r.stop()
        for t in self._threads:
            t.join(timeout=10.0)
        self._threads, self.reflectors = [], []
        self.watching.clear()

    async def synced(self, within: float = 60.0) -> bool:
        """Wait until every reflector finished its first LIST (tests, benchmarks)."""
        deadline = time.monotonic() + within
        while time.monotonic() < deadline:
            if len(self.reflectors) == 3 and all(r.synced.is_set() for r in self.reflectors):
                return True
            await asyncio.sleep(0.05)
        return False

    async def run(self, stop: asyncio.Event) -> None:
        self._loop = asyncio.get_running_loop()
        self._queue = asyncio.Queue()
        workers = [
            asyncio.create_task(self._launcher()) for _ in range(self.config.launch_concurrency)
        ]
        timer = asyncio.create_task(self._unknown_timer(stop))
        last_renew = 0.0
        last_warned = -LEASE_WARN_EVERY
        try:
            while not stop.is_set():
                if self.elector is None:
                    leader = True
                else:
                    try:
                        leader = await asyncio.to_thread(self.elector.try_acquire_or_renew)
                    except KubeError as err:
                        leader = False
                        if time.monotonic() - last_warned >= LEASE_WARN_EVERY:
                            last_warned = time.monotonic()
                            hint = (
                                f" (does namespace {self.config.namespace!r} exist? create it "
                                "or set SICKBAY_WATCH_NAMESPACE)"
                                if err.kind is ErrorKind.NOT_FOUND
                                else ""
                            )
                            log.error(
                                "health watcher cannot hold its Lease %s/%s, so it does not "
                                "watch: %s%s",
                                self.config.namespace,
                                self.config.lease_name,
                                err,
                                hint,
                            )
                now = time.monotonic()
                if leader:
                    last_renew = now
                    if not self.reflectors:
                        self.stats.leader_transitions += 1
                        self._start_reflectors()
                elif self.reflectors and now - last_renew > self.config.renew_deadline:
                    log.warning(
                        "health watcher %s lost the lease; stopping its watches",
                        self.config.identity,
                    )
                    await asyncio.to_thread(self._stop_reflectors)
                self.stats.leader = bool(self.reflectors)
                if self.elector is None:
                    await stop.wait()
                    break
                try:
                    await asyncio.wait_for(stop.wait(), timeout=self.config.retry_period)
                except TimeoutError:
                    pass
        finally:
            await asyncio.to_thread(self._stop_reflectors)
            self.stats.leader = False
            if self.elector is not None:
                await asyncio.to_thread(self.elector.release)
            timer.cancel()
            for w in workers:
                w.cancel()
            await asyncio.gather(timer, *workers, return_exceptions=True)

    # ---- launching (event loop) ---------------------------------------------------------

    async def _unknown_timer(self, stop: asyncio.Event) -> None:
        while not stop.is_set():
            await asyncio.sleep(1.0)
            now = time.monotonic()
            for pair, (due, finding) in list(self._unknown.items()):
                if not self.tracker.present(finding):
                    del self._unknown[pair]  # healthy again (or the pod went away)
                elif now >= due:
                    del self._unknown[pair]
                    if finding.node in self.tracker.vanished:
                        # The GPU vanished with its node's plugin: the node incident's, never a
                        # per-GPU remediation.
                        log.info("watch: %s Unknown on a node whose GPUs vanished", finding.key)
                        self.stats.left_to_node_incident += 1
                        continue
                    if finding.node and self.tracker.withheld(finding.node):
                        # Its device plugin stopped (the kubelet keeps the capacity for a
                        # grace period, allocatable 0): the Unknown is the plugin's silence,
                        # not the GPU's failure. The node's own finding says so; its capacity
                        # drops when the grace ends, and the node incident takes it then.
                        log.warning(
                            "watch: %s Unknown on a node whose device plugin offers none of "
                            "its GPUs; not acting on it (the node's finding stands)",
                            finding.key,
                        )
                        self.stats.left_to_node_incident += 1
                        continue
                    late = finding.model_copy(
                        update={
                            "message": f"{finding.message} (Unknown for over "
                            f"{int(self.config.unknown_timeout)}s)"
                        }
                    )
                    self._put("device", late)

    async def _launcher(self) -> None:
        assert self._queue is not None
        while True:
            what, finding = await self._queue.get()
            if what == "unknown":
                pair = (finding.key, finding_fingerprint(finding))
                self._unknown[pair] = (time.monotonic() + self.config.unknown_timeout, finding)
                continue
            if what == "node" and finding.vanished and self._on_vanished is not None:
                await self._start_node_incident(finding)
                continue
            if what == "node":
                if self._on_node is not None:
                    try:
                        await self._on_node(finding)
                    except Exception as exc:  # the sweep notifies at its next run anyway
                        log.warning("watch: node finding %s: %s", finding.node, exc)
                continue
            req = finding_launch(
                finding,
                now=datetime.now(UTC),
                trigger="watch",
                dry_run=self.config.dry_run,
                task_queue=self.config.task_queue,
                cluster=self.config.cluster,
            )
            await self._launch_until_done(finding, req)

    async def _start_node_incident(self, finding: SweepFinding) -> None:
        """One node incident per node whose GPUs vanished; retried like a launch, then left to
        the sweep."""
        assert finding.node and self._on_vanished is not None
        recorded = self.tracker.recorded(finding.node)
        inp = NodeIncidentInput(
            node=finding.node,
            cluster=self.config.cluster,
            trigger="watch",
            reason=finding.message,
            planned=finding.planned,
            # A plugin pod's finding carries no count: the most GPUs seen on the node.
            expected_gpus=finding.expected_gpus or recorded.gpu_count,
            recorded=recorded,
            dry_run=self.config.dry_run,
            task_queue=self.config.task_queue,
        )
        deadline = time.monotonic() + LAUNCH_GIVE_UP
        delay = 0.5
        while True:
            try:
                await self._on_vanished(inp)
                self.stats.node_incidents += 1
                log.warning("watch: %s; node incident started", finding.message)
                return
            except Exception as exc:
                self.stats.launch_errors += 1
                if time.monotonic() > deadline or not self.tracker.present(finding):
                    log.error("watch: node incident of %s not started (%s)", finding.node, exc)
                    return
                await asyncio.sleep(delay)
                delay = min(LAUNCH_BACKOFF_MAX, delay * 2)

    async def _launch_until_done(self, finding: SweepFinding, req: LaunchRequest) -> None:
        deadline = time.monotonic() + LAUNCH_GIVE_UP
        delay = 0.5
        while True:
            try:
                res = await self._launch(req)
            except Exception as exc:
                self.stats.launch_errors += 1
                if time.monotonic() > deadline or not self.tracker.present(finding):
                    self.stats.given_up += 1
                    log.error(
                        "watch: could not launch the remediation of %s (%s); the sweep will "
                        "find it",
                        finding.key,
                        exc,
                    )
                    return
                log.warning("watch: launch for %s failed (%s); retrying", finding.key, exc)
                await asyncio.sleep(delay)
                delay = min(LAUNCH_BACKOFF_MAX, delay * 2)
                continue
            self.stats.launched += 1
            if getattr(res, "started", False):
                self.stats.started += 1
            else:
                self.stats.signalled += 1
            return


# ---- process wiring -------------------------------------------------------------------------


def watcher_config(settings: Settings, *, unknown_timeout: float, dry_run: bool) -> WatcherConfig:
    """The watcher's configuration from `settings.watch` (and the cluster and queue)."""
    watch = settings.watch
    return WatcherConfig(
        cluster=settings.cluster,
        namespace=watch.watch_namespace,
        lease_duration=watch.watch_lease_seconds,
        renew_deadline=watch.watch_renew_seconds,
        retry_period=LEASE_RETRY_SECONDS,
        unknown_timeout=unknown_timeout,
        dry_run=dry_run,
        task_queue=settings.task_queue,
    )


def build_health_watcher(client: Any, settings: Settings, kube: Kube) -> HealthWatcher:
    """The watcher `sickbay worker` runs: launches through signal-with-start on `client`, and
    a node short of GPUs triggers the sweep Schedule (which notifies the channels)."""
    from activities.launch import signal_with_start
    from activities.node_launch import start_node_incident
    from contract.names import sweep_schedule_id

    sweep = settings.sweep
    cfg = watcher_config(
        settings,
        unknown_timeout=sweep.sweep_unknown_timeout.total_seconds(),
        dry_run=sweep.sweep_dry_run,
    )

    async def launch(req: LaunchRequest) -> Any:
        return await signal_with_start(
            client,
            req.remediation,
            task_queue=req.task_queue or settings.task_queue,
            evidence=req.evidence,
        )

    last_trigger = 0.0

    async def on_node(finding: SweepFinding) -> None:
        nonlocal last_trigger
        if not sweep.sweep_enabled or time.monotonic() - last_trigger < 60.0:
            return  # one early sweep a minute at most; the Schedule runs anyway
        last_trigger = time.monotonic()
        await client.get_schedule_handle(sweep_schedule_id(cfg.cluster)).trigger()
        log.info("watch: %s; triggered the health sweep to notify", finding.message)

    async def on_vanished(inp: NodeIncidentInput) -> Any:
        return await start_node_incident(client, inp, task_queue=settings.task_queue)

    return HealthWatcher(kube, launch, cfg, on_node=on_node, on_vanished=on_vanished)
