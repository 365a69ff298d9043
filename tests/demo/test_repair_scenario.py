"""`sickbay-dev demo --scenario repair` on an embedded stack with the shipped ladder on (twin, dev
server, real `sickbay worker` and webhook):

- Xid 48 under an inference Deployment -> quarantine -> replacement -> reset Job on the twin
  (nvidia-smi clears the ECC fault) -> validation Job (dcgmi diag on the device) passes ->
  released, no human step;
- Xid 79 on the replacement's GPU -> reset not applicable (off the bus) -> the node drained and
  rebooted through the twin's Compute Engine endpoint (asked once) -> Ready with its GPUs ->
  validation passes -> released, no human step; the node is uncordoned again;
- the lemon part: the GPU under the pod fails with Xid 48 until the ledger counts its third
  failure in the window; the earlier ones are repaired by the ladder (reset, validation,
  released), the third retires it: held until un-retired, no rung run, exactly one PagerDuty
  trigger asking for an RMA;
- no person acted: the scenario sent no repaired/abort signal and no approve/un-retire update
  (counted by the Demo), and no incident's timeline shows one; only the clean-up afterwards
  un-retires the lemon and releases it, counted apart;
- `--scenario lemon` (the lemon part alone) on the same stand: the GPU under the pod fails
  until the ledger (counting again from the clean-up's un-retire) retires it; every earlier
  failure released by the ladder, one RMA page whose summary leads with the ask and carries
  the ledger's count, no person acted.
"""

from __future__ import annotations

import sys
from collections.abc import AsyncIterator, Iterator

import pytest

from harness.scenarios import SCENARIOS, Demo, Progress
from harness.stack import Stack
from tests.demo.conftest import start_stack

pytestmark = [pytest.mark.slow(seconds=75), pytest.mark.devserver]


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
    before, sent = len(repair_demo.incidents), len(await repair_demo.notifications())
    repair_demo.people.clear()
    repair_demo.cleanup_people.clear()
    await scenario.run(repair_demo)
    # Nobody acted in the scenario; the clean-up un-retired the lemon and released it.
    assert repair_demo.people == []
    [unretire, release] = repair_demo.cleanup_people
    assert unretire.startswith("unretire GPU-") and release.startswith("repaired ")
    first, second, *lemon = repair_demo.incidents[before:]
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

    # The lemon part: the same GPU, repaired by reset until its third failure retires it.
    *repaired, retired = lemon
    assert repaired and len({i.workflow_id for i in lemon}) == 1
    for incident in repaired:
        assert incident.result is not None and incident.result.outcome == "released"
        assert incident.result.status.repair_rung == "reset"
        assert (incident.result.status.validation or "").startswith("passed after")
    assert retired.result is not None
    assert retired.result.status.escalation_reason == "gpu-retired"
    actions = [e.action for e in retired.result.timeline]
    assert "GPU retired" in actions and "repair skipped" in actions
    assert "reset requested" not in actions and "repair ladder" not in actions  # no rung ran
    counted = next(e for e in retired.result.timeline if e.action == "GPU retired")
    assert counted.outcome.startswith("3 of 3")
    # The ledger's count takes in the earlier parts' failure of the same GPU: at most 3 here.
    assert len(lemon) <= 3
    triggers = [
        n["body"]
        for n in await repair_demo.notifications(since=sent)
        if n["kind"] == "pagerduty" and n["body"]["event_action"] == "trigger"
    ]
    [page] = triggers
    assert "RMA" in page["payload"]["summary"]
    assert page["dedup_key"].startswith(retired.workflow_id[:60])
    # No incident's timeline shows a person before the clean-up's un-retire.
    for incident in repair_demo.incidents[before:]:
        assert incident.result is not None
        people = []
        for entry in incident.result.timeline:
            if entry.action == "GPU un-retired":
                break
            if entry.action in ("marked repaired", "approved", "rejected", "abort requested"):
                people.append(entry)
        assert people == [], (incident.title, people)


async def test_lemon_scenario_needs_no_human(repair_demo: Demo) -> None:
    scenario = SCENARIOS["lemon"]
    assert scenario.repair
    before, sent = len(repair_demo.incidents), len(await repair_demo.notifications())
    repair_demo.people.clear()
    await scenario.run(repair_demo)
    assert repair_demo.people == []
    incidents = repair_demo.incidents[before:]
    assert 1 <= len(incidents) <= 3 and len({i.workflow_id for i in incidents}) == 1
    *repaired, retired = incidents
    assert all(i.result is not None and i.result.outcome == "released" for i in repaired)
    assert all(i.result.status.repair_rung == "reset" for i in repaired if i.result)
    assert retired.result is not None
    assert retired.result.status.escalation_reason == "gpu-retired"
    [page] = [
        n["body"]
        for n in await repair_demo.notifications(since=sent)
        if n["kind"] == "pagerduty" and n["body"]["event_action"] == "trigger"
    ]
    summary = page["payload"]["summary"]
    assert "retired as a lemon: RMA it" in summary and "3 failures within 7d" in summary
