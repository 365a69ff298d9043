"""Fixtures for the deployment-artefact tests: the parsed compose file and manifests, and a
Temporal dev server of the module's own for the tests that run Sickbay processes."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from temporalio.testing import WorkflowEnvironment

from tests.conftest import start_dev_server
from tests.deploy.helpers import (
    COMPOSE_FILE,
    is_kubernetes_object,
    load_yaml_documents,
    manifest_files,
)


@pytest.fixture(scope="module")
def compose() -> dict[str, Any]:
    data = yaml.safe_load(COMPOSE_FILE.read_text())
    assert isinstance(data, dict), "docker-compose.yml is not a mapping"
    return data


@pytest.fixture(scope="module")
def manifests() -> dict[Path, list[dict[str, Any]]]:
    return {path: load_yaml_documents(path) for path in manifest_files()}


@pytest.fixture(scope="module")
def objects(manifests: dict[Path, list[dict[str, Any]]]) -> list[dict[str, Any]]:
    return [doc for docs in manifests.values() for doc in docs if is_kubernetes_object(doc)]


@pytest.fixture(scope="module")
async def own_dev_server(temporal_cli_path: str) -> AsyncIterator[WorkflowEnvironment]:
    """A Temporal dev server for this module alone. Sickbay keeps singletons per namespace
    (the `sickbay-budget` workflow, the sweep Schedule) bound to the task queue of the worker
    that started them; a worker process that stops would leave them on a queue nobody polls
    for every later test of a shared server. A server of our own isolates both ways."""
    env = await start_dev_server(temporal_cli_path)
    try:
        yield env
    finally:
        await env.shutdown()
