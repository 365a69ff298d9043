"""What the webhook says in its log (over real HTTP, the session's dev server).

Cases:
- a wrong or missing token: 401 and a WARNING naming the cause and the peer, never the
  token; repeated 401s are said once per window, with how many were not said;
- every notification gets one summary line, also one that held only duplicates or signals;
- an alert Sickbay cannot use is a WARNING with its reason (never a quiet 200).
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import AsyncIterator

import httpx
import pytest
from temporalio.testing import WorkflowEnvironment

from contract.names import device_workflow_id
from tests.webhook.helpers import (
    TOKEN,
    auth,
    payload,
    serve,
    settings_for,
    unique_device,
    xid_alert,
)
from worker.settings import WebhookSettings
from worker.webhook.app import create_app

pytestmark = pytest.mark.devserver


@pytest.fixture
async def http(dev_env: WorkflowEnvironment) -> AsyncIterator[httpx.AsyncClient]:
    app = create_app(
        settings_for(dev_env, f"log-{uuid.uuid4().hex[:8]}"),
        dev_env.client,
        webhook=WebhookSettings(webhook_token=TOKEN),
    )
    async with serve(app) as url, httpx.AsyncClient(base_url=url, timeout=30) as client:
        yield client


def lines(caplog: pytest.LogCaptureFixture, text: str) -> list[logging.LogRecord]:
    return [r for r in caplog.records if text in r.getMessage()]


async def test_401_is_logged_rate_limited(
    http: httpx.AsyncClient, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    caplog.set_level(logging.INFO, logger="worker.webhook")
    node, gpu = unique_device()
    body = payload(xid_alert(node, gpu))
    for _ in range(5):
        resp = await http.post("/v1/alertmanager", json=body, headers=auth("wrong-token"))
        assert resp.status_code == 401
    said = lines(caplog, "401")
    assert len(said) == 1 and said[0].levelno == logging.WARNING
    assert "bearer token" in said[0].getMessage() and "127.0.0.1" in said[0].getMessage()
    assert "wrong-token" not in caplog.text and TOKEN not in caplog.text
    monkeypatch.setattr("worker.webhook.auth.UNAUTHORIZED_LOG_SECONDS", 0.0)  # the window passed
    await http.post("/v1/alertmanager", json=body, headers={})
    said = lines(caplog, "401")
    assert len(said) == 2 and "4 more since" in said[1].getMessage()


async def test_summary_line_for_duplicates_and_warning_for_unusable(
    http: httpx.AsyncClient, caplog: pytest.LogCaptureFixture, dev_env: WorkflowEnvironment
) -> None:
    caplog.set_level(logging.INFO, logger="worker.webhook")
    node, gpu = unique_device()
    body = payload(xid_alert(node, gpu))
    for _ in range(2):
        assert (await http.post("/v1/alertmanager", json=body, headers=auth())).status_code == 200
    summaries = [r for r in lines(caplog, "notification ") if "alerts," in r.getMessage()]
    assert len(summaries) == 2 and all(r.levelno == logging.INFO for r in summaries)
    assert "1 duplicates" in summaries[1].getMessage()

    stray = xid_alert(node, gpu)
    del stray["labels"]["UUID"]
    resp = await http.post("/v1/alertmanager", json=payload(stray), headers=auth())
    assert resp.status_code == 200 and resp.json()["unmatched"][0]["reason"] == "missing-uuid"
    warned = [r for r in lines(caplog, "missing-uuid") if r.levelno == logging.WARNING]
    assert warned and "SickbayGpuXidError" in warned[0].getMessage()
    await dev_env.client.get_workflow_handle(device_workflow_id(node, gpu)).terminate("done")


async def test_rejected_alerts_reach_temporal_and_sickbay_status(
    dev_env: WorkflowEnvironment, capsys: pytest.CaptureFixture[str]
) -> None:
    """Unusable alerts are counted by reason in the sickbay-rejections workflow (whichever
    webhook replica saw them) and `sickbay status` shows the summary."""
    import asyncio

    from temporalio.worker import Worker

    from contract.names import QRY_REJECTIONS, rejections_workflow_id
    from contract.notify import RejectionsSummary
    from worker.cli import main as cli_main
    from workflows.rejections import RejectionsWorkflow

    queue = f"rejected-{uuid.uuid4().hex[:8]}"
    node, gpu = unique_device()
    no_uuid = xid_alert(node, gpu)
    del no_uuid["labels"]["UUID"]
    other = xid_alert(node, gpu, fingerprint="fp-other")
    other["labels"]["alertname"] = "NodeDiskFull"
    replicas = [
        create_app(
            settings_for(dev_env, queue),
            dev_env.client,
            webhook=WebhookSettings(webhook_token=TOKEN),
        )
        for _ in range(2)
    ]
    async with Worker(dev_env.client, task_queue=queue, workflows=[RejectionsWorkflow]):
        for app, alerts in zip(replicas, ([no_uuid, other], [no_uuid]), strict=True):
            async with serve(app) as url, httpx.AsyncClient(base_url=url, timeout=30) as http:
                resp = await http.post("/v1/alertmanager", json=payload(*alerts), headers=auth())
                assert resp.status_code == 200
                assert await app.state.service.report_rejected() == len(alerts)
        handle = dev_env.client.get_workflow_handle(rejections_workflow_id(queue))
        summary = await handle.query(QRY_REJECTIONS, result_type=RejectionsSummary)
        counts = {r.reason: r.count for r in summary.reasons}
        assert counts == {"missing-uuid": 2, "alertname-not-configured": 1}
        address = dev_env.client.service_client.config.target_host
        code = await asyncio.to_thread(
            cli_main, ["status", "--address", address, "--task-queue", queue, "--cluster", ""]
        )
        out = capsys.readouterr().out
    assert code == 0
    assert "rejected alerts" in out
    assert "missing-uuid" in out and "alertname-not-configured" in out
    assert "NodeDiskFull" in out
