"""`sickbay-node-incident`: a node whose GPUs vanished, as one procedure beside the per-GPU
remediation (one run per node: `contract.names.node_workflow_id`).

    detected (watcher / sweep / person; more findings are signals into the same run)
      ▼
    diagnosing   diagnose-node-gpus: plugin pods, their Events, versions vs recorded and pool,
      │          validator, RuntimeClass; every plugin pod Ready (a kubelet restart's first
      │          seconds look so): diagnosed again after nodeIncident.settle, nothing touched;
      │          waiting: GPUs gone while the MIG manager repartitions them: diagnosed again
      │          every plannedGrace / 30 (at once on a finding naming no planned work),
      │          nothing touched; still under way after nodeIncident.plannedGrace: one
      │          page and a Node Event, then a look every hour until it is done; done with
      │          the GPUs back: the page resolved; done with them gone: on as below
      │          ──GPUs back already──▶ closed `recovered`
      │          dry run ──▶ closed `dry-run` (the diagnosis and what it would do)
      ▼
    containing   condition GPUDevicesAvailable=False (reason = cause), Sickbay's NoSchedule
      │          node taint (or cordon), Node Event GPUDevicesVanished with the diagnosis
      ▼
    healing      the runbook's node ladder, each rung verified by the GPUs coming back and
      │          validated (validation Job per GPU) before the node is used again:
      │          restart-plugin (pluginRestarts attempts, each once across crashes; a cause a
      │          restart cannot fix skips it), reboot / replace (repair.enabled + provider,
      │          the budget lease for the node's GPUs, a drain honouring PDBs)
      ├─ healed ─▶ releasing (condition True, taint / cordon undone, Event) ─▶ closed `healed`
      ▼
    escalated    one page with the diagnosis (one per pool with nodeIncident.poolIncident),
      │          the node stays contained; its GPU workloads evicted (nodeIncident.relocate:
      │          within the budget, PDBs honoured) so their owners start them elsewhere;
      │          replacing: their replacements followed as the remediation does (the shared
      │          workflows.replacement race under replacement.pendingDeadline); scaling:
      │          still Pending -> scaleUp within the budget lease for the node's GPUs, then
      │          the capacity deadline; still Pending (or scale-up off / refused / failed):
      │          the same page updated, naming them and the scheduler's words (no 2nd page);
      │          held until its GPUs come back (validated, then released: `healed`) or
      │          `abort` (containment undone: `aborted`)
"""

from __future__ import annotations

import asyncio
from datetime import timedelta
from typing import Any

from temporalio import workflow
from temporalio.exceptions import ActivityError, ApplicationError

with workflow.unsafe.imports_passed_through():
    from contract.base import format_duration
    from contract.budget import BudgetLeaseRequest, BudgetReleaseRequest
    from contract.capacity import NodePoolTarget
    from contract.kube import (
        CordonInput,
        CountDevicesInput,
        EventTarget,
        EvictPodsInput,
        OwnerRef,
        PodRef,
        RecordEventInput,
        ReplacementReport,
        WaitEvictionInput,
        WaitReplacementInput,
    )
    from contract.names import (
        NODE_TAINT_KEY,
        QRY_NODE_STATUS,
        QRY_TIMELINE,
        SIG_ABORT,
        SIG_NODE_FINDING,
        WF_NODE_INCIDENT,
        node_notice_workflow_id,
        scoped,
    )
    from contract.node_incident import (
        ContainNodeInput,
        DiagnoseNodeInput,
        GpuPodsInput,
        GpusBackResult,
        NodeDiagnosis,
        NodeFinding,
        NodeIncidentInput,
        NodeIncidentResult,
        NodeIncidentStatus,
        NodeRungAction,
        PluginPod,
        ReleaseNodeInput,
        RestartPluginInput,
        WaitGpusBackInput,
    )
    from contract.notify import Incident, NotifyInput
    from contract.remediation import AbortRequest, Phase
    from contract.repair_rungs import (
        CleanUpRepairJobInput,
        DrainPodsInput,
        MachineActionInput,
        RepairJobStarted,
        ValidationJobInput,
        WaitNodeGpusInput,
        WaitRepairJobInput,
    )
    from contract.runbook import (
        BudgetPolicy,
        NodeIncidentPolicy,
        RunbookSet,
        RunbookSpec,
        ValidationPolicy,
    )
    from workflows.node_incident.calls import NodeCalls
    from workflows.replacement import (
        capacity_error,
        capacity_refusal,
        capacity_request,
        pool_target,
        watch_replacements,
    )

ACTIVITY_FAILED = (ActivityError, ApplicationError)
# What a GPU plugin pod's containers wait on while it starts normally (no error: an image
# pulled, a sandbox made, init containers running).
STARTING_REASONS = frozenset({"", "ContainerCreating", "PodInitializing"})
# How a starting plugin pod's containers may have ended before: never, an init container that
# completed, or with the node (a reboot).
ENDED_NOT_CRASHED = frozenset({"", "Completed", "Unknown"})
# After the escalation the node is held until its GPUs come back: one wait per day (a poll
# activity: its retries add no history), so a node fixed by hand next week is still released.
HOLD_ROUND = timedelta(days=1)
# GPUs back while held but failing validation: look again after an hour, three times at most
# (a GPU that keeps failing is not validated in a loop; abort or a new incident takes over).
HELD_REVALIDATE = timedelta(hours=1)
MAX_HELD_VALIDATIONS = 3
EVENT_VANISHED = "GPUDevicesVanished"
EVENT_RESTORED = "GPUDevicesRestored"
EVENT_ESCALATED = "GPUNodeIncidentEscalated"
EVENT_PLANNED_STUCK = "GPUsMissingUnderPlannedWork"
# Looks at a node under planned work (a MIG repartition) per plannedGrace; after it (people
# told), one look an hour until the work is done. A finding naming no planned work (the
# watcher or the sweep saw it end) brings the next look forward.
PLANNED_LOOKS = 30
PLANNED_HELD_LOOK = timedelta(hours=1)
CAUSE_REASONS = {
    "toolkit-hook": "ContainerToolkitHookFailed",
    "nvml-missing": "NVMLNotLoaded",
    "plugin-crashloop": "PluginCrashLooping",
    "plugin-not-registered": "PluginNotRegistered",
    "plugin-not-ready": "PluginNotReady",
    "plugin-missing": "PluginMissing",
    "driver-not-publishing": "DriverNotPublishing",
    "unknown": "GPUsMissing",
}


class Aborted(Exception):
    pass


def pick_runbook(runbooks: RunbookSet) -> RunbookSpec:
    """The runbook named `default`, else the first one (no workload picks a node incident)."""
    for rb in runbooks.runbooks:
        if rb.metadata.name == "default":
            return rb.spec
    return runbooks.runbooks[0].spec if runbooks.runbooks else RunbookSpec()


@workflow.defn(name=WF_NODE_INCIDENT)
class NodeIncidentWorkflow:
    @workflow.init
    def __init__(self, inp: NodeIncidentInput) -> None:
        self._inp = inp
        self._status = NodeIncidentStatus(node=inp.node)
        self._timeline: list[str] = []
        self._abort: AbortRequest | None = None
        self._findings = 0
        self._unplanned = 0  # findings naming no planned work
        self._unplanned_seen = 0  # ... heard by the last diagnosis
        self._act = NodeCalls()
        self._diag: NodeDiagnosis | None = None
        self._lease = False
        self._leased = 0  # GPUs the lease holds
        self._paged: list[tuple[str, Incident]] = []

    # ---- messages ------------------------------------------------------------------------

    @workflow.signal(name=SIG_NODE_FINDING)
    def node_finding(self, finding: NodeFinding) -> None:
        self._findings += 1
        if not finding.planned:
            self._unplanned += 1
        if self._findings <= 3:  # the watcher and every sweep repeat it: note the first few
            self._log(f"finding from {finding.source}", finding.message)

    @workflow.signal(name=SIG_ABORT)
    def abort(self, req: AbortRequest) -> None:
        if self._abort is None:
            self._abort = req
            self._log("abort requested", f"{req.reason} [{req.actor}]")

    @workflow.query(name=QRY_NODE_STATUS)
    def status(self) -> NodeIncidentStatus:
        return self._status

    @workflow.query(name=QRY_TIMELINE)
    def timeline(self) -> list[str]:
        return list(self._timeline)

    # ---- helpers -------------------------------------------------------------------------

    def _log(self, action: str, outcome: str = "") -> None:
        at = workflow.now().strftime("%H:%M:%S")
        line = f"{at} {self._status.phase:<11} {action}" + (f" -> {outcome}" if outcome else "")
        self._timeline.append(line[:600])
        workflow.logger.info("node %s: %s", self._inp.node, line)

    def _enter(self, phase: str, rung: str = "", attempt: int = 0) -> None:
        self._status = self._status.model_copy(
            update={"phase": phase, "rung": rung, "attempt": attempt}
        )

    def _result(self, outcome: Any, summary: str, rung: str = "") -> NodeIncidentResult:
        self._enter("closed")
        self._log("closed", f"{outcome}: {summary}"[:300])
        d = self._diag
        return NodeIncidentResult(
            node=self._inp.node,
            outcome=outcome,
            cause=d.cause if d else "",
            rung=rung,
            summary=summary,
            diagnosis=d,
            timeline=list(self._timeline),
        )

    async def _interruptible(self, coro: Any) -> Any:
        """Await `coro` unless `abort` arrives first (then it is cancelled: Aborted)."""
        task = asyncio.ensure_future(coro)
        aborted = asyncio.ensure_future(workflow.wait_condition(lambda: self._abort is not None))
        await workflow.wait([task, aborted], return_when=asyncio.FIRST_COMPLETED)
        if task.done():
            aborted.cancel()
            return task.result()
        task.cancel()
        try:
            await task
        except BaseException:
            pass
        raise Aborted()

    async def _settle(
        self, policy: NodeIncidentPolicy, d: NodeDiagnosis
    ) -> NodeDiagnosis | NodeIncidentResult:
        """Look again before touching the node while what it shows may be passing: its GPU
        plugin pods starting (a node back from a reboot, a rollout: every `settle`, for up to
        `startGrace`), or every one Ready with the GPUs gone (a kubelet restart's first
        seconds: once). Returns the last diagnosis to act on, or the run's result: back by
        then (`recovered`, nothing touched) or aborted meanwhile."""
        if policy.settle <= timedelta(0):
            return d
        settle = format_duration(policy.settle)
        began = workflow.now()
        give_up = began + policy.start_grace
        settled_ready = looked = False
        while d.vanished:
            if _plugins_starting(d) and workflow.now() < give_up:
                self._log(
                    "plugin starting",
                    f"a GPU plugin pod is starting ({_starting_states(d)}): diagnosing again "
                    f"in {settle}, for up to {format_duration(policy.start_grace)}, before "
                    "touching the node (a node back from a reboot or a plugin rollout shows "
                    "its GPUs gone until the plugin registers)",
                )
            elif _plugins_starting(d):
                self._log(
                    f"plugin still starting after {format_duration(policy.start_grace)}",
                    f"{_starting_states(d)}: acting on the node",
                )
                break
            elif _plugins_ready(d) and not settled_ready:
                settled_ready = True
                self._log(
                    "settling",
                    f"every GPU plugin pod is Ready: diagnosing again in {settle} before "
                    "touching the node (a kubelet restart shows the GPUs gone until the "
                    "plugin registers again)",
                )
            elif not _plugins(d) and not settled_ready:
                settled_ready = True
                self._log(
                    "settling",
                    f"no GPU plugin pod on the node: diagnosing again in {settle} before "
                    "touching the node (a DaemonSet replacing its pod shows none for a moment)",
                )
            else:
                break
            try:
                await self._interruptible(workflow.sleep(policy.settle))
            except Aborted:
                assert self._abort is not None
                return self._result("aborted", self._abort.reason)
            looked = True
            d = await self._diagnose(policy)
        if looked and not d.vanished:
            waited = format_duration(
                timedelta(seconds=int((workflow.now() - began).total_seconds()))
            )
            return self._result("recovered", f"back within {waited}, nothing touched: {d.summary}")
        return d

    async def _planned(
        self, spec: RunbookSpec, d: NodeDiagnosis
    ) -> NodeDiagnosis | NodeIncidentResult:
        """GPUs gone while planned work holds them (the MIG manager repartitioning): look
        again every plannedGrace / 30 (at least `settle`) while it lasts, touching nothing.
        Done: the last diagnosis (acted on as any) or `recovered` if the GPUs are back. Still
        under way after plannedGrace: one page and a Node Event saying the GPUs are gone under
        it, the node left alone (the work may still be someone's), then a look every hour
        until it is done (the page resolved if the GPUs are back then)."""
        if not d.planned_work:
            return d
        policy = spec.node_incident
        grace = format_duration(policy.planned_grace)
        every = max(policy.settle, policy.planned_grace / PLANNED_LOOKS, timedelta(seconds=1))
        began = workflow.now()
        told = False
        self._enter("waiting")
        self._log(
            "planned work",
            f"{d.planned_work}, its GPUs gone meanwhile: diagnosing again every "
            f"{format_duration(every)}, for up to {grace}, touching nothing",
        )
        while d.planned_work:
            if not told and workflow.now() - began >= policy.planned_grace:
                told = True
                await self._planned_stuck(spec, d, grace)
            try:
                await self._interruptible(
                    workflow.wait_condition(
                        lambda: self._unplanned != self._unplanned_seen,
                        timeout=PLANNED_HELD_LOOK if told else every,
                    )
                )
            except TimeoutError:
                pass  # the next look
            except Aborted:
                assert self._abort is not None
                return self._result("aborted", self._abort.reason)
            d = await self._diagnose(policy)
        waited = format_duration(timedelta(seconds=int((workflow.now() - began).total_seconds())))
        self._log("planned work done", f"after {waited}: {d.summary}")
        if d.vanished:
            self._enter("diagnosing")
            return d
        await self._resolve_pages()
        return self._result(
            "recovered", f"back after the planned work ({waited}), nothing touched: {d.summary}"
        )

    async def _planned_stuck(self, spec: RunbookSpec, d: NodeDiagnosis, grace: str) -> None:
        """Planned work still under way after plannedGrace, the GPUs gone: say so once."""
        summary = (
            f"node {self._inp.node}: its GPUs are gone and {d.planned_work} for longer than "
            f"nodeIncident.plannedGrace ({grace}); Sickbay does not touch a node under planned "
            f"work, so it is not touched: {d.summary}"
        )
        self._enter("escalated")
        await self._page_once(
            spec,
            d,
            reason="planned-work-stuck",
            summary=summary,
            needed="check the GPU Operator's MIG manager on the node (its pod and logs, the "
            "nvidia.com/mig.config label it applies); once it is done, or its state label "
            "says failed, Sickbay diagnoses the node again and acts as for any lost GPU",
        )
        self._log("planned work not done", summary[:300])
        await self._event(EVENT_PLANNED_STUCK, summary)
        self._enter("waiting")

    async def _page_once(
        self,
        spec: RunbookSpec,
        d: NodeDiagnosis,
        *,
        reason: str,
        summary: str,
        needed: str,
        id: str = "",
    ) -> None:
        """One page on every escalation channel about this node (or its pool's `id`), each
        failure logged."""
        inp = self._inp
        incident = Incident(
            id=id or workflow.info().workflow_id,
            device=f"{inp.node}/nvidia.com/gpu",
            node=inp.node,
            node_pool=d.node_pool,
            cluster=inp.cluster or None,
            phase=Phase.ESCALATED,
            severity=spec.escalation.severity,
            reason=reason,
            summary=summary,
            done=[line.split(" ", 1)[1] for line in self._timeline[-8:]],
            needed=needed,
        )
        if not spec.escalation.channels:
            workflow.logger.warning("no escalation channel configured: %s", summary)
        for channel in spec.escalation.channels:
            try:
                await self._act.notify(NotifyInput(channel=channel, incident=incident))
                self._paged.append((channel, incident))
            except ACTIVITY_FAILED as err:
                self._log(f"page on {channel} failed", _why(err))

    async def _event(self, reason: str, message: str, etype: str = "Warning") -> None:
        try:
            await self._act.record_event(
                RecordEventInput(
                    targets=[EventTarget(api_version="v1", kind="Node", name=self._inp.node)],
                    reason=reason,
                    message=message[:1000],
                    type=etype,  # type: ignore[arg-type]
                    workflow_id=workflow.info().workflow_id,
                )
            )
        except ACTIVITY_FAILED as err:  # Events are best effort: the timeline has it
            self._log(f"event {reason} not written", str(err.cause or err)[:200])

    # ---- the procedure -------------------------------------------------------------------

    @workflow.run
    async def run(self, inp: NodeIncidentInput) -> NodeIncidentResult:
        wid = workflow.info().workflow_id
        self._log(f"detected by {inp.trigger}", inp.reason)
        spec = pick_runbook(await self._act.load_runbooks())
        policy = spec.node_incident
        if not policy.enabled:
            # As before the node procedure: people are told, Sickbay touches nothing; GPUs
            # gone under planned work (a MIG repartition) are waited for first, as with it on.
            if inp.planned:
                waited = await self._planned(spec, await self._diagnose(policy))
                if not isinstance(waited, NodeDiagnosis):
                    return waited  # back after it (told if it outlasted plannedGrace)
                if not waited.vanished:
                    return self._result("recovered", f"nothing to tell: {waited.summary}")
            notice = Incident(
                id=node_notice_workflow_id(inp.node, inp.cluster),
                cluster=inp.cluster or None,
                device=f"{inp.node}/nvidia.com/gpu",
                node=inp.node,
                phase=Phase.ESCALATED,
                severity="warning",
                summary=inp.reason or f"node {inp.node}: GPUs missing",
                needed="check the node's GPUs and driver (nvidia-smi, device plugin / DRA "
                "driver logs); the node procedure is off (nodeIncident.enabled)",
            )
            for channel in spec.escalation.channels:
                try:
                    await self._act.notify(NotifyInput(channel=channel, incident=notice))
                except ACTIVITY_FAILED as err:
                    self._log(f"notice on {channel} failed", _why(err))
            return self._result("disabled", "nodeIncident.enabled is off in the runbook")
        self._enter("diagnosing")
        d = await self._diagnose(policy)
        waited = await self._planned(spec, d)
        if not isinstance(waited, NodeDiagnosis):
            return waited
        looked = await self._settle(policy, waited)
        if not isinstance(looked, NodeDiagnosis):
            return looked
        d = looked
        if not d.vanished:
            return self._result("recovered", f"nothing to do: {d.summary}")
        if inp.dry_run or spec.dry_run:
            plan = ", ".join(policy.order) if d.restartable else "escalate (a restart cannot fix)"
            return self._result(
                "dry-run",
                f"would contain ({policy.contain}) and heal ({plan}); diagnosis: {d.summary}",
            )

        self._enter("containing")
        reason = CAUSE_REASONS.get(d.cause, "GPUsMissing")
        contained = await self._act.contain(
            ContainNodeInput(
                node=inp.node,
                workflow_id=wid,
                mode=policy.contain,
                reason=reason,
                message=d.summary,
            )
        )
        self._log("contained", contained.detail)
        await self._event(EVENT_VANISHED, d.summary)
        try:
            healed = await self._ladder(spec, d)
            if healed is not None:
                return await self._release(healed, "healed")
            return await self._escalate_and_hold(spec, d)
        except Aborted:
            assert self._abort is not None
            await self._undo()
            return self._result("aborted", self._abort.reason)

    async def _diagnose(self, policy: NodeIncidentPolicy) -> NodeDiagnosis:
        inp = self._inp
        self._unplanned_seen = self._unplanned
        d = await self._act.diagnose(
            DiagnoseNodeInput(
                node=inp.node,
                expected_gpus=inp.expected_gpus,
                recorded=inp.recorded,
                pool_window=policy.pool_window,
            )
        )
        self._diag = d
        self._status = self._status.model_copy(update={"cause": d.cause, "summary": d.summary})
        self._log("diagnosed", d.summary)
        for p in d.plugin_pods:
            state = "Ready" if p.ready else (p.waiting_reason or p.phase or "not Ready")
            self._log(
                f"pod {p.namespace}/{p.name}",
                f"{state}, {p.restarts} restart(s)"
                + (f"; {p.waiting_message[:160]}" if p.waiting_message else "")
                + (f"; events: {' | '.join(e[:120] for e in p.events[-2:])}" if p.events else ""),
            )
        return d

    # ---- the ladder ----------------------------------------------------------------------

    async def _ladder(self, spec: RunbookSpec, d: NodeDiagnosis) -> str | None:
        """The rung that brought the GPUs back (validated), or None: escalate."""
        policy = spec.node_incident
        expected = d.expected_gpus or max(len(d.gpu_uuids), 1)
        for rung in policy.order:
            if rung == "restart-plugin":
                if not d.restartable:
                    self._log(
                        "restart-plugin skipped",
                        f"a restart cannot fix this ({d.cause}): escalating with the diagnosis",
                    )
                    return None
                for attempt in range(1, policy.plugin_restarts + 1):
                    if await self._restart_rung(spec, attempt, expected):
                        return "restart-plugin"
                continue
            if await self._machine_rung(spec, rung, expected):
                return rung
        return None

    async def _restart_rung(self, spec: RunbookSpec, attempt: int, expected: int) -> bool:
        inp, wid = self._inp, workflow.info().workflow_id
        timeout = spec.node_incident.gpus_back_timeout
        self._enter("healing", "restart-plugin", attempt)
        since = workflow.now()
        # Keyed by this incident (the first run id): a later incident of the same node (same
        # workflow id) restarts again, a retried call of this attempt never does.
        incident = f"{wid}/{workflow.info().first_execution_run_id}"
        done = await self._interruptible(
            self._act.restart_plugin(
                RestartPluginInput(node=inp.node, workflow_id=incident, attempt=attempt)
            )
        )
        self._log(f"restart-plugin (attempt {attempt})", done.detail)
        if not done.restarted and not done.already:
            return False  # no plugin pod to restart: this rung cannot do anything
        return await self._verify(
            spec, f"restart-plugin attempt {attempt}", expected, since, timeout
        )

    async def _verify(
        self,
        spec: RunbookSpec,
        what: str,
        expected: int,
        since: Any,
        within: timedelta,
    ) -> bool:
        """The GPUs are published again within `within`, then each passes validation."""
        self._enter("verifying", self._status.rung, self._status.attempt)
        try:
            back: GpusBackResult = await self._interruptible(
                self._act.wait_gpus_back(
                    WaitGpusBackInput(node=self._inp.node, expected_gpus=expected, since=since),
                    limit=within,
                )
            )
        except ACTIVITY_FAILED as err:
            self._log(f"GPUs not back after {what} within {within}", _why(err))
            return False
        self._log(f"GPUs back after {what}", f"{len(back.gpu_uuids)} published")
        return await self._validate(spec, back, what)

    async def _start_validation(
        self,
        back: GpusBackResult,
        gpu: str,
        dev: str,
        policy: ValidationPolicy,
        incident: str,
        attempt: int,
    ) -> RepairJobStarted:
        wid = workflow.info().workflow_id
        pool, _, device = dev.partition("/")
        return await self._interruptible(
            self._act.start_validation(
                ValidationJobInput(
                    workflow_id=wid,
                    incident=f"{incident}/{self._status.rung}",
                    attempt=attempt,
                    mode="dra" if back.mode == "dra" else "device-plugin",
                    node=self._inp.node,
                    gpu_uuid=gpu,
                    driver=back.driver,
                    pool=pool or None,
                    device=device or None,
                    taint_key=NODE_TAINT_KEY,  # the validation pod tolerates our taint
                    image=policy.image,
                    command=policy.command,
                    level=policy.level,
                    timeout=policy.timeout,
                )
            )
        )

    async def _validate(self, spec: RunbookSpec, back: GpusBackResult, what: str) -> bool:
        policy = spec.validation
        if not policy.enabled:
            self._log("validation skipped", "validation.enabled is off")
            return True
        wid = workflow.info().workflow_id
        incident = f"{wid}/{workflow.info().first_execution_run_id}"
        attempt = max(self._status.attempt, 1)
        for gpu in back.gpu_uuids:
            dev = back.devices.get(gpu, "")
            try:
                started = await self._start_validation(back, gpu, dev, policy, incident, attempt)
            except ACTIVITY_FAILED as err:  # refused (Pod Security, allowlist, no namespace)
                self._log(f"validation of {gpu} not started", _why(err)[:200])
                return False
            try:
                outcome = await self._interruptible(
                    self._act.wait_job(
                        WaitRepairJobInput(namespace=started.namespace, job_name=started.job_name),
                        limit=policy.timeout,
                    )
                )
                passed, summary = outcome.passed, outcome.summary or outcome.reason
            except ACTIVITY_FAILED as err:
                passed, summary = False, _why(err)
            except GeneratorExit:
                # Dropped from the worker's cache, closed outside the workflow's loop: its
                # replay on the next worker cleans up; an activity cannot be scheduled here.
                raise
            except BaseException:
                await self._clean_up_validation(started)
                raise
            await self._clean_up_validation(started)
            self._log(f"validation of {gpu} {'passed' if passed else 'failed'}", summary[:200])
            if not passed:
                return False
        return True

    async def _clean_up_validation(self, started: RepairJobStarted) -> None:
        try:
            await self._act.clean_up_job(
                CleanUpRepairJobInput(
                    namespace=started.namespace,
                    job_name=started.job_name,
                    claim_name=started.claim_name,
                )
            )
        except ACTIVITY_FAILED as err:
            self._log("validation Job not cleaned up", _why(err))

    async def _machine_rung(self, spec: RunbookSpec, action: NodeRungAction, expected: int) -> bool:
        """reboot / replace through the node's provider, as the remediation's rungs: within
        the budget, after a drain; the GPUs back and validated."""
        inp, wid, d = self._inp, workflow.info().workflow_id, self._diag
        assert d is not None
        if not spec.repair.enabled:
            self._log(f"{action} skipped", "repair.enabled is off in the runbook")
            return False
        scale = spec.scale_up
        pool = scale.pool or (
            NodePoolTarget(
                provider=scale.provider, name=d.node_pool or inp.node, node_pool_label=d.node_pool
            )
            if scale.provider
            else None
        )
        if pool is None:
            self._log(f"{action} skipped", "no provider (scaleUp.pool / scaleUp.provider)")
            return False
        rung = spec.repair.reboot if action == "reboot" else spec.repair.replace
        self._enter("healing", action, 1)
        if not await self._lease_gpus(spec, expected, f"the {action}"):
            return False
        plan = await self._act.find_drain_pods(DrainPodsInput(node=inp.node))
        await self._act.cordon(CordonInput(node=inp.node, workflow_id=wid))
        if plan.pods:
            await self._act.evict_pods(
                EvictPodsInput(
                    pods=plan.pods,
                    workflow_id=wid,
                    reason=f"Sickbay: drained for the {action} of a node whose GPUs vanished",
                    retry_blocked_for=spec.eviction.timeout,
                )
            )
            report = await self._act.wait_eviction(
                WaitEvictionInput(pods=plan.pods, timeout=spec.eviction.timeout)
            )
            if report.remaining:
                names = ", ".join(f"{p.namespace}/{p.name}" for p in report.remaining)
                self._log(f"{action} not asked: drain incomplete", names)
                return False
        asked_at = workflow.now()
        call = self._act.reboot_node if action == "reboot" else self._act.replace_node
        try:
            done = await call(
                MachineActionInput(
                    workflow_id=wid, attempt=1, action=action, node=inp.node, pool=pool
                )
            )
        except ACTIVITY_FAILED as err:
            self._log(f"{action} failed", _why(err))
            return False
        self._log(f"{action} asked", done.detail or done.operation or pool.provider)
        try:
            back = await self._interruptible(
                self._act.wait_node_gpus(
                    WaitNodeGpusInput(
                        node=inp.node,
                        replaced=action == "replace",
                        node_pool=d.node_pool,
                        asked_at=asked_at,
                        expected_gpus=expected,
                    ),
                    limit=rung.timeout,
                )
            )
        except ACTIVITY_FAILED as err:
            self._log(
                f"node not back after the {action} within {format_duration(rung.timeout)}",
                _why(err),
            )
            return False
        if action == "replace" and back.node != inp.node:
            self._log("replaced", f"new node {back.node} with {len(back.gpu_uuids)} GPU(s)")
            return True  # a new node: its GPUs are new, validated by their own procedure
        return await self._verify(
            spec, action, expected, asked_at, spec.node_incident.gpus_back_timeout
        )

    async def _lease_gpus(self, spec: RunbookSpec, gpus: int, what: str) -> bool:
        """The blast-radius budget lease for `gpus` GPUs of the node, as the remediation's
        rungs take theirs: a larger ask extends the incident's lease (a refusal leaves it as
        it was); False, logged, when the budget refuses."""
        if self._lease and gpus <= self._leased:
            return True
        inp, d = self._inp, self._diag
        assert d is not None
        counts = await self._act.count_devices(CountDevicesInput(node_pool=d.node_pool))
        decision = await self._act.acquire_budget(
            BudgetLeaseRequest(
                holder=workflow.info().workflow_id,
                device_key=f"{inp.node}/nvidia.com/gpu",
                node_pool=d.node_pool,
                pool_limit=BudgetPolicy.limit(spec.budget.max_per_pool, counts.pool_devices),
                cluster_limit=BudgetPolicy.limit(
                    spec.budget.max_per_cluster, counts.cluster_devices
                ),
                observed_pool_quarantined=counts.pool_quarantined,
                observed_cluster_quarantined=counts.cluster_quarantined,
                gpus=gpus,
            )
        )
        if not decision.granted:
            self._log(f"{what} refused by the blast-radius budget", decision.reason)
            return False
        self._lease, self._leased = True, gpus
        self._log("budget lease", f"{gpus} GPU(s) for {what}")
        return True

    async def _relocate(self, spec: RunbookSpec, gpus: int) -> str:
        """The node stays broken: the pods holding its vanished GPUs are evicted (PDBs
        honoured, within the budget, never forced), so their controllers start them on other
        nodes (Sickbay's taint keeps them off this one), then their replacements are followed
        (`_follow`). Returns what the page must add ("" when nothing): the workloads still
        Pending, and why."""
        inp, wid = self._inp, workflow.info().workflow_id
        found = await self._act.find_gpu_pods(GpuPodsInput(node=inp.node))
        if not found.pods:
            self._log("no workload holds the node's GPUs")
            return ""
        names = ", ".join(f"{p.namespace}/{p.name}" for p in found.pods)
        # The disruption is the workloads moved: one GPU's worth per pod, at most the node's.
        if not await self._lease_gpus(spec, min(len(found.pods), gpus), "moving the workloads"):
            self._log("workloads left in place", names)
            return ""
        timeout = spec.eviction.timeout
        self._enter("relocating")
        await self._interruptible(
            self._act.evict_pods(
                EvictPodsInput(
                    pods=found.pods,
                    workflow_id=wid,
                    reason="Sickbay: the node's GPUs vanished; started elsewhere by its owner",
                    retry_blocked_for=timeout,
                )
            )
        )
        report = await self._interruptible(
            self._act.wait_eviction(WaitEvictionInput(pods=found.pods, timeout=timeout))
        )
        left = ", ".join(f"{p.namespace}/{p.name}" for p in report.remaining)
        self._log(
            "workloads evicted",
            f"{len(report.gone)} gone" + (f"; still there (PDB): {left}" if left else ""),
        )
        gone = {(p.namespace, p.name) for p in report.gone}
        bare = [p for p in found.bare if (p.namespace, p.name) in gone]
        if bare:
            self._log(
                "no owner: nothing starts them again",
                ", ".join(f"{p.namespace}/{p.name}" for p in bare),
            )
        if not found.owners or not report.gone:
            return ""
        return await self._follow(spec, found.owners, report.gone, gpus)

    async def _follow(
        self, spec: RunbookSpec, owners: list[OwnerRef], gone: list[PodRef], gpus: int
    ) -> str:
        """The evicted workloads' replacements, followed as the per-GPU remediation follows
        its own (`workflows.replacement`): watched under `replacement.pendingDeadline`; still
        Pending then, the runbook's `scaleUp` within the budget (a lease for the node's GPUs,
        the capacity the new node brings back) and the capacity deadline. Returns "" when
        they run (or none is needed), else what the page must say."""
        inp, d, wid = self._inp, self._diag, workflow.info().workflow_id
        assert d is not None
        self._enter("replacing")
        watch = WaitReplacementInput(
            owners=owners,
            old_pods=gone,
            churn_evictions=spec.replacement.churn_evictions,
        )
        owned = ", ".join(f"{o.kind} {o.namespace}/{o.name}" for o in owners)
        pending_deadline = spec.replacement.pending_deadline
        self._log(
            "following the replacements",
            f"{owned} (Pending deadline {format_duration(pending_deadline)})",
        )
        report = await self._watch(watch, pending_deadline, "Pending")
        if report.status != "pending":
            return self._followed(report)
        waited = f"still Pending at the Pending deadline ({format_duration(pending_deadline)})"
        scale = spec.scale_up
        why = ""
        if not scale.enabled:
            why = "scale-up is off (scaleUp.enabled)"
        elif scale.provider == "karpenter":
            why = (
                "scaleUp.provider is karpenter: Karpenter provisions for Pending pods itself and "
                "the node incident raises no NodePool limit"
            )
        elif scale.approval:
            why = (
                "the scale-up needs approval (scaleUp.approval), which the node incident does "
                "not ask for: nothing was scaled"
            )
        elif not await self._lease_gpus(spec, gpus, "the scale-up"):
            why = "the scale-up was refused by the blast-radius budget"
        if why:
            return self._pending(report, "pending-deadline", f"{waited}; {why}")
        pool = pool_target(scale, inp.node, d.node_pool)
        self._enter("scaling")
        try:
            result = await self._interruptible(
                self._act.request_capacity(
                    capacity_request(
                        scale, pool, wid, f"{wid}-{workflow.info().first_execution_run_id}-scale"
                    )
                )
            )
        except ACTIVITY_FAILED as err:
            kind = capacity_error(_error_type(err))
            return self._pending(
                report, kind, f"{waited}; the scale-up of pool {pool.name} failed: {_why(err)}"
            )
        self._log(
            "capacity requested",
            f"{result.status}: pool {pool.name} size {result.current_size} -> "
            f"{result.target_size}" + (f"; {result.message}" if result.message else ""),
        )
        refusal = capacity_refusal(result, pool, scale)
        if refusal is not None:
            return self._pending(report, refusal[0], f"{waited}; {refusal[1]}")
        capacity_deadline = scale.capacity_deadline
        after = await self._watch(watch, capacity_deadline, "capacity")
        if after.status != "pending":
            return self._followed(after)
        return self._pending(
            after,
            "no-capacity",
            f"still Pending at the capacity deadline ({format_duration(capacity_deadline)} "
            f"after the scale-up of pool {pool.name})",
        )

    async def _watch(
        self, watch: WaitReplacementInput, deadline: timedelta, name: str
    ) -> ReplacementReport:
        """One wait under a deadline timer (the shared race); abort ends it (Aborted)."""
        end = workflow.now() + deadline
        report: ReplacementReport = await self._interruptible(
            watch_replacements(self._act.wait_replacement, watch, deadline, lambda: end, name)
        )
        return report

    def _followed(self, report: ReplacementReport) -> str:
        """The replacements ran (or none was needed), or churn: logged; churn is said."""
        if report.status == "churn":
            diag = report.churn.diagnosis if report.churn else "repeated evictions"
            self._log("replacements churn", diag)
            return f"the evicted workloads' replacements churn: {diag}"
        where = ", ".join(
            f"{p.pod.namespace}/{p.pod.name} on {p.node}"
            for p in report.pods
            if p.phase == "Running" and p.node
        )
        self._log(
            "replacements Running elsewhere"
            if report.status == "running"
            else "no replacement needed",
            where,
        )
        return ""

    def _pending(self, report: ReplacementReport, kind: str, why: str) -> str:
        """The Pending replacements named with the scheduler's words: logged, for the page."""
        pods = [p for p in report.pods if p.phase == "Pending"]
        names = "; ".join(
            f"{p.pod.namespace}/{p.pod.name}" + (f" ({p.message[:200]})" if p.message else "")
            for p in pods[:8]
        ) + (f" and {len(pods) - 8} more" if len(pods) > 8 else "")
        text = f"{kind}: workloads {why}: {names or 'none listed'}" + (
            f"; scheduler: {report.unschedulable_message[:300]}"
            if report.unschedulable_message
            else ""
        )
        self._log("replacements still Pending", text)
        return text

    # ---- endings -------------------------------------------------------------------------

    async def _release(self, rung: str, outcome: Any) -> NodeIncidentResult:
        inp, wid = self._inp, workflow.info().workflow_id
        self._enter("releasing", rung)
        done = await self._act.release(
            ReleaseNodeInput(node=inp.node, workflow_id=wid, message=f"GPUs back after {rung}")
        )
        self._log("released", done.detail)
        if self._lease:
            await self._act.release_budget(
                BudgetReleaseRequest(holder=wid, device_key=f"{inp.node}/nvidia.com/gpu")
            )
        await self._event(EVENT_RESTORED, f"the node's GPUs are back after {rung}", "Normal")
        await self._resolve_pages()
        return self._result(outcome, f"GPUs back after {rung}", rung=rung)

    async def _resolve_pages(self) -> None:
        """Resolve every page this incident sent (each failure logged)."""
        for channel, incident in self._paged:
            try:
                await self._act.notify(
                    NotifyInput(channel=channel, action="resolve", incident=incident)
                )
            except ACTIVITY_FAILED as err:
                self._log(f"page on {channel} not resolved", _why(err))

    async def _undo(self) -> None:
        inp, wid = self._inp, workflow.info().workflow_id
        done = await self._act.release(
            ReleaseNodeInput(node=inp.node, workflow_id=wid, message="node incident aborted")
        )
        self._log("containment undone", done.detail)
        if self._lease:
            await self._act.release_budget(
                BudgetReleaseRequest(holder=wid, device_key=f"{inp.node}/nvidia.com/gpu")
            )

    async def _update_page(self, pending: str) -> None:
        """The incident's page (the one sent: same id, same dedup key, so no second page)
        updated with the workloads still Pending and why."""
        if not self._paged:
            workflow.logger.warning("no page to update: %s", pending)
        updated: list[tuple[str, Incident]] = []
        for channel, incident in self._paged:
            now = incident.model_copy(
                update={
                    "summary": f"{incident.summary}; {pending}"[:1500],
                    "done": [line.split(" ", 1)[1] for line in self._timeline[-8:]],
                    "needed": f"{incident.needed}; GPU capacity elsewhere for the Pending "
                    "workloads (scale the pool, free GPUs), or they wait",
                }
            )
            try:
                await self._act.notify(NotifyInput(channel=channel, incident=now))
                updated.append((channel, now))
                self._log(f"page on {channel} updated", "workloads still Pending")
            except ACTIVITY_FAILED as err:
                updated.append((channel, incident))
                self._log(f"page on {channel} not updated", _why(err))
        self._paged = updated

    async def _escalate_and_hold(self, spec: RunbookSpec, d: NodeDiagnosis) -> NodeIncidentResult:
        inp, wid = self._inp, workflow.info().workflow_id
        policy = spec.node_incident
        self._enter("escalated")
        pool_nodes = sorted({inp.node, *d.pool_vanished})
        as_pool = policy.pool_incident and d.node_pool and len(pool_nodes) >= policy.pool_nodes
        if as_pool:
            incident_id = scoped(inp.cluster, f"pool-gpus-{d.node_pool}")
            summary = (
                f"pool {d.node_pool}: {len(pool_nodes)} nodes lost their GPUs "
                f"({', '.join(pool_nodes)}); {d.summary}"
            )
        else:
            incident_id = wid
            summary = d.summary
        needed = (
            "fix the node's GPU software (container toolkit / driver / plugin matching the new "
            "kubelet and runtime), or roll the upgrade back; Sickbay keeps the node tainted and "
            "releases it once its GPUs are back and validated"
        )
        await self._page_once(
            spec, d, reason="gpus-vanished", summary=summary, needed=needed, id=incident_id
        )
        self._log("escalated" + (" as a pool incident" if as_pool else ""), summary[:300])
        await self._event(EVENT_ESCALATED, summary)
        expected = d.expected_gpus or max(len(d.gpu_uuids), 1)
        if policy.relocate:
            pending = await self._relocate(spec, expected)
            if pending:
                await self._update_page(pending)
        validations = 0
        while True:
            self._enter("held")
            if validations >= MAX_HELD_VALIDATIONS:
                self._log(
                    f"{validations} validations failed while held",
                    "no more tries: held until abort (people were told)",
                )
                await self._interruptible(workflow.wait_condition(lambda: False))
            since = workflow.now()
            try:
                back = await self._interruptible(
                    self._act.wait_gpus_back(
                        WaitGpusBackInput(node=inp.node, expected_gpus=expected, since=since),
                        limit=HOLD_ROUND,
                    )
                )
            except ACTIVITY_FAILED:
                continue  # still gone: another round (people were told once)
            self._log("GPUs back while held", f"{len(back.gpu_uuids)} published")
            self._enter("verifying", "by hand", self._status.attempt + 1)
            if await self._validate(spec, back, "the fix by hand"):
                return await self._release("a fix by hand", "healed")
            validations += 1
            self._enter("held")
            await self._interruptible(workflow.sleep(HELD_REVALIDATE))


def _error_type(err: BaseException) -> str | None:
    """The type of the innermost ApplicationError of a failed call."""
    cause: BaseException | None = err
    while cause is not None and not isinstance(cause, ApplicationError):
        cause = getattr(cause, "cause", None)
    return cause.type if isinstance(cause, ApplicationError) else None


def _why(err: BaseException) -> str:
    """The innermost reason of a failed call (a poll's last StillWaiting says what it waited
    for)."""
    cause: BaseException | None = err
    while cause is not None and not isinstance(cause, ApplicationError):
        cause = getattr(cause, "cause", None)
    return str(cause or err)[:300]


def _plugins_starting(d: NodeDiagnosis) -> bool:
    """A GPU plugin pod on the node is starting (`_starting`: ContainerCreating,
    PodInitializing, init containers at work), as after a node reboot or in a rollout; none
    failing (a failing one is acted on)."""
    plugins = _plugins(d)
    return any(_starting(p) for p in plugins) and not any(
        not p.ready and not _starting(p) for p in plugins
    )


def _starting(p: PluginPod) -> bool:
    """Not Ready, waiting on nothing that is an error, and its last container end no crash:
    none, an init container that completed, or one that ended with the node (a reboot: the
    kubelet reports reason Unknown, exit code 255, and counts a restart)."""
    return (
        not p.ready
        and p.waiting_reason in STARTING_REASONS
        and p.last_terminated_reason.split(":", 1)[0] in ENDED_NOT_CRASHED
    )


def _starting_states(d: NodeDiagnosis) -> str:
    return ", ".join(
        f"{p.name} {p.waiting_reason or p.phase or 'not Ready'}"
        for p in d.plugin_pods
        if p.component != "validator" and _starting(p)
    )


def _plugins(d: NodeDiagnosis) -> list[PluginPod]:
    """The node's GPU plugin pods (the validator registers no GPU)."""
    return [p for p in d.plugin_pods if p.component != "validator"]


def _plugins_ready(d: NodeDiagnosis) -> bool:
    """Every GPU plugin pod on the node is Ready (and there is one)."""
    plugins = _plugins(d)
    return bool(plugins) and all(p.ready for p in plugins)
