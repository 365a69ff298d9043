"""Who sent a person's action: a verified actor (checked) or an unverified claim.

A signal or update carrying `verified` (contract/actors.py) counts as verified only when
- it is fresh: issued at most `ATTESTATION_TTL` before the workflow takes it in (a signature
  copied out of history cannot be replayed later), and not seen before in this run;
- the worker's `verify-actor` local activity, which holds the actions key, says its signature
  covers this workflow id, this action and every field of the request.
Anything else is an unverified claim, recorded as such with why the verification failed.
A runbook with `requireVerifiedActors` refuses approve / reject and repaired from an
unverified sender (`refusal()`).
"""

from __future__ import annotations

from dataclasses import dataclass

from temporalio import workflow

with workflow.unsafe.imports_passed_through():
    from contract.actors import (
        ActorCheck,
        VerifiedActor,
        request_fields,
    )
    from contract.base import Contract
    from workflows.attestation import stale_or_replayed
    from workflows.identity import sender_identity
    from workflows.remediation.calls import ACTIVITY_FAILED, error_text
    from workflows.remediation.context import Remediation


@dataclass(frozen=True)
class Sender:
    """The sender of one signal / update, as the timeline records it."""

    actor: str  # the verified user, or the claimed actor
    identity: str  # the Temporal client identity the server recorded
    verified: VerifiedActor | None = None  # set only when the check passed
    problem: str = ""  # why a claimed verification did not count

    @property
    def verification(self) -> str:
        return "verified" if self.verified is not None else "unverified"


async def sender(r: Remediation, action: str, req: Contract, claimed: str) -> Sender:
    """Check `req.verified` (if any) for `action`. Call first thing in the handler: the
    client identity is read before any await."""
    identity = sender_identity() or "unknown"
    att: VerifiedActor | None = getattr(req, "verified", None)
    if att is None:
        return Sender(claimed, identity)
    problem = stale_or_replayed(att, claimed, workflow.now(), r.s.actors.seen_nonces)
    if not problem:
        check = ActorCheck(
            workflow_id=workflow.info().workflow_id,
            action=action,
            request=request_fields(req),
            actor=att,
        )
        try:
            verdict = await r.act.verify_actor(check)
        except ACTIVITY_FAILED as err:
            problem = f"its verification could not be checked: {error_text(err)}"
        else:
            if verdict.verified:
                r.s.actors.seen_nonces.add(att.nonce)
                return Sender(att.user, identity, verified=att)
            problem = verdict.reason
    workflow.logger.warning(
        "%s claims verified user %s but is recorded as unverified: %s", action, att.user, problem
    )
    return Sender(claimed, identity, problem=f"claimed verified user {att.user}: {problem}")


def refusal(r: Remediation, who: Sender, action: str) -> str | None:
    """Why the runbook refuses this sender for `action` (approve, reject, repaired), or None."""
    if who.verified is not None or not r.s.spec.require_verified_actors:
        return None
    runbook = r.s.confirm.runbook.name if r.s.confirm.runbook is not None else "default"
    how = who.problem or "sent straight through Temporal, not through the actions endpoint"
    return (
        f"runbook {runbook} requires a verified actor for {action}: {how} "
        f"(use `sickbay {action} --via <actions URL>` or the Slack button)"
    )


def log_refused(r: Remediation, who: Sender, action: str, reason: str) -> None:
    r.j.log(
        f"{action} refused",
        outcome="unverified actor",
        actor=who.actor,
        reason=reason,
        client_identity=who.identity,
        verification="unverified",
    )
