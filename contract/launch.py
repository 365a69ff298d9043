"""The `signal-with-start-remediation` activity's input and result (sweep, maintenance)."""

from __future__ import annotations

from contract.activity import Activity
from contract.base import Contract
from contract.names import ACT_SIGNAL_WITH_START, ACT_START_NODE_INCIDENT
from contract.node_incident import NodeLaunch
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


# --- activities (contract.activity): the name, the input model, the result model ------------
SIGNAL_WITH_START_REMEDIATION = Activity(ACT_SIGNAL_WITH_START, LaunchRequest, LaunchResult)
SIGNAL_WITH_START_NODE_INCIDENT = Activity(ACT_START_NODE_INCIDENT, NodeLaunch, LaunchResult)
