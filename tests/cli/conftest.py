"""The CLI tests' fakes: the launches of a FakeWorld's device (no cluster behind it) are
confirmed as given; a test that runs against the cluster twin (`twin` fixture) keeps the real
resolve-device code (tests/cli/test_launch_refusals.py)."""

from __future__ import annotations

from typing import Any

import pytest


@pytest.fixture(autouse=True)
def fake_world_devices_exist(
    request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch
) -> None:
    if "twin" in request.fixturenames:
        return

    async def as_given(settings: Any, ref: Any) -> Any:
        return ref

    monkeypatch.setattr("worker.commands._resolve", as_given)
