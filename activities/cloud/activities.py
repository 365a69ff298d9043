"""`CloudActivities`: describe a node pool, resize it, follow the resize.

Thin wrappers over the provider clients (`NodePoolClient`): each method picks the provider
from the runbook's `NodePoolTarget.provider`, makes its calls and maps errors:

- `CloudRejected` -> ApplicationError ERR_CLOUD_REJECTED, non-retryable, provider's message;
- `CloudUnavailable` -> ApplicationError ERR_CLOUD_UNAVAILABLE, retryable (Retry-After kept);
- `ConfigError` -> ApplicationError ERR_CONFIG, non-retryable.

`scale_pool` is safe to retry: it never asks above `max_size`, asks *for* a size (not "+n"),
and adopts a resize already running on the pool instead of stacking a second one.
"""

from __future__ import annotations

import ipaddress
import logging
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import timedelta
from typing import Any
from urllib.parse import urlsplit

import httpx
from temporalio import activity
from temporalio.exceptions import ApplicationError

from activities.cloud.base import CloudRejected, CloudUnavailable, NodePoolClient
from activities.cloud.config import CloudConfig
from activities.cloud.credentials import StaticToken
from activities.cloud.gke import GkeNodePools
from activities.defn import implements
from activities.heartbeat import HEARTBEAT_EVERY, heartbeating
from activities.outbound import ConfigError
from activities.waiting import still_waiting
from contract.capacity import (
    DESCRIBE_NODE_POOL,
    SCALE_NODE_POOL,
    WAIT_NODE_POOL_OPERATION,
    DescribePoolInput,
    NodePoolTarget,
    PoolDescription,
    PoolOperation,
    PoolOperationInput,
    ScalePoolInput,
    ScalePoolResult,
)
from contract.errors import (
    ERR_CLOUD_REJECTED,
    ERR_CLOUD_UNAVAILABLE,
    ERR_CONFIG,
    ERR_INVALID_INPUT,
)

log = logging.getLogger(__name__)


@contextmanager
def mapped_errors(what: str) -> Iterator[None]:
    """Provider exceptions -> Temporal ApplicationErrors with the right retry semantics."""
    try:
        yield
    except CloudRejected as exc:
        raise ApplicationError(
            f"{what}: {exc}", type=ERR_CLOUD_REJECTED, non_retryable=True
        ) from exc
    except CloudUnavailable as exc:
        delay = timedelta(seconds=exc.retry_after) if exc.retry_after is not None else None
        raise ApplicationError(
            f"{what}: {exc}", type=ERR_CLOUD_UNAVAILABLE, next_retry_delay=delay
        ) from exc
    except ConfigError as exc:
        raise ApplicationError(f"{what}: {exc}", type=ERR_CONFIG, non_retryable=True) from exc


def _is_loopback(url: str) -> bool:
    host = urlsplit(url).hostname or ""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


class CloudActivities:
    """Node-pool activities. Give it the worker's `CloudConfig`; tests may pass `providers`
    (provider kind -> `NodePoolClient`) to replace the real clients."""

    def __init__(
        self,
        config: CloudConfig | None = None,
        *,
        http: httpx.AsyncClient | None = None,
        kube_api: Any = None,
        providers: dict[str, NodePoolClient] | None = None,
    ) -> None:
        self._config = config or CloudConfig()
        self._http = http or httpx.AsyncClient(timeout=self._config.request_timeout)
        self._kube_api = kube_api  # kubernetes.client.ApiClient for the Cluster API provider
        self._providers: dict[str, NodePoolClient] = dict(providers or {})
        self._aws: Any = None  # AwsClients, made at the first EKS pool

    async def aclose(self) -> None:
        await self._http.aclose()

    def provider_for(self, pool: NodePoolTarget) -> NodePoolClient:
        key: str = pool.provider
        if pool.provider == "twin":
            key = f"twin:{pool.endpoint or self._config.twin.endpoint}"
        elif pool.provider == "http":
            key = f"http:{pool.profile}"
        if key in self._providers:
            return self._providers[key]
        if pool.provider in self._providers:  # a test fake for the whole kind
            return self._providers[pool.provider]
        provider = self._build(pool)
        self._providers[key] = provider
        return provider

    def _aws_clients(self) -> Any:
        if self._aws is None:
            from activities.cloud.aws import AwsClients

            self._aws = AwsClients(self._config.aws)
        return self._aws

    def _build(self, pool: NodePoolTarget) -> NodePoolClient:
        if pool.provider == "gke":
            return GkeNodePools.from_config(self._http, self._config.gke)
        if pool.provider == "twin":
            twin = self._config.twin
            endpoint = pool.endpoint or twin.endpoint
            if not endpoint:
                raise ConfigError(
                    "a `twin` pool needs `endpoint` (the twin's cloud API URL) in the runbook "
                    "or `twin.endpoint` in the worker's cloud file"
                )
            if not _is_loopback(endpoint):
                raise ConfigError(
                    f"the twin's cloud API must be on loopback, not {endpoint}; "
                    "the twin token is never sent elsewhere"
                )
            return GkeNodePools(
                self._http,
                endpoint=endpoint,
                token=StaticToken(twin.token),
                defaults={
                    "project": twin.project,
                    "location": twin.location,
                    "cluster": twin.cluster,
                },
            )
        if pool.provider == "aks":
            from activities.cloud.aks import AksNodePools

            return AksNodePools.from_config(self._http, self._config.aks)
        if pool.provider == "eks":
            from activities.cloud.aws import EksNodeGroups

            return EksNodeGroups(self._aws_clients(), self._config.aws)
        if pool.provider == "http":
            from activities.cloud.http import HttpNodePools

            if not pool.profile or pool.profile not in self._config.http:
                known = ", ".join(sorted(self._config.http)) or "none"
                raise ConfigError(
                    f"http pool {pool.name!r} names profile {pool.profile!r}, not configured on "
                    f"this worker (configured: {known})"
                )
            return HttpNodePools(self._http, self._config.http[pool.profile])
        if pool.provider == "cluster-api":
            from activities.cloud.cluster_api import ClusterApiNodePools

            if self._kube_api is None:
                raise ConfigError("the Cluster API provider needs the worker's Kubernetes client")
            return ClusterApiNodePools(self._kube_api)
        raise ConfigError(f"unknown node-pool provider {pool.provider!r}")

    # --- activities ------------------------------------------------------------------------

    @implements(DESCRIBE_NODE_POOL)
    async def describe_pool(self, req: DescribePoolInput) -> PoolDescription:
        """The pool's size, bounds and running resize. Heartbeats while the provider answers,
        so a worker killed meanwhile is retried elsewhere within the pool scaler's heartbeat
        timeout, not its start-to-close."""
        async with heartbeating(HEARTBEAT_EVERY):
            with mapped_errors(f"describe {req.pool.provider} pool {req.pool.name}"):
                return await self.provider_for(req.pool).describe(req.pool)

    @implements(SCALE_NODE_POOL)
    async def scale_pool(self, req: ScalePoolInput) -> ScalePoolResult:
        """One resize (or the one already running, adopted). Heartbeats while the provider
        answers, as `describe_pool` does: the retry of a killed attempt adopts the resize it
        asked for (a running operation) or finds the pool grown; nothing is asked twice."""
        async with heartbeating(HEARTBEAT_EVERY):
            return await self._scale(req)

    async def _scale(self, req: ScalePoolInput) -> ScalePoolResult:
        pool = req.pool
        if req.target_size > req.max_size:
            raise ApplicationError(
                f"refusing to scale pool {pool.name} to {req.target_size}: above its max size "
                f"{req.max_size}",
                type=ERR_INVALID_INPUT,
                non_retryable=True,
            )
        what = f"scale {pool.provider} pool {pool.name} to {req.target_size}"
        with mapped_errors(what):
            provider = self.provider_for(pool)
            desc = await provider.describe(pool)
            pending = desc.pending_operation
            if pending is not None and not pending.done:
                # Ours from an attempt whose answer was lost, or someone else's: either way a
                # second resize would be refused or would race it. Follow it instead.
                activity.logger.info(
                    "pool %s: resize %s already running; following it", pool.name, pending.id
                )
                return ScalePoolResult(
                    previous_size=desc.current_size,
                    target_size=pending.target_size or desc.current_size,
                    operation=pending,
                    adopted=True,
                    message=f"a resize was already running on the pool ({pending.id})",
                )
            if desc.current_size >= req.target_size:
                return ScalePoolResult(
                    previous_size=desc.current_size,
                    target_size=desc.current_size,
                    message=f"pool already has {desc.current_size} node(s); nothing asked",
                )
            limit = req.max_size
            if desc.max_size is not None and desc.max_size < limit:
                limit = desc.max_size  # the provider's own autoscaling bound
            if req.target_size > limit:
                raise ApplicationError(
                    f"{what}: the provider's max for this pool is {limit}",
                    type=ERR_CLOUD_REJECTED,
                    non_retryable=True,
                )
            if req.dry_run:
                return ScalePoolResult(
                    previous_size=desc.current_size,
                    target_size=req.target_size,
                    message=f"dry run: would resize {desc.current_size} -> {req.target_size}",
                )
            outcome = await provider.set_size(pool, req.target_size, limit, req.idempotency_key)
        activity.logger.info(
            "pool %s (%s): asked %d -> %d, operation %s",
            pool.name,
            pool.provider,
            desc.current_size,
            outcome.target_size,
            outcome.operation.id if outcome.operation else "none",
        )
        return ScalePoolResult(
            previous_size=desc.current_size,
            target_size=outcome.target_size,
            operation=outcome.operation,
            message=f"asked {desc.current_size} -> {outcome.target_size}",
        )

    @implements(WAIT_NODE_POOL_OPERATION)
    async def wait_pool_operation(self, req: PoolOperationInput) -> PoolOperation:
        """One look at a resize; raises retryable ERR_STILL_WAITING while it runs, so the
        caller's retry policy is the polling loop. A failed operation is returned, not raised:
        the caller turns its `error` into a rejection."""
        with mapped_errors(f"follow {req.pool.provider} operation {req.operation}"):
            op = await self.provider_for(req.pool).get_operation(req.pool, req.operation)
        if not op.done:
            raise still_waiting(f"operation {req.operation} on pool {req.pool.name} still running")
        return op
