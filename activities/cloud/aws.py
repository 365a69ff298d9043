"""AWS: EKS managed node groups, through boto3 (the AWS SDK signs every request; credentials
come from its standard chain: EKS Pod Identity, IRSA web identity, the environment, a shared
config profile, the instance profile).

- describe: `DescribeNodegroup` -> `scalingConfig` (`desiredSize` is the size, `minSize` /
  `maxSize` the bounds) and `status`; while the node group is `UPDATING` the running update is
  found with `ListUpdates` + `DescribeUpdate` (status `InProgress`) and adopted instead of
  stacking a second one.
- set_size: `UpdateNodegroupConfig` with `scalingConfig: {desiredSize: n}` only (the bounds are
  never touched, so the size stays within `maxSize`) and `clientRequestToken` derived from the
  request's idempotency key: a retry, also on another worker after a crash, gets the same
  update back from EKS and nothing is asked twice.
- get_operation: `DescribeUpdate` until `Successful` (`Failed` / `Cancelled` carry EKS's
  `errors`). Without an update id (an `UPDATING` node group whose update was not listed) the
  node group's `status` is followed instead (operation `nodegroup-status`).

boto3 is synchronous: every call runs in a worker thread (`asyncio.to_thread`), as the
kubernetes client's calls do, never blocking the activity's event loop. botocore's own retries
are off (one attempt): Temporal's retry policy is the only retry loop, with the error mapping
below (throttling, 5xx and "resource in use" retryable; the rest refused for good).
"""

from __future__ import annotations

import asyncio
import threading
import uuid as uuidlib
from collections.abc import Callable
from typing import Any

from activities.cloud.base import CloudRejected, CloudUnavailable, ScaleOutcome
from activities.cloud.config import AwsConfig
from activities.outbound import ConfigError
from contract.capacity import NodePoolTarget, PoolDescription, PoolOperation

STATUS_OPERATION = "nodegroup-status"
# AWS error codes that mean "try again later" although some come as 4xx: throttling, a node
# group busy with another update, the service's own transient failures.
RETRYABLE_CODES = frozenset(
    {
        "Throttling",
        "ThrottlingException",
        "TooManyRequestsException",
        "RequestLimitExceeded",
        "RequestThrottled",
        "ResourceInUseException",
        "ServerException",
        "ServiceUnavailable",
        "ServiceUnavailableException",
        "InternalError",
        "InternalFailure",
        "Unavailable",
        "ScalingActivityInProgress",
        "ResourceContention",
    }
)
# Seconds per AWS call (connect, read): EKS, EC2 and Auto Scaling answer well within these.
CONNECT_TIMEOUT = 10.0
READ_TIMEOUT = 30.0
# Updates looked at to find the running one: EKS lists the newest first, and a node group
# runs one update at a time.
UPDATES_LOOKED_AT = 10


def request_token(key: str) -> str:
    """The idempotency token AWS is sent for a request key (a UUID: within every API's length
    limit, the same for every retry of the same request)."""
    return str(uuidlib.uuid5(uuidlib.NAMESPACE_URL, f"sickbay:{key}"))


class AwsClients:
    """boto3 clients per (service, region), made once: a boto3 client is thread-safe, a
    session is not, so clients are created under a lock."""

    def __init__(self, config: AwsConfig) -> None:
        self._config = config
        self._clients: dict[tuple[str, str | None], Any] = {}
        self._lock = threading.Lock()
        self._session: Any = None

    def region(self, pool: NodePoolTarget | None) -> str | None:
        return (pool.location if pool else None) or self._config.region

    def client(self, service: str, region: str | None) -> Any:
        with self._lock:
            found = self._clients.get((service, region))
            if found is not None:
                return found
            import boto3
            from botocore.config import Config
            from botocore.exceptions import BotoCoreError

            try:
                if self._session is None:
                    self._session = boto3.session.Session(profile_name=self._config.profile)
                client = self._session.client(
                    service,
                    region_name=region,
                    endpoint_url=self._config.endpoints.get(service),  # type: ignore[call-overload]
                    config=Config(
                        connect_timeout=CONNECT_TIMEOUT,
                        read_timeout=READ_TIMEOUT,
                        # One attempt: Temporal's retry policy is the retry loop.
                        retries={"total_max_attempts": 1, "mode": "standard"},
                    ),
                )
            except BotoCoreError as exc:  # no region, unknown profile
                raise ConfigError(f"AWS {service} client: {exc}") from exc
            self._clients[(service, region)] = client
            return client

    async def call(self, what: str, fn: Callable[..., Any], **params: Any) -> dict[str, Any]:
        """One AWS call in a worker thread, its errors mapped for Temporal's retries."""
        from botocore.exceptions import (
            BotoCoreError,
            ClientError,
            ConnectionError,
            HTTPClientError,
            NoCredentialsError,
            NoRegionError,
            ParamValidationError,
            PartialCredentialsError,
        )

        try:
            answer: dict[str, Any] = await asyncio.to_thread(fn, **params)
            return answer
        except ClientError as exc:
            error = exc.response.get("Error") or {}
            code = str(error.get("Code", ""))
            status = exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode")
            message = f"{what}: {code}: {str(error.get('Message', ''))[:300]}"
            if code in RETRYABLE_CODES or (status or 0) >= 500 or status == 429:
                raise CloudUnavailable(message, status=status) from exc
            raise CloudRejected(message, status) from exc
        except (NoCredentialsError, PartialCredentialsError, NoRegionError) as exc:
            raise ConfigError(
                f"{what}: {exc} (the AWS SDK's standard chain: EKS Pod Identity, IRSA, "
                "the environment, a profile, the instance profile)"
            ) from exc
        except ParamValidationError as exc:  # a request the service model refuses: a bug
            raise CloudRejected(f"{what}: {exc}") from exc
        except (ConnectionError, HTTPClientError) as exc:
            raise CloudUnavailable(f"{what}: {exc}") from exc
        except BotoCoreError as exc:  # credential refresh failures and the like: transient
            raise CloudUnavailable(f"{what}: {exc}") from exc


class EksNodeGroups:
    """`NodePoolClient` for EKS managed node groups."""

    def __init__(self, clients: AwsClients, config: AwsConfig) -> None:
        self._clients = clients
        self._config = config

    def _eks(self, pool: NodePoolTarget) -> Any:
        return self._clients.client("eks", self._clients.region(pool))

    def _cluster(self, pool: NodePoolTarget) -> str:
        cluster = pool.cluster or self._config.cluster
        if not cluster:
            raise ConfigError(
                f"EKS node group {pool.name!r} needs `cluster` in the runbook's scaleUp.pool "
                "(or SICKBAY_EKS_CLUSTER on the worker)"
            )
        return cluster

    async def _nodegroup(self, pool: NodePoolTarget) -> dict[str, Any]:
        cluster = self._cluster(pool)
        answer = await self._clients.call(
            f"DescribeNodegroup {cluster}/{pool.name}",
            self._eks(pool).describe_nodegroup,
            clusterName=cluster,
            nodegroupName=pool.name,
        )
        return dict(answer.get("nodegroup") or {})

    async def describe(self, pool: NodePoolTarget) -> PoolDescription:
        group = await self._nodegroup(pool)
        scaling = group.get("scalingConfig") or {}
        status = str(group.get("status", ""))
        pending = None
        if status == "UPDATING":
            pending = await self._running_update(pool) or PoolOperation(id=STATUS_OPERATION)
        return PoolDescription(
            current_size=int(scaling.get("desiredSize", 0)),
            min_size=int(scaling["minSize"]) if "minSize" in scaling else None,
            max_size=int(scaling["maxSize"]) if "maxSize" in scaling else None,
            pending_operation=pending,
            detail=f"status {status or '?'}",
        )

    async def _running_update(self, pool: NodePoolTarget) -> PoolOperation | None:
        cluster = self._cluster(pool)
        eks = self._eks(pool)
        listed = await self._clients.call(
            f"ListUpdates {cluster}/{pool.name}",
            eks.list_updates,
            name=cluster,
            nodegroupName=pool.name,
            maxResults=UPDATES_LOOKED_AT,
        )
        for update_id in listed.get("updateIds") or []:
            op = await self.get_operation(pool, str(update_id))
            if not op.done:
                return op
        return None

    async def set_size(
        self, pool: NodePoolTarget, size: int, max_size: int, idempotency_key: str
    ) -> ScaleOutcome:
        size = min(size, max_size)
        cluster = self._cluster(pool)
        answer = await self._clients.call(
            f"UpdateNodegroupConfig {cluster}/{pool.name} desiredSize={size}",
            self._eks(pool).update_nodegroup_config,
            clusterName=cluster,
            nodegroupName=pool.name,
            scalingConfig={"desiredSize": size},
            clientRequestToken=request_token(idempotency_key),
        )
        update = answer.get("update") or {}
        if not update.get("id"):
            raise CloudUnavailable("EKS answered UpdateNodegroupConfig without an update id")
        op = self._operation(update)
        return ScaleOutcome(target_size=size, operation=op.model_copy(update={"target_size": size}))

    async def get_operation(self, pool: NodePoolTarget, operation: str) -> PoolOperation:
        if operation == STATUS_OPERATION:
            group = await self._nodegroup(pool)
            status = str(group.get("status", ""))
            failed = status in ("DEGRADED", "CREATE_FAILED", "DELETE_FAILED", "DELETING")
            issues = (group.get("health") or {}).get("issues") or []
            reason = "; ".join(f"{i.get('code')}: {i.get('message')}" for i in issues[:3])
            return PoolOperation(
                id=operation,
                done=status != "UPDATING",
                error=f"node group {status}{': ' + reason if reason else ''}"[:500]
                if failed
                else None,
            )
        cluster = self._cluster(pool)
        answer = await self._clients.call(
            f"DescribeUpdate {cluster}/{pool.name} {operation}",
            self._eks(pool).describe_update,
            name=cluster,
            updateId=operation,
            nodegroupName=pool.name,
        )
        return self._operation(answer.get("update") or {"id": operation})

    @staticmethod
    def _operation(update: dict[str, Any]) -> PoolOperation:
        status = str(update.get("status", ""))
        error = None
        if status in ("Failed", "Cancelled"):
            errors = update.get("errors") or []
            words = "; ".join(
                f"{e.get('errorCode', '')}: {e.get('errorMessage', '')}" for e in errors[:3]
            )
            error = f"update {status}{': ' + words if words else ''}"[:500]
        target = next(
            (p.get("value") for p in update.get("params") or [] if p.get("type") == "DesiredSize"),
            None,
        )
        return PoolOperation(
            id=str(update.get("id", "")),
            done=status in ("Successful", "Failed", "Cancelled"),
            error=error,
            target_size=int(target) if target is not None and str(target).isdigit() else None,
        )
