"""The cluster's name: derived once, recorded in the cluster, read by every Sickbay process.

`SICKBAY_CLUSTER` scopes every workflow id, task queue and schedule (contract/names.py). A name
that came from configuration alone could change with a restart (a ConfigMap edit, a copied
manifest) and strand every open remediation under the old ids. So the name lives in the
cluster, in the ConfigMap `sickbay-cluster` (key `name`) of Sickbay's namespace:

- created if absent, never overwritten: the first writer wins (create; 409 AlreadyExists ->
  read what is there), so two replicas starting at once agree;
- nothing recorded and `SICKBAY_CLUSTER` unset: the worker derives the name once and records
  `k-<8 hex of the kube-system uid>`;
- `SICKBAY_CLUSTER` set (even to "", the unnamed cluster): recorded when nothing is; when it
  disagrees with the record, the process refuses to start naming both. A rename is a migration
  (docs/deploy.md, 'Many clusters on one Temporal'), not a restart.

The webhook has no Kubernetes API token: it reads the same ConfigMap as a mounted file
(`SICKBAY_CLUSTER_FILE`, deploy/webhook.yaml) and answers 503 until the file exists.
"""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path
from typing import Any

from activities.kube.client import ErrorKind, KubeError
from contract.names import (
    CLUSTER_CONFIGMAP,
    CLUSTER_CONFIGMAP_KEY,
    check_cluster_name,
    derived_cluster_name,
)
from worker.cluster import FINGERPRINT_NAMESPACE

log = logging.getLogger(__name__)

# An unreachable API server at start: retried this long, then the worker stops (exit 7).
UNREACHABLE_SECONDS = 120.0
RETRY_SECONDS = 2.0
MIGRATE_HINT = "docs/deploy.md, 'Many clusters on one Temporal'"


class ClusterNameError(RuntimeError):
    """The cluster name cannot be settled: the process must not start."""


def shown(name: str) -> str:
    return repr(name) if name else '"" (the unnamed cluster)'


def _record_value(cm: dict[str, Any], namespace: str) -> str:
    data = cm.get("data") or {}
    if CLUSTER_CONFIGMAP_KEY not in data:
        raise ClusterNameError(
            f"ConfigMap {namespace}/{CLUSTER_CONFIGMAP} has no key {CLUSTER_CONFIGMAP_KEY!r}: "
            f"set it to the cluster's name (or delete the ConfigMap to derive one again)"
        )
    value = str(data[CLUSTER_CONFIGMAP_KEY]).strip()
    try:
        return check_cluster_name(value)
    except ValueError as exc:
        raise ClusterNameError(
            f"ConfigMap {namespace}/{CLUSTER_CONFIGMAP} records an invalid name: {exc}"
        ) from exc


def read_recorded(kube: Any, namespace: str) -> str | None:
    """The recorded name, or None when the ConfigMap does not exist (KubeError otherwise)."""
    try:
        cm = kube.call(
            kube.core.read_namespaced_config_map,
            CLUSTER_CONFIGMAP,
            namespace,
            verb="get",
            resource="configmaps",
            name=CLUSTER_CONFIGMAP,
        )
    except KubeError as exc:
        if exc.kind is ErrorKind.NOT_FOUND and (exc.body.get("details") or {}).get("kind") in (
            "configmaps",
            None,
        ):
            return None
        raise
    return _record_value(cm, namespace)


def record(kube: Any, namespace: str, name: str) -> str:
    """Record `name` unless a name is recorded already; returns the recorded one (first
    writer wins: a concurrent replica's record is read back, never overwritten)."""
    body = {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {
            "name": CLUSTER_CONFIGMAP,
            "namespace": namespace,
            "labels": {"app.kubernetes.io/managed-by": "sickbay"},
            "annotations": {
                "sickbay.dev/note": "the Sickbay cluster name; change it only by a migration "
                f"({MIGRATE_HINT})"
            },
        },
        "data": {CLUSTER_CONFIGMAP_KEY: name},
    }
    try:
        cm = kube.call(
            kube.core.create_namespaced_config_map,
            namespace,
            body,
            verb="create",
            resource="configmaps",
            name=CLUSTER_CONFIGMAP,
        )
    except KubeError as exc:
        if exc.kind is not ErrorKind.CONFLICT:
            raise
        recorded = read_recorded(kube, namespace)
        if recorded is None:  # deleted in between: nothing to agree with, try once more
            return record(kube, namespace, name)
        return recorded
    return _record_value(cm, namespace)


def kube_system_uid(kube: Any) -> str:
    ns = kube.call(
        kube.core.read_namespace,
        FINGERPRINT_NAMESPACE,
        verb="get",
        resource="namespaces",
        name=FINGERPRINT_NAMESPACE,
    )
    uid = str(((ns.get("metadata") or {}).get("uid")) or "")
    if not uid:
        raise ClusterNameError("the kube-system namespace has no uid to derive a name from")
    return uid


async def resolve_worker_cluster(kube: Any, explicit: str | None, namespace: str) -> str:
    """The worker's cluster name (see the module docstring); raises ClusterNameError.

    `explicit`: SICKBAY_CLUSTER when set (even ""), else None."""
    recorded = await asyncio.to_thread(read_recorded, kube, namespace)
    if recorded is None:
        if explicit is not None:
            wanted = explicit
        else:
            wanted = derived_cluster_name(await asyncio.to_thread(kube_system_uid, kube))
        recorded = await asyncio.to_thread(record, kube, namespace, wanted)
        if recorded == wanted:
            log.info(
                "recorded cluster name %s in ConfigMap %s/%s",
                shown(recorded),
                namespace,
                CLUSTER_CONFIGMAP,
            )
    check_agrees(explicit, recorded, f"ConfigMap {namespace}/{CLUSTER_CONFIGMAP}")
    return recorded


def check_agrees(explicit: str | None, recorded: str, where: str) -> None:
    if explicit is not None and explicit != recorded:
        raise ClusterNameError(
            f"refusing to start: SICKBAY_CLUSTER is {shown(explicit)} but this cluster's "
            f"recorded name is {shown(recorded)} ({where}). Changing a cluster's name is a "
            f"migration, not a restart ({MIGRATE_HINT}): unset SICKBAY_CLUSTER, or set it to "
            f"{shown(recorded)}"
        )


def read_cluster_file(path: Path) -> str | None:
    """The name in a mounted record (`SICKBAY_CLUSTER_FILE`), or None while it is absent."""
    try:
        text = path.read_text()
    except FileNotFoundError:
        return None
    try:
        return check_cluster_name(text.strip())
    except ValueError as exc:
        raise ClusterNameError(f"SICKBAY_CLUSTER_FILE {path}: {exc}") from exc


async def settle_worker_cluster(settings: Any, kube: Any) -> Any:
    """`settings` (worker.settings.Settings) for the recorded cluster name; raises
    ClusterNameError (or KubeError: the record cannot be read or written)."""
    explicit = settings.cluster if settings.cluster_explicit else None
    loop = asyncio.get_running_loop()
    deadline = loop.time() + UNREACHABLE_SECONDS
    while True:
        try:
            name = await resolve_worker_cluster(kube, explicit, settings.watch.watch_namespace)
        except KubeError as exc:
            # An API server still starting (or a blip): wait a little, never guess the name.
            if exc.kind is not ErrorKind.TRANSIENT or loop.time() > deadline:
                raise
            log.warning("cannot read the cluster name record yet (%s); retrying", exc)
            await asyncio.sleep(RETRY_SECONDS)
            continue
        return settings.with_cluster(name)
