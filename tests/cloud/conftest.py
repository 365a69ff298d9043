"""Fixtures for node-pool tests: the twin's cloud API on loopback and a CloudActivities
pointed at it."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

from activities.cloud import CloudActivities
from activities.cloud.config import CloudConfig
from contract.capacity import NodePoolTarget
from twin.cloudapi import CloudApi, CloudApiServer, TwinPool

TWIN_TOKEN = "twin-token-for-tests"


@pytest.fixture
async def cloud_twin(monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[CloudApiServer]:
    monkeypatch.setenv("SICKBAY_TWIN_CLOUD_TOKEN", TWIN_TOKEN)
    resized: list[tuple[str, int]] = []
    api = CloudApi(token=TWIN_TOKEN, on_resize=lambda pool, size: resized.append((pool, size)))
    api.resized = resized  # type: ignore[attr-defined]
    api.add_pool(TwinPool(name="gpu-pool", size=2, max_size=4, latency=0.2))
    server = await CloudApiServer(api).start()
    try:
        yield server
    finally:
        await server.stop()


@pytest.fixture
def twin_pool(cloud_twin: CloudApiServer) -> NodePoolTarget:
    return NodePoolTarget(provider="twin", name="gpu-pool", endpoint=cloud_twin.url)


@pytest.fixture
async def cloud_activities() -> AsyncIterator[CloudActivities]:
    acts = CloudActivities(CloudConfig())
    try:
        yield acts
    finally:
        await acts.aclose()


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers", "scaler(**knobs): CapacityActivities knobs for the pool-scaler harness"
    )
