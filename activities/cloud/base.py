"""The node-pool provider interface, its errors, secret references and the HTTP error mapping.

Every provider answers three questions about one pool:
- `describe`: how big is it now, what are its bounds, is a resize still running?
- `set_size`: ask for a new size (always *to* a count, never "+1", so a retry is harmless);
- `get_operation`: has that resize finished, and did it fail?

Errors are split the way Temporal retries them:
- `CloudRejected` (4xx: quota, auth, bad request) -> non-retryable, carries the provider's words;
- `CloudUnavailable` (429, 5xx, timeouts, "another operation is running") -> retried, with the
  provider's Retry-After when it sent one;
- `ConfigError` (missing credentials, unknown profile, a URL outside the provider) -> non-retryable.
"""

from __future__ import annotations

import json
import math
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol, TypeVar
from urllib.parse import urlsplit

import httpx
import yaml
from pydantic import BaseModel, ConfigDict, ValidationError, model_validator

from workflows.models import NodePoolTarget, PoolDescription, PoolOperation

# Statuses that mean "try again later" even though they are 4xx: request timeout, conflict with
# another change in flight, locked, too early, rate limited.
RETRYABLE_4XX = frozenset({408, 409, 423, 425, 429})
MAX_MESSAGE = 500  # characters of a provider's error kept in errors and history


class CloudRejected(Exception):
    """The provider refused the request for good (quota, auth, invalid)."""

    def __init__(self, message: str, status: int | None = None) -> None:
        super().__init__(message)
        self.status = status


class CloudUnavailable(Exception):
    """The provider could not answer now; retry (after `retry_after` seconds if given)."""

    def __init__(self, message: str, retry_after: float | None = None) -> None:
        super().__init__(message)
        self.retry_after = retry_after


class ConfigError(Exception):
    """The worker is not configured for this pool (credentials, profile, endpoint)."""


M = TypeVar("M", bound=BaseModel)


def load_yaml_model(model: type[M], path: Path, what: str) -> M:
    """A worker configuration file (cloud providers, notification channels): YAML validated by
    `model`; any problem is one ConfigError naming the file and each `field: problem`."""
    try:
        raw = yaml.safe_load(path.read_text()) or {}
    except OSError as exc:
        raise ConfigError(f"cannot read {what} {path}: {exc.strerror}") from exc
    except yaml.YAMLError as exc:
        raise ConfigError(f"{path}: invalid YAML: {exc}") from exc
    try:
        return model.model_validate(raw)
    except ValidationError as exc:
        problems = "; ".join(
            f"{'.'.join(str(p) for p in err['loc'])}: {err['msg']}" for err in exc.errors()
        )
        raise ConfigError(f"{path}: {problems}") from exc


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


class SecretRef(BaseModel):
    """Where a secret lives: an environment variable or a file. Never the secret itself.

    `env: NAME` reads `$NAME`; when that is unset it also tries the file named by `$NAME_FILE`
    (the Docker/Kubernetes secrets convention). `file: PATH` reads the file (stripped). Files are
    read at each use, so rotated tokens are picked up without a restart.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    env: str | None = None
    file: Path | None = None

    @model_validator(mode="after")
    def _one_source(self) -> SecretRef:
        if not (self.env or self.file):
            raise ValueError("a secret reference needs `env: VAR` or `file: PATH`")
        return self

    def describe(self) -> str:
        return f"${self.env}" if self.env else f"file {self.file}"

    def resolve(self) -> str:
        if self.env:
            value = os.environ.get(self.env)
            if value:
                return value.strip()
            path = os.environ.get(f"{self.env}_FILE")
            if path:
                return _read_secret_file(Path(path), f"${self.env}_FILE")
            if self.file is None:
                raise ConfigError(f"secret not set: environment variable {self.env} is empty")
        assert self.file is not None
        return _read_secret_file(self.file, "file")

    def available(self) -> bool:
        try:
            self.resolve()
        except ConfigError:
            return False
        return True


def _read_secret_file(path: Path, what: str) -> str:
    try:
        value = path.read_text().strip()
    except OSError as exc:
        raise ConfigError(f"cannot read secret {what} {path}: {exc.strerror}") from exc
    if not value:
        raise ConfigError(f"secret {what} {path} is empty")
    return value


def provider_message(response: httpx.Response) -> str:
    """The provider's own explanation, from the shapes Google, Azure, AWS and most JSON APIs
    use: `{"error": {"message", "status"|"code"}}`, `{"message"}`, or plain text."""
    text = response.text
    try:
        body: Any = response.json()
    except (json.JSONDecodeError, UnicodeDecodeError):
        body = None
    message = ""
    if isinstance(body, dict):
        err = body.get("error")
        if isinstance(err, dict):
            code = err.get("status") or err.get("code") or ""
            message = f"{code}: {err.get('message', '')}".strip(": ")
        elif isinstance(err, str):
            message = err
        if not message:
            message = str(body.get("message") or body.get("Message") or "")
    if not message:
        message = text.strip() or response.reason_phrase
    return f"HTTP {response.status_code}: {message}"[:MAX_MESSAGE]


def retry_after_seconds(response: httpx.Response) -> float | None:
    value = response.headers.get("retry-after")
    if value is None:
        return None
    try:
        seconds = float(value)
    except ValueError:
        return None  # an HTTP date; let the retry policy decide
    return max(0.0, min(seconds, 600.0))  # cap: a bogus header must not park the retry for days


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
        raise CloudUnavailable(provider_message(response), retry_after_seconds(response))
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
