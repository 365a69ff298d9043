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

Credentials: a bearer token from `$SICKBAY_AZURE_TOKEN` / `_FILE`, or a Microsoft Entra
client-credentials login (`AZURE_TENANT_ID`, `AZURE_CLIENT_ID` and `AZURE_CLIENT_SECRET` or
the workload-identity `AZURE_FEDERATED_TOKEN_FILE`) for the scope
`https://management.azure.com/.default`. Tokens go only to the ARM endpoint.
"""

from __future__ import annotations

import time
from typing import Any
from urllib.parse import quote

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
from activities.outbound import ConfigError
from contract.capacity import NodePoolTarget, PoolDescription, PoolOperation

STATE_OPERATION = "provisioning-state"
_TERMINAL = ("Succeeded", "Failed", "Canceled")
# Read-only agent pool properties: ARM ignores or refuses them on PUT.
_READ_ONLY = ("provisioningState", "nodeImageVersion", "currentOrchestratorVersion")
# PUT with a stale etag: another change won the race; describe again and retry.
_PRECONDITION_FAILED = 412


class AzureToken:
    """A bearer token for ARM: configured directly, or from a client-credentials login."""

    def __init__(self, client: httpx.AsyncClient, config: AksConfig) -> None:
        self._client, self._config = client, config
        self._token: str | None = None
        self._expires = 0.0

    async def get(self) -> str:
        cfg = self._config
        if cfg.token.available():
            return cfg.token.resolve()
        if self._token and time.monotonic() < self._expires:
            return self._token
        if not (cfg.tenant_id and cfg.client_id):
            raise ConfigError(
                f"no Azure credentials: set {cfg.token.describe()} (or its _FILE), or "
                "AZURE_TENANT_ID + AZURE_CLIENT_ID with AZURE_CLIENT_SECRET or "
                "AZURE_FEDERATED_TOKEN_FILE"
            )
        form = {
            "grant_type": "client_credentials",
            "client_id": cfg.client_id,
            "scope": f"{cfg.endpoint.rstrip('/')}/.default",
        }
        if cfg.client_secret.available():
            form["client_secret"] = cfg.client_secret.resolve()
        elif cfg.federated_token_file is not None:
            try:
                assertion = cfg.federated_token_file.read_text().strip()
            except OSError as exc:
                raise ConfigError(
                    f"cannot read federated token file {cfg.federated_token_file}: {exc.strerror}"
                ) from exc
            form["client_assertion_type"] = "urn:ietf:params:oauth:client-assertion-type:jwt-bearer"
            form["client_assertion"] = assertion
        else:
            raise ConfigError("Azure login needs AZURE_CLIENT_SECRET or AZURE_FEDERATED_TOKEN_FILE")
        url = f"{cfg.authority.rstrip('/')}/{quote(cfg.tenant_id)}/oauth2/v2.0/token"
        try:
            response = await self._client.post(url, data=form)
        except httpx.HTTPError as exc:
            raise CloudUnavailable(f"Microsoft Entra login failed: {exc!r}") from exc
        if response.status_code >= 500 or response.status_code == 429:
            raise CloudUnavailable(f"Microsoft Entra login: HTTP {response.status_code}")
        try:
            body = response.json()
        except ValueError:
            body = {}
        if response.status_code >= 400:
            raise CloudRejected(
                f"Microsoft Entra login refused: {body.get('error', '')}: "
                f"{str(body.get('error_description', ''))[:300]}",
                response.status_code,
            )
        self._token = str(body["access_token"])
        self._expires = time.monotonic() + float(body.get("expires_in", 300)) - 60
        return self._token


class AksNodePools:
    """`NodePoolClient` for AKS agent pools."""

    def __init__(self, client: httpx.AsyncClient, config: AksConfig) -> None:
        self._client = client
        self._config = config
        self._endpoint = config.endpoint.rstrip("/")
        self._token = AzureToken(client, config)

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
