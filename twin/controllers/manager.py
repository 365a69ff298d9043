"""The twin's controller manager: runs every controller of the cluster twin in one thread.

    from twin.controllers.manager import ControllerManager, TwinOptions
    twin = Twin(profile="1.36", clock=Clock(time_scale=60))
    twin.seed(nodes=1, gpus_per_node=2)
    manager = ControllerManager(TwinOptions(alert_webhook="http://127.0.0.1:8080/alerts"))
    twin.add_controller(manager)       # start(twin) / stop(), as twin/runtime.py expects
    twin.start()
    manager.faults.fail("node-1", "0", xid=79)  # or over HTTP (fault_routes.py), or the CLI
    manager.node_pools.resize("gpu-pool", 3)     # also what the cloud API calls

Controllers are level-triggered: each pass reads the store and writes what differs from the
desired state. A pass runs whenever the store changes (a `subscribe` callback wakes the loop)
and when a controller's timer is due (each `sync()` returns the simulated seconds until it
needs to look again: a grace period ending, a container restart, a DeviceTaintRule's next
status update). All timers are on the twin's `Clock`, so `--time-scale` speeds them up.

Order of one pass: resource claims from templates -> scheduler -> workload controllers
(Deployment, ReplicaSet, StatefulSet, Job) -> device-taint eviction -> kubelet stand-in
-> node Leases and heartbeats (controllers/leases.py) ->
node pools / MachineDeployments -> garbage collection. Every controller writes only through
`twin.store`, exactly as the HTTP API would.

At start the manager also mounts the `/twin/...` fault, alert, API-fault and pool routes on
the twin's API server and enables API fault injection there
(twin/fault_routes.py `install_server_hooks`). `sickbay-dev twin up` uses the module-level
hooks below (`add_twin_up_arguments`, `make_clock`, `configure_twin`): --time-scale,
--alert-webhook/--alert-token/--alert-*, --provisioning-delay, --ignore-device-taint-rules,
--expired-toleration-bug, --no-controllers.

Workload knobs for rehearsals (pod template annotations):
    twin.sickbay.dev/run-seconds: "30"  -> each container exits after 30 simulated seconds
    twin.sickbay.dev/exit-code:   "42"  -> ... with exit code 42 (default 0)
Without them a container runs until deleted, or until its GPU dies.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from dataclasses import dataclass, field
from typing import Any

from twin.alerts import AlertConfig, AlertmanagerTwin
from twin.clock import Clock
from twin.controllers.common import TAINT_RULES, EventRecorder

log = logging.getLogger(__name__)

# The loop never sleeps longer than this in real time, so controllers notice a changed time
# scale (or a stop request) promptly even when no timer is due.
MAX_IDLE_REAL = 0.5
# Real-time batching delay after a store change: many writes in a burst make one pass.
DEBOUNCE_REAL = 0.003
# A due timer still waits this long, so a controller that keeps asking for 0 s cannot spin.
MIN_SLEEP_REAL = 0.01
# After passes that took S real seconds, the next change-triggered pass waits at least
# S * PASS_REST_RATIO (capped at MAX_REST_REAL): a pass over 8,000 pods costs ~150 ms, and a
# stream of API writes (a 200-GPU burst) otherwise kept this thread passing back to back, a
# whole core and the API server's GIL taken from the clients the twin stands in a cluster for.
# Changes arriving meanwhile are batched into that next pass, as a controller's work queue
# batches them; a real control plane reacts in the same tens to hundreds of milliseconds.
PASS_REST_RATIO = 1.0
MAX_REST_REAL = 0.25


@dataclass
class TwinOptions:
    """Behaviour switches and timings (simulated seconds) for the twin's controllers."""

    # Kubelet stand-in.
    pod_startup_seconds: float = 2.0  # Pending -> Running after binding
    crash_after_seconds: float = 3.0  # a container on a dead GPU fails this long after start
    crash_backoff_initial: float = 10.0  # kubelet's CrashLoopBackOff: 10 s, doubling ...
    crash_backoff_max: float = 300.0  # ... up to 5 minutes
    # The device manager's endpointStopGracePeriod: a device plugin that stopped while the
    # kubelet runs keeps its capacity (none allocatable) this long.
    plugin_stop_grace: float = 300.0
    # Pod device health ids as the 1.36 kubelet writes them: the first CDI device id the
    # driver returned (NVIDIA's driver returns `k8s.gpu.nvidia.com/claim=<claim uid>-<device>`);
    # False: the driver returned none, so `<driver>/<pool>/<device>`.
    cdi_device_ids: bool = True
    # Device-taint eviction: DeviceTaintRule status is written at most this often.
    rule_status_period: float = 10.0
    # Node pools: time from a resize until new nodes (and their ResourceSlices) appear.
    provisioning_delay: float = 30.0
    reboot_seconds: float = 20.0  # a rebooted twin node is NotReady this long (simulated)
    # A replacement node (repairs.replace) registers NotReady with no GPUs published, then is
    # Ready with its devices this long after (kubelet start, then the device plugin / DRA
    # driver DaemonSet); 0: registered Ready with its devices at once.
    node_startup_seconds: float = 0.0
    # What the twin's Cluster API MachineHealthCheck does with `remediate-machine`: an external
    # reboot remediator ("reboot") or the owner's delete-and-recreate ("replace").
    capi_remediation: str = "reboot"
    # Scheduler retry backoff for unschedulable pods (kube-scheduler: 1 s doubling to 10 s).
    schedule_backoff_initial: float = 1.0
    schedule_backoff_max: float = 10.0
    # Known control-plane faults (switchable at run time through fault_routes / faults.py).
    ignore_device_taint_rules: bool = False  # kubernetes#139651: scheduler misses rule taints
    expired_toleration_bug: bool = False  # expired NoExecute toleration still gets the device
    # Alerts (Alertmanager stand-in).
    alert_webhook: str | None = None
    alert_token: str | None = field(default=None, repr=False)
    alert_group_wait: float = 30.0
    alert_group_interval: float = 300.0
    alert_repeat_interval: float = 4 * 3600.0
    # Node-pool label on nodes (the pool a node belongs to).
    pool_label: str = "sickbay.dev/node-pool"

    def alert_config(self) -> AlertConfig:
        return AlertConfig(
            url=self.alert_webhook,
            token=self.alert_token,
            group_wait=self.alert_group_wait,
            group_interval=self.alert_group_interval,
            repeat_interval=self.alert_repeat_interval,
        )


class SyncContext:
    """What a controller gets for one pass."""

    def __init__(self, manager: ControllerManager) -> None:
        self.manager = manager
        self.store = manager.store
        self.clock = manager.clock
        self.options = manager.options
        self.events = manager.events
        self.now = manager.clock.now()
        self.mono = manager.clock.monotonic()
        self.dra = manager.dra


def _conditions(node: dict[str, Any] | None) -> list[tuple[Any, Any, Any]]:
    conds = ((node or {}).get("status") or {}).get("conditions") or []
    return [(c.get("type"), c.get("status"), c.get("reason")) for c in conds]


def _heartbeat_only(event: Any) -> bool:
    """A Node status write that moved only heartbeat times (the kubelet stand-in's beat)."""
    old, new = event.old, event.object
    if event.type != "MODIFIED" or old is None:
        return False
    if old.get("spec") != new.get("spec") or _conditions(old) != _conditions(new):
        return False
    o_meta, n_meta = old.get("metadata") or {}, new.get("metadata") or {}
    for key in ("labels", "annotations", "deletionTimestamp", "finalizers"):
        if o_meta.get(key) != n_meta.get(key):
            return False
    o_status, n_status = old.get("status") or {}, new.get("status") or {}
    return all(
        o_status.get(key) == n_status.get(key)
        for key in set(o_status) | set(n_status)
        if key != "conditions"
    )


def _wakes_controllers(event: Any) -> bool:
    """Whether a store change asks for a pass. No controller acts on Events or Leases (node
    Leases are renewed on NodeLeases' own timer; Sickbay's Lease is its own business), nor on a
    node heartbeat: on a 1,000-node twin those writes (5 a second) each caused a pass over
    every pod, about a core of CPU with 8,000 pods."""
    if event.resource == "events" or event.resource.startswith("leases"):
        return False
    return not (event.resource == "nodes" and _heartbeat_only(event))


def _rules_only(event: Any) -> bool:
    """A DeviceTaintRule change: only the controllers that read rules act on it (the device
    taint eviction and the scheduler, `rule_readers`). Sickbay creates one per failed GPU, and a
    burst of 200 made every controller pass over every pod 200 times."""
    return bool(event.resource == TAINT_RULES)


class ControllerManager:
    """Owns the controllers, the fault injector and the alert notifier of one twin."""

    def __init__(self, options: TwinOptions | None = None) -> None:
        self.options = options or TwinOptions()
        self.twin: Any = None
        self.store: Any = None
        self.clock: Clock = Clock()
        self.dra = True
        self.events: EventRecorder | None = None  # type: ignore[assignment]
        self.controllers: list[Any] = []
        self.rule_readers: list[Any] = []
        self._thread: threading.Thread | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._wake: asyncio.Event | None = None
        self._stop = threading.Event()
        self._unsubscribe: Any = None
        self._pass_lock = threading.RLock()
        self.passes = 0
        # Store changes a controller may act on (and pokes), and each controller's next timer
        # (twin seconds; None: only a change wakes it): the loop skips what is not due.
        self._changes = 0
        self._rule_changes = 0  # DeviceTaintRule changes: only `rule_readers` look
        self._due: dict[int, float | None] = {}
        self.alerts: AlertmanagerTwin | None = None
        self.faults: Any = None
        self.node_pools: Any = None
        self._fault_server: Any = None

    # -- wiring --------------------------------------------------------------------------

    def attach(self, twin: Any) -> None:
        """Bind to a twin without starting the thread (unit tests drive `run_once`)."""
        from twin.controllers.claims import ResourceClaimController
        from twin.controllers.gc import GarbageCollector
        from twin.controllers.kubelet import Kubelet
        from twin.controllers.leases import NodeLeases
        from twin.controllers.nodepools import MachineDeploymentController, NodePools
        from twin.controllers.repair_tools import MachineRemediation, NodeRepairs
        from twin.controllers.scheduler import Scheduler
        from twin.controllers.taints import DeviceTaintEviction
        from twin.controllers.workloads import (
            DeploymentController,
            JobController,
            ReplicaSetController,
            StatefulSetController,
        )
        from twin.faults import FaultInjector
        from twin.upgrade import GpuPlugins

        self.twin = twin
        self.store = twin.store
        clock = getattr(twin, "clock", None)
        self.clock = clock if isinstance(clock, Clock) else Clock()
        profile = getattr(twin, "profile", None)
        self.dra = bool(getattr(profile, "dra", True))
        self.events = EventRecorder(self.store, self.clock)
        self.alerts = AlertmanagerTwin(self.clock, self.options.alert_config())
        self.faults = FaultInjector(self)
        self.node_pools = NodePools(self)
        self.kubelet = Kubelet(self)
        self.repairs = NodeRepairs(self)
        self.scheduler = Scheduler(self)
        self.taints = DeviceTaintEviction(self)
        self.gpu_plugins = GpuPlugins(self)  # off until installed (twin/upgrade.py)
        # The controllers a DeviceTaintRule change wakes (no other reads rules).
        self.rule_readers = [self.taints, self.scheduler]
        self.controllers = [
            ResourceClaimController(self),
            self.scheduler,
            DeploymentController(self),
            ReplicaSetController(self),
            StatefulSetController(self),
            JobController(self),
            self.taints,
            self.kubelet,
            NodeLeases(self),
            self.node_pools,
            self.repairs,
            MachineRemediation(self),
            MachineDeploymentController(self),
            GarbageCollector(self),
            self.gpu_plugins,
        ]
        if bool(getattr(profile, "hami", False)):
            from twin.controllers.hami import HamiController

            # HAMi's scheduler and device plugin (pods with schedulerName hami-scheduler).
            self.hami = HamiController(self)
            self.controllers.insert(self.controllers.index(self.scheduler) + 1, self.hami)
        extensions = getattr(twin, "extensions", None)
        if isinstance(extensions, dict):
            extensions.update(
                {
                    "controllers": self,
                    "faults": self.faults,
                    "alerts": self.alerts,
                    "node_pools": self.node_pools,
                    "repairs": self.repairs,
                    "gpu_plugins": self.gpu_plugins,
                    "container_output": self.kubelet.output,
                }
            )

    def start(self, twin: Any) -> None:
        from twin.fault_routes import FaultApiServer, install_server_hooks

        if self.twin is None:
            self.attach(twin)
        if not install_server_hooks(twin):
            # The API server could not be extended: serve the fault routes on their own port.
            self._fault_server = FaultApiServer(twin).start()
            twin.extensions["fault_api_url"] = self._fault_server.url
            log.warning("fault routes on their own port: %s", self._fault_server.url)
        else:
            twin.extensions["fault_api_url"] = twin.url
        self._stop.clear()
        self._thread = threading.Thread(
            target=self._run_thread, name="twin-controllers", daemon=True
        )
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        loop, wake = self._loop, self._wake
        if loop is not None and wake is not None and not loop.is_closed():
            try:
                loop.call_soon_threadsafe(wake.set)
            except RuntimeError:  # loop already closed
                pass
        if self._thread is not None:
            self._thread.join(timeout=5)
            self._thread = None
        if self._fault_server is not None:
            self._fault_server.stop()
            self._fault_server = None

    def poke(self) -> None:
        """Ask for a pass soon (thread-safe): used after a fault or a resize."""
        self._changes += 1  # state outside the store changed: every controller looks
        loop, wake = self._loop, self._wake
        if loop is not None and wake is not None and not loop.is_closed():
            try:
                loop.call_soon_threadsafe(wake.set)
            except RuntimeError:
                pass

    # -- the loop ------------------------------------------------------------------------

    def _run_thread(self) -> None:
        loop = asyncio.new_event_loop()
        self._loop = loop
        try:
            loop.run_until_complete(self._main())
        finally:
            loop.close()

    async def _main(self) -> None:
        self._wake = asyncio.Event()
        loop = asyncio.get_running_loop()
        wake = self._wake

        def on_change(event: Any) -> None:
            if not _wakes_controllers(event):
                return
            if _rules_only(event):
                self._rule_changes += 1
            else:
                self._changes += 1
            try:
                loop.call_soon_threadsafe(wake.set)
            except RuntimeError:
                pass

        self._unsubscribe = self.store.subscribe(on_change)
        assert self.alerts is not None
        notifier = asyncio.create_task(self.alerts.run())
        try:
            seen = seen_rules = -1  # the first pass runs every controller
            while not self._stop.is_set():
                # Read once: a change after this is seen next time.
                current, current_rules = self._changes, self._rule_changes
                changed, seen = current != seen, current
                rules_changed, seen_rules = current_rules != seen_rules, current_rules
                started = time.monotonic()
                # One pass, then rest: changes made meanwhile (the controllers' own writes
                # included) have set `wake`, so a cascade goes on pass by pass. Without a
                # change (a timer or the idle wake-up), only the controllers whose own timer
                # is due run: a controller with nothing due and nothing changed would only read.
                delay = self._pass(everyone=changed, rules_changed=rules_changed)
                spent = time.monotonic() - started
                real = MAX_IDLE_REAL if delay is None else self.clock.real_seconds(delay)
                real = min(MAX_IDLE_REAL, max(MIN_SLEEP_REAL, real))
                try:
                    await asyncio.wait_for(wake.wait(), timeout=real)
                except TimeoutError:
                    pass
                wake.clear()
                rested = time.monotonic() - started - spent
                rest = min(MAX_REST_REAL, spent * PASS_REST_RATIO) - rested
                await asyncio.sleep(max(DEBOUNCE_REAL, rest))
        finally:
            if self._unsubscribe is not None:
                self._unsubscribe()
            notifier.cancel()
            try:
                await notifier
            except (asyncio.CancelledError, Exception):
                pass

    def _pass(self, everyone: bool, rules_changed: bool = False) -> float | None:
        """One pass of the controllers that are due (all of them with `everyone`; with
        `rules_changed`, the ones that read DeviceTaintRules too)."""
        with self._pass_lock:
            self.passes += 1
            now = self.clock.monotonic()
            earliest: float | None = None
            for controller in self.controllers:
                due = self._due.get(id(controller))
                woken = everyone or (rules_changed and controller in self.rule_readers)
                if not woken and id(controller) in self._due and (due is None or due > now):
                    wanted = None if due is None else due - now  # not due, nothing changed
                else:
                    ctx = SyncContext(self)
                    try:
                        wanted = controller.sync(ctx)
                    except Exception:
                        log.exception("controller %s failed", type(controller).__name__)
                        wanted = 1.0  # retry soon rather than never
                    if wanted is not None:
                        wanted = max(0.0, wanted)
                    self._due[id(controller)] = None if wanted is None else now + wanted
                if wanted is not None:
                    earliest = wanted if earliest is None else min(earliest, wanted)
            return earliest

    def run_once(self) -> float | None:
        """One pass of every controller (thread-safe). Returns the earliest timer, if any."""
        return self._pass(everyone=True)

    def settle(self, max_passes: int = 200) -> None:
        """Run passes until nothing changes (unit tests with a ManualClock)."""
        for _ in range(max_passes):
            before = self.store.resource_version
            self.run_once()
            if self.store.resource_version == before:
                return
        raise RuntimeError("controllers did not settle")


# --------------------------------------------------------------------------------------------
# `sickbay-dev twin up` extension hooks (twin/cli.py calls these; see its docstring)
# --------------------------------------------------------------------------------------------


def add_twin_up_arguments(parser: Any) -> None:
    """Flags of `sickbay-dev twin up` for the controllers, the clock, faults and alerts."""
    import os

    group = parser.add_argument_group("controllers, faults and alerts")
    group.add_argument(
        "--time-scale",
        type=float,
        default=1.0,
        help="simulated seconds per real second (60: a 5-minute grace period takes 5 s)",
    )
    group.add_argument(
        "--alert-webhook", default=None, help="post Alertmanager webhook payloads to this URL"
    )
    group.add_argument(
        "--alert-token",
        default=os.environ.get("SICKBAY_TWIN_ALERT_TOKEN"),
        help="bearer token for the alert webhook (env SICKBAY_TWIN_ALERT_TOKEN)",
    )
    group.add_argument(
        "--alert-group-wait",
        type=float,
        default=TwinOptions.alert_group_wait,
        help="simulated seconds before a new alert group is first sent (Alertmanager: 30)",
    )
    group.add_argument(
        "--alert-group-interval",
        type=float,
        default=TwinOptions.alert_group_interval,
        help="simulated seconds between sends of a changed group (Alertmanager: 300)",
    )
    group.add_argument(
        "--alert-repeat-interval",
        type=float,
        default=TwinOptions.alert_repeat_interval,
        help="simulated seconds before an unchanged firing group is sent again",
    )
    group.add_argument(
        "--provisioning-delay",
        type=float,
        default=TwinOptions.provisioning_delay,
        help="simulated seconds until a node added to a pool registers",
    )
    group.add_argument(
        "--node-startup-seconds",
        type=float,
        default=TwinOptions.node_startup_seconds,
        help="simulated seconds a replaced node stays NotReady with no GPU published "
        "(kubelet and GPU driver starting; 0: Ready with its GPUs at once)",
    )
    group.add_argument(
        "--ignore-device-taint-rules",
        action="store_true",
        help="known fault kubernetes#139651: the scheduler ignores DeviceTaintRules",
    )
    group.add_argument(
        "--expired-toleration-bug",
        action="store_true",
        help="known fault: an expired NoExecute toleration still gets a tainted device",
    )
    group.add_argument(
        "--no-controllers",
        action="store_true",
        help="serve the API only (no scheduler, kubelet, faults or alerts)",
    )


def make_clock(args: Any) -> Clock | None:
    scale = getattr(args, "time_scale", None)
    return Clock(time_scale=scale) if scale else None


def options_from_args(args: Any) -> TwinOptions:
    options = TwinOptions()
    options.alert_webhook = getattr(args, "alert_webhook", None)
    options.alert_token = getattr(args, "alert_token", None)
    options.alert_group_wait = float(getattr(args, "alert_group_wait", options.alert_group_wait))
    options.alert_group_interval = float(
        getattr(args, "alert_group_interval", options.alert_group_interval)
    )
    options.alert_repeat_interval = float(
        getattr(args, "alert_repeat_interval", options.alert_repeat_interval)
    )
    options.provisioning_delay = float(
        getattr(args, "provisioning_delay", options.provisioning_delay)
    )
    options.node_startup_seconds = float(
        getattr(args, "node_startup_seconds", options.node_startup_seconds)
    )
    options.ignore_device_taint_rules = bool(getattr(args, "ignore_device_taint_rules", False))
    options.expired_toleration_bug = bool(getattr(args, "expired_toleration_bug", False))
    return options


def configure_twin(twin: Any, args: Any) -> ControllerManager | None:
    """Attach the controller manager (before start, so the cloud API can find node pools)."""
    if getattr(args, "no_controllers", False):
        return None
    manager = ControllerManager(options_from_args(args))
    manager.attach(twin)
    twin.add_controller(manager)
    return manager
