"""What the activities calling outside services share (node-pool providers in activities.cloud,
notification channels in activities.notify): the worker's configuration files, references to
secrets, and reading a service's HTTP error answer. Kept apart from both, so neither imports
the other.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any, TypeVar

import httpx
import yaml
from pydantic import BaseModel, ConfigDict, ValidationError, model_validator

MAX_MESSAGE = 500  # characters of a provider's error kept in errors and history


class ConfigError(Exception):
    """The worker is not configured for this pool (credentials, profile, endpoint)."""


M = TypeVar("M", bound=BaseModel)


def load_yaml_model(
    model: type[M], path: Path | None, what: str, defaults: Mapping[str, Any] | None = None
) -> M:
    """A worker configuration file (cloud providers, notification channels): YAML validated by
    `model`; any problem is one ConfigError naming the file and each `field: problem`.
    `defaults`: values for the keys the file leaves out (a section's keys one by one); no
    `path`: the defaults alone."""
    raw: Any = {}
    if path is not None:
        try:
            raw = yaml.safe_load(path.read_text()) or {}
        except OSError as exc:
            raise ConfigError(f"cannot read {what} {path}: {exc.strerror}") from exc
        except yaml.YAMLError as exc:
            raise ConfigError(f"{path}: invalid YAML: {exc}") from exc
    if defaults and isinstance(raw, dict):
        raw = _over(defaults, raw)
    try:
        return model.model_validate(raw)
    except ValidationError as exc:
        problems = "; ".join(
            f"{'.'.join(str(p) for p in err['loc'])}: {err['msg']}" for err in exc.errors()
        )
        raise ConfigError(f"{path or what}: {problems}") from exc


def _over(defaults: Mapping[str, Any], given: dict[str, Any]) -> dict[str, Any]:
    """`given` over `defaults`, section by section; defaults that are None are left out."""
    out = dict(given)
    for key, value in defaults.items():
        if value is None:
            continue
        if key not in out:
            out[key] = _over(value, {}) if isinstance(value, Mapping) else value
        elif isinstance(value, Mapping) and isinstance(out[key], dict):
            out[key] = _over(value, out[key])
    return out


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
