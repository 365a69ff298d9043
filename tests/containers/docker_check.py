"""Is a Docker engine really there? Asked of the daemon itself, not of PATH.

`docker_unavailable_reason()` pings the engine that `docker.from_env()` would use
(DOCKER_HOST, else the default socket) and returns why it cannot be used, or None. The
container tests skip with that reason, or fail with it when SICKBAY_REQUIRE_DOCKER=1 (CI
machines that do have Docker, where a skip would hide a broken set-up).
"""

from __future__ import annotations

import os
from functools import cache

REQUIRE_ENV = "SICKBAY_REQUIRE_DOCKER"


def _where() -> str:
    return os.environ.get("DOCKER_HOST") or "the default socket (unix:///var/run/docker.sock)"


def docker_unavailable_reason(timeout: float = 5.0) -> str | None:
    try:
        import docker
    except ImportError as exc:  # the `docker` SDK comes with testcontainers (dev extra)
        return f"the docker Python SDK is not installed ({exc}); run `make venv`"
    try:
        # 5 s: a healthy local daemon answers /_ping in milliseconds; a remote DOCKER_HOST
        # behind a slow link still should within 5 s, and a dead one must not stall collection.
        client = docker.from_env(timeout=timeout)
    except Exception as exc:  # DockerException for a missing socket, bad DOCKER_HOST, ...
        return f"no Docker engine reachable at {_where()}: {type(exc).__name__}: {exc}"
    try:
        if not client.ping():
            return f"the Docker engine at {_where()} did not answer ping"
    except Exception as exc:
        return f"no Docker engine answers at {_where()}: {type(exc).__name__}: {exc}"
    finally:
        client.close()
    return None


@cache
def cached_reason() -> str | None:
    return docker_unavailable_reason()


def docker_required() -> bool:
    return os.environ.get(REQUIRE_ENV, "").strip().lower() in ("1", "true", "yes")
