"""The remediation's one state model (workflows/remediation/state.py) and its carry.

Cases:
- a run resumed from a carry (continue-as-new) carries every field on into the next carry
  unchanged, whatever RemediationCarry holds (none is dropped or re-packed by hand), and each
  carried field lands in the part that owns it (`CARRIED` names one for every field);
- the resumed run appends to copies: the previous run's carried lists and counts stay as
  they were;
- the runbook spec is the chosen runbook's, and the `default` runbook's before one is chosen.
"""

from __future__ import annotations

from datetime import UTC, datetime

from contract.kube import DeviceRef, QuarantineResult, ResolvedDevice
from contract.remediation import (
    AlertEvidence,
    Phase,
    RemediationCarry,
    RemediationInput,
    RemediationStatus,
    TimelineEntry,
)
from workflows.remediation.state import CARRIED, RemediationState
from workflows.runbook_match import builtin_default

AT = datetime(2026, 12, 1, 12, 0, tzinfo=UTC)


def _carry() -> RemediationCarry:
    runbook = builtin_default()
    return RemediationCarry(
        device=ResolvedDevice(node="n1", gpu_uuid="GPU-1", node_pool="pool-a"),
        runbook=runbook.model_copy(
            update={"metadata": runbook.metadata.model_copy(update={"name": "training"})}
        ),
        quarantine=QuarantineResult(rule_name="sickbay-n1-gpu-1", mode="rule"),
        lease_held=True,
        escalated=True,
        status=RemediationStatus(
            workflow_id="sickbay-gpu-n1-gpu-1", device="n1/GPU-1", phase=Phase.HOLDING
        ),
        timeline=[TimelineEntry(at=AT, phase=Phase.HOLDING, action="quarantined")],
        alerts=[AlertEvidence(source="alertmanager", xid=79, fingerprint="fp-1")],
        healthy_since=AT,
        waiting_for_budget=True,
        event_counts={"GPUQuarantined|Node||n1": 2},
        retired=True,
        incident="sickbay-gpu-n1-gpu-1/run-1",
        guard_node="n1-new",
    )


def test_a_resumed_run_carries_every_field_on() -> None:
    carry = _carry()
    inp = RemediationInput(device=DeviceRef(node="n1", gpu_uuid="GPU-1"), resume=carry)
    state = RemediationState.from_input(inp, None)
    again = state.carry(waiting_for_budget=True).resume
    assert again is not None
    assert again.model_dump() == carry.model_dump()
    # Every carried field is set (none left at its default), so the equality covers each.
    assert all(
        getattr(carry, f) != d.default
        for f, d in RemediationCarry.model_fields.items()
        if not d.is_required()
    )


def test_each_carried_field_lands_in_its_part() -> None:
    carry = _carry()
    inp = RemediationInput(device=DeviceRef(node="n1", gpu_uuid="GPU-1"), resume=carry)
    state = RemediationState.from_input(inp, None)
    assert set(CARRIED) == set(RemediationCarry.model_fields)
    assert state.confirm.device == carry.device and state.quarantine.result == carry.quarantine
    assert state.lease.held and state.escalation.done and state.ledger.retired
    assert state.hold.healthy_since == AT and state.quarantine.guard_node == "n1-new"
    assert state.ledger.incident == carry.incident and state.status == carry.status


def test_the_resumed_run_appends_to_copies() -> None:
    carry = _carry()
    inp = RemediationInput(device=DeviceRef(node="n1", gpu_uuid="GPU-1"), resume=carry)
    state = RemediationState.from_input(inp, None)
    state.journal.timeline.append(
        TimelineEntry(at=AT, phase=Phase.HOLDING, action="health checked")
    )
    state.journal.event_counts["GPUQuarantined|Node||n1"] = 3
    assert len(carry.timeline) == 1 and carry.event_counts["GPUQuarantined|Node||n1"] == 2
    resume = state.carry().resume
    assert resume is not None and len(resume.timeline) == 2


def test_the_spec_is_the_chosen_runbooks_and_default_before() -> None:
    carry = _carry()
    inp = RemediationInput(device=DeviceRef(node="n1", gpu_uuid="GPU-1"), resume=carry)
    state = RemediationState.from_input(inp, None)
    state.confirm.runbook = None
    assert state.spec == state.confirm.fallback.spec
    chosen = carry.runbook.model_copy(
        update={"spec": carry.runbook.spec.model_copy(update={"dry_run": True})}
    )
    state.confirm.runbook = chosen
    assert state.spec.dry_run and state.dry
