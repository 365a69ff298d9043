"""`remediate-gpu-device`: one durable remediation per physical GPU.

The state machine is drawn in the package docstring (workflows/remediation/__init__.py).

`abort` interrupts any wait: what Sickbay did is undone (rule removed, lease released) and the
remediation closes as `aborted`. One escalation per incident; a step that needs people returns
an `Escalation` (never raises): the run escalates, then holds the device if it is quarantined,
else closes. Non-retryable activity errors end in escalation too.

The steps live beside this file (confirm, guard, approval, quarantine, replace, escalation,
hold); `state.RemediationState` is the one state (status query, continue-as-new carry), in
parts each written by its owner (`state.OWNERS`): a signal handler here keeps only the abort
and the repaired mark (`inbox`) and tells every other message to the module that owns it
(`guard.slot_freed`, `pause.pause_told`, `approval.decided`, ...). `calls.Calls` are the typed
activity calls, `journal.Journal` the timeline, phase, search attributes and Kubernetes Events.

Not sandboxed: the sandbox re-imports (and, without bytecode files, recompiles) these modules
for every run, ~15-20 ms of worker CPU before the first step of each remediation (measured:
alert -> rule p50 61 -> 44 ms). Determinism is kept the same ways: the package imports only
stdlib, temporalio and the contract (lint-imports), time/ids/randomness come from
workflow.now()/uuid4(), and the recorded histories replay (tests/workflows/test_replay).
Versioning: nothing is released yet, so a change to the command sequence changes the code and
re-records tests/histories/ (docs/architecture.md, "Workflow versioning").
"""

from __future__ import annotations

from typing import Any, TypeVar

from temporalio import workflow
from temporalio.exceptions import ApplicationError

with workflow.unsafe.imports_passed_through():
    from pydantic import BaseModel, ValidationError

with workflow.unsafe.imports_passed_through():
    from contract.base import input_problems
    from contract.budget import PauseNotice
    from contract.errors import ERR_UNVERIFIED_ACTOR
    from contract.ledger import UnretireNotice
    from contract.names import (
        QRY_STATUS,
        QRY_TIMELINE,
        SIG_ABORT,
        SIG_ALERT,
        SIG_ALERT_RESOLVED,
        SIG_ALERTS,
        SIG_BUDGET_FREED,
        SIG_CLUSTER_PAUSED,
        SIG_GPU_UNRETIRED,
        SIG_REPAIRED,
        UPD_APPROVE,
        UPD_EXTEND_DEADLINE,
        WF_REMEDIATE,
    )
    from contract.remediation import (
        AbortRequest,
        AlertEvidence,
        AlertResolved,
        ApprovalDecision,
        ApprovalResult,
        ExtendDeadlineRequest,
        ExtendDeadlineResult,
        Phase,
        RemediationInput,
        RemediationResult,
        RemediationStatus,
        RepairedRequest,
        TimelineEntry,
    )
    from workflows.identity import sender_identity
    from workflows.remediation import (
        actors,
        approval,
        confirm,
        escalation,
        guard,
        hold,
        lease,
        lemons,
        pause,
        quarantine,
        repair,
        replace,
    )
    from workflows.remediation.calls import ACTIVITY_FAILED, Aborted
    from workflows.remediation.context import Remediation
    from workflows.remediation.outcome import Closed, Escalation, InputRefused
    from workflows.remediation.state import RemediationState

M = TypeVar("M", bound=BaseModel)


@workflow.defn(name=WF_REMEDIATE, sandboxed=False)
class DeviceRemediationWorkflow:
    @workflow.init
    def __init__(self, raw: Any = None) -> None:
        # The input is decoded here, not by the SDK: a payload the SDK cannot decode fails the
        # workflow *task* on every retry, so a mistyped Web UI launch would stay Running
        # forever under the device's id, swallowing its alerts. Bad input instead fails the
        # run at once (in `run`), naming the field; the next trigger starts a fresh run.
        try:
            inp, error = RemediationInput.model_validate(raw), None
        except ValidationError as err:
            inp, error = RemediationState.invalid_input(), input_problems(err, RemediationInput)
        self._r = r = Remediation.of(RemediationState.from_input(inp, error))
        if inp.resume is None:
            r.j.add_alerts(inp.alerts, initial=True)
        if error is None:
            workflow.set_current_details(r.j.details())

    # ---------------------------------------------------------------- run ------------------

    @workflow.run
    async def run(self, raw: Any = None) -> RemediationResult:
        r = self._r
        if r.s.input_error is not None:
            raise r.j.refuse_input(r.s.input_error)
        if r.s.inp.resume is None and r.s.inp.trigger in ("manual", "ui"):
            await self._launched()
        try:
            ended = await self._procedure()
        except Aborted:
            ended = await hold.undo_after_abort(r)
        except InputRefused as refused:  # a launch naming what the cluster has not got
            raise r.j.refuse_input(str(refused)) from None
        await lemons.recorded(r)  # never closed with the ledger's answer still on its way
        return await r.j.close(ended)

    async def _launched(self) -> None:
        """A person's launch: who, verified (`sickbay launch --via`, its signature checked
        like any verified action's) or the claimed `requested_by`, unverified."""
        r = self._r
        inp = r.s.inp
        who = await actors.sender(r, "launch", inp, inp.requested_by)
        r.j.log_sent("launch", "launched", who.actor, inp.reason, who)

    async def _procedure(self) -> Closed:
        r = self._r
        resume = r.s.inp.resume
        if resume is not None and not resume.waiting_for_budget:
            r.j.log("continued as new", outcome="holding")
            return await hold.hold_and_release(r)
        if resume is not None:
            # Weeks may have passed: confirm afresh (evidence, consumers, runbook), then ask
            # for the lease again; still escalated, so no second page.
            r.j.log("continued as new", outcome="waiting for budget")
        try:
            return await self._steps()
        except ACTIVITY_FAILED as err:  # a step failed for good: escalate, never fail the run
            return await self._ended(await escalation.step_failed(r, err))

    async def _steps(self) -> Closed:
        """The procedure, in the README's steps; a step returns how it ended early."""
        r = self._r
        confirmed = await confirm.confirm(r)  # 1. confirm, 2. resolve the consumers
        if isinstance(confirmed, Closed):
            return confirmed
        # The failure goes into the GPU ledger meanwhile (lemons: retired or not); only the
        # repair ladder, the escalation and the hold wait for its answer.
        lemons.start_recording(r, confirmed.counts, confirmed.counts_why)
        ended: Escalation | Closed | None = await guard.guard(r, confirmed.early)  # 3. budget
        if ended is None and r.s.spec.approval.required:
            ended = await approval.approval(r)  # 4. approval
        ended = ended or await quarantine.quarantine(r)  # 5. quarantine
        await r.j.events_written()  # the confirmed Event is in, whatever ended the steps
        ended = ended or await replace.evict_and_replace(r)  # 6. evict, 7. replace, 8. scale
        await lemons.recorded(r)
        ended = ended or await repair.repair(r)  # 9. repair ladder + validation -> release
        return await self._ended(ended)  # 10. escalate, 11. hold and release

    async def _ended(self, ended: Escalation | Closed | None) -> Closed:
        """Escalate when a step asked to; hold a quarantined device; else close (the budget
        lease given back)."""
        r = self._r
        await lemons.recorded(r)
        if not isinstance(ended, Closed):
            ended = lemons.rma(r, ended)  # a retired GPU: the one RMA escalation
        if isinstance(ended, Escalation):
            await escalation.escalate(r, ended)
            if r.s.quarantine.result is None:
                ended = Closed("escalated", ended.summary)
        if isinstance(ended, Closed):
            await lease.release_lease(r)
            return ended
        return await hold.hold_and_release(r)

    # ---------------------------------------------------------------- messages -------------

    @workflow.signal(
        name=SIG_ALERT, description="internal: more evidence, sent by the webhook, sweep and CLI"
    )
    def alert(self, evidence: AlertEvidence) -> None:
        self._r.j.add_alerts([evidence])

    @workflow.signal(
        name=SIG_ALERTS, description="internal: several alerts at once, sent by the webhook"
    )
    def alert_batch(self, evidence: list[AlertEvidence]) -> None:
        """Several alerts in one signal (the webhook coalesces a storm's deliveries for one
        workflow): each is handled exactly as its own `alert` signal would be."""
        for one in evidence:
            self._r.j.add_alerts([one])

    @workflow.signal(
        name=SIG_ALERT_RESOLVED, description="internal: Alertmanager resolved the alert (webhook)"
    )
    def alert_resolved(self, resolved: AlertResolved) -> None:
        guard.alert_resolved(self._r)
        self._r.j.log(
            "alert resolved",
            outcome=resolved.alertname or resolved.fingerprint,
            actor="alertmanager",
            client_identity=sender_identity(),
        )

    @workflow.signal(
        name=SIG_BUDGET_FREED,
        description="internal: sent by the sickbay-budget workflow when a slot frees; not for people",
    )
    def budget_freed(self) -> None:
        """From sickbay-budget: a slot freed while this remediation waits for one."""
        guard.slot_freed(self._r)

    @workflow.signal(
        name=SIG_CLUSTER_PAUSED,
        description="internal: sent by the sickbay-budget workflow on `sickbay pause` / "
        "`sickbay resume`; not for people",
    )
    def cluster_paused(self, notice: PauseNotice) -> None:
        """From sickbay-budget: the cluster is paused (hold before the next eviction force,
        scale-up or repair rung) or resumed (no pause)."""
        pause.pause_told(self._r, notice.pause)

    @workflow.signal(
        name=SIG_GPU_UNRETIRED,
        description="internal: sent by the GPU ledger when a person un-retires this GPU",
    )
    def gpu_unretired(self, notice: UnretireNotice) -> None:
        lemons.unretired(self._r, notice)

    @workflow.signal(
        name=SIG_ABORT,
        description='for people: stop and undo the quarantine. Input: {"reason": "why", "actor": "you"}',
    )
    async def abort(self, raw: Any = None) -> None:
        s = self._r.s
        req = self._message(SIG_ABORT, AbortRequest, raw)
        if req is None or s.inbox.abort is not None:
            return
        who = await actors.sender(self._r, "abort", req, req.actor)
        if s.inbox.abort is None:  # not taken meanwhile (the check above may have waited)
            s.inbox.abort = req
            self._r.j.log_sent("abort", "abort requested", who.actor, req.reason, who)

    @workflow.signal(
        name=SIG_REPAIRED,
        description='for people: the GPU is repaired, release it. Input: {"actor": "you", "note": "what was done"}',
    )
    async def repaired(self, raw: Any = None) -> None:
        s = self._r.s
        req = self._message(SIG_REPAIRED, RepairedRequest, raw)
        if req is None or s.inbox.repaired is not None:
            return
        who = await actors.sender(self._r, "repaired", req, req.actor)
        refused = actors.refusal(self._r, who, "repaired")
        if refused is not None:
            actors.log_refused(self._r, who, "repaired", refused)
            return
        if s.inbox.repaired is None:
            s.inbox.repaired = req
            self._r.j.log_sent("repaired", "marked repaired", who.actor, req.note, who)
            if s.ledger.retired:
                self._r.j.log("repair noted", reason="the GPU is retired: un-retire it first")
            elif s.hold.health_only:
                hold.note_repair(self._r)

    def _message(self, name: str, model: type[M], raw: Any) -> M | None:
        """Decode a signal typed by a person (Web UI): the SDK would drop an undecodable one
        with only a worker log line; here the refusal, naming the field, is in the timeline,
        with the actor the signal claims (as sent, even when not a string) and the Temporal
        client identity the server recorded."""
        try:
            return model.model_validate(raw)
        except ValidationError as err:
            problems = input_problems(err, model)
            claimed = raw.get("actor") if isinstance(raw, dict) else None
            actor = claimed if isinstance(claimed, str) and claimed else "unknown"
            if claimed is not None and not isinstance(claimed, str):
                actor = repr(claimed)
            self._r.j.log(
                f"{name} signal refused",
                outcome="invalid input",
                actor=actor,
                reason=problems,
                client_identity=sender_identity() or "unknown",
            )
            workflow.logger.warning("%s signal refused (actor %s): %s", name, actor, problems)
            return None

    @workflow.update(
        name=UPD_APPROVE,
        description='for people, while awaiting-approval. Input: {"approve": true, "actor": "you", "reason": "why"}',
    )
    async def approve(self, raw: Any = None) -> ApprovalResult:
        decision = self._update_input(UPD_APPROVE, ApprovalDecision, raw)
        action = "approve" if decision.approve else "reject"
        s = self._r.s
        who = await actors.sender(self._r, action, decision, decision.actor)
        refused = actors.refusal(self._r, who, action)
        if refused is not None:
            actors.log_refused(self._r, who, action, refused)
            raise ApplicationError(refused, type=ERR_UNVERIFIED_ACTOR, non_retryable=True)
        # The check may have waited for the worker: the decision may be taken or moot now.
        if s.approval.decision is not None:
            raise ApplicationError("already decided by " + self._r.j.who("decision"))
        if s.status.phase is not Phase.AWAITING_APPROVAL:
            raise ApplicationError(
                f"nothing to approve: the remediation is {s.status.phase.value} now"
            )
        approval.decided(self._r, decision)
        self._r.j.log_sent(
            "decision",
            "approved" if decision.approve else "rejected",
            who.actor,
            decision.reason,
            who,
        )
        return ApprovalResult(accepted=True, phase=s.status.phase)

    @approve.validator
    def _validate_approve(self, raw: Any = None) -> None:
        self._update_input(UPD_APPROVE, ApprovalDecision, raw)
        s = self._r.s
        if s.status.phase is not Phase.AWAITING_APPROVAL:
            raise ValueError(
                f"nothing to approve: the remediation is {s.status.phase.value}, "
                "not awaiting-approval"
            )
        if s.approval.decision is not None:
            raise ValueError("already decided by " + self._r.j.who("decision"))

    @workflow.update(
        name=UPD_EXTEND_DEADLINE,
        description="for people, while waiting for replacements: move the Pending (or capacity) "
        'deadline. Input: {"by": "30m", "reason": "why", "actor": "you"} or {"until": "<ISO time>", ...}',
    )
    async def extend_deadline(self, raw: Any = None) -> ExtendDeadlineResult:
        req = self._update_input(UPD_EXTEND_DEADLINE, ExtendDeadlineRequest, raw)
        who = await actors.sender(self._r, "extend", req, req.actor)
        try:  # the check may have waited for the worker: the wait may be over now
            return replace.extend_deadline(self._r, req, who)
        except ValueError as err:
            raise ApplicationError(str(err)) from None

    @extend_deadline.validator
    def _validate_extend(self, raw: Any = None) -> None:
        req = self._update_input(UPD_EXTEND_DEADLINE, ExtendDeadlineRequest, raw)
        replace.check_extension(self._r, req)

    @staticmethod
    def _update_input(name: str, model: type[M], raw: Any) -> M:
        """Decode an update typed by a person (Web UI): taken raw, so a bad input is refused by
        the validator naming the field and the problem (the SDK's own decoding would refuse it
        as a bare "Failed decoding arguments", the reason hidden in a cause the UI never shows)."""
        try:
            return model.model_validate(raw)
        except ValidationError as err:
            problems = input_problems(err, model)
            raise ValueError(f"invalid {name} input: {problems}") from None

    @workflow.query(name=QRY_TIMELINE, description="the ordered timeline of decisions")
    def timeline(self) -> list[TimelineEntry]:
        return self._r.s.journal.timeline

    @workflow.query(name=QRY_STATUS, description="phase, what it waits for, until when, next")
    def status(self) -> RemediationStatus:
        return self._r.s.status
