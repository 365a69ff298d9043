"""`verify-actor`: the worker's check of a verified actor's signature (contract/actors.py).

The workflow calls it as a local activity for a signal or update that carries `verified`. It
holds the actions key (`SICKBAY_ACTIONS_KEY_FILE`, the same Secret the webhook signs with) and
answers only yes/no with a reason: the key never leaves this process, so it is never in a
workflow's history, and neither is any credential (the endpoint signs the *verified identity*,
not the person's token). A worker without a key answers "no" for every attestation, so a
forged `verified` field can never count.
"""

from __future__ import annotations

import logging

from activities.defn import defn
from contract.actors import ActorCheck, ActorVerdict, signature_ok
from contract.names import ACT_VERIFY_ACTOR

log = logging.getLogger(__name__)


class ActorActivities:
    def __init__(self, key: bytes | None) -> None:
        self._key = key

    @defn(ACT_VERIFY_ACTOR)
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
