"""The `signal-with-start-remediation` activity's input and result (sweep, maintenance)."""

from __future__ import annotations

from contract.base import Contract
from contract.remediation import AlertEvidence, RemediationInput


class LaunchRequest(Contract):
    """Input of the `signal-with-start-remediation` activity (sweep, maintenance): start the
    device's remediation or, when one runs, hand it the evidence."""

    remediation: RemediationInput
    evidence: AlertEvidence | None = None  # None: a manual-launch evidence entry is sent
    task_queue: str | None = None  # None: the worker's / caller's configured queue
    # True (an alert handed over to its device's canonical id): never start a run after a
    # completed one for evidence that run handled (`already_handled`), as the webhook does.
    respect_handled: bool = False


class LaunchResult(Contract):
    workflow_id: str
    run_id: str | None = None
    started: bool  # True: a new run started; False: an existing run was signalled
    device: str = ""
    # The device's last, completed run handled this evidence: nothing started or signalled.
    already_handled: bool = False
