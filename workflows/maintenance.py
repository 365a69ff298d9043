"""`sickbay-maintenance-drain`: drain every device a selector chooses, a few at a time.

    select-devices (selector -> physical GPUs)
      -> for each device, at most `max_parallel` at once:
           signal-with-start its remediation (runbook `maintenance`, trigger `maintenance`)
           await-remediation-phase until it is drained (holding), escalated or closed
      -> result: devices, launches, how each ended

Each device's remediation is the ordinary `remediate-gpu-device` workflow under the device's
canonical id, so an alert for a device being drained meets the same workflow. `max_parallel`
comes from the runbook's `maintenance.maxParallel` (looked up through load-runbooks) unless
the input is a dry run, which launches dry-run remediations (previews) for every device.
"""

from __future__ import annotations

import asyncio
from datetime import timedelta
from typing import Any

from temporalio import workflow
from temporalio.common import RetryPolicy
from temporalio.exceptions import ActivityError, ApplicationError

with workflow.unsafe.imports_passed_through():
    from pydantic import ValidationError

    from contract.activity import declared_in
    from contract.base import input_problems
    from contract.errors import ERR_INVALID_INPUT, ERR_MAINTENANCE_FAILED
    from contract.kube import DeviceRef
    from contract.launch import SIGNAL_WITH_START_REMEDIATION, LaunchRequest
    from contract.maintenance import (
        AWAIT_REMEDIATION_PHASE,
        SELECT_DEVICES,
        AwaitRemediationInput,
        MaintenanceInput,
        MaintenanceResult,
        SelectDevicesInput,
    )
    from contract.names import (
        QRY_MAINTENANCE_PROGRESS,
        WF_MAINTENANCE,
    )
    from contract.remediation import AlertEvidence, Phase, RemediationInput
    from contract.runbook import LOAD_RUNBOOKS
    from workflows.execute import execute, execute_local

# The activities this workflow calls: the declarations imported here (the worker checks them).
REQUIRED_ACTIVITIES = declared_in(globals())

# Selecting lists nodes and ResourceSlices: one or two API calls; a minute with retries covers
# an API-server blip. Launch is one Temporal RPC.
SHORT = timedelta(seconds=30)
SHORT_RETRY = RetryPolicy(initial_interval=timedelta(seconds=1), maximum_attempts=5)
# A drain may take as long as the runbook's eviction timeout plus force; the wait heartbeats,
# so a worker crash is noticed within a minute and the wait resumes elsewhere.
DRAIN_TIMEOUT = timedelta(hours=6)
DRAIN_HEARTBEAT = timedelta(seconds=60)
DRAIN_RETRY = RetryPolicy(initial_interval=timedelta(seconds=5), maximum_attempts=3)
DRAINED = [Phase.HOLDING, Phase.ESCALATED, Phase.CLOSED]


@workflow.defn(name=WF_MAINTENANCE)
class MaintenanceWorkflow:
    def __init__(self) -> None:
        self._result = MaintenanceResult()

    @workflow.query(name=QRY_MAINTENANCE_PROGRESS)
    def progress(self) -> MaintenanceResult:
        return self._result

    @workflow.run
    async def run(self, raw: Any = None) -> MaintenanceResult:
        # Decoded here, not by the SDK: undecodable input would fail the workflow task on
        # every retry (a run stuck Running); bad input fails the run at once, naming the field.
        try:
            inp = MaintenanceInput.model_validate(raw)
        except ValidationError as err:
            raise ApplicationError(
                f"invalid input for {WF_MAINTENANCE}: {input_problems(err, MaintenanceInput)}",
                type=ERR_INVALID_INPUT,
                non_retryable=True,
            ) from None
        self._result.dry_run = inp.dry_run
        selected = await execute(
            SELECT_DEVICES,
            SelectDevicesInput(selector=inp.selector),
            start_to_close_timeout=SHORT,
            retry_policy=SHORT_RETRY,
        )
        self._result.devices = [d.key for d in selected.devices]
        if not selected.devices:
            workflow.logger.info("maintenance selector matched no device")
            return self._result
        max_parallel = await self._max_parallel(inp.runbook)
        slots = asyncio.Semaphore(max_parallel)
        workflow.logger.info(
            "draining %d device(s), %d at a time", len(selected.devices), max_parallel
        )

        async def drain(index: int) -> None:
            device = selected.devices[index]
            async with slots:
                launch = await execute(
                    SIGNAL_WITH_START_REMEDIATION,
                    LaunchRequest(
                        remediation=RemediationInput(
                            device=DeviceRef(node=device.node, gpu_uuid=device.gpu_uuid),
                            trigger="maintenance",
                            runbook=inp.runbook,
                            dry_run=inp.dry_run,
                            requested_by=inp.requested_by,
                            reason=inp.reason,
                        ),
                        evidence=AlertEvidence(
                            source="manual",
                            alertname="sickbay-maintenance",
                            fingerprint=f"maintenance-{workflow.info().workflow_id}",
                            summary=inp.reason,
                            received_at=workflow.now(),
                            labels={"requested_by": inp.requested_by},
                        ),
                        task_queue=workflow.info().task_queue,
                    ),
                    start_to_close_timeout=SHORT,
                    retry_policy=SHORT_RETRY,
                )
                self._result.launched.append(launch)
                done = await execute(
                    AWAIT_REMEDIATION_PHASE,
                    AwaitRemediationInput(workflow_id=launch.workflow_id, phases=DRAINED),
                    start_to_close_timeout=DRAIN_TIMEOUT,
                    heartbeat_timeout=DRAIN_HEARTBEAT,
                    retry_policy=DRAIN_RETRY,
                )
                self._result.finished.append(done)

        results = await asyncio.gather(
            *(drain(i) for i in range(len(selected.devices))), return_exceptions=True
        )
        failures = [r for r in results if isinstance(r, BaseException)]
        for failure in failures:
            workflow.logger.warning("a drain failed: %s", failure)
        if failures and len(failures) == len(results):
            raise ApplicationError(
                f"every drain failed; first: {failures[0]}", type=ERR_MAINTENANCE_FAILED
            )
        return self._result

    async def _max_parallel(self, runbook: str) -> int:
        try:
            runbooks = await execute_local(
                LOAD_RUNBOOKS,
                None,
                start_to_close_timeout=timedelta(seconds=10),
                retry_policy=RetryPolicy(maximum_attempts=3),
            )
        except (ActivityError, ApplicationError):
            return 1
        found = runbooks.get(runbook)
        return found.spec.maintenance.max_parallel if found else 1
