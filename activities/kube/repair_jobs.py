"""The GPU rungs of closed-loop repair on the cluster: who holds a GPU, its reset group, the
reset Job, the validation Job (and its claim), waiting for a Job and cleaning up.

- Holders: every unfinished pod holding a device of the physical GPU(s) - DRA claims allocated
  on any device whose ResourceSlice `uuid`/`parentUUID` is the GPU (MIG slices, vGPUs and
  time-sliced replicas included), and device-plugin pods on the node asking for
  `nvidia.com/gpu` unless their `allocatedResourcesStatus` shows another GPU (a pod that does
  not say which GPU it has is counted: when in doubt, no reset; a HAMi pod holds the GPUs its
  `hami.io/vgpu-devices-allocated` names). An allocated claim no pod uses yet holds the device
  too.
- Reset group: the GPUs sharing the ResourceSlice attribute `sickbay.dev/resetGroup` with the
  GPU, else every GPU of the node when it carries `sickbay.dev/gpu-reset-group: node`, else the
  GPU alone. The NVIDIA DRA driver publishes neither (its devices carry type, uuid,
  productName, brand, architecture, cudaComputeCapability, driverVersion, cudaDriverVersion,
  pcieBusID, addressingMode and `resource.kubernetes.io/pcieRoot`; MIG devices parentUUID and
  profile): on HGX/NVSwitch nodes an administrator labels the node (or a driver build adds the
  attribute).
- Jobs are named after the remediation and the rung attempt (`sickbay-reset-<hash>`,
  `sickbay-validate-<hash>`): creating one again answers 409 AlreadyExists, read back as the
  same attempt (`created: false`), never a second Job. `backoffLimit: 0`: a failed reset or
  validation is a result for the ladder, not something to repeat blindly.
- Jobs run in the worker's repair namespace (`RepairConfig.namespace`, SICKBAY_REPAIR_NAMESPACE)
  as the ServiceAccount `sickbay-repair` (no permissions, no token mounted), with requests and
  limits. Images and commands come from the operator's allowlist (`RepairConfig.allowlist`,
  SICKBAY_REPAIR_ALLOWLIST): a runbook's image or command outside it is refused here too
  (RepairNotAllowed), whatever a recorded runbook says. Privileges, each only what it needs:
  the reset pod is privileged (a GPU reset through the driver needs every GPU device node
  and CAP_SYS_ADMIN); the validation pod is not: it gets the one GPU through its claim (DRA,
  the driver's CDI devices) or the container toolkit (device plugin), drops every capability,
  no privilege escalation, the runtime's seccomp profile; it runs as the image's user, not
  forced to non-root (DCGM's host engine is normally run as root). So the validation pod passes Pod Security `baseline`, the reset pod
  only `privileged` (docs/deploy.md).
- A Job whose pod is refused (its `FailedCreate` Warning Event: Pod Security, quota, a missing
  ServiceAccount) or cannot start (image pull, container config) is reported at the next poll
  with the API's own text (RepairJobRefused), not at the rung's timeout.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from temporalio.exceptions import ApplicationError

from activities.kube import hami
from activities.kube.client import ErrorKind, Kube, KubeError
from activities.kube.consumers import _may_hold, claim_devices, list_claims, list_node_pods
from activities.kube.devices import (
    SliceDevice,
    list_nodes,
    list_slice_devices,
    node_gpu_uuids,
    node_pool_of,
    offered_gpus,
)
from activities.kube.nodes import ANN_CORDONED_BY, converge_node, cordon_change, read_node
from activities.kube.pods import is_terminal, meta, pod_ref, requests_gpu
from activities.waiting import still_waiting
from contract.errors import (
    ERR_GPU_HELD,
    ERR_INVALID_INPUT,
    ERR_REPAIR_JOB_REFUSED,
    ERR_REPAIR_NOT_ALLOWED,
)
from contract.kube import PodRef
from contract.names import (
    ANN_REPAIR_KEY,
    ANN_WORKFLOW_ID,
    LABEL_REPAIR,
    REPAIR_NAMESPACE,
    REPAIR_SERVICE_ACCOUNT,
    RESET_GROUP_ATTRIBUTE,
    RESET_GROUP_LABEL,
)
from contract.repair_rungs import (
    CleanUpRepairJobInput,
    DrainPodsInput,
    DrainPodsResult,
    GpuHoldersInput,
    GpuHoldersResult,
    NodeGpusResult,
    RepairJobInput,
    RepairJobOutcome,
    RepairJobStarted,
    ResetGroupInput,
    ResetGroupResult,
    ValidationJobInput,
    WaitNodeGpusInput,
    WaitRepairJobInput,
)
from contract.runbook import RepairAllowlist, RepairWork, fill_command

JOBS = "jobs.batch"
CLAIMS = "resourceclaims.resource.k8s.io"
SUMMARY_LINES = 20  # log lines kept as a Job's summary (timeline, Events)
SUMMARY_CHARS = 1500
JOB_TTL_SECONDS = 24 * 3600  # a finished Job stays a day for people to read, then goes
# Requests and limits. A reset is one nvidia-smi call (tens of MB); dcgmi diag runs its
# plugins in the container (host memory in the hundreds of MB, more at levels 3-4), and the
# CPU feeds the GPU's stress tests: bounded so a diag cannot starve the node's other pods.
RESET_RESOURCES = {
    "requests": {"cpu": "100m", "memory": "64Mi"},
    "limits": {"cpu": "500m", "memory": "256Mi"},
}
VALIDATION_RESOURCES = {
    "requests": {"cpu": "500m", "memory": "512Mi"},
    "limits": {"cpu": "2", "memory": "2Gi"},
}
# The validation container: no privilege, no capability, the runtime's seccomp profile (Pod
# Security baseline; restricted would also need runAsNonRoot, which DCGM is not run with).
VALIDATION_SECURITY = {
    "privileged": False,
    "allowPrivilegeEscalation": False,
    "capabilities": {"drop": ["ALL"]},
    "seccompProfile": {"type": "RuntimeDefault"},
}
# Why a pod of a Job never starts: kubelet waiting reasons that do not fix themselves.
NOT_STARTING = frozenset(
    {
        "ErrImagePull",
        "ImagePullBackOff",
        "InvalidImageName",
        "ErrImageNeverPull",
        "CreateContainerConfigError",
        "CreateContainerError",
    }
)


@dataclass(frozen=True)
class RepairConfig:
    """The worker's repair settings: where Jobs run and what they may run."""

    namespace: str = REPAIR_NAMESPACE
    allowlist: RepairAllowlist = field(default_factory=RepairAllowlist)


def _allowed(
    config: RepairConfig, kind: RepairWork, image: str | None, command: list[str]
) -> tuple[str, list[str]]:
    try:
        return config.allowlist.resolve(kind, image, command)
    except ValueError as err:
        raise ApplicationError(
            f"{kind} Job not created: {err}", type=ERR_REPAIR_NOT_ALLOWED, non_retryable=True
        ) from err


def _namespace(config: RepairConfig, kind: RepairWork, asked: str | None) -> str:
    """The worker's repair namespace: a Job is created nowhere else (an input naming another,
    say one recorded before the setting changed, is refused, not followed)."""
    if asked and asked != config.namespace:
        raise ApplicationError(
            f"{kind} Job not created: namespace {asked!r} is not the repair namespace "
            f"{config.namespace!r} (SICKBAY_REPAIR_NAMESPACE)",
            type=ERR_REPAIR_NOT_ALLOWED,
            non_retryable=True,
        )
    return config.namespace


def resolve_reset(inp: RepairJobInput, config: RepairConfig) -> RepairJobInput:
    """The input with the worker's namespace and the allowlisted image and command."""
    namespace = _namespace(config, "reset", inp.namespace)
    image, command = _allowed(config, "reset", inp.image, inp.command)
    return inp.model_copy(update={"namespace": namespace, "image": image, "command": command})


def resolve_validation(inp: ValidationJobInput, config: RepairConfig) -> ValidationJobInput:
    namespace = _namespace(config, "validation", inp.namespace)
    image, command = _allowed(config, "validation", inp.image, inp.command)
    return inp.model_copy(update={"namespace": namespace, "image": image, "command": command})


def _name(kind: str, key: str) -> str:
    return f"sickbay-{kind}-{hashlib.sha256(key.encode()).hexdigest()[:16]}"


def _attempt_key(incident: str, kind: str, attempt: int) -> str:
    return f"{incident}/{kind}/{attempt}"


# -- holders and reset groups --------------------------------------------------------------------


def _node_devices(kube: Kube, node: str) -> list[SliceDevice]:
    """The node's DRA devices, read now; none where DRA is not served (device plugin)."""
    try:
        return list_slice_devices(kube, node, fresh=True)
    except KubeError as err:
        if err.kind is ErrorKind.NOT_FOUND:
            return []
        raise


def gpu_holders(kube: Kube, inp: GpuHoldersInput) -> GpuHoldersResult:
    found, _pods = _holders(kube, inp)
    return GpuHoldersResult(holders=sorted(set(found)))


def _holders(kube: Kube, inp: GpuHoldersInput) -> tuple[list[str], dict[str, PodRef]]:
    """(`ns/name (why)` of every holder, the holding pods by `ns/name`)."""
    wanted = {u.lower() for u in inp.gpu_uuids}
    ignore = set(inp.ignore_pods)
    found: list[str] = []
    pods: dict[str, PodRef] = {}
    devices = [
        d
        for d in _node_devices(kube, inp.node)
        if (d.physical_uuid or "").lower() in wanted or (d.uuid or "").lower() in wanted
    ]
    keys = {(d.driver, d.pool, d.device) for d in devices}
    if keys:
        for claim in list_claims(kube):
            held = [k for k in claim_devices(claim) if k in keys]
            if not held:
                continue
            ns, cname = meta(claim).get("namespace", ""), meta(claim).get("name", "")
            users = [
                r for r in (claim.get("status") or {}).get("reservedFor") or [] if r.get("name")
            ]
            live = []
            for ref in users:
                key = f"{ns}/{ref['name']}"
                if key in ignore:
                    continue
                pod = _pod(kube, ns, ref["name"])
                if pod is not None and not is_terminal(pod):
                    live.append(f"{key} (claim {cname} on {'/'.join(held[0])})")
                    pods[key] = pod_ref(pod)
            if not users and f"{ns}/{cname}" not in ignore:
                live.append(f"claim {ns}/{cname} allocated on {'/'.join(held[0])}")
            found.extend(live)
    for pod in list_node_pods(kube, inp.node):
        key = f"{meta(pod).get('namespace', '')}/{meta(pod).get('name', '')}"
        if key in ignore or is_terminal(pod) or not requests_gpu(pod):
            continue
        try:
            shares = hami.pod_gpu_uuids(pod)  # HAMi says which GPU the pod holds
        except hami.HamiFormatError as err:
            raise err.application_error() from err
        if shares is not None:
            if shares & wanted:
                found.append(f"{key} (HAMi share)")
                pods[key] = pod_ref(pod)
            continue
        if any(_may_hold(pod, u) for u in inp.gpu_uuids):
            found.append(f"{key} (nvidia.com/gpu)")
            pods[key] = pod_ref(pod)
    return found, pods


def _daemon_or_mirror(pod: dict[str, Any]) -> bool:
    m = meta(pod)
    if "kubernetes.io/config.mirror" in (m.get("annotations") or {}):
        return True
    return any(o.get("kind") == "DaemonSet" for o in m.get("ownerReferences") or [])


def node_gpus(kube: Kube, node: str) -> list[str]:
    """Every physical GPU of the node: its DRA devices' UUIDs, else the node's UUID list."""
    seen: list[str] = []
    for d in _node_devices(kube, node):
        if d.physical_uuid and d.physical_uuid not in seen:
            seen.append(d.physical_uuid)
    if seen:
        return seen
    obj = read_node(kube, node)
    try:
        registered = hami.node_gpus(obj)  # a HAMi node: the GPUs its device plugin registers
    except hami.HamiFormatError as err:
        raise err.application_error() from err
    return [g.uuid for g in registered] if registered is not None else node_gpu_uuids(obj)


def drain_pods(
    kube: Kube, inp: DrainPodsInput, repair_namespace: str = REPAIR_NAMESPACE
) -> DrainPodsResult:
    """The pods a rung must evict first: the holders of the reset group's GPUs, or every pod
    of the node (DaemonSet and mirror pods stay, as with `kubectl drain`; so do Sickbay's own
    Jobs in the repair namespace)."""
    skip = {*inp.ignore_namespaces, repair_namespace}
    gpus = node_gpus(kube, inp.node)
    if inp.gpu_uuids:
        _found, held = _holders(kube, GpuHoldersInput(node=inp.node, gpu_uuids=inp.gpu_uuids))
        refs = [p for key, p in sorted(held.items()) if p.namespace not in skip]
        return DrainPodsResult(pods=refs, node_gpu_uuids=gpus)
    refs = []
    for pod in list_node_pods(kube, inp.node):
        if is_terminal(pod) or _daemon_or_mirror(pod) or meta(pod).get("namespace") in skip:
            continue
        refs.append(pod_ref(pod))
    refs.sort(key=lambda p: (p.namespace, p.name))
    return DrainPodsResult(pods=refs, node_gpu_uuids=gpus)


def require_free(kube: Kube, inp: GpuHoldersInput) -> GpuHoldersResult:
    """The holders check as a gate: raises a retryable GpuStillHeld while anything holds it."""
    result = gpu_holders(kube, inp)
    if result.holders:
        raise ApplicationError(
            f"GPU {', '.join(inp.gpu_uuids)} on {inp.node} is still held by "
            f"{'; '.join(result.holders)}: no reset while it is in use",
            type=ERR_GPU_HELD,
        )
    return result


def _pod(kube: Kube, namespace: str, name: str) -> dict[str, Any] | None:
    try:
        return kube.call(
            kube.core.read_namespaced_pod, name, namespace, verb="get", resource="pods", name=name
        )
    except KubeError as err:
        if err.kind is ErrorKind.NOT_FOUND:
            return None
        raise


def reset_group(kube: Kube, inp: ResetGroupInput) -> ResetGroupResult:
    want = inp.gpu_uuid.lower()
    devices = _node_devices(kube, inp.node)
    group_of: dict[str, str] = {}
    order: dict[str, int] = {}
    for d in devices:
        physical = d.physical_uuid
        if not physical:
            continue
        order.setdefault(physical, d.index if d.index is not None else len(order))
        # Attributes are read short and lower-case (devices.py): `sickbay.dev/resetGroup`.
        value = d.attributes.get(RESET_GROUP_ATTRIBUTE.rsplit("/", 1)[-1].lower())
        if value:
            group_of[physical] = str(value)
    mine = next((g for u, g in group_of.items() if u.lower() == want), None)
    if mine is not None:
        members = sorted((u for u, g in group_of.items() if g == mine), key=lambda u: order[u])
        return ResetGroupResult(gpu_uuids=members, source="attribute")
    node = read_node(kube, inp.node)
    if (meta(node).get("labels") or {}).get(RESET_GROUP_LABEL) == "node":
        uuids = sorted(order, key=lambda u: order[u]) if order else node_gpu_uuids(node)
        if not any(u.lower() == want for u in uuids):
            uuids = [*uuids, inp.gpu_uuid]
        return ResetGroupResult(gpu_uuids=uuids, source="label")
    return ResetGroupResult(gpu_uuids=[inp.gpu_uuid], source="single")


# -- Jobs --------------------------------------------------------------------------------------


def _tolerations(taint_key: str) -> list[dict[str, Any]]:
    return [
        {"key": taint_key, "operator": "Exists"},  # Sickbay's own node taint (fallback mode)
        {"key": "node.kubernetes.io/unschedulable", "operator": "Exists", "effect": "NoSchedule"},
    ]


def _job(
    name: str,
    namespace: str,
    kind: str,
    key: str,
    workflow_id: str,
    pod_spec: dict[str, Any],
    timeout_seconds: int,
) -> dict[str, Any]:
    labels = {LABEL_REPAIR: kind}
    annotations = {ANN_REPAIR_KEY: key, ANN_WORKFLOW_ID: workflow_id}
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {
            "name": name,
            "namespace": namespace,
            "labels": labels,
            "annotations": annotations,
        },
        "spec": {
            "backoffLimit": 0,
            "activeDeadlineSeconds": max(1, timeout_seconds),
            "ttlSecondsAfterFinished": JOB_TTL_SECONDS,
            "template": {
                "metadata": {"labels": labels, "annotations": annotations},
                "spec": {"restartPolicy": "Never", **pod_spec},
            },
        },
    }


def _pod_identity() -> dict[str, Any]:
    """Repair pods talk to no API: their own ServiceAccount (no grants), no token mounted."""
    return {"serviceAccountName": REPAIR_SERVICE_ACCOUNT, "automountServiceAccountToken": False}


def reset_job_manifest(inp: RepairJobInput, config: RepairConfig | None = None) -> dict[str, Any]:
    inp = resolve_reset(inp, config or RepairConfig())
    uuids = ",".join(inp.gpu_uuids)
    command = fill_command(inp.command, uuid=uuids, node=inp.node, level=0)
    key = _attempt_key(inp.incident, "reset", inp.attempt)
    container = {
        "name": "reset",
        "image": inp.image,
        "command": command,
        # A reset goes through the driver to every device node of the GPU (and of its reset
        # group) and needs CAP_SYS_ADMIN: privileged, the only repair pod that is.
        "securityContext": {"privileged": True},
        "resources": RESET_RESOURCES,
        "terminationMessagePolicy": "FallbackToLogsOnError",
        # No GPU request: a reset must not wait for (or take) a GPU from the device plugin;
        # the container toolkit mounts the driver's tools for these variables.
        "env": [
            {"name": "NVIDIA_VISIBLE_DEVICES", "value": "all"},
            {"name": "NVIDIA_DRIVER_CAPABILITIES", "value": "utility"},
        ],
    }
    pod_spec = {
        "nodeName": inp.node,
        "containers": [container],
        "tolerations": [{"operator": "Exists"}],  # the node may carry any taint by now
        **_pod_identity(),
    }
    return _job(
        _name("reset", key),
        inp.namespace or REPAIR_NAMESPACE,  # resolve_reset filled it
        "reset",
        key,
        inp.workflow_id,
        pod_spec,
        int(inp.timeout.total_seconds()),
    )


def validation_manifests(
    kube: Kube | None, inp: ValidationJobInput, config: RepairConfig | None = None
) -> tuple[dict[str, Any], dict[str, Any] | None]:
    """(Job, claim or None). DRA: a claim selecting the device by its uuid attribute and
    tolerating Sickbay's taint; device plugin: pinned to the node, the GPU by UUID."""
    inp = resolve_validation(inp, config or RepairConfig())
    namespace = inp.namespace or REPAIR_NAMESPACE  # resolve_validation filled it
    key = _attempt_key(inp.incident, "validation", inp.attempt)
    name = _name("validate", key)
    command = fill_command(inp.command, uuid=inp.gpu_uuid, node=inp.node, level=inp.level)
    container: dict[str, Any] = {
        "name": "validate",
        "image": inp.image,
        "command": command,
        "securityContext": VALIDATION_SECURITY,
        "resources": dict(VALIDATION_RESOURCES),
        "terminationMessagePolicy": "FallbackToLogsOnError",
    }
    pod_spec: dict[str, Any] = {
        "containers": [container],
        "tolerations": _tolerations(inp.taint_key),
        **_pod_identity(),
    }
    claim: dict[str, Any] | None = None
    if inp.mode == "dra":
        if kube is not None and inp.driver and not (inp.pool and inp.device):
            inp = _device_of(kube, inp)  # a replaced node's new GPU: known by its UUID only
        if not (inp.driver and inp.pool and inp.device):
            raise ApplicationError(
                "validation on DRA needs the device (driver, pool, device)",
                type=ERR_INVALID_INPUT,
                non_retryable=True,
            )
        device_uuid = inp.gpu_uuid
        if kube is not None:
            for d in list_slice_devices(kube, inp.node, fresh=True):
                if (d.driver, d.pool, d.device) == (inp.driver, inp.pool, inp.device):
                    device_uuid = d.uuid or device_uuid
                    break
            else:
                raise ApplicationError(
                    f"device {inp.driver}/{inp.pool}/{inp.device} is not published on "
                    f"{inp.node}: nothing to validate",
                    type=ERR_INVALID_INPUT,
                    non_retryable=True,
                )
        expression = (
            f"device.driver == '{inp.driver}' && "
            f"device.attributes['{inp.driver}'].uuid == '{device_uuid}'"
        )
        claim = {
            "apiVersion": "resource.k8s.io/v1",
            "kind": "ResourceClaim",
            "metadata": {
                "name": name,
                "namespace": namespace,
                "labels": {LABEL_REPAIR: "validation"},
                "annotations": {ANN_REPAIR_KEY: key, ANN_WORKFLOW_ID: inp.workflow_id},
            },
            "spec": {
                "devices": {
                    "requests": [
                        {
                            "name": "gpu",
                            "exactly": {
                                "deviceClassName": inp.device_class,
                                "selectors": [{"cel": {"expression": expression}}],
                                # The device is still under Sickbay's DeviceTaintRule: the
                                # validation is the one pod allowed on it.
                                "tolerations": [{"key": inp.taint_key, "operator": "Exists"}],
                            },
                        }
                    ]
                }
            },
        }
        container["resources"] = {**VALIDATION_RESOURCES, "claims": [{"name": "gpu"}]}
        pod_spec["resourceClaims"] = [{"name": "gpu", "resourceClaimName": name}]
    else:
        pod_spec["nodeName"] = inp.node
        container["env"] = [
            {"name": "NVIDIA_VISIBLE_DEVICES", "value": inp.gpu_uuid},
            {"name": "NVIDIA_DRIVER_CAPABILITIES", "value": "compute,utility"},
        ]
    job = _job(
        name,
        namespace,
        "validation",
        key,
        inp.workflow_id,
        pod_spec,
        int(inp.timeout.total_seconds()),
    )
    return job, claim


def _device_of(kube: Kube, inp: ValidationJobInput) -> ValidationJobInput:
    """The node's DRA device of the GPU `inp.gpu_uuid` (the whole GPU, else a slice of it)."""
    want = inp.gpu_uuid.lower()
    devices = [d for d in list_slice_devices(kube, inp.node, fresh=True) if d.driver == inp.driver]
    found = next((d for d in devices if (d.uuid or "").lower() == want), None) or next(
        (d for d in devices if (d.physical_uuid or "").lower() == want), None
    )
    if found is None:
        raise ApplicationError(
            f"GPU {inp.gpu_uuid} is not published by {inp.driver} on {inp.node}: nothing to "
            "validate",
            type=ERR_INVALID_INPUT,
            non_retryable=True,
        )
    return inp.model_copy(update={"pool": found.pool, "device": found.device})


def _create_once(kube: Kube, resource: str, body: dict[str, Any]) -> bool:
    """Create; an AlreadyExists of the same attempt is that earlier create (False)."""
    ns, name = body["metadata"]["namespace"], body["metadata"]["name"]
    key = body["metadata"]["annotations"][ANN_REPAIR_KEY]
    create: Callable[..., Any]
    read: Callable[..., Any]
    if resource == JOBS:
        create, read = kube.batch.create_namespaced_job, kube.batch.read_namespaced_job
    else:
        create = kube.resource_v1.create_namespaced_resource_claim
        read = kube.resource_v1.read_namespaced_resource_claim
    try:
        kube.call(create, ns, body, verb="create", resource=resource, name=name)
        return True
    except KubeError as err:
        if err.kind is not ErrorKind.CONFLICT or err.body.get("reason") != "AlreadyExists":
            raise
    existing = kube.call(read, name, ns, verb="get", resource=resource, name=name)
    if (meta(existing).get("annotations") or {}).get(ANN_REPAIR_KEY) != key:
        raise ApplicationError(
            f"{resource} {ns}/{name} exists but is not Sickbay's for attempt {key}",
            type=ERR_INVALID_INPUT,
            non_retryable=True,
        )
    return False


def start_reset_job(
    kube: Kube, inp: RepairJobInput, config: RepairConfig | None = None
) -> RepairJobStarted:
    job = reset_job_manifest(inp, config)
    name, namespace = job["metadata"]["name"], job["metadata"]["namespace"]
    if inp.dry_run:
        return RepairJobStarted(
            namespace=namespace, job_name=name, created=False, dry_run=True, manifest=job
        )
    created = _create_once(kube, JOBS, job)
    return RepairJobStarted(namespace=namespace, job_name=name, created=created)


def start_validation_job(
    kube: Kube, inp: ValidationJobInput, config: RepairConfig | None = None
) -> RepairJobStarted:
    job, claim = validation_manifests(None if inp.dry_run else kube, inp, config)
    name, namespace = job["metadata"]["name"], job["metadata"]["namespace"]
    claim_name = claim["metadata"]["name"] if claim else None
    if inp.dry_run:
        return RepairJobStarted(
            namespace=namespace,
            job_name=name,
            created=False,
            claim_name=claim_name,
            dry_run=True,
            manifest=job,
        )
    if claim is not None:
        _create_once(kube, CLAIMS, claim)
    created = _create_once(kube, JOBS, job)
    return RepairJobStarted(
        namespace=namespace, job_name=name, created=created, claim_name=claim_name
    )


def _condition(obj: dict[str, Any], ctype: str) -> dict[str, Any] | None:
    for cond in (obj.get("status") or {}).get("conditions") or []:
        if cond.get("type") == ctype and cond.get("status") == "True":
            return dict(cond)
    return None


def _summary(kube: Kube, namespace: str, job_name: str) -> str:
    body = kube.call(
        kube.core.list_namespaced_pod,
        namespace,
        verb="list",
        resource="pods",
        label_selector=f"batch.kubernetes.io/job-name={job_name}",
    )
    pods = sorted(
        body.get("items") or [], key=lambda p: meta(p).get("creationTimestamp") or "", reverse=True
    )
    for pod in pods:
        name = meta(pod).get("name", "")
        try:
            text = kube.call(
                kube.core.read_namespaced_pod_log,
                name,
                namespace,
                verb="get",
                resource="pods/log",
                name=name,
                tail_lines=SUMMARY_LINES,
            ).get("raw", "")
        except KubeError:
            text = ""
        if not text:
            for cs in (pod.get("status") or {}).get("containerStatuses") or []:
                text = ((cs.get("state") or {}).get("terminated") or {}).get("message") or ""
        if text:
            return str(text).strip()[-SUMMARY_CHARS:]
    return ""


def wait_repair_job(kube: Kube, inp: WaitRepairJobInput) -> RepairJobOutcome:
    """Pass/fail once the Job ended; a retryable StillWaiting while it runs."""
    try:
        job = kube.call(
            kube.batch.read_namespaced_job,
            inp.job_name,
            inp.namespace,
            verb="get",
            resource=JOBS,
            name=inp.job_name,
        )
    except KubeError as err:
        if err.kind is ErrorKind.NOT_FOUND:
            raise ApplicationError(
                f"Job {inp.namespace}/{inp.job_name} is gone before it finished: no result",
                type=ERR_INVALID_INPUT,
                non_retryable=True,
            ) from err
        raise
    done, failed = _condition(job, "Complete"), _condition(job, "Failed")
    if not done:
        # Refused or never starting: the API's own reason now, not the rung's timeout.
        refused = _not_starting(kube, inp.namespace, job)
        if refused:
            raise ApplicationError(
                f"Job {inp.namespace}/{inp.job_name} {refused}",
                type=ERR_REPAIR_JOB_REFUSED,
                non_retryable=True,
            )
    if not done and not failed:
        raise still_waiting(f"Job {inp.namespace}/{inp.job_name} still running")
    summary = _summary(kube, inp.namespace, inp.job_name)
    if done:
        return RepairJobOutcome(passed=True, summary=summary, reason="Complete")
    reason = str((failed or {}).get("reason") or "Failed")
    message = str((failed or {}).get("message") or "")
    return RepairJobOutcome(passed=False, summary=summary or message, reason=reason)


def _events_of(kube: Kube, namespace: str, obj: dict[str, Any]) -> list[dict[str, Any]]:
    """The Warning Events about one object, newest last (listed by uid, as kubectl does)."""
    uid = meta(obj).get("uid")
    if not uid:
        return []
    body = kube.call(
        kube.core.list_namespaced_event,
        namespace,
        verb="list",
        resource="events",
        field_selector=f"involvedObject.uid={uid},type=Warning",
    )
    items = body.get("items") or []
    return sorted(items, key=lambda e: e.get("lastTimestamp") or e.get("eventTime") or "")


def _not_starting(kube: Kube, namespace: str, job: dict[str, Any]) -> str | None:
    """Why the Job's pod is refused or cannot start, in the API's words; None: not known to
    be stuck. A Job without any pod whose controller wrote `FailedCreate` (Pod Security, a
    quota, a missing ServiceAccount); a pod whose container waits for a reason that does not
    fix itself (NOT_STARTING: image pull, container config) or that the kubelet reported
    `Failed` about."""
    pods = (
        kube.call(
            kube.core.list_namespaced_pod,
            namespace,
            verb="list",
            resource="pods",
            label_selector=f"batch.kubernetes.io/job-name={meta(job).get('name', '')}",
        ).get("items")
        or []
    )
    if not pods:
        refused = [e for e in _events_of(kube, namespace, job) if e.get("reason") == "FailedCreate"]
        if refused:
            return f"cannot create its pod: FailedCreate: {refused[-1].get('message', '')}"
        return None
    for pod in pods:
        name = meta(pod).get("name", "")
        status = pod.get("status") or {}
        if status.get("phase") in ("Succeeded", "Failed"):
            continue
        for cs in [
            *(status.get("initContainerStatuses") or []),
            *(status.get("containerStatuses") or []),
        ]:
            waiting = (cs.get("state") or {}).get("waiting") or {}
            if waiting.get("reason") in NOT_STARTING:
                return (
                    f"pod {name} cannot start: {waiting['reason']}: {waiting.get('message', '')}"
                ).rstrip(": ")
        failed = [e for e in _events_of(kube, namespace, pod) if e.get("reason") == "Failed"]
        if failed:
            return f"pod {name} cannot start: Failed: {failed[-1].get('message', '')}"
    return None


def clean_up_repair_job(kube: Kube, inp: CleanUpRepairJobInput) -> None:
    """Delete the Job with its pods (foreground), then the validation claim; gone is fine."""
    steps: list[tuple[Callable[..., Any], str | None, str, dict[str, Any]]] = [
        (
            kube.batch.delete_namespaced_job,
            inp.job_name,
            JOBS,
            {"propagation_policy": "Foreground"},
        ),
        (kube.resource_v1.delete_namespaced_resource_claim, inp.claim_name, CLAIMS, {}),
    ]
    for fn, name, resource, kwargs in steps:
        if not name:
            continue
        try:
            kube.call(
                fn, name, inp.namespace, verb="delete", resource=resource, name=name, **kwargs
            )
        except KubeError as err:
            if err.kind is not ErrorKind.NOT_FOUND:
                raise


# -- nodes back after a reboot / replace -------------------------------------------------------


def _created(obj: dict[str, Any]) -> datetime | None:
    raw = meta(obj).get("creationTimestamp")
    try:
        return datetime.fromisoformat(str(raw).replace("Z", "+00:00")) if raw else None
    except ValueError:
        return None


def _ready_since(node: dict[str, Any], when: datetime) -> bool:
    for c in (node.get("status") or {}).get("conditions") or []:
        if c.get("type") == "Ready" and c.get("status") == "True":
            raw = c.get("lastTransitionTime")
            try:
                since = datetime.fromisoformat(str(raw).replace("Z", "+00:00")) if raw else None
            except ValueError:
                since = None
            return since is not None and since > when
    return False


def _ready(node: dict[str, Any]) -> bool:
    return any(
        c.get("type") == "Ready" and c.get("status") == "True"
        for c in (node.get("status") or {}).get("conditions") or []
    )


def _published(kube: Kube, node: dict[str, Any]) -> list[str]:
    """Physical GPU UUIDs the node's driver / device plugin publishes right now."""
    name = meta(node).get("name", "")
    devices = _node_devices(kube, name)
    if devices:
        return sorted({d.physical_uuid for d in devices if d.physical_uuid})
    count = offered_gpus(node, "allocatable", per_gpu=True) or 0  # a shared GPU once
    return node_gpu_uuids(node)[:count] if count else []


def wait_node_gpus(kube: Kube, inp: WaitNodeGpusInput) -> NodeGpusResult:
    """The node (or, after a replace, the pool's new node: another name, other GPU UUIDs)
    Ready with at least `expected_gpus` GPUs published; a retryable StillWaiting until then.
    With `guard_workflow_id` the replacement is cordoned for that workflow on the first look
    that finds it, Ready or not (its GPUs are unvalidated), and is the one followed."""
    previous = {u.lower() for u in inp.previous_uuids}
    if inp.asked_at is None or (inp.replaced and not inp.node_pool):
        raise ApplicationError(
            "waiting for a node after a rung needs when the rung was asked for (asked_at), "
            "and for a replacement the node pool",
            type=ERR_INVALID_INPUT,
            non_retryable=True,
        )
    if inp.replaced:
        since = inp.asked_at
        candidates = [
            n
            for n in list_nodes(kube)
            if node_pool_of(n) == inp.node_pool  # the same name too: a recreated VM keeps it
            and _created(n) is not None
            and _created(n) > since  # type: ignore[operator]
        ]
    else:
        try:
            candidates = [read_node(kube, inp.node)]
        except KubeError as err:
            if err.kind is not ErrorKind.NOT_FOUND:
                raise
            candidates = []
    waiting: list[str] = []
    eligible: list[tuple[dict[str, Any], list[str]]] = []
    for node in sorted(candidates, key=lambda n: meta(n).get("creationTimestamp") or ""):
        uuids = _published(kube, node)
        if inp.replaced and {u.lower() for u in uuids} & previous:
            continue  # an old node of the pool, not the replacement
        if inp.replaced and not previous.isdisjoint({u.lower() for u in node_gpu_uuids(node)}):
            continue
        eligible.append((node, uuids))
    cordoned, note = False, ""
    if inp.replaced and inp.guard_workflow_id and eligible:
        # Guard one replacement (the one this workflow cordoned on an earlier look, else the
        # oldest new node of the pool) the first time it is seen, Ready or not, and follow it.
        wf = inp.guard_workflow_id
        ours = [e for e in eligible if _cordoned_by(e[0]) == wf]
        target = ours[0] if ours else eligible[0]
        eligible = [target]
        cordoned, note = _guard(kube, meta(target[0]).get("name", ""), wf)
    for node, uuids in eligible:
        name = meta(node).get("name", "")
        # After a reboot the node must have been down since the request: Ready again later
        # than it (a node still Ready from before has not rebooted yet).
        rebooted = inp.replaced or _ready_since(node, inp.asked_at)
        if _ready(node) and rebooted and len(uuids) >= inp.expected_gpus:
            return NodeGpusResult(node=name, gpu_uuids=uuids, cordoned=cordoned, guard_note=note)
        if _ready(node) and not rebooted:
            waiting.append(f"{name}: still Ready since before the request (not rebooted yet)")
            continue
        state = f"{name}: {'Ready' if _ready(node) else 'not Ready'}, {len(uuids)} GPUs"
        if cordoned:  # said in every StillWaiting, so a rung that times out names it
            state += (
                f" (cordoned by Sickbay for {inp.guard_workflow_id}: its GPUs are unvalidated;"
                " uncordon it once they are checked)"
            )
        waiting.append(state)
    raise still_waiting(
        f"waiting for {'a replacement of ' if inp.replaced else ''}{inp.node}: "
        + ("; ".join(waiting) or "no node yet")
    )


def _cordoned_by(node: dict[str, Any]) -> str | None:
    return (meta(node).get("annotations") or {}).get(ANN_CORDONED_BY)


def _guard(kube: Kube, name: str, workflow_id: str) -> tuple[bool, str]:
    """Cordon a replacement node for `workflow_id` (idempotent): (Sickbay's cordon of this
    workflow is on it, what happened). A node someone else cordoned stays theirs."""
    outcome: dict[str, str] = {}
    try:
        node, _changed = converge_node(kube, name, cordon_change(True, workflow_id, outcome))
    except KubeError as err:
        if err.kind is not ErrorKind.NOT_FOUND:
            raise
        return False, f"node {name} is gone"
    return _cordoned_by(node) == workflow_id, outcome.get("message", "")
