"""Signing verified actors (the actions endpoint: `attest`) and `verify-actor`, the worker's check of a verified actor's signature (contract/actors.py).

The workflow calls it as a local activity for a signal or update that carries `verified`. It
holds the actions key (`SICKBAY_ACTIONS_KEY_FILE`, the same Secret the webhook signs with) and
answers only yes/no with a reason: the key never leaves this process, so it is never in a
workflow's history, and neither is any credential (the endpoint signs the *verified identity*,
not the person's token). A worker without a key answers "no" for every attestation, so a
forged `verified` field can never count.
"""

from __future__ import annotations

import hashlib
import hmac
import logging
import secrets
from datetime import UTC, datetime
from typing import Any, Literal, TypeVar

from activities.defn import implements
from contract.actors import (
    VERIFY_ACTOR,
    ActorCheck,
    ActorVerdict,
    VerifiedActor,
    request_fields,
    signed_bytes,
)
from contract.base import Contract

log = logging.getLogger(__name__)


def sign(
    key: bytes, workflow_id: str, action: str, request: dict[str, Any], actor: VerifiedActor
) -> str:
    return hmac.new(
        key, signed_bytes(workflow_id, action, request, actor), hashlib.sha256
    ).hexdigest()


def signature_ok(key: bytes, check: ActorCheck) -> bool:
    want = sign(key, check.workflow_id, check.action, check.request, check.actor)
    return hmac.compare_digest(want, check.actor.signature)


R = TypeVar("R", bound=Contract)


def attest(
    key: bytes,
    workflow_id: str,
    action: str,
    request: R,
    *,
    user: str,
    groups: list[str],
    via: Literal["kubernetes", "slack"] = "kubernetes",
    external_id: str = "",
) -> R:
    """`request` with its `verified` attachment signed (the actions endpoint's job). The
    request's `actor` must already be `user`."""
    actor = VerifiedActor(
        user=user,
        groups=groups,
        via=via,
        external_id=external_id,
        issued_at=datetime.now(UTC),
        nonce=secrets.token_hex(16),
    )
    actor.signature = sign(key, workflow_id, action, request_fields(request), actor)
    return request.model_copy(update={"verified": actor})


class ActorActivities:
    def __init__(self, key: bytes | None) -> None:
        self._key = key

    @implements(VERIFY_ACTOR)
    async def verify_actor(self, check: ActorCheck) -> ActorVerdict:
        if self._key is None:
            return ActorVerdict(
                verified=False,
                reason="this worker holds no actions key (SICKBAY_ACTIONS_KEY_FILE): "
                "no signature can be checked",
            )
        if not check.actor.signature or not signature_ok(self._key, check):
            log.warning(
                "a %s on %s claims verified user %r with a signature that does not match: "
                "recorded as unverified",
                check.action,
                check.workflow_id,
                check.actor.user,
            )
            return ActorVerdict(
                verified=False,
                reason="its signature does not match (not sent by the actions endpoint, or "
                "altered on the way)",
            )
        return ActorVerdict(verified=True)
