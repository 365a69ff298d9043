"""Cluster API node pools: a `MachineDeployment` (cluster.x-k8s.io/v1beta1) whose
`spec.replicas` is the pool size, through the official kubernetes client (CustomObjectsApi).

- describe: GET the MachineDeployment; size = `spec.replicas`; bounds from the cluster
  autoscaler's annotations (`cluster.x-k8s.io/cluster-api-autoscaler-node-group-min-size` /
  `-max-size`); a resize is still running while `status.readyReplicas` < `spec.replicas`.
- set_size: JSON merge patch `{"spec": {"replicas": n}}`, plus an annotation naming the
  request (`sickbay.dev/scale-request: <idempotency key>`) so people see who scaled it.
- get_operation (`replicas:<n>`): done when `status.readyReplicas` >= n; failed when the
  MachineDeployment's `status.phase` is `Failed`.

The kubernetes client is synchronous: calls run in a worker thread (`asyncio.to_thread`),
never blocking the activity event loop. RBAC: get/patch on machinedeployments.
"""

from __future__ import annotations

import asyncio
from typing import Any

from activities.cloud.base import CloudRejected, CloudUnavailable, ScaleOutcome
from activities.outbound import ConfigError
from contract.capacity import NodePoolTarget, PoolDescription, PoolOperation

GROUP = "cluster.x-k8s.io"
VERSION = "v1beta1"
PLURAL = "machinedeployments"
ANN_MIN = "cluster.x-k8s.io/cluster-api-autoscaler-node-group-min-size"
ANN_MAX = "cluster.x-k8s.io/cluster-api-autoscaler-node-group-max-size"
ANN_SCALE_REQUEST = "sickbay.dev/scale-request"
_OP_PREFIX = "replicas:"


def _int(value: Any) -> int | None:
    try:
        return int(value)
    except (TypeError, ValueError):
        return None


class ClusterApiNodePools:
    def __init__(self, api_client: Any) -> None:
        from kubernetes.client import CustomObjectsApi

        self._api = CustomObjectsApi(api_client)

    async def _run(self, what: str, fn: Any, *args: Any, **kwargs: Any) -> dict[str, Any]:
        from kubernetes.client.exceptions import ApiException
        from urllib3.exceptions import HTTPError

        try:
            return await asyncio.to_thread(fn, *args, **kwargs)
        except ApiException as exc:
            message = f"{what}: HTTP {exc.status} {exc.reason}: {str(exc.body or '')[:300]}"
            if exc.status in (409, 429) or (exc.status or 0) >= 500:
                raise CloudUnavailable(message) from exc
            raise CloudRejected(message, exc.status) from exc
        except HTTPError as exc:
            raise CloudUnavailable(f"{what}: {exc!r}") from exc

    async def _get(self, pool: NodePoolTarget) -> dict[str, Any]:
        namespace = pool.namespace or "default"
        return await self._run(
            f"get MachineDeployment {namespace}/{pool.name}",
            self._api.get_namespaced_custom_object,
            GROUP,
            VERSION,
            namespace,
            PLURAL,
            pool.name,
        )

    async def describe(self, pool: NodePoolTarget) -> PoolDescription:
        md = await self._get(pool)
        spec, status = md.get("spec") or {}, md.get("status") or {}
        annotations = (md.get("metadata") or {}).get("annotations") or {}
        replicas = _int(spec.get("replicas"))
        if replicas is None:
            replicas = 1  # the API server's default for an unset spec.replicas
        ready = _int(status.get("readyReplicas")) or 0
        pending = None
        if ready < replicas:
            pending = PoolOperation(id=f"{_OP_PREFIX}{replicas}", target_size=replicas)
        return PoolDescription(
            current_size=replicas,
            min_size=_int(annotations.get(ANN_MIN)),
            max_size=_int(annotations.get(ANN_MAX)),
            pending_operation=pending,
            detail=f"{ready}/{replicas} ready, phase {status.get('phase', '?')}",
        )

    async def set_size(
        self, pool: NodePoolTarget, size: int, max_size: int, idempotency_key: str
    ) -> ScaleOutcome:
        namespace = pool.namespace or "default"
        body = {
            "metadata": {"annotations": {ANN_SCALE_REQUEST: idempotency_key}},
            "spec": {"replicas": size},
        }
        await self._run(
            f"patch MachineDeployment {namespace}/{pool.name}",
            self._api.patch_namespaced_custom_object,
            GROUP,
            VERSION,
            namespace,
            PLURAL,
            pool.name,
            body,
            _content_type="application/merge-patch+json",
        )
        return ScaleOutcome(size, PoolOperation(id=f"{_OP_PREFIX}{size}", target_size=size))

    async def get_operation(self, pool: NodePoolTarget, operation: str) -> PoolOperation:
        target = (
            _int(operation.removeprefix(_OP_PREFIX)) if operation.startswith(_OP_PREFIX) else None
        )
        if target is None:
            raise ConfigError(f"not a Cluster API operation: {operation!r}")
        status = (await self._get(pool)).get("status") or {}
        ready = _int(status.get("readyReplicas")) or 0
        if status.get("phase") == "Failed":
            reason = status.get("failureMessage") or status.get("failureReason") or "phase Failed"
            return PoolOperation(
                id=operation, done=True, error=str(reason)[:500], target_size=target
            )
        return PoolOperation(id=operation, done=ready >= target, target_size=target)
