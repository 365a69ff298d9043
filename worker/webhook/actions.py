"""People's actions with a verified identity: `POST /v1/actions` and `POST /v1/slack/actions`.

`/v1/actions` (the CLI's `--via`): the person's Kubernetes bearer token (what kubectl sends:
the kubeconfig's token or its exec plugin's) in `Authorization`, and a JSON body
`{"action": "approve", "target": "<workflow id or node/GPU-uuid>", "reason": "..."}`.

1. TokenReview (authentication.k8s.io/v1): who the token is. Not authenticated: 401, before
   the body is read. The token is used for this one call and never logged or stored.
2. SubjectAccessReview (authorization.k8s.io/v1): may that user (with their groups) do verb
   `<action>` on resource `remediations` in API group `sickbay.dev`, name `<workflow id>`?
   No: 403 with the reason. (Verbs: contract.actors.ACTION_VERBS; "extend" is
   `extend-deadline`.)
3. The signal / update goes to the workflow with `actor` = the verified user and a
   `verified` attachment signed with the actions key (contract/actors.py); the workflow has
   the worker check that signature before it counts the action as verified.

`/v1/slack/actions` (a Slack app's interactivity URL, the escalation's buttons): the request's
`X-Slack-Signature` (`v0=` HMAC-SHA256 of `v0:<timestamp>:<body>` with the app's signing
secret) and `X-Slack-Request-Timestamp` (within 5 minutes) are checked, a signature seen
before is refused (replay), the Slack user id is mapped to a Kubernetes user and groups
(SICKBAY_SLACK_USERS_FILE), and from there on it is step 2 and 3 above.

Answers: 200 taken in (the timeline shows it), 202 sent but not yet taken in, 401 not
authenticated, 403 not authorized, 404 no such remediation, 409 the workflow refused it
(not awaiting approval, already decided, a runbook that requires verified actors...), 422 a
bad body, 503 not configured / Kubernetes or Temporal unreachable.
"""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import json
import logging
import time
from collections import OrderedDict
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path
from typing import Any, Literal
from urllib.parse import parse_qs

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from activities.actors import attest
from contract.actors import ACTIONS_API_GROUP, ACTIONS_RESOURCE
from contract.base import Contract, Duration
from contract.names import (
    QRY_TIMELINE,
    SIG_ABORT,
    SIG_REPAIRED,
    UPD_APPROVE,
    UPD_EXTEND_DEADLINE,
    device_workflow_id,
)
from contract.remediation import (
    AbortRequest,
    ApprovalDecision,
    ApprovalResult,
    ExtendDeadlineRequest,
    ExtendDeadlineResult,
    RepairedRequest,
    TimelineEntry,
)

log = logging.getLogger(__name__)

# Slack: a request older (or newer) than this is refused (Slack's documented window).
SLACK_MAX_AGE_SECONDS = 300
# Signatures remembered against replays: for the window above, at most this many.
SLACK_SEEN_MAX = 10_000
# How long the endpoint waits for the workflow to take a signal in before answering 202.
CONFIRM_SECONDS = 10.0
ACTION_BODY_LIMIT = 64 * 1024

Action = Literal["approve", "reject", "abort", "repaired", "extend"]


class ActionBody(BaseModel):
    """The body of `POST /v1/actions`."""

    model_config = ConfigDict(extra="forbid")
    action: Action
    target: str = Field(min_length=1)
    reason: str = ""
    by: Duration | None = None  # extend
    until: str | None = None  # extend


@dataclass(frozen=True)
class Person:
    user: str
    groups: list[str] = field(default_factory=list)
    uid: str = ""
    extra: dict[str, list[str]] = field(default_factory=dict)
    via: Literal["kubernetes", "slack"] = "kubernetes"
    external_id: str = ""


class Refused(Exception):
    def __init__(self, code: int, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


class ClusterReviews:
    """TokenReview and SubjectAccessReview through the official client, off the event loop.
    Answers are read raw (`_preload_content=False`): the API's JSON, as documented."""

    def __init__(self, api_client: Any) -> None:
        from kubernetes import client as k8s

        self._authn = k8s.AuthenticationV1Api(api_client)
        self._authz = k8s.AuthorizationV1Api(api_client)

    async def who(self, token: str) -> Person:
        body = {
            "apiVersion": "authentication.k8s.io/v1",
            "kind": "TokenReview",
            "spec": {"token": token},
        }
        review = await self._call(self._authn.create_token_review, body, "TokenReview")
        status = review.get("status") or {}
        if not status.get("authenticated"):
            why = f": {status['error']}" if status.get("error") else ""
            raise Refused(401, f"the cluster did not authenticate this token{why}")
        info = status.get("user") or {}
        return Person(
            user=str(info.get("username") or ""),
            groups=[str(g) for g in info.get("groups") or []],
            uid=str(info.get("uid") or ""),
            extra={str(k): [str(x) for x in v] for k, v in (info.get("extra") or {}).items()},
        )

    async def may(self, person: Person, verb: str, name: str) -> None:
        spec: dict[str, Any] = {
            "user": person.user,
            "groups": person.groups,
            "resourceAttributes": {
                "group": ACTIONS_API_GROUP,
                "resource": ACTIONS_RESOURCE,
                "verb": verb,
                "name": name,
            },
        }
        if person.uid:
            spec["uid"] = person.uid
        if person.extra:
            spec["extra"] = person.extra
        body = {
            "apiVersion": "authorization.k8s.io/v1",
            "kind": "SubjectAccessReview",
            "spec": spec,
        }
        review = await self._call(
            self._authz.create_subject_access_review, body, "SubjectAccessReview"
        )
        status = review.get("status") or {}
        if status.get("allowed") and not status.get("denied"):
            return
        why = status.get("reason") or status.get("evaluationError") or "no RBAC rule grants it"
        raise Refused(
            403,
            f'User "{person.user}" may not {verb} {ACTIONS_RESOURCE}.{ACTIONS_API_GROUP} '
            f'"{name}": {why} (docs/deploy.md, "Granting people the right to act")',
        )

    @staticmethod
    async def _call(fn: Any, body: dict[str, Any], kind: str) -> dict[str, Any]:
        from kubernetes.client.exceptions import ApiException

        def call() -> dict[str, Any]:
            resp = fn(body, _preload_content=False, _request_timeout=10)  # the API's bound
            return dict(json.loads(resp.data))

        try:
            return await asyncio.to_thread(call)
        except ApiException as exc:
            raise Refused(
                503, f"the Kubernetes API refused the {kind} ({exc.status} {exc.reason})"
            ) from None
        except Exception as exc:  # unreachable, TLS, timeout: say which, never the body
            raise Refused(
                503, f"cannot reach the Kubernetes API for the {kind}: {type(exc).__name__}"
            ) from None


class SlackVerifier:
    """Slack's request signing (v0): signature, 5-minute timestamp window, replays."""

    def __init__(self, secret: bytes, clock: Any = time.time) -> None:
        self._secret = secret
        self._clock = clock
        self._seen: OrderedDict[str, float] = OrderedDict()

    def check(self, headers: Any, body: bytes) -> None:
        stamp = headers.get("x-slack-request-timestamp", "")
        given = headers.get("x-slack-signature", "")
        if not stamp.isdigit() or not given.startswith("v0="):
            raise Refused(401, "not signed by Slack (X-Slack-Signature / -Request-Timestamp)")
        now = self._clock()
        if abs(now - int(stamp)) > SLACK_MAX_AGE_SECONDS:
            raise Refused(401, "the Slack request is older than 5 minutes (or from the future)")
        base = b"v0:" + stamp.encode() + b":" + body
        want = "v0=" + hmac.new(self._secret, base, hashlib.sha256).hexdigest()
        if not hmac.compare_digest(want, given):
            raise Refused(401, "the Slack signature does not match")
        while self._seen and next(iter(self._seen.values())) < now - SLACK_MAX_AGE_SECONDS:
            self._seen.popitem(last=False)
        if given in self._seen:
            raise Refused(401, "this Slack request was already received (a replay)")
        if len(self._seen) >= SLACK_SEEN_MAX:
            self._seen.popitem(last=False)
        self._seen[given] = float(stamp)


class SlackUsers(BaseModel):
    """SICKBAY_SLACK_USERS_FILE: `users: {U0123ABC: {user: alice@example.com, groups: [sre]}}`."""

    model_config = ConfigDict(extra="forbid")

    class Mapped(BaseModel):
        model_config = ConfigDict(extra="forbid")
        user: str = Field(min_length=1)
        groups: list[str] = Field(default_factory=list)

    users: dict[str, Mapped] = Field(default_factory=dict)

    @classmethod
    def load(cls, path: Path | None) -> SlackUsers:
        if path is None:
            return cls()
        try:
            return cls.model_validate(yaml.safe_load(path.read_text()) or {})
        except (OSError, yaml.YAMLError, ValidationError) as exc:
            raise RuntimeError(f"SICKBAY_SLACK_USERS_FILE {path}: {exc}") from exc


# Slack button action ids (activities/notify/messages.py) -> action.
SLACK_ACTIONS: dict[str, Action] = {
    "sickbay-approve": "approve",
    "sickbay-reject": "reject",
    "sickbay-abort": "abort",
    "sickbay-repaired": "repaired",
}


class Actions:
    """The verified path: reviews, signing, the Temporal call, the confirmation."""

    def __init__(
        self,
        key: bytes | None,
        service: Any,
        reviews: ClusterReviews | None,
        slack: SlackVerifier | None = None,
        slack_users: SlackUsers | None = None,
    ) -> None:
        self.key = key
        self.service = service  # webhook AlertService: its Temporal client and settings
        self.reviews = reviews
        self.slack = slack
        self.slack_users = slack_users or SlackUsers()

    def ready(self) -> None:
        if self.key is None or self.reviews is None:
            raise Refused(
                503,
                "verified actions are not configured here (SICKBAY_ACTIONS_KEY_FILE and "
                "Kubernetes API access): use the direct Temporal path (recorded unverified)",
            )

    async def authenticate(self, header: str) -> Person:
        self.ready()
        assert self.reviews is not None
        scheme, _, token = header.partition(" ")
        if scheme.lower() != "bearer" or not token.strip():
            raise Refused(401, "send your Kubernetes bearer token (Authorization: Bearer ...)")
        return await self.reviews.who(token.strip())

    def slack_person(self, headers: Any, body: bytes) -> tuple[Person, ActionBody]:
        self.ready()
        if self.slack is None:
            raise Refused(503, "Slack actions are not configured (SICKBAY_SLACK_SIGNING_SECRET)")
        self.slack.check(headers, body)
        try:
            form = parse_qs(body.decode(), strict_parsing=True)
            payload = json.loads(form["payload"][0])
            user_id = str(payload["user"]["id"])
            pressed = payload["actions"][0]
            action = SLACK_ACTIONS[str(pressed["action_id"])]
            target = str(pressed["value"])
        except (ValueError, KeyError, IndexError, TypeError):
            raise Refused(422, "not a Slack block_actions payload from a Sickbay button") from None
        mapped = self.slack_users.users.get(user_id)
        if mapped is None:
            raise Refused(
                403,
                f"Slack user {user_id} is not mapped to a Kubernetes identity "
                "(SICKBAY_SLACK_USERS_FILE)",
            )
        person = Person(mapped.user, list(mapped.groups), via="slack", external_id=user_id)
        reason = f"from Slack ({payload.get('user', {}).get('username') or user_id})"
        return person, ActionBody(action=action, target=target, reason=reason)

    def workflow_id(self, target: str) -> str:
        if target.startswith("sickbay-"):
            return target
        node, sep, gpu = target.partition("/")
        if not sep or not node or not gpu or "/" in gpu:
            raise Refused(422, f"{target!r} is neither a workflow id nor node/GPU-uuid")
        return str(device_workflow_id(node, gpu, self.service.settings.cluster))

    async def perform(self, person: Person, body: ActionBody) -> tuple[int, dict[str, Any]]:
        assert self.reviews is not None and self.key is not None
        wf_id = self.workflow_id(body.target)
        await self.reviews.may(person, body.action, wf_id)
        client = await self.service.client()
        handle = client.get_workflow_handle(wf_id)
        key = self.key

        def signed(action: str, req: Contract) -> Any:
            return attest(
                key,
                wf_id,
                action,
                req,
                user=person.user,
                groups=person.groups,
                via=person.via,
                external_id=person.external_id,
            )

        log.info("verified %s on %s by %s (via %s)", body.action, wf_id, person.user, person.via)
        from temporalio.client import WorkflowUpdateFailedError
        from temporalio.service import RPCError, RPCStatusCode

        try:
            if body.action in ("approve", "reject"):
                decision = ApprovalDecision(
                    approve=body.action == "approve", actor=person.user, reason=body.reason
                )
                result = await handle.execute_update(
                    UPD_APPROVE, signed(body.action, decision), result_type=ApprovalResult
                )
                return 200, {
                    "workflow_id": wf_id,
                    "status": f"{body.action}d",
                    "phase": result.phase.value,
                    "actor": person.user,
                    "verified": True,
                }
            if body.action == "extend":
                try:
                    # As sent: the strict model reads the duration and the ISO time itself.
                    req = ExtendDeadlineRequest.model_validate(
                        {
                            "by": body.by,
                            "until": body.until,
                            "reason": body.reason,
                            "actor": person.user,
                        }
                    )
                except ValidationError as exc:
                    raise Refused(422, str(exc.errors()[0]["msg"])) from None
                extended = await handle.execute_update(
                    UPD_EXTEND_DEADLINE, signed("extend", req), result_type=ExtendDeadlineResult
                )
                return 200, {
                    "workflow_id": wf_id,
                    "status": "extended",
                    "deadline": extended.deadline.isoformat(),
                    "actor": person.user,
                    "verified": True,
                }
            if body.action == "abort":
                if not body.reason:
                    raise Refused(422, "abort needs a reason")
                await handle.signal(
                    SIG_ABORT, signed("abort", AbortRequest(reason=body.reason, actor=person.user))
                )
                action = "abort requested"
            else:
                await handle.signal(
                    SIG_REPAIRED,
                    signed("repaired", RepairedRequest(actor=person.user, note=body.reason)),
                )
                action = "marked repaired"
        except WorkflowUpdateFailedError as exc:
            return 409, {"workflow_id": wf_id, "error": f"refused: {exc.cause}"}
        except RPCError as exc:
            if exc.status == RPCStatusCode.NOT_FOUND:
                return 404, {"error": f"no running remediation {wf_id}"}
            raise Refused(503, f"Temporal refused the call: {exc.message}") from None
        entry = await _taken_in(handle, action, person.user)
        if entry is None:
            return 202, {
                "workflow_id": wf_id,
                "status": "sent; not taken in yet (is a worker running?)",
                "actor": person.user,
            }
        if entry.verification != "verified" or entry.action != action:
            return 409, {
                "workflow_id": wf_id,
                "error": f"the workflow did not count it as verified: {entry.action}: "
                f"{entry.reason}",
            }
        return 200, {
            "workflow_id": wf_id,
            "status": action,
            "actor": person.user,
            "verified": True,
        }


async def _taken_in(handle: Any, action: str, user: str) -> TimelineEntry | None:
    """The timeline entry of this action by `user` (taken in, or refused), once there."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + CONFIRM_SECONDS
    refused = action.split()[0] + " refused"
    if action == "marked repaired":
        refused = "repaired refused"
    while loop.time() < deadline:
        try:
            entries = await handle.query(
                QRY_TIMELINE, result_type=list[TimelineEntry], rpc_timeout=timedelta(seconds=5)
            )
        except Exception:  # no worker yet, or the run just closed: look again
            entries = []
        for e in reversed(entries):
            if e.actor == user and e.action in (action, refused):
                return e  # type: ignore[no-any-return]
        await asyncio.sleep(0.2)
    return None
