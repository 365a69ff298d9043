"""Step 3, guard: the blast-radius budget. The lease is asked of the `sickbay-budget` workflow
(early, while the evidence is still coming: `lease.ask_lease` from the confirm step); over budget or budget unreachable,
the remediation escalates once and waits for a slot: it retries every minute (then every 5),
woken at once when the budget frees a slot of its pool, and ends the wait on repaired, alert
resolved + Healthy, or abort. A wait of days continues-as-new and confirms afresh.

A paused cluster (`sickbay pause`: the budget refuses with the pause) is not over budget: the
remediation records who paused it and why ("not quarantined"), shows it in its details and the
`SickbayPaused` search attribute, sends no page, and waits for the resume (the budget wakes
every held remediation), repaired, alert resolved + Healthy, or abort."""

from __future__ import annotations

from datetime import timedelta

from temporalio import workflow

with workflow.unsafe.imports_passed_through():
    from contract.base import format_duration
    from contract.budget import (
        BudgetPause,
    )
    from contract.kube import CheckHealthInput, DeviceCounts, ResolvedDevice
    from contract.remediation import Phase
    from contract.runbook import EscalationReason, Runbook
    from workflows.remediation.calls import ACTIVITY_FAILED, error_text
    from workflows.remediation.context import Remediation
    from workflows.remediation.escalation import escalate, resolve_page
    from workflows.remediation.lease import EarlyLease, ask_lease
    from workflows.remediation.outcome import Closed, Escalation
    from workflows.remediation.pause import pause_told, show_paused
    from workflows.remediation.state import history_full

# Over budget or budget unreachable: escalate once, then retry the lease every minute for the
# first hour (a slot frees when another GPU is released), then every 5 minutes so a wait of
# days stays a few thousand history events.
BUDGET_RETRY_FIRST = timedelta(minutes=1)
BUDGET_RETRY_LATER = timedelta(minutes=5)
BUDGET_RETRY_SWITCH = 60
BUDGET_RECOUNT_EVERY = 5  # waiting: count devices again on every 5th lease retry
BUDGET_AWAITING = "a budget slot, repaired, alert resolved + Healthy, or abort"
PAUSE_AWAITING = "sickbay resume, repaired, alert resolved + Healthy, or abort"


def alert_resolved(r: Remediation) -> None:
    """`alert-resolved` came in: the wait checks the device's health."""
    r.s.guard.resolved_pending = True


def slot_freed(r: Remediation) -> None:
    """`budget-freed` from sickbay-budget: a slot freed, the wait asks again at once."""
    r.s.guard.budget_freed = True


async def guard(r: Remediation, early: EarlyLease | None) -> Closed | None:
    """Hold a budget lease before anything is tainted; None once granted."""
    s = r.s
    assert s.confirm.device is not None and s.confirm.runbook is not None
    r.j.enter(
        Phase.GUARDING,
        awaiting="budget lease",
        next_action="approval" if s.spec.approval.required else "quarantine the device",
    )
    return await _acquire_lease(r, s.confirm.device, s.confirm.runbook, early)


async def _acquire_lease(
    r: Remediation, device: ResolvedDevice, runbook: Runbook, early: EarlyLease | None
) -> Closed | None:
    s, j = r.s, r.j
    tries = 0
    counts: DeviceCounts | None = None
    # A run continued from a long wait goes on at the slower pace.
    resumed = s.inp.resume is not None and s.inp.resume.waiting_for_budget
    paged = False
    while True:
        tries += 1
        # Retries while waiting reuse the device counts (two cluster-wide lists) except after
        # a wake-up and every BUDGET_RECOUNT_EVERY-th try, so a storm of waiters does not list
        # every node each minute; the budget's own leases are always current.
        if s.guard.budget_freed or tries % BUDGET_RECOUNT_EVERY == 1:
            counts = None
        # A wake-up arriving from here on is for this try; one that arrived after an early
        # request was answered is for the next try (it stays set).
        s.guard.budget_freed = s.guard.budget_freed and early is not None and tries == 1
        kind: EscalationReason
        paused: BudgetPause | None = None
        try:
            granted, kind, why, counts, paused = await _try_lease(
                r, device, runbook, counts, early if tries == 1 else None
            )
        except ACTIVITY_FAILED as err:
            # The budget workflow could not be reached within the bounded retries (update
            # limit under a storm, server down): never fail the run, escalate and retry.
            granted, kind, counts = False, "error", None
            why = f"budget service unavailable: {error_text(err)}; device NOT tainted"
        was_paused = s.status.paused is not None
        show_paused(r, paused)
        if was_paused and paused is None:
            j.log("cluster resumed", actor="sickbay-budget", reason="asking for the lease again")
        if granted:
            if s.journal.sa_paused:
                j.upsert()  # SickbayPaused cleared at once, not at the next durable wait
            return None
        if paused is not None:
            # Not over budget: held by people on purpose. Recorded (who, why), never paged.
            j.log(
                "held: cluster paused",
                actor=paused.actor,
                outcome="no taint",
                reason=f"{paused.describe()}; not quarantined",
                replace_same=was_paused,
            )
        elif not paged:
            paged = True
            j.log(
                "budget denied" if kind != "error" else "budget unavailable",
                outcome="no taint",
                reason=why,
            )
            await escalate(
                r,
                Escalation(
                    kind,
                    f"{why}; waiting for a budget slot (retrying every "
                    f"{BUDGET_RETRY_FIRST}, then every {BUDGET_RETRY_LATER})",
                ),
                awaiting=BUDGET_AWAITING,
            )
        else:
            # One timeline entry for a run of retries (the latest), not one per minute.
            j.log(
                "budget still unavailable" if kind == "error" else "budget still full",
                outcome=f"try {tries}",
                reason=why,
                replace_same=True,
            )
        first = tries < BUDGET_RETRY_SWITCH and not resumed
        # Paused: the resume wakes this run at once; the slower retry is only the backstop.
        interval = BUDGET_RETRY_FIRST if first and paused is None else BUDGET_RETRY_LATER
        j.enter(
            Phase.ESCALATED if paused is None else Phase.GUARDING,
            awaiting=BUDGET_AWAITING
            if paused is None
            else f"{PAUSE_AWAITING} (cluster {paused.describe()})",
            until=interval,
            next_action=f"ask the budget for a lease again (try {tries + 1})",
        )
        j.upsert()
        try:
            await r.act.wait(
                lambda: (
                    s.inbox.repaired is not None or s.guard.resolved_pending or s.guard.budget_freed
                ),
                limit=interval,
                summary=f"budget lease retry {tries + 1} ({format_duration(interval)})",
            )
        except TimeoutError:
            pass
        if s.guard.budget_freed and s.inbox.repaired is None and paused is None:
            j.log("budget slot freed", actor="sickbay-budget", reason="retrying now")
        if s.inbox.repaired is not None:
            show_paused(r, None)
            await resolve_page(r, "repaired while waiting for budget")
            return Closed(
                "not-quarantined",
                f"repaired ({j.who('repaired')}) while waiting for a budget slot; "
                "never quarantined",
            )
        if s.guard.resolved_pending:
            s.guard.resolved_pending = False
            if await healthy_now(r):
                show_paused(r, None)
                await resolve_page(r, "alert resolved, device Healthy")
                return Closed(
                    "not-quarantined",
                    "alert resolved and the device is Healthy while waiting for a budget "
                    "slot; never quarantined",
                )
        if history_full():
            await r.j.events_written()
            await workflow.wait_condition(workflow.all_handlers_finished)
            workflow.continue_as_new(s.carry(waiting_for_budget=True))


async def healthy_now(r: Remediation) -> bool:
    try:
        health = await r.act.check_health(CheckHealthInput(device=r.s.confirm.device))
    except ACTIVITY_FAILED as err:
        r.j.log("health check failed", outcome="unknown", reason=error_text(err))
        return False
    r.j.log("health checked", outcome=health.health or "unknown")
    return health.health == "Healthy"


def _lease_refusal(r: Remediation, device: ResolvedDevice, asked: EarlyLease) -> str | None:
    """Why the answered request was refused (None: granted, and logged so)."""
    decision, counts = asked.decision, asked.counts
    assert decision is not None and counts is not None
    pool_limit, cluster_limit = asked.pool_limit, asked.cluster_limit
    if not decision.granted and decision.paused is not None:
        return f"cluster {decision.paused.describe()}; device NOT tainted"
    if not decision.granted:
        return (
            f"blast-radius budget exhausted: {decision.reason} (pool {device.node_pool}: "
            f"{decision.pool_in_use}/{pool_limit} of {counts.pool_devices} devices, cluster: "
            f"{decision.cluster_in_use}/{cluster_limit} of {counts.cluster_devices}); "
            "device NOT tainted"
        )
    r.j.log(
        "budget lease acquired",
        outcome=f"pool {decision.pool_in_use}/{pool_limit}, "
        f"cluster {decision.cluster_in_use}/{cluster_limit}",
    )
    return None


async def _try_lease(
    r: Remediation,
    device: ResolvedDevice,
    runbook: Runbook,
    counts: DeviceCounts | None = None,
    asked: EarlyLease | None = None,
) -> tuple[bool, EscalationReason, str, DeviceCounts, BudgetPause | None]:
    """(granted, escalation kind, why not, the counts used, the pause that refused it);
    raises when the budget cannot be reached. `counts` given: reused instead of counting again; `asked` given: the answer
    of a request already made (concurrent confirm)."""
    if asked is None:
        asked = await ask_lease(r, device, runbook.spec.budget, counts)
    if asked.error is not None:
        raise asked.error
    assert asked.counts is not None and asked.decision is not None
    why = _lease_refusal(r, device, asked)
    if why is not None:
        return False, "budget-exhausted", why, asked.counts, asked.decision.paused
    # A lease kept across a continue-as-new is granted again while paused: the pause comes
    # with it, so the steps after the quarantine hold (workflows/remediation/pause.py).
    pause_told(r, asked.decision.paused)
    return True, "budget-exhausted", "", asked.counts, None
