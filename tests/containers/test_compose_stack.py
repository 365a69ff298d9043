"""The Temporal half of docker-compose.yml, brought up by `docker compose` (marker `docker`).

Cases:
- PostgreSQL → schema job (admin-tools) → server → namespace job come up in order, the
  one-shots exit 0, and the server answers on the published port;
- the namespace exists and Sickbay's four Keyword search attributes are registered;
- running the schema job again on the kept volume succeeds (idempotent upgrade path).
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from typing import Any

import pytest

from tests.containers.conftest import ROOT, _wait_for_temporal, free_port

pytestmark = pytest.mark.docker

TEMPORAL_SERVICES = ["postgresql", "temporal-schema", "temporal", "temporal-namespace"]


@pytest.fixture(scope="module")
def compose_stack(docker_engine: None) -> Iterator[tuple[Any, str]]:
    import shutil

    from testcontainers.compose import DockerCompose

    if shutil.which("docker") is None:
        pytest.skip("the docker CLI (with the compose plugin) is not on PATH")
    port = free_port()
    env_file = ROOT / ".sickbay" / "compose-test.env"
    env_file.parent.mkdir(exist_ok=True)
    # A free host port and a project name of our own: never collides with a running stack.
    env_file.write_text(f"TEMPORAL_HOST_PORT={port}\nCOMPOSE_PROJECT_NAME=sickbay-test\n")
    stack = DockerCompose(
        context=str(ROOT),
        compose_file_name="docker-compose.yml",
        services=TEMPORAL_SERVICES,
        env_file=str(env_file),
        wait=False,
    )
    with pytest.MonkeyPatch.context() as env:
        # Also in the environment: it outranks the file's top-level `name:` for sure.
        env.setenv("COMPOSE_PROJECT_NAME", "sickbay-test")
        stack.start()
        try:
            address = f"127.0.0.1:{port}"
            _wait_for_temporal(address, timeout=180)  # 180 s: image pulls and schema migrations
            yield stack, address
        finally:
            stack.stop(down=True)  # also removes the volume (docker compose down -v)
            env_file.unlink(missing_ok=True)


def test_namespace_and_search_attributes(compose_stack: tuple[Any, str]) -> None:
    from temporalio.api.operatorservice.v1 import ListSearchAttributesRequest
    from temporalio.client import Client

    from contract.names import SEARCH_ATTRIBUTES

    _stack, address = compose_stack

    async def check() -> set[str]:
        client = await Client.connect(address)
        deadline = asyncio.get_running_loop().time() + 60  # the namespace job runs after health
        while True:
            try:
                listed = await client.operator_service.list_search_attributes(
                    ListSearchAttributesRequest(namespace="default")
                )
                names = set(listed.custom_attributes)
                if set(SEARCH_ATTRIBUTES) <= names:
                    return names
            except Exception:
                if asyncio.get_running_loop().time() > deadline:
                    raise
            if asyncio.get_running_loop().time() > deadline:
                return set()
            await asyncio.sleep(2)  # poll interval while the schema job runs

    names = asyncio.run(check())
    assert set(SEARCH_ATTRIBUTES) <= names


def test_schema_job_is_idempotent(compose_stack: tuple[Any, str]) -> None:
    """Re-running the schema job on the kept database is how upgrades apply migrations."""
    import subprocess

    stack, _address = compose_stack
    done = subprocess.run(
        [*stack.compose_command_property, "run", "--rm", "--no-deps", "temporal-schema"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=180,  # pulls nothing new; the tool checks two schemas in seconds
    )
    assert done.returncode == 0, done.stderr
    assert "already exists" in done.stdout
    assert "Temporal schema is up to date" in done.stdout
