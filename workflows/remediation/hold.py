"""Step 10, hold and release: the device stays quarantined until repaired (signal / CLI) or
Healthy for the cool-down (per `release.mode`); then the rule (and Sickbay's node taint or
cordon) is removed, the lease given back and the page resolved. Also the undo after `abort`.
A long hold continues-as-new."""

from __future__ import annotations

from temporalio import workflow

with workflow.unsafe.imports_passed_through():
    from contract.base import format_duration
    from contract.kube import CheckHealthInput, HealthResult
    from contract.remediation import Phase
    from workflows.remediation.calls import ACTIVITY_FAILED, error_text
    from workflows.remediation.context import Remediation
    from workflows.remediation.escalation import escalate
    from workflows.remediation.lease import release_lease
    from workflows.remediation.lemons import wait_unretired
    from workflows.remediation.outcome import Closed, Escalation
    from workflows.remediation.release import release_now, remove_quarantine
    from workflows.remediation.state import history_full


async def hold_and_release(r: Remediation) -> Closed:
    s, j = r.s, r.j
    await wait_unretired(r)  # a retired GPU (lemon) is held until a person un-retires it
    release = s.spec.release
    auto = release.mode in ("healthy-cooldown", "either")
    # release.mode healthy-cooldown: only the device's health releases it; a `repaired`
    # mark is recorded and the device still has to stay Healthy for the cool-down.
    health_only = release.mode == "healthy-cooldown"
    if health_only:
        awaiting = f"Healthy for {format_duration(release.cooldown)}"
    else:
        awaiting = "marked repaired" + (
            f" or Healthy for {format_duration(release.cooldown)}" if auto else ""
        )
    j.enter(
        Phase.HOLDING,
        awaiting=awaiting,
        until=release.health_check_interval if auto else None,
        next_action="check the device's health" if auto else "release once marked repaired",
    )
    j.upsert()
    s.hold.health_only = health_only
    if health_only and s.inbox.repaired is not None:  # marked before the hold began
        note_repair(r)
    while health_only or s.inbox.repaired is None:
        try:
            await r.act.wait(
                lambda: not health_only and s.inbox.repaired is not None,
                limit=release.health_check_interval if auto else None,
                summary=f"health check ({format_duration(release.health_check_interval)})"
                if auto
                else None,
            )
            break  # marked repaired (never woken so when only health releases)
        except TimeoutError:
            pass
        try:
            health = await r.act.check_health(CheckHealthInput(device=s.confirm.device))
        except ACTIVITY_FAILED as err:
            # Not knowing is not Healthy: keep holding, try again next interval.
            health = HealthResult(health=None, message=error_text(err))
            j.log("health check failed", outcome="unknown", reason=health.message)
        now = workflow.now()
        if health.health == "Healthy":
            if s.hold.healthy_since is None:
                s.hold.healthy_since = now
                j.log(
                    "device Healthy", reason=f"cool-down {format_duration(release.cooldown)} starts"
                )
            if now - s.hold.healthy_since >= release.cooldown:
                j.log("healthy for the cool-down", outcome=str(release.cooldown))
                return await _release(r, by_health=True)
        elif s.hold.healthy_since is not None:
            s.hold.healthy_since = None
            j.log("device not Healthy again", outcome=health.health or "unknown")
        if history_full():
            await r.j.events_written()
            await workflow.wait_condition(workflow.all_handlers_finished)
            workflow.continue_as_new(s.carry())
    return await _release(r, by_health=False)


def note_repair(r: Remediation) -> None:
    """Under release.mode healthy-cooldown a repair mark does not release the device."""
    s = r.s
    assert s.inbox.repaired is not None
    r.j.log(
        "repair noted",
        actor=s.inbox.repaired.actor,
        client_identity=s.journal.sent["repaired"][1],
        reason="release.mode healthy-cooldown: released once Healthy for "
        f"{format_duration(s.spec.release.cooldown)}",
    )


async def _release(r: Remediation, by_health: bool) -> Closed:
    reason = (
        "healthy for the cool-down"
        if by_health or r.s.inbox.repaired is None
        else f"repaired ({r.j.who('repaired')})"
    )
    return await release_now(r, reason)


async def undo_after_abort(r: Remediation) -> Closed:
    """`abort` interrupted a wait: undo what Sickbay did (rule removed, lease released)."""
    s, j = r.s, r.j
    req = s.inbox.abort
    assert req is not None
    s.hold.undoing = True
    j.enter(Phase.RELEASING, awaiting="undo after abort")
    reason = f"aborted by {j.who('abort')}: {req.reason}"
    try:
        await remove_quarantine(r, reason)
    except ACTIVITY_FAILED as err:
        await escalate(
            r, Escalation("error", f"abort could not remove the quarantine: {error_text(err)}")
        )
        await release_lease(r)
        return Closed("escalated", f"{reason}; quarantine removal failed")
    await release_lease(r)
    return Closed("aborted", reason)
