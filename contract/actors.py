"""Verified actors: a person's action whose identity the cluster checked.

`sickbay approve --via URL` (or a Slack button) reaches the actions endpoint
(`POST /v1/actions`, `POST /v1/slack/actions` on the webhook). The endpoint checks the person
with the cluster (TokenReview for a Kubernetes bearer token; for Slack, the request's signature
and the configured Slack-user mapping), authorizes the action with a SubjectAccessReview of
verb `<action>` on resource `remediations` in API group `sickbay.dev`, and sends the signal or
update with a `VerifiedActor` attached: the user and groups, and an HMAC-SHA256 signature over
the whole message with the *actions key*, a secret only the webhook and the worker hold.

The workflow never trusts the `verified` field by itself: anyone who may signal the workflow
through Temporal can type one. It asks the worker (local activity `verify-actor`, which holds
the key) whether the signature is right for this workflow, this action and this content, and
that answer (a yes/no and a reason: never the key) is what history records. The signature is
in history; it proves nothing about any other message (it covers the workflow id, the action
and every field), and the workflow refuses one issued more than `ATTESTATION_TTL` before it
takes it in. docs/architecture.md, "Verified actors", has the threat model. The signing
itself (HMAC, nonces, the clock) lives in activities/actors.py: workflows import this module.
"""

from __future__ import annotations

import json
from datetime import datetime, timedelta
from typing import Any, Literal

from pydantic import Field

from contract.activity import Activity
from contract.base import Contract
from contract.names import ACT_VERIFY_ACTOR

# The virtual resource RBAC grants people's actions on (never served by any API server:
# SubjectAccessReview evaluates RBAC rules for any group/resource).
ACTIONS_API_GROUP = "sickbay.dev"
ACTIONS_RESOURCE = "remediations"
ActionVerb = Literal[
    "approve", "reject", "abort", "repaired", "extend", "unretire", "launch", "pause", "resume"
]
ACTION_VERBS: tuple[str, ...] = (
    "approve",
    "reject",
    "abort",
    "repaired",
    "extend",
    "unretire",
    "launch",
    "pause",
    "resume",
)

Verification = Literal["", "verified", "unverified"]
# The actions a runbook's `require_verified_actors` applies to.
GUARDED_ACTIONS: tuple[str, ...] = ("approve", "repaired", "unretire")

# A verified action taken in later than this after the endpoint signed it is refused: a
# signature copied out of history cannot be replayed later (and a worker down for longer
# than this makes the person send it again, which they are told).
ATTESTATION_TTL = timedelta(minutes=10)


class VerifiedActor(Contract):
    """Who the endpoint verified, and its signature over the message (see module doc)."""

    user: str = Field(min_length=1)
    groups: list[str] = Field(default_factory=list)
    via: Literal["kubernetes", "slack"] = "kubernetes"
    # For Slack: the Slack user id the identity was mapped from.
    external_id: str = ""
    issued_at: datetime
    nonce: str = Field(min_length=8)
    signature: str = ""


class ActorCheck(Contract):
    """Input of `verify-actor`: the message as the workflow received it."""

    workflow_id: str
    action: str
    request: dict[str, Any]  # the request's fields, without `verified`
    actor: VerifiedActor


class ActorVerdict(Contract):
    verified: bool
    reason: str = ""


def signed_bytes(
    workflow_id: str, action: str, request: dict[str, Any], actor: VerifiedActor
) -> bytes:
    """The canonical bytes the signature covers: workflow id, action, every field of the
    request and of the actor except the signature itself."""
    doc = {
        "workflow_id": workflow_id,
        "action": action,
        "request": request,
        "actor": actor.model_dump(mode="json", exclude={"signature"}),
    }
    return json.dumps(doc, sort_keys=True, separators=(",", ":"), ensure_ascii=True).encode()


def request_fields(request: Contract) -> dict[str, Any]:
    """A request's fields as signed: JSON-mode, without its `verified` attachment."""
    return request.model_dump(mode="json", exclude={"verified"})


# --- activities (contract.activity): the name, the input model, the result model ------------
VERIFY_ACTOR = Activity(ACT_VERIFY_ACTOR, ActorCheck, ActorVerdict)
