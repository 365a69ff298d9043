"""Scenario scripts for `sickbay-dev demo`: each drives the embedded stack over HTTP and checks
what Sickbay did.

A scenario only *causes* things the way the real world would (a workload is deployed through
the Kubernetes API, a GPU fails through the twin's `/twin/faults` route, a person marks a GPU
repaired with the `repaired` signal); everything in between - the Alertmanager notification,
the webhook, the workflow, the DeviceTaintRule, the eviction, the scale-up - is the product
running. Each step waits for an observable result (pod phase, workflow phase, a node) with a
deadline and raises `DemoFailure` naming what did not happen.

    seed      the seed incident: GPU dies under an inference Deployment -> alert -> taint ->
              eviction -> replacement on the 2nd GPU; 2nd GPU dies -> Pending deadline ->
              node-pool scale-up -> replacement on the new node; repair -> released
    training  a training Job (pinned to the `training` runbook) moves to the healthy GPU
    vgpu      two vGPUs of one physical GPU fail together: one workflow quarantines both
    hami      HAMi vGPU (device plugin, no DRA): two pods share one GPU by HAMi's record; it
              fails: both found from HAMi's annotations, the GPU put in HAMi's per-GPU cordon
              (hami.io/device-cordon), both pods moved to the healthy GPU, node untouched; the
              cordon outlives the plugin's re-registration until the GPU is marked repaired
    budget    two GPUs fail at once under the shipped 50% budget: the 2nd is NOT tainted
    app-xid   Xid 13 (the program's fault): Event + warning, no quarantine
    churn     the scheduler ignores DeviceTaintRules (kubernetes#139651): replacements land
              on the tainted GPU again, Sickbay detects the churn, stops it (cordons the
              node) and escalates
    watch     no Alertmanager and no sweep: the health watcher sees the pod's device turn
              Unhealthy in the API and starts the remediation within seconds
    repair    the shipped repair ladder, no human step: Xid 48 -> reset -> validation ->
              released; Xid 79 -> reboot -> validation -> released; the same GPU failing
              again until its third failure in the window retires it (one RMA page)
    lemon     the repair scenario's lemon part alone

Every scenario leaves the stack as it found it (faults recovered, remediations closed,
namespace deleted), so tests can run several on one stack. What a person would do (a
`repaired` or `abort` signal, an approval, an un-retire) goes through `Demo`, which counts it:
`Demo.people` for a scenario's own steps, `Demo.cleanup_people` for the clean-up's.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, Literal, TypeVar
from urllib.parse import quote

import httpx
from temporalio.client import Client, WorkflowExecutionStatus, WorkflowHandle
from temporalio.service import RPCError

from contract.ledger import UnretireRequest, UnretireResult
from contract.names import (
    LABEL_WORKLOAD_CLASS,
    UPD_LEDGER_UNRETIRE,
    WF_REMEDIATE,
    device_workflow_id,
    ledger_workflow_id,
)
from contract.remediation import (
    AbortRequest,
    Phase,
    RemediationResult,
    RemediationStatus,
    RepairedRequest,
    TimelineEntry,
)
from harness.stack import POOL, Stack
from twin import hami
from workflows.ledger import GpuLedgerWorkflow
from workflows.remediation import DeviceRemediationWorkflow

T = TypeVar("T")

DEVICE_CLASS = "gpu.nvidia.com"  # the twin's (and NVIDIA DRA driver's) whole-GPU class
VGPU_CLASS = "vgpu.nvidia.com"  # made by the vgpu scenario, as an admin would
RESOURCE_API = "/apis/resource.k8s.io/v1"
TAINT_RULE_VERSIONS = ("v1", "v1beta2", "v1alpha3")
# How long one observable step may take, in real seconds. Most take 1-3 s; the limits allow
# for a loaded 2-core machine (the tests share it; 30 s was not enough at a load average of 11)
# without letting a stuck demo hang.
STEP_TIMEOUT = 90.0
# Waiting through a Pending deadline plus a node-pool resize (scaler batch window and polls).
SCALE_TIMEOUT = 90.0
# A repair: drain, reset Job or node reboot, validation Job, each polled every 5 s.
REPAIR_TIMEOUT = 180.0
POLL = 0.2  # seconds between looks; the twin and the dev server answer in milliseconds


class DemoFailure(RuntimeError):
    """A step did not produce the expected result in time."""


# --------------------------------------------------------------------------------------------
# Output
# --------------------------------------------------------------------------------------------


class Progress:
    """`[  12.3s] act 2/4  text` lines, elapsed from the demo's start."""

    def __init__(self, write: Callable[[str], None] = print, t0: float | None = None) -> None:
        self.write = write
        self.t0 = time.monotonic() if t0 is None else t0
        self.tag = ""

    def elapsed(self) -> float:
        return time.monotonic() - self.t0

    def __call__(self, text: str, tag: str | None = None) -> None:
        if tag is not None:
            self.tag = tag
        shown = tag if tag is not None else ""
        self.write(f"[{self.elapsed():6.1f}s] {shown:<10} {text}")


# --------------------------------------------------------------------------------------------
# The context a scenario runs in
# --------------------------------------------------------------------------------------------


@dataclass
class WatchedRemediation:
    workflow_id: str
    device: str
    title: str
    result: RemediationResult | None = None
    status: RemediationStatus | None = None  # last seen by the watcher


@dataclass
class Demo:
    stack: Stack
    client: Client
    kube: httpx.AsyncClient
    say: Progress
    incidents: list[WatchedRemediation] = field(default_factory=list)
    checks: list[str] = field(default_factory=list)
    # What a person would have done, as sent by the scenario ("repaired <workflow id>", ...):
    # `people` by a scenario's own steps, `cleanup_people` by `cleanup` leaving the stand as
    # found (a repair mark, an abort, an un-retire). A no-human scenario leaves `people` empty.
    people: list[str] = field(default_factory=list)
    cleanup_people: list[str] = field(default_factory=list)
    _watchers: list[asyncio.Task[None]] = field(default_factory=list)
    _earlier_run: dict[str, str] = field(default_factory=dict)
    _cleaning: bool = False

    @classmethod
    async def open(cls, stack: Stack, say: Progress | None = None) -> Demo:
        from worker.settings import Settings
        from worker.temporal import connect

        info = stack.info
        assert info is not None
        client = await connect(
            Settings(temporal_address=info.temporal_address, temporal_namespace=info.namespace)
        )
        # Loopback twin: answers in milliseconds; 10 s means it is gone.
        kube = httpx.AsyncClient(base_url=info.kube_url, timeout=10.0)
        return cls(stack, client, kube, say or Progress())

    async def settle(self, within: float = 3.0) -> None:
        """Let the phase watchers print their last change (they end at `closed`)."""
        if self._watchers:
            await asyncio.wait(self._watchers, timeout=within)

    async def close(self) -> None:
        for task in self._watchers:
            task.cancel()
        await asyncio.gather(*self._watchers, return_exceptions=True)
        self._watchers.clear()
        await self.kube.aclose()

    @property
    def node(self) -> str:
        assert self.stack.info is not None
        return self.stack.info.node

    def check(self, text: str) -> None:
        self.checks.append(text)
        self.say(f"ok: {text}")

    # -- waiting -----------------------------------------------------------------------------

    async def until(
        self,
        what: str,
        probe: Callable[[], Awaitable[T | None]],
        within: float = STEP_TIMEOUT,
    ) -> T:
        """Poll `probe` until it returns something truthy; DemoFailure after `within` s."""
        deadline = time.monotonic() + within
        last_error: Exception | None = None
        while time.monotonic() < deadline:
            try:
                value = await probe()
                if value:
                    return value
            except (httpx.HTTPError, RPCError, KeyError, IndexError) as err:
                last_error = err
            self.stack.check_alive()
            await asyncio.sleep(POLL)
        extra = f" (last error: {last_error})" if last_error else ""
        raise DemoFailure(f"timed out after {within:.0f} s waiting for {what}{extra}")

    # -- Kubernetes (the twin, over HTTP) ------------------------------------------------------

    async def k(self, method: str, path: str, body: Any = None, ok: tuple[int, ...] = ()) -> Any:
        response = await self.kube.request(method, path, json=body)
        if response.status_code >= 300 and response.status_code not in ok:
            raise DemoFailure(f"{method} {path} -> {response.status_code}: {response.text[:300]}")
        return response.json() if response.content else None

    async def show_events(self, namespace: str | None, selector: str) -> list[dict[str, Any]]:
        """Sickbay's Kubernetes Events as `kubectl get events` prints them (the command first),
        read from the twin with the same field selector; returns them, oldest first."""
        path = f"/api/v1/namespaces/{namespace}/events" if namespace else "/api/v1/events"
        body = await self.k("GET", f"{path}?fieldSelector={quote(selector)}")
        # In the order they were written (Sickbay stamps events with its own clock, the twin's
        # controllers with the twin's scaled one).
        items = sorted(body["items"], key=lambda e: int(e["metadata"].get("resourceVersion") or 0))
        where = f"-n {namespace}" if namespace else "-A"
        self.say(f"$ kubectl get events {where} --field-selector {selector}")
        rows: list[tuple[str, ...]] = [
            ("NAMESPACE", "LAST SEEN", "TYPE", "REASON", "OBJECT", "MESSAGE")
        ]
        for e in items:
            obj = e.get("involvedObject") or {}
            count = int(e.get("count") or 1)
            seen = (e.get("lastTimestamp") or "")[11:19] + (f" (x{count})" if count > 1 else "")
            message = str(e.get("message") or "")
            rows.append(
                (
                    e["metadata"].get("namespace", ""),
                    seen,
                    str(e.get("type", "")),
                    str(e.get("reason", "")),
                    f"{str(obj.get('kind', '')).lower()}/{obj.get('name', '')}",
                    message if len(message) <= 90 else message[:87] + "...",
                )
            )
        if namespace is not None:
            rows = [r[1:] for r in rows]  # kubectl shows NAMESPACE only with -A
        widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]) - 1)]
        for r in rows:
            self.say(
                "  "
                + "   ".join(c.ljust(w) for c, w in zip(r, widths, strict=False))
                + "   "
                + r[-1]
            )
        return items

    async def namespace(
        self, name: str, labels: dict[str, str] | None = None, device_class: str = DEVICE_CLASS
    ) -> None:
        await self.k(
            "POST",
            "/api/v1/namespaces",
            {"metadata": {"name": name, "labels": labels or {}}},
            ok=(409,),
        )
        await self.k(
            "POST",
            f"{RESOURCE_API}/namespaces/{name}/resourceclaimtemplates",
            {
                "apiVersion": "resource.k8s.io/v1",
                "kind": "ResourceClaimTemplate",
                "metadata": {"name": "one-gpu"},
                "spec": {
                    "spec": {
                        "devices": {
                            "requests": [
                                {"name": "gpu", "exactly": {"deviceClassName": device_class}}
                            ]
                        }
                    }
                },
            },
            ok=(409,),
        )

    async def delete_namespace(self, name: str) -> None:
        await self.k("DELETE", f"/api/v1/namespaces/{name}", ok=(404,))

    @staticmethod
    def pod_template(app: str, labels: dict[str, str] | None = None) -> dict[str, Any]:
        return {
            "metadata": {"labels": {"app": app, **(labels or {})}},
            "spec": {
                "containers": [
                    {
                        "name": "main",
                        "image": f"registry.invalid/{app}:demo",
                        "resources": {"claims": [{"name": "gpu"}]},
                    }
                ],
                "resourceClaims": [{"name": "gpu", "resourceClaimTemplateName": "one-gpu"}],
            },
        }

    async def deployment(
        self,
        ns: str,
        name: str,
        replicas: int = 1,
        labels: dict[str, str] | None = None,
        template: dict[str, Any] | None = None,
    ) -> None:
        """A Deployment of `pod_template(name, labels)`, or of `template` when given (its
        metadata labels must carry `app: name`)."""
        await self.k(
            "POST",
            f"/apis/apps/v1/namespaces/{ns}/deployments",
            {
                "apiVersion": "apps/v1",
                "kind": "Deployment",
                "metadata": {"name": name},
                "spec": {
                    "replicas": replicas,
                    "selector": {"matchLabels": {"app": name}},
                    "template": template or self.pod_template(name, labels),
                },
            },
        )

    async def job(self, ns: str, name: str, labels: dict[str, str] | None = None) -> None:
        template = self.pod_template(name, labels)
        # OnFailure, as training operators run their workers: a dead GPU makes the container
        # crash-loop in place (the pod keeps its claim) rather than fail the pod at once.
        template["spec"]["restartPolicy"] = "OnFailure"
        await self.k(
            "POST",
            f"/apis/batch/v1/namespaces/{ns}/jobs",
            {
                "apiVersion": "batch/v1",
                "kind": "Job",
                "metadata": {"name": name},
                "spec": {
                    "parallelism": 1,
                    "completions": 1,
                    "backoffLimit": 6,
                    "template": template,
                },
            },
        )

    async def pods(self, ns: str, app: str) -> list[dict[str, Any]]:
        body = await self.k("GET", f"/api/v1/namespaces/{ns}/pods?labelSelector=app%3D{app}")
        return [p for p in body["items"] if not p["metadata"].get("deletionTimestamp")]

    async def devices_of(self, pod: dict[str, Any]) -> list[str]:
        """Allocated devices (driver/pool/device) of a pod, from its ResourceClaims."""
        ns = pod["metadata"]["namespace"]
        out: list[str] = []
        for entry in pod.get("status", {}).get("resourceClaimStatuses") or []:
            claim_name = entry.get("resourceClaimName")
            if not claim_name:
                continue
            claim = await self.k(
                "GET", f"{RESOURCE_API}/namespaces/{ns}/resourceclaims/{claim_name}", ok=(404,)
            )
            alloc = ((claim or {}).get("status") or {}).get("allocation") or {}
            for r in (alloc.get("devices") or {}).get("results") or []:
                out.append(f"{r['driver']}/{r['pool']}/{r['device']}")
        return out

    async def running(self, ns: str, app: str, count: int = 1) -> list[tuple[dict[str, Any], str]]:
        """`count` pods of `app` Running and ready, with their device: [(pod, device)]."""

        async def probe() -> list[tuple[dict[str, Any], str]] | None:
            ready = []
            for pod in await self.pods(ns, app):
                statuses = pod.get("status", {}).get("containerStatuses") or []
                if pod.get("status", {}).get("phase") != "Running" or not all(
                    s.get("ready") for s in statuses
                ):
                    continue
                devices = await self.devices_of(pod)
                if devices:
                    ready.append((pod, devices[0]))
            return ready if len(ready) >= count else None

        return await self.until(f"{count} pod(s) of {ns}/{app} Running", probe)

    async def gpu(self, device: str) -> dict[str, Any]:
        """The twin's physical GPU (node, index, uuid) that holds `device`."""
        items = (await self.k("GET", "/twin/gpus"))["items"]
        for gpu in items:
            if any(d["resourceID"] == device for d in gpu["devices"]):
                return gpu
        raise DemoFailure(f"no GPU in the twin holds device {device}")

    async def fail(self, gpu: dict[str, Any], xid: int = 79) -> None:
        # A GPU keeps its workflow id across incidents: remember the run before this fault,
        # so `incident()` waits for the run this fault starts, not a closed earlier one.
        try:
            before = await self.handle(self.workflow_id(gpu)).describe()
            self._earlier_run[gpu["uuid"]] = before.run_id
        except RPCError:  # never remediated before
            self._earlier_run.pop(gpu["uuid"], None)
        await self.k("POST", "/twin/faults", {"node": gpu["node"], "gpu": gpu["uuid"], "xid": xid})

    async def recover(self, gpu: dict[str, Any]) -> None:
        await self.k("POST", "/twin/faults/recover", {"node": gpu["node"], "gpu": gpu["uuid"]})

    async def taint_rules(self) -> list[dict[str, Any]]:
        """Every DeviceTaintRule, through the first served version."""
        for version in TAINT_RULE_VERSIONS:
            r = await self.kube.get(f"/apis/resource.k8s.io/{version}/devicetaintrules")
            if r.status_code == 200:
                return list(r.json()["items"])
        return []

    async def taint_rule(self, name: str) -> dict[str, Any] | None:
        for version in TAINT_RULE_VERSIONS:
            r = await self.kube.get(f"/apis/resource.k8s.io/{version}/devicetaintrules/{name}")
            if r.status_code == 200:
                return r.json()
        return None

    async def nodes(self) -> list[str]:
        return [n["metadata"]["name"] for n in (await self.k("GET", "/api/v1/nodes"))["items"]]

    async def crash_looping(self, ns: str, app: str) -> dict[str, Any]:
        """Wait for the pod's restart loop with Unhealthy in its allocatedResourcesStatus."""

        async def probe() -> dict[str, Any] | None:
            for pod in await self.pods(ns, app):
                for cs in pod.get("status", {}).get("containerStatuses") or []:
                    health = [
                        r
                        for a in cs.get("allocatedResourcesStatus") or []
                        for r in a.get("resources") or []
                        if r.get("health") == "Unhealthy"
                    ]
                    if cs.get("restartCount", 0) >= 1 and health:
                        return {"pod": pod, "status": cs, "health": health[0]}
            return None

        return await self.until(f"{ns}/{app} in a restart loop with an Unhealthy GPU", probe)

    # -- Temporal -------------------------------------------------------------------------------

    def handle(self, workflow_id: str) -> WorkflowHandle[Any, Any]:
        return self.client.get_workflow_handle(workflow_id)

    def workflow_id(self, gpu: dict[str, Any]) -> str:
        assert self.stack.info is not None
        return device_workflow_id(gpu["node"], gpu["uuid"], self.stack.info.cluster)

    async def status(self, workflow_id: str) -> RemediationStatus:
        return await self.handle(workflow_id).query(DeviceRemediationWorkflow.status)

    async def incident(self, gpu: dict[str, Any], title: str) -> WatchedRemediation:
        """Wait for the device's remediation to exist and follow its phases on screen."""
        wf_id = self.workflow_id(gpu)

        earlier = self._earlier_run.get(gpu["uuid"])

        async def probe() -> bool:
            desc = await self.handle(wf_id).describe()
            return desc.workflow_type == WF_REMEDIATE and desc.run_id != earlier

        await self.until(f"remediation {wf_id} to start", probe)
        incident = WatchedRemediation(wf_id, f"{gpu['node']}/{gpu['uuid']}", title)
        self.incidents.append(incident)
        self._watchers.append(asyncio.create_task(self._watch(incident)))
        return incident

    async def _watch(self, incident: WatchedRemediation) -> None:
        """The one poller of a remediation's `status` query: prints each phase change with
        what it waits for, and caches the status for `phase()` (one query per POLL, however
        many steps wait on it, so a busy workflow is not flooded with queries)."""
        last: tuple[Phase, str] | None = None
        short = "GPU " + incident.device.split("/")[-1][:12]
        while True:
            try:
                st = await self.status(incident.workflow_id)
            except RPCError:
                await asyncio.sleep(POLL * 2)
                continue
            incident.status = st
            now = (st.phase, st.awaiting)
            if now != last:
                extra = f" - waiting for {st.awaiting}" if st.awaiting else ""
                outcome = f" ({st.outcome})" if st.outcome else ""
                self.say(f"{short}: {st.phase.value}{outcome}{extra}")
                last = now
            if st.phase is Phase.CLOSED:
                return
            await asyncio.sleep(POLL)

    async def phase(
        self, incident: WatchedRemediation, phases: set[Phase], within: float = STEP_TIMEOUT
    ) -> RemediationStatus:
        async def probe() -> RemediationStatus | None:
            st = incident.status
            if st is None:
                return None
            if st.phase is Phase.CLOSED and Phase.CLOSED not in phases:
                raise DemoFailure(
                    f"{incident.workflow_id} closed ({st.outcome}: {st.escalation_reason or ''}) "
                    f"before reaching {'/'.join(sorted(p.value for p in phases))}"
                )
            return st if st.phase in phases else None

        wanted = " or ".join(sorted(p.value for p in phases))
        return await self.until(f"{incident.workflow_id} to reach {wanted}", probe, within)

    def person(self, action: str) -> None:
        """Count one action a person would take (a signal or update the scenario sends)."""
        (self.cleanup_people if self._cleaning else self.people).append(action)

    async def repaired(self, incident: WatchedRemediation, actor: str = "sickbay-demo") -> None:
        self.person(f"repaired {incident.workflow_id}")
        await self.handle(incident.workflow_id).signal(
            DeviceRemediationWorkflow.repaired,
            RepairedRequest(actor=actor, note="GPU replaced (demo)"),
        )

    async def abort(self, incident: WatchedRemediation, reason: str) -> None:
        self.person(f"abort {incident.workflow_id}")
        await self.handle(incident.workflow_id).signal(
            DeviceRemediationWorkflow.abort, AbortRequest(reason=reason, actor="sickbay-demo")
        )

    async def unretire(self, gpu_uuid: str, reason: str) -> None:
        """`sickbay gpus unretire`: the ledger lets the GPU's remediation release it."""
        assert self.stack.info is not None
        self.person(f"unretire {gpu_uuid}")
        ledger = self.client.get_workflow_handle_for(
            GpuLedgerWorkflow.run,
            ledger_workflow_id(self.stack.info.task_queue, self.stack.info.cluster),
        )
        await ledger.execute_update(
            UPD_LEDGER_UNRETIRE,
            UnretireRequest(gpu_uuid=gpu_uuid, reason=reason, actor="sickbay-demo cleanup"),
            result_type=UnretireResult,
        )

    async def closed(
        self, incident: WatchedRemediation, within: float = STEP_TIMEOUT
    ) -> RemediationResult:
        handle = self.client.get_workflow_handle(
            incident.workflow_id, result_type=RemediationResult
        )

        async def probe() -> bool:
            desc = await handle.describe()
            return desc.status != WorkflowExecutionStatus.RUNNING

        await self.until(f"{incident.workflow_id} to close", probe, within)
        result: RemediationResult = await handle.result()
        incident.result = result
        return result

    async def timeline(self, incident: WatchedRemediation) -> list[TimelineEntry]:
        """The workflow's `timeline` query (answered by the worker, closed runs too); the
        result's copy if the query cannot be answered."""
        try:
            return await self.handle(incident.workflow_id).query(DeviceRemediationWorkflow.timeline)
        except RPCError:
            if incident.result is not None:
                return incident.result.timeline
            raise

    async def notifications(self, since: int = 0) -> list[dict[str, Any]]:
        return (await asyncio.to_thread(self.stack.notifications))[since:]

    @contextlib.asynccontextmanager
    async def scene(self, ns: str) -> AsyncIterator[None]:
        """Run a scenario's body; afterwards clean up - best effort after a failure, so one
        failing scenario does not break the next one on a shared stack."""
        try:
            yield
        except BaseException:
            try:
                await self.cleanup(ns)
            except Exception as err:  # the original failure is what matters
                self.say(f"cleanup after the failure incomplete: {err}")
            raise
        await self.cleanup(ns)

    async def cleanup(self, ns: str | None = None) -> None:
        """Recover every fault, release open remediations (un-retiring a retired GPU first),
        delete the namespace. What it sends counts in `cleanup_people`, not `people`."""
        self._cleaning = True
        try:
            await self._cleanup(ns)
        finally:
            self._cleaning = False

    async def _unretired(self, incident: WatchedRemediation) -> None:
        """Wait for the ledger's un-retire notice to reach the remediation (the update returns
        before its signal lands), so a repair mark sent next is not merely noted."""

        async def probe() -> bool:
            st = await self.status(incident.workflow_id)
            return "un-retire" not in st.awaiting

        await self.until(f"{incident.workflow_id} to hear of the un-retire", probe)

    async def _cleanup(self, ns: str | None) -> None:
        for fault in (await self.k("GET", "/twin/faults"))["items"]:
            await self.k(
                "POST", "/twin/faults/recover", {"node": fault["node"], "gpu": fault["gpu_uuid"]}
            )
        await self.k("PUT", "/twin/known-faults", {"ignoreDeviceTaintRules": False})
        for incident in self.incidents:
            if incident.result is None:
                desc = await self.handle(incident.workflow_id).describe()
                if desc.status == WorkflowExecutionStatus.RUNNING:
                    st = await self.status(incident.workflow_id)
                    if st.phase is Phase.HOLDING:
                        if "un-retire" in st.awaiting:  # a lemon: held until un-retired
                            await self.unretire(
                                incident.device.split("/")[-1], reason="demo scenario finished"
                            )
                            await self._unretired(incident)
                        await self.repaired(incident, actor="sickbay-demo cleanup")
                    else:  # mid-wait (e.g. a Pending deadline): undo and close
                        await self.abort(incident, reason="demo scenario finished")
                await self.closed(incident)
        if ns:
            await self.delete_namespace(ns)


# --------------------------------------------------------------------------------------------
# Scenarios
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Scenario:
    name: str
    title: str
    run: Callable[[Demo], Awaitable[None]]
    topology: str = "full"
    acts: int = 1
    watch: bool = False  # needs the health watcher in the worker (StackConfig.watch)
    repair: bool = False  # needs the shipped repair ladder on (StackConfig.repair)
    profile: str = "1.36"  # the twin's profile (StackConfig.profile)
    cloud: Literal["gke", "eks"] = "gke"  # the pool's cloud shape (StackConfig.cloud)
    nodes: int = 1  # GPU nodes in the twin's pool (StackConfig.nodes)


def _ns(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:5]}"


@dataclass
class SeedState:
    """What one act of the seed story hands to the next."""

    ns: str = "serving"
    app: str = "llm"
    pod: str = ""  # the first pod, on the first GPU
    device: str = ""  # its device
    gpu1: dict[str, Any] = field(default_factory=dict)
    first: WatchedRemediation | None = None
    replacement: str = ""  # the pod on the second GPU
    device2: str = ""
    gpu2: dict[str, Any] = field(default_factory=dict)
    second: WatchedRemediation | None = None
    new_nodes: list[str] = field(default_factory=list)
    device3: str = ""  # the replacement's device on the new node


async def act1_gpu_dies(demo: Demo, st: SeedState) -> None:
    """An inference Deployment runs; its GPU dies (Xid 79): restart loop, Unhealthy in status."""
    say = demo.say
    say(f"an inference Deployment {st.ns}/{st.app} (1 replica, 1 GPU through DRA)", tag="act 1/4")
    await demo.namespace(st.ns)
    await demo.deployment(st.ns, st.app)
    [(pod, device)] = await demo.running(st.ns, st.app)
    st.pod, st.device = pod["metadata"]["name"], device
    st.gpu1 = await demo.gpu(device)
    say(f"pod {st.pod} Running on {device}")
    say(f"GPU {st.gpu1['index']} ({st.gpu1['uuid']}) dies: Xid 79, fell off the bus")
    await demo.fail(st.gpu1, xid=79)
    loop = await demo.crash_looping(st.ns, st.app)
    demo.check(
        f"restart loop: {loop['pod']['metadata']['name']} restarts "
        f"{loop['status']['restartCount']}, pod status says {loop['health']['resourceID']} "
        f"{loop['health']['health']} ({loop['health'].get('message', '')}): the driver's CDI "
        f"id, which Sickbay maps to {device} through the pod's ResourceClaim"
    )


async def act2_quarantine(demo: Demo, st: SeedState) -> None:
    """The alert reaches the webhook: taint, eviction, replacement Running on the 2nd GPU."""
    demo.say("the twin's Alertmanager posts the alert to the Sickbay webhook", tag="act 2/4")
    st.first = await demo.incident(st.gpu1, "the seed incident, first GPU")
    status = await demo.phase(st.first, {Phase.HOLDING})
    rule = await demo.taint_rule(status.rule_name or "")
    if rule is None:
        raise DemoFailure(f"no DeviceTaintRule {status.rule_name} in the twin")
    demo.check(
        f"DeviceTaintRule {rule['metadata']['name']} effect {rule['spec']['taint']['effect']}"
    )
    [(replacement, device2)] = await demo.running(st.ns, st.app)
    if device2 == st.device:
        raise DemoFailure(f"the replacement runs on the quarantined device {st.device}")
    if replacement["metadata"]["name"] == st.pod:
        raise DemoFailure("the pod on the failed GPU was not evicted")
    st.replacement, st.device2 = replacement["metadata"]["name"], device2
    demo.check(f"{st.pod} evicted; replacement {st.replacement} Running on {device2}")
    # Every decision is an Event where a person looks: the Deployment, the rule, the pods.
    owner = await demo.show_events(
        st.ns, f"involvedObject.kind=Deployment,involvedObject.name={st.app}"
    )
    want = ["GPUFailureConfirmed", "GPUQuarantined", "GPUConsumersEvicted", "GPUReplacementRunning"]
    reasons = [e["reason"] for e in owner]
    if [r for r in want if r not in reasons]:
        raise DemoFailure(f"Events on Deployment {st.app}: {reasons}, expected {want}")
    demo.check(f"Events on Deployment {st.ns}/{st.app}: {', '.join(reasons)}")
    on_rule = await demo.show_events(
        "default",
        f"involvedObject.kind=DeviceTaintRule,involvedObject.name={rule['metadata']['name']}",
    )
    if "GPUQuarantined" not in [e["reason"] for e in on_rule]:
        raise DemoFailure(f"no GPUQuarantined Event on DeviceTaintRule {rule['metadata']['name']}")
    demo.check(f"Event GPUQuarantined on DeviceTaintRule {rule['metadata']['name']}")


async def act3_scale_up(demo: Demo, st: SeedState) -> None:
    """The 2nd GPU dies: no free device, Pending deadline, node-pool scale-up, new node."""
    say = demo.say
    st.gpu2 = await demo.gpu(st.device2)
    say(
        f"GPU {st.gpu2['index']} ({st.gpu2['uuid']}) dies too: Xid 48, double-bit ECC",
        tag="act 3/4",
    )
    nodes_before = await demo.nodes()
    await demo.fail(st.gpu2, xid=48)
    st.second = await demo.incident(st.gpu2, "the seed incident, second GPU")
    await demo.phase(st.second, {Phase.AWAITING_REPLACEMENT, Phase.SCALING})
    say("no healthy GPU is free: the replacement stays Pending until the deadline")
    await demo.phase(st.second, {Phase.SCALING}, within=SCALE_TIMEOUT)
    eks = demo.stack.config.cloud == "eks"
    shape = "EKS UpdateNodegroupConfig through boto3" if eks else "GKE-shaped API"
    say(f"Pending deadline passed: asking the node pool for one more node ({shape})")
    await demo.phase(st.second, {Phase.HOLDING}, within=SCALE_TIMEOUT)
    st.new_nodes = sorted(set(await demo.nodes()) - set(nodes_before))
    if not st.new_nodes:
        raise DemoFailure("the remediation is holding but no node was added to the pool")
    if eks:
        cloud = demo.stack.twin("PUT", f"/twin/pools/{POOL}/cloud", {})
        if cloud["eksUpdates"] != 1:
            raise DemoFailure(f"EKS node group updates: {cloud['eksUpdates']}, expected 1")
        demo.check("one EKS node-group update (UpdateNodegroupConfig desiredSize, SigV4-signed)")
    [(third, device3)] = await demo.running(st.ns, st.app)
    if not any(f"/{n}/" in device3 for n in st.new_nodes):
        raise DemoFailure(f"the replacement runs on {device3}, not on the new node {st.new_nodes}")
    st.device3 = device3
    demo.check(f"node pool grew: new node {', '.join(st.new_nodes)}")
    demo.check(f"replacement {third['metadata']['name']} Running on {device3}")


async def act4_repair(demo: Demo, st: SeedState) -> None:
    """Both GPUs are repaired: quarantines lifted, remediations closed as released."""
    demo.say(
        "both GPUs are replaced: the twin reports them healthy, an operator marks them repaired",
        tag="act 4/4",
    )
    assert st.first is not None and st.second is not None
    for gpu, incident in ((st.gpu1, st.first), (st.gpu2, st.second)):
        await demo.recover(gpu)
        await demo.repaired(incident)
    for incident in (st.first, st.second):
        result = await demo.closed(incident)
        if result.outcome != "released":
            raise DemoFailure(f"{incident.workflow_id} closed {result.outcome}: {result.reason}")
        if await demo.taint_rule(result.status.rule_name or ""):
            raise DemoFailure(f"DeviceTaintRule {result.status.rule_name} is still there")
    demo.check("both quarantines lifted (DeviceTaintRules removed), remediations closed: released")
    every = await demo.show_events(None, "reportingComponent=sickbay")
    reasons = {e["reason"] for e in every}
    for wanted in ("GPUScaleUpRequested", "GPUQuarantineReleased"):
        if wanted not in reasons:
            raise DemoFailure(f"no {wanted} Event among Sickbay's: {sorted(reasons)}")
    demo.check(
        f"{len(every)} Sickbay Events, one per decision and object: {', '.join(sorted(reasons))}"
    )


SEED_ACTS = (act1_gpu_dies, act2_quarantine, act3_scale_up, act4_repair)


async def seed_story(demo: Demo) -> None:
    st = SeedState()
    for act in SEED_ACTS:
        await act(demo, st)


async def training_job(demo: Demo) -> None:
    say = demo.say
    ns = _ns("training")
    async with demo.scene(ns):
        say(f"a training Job {ns}/train pinned to the `training` runbook", tag="training")
        await demo.namespace(ns)
        await demo.job(ns, "train", labels={LABEL_WORKLOAD_CLASS: "training"})
        [(pod, device)] = await demo.running(ns, "train")
        gpu = await demo.gpu(device)
        say(f"GPU {gpu['index']} under {pod['metadata']['name']} dies (Xid 79)")
        await demo.fail(gpu)
        incident = await demo.incident(gpu, "training Job")
        st = await demo.phase(incident, {Phase.HOLDING})
        if st.runbook != "training":
            raise DemoFailure(f"the Job was handled by runbook {st.runbook}, not training")
        [(again, device2)] = await demo.running(ns, "train")
        if device2 == device or again["metadata"]["name"] == pod["metadata"]["name"]:
            raise DemoFailure("the Job's pod did not move off the failed GPU")
        demo.check(
            f"runbook training; the Job's new pod {again['metadata']['name']} runs on {device2}"
        )
        await demo.recover(gpu)
        await demo.repaired(incident)
        result = await demo.closed(incident)
        if result.outcome != "released":
            raise DemoFailure(f"closed {result.outcome}: {result.reason}")
        demo.check("repaired -> quarantine lifted, closed: released")


async def vgpu_correlated(demo: Demo) -> None:
    say = demo.say
    ns = _ns("vdi")
    async with demo.scene(ns):
        say(f"two desktops ({ns}/desktop, 2 replicas) on vGPUs", tag="vgpu")
        driver = DEVICE_CLASS  # the driver's name doubles as its whole-GPU class name
        expr = f"device.driver == '{driver}' && device.attributes['{driver}'].type == 'vgpu'"
        await demo.k(
            "POST",
            f"{RESOURCE_API}/deviceclasses",
            {
                "apiVersion": "resource.k8s.io/v1",
                "kind": "DeviceClass",
                "metadata": {"name": VGPU_CLASS},
                "spec": {"selectors": [{"cel": {"expression": expr}}]},
            },
            ok=(409,),
        )
        await demo.namespace(ns, device_class=VGPU_CLASS)
        await demo.deployment(ns, "desktop", replicas=2)
        running = await demo.running(ns, "desktop", count=2)
        gpus: dict[str, dict[str, Any]] = {}
        for _pod, device in running:
            gpu = await demo.gpu(device)
            gpus.setdefault(gpu["uuid"], gpu)
        shared = next(
            (
                g
                for g in gpus.values()
                if sum(1 for _p, d in running if d in {x["resourceID"] for x in g["devices"]}) >= 2
            ),
            None,
        )
        if shared is None:
            raise DemoFailure(f"the two desktops did not share one physical GPU: {running}")
        siblings = [d["resourceID"] for d in shared["devices"]]
        say(f"both run on vGPUs of GPU {shared['index']}: {', '.join(siblings)}; it fails (Xid 79)")
        await demo.fail(shared)
        incident = await demo.incident(shared, "vGPU correlated failure")
        st = await demo.phase(incident, {Phase.HOLDING})
        tainted = sorted(
            "{driver}/{pool}/{device}".format(**r["spec"]["deviceSelector"])
            for r in await demo.taint_rules()
        )
        if tainted != sorted(siblings):
            raise DemoFailure(f"tainted {tainted}, expected every vGPU of the GPU: {siblings}")
        demo.check(
            f"one remediation for the physical GPU tainted all its vGPUs: {', '.join(tainted)}"
        )
        moved = await demo.running(ns, "desktop", count=2)
        if any(d in siblings for _p, d in moved):
            raise DemoFailure(f"a desktop still runs on a vGPU of the failed GPU: {moved}")
        demo.check(
            "both desktops replaced on the other GPU's vGPUs: " + ", ".join(d for _p, d in moved)
        )
        st = await demo.status(incident.workflow_id)
        demo.check(
            f"{st.alerts} distinct alert(s) for {len(st.consumers)} desktop(s) went to this one "
            f"workflow ({st.duplicate_alerts} repeat(s) ignored)"
        )
        await demo.recover(shared)
        await demo.repaired(incident)
        await demo.closed(incident)


def _hami_template(app: str) -> dict[str, Any]:
    """A pod template as a HAMi user writes it: HAMi's scheduler, one share of 20 GB, and
    binpack so the replicas share one GPU."""
    return {
        "metadata": {"labels": {"app": app}, "annotations": {hami.ANN_POLICY: "binpack"}},
        "spec": {
            "schedulerName": hami.SCHEDULER_NAME,
            "containers": [
                {
                    "name": "main",
                    "image": f"registry.invalid/{app}:demo",
                    "resources": {"limits": {"nvidia.com/gpu": "1", hami.MEM_RESOURCE: "20000"}},
                }
            ],
        },
    }


async def _hami_running(
    demo: Demo,
    ns: str,
    app: str,
    count: int,
    avoid: frozenset[str] = frozenset(),
) -> list[tuple[str, str]]:
    """`count` Running, ready pods of `app` HAMi placed, none of `avoid`: [(pod, GPU UUID)]."""

    async def probe() -> list[tuple[str, str]] | None:
        ready = []
        for pod in await demo.pods(ns, app):
            statuses = pod.get("status", {}).get("containerStatuses") or []
            uuids = hami.allocated_uuids(pod)
            if (
                pod.get("status", {}).get("phase") == "Running"
                and statuses
                and all(s.get("ready") for s in statuses)
                and len(uuids) == 1
                and pod["metadata"]["name"] not in avoid
            ):
                ready.append((pod["metadata"]["name"], next(iter(uuids))))
        return sorted(ready) if len(ready) >= count else None

    return await demo.until(f"{count} HAMi pod(s) of {ns}/{app} Running", probe)


async def _hami_node(demo: Demo, node: str) -> dict[str, Any]:
    body: dict[str, Any] = await demo.k("GET", f"/api/v1/nodes/{node}")
    return body


async def hami_shared_gpu(demo: Demo) -> None:
    say = demo.say
    ns = _ns("hami")
    async with demo.scene(ns):
        await demo.k("POST", "/api/v1/namespaces", {"metadata": {"name": ns}}, ok=(409,))
        say(f"two desktops ({ns}/desktop, 2 replicas) on HAMi vGPU shares", tag="hami")
        await demo.deployment(ns, "desktop", replicas=2, template=_hami_template("desktop"))
        placed = await _hami_running(demo, ns, "desktop", 2)
        shared = {uuid for _pod, uuid in placed}
        if len(shared) != 1:
            raise DemoFailure(f"HAMi did not binpack the two desktops onto one GPU: {placed}")
        failed_uuid = shared.pop()
        gpu = next(
            g for g in (await demo.k("GET", "/twin/gpus"))["items"] if g["uuid"] == failed_uuid
        )
        demo.check(
            f"HAMi's scheduler put both desktops on GPU {gpu['index']} "
            f"({hami.ANN_ALLOCATED}: {failed_uuid},NVIDIA,20000,0:;)"
        )
        say(f"GPU {gpu['index']} fails (Xid 79) under both shares")
        await demo.fail(gpu)
        incident = await demo.incident(gpu, "HAMi shared GPU failure")
        st = await demo.phase(incident, {Phase.HOLDING})
        consumers = sorted(f"{c.namespace}/{c.name}" for c in st.consumers)
        if consumers != sorted(f"{ns}/{p}" for p, _u in placed):
            raise DemoFailure(f"consumers {consumers}, expected both desktops: {placed}")
        demo.check(f"consumers from HAMi's records: {', '.join(consumers)}")
        node = await _hami_node(demo, gpu["node"])
        cordon = hami.uuid_list(node["metadata"].get("annotations", {}).get(hami.ANN_DEVICE_CORDON))
        if failed_uuid not in cordon:
            raise DemoFailure(f"{hami.ANN_DEVICE_CORDON} on {gpu['node']} is {sorted(cordon)}")
        if node["spec"].get("taints") or node["spec"].get("unschedulable"):
            raise DemoFailure(f"node {gpu['node']} was tainted or cordoned: {node['spec']}")
        demo.check(f"GPU quarantined alone: {hami.ANN_DEVICE_CORDON}={failed_uuid}, node untouched")
        moved = await _hami_running(demo, ns, "desktop", 2, avoid=frozenset(p for p, _u in placed))
        if any(uuid == failed_uuid for _p, uuid in moved):
            raise DemoFailure(f"a desktop was placed on the failed GPU again: {moved}")
        demo.check(
            "both desktops replaced on the healthy GPU: "
            + ", ".join(f"{p} on {uuid}" for p, uuid in moved)
        )

        say("the GPU recovers on its own; Sickbay still holds it until it is marked repaired")
        await demo.recover(gpu)

        async def survives() -> bool:
            node = await _hami_node(demo, gpu["node"])
            registered = {g["id"]: g for g in hami.registered_gpus(node)}
            annotations = node["metadata"].get("annotations", {})
            return registered.get(failed_uuid, {}).get("health") is True and failed_uuid in (
                hami.uuid_list(annotations.get(hami.ANN_DEVICE_CORDON))
            )

        await demo.until("HAMi's device plugin to re-register the GPU healthy", survives)
        demo.check("HAMi re-registered the GPU healthy; the cordon survived the rewrite")
        probe = _hami_template("probe")
        probe["metadata"]["name"] = "probe"
        probe["metadata"]["annotations"][hami.ANN_USE_UUID] = failed_uuid
        await demo.k(
            "POST", f"/api/v1/namespaces/{ns}/pods", {"apiVersion": "v1", "kind": "Pod", **probe}
        )

        async def held_off() -> str | None:
            pod = await demo.k("GET", f"/api/v1/namespaces/{ns}/pods/probe")
            cond: dict[str, Any] = next(
                (
                    c
                    for c in pod.get("status", {}).get("conditions") or []
                    if c["type"] == "PodScheduled"
                ),
                {},
            )
            return str(cond.get("message")) if cond.get("reason") == "Unschedulable" else None

        why = await demo.until("a pod asking for that GPU by UUID to be refused", held_off)
        demo.check(f"a pod asking for GPU {gpu['index']} by UUID stays Pending: {why}")
        await demo.repaired(incident)
        result = await demo.closed(incident)
        if result.outcome != "released":
            raise DemoFailure(f"closed {result.outcome}: {result.reason}")
        node = await _hami_node(demo, gpu["node"])
        if failed_uuid in hami.uuid_list(
            node["metadata"].get("annotations", {}).get(hami.ANN_DEVICE_CORDON)
        ):
            raise DemoFailure("the repaired GPU is still in HAMi's device cordon")
        [(_probe, placed_on)] = await _hami_running(demo, ns, "probe", 1)
        if placed_on != failed_uuid:
            raise DemoFailure(f"the probe ran on {placed_on}, not the released GPU")
        demo.check(
            "repaired -> taken out of HAMi's device cordon, closed: released; the waiting pod "
            "now runs on it"
        )


async def budget_exhausted(demo: Demo) -> None:
    say = demo.say
    ns = _ns("budget")
    async with demo.scene(ns):
        say(
            "two services pinned to the `default` runbook (shipped budget: 50% of a pool)",
            tag="budget",
        )
        await demo.namespace(ns)
        await demo.deployment(ns, "svc-a", labels={LABEL_WORKLOAD_CLASS: "default"})
        [(_pa, dev_a)] = await demo.running(ns, "svc-a")
        await demo.deployment(ns, "svc-b", labels={LABEL_WORKLOAD_CLASS: "default"})
        [(_pb, dev_b)] = await demo.running(ns, "svc-b")
        gpu_a, gpu_b = await demo.gpu(dev_a), await demo.gpu(dev_b)
        sent_before = len(await demo.notifications())
        say("GPU A fails; its remediation takes the pool's only budget slot (1 of 2 GPUs)")
        await demo.fail(gpu_a)
        first = await demo.incident(gpu_a, "budget: first GPU")
        await demo.phase(first, {Phase.HOLDING, Phase.AWAITING_REPLACEMENT, Phase.ESCALATED})
        say("GPU B fails while A is quarantined")
        await demo.fail(gpu_b)
        second = await demo.incident(gpu_b, "budget: second GPU")
        st = await demo.phase(second, {Phase.ESCALATED, Phase.CLOSED})
        if st.escalation_reason != "budget-exhausted":
            raise DemoFailure(f"second GPU: {st.phase.value} ({st.escalation_reason})")
        rule_name = device_workflow_id(gpu_b["node"], gpu_b["uuid"])
        if await demo.taint_rule(rule_name):
            raise DemoFailure("the over-budget GPU was tainted anyway")
        demo.check(
            f"second GPU NOT tainted: escalated (budget-exhausted), waiting for {st.awaiting}"
        )
        pages = await demo.until(
            "the budget escalation to reach the sink",
            lambda: _pages(demo, sent_before, second.workflow_id),
        )
        demo.check(
            f"escalation delivered: {pages[0]['body'].get('payload', {}).get('summary', '')[:100]}"
        )
        say("the team moves svc-b away and GPU B recovers (its alert resolves)")
        await demo.k("DELETE", f"/apis/apps/v1/namespaces/{ns}/deployments/svc-b")
        await demo.recover(gpu_b)
        result = await demo.closed(second)
        if result.outcome != "not-quarantined":
            raise DemoFailure(f"second GPU closed {result.outcome}: {result.reason}")
        demo.check(f"second GPU closed without a quarantine: {result.reason}")
        await demo.phase(first, {Phase.HOLDING})
        [(_pa2, dev_a2)] = await demo.running(ns, "svc-a")
        demo.check(f"the first GPU stays quarantined; svc-a's replacement runs on {dev_a2}")


async def _pages(demo: Demo, since: int, workflow_id: str) -> list[dict[str, Any]]:
    return [
        n
        for n in await demo.notifications(since)
        if n["kind"] == "pagerduty" and n["body"].get("dedup_key", "").startswith(workflow_id[:60])
    ]


async def application_xid(demo: Demo) -> None:
    say = demo.say
    ns = _ns("app")
    async with demo.scene(ns):
        say(
            f"a service {ns}/model; its program triggers Xid 13 (graphics engine exception)",
            tag="app-xid",
        )
        await demo.namespace(ns)
        await demo.deployment(ns, "model")
        [(pod, device)] = await demo.running(ns, "model")
        gpu = await demo.gpu(device)
        await demo.fail(gpu, xid=13)
        incident = await demo.incident(gpu, "application Xid")
        result = await demo.closed(incident)
        if result.outcome != "not-quarantined" or result.status.failure_class != "application":
            raise DemoFailure(f"closed {result.outcome} ({result.status.failure_class})")
        if await demo.taint_rule(device_workflow_id(gpu["node"], gpu["uuid"])):
            raise DemoFailure("an application error quarantined the GPU")
        [(still, device2)] = await demo.running(ns, "model")
        if still["metadata"]["name"] != pod["metadata"]["name"]:
            raise DemoFailure("the pod was evicted for an application error")
        demo.check("classified application: no DeviceTaintRule, the pod keeps running")
        events = await demo.k("GET", f"/api/v1/namespaces/{ns}/events")
        reasons = {e.get("reason") for e in events["items"]}
        if "GPUApplicationError" in reasons:
            demo.check("Warning Event GPUApplicationError on the pod for its owner")


async def scheduler_churn(demo: Demo) -> None:
    say = demo.say
    ns = _ns("churn")
    async with demo.scene(ns):
        say(
            "known fault on: the scheduler ignores DeviceTaintRules (kubernetes#139651)",
            tag="churn",
        )
        await demo.k("PUT", "/twin/known-faults", {"ignoreDeviceTaintRules": True})
        await demo.namespace(ns)
        await demo.deployment(ns, "api")
        [(_pod, device)] = await demo.running(ns, "api")
        gpu = await demo.gpu(device)
        # Keep every other GPU busy, so the only free device is the one Sickbay taints.
        free = len((await demo.k("GET", "/twin/gpus"))["items"]) - 1
        if free:
            await demo.deployment(ns, "filler", replicas=free)
            await demo.running(ns, "filler", count=free)
        say(
            f"GPU {gpu['index']} fails; the only free device for the replacement is the tainted one"
        )
        await demo.fail(gpu)
        incident = await demo.incident(gpu, "scheduler ignores DeviceTaintRules")
        st = await demo.phase(incident, {Phase.ESCALATED, Phase.HOLDING}, within=SCALE_TIMEOUT)
        if st.escalation_reason != "churn":
            raise DemoFailure(
                f"expected a churn escalation, got {st.phase.value} ({st.escalation_reason})"
            )
        demo.check(f"eviction churn detected -> escalated (churn) while {st.phase.value}")
        entries = await demo.timeline(incident)
        said = next((e for e in entries if e.action == "escalate"), None)
        if said is not None:
            demo.check(f"the escalation says: {said.reason[:320]}")
        node = await demo.k("GET", f"/api/v1/nodes/{gpu['node']}")
        if not (node.get("spec") or {}).get("unschedulable"):
            raise DemoFailure(f"churn was not stopped: node {gpu['node']} is not cordoned")
        demo.check(
            f"the loop stopped (replacement.onChurn: cordon): node {gpu['node']} cordoned, "
            "so the scheduler places no new pod on the tainted GPU"
        )


async def watch_detection(demo: Demo) -> None:
    """Detection by watch: the twin's Alertmanager is silenced and no sweep runs."""
    say = demo.say
    ns = _ns("watched")
    alerts = await demo.k("GET", "/twin/alerts")
    receiver = alerts.get("receiver")
    last_sent = (alerts.get("sent") or [])[-1:]
    await demo.k("PUT", "/twin/alerts", {"url": None})  # nothing reaches the webhook
    try:
        async with demo.scene(ns):
            say(f"an inference Deployment {ns}/llm; Alertmanager silenced, no sweep", tag="watch")
            await demo.namespace(ns)
            await demo.deployment(ns, "llm")
            [(pod, device)] = await demo.running(ns, "llm")
            gpu = await demo.gpu(device)
            say(f"GPU {gpu['index']} under {pod['metadata']['name']} dies (Xid 79)")
            failed_at = time.monotonic()
            await demo.fail(gpu)
            incident = await demo.incident(gpu, "detected by watch")
            st = await demo.phase(incident, {Phase.HOLDING})
            entries = await demo.timeline(incident)
            if not entries or entries[0].actor != "watch":
                first = entries[0].actor if entries else "nothing"
                raise DemoFailure(f"the remediation was started by {first}, not the watcher")
            demo.check(
                f"the watcher started it: {entries[0].outcome[:120]}; DeviceTaintRule "
                f"{st.rule_name} {time.monotonic() - failed_at:.1f} s after the fault"
            )
            sent = (await demo.k("GET", "/twin/alerts")).get("sent") or []
            if sent[-1:] != last_sent:
                raise DemoFailure("an alert was delivered: this was not detection by watch")
            await demo.recover(gpu)
            await demo.repaired(incident)
            result = await demo.closed(incident)
            if result.outcome != "released":
                raise DemoFailure(f"closed {result.outcome}: {result.reason}")
            demo.check("repaired -> quarantine lifted, closed: released")
    finally:
        await demo.k("PUT", "/twin/alerts", {"url": receiver})


HUMAN_ACTIONS = ("marked repaired", "approved", "rejected", "abort requested", "GPU un-retired")


def _people_in(entries: list[TimelineEntry]) -> list[TimelineEntry]:
    """Timeline entries a person caused (a repair mark, approval, abort, un-retire)."""
    return [e for e in entries if e.action in HUMAN_ACTIONS]


async def _repaired_without_people(
    demo: Demo,
    ns: str,
    app: str,
    xid: int,
    rung: str,
    part: str,
    gpu: dict[str, Any] | None = None,
) -> RemediationResult:
    """A GPU fails with `xid` (the one under `app`'s pod unless `gpu` is given); the ladder's
    `rung` repairs it and validation releases it, nobody acting."""
    if gpu is None:
        [(pod, device)] = await demo.running(ns, app)
        gpu = await demo.gpu(device)
        demo.say(f"GPU {gpu['index']} ({gpu['uuid']}) under {pod['metadata']['name']}: Xid {xid}")
    else:
        demo.say(f"GPU {gpu['index']} ({gpu['uuid']}) again: Xid {xid}")
    await demo.fail(gpu, xid=xid)
    incident = await demo.incident(gpu, part)
    result = await demo.closed(incident, within=REPAIR_TIMEOUT)
    # A replace ends the old GPU's remediation once the new node's GPUs passed validation.
    done = (
        result.reason.startswith("replaced:") and "new GPUs validated" in result.reason
        if rung == "replace"
        else f"{rung} repaired it" in result.reason
    )
    if result.outcome != "released" or not done:
        raise DemoFailure(f"{part}: closed {result.outcome}: {result.reason}")
    people = _people_in(result.timeline)
    if people:
        raise DemoFailure(f"{part}: a person acted: {people[0].action} by {people[0].actor}")
    ladder = next((e for e in result.timeline if e.action == "repair ladder"), None)
    if ladder is not None:
        demo.check(f"ladder {ladder.outcome}" + (f" ({ladder.reason})" if ladder.reason else ""))
    demo.check(f"{rung}, then validation: {result.status.validation}")
    demo.check(f"released with no human step: {result.reason}")
    return result


# The shipped runbooks' lemons knob: a GPU failing this often within the window is retired.
LEMON_FAILURES = 3


async def _lemon_without_people(demo: Demo, ns: str, app: str) -> WatchedRemediation:
    """The GPU under `app`'s pod keeps failing with Xid 48: each failure the ledger counts
    under `LEMON_FAILURES` is repaired by the ladder (reset, validation, released); the one
    that reaches it retires the GPU: held until un-retired, no rung run, one RMA page. Earlier
    parts' failures of the same GPU count too (the ledger's window spans the whole stand)."""
    [(pod, device)] = await demo.running(ns, app)
    gpu = await demo.gpu(device)
    demo.say(
        f"GPU {gpu['index']} ({gpu['uuid']}) under {pod['metadata']['name']} keeps failing "
        "with Xid 48 (ECC)",
        tag="lemon",
    )
    sent = len(await demo.notifications())
    for n in range(1, LEMON_FAILURES + 1):
        await demo.fail(gpu, xid=48)
        incident = await demo.incident(gpu, f"the same GPU failing again ({n})")

        async def counted(incident: WatchedRemediation = incident) -> TimelineEntry | None:
            entries = await demo.timeline(incident)
            return next(
                (e for e in entries if e.action in ("failure recorded", "GPU retired")), None
            )

        recorded = await demo.until(f"failure {n} of {gpu['uuid']} in the GPU ledger", counted)
        if recorded.action == "GPU retired":

            async def held(incident: WatchedRemediation = incident) -> RemediationStatus | None:
                st = incident.status
                held = st is not None and st.phase is Phase.HOLDING and "un-retire" in st.awaiting
                return st if held else None

            st = await demo.until("the retired GPU held until un-retired", held, REPAIR_TIMEOUT)
            entries = await demo.timeline(incident)
            break
        demo.check(f"failure counted: {recorded.outcome}; the ladder repairs it")
        result = await demo.closed(incident, within=REPAIR_TIMEOUT)
        if result.outcome != "released" or "reset repaired it" not in result.reason:
            raise DemoFailure(f"failure {n}: closed {result.outcome}: {result.reason}")
        if _people_in(result.timeline):
            raise DemoFailure(f"failure {n}: a person acted")
        demo.check(f"reset, then validation: {result.status.validation}; released")
    else:
        raise DemoFailure(f"{gpu['uuid']} failed {LEMON_FAILURES} times and was not retired")
    if not recorded.outcome.startswith(f"{LEMON_FAILURES} of {LEMON_FAILURES}"):
        raise DemoFailure(f"retired at the wrong count: {recorded.outcome}")
    if st.escalation_reason != "gpu-retired" or "un-retire" not in st.awaiting:
        raise DemoFailure(f"the GPU was not held retired: {st.escalation_reason} {st.awaiting}")
    if not any(e.action == "repair skipped" for e in entries):
        raise DemoFailure("the repair ladder was not skipped for the retired GPU")
    demo.check(f"retired (a lemon, {recorded.outcome}): held until un-retired, no repair rung")
    pages = [
        x["body"]
        for x in await demo.notifications(since=sent)
        if x["kind"] == "pagerduty" and x["body"].get("event_action") == "trigger"
    ]
    if len(pages) != 1 or "RMA" not in pages[0]["payload"]["summary"]:
        said = [p["payload"]["summary"][:200] for p in pages]
        raise DemoFailure(f"expected one RMA page, got {len(pages)}: {said}")
    demo.check("one page asks for an RMA with the GPU's history; nobody else was paged")
    return incident


# Parts of the repair scenario, played in order on one stand, each a (demo, namespace, app)
# coroutine; none needs a person (the scenario's clean-up un-retires the lemon at the end).
REPAIR_PARTS: list[Callable[[Demo, str, str], Awaitable[object]]] = [
    lambda demo, ns, app: _repaired_without_people(
        demo, ns, app, 48, "reset", "Xid 48 -> reset -> validation"
    ),
    lambda demo, ns, app: _repaired_without_people(
        demo, ns, app, 79, "reboot", "Xid 79 -> reset not applicable -> reboot -> validation"
    ),
    _lemon_without_people,
]


async def _play(
    demo: Demo, prefix: str, parts: list[Callable[[Demo, str, str], Awaitable[object]]]
) -> None:
    ns = _ns(prefix)
    async with demo.scene(ns):
        demo.say(f"an inference Deployment {ns}/llm; the shipped repair ladder is on", tag=prefix)
        await demo.namespace(ns)
        await demo.deployment(ns, "llm")
        for part in parts:
            await part(demo, ns, "llm")


async def repair_ladder(demo: Demo) -> None:
    await _play(demo, "repair", REPAIR_PARTS)


async def eks_repair(demo: Demo) -> None:
    """The repair ladder on an EKS node group: Xid 79 -> reboot through EC2 RebootInstances
    (boto3, the twin's EC2 shapes) -> validation -> released, asked once."""

    async def reboot(demo: Demo, ns: str, app: str) -> None:
        await _repaired_without_people(
            demo, ns, app, 79, "reboot", "Xid 79 -> reboot through EC2 -> validation"
        )
        cloud = demo.stack.twin("PUT", f"/twin/pools/{POOL}/cloud", {})
        calls = [c for c in cloud["instanceCalls"] if c[0] == "reset"]
        if len(calls) != 1:
            raise DemoFailure(f"EC2 reboots acted on: {calls}, expected one")
        demo.check(f"one EC2 RebootInstances of node {calls[0][1]}'s instance")

    await _play(demo, "eks-repair", [reboot])


async def lemon_gpu(demo: Demo) -> None:
    """The repair scenario's lemon part alone: on a fresh stand two failures repaired by the
    ladder, the third retires the GPU (one RMA page); no human step."""
    await _play(demo, "lemon", [_lemon_without_people])


async def node_upgrade(demo: Demo) -> None:
    """After the upgrade the node forgot its GPU: harness/upgrade_scenario.py."""
    from harness.upgrade_scenario import upgrade_story

    await upgrade_story(demo)


SCENARIOS: dict[str, Scenario] = {
    s.name: s
    for s in (
        Scenario("seed", "the seed incident, end to end", seed_story, acts=4),
        Scenario("training", "training Job moves off a failed GPU", training_job),
        Scenario("vgpu", "vGPU correlated failure: one GPU, two vGPUs", vgpu_correlated, "vgpu"),
        Scenario(
            "hami",
            "HAMi vGPU: a failed shared GPU, every share moved",
            hami_shared_gpu,
            profile="hami",
        ),
        Scenario("budget", "blast-radius budget exhausted", budget_exhausted),
        Scenario("app-xid", "application Xid: notify, no quarantine", application_xid),
        Scenario("churn", "scheduler ignoring DeviceTaintRules", scheduler_churn),
        Scenario("watch", "detection by watch: no alert, no sweep", watch_detection, watch=True),
        Scenario(
            "repair",
            "closed-loop repair: reset, reboot, validated release, a lemon retired, no human step",
            repair_ladder,
            repair=True,
        ),
        Scenario(
            "eks",
            "the seed incident on an EKS node group: scale-up through UpdateNodegroupConfig",
            seed_story,
            acts=4,
            cloud="eks",
        ),
        Scenario(
            "eks-repair",
            "closed-loop repair on EKS: Xid 79 -> EC2 reboot -> validated release",
            eks_repair,
            repair=True,
            cloud="eks",
        ),
        Scenario(
            "lemon",
            "a GPU failing for the third time is retired: one RMA page, no human step",
            lemon_gpu,
            repair=True,
        ),
        Scenario(
            "upgrade",
            "after the upgrade the node forgot its GPU: one node incident, diagnosed, healed",
            node_upgrade,
            watch=True,
            nodes=3,
        ),
    )
}


def ui_links(stack: Stack, incidents: list[WatchedRemediation]) -> list[str]:
    info = stack.info
    assert info is not None
    if not info.ui_url:
        return []
    base = f"{info.ui_url}/namespaces/{info.namespace}/workflows"
    query = quote(f'WorkflowType="{WF_REMEDIATE}"')
    return [f"all remediations: {base}?query={query}"] + [
        f"{i.workflow_id}: {base}/{i.workflow_id}" for i in incidents
    ]


def format_timeline(entries: list[TimelineEntry]) -> list[str]:
    if not entries:
        return ["(empty)"]
    t0 = entries[0].at
    lines = []
    for e in entries:
        line = f"+{(e.at - t0).total_seconds():6.1f}s  {e.phase.value:<20} {e.action}"
        if e.outcome:
            line += f" -> {e.outcome}"
        if e.reason:
            line += f"  ({e.reason[:110]})"
        if e.actor and e.actor != "sickbay":
            line += f"  [{e.actor}]"
        lines.append(line)
    return lines
