"""A paused cluster (`sickbay pause`) seen by an open remediation: before a step that takes
more out of service or changes the fleet (eviction force, scale-up, a repair rung), hold until
the cluster is resumed. What it already holds stays as it is (the quarantine, the lease), and
what gives back goes on (releases on repair or health, abort).

The budget workflow tells every lease holder (`cluster-paused` signal, `PauseNotice`); a
remediation without a lease learns of the pause when its lease is refused (guard.py), one
with a lease when it is granted or grown while paused. Owns the pause as last told
(`pause_told`) and the status's `paused` (`show_paused`)."""

from __future__ import annotations

from temporalio import workflow

with workflow.unsafe.imports_passed_through():
    from contract.budget import BudgetPause
    from workflows.remediation.context import Remediation


def pause_told(r: Remediation, pause: BudgetPause | None) -> None:
    """The cluster's pause as the budget workflow told it (None: resumed)."""
    r.s.pause.pause = pause


def show_paused(r: Remediation, pause: BudgetPause | None) -> None:
    """The status (and details) show the run held by `pause`, or not held (None)."""
    r.s.status.paused = pause.describe() if pause is not None else None


async def hold_while_paused(r: Remediation, what: str) -> None:
    """Return at once when not paused; else record who paused it and why, show it (details,
    `SickbayPaused`), and wait for the resume (abort ends the wait: Aborted). No page: people
    paused it on purpose."""
    s, j = r.s, r.j
    pause = s.pause.pause
    if pause is None:
        return
    j.log(
        "held: cluster paused",
        actor=pause.actor,
        outcome=f"{what} not started",
        reason=pause.describe(),
    )
    show_paused(r, pause)
    j.enter(
        s.status.phase,
        awaiting=f"sickbay resume (cluster {pause.describe()}), or abort",
        next_action=what,
    )
    j.upsert()
    await r.act.wait(lambda: s.pause.pause is None, limit=None, summary="cluster paused")
    show_paused(r, None)
    j.log("cluster resumed", actor="sickbay-budget", reason=f"going on: {what}")
    j.upsert()
