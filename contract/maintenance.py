"""The maintenance drain workflow: selector, input, result, and its activities' models."""

from __future__ import annotations

from datetime import timedelta

from pydantic import Field, model_validator

from contract.activity import Activity
from contract.base import Contract, Duration, StrictBool
from contract.kube import ResolvedDevice
from contract.launch import LaunchResult
from contract.names import ACT_AWAIT_REMEDIATION, ACT_SELECT_DEVICES
from contract.remediation import Phase


class MaintenanceSelector(Contract):
    """Devices chosen for a planned drain: every field set must match."""

    nodes: list[str] = Field(default_factory=list)
    node_labels: dict[str, str] = Field(default_factory=dict)
    driver: str | None = None
    device_attributes: dict[str, str] = Field(default_factory=dict)  # e.g. driverVersion

    @model_validator(mode="after")
    def _not_everything(self) -> MaintenanceSelector:
        if not (self.nodes or self.node_labels or self.device_attributes):
            raise ValueError(
                "a maintenance selector needs nodes, node_labels or device_attributes; "
                "it never selects every device in the cluster"
            )
        return self


class MaintenanceInput(Contract):
    selector: MaintenanceSelector
    runbook: str = "maintenance"
    reason: str = Field(default="planned maintenance", min_length=1)
    requested_by: str = "unknown"
    dry_run: StrictBool = False


class SelectDevicesInput(Contract):
    selector: MaintenanceSelector


class SelectedDevices(Contract):
    devices: list[ResolvedDevice] = Field(default_factory=list)


class AwaitRemediationInput(Contract):
    """Wait until a remediation reaches one of `phases` (or closes)."""

    workflow_id: str
    phases: list[Phase] = Field(default_factory=list)
    poll_interval: Duration = timedelta(seconds=5)


class AwaitRemediationResult(Contract):
    workflow_id: str
    phase: Phase | None = None
    closed: bool = False
    outcome: str | None = None


class MaintenanceResult(Contract):
    devices: list[str] = Field(default_factory=list)  # device keys selected
    launched: list[LaunchResult] = Field(default_factory=list)
    finished: list[AwaitRemediationResult] = Field(default_factory=list)
    dry_run: bool = False


# --- activities (contract.activity): the name, the input model, the result model ------------
SELECT_DEVICES = Activity(ACT_SELECT_DEVICES, SelectDevicesInput, SelectedDevices)
AWAIT_REMEDIATION_PHASE = Activity(
    ACT_AWAIT_REMEDIATION, AwaitRemediationInput, AwaitRemediationResult
)
