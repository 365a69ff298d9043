"""`sickbay demo --scenario ...` on one embedded stack (scenarios clean up after themselves):

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
- lemon: one GPU fails (Xid 48) until its third failure in the window -> retired: held with
  `gpu-retired`, exactly one PagerDuty trigger asking for an RMA with the ledger history (three
  Xid 48 failures); the earlier incidents paged nobody; un-retired, it is released.
"""

from __future__ import annotations

import re

import pytest

from harness.scenarios import (
    Demo,
    application_xid,
    budget_exhausted,
    lemon_gpu,
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
        if n["kind"] == "pagerduty" and n["body"]["dedup_key"] == second.workflow_id
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
        if n["kind"] == "pagerduty" and n["body"]["dedup_key"] == incident.workflow_id
    ]
    assert [p["event_action"] for p in pages][:1] == ["trigger"]
    assert "churn" in pages[0]["payload"]["summary"]
    # The loop was stopped, and the page says how; the release undid Sickbay's cordon.
    assert "cordoning node" in pages[0]["payload"]["summary"]
    nodes = (await demo.k("GET", "/api/v1/nodes"))["items"]
    assert not [n for n in nodes if (n.get("spec") or {}).get("unschedulable")]


async def test_lemon_gpu_is_retired_with_one_rma_page(demo: Demo) -> None:
    before, sent = len(demo.incidents), len(await demo.notifications())
    await lemon_gpu(demo)
    incidents = demo.incidents[before:]
    assert len({i.workflow_id for i in incidents}) == 1  # one GPU, several incidents
    retired = incidents[-1]
    assert retired.result is not None
    assert retired.result.status.escalation_reason == "gpu-retired"
    assert any(e.action == "GPU un-retired" for e in retired.result.timeline)
    assert all(i.result is not None and i.result.outcome == "released" for i in incidents[:-1])
    triggers = [
        n["body"]
        for n in await demo.notifications(since=sent)
        if n["kind"] == "pagerduty" and n["body"]["event_action"] == "trigger"
    ]
    [page] = triggers
    summary = page["payload"]["summary"]
    # The ledger's history: three failures (each with its date), then the retirement.
    assert "RMA" in summary and len(re.findall(r"\d\d:\d\d failure", summary)) == 3
    assert "3 failures within 7d" in summary
