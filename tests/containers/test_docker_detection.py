"""The Docker check behind every `docker` test: it asks the daemon, so it cannot be fooled
by a `docker` binary on PATH or a stale socket path.

Cases (no Docker needed):
- DOCKER_HOST at a closed TCP port: a reason naming that address;
- DOCKER_HOST at a unix socket that does not exist: a reason;
- the reason the container tests use on this machine is either None (an engine answered)
  or a sentence naming where it looked;
- SICKBAY_REQUIRE_DOCKER turns on only for 1/true/yes.
"""

from __future__ import annotations

import socket
from pathlib import Path

import pytest

from tests.containers.docker_check import (
    REQUIRE_ENV,
    cached_reason,
    docker_required,
    docker_unavailable_reason,
)


def _closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])  # closed again when the block ends


def test_closed_tcp_port_gives_a_reason(monkeypatch: pytest.MonkeyPatch) -> None:
    port = _closed_port()
    monkeypatch.setenv("DOCKER_HOST", f"tcp://127.0.0.1:{port}")
    reason = docker_unavailable_reason(timeout=2)
    assert reason is not None
    assert f"tcp://127.0.0.1:{port}" in reason


def test_missing_unix_socket_gives_a_reason(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("DOCKER_HOST", f"unix://{tmp_path}/nothing-here.sock")
    reason = docker_unavailable_reason(timeout=2)
    assert reason is not None
    assert "nothing-here.sock" in reason


def test_reason_on_this_machine_is_explicit() -> None:
    reason = cached_reason()
    if reason is not None:  # None: this machine runs Docker (both are legitimate here)
        # One of the three reasons docker_check gives, each naming what is missing.
        assert reason.startswith(("the docker Python SDK", "no Docker engine", "the Docker engine"))


@pytest.mark.parametrize(
    ("value", "required"),
    [("1", True), ("true", True), ("YES", True), ("0", False), ("", False), ("no", False)],
)
def test_require_flag(monkeypatch: pytest.MonkeyPatch, value: str, required: bool) -> None:
    monkeypatch.setenv(REQUIRE_ENV, value)
    assert docker_required() is required
