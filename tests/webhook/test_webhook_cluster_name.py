"""The webhook uses the cluster name the worker recorded (SICKBAY_CLUSTER_FILE, the mounted
ConfigMap sickbay-cluster), never a guessed one.

Cases (dev server, no worker: what counts is what Temporal recorded):
- while the file is absent every alert is answered 503 naming why, and nothing starts;
  /healthz says the cluster is not known;
- once the worker's record appears, alerts start `sickbay-<recorded>-gpu-...` on the recorded
  cluster's queue, tagged with it, with no restart;
- a record that disagrees with an explicit SICKBAY_CLUSTER stops the start, naming both; one
  that appears later while running keeps answering 503 with that reason.
"""

from __future__ import annotations

import asyncio
import uuid
from pathlib import Path

import httpx
import pytest
from temporalio.service import RPCError, RPCStatusCode
from temporalio.testing import WorkflowEnvironment

from contract.names import cluster_task_queue, device_workflow_id
from tests.webhook.helpers import (
    TOKEN,
    auth,
    payload,
    serve,
    settings_for,
    unique_device,
    xid_alert,
)
from worker.cluster_name import ClusterNameError
from worker.settings import WebhookSettings
from worker.webhook import app as webhook_app
from worker.webhook.app import create_app

pytestmark = pytest.mark.devserver


async def _eventually_code(http: httpx.AsyncClient, body: dict, code: int) -> httpx.Response:
    for _ in range(600):  # the file is polled every CLUSTER_FILE_POLL_SECONDS
        resp = await http.post("/v1/alertmanager", json=body, headers=auth())
        if resp.status_code == code:
            return resp
        await asyncio.sleep(0.1)
    raise AssertionError(f"never {code}: last {resp.status_code} {resp.text}")


async def test_alerts_wait_for_the_recorded_name_then_use_it(
    dev_env: WorkflowEnvironment, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(webhook_app, "CLUSTER_FILE_POLL_SECONDS", 0.1)
    queue = f"cname-{uuid.uuid4().hex[:8]}"
    record = tmp_path / "cluster" / "name"
    settings = settings_for(dev_env, queue).model_copy(update={"cluster_file": record})
    assert not settings.cluster_explicit
    app = create_app(settings, dev_env.client, webhook=WebhookSettings(webhook_token=TOKEN))
    node, gpu = unique_device()
    body = payload(xid_alert(node, gpu))
    async with serve(app) as url, httpx.AsyncClient(base_url=url, timeout=30) as http:
        resp = await http.post("/v1/alertmanager", json=body, headers=auth())
        assert resp.status_code == 503, resp.text
        assert "cluster name is not known yet" in resp.json()["error"]
        assert (await http.get("/healthz")).json()["cluster"] is None
        unnamed = device_workflow_id(node, gpu)
        listed = [w async for w in dev_env.client.list_workflows(f"WorkflowId = '{unnamed}'")]
        assert listed == []

        record.parent.mkdir()
        record.write_text("east\n")  # the kubelet's copy of the ConfigMap's `name` key
        ok = await _eventually_code(http, body, 200)
        assert ok.json()["started"] == 1, ok.text
        assert (await http.get("/healthz")).json()["cluster"] == "east"
    wf_id = device_workflow_id(node, gpu, "east")
    desc = await dev_env.client.get_workflow_handle(wf_id).describe()
    assert desc.task_queue == cluster_task_queue(queue, "east")
    with pytest.raises(RPCError) as missing:  # nothing under the unnamed cluster's id
        await dev_env.client.get_workflow_handle(unnamed).describe()
    assert missing.value.status is RPCStatusCode.NOT_FOUND
    await dev_env.client.get_workflow_handle(wf_id).terminate("test")


async def test_a_record_naming_another_cluster_stops_the_start(
    dev_env: WorkflowEnvironment, tmp_path: Path
) -> None:
    record = tmp_path / "name"
    record.write_text("east")
    settings = settings_for(dev_env, f"cname-{uuid.uuid4().hex[:8]}").model_copy(
        update={"cluster_file": record, "cluster": "west"}
    )
    assert settings.cluster_explicit
    app = create_app(settings, dev_env.client, webhook=WebhookSettings(webhook_token=TOKEN))
    with pytest.raises(ClusterNameError) as refused:
        async with app.router.lifespan_context(app):
            pass
    assert "SICKBAY_CLUSTER is 'west'" in str(refused.value)
    assert "recorded name is 'east'" in str(refused.value)


async def test_a_mismatching_record_that_appears_later_keeps_503(
    dev_env: WorkflowEnvironment, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(webhook_app, "CLUSTER_FILE_POLL_SECONDS", 0.1)
    record = tmp_path / "name"
    settings = settings_for(dev_env, f"cname-{uuid.uuid4().hex[:8]}").model_copy(
        update={"cluster_file": record, "cluster": "west"}
    )
    app = create_app(settings, dev_env.client, webhook=WebhookSettings(webhook_token=TOKEN))
    body = payload(xid_alert(*unique_device()))
    async with serve(app) as url, httpx.AsyncClient(base_url=url, timeout=30) as http:
        record.write_text("east")
        for _ in range(600):
            resp = await http.post("/v1/alertmanager", json=body, headers=auth())
            assert resp.status_code == 503, resp.text
            if "recorded name is 'east'" in resp.json()["error"]:
                break
            await asyncio.sleep(0.1)
        else:
            raise AssertionError("the refusal never reached the answer")
