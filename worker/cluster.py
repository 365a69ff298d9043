"""One cluster name per cluster: refuse to serve a name another cluster is already serving.

`SICKBAY_CLUSTER` scopes every id and queue (contract/names.py, `scoped`), but it is
configuration: two clusters left unnamed, or given the same name by a copy-pasted ConfigMap,
would share one task queue and one blast-radius budget, and each worker would run the other
cluster's remediations against its own cluster. So the worker carries its cluster's
fingerprint - the uid of the cluster's `kube-system` namespace, fixed for the life of the
cluster and different in every cluster - in its Temporal worker identity, and before it polls
it looks at who polls its task queue already: a poller with the same cluster name and another
fingerprint stops it with a clear error.
"""

from __future__ import annotations

import os
import re
import socket
from typing import Any

from temporalio.api.enums.v1 import TaskQueueType
from temporalio.api.taskqueue.v1 import TaskQueue
from temporalio.api.workflowservice.v1 import DescribeTaskQueueRequest
from temporalio.client import Client

FINGERPRINT_NAMESPACE = "kube-system"
# `sickbay-worker cluster=<name|-> fp=<uid prefix> <pid>@<host>`
_IDENTITY = re.compile(r"^sickbay-worker cluster=(?P<cluster>\S+) fp=(?P<fp>\S+) ")


def kube_fingerprint(kube: Any) -> str:
    """The uid of the cluster's kube-system namespace (first 12 characters), via the worker's
    Kubernetes client (`activities.kube.client.Kube`; RBAC: namespaces get)."""
    ns = kube.call(
        kube.core.read_namespace,
        FINGERPRINT_NAMESPACE,
        verb="get",
        resource="namespaces",
        name=FINGERPRINT_NAMESPACE,
    )
    metadata = ns.get("metadata") if isinstance(ns, dict) else None
    uid = (metadata or {}).get("uid") or ""
    if not uid:
        raise RuntimeError("the kube-system namespace has no uid")
    return str(uid).replace("-", "")[:12]


def worker_identity(cluster: str, fingerprint: str) -> str:
    return f"sickbay-worker cluster={cluster or '-'} fp={fingerprint} {os.getpid()}@{socket.gethostname()}"


def conflicts(identities: list[str], cluster: str, fingerprint: str) -> list[str]:
    """The identities of pollers serving `cluster` from a cluster with another fingerprint."""
    found = []
    for identity in identities:
        m = _IDENTITY.match(identity)
        if m and m["cluster"] == (cluster or "-") and m["fp"] != fingerprint:
            found.append(identity)
    return found


async def queue_pollers(client: Client, task_queue: str) -> list[str]:
    """Identities of the workers that polled `task_queue` (workflow tasks) lately."""
    resp = await client.workflow_service.describe_task_queue(
        DescribeTaskQueueRequest(
            namespace=client.namespace,
            task_queue=TaskQueue(name=task_queue),
            task_queue_type=TaskQueueType.TASK_QUEUE_TYPE_WORKFLOW,
        )
    )
    return [p.identity for p in resp.pollers]


async def check_cluster_unique(
    client: Client, task_queue: str, cluster: str, fingerprint: str
) -> str | None:
    """None, or why this worker must not start: another cluster already serves its name."""
    others = conflicts(await queue_pollers(client, task_queue), cluster, fingerprint)
    if not others:
        return None
    name = repr(cluster) if cluster else "(unnamed)"
    return (
        f"refusing to start: cluster name {name} (task queue {task_queue}) is already served by "
        f"a worker of another cluster ({others[0]}; kube-system uid differs). Two clusters would "
        "share one budget and run each other's remediations: give each cluster its own "
        "SICKBAY_CLUSTER (docs/deploy.md, 'Many clusters on one Temporal')"
    )


async def missing_worker_warning(client: Client, task_queue: str, cluster: str) -> str | None:
    """For a process that starts remediations (the webhook): None when a Sickbay worker of
    `cluster` polls `task_queue`, else the warning to log - typically a webhook and a worker
    configured with different SICKBAY_CLUSTER values, whose remediations would wait forever."""
    pollers = await queue_pollers(client, task_queue)
    ours = [p for p in pollers if (m := _IDENTITY.match(p)) and m["cluster"] == (cluster or "-")]
    if ours:
        return None
    name = repr(cluster) if cluster else "(unnamed)"
    return (
        f"no Sickbay worker of cluster {name} polls task queue {task_queue} yet: remediations "
        "started now wait until one does. If the worker runs, its SICKBAY_CLUSTER or "
        "SICKBAY_TASK_QUEUE differs from this process's"
    )
