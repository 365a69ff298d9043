"""GKE node pools over the Kubernetes Engine REST API v1 (and the cluster twin, which speaks
the same shapes).

- describe: `GET /v1/projects/{p}/locations/{l}/clusters/{c}/nodePools/{np}` for the pool's
  zones, autoscaling bounds and instance groups; the size is the sum of each instance group
  manager's `targetSize` (the NodePool resource itself has no current size); running resizes
  come from `GET .../locations/{l}/operations` (status PENDING/RUNNING, targetLink = the pool).
- set_size: `POST .../nodePools/{np}:setSize {"nodeCount": n}` -> Operation. `nodeCount` is
  per zone: a pool in 3 zones asked for 7 nodes gets 3 per zone (9), lowered to 2 per zone when
  9 would pass the max.
- get_operation: `GET .../locations/{l}/operations/{name}` until `status == DONE`; a DONE
  operation with `error` failed (quota exhausted while creating VMs, for instance).

The bearer token comes from `$SICKBAY_GKE_TOKEN` / `$SICKBAY_GKE_TOKEN_FILE`, else google-auth's
Application Default Credentials (Workload Identity on GKE; credentials.py); it is sent only to
the API endpoint and the compute hosts.
"""

from __future__ import annotations

from typing import Any, Protocol

import httpx

from activities.cloud.base import (
    CloudRejected,
    CloudUnavailable,
    ScaleOutcome,
    json_of,
    per_zone_count,
    same_origin,
    send,
)
from activities.cloud.config import GkeConfig
from activities.cloud.credentials import GoogleToken
from activities.outbound import ConfigError
from contract.capacity import NodePoolTarget, PoolDescription, PoolOperation

_ACTIVE = ("PENDING", "RUNNING", "ABORTING")


class TokenSource(Protocol):
    async def get(self) -> str: ...


class GkeNodePools:
    """`NodePoolClient` for GKE-shaped APIs."""

    def __init__(
        self,
        client: httpx.AsyncClient,
        *,
        endpoint: str,
        token: TokenSource,
        compute_hosts: list[str] | None = None,
        defaults: dict[str, str] | None = None,
    ) -> None:
        self._client = client
        self._endpoint = endpoint.rstrip("/")
        self._token = token
        self._compute_hosts = compute_hosts or []
        self._defaults = defaults or {}  # project/location/cluster for the twin

    @classmethod
    def from_config(cls, client: httpx.AsyncClient, config: GkeConfig) -> GkeNodePools:
        defaults = {
            k: v
            for k, v in (
                ("project", config.project),
                ("location", config.location),
                ("cluster", config.cluster),
            )
            if v
        }
        return cls(
            client,
            endpoint=config.endpoint,
            token=GoogleToken(config),
            compute_hosts=config.compute_hosts,
            defaults=defaults,
        )

    # --- NodePoolClient ------------------------------------------------------------------

    async def describe(self, pool: NodePoolTarget) -> PoolDescription:
        node_pool = await self._get(self._pool_url(pool))
        groups = node_pool.get("instanceGroupUrls") or []
        size = await self._size(node_pool)
        zones = max(1, len(groups) or len(node_pool.get("locations") or []))
        autoscaling = node_pool.get("autoscaling") or {}
        min_size = max_size = None
        if autoscaling.get("enabled"):
            if "totalMaxNodeCount" in autoscaling:
                min_size = int(autoscaling.get("totalMinNodeCount", 0))
                max_size = int(autoscaling["totalMaxNodeCount"])
            else:
                min_size = int(autoscaling.get("minNodeCount", 0)) * zones
                max_size = int(autoscaling.get("maxNodeCount", 0)) * zones
        pending = await self._pending_operation(pool)
        return PoolDescription(
            current_size=size,
            min_size=min_size,
            max_size=max_size,
            pending_operation=pending,
            detail=f"status {node_pool.get('status', '?')}, {zones} zone(s)",
        )

    async def set_size(
        self, pool: NodePoolTarget, size: int, max_size: int, idempotency_key: str
    ) -> ScaleOutcome:
        # setSize has no request id: asking for the same count twice is harmless, and the
        # activity looks for a running resize before it asks again.
        node_pool = await self._get(self._pool_url(pool))
        zones = max(1, len(node_pool.get("instanceGroupUrls") or node_pool.get("locations") or []))
        per_zone = per_zone_count(size, zones, max_size)
        current = await self._size(node_pool)
        if per_zone * zones <= current:
            # Whole zones only: the max leaves no room for one more node in every zone.
            return ScaleOutcome(target_size=current, operation=None)
        try:
            response = await send(
                self._client,
                "POST",
                f"{self._pool_url(pool)}:setSize",
                headers=await self._headers(),
                json_body={"nodeCount": per_zone},
            )
        except CloudRejected as exc:
            # GKE refuses with 400 FAILED_PRECONDITION while another operation runs on the
            # cluster ("incompatible operation"): that passes, so retry rather than give up.
            if (
                exc.status == 400
                and "operation" in str(exc)
                and ("FAILED_PRECONDITION" in str(exc) or "incompatible" in str(exc))
            ):
                raise CloudUnavailable(str(exc)) from exc
            raise
        operation = self._operation(json_of(response), target=per_zone * zones)
        return ScaleOutcome(target_size=per_zone * zones, operation=operation)

    async def get_operation(self, pool: NodePoolTarget, operation: str) -> PoolOperation:
        if "/" in operation or not operation:
            raise ConfigError(f"not a GKE operation name: {operation!r}")
        return self._operation(
            await self._get(f"{self._location_url(pool)}/operations/{operation}")
        )

    # --- helpers -------------------------------------------------------------------------

    def _part(self, pool: NodePoolTarget, field: str) -> str:
        value = getattr(pool, field) or self._defaults.get(field)
        if not value:
            raise ConfigError(
                f"GKE pool {pool.name!r} needs `{field}` in the runbook's scaleUp.pool"
            )
        return str(value)

    def _location_url(self, pool: NodePoolTarget) -> str:
        return (
            f"{self._endpoint}/v1/projects/{self._part(pool, 'project')}"
            f"/locations/{self._part(pool, 'location')}"
        )

    def _pool_url(self, pool: NodePoolTarget) -> str:
        return (
            f"{self._location_url(pool)}/clusters/{self._part(pool, 'cluster')}"
            f"/nodePools/{pool.name}"
        )

    def _checked_group_url(self, url: str) -> str:
        allowed = [self._endpoint, *self._compute_hosts]
        if not any(same_origin(url, base) for base in allowed):
            raise ConfigError(
                f"instance group URL {url} is outside the configured GKE/compute endpoints; "
                "not sending the token there"
            )
        return url

    async def _headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {await self._token.get()}", "Accept": "application/json"}

    async def _get(self, url: str) -> dict[str, Any]:
        return json_of(await send(self._client, "GET", url, headers=await self._headers()))

    async def _size(self, node_pool: dict[str, Any]) -> int:
        """Sum of the pool's instance groups' target sizes (one group per zone)."""
        size = 0
        for url in node_pool.get("instanceGroupUrls") or []:
            size += int((await self._get(self._checked_group_url(url))).get("targetSize", 0))
        return size

    async def _pending_operation(self, pool: NodePoolTarget) -> PoolOperation | None:
        body = await self._get(f"{self._location_url(pool)}/operations")
        suffix = f"/clusters/{self._part(pool, 'cluster')}/nodePools/{pool.name}"
        for op in body.get("operations") or []:
            if op.get("status") in _ACTIVE and str(op.get("targetLink", "")).endswith(suffix):
                return self._operation(op)
        return None

    @staticmethod
    def _operation(op: dict[str, Any], target: int | None = None) -> PoolOperation:
        name = op.get("name")
        if not name:
            raise CloudUnavailable("GKE answered without an operation name")
        done = op.get("status") == "DONE"
        error = None
        if done and op.get("error"):
            err = op["error"]
            error = str(err.get("message") or err)[:500]
        return PoolOperation(id=str(name), done=done, error=error, target_size=target)
