"""Fixtures for the demo tests: the embedded stack of `sickbay-dev demo` (dev server + twin + real
`sickbay worker` + webhook + notification sink, all child processes on loopback), one per test
module, and a `Demo` (harness/scenarios.py) talking to it over HTTP and gRPC.

The stack runs the twin 60x faster and the demo runbooks 60x shorter (the demo uses 30x);
free ports everywhere (no Web UI), so a developer's own dev server on 7233 is never touched.
"""

from __future__ import annotations

import sys
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest

from harness.scenarios import Demo, Progress
from harness.stack import Stack, StackConfig, free_port

TIME_SCALE = 60.0  # tests: twice the demo's pace; the runbook floors (MIN_SECONDS) keep it sound


def start_stack(tmp: Path, **overrides: object) -> Stack:
    config = StackConfig(
        time_scale=TIME_SCALE,
        temporal_port=free_port(),
        ui=False,
        state_dir=tmp,
        notes=lambda text: print(text, file=sys.stderr),
        **overrides,  # type: ignore[arg-type]
    )
    stack = Stack(config)
    stack.__enter__()
    return stack


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    """One full-topology stack (1 node x 2 GPUs, pool may grow to 2 nodes) per module. Its
    scenarios fail the same two GPUs again and again, so the GPU ledger would retire one by the
    third failure within its 7-day window and hold it: lemons off here (the repair scenario's
    own stack tests them)."""
    s = start_stack(tmp_path_factory.mktemp("stack"), lemons=False)
    try:
        yield s
    finally:
        s.stop()


@pytest.fixture(scope="module")
async def demo(stack: Stack) -> AsyncIterator[Demo]:
    """One client side per module: incidents and their phase watchers live across tests."""
    d = await Demo.open(stack, Progress(lambda line: print(line, file=sys.stderr)))
    try:
        yield d
    finally:
        await d.close()
