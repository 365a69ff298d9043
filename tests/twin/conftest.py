"""Fixtures for the twin tests (helpers live in tests/twin/helpers.py).

- `ns`: a fresh namespace in the session twin, deleted after the test.
- `api` / `core`: official-client ApiClient and CoreV1Api for the session twin.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import pytest
from kubernetes import client

from twin.testing import RunningTwin


@pytest.fixture
def ns(twin: RunningTwin) -> Iterator[str]:
    name = f"t-{uuid.uuid4().hex[:8]}"
    twin.store.create("namespaces", {"metadata": {"name": name}})
    yield name
    if twin.store.try_get("namespaces", name) is not None:
        twin.store.delete("namespaces", name)


@pytest.fixture(scope="session")
def api(twin: RunningTwin) -> client.ApiClient:
    return twin.api_client()


@pytest.fixture(scope="session")
def core(api: client.ApiClient) -> client.CoreV1Api:
    return client.CoreV1Api(api)
