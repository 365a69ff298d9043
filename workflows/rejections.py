"""`sickbay-rejections`: what Sickbay was told but could not use, kept in Temporal.

One long-running workflow per task queue (`constants.rejections_workflow_id`), like the
budget. Two kinds of input:

- signal `rejected` (RejectedAlerts) from every webhook process, a few seconds apart at most:
  alerts it could not map to a GPU, counted by reason with a few examples, so `sickbay status`
  shows them whichever replica refused them, across restarts;
- update `claim-escalation` (EscalationClaim) from remediations that cannot act on what they
  were told (a node or GPU that does not exist): the first claim for a cause and node in its
  window pages, the others are answered with who did and count as suppressed. 5,000 made-up
  UUIDs on one node page once, not 5,000 times.

    start (signal- or update-with-start) --> serve signals and updates
        every hour: forget reasons not seen for `keep`, claims whose window passed
        after `max_events_per_run` messages or when Temporal suggests it: continue-as-new

Sandboxed (few messages, off the alert -> taint path); state from messages, time from
workflow.now().
"""

from __future__ import annotations

from datetime import timedelta

from temporalio import workflow

with workflow.unsafe.imports_passed_through():
    from contract.names import QRY_REJECTIONS, SIG_REJECTED, UPD_CLAIM_ESCALATION, WF_REJECTIONS
    from contract.notify import (
        EscalationClaim,
        EscalationClaimRecord,
        EscalationClaimResult,
        RejectedAlerts,
        RejectionCount,
        RejectionsState,
        RejectionsSummary,
    )

# Examples kept per reason (the latest): enough to see what is wrong, small in history.
EXAMPLES = 5
# Housekeeping (forget old reasons and claims) at least this often.
PRUNE_EVERY = timedelta(hours=1)


@workflow.defn(name=WF_REJECTIONS)
class RejectionsWorkflow:
    @workflow.init
    def __init__(self, state: RejectionsState) -> None:
        self._state = state
        self._reasons: dict[str, RejectionCount] = {r.reason: r for r in state.reasons}
        self._claims: dict[tuple[str, str], EscalationClaimRecord] = {
            (c.cause, c.node): c for c in state.claims
        }
        self._events = 0

    @workflow.signal(name=SIG_REJECTED)
    def rejected(self, batch: RejectedAlerts) -> None:
        self._events += 1
        for reason, count in batch.counts.items():
            self._count(reason, count, batch.examples.get(reason, []))

    @workflow.update(name=UPD_CLAIM_ESCALATION)
    def claim(self, req: EscalationClaim) -> EscalationClaimResult:
        self._events += 1
        now = workflow.now()
        key = (req.cause, req.node)
        held = self._claims.get(key)
        self._count(req.cause, 1, [f"{req.node}: {req.detail or req.holder}"])
        if held is not None and held.holder != req.holder and now - held.at < held.window:
            held.suppressed += 1
            return EscalationClaimResult(
                granted=False, holder=held.holder, since=held.at, suppressed=held.suppressed
            )
        if held is None or held.holder != req.holder:
            held = self._claims[key] = EscalationClaimRecord(
                cause=req.cause,
                node=req.node,
                holder=req.holder,
                at=now,
                window=req.window,
                detail=req.detail,
            )
        return EscalationClaimResult(granted=True, holder=held.holder, since=held.at)

    @workflow.query(name=QRY_REJECTIONS)
    def summary(self) -> RejectionsSummary:
        return RejectionsSummary(
            reasons=sorted(self._reasons.values(), key=lambda r: (-r.count, r.reason)),
            claims=sorted(self._claims.values(), key=lambda c: c.at),
        )

    @workflow.run
    async def run(self, state: RejectionsState) -> None:
        while True:
            await workflow.wait_condition(
                lambda: (
                    self._events >= state.max_events_per_run
                    or workflow.info().is_continue_as_new_suggested()
                ),
                timeout=PRUNE_EVERY,
            )
            self._prune()
            if (
                self._events >= state.max_events_per_run
                or workflow.info().is_continue_as_new_suggested()
            ):
                await workflow.wait_condition(workflow.all_handlers_finished)
                workflow.continue_as_new(
                    state.model_copy(
                        update={
                            "reasons": list(self._reasons.values()),
                            "claims": list(self._claims.values()),
                        }
                    )
                )

    def _count(self, reason: str, count: int, examples: list[str]) -> None:
        now = workflow.now()
        known = self._reasons.get(reason)
        if known is None:
            known = self._reasons[reason] = RejectionCount(reason=reason, first_at=now, last_at=now)
        known.count += count
        known.last_at = now
        known.examples = (known.examples + list(examples))[-EXAMPLES:]

    def _prune(self) -> None:
        now = workflow.now()
        keep = self._state.keep
        self._reasons = {k: r for k, r in self._reasons.items() if now - r.last_at < keep}
        self._claims = {k: c for k, c in self._claims.items() if now - c.at < c.window}
