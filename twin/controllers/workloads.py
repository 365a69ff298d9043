"""Workload controllers: Deployment -> ReplicaSet -> Pods, StatefulSet, Job.

Shapes follow kube-controller-manager (tests/k8s_golden/42 for the events):
- **Deployment**: one ReplicaSet per pod-template hash (`<deployment>-<hash>`, label
  `pod-template-hash`, annotation `deployment.kubernetes.io/revision`); the current one is
  scaled to `spec.replicas` and older ones to 0 (a roll-out completes at once: the twin has no
  image pulls to wait for). Events `ScalingReplicaSet` "Scaled up replica set X from 0 to 1".
  Status: replicas, updated/ready/available/unavailable, Available and Progressing conditions.
- **ReplicaSet**: keeps `spec.replicas` active pods (not finished, not being deleted: a
  Terminating pod is replaced at once, golden 39), generateName `<rs>-`; events
  `SuccessfulCreate` "Created pod: X" / `SuccessfulDelete` "Deleted pod: X".
- **StatefulSet**: pods `<sts>-<ordinal>`; OrderedReady creates ordinal n only when 0..n-1 are
  Running and Ready; a pod being deleted is recreated with the same name only once it is gone;
  a failed pod is deleted and recreated.
- **Job**: parallelism/completions, `backoffLimit` (failed pods, and container restarts under
  restartPolicy OnFailure), `podFailurePolicy` rules (`onExitCodes` In/NotIn with an optional
  containerName, `onPodConditions` such as DisruptionTarget; actions FailJob, Ignore, Count),
  pod tracking with the `batch.kubernetes.io/job-tracking` finalizer so a deleted pod is still
  counted, FailureTarget/Failed and SuccessCriteriaMet/Complete conditions, the real messages
  ("Container main for pod ns/p failed with exit code 42 matching FailJob rule at index 0",
  "Job has reached the specified backoff limit"), and active pods deleted when the Job fails.
"""

from __future__ import annotations

import json
import logging
from typing import Any

from twin.clock import parse_time, rfc3339
from twin.controllers.common import (
    DEPLOYMENTS,
    JOBS,
    PODS,
    REPLICASETS,
    STATEFULSETS,
    controller_ref,
    get_condition,
    is_active,
    is_deleting,
    is_terminal,
    meta,
    name_of,
    ns_of,
    owned_by,
    owner_reference,
    phase,
    set_condition,
    uid_of,
)
from twin.errors import ApiError

log = logging.getLogger(__name__)

REVISION_ANN = "deployment.kubernetes.io/revision"
JOB_TRACKING_FINALIZER = "batch.kubernetes.io/job-tracking"
_SAFE = "bcdfghjklmnpqrstvwxz2456789"


def template_hash(template: dict[str, Any]) -> str:
    """A pod-template hash in apimachinery's alphabet (FNV-1a 32 of the canonical JSON)."""
    value = 0x811C9DC5
    for byte in json.dumps(template, sort_keys=True, separators=(",", ":")).encode():
        value ^= byte
        value = (value * 0x01000193) & 0xFFFFFFFF
    out = ""
    for _ in range(10):
        out += _SAFE[value % len(_SAFE)]
        value //= len(_SAFE)
    return out


def pod_ready(pod: dict[str, Any]) -> bool:
    cond = get_condition(pod, "Ready")
    return phase(pod) == "Running" and cond is not None and cond.get("status") == "True"


def pods_owned(ctx: Any, owner: dict[str, Any]) -> list[dict[str, Any]]:
    items = ctx.store.list(PODS, namespace=ns_of(owner), copy_objects=False).items
    return [p for p in items if owned_by(p, uid_of(owner))]


def new_pod(
    owner: dict[str, Any],
    api_version: str,
    kind: str,
    template: dict[str, Any],
    name: str | None = None,
    extra_labels: dict[str, str] | None = None,
    finalizers: list[str] | None = None,
) -> dict[str, Any]:
    tmeta = template.get("metadata") or {}
    pod_meta: dict[str, Any] = {
        "namespace": ns_of(owner),
        "labels": {**(tmeta.get("labels") or {}), **(extra_labels or {})},
        "ownerReferences": [owner_reference(owner, api_version, kind)],
    }
    if name:
        pod_meta["name"] = name
    else:
        pod_meta["generateName"] = f"{name_of(owner)}-"
    if tmeta.get("annotations"):
        pod_meta["annotations"] = dict(tmeta["annotations"])
    if finalizers:
        pod_meta["finalizers"] = list(finalizers)
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": pod_meta,
        "spec": template.get("spec") or {},
    }


def _write_status(ctx: Any, resource: str, obj: dict[str, Any], status: dict[str, Any]) -> None:
    def update(current: dict[str, Any]) -> None:
        current["status"] = status

    if (obj.get("status") or {}) == status:
        return
    try:
        ctx.store.mutate(resource, name_of(obj), update, ns_of(obj), subresource="status")
    except ApiError as err:
        log.debug("%s %s/%s status: %s", resource, ns_of(obj), name_of(obj), err.message)


# --------------------------------------------------------------------------------------------
# Deployment
# --------------------------------------------------------------------------------------------


class DeploymentController:
    COMPONENT = "deployment-controller"

    def __init__(self, manager: Any) -> None:
        self.manager = manager

    def sync(self, ctx: Any) -> float | None:
        for deployment in ctx.store.list(DEPLOYMENTS, copy_objects=False).items:
            if not is_deleting(deployment):
                try:
                    self._sync_one(ctx, deployment)
                except ApiError as err:
                    log.warning("deployment %s: %s", name_of(deployment), err.message)
        return None

    def _sync_one(self, ctx: Any, deployment: dict[str, Any]) -> None:
        store = ctx.store
        spec = deployment.get("spec") or {}
        desired = int(spec.get("replicas", 1))
        template = spec.get("template") or {}
        hash_ = template_hash(template)
        owned = [
            rs
            for rs in store.list(REPLICASETS, namespace=ns_of(deployment), copy_objects=False).items
            if owned_by(rs, uid_of(deployment))
        ]
        current = next(
            (
                rs
                for rs in owned
                if (meta(rs).get("labels") or {}).get("pod-template-hash") == hash_
            ),
            None,
        )
        revisions = [
            int((meta(rs).get("annotations") or {}).get(REVISION_ANN, "0")) for rs in owned
        ]
        if current is None:
            revision = str(max(revisions, default=0) + 1)
            labels = {
                **((template.get("metadata") or {}).get("labels") or {}),
                "pod-template-hash": hash_,
            }
            selector = dict(spec.get("selector") or {})
            selector["matchLabels"] = {
                **(selector.get("matchLabels") or {}),
                "pod-template-hash": hash_,
            }
            rs_template = json.loads(json.dumps(template))
            rs_template.setdefault("metadata", {})["labels"] = labels
            rs = {
                "apiVersion": "apps/v1",
                "kind": "ReplicaSet",
                "metadata": {
                    "name": f"{name_of(deployment)}-{hash_}",
                    "namespace": ns_of(deployment),
                    "labels": labels,
                    "annotations": {REVISION_ANN: revision},
                    "ownerReferences": [owner_reference(deployment, "apps/v1", "Deployment")],
                },
                "spec": {"replicas": 0, "selector": selector, "template": rs_template},
            }
            current = store.create(REPLICASETS, rs, namespace=ns_of(deployment))
            owned.append(current)
            self._annotate_revision(ctx, deployment, revision)
        for rs in owned:
            want = desired if uid_of(rs) == uid_of(current) else 0
            have = int((rs.get("spec") or {}).get("replicas", 0))
            if want != have:
                self._scale(ctx, deployment, rs, have, want)
        self._status(ctx, deployment, owned, current, desired)

    def _annotate_revision(self, ctx: Any, deployment: dict[str, Any], revision: str) -> None:
        def annotate(obj: dict[str, Any]) -> None:
            obj["metadata"].setdefault("annotations", {})[REVISION_ANN] = revision

        ctx.store.mutate(DEPLOYMENTS, name_of(deployment), annotate, ns_of(deployment))

    def _scale(
        self, ctx: Any, deployment: dict[str, Any], rs: dict[str, Any], have: int, want: int
    ) -> None:
        def scale(obj: dict[str, Any]) -> None:
            obj["spec"]["replicas"] = want

        ctx.store.mutate(REPLICASETS, name_of(rs), scale, ns_of(rs))
        verb = "up" if want > have else "down"
        ctx.events.controller(
            deployment,
            self.COMPONENT,
            "ScalingReplicaSet",
            f"Scaled {verb} replica set {name_of(rs)} from {have} to {want}",
        )

    def _status(
        self,
        ctx: Any,
        deployment: dict[str, Any],
        owned: list[dict[str, Any]],
        current: dict[str, Any],
        desired: int,
    ) -> None:
        fresh = [ctx.store.try_get(REPLICASETS, name_of(rs), ns_of(rs)) or rs for rs in owned]
        total = sum(int((rs.get("status") or {}).get("replicas", 0)) for rs in fresh)
        ready = sum(int((rs.get("status") or {}).get("readyReplicas", 0)) for rs in fresh)
        available = sum(int((rs.get("status") or {}).get("availableReplicas", 0)) for rs in fresh)
        cur = next((rs for rs in fresh if uid_of(rs) == uid_of(current)), current)
        updated = int((cur.get("status") or {}).get("replicas", 0))
        status = json.loads(json.dumps(deployment.get("status") or {}))
        status.update(
            {
                "observedGeneration": int(meta(deployment).get("generation", 1)),
                "replicas": total,
                "updatedReplicas": updated,
                "readyReplicas": ready,
                "availableReplicas": available,
            }
        )
        for key in ("replicas", "updatedReplicas", "readyReplicas", "availableReplicas"):
            if not status[key]:
                status.pop(key)
        unavailable = max(0, desired - available)
        if unavailable:
            status["unavailableReplicas"] = unavailable
        else:
            status.pop("unavailableReplicas", None)
        if available >= desired:
            set_condition(
                status,
                "Available",
                "True",
                ctx.now,
                "MinimumReplicasAvailable",
                "Deployment has minimum availability.",
            )
        else:
            set_condition(
                status,
                "Available",
                "False",
                ctx.now,
                "MinimumReplicasUnavailable",
                "Deployment does not have minimum availability.",
            )
        if updated == desired and available >= desired:
            set_condition(
                status,
                "Progressing",
                "True",
                ctx.now,
                "NewReplicaSetAvailable",
                f'ReplicaSet "{name_of(current)}" has successfully progressed.',
            )
        else:
            set_condition(
                status,
                "Progressing",
                "True",
                ctx.now,
                "ReplicaSetUpdated",
                f'ReplicaSet "{name_of(current)}" is progressing.',
            )
        for cond in status.get("conditions", []):
            cond.setdefault("lastUpdateTime", cond.get("lastTransitionTime"))
        _write_status(ctx, DEPLOYMENTS, deployment, status)


# --------------------------------------------------------------------------------------------
# ReplicaSet
# --------------------------------------------------------------------------------------------


def _deletion_rank(pod: dict[str, Any]) -> tuple[int, int, str]:
    """Pods to remove first on scale-down: unscheduled, then pending, then not ready, newest."""
    scheduled = 1 if pod["spec"].get("nodeName") else 0
    running = 1 if phase(pod) == "Running" else 0
    created = meta(pod).get("creationTimestamp", "")
    return (scheduled + running + (1 if pod_ready(pod) else 0), 0, "~" + created)


class ReplicaSetController:
    COMPONENT = "replicaset-controller"

    def __init__(self, manager: Any) -> None:
        self.manager = manager
        # rs uid -> (monotonic time pods may be created again, refusals in a row)
        self._refused: dict[str, tuple[float, int]] = {}

    def sync(self, ctx: Any) -> float | None:
        earliest: float | None = None
        for rs in ctx.store.list(REPLICASETS, copy_objects=False).items:
            if is_deleting(rs):
                continue
            try:
                self._sync_one(ctx, rs)
            except ApiError as err:
                log.warning("replicaset %s: %s", name_of(rs), err.message)
            refused = self._refused.get(uid_of(rs))
            if refused is not None and refused[0] > ctx.mono:
                wait = refused[0] - ctx.mono
                earliest = wait if earliest is None else min(earliest, wait)
        return earliest

    def _sync_one(self, ctx: Any, rs: dict[str, Any]) -> None:
        store = ctx.store
        desired = int((rs.get("spec") or {}).get("replicas", 1))
        pods = pods_owned(ctx, rs)
        active = [p for p in pods if is_active(p)]
        refused = self._refused.get(uid_of(rs))
        if len(active) < desired and refused is not None and ctx.mono < refused[0]:
            return  # refused a moment ago: wait for the backoff, as the controller does
        if len(active) < desired:
            template = (rs.get("spec") or {}).get("template") or {}
            for _ in range(desired - len(active)):
                try:
                    created = store.create(PODS, new_pod(rs, "apps/v1", "ReplicaSet", template))
                except ApiError as err:
                    ctx.events.controller(
                        rs,
                        self.COMPONENT,
                        "FailedCreate",
                        f"Error creating: {err.message}",
                        etype="Warning",
                    )
                    tries = (refused[1] if refused else 0) + 1
                    # 10 s doubling, capped at 6 minutes, like the Job controller's backoff.
                    self._refused[uid_of(rs)] = (
                        ctx.mono + min(360.0, 10.0 * 2 ** (tries - 1)),
                        tries,
                    )
                    break
                self._refused.pop(uid_of(rs), None)
                active.append(created)
                ctx.events.controller(
                    rs, self.COMPONENT, "SuccessfulCreate", f"Created pod: {name_of(created)}"
                )
        elif len(active) > desired:
            victims = sorted(active, key=_deletion_rank)[: len(active) - desired]
            for pod in victims:
                try:
                    store.delete(PODS, name_of(pod), ns_of(pod))
                except ApiError:
                    continue
                active.remove(pod)
                ctx.events.controller(
                    rs, self.COMPONENT, "SuccessfulDelete", f"Deleted pod: {name_of(pod)}"
                )
        ready = sum(1 for p in active if pod_ready(p))
        status = {
            "replicas": len(active),
            "fullyLabeledReplicas": len(active),
            "readyReplicas": ready,
            "availableReplicas": ready,
            "observedGeneration": int(meta(rs).get("generation", 1)),
        }
        terminating = sum(1 for p in pods if is_deleting(p) and not is_terminal(p))
        if terminating:
            status["terminatingReplicas"] = terminating
        for key in ("fullyLabeledReplicas", "readyReplicas", "availableReplicas"):
            if not status[key]:
                status.pop(key)
        _write_status(ctx, REPLICASETS, rs, status)


# --------------------------------------------------------------------------------------------
# StatefulSet
# --------------------------------------------------------------------------------------------


class StatefulSetController:
    COMPONENT = "statefulset-controller"

    def __init__(self, manager: Any) -> None:
        self.manager = manager

    def sync(self, ctx: Any) -> float | None:
        for sts in ctx.store.list(STATEFULSETS, copy_objects=False).items:
            if is_deleting(sts):
                continue
            try:
                self._sync_one(ctx, sts)
            except ApiError as err:
                log.warning("statefulset %s: %s", name_of(sts), err.message)
        return None

    def _sync_one(self, ctx: Any, sts: dict[str, Any]) -> None:
        store = ctx.store
        spec = sts.get("spec") or {}
        desired = int(spec.get("replicas", 1))
        ordered = (spec.get("podManagementPolicy") or "OrderedReady") == "OrderedReady"
        template = spec.get("template") or {}
        revision = f"{name_of(sts)}-{template_hash(template)}"
        by_name = {name_of(p): p for p in pods_owned(ctx, sts)}
        for ordinal in range(desired):
            pod_name = f"{name_of(sts)}-{ordinal}"
            pod = by_name.get(pod_name)
            if pod is not None and is_terminal(pod) and not is_deleting(pod):
                store.delete(PODS, pod_name, ns_of(sts))
                ctx.events.controller(
                    sts,
                    self.COMPONENT,
                    "SuccessfulDelete",
                    f"delete Pod {pod_name} in StatefulSet {name_of(sts)} successful",
                )
                pod = store.try_get(PODS, pod_name, ns_of(sts))
            if pod is None:
                if store.try_get(PODS, pod_name, ns_of(sts)) is not None:
                    break  # a pod of that name we do not own: wait, as the real controller does
                labels = {
                    "controller-revision-hash": revision,
                    "statefulset.kubernetes.io/pod-name": pod_name,
                    "apps.kubernetes.io/pod-index": str(ordinal),
                }
                store.create(
                    PODS, new_pod(sts, "apps/v1", "StatefulSet", template, pod_name, labels)
                )
                ctx.events.controller(
                    sts,
                    self.COMPONENT,
                    "SuccessfulCreate",
                    f"create Pod {pod_name} in StatefulSet {name_of(sts)} successful",
                )
                if ordered:
                    break
            elif ordered and (is_deleting(pod) or not pod_ready(pod)):
                break
        for pod_name, pod in sorted(by_name.items(), reverse=True):
            suffix = pod_name.rsplit("-", 1)[-1]
            if suffix.isdigit() and int(suffix) >= desired and not is_deleting(pod):
                store.delete(PODS, pod_name, ns_of(sts))
                ctx.events.controller(
                    sts,
                    self.COMPONENT,
                    "SuccessfulDelete",
                    f"delete Pod {pod_name} in StatefulSet {name_of(sts)} successful",
                )
                if ordered:
                    break
        pods = [p for p in pods_owned(ctx, sts) if is_active(p)]
        ready = sum(1 for p in pods if pod_ready(p))
        status = {
            "observedGeneration": int(meta(sts).get("generation", 1)),
            "replicas": len(pods),
            "readyReplicas": ready,
            "currentReplicas": len(pods),
            "updatedReplicas": len(pods),
            "availableReplicas": ready,
            "currentRevision": revision,
            "updateRevision": revision,
            "collisionCount": 0,
        }
        _write_status(ctx, STATEFULSETS, sts, status)


# --------------------------------------------------------------------------------------------
# Job
# --------------------------------------------------------------------------------------------


def _exit_codes(pod: dict[str, Any]) -> list[tuple[str, int]]:
    out = []
    for cs in (pod.get("status") or {}).get("containerStatuses") or []:
        terminated = (cs.get("state") or {}).get("terminated")
        if terminated is not None:
            out.append((cs.get("name", ""), int(terminated.get("exitCode", 0))))
    return out


def match_failure_policy(job: dict[str, Any], pod: dict[str, Any]) -> tuple[str, str] | None:
    """(action, message) of the first podFailurePolicy rule matching a failed pod."""
    rules = ((job.get("spec") or {}).get("podFailurePolicy") or {}).get("rules") or []
    pod_id = f"{ns_of(pod)}/{name_of(pod)}"
    for index, rule in enumerate(rules):
        action = rule.get("action", "Count")
        on_codes = rule.get("onExitCodes")
        if on_codes:
            wanted_container = on_codes.get("containerName")
            values = {int(v) for v in on_codes.get("values") or []}
            operator = on_codes.get("operator", "In")
            for container, code in _exit_codes(pod):
                if wanted_container and container != wanted_container:
                    continue
                if code == 0:
                    continue  # exit code 0 never matches a failure rule
                hit = code in values if operator == "In" else code not in values
                if hit:
                    return action, (
                        f"Container {container} for pod {pod_id} failed with exit code {code} "
                        f"matching {action} rule at index {index}"
                    )
        for pattern in rule.get("onPodConditions") or []:
            cond = get_condition(pod, pattern.get("type", ""))
            if cond is not None and cond.get("status") == pattern.get("status", "True"):
                return action, (
                    f"Pod {pod_id} has condition {pattern.get('type')} matching {action} rule "
                    f"at index {index}"
                )
    return None


class JobController:
    COMPONENT = "job-controller"

    def __init__(self, manager: Any) -> None:
        self.manager = manager
        self._next_create: dict[str, float] = {}  # job uid -> monotonic time pods may be created
        self._refused: dict[str, int] = {}  # job uid -> pod creates refused in a row

    def sync(self, ctx: Any) -> float | None:
        earliest: float | None = None
        jobs = ctx.store.list(JOBS, copy_objects=False).items
        self._release_orphans(ctx, {uid_of(j) for j in jobs if not is_deleting(j)})
        for job in jobs:
            if is_deleting(job):
                continue
            try:
                wait = self._sync_one(ctx, job)
            except ApiError as err:
                log.warning("job %s: %s", name_of(job), err.message)
                continue
            if wait is not None:
                earliest = wait if earliest is None else min(earliest, wait)
        return earliest

    def _finished(self, job: dict[str, Any]) -> bool:
        for ctype in ("Complete", "Failed"):
            cond = get_condition(job, ctype)
            if cond is not None and cond.get("status") == "True":
                return True
        return False

    def _sync_one(self, ctx: Any, job: dict[str, Any]) -> float | None:
        store = ctx.store
        spec = job.get("spec") or {}
        status = json.loads(json.dumps(job.get("status") or {}))
        pods = pods_owned(ctx, job)
        # 1. Account for finished pods once (the tracking finalizer marks the uncounted ones).
        failed_new: list[dict[str, Any]] = []
        for pod in pods:
            finalizers = meta(pod).get("finalizers") or []
            if JOB_TRACKING_FINALIZER not in finalizers or not is_terminal(pod):
                if (
                    JOB_TRACKING_FINALIZER in finalizers
                    and self._finished(job)
                    and is_deleting(pod)
                ):
                    self._release(ctx, pod)
                continue
            if phase(pod) == "Succeeded":
                status["succeeded"] = int(status.get("succeeded", 0)) + 1
            else:
                failed_new.append(pod)
            self._release(ctx, pod)
        verdict: tuple[str, str] | None = None
        for pod in failed_new:
            matched = match_failure_policy(job, pod)
            action = matched[0] if matched else "Count"
            if action == "Ignore":
                continue
            status["failed"] = int(status.get("failed", 0)) + 1
            if action == "FailJob" and verdict is None and matched:
                verdict = ("PodFailurePolicy", matched[1])
        if self._finished(job):
            return None
        restarts = 0
        if (spec.get("template") or {}).get("spec", {}).get("restartPolicy") == "OnFailure":
            for pod in pods:
                for cs in (pod.get("status") or {}).get("containerStatuses") or []:
                    restarts += int(cs.get("restartCount", 0))
        backoff_limit = int(spec.get("backoffLimit", 6))
        if verdict is None and int(status.get("failed", 0)) + restarts > backoff_limit:
            verdict = ("BackoffLimitExceeded", "Job has reached the specified backoff limit")
        active = [p for p in pods if is_active(p)]
        completions = spec.get("completions", 1)
        succeeded = int(status.get("succeeded", 0))
        status.setdefault("startTime", rfc3339(ctx.now))
        wait: float | None = None
        # activeDeadlineSeconds counts from startTime, pods or not (a Job whose pods are all
        # refused fails here too, with the same reason as on a real cluster).
        deadline = spec.get("activeDeadlineSeconds")
        if verdict is None and deadline is not None and not spec.get("suspend"):
            left = float(deadline) - (ctx.now - parse_time(status["startTime"])).total_seconds()
            if left <= 0:
                verdict = ("DeadlineExceeded", "Job was active longer than specified deadline")
            else:
                wait = left
        if verdict is not None:
            reason, message = verdict
            for pod in active:
                store.delete(PODS, name_of(pod), ns_of(pod))
                ctx.events.controller(
                    job, self.COMPONENT, "SuccessfulDelete", f"Deleted pod: {name_of(pod)}"
                )
            set_condition(status, "FailureTarget", "True", ctx.now, reason, message, probe=True)
            set_condition(status, "Failed", "True", ctx.now, reason, message, probe=True)
            ctx.events.controller(job, self.COMPONENT, reason, message, etype="Warning")
            active = []
        elif completions is not None and succeeded >= int(completions):
            set_condition(
                status,
                "SuccessCriteriaMet",
                "True",
                ctx.now,
                "CompletionsReached",
                "Reached expected number of succeeded pods",
                probe=True,
            )
            set_condition(
                status,
                "Complete",
                "True",
                ctx.now,
                "CompletionsReached",
                "Reached expected number of succeeded pods",
                probe=True,
            )
            status["completionTime"] = rfc3339(ctx.now)
            ctx.events.controller(job, self.COMPONENT, "Completed", "Job completed")
        elif not spec.get("suspend"):
            parallelism = int(spec.get("parallelism", 1))
            remaining = parallelism if completions is None else int(completions) - succeeded
            want = max(0, min(parallelism, remaining) - len(active))
            not_before = self._next_create.get(uid_of(job), 0.0)
            if want and ctx.mono < not_before:
                later = not_before - ctx.mono
                wait = later if wait is None else min(wait, later)
            elif want:
                template = spec.get("template") or {}
                labels = {
                    "batch.kubernetes.io/controller-uid": uid_of(job),
                    "batch.kubernetes.io/job-name": name_of(job),
                    "controller-uid": uid_of(job),
                    "job-name": name_of(job),
                }
                for _ in range(want):
                    pod = new_pod(
                        job, "batch/v1", "Job", template, None, labels, [JOB_TRACKING_FINALIZER]
                    )
                    pod["metadata"]["generateName"] = f"{name_of(job)}-"
                    try:
                        created = store.create(PODS, pod)
                    except ApiError as err:
                        # Refused (Pod Security admission, say): a Warning Event on the Job
                        # with the server's text, then try again after a backoff.
                        ctx.events.controller(
                            job,
                            self.COMPONENT,
                            "FailedCreate",
                            f"Error creating: {err.message}",
                            etype="Warning",
                        )
                        tries = self._refused.get(uid_of(job), 0) + 1
                        self._refused[uid_of(job)] = tries
                        # 10 s doubling, capped at 6 minutes: the controller's own backoff.
                        retry = min(360.0, 10.0 * 2 ** (tries - 1))
                        self._next_create[uid_of(job)] = ctx.mono + retry
                        wait = retry if wait is None else min(wait, retry)
                        break
                    self._refused.pop(uid_of(job), None)
                    active.append(created)
                    ctx.events.controller(
                        job, self.COMPONENT, "SuccessfulCreate", f"Created pod: {name_of(created)}"
                    )
            if failed_new:
                # Pod re-creation backoff after failures: 10 s doubling, capped at 6 minutes.
                failures = max(1, int(status.get("failed", 0)))
                self._next_create[uid_of(job)] = ctx.mono + min(360.0, 10.0 * 2 ** (failures - 1))
        status["active"] = len(active)
        status["ready"] = sum(1 for p in active if pod_ready(p))
        terminating = sum(1 for p in pods if is_deleting(p) and not is_terminal(p))
        status["terminating"] = terminating
        for key in ("active", "succeeded", "failed"):
            if not status.get(key):
                status.pop(key, None)
        status.setdefault("uncountedTerminatedPods", {})
        _write_status(ctx, JOBS, job, status)
        return wait

    def _release_orphans(self, ctx: Any, live_jobs: set[str]) -> None:
        """Pods whose Job is gone keep no tracking finalizer (else they would never go)."""
        for pod in ctx.store.list(PODS, copy_objects=False).items:
            if JOB_TRACKING_FINALIZER not in (meta(pod).get("finalizers") or []):
                continue
            ref = controller_ref(pod)
            if ref is None or ref.get("kind") != "Job" or ref.get("uid") not in live_jobs:
                self._release(ctx, pod)

    def _release(self, ctx: Any, pod: dict[str, Any]) -> None:
        def drop(obj: dict[str, Any]) -> None:
            rest = [
                f for f in obj["metadata"].get("finalizers") or [] if f != JOB_TRACKING_FINALIZER
            ]
            if rest:
                obj["metadata"]["finalizers"] = rest
            else:
                obj["metadata"].pop("finalizers", None)

        try:
            ctx.store.mutate(PODS, name_of(pod), drop, ns_of(pod))
        except ApiError:
            pass
