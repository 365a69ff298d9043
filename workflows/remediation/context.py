"""What every step of a remediation works with: its state, its activity calls, its journal."""

from __future__ import annotations

from dataclasses import dataclass

from temporalio import workflow

with workflow.unsafe.imports_passed_through():
    from workflows.remediation.calls import Calls
    from workflows.remediation.journal import Journal
    from workflows.remediation.state import RemediationState


@dataclass
class Remediation:
    s: RemediationState
    act: Calls
    j: Journal

    @classmethod
    def of(cls, state: RemediationState) -> Remediation:
        calls = Calls(state)
        return cls(s=state, act=calls, j=Journal(state, calls))
