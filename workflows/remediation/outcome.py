"""How a step ends the procedure early: one convention, a returned value (never an exception
or a flag). `Escalation`: people must act; the workflow escalates, then holds the device if it
is quarantined, else closes `escalated`. `Closed`: close now with this outcome."""

from __future__ import annotations

from dataclasses import dataclass

from temporalio import workflow

with workflow.unsafe.imports_passed_through():
    from contract.remediation import Outcome
    from contract.runbook import EscalationReason


@dataclass(frozen=True)
class Escalation:
    reason: EscalationReason
    summary: str


@dataclass(frozen=True)
class Closed:
    outcome: Outcome
    reason: str


class InputRefused(Exception):
    """A person's launch (CLI, Web UI) named what the cluster does not have (a device, a
    runbook): the run fails at once as invalid input, before anything is done; never an
    escalation, never a page, never a GPU failure. The one exception a step raises."""
