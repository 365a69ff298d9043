"""A paused cluster (`sickbay pause`) seen by an open remediation: before a step that takes
more out of service or changes the fleet (eviction force, scale-up, a repair rung), hold until
the cluster is resumed. What it already holds stays as it is (the quarantine, the lease), and
what gives back goes on (releases on repair or health, abort).

The budget workflow tells every lease holder (`cluster-paused` signal, `PauseNotice`); a
remediation without a lease learns of the pause when its lease is refused (guard.py)."""

from __future__ import annotations

from temporalio import workflow

with workflow.unsafe.imports_passed_through():
    from workflows.remediation.context import Remediation


async def hold_while_paused(r: Remediation, what: str) -> None:
    """Return at once when not paused; else record who paused it and why, show it (details,
    `SickbayPaused`), and wait for the resume (abort ends the wait: Aborted). No page: people
    paused it on purpose."""
    s, j = r.s, r.j
    pause = s.cluster_pause
    if pause is None:
        return
    j.log(
        "held: cluster paused",
        actor=pause.actor,
        outcome=f"{what} not started",
        reason=pause.describe(),
    )
    s.status.paused = pause.describe()
    j.enter(
        s.status.phase,
        awaiting=f"sickbay resume (cluster {pause.describe()}), or abort",
        next_action=what,
    )
    j.upsert()
    await r.act.wait(lambda: s.cluster_pause is None, limit=None, summary="cluster paused")
    s.status.paused = None
    j.log("cluster resumed", actor="sickbay-budget", reason=f"going on: {what}")
    j.upsert()
