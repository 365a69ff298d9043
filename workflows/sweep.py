"""`sickbay-health-sweep`: started by the Temporal Schedule every few minutes.

    sweep-cluster ──> Unhealthy / driver-tainted devices ──> signal-with-start each device
         │                                                    workflow (never a second one)
         ├──> GPUs vanished from a node ──> signal-with-start its node incident
         │        (workflows/node_incident/: one per node, never a per-GPU remediation)
         ├──> other node-capacity findings (allocatable < capacity) ──> notify; never taint
         ├──> pod health Sickbay cannot map to a GPU ──> WARNING + notify; never taint
         └──> Unknown devices ──> sleep(unknown_timeout) ──> sweep-cluster(only those)
                                                          ──> still Unknown/Unhealthy: start

Every device workflow is reached through the `signal-with-start-remediation` activity, whose
workflow id comes from node + GPU UUID, so a device an alert already named is only signalled.
The evidence fingerprint is stable across sweeps (`sweep:<kind>:<resourceID>:<state>`), so the
device workflow ignores the same finding sent again by the next sweep, or by the health
watcher, which builds its launches with the same `finding_launch`. With the watcher running
(`SweepInput.watcher`), a device this sweep has to start rather than signal is one the watch
missed: it is listed in `SweepResult.missed_by_watch` and counted by the workflow metric
`sickbay_sweep_missed_by_watch`.
"""

from __future__ import annotations

import asyncio
from datetime import datetime, timedelta

from temporalio import workflow
from temporalio.common import RetryPolicy
from temporalio.exceptions import ActivityError

with workflow.unsafe.imports_passed_through():
    from contract.activity import declared_in
    from contract.base import format_duration
    from contract.kube import DeviceRef
    from contract.launch import (
        SIGNAL_WITH_START_NODE_INCIDENT,
        SIGNAL_WITH_START_REMEDIATION,
        LaunchRequest,
    )
    from contract.names import (
        WF_SWEEP,
        node_notice_workflow_id,
        scoped,
    )
    from contract.node_incident import NodeIncidentInput, NodeLaunch
    from contract.notify import SEND_NOTIFICATION, Incident, NotifyInput
    from contract.remediation import AlertEvidence, Phase, RemediationInput, Trigger
    from contract.sweep import (
        SWEEP_CLUSTER,
        SweepClusterInput,
        SweepFinding,
        SweepInput,
        SweepReport,
        SweepResult,
    )
    from workflows.execute import execute

# The activities this workflow calls: the declarations imported here (the worker checks them).
REQUIRED_ACTIVITIES = declared_in(globals())

# Listing every pod, slice and node of a big cluster takes seconds, a few pages per kind;
# two minutes is generous and still lets the next scheduled sweep start on time.
SWEEP_TIMEOUT = timedelta(minutes=2)
# Three tries, 10 s apart: a flaky API server gets a second chance within this sweep; past
# that the next scheduled sweep tries again anyway.
SWEEP_RETRY = RetryPolicy(
    initial_interval=timedelta(seconds=10), backoff_coefficient=2.0, maximum_attempts=3
)
# One signal-with-start RPC. Retried for a minute or so (Temporal frontend restarts), then the
# device is reported as failed in this sweep and picked up again by the next one.
LAUNCH_TIMEOUT = timedelta(seconds=30)
LAUNCH_RETRY = RetryPolicy(
    initial_interval=timedelta(seconds=2),
    backoff_coefficient=2.0,
    maximum_interval=timedelta(seconds=30),
    maximum_attempts=5,
)
# A notification is best effort here: the next sweep repeats it while the node stays short.
NOTIFY_TIMEOUT = timedelta(seconds=30)
NOTIFY_RETRY = RetryPolicy(initial_interval=timedelta(seconds=5), maximum_attempts=3)
# Launch at most this many device workflows at once (a rack failing together).
FAN_OUT = 20


def finding_fingerprint(f: SweepFinding) -> str:
    """The evidence fingerprint of a finding: the same for the sweep and the health watcher,
    so a device workflow keeps one evidence entry however many times either reports it. A
    node finding that says its GPUs vanished differs from one that does not (GPUs merely
    unhealthy or not offered), so the watcher sends a node's vanish after its notice."""
    state = f.taint.key + "=" + f.taint.value if f.taint else (f.health or "")
    if f.vanished:
        state += "vanished"
    return f"sweep:{f.kind}:{f.resource_id or f.key}:{state}"


def finding_launch(
    f: SweepFinding,
    *,
    now: datetime,
    trigger: Trigger,
    dry_run: bool,
    task_queue: str | None,
    cluster: str = "",
) -> LaunchRequest:
    """The signal-with-start request for one device finding (sweep and health watcher)."""
    assert f.node and f.gpu_uuid
    evidence = AlertEvidence(
        source="watch" if trigger == "watch" else "sweep",
        alertname=f"{trigger}-{f.kind}",
        fingerprint=finding_fingerprint(f),
        xid=f.xid,
        # HAMi's plugin registers a GPU unhealthy on the GPU's own failure (critical Xid).
        failure_class="unhealthy" if f.kind == "hami-health" else None,
        received_at=now,
        summary=f.message,
        labels={
            "resource_id": f.resource_id,
            "health": f.health or "",
            "pods": ",".join(f"{p.namespace}/{p.name}" for p in f.pods[:10]),
        },
        pod=f.pods[0] if f.pods else None,
    )
    return LaunchRequest(
        remediation=RemediationInput(
            device=DeviceRef(node=f.node, gpu_uuid=f.gpu_uuid),
            trigger=trigger,
            requested_by=f"sickbay-{trigger}",
            reason=f.message,
            dry_run=dry_run,
            cluster=cluster,
        ),
        evidence=evidence,
        task_queue=task_queue,
    )


@workflow.defn(name=WF_SWEEP)
class HealthSweepWorkflow:
    def __init__(self) -> None:
        self._result = SweepResult()

    @workflow.query(name="result")
    def result(self) -> SweepResult:
        return self._result

    @workflow.run
    async def run(self, inp: SweepInput) -> SweepResult:
        report = await self._sweep(
            SweepClusterInput(
                check_pods=inp.check_pods,
                check_slice_taints=inp.check_slice_taints,
                check_nodes=inp.check_nodes,
            )
        )
        self._result.unresolved = sorted({f.resource_id for f in report.unresolved})
        unknown = [f for f in report.findings if f.health == "Unknown"]
        await self._launch_all([f for f in report.findings if f.health != "Unknown"], inp)
        await self._node_incidents([f for f in report.nodes if f.vanished], inp)
        await self._notify_nodes([f for f in report.nodes if not f.vanished], inp)
        for f in report.unresolved:
            workflow.logger.warning("sweep: %s", f.message)
        await self._notify_unresolved(report.unresolved, inp)

        if unknown:
            # Unknown = the kubelet heard nothing from the driver for 30 s. Give it the
            # configured time to recover before treating it like Unhealthy.
            workflow.logger.info(
                "%d devices Unknown; re-checking in %s", len(unknown), inp.unknown_timeout
            )
            await workflow.sleep(inp.unknown_timeout)
            again = await self._sweep(
                SweepClusterInput(
                    check_pods=True,
                    check_slice_taints=False,
                    check_nodes=False,
                    only_unknown=[f.key for f in unknown],
                )
            )
            still = {f.key: f for f in again.findings}
            late: list[SweepFinding] = []
            for f in unknown:
                current = still.get(f.key)
                if current is None:
                    self._result.unknown_cleared.append(f.key)
                    continue
                if current.health == "Unknown":
                    current = current.model_copy(
                        update={
                            "message": f"{current.message} (Unknown for over {format_duration(inp.unknown_timeout)})"
                        }
                    )
                late.append(current)
            await self._launch_all(late, inp)
        return self._result

    async def _sweep(self, req: SweepClusterInput) -> SweepReport:
        return await execute(
            SWEEP_CLUSTER,
            req,
            start_to_close_timeout=SWEEP_TIMEOUT,
            retry_policy=SWEEP_RETRY,
        )

    async def _launch_all(self, findings: list[SweepFinding], inp: SweepInput) -> None:
        for start in range(0, len(findings), FAN_OUT):
            batch = findings[start : start + FAN_OUT]
            await asyncio.gather(*(self._launch(f, inp) for f in batch))

    async def _launch(self, f: SweepFinding, inp: SweepInput) -> None:
        req = finding_launch(
            f,
            now=workflow.now(),
            trigger="sweep",
            dry_run=inp.dry_run,
            task_queue=inp.task_queue,
            cluster=inp.cluster,
        )
        try:
            res = await execute(
                SIGNAL_WITH_START_REMEDIATION,
                req,
                start_to_close_timeout=LAUNCH_TIMEOUT,
                retry_policy=LAUNCH_RETRY,
            )
        except ActivityError as exc:
            workflow.logger.warning("could not launch remediation for %s: %s", f.key, exc.cause)
            return
        self._result.devices.append(f.key)
        (self._result.started if res.started else self._result.signalled).append(res.workflow_id)
        if res.started and inp.watcher:
            # The watcher signal-with-starts a device within seconds of its failure; a sweep
            # that has to start the workflow itself found something the watch missed.
            self._result.missed_by_watch.append(f.key)
            workflow.logger.warning("the health watcher missed %s (%s)", f.key, f.message)
            workflow.metric_meter().create_counter(
                "sickbay_sweep_missed_by_watch",
                "device failures the health sweep found that the health watcher had not launched",
            ).add(1)

    async def _node_incidents(self, nodes: list[SweepFinding], inp: SweepInput) -> None:
        """One node incident per node whose GPUs vanished (signalled when it runs)."""
        for f in nodes:
            assert f.node
            req = NodeLaunch(
                incident=NodeIncidentInput(
                    node=f.node,
                    cluster=inp.cluster,
                    trigger="sweep",
                    reason=f.message,
                    planned=f.planned,
                    expected_gpus=f.expected_gpus,
                    dry_run=inp.dry_run,
                    task_queue=inp.task_queue,
                ),
                task_queue=inp.task_queue,
            )
            try:
                res = await execute(
                    SIGNAL_WITH_START_NODE_INCIDENT,
                    req,
                    start_to_close_timeout=LAUNCH_TIMEOUT,
                    retry_policy=LAUNCH_RETRY,
                )
            except ActivityError as exc:
                workflow.logger.warning(
                    "could not start the node incident of %s: %s", f.node, exc.cause
                )
                continue
            self._result.node_incidents.append(res.workflow_id)

    async def _notify_nodes(self, nodes: list[SweepFinding], inp: SweepInput) -> None:
        for f in nodes:
            node = f.node or "?"
            incident = Incident(
                id=node_notice_workflow_id(node, inp.cluster),  # per node: channels dedup
                cluster=inp.cluster or None,
                device=f"{node}/nvidia.com/gpu",
                node=node,
                phase=Phase.ESCALATED,
                severity="warning",
                summary=f.message,
                needed=(
                    "check the node's GPUs and driver (nvidia-smi, device plugin / DRA "
                    "driver logs); Sickbay does not taint or drain for a missing GPU"
                ),
            )
            if await self._notify(incident, inp):
                self._result.notified_nodes.append(node)

    async def _notify_unresolved(self, unresolved: list[SweepFinding], inp: SweepInput) -> None:
        """A pod reports a sick device Sickbay cannot map to a GPU: it does nothing, loudly."""
        for f in unresolved:
            pod = f.pods[0] if f.pods else None
            where = f"{pod.namespace}/{pod.name}" if pod else (f.node or "?")
            incident = Incident(
                # One incident per pod and id: the next sweep's repeat is deduplicated.
                id=scoped(inp.cluster, f"unresolved-{where}-{f.resource_id}"),
                cluster=inp.cluster or None,
                device=f.resource_id or "?",
                node=f.node,
                phase=Phase.ESCALATED,
                severity="warning",
                reason="unresolved-health",
                summary=f.message,
                needed=(
                    f"find which GPU pod {where} holds and remediate it by hand "
                    "(`sickbay launch --device driver/pool/device`); Sickbay takes no action "
                    "on a health report it cannot tie to a device"
                ),
            )
            if await self._notify(incident, inp):
                self._result.notified_unresolved.append(f"{where} {f.resource_id}")

    async def _notify(self, incident: Incident, inp: SweepInput) -> bool:
        if not inp.notify_channels:
            workflow.logger.warning("no notify channel configured: %s", incident.summary)
        delivered = False
        for channel in inp.notify_channels:
            try:
                await execute(
                    SEND_NOTIFICATION,
                    NotifyInput(channel=channel, incident=incident),
                    start_to_close_timeout=NOTIFY_TIMEOUT,
                    retry_policy=NOTIFY_RETRY,
                )
                delivered = True
            except ActivityError as exc:
                workflow.logger.warning(
                    "notify %s about %s failed: %s", channel, incident.id, exc.cause
                )
        return delivered
