"""A verified actor's check for the long-running workflows (the budget's pause / resume, the
GPU ledger's unretire): the same rules as the remediation's (workflows/remediation/actors.py).

A request carrying `verified` (contract/actors.py) counts as verified only when it is fresh
(issued at most `ATTESTATION_TTL` before the workflow takes it in, not dated in the future),
its nonce was not seen before (the nonces of the last `ATTESTATION_TTL` ride in the state across
continue-as-new), its `actor` is the verified user, and the worker's `verify-actor` local
activity (which holds the actions key) says the signature covers this workflow id, this action
and every field. Anything else is an unverified claim, with why.

Call first thing in an update handler, after reading `sender_identity()`: the local activity
is an await, so state may change meanwhile and the handler checks it again afterwards.
"""

from __future__ import annotations

from collections.abc import Container
from dataclasses import dataclass
from datetime import datetime, timedelta

from temporalio import workflow
from temporalio.common import RetryPolicy
from temporalio.exceptions import ActivityError, ApplicationError, TimeoutError

with workflow.unsafe.imports_passed_through():
    from contract.activity import declared_in
    from contract.actors import (
        ATTESTATION_TTL,
        VERIFY_ACTOR,
        ActorCheck,
        VerifiedActor,
        request_fields,
    )
    from contract.base import Contract
    from workflows.execute import execute_local

# verify-actor: the declarations imported here, required by every workflow that checks actors.
REQUIRED_ACTIVITIES = declared_in(globals())

# The endpoint's clock may run a little ahead of the worker's history time.
CLOCK_SKEW = timedelta(minutes=1)
# A pure HMAC check in the worker's process: 10 s is ample, 3 attempts cover a busy worker;
# after that the action is recorded unverified (never lost, never counted as verified).
VERIFY_TIMEOUT = timedelta(seconds=10)
VERIFY_RETRY = RetryPolicy(initial_interval=timedelta(seconds=1), maximum_attempts=3)


@dataclass(frozen=True)
class Checked:
    """The outcome: `verified` set only when every check passed; else `problem` says why
    (empty when nothing was claimed: sent straight through Temporal)."""

    actor: str
    verified: VerifiedActor | None = None
    problem: str = ""

    @property
    def verification(self) -> str:
        return "verified" if self.verified is not None else "unverified"

    def how(self) -> str:
        """Why an unverified sender is unverified, in words."""
        return self.problem or "sent straight through Temporal, not through the actions endpoint"


def prune_nonces(seen: dict[str, datetime], now: datetime) -> dict[str, datetime]:
    """The nonces still worth remembering: a signature older than the TTL is refused anyway."""
    horizon = now - ATTESTATION_TTL - CLOCK_SKEW
    return {n: at for n, at in seen.items() if at >= horizon}


def stale_or_replayed(att: VerifiedActor, claimed: str, now: datetime, seen: Container[str]) -> str:
    """Why `att` cannot count before its signature is even checked (too old, dated in the
    future, a nonce in `seen`, another user than the `claimed` actor), or "" when none."""
    if now - att.issued_at > ATTESTATION_TTL:
        return (
            f"its verification was issued at {att.issued_at:%H:%M:%S} UTC, more than "
            f"{int(ATTESTATION_TTL.total_seconds() // 60)}m before it was taken in: send it again"
        )
    if att.issued_at - now > CLOCK_SKEW:
        return "its verification is dated in the future"
    if att.nonce in seen:
        return "its verification was already used (a replay)"
    if att.user != claimed:
        return f"the actor {claimed!r} is not the verified user {att.user!r}"
    return ""


async def check_actor(
    action: str, req: Contract, claimed: str, seen: dict[str, datetime]
) -> Checked:
    """Check `req.verified` for `action`; a verified nonce is added to `seen`."""
    att: VerifiedActor | None = getattr(req, "verified", None)
    if att is None:
        return Checked(claimed)
    problem = stale_or_replayed(att, claimed, workflow.now(), seen)
    if not problem:
        check = ActorCheck(
            workflow_id=workflow.info().workflow_id,
            action=action,
            request=request_fields(req),
            actor=att,
        )
        try:
            verdict = await execute_local(
                VERIFY_ACTOR,
                check,
                start_to_close_timeout=VERIFY_TIMEOUT,
                retry_policy=VERIFY_RETRY,
                summary=f"verify {action} by {att.user}",
            )
        except (ActivityError, ApplicationError, TimeoutError) as err:
            cause = err.cause if isinstance(err, ActivityError) and err.cause else err
            problem = f"its verification could not be checked: {cause}"
        else:
            if verdict.verified:
                seen[att.nonce] = att.issued_at
                return Checked(att.user, verified=att)
            problem = verdict.reason
    workflow.logger.warning(
        "%s claims verified user %s but is recorded as unverified: %s", action, att.user, problem
    )
    return Checked(claimed, problem=f"claimed verified user {att.user}: {problem}")
