"""Fixtures for node-pool tests: the twin's cloud API on loopback and a CloudActivities
pointed at it."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

from activities.cloud import CloudActivities
from activities.cloud.config import CloudConfig
from contract.capacity import NodePoolTarget
from simulator.cloudapi import CloudApi, CloudApiServer, SimPool

SIM_TOKEN = "twin-token-for-tests"


@pytest.fixture
async def cloud_twin(monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[CloudApiServer]:
    monkeypatch.setenv("SICKBAY_SIM_CLOUD_TOKEN", SIM_TOKEN)
    resized: list[tuple[str, int]] = []
    api = CloudApi(token=SIM_TOKEN, on_resize=lambda pool, size: resized.append((pool, size)))
    api.resized = resized  # type: ignore[attr-defined]
    api.add_pool(SimPool(name="gpu-pool", size=2, max_size=4, latency=0.2))
    server = await CloudApiServer(api).start()
    try:
        yield server
    finally:
        await server.stop()


@pytest.fixture
def sim_pool(cloud_twin: CloudApiServer) -> NodePoolTarget:
    return NodePoolTarget(provider="sim", name="gpu-pool", endpoint=cloud_twin.url)


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
