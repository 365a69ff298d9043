"""The kubelet stand-in: runs bound pods, reports device health, finishes deleted pods.

Per pod bound to a node (state kept in memory, like a real kubelet's):
- **Start**: Pending -> Running `pod_startup_seconds` after binding, with containerStatuses
  (running, ready, started), conditions PodReadyToStartContainers/Initialized/Ready/
  ContainersReady, `startTime`, `hostIP`/`podIP`.
- **Dead GPU**: a container whose device's physical GPU has a fatal fault (faults.py) fails
  `crash_after_seconds` after each start (exit code 1, reason Error), then waits in
  `CrashLoopBackOff` (10 s doubling to 5 min, the kubelet's backoff) before restarting with
  `restartCount + 1`: the seed's symptom, Running 0/1 with RESTARTS climbing.
- **Finite workloads**: pod annotations `twin.sickbay.dev/run-seconds` and
  `twin.sickbay.dev/exit-code` make containers exit; restartPolicy Always restarts them,
  OnFailure only on a non-zero code, Never leaves the pod Succeeded or Failed.
- **Device health** (KEP-4680): `containerStatuses[].allocatedResourcesStatus` lists, per
  claim the container uses, `{name: "claim:<claim>[/<request>]", resources: [{resourceID,
  health: Healthy|Unhealthy|Unknown, message}]}`. As the 1.36 kubelet does, `resourceID` is
  the first CDI device id the driver returned (`k8s.gpu.nvidia.com/claim=<claim uid>-gpu-0`
  for the NVIDIA driver), `<driver>/<pool>/<device>` when it returned none (drivers without
  CDI ids, or `TwinOptions.cdi_device_ids` off). In the
  device-plugin profile the kubelet assigns GPU device IDs itself (`nvidia.com/gpu`, resourceID
  = the GPU UUID) and lowers the node's allocatable `nvidia.com/gpu` by the unhealthy GPUs (and
  to 0 for capacity and allocatable when the plugin "vanished" them).
- **A device plugin that stops while the kubelet runs** (`device_plugin_stopped`, e.g. a
  plugin rollout whose new pod cannot run): as the kubelet's device manager does, its devices
  are marked unhealthy but kept for `endpointStopGracePeriod` (`TwinOptions.plugin_stop_grace`,
  5 minutes): capacity still counts them, allocatable 0; then the resource is deleted and
  capacity goes to 0 too. A kubelet restart (an upgrade, a reboot) reads its checkpoint
  instead: the capacity is 0 until the plugin registers again, with no grace to show.
- **Graceful deletion**: a pod with `deletionTimestamp` keeps running (and keeps its claim)
  until that time, then its containers are reported terminated (phase Failed, or Succeeded if
  they had all exited 0) and the pod is deleted with grace period 0, which lets the
  resourceclaim controller free the device (tests/k8s_golden/44-45).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from twin import hami
from twin.clock import parse_time, rfc3339
from twin.controllers.allocator import claim_devices
from twin.controllers.common import (
    ANN_EXIT_CODE,
    ANN_RUN_SECONDS,
    CLAIMS,
    GPU_RESOURCE,
    NODES,
    PODS,
    is_deleting,
    is_terminal,
    meta,
    name_of,
    ns_of,
    pod_claim_name,
    pod_gpu_request,
    quantity_int,
    set_condition,
    uid_of,
)
from twin.controllers.repair_tools import ToolRun, run_tool
from twin.errors import ApiError
from twin.faults import MIG_PER_GPU, MIG_RESOURCE, SHARED_RESOURCE

log = logging.getLogger(__name__)

CRASH_EXIT_CODE = 1
TWIN_GPU_PLUGIN = "twin.sickbay.dev/gpu-plugin"  # twin/upgrade.py's ANN_PLUGIN
TERMINATED_BY_SIGNAL = 137  # SIGKILL after the grace period, as the runtime reports it


@dataclass
class _Container:
    name: str
    restarts: int = 0
    state: str = "running"  # running | terminated | backoff
    started_at: datetime | None = None
    started_mono: float = 0.0
    finished_at: datetime | None = None
    exit_code: int = 0
    reason: str = ""
    last: dict[str, Any] | None = None  # lastState.terminated
    retry_mono: float = 0.0
    tool: ToolRun | None = None  # a reset / diagnostic tool's run (controllers/repair_tools.py)
    tool_mono: float = -1.0  # the instance (started_mono) that run belongs to


@dataclass
class _Pod:
    uid: str
    bound_mono: float
    started: bool = False
    start_time: datetime | None = None
    containers: dict[str, _Container] = field(default_factory=dict)
    gpu_ids: list[str] = field(default_factory=list)
    ip: str = ""
    killing: bool = False  # the Killing event was recorded
    # What the last full sync saw (pod resourceVersion, fault epoch, claim changes) and when
    # it needs to look again: an unchanged running pod is skipped until then.
    seen: tuple[str, int, int] | None = None
    next_due: float = float("inf")


class Kubelet:
    def __init__(self, manager: Any) -> None:
        self.manager = manager
        self._pods: dict[str, _Pod] = {}
        self._ip_counter = 0
        self._claim_changes = 0
        # node -> (when its device plugin stopped, what it offered then: resource -> count):
        # kept for the grace.
        self._plugin_stops: dict[str, tuple[float, dict[str, int]]] = {}
        manager.store.subscribe(self._on_claim, [CLAIMS])

    def device_plugin_stopped(self, node: str) -> None:
        """The node's device plugin stopped while this kubelet runs (its process ended, its
        pod replaced): the GPUs it offered stay in capacity, none allocatable, for the grace."""
        obj = self.manager.store.try_get(NODES, node)
        capacity = ((obj or {}).get("status") or {}).get("capacity") or {}
        offered = {
            r: quantity_int(capacity.get(r)) for r in (GPU_RESOURCE, SHARED_RESOURCE, MIG_RESOURCE)
        }
        if any(offered.values()):
            self._plugin_stops[node] = (self.manager.clock.monotonic(), offered)
        self.manager.poke()

    def restarted(self, node: str) -> None:
        """The node's kubelet restarted: it reads its checkpoint, so a stopped plugin's GPUs
        count 0 until the plugin registers again (no grace)."""
        self._plugin_stops.pop(node, None)

    def _on_claim(self, _event: Any) -> None:
        self._claim_changes += 1

    # -- device health ---------------------------------------------------------------------

    def output(self, pod_uid: str, container: str) -> list[str]:
        """What a tool container printed (its log lines beyond the twin's own)."""
        runtime = self._pods.get(pod_uid)
        c = runtime.containers.get(container) if runtime else None
        return list(c.tool.lines) if c is not None and c.tool is not None else []

    def _health(self, ctx: Any, node: str, resource_id: str) -> tuple[str, str, bool]:
        faults = self.manager.faults
        if faults is None:
            return "Healthy", "", False
        return faults.health(node, resource_id)

    def _container_resources(
        self,
        ctx: Any,
        pod: dict[str, Any],
        container: dict[str, Any],
        claims: dict[str, Any],
        runtime: _Pod,
    ) -> tuple[list[dict[str, Any]], bool]:
        """allocatedResourcesStatus entries for a container, and whether a device is dead."""
        node = pod["spec"].get("nodeName", "")
        entries: list[dict[str, Any]] = []
        dead = False
        if not ctx.dra:
            wanted = quantity_int(
                ((container.get("resources") or {}).get("limits") or {}).get(GPU_RESOURCE)
            )
            if wanted and runtime.gpu_ids:
                resources = []
                for device_id in runtime.gpu_ids:
                    health, message, fatal = self._health(ctx, node, device_id)
                    dead = dead or fatal
                    resources.append(_resource(device_id, health, message))
                entries.append({"name": GPU_RESOURCE, "resources": resources})
            return entries, dead
        for ref in (container.get("resources") or {}).get("claims") or []:
            entry = next(
                (
                    e
                    for e in pod["spec"].get("resourceClaims") or []
                    if e.get("name") == ref.get("name")
                ),
                None,
            )
            claim_name = pod_claim_name(pod, entry) if entry else None
            claim = claims.get(claim_name or "")
            if claim is None:
                continue
            request = ref.get("request")
            resources = []
            for dev_id, result in claim_devices(claim):
                if request and result.get("request", "").split("/")[0] != request:
                    continue
                health, message, fatal = self._health(ctx, node, str(dev_id))
                dead = dead or fatal
                rid = str(dev_id)
                if ctx.options.cdi_device_ids:
                    rid = cdi_device_id(claim, dev_id.driver, dev_id.device) or rid
                resources.append(_resource(rid, health, message))
            label = f"claim:{ref.get('name')}" + (f"/{request}" if request else "")
            entries.append({"name": label, "resources": resources})
        return entries, dead

    # -- pass ------------------------------------------------------------------------------

    def sync(self, ctx: Any) -> float | None:
        store = ctx.store
        nodes = {name_of(n): n for n in store.list(NODES, copy_objects=False).items}
        pods = [p for p in store.list(PODS, copy_objects=False).items if p["spec"].get("nodeName")]
        claims_by_ns: dict[str, dict[str, Any]] = {}
        if ctx.dra:
            for claim in store.list(CLAIMS, copy_objects=False).items:
                claims_by_ns.setdefault(ns_of(claim), {})[name_of(claim)] = claim
        earliest: float | None = None
        live: set[str] = set()
        for pod in pods:
            live.add(uid_of(pod))
            if pod["spec"]["nodeName"] not in nodes:
                continue  # the node is gone: the pod garbage collector removes the pod
            if TWIN_GPU_PLUGIN in (meta(pod).get("annotations") or {}):
                continue  # twin/upgrade.py's GpuPlugins runs the GPU plugin pods
            try:
                wait = self._sync_pod(ctx, pod, claims_by_ns.get(ns_of(pod), {}))
            except ApiError as err:
                log.debug("kubelet: pod %s/%s: %s", ns_of(pod), name_of(pod), err.message)
                wait = 1.0
            if wait is not None:
                earliest = wait if earliest is None else min(earliest, wait)
        for uid in list(self._pods):
            if uid not in live:
                del self._pods[uid]
        if not ctx.dra:
            wait = self._node_gpus(ctx, nodes)
            if wait is not None:
                earliest = wait if earliest is None else min(earliest, wait)
        return earliest

    def _sync_pod(self, ctx: Any, pod: dict[str, Any], claims: dict[str, Any]) -> float | None:
        runtime = self._pods.get(uid_of(pod))
        if runtime is None:
            runtime = self._pods[uid_of(pod)] = _Pod(uid_of(pod), ctx.mono)
        if is_deleting(pod):
            return self._terminate(ctx, pod, runtime)
        if is_terminal(pod):
            return None
        if not runtime.started:
            due = runtime.bound_mono + ctx.options.pod_startup_seconds
            if ctx.mono < due:
                return due - ctx.mono
            if not ctx.dra and not self._assign_gpus(ctx, pod, runtime):
                return 1.0
            runtime.started = True
            runtime.start_time = ctx.now
            for container in pod["spec"].get("containers") or []:
                runtime.containers[container["name"]] = _Container(
                    container["name"], started_at=ctx.now, started_mono=ctx.mono
                )
        seen = (
            str(meta(pod).get("resourceVersion")),
            getattr(self.manager.faults, "epoch", 0),
            self._claim_changes,
        )
        if runtime.seen == seen and ctx.mono < runtime.next_due:
            return runtime.next_due - ctx.mono if runtime.next_due != float("inf") else None
        wait = self._run(ctx, pod, claims, runtime)
        runtime.seen = seen
        runtime.next_due = ctx.mono + wait if wait is not None else float("inf")
        return wait

    def _assign_gpus(self, ctx: Any, pod: dict[str, Any], runtime: _Pod) -> bool:
        need = pod_gpu_request(pod)
        if not need:
            return True
        node = pod["spec"]["nodeName"]
        taken = {
            gid for other in self._pods.values() if other is not runtime for gid in other.gpu_ids
        }
        faults = self.manager.faults
        # HAMi's device plugin hands out shares of the GPUs its scheduler recorded on the pod.
        chosen = hami.allocated_uuids(pod)
        free = [
            gid
            for gid in faults.plugin_device_ids(node)
            if gid not in taken
            and faults.health(node, gid)[0] == "Healthy"
            and (not chosen or hami.uuid_of_device_id(gid) in chosen)
        ]
        if chosen:  # one share of each recorded GPU
            firsts: dict[str, str] = {}
            for gid in free:
                firsts.setdefault(hami.uuid_of_device_id(gid), gid)
            free = list(firsts.values())
        if len(free) < need:
            log.info("kubelet: no free GPU for %s/%s on %s", ns_of(pod), name_of(pod), node)
            return False
        runtime.gpu_ids = free[:need]
        return True

    # -- running containers ----------------------------------------------------------------

    def _run(
        self, ctx: Any, pod: dict[str, Any], claims: dict[str, Any], runtime: _Pod
    ) -> float | None:
        policy = pod["spec"].get("restartPolicy") or "Always"
        annotations = meta(pod).get("annotations") or {}
        run_seconds = _float(annotations.get(ANN_RUN_SECONDS))
        exit_code = int(_float(annotations.get(ANN_EXIT_CODE)) or 0)
        earliest: float | None = None
        statuses: list[dict[str, Any]] = []
        for spec in pod["spec"].get("containers") or []:
            c = runtime.containers.setdefault(
                spec["name"], _Container(spec["name"], started_at=ctx.now, started_mono=ctx.mono)
            )
            resources, dead = self._container_resources(ctx, pod, spec, claims, runtime)
            seconds, code = run_seconds, exit_code
            if c.state == "running" and c.tool_mono != c.started_mono:
                c.tool = run_tool(self.manager, pod, spec, claims, runtime)
                c.tool_mono = c.started_mono
            if c.tool is not None:  # the tool decides how long it runs and how it exits
                seconds, code = c.tool.seconds, c.tool.exit_code
            wait = self._step(ctx, c, dead, seconds, code, policy, pod)
            if wait is not None:
                earliest = wait if earliest is None else min(earliest, wait)
            statuses.append(self._container_status(pod, spec, c, resources))
        self._write_status(ctx, pod, runtime, statuses, policy)
        return earliest

    def _step(
        self,
        ctx: Any,
        c: _Container,
        dead: bool,
        run_seconds: float | None,
        exit_code: int,
        policy: str,
        pod: dict[str, Any],
    ) -> float | None:
        opts = ctx.options
        if c.state == "backoff":
            if ctx.mono < c.retry_mono:
                return c.retry_mono - ctx.mono
            c.state, c.restarts = "running", c.restarts + 1
            c.started_at, c.started_mono = ctx.now, ctx.mono
        if c.state == "running":
            deadlines: list[tuple[float, int, str]] = []
            if dead:
                deadlines.append(
                    (c.started_mono + opts.crash_after_seconds, CRASH_EXIT_CODE, "Error")
                )
            if run_seconds is not None:
                reason = "Completed" if exit_code == 0 else "Error"
                deadlines.append((c.started_mono + run_seconds, exit_code, reason))
            if not deadlines:
                return None
            when, code, reason = min(deadlines)
            if ctx.mono < when:
                return when - ctx.mono
            c.state, c.exit_code, c.reason = "terminated", code, reason
            c.finished_at = ctx.now
            log.info(
                "kubelet: container %s of %s/%s exited %s", c.name, ns_of(pod), name_of(pod), code
            )
        if c.state == "terminated":
            restart = policy == "Always" or (policy == "OnFailure" and c.exit_code != 0)
            if not restart:
                return None
            c.last = {
                "terminated": {
                    "exitCode": c.exit_code,
                    "reason": c.reason,
                    "startedAt": rfc3339(c.started_at or ctx.now),
                    "finishedAt": rfc3339(c.finished_at or ctx.now),
                    "containerID": _container_id(pod, c),
                }
            }
            backoff = min(opts.crash_backoff_max, opts.crash_backoff_initial * 2**c.restarts)
            c.state, c.retry_mono = "backoff", ctx.mono + backoff
            ctx.events.controller(
                pod,
                "kubelet",
                "BackOff",
                f"Back-off restarting failed container {c.name} in pod "
                f"{name_of(pod)}_{ns_of(pod)}({uid_of(pod)})",
                etype="Warning",
                with_version=False,
                host=pod["spec"].get("nodeName"),
            )
            return backoff
        return None

    def _container_status(
        self,
        pod: dict[str, Any],
        spec: dict[str, Any],
        c: _Container,
        resources: list[dict[str, Any]],
    ) -> dict[str, Any]:
        if c.state == "running":
            state: dict[str, Any] = {"running": {"startedAt": rfc3339(c.started_at)}}  # type: ignore[arg-type]
        elif c.state == "backoff":
            state = {
                "waiting": {
                    "reason": "CrashLoopBackOff",
                    "message": (
                        f"back-off {_fmt_backoff(self, c)} restarting failed container={c.name} "
                        f"pod={name_of(pod)}_{ns_of(pod)}({uid_of(pod)})"
                    ),
                }
            }
        else:
            state = {
                "terminated": {
                    "exitCode": c.exit_code,
                    "reason": c.reason,
                    "startedAt": rfc3339(c.started_at),  # type: ignore[arg-type]
                    "finishedAt": rfc3339(c.finished_at),  # type: ignore[arg-type]
                    "containerID": _container_id(pod, c),
                }
            }
            fallback = spec.get("terminationMessagePolicy") == "FallbackToLogsOnError"
            if fallback and c.exit_code != 0 and c.tool is not None:
                state["terminated"]["message"] = "\n".join(c.tool.lines)[-2048:]
        status: dict[str, Any] = {
            "name": c.name,
            "image": spec.get("image", ""),
            "imageID": f"{spec.get('image', '')}@sha256:{'0' * 64}",
            "containerID": _container_id(pod, c),
            "ready": c.state == "running",
            "started": c.state == "running",
            "restartCount": c.restarts,
            "state": state,
            "lastState": c.last or {},
        }
        if resources:
            status["allocatedResourcesStatus"] = resources
        return status

    def _write_status(
        self,
        ctx: Any,
        pod: dict[str, Any],
        runtime: _Pod,
        statuses: list[dict[str, Any]],
        policy: str,
    ) -> None:
        containers = list(runtime.containers.values())
        all_done = all(c.state == "terminated" for c in containers) and containers
        if (
            all_done
            and policy != "Always"
            and not (policy == "OnFailure" and any(c.exit_code != 0 for c in containers))
        ):
            new_phase = "Succeeded" if all(c.exit_code == 0 for c in containers) else "Failed"
        elif all_done and policy == "Never":
            new_phase = "Failed"
        else:
            new_phase = "Running"
        ready = all(s["ready"] for s in statuses) and new_phase == "Running"
        node = pod["spec"]["nodeName"]
        if not runtime.ip:
            self._ip_counter += 1
            runtime.ip = f"10.244.{self._ip_counter // 250 % 250}.{self._ip_counter % 250 + 2}"

        def update(obj: dict[str, Any]) -> None:
            status = obj.setdefault("status", {})
            status["phase"] = new_phase
            status["startTime"] = rfc3339(runtime.start_time or ctx.now)
            status["hostIP"] = _node_ip(ctx, node)
            status["hostIPs"] = [{"ip": status["hostIP"]}]
            status["podIP"] = runtime.ip
            status["podIPs"] = [{"ip": runtime.ip}]
            status["containerStatuses"] = statuses
            status.setdefault("qosClass", "BestEffort")
            alive = new_phase == "Running"
            set_condition(
                status,
                "PodReadyToStartContainers",
                "True" if alive else "False",
                ctx.now,
                probe=True,
            )
            set_condition(status, "Initialized", "True", ctx.now, probe=True)
            if ready:
                set_condition(status, "Ready", "True", ctx.now, probe=True)
                set_condition(status, "ContainersReady", "True", ctx.now, probe=True)
            else:
                not_ready = [s["name"] for s in statuses if not s["ready"]]
                reason = (
                    "PodCompleted" if new_phase in ("Succeeded", "Failed") else "ContainersNotReady"
                )
                message = (
                    None
                    if reason == "PodCompleted"
                    else (f"containers with unready status: [{' '.join(not_ready)}]")
                )
                set_condition(status, "Ready", "False", ctx.now, reason, message, probe=True)
                set_condition(
                    status, "ContainersReady", "False", ctx.now, reason, message, probe=True
                )

        current = pod.get("status") or {}
        probe = _copy(current)
        update({"status": probe})
        if probe == current:
            return
        ctx.store.mutate(PODS, name_of(pod), update, ns_of(pod), subresource="status")

    # -- graceful deletion -----------------------------------------------------------------

    def _terminate(self, ctx: Any, pod: dict[str, Any], runtime: _Pod) -> float | None:
        if runtime.started and not runtime.killing and not is_terminal(pod):
            runtime.killing = True
            for name in runtime.containers:
                ctx.events.controller(
                    pod,
                    "kubelet",
                    "Killing",
                    f"Stopping container {name}",
                    with_version=False,
                    host=pod["spec"].get("nodeName"),
                )
        deadline = parse_time(meta(pod)["deletionTimestamp"])
        if ctx.now < deadline:
            return (deadline - ctx.now).total_seconds()
        if meta(pod).get("deletionGracePeriodSeconds") == 0 and is_terminal(pod):
            return None  # finished; another controller's finalizer keeps it
        if not is_terminal(pod):
            succeeded = bool(runtime.containers) and all(
                c.state == "terminated" and c.exit_code == 0 for c in runtime.containers.values()
            )

            def finish(obj: dict[str, Any]) -> None:
                status = obj.setdefault("status", {})
                status["phase"] = "Succeeded" if succeeded else "Failed"
                for cs in status.get("containerStatuses") or []:
                    if "terminated" in (cs.get("state") or {}):
                        continue
                    started = ((cs.get("state") or {}).get("running") or {}).get("startedAt")
                    cs["state"] = {
                        "terminated": {
                            "exitCode": TERMINATED_BY_SIGNAL,
                            "reason": "Error",
                            "startedAt": started or rfc3339(ctx.now),
                            "finishedAt": rfc3339(ctx.now),
                        }
                    }
                    cs["ready"] = False
                    cs["started"] = False
                set_condition(status, "Ready", "False", ctx.now, "PodCompleted", probe=True)
                set_condition(
                    status, "ContainersReady", "False", ctx.now, "PodCompleted", probe=True
                )

            ctx.store.mutate(PODS, name_of(pod), finish, ns_of(pod), subresource="status")
        try:
            ctx.store.delete(PODS, name_of(pod), ns_of(pod), grace_period_seconds=0)
        except ApiError:
            pass
        log.info("kubelet: pod %s/%s terminated", ns_of(pod), name_of(pod))
        return None

    # -- device plugin: node allocatable ---------------------------------------------------

    def _node_gpus(self, ctx: Any, nodes: dict[str, dict[str, Any]]) -> float | None:
        """Writes each device-plugin node's nvidia.com/gpu; returns when a stopped plugin's
        grace ends (simulated seconds from now), if one is running."""
        faults = self.manager.faults
        earliest: float | None = None
        for node_name in list(self._plugin_stops):  # a snapshot: a rollout adds from its thread
            if node_name not in nodes:
                self._plugin_stops.pop(node_name, None)
        for node_name, node in nodes.items():
            ids = faults.plugin_device_ids(node_name, include_vanished=True, obj=node)
            migs = faults.mig_gpus(node_name, obj=node)
            status = node.get("status") or {}
            if not ids and not migs and MIG_RESOURCE not in (status.get("capacity") or {}):
                continue

            def state(devices: list[str], per: int = 1, node: str = node_name) -> tuple[int, int]:
                health = [faults.health(node, d)[0] for d in devices]
                return per * sum(h != "Unknown" for h in health), per * health.count("Healthy")

            # resource -> (capacity, allocatable): whole GPUs (or their replicas, renamed
            # nvidia.com/gpu.shared: an nvidia.com/gpu once registered stays at 0), and MIG
            # instances (mixed)
            offered_as = faults.plugin_resource(node)
            want = {offered_as: state(ids)}
            for other in (GPU_RESOURCE, SHARED_RESOURCE):
                if other != offered_as and other in (status.get("capacity") or {}):
                    want[other] = (0, 0)
            if migs or MIG_RESOURCE in (status.get("capacity") or {}):
                want[MIG_RESOURCE] = state([g.uuid for g in migs], MIG_PER_GPU)
            repairs = getattr(self.manager, "repairs", None)
            stop = self._plugin_stops.get(node_name)
            if repairs is not None and repairs.rebooting(node_name):
                want = dict.fromkeys(want, (0, 0))  # the device plugin is down with the node
                self.restarted(node_name)
            elif stop is not None and any(c for c, _ in want.values()):
                self._plugin_stops.pop(node_name, None)  # a plugin registered again
            elif stop is not None:
                left = stop[0] + ctx.options.plugin_stop_grace - ctx.mono
                if left > 0:  # kept, unhealthy, until the grace ends
                    want = {r: (stop[1].get(r, 0), 0) for r in want}
                    earliest = left if earliest is None else min(earliest, left)
            wanted = {r: (str(c), str(a)) for r, (c, a) in want.items()}
            if all(
                (status.get("capacity") or {}).get(r) == c
                and (status.get("allocatable") or {}).get(r) == a
                for r, (c, a) in wanted.items()
            ):
                continue

            def update(obj: dict[str, Any], wanted: dict[str, tuple[str, str]] = wanted) -> None:
                st = obj.setdefault("status", {})
                for resource, (capacity, allocatable) in wanted.items():
                    st.setdefault("capacity", {})[resource] = capacity
                    st.setdefault("allocatable", {})[resource] = allocatable

            try:
                ctx.store.mutate(NODES, node_name, update, subresource="status")
            except ApiError:
                pass
        return earliest


# Drivers whose NodePrepareResources returns CDI device ids, and the CDI kind they use.
CDI_KINDS = {"gpu.nvidia.com": "k8s.gpu.nvidia.com/claim"}


def cdi_device_id(claim: dict[str, Any], driver: str, device: str) -> str | None:
    """The first CDI device id the driver returns for one allocated device (NVIDIA's DRA
    driver names them `<claim uid>-<device>`), None for drivers that return none."""
    kind = CDI_KINDS.get(driver)
    if kind is None:
        return None
    return f"{kind}={uid_of(claim)}-{device}"


def _resource(resource_id: str, health: str, message: str) -> dict[str, Any]:
    out = {"resourceID": resource_id, "health": health}
    if message:
        out["message"] = message
    return out


def _float(value: Any) -> float | None:
    try:
        return float(value) if value is not None else None
    except (TypeError, ValueError):
        return None


def _container_id(pod: dict[str, Any], c: _Container) -> str:
    return f"containerd://{uid_of(pod).replace('-', '')[:24]}{c.restarts:08x}{c.name[:8]}"


def _fmt_backoff(kubelet: Kubelet, c: _Container) -> str:
    seconds = int(kubelet.manager.options.crash_backoff_initial * 2 ** max(0, c.restarts))
    seconds = min(seconds, int(kubelet.manager.options.crash_backoff_max))
    return f"{seconds // 60}m{seconds % 60}s" if seconds >= 60 else f"{seconds}s"


def _node_ip(ctx: Any, node: str) -> str:
    obj = ctx.store.get_ref(NODES, node) if hasattr(ctx.store, "get_ref") else None
    for addr in ((obj or {}).get("status") or {}).get("addresses") or []:
        if addr.get("type") == "InternalIP":
            return str(addr.get("address"))
    return "10.0.0.1"


def _copy(obj: Any) -> Any:
    if isinstance(obj, dict):
        return {k: _copy(v) for k, v in obj.items()}
    if isinstance(obj, list):
        return [_copy(v) for v in obj]
    return obj
