"""`KubeActivities`: the workflow's hands on the cluster, one method per activity name.

Threading: every method is `async def`; the blocking `kubernetes` client calls run on this
class's own bounded ThreadPoolExecutors, never on the event loop, so the worker needs no
`activity_executor`. Short calls (the hot path: resolve, evidence, consumers, the rule) share
`KubeSettings.max_threads` threads; the long ones (the eviction and replacement waits, each
keeping a thread for its watch and heartbeating from the loop, and evict-pods, which may
retry a PDB's 429s for a minute) run on a pool of their own (`max_waits`), so a burst of open
waits never holds up the next GPU's quarantine. Built once per worker from plain settings:

    acts = KubeActivities(settings.kube_settings())     # worker.settings.Settings
    Worker(..., activities=acts.all())

Every method lets Temporal retry transient failures (429/5xx/timeouts) and raises
non-retryable ApplicationErrors for the rest (see client.py for the classification).
"""

from __future__ import annotations

import asyncio
import contextvars
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

from temporalio import activity
from temporalio.exceptions import ApplicationError

from activities.defn import implements
from activities.kube import consumers, devices, events, evidence, nodes, quarantine, waits
from activities.kube.client import ErrorKind, Kube, KubeError, KubeSettings, to_application_error
from activities.kube.discovery import ClusterApis, Discovery
from contract.capacity import KARPENTER_CAPACITY, KarpenterInput, KarpenterResult
from contract.errors import ERR_INVALID_INPUT
from contract.kube import (
    CHECK_DEVICE_HEALTH,
    CORDON_NODE,
    COUNT_DEVICES,
    EVICT_PODS,
    FIND_CONSUMERS,
    GATHER_EVIDENCE,
    PREVIEW_QUARANTINE,
    QUARANTINE_DEVICE,
    RECORD_EVENT,
    RELEASE_QUARANTINE,
    RESOLVE_DEVICE,
    WAIT_FOR_EVICTION,
    WAIT_FOR_REPLACEMENT,
    CheckHealthInput,
    ConsumersResult,
    CordonInput,
    CordonResult,
    CountDevicesInput,
    DeviceCounts,
    EvictionReport,
    EvictPodsInput,
    EvictPodsResult,
    Evidence,
    EvidenceInput,
    FindConsumersInput,
    HealthResult,
    QuarantineInput,
    QuarantineResult,
    RecordEventInput,
    ReleaseInput,
    ReleaseResult,
    ReplacementReport,
    ResolvedDevice,
    ResolveDeviceInput,
    WaitEvictionInput,
    WaitReplacementInput,
)

T = TypeVar("T")
# evict-pods heartbeats at this pace (seconds); the workflow gives it a 30 s heartbeat_timeout.
EVICT_HEARTBEAT_EVERY = 10.0


class KubeActivities:
    def __init__(
        self,
        settings: KubeSettings | None = None,
        *,
        kube: Kube | None = None,
    ) -> None:
        self._settings = settings or KubeSettings()
        self._kube = kube or Kube.from_settings(self._settings)
        self._executor = ThreadPoolExecutor(
            max_workers=self._settings.max_threads, thread_name_prefix="sickbay-kube"
        )
        self._waits = ThreadPoolExecutor(
            max_workers=max(1, self._settings.max_waits), thread_name_prefix="sickbay-wait"
        )
        self._discovery = Discovery(self._kube)

    @property
    def kube(self) -> Kube:
        return self._kube

    def all(self) -> list[Callable[..., Any]]:
        """Every activity method, for `Worker(activities=...)`."""
        return [
            self.resolve_device,
            self.gather_evidence,
            self.find_consumers,
            self.count_devices,
            self.quarantine_device,
            self.preview_quarantine,
            self.evict_pods,
            self.wait_for_eviction,
            self.wait_for_replacement,
            self.release_quarantine,
            self.check_device_health,
            self.record_event,
            self.cordon_node,
            self.karpenter_capacity,
        ]

    async def warm_up(self) -> None:
        """At worker start: API discovery (cached for the worker's life), the DeviceClass
        list (cached 5 min), and the GPU inventory and node list the budget count reads, so a
        remediation does not pay for them, and the first burst of failures after a start does
        not wait for one cluster-wide list together."""

        def body() -> None:
            apis = self._apis()
            if apis.dra:
                devices.device_classes(self._kube)
                devices.gpu_inventory(self._kube)
            devices.list_nodes(self._kube, max_age=devices.NODES_MAX_AGE)

        await self._run(body)

    def close(self) -> None:
        self._executor.shutdown(wait=False, cancel_futures=True)
        self._waits.shutdown(wait=False, cancel_futures=True)
        self._kube.api_client.close()

    # -- plumbing -------------------------------------------------------------------------

    async def _run(
        self, fn: Callable[..., T], *args: Any, heartbeat_every: float | None = None
    ) -> T:
        """Run a blocking body on the short calls' executor (activity context copied),
        mapping errors; with `heartbeat_every` (a long body), on the waits' executor,
        heartbeating from the loop at that pace until the body ends."""
        ctx = contextvars.copy_context()
        loop = asyncio.get_running_loop()
        pool = self._executor if heartbeat_every is None else self._waits
        future = loop.run_in_executor(pool, lambda: ctx.run(fn, *args))
        try:
            if heartbeat_every is None:
                return await future
            while True:
                activity.heartbeat()
                done, _ = await asyncio.wait({future}, timeout=heartbeat_every)
                if done:
                    return future.result()
        except KubeError as err:
            raise to_application_error(err) from err

    def _apis(self) -> ClusterApis:
        return self._discovery.get()

    # -- activities -----------------------------------------------------------------------

    @implements(RESOLVE_DEVICE)
    async def resolve_device(self, inp: ResolveDeviceInput) -> ResolvedDevice:
        return await self._run(lambda: devices.resolve(self._kube, self._apis(), inp.device))

    @implements(GATHER_EVIDENCE)
    async def gather_evidence(self, inp: EvidenceInput) -> Evidence:
        # A node pod list (or claim list) loaded since this step was scheduled is as fresh as
        # the step asked for: find-consumers, scheduled with it, may have read it a moment
        # before.
        fresh_since = activity.info().current_attempt_scheduled_time.timestamp()
        return await self._run(
            lambda: evidence.gather_evidence(self._kube, inp.device, fresh_since=fresh_since)
        )

    @implements(FIND_CONSUMERS)
    async def find_consumers(self, inp: FindConsumersInput) -> ConsumersResult:
        # A claim list loaded since this step was scheduled (by gather-evidence, scheduled
        # with it) is a read from the API made after the workflow asked: used, not repeated.
        fresh_since = activity.info().current_attempt_scheduled_time.timestamp()
        return await self._run(
            lambda: consumers.find_consumers(self._kube, inp, fresh_since=fresh_since)
        )

    @implements(COUNT_DEVICES)
    async def count_devices(self, inp: CountDevicesInput) -> DeviceCounts:
        return await self._run(
            lambda: quarantine.count_devices(self._kube, self._apis(), inp.node_pool, inp.node)
        )

    @implements(QUARANTINE_DEVICE)
    async def quarantine_device(self, inp: QuarantineInput) -> QuarantineResult:
        """Rule mode when DeviceTaintRule is served and the device is a DRA device; else the
        fallback. `dry_run` -> the preview (nothing is left behind)."""
        if inp.dry_run:
            return await self.preview_quarantine(inp)

        def body() -> QuarantineResult:
            apis = self._apis()
            if apis.taint_version and inp.device.devices:
                try:
                    result = quarantine.quarantine_rules(self._kube, apis, inp)
                except KubeError as err:
                    if err.kind is ErrorKind.NOT_FOUND and err.resource == quarantine.RULES:
                        # The version stopped being served (control plane changed under a
                        # running worker): re-discover on the retry.
                        self._discovery.invalidate()
                    raise
            elif inp.device.hami:
                result = quarantine.quarantine_hami(
                    self._kube, apis, inp, device_cordon=self._settings.hami_device_cordon
                )
            else:
                result = quarantine.quarantine_fallback(self._kube, apis, inp)
            activity.logger.info(
                "quarantine %s: %s (%s)", inp.device.key, result.mode, result.message
            )
            return result

        return await self._run(body)

    @implements(PREVIEW_QUARANTINE)
    async def preview_quarantine(self, inp: QuarantineInput) -> QuarantineResult:
        return await self._run(
            lambda: quarantine.preview(
                self._kube, self._apis(), inp, hami_cordon=self._settings.hami_device_cordon
            )
        )

    @implements(EVICT_PODS)
    async def evict_pods(self, inp: EvictPodsInput) -> EvictPodsResult:
        def body() -> EvictPodsResult:
            result = quarantine.evict_pods(self._kube, inp)
            activity.logger.info(
                "evict for %s: evicted=%d deleted=%d blocked=%d gone=%d",
                inp.workflow_id,
                len(result.evicted),
                len(result.deleted),
                len(result.blocked),
                len(result.gone),
            )
            return result

        # Heartbeats while the evictions run (PDB 429 retries can take a minute), so the
        # workflow's heartbeat_timeout notices a killed worker long before start-to-close.
        return await self._run(body, heartbeat_every=EVICT_HEARTBEAT_EVERY)

    @implements(WAIT_FOR_EVICTION)
    async def wait_for_eviction(self, inp: WaitEvictionInput) -> EvictionReport:
        try:
            return await waits.wait_eviction(self._kube, self._waits, inp)
        except KubeError as err:
            raise to_application_error(err) from err

    @implements(WAIT_FOR_REPLACEMENT)
    async def wait_for_replacement(self, inp: WaitReplacementInput) -> ReplacementReport:
        try:
            return await waits.wait_replacement(self._kube, self._waits, inp)
        except KubeError as err:
            raise to_application_error(err) from err

    @implements(RELEASE_QUARANTINE)
    async def release_quarantine(self, inp: ReleaseInput) -> ReleaseResult:
        def body() -> ReleaseResult:
            result = quarantine.release(self._kube, self._apis(), inp)
            activity.logger.info("release %s: %s", inp.device.key, result.message)
            return result

        return await self._run(body)

    @implements(CHECK_DEVICE_HEALTH)
    async def check_device_health(self, inp: CheckHealthInput) -> HealthResult:
        return await self._run(evidence.check_health, self._kube, inp.device)

    @implements(RECORD_EVENT)
    async def record_event(self, inp: RecordEventInput) -> None:
        """One Event per target (workflows call it with result_type=type(None))."""
        if not inp.targets:
            return
        info = activity.info()
        # Same token on every retry of this activity -> same event names -> no duplicates.
        token = f"{info.workflow_id}|{info.workflow_run_id}|{info.activity_id}"
        written = await self._run(events.record_events, self._kube, inp, token)
        activity.logger.info("recorded %d event(s) %s for %s", written, inp.reason, inp.workflow_id)

    @implements(KARPENTER_CAPACITY)
    async def karpenter_capacity(self, inp: KarpenterInput) -> KarpenterResult:
        """The Karpenter NodePool serving the node's workloads, its GPU limit raised when
        asked (activities/kube/karpenter.py)."""
        from activities.kube.karpenter import karpenter_capacity

        result = await self._run(karpenter_capacity, self._kube, inp)
        activity.logger.info("karpenter for node %s: %s", inp.node, result.message)
        return result

    @implements(CORDON_NODE)
    async def cordon_node(self, inp: CordonInput) -> CordonResult:
        if not inp.node:
            raise ApplicationError(
                "cordon needs a node name", type=ERR_INVALID_INPUT, non_retryable=True
            )

        def body() -> CordonResult:
            outcome: dict[str, str] = {}
            try:
                _, changed = nodes.converge_node(
                    self._kube, inp.node, nodes.cordon_change(inp.cordon, inp.workflow_id, outcome)
                )
            except KubeError as err:
                if err.kind is not ErrorKind.NOT_FOUND or err.resource != "nodes":
                    raise
                return CordonResult(changed=False, message=f"node {inp.node} does not exist")
            activity.logger.info("node %s: %s", inp.node, outcome.get("message", ""))
            return CordonResult(changed=changed, message=outcome.get("message", ""))

        return await self._run(body)
