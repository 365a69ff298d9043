"""GPU plugin pods and the "after the upgrade the node forgot its GPU" story for the twin.

`GpuPlugins` is a controller (added by the ControllerManager; off until `install()`): once
installed it keeps, on every GPU node, the pods a GPU Operator cluster runs there, in
namespace `gpu-operator`, the way their DaemonSets would:

- device-plugin profile: `nvidia-device-plugin-daemonset-<5>` (label
  `app=nvidia-device-plugin-daemonset`, container `nvidia-device-plugin`);
- DRA profiles: `nvidia-dra-driver-gpu-kubelet-plugin-<5>` (label
  `app.kubernetes.io/name=nvidia-dra-driver-gpu`, `app.kubernetes.io/component=kubelet-plugin`,
  container `gpus`);
- both: `nvidia-operator-validator-<5>` (label `app=nvidia-operator-validator`).

They run with `runtimeClassName: nvidia`, as the GPU Operator's operands do. The kubelet
stand-in leaves them alone (annotation `twin.sickbay.dev/gpu-plugin`): this controller writes
their status.

`upgrade(node, kubelet=..., breaks=...)` plays a kubelet / container-runtime upgrade of one
node that breaks its GPU plugin in one of the documented ways, with the shapes a real cluster
shows:

| breaks   | plugin pod                                                  | Events (kubelet)   |
|----------|-------------------------------------------------------------|--------------------|
| `hook`   | Pending, waiting `CreateContainerError`: `error executing   | Warning `Failed`   |
|          | hook /usr/bin/nvidia-container-toolkit` (never started)      |                    |
| `nvml`   | Running 0/1, `CrashLoopBackOff`, last terminated exit 1,    | Warning `BackOff`  |
|          | message `could not load NVML library: libnvidia-ml.so.1`    |                    |
| `socket` | Running 1/1 (the plugin lost its kubelet socket and did not  | none               |
|          | re-register: nothing in its status says so)                  |                    |

and the node's `status.nodeInfo.kubeletVersion` / `containerRuntimeVersion` change. Every GPU
of the node vanishes (faults.py `vanish`: capacity 0 with the device plugin, devices gone from
the ResourceSlice with DRA). Deleting the plugin pod (a restart) brings a new one: with
`heals_on_restart` the GPUs come back and the pod is Ready; without, the new pod breaks the
same way. A reboot (twin repairs) does not heal it: the upgraded software is still there.
`recover(node)` undoes the break (a fixed toolkit rolled out).

An upgrade restarts the kubelet, which reads its device-manager checkpoint: a plugin's
resource counts 0 until the plugin registers again, so the capacity drops at once.
`rollout(node, breaks=hook|nvml)` is the other way a plugin breaks: a GPU Operator or
device-plugin DaemonSet update whose new pod cannot run, the kubelet running on. The old plugin
pod is replaced by a broken one; with the device plugin, the kubelet keeps the stopped plugin's
GPUs in capacity, none allocatable, for its 5-minute grace (`TwinOptions.plugin_stop_grace`,
kubelet.py), then drops them; the node's versions do not change. (`socket` is no rollout
break: a plugin loses its kubelet socket when the kubelet restarts.)
"""

from __future__ import annotations

import contextlib
import logging
import threading
import uuid
from dataclasses import dataclass
from typing import Any

from twin.clock import rfc3339
from twin.controllers.common import NODES, PODS, is_deleting, meta, name_of, ns_of
from twin.errors import ApiError

log = logging.getLogger(__name__)

NAMESPACE = "gpu-operator"
ANN_PLUGIN = "twin.sickbay.dev/gpu-plugin"  # the kubelet stand-in skips these pods
RUNTIME_CLASS = "nvidia"
BREAKS = ("hook", "nvml", "socket")
ROLLOUT_BREAKS = ("hook", "nvml")  # a plugin loses its kubelet socket only to a kubelet restart
DEVICE_PLUGIN = "device-plugin"
DRA_PLUGIN = "dra-kubelet-plugin"
VALIDATOR = "validator"

HOOK_MESSAGE = (
    "Error: container create failed: error executing hook "
    "`/usr/bin/nvidia-container-toolkit` (exit code: 1)"
)
NVML_MESSAGE = (
    "could not load NVML library: libnvidia-ml.so.1: cannot open shared object file: "
    "No such file or directory"
)


@dataclass
class UpgradeFault:
    node: str
    breaks: str
    heals_on_restart: bool
    kubelet_from: str
    kubelet_to: str
    runtime_from: str
    runtime_to: str
    since: str
    restarts: int = 0  # plugin pods deleted while broken
    kubelet_restarted: bool = True  # False: a plugin rollout on a running kubelet

    def to_json(self) -> dict[str, Any]:
        return {
            "node": self.node,
            "breaks": self.breaks,
            "healsOnRestart": self.heals_on_restart,
            "kubelet": {"from": self.kubelet_from, "to": self.kubelet_to},
            "runtime": {"from": self.runtime_from, "to": self.runtime_to},
            "since": self.since,
            "restarts": self.restarts,
            "kubeletRestarted": self.kubelet_restarted,
        }


def _labels(component: str) -> dict[str, str]:
    if component == DEVICE_PLUGIN:
        return {"app": "nvidia-device-plugin-daemonset"}
    if component == DRA_PLUGIN:
        return {
            "app.kubernetes.io/name": "nvidia-dra-driver-gpu",
            "app.kubernetes.io/component": "kubelet-plugin",
        }
    return {"app": "nvidia-operator-validator"}


def _prefix(component: str) -> str:
    return {
        DEVICE_PLUGIN: "nvidia-device-plugin-daemonset",
        DRA_PLUGIN: "nvidia-dra-driver-gpu-kubelet-plugin",
        VALIDATOR: "nvidia-operator-validator",
    }[component]


def _container(component: str) -> str:
    return {
        DEVICE_PLUGIN: "nvidia-device-plugin",
        DRA_PLUGIN: "gpus",
        VALIDATOR: "nvidia-operator-validator",
    }[component]


class GpuPlugins:
    """The controller (see the module docstring)."""

    def __init__(self, manager: Any) -> None:
        self.manager = manager
        self.enabled = False
        self._lock = threading.RLock()
        self._faults: dict[str, UpgradeFault] = {}
        # (node, component) whose pod has run: one missing later went away (a restart).
        self._ran: set[tuple[str, str]] = set()
        self._rolling: set[tuple[str, str]] = set()  # pods a rollout replaces: no restart
        # node -> (when its plugin registers again, the GPUs the restart hid)
        self._restarting: dict[str, tuple[float, list[str]]] = {}
        # Nodes whose plugin pod a healthy rollout replaced: the new pod is ContainerCreating
        # until its plugin registers (`_restarting` says when).
        self._starting: set[str] = set()
        self._rebooted: set[str] = set()  # nodes whose pods' containers ended with a reboot

    # ---- API (fault routes, tests, scenarios) ----------------------------------------------

    def install(self) -> None:
        """Run GPU plugin pods on every GPU node from now on."""
        self.enabled = True
        self.manager.poke()

    def faults(self) -> list[UpgradeFault]:
        with self._lock:
            return list(self._faults.values())

    def fault(self, node: str) -> UpgradeFault | None:
        with self._lock:
            return self._faults.get(node)

    def upgrade(
        self,
        node: str,
        *,
        kubelet: str | None = None,
        runtime: str | None = None,
        breaks: str = "hook",
        heals_on_restart: bool = True,
    ) -> UpgradeFault:
        if breaks not in BREAKS:
            raise ValueError(f"breaks must be one of {', '.join(BREAKS)}, not {breaks!r}")
        store = self.manager.store
        fault = self._new_fault(node, breaks, heals_on_restart, kubelet, runtime)

        def bump(o: dict[str, Any]) -> None:
            ni = o.setdefault("status", {}).setdefault("nodeInfo", {})
            ni["kubeletVersion"] = fault.kubelet_to
            ni["kubeProxyVersion"] = fault.kubelet_to
            ni["containerRuntimeVersion"] = fault.runtime_to

        store.mutate(NODES, node, bump, subresource="status")
        kubelet = getattr(self.manager, "kubelet", None)
        if kubelet is not None:
            kubelet.restarted(node)
        # The GPUs vanish before the fault is registered: a controller pass between the two
        # (its own thread) would otherwise read a registered fault with nothing vanished as a
        # reboot that republished them, and heal it before it broke.
        self.manager.faults.fail(node, "all", vanish=True)
        with self._lock:
            self._faults[node] = fault
        self.enabled = True
        # The upgraded kubelet restarted every container on the node: the plugin pods too.
        for pod in self._pods(node):
            self._write_status(pod, fault, fresh=False)
        self.manager.poke()
        log.info(
            "upgrade of %s: kubelet %s -> %s, plugin breaks: %s",
            node,
            fault.kubelet_from,
            fault.kubelet_to,
            breaks,
        )
        return fault

    def rollout(
        self, node: str, *, breaks: str = "nvml", heals_on_restart: bool = False
    ) -> UpgradeFault:
        """A GPU plugin rollout (a GPU Operator or device-plugin DaemonSet update, no node
        upgrade) whose new pod cannot run on `node`: the old plugin pod is replaced by one
        that breaks (`hook` or `nvml`) while the kubelet runs on, so with the device plugin
        the kubelet keeps the GPUs in capacity, none allocatable, for its grace period
        (kubelet.py), then drops them. The node's versions do not change."""
        if breaks not in ROLLOUT_BREAKS:
            raise ValueError(
                f"a rollout breaks one of {', '.join(ROLLOUT_BREAKS)}, not {breaks!r} (a "
                "plugin loses its kubelet socket when the kubelet restarts: an upgrade)"
            )
        fault = self._new_fault(node, breaks, heals_on_restart, kubelet_restarted=False)
        kubelet = getattr(self.manager, "kubelet", None)
        if kubelet is not None and not self.manager.dra:
            kubelet.device_plugin_stopped(node)
        self.manager.faults.fail(node, "all", vanish=True)  # before the fault: see upgrade()
        with self._lock:
            self._faults[node] = fault
        self._replace_plugin_pods(node)
        log.info("plugin rollout on %s breaks: %s (kubelet running)", node, breaks)
        return fault

    def roll_plugin(self, node: str, *, starts_after: float = 10.0) -> None:
        """A healthy GPU plugin rollout on `node` (a DaemonSet update, nothing broken): the old
        plugin pod is replaced while the kubelet runs on, so with the device plugin the kubelet
        keeps its GPUs in capacity, none allocatable (kubelet.py); the new pod is
        ContainerCreating (its image pull, the operator's validation init containers) for
        `starts_after` simulated seconds, then runs and registers, offering every GPU again.
        With a DRA driver the kubelet keeps the slices while its plugin restarts (it wipes
        them only after the plugin stayed away for a while): nothing vanishes."""
        self._gpu_node(node)
        if not self.manager.dra:
            kubelet = getattr(self.manager, "kubelet", None)
            if kubelet is not None:
                kubelet.device_plugin_stopped(node)
            faults = self.manager.faults
            broken = {f.gpu_uuid for f in faults.faults() if f.node == node}
            hidden = [g.uuid for g in faults.gpus(node) if g.uuid not in broken]
            for gpu in hidden:
                faults.fail(node, gpu, vanish=True)
        else:
            hidden = []
        with self._lock:
            self._restarting[node] = (
                self.manager.clock.monotonic() + max(0.0, starts_after),
                hidden,
            )
        self._new_plugin_pod(node)
        log.info("healthy plugin rollout on %s: its new pod starts in %.0f s", node, starts_after)

    def reboot(self, node: str, *, starts_after: float = 60.0) -> None:
        """`node` rebooted outside Sickbay (a kernel patch, a driver update), nothing broken:
        the kubelet comes back counting no GPU (device plugin: its checkpoint; DRA: it deletes
        the node's ResourceSlices) and the GPU plugin pod starts again, ContainerCreating for
        `starts_after` simulated seconds (the driver and toolkit validations of a GPU
        Operator), then registers and publishes every GPU."""
        self.restart_kubelet(node, republish_after=starts_after)
        with self._lock:
            self._starting.add(node)
            self._rebooted.add(node)
            fault = self._faults.get(node)
        for pod in self._pods(node):  # the same pods: the kubelet restarts their containers
            component = (meta(pod).get("annotations") or {}).get(ANN_PLUGIN, "")
            if component != VALIDATOR and not is_deleting(pod):
                self._write_status(pod, fault, fresh=False)
        with self._lock:
            self._rebooted.discard(node)
        log.info("reboot of %s: its GPU plugin pod starts in %.0f s", node, starts_after)

    def start_now(self, node: str) -> None:
        """The plugin a rollout or reboot is starting on `node` registers now (tests end a
        long start when they have seen what they came for)."""
        self._gpu_node(node)
        with self._lock:
            pending = self._restarting.get(node)
            if pending is not None:
                self._restarting[node] = (self.manager.clock.monotonic(), pending[1])
        self.manager.poke()

    def _new_plugin_pod(self, node: str) -> None:
        """Replace `node`'s GPU plugin pod with one that is ContainerCreating until the node's
        plugin registers again (`_restarting` says when); no restart counted."""
        with self._lock:
            self._starting.add(node)
        self._replace_plugin_pods(node)

    def _replace_plugin_pods(self, node: str) -> None:
        """Delete `node`'s GPU plugin pods (not the validator) as a DaemonSet rollout does; the
        controller's next pass creates their successors, counting no restart."""
        self.enabled = True
        for pod in self._pods(node):
            component = (meta(pod).get("annotations") or {}).get(ANN_PLUGIN, "")
            if component == VALIDATOR or is_deleting(pod):
                continue
            with self._lock:
                self._rolling.add((node, component))
            with contextlib.suppress(ApiError):  # the DaemonSet's new pod replaces it
                self.manager.store.delete(PODS, name_of(pod), NAMESPACE, grace_period_seconds=0)
        self.manager.poke()

    def restart_kubelet(self, node: str, *, republish_after: float = 5.0) -> None:
        """A routine kubelet restart (no upgrade, nothing broken): the kubelet starts by
        deleting the node's ResourceSlices (DRA) or reading its checkpoint, which counts the
        device plugin's GPUs 0 (device plugin), and the running plugin registers again
        `republish_after` simulated seconds later, publishing every GPU again."""
        self._gpu_node(node)
        kubelet = getattr(self.manager, "kubelet", None)
        if kubelet is not None:
            kubelet.restarted(node)
        faults = self.manager.faults
        # A GPU that already has a fault keeps it: the restart neither hides nor heals it.
        broken = {f.gpu_uuid for f in faults.faults() if f.node == node}
        hidden = [g.uuid for g in faults.gpus(node) if g.uuid not in broken]
        for gpu in hidden:
            faults.fail(node, gpu, vanish=True)
        with self._lock:
            self._restarting[node] = (
                self.manager.clock.monotonic() + max(0.0, republish_after),
                hidden,
            )
        self.manager.poke()

    def _gpu_node(self, node: str) -> dict[str, Any]:
        """The Node `node`, which has GPUs (KeyError: no such node; ValueError: no GPUs)."""
        obj = self.manager.store.try_get(NODES, node)
        if obj is None:
            raise KeyError(node)
        if not self.manager.faults.gpus(node):
            raise ValueError(f"node {node} has no GPUs")
        return dict(obj)

    def _new_fault(
        self,
        node: str,
        breaks: str,
        heals_on_restart: bool,
        kubelet: str | None = None,
        runtime: str | None = None,
        *,
        kubelet_restarted: bool = True,
    ) -> UpgradeFault:
        """The fault of `node`'s plugin breaking, its versions from now to `kubelet` /
        `runtime` (unchanged when None)."""
        info = (self._gpu_node(node).get("status") or {}).get("nodeInfo") or {}
        old_kubelet = str(info.get("kubeletVersion") or "")
        old_runtime = str(info.get("containerRuntimeVersion") or "")
        return UpgradeFault(
            node=node,
            breaks=breaks,
            heals_on_restart=heals_on_restart,
            kubelet_from=old_kubelet,
            kubelet_to=kubelet or old_kubelet,
            runtime_from=old_runtime,
            runtime_to=runtime or old_runtime,
            since=rfc3339(self.manager.clock.now()),
            kubelet_restarted=kubelet_restarted,
        )

    def recover(self, node: str) -> UpgradeFault | None:
        """The break is fixed (a toolkit that works with the new runtime rolled out)."""
        with self._lock:
            fault = self._faults.pop(node, None)
        if fault is not None:
            self.manager.faults.recover(node)
            for pod in self._pods(node):
                self._write_status(pod, None, fresh=False)
            self.manager.poke()
        return fault

    # ---- controller ----------------------------------------------------------------------

    def _components(self) -> tuple[str, ...]:
        return (DRA_PLUGIN if self.manager.dra else DEVICE_PLUGIN, VALIDATOR)

    def _pods(self, node: str) -> list[dict[str, Any]]:
        return [
            p
            for p in self.manager.store.list(PODS, namespace=NAMESPACE).items
            if p["spec"].get("nodeName") == node
            and ANN_PLUGIN in (meta(p).get("annotations") or {})
        ]

    def sync(self, ctx: Any) -> float | None:
        wake = self._registered_again(ctx)
        if not self.enabled:
            return wake
        store = ctx.store
        if store.try_get("namespaces", NAMESPACE) is None:
            store.create("namespaces", {"metadata": {"name": NAMESPACE}})
        for node in store.list(NODES, copy_objects=False).items:
            name = name_of(node)
            if not self.manager.faults.gpus(name):
                continue
            self._after_reboot(name)
            pods = self._pods(name)
            for pod in pods:
                if is_deleting(pod):
                    self._finish(ctx, pod)
            live = {
                (meta(p).get("annotations") or {}).get(ANN_PLUGIN)
                for p in pods
                if not is_deleting(p)
            }
            for component in self._components():
                if component not in live:
                    with self._lock:
                        rolled = (name, component) in self._rolling
                        self._rolling.discard((name, component))
                    if rolled:
                        pass  # the rollout's new pod: no restart of the old one
                    elif (name, component) in self._ran and component != VALIDATOR:
                        # Deleted (by anyone: this pass's finish or the kubelet's): the
                        # DaemonSet starts it again, which is the restart that may heal.
                        self._restarted(name)
                    self._create(ctx, name, component)
                    self._ran.add((name, component))
        return wake

    def _registered_again(self, ctx: Any) -> float | None:
        """Kubelet restarts whose plugin registered again by now publish their GPUs; returns
        when the next one is due (simulated seconds from now)."""
        with self._lock:
            due = [(n, gpus) for n, (at, gpus) in self._restarting.items() if at <= ctx.mono]
            for node, _gpus in due:
                del self._restarting[node]
            left = [at - ctx.mono for at, _gpus in self._restarting.values()]
        for node, gpus in due:
            for gpu in gpus:
                self.manager.faults.recover(node, gpu)
            with self._lock:
                started = node in self._starting
                self._starting.discard(node)
            if started:  # the rollout's new pod runs now
                with self._lock:
                    fault = self._faults.get(node)
                for pod in self._pods(node):
                    if not is_deleting(pod):
                        self._write_status(pod, fault, fresh=False)
            log.info("twin: the plugin on %s registered with the kubelet", node)
        return min(left) if left else None

    def _after_reboot(self, node: str) -> None:
        """A reboot republished the node's GPUs (twin repairs): the plugin starts again on the
        upgraded node, which heals it only as a restart would."""
        with self._lock:
            fault = self._faults.get(node)
        repairs = getattr(self.manager, "repairs", None)
        if fault is None or (repairs is not None and repairs.rebooting(node)):
            return
        faults = self.manager.faults
        if any(f.node == node and f.kind == "vanish" for f in faults.faults()):
            return
        with self._lock:
            fault.restarts += 1
            healed = fault.heals_on_restart
            if healed:
                self._faults.pop(node, None)
        if not healed:
            faults.fail(node, "all", vanish=True)
        for pod in self._pods(node):
            if not is_deleting(pod):
                self._write_status(pod, None if healed else fault, fresh=False)

    def _finish(self, ctx: Any, pod: dict[str, Any]) -> None:
        """A deleted plugin pod goes at once (the restart is counted when it is replaced)."""
        with contextlib.suppress(ApiError):
            ctx.store.delete(PODS, name_of(pod), ns_of(pod), grace_period_seconds=0)

    def _restarted(self, node: str) -> None:
        with self._lock:
            fault = self._faults.get(node)
            if fault is None:
                return
            fault.restarts += 1
            if fault.heals_on_restart:
                # The new plugin starts against the upgraded runtime and registers again.
                self._faults.pop(node, None)
                heal = True
            else:
                heal = False
        if heal:
            log.info("twin: plugin restart on %s brings its GPUs back", node)
            self.manager.faults.recover(node)
            for other in self._pods(node):
                if not is_deleting(other):
                    self._write_status(other, None, fresh=False)

    def _create(self, ctx: Any, node: str, component: str) -> None:
        suffix = uuid.uuid4().hex[:5]
        name = f"{_prefix(component)}-{suffix}"
        pod = {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {
                "name": name,
                "namespace": NAMESPACE,
                "labels": _labels(component),
                "annotations": {ANN_PLUGIN: component},
            },
            "spec": {
                "nodeName": node,
                "runtimeClassName": RUNTIME_CLASS,
                "priorityClassName": "system-node-critical",
                "tolerations": [{"operator": "Exists"}],
                "containers": [
                    {
                        "name": _container(component),
                        "image": "nvcr.io/nvidia/k8s-device-plugin:v0.17.1"
                        if component == DEVICE_PLUGIN
                        else "nvcr.io/nvidia/k8s-dra-driver-gpu:v25.3.0"
                        if component == DRA_PLUGIN
                        else "nvcr.io/nvidia/cloud-native/gpu-operator-validator:v25.3.0",
                    }
                ],
            },
        }
        try:
            created = ctx.store.create(PODS, pod, namespace=NAMESPACE)
        except ApiError as err:
            log.debug("twin: plugin pod on %s: %s", node, err.message)
            return
        with self._lock:
            fault = self._faults.get(node)
        self._write_status(created, fault, fresh=True)

    def _write_status(
        self, pod: dict[str, Any], fault: UpgradeFault | None, *, fresh: bool
    ) -> None:
        manager = self.manager
        now = rfc3339(manager.clock.now())
        node = pod["spec"].get("nodeName", "")
        component = (meta(pod).get("annotations") or {}).get(ANN_PLUGIN, "")
        container = _container(component)
        image = pod["spec"]["containers"][0]["image"]
        breaks = fault.breaks if fault is not None else ""
        if component == VALIDATOR and breaks == "socket":
            breaks = ""  # the validator's own containers start fine
        if component == VALIDATOR and breaks == "nvml":
            breaks = "hook"  # its toolkit-validation step runs the hook
        with self._lock:
            starting = node in self._starting and component != VALIDATOR
            rebooted = node in self._rebooted
        ready = (not breaks or breaks == "socket") and not starting
        old = (pod.get("status") or {}).get("containerStatuses") or [{}]
        restarts = int(old[0].get("restartCount") or 0)
        cid = f"containerd://{uuid.uuid4().hex}"
        if breaks == "hook":
            state: dict[str, Any] = {
                "waiting": {"reason": "CreateContainerError", "message": HOOK_MESSAGE}
            }
            last: dict[str, Any] = {}
            phase = "Pending"
            started = False
            event: tuple[str, str, str] | None = ("Warning", "Failed", HOOK_MESSAGE)
        elif breaks == "nvml":
            restarts += 1
            state = {
                "waiting": {
                    "reason": "CrashLoopBackOff",
                    "message": f"back-off 10s restarting failed container={container} "
                    f"pod={name_of(pod)}_{NAMESPACE}({meta(pod).get('uid')})",
                }
            }
            last = {
                "terminated": {
                    "exitCode": 1,
                    "reason": "Error",
                    "message": f"E1205 error starting plugins: {NVML_MESSAGE}\n",
                    "startedAt": now,
                    "finishedAt": now,
                    "containerID": cid,
                }
            }
            phase = "Running"
            started = False
            event = (
                "Warning",
                "BackOff",
                f"Back-off restarting failed container {container} in pod "
                f"{name_of(pod)}_{NAMESPACE}({meta(pod).get('uid')})",
            )
        elif starting:
            state = {"waiting": {"reason": "ContainerCreating"}}
            last = {}
            phase = "Pending"
            if rebooted:  # its container ended with the node: as the kubelet reports it
                restarts += 1
                last = {"terminated": {"exitCode": 255, "reason": "Unknown", "finishedAt": now}}
                phase = "Running"
            started = False
            event = None
        else:
            state = {"running": {"startedAt": now}}
            # A reboot's end stays the last state, as the kubelet keeps it.
            before = (old[0].get("lastState") or {}).get("terminated") or {}
            last = {"terminated": before} if before.get("reason") == "Unknown" else {}
            phase = "Running"
            started = True
            event = None
        status_cs = {
            "name": container,
            "image": image,
            "imageID": image,
            "ready": ready,
            "started": started,
            "restartCount": restarts,
            "state": state,
            "lastState": last,
        }
        if "running" in state:
            status_cs["containerID"] = cid

        def cond(ctype: str, value: bool, reason: str = "") -> dict[str, Any]:
            c: dict[str, Any] = {
                "type": ctype,
                "status": "True" if value else "False",
                "lastProbeTime": None,
                "lastTransitionTime": now,
            }
            if not value and reason:
                c["reason"] = reason
            return c

        def update(obj: dict[str, Any]) -> None:
            st = obj.setdefault("status", {})
            st["phase"] = phase
            st["hostIP"] = "10.0.0.1"
            st.setdefault("startTime", now)
            st["qosClass"] = "BestEffort"
            st["conditions"] = [
                cond("PodReadyToStartContainers", True),
                cond("Initialized", True),
                cond("Ready", ready, "ContainersNotReady"),
                cond("ContainersReady", ready, "ContainersNotReady"),
                cond("PodScheduled", True),
            ]
            st["containerStatuses"] = [status_cs]

        try:
            current = manager.store.mutate(
                PODS, name_of(pod), update, NAMESPACE, subresource="status"
            )
        except ApiError:
            return
        if fresh:
            manager.events.controller(
                current,
                "kubelet",
                "Pulled",
                f'Container image "{image}" already present on machine',
                with_version=False,
                host=node,
            )
        if event is not None:
            etype, reason, message = event
            manager.events.controller(
                current, "kubelet", reason, message, etype=etype, with_version=False, host=node
            )
