"""The node-pool provider interface, its errors and the HTTP error mapping.

Every provider answers three questions about one pool:
- `describe`: how big is it now, what are its bounds, is a resize still running?
- `set_size`: ask for a new size (always *to* a count, never "+1", so a retry is harmless);
- `get_operation`: has that resize finished, and did it fail?

Errors are split the way Temporal retries them:
- `CloudRejected` (4xx: quota, auth, bad request) -> non-retryable, carries the provider's words;
- `CloudUnavailable` (429, 5xx, timeouts, "another operation is running") -> retried, with the
  provider's Retry-After when it sent one;
- `ConfigError` (activities.outbound: missing credentials, unknown profile, a URL outside the
  provider) -> non-retryable.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from typing import Any, Protocol
from urllib.parse import urlsplit

import httpx

from activities.outbound import provider_message, retry_after_seconds
from contract.capacity import NodePoolTarget, PoolDescription, PoolOperation

# Statuses that mean "try again later" even though they are 4xx: request timeout, conflict with
# another change in flight, locked, too early, rate limited.
RETRYABLE_4XX = frozenset({408, 409, 423, 425, 429})


class CloudRejected(Exception):
    """The provider refused the request for good (quota, auth, invalid)."""

    def __init__(self, message: str, status: int | None = None) -> None:
        super().__init__(message)
        self.status = status


class CloudUnavailable(Exception):
    """The provider could not answer now; retry (after `retry_after` seconds if given)."""

    def __init__(
        self, message: str, retry_after: float | None = None, status: int | None = None
    ) -> None:
        super().__init__(message)
        self.retry_after = retry_after
        self.status = status  # the HTTP status of the provider's answer; None: no answer


@dataclass(frozen=True)
class ScaleOutcome:
    """What `set_size` asked for: the size (providers may round, e.g. per zone) and the
    operation to follow, if the provider gives one."""

    target_size: int
    operation: PoolOperation | None


class NodePoolClient(Protocol):
    async def describe(self, pool: NodePoolTarget) -> PoolDescription: ...

    async def set_size(
        self, pool: NodePoolTarget, size: int, max_size: int, idempotency_key: str
    ) -> ScaleOutcome: ...

    async def get_operation(self, pool: NodePoolTarget, operation: str) -> PoolOperation: ...


async def send(
    client: httpx.AsyncClient,
    method: str,
    url: str,
    *,
    headers: dict[str, str] | None = None,
    json_body: Any = None,
    content: bytes | None = None,
) -> httpx.Response:
    """One HTTP call with the error mapping shared by every provider."""
    try:
        response = await client.request(
            method, url, headers=headers, json=json_body, content=content
        )
    except httpx.TimeoutException as exc:
        raise CloudUnavailable(f"{method} {_safe(url)} timed out: {exc!r}") from exc
    except httpx.TransportError as exc:
        raise CloudUnavailable(f"{method} {_safe(url)} failed: {exc!r}") from exc
    if response.status_code in RETRYABLE_4XX or response.status_code >= 500:
        raise CloudUnavailable(
            provider_message(response), retry_after_seconds(response), response.status_code
        )
    if response.status_code >= 400:
        raise CloudRejected(provider_message(response), response.status_code)
    return response


def json_of(response: httpx.Response) -> dict[str, Any]:
    try:
        body = response.json()
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise CloudUnavailable(
            f"{response.request.method} {_safe(str(response.request.url))}: "
            f"HTTP {response.status_code} with a body that is not JSON"
        ) from exc
    if not isinstance(body, dict):
        raise CloudUnavailable(f"HTTP {response.status_code}: expected a JSON object")
    return body


def same_origin(url: str, base: str) -> bool:
    a, b = urlsplit(url), urlsplit(base)
    return (a.scheme, a.netloc) == (b.scheme, b.netloc)


def _safe(url: str) -> str:
    """A URL without its query string (which may carry keys) for messages."""
    parts = urlsplit(url)
    return f"{parts.scheme}://{parts.netloc}{parts.path}"


def per_zone_count(target: int, zones: int, max_size: int) -> int:
    """Providers that size a pool per zone: the smallest per-zone count reaching `target`,
    lowered when that would pass `max_size` in total."""
    zones = max(1, zones)
    per_zone = math.ceil(target / zones)
    if per_zone * zones > max_size:
        per_zone = max_size // zones
    return per_zone
