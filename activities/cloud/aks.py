"""AKS agent pools over Azure Resource Manager REST (Microsoft.ContainerService).

- describe: `GET .../managedClusters/{cluster}/agentPools/{pool}?api-version=V` ->
  `properties.count`, autoscaling bounds (`enableAutoScaling`, `minCount`, `maxCount`), and a
  resize still running when `provisioningState` is not terminal (Scaling, Updating, ...).
- set_size: ARM PUT replaces the resource, so the pool is read first and written back with
  only `properties.count` changed (read-only fields dropped), `If-Match: <etag>` when ARM gave
  one, so a concurrent change makes the PUT fail (412, retried) instead of being overwritten.
  ARM answers 200/201 with an `Azure-AsyncOperation` header: that URL is the operation.
- get_operation: `GET <Azure-AsyncOperation URL>` -> `status` InProgress / Succeeded /
  Failed / Canceled, `error.message` on failure. Without such a header the pool's
  `provisioningState` is followed instead (operation id `provisioning-state`).

Credentials: a bearer token from `$SICKBAY_AZURE_TOKEN` / `_FILE`, else azure-identity's
credential chain (AKS workload identity, managed identity, a client secret or certificate in
the environment; credentials.py) for the scope `https://management.azure.com/.default`. Tokens
go only to the ARM endpoint.
"""

from __future__ import annotations

from typing import Any

import httpx

from activities.cloud.base import (
    CloudRejected,
    CloudUnavailable,
    ScaleOutcome,
    json_of,
    same_origin,
    send,
)
from activities.cloud.config import AksConfig
from activities.cloud.credentials import AzureToken
from activities.outbound import ConfigError
from contract.capacity import NodePoolTarget, PoolDescription, PoolOperation

STATE_OPERATION = "provisioning-state"
_TERMINAL = ("Succeeded", "Failed", "Canceled")
# Read-only agent pool properties (the ARM agent-pool schema's read-only fields, and the node
# image an upgrade sets): ARM ignores or refuses them on PUT. The etag goes in If-Match.
_READ_ONLY = ("provisioningState", "nodeImageVersion", "currentOrchestratorVersion", "eTag")
# PUT with a stale etag: another change won the race; describe again and retry.
_PRECONDITION_FAILED = 412


class AksNodePools:
    """`NodePoolClient` for AKS agent pools."""

    def __init__(self, client: httpx.AsyncClient, config: AksConfig) -> None:
        self._client = client
        self._config = config
        self._endpoint = config.endpoint.rstrip("/")
        self._token = AzureToken(config)

    @classmethod
    def from_config(cls, client: httpx.AsyncClient, config: AksConfig) -> AksNodePools:
        return cls(client, config)

    async def describe(self, pool: NodePoolTarget) -> PoolDescription:
        resource = await self._get_pool(pool)
        props = resource.get("properties") or {}
        state = str(props.get("provisioningState", ""))
        pending = None
        if state and state not in _TERMINAL:
            pending = PoolOperation(id=STATE_OPERATION)
        autoscale = bool(props.get("enableAutoScaling"))
        return PoolDescription(
            current_size=int(props.get("count", 0)),
            min_size=int(props["minCount"]) if autoscale and "minCount" in props else None,
            max_size=int(props["maxCount"]) if autoscale and "maxCount" in props else None,
            pending_operation=pending,
            detail=f"provisioningState {state or '?'}"
            + (", cluster autoscaler enabled" if autoscale else ""),
        )

    async def set_size(
        self, pool: NodePoolTarget, size: int, max_size: int, idempotency_key: str
    ) -> ScaleOutcome:
        resource = await self._get_pool(pool)
        props = {k: v for k, v in (resource.get("properties") or {}).items() if k not in _READ_ONLY}
        props["count"] = size
        headers = await self._headers()
        etag = resource.get("etag") or resource.get("properties", {}).get("eTag")
        if etag:
            headers["If-Match"] = str(etag)
        try:
            response = await send(
                self._client,
                "PUT",
                self._pool_url(pool),
                headers=headers,
                json_body={"properties": props},
            )
        except CloudRejected as exc:
            if exc.status == _PRECONDITION_FAILED:
                raise CloudUnavailable(f"agent pool changed meanwhile (etag): {exc}") from exc
            raise
        async_url = response.headers.get("azure-asyncoperation")
        if async_url:
            if not same_origin(async_url, self._endpoint):
                raise ConfigError(
                    f"Azure-AsyncOperation URL outside {self._endpoint}; not followed"
                )
            op_id = async_url
        else:
            op_id = STATE_OPERATION
        state = (json_of(response).get("properties") or {}).get("provisioningState")
        done = state == "Succeeded" and not async_url
        return ScaleOutcome(
            target_size=size, operation=PoolOperation(id=op_id, done=done, target_size=size)
        )

    async def get_operation(self, pool: NodePoolTarget, operation: str) -> PoolOperation:
        if operation == STATE_OPERATION:
            props = (await self._get_pool(pool)).get("properties") or {}
            state = str(props.get("provisioningState", ""))
            return PoolOperation(
                id=operation,
                done=state in _TERMINAL,
                error=None if state in ("Succeeded", "") else f"agent pool {state}",
            )
        if not same_origin(operation, self._endpoint):
            raise ConfigError(f"operation {operation[:100]} is not an ARM URL; not followed")
        body = json_of(await send(self._client, "GET", operation, headers=await self._headers()))
        status = str(body.get("status", ""))
        error = None
        if status in ("Failed", "Canceled"):
            err = body.get("error") or {}
            error = f"{status}: {err.get('code', '')} {err.get('message', '')}".strip()[:500]
        return PoolOperation(id=operation, done=status in _TERMINAL, error=error)

    # --- helpers -------------------------------------------------------------------------

    def _pool_url(self, pool: NodePoolTarget) -> str:
        parts = {
            f: getattr(pool, f) or getattr(self._config, f)
            for f in ("subscription", "resource_group", "cluster")
        }
        missing = [f for f, v in parts.items() if not v]
        if missing:
            raise ConfigError(
                f"AKS pool {pool.name!r} needs {', '.join(missing)} in the runbook's "
                "scaleUp.pool (or the worker's SICKBAY_AKS_* defaults)"
            )
        return (
            f"{self._endpoint}/subscriptions/{parts['subscription']}/resourceGroups/"
            f"{parts['resource_group']}/providers/Microsoft.ContainerService/managedClusters/"
            f"{parts['cluster']}/agentPools/{pool.name}?api-version={self._config.api_version}"
        )

    async def _headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {await self._token.get()}", "Accept": "application/json"}

    async def _get_pool(self, pool: NodePoolTarget) -> dict[str, Any]:
        return json_of(
            await send(self._client, "GET", self._pool_url(pool), headers=await self._headers())
        )
