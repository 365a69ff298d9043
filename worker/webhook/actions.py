"""People's actions with a verified identity: `POST /v1/actions` and `POST /v1/slack/actions`.

`/v1/actions` (the CLI's `--via`): the person's Kubernetes bearer token (what kubectl sends:
the kubeconfig's token or its exec plugin's) in `Authorization`, and a JSON body
`{"action": "approve", "target": "<workflow id or node/GPU-uuid>", "reason": "..."}`.

1. TokenReview (authentication.k8s.io/v1): who the token is. Not authenticated: 401, before
   the body is read. The token is used for this one call and never logged or stored.
2. SubjectAccessReview (authorization.k8s.io/v1): may that user (with their groups) do verb
   `<action>` on resource `remediations` in API group `sickbay.dev`, name `<workflow id>`?
   No: 403 with the reason. (Verbs: contract.actors.ACTION_VERBS; "extend" is
   `extend-deadline`.) The name: the remediation's workflow id (approve ... extend, and
   `launch`, whose target is node/GPU-uuid); the cluster's GPU ledger workflow id
   (`unretire`, target GPU-uuid or node/GPU-uuid); the cluster's budget workflow id
   (`pause` / `resume`, target a cluster name, a budget workflow id, or `fleet`: every
   running budget, each authorized before any is sent). `launch` confirms the device with
   the Kubernetes API before anything starts (422 for a GPU the cluster has not got).
3. The signal / update goes to the workflow with `actor` = the verified user and a
   `verified` attachment signed with the actions key (contract/actors.py); the workflow has
   the worker check that signature before it counts the action as verified.

`/v1/slack/actions` (a Slack app's interactivity URL, the escalation's buttons): the request's
`X-Slack-Signature` (`v0=` HMAC-SHA256 of `v0:<timestamp>:<body>` with the app's signing
secret) and `X-Slack-Request-Timestamp` (within 5 minutes) are checked, a signature seen
before is refused (replay), the Slack user id is mapped to a Kubernetes user and groups
(SICKBAY_SLACK_USERS_FILE), and from there on it is step 2 and 3 above.

Answers: 200 taken in (the timeline, ledger or pause shows it verified), 202 sent but not yet
taken in, 401 not
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
from typing import Any, Literal, TypeVar
from urllib.parse import parse_qs

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from activities.actors import attest
from contract.actors import ACTIONS_API_GROUP, ACTIONS_RESOURCE
from contract.base import Contract, Duration
from contract.budget import BudgetState, PauseAnswer, PauseRequest, ResumeRequest
from contract.kube import DeviceRef
from contract.ledger import UnretireRequest, UnretireResult
from contract.names import (
    QRY_TIMELINE,
    SIG_ABORT,
    SIG_REPAIRED,
    UPD_APPROVE,
    UPD_BUDGET_PAUSE,
    UPD_BUDGET_RESUME,
    UPD_EXTEND_DEADLINE,
    UPD_LEDGER_UNRETIRE,
    WF_BUDGET,
    budget_task_queue,
    budget_workflow_id,
    check_cluster_name,
    device_workflow_id,
    ledger_workflow_id,
)
from contract.remediation import (
    AbortRequest,
    ApprovalDecision,
    ApprovalResult,
    ExtendDeadlineRequest,
    ExtendDeadlineResult,
    RemediationInput,
    RepairedRequest,
    TimelineEntry,
)

R = TypeVar("R", bound=Contract)

log = logging.getLogger(__name__)

# Slack: a request older (or newer) than this is refused (Slack's documented window).
SLACK_MAX_AGE_SECONDS = 300
# Signatures remembered against replays: for the window above, at most this many.
SLACK_SEEN_MAX = 10_000
# How long the endpoint waits for the workflow to take a signal in before answering 202.
CONFIRM_SECONDS = 10.0
ACTION_BODY_LIMIT = 64 * 1024

Action = Literal[
    "approve", "reject", "abort", "repaired", "extend", "unretire", "launch", "pause", "resume"
]
# The target of `pause` / `resume` that means every cluster of this Temporal namespace.
FLEET = "fleet"


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


class DeviceCheck:
    """A launch's device confirmed with the Kubernetes API, with the resolve-device activity's
    code (as the CLI's `sickbay launch` does): a typo is refused before anything starts."""

    def __init__(self, api_client: Any) -> None:
        self._api_client = api_client
        self._kube: Any = None

    async def confirm(self, node: str, gpu_uuid: str) -> DeviceRef:
        from temporalio.exceptions import ApplicationError

        from activities.kube import KubeActivities
        from activities.kube.client import Kube
        from contract.errors import ERR_DEVICE_NOT_FOUND
        from contract.kube import ResolveDeviceInput

        if self._kube is None:
            self._kube = KubeActivities(kube=Kube(self._api_client))
        asked = DeviceRef(node=node, gpu_uuid=gpu_uuid)
        try:
            found = await self._kube.resolve_device(ResolveDeviceInput(device=asked))
        except ApplicationError as exc:
            if exc.type == ERR_DEVICE_NOT_FOUND:
                raise Refused(422, f"no such device, nothing launched: {exc}") from None
            raise Refused(503, f"cannot confirm the device: {exc}") from None
        except Exception as exc:  # unreachable, TLS, timeout: say which
            raise Refused(
                503, f"cannot confirm the device with the Kubernetes API: {type(exc).__name__}"
            ) from None
        if (found.node, found.gpu_uuid) != (node, gpu_uuid):
            raise Refused(
                422,
                f"{gpu_uuid} is on node {found.node}, not {node}: nothing launched",
            )
        return asked


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
        devices: DeviceCheck | None = None,
    ) -> None:
        self.devices = devices
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
        if body.action == "unretire":
            return await self._unretire(person, body)
        if body.action == "launch":
            return await self._launch(person, body)
        if body.action in ("pause", "resume"):
            return await self._pause(person, body)
        wf_id = self.workflow_id(body.target)
        await self.reviews.may(person, body.action, wf_id)
        client = await self.service.client()
        handle = client.get_workflow_handle(wf_id)

        def signed(action: str, req: Contract) -> Any:
            return self._sign(person, wf_id, action, req)

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

    def _sign(self, person: Person, wf_id: str, action: str, req: R) -> R:
        assert self.key is not None
        return attest(
            self.key,
            wf_id,
            action,
            req,
            user=person.user,
            groups=person.groups,
            via=person.via,
            external_id=person.external_id,
        )

    async def _unretire(self, person: Person, body: ActionBody) -> tuple[int, dict[str, Any]]:
        """`unretire` of a GPU: SAR name = the cluster's GPU ledger workflow id."""
        assert self.reviews is not None
        from temporalio.client import WorkflowUpdateFailedError
        from temporalio.service import RPCError, RPCStatusCode

        node, sep, gpu = body.target.rpartition("/")
        if (sep and not node) or not gpu.startswith("GPU-"):
            raise Refused(422, f"{body.target!r} is neither a GPU UUID nor node/GPU-uuid")
        if not body.reason.strip():
            raise Refused(422, "unretire needs a reason")
        settings = self.service.settings
        wf_id = ledger_workflow_id(settings.task_queue, settings.cluster)
        await self.reviews.may(person, "unretire", wf_id)
        req = UnretireRequest(gpu_uuid=gpu, reason=body.reason, actor=person.user)
        log.info(
            "verified unretire of %s on %s by %s (via %s)", gpu, wf_id, person.user, person.via
        )
        client = await self.service.client()
        try:
            result = await client.get_workflow_handle(wf_id).execute_update(
                UPD_LEDGER_UNRETIRE,
                self._sign(person, wf_id, "unretire", req),
                result_type=UnretireResult,
            )
        except WorkflowUpdateFailedError as exc:
            return 409, {"workflow_id": wf_id, "error": f"refused: {exc.cause}"}
        except RPCError as exc:
            if exc.status == RPCStatusCode.NOT_FOUND:
                return 404, {"error": f"no GPU ledger {wf_id}: nothing is retired"}
            raise Refused(503, f"Temporal refused the call: {exc.message}") from None
        return _counted(
            wf_id,
            "un-retired",
            person,
            result.verification,
            gpu=gpu,
            holder=result.holder,
        )

    async def _launch(self, person: Person, body: ActionBody) -> tuple[int, dict[str, Any]]:
        """`launch` of a device's remediation: SAR name = its workflow id; the device is
        confirmed with the Kubernetes API first (a typo starts nothing)."""
        assert self.reviews is not None
        from activities.launch import signal_with_start

        wf_id = self.workflow_id(body.target)
        if body.target.startswith("sickbay-"):
            raise Refused(422, "launch takes node/GPU-uuid, not a workflow id")
        node, _, gpu = body.target.partition("/")
        await self.reviews.may(person, "launch", wf_id)
        settings = self.service.settings
        if self.devices is None:
            raise Refused(503, "launch needs the Kubernetes API to confirm the device")
        device = await self.devices.confirm(node, gpu)
        inp = RemediationInput(
            device=device,
            trigger="manual",
            requested_by=person.user,
            reason=body.reason,
            cluster=settings.cluster,
        )
        log.info("verified launch of %s by %s (via %s)", wf_id, person.user, person.via)
        client = await self.service.client()
        result = await signal_with_start(
            client, self._sign(person, wf_id, "launch", inp), task_queue=settings.task_queue
        )
        if not result.started:
            return 200, {
                "workflow_id": wf_id,
                "status": "signalled running (its launch stays as recorded)",
                "actor": person.user,
                "verified": False,
            }
        entry = await _taken_in(client.get_workflow_handle(wf_id), "launched", person.user)
        if entry is None:
            return 202, {
                "workflow_id": wf_id,
                "status": "started; not taken in yet (is a worker running?)",
                "actor": person.user,
            }
        return _counted(wf_id, "launched", person, entry.verification, reason=entry.reason)

    async def _pause(self, person: Person, body: ActionBody) -> tuple[int, dict[str, Any]]:
        """`pause` / `resume` of a cluster (SAR name = its budget workflow id) or of every
        cluster of the namespace (target `fleet`: a SAR for each budget workflow)."""
        assert self.reviews is not None
        from temporalio.client import WorkflowUpdateFailedError
        from temporalio.service import RPCError, RPCStatusCode

        from activities.update_with_start import UpdateSender

        if body.action == "pause" and not body.reason.strip():
            raise Refused(422, "pause needs a reason")
        settings = self.service.settings
        client = await self.service.client()
        if body.target == FLEET:
            query = f"WorkflowType = '{WF_BUDGET}' AND ExecutionStatus = 'Running'"
            ids = sorted({wf.id async for wf in client.list_workflows(query)})
            if not ids:
                return 404, {"error": "no cluster's budget workflow runs on this namespace"}
        elif body.target.startswith("sickbay-"):
            # A budget workflow id: this cluster's may be started (paused) here, any other
            # must be running (an id of no budget is never started).
            ids = [body.target]
        else:
            try:
                cluster = check_cluster_name(body.target)
            except ValueError as exc:
                raise Refused(422, str(exc)) from None
            ids = [budget_workflow_id(settings.task_queue, cluster)]
        startable = {budget_workflow_id(settings.task_queue, settings.cluster)}
        if body.target != FLEET and not body.target.startswith("sickbay-"):
            startable |= set(ids)
        for wf_id in ids:  # all authorized before any is sent
            await self.reviews.may(person, body.action, wf_id)
        answers = []
        for wf_id in ids:
            req: PauseRequest | ResumeRequest
            if body.action == "pause":
                req, update = PauseRequest(reason=body.reason, actor=person.user), UPD_BUDGET_PAUSE
            else:
                req = ResumeRequest(reason=body.reason, actor=person.user)
                update = UPD_BUDGET_RESUME
            signed = self._sign(person, wf_id, body.action, req)
            log.info(
                "verified %s of %s by %s (via %s)", body.action, wf_id, person.user, person.via
            )
            try:
                if wf_id not in startable:
                    answer = await client.get_workflow_handle(wf_id).execute_update(
                        update, signed, result_type=PauseAnswer
                    )
                else:  # a cluster named: its budget is started (paused) if it is not running
                    sender = UpdateSender(
                        client,
                        WF_BUDGET,
                        BudgetState(),
                        workflow_id=wf_id,
                        task_queue=budget_task_queue(settings.task_queue),
                        what="budget",
                    )
                    answer = await sender.send(update, signed, PauseAnswer)
            except WorkflowUpdateFailedError as exc:
                return 409, {"workflow_id": wf_id, "error": f"refused: {exc.cause}"}
            except RPCError as exc:
                if exc.status == RPCStatusCode.NOT_FOUND:
                    return 404, {"error": f"no running budget workflow {wf_id}"}
                raise Refused(503, f"Temporal refused the call: {exc.message}") from None
            answers.append((wf_id, answer))
        verification = "verified"
        for _, answer in answers:
            if answer.verification != "verified":
                verification = answer.verification or "unverified"
        status = "paused" if body.action == "pause" else "resumed"
        code, out = _counted(ids[0] if len(ids) == 1 else FLEET, status, person, verification)
        out["clusters"] = {
            wf_id: (a.pause.describe() if a.pause is not None else "running")
            for wf_id, a in answers
        }
        return code, out


def _counted(
    wf_id: str, status: str, person: Person, verification: str, **extra: Any
) -> tuple[int, dict[str, Any]]:
    """200 when the workflow counted the person verified; 409 (it was done, but recorded
    unverified: the worker's actions key differs, or the signature aged) otherwise."""
    if verification != "verified":
        why = extra.get("reason") or "is the worker's actions key the webhook's?"
        return 409, {
            "workflow_id": wf_id,
            "error": f"{status}, but the workflow recorded it as unverified ({why})",
        }
    out = {"workflow_id": wf_id, "status": status, "actor": person.user, "verified": True}
    return 200, {**out, **{k: v for k, v in extra.items() if k != "reason"}}


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
