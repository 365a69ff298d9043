"""`sickbay-dev demo --scenario ...` on one embedded stack (scenarios clean up after themselves):

- training: a Job pinned to the `training` runbook -> handled by `training`, its new pod on the
  healthy GPU, released after repair;
- budget: two GPUs fail under the shipped 50% budget -> the second is NOT tainted, waits
  escalated (budget-exhausted), its PagerDuty-shaped page reaches the sink; when it recovers
  it closes `not-quarantined` and the page is resolved; the first stays quarantined;
- app-xid: Xid 13 -> classified `application`, no DeviceTaintRule, the pod keeps running,
  closes `not-quarantined`;
- churn: the scheduler ignores DeviceTaintRules -> replacements land on the tainted device
  again -> the node is cordoned (replacement.onChurn default) and the escalation (reason
  `churn`, page delivered) says so; after the release no node is left cordoned;
(the lemon scenario needs the repair ladder: tests/demo/test_repair_scenario.py)
"""

from __future__ import annotations

import pytest

from harness.scenarios import (
    Demo,
    application_xid,
    budget_exhausted,
    scheduler_churn,
    training_job,
)

pytestmark = pytest.mark.devserver


async def test_training_job(demo: Demo) -> None:
    await training_job(demo)
    [incident] = demo.incidents[-1:]
    assert incident.result is not None
    assert incident.result.status.runbook == "training"
    assert incident.result.outcome == "released"
    owners = {c.name for c in incident.result.status.consumers}
    assert owners and all(name.startswith("train-") for name in owners)


async def test_budget_exhausted(demo: Demo) -> None:
    before, sent = len(demo.incidents), len(await demo.notifications())
    await budget_exhausted(demo)
    first, second = demo.incidents[before:]
    assert second.result is not None and second.result.outcome == "not-quarantined"
    assert second.result.status.escalation_reason == "budget-exhausted"
    assert second.result.status.rule_name is None  # never tainted
    assert first.result is not None and first.result.outcome == "released"
    pages = [
        n["body"]
        for n in await demo.notifications(since=sent)
        if n["kind"] == "pagerduty"
        and n["body"]["dedup_key"].rsplit("/", 1)[0] == second.workflow_id
    ]
    assert [p["event_action"] for p in pages] == ["trigger", "resolve"]
    assert "budget" in pages[0]["payload"]["summary"]
    assert pages[0]["routing_key"] == "<redacted>"  # the sink never stores the key


async def test_application_xid_no_quarantine(demo: Demo) -> None:
    await application_xid(demo)
    incident = demo.incidents[-1]
    assert incident.result is not None
    assert incident.result.outcome == "not-quarantined"
    assert incident.result.status.failure_class == "application"
    assert incident.result.status.rule_name is None


async def test_scheduler_ignoring_taints_churn(demo: Demo) -> None:
    sent = len(await demo.notifications())
    await scheduler_churn(demo)
    incident = demo.incidents[-1]
    assert incident.result is not None
    assert incident.result.status.escalation_reason == "churn"
    assert (await demo.k("GET", "/twin/known-faults"))["ignoreDeviceTaintRules"] is False
    pages = [
        n["body"]
        for n in await demo.notifications(since=sent)
        if n["kind"] == "pagerduty"
        and n["body"]["dedup_key"].rsplit("/", 1)[0] == incident.workflow_id
    ]
    assert [p["event_action"] for p in pages][:1] == ["trigger"]
    assert "churn" in pages[0]["payload"]["summary"]
    # The loop was stopped, and the page says how; the release undid Sickbay's cordon.
    assert "cordoning node" in pages[0]["payload"]["summary"]
    nodes = (await demo.k("GET", "/api/v1/nodes"))["items"]
    assert not [n for n in nodes if (n.get("spec") or {}).get("unschedulable")]
