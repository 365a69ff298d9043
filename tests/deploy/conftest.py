"""Fixtures for the deployment-artefact tests: the parsed compose file and manifests."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

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
