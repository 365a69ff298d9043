"""Generic HTTP node pools: in-house or OpenStack-style APIs described by a worker-side
profile (`HttpProfile` in the cloud config file).

A profile gives the describe call and where the size sits in its answer (`size_path`, dotted:
`nodegroup.node_count`, list indexes allowed: `items.0.size`), the scale call (method, URL,
headers, JSON body, all templated from the pool and the size), which statuses mean success,
and optionally how to follow the operation the scale call starts (operation id from a JSON
path or a header; poll call; done / failed values). Without an operation, and with
`poll_size_after_scale`, the pool is described until it reports the asked size.

An `Idempotency-Key` header (name configurable) carries the request's idempotency key so
APIs that support it drop a retried duplicate.
"""

from __future__ import annotations

import re
from typing import Any
from urllib.parse import quote

import httpx

from activities.cloud.base import CloudRejected, CloudUnavailable, ScaleOutcome, same_origin, send
from activities.cloud.config import HttpCall, HttpProfile
from activities.outbound import ConfigError, SecretRef, provider_message
from contract.capacity import NodePoolTarget, PoolDescription, PoolOperation

SIZE_OPERATION = "size"  # synthetic operation: "describe until the size is reached"
_PLACEHOLDER = re.compile(r"\{([a-z_]+)\}")


def dig(body: Any, path: str) -> Any:
    """Value at a dotted path (`a.b.0.c`); None when any step is missing."""
    node = body
    for part in path.split("."):
        if isinstance(node, dict):
            node = node.get(part)
        elif isinstance(node, list) and part.isdigit() and int(part) < len(node):
            node = node[int(part)]
        else:
            return None
    return node


class HttpNodePools:
    def __init__(self, client: httpx.AsyncClient, profile: HttpProfile) -> None:
        self._client = client
        self._profile = profile

    # --- templating -------------------------------------------------------------------------

    def _values(self, pool: NodePoolTarget, **extra: Any) -> dict[str, Any]:
        values: dict[str, Any] = {
            k: v for k, v in pool.model_dump().items() if isinstance(v, str | int) and v is not None
        }
        endpoint = pool.endpoint or self._profile.endpoint
        allowed = self._profile.allowed_endpoints or (
            [self._profile.endpoint] if self._profile.endpoint else []
        )
        if endpoint and allowed and not any(same_origin(endpoint, a) for a in allowed):
            raise ConfigError(
                f"pool endpoint {endpoint} is not among the profile's allowed endpoints; "
                "its credentials are not sent there"
            )
        if endpoint:
            values["endpoint"] = endpoint.rstrip("/")
        values.update({k: v for k, v in extra.items() if v is not None})
        return values

    @staticmethod
    def _fill(text: str, values: dict[str, Any], *, url: bool = False) -> Any:
        whole = _PLACEHOLDER.fullmatch(text)
        if whole and not url:
            key = whole.group(1)
            if key not in values:
                raise ConfigError(f"template needs {{{key}}}, which this pool does not set")
            return values[key]  # keeps its type: "{size}" -> 3

        def sub(match: re.Match[str]) -> str:
            key = match.group(1)
            if key not in values:
                raise ConfigError(f"template needs {{{key}}}, which this pool does not set")
            value = str(values[key])
            # endpoint is a base URL; everything else is a path segment or query value
            return value if (not url or key == "endpoint") else quote(value, safe="")

        return _PLACEHOLDER.sub(sub, text)

    def _render(self, body: Any, values: dict[str, Any]) -> Any:
        if isinstance(body, str):
            return self._fill(body, values)
        if isinstance(body, list):
            return [self._render(item, values) for item in body]
        if isinstance(body, dict):
            return {k: self._render(v, values) for k, v in body.items()}
        return body

    def _headers(self, call: HttpCall, values: dict[str, Any]) -> dict[str, str]:
        headers: dict[str, str] = {"Accept": "application/json"}
        for source in (self._profile.headers, call.headers):
            for name, value in source.items():
                headers[name] = (
                    value.resolve()
                    if isinstance(value, SecretRef)
                    else str(self._fill(value, values))
                )
        return headers

    async def _call(
        self,
        call: HttpCall,
        values: dict[str, Any],
        extra_headers: dict[str, str] | None = None,
    ) -> httpx.Response:
        if call.url == "{operation}":
            # the operation id is itself a URL (a Location header): only on the pool's endpoint
            url = str(values.get("operation", ""))
            endpoint = values.get("endpoint")
            if not endpoint or not same_origin(url, str(endpoint)):
                raise ConfigError(
                    f"operation URL {url[:100]} is not on the pool's endpoint; not followed"
                )
        else:
            url = self._fill(call.url, values, url=True)
        headers = {**self._headers(call, values), **(extra_headers or {})}
        body = self._render(call.body, values) if call.body is not None else None
        response = await send(self._client, call.method, url, headers=headers, json_body=body)
        if response.status_code not in call.ok_status:
            # 2xx/3xx the profile does not accept: the API did something else than asked
            raise CloudRejected(
                f"unexpected answer, expected {call.ok_status}: {provider_message(response)}",
                response.status_code,
            )
        return response

    @staticmethod
    def _json(response: httpx.Response) -> Any:
        if not response.content:
            return {}
        try:
            return response.json()
        except ValueError as exc:
            raise CloudUnavailable(f"HTTP {response.status_code}: answer is not JSON") from exc

    # --- NodePoolClient ------------------------------------------------------------------

    async def describe(self, pool: NodePoolTarget) -> PoolDescription:
        profile = self._profile
        body = self._json(await self._call(profile.describe, self._values(pool)))
        size = dig(body, profile.size_path)
        if not isinstance(size, int | float) or isinstance(size, bool):
            raise CloudRejected(
                f"describe answer has no number at {profile.size_path!r} (got {size!r})"
            )

        def bound(path: str | None) -> int | None:
            value = dig(body, path) if path else None
            return int(value) if isinstance(value, int | float) else None

        return PoolDescription(
            current_size=int(size),
            min_size=bound(profile.min_path),
            max_size=bound(profile.max_path),
        )

    async def set_size(
        self, pool: NodePoolTarget, size: int, max_size: int, idempotency_key: str
    ) -> ScaleOutcome:
        profile = self._profile
        values = self._values(pool, size=size, idempotency_key=idempotency_key)
        extra = {profile.idempotency_header: idempotency_key} if profile.idempotency_header else {}
        response = await self._call(profile.scale, values, extra)
        op_id: str | None = None
        if profile.operation_id_header:
            op_id = response.headers.get(profile.operation_id_header)
        if op_id is None and profile.operation_id_path:
            found = dig(self._json(response), profile.operation_id_path)
            op_id = str(found) if found is not None else None
        if profile.operation is not None:
            if not op_id:
                raise CloudUnavailable("scale answer named no operation to follow")
            return ScaleOutcome(size, PoolOperation(id=op_id, target_size=size))
        if profile.poll_size_after_scale:
            return ScaleOutcome(
                size, PoolOperation(id=f"{SIZE_OPERATION}:{size}", target_size=size)
            )
        return ScaleOutcome(size, None)

    async def get_operation(self, pool: NodePoolTarget, operation: str) -> PoolOperation:
        if operation.startswith(f"{SIZE_OPERATION}:"):
            target = int(operation.split(":", 1)[1])
            desc = await self.describe(pool)
            return PoolOperation(id=operation, done=desc.current_size >= target, target_size=target)
        spec = self._profile.operation
        if spec is None:
            raise ConfigError(f"profile follows no operations, got {operation!r}")
        body = self._json(await self._call(spec.call, self._values(pool, operation=operation)))
        state = dig(body, spec.done_path)
        if state in spec.failed_values:
            message = dig(body, spec.message_path)
            return PoolOperation(
                id=operation, done=True, error=f"{state}: {message or ''}".strip(": ")[:500]
            )
        return PoolOperation(id=operation, done=state in spec.done_values)
