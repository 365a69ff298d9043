"""`sickbay-dev demo --scenario upgrade` on an embedded stack of 3 GPU nodes whose worker runs the
health watcher (no alert, no sweep):

- act 1: a kubelet upgrade leaves the DRA plugin unregistered -> one node incident, diagnosed,
  healed by one plugin restart, validated and released;
- act 2: the toolkit hook fails under a Deployment's pod -> escalated at once with the
  diagnosis (the kubelet change in the page), the node tainted with its condition False, no
  restart, the pod evicted and running again on another node; the fixed toolkit -> GPUs
  back, validated, released; no per-GPU remediation for either node.
"""

from __future__ import annotations

import sys
from collections.abc import AsyncIterator, Iterator

import pytest

from harness.scenarios import SCENARIOS, Demo, Progress
from harness.stack import Stack
from tests.demo.conftest import start_stack

pytestmark = pytest.mark.devserver


@pytest.fixture(scope="module")
def upgrade_stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    s = start_stack(tmp_path_factory.mktemp("upgrade-stack"), watch=True, nodes=3, pool_max=3)
    try:
        yield s
    finally:
        s.stop()


@pytest.fixture(scope="module")
async def upgrade_demo(upgrade_stack: Stack) -> AsyncIterator[Demo]:
    d = await Demo.open(upgrade_stack, Progress(lambda line: print(line, file=sys.stderr)))
    try:
        yield d
    finally:
        await d.close()


async def test_upgrade_story(upgrade_demo: Demo) -> None:
    scenario = SCENARIOS["upgrade"]
    assert scenario.watch and scenario.nodes == 3
    await scenario.run(upgrade_demo)
    checks = " | ".join(upgrade_demo.checks)
    assert "healed by one plugin restart" in checks
    assert "escalated at once with the diagnosis" in checks
    assert "no per-GPU remediation" in checks
    assert "was evicted and runs again on" in checks
    [person] = upgrade_demo.people  # the one fix a person made: the toolkit
    assert person.startswith("rolled out a fixed container toolkit on ")
