"""Quarantine a physical GPU: DeviceTaintRules (served version from discovery), or the fallback
(Eviction API + node taint below the healthy-GPU threshold) where no rule is served. A GPU
HAMi shares: its UUID in the node's `hami.io/device-cordon` (HAMi v2.10+, setting
hami_device_cordon) or, without it, a NoSchedule taint on the whole node (`quarantine_hami`).

Rules: a rule's deviceSelector is exact driver/pool/device, so a group (MIG slices, vGPUs) gets
one rule per device. Names are deterministic: `taint_rule_name(node, uuid)` for a one-device
GPU, that name plus `-<device>` per device otherwise. Every rule carries
`app.kubernetes.io/managed-by: sickbay` and annotations (workflow id, reason, device key);
Sickbay never changes or deletes a rule without that label.

Idempotent create: POST; 409 AlreadyExists -> GET; identical -> "unchanged"; different -> PUT
with the read resourceVersion (409 -> re-read, converge). Happy path: 1 request per device.
"""

from __future__ import annotations

import functools
import logging
import re
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from temporalio.exceptions import ApplicationError

from activities.kube import hami
from activities.kube.client import ErrorKind, Kube, KubeError
from activities.kube.consumers import group_keys, list_claims
from activities.kube.devices import (
    NODES_MAX_AGE,
    get_node,
    gpu_capacity,
    gpu_inventory,
    list_slice_devices,
    node_pool_of,
    physical_gpus,
    shared_nodes,
)
from activities.kube.discovery import ClusterApis
from activities.kube.nodes import (
    add_quarantined,
    converge_node,
    quarantined_on,
    release_gpu,
    set_node_taint,
)
from activities.kube.pods import meta
from contract.errors import ERR_INVALID_INPUT, ERR_NO_TAINT_API
from contract.kube import (
    DeviceCounts,
    DraDevice,
    EvictPodsInput,
    EvictPodsResult,
    PodRef,
    QuarantineInput,
    QuarantineResult,
    ReleaseInput,
    ReleaseResult,
    ResolvedDevice,
)
from contract.names import (
    ANN_DEVICE_KEY,
    ANN_REASON,
    ANN_WORKFLOW_ID,
    LABEL_MANAGED_BY,
    MANAGED_BY_VALUE,
    normalise_id_part,
    taint_rule_name,
)

log = logging.getLogger(__name__)

RULES = "devicetaintrules.resource.k8s.io"
LABEL_NODE_POOL = "sickbay.dev/node-pool"
CONFLICT_RETRIES = 3  # re-read-and-converge attempts on 409 before Temporal retries
_LABEL_VALUE = re.compile(r"^([A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?)?$")
MANAGED_SELECTOR = f"{LABEL_MANAGED_BY}={MANAGED_BY_VALUE}"


def rule_plan(device: ResolvedDevice) -> list[tuple[str, DraDevice]]:
    """(rule name, device) for every device of the physical GPU."""
    base = taint_rule_name(device.node, device.gpu_uuid)
    if len(device.devices) == 1:
        return [(base, device.devices[0])]
    plan = []
    for dev in device.devices:
        suffix = normalise_id_part(dev.device)[:60] or "device"
        plan.append((f"{base[: 252 - len(suffix)].rstrip('-')}-{suffix}", dev))
    return plan


def is_managed(obj: dict[str, Any]) -> bool:
    return (meta(obj).get("labels") or {}).get(LABEL_MANAGED_BY) == MANAGED_BY_VALUE


def desired_rule(
    version: str, name: str, dev: DraDevice, inp: QuarantineInput, effect: str
) -> dict[str, Any]:
    labels = {LABEL_MANAGED_BY: MANAGED_BY_VALUE}
    pool = inp.device.node_pool
    if pool and _LABEL_VALUE.match(pool):
        labels[LABEL_NODE_POOL] = pool
    return {
        "apiVersion": f"resource.k8s.io/{version}",
        "kind": "DeviceTaintRule",
        "metadata": {
            "name": name,
            "labels": labels,
            "annotations": {
                ANN_WORKFLOW_ID: inp.workflow_id,
                ANN_REASON: inp.reason or "unhealthy GPU",
                ANN_DEVICE_KEY: inp.device.key,
            },
        },
        "spec": {
            "deviceSelector": {"driver": dev.driver, "pool": dev.pool, "device": dev.device},
            "taint": {"key": inp.taint_key, "value": inp.taint_value, "effect": effect},
        },
    }


def _same(existing: dict[str, Any], want: dict[str, Any]) -> bool:
    es, ws = existing.get("spec") or {}, want["spec"]
    et = es.get("taint") or {}
    wt = ws["taint"]
    sel = es.get("deviceSelector") or {}
    annotations = meta(existing).get("annotations") or {}
    return (
        {k: sel.get(k) for k in ("driver", "pool", "device")} == ws["deviceSelector"]
        and (et.get("key"), et.get("value") or "", et.get("effect"))
        == (wt["key"], wt["value"], wt["effect"])
        and all(annotations.get(k) == v for k, v in want["metadata"]["annotations"].items())
        and all(
            (meta(existing).get("labels") or {}).get(k) == v
            for k, v in want["metadata"]["labels"].items()
        )
    )


def _api(kube: Kube, version: str) -> Any:
    return kube.resource_by_version[version]


def read_rule(kube: Kube, version: str, name: str) -> dict[str, Any] | None:
    try:
        return kube.call(
            _api(kube, version).read_device_taint_rule, name, verb="get", resource=RULES, name=name
        )
    except KubeError as err:
        if err.kind is ErrorKind.NOT_FOUND:
            return None
        raise


def apply_rule(kube: Kube, version: str, want: dict[str, Any]) -> tuple[str, dict[str, Any]]:
    """Create or converge one rule -> ("created" | "updated" | "unchanged", rule)."""
    api = _api(kube, version)
    name = want["metadata"]["name"]
    for _ in range(CONFLICT_RETRIES):
        try:
            created = kube.call(
                api.create_device_taint_rule, want, verb="create", resource=RULES, name=name
            )
            kube.amend_cached(
                _rules_key(version), functools.partial(_with, _rule_entry(created or want))
            )
            return "created", created
        except KubeError as err:
            if err.kind is not ErrorKind.CONFLICT:
                raise
        existing = read_rule(kube, version, name)
        if existing is None:
            continue  # deleted between our create and read: create again
        if not is_managed(existing):
            raise ApplicationError(
                f"DeviceTaintRule {name} exists but is not managed by Sickbay "
                f"(no {LABEL_MANAGED_BY}={MANAGED_BY_VALUE}); Sickbay will not modify it. "
                "Rename or delete it, then retry.",
                type=ERR_INVALID_INPUT,
                non_retryable=True,
            )
        if _same(existing, want):
            return "unchanged", existing
        body = dict(existing)
        m = dict(meta(existing))
        m["labels"] = {**(m.get("labels") or {}), **want["metadata"]["labels"]}
        m["annotations"] = {**(m.get("annotations") or {}), **want["metadata"]["annotations"]}
        body["metadata"] = m
        spec = dict(existing.get("spec") or {})
        taint = dict(want["spec"]["taint"])
        old_taint = spec.get("taint") or {}
        if old_taint.get("timeAdded") and old_taint.get("effect") == taint["effect"]:
            taint["timeAdded"] = old_taint["timeAdded"]
        spec["deviceSelector"] = want["spec"]["deviceSelector"]
        spec["taint"] = taint
        body["spec"] = spec
        body["apiVersion"] = want["apiVersion"]
        try:
            updated = kube.call(
                api.replace_device_taint_rule, name, body, verb="update", resource=RULES, name=name
            )
            return "updated", updated
        except KubeError as err:
            if err.kind is not ErrorKind.CONFLICT:
                raise
    raise KubeError(
        ErrorKind.CONFLICT,
        status=409,
        verb="update",
        resource=RULES,
        name=name,
        message="rule kept changing",
    )


def quarantine_rules(
    kube: Kube, apis: ClusterApis, inp: QuarantineInput, effect: str | None = None
) -> QuarantineResult:
    version = apis.taint_version
    if version is None:
        raise ApplicationError(
            "this cluster serves no DeviceTaintRule version",
            type=ERR_NO_TAINT_API,
            non_retryable=True,
        )
    if not inp.device.devices:
        raise ApplicationError(
            f"device {inp.device.key} has no DRA devices to taint",
            type=ERR_INVALID_INPUT,
            non_retryable=True,
        )
    effect = effect or inp.effect
    if effect == "None" and not apis.effect_none:
        raise ApplicationError(
            f"effect None is not served by resource.k8s.io/{version} on {apis.server_version}",
            type=ERR_INVALID_INPUT,
            non_retryable=True,
        )
    actions = []
    names = []
    uids: dict[str, str] = {}
    for name, dev in rule_plan(inp.device):
        action, rule = apply_rule(kube, version, desired_rule(version, name, dev, inp, effect))
        actions.append(action)
        names.append(name)
        if meta(rule).get("uid"):
            uids[name] = str(meta(rule)["uid"])
    if all(a == "unchanged" for a in actions):
        overall = "unchanged"
    elif all(a == "created" for a in actions):
        overall = "created"
    else:
        overall = "updated"
    return QuarantineResult(
        mode="rule",
        rule_name=names[0],
        api_version=version,
        action=overall,  # type: ignore[arg-type]
        message=f"{effect} DeviceTaintRule(s) {', '.join(names)} ({', '.join(actions)})",
        rule_uids=uids,
    )


# --- preview (effect None) -----------------------------------------------------------------

_WOULD = re.compile(r"(\d+) pods? would be evicted")


def would_evict_from_claims(kube: Kube, device: ResolvedDevice, taint_key: str) -> list[PodRef]:
    """Pods reserving a claim on the group's devices that do not tolerate the taint key."""
    keys = group_keys(device)
    out: list[PodRef] = []
    for claim in list_claims(kube):
        alloc = ((claim.get("status") or {}).get("allocation") or {}).get("devices") or {}
        hit = [
            r
            for r in alloc.get("results") or []
            if (r.get("driver"), r.get("pool"), r.get("device")) in keys
        ]
        if not hit:
            continue
        tolerated = all(
            any(
                t.get("operator") == "Exists" and not t.get("key") or t.get("key") == taint_key
                for t in r.get("tolerations") or []
            )
            for r in hit
        )
        if tolerated:
            continue
        ns = meta(claim).get("namespace", "")
        for ref in (claim.get("status") or {}).get("reservedFor") or []:
            if ref.get("resource", "pods") == "pods":
                out.append(PodRef(namespace=ns, name=ref.get("name", ""), uid=ref.get("uid")))
    return out


def preview_fallback(inp: QuarantineInput, hami_cordon: bool = False) -> QuarantineResult:
    message = (
        "no DeviceTaintRule served: the fallback would evict these pods through the "
        "Eviction API (PodDisruptionBudgets honoured)"
    )
    if inp.device.hami:
        message = (
            f"HAMi: would add GPU {inp.device.gpu_uuid} to {hami.ANN_DEVICE_CORDON} on "
            f"{inp.device.node}"
            if hami_cordon
            else f"HAMi without a per-GPU cordon: would taint node {inp.device.node} NoSchedule "
            "and escalate node-quarantined"
        ) + "; would evict these pods through the Eviction API (PodDisruptionBudgets honoured)"
    return QuarantineResult(
        mode="dry-run",
        action="skipped",
        would_evict=list(inp.consumers),
        node_level="" if hami_cordon or not inp.device.hami else "no per-GPU cordon for HAMi",
        message=message,
    )


def parse_would_evict(conditions: list[dict[str, Any]]) -> int | None:
    for cond in conditions:
        match = _WOULD.search(str(cond.get("message") or ""))
        if match:
            return int(match.group(1))
    return None


# --- release -------------------------------------------------------------------------------


def _delete_rule(kube: Kube, version: str, name: str, uid: str | None = None) -> None:
    """Delete one DeviceTaintRule; with `uid`, only if the name still holds that very rule."""
    kwargs: dict[str, Any] = {"body": {"preconditions": {"uid": uid}}} if uid else {}
    kube.call(
        _api(kube, version).delete_device_taint_rule,
        name,
        verb="delete",
        resource=RULES,
        name=name,
        **kwargs,
    )
    kube.amend_cached(_rules_key(version), lambda rules: [r for r in rules if r[2] != name])


def release(kube: Kube, apis: ClusterApis, inp: ReleaseInput) -> ReleaseResult:
    messages: list[str] = []
    removed = False
    version = inp.api_version or apis.taint_version
    if version and inp.device.devices:
        wanted = {name for name, _ in rule_plan(inp.device)}
        if inp.rule_name:
            wanted.add(inp.rule_name)
        # Rules whose uid the quarantine recorded: delete with a uid precondition, one request
        # that can only remove that very rule (ours). 404: gone already; 409: the name now
        # belongs to another object, decided by the managed-label check below.
        unverified: set[str] = set()
        for name in sorted(wanted):
            uid = inp.rule_uids.get(name)
            if not uid:
                unverified.add(name)
                continue
            try:
                _delete_rule(kube, version, name, uid)
                removed = True
                messages.append(f"deleted rule {name}")
            except KubeError as err:
                if err.kind is ErrorKind.NOT_FOUND:
                    messages.append(f"rule {name} already gone")
                elif err.kind is ErrorKind.CONFLICT:
                    unverified.add(name)
                else:
                    raise
        body = (
            kube.call(
                _api(kube, version).list_device_taint_rule,
                verb="list",
                resource=RULES,
                label_selector=MANAGED_SELECTOR,
            )
            if unverified
            else {}
        )
        managed = {meta(r).get("name"): r for r in body.get("items") or []}
        for name in sorted(unverified):
            rule = managed.get(name)
            if rule is None:
                messages.append(f"rule {name} absent (or not Sickbay's): nothing to remove")
                continue
            try:
                _delete_rule(kube, version, name)
                removed = True
                messages.append(f"deleted rule {name}")
            except KubeError as err:
                if err.kind is not ErrorKind.NOT_FOUND:
                    raise
                messages.append(f"rule {name} already gone")
    if inp.node_tainted or not version or not inp.device.devices:
        node = get_node(kube, inp.device.node)
        if node is not None and inp.device.hami:
            node, changed = converge_node(
                kube, inp.device.node, hami.uncordon_change(inp.device.gpu_uuid), node
            )
            if changed:
                removed = True
                messages.append(f"took GPU {inp.device.gpu_uuid} out of {hami.ANN_DEVICE_CORDON}")
        if node is not None:
            _, changed = converge_node(
                kube, inp.device.node, release_gpu(inp.device.gpu_uuid, untaint=True), node
            )
            if changed:
                removed = True
                messages.append(f"removed Sickbay's quarantine marks from node {inp.device.node}")
    return ReleaseResult(removed=removed, message="; ".join(messages) or "nothing to release")


# --- budget count --------------------------------------------------------------------------


# How old a DeviceTaintRule list a budget count may use. A 200-GPU burst otherwise lists
# every rule for each count (quadratic in the burst). What a young list can miss is a rule
# another worker created since, and that rule belongs to a remediation holding a budget lease,
# which the budget counts anyway. This worker's own creates and deletes are applied to the
# cached list (they used to drop it: under a burst every count then listed every rule again,
# 200 lists of up to 400 rules), and while one count reloads an expired list the others use
# the one it replaces for up to RULES_STALE more (Kube.cached).
RULES_MAX_AGE = 1.0  # seconds
RULES_STALE = 5.0  # seconds


def _rules_key(version: str) -> tuple[str, str]:
    return ("managed-rules", version)


def _with(entry: tuple[str | None, str, str], rules: list[Any]) -> list[Any]:
    return [*rules, entry]


def _rule_entry(rule: dict[str, Any]) -> tuple[str | None, str, str]:
    """(node-pool label, device key, name) of one managed rule."""
    m = meta(rule)
    key = (m.get("annotations") or {}).get(ANN_DEVICE_KEY) or m.get("name", "")
    return ((m.get("labels") or {}).get(LABEL_NODE_POOL), key, m.get("name", ""))


def managed_rule_keys(kube: Kube, version: str) -> list[tuple[str | None, str]]:
    """(node-pool label, device key) of every DeviceTaintRule Sickbay manages: a list at most
    RULES_MAX_AGE old, with this worker's own creates and deletes applied to it; counts
    running at the same moment share the list one of them has under way (single flight)."""

    def load() -> list[tuple[str | None, str, str]]:
        body = kube.call(
            _api(kube, version).list_device_taint_rule,
            verb="list",
            resource=RULES,
            label_selector=MANAGED_SELECTOR,
        )
        return [_rule_entry(rule) for rule in body.get("items") or []]

    rules = kube.cached(_rules_key(version), RULES_MAX_AGE, load, stale=RULES_STALE)
    return [(pool, key) for pool, key, _ in rules]


@dataclass(frozen=True)
class _NodeSummary:
    """What a budget count needs of a node list, computed once per list (a burst of counts
    shares one list of maybe 1,000 nodes)."""

    pool_of: dict[str, str | None]
    capacity: dict[str, int]  # device plugin: nvidia.com/gpu capacity per node
    marked: list[tuple[str | None, str]]  # fallback quarantines recorded on nodes


def _summarize(nodes: list[dict[str, Any]]) -> _NodeSummary:
    pool_of: dict[str, str | None] = {}
    capacity: dict[str, int] = {}
    marked: list[tuple[str | None, str]] = []
    for n in nodes:
        name = meta(n).get("name", "")
        pool_of[name] = node_pool_of(n)
        capacity[name] = _hami_gpus(n) if hami.is_hami_node(n) else gpu_capacity(n)[0] or 0
        marked += [(pool_of[name], f"{name}/{uuid}") for uuid in quarantined_on(n)]
    return _NodeSummary(pool_of, capacity, marked)


def _hami_gpus(node: dict[str, Any]) -> int:
    """Physical GPUs of a HAMi node (its nvidia.com/gpu counts shares): the registered ones.
    One unreadable registration must not stop every budget count of the cluster: it counts
    as GPU feature discovery's `nvidia.com/gpu.count` (0 without it), with a warning."""
    try:
        return len(hami.node_gpus(node) or [])
    except hami.HamiFormatError as err:
        labels = meta(node).get("labels") or {}
        count = str(labels.get("nvidia.com/gpu.count", "0"))
        log.warning("budget count: %s; counting %s GPU(s) (nvidia.com/gpu.count)", err, count)
        return int(count) if count.isdigit() else 0


def count_devices(
    kube: Kube, apis: ClusterApis, node_pool: str | None, node: str | None = None
) -> DeviceCounts:
    """The budget's counts for `node_pool`, or (`node_pool` None) for the pool of `node`; the
    counts name the pool they counted."""
    nodes = shared_nodes(kube, max_age=NODES_MAX_AGE)  # usually resolve's list, ms old
    summary: _NodeSummary = kube.derived("node-summary", nodes, _summarize)
    pool_of = summary.pool_of
    if node_pool is None and node:
        node_pool = pool_of.get(node)
    counts = DeviceCounts(node_pool=node_pool)
    quarantined: set[tuple[str | None, str]] = set()  # (pool, device key)
    if apis.dra:
        # Physical GPUs per node, summarised from one cached ResourceSlice list (no device
        # objects: on 1,000 nodes x 16 devices that is a fraction of converting every device).
        per_node = gpu_inventory(kube)
        counts.cluster_devices = sum(per_node.values())
        counts.pool_devices = sum(
            n for node, n in per_node.items() if node_pool and pool_of.get(node) == node_pool
        )
        if apis.taint_version:
            for pool, key in managed_rule_keys(kube, apis.taint_version):
                quarantined.add((pool or pool_of.get(key.split("/")[0]), key))
    else:
        for name, capacity in summary.capacity.items():
            counts.cluster_devices += capacity
            if node_pool and pool_of.get(name) == node_pool:
                counts.pool_devices += capacity
    # Fallback quarantines are recorded on nodes (any mode: the taint API may have been off).
    quarantined.update(summary.marked)
    counts.cluster_quarantined = len({key for _, key in quarantined})
    counts.pool_quarantined = len(
        {key for pool, key in quarantined if node_pool and pool == node_pool}
    )
    return counts


# --- eviction ------------------------------------------------------------------------------


# Blocked evictions (429 from a PodDisruptionBudget) are tried again after 5 s, doubling to a
# minute: a budget frees up when a replacement turns Ready, which takes seconds to minutes.
BLOCKED_RETRY_INITIAL = 5.0
BLOCKED_RETRY_MAX = 60.0
_BUDGET_NAME = re.compile(r"disruption budget (\S+)")


def _budget_message(err: KubeError) -> str:
    """The server's reason a budget refused: `The disruption budget X needs 1 healthy pods
    and has 1 currently` (429), or the several-budgets message (500)."""
    causes = ((err.body or {}).get("details") or {}).get("causes") or []
    for cause in causes:
        if cause.get("reason") == "DisruptionBudget" and cause.get("message"):
            return str(cause["message"])
    return err.message


def budget_names(result: EvictPodsResult) -> list[str]:
    """PodDisruptionBudget names the blocked evictions named (for the escalation)."""
    names = {m.group(1) for text in result.budgets for m in _BUDGET_NAME.finditer(text)}
    return sorted(names)


def evict_pods(
    kube: Kube,
    inp: EvictPodsInput,
    *,
    sleep: Callable[[float], None] = time.sleep,
    clock: Callable[[], float] = time.monotonic,
) -> EvictPodsResult:
    """Eviction API per pod (see evict_once); with `retry_blocked_for`, the pods a budget
    blocks are tried again with backoff until they go or that time is up (never deleted:
    only `delete_if_blocked`, an explicit force, deletes past a budget)."""
    result = evict_once(kube, inp, inp.pods)
    if inp.retry_blocked_for is None or inp.delete_if_blocked:
        return result
    deadline = clock() + inp.retry_blocked_for.total_seconds()
    delay = BLOCKED_RETRY_INITIAL
    while result.blocked:
        left = deadline - clock()
        if left <= 0:
            break
        sleep(min(delay, left))
        delay = min(delay * 2, BLOCKED_RETRY_MAX)
        again = evict_once(kube, inp, result.blocked)
        result = EvictPodsResult(
            evicted=result.evicted + again.evicted,
            deleted=result.deleted + again.deleted,
            blocked=again.blocked,
            gone=result.gone + again.gone,
            budgets=again.budgets,
            attempts=result.attempts + 1,
        )
    return result


def evict_once(kube: Kube, inp: EvictPodsInput, pods: list[PodRef]) -> EvictPodsResult:
    """Eviction API per pod: 201 evicted, 404 gone, 429 blocked by a PDB (or deleted when
    `delete_if_blocked`), 409 on the uid precondition = a same-named replacement (gone)."""
    result = EvictPodsResult()
    for ref in pods:
        body: dict[str, Any] = {
            "apiVersion": "policy/v1",
            "kind": "Eviction",
            "metadata": {"name": ref.name, "namespace": ref.namespace},
        }
        if ref.uid:
            body["deleteOptions"] = {"preconditions": {"uid": ref.uid}}
        kwargs: dict[str, Any] = {"dry_run": "All"} if inp.dry_run else {}
        try:
            kube.call(
                kube.core.create_namespaced_pod_eviction,
                ref.name,
                ref.namespace,
                body,
                verb="create",
                resource="pods/eviction",
                name=ref.name,
                **kwargs,
            )
            result.evicted.append(ref)
            continue
        except KubeError as err:
            if err.kind is ErrorKind.NOT_FOUND or err.kind is ErrorKind.CONFLICT:
                result.gone.append(ref)
                continue
            # 429: a PDB forbids it now; 500 "more than one PodDisruptionBudget": also blocked.
            blocked = err.kind is ErrorKind.THROTTLED or (
                err.status == 500 and "DisruptionBudget" in err.message
            )
            if not blocked:
                raise
            refusal = _budget_message(err)
        if not inp.delete_if_blocked:
            result.blocked.append(ref)
            result.budgets.append(f"{ref.namespace}/{ref.name}: {refusal}")
            continue
        try:
            kube.call(
                kube.core.delete_namespaced_pod,
                ref.name,
                ref.namespace,
                verb="delete",
                resource="pods",
                name=ref.name,
                body={"preconditions": {"uid": ref.uid}} if ref.uid else None,
                **kwargs,
            )
            result.deleted.append(ref)
        except KubeError as err:
            if err.kind not in (ErrorKind.NOT_FOUND, ErrorKind.CONFLICT):
                raise
            result.gone.append(ref)
    return result


# --- fallback ------------------------------------------------------------------------------


def healthy_gpus_on_node(
    kube: Kube, apis: ClusterApis, device: ResolvedDevice, node: dict[str, Any]
) -> int:
    quarantined = set(quarantined_on(node)) | {device.gpu_uuid}
    if device.hami:
        try:
            registered = hami.node_gpus(node) or []
        except hami.HamiFormatError as err:
            raise err.application_error() from err
        return len({g.uuid for g in registered if g.healthy} - quarantined)
    if apis.dra:
        gpus = {uuid for _, uuid in physical_gpus(list_slice_devices(kube, device.node))}
        return len(gpus - quarantined)
    capacity, allocatable = gpu_capacity(node)
    return max(0, min(allocatable or 0, (capacity or 0) - len(quarantined)))


def quarantine_hami(
    kube: Kube, apis: ClusterApis, inp: QuarantineInput, *, device_cordon: bool
) -> QuarantineResult:
    """A GPU HAMi shares: with `device_cordon` (HAMi v2.10+), the UUID goes into the node's
    `hami.io/device-cordon`, which HAMi's scheduler honours and its device plugin never
    rewrites; else HAMi cannot be kept off one GPU and the node is tainted NoSchedule (the
    result's `node_level` says why, for the escalation). Either way the GPU is recorded on the
    node for the budget and its consumers (every share, from HAMi's records) are evicted
    through the Eviction API."""
    device = inp.device
    node, _ = converge_node(kube, device.node, add_quarantined(device.gpu_uuid))
    volcano = hami.is_volcano_node(node)
    device_cordon = device_cordon and not volcano
    if device_cordon:
        node, _ = converge_node(kube, device.node, hami.cordon_change(device.gpu_uuid), node)
    evicted = evict_pods(
        kube, EvictPodsInput(pods=inp.consumers, workflow_id=inp.workflow_id, reason=inp.reason)
    )
    healthy = healthy_gpus_on_node(kube, apis, device, node)
    node_level = ""
    if not device_cordon:
        why = (
            "Volcano's vGPU scheduler has no per-GPU cordon"
            if volcano
            else f"its per-GPU {hami.ANN_DEVICE_CORDON} needs HAMi v2.10+ and "
            "SICKBAY_HAMI_DEVICE_CORDON"
        )
        node_level = (
            f"HAMi's scheduler cannot be kept off GPU {device.gpu_uuid} alone ({why}): node "
            f"{device.node} tainted NoSchedule, its {healthy} healthy GPU(s) idle for new pods"
        )
    tainted = bool(node_level) or healthy < inp.fallback_node_threshold
    if tainted:
        converge_node(kube, device.node, set_node_taint(inp.workflow_id, inp.taint_value), node)
    parts = [
        f"HAMi {hami.ANN_DEVICE_CORDON} {device.gpu_uuid}"
        if device_cordon
        else "no per-GPU cordon for HAMi",
        f"evicted {len(evicted.evicted)} HAMi share holder(s) via the Eviction API",
    ]
    if evicted.blocked:
        parts.append(
            "PodDisruptionBudget blocked "
            + ", ".join(f"{p.namespace}/{p.name}" for p in evicted.blocked)
        )
    parts.append(
        node_level
        or f"{healthy} healthy GPU(s) left on {device.node}; node "
        + (
            "tainted NoSchedule"
            if tainted
            else f"not tainted (threshold {inp.fallback_node_threshold})"
        )
    )
    return QuarantineResult(
        mode="fallback",
        action="created",
        evicted=evicted.evicted + evicted.gone,
        blocked=evicted.blocked,
        node_tainted=tainted,
        hami_cordon=device_cordon,
        node_level=node_level,
        message="; ".join(parts),
    )


def quarantine_fallback(kube: Kube, apis: ClusterApis, inp: QuarantineInput) -> QuarantineResult:
    """No DeviceTaintRule: record the GPU on its node, evict its consumers through the
    Eviction API, and taint the node (NoSchedule) only below the healthy-GPU threshold."""
    device = inp.device
    node, _ = converge_node(kube, device.node, add_quarantined(device.gpu_uuid))
    evicted = evict_pods(
        kube, EvictPodsInput(pods=inp.consumers, workflow_id=inp.workflow_id, reason=inp.reason)
    )
    healthy = healthy_gpus_on_node(kube, apis, device, node)
    tainted = False
    if healthy < inp.fallback_node_threshold:
        _, _ = converge_node(
            kube, device.node, set_node_taint(inp.workflow_id, inp.taint_value), node
        )
        tainted = True
    parts = [
        f"no DeviceTaintRule served: evicted {len(evicted.evicted)} pod(s) via the Eviction API",
    ]
    if evicted.blocked:
        parts.append(
            "PodDisruptionBudget blocked "
            + ", ".join(f"{p.namespace}/{p.name}" for p in evicted.blocked)
        )
    parts.append(
        f"{healthy} healthy GPU(s) left on {device.node}; node "
        + (
            "tainted NoSchedule"
            if tainted
            else f"not tainted (threshold {inp.fallback_node_threshold})"
        )
    )
    return QuarantineResult(
        mode="fallback",
        action="created",
        evicted=evicted.evicted + evicted.gone,
        blocked=evicted.blocked,
        node_tainted=tainted,
        message="; ".join(parts),
    )


# --- preview and probe: rules with effect None ---------------------------------------------

PREVIEW_WAIT_SECONDS = 15  # the controller writes status ~0.2 s after create; 10 s cadence


def wait_rule_conditions(
    kube: Kube, version: str, names: list[str], timeout: float
) -> dict[str, list[dict[str, Any]]]:
    """Watch rules until each has a status condition for its generation (or `timeout`)."""
    from kubernetes import watch as k8s_watch

    api = _api(kube, version)
    kwargs: dict[str, Any] = {}
    if len(names) == 1:
        kwargs["field_selector"] = f"metadata.name={names[0]}"
    else:
        kwargs["label_selector"] = MANAGED_SELECTOR
    found: dict[str, list[dict[str, Any]]] = {}

    def take(rule: dict[str, Any]) -> None:
        m = meta(rule)
        if m.get("name") not in names:
            return
        conds = (rule.get("status") or {}).get("conditions") or []
        current = [
            c for c in conds if (c.get("observedGeneration") or 0) >= (m.get("generation") or 0)
        ]
        if current:
            found[m["name"]] = current

    body = kube.call(api.list_device_taint_rule, verb="list", resource=RULES, **kwargs)
    for rule in body.get("items") or []:
        take(rule)
    if len(found) == len(names):
        return found
    watcher = k8s_watch.Watch(return_type="object")
    try:
        for event in watcher.stream(
            api.list_device_taint_rule,
            resource_version=(body.get("metadata") or {}).get("resourceVersion", ""),
            timeout_seconds=max(1, int(timeout)),
            _request_timeout=(kube.timeout, timeout + kube.timeout),
            **kwargs,
        ):
            if event.get("type") in ("ADDED", "MODIFIED"):
                take(event.get("raw_object") or {})
            if len(found) == len(names):
                break
    except Exception as exc:
        from activities.kube.client import classify

        err = classify(exc, verb="watch", resource=RULES)
        if err.kind is not ErrorKind.TRANSIENT:
            raise err from exc
    finally:
        watcher.stop()
    return found


def delete_rule(kube: Kube, version: str, name: str) -> bool:
    """Delete one DeviceTaintRule; False if it was already gone."""
    try:
        _delete_rule(kube, version, name)
        return True
    except KubeError as err:
        if err.kind is ErrorKind.NOT_FOUND:
            return False
        raise


def preview(
    kube: Kube, apis: ClusterApis, inp: QuarantineInput, *, hami_cordon: bool = False
) -> QuarantineResult:
    """Dry run. With `effect: None` served: create short-lived preview rules, read the
    controller's verdict from their status, delete them. The pods that would go are computed
    from the claims (status messages only carry counts)."""
    if apis.taint_version is None or not inp.device.devices:
        if inp.device.hami and hami_cordon:
            node = get_node(kube, inp.device.node)
            hami_cordon = node is not None and not hami.is_volcano_node(node)
        return preview_fallback(inp, hami_cordon)
    would = would_evict_from_claims(kube, inp.device, inp.taint_key)
    if not apis.effect_none:
        return QuarantineResult(
            mode="dry-run",
            action="skipped",
            api_version=apis.taint_version,
            would_evict=would,
            message=f"effect None not served on {apis.server_version}: computed from claims only",
        )
    version = apis.taint_version
    names: list[str] = []
    try:
        for name, dev in rule_plan(inp.device):
            pname = f"{name[:244].rstrip('-')}-preview"
            want = desired_rule(version, pname, dev, inp, "None")
            want["metadata"]["annotations"][ANN_REASON] = f"preview: {inp.reason or 'dry run'}"
            apply_rule(kube, version, want)
            names.append(pname)
        conditions = wait_rule_conditions(kube, version, names, PREVIEW_WAIT_SECONDS)
    finally:
        for pname in names:
            delete_rule(kube, version, pname)
    messages = [c.get("message", "") for conds in conditions.values() for c in conds]
    counts = [parse_would_evict(conds) for conds in conditions.values()]
    if len(conditions) < len(names):
        verdict = (
            f"no rule status within {PREVIEW_WAIT_SECONDS} s: the device-taint eviction "
            "controller does not seem to run (feature gate DRADeviceTaintRules off in "
            "kube-controller-manager?)"
        )
    else:
        total = sum(c or 0 for c in counts)
        verdict = f"controller: {total} pod(s) would be evicted"
    return QuarantineResult(
        mode="dry-run",
        action="skipped",
        rule_name=rule_plan(inp.device)[0][0],
        api_version=version,
        would_evict=would,
        message="; ".join([verdict, *messages]),
    )
