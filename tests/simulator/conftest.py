"""Fixtures for the simulator tests (helpers live in tests/simulator/helpers.py).

- `ns`: a fresh namespace in the session twin, deleted after the test.
- `api` / `core`: official-client ApiClient and CoreV1Api for the session twin.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import pytest
from kubernetes import client

from simulator.testing import RunningSim


@pytest.fixture
def ns(sim: RunningSim) -> Iterator[str]:
    name = f"t-{uuid.uuid4().hex[:8]}"
    sim.store.create("namespaces", {"metadata": {"name": name}})
    yield name
    if sim.store.try_get("namespaces", name) is not None:
        sim.store.delete("namespaces", name)


@pytest.fixture(scope="session")
def api(sim: RunningSim) -> client.ApiClient:
    return sim.api_client()


@pytest.fixture(scope="session")
def core(api: client.ApiClient) -> client.CoreV1Api:
    return client.CoreV1Api(api)
