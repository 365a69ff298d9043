"""The remediation workflow (`remediate-gpu-device`), one module per step of its procedure."""

from workflows.remediation.calls import REQUIRED_ACTIVITIES
from workflows.remediation.workflow import DeviceRemediationWorkflow

__all__ = ["REQUIRED_ACTIVITIES", "DeviceRemediationWorkflow"]
