"""`POST /v1/actions` against the twin's TokenReview / SubjectAccessReview and a real
remediation (FakeWorld activities, the production workflow, the dev server):

- a bad token is 401 before anything else; a person RBAC does not grant the verb is 403 with
  the reason; a person it grants (through a group) approves and marks repaired, and the
  timeline records them *verified*, with their groups, via kubernetes;
- a runbook requiring verified actors refuses the same approve sent straight through Temporal;
- the CLI's `--via` sends the kubeconfig's token and prints who the cluster said it is;
- no token appears in the workflow history, the webhook's log or the twin's request log.
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from pydantic import SecretStr
from temporalio.client import WorkflowUpdateFailedError
from temporalio.testing import WorkflowEnvironment

from activities.notify.messages import slack_message
from contract.names import UPD_APPROVE
from contract.notify import Incident
from contract.remediation import ApprovalDecision, ApprovalResult, Phase, RemediationStatus
from tests.webhook.helpers import TOKEN, serve, settings_for
from tests.webhook.slack_standin import SlackStandIn
from tests.workflows.fakes import (
    ACTIONS_TEST_KEY,
    FakeWorld,
    make_runbook,
    new_worker,
    shipped_runbooks,
    start,
    wait_phase,
)
from twin.testing import RunningTwin
from worker.cli import main as cli_main
from worker.settings import WebhookSettings
from worker.webhook.app import create_app

RBAC = "rbac.authorization.k8s.io"


@pytest.fixture
def people(twin: RunningTwin) -> Iterator[dict[str, str]]:
    """alice (group sre-oncall, bound to a ClusterRole granting the Sickbay verbs) and bob
    (no grant), each with a bearer token the twin knows."""
    tag = uuid.uuid4().hex[:6]
    role, group = f"sickbay-approver-{tag}", f"sre-oncall-{tag}"
    twin.store.create(
        f"clusterroles.{RBAC}",
        {
            "metadata": {"name": role},
            "rules": [
                {
                    "apiGroups": ["sickbay.dev"],
                    "resources": ["remediations"],
                    "verbs": ["approve", "reject", "repaired", "abort"],
                }
            ],
        },
    )
    twin.store.create(
        f"clusterrolebindings.{RBAC}",
        {
            "metadata": {"name": role},
            "roleRef": {"apiGroup": RBAC, "kind": "ClusterRole", "name": role},
            "subjects": [{"kind": "Group", "apiGroup": RBAC, "name": group}],
        },
    )
    tokens = {"alice": f"alice-{uuid.uuid4().hex}", "bob": f"bob-{uuid.uuid4().hex}"}
    twin.twin.add_user(tokens["alice"], f"alice-{tag}", [group])
    twin.twin.add_user(tokens["bob"], f"bob-{tag}", ["developers"])
    yield {**tokens, "tag": tag, "group": group}
    twin.store.delete(f"clusterrolebindings.{RBAC}", role)
    twin.store.delete(f"clusterroles.{RBAC}", role)


async def test_verified_actions_through_the_cluster(
    dev_env: WorkflowEnvironment,
    twin: RunningTwin,
    people: dict[str, str],
    caplog: pytest.LogCaptureFixture,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
) -> None:
    caplog.set_level(logging.DEBUG)
    tag = people["tag"]
    others = [r for r in shipped_runbooks() if r.name != "inference"]
    gated = make_runbook(
        "inference",
        50,
        match={"ownerKinds": ["Deployment"]},
        approval={"required": True},
        requireVerifiedActors=True,
    )
    world = FakeWorld(runbooks=[*others, gated])
    queue = f"actions-{uuid.uuid4().hex[:8]}"
    settings = settings_for(dev_env, queue).model_copy(
        update={"actions_key": SecretStr(ACTIONS_TEST_KEY.decode())}
    )
    app = create_app(
        settings,
        dev_env.client,
        webhook=WebhookSettings(webhook_token=TOKEN),
        kube_api_client=twin.api_client(),
    )
    async with new_worker(dev_env.client, world, task_queue=queue) as worker, serve(app) as url:
        handle = await start(dev_env.client, worker, world)
        await wait_phase(handle, Phase.AWAITING_APPROVAL)
        async with httpx.AsyncClient(base_url=url, timeout=30) as http:

            async def act(token: str, action: str, reason: str = "checked") -> httpx.Response:
                return await http.post(
                    "/v1/actions",
                    json={"action": action, "target": handle.id, "reason": reason},
                    headers={"Authorization": f"Bearer {token}"},
                )

            bad = await act("not-a-token-the-cluster-knows", "approve")
            assert bad.status_code == 401
            assert "did not authenticate" in bad.json()["error"]
            no_header = await http.post("/v1/actions", json={})
            assert no_header.status_code == 401

            refused = await act(people["bob"], "approve")
            assert refused.status_code == 403
            assert (
                f'User "bob-{tag}" may not approve remediations.sickbay.dev "{handle.id}"'
                in refused.json()["error"]
            )

            # Straight through Temporal: refused by the runbook, recorded with the claim.
            with pytest.raises(WorkflowUpdateFailedError):
                await handle.execute_update(
                    UPD_APPROVE,
                    ApprovalDecision(approve=True, actor=f"alice-{tag}", reason="direct"),
                    result_type=ApprovalResult,
                )

            approved = await act(people["alice"], "approve", "looks right")
            assert approved.status_code == 200, approved.text
            assert approved.json()["actor"] == f"alice-{tag}"
            await wait_phase(handle, Phase.HOLDING)
            # The CLI: alice's kubeconfig token, through the endpoint (`--via`).
            kubeconfig = twin.twin.write_kubeconfig(tmp_path / "alice", token=people["alice"])
            monkeypatch.setenv("KUBECONFIG", str(kubeconfig))
            argv = ["repaired", handle.id, "--via", url, "--reason", "reseated"]
            capsys.readouterr()
            assert await asyncio.to_thread(cli_main, argv) == 0
            out = capsys.readouterr()
            assert f"marked repaired, verified as alice-{tag}" in out.out
            assert people["alice"] not in out.out + out.err
        result = await handle.result()
    assert result.outcome == "released"
    by_action = {e.action: e for e in result.timeline}
    assert by_action["approve refused"].verification == "unverified"
    for action in ("approved", "marked repaired"):
        e = by_action[action]
        assert (e.actor, e.verification, e.via) == (f"alice-{tag}", "verified", "kubernetes")
        assert people["group"] in e.groups
    history = (await handle.fetch_history()).to_json()
    logs = caplog.text + "\n".join(str(r.__dict__) for r in twin.requests())
    for token in (people["alice"], people["bob"], ACTIONS_TEST_KEY.decode()):
        assert token not in history
        assert token not in logs


SLACK_SECRET = b"slack-signing-secret-0123456789abcdef"


async def test_slack_buttons_are_verified_actors(
    dev_env: WorkflowEnvironment,
    twin: RunningTwin,
    people: dict[str, str],
    tmp_path: Path,
) -> None:
    """The holding incident's Slack message carries Mark repaired / Abort buttons; a press
    signed as Slack signs it, by a mapped user RBAC allows, releases the device as a verified
    actor (via slack). A bad signature, an old timestamp, a replay, an unmapped user and a
    mapped user without the grant are refused."""
    tag = people["tag"]
    world = FakeWorld()
    queue = f"slack-{uuid.uuid4().hex[:8]}"
    users = tmp_path / "slack-users.yaml"
    users.write_text(
        f"users:\n"
        f"  U0ALICE: {{user: alice-{tag}, groups: [{people['group']}]}}\n"
        f"  U0BOB: {{user: bob-{tag}, groups: [developers]}}\n"
    )
    settings = settings_for(dev_env, queue).model_copy(
        update={
            "actions_key": SecretStr(ACTIONS_TEST_KEY.decode()),
            "slack_signing_secret": SecretStr(SLACK_SECRET.decode()),
            "slack_users_file": users,
        }
    )
    app = create_app(
        settings,
        dev_env.client,
        webhook=WebhookSettings(webhook_token=TOKEN),
        kube_api_client=twin.api_client(),
    )
    slack = SlackStandIn(SLACK_SECRET)
    async with new_worker(dev_env.client, world, task_queue=queue) as worker, serve(app) as url:
        handle = await start(dev_env.client, worker, world)
        await wait_phase(handle, Phase.HOLDING)
        status = await handle.query("status", result_type=RemediationStatus)
        message = slack_message(
            Incident(id=handle.id, device=status.device, phase=status.phase, summary="held"),
            "trigger",
        )
        async with httpx.AsyncClient(base_url=url, timeout=30) as http:

            async def send(headers: dict[str, str], body: bytes) -> httpx.Response:
                return await http.post("/v1/slack/actions", headers=headers, content=body)

            forged = await send(
                *slack.press(message, "sickbay-repaired", "U0ALICE", secret=b"x" * 32)
            )
            assert forged.status_code == 401 and "does not match" in forged.json()["error"]
            old = await send(
                *slack.press(message, "sickbay-repaired", "U0ALICE", at=time.time() - 600)
            )
            assert old.status_code == 401 and "older than 5 minutes" in old.json()["error"]
            stranger = await send(*slack.press(message, "sickbay-repaired", "U0EVE"))
            assert stranger.status_code == 403
            assert "U0EVE is not mapped" in stranger.json()["error"]
            bob = await send(*slack.press(message, "sickbay-repaired", "U0BOB"))
            assert bob.status_code == 403
            assert f'User "bob-{tag}" may not repaired' in bob.json()["error"]

            good = slack.press(message, "sickbay-repaired", "U0ALICE")
            taken = await send(*good)
            assert taken.status_code == 200, taken.text
            assert "verified" in taken.json()["text"]
            replay = await send(*good)
            assert replay.status_code == 401 and "replay" in replay.json()["error"]
        result = await handle.result()
    assert result.outcome == "released"
    (repaired,) = [e for e in result.timeline if e.action == "marked repaired"]
    assert (repaired.actor, repaired.verification, repaired.via) == (
        f"alice-{tag}",
        "verified",
        "slack",
    )
    assert repaired.who().startswith(f"verified user alice-{tag} (via slack")


def test_slack_messages_carry_the_buttons_of_their_phase() -> None:
    def ids(phase: Phase, action: str = "trigger", reason: str | None = None) -> list[str]:
        message = slack_message(
            Incident(id="sickbay-gpu-x", device="n/GPU-1", phase=phase, summary="s", reason=reason),
            action,
        )
        return [
            e["action_id"]
            for b in message["blocks"]
            if b["type"] == "actions"
            for e in b["elements"]
            if e["value"] == "sickbay-gpu-x"
        ]

    assert ids(Phase.AWAITING_APPROVAL) == ["sickbay-approve", "sickbay-reject", "sickbay-abort"]
    assert ids(Phase.HOLDING) == ["sickbay-repaired", "sickbay-abort"]
    assert ids(Phase.ESCALATED) == ["sickbay-repaired", "sickbay-abort"]
    assert ids(Phase.HOLDING, "resolve") == []
    assert ids(Phase.QUARANTINING) == []
    # The workload owners' note of an application error: nothing held, nothing to press.
    assert ids(Phase.ESCALATED, reason="application-error") == []


def test_a_short_actions_key_is_refused_and_none_turns_the_endpoint_off(tmp_path: Path) -> None:
    from worker.settings import Settings

    with pytest.raises(RuntimeError, match="shorter than 32"):
        Settings(actions_key=SecretStr("short-key")).actions_key_bytes()
    with pytest.raises(RuntimeError, match="cannot read SICKBAY_ACTIONS_KEY_FILE"):
        Settings(actions_key_file=tmp_path / "absent").actions_key_bytes()
    assert Settings().actions_key_bytes() is None


async def test_without_a_key_the_endpoint_answers_503(dev_env: WorkflowEnvironment) -> None:
    app = create_app(
        settings_for(dev_env, "no-key"),
        dev_env.client,
        webhook=WebhookSettings(webhook_token=TOKEN),
    )
    async with serve(app) as url, httpx.AsyncClient(base_url=url, timeout=30) as http:
        answer = await http.post(
            "/v1/actions",
            json={"action": "abort", "target": "sickbay-gpu-x", "reason": "x"},
            headers={"Authorization": "Bearer something"},
        )
    assert answer.status_code == 503
    assert "not configured" in answer.json()["error"]
