"""The Temporal worker process (`sickbay worker`): the one WORKFLOWS / ACTIVITIES registration.

- `WORKFLOWS`: every workflow type Sickbay runs: the remediation, budget, maintenance,
  rejections, pool-scaler (`workflows.pool_scaler`), health-sweep (`workflows.sweep`) and
  node-incident (`workflows.node_incident`) workflows.
- `build_activities(client, settings)` builds each activity class once from `Settings`
  (Kubernetes from `activities.kube`, cloud from `activities.cloud`, notifications from
  `activities.notify`, the sweep, capacity requests, budget leases, launches, runbooks) and
  returns their activity callables; `missing_activities()` names every activity a registered
  workflow calls that nobody provides, and the worker refuses to start, listing them.
- `build_worker(client, settings)`: a `SickbayWorker`, the remediation-queue worker plus
  small workers for the budget's and the GPU ledger's own queues (`budget_task_queue`,
  `ledger_task_queue`), run together.
- `run_worker(settings)`: registers search attributes (or prints exactly what to run where
  the server does not allow it), serves Prometheus metrics on `Settings.metrics_port` (the
  SDK's own plus the workflows' `sickbay_*` counters and time-to-quarantine / time-to-recovery
  histograms, emitted replay-safely through the workflow metric meter), installs the sweep
  Schedule, and shuts down gracefully on SIGINT/SIGTERM. Before polling it checks that every
  channel and provider the runbooks name is configured (`check_integrations`: refuses to
  start, exit 8, or starts degraded with SICKBAY_ALLOW_UNCONFIGURED_INTEGRATIONS); while
  polling it serves `GET /healthz` on SICKBAY_HEALTH_PORT (worker/health.py).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import signal
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

from temporalio.client import Client
from temporalio.runtime import PrometheusConfig, Runtime, TelemetryConfig
from temporalio.worker import UnsandboxedWorkflowRunner, Worker
from temporalio.worker.workflow_sandbox import SandboxedWorkflowRunner

from activities.actors import ActorActivities
from activities.budget_client import BudgetActivities
from activities.capacity import CapacityActivities
from activities.cloud import CloudActivities
from activities.cloud.config import CloudConfig
from activities.cloud.machines import MachineActivities
from activities.defn import name_of
from activities.kube import KubeActivities
from activities.kube.client import Kube, KubeError
from activities.kube.events import report_pause as post_pause_event
from activities.kube.events import report_runbooks_invalid
from activities.kube.node_diagnosis import NodeIncidentActivities
from activities.kube.repair_activities import KubeRepairActivities
from activities.kube.repair_jobs import RepairConfig
from activities.launch import LaunchActivities
from activities.ledger import LedgerActivities
from activities.maintenance import MaintenanceActivities
from activities.node_launch import NodeLaunchActivities
from activities.notify.activities import NotifyActivities
from activities.notify.config import ChannelsConfig
from activities.runbooks import RunbookActivities
from activities.sweep import SweepActivities
from contract.activity import Activity
from contract.failover import (
    NONSTICKY_TO_STICKY_POLLS,
    STICKY_SCHEDULE_TO_START,
    WORKFLOW_TASK_POLLS,
)
from contract.names import (
    WF_BUDGET,
    WF_GPU_LEDGER,
    WF_MAINTENANCE,
    WF_NODE_INCIDENT,
    WF_POOL_SCALER,
    WF_REJECTIONS,
    WF_REMEDIATE,
    WF_SWEEP,
    budget_task_queue,
    budget_workflow_id,
    ledger_task_queue,
    ledger_workflow_id,
)
from worker import slots
from worker.cluster import check_cluster_unique, kube_fingerprint, worker_identity
from worker.cluster_name import ClusterNameError, settle_worker_cluster
from worker.gauges import report_open_remediations, report_pause
from worker.identity import SenderIdentityRunner
from worker.schedules import ensure_sweep_schedule
from worker.settings import Settings
from worker.watcher import build_health_watcher
from workflows import budget, ledger, maintenance, pool_scaler, sweep
from workflows.budget import BudgetWorkflow
from workflows.identity import SenderIdentityInterceptor
from workflows.ledger import GpuLedgerWorkflow
from workflows.maintenance import MaintenanceWorkflow
from workflows.node_incident import calls as node_incident_calls
from workflows.node_incident.workflow import NodeIncidentWorkflow
from workflows.pool_scaler import PoolScalerWorkflow
from workflows.rejections import RejectionsWorkflow
from workflows.remediation import REQUIRED_ACTIVITIES as REMEDIATION_ACTIVITIES
from workflows.remediation import DeviceRemediationWorkflow
from workflows.sweep import HealthSweepWorkflow

log = logging.getLogger(__name__)
# Warm-up reads a few Kubernetes objects; an API server slower than this is left to the first
# remediation (the caches fill on demand), so a slow cluster never delays polling much.
WARM_UP_TIMEOUT = 15.0  # seconds


# Every workflow type by the name it is defined with (`@workflow.defn(name=...)`; the
# registration test holds the two together).
WORKFLOW_NAMES: dict[type, str] = {
    DeviceRemediationWorkflow: WF_REMEDIATE,
    BudgetWorkflow: WF_BUDGET,
    MaintenanceWorkflow: WF_MAINTENANCE,
    RejectionsWorkflow: WF_REJECTIONS,
    PoolScalerWorkflow: WF_POOL_SCALER,
    HealthSweepWorkflow: WF_SWEEP,
    GpuLedgerWorkflow: WF_GPU_LEDGER,
    NodeIncidentWorkflow: WF_NODE_INCIDENT,
}
WORKFLOWS: list[type] = list(WORKFLOW_NAMES)


def _names(declarations: tuple[Activity[Any, Any], ...]) -> tuple[str, ...]:
    return tuple(decl.name for decl in declarations)


# Activities each workflow type calls; the worker refuses to start when one is missing. Each
# list is the activity declarations (contract.activity) the workflow's modules import to call.
REQUIRED: dict[str, tuple[str, ...]] = {
    WF_REMEDIATE: _names(REMEDIATION_ACTIVITIES),  # workflows/remediation/calls.py
    WF_BUDGET: _names(budget.REQUIRED_ACTIVITIES),
    WF_GPU_LEDGER: _names(ledger.REQUIRED_ACTIVITIES),
    WF_MAINTENANCE: _names(maintenance.REQUIRED_ACTIVITIES),
    WF_POOL_SCALER: _names(pool_scaler.REQUIRED_ACTIVITIES),
    WF_SWEEP: _names(sweep.REQUIRED_ACTIVITIES),
    WF_NODE_INCIDENT: _names(node_incident_calls.REQUIRED_ACTIVITIES),
}


def activity_name(fn: Callable[..., Any]) -> str | None:
    """The name `activities.defn.implements` recorded (every product activity implements its
    declaration with it)."""
    return name_of(fn)


def activities_of(obj: Any) -> list[Callable[..., Any]]:
    """Every `@activity.defn` method of an activity-class instance."""
    out = []
    for attr in dir(type(obj)):
        if attr.startswith("__"):
            continue
        fn = getattr(obj, attr, None)
        if callable(fn) and activity_name(fn) is not None:
            out.append(fn)
    return out


def workflow_name(wf: type) -> str:
    return WORKFLOW_NAMES[wf]


def missing_activities(
    workflows: list[type], activities: list[Callable[..., Any]]
) -> dict[str, list[str]]:
    have = {activity_name(a) for a in activities}
    missing: dict[str, list[str]] = {}
    for wf in workflows:
        gaps = [a for a in REQUIRED.get(workflow_name(wf), ()) if a not in have]
        if gaps:
            missing[workflow_name(wf)] = gaps
    return missing


@dataclass
class Built:
    activities: list[Callable[..., Any]]
    closers: list[Callable[[], Any]] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    # Run once before polling (best effort): per-worker caches such as Kubernetes discovery.
    warmers: list[Callable[[], Any]] = field(default_factory=list)
    kube: Any = None  # the Kubernetes client (activities.kube.Kube), for the health watcher
    # The cluster's fingerprint (worker/cluster.py), read through the Kubernetes client.
    fingerprint: Callable[[], str] | None = None


def build_activities(client: Client, settings: Settings, *, kube_activities: Any = None) -> Built:
    """Every activity, each class built once from the settings."""
    runbooks = RunbookActivities(settings.runbooks_dir, settings.repair_allowlist)
    runbooks.current()  # invalid runbooks stop the worker here, with file:line errors
    built = Built(
        activities=[
            runbooks.load_runbooks,
            # Verified actors: checks the actions endpoint's signatures (contract/actors.py).
            *activities_of(ActorActivities(settings.actions_key_bytes())),
            *activities_of(LaunchActivities(client, settings.task_queue, settings.cluster)),
            *activities_of(NodeLaunchActivities(client, settings.task_queue, settings.cluster)),
            *activities_of(
                BudgetActivities(
                    client,
                    settings.task_queue,
                    workflow_id=budget_workflow_id(settings.task_queue, settings.cluster),
                )
            ),
            *activities_of(
                LedgerActivities(
                    client,
                    settings.task_queue,
                    workflow_id=ledger_workflow_id(settings.task_queue, settings.cluster),
                )
            ),
        ]
    )
    kube = (
        kube_activities if kube_activities is not None else KubeActivities(settings.kube_settings())
    )
    built.kube = kube.kube
    # A bad runbook edit after start-up: a Warning Event on the runbooks ConfigMap.
    runbooks.on_invalid = functools.partial(
        report_runbooks_invalid, kube.kube, settings.watch.watch_namespace
    )
    built.activities += activities_of(kube)
    built.closers.append(kube.close)
    built.warmers.append(kube.warm_up)
    built.fingerprint = functools.partial(kube_fingerprint, kube.kube)
    built.activities += activities_of(MaintenanceActivities(kube.kube, client))
    built.activities += activities_of(SweepActivities(kube.kube))
    # Pool scalers run on the worker's own queue, one per (Sickbay cluster, pool).
    capacity = CapacityActivities(client, settings.task_queue, cluster=settings.cluster)
    built.activities += activities_of(capacity)
    cloud_config = settings.cloud.cloud_config()
    cloud = CloudActivities(cloud_config, kube_api=kube.kube.api_client)
    built.activities += activities_of(cloud)
    built.closers.append(cloud.aclose)
    _add_repair_activities(
        built,
        kube.kube,
        RepairConfig(namespace=settings.repair_namespace, allowlist=settings.repair_allowlist),
        cloud_config,
    )
    # Channels from SICKBAY_CHANNELS_FILE (none when unset); links to the Temporal Web UI.
    notify = NotifyActivities(
        ChannelsConfig.load(settings.channels_file), ui_url=settings.temporal_ui_url
    )
    built.activities += activities_of(notify)
    built.closers.append(notify.aclose)
    # One registration per name: the first provider wins (core before optional modules).
    seen: set[str | None] = set()
    unique = []
    for fn in built.activities:
        name = activity_name(fn)
        if name not in seen:
            seen.add(name)
            unique.append(fn)
    built.activities = unique
    return built


def _add_repair_activities(
    built: Built, kube: Kube, config: RepairConfig, cloud: CloudConfig
) -> None:
    """The repair ladder's rungs: the GPU rungs on the Kubernetes client (Jobs in the repair
    namespace, images from the allowlist), the node rungs through the providers
    `machine_providers` builds from the cloud config."""
    repair = KubeRepairActivities(kube, config)
    built.activities += repair.all()
    built.closers.append(repair.close)
    node = NodeIncidentActivities(kube)  # the node incident (workflows/node_incident/)
    built.activities += node.all()
    built.closers.append(node.close)
    machines = MachineActivities.from_config(cloud, kube.api_client)
    built.activities += machines.all()
    built.closers.append(machines.aclose)


class SickbayWorker:
    """The remediation-queue worker and the budget- and ledger-queue workers, run and stopped
    together.

    The budget and GPU ledger workflows poll their own queues (`budget_task_queue`,
    `ledger_task_queue`), so their update tasks never wait for a workflow-task poller busy with
    remediations. Used like a `Worker`: `run()`, `shutdown()`, `async with`, `task_queue` (the
    remediation queue).
    """

    def __init__(self, main: Worker, budget: Worker, ledger: Worker) -> None:
        self.main = main
        self.budget = budget
        self.ledger = ledger
        self._running: asyncio.Task[None] | None = None

    @property
    def task_queue(self) -> str:
        return self.main.task_queue

    @property
    def workers(self) -> tuple[Worker, Worker, Worker]:
        return (self.main, self.budget, self.ledger)

    async def run(self) -> None:
        """Until shutdown; if one worker stops with an error, the others are shut down too."""
        runs = [asyncio.ensure_future(w.run()) for w in self.workers]
        try:
            await asyncio.wait(runs, return_when=asyncio.FIRST_COMPLETED)
        finally:
            await self._stop(return_exceptions=True)
            results = await asyncio.gather(*runs, return_exceptions=True)
        for result in results:
            if isinstance(result, BaseException) and not isinstance(result, asyncio.CancelledError):
                raise result

    async def shutdown(self) -> None:
        await self._stop(return_exceptions=False)

    async def _stop(self, *, return_exceptions: bool) -> None:
        """The remediation queue's worker first, the budget's and the ledger's once it is done:
        its remediations still inside a lease or a ledger record (local activities waiting on
        an update) get their answer from this process's budget and ledger pollers, instead of
        running into the graceful-shutdown timeout with nobody polling those queues."""
        try:
            await self.main.shutdown()
        except Exception:
            if not return_exceptions:
                raise
        finally:  # stopped even when the first stop failed
            await asyncio.gather(
                self.budget.shutdown(), self.ledger.shutdown(), return_exceptions=return_exceptions
            )

    async def __aenter__(self) -> SickbayWorker:
        self._running = asyncio.create_task(self.run())
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.shutdown()
        if self._running is not None:
            await self._running


# The budget queue carries one workflow (a few updates per remediation) and its reconcile
# activity: two workflow-task pollers (the SDK's minimum with a sticky queue) and one
# activity poller are plenty, and a small cache since there is one budget per queue. The
# ledger queue is sized the same (one workflow, no activities).
BUDGET_WORKFLOW_POLLS = 2
BUDGET_ACTIVITY_POLLS = 1
BUDGET_CACHED_WORKFLOWS = 10


async def build_worker(
    client: Client,
    settings: Settings,
    *,
    kube_activities: Any = None,
    built: Built | None = None,
    identity: str | None = None,
) -> SickbayWorker:
    """The production workers for `settings.task_queue` (and its budget queue); raises
    RuntimeError naming every activity a registered workflow needs but nothing provides."""
    built = built or build_activities(client, settings, kube_activities=kube_activities)
    missing = missing_activities(WORKFLOWS, built.activities)
    if missing:
        lines = [f"  {wf}: {', '.join(names)}" for wf, names in missing.items()]
        raise RuntimeError(
            "refusing to start: workflows call activities nothing registers:\n" + "\n".join(lines)
        )
    return sickbay_workers(client, settings, built, identity)


def sickbay_workers(
    client: Client, settings: Settings, built: Built, identity: str | None = None
) -> SickbayWorker:
    """The remediation queue's worker and the budget's and the ledger's, unchecked (tests
    with fake activities; `build_worker` checks the activities first)."""
    budget = _single_workflow_worker(
        client, settings, built, identity, budget_task_queue, BudgetWorkflow, WF_BUDGET
    )
    ledger = _single_workflow_worker(
        client,
        settings,
        built,
        identity,
        ledger_task_queue,
        GpuLedgerWorkflow,
        WF_GPU_LEDGER,
        **sender_identity_options(),
    )
    return SickbayWorker(_main_worker(client, settings, built, identity), budget, ledger)


def _single_workflow_worker(
    client: Client,
    settings: Settings,
    built: Built,
    identity: str | None,
    queue_of: Callable[[str], str],
    workflow_cls: type,
    workflow_name: str,
    **options: Any,
) -> Worker:
    """The Worker of a queue that serves one workflow (the budget, the GPU ledger), sized for
    it, with the activities that workflow calls."""
    return Worker(
        client,
        task_queue=queue_of(settings.task_queue),
        workflows=[workflow_cls],
        activities=[fn for fn in built.activities if activity_name(fn) in REQUIRED[workflow_name]],
        max_concurrent_workflow_task_polls=BUDGET_WORKFLOW_POLLS,
        max_concurrent_activity_task_polls=BUDGET_ACTIVITY_POLLS,
        max_cached_workflows=BUDGET_CACHED_WORKFLOWS,
        sticky_queue_schedule_to_start_timeout=STICKY_SCHEDULE_TO_START,
        graceful_shutdown_timeout=timedelta(seconds=settings.graceful_shutdown_seconds),
        identity=identity,
        **options,
    )


def sender_identity_options() -> dict[str, Any]:
    """Worker options that let signal and update handlers read the Temporal client identity
    the server recorded (`workflows/identity.py`): the timeline shows it beside the claimed
    actor of an abort, a repaired mark or an approval."""
    return {
        "workflow_runner": SenderIdentityRunner(SandboxedWorkflowRunner()),
        "unsandboxed_workflow_runner": SenderIdentityRunner(UnsandboxedWorkflowRunner()),
        "interceptors": [SenderIdentityInterceptor()],
    }


def _main_worker(
    client: Client, settings: Settings, built: Built, identity: str | None = None
) -> Worker:
    # BudgetWorkflow and GpuLedgerWorkflow stay registered here: one started on the
    # remediation queue keeps running on this one until its next continue-as-new moves it to
    # its own queue.
    return Worker(
        client,
        task_queue=settings.task_queue,
        workflows=WORKFLOWS,
        activities=built.activities,
        # Sync activities (runbook loading) run here; Kubernetes calls use their own pool.
        activity_executor=ThreadPoolExecutor(
            max_workers=settings.max_concurrent_activities, thread_name_prefix="sickbay-act"
        ),
        # Long waits (a watch for a GPU's pods to leave, a held capacity request) have slots
        # of their own beside the short activities' (worker/slots.py).
        tuner=slots.tuner(
            workflow_tasks=settings.max_concurrent_workflow_tasks,
            activities=settings.max_concurrent_activities,
            open_waits=settings.max_open_waits,
            local_activities=settings.max_concurrent_local_activities,
        ),
        max_cached_workflows=settings.max_cached_workflows,
        # Half the pollers on the shared queue: a burst's first tasks and a dead worker's
        # tasks wait there (contract/failover.py).
        max_concurrent_workflow_task_polls=WORKFLOW_TASK_POLLS,
        nonsticky_to_sticky_poll_ratio=NONSTICKY_TO_STICKY_POLLS,
        sticky_queue_schedule_to_start_timeout=STICKY_SCHEDULE_TO_START,
        graceful_shutdown_timeout=timedelta(seconds=settings.graceful_shutdown_seconds),
        identity=identity,
        **sender_identity_options(),
    )


def _start_health_watcher(
    client: Client, settings: Settings, built: Built, stop: asyncio.Event
) -> asyncio.Task[None] | None:
    """The health watcher (worker.watcher) beside the worker, unless SICKBAY_WATCH_ENABLED=false
    or there is no Kubernetes client."""
    kube = built.kube
    if kube is None:
        return None
    if not settings.watch.watch_enabled:
        log.info("health watcher disabled (SICKBAY_WATCH_ENABLED=false): the sweep detects")
        return None
    watcher = build_health_watcher(client, settings, kube)

    def ended(task: asyncio.Task[None]) -> None:
        if not task.cancelled() and task.exception() is not None:
            # Detection falls back to the sweep and alerts; say so loudly.
            log.error(
                "the health watcher stopped: %r; only the sweep and alerts detect now",
                task.exception(),
            )

    log.info(
        "health watcher: Lease %s/%s as %s",
        watcher.config.namespace,
        watcher.config.lease_name,
        watcher.config.identity,
    )
    task = asyncio.create_task(watcher.run(stop))
    task.add_done_callback(ended)
    return task


# Buckets of Sickbay's duration histograms, in seconds: from a fast quarantine (well under a
# second) to a recovery that waited for a new node (minutes) or a person (hours).
DURATION_BUCKETS: tuple[float, ...] = (
    0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600, 1200, 1800, 3600, 7200, 14400,
    28800, 86400,
)  # fmt: skip
DURATION_HISTOGRAMS = ("sickbay_time_to_quarantine_seconds", "sickbay_time_to_recovery_seconds")


def _start_health(
    client: Client,
    settings: Settings,
    identity: str,
    run: asyncio.Task[None],
    stop: asyncio.Event,
) -> tuple[asyncio.Task[None] | None, Any]:
    """`GET /healthz` on SICKBAY_HEALTH_PORT: 200 only while this worker polls Temporal
    (worker/health.py), and the task that checks it. Off when the port is 0."""
    from worker import health

    if settings.health_port <= 0:
        return None, None
    state = health.PollingHealth(settings.health_stale_seconds)
    server = health.serve(state, settings.metrics_host, settings.health_port)
    task = asyncio.create_task(
        health.monitor(
            client,
            settings.task_queue,
            identity,
            lambda: not run.done(),
            state,
            settings.health_interval_seconds,
            stop,
        )
    )
    log.info("health: http://%s:%s/healthz", settings.metrics_host, settings.health_port)
    return task, server


UNCONFIGURED_GAUGE = "sickbay_unconfigured_integrations"


def check_integrations(settings: Settings, kube_api: Any, runtime: Runtime | None = None) -> bool:
    """Every channel and provider the runbooks name is configured (worker/integrations.py).
    False: the worker must not start (each problem logged on one ERROR line naming the
    runbook, the channel or provider and the setting to fix). With
    SICKBAY_ALLOW_UNCONFIGURED_INTEGRATIONS it starts degraded: each problem at WARNING and
    the count, per kind, in the gauge `sickbay_unconfigured_integrations` (0 when none)."""
    from activities.runbooks import load_dir
    from worker.integrations import load_and_check

    problems = load_and_check(load_dir(settings.runbooks_dir).runbooks, settings, kube_api)
    meter = (runtime or Runtime.default()).metric_meter
    gauge = meter.create_gauge(
        UNCONFIGURED_GAUGE,
        "Channels and providers runbooks name that this worker has not configured "
        "(non-zero only when started degraded: SICKBAY_ALLOW_UNCONFIGURED_INTEGRATIONS)",
    )
    for kind in ("channel", "provider"):
        gauge.set(sum(p.kind == kind for p in problems), {"kind": kind})
    if not problems:
        return True
    if not settings.allow_unconfigured_integrations:
        for problem in problems:
            log.error(
                "refusing to start: %s (or set SICKBAY_ALLOW_UNCONFIGURED_INTEGRATIONS=true to "
                "start degraded)",
                problem.line(),
            )
        return False
    for problem in problems:
        log.warning(
            "starting DEGRADED (SICKBAY_ALLOW_UNCONFIGURED_INTEGRATIONS): %s", problem.line()
        )
    return True


def metrics_runtime(port: int, host: str = "127.0.0.1") -> Runtime | None:
    """A Temporal runtime exporting SDK + workflow metrics for Prometheus on `host:port`, by
    the Prometheus conventions: counters end in `_total`, durations are in seconds."""
    if port <= 0:
        return None
    address = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"  # IPv6 in brackets
    return Runtime(
        telemetry=TelemetryConfig(
            metrics=PrometheusConfig(
                bind_address=address,
                counters_total_suffix=True,
                durations_as_seconds=True,
                histogram_bucket_overrides=dict.fromkeys(DURATION_HISTOGRAMS, DURATION_BUCKETS),
            ),
        )
    )


async def run_worker(settings: Settings) -> int:
    from worker.security import configured_token_problem
    from worker.temporal import connect, ensure_search_attributes, freeze_startup_heap

    problem = configured_token_problem(settings.webhook)
    if problem is not None:  # a weak webhook token in the shared settings: stop the deployment
        log.error("refusing to start: %s", problem)
        return 2
    runtime = metrics_runtime(settings.metrics_port, settings.metrics_host)
    if runtime is not None:
        # The default runtime serves every client this process makes, so connect() uses it.
        Runtime.set_default(runtime, error_if_already_set=False)
    client = await connect(settings)
    try:
        added = await ensure_search_attributes(client, settings.temporal_namespace)
        if added:
            log.info("registered search attributes %s", added)
    except RuntimeError as exc:
        # Temporal Cloud / restricted namespace: say exactly what to run, then stop - without
        # the attributes every remediation's first upsert would fail its workflow task.
        log.error("%s", exc)
        return 3
    try:
        kube_activities = KubeActivities(settings.kube_settings())
    except Exception as exc:  # any configuration problem: report, then stop
        log.error("cannot build the activities: %s: %s", type(exc).__name__, exc)
        return 5
    try:  # the recorded cluster name (worker/cluster_name.py), before any id is made
        settings = await settle_worker_cluster(settings, kube_activities.kube)
    except (ClusterNameError, KubeError) as exc:
        log.error("cannot settle the cluster name: %s", exc)
        kube_activities.close()
        return 7
    try:
        built = build_activities(client, settings, kube_activities=kube_activities)
    except Exception as exc:  # any configuration problem: report, then stop
        log.error("cannot build the activities: %s: %s", type(exc).__name__, exc)
        return 5
    # After build_activities: the runbooks are valid (file:line errors were said there).
    if not check_integrations(settings, kube_activities.kube.api_client, runtime):
        for close in built.closers:
            result = close()
            if asyncio.iscoroutine(result):
                await result
        return 8
    for note in built.notes:
        log.warning("%s", note)
    if settings.cluster:
        log.info("cluster %s: task queue %s", settings.cluster, settings.task_queue)
    else:
        log.warning(
            "the unnamed cluster: single-cluster ids (sickbay-gpu-..., sickbay-budget, "
            "queue %s). Migrate to a named cluster before a second cluster shares this "
            "Temporal namespace (docs/deploy.md, 'Many clusters on one Temporal')",
            settings.task_queue,
        )
    fingerprint = "unknown"
    if built.fingerprint is not None:
        try:
            fingerprint = await asyncio.to_thread(built.fingerprint)
        except Exception as exc:  # RBAC or API trouble: the start-up check cannot run
            log.warning("cannot read the cluster fingerprint (kube-system uid): %s", exc)
    problem = await check_cluster_unique(client, settings.task_queue, settings.cluster, fingerprint)
    if problem is not None:
        log.error("%s", problem)
        return 6
    identity = worker_identity(settings.cluster, fingerprint)
    try:
        worker = await build_worker(client, settings, built=built, identity=identity)
    except RuntimeError as exc:
        log.error("%s", exc)
        return 4
    for warm in built.warmers:
        try:
            await asyncio.wait_for(warm(), timeout=WARM_UP_TIMEOUT)
        except Exception as exc:  # the first remediation then pays for it; never fatal
            log.warning("warm-up %s failed: %s: %s", warm, type(exc).__name__, exc)
    log.info("start-up heap frozen: %d objects out of full collections", freeze_startup_heap())
    if any(workflow_name(w) == WF_SWEEP for w in WORKFLOWS):
        try:
            log.info("sweep schedule: %s", await ensure_sweep_schedule(client, settings))
        except Exception as exc:
            log.warning("could not install the sweep schedule: %s", exc)

    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        with contextlib.suppress(NotImplementedError):
            loop.add_signal_handler(sig, stop.set)
    log.info(
        "worker polling %s (+ %s, %s) on %s/%s (%d workflows, %d activities, metrics %s:%s)",
        settings.task_queue,
        budget_task_queue(settings.task_queue),
        ledger_task_queue(settings.task_queue),
        settings.temporal_address,
        settings.temporal_namespace,
        len(WORKFLOWS),
        len(built.activities),
        settings.metrics_host,
        settings.metrics_port or "off",
    )
    run = asyncio.create_task(worker.run())
    watcher_task = _start_health_watcher(client, settings, built, stop)
    gauges = asyncio.create_task(report_open_remediations(client, settings.cluster, stop))
    budget_id = budget_workflow_id(settings.task_queue, settings.cluster)
    # `sickbay pause`: the gauge, and an Event on ConfigMap sickbay-cluster per pause/resume.
    pause_task = asyncio.create_task(
        report_pause(
            client,
            budget_id,
            settings.cluster,
            stop,
            on_record=functools.partial(
                post_pause_event, built.kube, settings.watch.watch_namespace, budget_id=budget_id
            )
            if built.kube is not None
            else None,
        )
    )
    health_task, health_server = _start_health(client, settings, identity, run, stop)
    stopper = asyncio.create_task(stop.wait())
    await asyncio.wait({run, stopper}, return_when=asyncio.FIRST_COMPLETED)
    if stopper.done():
        log.info(
            "stopping: waiting up to %ss for running activities", settings.graceful_shutdown_seconds
        )
        await worker.shutdown()
    stopper.cancel()
    stop.set()
    if watcher_task is not None:
        # Releases its Lease, so a standby replica takes over at once.
        await asyncio.gather(watcher_task, return_exceptions=True)
    await asyncio.gather(gauges, pause_task, return_exceptions=True)
    if health_task is not None:
        await asyncio.gather(health_task, return_exceptions=True)
    if health_server is not None:
        await asyncio.to_thread(health_server.shutdown)
    with contextlib.suppress(asyncio.CancelledError):
        await run
    for close in built.closers:
        result = close()
        if asyncio.iscoroutine(result):
            await result
    log.info("worker stopped")
    return 0
