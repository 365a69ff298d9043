"""Watch-based waits: consumers gone, replacements Running (or Pending and why), churn.

Both waits heartbeat their progress so a worker restart resumes: the next attempt reads
`activity.info().heartbeat_details` and keeps the facts already seen (pods gone, evictions per
owner). The eviction wait also keeps its original deadline (`{"deadline": <epoch s>, ...}`:
it never starts over). The replacement wait has no deadline at all: the workflow's durable
timer is the Pending deadline, and it cancels this watch when the timer fires (then looks once
with `look_once`), so the wait can be extended and never decides "deadline passed" itself.
Each wait costs one list + one watch per namespace set, plus reads of the owners and claim
lists when replacements bind.

"Gone" means the pod object is gone (or replaced under the same name with a new uid): a pod
with a deletionTimestamp still holds its device. Replacements are verified, not trusted: a
replacement whose claim got a device Sickbay tainted (HAMi: whose placement record names the
quarantined GPU), and owners whose new pods keep being
evicted by the device-taint manager (DisruptionTarget reason DeletionByDeviceTaintManager,
the same signal as the DeviceTaintManagerEviction event), are reported as churn.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from concurrent.futures import Executor
from dataclasses import dataclass, field
from typing import Any

from temporalio import activity

from activities.kube import hami
from activities.kube.client import ErrorKind, Kube, KubeError
from activities.kube.consumers import claim_devices
from activities.kube.pods import claim_names, is_terminating, meta, pod_ref, same_pod
from activities.kube.watching import watch_until
from contract.kube import (
    ChurnDiagnosis,
    EvictionReport,
    OwnerRef,
    PodRef,
    PodState,
    ReplacementReport,
    WaitEvictionInput,
    WaitReplacementInput,
)

HEARTBEAT_EVERY = 10.0  # seconds; the workflow's heartbeat_timeout must be larger (e.g. 60 s)
TAINT_MANAGER_REASON = "DeletionByDeviceTaintManager"
DIAG_SCHEDULER = (
    "replacement pods of {owner} were evicted {n} times by the device-taint manager: the "
    "scheduler is placing them on tainted devices. Kubernetes 1.36 schedulers before the fix "
    "for kubernetes#139651 (back-ported as #139681) ignore DeviceTaintRules; upgrade the "
    "control plane or keep the taint NoSchedule and evict through the Eviction API."
)
DIAG_BOUND = (
    "replacement {pods} of {owner} was placed on the quarantined device {devices} although the "
    "DeviceTaintRule forbids it (NoSchedule): the scheduler ignores DeviceTaintRules "
    "(Kubernetes 1.36 schedulers before the fix for kubernetes#139651, back-ported as "
    "#139681). Under NoSchedule nothing evicts it: it runs on the failed GPU. Upgrade the "
    "control plane."
)
DIAG_TOLERATION = (
    "replacement pods of {owner} were evicted {n} times although their claims tolerate the "
    "taint with tolerationSeconds: the toleration window had already expired when they were "
    "scheduled onto the tainted device; remove the toleration or the tolerationSeconds."
)


def _details() -> dict[str, Any]:
    try:
        details = activity.info().heartbeat_details
    except RuntimeError:
        return {}
    if details and isinstance(details[-1], dict):
        return dict(details[-1])
    return {}


def _heartbeat(payload: Callable[[], dict[str, Any]]) -> Callable[[], None]:
    def beat() -> None:
        try:
            activity.heartbeat(payload())
        except RuntimeError:
            pass  # outside an activity (unit use)

    return beat


def _key(ref: PodRef) -> str:
    return f"{ref.namespace}/{ref.name}/{ref.uid or ''}"


def _list_target(
    kube: Kube, namespaces: set[str], names: list[str]
) -> tuple[Any, tuple[Any, ...], dict[str, Any]]:
    kwargs: dict[str, Any] = {}
    if len(names) == 1:
        kwargs["field_selector"] = f"metadata.name={names[0]}"
    if len(namespaces) == 1:
        return kube.core.list_namespaced_pod, (next(iter(namespaces)),), kwargs
    return kube.core.list_pod_for_all_namespaces, (), kwargs


async def wait_eviction(kube: Kube, executor: Executor, inp: WaitEvictionInput) -> EvictionReport:
    saved = _details()
    deadline = float(saved.get("deadline") or time.time() + inp.timeout.total_seconds())
    gone_keys: set[str] = set(saved.get("gone") or [])
    pending = [p for p in inp.pods if _key(p) not in gone_keys]

    def report(timed_out: bool) -> EvictionReport:
        return EvictionReport(
            gone=[p for p in inp.pods if _key(p) in gone_keys],
            remaining=[p for p in inp.pods if _key(p) not in gone_keys],
            timed_out=timed_out,
        )

    if not pending:
        return report(False)
    beat = _heartbeat(lambda: {"deadline": deadline, "gone": sorted(gone_keys)})

    def on_list(items: list[dict[str, Any]]) -> bool:
        for ref in pending:
            if not any(same_pod(ref, p) for p in items):
                gone_keys.add(_key(ref))
        return all(_key(p) in gone_keys for p in pending)

    def on_event(kind: str, pod: dict[str, Any]) -> bool:
        if kind != "DELETED":
            return False
        for ref in pending:
            if same_pod(ref, pod):
                gone_keys.add(_key(ref))
        return all(_key(p) in gone_keys for p in pending)

    fn, args, kwargs = _list_target(
        kube, {p.namespace for p in pending}, sorted({p.name for p in pending})
    )
    done = await watch_until(
        kube,
        executor,
        fn,
        args,
        kwargs,
        resource="pods",
        on_list=on_list,
        on_event=on_event,
        deadline=deadline,
        heartbeat=beat,
        heartbeat_every=HEARTBEAT_EVERY,
    )
    return report(not done)


# --- replacements --------------------------------------------------------------------------


@dataclass
class OwnerWatch:
    owner: OwnerRef
    selector: dict[str, str]  # matchLabels (matchExpressions with In of one value folded in)
    need: int
    evicted: set[str] = field(default_factory=set)  # uids evicted by the taint manager


def _match(selector: dict[str, str], pod: dict[str, Any]) -> bool:
    labels = meta(pod).get("labels") or {}
    return bool(selector) and all(labels.get(k) == v for k, v in selector.items())


def _selector(obj: dict[str, Any]) -> dict[str, str]:
    sel = (obj.get("spec") or {}).get("selector") or {}
    out = dict(sel.get("matchLabels") or {})
    for expr in sel.get("matchExpressions") or []:
        if expr.get("operator") == "In" and len(expr.get("values") or []) == 1:
            out[expr["key"]] = expr["values"][0]
    return out


def _read_owner(kube: Kube, owner: OwnerRef) -> OwnerWatch | None:
    """The owner's pod selector and how many Running pods mean "replaced"; None = deleted."""
    ns, name = owner.namespace, owner.name
    readers = {
        "Deployment": (kube.apps.read_namespaced_deployment, "deployments.apps"),
        "StatefulSet": (kube.apps.read_namespaced_stateful_set, "statefulsets.apps"),
        "ReplicaSet": (kube.apps.read_namespaced_replica_set, "replicasets.apps"),
        "Job": (kube.batch.read_namespaced_job, "jobs.batch"),
    }
    if owner.kind == "JobSet":
        return OwnerWatch(owner, {"jobset.sigs.k8s.io/jobset-name": name}, need=1)
    if owner.kind not in readers:
        return None  # DaemonSet, bare pods, custom controllers: nothing to wait for here
    fn, resource = readers[owner.kind]
    try:
        obj = kube.call(fn, name, ns, verb="get", resource=resource, name=name)
    except KubeError as err:
        if err.kind is ErrorKind.NOT_FOUND:
            return None
        raise
    spec = obj.get("spec") or {}
    if owner.kind == "Job":
        status = obj.get("status") or {}
        finished = any(
            c.get("type") in ("Complete", "Failed") and c.get("status") == "True"
            for c in status.get("conditions") or []
        )
        completions = spec.get("completions")
        left = (completions - int(status.get("succeeded") or 0)) if completions else 1
        need = 0 if finished else max(0, min(int(spec.get("parallelism") or 1), left))
    else:
        need = int(spec.get("replicas", 1) or 0)
    return OwnerWatch(owner, _selector(obj), need=need)


def _unschedulable(pod: dict[str, Any]) -> str:
    for cond in (pod.get("status") or {}).get("conditions") or []:
        if cond.get("type") == "PodScheduled" and cond.get("status") == "False":
            return str(cond.get("message") or cond.get("reason") or "")
    return ""


def _evicted_by_taint_manager(pod: dict[str, Any]) -> bool:
    return any(
        c.get("type") == "DisruptionTarget"
        and c.get("status") == "True"
        and c.get("reason") == TAINT_MANAGER_REASON
        for c in (pod.get("status") or {}).get("conditions") or []
    )


class _Claims:
    """Allocated devices of claims, listed per namespace when an unknown claim shows up."""

    def __init__(self, kube: Kube) -> None:
        self._kube = kube
        self.devices: dict[tuple[str, str], list[str]] = {}
        self.tolerations: dict[tuple[str, str], list[dict[str, Any]]] = {}
        self.missing: set[tuple[str, str]] = set()

    def refresh(self, namespace: str) -> None:
        kube = self._kube
        body = kube.call(
            kube.resource_v1.list_namespaced_resource_claim,
            namespace,
            verb="list",
            resource="resourceclaims.resource.k8s.io",
        )
        for claim in body.get("items") or []:
            key = (namespace, meta(claim).get("name", ""))
            self.devices[key] = ["/".join(d) for d in claim_devices(claim)]
            alloc = ((claim.get("status") or {}).get("allocation") or {}).get("devices") or {}
            self.tolerations[key] = [
                t for r in alloc.get("results") or [] for t in r.get("tolerations") or []
            ]

    def of(self, pod: dict[str, Any]) -> list[str] | None:
        """Allocated devices, or None while a claim the pod names cannot be read (a stale
        watch event of a pod already gone with its claim, or a claim not yet allocated)."""
        ns = meta(pod).get("namespace", "")
        names = claim_names(pod)
        unknown = [
            n for n in names if not self.devices.get((ns, n)) and (ns, n) not in self.missing
        ]
        if unknown:
            self.refresh(ns)
            self.missing.update((ns, n) for n in unknown if (ns, n) not in self.devices)
        if any((ns, n) not in self.devices or not self.devices[(ns, n)] for n in names):
            return None
        return [d for n in names for d in self.devices[(ns, n)]]

    def tolerates_with_seconds(self, pod: dict[str, Any]) -> bool:
        ns = meta(pod).get("namespace", "")
        return any(
            t.get("tolerationSeconds") is not None
            for n in claim_names(pod)
            for t in self.tolerations.get((ns, n), [])
        )


def _hami_devices(pod: dict[str, Any], node: str) -> list[str] | None:
    """`<node>/<uuid>` of the GPUs HAMi's record places the pod on (as `hami_gpu` is keyed);
    None when the record cannot be read (the replacement is then not counted as running)."""
    try:
        shares = hami.pod_shares(pod) or []
    except hami.HamiFormatError:
        return None
    return sorted({f"{node}/{s.uuid}" for s in shares})


async def wait_replacement(
    kube: Kube, executor: Executor, inp: WaitReplacementInput
) -> ReplacementReport:
    import asyncio

    saved = _details()
    loop = asyncio.get_running_loop()
    owners: list[OwnerWatch] = []
    for owner in inp.owners:
        w = await loop.run_in_executor(executor, _read_owner, kube, owner)
        if w is not None and w.need > 0:
            w.evicted = set((saved.get("evicted") or {}).get(f"{owner.kind}/{owner.name}", []))
            owners.append(w)
    if not owners:
        return ReplacementReport(status="no-replacement-needed")
    tainted = {d.resource_id for d in inp.tainted} | ({inp.hami_gpu} if inp.hami_gpu else set())
    claims = _Claims(kube)
    pods: dict[str, dict[str, Any]] = {}  # uid -> latest object
    toleration_churn: dict[str, bool] = {}
    result: dict[str, ReplacementReport] = {}

    def is_old(pod: dict[str, Any]) -> bool:
        return any(same_pod(ref, pod) for ref in inp.old_pods)

    def owner_of(pod: dict[str, Any]) -> OwnerWatch | None:
        if meta(pod).get("namespace") not in {w.owner.namespace for w in owners}:
            return None
        return next(
            (
                w
                for w in owners
                if w.owner.namespace == meta(pod).get("namespace") and _match(w.selector, pod)
            ),
            None,
        )

    def states() -> tuple[list[PodState], dict[str, int], str, ChurnDiagnosis | None]:
        out: list[PodState] = []
        running: dict[str, int] = {}
        bound: dict[str, list[tuple[PodRef, list[str]]]] = {}  # owner -> on tainted devices
        message = ""
        for uid, pod in sorted(pods.items(), key=lambda kv: meta(kv[1]).get("name", "")):
            w = owner_of(pod)
            if w is None or is_old(pod) or is_terminating(pod):
                continue
            status = pod.get("status") or {}
            node = (pod.get("spec") or {}).get("nodeName")
            allocated = claims.of(pod) if node and claim_names(pod) else []
            devices = allocated or []
            unreadable = ""
            if inp.hami_gpu and node:
                held = _hami_devices(pod, node)
                if held is None:
                    unreadable = f"its {hami.ANN_ALLOCATED} cannot be read: not counted"
                devices = held or devices
            phase = status.get("phase", "Pending")
            msg = _unschedulable(pod) if not node else ""
            bad = sorted(set(devices) & tainted)
            if allocated is None:
                msg = "its resource claim is not allocated (or already gone)"
            elif unreadable:
                msg = unreadable
            elif bad:
                w.evicted.add(uid)  # placed on a device Sickbay tainted: the scheduler ignored it
                toleration_churn[uid] = claims.tolerates_with_seconds(pod)
                bound.setdefault(w.owner.name, []).append((pod_ref(pod), bad))
                msg = f"allocated tainted device(s) {', '.join(bad)}"
            elif phase == "Running":
                running[w.owner.name] = running.get(w.owner.name, 0) + 1
            message = message or msg
            out.append(
                PodState(pod=pod_ref(pod), phase=phase, node=node, devices=devices, message=msg)
            )
        churn = None
        for w in owners:
            on_bad = bound.get(w.owner.name, [])
            name = f"{w.owner.kind}/{w.owner.namespace}/{w.owner.name}"
            if on_bad and inp.rule_effect != "NoExecute":
                # Nothing will evict it: one is churn (the loop is "bound for good").
                churn = ChurnDiagnosis(
                    owner=w.owner,
                    evictions=len(w.evicted),
                    diagnosis=DIAG_BOUND.format(
                        pods=", ".join(f"{p.namespace}/{p.name}" for p, _ in on_bad),
                        owner=name,
                        devices=", ".join(sorted({d for _, ds in on_bad for d in ds})),
                    ),
                    bound=[p for p, _ in on_bad],
                )
                break
            if len(w.evicted) >= inp.churn_evictions:
                tol = any(toleration_churn.get(u) for u in w.evicted)
                text = DIAG_TOLERATION if tol else DIAG_SCHEDULER
                churn = ChurnDiagnosis(
                    owner=w.owner,
                    evictions=len(w.evicted),
                    diagnosis=text.format(owner=name, n=len(w.evicted)),
                    bound=[p for p, _ in on_bad],
                )
                break
        return out, running, message, churn

    def evaluate() -> bool:
        out, running, message, churn = states()
        if churn is not None:
            result["r"] = ReplacementReport(
                status="churn", pods=out, churn=churn, unschedulable_message=message
            )
            return True
        if all(running.get(w.owner.name, 0) >= w.need for w in owners):
            result["r"] = ReplacementReport(status="running", pods=out)
            return True
        result["r"] = ReplacementReport(status="pending", pods=out, unschedulable_message=message)
        return False

    def track(pod: dict[str, Any]) -> None:
        uid = meta(pod).get("uid", "")
        w = owner_of(pod)
        if w is not None and not is_old(pod) and _evicted_by_taint_manager(pod):
            w.evicted.add(uid)
            toleration_churn.setdefault(
                uid, claims.tolerates_with_seconds(pod) if claim_names(pod) else False
            )

    def on_list(items: list[dict[str, Any]]) -> bool:
        pods.clear()
        for pod in items:
            if owner_of(pod) is not None:
                pods[meta(pod).get("uid", "")] = pod
                track(pod)
        return evaluate()

    def on_event(kind: str, pod: dict[str, Any]) -> bool:
        if owner_of(pod) is None:
            return False
        uid = meta(pod).get("uid", "")
        track(pod)
        if kind == "DELETED":
            pods.pop(uid, None)
        else:
            pods[uid] = pod
        return evaluate()

    beat = _heartbeat(
        lambda: {
            "evicted": {f"{w.owner.kind}/{w.owner.name}": sorted(w.evicted) for w in owners},
        }
    )
    namespaces = {w.owner.namespace for w in owners}
    fn, args, kwargs = _list_target(kube, namespaces, [])
    if inp.look_once:
        body = await loop.run_in_executor(
            executor, lambda: kube.call(fn, *args, verb="list", resource="pods", **kwargs)
        )
        await loop.run_in_executor(executor, on_list, body.get("items") or [])
        beat()
        return result["r"]
    # No deadline: done, or cancelled by the workflow when its deadline timer fires.
    await watch_until(
        kube,
        executor,
        fn,
        args,
        kwargs,
        resource="pods",
        on_list=on_list,
        on_event=on_event,
        heartbeat=beat,
        heartbeat_every=HEARTBEAT_EVERY,
    )
    return result["r"]
