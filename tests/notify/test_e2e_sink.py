"""End to end: a worker on the Temporal dev server runs NotifyActivities for a remediation-like
escalation; a loopback HTTP sink plays PagerDuty, Slack and a generic webhook.

Cases:
- one trigger per channel reaches the sink with the right shape (PagerDuty event with the
  dedup key, Slack blocks, webhook incident JSON);
- a channel answering 503 twice is retried by Temporal and delivers on the third try; the
  result lists the two failed tries (heartbeat details carried between tries) for the timeline;
- resolve reaches PagerDuty with the same dedup key.
"""

from __future__ import annotations

import uuid
from pathlib import Path

import pytest
from temporalio.testing import WorkflowEnvironment
from temporalio.worker import Worker

from activities.notify.activities import NotifyActivities
from activities.notify.config import ChannelsConfig
from contract.notify import NotifyInput, NotifyResult
from tests.notify.escalator import Escalator
from tests.notify.sink import LoopbackServer, Sink
from tests.notify.test_channels import incident


async def test_escalation_reaches_every_channel(
    dev_env: WorkflowEnvironment, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    sink = Sink()
    sink.fail("/slack/T1/B1/secret", 503, 503)
    async with LoopbackServer(sink.app()) as server:
        monkeypatch.setenv("E2E_PD_KEY", "e2e-routing-key")
        monkeypatch.setenv("E2E_SLACK_URL", f"{server.url}/slack/T1/B1/secret")
        path = tmp_path / "channels.yaml"
        path.write_text(
            f"""
channels:
  oncall: {{type: pagerduty, routingKey: {{env: E2E_PD_KEY}}, url: "{server.url}/v2/enqueue"}}
  team: {{type: slack, webhookUrl: {{env: E2E_SLACK_URL}}}}
  audit: {{type: webhook, url: "{server.url}/hooks/sickbay"}}
"""
        )
        notify = NotifyActivities(ChannelsConfig.load(path))
        task_queue = f"notify-{uuid.uuid4()}"
        inc = incident()
        async with Worker(
            dev_env.client,
            task_queue=task_queue,
            workflows=[Escalator],
            activities=[notify.notify],
        ):
            results: list[NotifyResult] = await dev_env.client.execute_workflow(
                Escalator.run,
                [
                    NotifyInput(channel="oncall", incident=inc),
                    NotifyInput(channel="team", incident=inc),
                    NotifyInput(channel="audit", incident=inc),
                    NotifyInput(channel="oncall", action="resolve", incident=inc),
                ],
                id=f"escalate-{uuid.uuid4()}",
                task_queue=task_queue,
                result_type=list[NotifyResult],
            )
        await notify.aclose()

    assert [r.delivered for r in results] == [True, True, True, True]
    pd = sink.at("/v2/enqueue")
    assert [e.json()["event_action"] for e in pd] == ["trigger", "resolve"]
    assert {e.json()["dedup_key"] for e in pd} == {inc.id}
    assert pd[0].json()["payload"]["severity"] == "critical"

    slack = sink.at("/slack/T1/B1/secret")
    assert len(slack) == 3  # two 503s, then delivered
    assert results[1].attempt == 3
    assert len(results[1].earlier_failures) == 2
    assert results[1].earlier_failures[0].startswith("try 1 team: Slack HTTP 503")
    assert "secret" not in " ".join(results[1].earlier_failures)
    assert slack[-1].json()["blocks"][0]["text"]["text"].startswith("GPU node-a/GPU-1234")

    hook = sink.at("/hooks/sickbay")
    assert len(hook) == 1 and hook[0].json()["incident"]["needed"].startswith("Replacement")
