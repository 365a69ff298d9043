"""Kubernetes Events for every Sickbay action, on each affected pod, rule or node.

core/v1 Events (what `kubectl describe` and `kubectl get events` show), source and
reportingComponent `sickbay`, message always carrying the workflow id. The event name is
derived from the workflow, the activity and the target, so a retried activity re-posts the same
name and the 409 AlreadyExists is success: no duplicate events. Aggregated events (the
remediation's decisions) are named per workflow, object and reason instead: the first is
created, a repeat PATCHes `count` (the workflow keeps the count, so retries are harmless) and
`lastTimestamp`, as the kubelet aggregates (`kubectl get events` shows `(x3)`). Cluster-scoped targets (rules,
nodes) get their events in the `default` namespace, as the kubelet and controllers do.

Every Event carries its object's `involvedObject.uid`: `kubectl describe node|pod` lists Events
by uid (field selector `involvedObject.uid=<uid>` with name, namespace and kind), so an Event
without it shows only in `kubectl get events`. A node or pod target named without its uid (the
remediation knows its node by name) is looked up first (a list by `metadata.name`: the grants
Sickbay has anyway); one that is gone gets its Event without the uid.
"""

from __future__ import annotations

import hashlib
import logging
import os
import socket
from datetime import UTC, datetime
from typing import Any

from activities.kube.client import ErrorKind, Kube, KubeError
from contract.budget import PauseRecord
from contract.kube import EventTarget, RecordEventInput
from contract.names import CLUSTER_CONFIGMAP, EVENT_COMPONENT, RUNBOOKS_CONFIGMAP

log = logging.getLogger(__name__)

EVENT_NAMESPACE_FOR_CLUSTER_OBJECTS = "default"
MAX_MESSAGE = 1024  # the API server truncates longer event messages


def _instance() -> str:
    return os.environ.get("POD_NAME") or socket.gethostname()


def event_name(target: EventTarget, reason: str, token: str) -> str:
    digest = hashlib.sha256(f"{token}|{target.kind}|{target.name}|{reason}".encode()).hexdigest()
    return f"{target.name[:200]}.sickbay-{digest[:16]}"


def aggregated_name(target: EventTarget, reason: str, series: str) -> str:
    """One name per (remediation, object, reason): repeats PATCH its count."""
    key = f"{series}|{target.kind}|{target.namespace or ''}|{target.name}|{reason}"
    return f"{target.name[:200]}.sickbay-{hashlib.sha256(key.encode()).hexdigest()[:16]}"


def event_body(target: EventTarget, inp: RecordEventInput, token: str) -> dict[str, Any]:
    now = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    namespace = target.namespace or EVENT_NAMESPACE_FOR_CLUSTER_OBJECTS
    message = inp.message
    if inp.workflow_id not in message:
        message = f"{message} (workflow {inp.workflow_id})"
    involved: dict[str, Any] = {
        "apiVersion": target.api_version,
        "kind": target.kind,
        "name": target.name,
    }
    if target.namespace:
        involved["namespace"] = target.namespace
    if target.uid:
        involved["uid"] = target.uid
    name = (
        aggregated_name(target, inp.reason, inp.series or inp.workflow_id)
        if inp.aggregate
        else event_name(target, inp.reason, token)
    )
    return {
        "apiVersion": "v1",
        "kind": "Event",
        "metadata": {"name": name, "namespace": namespace},
        "involvedObject": involved,
        "reason": inp.reason,
        "message": message[:MAX_MESSAGE],
        "type": inp.type,
        "source": {"component": EVENT_COMPONENT},
        "reportingComponent": EVENT_COMPONENT,
        "reportingInstance": _instance(),
        "firstTimestamp": now,
        "lastTimestamp": now,
        "count": target.count if inp.aggregate else 1,
    }


def _create(kube: Kube, namespace: str, body: dict[str, Any]) -> None:
    try:
        kube.call(
            kube.core.create_namespaced_event,
            namespace,
            body,
            verb="create",
            resource="events",
            name=body["metadata"]["name"],
        )
    except KubeError as err:
        if err.kind is not ErrorKind.CONFLICT:
            raise  # 409: this very event exists (a retry): success


def _with_uid(kube: Kube, target: EventTarget) -> EventTarget:
    """The target with a uid `kubectl describe` finds it by. A node's is its name, as the
    kubelet's own node Events carry: `kubectl describe node` lists the Events of the node's
    uid and of its name (kubectl pkg/describe, NodeDescriber), so no read before the write,
    and a node recreated under the same name still shows them. A pod's is read by name."""
    if target.uid or target.api_version != "v1" or target.kind not in ("Node", "Pod"):
        return target
    if target.kind == "Node":
        return target.model_copy(update={"uid": target.name})
    if not target.namespace:
        return target
    try:
        found = kube.call(
            kube.core.list_namespaced_pod,
            target.namespace,
            verb="list",
            resource="pods",
            field_selector=f"metadata.name={target.name}",
        )
    except KubeError as err:
        log.warning(
            "%s %s: uid not read (%s); its Event will not show in kubectl describe",
            target.kind,
            target.name,
            err,
        )
        return target
    items = found.get("items") or []
    uid = ((items[0].get("metadata") or {}).get("uid")) if items else None
    return target.model_copy(update={"uid": uid}) if uid else target


def record_events(kube: Kube, inp: RecordEventInput, token: str) -> int:
    """One request per target; returns how many events exist afterwards. Aggregated events
    above count 1 are PATCHed (count, lastTimestamp, message: absolute values, so a retry
    changes nothing), or created with that count when they are gone (expired)."""
    written = 0
    for named in inp.targets:
        target = _with_uid(kube, named)
        body = event_body(target, inp, token)
        namespace = body["metadata"]["namespace"]
        if not inp.aggregate or target.count <= 1:
            _create(kube, namespace, body)
            written += 1
            continue
        patch = {key: body[key] for key in ("count", "lastTimestamp", "message", "type")}
        patch["reportingInstance"] = body["reportingInstance"]
        try:
            kube.call(
                kube.core.patch_namespaced_event,
                body["metadata"]["name"],
                namespace,
                patch,
                verb="patch",
                resource="events",
                name=body["metadata"]["name"],
            )
        except KubeError as err:
            if err.kind is not ErrorKind.NOT_FOUND:
                raise
            _create(kube, namespace, body)
        written += 1
    return written


def report_runbooks_invalid(kube: Kube, namespace: str, problems: str) -> bool:
    """A Warning Event `RunbookReloadFailed` on the runbooks ConfigMap (with its uid, so
    `kubectl describe configmap sickbay-runbooks` shows it): the edit did not take, the last
    good set is in use. False when there is no such ConfigMap (runbooks from another source:
    the log line and the metric say it)."""
    try:
        cm = kube.call(
            kube.core.read_namespaced_config_map,
            RUNBOOKS_CONFIGMAP,
            namespace,
            verb="get",
            resource="configmaps",
            name=RUNBOOKS_CONFIGMAP,
        )
    except KubeError as err:
        if err.kind is ErrorKind.NOT_FOUND:
            return False
        raise
    meta = cm.get("metadata") or {}
    uid, version = meta.get("uid"), meta.get("resourceVersion", "")
    target = EventTarget(
        api_version="v1", kind="ConfigMap", name=RUNBOOKS_CONFIGMAP, namespace=namespace, uid=uid
    )
    inp = RecordEventInput(
        targets=[target],
        reason="RunbookReloadFailed",
        message=f"the runbooks are invalid; the last good set stays in use: {problems}",
        type="Warning",
        workflow_id="",
    )
    # One Event per edit of the ConfigMap: a retry of the same report is the same name.
    record_events(kube, inp, token=f"runbooks|{uid}|{version}|{problems}")
    return True


def report_pause(kube: Kube, namespace: str, record: PauseRecord, budget_id: str) -> None:
    """An Event on ConfigMap `sickbay-cluster` (Sickbay's namespace) for a pause (Warning
    `SickbayPaused`) or a resume (Normal `SickbayResumed`), with who and why: `kubectl
    describe configmap sickbay-cluster` and `kubectl get events` show it. Named from the
    record, so every worker replica (and a restarted one) posting the same record makes one
    Event. Without the ConfigMap (not recorded yet) the Event still names it, without a uid."""
    try:
        cm = kube.call(
            kube.core.read_namespaced_config_map,
            CLUSTER_CONFIGMAP,
            namespace,
            verb="get",
            resource="configmaps",
            name=CLUSTER_CONFIGMAP,
        )
        uid = (cm.get("metadata") or {}).get("uid")
    except KubeError as err:
        if err.kind is not ErrorKind.NOT_FOUND:
            raise
        uid = None
    target = EventTarget(
        api_version="v1", kind="ConfigMap", name=CLUSTER_CONFIGMAP, namespace=namespace, uid=uid
    )
    paused = record.action == "pause"
    why = f": {record.reason}" if record.reason else ""
    inp = RecordEventInput(
        targets=[target],
        reason="SickbayPaused" if paused else "SickbayResumed",
        message=(
            f"cluster paused by {record.who()}{why}; nothing new is quarantined, evicted, "
            "scaled or repaired until `sickbay resume`"
            if paused
            else f"cluster resumed by {record.who()}{why}; held remediations go on"
        )
        + f" (budget {budget_id})",
        type="Warning" if paused else "Normal",
        workflow_id=budget_id,
    )
    token = f"pause|{budget_id}|{record.action}|{record.at.isoformat()}|{record.actor}"
    record_events(kube, inp, token=token)
