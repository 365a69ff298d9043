"""Notification channels: request shapes checked against the services' public API documents
(respx stands in for the services), and error handling.

PagerDuty Events API v2 (POST https://events.pagerduty.com/v2/enqueue):
- trigger: routing_key, event_action, dedup_key = incident id, payload.summary / source /
  severity (from the runbook) / timestamp / component / group / class, custom_details with the
  timeline summary, links + client_url to the workflow; JSON content type;
- acknowledge / resolve: only routing_key, event_action, dedup_key;
- routing key from env and from a file; missing -> ERR_CONFIG, non-retryable;
- 400 invalid event -> ERR_CHANNEL_REJECTED non-retryable with PagerDuty's errors;
- 429 with Retry-After -> retryable with that delay; 500 -> retryable; the try is remembered.
Slack incoming webhook (POST to the webhook URL, text + blocks):
- readable message: device, node, workload, phase, what was done, what is needed, UI link;
  mrkdwn escaping;
- 404 no_service -> rejected, and the secret URL never appears in the error.
Generic webhook: incident and timeline JSON, headers from env, HMAC signature verifies.
Channels file: secret references only, unknown fallback refused, unknown channel -> ERR_CONFIG.
Fallback: a refused channel hands the message to its fallback; a failing one from try N.
"""

from __future__ import annotations

import hashlib
import hmac
import json
from datetime import UTC, datetime, timedelta
from pathlib import Path

import httpx
import pytest
import respx
from temporalio.exceptions import ApplicationError
from temporalio.testing import ActivityEnvironment

from activities.notify.activities import NotifyActivities
from activities.notify.config import ChannelsConfig
from activities.outbound import ConfigError
from contract.errors import ERR_CHANNEL_REJECTED, ERR_CHANNEL_UNAVAILABLE, ERR_CONFIG
from contract.notify import Incident, NotifyInput, NotifyResult
from contract.remediation import Phase, TimelineEntry

PD_URL = "https://events.pagerduty.com/v2/enqueue"
SLACK_URL = "https://hooks.slack.com/services/T000/B000/XXXXSECRETXXXX"
HOOK_URL = "https://hooks.example.internal/sickbay"
T0 = datetime(2026, 11, 29, 9, 0, tzinfo=UTC)


def incident(**kw: object) -> Incident:
    fields: dict[str, object] = dict(
        id="sickbay-gpu-node-a-gpu-1234",
        device="node-a/GPU-1234",
        node="node-a",
        workload="inference/llm-server",
        phase=Phase.ESCALATED,
        severity="critical",
        reason="no-capacity",
        node_pool="h100",
        summary="GPU GPU-1234 on node-a fell off the bus (Xid 79); no capacity for the replacement",
        done=["quarantined GPU-1234 (DeviceTaintRule, NoExecute)", "evicted llm-server-abc"],
        needed="Replacement pod Pending: approve a scale-up or free a GPU in pool h100",
        ui_url="http://localhost:8233/namespaces/default/workflows/sickbay-gpu-node-a-gpu-1234",
        timeline=[
            TimelineEntry(at=T0, phase=Phase.QUARANTINING, action="taint", outcome="created"),
            TimelineEntry(
                at=T0 + timedelta(minutes=5),
                phase=Phase.SCALING,
                action="scale-up",
                outcome="at-max",
                reason="pool at max 4",
            ),
        ],
    )
    fields.update(kw)
    return Incident.model_validate(fields)


def channels(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, extra: str = "") -> ChannelsConfig:
    monkeypatch.setenv("PD_KEY", "R0UTINGKEY0123456789abcdef012345")
    (tmp_path / "slack-url").write_text(SLACK_URL + "\n")
    monkeypatch.setenv("HOOK_AUTH", "Bearer hook-token")
    monkeypatch.setenv("HOOK_SECRET", "s3cret")
    path = tmp_path / "channels.yaml"
    path.write_text(
        f"""
channels:
  oncall:
    type: pagerduty
    routingKey: {{env: PD_KEY}}
  team:
    type: slack
    webhookUrl: {{file: {tmp_path / "slack-url"}}}
  audit:
    type: webhook
    url: {HOOK_URL}
    headers: {{Authorization: {{env: HOOK_AUTH}}, X-Static: fixed}}
    signingSecret: {{env: HOOK_SECRET}}
{extra}"""
    )
    return ChannelsConfig.load(path)


@pytest.fixture
def acts(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> NotifyActivities:
    return NotifyActivities(channels(tmp_path, monkeypatch))


async def run(acts: NotifyActivities, req: NotifyInput, attempt: int = 1) -> NotifyResult:
    env = ActivityEnvironment()
    env.info = env.info.__class__(**{**env.info.__dict__, "attempt": attempt})
    return await env.run(acts.notify, req)


@respx.mock
async def test_pagerduty_trigger_shape(acts: NotifyActivities) -> None:
    route = respx.post(PD_URL).respond(
        202, json={"status": "success", "message": "Event processed", "dedup_key": "x"}
    )
    result = await run(acts, NotifyInput(channel="oncall", incident=incident()))
    assert result.delivered and result.attempt == 1 and "Event processed" in result.detail
    request = route.calls.last.request
    assert request.headers["content-type"] == "application/json"
    event = json.loads(request.content)
    assert event["routing_key"] == "R0UTINGKEY0123456789abcdef012345"
    assert event["event_action"] == "trigger"
    assert event["dedup_key"] == "sickbay-gpu-node-a-gpu-1234"
    payload = event["payload"]
    assert payload["summary"].startswith("GPU GPU-1234 on node-a fell off the bus")
    assert payload["source"] == "node-a"
    assert payload["severity"] == "critical"
    assert datetime.fromisoformat(payload["timestamp"]).tzinfo is not None
    assert payload["component"] == "node-a/GPU-1234"
    assert payload["group"] == "inference/llm-server"
    assert payload["class"] == "gpu-remediation"
    details = payload["custom_details"]
    assert details["phase"] == "escalated"
    # what PagerDuty's content-based grouping can merge a storm of incidents by
    assert (details["reason"], details["node_pool"]) == ("no-capacity", "h100")
    assert details["needed"].startswith("Replacement pod Pending")
    assert details["timeline"] == [
        "09:00:00Z quarantining: taint -> created",
        "09:05:00Z scaling: scale-up -> at-max (pool at max 4)",
    ]
    assert event["links"][0]["href"].endswith("/workflows/sickbay-gpu-node-a-gpu-1234")
    assert event["client_url"] == event["links"][0]["href"]


@pytest.mark.parametrize("action", ["acknowledge", "resolve"])
@respx.mock
async def test_pagerduty_ack_and_resolve_carry_only_keys(
    acts: NotifyActivities, action: str
) -> None:
    route = respx.post(PD_URL).respond(202, json={"status": "success", "dedup_key": "x"})
    await run(acts, NotifyInput(channel="oncall", action=action, incident=incident()))  # type: ignore[arg-type]
    assert json.loads(route.calls.last.request.content) == {
        "routing_key": "R0UTINGKEY0123456789abcdef012345",
        "event_action": action,
        "dedup_key": "sickbay-gpu-node-a-gpu-1234",
    }


@respx.mock
async def test_pagerduty_invalid_event_is_rejected_for_good(acts: NotifyActivities) -> None:
    respx.post(PD_URL).respond(
        400,
        json={
            "status": "invalid event",
            "message": "Event object is invalid",
            "errors": ["'routing_key' is invalid"],
        },
    )
    with pytest.raises(ApplicationError) as info:
        await run(acts, NotifyInput(channel="oncall", incident=incident()))
    assert info.value.type == ERR_CHANNEL_REJECTED and info.value.non_retryable
    assert "Event object is invalid" in str(info.value)
    assert "'routing_key' is invalid" in str(info.value)


@respx.mock
async def test_pagerduty_rate_limit_is_retried_after_its_delay(acts: NotifyActivities) -> None:
    respx.post(PD_URL).respond(429, headers={"Retry-After": "7"}, text="Too Many Requests")
    with pytest.raises(ApplicationError) as info:
        await run(acts, NotifyInput(channel="oncall", incident=incident()))
    assert info.value.type == ERR_CHANNEL_UNAVAILABLE and not info.value.non_retryable
    assert info.value.next_retry_delay == timedelta(seconds=7)


@respx.mock
async def test_server_error_is_retryable(acts: NotifyActivities) -> None:
    respx.post(PD_URL).respond(503, text="upstream down")
    with pytest.raises(ApplicationError) as info:
        await run(acts, NotifyInput(channel="oncall", incident=incident()))
    assert info.value.type == ERR_CHANNEL_UNAVAILABLE and not info.value.non_retryable
    assert "503" in str(info.value)


async def test_missing_routing_key_is_a_config_error(
    acts: NotifyActivities, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("PD_KEY")
    with pytest.raises(ApplicationError) as info:
        await run(acts, NotifyInput(channel="oncall", incident=incident()))
    assert info.value.type == ERR_CONFIG and info.value.non_retryable
    assert "PD_KEY" in str(info.value)


@respx.mock
async def test_routing_key_from_file_via_env_file_convention(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    acts = NotifyActivities(channels(tmp_path, monkeypatch))
    monkeypatch.delenv("PD_KEY")
    (tmp_path / "pd-key").write_text("FILEKEY\n")
    monkeypatch.setenv("PD_KEY_FILE", str(tmp_path / "pd-key"))
    route = respx.post(PD_URL).respond(202, json={"status": "success"})
    await run(acts, NotifyInput(channel="oncall", incident=incident()))
    assert json.loads(route.calls.last.request.content)["routing_key"] == "FILEKEY"


@respx.mock
async def test_slack_message_is_readable(acts: NotifyActivities) -> None:
    route = respx.post(SLACK_URL).respond(200, text="ok")
    inc = incident(done=["evicted <pod> & friends"])
    result = await run(acts, NotifyInput(channel="team", incident=inc))
    assert result.delivered and result.detail == "Slack ok"
    message = json.loads(route.calls.last.request.content)
    assert "node-a/GPU-1234" in message["text"] and "needs attention" in message["text"]
    text = json.dumps(message["blocks"])
    for expected in (
        "*Device*\\nnode-a/GPU-1234",
        "*Node*\\nnode-a",
        "*Workload*\\ninference/llm-server",
        "*Phase*\\nescalated",
        "*Reason*\\nno-capacity",
        "*Node pool*\\nh100",
        "*What was done*",
        "evicted &lt;pod&gt; &amp; friends",
        "*What is needed*\\nReplacement pod Pending",
        "<http://localhost:8233/namespaces/default/workflows/sickbay-gpu-node-a-gpu-1234|Open the workflow in Temporal UI>",
    ):
        assert expected in text, expected
    assert message["blocks"][0]["type"] == "header"


@respx.mock
async def test_slack_rejection_never_leaks_the_webhook_url(acts: NotifyActivities) -> None:
    respx.post(SLACK_URL).respond(404, text="no_service")
    with pytest.raises(ApplicationError) as info:
        await run(acts, NotifyInput(channel="team", incident=incident()))
    assert info.value.type == ERR_CHANNEL_REJECTED and "no_service" in str(info.value)
    assert "XXXXSECRETXXXX" not in str(info.value)


@respx.mock
async def test_slack_transport_error_never_leaks_the_webhook_url(acts: NotifyActivities) -> None:
    respx.post(SLACK_URL).mock(side_effect=httpx.ConnectError("connection refused"))
    with pytest.raises(ApplicationError) as info:
        await run(acts, NotifyInput(channel="team", incident=incident()))
    assert info.value.type == ERR_CHANNEL_UNAVAILABLE
    assert "XXXXSECRETXXXX" not in str(info.value)


@respx.mock
async def test_generic_webhook_body_headers_and_signature(acts: NotifyActivities) -> None:
    route = respx.post(HOOK_URL).respond(204)
    await run(acts, NotifyInput(channel="audit", action="resolve", incident=incident()))
    request = route.calls.last.request
    assert request.headers["authorization"] == "Bearer hook-token"
    assert request.headers["x-static"] == "fixed"
    expected = hmac.new(b"s3cret", request.content, hashlib.sha256).hexdigest()
    assert request.headers["x-sickbay-signature"] == f"sha256={expected}"
    body = json.loads(request.content)
    assert body["action"] == "resolve"
    assert body["incident"]["id"] == "sickbay-gpu-node-a-gpu-1234"
    assert body["incident"]["timeline"][1]["outcome"] == "at-max"
    assert body["timeline_summary"][0] == "09:00:00Z quarantining: taint -> created"


async def test_unknown_channel_names_the_configured_ones(acts: NotifyActivities) -> None:
    with pytest.raises(ApplicationError) as info:
        await run(acts, NotifyInput(channel="nope", incident=incident()))
    assert info.value.type == ERR_CONFIG and info.value.non_retryable
    assert "audit, oncall, team" in str(info.value)


def test_channels_file_refuses_inline_secrets_and_unknown_fallbacks(tmp_path: Path) -> None:
    path = tmp_path / "c.yaml"
    path.write_text("channels:\n  x: {type: pagerduty, routingKey: plain-secret-string}\n")
    with pytest.raises(ConfigError, match=r"channels\.x"):
        ChannelsConfig.load(path)
    path.write_text("channels:\n  x: {type: slack, webhookUrl: {env: U}, fallback: missing}\n")
    with pytest.raises(ConfigError, match="fallback 'missing' is not defined"):
        ChannelsConfig.load(path)


@respx.mock
async def test_refused_channel_falls_back(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    cfg = channels(
        tmp_path,
        monkeypatch,
        extra="  paged:\n    type: pagerduty\n    routingKey: {env: PD_KEY}\n    fallback: team\n",
    )
    acts = NotifyActivities(cfg)
    respx.post(PD_URL).respond(400, json={"status": "invalid event", "message": "bad key"})
    slack = respx.post(SLACK_URL).respond(200, text="ok")
    result = await run(acts, NotifyInput(channel="paged", incident=incident()))
    assert result.delivered and result.delivered_via == "team"
    assert result.earlier_failures == ["try 1 paged: PagerDuty HTTP 400: bad key"]
    assert slack.called


@respx.mock
async def test_failing_channel_falls_back_from_the_configured_try(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    cfg = channels(
        tmp_path,
        monkeypatch,
        extra=(
            "  paged:\n    type: pagerduty\n    routingKey: {env: PD_KEY}\n"
            "    fallback: team\n    fallbackAfterAttempts: 3\n"
        ),
    )
    acts = NotifyActivities(cfg)
    respx.post(PD_URL).respond(503)
    slack = respx.post(SLACK_URL).respond(200, text="ok")
    with pytest.raises(ApplicationError):  # try 2: not yet
        await run(acts, NotifyInput(channel="paged", incident=incident()), attempt=2)
    assert not slack.called
    result = await run(acts, NotifyInput(channel="paged", incident=incident()), attempt=3)
    assert result.delivered_via == "team" and result.attempt == 3


@respx.mock
async def test_workflow_link_is_added_from_the_worker_ui_url(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    acts = NotifyActivities(channels(tmp_path, monkeypatch), ui_url="https://temporal.example/")
    route = respx.post(SLACK_URL).respond(200, text="ok")
    await run(acts, NotifyInput(channel="team", incident=incident(ui_url=None)))
    text = json.dumps(json.loads(route.calls.last.request.content)["blocks"])
    # ActivityEnvironment's namespace is "default"
    assert (
        "<https://temporal.example/namespaces/default/workflows/sickbay-gpu-node-a-gpu-1234|"
        "Open the workflow in Temporal UI>"
    ) in text
