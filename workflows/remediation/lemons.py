"""Lemons: the GPU's failure ledger (`sickbay-gpu-ledger`, through the record-gpu-failure /
record-gpu-repair activities) and retirement.

After the failure is confirmed, the remediation records it while it goes on (`start_recording`):
the budget guard, an approval and the quarantine never wait for the ledger, whose one workflow
answers every failure of the cluster (a burst of 200 failures is 200 records). The steps that
read its answer wait for it first (`recorded`): the repair ladder, the escalation and the hold.
A record is idempotent per incident: the
workflow id and its first run's id, carried, so a continue-as-new that confirms afresh records nothing
twice). A GPU the ledger calls retired (`lemons.failures` within `lemons.window`):

- stays quarantined: the hold waits for a person to un-retire it (`sickbay gpus unretire`, which
  makes the ledger send `gpu-unretired`); no cool-down release, no `repaired` release, and no
  repair ladder (`repair_allowed`);
- is escalated once, asking for an RMA with its ledger history: the one incident the ledger
  names (`rma_due`) pages `gpu-retired`, or adds the RMA request to the escalation it was going
  to send anyway; a later incident of the same retired GPU (a repeat alert after an abort)
  holds it without paging again.

The ledger being unreachable changes nothing else: the remediation goes on as for a first
failure, and says so in the timeline.
"""

from __future__ import annotations

import asyncio

from temporalio import workflow

with workflow.unsafe.imports_passed_through():
    from contract.ledger import (
        LedgerDecision,
        RecordFailureInput,
        RecordRepairInput,
        UnretireNotice,
    )
    from contract.remediation import Phase
    from workflows.ledger import describe, span
    from workflows.remediation.calls import ACTIVITY_FAILED, error_text
    from workflows.remediation.context import Remediation
    from workflows.remediation.outcome import Escalation

# How much of the ledger history goes into the RMA page (the newest entries).
RMA_HISTORY_LINES = 12


def incident_id(r: Remediation) -> str:
    """The ledger's idempotency key for this remediation: its workflow id and the id of the run
    that first recorded, carried across continue-as-new (`RemediationCarry.incident`). Not
    `first_execution_run_id`: the test server gives a fresh run under a reused id the earlier
    run's, which would merge two incidents."""
    if not r.s.ledger.incident:
        info = workflow.info()
        r.s.ledger.incident = f"{info.workflow_id}/{info.run_id}"
    return r.s.ledger.incident


def start_recording(r: Remediation, counts: bool, why: str) -> None:
    """Record the confirmed failure in the ledger, side by side with what follows; only
    confirmed device evidence counts (`counts`, from `classify.device_evidence`: the confirm
    step's): a maintenance drain or a hand launch without evidence is not a failure, and the
    timeline says so."""
    s = r.s
    if s.ledger.call is not None:
        return
    s.ledger.counts, s.ledger.counts_why = counts, why
    if not s.spec.lemons.enabled or s.confirm.device is None:
        return
    if not s.ledger.counts:
        r.j.log("failure not counted", outcome="GPU ledger unchanged", reason=s.ledger.counts_why)
        return
    s.ledger.call = asyncio.ensure_future(record_failure(r))


async def record_validation_failure(r: Remediation, action: str, summary: str) -> None:
    """A failed validation is device evidence: an incident the ledger did not count yet (a
    hand launch without evidence) counts now, and the answer is waited for (retired or not)."""
    s = r.s
    if s.ledger.call is None and not s.ledger.counts:
        start_recording(r, True, f"validation failed after {action}: {summary}"[:300])
    await recorded(r)


async def recorded(r: Remediation) -> None:
    """Wait for the ledger's answer, if this run asked for one (a no-op once it is in)."""
    if r.s.ledger.call is not None:
        await r.s.ledger.call


async def record_failure(r: Remediation) -> None:
    """Record the confirmed failure in the ledger; marks the state retired when it says so."""
    s, j = r.s, r.j
    lemons = s.spec.lemons
    if not lemons.enabled or s.confirm.device is None:
        return
    if s.dry:
        j.log("dry run: failure not recorded", reason="the GPU ledger counts real failures only")
        return
    xid = next((a.xid for a in reversed(s.journal.alerts) if a.xid is not None), None)
    try:
        decision = await r.act.record_gpu_failure(
            RecordFailureInput(
                gpu_uuid=s.confirm.device.gpu_uuid,
                node=s.confirm.device.node,
                device_key=s.confirm.device.key,
                incident=incident_id(r),
                holder=s.workflow_id,
                failure_class=s.status.failure_class,
                xid=xid,
                detail=f"runbook {s.status.runbook}",
                evidence=s.ledger.counts_why,
                failures=lemons.failures,
                window=lemons.window,
                require_verified_actors=s.spec.require_verified_actors,
            )
        )
    except ACTIVITY_FAILED as err:
        j.log(
            "failure not recorded",
            outcome="ledger unreachable",
            reason=f"{error_text(err)}; remediating as a first failure",
        )
        return
    s.ledger.decision = decision
    count = f"{decision.failures_in_window} of {lemons.failures} in {span(lemons.window)}"
    if not decision.retired:
        j.log("failure recorded", outcome=count, reason=s.ledger.counts_why)
        return
    s.ledger.retired = True
    since = decision.retired_at.isoformat() if decision.retired_at else "now"
    j.log(
        "GPU retired" if decision.newly_retired else "GPU already retired",
        outcome=count,
        reason=f"retired since {since}: stays quarantined until un-retired; "
        + (
            "this incident asks for an RMA" if decision.rma_due else "the RMA was asked for earlier"
        ),
    )


def repair_allowed(r: Remediation) -> bool:
    """A retired GPU is never repaired automatically (the repair ladder checks this)."""
    if r.s.ledger.retired:
        r.j.log("repair skipped", reason="the GPU is retired (lemon): RMA it or un-retire it")
        return False
    return True


def rma(r: Remediation, ended: Escalation | None) -> Escalation | None:
    """The one RMA escalation of a retired GPU, with its ledger history; None when not due."""
    s, decision = r.s, r.s.ledger.decision
    if not s.ledger.retired or decision is None or not decision.rma_due or s.escalation.done:
        return ended
    # The ask leads, the history follows: a page's summary is cut at 1024 characters (PagerDuty
    # Events v2), and a history with the ladder's repairs in it can be longer than that.
    ask, history = "retired as a lemon: RMA it", rma_history(decision)
    if ended is None:
        return Escalation("gpu-retired", f"{ask} ({history})")
    return Escalation(ended.reason, f"{ask}; {ended.summary} ({history})")


def rma_history(decision: LedgerDecision) -> str:
    lines = [describe(e) for e in decision.history[-RMA_HISTORY_LINES:]]
    return f"{decision.failures_in_window} failures within {span(decision.window)}; " + "; ".join(
        lines
    )


async def wait_unretired(r: Remediation) -> None:
    """Hold a retired GPU until a person un-retires it; never released before that."""
    s, j = r.s, r.j
    if not s.ledger.retired or s.confirm.device is None:
        return
    j.enter(
        Phase.HOLDING,
        awaiting="un-retire (the GPU is a lemon: RMA it, or "
        f"sickbay gpus unretire {s.confirm.device.gpu_uuid} --reason ...)",
        next_action="release normally once un-retired",
    )
    j.upsert()
    await r.act.wait(lambda: not s.ledger.retired, limit=None, summary="un-retire")


def unretired(r: Remediation, notice: UnretireNotice) -> None:
    """`gpu-unretired` from the ledger: the hold goes on as for any quarantined GPU."""
    if not r.s.ledger.retired:
        return
    r.s.ledger.retired = False
    r.j.log(
        "GPU un-retired",
        actor=notice.actor,
        client_identity=notice.client_identity,
        reason=notice.reason,
        verification=notice.verification,
    )


async def record_repair(r: Remediation, rung: str, detail: str = "") -> None:
    """For the repair ladder: a validated repair goes into the ledger (best effort)."""
    s = r.s
    if s.confirm.device is None or s.dry or not s.spec.lemons.enabled:
        return
    try:
        await r.act.record_gpu_repair(
            RecordRepairInput(
                gpu_uuid=s.confirm.device.gpu_uuid,
                node=s.confirm.device.node,
                incident=incident_id(r),
                rung=rung,
                detail=detail,
            )
        )
    except ACTIVITY_FAILED as err:
        r.j.log("repair not recorded", outcome="ledger unreachable", reason=error_text(err))
