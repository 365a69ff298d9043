"""The health-sweep workflow's decisions, on the time-skipping server with stub activities.

Cases:
- Unhealthy pod health and a driver slice taint: one signal-with-start per device, trigger
  `sweep`, stable fingerprints; a node short of GPUs is notified on every channel and never
  launched; unresolved DRA ids are reported
- Unknown health: the sweep waits `unknown_timeout` (skipped time), re-checks only those
  devices, launches the one still Unknown and reports the one that recovered
- a launch that fails does not fail the sweep; the device is left for the next sweep
- the same finding in two sweeps carries the same fingerprint (the device workflow dedups)
- with the watcher on, a device the sweep had to start is counted in `missed_by_watch`
"""

from __future__ import annotations

import uuid
from datetime import datetime, timedelta

from temporalio import activity
from temporalio.exceptions import ApplicationError
from temporalio.testing import WorkflowEnvironment
from temporalio.worker import Worker

from contract.errors import ERR_INVALID_INPUT
from contract.kube import PodRef, SliceTaint
from contract.launch import LaunchRequest, LaunchResult
from contract.names import ACT_NOTIFY, ACT_SIGNAL_WITH_START, ACT_SWEEP_CLUSTER
from contract.notify import NotifyInput, NotifyResult
from contract.sweep import SweepClusterInput, SweepFinding, SweepInput, SweepReport, SweepResult
from workflows.sweep import HealthSweepWorkflow

POD = PodRef(namespace="ml", name="trainer-0")


def unhealthy(node: str, idx: int, health: str = "Unhealthy") -> SweepFinding:
    return SweepFinding(
        kind="pod-health",
        node=node,
        gpu_uuid=f"GPU-{node}-{idx}",
        resource_id=f"gpu.nvidia.com/{node}/gpu-{idx}",
        health=health,  # type: ignore[arg-type]
        xid=79 if health == "Unhealthy" else None,
        message="XID 79" if health == "Unhealthy" else "no update",
        pods=[POD],
    )


class Stubs:
    """Name-matched stand-ins that record what the workflow asked for."""

    def __init__(self, reports: list[SweepReport], fail_launch: bool = False) -> None:
        self.reports = reports
        self.sweeps: list[tuple[SweepClusterInput, datetime]] = []
        self.launches: list[LaunchRequest] = []
        self.notices: list[NotifyInput] = []
        self.fail_launch = fail_launch

    def activities(self) -> list:
        @activity.defn(name=ACT_SWEEP_CLUSTER)
        async def sweep(req: SweepClusterInput) -> SweepReport:
            self.sweeps.append((req, activity.info().scheduled_time))
            return self.reports[min(len(self.sweeps) - 1, len(self.reports) - 1)]

        @activity.defn(name=ACT_SIGNAL_WITH_START)
        async def launch(req: LaunchRequest) -> LaunchResult:
            self.launches.append(req)
            if self.fail_launch:
                raise ApplicationError("bad device", type=ERR_INVALID_INPUT, non_retryable=True)
            device = req.remediation.device
            return LaunchResult(
                workflow_id=device.workflow_id(), started=len(self.launches) % 2 == 1
            )

        @activity.defn(name=ACT_NOTIFY)
        async def notify(req: NotifyInput) -> NotifyResult:
            self.notices.append(req)
            return NotifyResult(channel=req.channel, delivered=True)

        return [sweep, launch, notify]


async def run_sweep(env: WorkflowEnvironment, stubs: Stubs, inp: SweepInput) -> SweepResult:
    queue = f"sweep-{uuid.uuid4().hex[:8]}"
    async with Worker(
        env.client,
        task_queue=queue,
        workflows=[HealthSweepWorkflow],
        activities=stubs.activities(),
        max_cached_workflows=0,  # every task replays: determinism is checked as we go
    ):
        return await env.client.execute_workflow(
            HealthSweepWorkflow.run,
            inp,
            id=f"sweep-test-{uuid.uuid4().hex[:8]}",
            task_queue=queue,
            result_type=SweepResult,
        )


async def test_unhealthy_launched_and_vanished_notified(
    time_skipping_env: WorkflowEnvironment,
) -> None:
    taint = SweepFinding(
        kind="slice-taint",
        node="n2",
        gpu_uuid="GPU-n2-0",
        resource_id="gpu.nvidia.com/n2/gpu-0",
        health="Unhealthy",
        xid=48,
        message="driver taint gpu.nvidia.com/xid=48:NoSchedule",
        taint=SliceTaint(key="gpu.nvidia.com/xid", value="48", effect="NoSchedule"),
    )
    node = SweepFinding(kind="node-capacity", node="n3", message="node n3: 7 < 8")
    orphan = SweepFinding(kind="pod-health", resource_id="gpu.nvidia.com/gone/gpu-9")
    report = SweepReport(findings=[unhealthy("n1", 0), taint], nodes=[node], unresolved=[orphan])
    stubs = Stubs([report])
    result = await run_sweep(
        time_skipping_env, stubs, SweepInput(notify_channels=["ops", "pager"], task_queue="q1")
    )
    assert sorted(r.remediation.device.key for r in stubs.launches) == [
        "n1/GPU-n1-0",
        "n2/GPU-n2-0",
    ]
    for req in stubs.launches:
        assert req.remediation.trigger == "sweep" and req.task_queue == "q1"
        assert req.evidence is not None and req.evidence.source == "sweep"
    by_key = {r.remediation.device.key: r for r in stubs.launches}
    first = by_key["n1/GPU-n1-0"].evidence
    assert first is not None and first.xid == 79 and first.pod == POD
    assert first.fingerprint == "sweep:pod-health:gpu.nvidia.com/n1/gpu-0:Unhealthy"
    second = by_key["n2/GPU-n2-0"].evidence
    assert second is not None and second.xid == 48
    assert second.fingerprint == "sweep:slice-taint:gpu.nvidia.com/n2/gpu-0:gpu.nvidia.com/xid=48"
    nodes = [n for n in stubs.notices if n.incident.node == "n3"]
    assert sorted(n.channel for n in nodes) == ["ops", "pager"]
    assert result.notified_nodes == ["n3"]
    # The health entry no device was found for is told to the same channels, never acted on.
    orphans = [n for n in stubs.notices if n.incident.device == "gpu.nvidia.com/gone/gpu-9"]
    assert sorted(n.channel for n in orphans) == ["ops", "pager"]
    assert orphans[0].incident.reason == "unresolved-health"
    assert len(stubs.notices) == 4
    assert result.unresolved == ["gpu.nvidia.com/gone/gpu-9"]
    assert sorted(result.devices) == ["n1/GPU-n1-0", "n2/GPU-n2-0"]
    assert len(result.started) + len(result.signalled) == 2
    assert result.unresolved == ["gpu.nvidia.com/gone/gpu-9"]
    assert len(stubs.sweeps) == 1  # nothing Unknown: no second look


async def test_unknown_rechecked_after_timeout(time_skipping_env: WorkflowEnvironment) -> None:
    first = SweepReport(findings=[unhealthy("n1", 0, "Unknown"), unhealthy("n1", 1, "Unknown")])
    second = SweepReport(findings=[unhealthy("n1", 0, "Unknown")])  # gpu-1 recovered
    stubs = Stubs([first, second])
    result = await run_sweep(
        time_skipping_env, stubs, SweepInput(unknown_timeout=timedelta(minutes=7))
    )
    assert len(stubs.sweeps) == 2
    (req1, t1), (req2, t2) = stubs.sweeps
    assert req1.only_unknown == [] and req1.check_nodes
    assert sorted(req2.only_unknown) == ["n1/GPU-n1-0", "n1/GPU-n1-1"]
    assert not req2.check_nodes and not req2.check_slice_taints
    assert t2 - t1 >= timedelta(minutes=7)
    assert [r.remediation.device.key for r in stubs.launches] == ["n1/GPU-n1-0"]
    assert "(Unknown for over 7m)" in stubs.launches[0].remediation.reason
    assert result.unknown_cleared == ["n1/GPU-n1-1"]


async def test_failed_launch_does_not_fail_sweep(time_skipping_env: WorkflowEnvironment) -> None:
    stubs = Stubs([SweepReport(findings=[unhealthy("n1", 0)])], fail_launch=True)
    result = await run_sweep(time_skipping_env, stubs, SweepInput())
    assert len(stubs.launches) == 1
    assert result.devices == [] and result.started == [] and result.signalled == []


async def test_same_finding_same_fingerprint(time_skipping_env: WorkflowEnvironment) -> None:
    stubs = Stubs([SweepReport(findings=[unhealthy("n1", 0)])])
    await run_sweep(time_skipping_env, stubs, SweepInput())
    await run_sweep(time_skipping_env, stubs, SweepInput())
    prints = [r.evidence.fingerprint for r in stubs.launches if r.evidence]
    assert len(prints) == 2 and prints[0] == prints[1]


async def test_missed_by_watch_counts_devices_the_sweep_had_to_start(
    time_skipping_env: WorkflowEnvironment,
) -> None:
    """With the health watcher on, a device the sweep STARTS a remediation for (the stub
    starts every other launch) was missed by the watch; one it only signals was not."""
    report = SweepReport(findings=[unhealthy("n1", 0), unhealthy("n1", 1)])
    on = await run_sweep(time_skipping_env, Stubs([report]), SweepInput(watcher=True))
    assert on.started and on.signalled  # one of each (see Stubs.launch)
    started_keys = {k for k in on.devices if any(k.split("/")[1].lower() in w for w in on.started)}
    assert on.missed_by_watch == sorted(started_keys) and len(on.missed_by_watch) == 1
    off = await run_sweep(time_skipping_env, Stubs([report]), SweepInput())
    assert off.missed_by_watch == []  # no watcher: starting is the sweep's job
