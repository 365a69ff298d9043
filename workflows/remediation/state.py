"""The one state of a remediation run: the status query's source, the continue-as-new carry
and the holder of the signal flags.

Fields named like `RemediationCarry`'s are carried into the next run as they are (`carry()`
/ `from_input()` copy them by name); the others live for one run only. Signal handlers only
set flags here; the steps read them.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from temporalio import workflow

with workflow.unsafe.imports_passed_through():
    from contract.budget import BudgetPause
    from contract.kube import (
        Consumer,
        DeviceRef,
        OwnerRef,
        PodRef,
        QuarantineResult,
        ResolvedDevice,
    )
    from contract.ledger import LedgerDecision
    from contract.remediation import (
        AbortRequest,
        AlertEvidence,
        ApprovalDecision,
        HandledAlert,
        Phase,
        RemediationCarry,
        RemediationInput,
        RemediationStatus,
        RepairedRequest,
        TimelineEntry,
    )
    from contract.runbook import EscalationReason, Runbook, RunbookSpec
    from workflows.remediation.deadline import PendingDeadline
    from workflows.runbook_match import builtin_default

# A result lists at most this many handled alert instances (they add up over a GPU's runs).
MAX_HANDLED_ALERTS = 500
# Continue-as-new during a long hold, or a wait of weeks for a budget slot (the quarantined
# GPUs it waits on are away for RMA), once history grows past this (periodic health checks).
HOLD_HISTORY_LIMIT = 2_000
# The carried fields: exactly RemediationCarry's, by name.
CARRIED = tuple(RemediationCarry.model_fields)


@dataclass
class RemediationState:
    inp: RemediationInput
    status: RemediationStatus
    input_error: str | None = None  # the input did not validate: the run fails at once
    # --- carried into the next run (RemediationCarry) -------------------------------------
    device: ResolvedDevice | None = None
    runbook: Runbook | None = None
    quarantine: QuarantineResult | None = None
    lease_held: bool = False
    escalated: bool = False
    timeline: list[TimelineEntry] = field(default_factory=list)
    alerts: list[AlertEvidence] = field(default_factory=list)
    healthy_since: datetime | None = None
    waiting_for_budget: bool = False  # the next run confirms afresh and asks again
    # Aggregated Kubernetes Events: how often each (reason, object) was told so far.
    event_counts: dict[str, int] = field(default_factory=dict)
    retired: bool = False  # a lemon (GPU ledger): never released until un-retired
    incident: str = ""  # the GPU ledger's key: <workflow id>/<first run id>, kept across runs
    guard_node: str | None = None  # a replace's new node under Sickbay's cordon (validation)
    # --- this run only ----------------------------------------------------------------------
    consumers: list[Consumer] = field(default_factory=list)
    # Pods that exist now, for Events: None = the consumers (not evicted yet); then the ones
    # still on the device, or the replacements last seen Pending / Running.
    live_pods: list[PodRef] | None = None
    fallback: Runbook = field(default_factory=builtin_default)
    would_have: EscalationReason | None = None  # a dry run's escalation
    sa_phase: Phase | None = None  # the phase last written to the search attributes
    # The effect of the rule as last applied (NoSchedule in mode eviction-api until its
    # backstop): under NoSchedule one replacement bound to the device is churn.
    rule_effect: str = "NoExecute"
    sa_paused: bool = False  # SickbayPaused last written as "paused"
    health_only: bool = False  # holding under release.mode healthy-cooldown
    undoing: bool = False  # set once an abort is being handled: undo steps run to the end
    # The replacement wait's deadline (a durable timer; `extend-deadline` moves it).
    deadline: PendingDeadline = field(default_factory=PendingDeadline)
    lease_gpus: int = 1  # GPUs the budget lease counts (a repair rung grows it)
    lemon: LedgerDecision | None = None  # the GPU ledger's answer to this run's failure
    # Whether this incident is a GPU failure for the ledger (confirmed device evidence), and
    # why or why not (classify.device_evidence; a failed validation makes it one later).
    counts: bool = False
    counts_why: str = ""
    # The record-gpu-failure call on its way (lemons.start_recording): nothing before the
    # repair ladder, the escalation and the hold waits for it.
    ledger_call: asyncio.Task[None] | None = None
    # --- signal / update flags ------------------------------------------------------------
    abort: AbortRequest | None = None
    repaired: RepairedRequest | None = None
    decision: ApprovalDecision | None = None
    resolved_pending: bool = False  # an alert-resolved not yet checked against health
    budget_freed: bool = False  # set by the budget workflow's wake-up signal
    # The cluster's pause, told by the budget workflow to its lease holders (`cluster-paused`)
    cluster_pause: BudgetPause | None = None
    # (claimed actor, Temporal client identity) of the abort / repaired / decision.
    sent: dict[str, tuple[str, str]] = field(default_factory=dict)
    # "verified user X (via ...)" of the abort / repaired / decision sent by a verified actor.
    verified_sent: dict[str, str] = field(default_factory=dict)
    # Nonces of the verified actions taken in (a copied signature counts once).
    seen_nonces: set[str] = field(default_factory=set)

    @classmethod
    def from_input(cls, inp: RemediationInput, input_error: str | None) -> RemediationState:
        """A fresh state, or the one the previous run carried (`inp.resume`)."""
        carry = inp.resume
        if carry is not None:
            carried: dict[str, Any] = {name: _copied(getattr(carry, name)) for name in CARRIED}
            return cls(inp=inp, input_error=input_error, **carried)
        bad = input_error is not None
        return cls(
            inp=inp,
            input_error=input_error,
            status=RemediationStatus(
                workflow_id=workflow.info().workflow_id,
                device="unknown (invalid input)" if bad else inp.device.key,
                node=None if bad else inp.device.node,
                started_at=workflow.now(),
                updated_at=workflow.now(),
                dry_run=inp.dry_run,
            ),
        )

    @staticmethod
    def invalid_input() -> RemediationInput:
        """What the run holds when its input did not validate (it fails at once)."""
        return RemediationInput(device=DeviceRef(node="invalid-input", gpu_uuid="invalid"))

    def carry(self, *, waiting_for_budget: bool = False) -> RemediationInput:
        """The next run's input: the same trigger, resumed from this state."""
        assert self.device is not None and self.runbook is not None
        self.waiting_for_budget = waiting_for_budget
        resume = RemediationCarry.model_validate({name: getattr(self, name) for name in CARRIED})
        return self.inp.model_copy(update={"alerts": [], "resume": resume})

    @property
    def spec(self) -> RunbookSpec:
        """The chosen runbook's spec; before one is chosen (a step failed early), `default`'s
        decides how to escalate."""
        return (self.runbook or self.fallback).spec

    @property
    def dry(self) -> bool:
        """A dry run (input or runbook): nothing is created, nobody is paged."""
        return self.inp.dry_run or bool(self.runbook and self.runbook.spec.dry_run)

    @property
    def workflow_id(self) -> str:
        return workflow.info().workflow_id

    def owners(self) -> list[OwnerRef]:
        seen: dict[tuple[str, str, str], OwnerRef] = {}
        for c in self.consumers:
            owner = c.top_owner or c.owner
            if owner is not None:
                seen.setdefault((owner.kind, owner.namespace, owner.name), owner)
        return list(seen.values())

    def handled_alerts(self) -> list[HandledAlert]:
        """Alertmanager alert instances this run and the ones before it handled."""
        seen: dict[tuple[str, str], HandledAlert] = {h.key(): h for h in self.inp.handled_before}
        for a in self.alerts:
            if a.source == "alertmanager" and a.fingerprint:
                h = HandledAlert.of(a)
                seen.setdefault(h.key(), h)
        return list(seen.values())[-MAX_HANDLED_ALERTS:]  # newest last: the oldest go first


def history_full() -> bool:
    """Time to continue-as-new (a long hold, or a long wait for a budget slot)."""
    info = workflow.info()
    return (
        info.get_current_history_length() > HOLD_HISTORY_LIMIT
        or info.is_continue_as_new_suggested()
    )


def _copied(value: Any) -> Any:
    """Lists and dicts of the carry are copied: this run appends to its own."""
    if isinstance(value, list):
        return list(value)
    if isinstance(value, dict):
        return dict(value)
    return value
