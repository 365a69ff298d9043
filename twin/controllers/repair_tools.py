"""The twin's model of repair: what a GPU reset, a node reboot and a node replacement fix, and
what the reset / validation tools print and return.

There is no GPU behind the twin, so the kubelet stand-in recognises two commands in a
container (`command` + `args`, or a `sh -c` line) and plays them against the fault injector:

- `nvidia-smi -r -i <UUID>[,<UUID>...]` (also `--gpu-reset`, `--id=`): needs a privileged
  container (else exit 4, "Insufficient Permissions", as nvidia-smi). It fails with exit 255
  when another pod holds a device of the GPU (MIG slices, vGPUs and time-sliced replicas
  included: they share the physical GPU), with exit 3 when the GPU sits on an NVSwitch
  baseboard and the command does not name every GPU of the reset group, with exit 15 when the
  GPU fell off the bus (Xid 79) or vanished: the driver cannot reach it. Otherwise it clears
  the faults a reset clears (`RESET_CLEARS`) and exits 0; other faults (Xid 64 row-remap
  failure, 92 high single-bit error rate) stay: the reset "worked", validation will tell.
- `dcgmi diag -r <level>`: passes (exit 0) when every GPU the container holds is Healthy, else
  fails (exit 1) naming the failing GPU; no GPU at all fails too. Held GPUs are the claim's
  allocated devices (DRA) or `NVIDIA_VISIBLE_DEVICES` / the kubelet's assigned device IDs
  (device plugin).

Their output lines are added to the container's log (`GET .../log`); a non-zero exit with
`terminationMessagePolicy: FallbackToLogsOnError` also puts the log tail into
`state.terminated.message`, as the kubelet does.

Node rungs (`NodeRepairs`, a controller): `reboot(node)` takes the node NotReady
(`KubeletNotReady`) with its devices withdrawn (the DRA slice loses its devices; the device
plugin's capacity drops to 0) for `reboot_seconds`, then Ready again with a new
`status.nodeInfo.bootID` (as the kubelet reports after a boot), the devices republished and
the faults a reboot clears (`REBOOT_CLEARS`, and vanished devices) gone.
`replace(node)` deletes the node and lets its pool bring a new one under a new name (a new
Cluster API Machine), or with `same_name` under the same name (a recreated cloud VM), in both
cases with new GPU UUIDs (twin/controllers/nodepools.py `replace_node`). Pods on the node are not
modelled through a reboot: Sickbay drains a node before rebooting it.
"""

from __future__ import annotations

import logging
import shlex
import threading
import uuid
from dataclasses import dataclass, field
from typing import Any

from twin.controllers.allocator import claim_devices
from twin.controllers.common import (
    CLAIMS,
    GPU_RESOURCE,
    NODES,
    PODS,
    SLICES,
    is_terminal,
    meta,
    name_of,
    ns_of,
    pod_claim_name,
    set_condition,
    uid_of,
)

log = logging.getLogger(__name__)

# Xids a GPU reset recovers from (NVIDIA's Xid catalogue: "reset GPU"): double-bit / contained /
# uncontained ECC, micro-controller halts, NVLink errors, row-remap pending (applied by the
# reset), GSP RPC timeouts and errors.
RESET_CLEARS = frozenset({48, 61, 62, 63, 74, 94, 95, 119, 120})
# A reboot reaches a GPU that fell off the bus too (the PCIe link is retrained at boot).
REBOOT_CLEARS = RESET_CLEARS | {79}
# Neither clears Xid 64 (row-remap failure: no spare rows left) nor 92 (high single-bit error
# rate): the memory is wearing out, only new hardware helps.

RESET_GROUP_ATTRIBUTE = "sickbay.dev/resetGroup"
RESET_GROUP_LABEL = "sickbay.dev/gpu-reset-group"


@dataclass
class ToolRun:
    exit_code: int
    lines: list[str]
    seconds: float = 1.0


def _argv(container: dict[str, Any]) -> list[str]:
    argv = [str(a) for a in (container.get("command") or []) + (container.get("args") or [])]
    if len(argv) >= 3 and argv[0].rsplit("/", 1)[-1] in ("sh", "bash") and argv[1] == "-c":
        try:
            return shlex.split(argv[2])
        except ValueError:
            return argv
    return argv


def tool_of(container: dict[str, Any]) -> tuple[str, list[str]] | None:
    """("reset", [gpu ids]) or ("diag", [level]) for a container running one of the tools."""
    argv = _argv(container)
    if not argv:
        return None
    prog = argv[0].rsplit("/", 1)[-1]
    if prog == "nvidia-smi" and ("-r" in argv or "--gpu-reset" in argv):
        ids: list[str] = []
        for i, arg in enumerate(argv):
            if arg in ("-i", "--id") and i + 1 < len(argv):
                ids.extend(x for x in argv[i + 1].split(",") if x)
            elif arg.startswith("--id="):
                ids.extend(x for x in arg.split("=", 1)[1].split(",") if x)
        return "reset", ids
    if prog == "dcgmi" and len(argv) > 1 and argv[1] == "diag":
        level = "1"
        for i, arg in enumerate(argv):
            if arg in ("-r", "--run") and i + 1 < len(argv):
                level = argv[i + 1]
        return "diag", [level]
    return None


def reset_group(manager: Any, node: str, gpu_uuid: str) -> list[str]:
    """UUIDs of every GPU that resets together with `gpu_uuid` (itself alone without NVSwitch)."""
    gpus = manager.faults.gpus(node)
    if manager.dra:
        groups: dict[str, str] = {}
        for piece in manager.store.list(SLICES, field_selector=f"spec.nodeName={node}").items:
            for dev in (piece.get("spec") or {}).get("devices") or []:
                attrs = dev.get("attributes") or {}
                group = (attrs.get(RESET_GROUP_ATTRIBUTE) or {}).get("string")
                physical = (attrs.get("parentUUID") or attrs.get("uuid") or {}).get("string")
                if group and physical:
                    groups[str(physical)] = str(group)
        mine = groups.get(gpu_uuid)
        if mine is None:
            return [gpu_uuid]
        return [g.uuid for g in gpus if groups.get(g.uuid) == mine]
    obj = manager.store.try_get(NODES, node)
    if obj is not None and (meta(obj).get("labels") or {}).get(RESET_GROUP_LABEL) == "node":
        return [g.uuid for g in gpus]
    return [gpu_uuid]


def holders(manager: Any, node: str, devices: set[str], except_uid: str) -> list[str]:
    """`ns/pod` of every unfinished pod (other than `except_uid`) holding one of `devices`."""
    found: list[str] = []
    if manager.dra:
        for claim in manager.store.list(CLAIMS, copy_objects=False).items:
            if not any(str(d) in devices for d, _ in claim_devices(claim)):
                continue
            for ref in (claim.get("status") or {}).get("reservedFor") or []:
                pod = manager.store.try_get(PODS, ref.get("name", ""), ns_of(claim))
                if pod and uid_of(pod) != except_uid and not is_terminal(pod):
                    found.append(f"{ns_of(pod)}/{name_of(pod)}")
        return sorted(set(found))
    runtimes = dict(getattr(manager.kubelet, "_pods", {}))
    for pod in manager.store.list(PODS, field_selector=f"spec.nodeName={node}").items:
        runtime = runtimes.get(uid_of(pod))
        if uid_of(pod) == except_uid or is_terminal(pod) or runtime is None:
            continue
        if devices.intersection(runtime.gpu_ids):
            found.append(f"{ns_of(pod)}/{name_of(pod)}")
    return sorted(set(found))


def run_reset(
    manager: Any, pod: dict[str, Any], container: dict[str, Any], ids: list[str]
) -> ToolRun:
    node = pod["spec"].get("nodeName", "")
    faults = manager.faults
    if not (container.get("securityContext") or {}).get("privileged"):
        return ToolRun(4, ["Unable to reset GPU: Insufficient Permissions"])
    gpus = {g.uuid: g for g in faults.gpus(node)}
    by_index = {str(g.index): g for g in gpus.values()}
    targets = []
    for gid in ids:
        gpu = gpus.get(gid) or by_index.get(gid)
        if gpu is None:
            return ToolRun(6, [f"No GPU with id {gid} was found on this node"])
        targets.append(gpu)
    if not targets:
        return ToolRun(2, ["GPU reset needs a target: -i <UUID>"])
    named = {g.uuid for g in targets}
    for gpu in targets:
        group = reset_group(manager, node, gpu.uuid)
        if not set(group) <= named:
            return ToolRun(
                3,
                [
                    f"GPU {gpu.pci_bus_id} is part of an NVSwitch reset group: a GPU of this "
                    f"baseboard cannot be reset alone; reset all of {', '.join(group)} together"
                ],
            )
    by_uuid = {f.gpu_uuid: f for f in faults.faults() if f.node == node}
    lines: list[str] = []
    for gpu in targets:
        fault = by_uuid.get(gpu.uuid)
        if fault is not None and (fault.kind == "vanish" or fault.xid == 79):
            return ToolRun(
                15,
                [
                    f"Unable to determine the device handle for GPU {gpu.pci_bus_id}: GPU is "
                    "lost. Reboot the system to recover this GPU"
                ],
            )
        busy = holders(manager, node, set(gpu.devices), uid_of(pod))
        if busy:
            return ToolRun(
                255,
                [
                    f"GPU {gpu.pci_bus_id} is currently in use by another process "
                    f"({', '.join(busy)}).",
                    "1 device is currently being used by one or more other processes.",
                ],
            )
    for gpu in targets:
        fault = by_uuid.get(gpu.uuid)
        if fault is not None and fault.xid in RESET_CLEARS:
            faults.recover(node, gpu.uuid)
        lines.append(f"GPU {gpu.pci_bus_id} was successfully reset.")
    lines.append("All done.")
    log.info("twin: reset of %s on %s", ", ".join(sorted(named)), node)
    return ToolRun(0, lines, seconds=2.0)


def held_resource_ids(
    manager: Any,
    pod: dict[str, Any],
    container: dict[str, Any],
    claims: dict[str, Any],
    runtime: Any,
) -> list[str]:
    """Device resource IDs (driver/pool/device, or plugin device IDs) the container holds."""
    if manager.dra:
        out: list[str] = []
        for ref in (container.get("resources") or {}).get("claims") or []:
            for entry in pod["spec"].get("resourceClaims") or []:
                if entry.get("name") != ref.get("name"):
                    continue
                claim = claims.get(pod_claim_name(pod, entry) or "")
                if claim is not None:
                    out.extend(str(d) for d, _ in claim_devices(claim))
        return out
    env = {e.get("name"): e.get("value") for e in container.get("env") or []}
    visible = str(env.get("NVIDIA_VISIBLE_DEVICES") or "")
    limits = (container.get("resources") or {}).get("limits") or {}
    if GPU_RESOURCE in limits and runtime is not None and runtime.gpu_ids:
        return list(runtime.gpu_ids)  # the device plugin's choice overrides the variable
    if visible in ("", "void", "none"):
        return []
    node = pod["spec"].get("nodeName", "")
    gpus = manager.faults.gpus(node)
    if visible == "all":
        return [d for g in gpus for d in g.devices[:1]]
    out = []
    for gid in visible.split(","):
        gpu = next((g for g in gpus if gid in (g.uuid, str(g.index))), None)
        if gpu is not None:
            out.append(gpu.devices[0] if gpu.devices else gpu.uuid)
    return out


def run_diag(
    manager: Any,
    pod: dict[str, Any],
    container: dict[str, Any],
    level: str,
    claims: dict[str, Any],
    runtime: Any,
) -> ToolRun:
    node = pod["spec"].get("nodeName", "")
    try:
        lvl = int(level)
    except ValueError:
        return ToolRun(2, [f"Invalid run level {level!r}: expected 1, 2, 3 or 4"])
    held = held_resource_ids(manager, pod, container, claims, runtime)
    if not held:
        return ToolRun(1, ["Error: no GPUs were found to run the diagnostic on"])
    lines = [f"Successfully ran diagnostic level {lvl} on {len(held)} GPU(s)."]
    failed = False
    for rid in held:
        health, message, _fatal = manager.faults.health(node, rid)
        if health == "Healthy":
            lines.append(f"| {rid}: Pass")
        else:
            failed = True
            lines.append(f"| {rid}: Fail - {message or health}")
    lines.append("Result: " + ("Fail" if failed else "Pass"))
    return ToolRun(1 if failed else 0, lines, seconds=float(lvl))


def run_tool(
    manager: Any,
    pod: dict[str, Any],
    container: dict[str, Any],
    claims: dict[str, Any],
    runtime: Any,
) -> ToolRun | None:
    tool = tool_of(container)
    if tool is None or getattr(manager, "faults", None) is None:
        return None
    kind, args = tool
    if kind == "reset":
        return run_reset(manager, pod, container, args)
    return run_diag(manager, pod, container, args[0], claims, runtime)


# -- node rungs ---------------------------------------------------------------------------------


@dataclass
class _Reboot:
    node: str
    due: float
    withdrawn: list[dict[str, Any]] = field(default_factory=list)


class NodeRepairs:
    """Reboots and replacements of twin nodes (the cloud/Cluster API rungs end here)."""

    def __init__(self, manager: Any) -> None:
        self.manager = manager
        self._lock = threading.RLock()
        self._reboots: dict[str, _Reboot] = {}
        self.reboots: list[str] = []  # every node rebooted, in order (tests count them)
        self.replacements: list[str] = []
        self.starting_pools: set[str] = set()  # pools whose next new node is a replacement

    def reboot(self, node: str, seconds: float | None = None) -> None:
        wait = self.manager.options.reboot_seconds if seconds is None else float(seconds)
        self._down(node, wait, record=True)

    def _down(self, node: str, wait: float, record: bool) -> None:
        store = self.manager.store
        if store.try_get(NODES, node) is None:
            raise KeyError(f'node "{node}" not found')
        with self._lock:
            if node in self._reboots:
                return  # already rebooting: a second reset of the instance changes nothing
            entry = self._reboots[node] = _Reboot(node, self.manager.clock.monotonic() + wait)
            if record:
                self.reboots.append(node)

        def not_ready(obj: dict[str, Any]) -> None:
            status = obj.setdefault("status", {})
            set_condition(
                status,
                "Ready",
                "Unknown",
                self.manager.clock.now(),
                "NodeStatusUnknown",
                "Kubelet stopped posting node status.",
            )
            if not self.manager.dra:  # the kubelet keeps it at 0 until the node is back
                status.setdefault("capacity", {})[GPU_RESOURCE] = "0"
                status.setdefault("allocatable", {})[GPU_RESOURCE] = "0"

        store.mutate(NODES, node, not_ready, subresource="status")
        if self.manager.dra:
            for piece in store.list(SLICES, field_selector=f"spec.nodeName={node}").items:
                entry.withdrawn.append(piece)
                store.delete(SLICES, name_of(piece))
        log.info("twin: node %s rebooting", node)
        self.manager.poke()

    def replace(self, node: str, seconds: float | None = None, same_name: bool = False) -> str:
        wait = self.manager.options.provisioning_delay if seconds is None else float(seconds)
        # New hardware: the old GPUs' faults do not follow a recreated VM that keeps the name.
        if self.manager.faults is not None:
            self.manager.faults.forget_node(node)
        pool = self.manager.node_pools.replace_node(node, delay=wait, same_name=same_name)
        with self._lock:
            self.replacements.append(node)
            self.starting_pools.add(pool)
        return pool

    def registered(self, node: str, pool: str) -> None:
        """A pool node was just registered: a replacement's kubelet and GPU driver still start
        (`node_startup_seconds`): NotReady, nothing published, until then."""
        seconds = self.manager.options.node_startup_seconds
        with self._lock:
            if seconds <= 0 or pool not in self.starting_pools:
                return
            self.starting_pools.discard(pool)
        self._down(node, seconds, record=False)

    def rebooting(self, node: str) -> bool:
        with self._lock:
            return node in self._reboots

    def sync(self, ctx: Any) -> float | None:
        with self._lock:
            due = [r for r in self._reboots.values() if r.due <= ctx.mono]
            later = [r.due - ctx.mono for r in self._reboots.values() if r.due > ctx.mono]
            for r in due:
                del self._reboots[r.node]
        for r in due:
            self._come_back(ctx, r)
        return min(later) if later else None

    def _come_back(self, ctx: Any, r: _Reboot) -> None:
        store = ctx.store
        if store.try_get(NODES, r.node) is None:
            return

        def ready(obj: dict[str, Any]) -> None:
            # The kubelet reports the new boot's id (it reads /proc/sys/kernel/random/boot_id).
            obj.setdefault("status", {}).setdefault("nodeInfo", {})["bootID"] = str(uuid.uuid4())
            set_condition(
                obj.setdefault("status", {}),
                "Ready",
                "True",
                ctx.now,
                "KubeletReady",
                "kubelet is posting ready status",
            )

        store.mutate(NODES, r.node, ready, subresource="status")
        kept = ("name", "ownerReferences", "labels")
        for piece in r.withdrawn:  # the driver publishes its slice again after the boot
            body = {
                "metadata": {k: v for k, v in meta(piece).items() if k in kept},
                "spec": piece["spec"],
            }
            if store.try_get(SLICES, name_of(piece)) is None:
                store.create(SLICES, body)
        faults = self.manager.faults
        for fault in faults.faults():
            if fault.node == r.node and (fault.kind == "vanish" or fault.xid in REBOOT_CLEARS):
                faults.recover(r.node, fault.gpu_uuid)
        log.info("twin: node %s is back", r.node)
        self.manager.poke()


# -- Cluster API Machines -----------------------------------------------------------------------

ANN_REMEDIATE_MACHINE = "cluster.x-k8s.io/remediate-machine"


class MachineRemediation:
    """Cluster API's side of the node rungs, for `machines.cluster.x-k8s.io` (v1beta1) whose
    `status.nodeRef.name` names a twin node:

    - the annotation `cluster.x-k8s.io/remediate-machine` marks the Machine unhealthy for its
      MachineHealthCheck; the twin models an MHC whose remediation template is an external
      *reboot* remediator (as Metal3's reboot strategy): the node is rebooted once, and when
      it is back the remediator is done and the annotation is removed (a condition
      `Remediated` records it). `TwinOptions.capi_remediation = "replace"` models an MHC without
      a template instead: the owner deletes the Machine and its pool brings a new node;
    - deleting a Machine deletes its node; its MachineSet's replacement is a new node of the
      pool (new name, new GPU UUIDs) with a new Machine pointing at it.
    """

    def __init__(self, manager: Any) -> None:
        self.manager = manager
        self._known: dict[tuple[str, str], str] = {}  # (ns, machine) -> node
        self._rebooting: dict[tuple[str, str], str] = {}  # (ns, machine) -> node
        # Machines deleted since the last pass, with their node, as the store reported them:
        # one created and deleted between two passes is replaced too (a MachineSet keeps its
        # count whether or not anyone saw the Machine it lost).
        self._deleted: list[tuple[tuple[str, str], str]] = []
        self._deleted_lock = threading.Lock()
        self._subscribed_to: Any = None

    def _on_change(self, event: Any) -> None:
        from twin.controllers.common import MACHINES

        if event.type != "DELETED" or event.resource != MACHINES:
            return
        node = ((event.object.get("status") or {}).get("nodeRef") or {}).get("name")
        if node:
            with self._deleted_lock:
                self._deleted.append(((ns_of(event.object), name_of(event.object)), node))

    def sync(self, ctx: Any) -> float | None:
        from twin.controllers.common import MACHINES

        store = ctx.store
        if self._subscribed_to is not store:
            store.subscribe(self._on_change)
            self._subscribed_to = store
        try:
            machines = store.list(MACHINES).items
        except Exception:  # the resource is not served by this profile
            return None
        seen: dict[tuple[str, str], str] = {}
        repairs = self.manager.repairs
        for machine in machines:
            key = (ns_of(machine), name_of(machine))
            node = ((machine.get("status") or {}).get("nodeRef") or {}).get("name")
            if not node:
                continue
            seen[key] = node
            annotations = meta(machine).get("annotations") or {}
            if key in self._rebooting:
                if not repairs.rebooting(node):
                    self._done(ctx, machine)
                    del self._rebooting[key]
                continue
            if ANN_REMEDIATE_MACHINE not in annotations or meta(machine).get("deletionTimestamp"):
                continue
            if self.manager.options.capi_remediation == "replace":
                store.delete(MACHINES, name_of(machine), ns_of(machine))
                continue
            try:
                repairs.reboot(node)
            except KeyError:
                continue
            self._rebooting[key] = node
        with self._deleted_lock:
            deleted, self._deleted = self._deleted, []
        gone = {key: node for key, node in self._known.items() if key not in seen}
        for key, node in deleted:
            if key not in seen:
                gone.setdefault(key, node)
        # A Machine gone: so is its node, and its pool replaces it.
        for key, node in gone.items():
            self._rebooting.pop(key, None)
            if store.try_get(NODES, node) is not None:
                try:
                    new_node_pool = repairs.replace(node)
                    log.info(
                        "twin: machine %s/%s deleted, pool %s replaces %s",
                        *key,
                        new_node_pool,
                        node,
                    )
                except KeyError as err:
                    log.warning("twin: machine %s/%s deleted: %s", *key, err)
        self._known = seen
        return 1.0 if self._rebooting else None

    def _done(self, ctx: Any, machine: dict[str, Any]) -> None:
        from twin.controllers.common import MACHINES

        def update(obj: dict[str, Any]) -> None:
            (obj["metadata"].get("annotations") or {}).pop(ANN_REMEDIATE_MACHINE, None)

        ctx.store.mutate(MACHINES, name_of(machine), update, namespace=ns_of(machine))

        def status(obj: dict[str, Any]) -> None:
            set_condition(
                obj.setdefault("status", {}),
                "Remediated",
                "True",
                ctx.now,
                "ExternalRemediationSucceeded",
                "the node was rebooted and is Ready",
            )

        ctx.store.mutate(
            MACHINES, name_of(machine), status, namespace=ns_of(machine), subresource="status"
        )
