"""`sickbay demo --scenario repair` on an embedded stack with the shipped ladder on (twin, dev
server, real `sickbay worker` and webhook):

- Xid 48 under an inference Deployment -> quarantine -> replacement -> reset Job on the twin
  (nvidia-smi clears the ECC fault) -> validation Job (dcgmi diag on the device) passes ->
  released, no human step;
- Xid 79 on the replacement's GPU -> reset not applicable (off the bus) -> the node drained and
  rebooted through the twin's Compute Engine endpoint (asked once) -> Ready with its GPUs ->
  validation passes -> released, no human step; the node is uncordoned again.
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
def repair_stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    s = start_stack(tmp_path_factory.mktemp("repair-stack"), repair=True)
    try:
        yield s
    finally:
        s.stop()


@pytest.fixture(scope="module")
async def repair_demo(repair_stack: Stack) -> AsyncIterator[Demo]:
    d = await Demo.open(repair_stack, Progress(lambda line: print(line, file=sys.stderr)))
    try:
        yield d
    finally:
        await d.close()


async def test_repair_scenario_needs_no_human(repair_demo: Demo, repair_stack: Stack) -> None:
    scenario = SCENARIOS["repair"]
    assert scenario.repair
    await scenario.run(repair_demo)
    first, second = repair_demo.incidents[-2:]
    assert first.result is not None and second.result is not None
    assert first.result.outcome == second.result.outcome == "released"
    assert first.result.status.repair_rung == "reset"
    assert second.result.status.repair_rung == "reboot"
    for incident in (first, second):
        assert incident.result is not None
        validation = incident.result.status.validation or ""
        assert validation.startswith("passed after"), validation
    timeline = await repair_demo.timeline(second)
    ladder = next(e for e in timeline if e.action == "repair ladder")
    assert "reset not applicable: Xid 79" in ladder.reason
    assert [e.action for e in timeline].count("reboot asked") == 1
    node = await repair_demo.k("GET", f"/api/v1/nodes/{repair_stack.info.node}")  # type: ignore[union-attr]
    assert not (node.get("spec") or {}).get("unschedulable")  # uncordoned on release
