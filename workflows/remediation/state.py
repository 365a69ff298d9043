"""The one state of a remediation run: the status query's source and the continue-as-new
carry, in parts. Each part is written by one module, its owner (`OWNERS`, checked on the
source by tests/workflows/test_state_ownership.py); the others read it. A step owns what it
decides; a part several steps change belongs to the shared module below them that decides it
(the quarantine record: `rule.py`; the lease: `lease.py`; the pause: `pause.py`; the pods the
Events go on: `journal.py`); a signal handler in `workflow.py` keeps only the abort and the
repaired mark (`inbox`) and tells the owner of anything else.

The carried fields (`RemediationCarry`'s) live in their owners' parts: `CARRIED` names where
each one is, and `carry()` / `from_input()` copy them by that map (`RemediationCarry` itself
stays flat: it is in the history); the others live for one run only.
"""

from __future__ import annotations

import asyncio
import functools
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


# --- the parts, each with its owner (the module of workflows/remediation that writes it) -----


@dataclass
class Confirmation:
    """confirm.py: what confirming found."""

    device: ResolvedDevice | None = None
    runbook: Runbook | None = None
    consumers: list[Consumer] = field(default_factory=list)
    # The `default` runbook as loaded: before a runbook is chosen it decides how to escalate.
    fallback: Runbook = field(default_factory=builtin_default)


@dataclass
class Record:
    """journal.py: what the remediation told, and where."""

    timeline: list[TimelineEntry] = field(default_factory=list)
    alerts: list[AlertEvidence] = field(default_factory=list)
    # Aggregated Kubernetes Events: how often each (reason, object) was told so far.
    event_counts: dict[str, int] = field(default_factory=dict)
    # An Event on its way beside the steps that follow it (`event_beside`); every later
    # Event waits for it, so they read in the order they were decided.
    writing: asyncio.Task[None] | None = None
    # Pods that exist now, for Events: None = the consumers (not evicted yet); then the ones
    # still on the device, or the replacements last seen Pending / Running (`pods_now`).
    live_pods: list[PodRef] | None = None
    sa_phase: Phase | None = None  # the phase last written to the search attributes
    sa_paused: bool = False  # SickbayPaused last written as "paused"
    # (claimed actor, Temporal client identity) of the abort / repaired / decision.
    sent: dict[str, tuple[str, str]] = field(default_factory=dict)
    # "verified user X (via ...)" of the abort / repaired / decision sent by a verified actor.
    verified_sent: dict[str, str] = field(default_factory=dict)


@dataclass
class Quarantine:
    """rule.py: what Sickbay holds out of service, as last applied or lifted."""

    result: QuarantineResult | None = None  # the rule (or fallback), its node taint / cordon
    # The effect of the rule as last applied (NoSchedule in mode eviction-api until its
    # backstop): under NoSchedule one replacement bound to the device is churn.
    effect: str = "NoExecute"
    guard_node: str | None = None  # a replace's new node under Sickbay's cordon (validation)


@dataclass
class Lease:
    """lease.py: the budget lease."""

    held: bool = False
    gpus: int = 1  # GPUs the lease counts (a repair rung grows it)


@dataclass
class Escalated:
    """escalation.py: the one escalation of the incident."""

    done: bool = False
    would_have: EscalationReason | None = None  # a dry run's escalation


@dataclass
class Holding:
    """hold.py: the hold until repaired or Healthy, and the undo after an abort."""

    healthy_since: datetime | None = None
    health_only: bool = False  # holding under release.mode healthy-cooldown
    undoing: bool = False  # set once an abort is being handled: undo steps run to the end


@dataclass
class Replacing:
    """replace.py: the replacement wait's deadline (a durable timer; `extend-deadline` moves
    it)."""

    deadline: PendingDeadline = field(default_factory=PendingDeadline)


@dataclass
class Ledger:
    """lemons.py: the GPU ledger's view of this incident."""

    incident: str = ""  # the ledger's key: <workflow id>/<first run id>, kept across runs
    # Whether this incident is a GPU failure for the ledger (confirmed device evidence), and
    # why or why not (classify.device_evidence, given by the confirm step; a failed
    # validation makes it one later).
    counts: bool = False
    counts_why: str = ""
    # The record-gpu-failure call on its way (`start_recording`): nothing before the repair
    # ladder, the escalation and the hold waits for it.
    call: asyncio.Task[None] | None = None
    decision: LedgerDecision | None = None  # the ledger's answer to this run's failure
    retired: bool = False  # a lemon: never released until un-retired


@dataclass
class Guarding:
    """guard.py: what wakes the wait for a budget slot."""

    resolved_pending: bool = False  # an alert-resolved not yet checked against health
    budget_freed: bool = False  # the budget workflow's wake-up signal


@dataclass
class Approving:
    """approval.py: the decision of the `approve` update."""

    decision: ApprovalDecision | None = None


@dataclass
class Paused:
    """pause.py: the cluster's pause, told by the budget workflow to its lease holders
    (`cluster-paused`) or with a lease answer."""

    pause: BudgetPause | None = None


@dataclass
class Inbox:
    """workflow.py: a person's abort and repaired mark, as the signal handlers took them in."""

    abort: AbortRequest | None = None
    repaired: RepairedRequest | None = None


@dataclass
class Senders:
    """actors.py: nonces of the verified actions taken in (a copied signature counts once)."""

    seen_nonces: set[str] = field(default_factory=set)


# Who writes each part; `status.<field>`: a field of the status query's model. "state": set
# when the state is built, never written after.
OWNERS: dict[str, str] = {
    "inp": "state",
    "input_error": "state",
    "status": "state",
    "confirm": "confirm",
    "journal": "journal",
    "quarantine": "rule",
    "lease": "lease",
    "escalation": "escalation",
    "hold": "hold",
    "replace": "replace",
    "ledger": "lemons",
    "guard": "guard",
    "approval": "approval",
    "pause": "pause",
    "inbox": "workflow",
    "actors": "actors",
    **{
        f"status.{name}": owner
        for owner, names in {
            "state": ("workflow_id", "started_at"),
            "confirm": (
                "device",
                "node",
                "consumers",
                "runbook",
                "workload_class",
                "failure_class",
                "dry_run",
            ),
            "journal": (
                "phase",
                "awaiting",
                "until",
                "next_action",
                "updated_at",
                "outcome",
                "alerts",
                "duplicate_alerts",
            ),
            "rule": ("rule_name",),
            "replace": ("deadline",),
            "escalation": ("escalation_reason",),
            "pause": ("paused",),
            "repair": ("repair_rung", "repair_attempt", "validation"),
        }.items()
        for name in names
    },
}

# The carried fields (exactly RemediationCarry's): where each lives in the state; None for the
# one only the carry holds (`waiting_for_budget`, an argument of `carry()`).
CARRIED: dict[str, str | None] = {
    "device": "confirm.device",
    "runbook": "confirm.runbook",
    "quarantine": "quarantine.result",
    "lease_held": "lease.held",
    "escalated": "escalation.done",
    "status": "status",
    "timeline": "journal.timeline",
    "alerts": "journal.alerts",
    "healthy_since": "hold.healthy_since",
    "waiting_for_budget": None,
    "event_counts": "journal.event_counts",
    "retired": "ledger.retired",
    "incident": "ledger.incident",
    "guard_node": "quarantine.guard_node",
}


@dataclass
class RemediationState:
    inp: RemediationInput
    status: RemediationStatus
    input_error: str | None = None  # the input did not validate: the run fails at once
    confirm: Confirmation = field(default_factory=Confirmation)
    journal: Record = field(default_factory=Record)
    quarantine: Quarantine = field(default_factory=Quarantine)
    lease: Lease = field(default_factory=Lease)
    escalation: Escalated = field(default_factory=Escalated)
    hold: Holding = field(default_factory=Holding)
    replace: Replacing = field(default_factory=Replacing)
    ledger: Ledger = field(default_factory=Ledger)
    guard: Guarding = field(default_factory=Guarding)
    approval: Approving = field(default_factory=Approving)
    pause: Paused = field(default_factory=Paused)
    inbox: Inbox = field(default_factory=Inbox)
    actors: Senders = field(default_factory=Senders)

    @classmethod
    def from_input(cls, inp: RemediationInput, input_error: str | None) -> RemediationState:
        """A fresh state, or the one the previous run carried (`inp.resume`)."""
        carry = inp.resume
        if carry is not None:
            state = cls(inp=inp, input_error=input_error, status=carry.status)
            for name, path in CARRIED.items():
                if path is not None and "." in path:
                    part, attr = path.split(".")
                    setattr(getattr(state, part), attr, _copied(getattr(carry, name)))
            return state
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
        assert self.confirm.device is not None and self.confirm.runbook is not None
        carried = {
            name: functools.reduce(getattr, path.split("."), self)
            for name, path in CARRIED.items()
            if path is not None
        }
        resume = RemediationCarry.model_validate(
            carried | {"waiting_for_budget": waiting_for_budget}
        )
        return self.inp.model_copy(update={"alerts": [], "resume": resume})

    # --- read by calls.py, which takes the state: an abort interrupts, unless undoing -------

    @property
    def abort(self) -> AbortRequest | None:
        return self.inbox.abort

    @property
    def undoing(self) -> bool:
        return self.hold.undoing

    @property
    def spec(self) -> RunbookSpec:
        """The chosen runbook's spec; before one is chosen (a step failed early), `default`'s
        decides how to escalate."""
        return (self.confirm.runbook or self.confirm.fallback).spec

    @property
    def dry(self) -> bool:
        """A dry run (input or runbook): nothing is created, nobody is paged."""
        runbook = self.confirm.runbook
        return self.inp.dry_run or bool(runbook and runbook.spec.dry_run)

    @property
    def workflow_id(self) -> str:
        return workflow.info().workflow_id

    def owners(self) -> list[OwnerRef]:
        seen: dict[tuple[str, str, str], OwnerRef] = {}
        for c in self.confirm.consumers:
            owner = c.top_owner or c.owner
            if owner is not None:
                seen.setdefault((owner.kind, owner.namespace, owner.name), owner)
        return list(seen.values())

    def handled_alerts(self) -> list[HandledAlert]:
        """Alertmanager alert instances this run and the ones before it handled."""
        seen: dict[tuple[str, str], HandledAlert] = {h.key(): h for h in self.inp.handled_before}
        for a in self.journal.alerts:
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
