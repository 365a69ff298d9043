"""The latency benchmark's floor receiver (bench/floor.py), run as `python -m bench.floor`
against the session's Temporal dev server and cluster twin.

Cases:
- a notification with one firing and one resolved alert starts exactly one workflow, eagerly
  (the receiver's count of the SDK's eager flag on the start response, and the history's
  `eager_execution_accepted` on WorkflowExecutionStarted), with no activity task events and
  one local-activity marker in its history; the workflow completes with the rule's name, the
  rule exists in the twin and its create carries the floor's user agent;
- a body that is not an Alertmanager notification gets a 400 naming the problem and starts
  nothing.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import subprocess
import sys
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any, cast

import httpx
import pytest
from kubernetes import client as k8s
from kubernetes.client.rest import ApiException
from temporalio.api.enums.v1 import EventType
from temporalio.testing import WorkflowEnvironment

from bench.common import dcgm_alert, notification
from bench.floor import AGENT, TASK_QUEUE, workflow_id
from bench.peer import GROUP, taint_version
from contract.names import taint_rule_name
from harness.stack import free_port

pytestmark = pytest.mark.devserver

ROOT = Path(__file__).resolve().parents[2]
PREFIX = "floortest-"  # the shared twin: rules of this module only, deleted after


def _spawn(argv: list[str], log_path: Path) -> subprocess.Popen[bytes]:
    with open(log_path, "wb") as errors:
        return subprocess.Popen(
            argv,
            cwd=ROOT,
            env={**os.environ, "PYTHONPATH": str(ROOT)},
            stdout=subprocess.DEVNULL,
            stderr=errors,
        )


@pytest.fixture(scope="module")
async def floor(
    dev_env: WorkflowEnvironment, twin: Any, tmp_path_factory: pytest.TempPathFactory
) -> AsyncIterator[str]:
    """`python -m bench.floor` on the session's dev server and twin; its URL once it listens."""
    port = free_port()
    log_path = tmp_path_factory.mktemp("floor") / "floor.log"
    argv = [
        sys.executable,
        "-m",
        "bench.floor",
        "--port",
        str(port),
        "--kubeconfig",
        str(twin.kubeconfig_path),
        "--temporal",
        dev_env.client.service_client.config.target_host,
        "--namespace",
        dev_env.client.namespace,
        "--prefix",
        PREFIX,
    ]
    proc = await asyncio.to_thread(_spawn, argv, log_path)
    url = f"http://127.0.0.1:{port}"
    try:
        # Imports and the Temporal connection take a few seconds, more on 2 busy cores.
        deadline = time.monotonic() + 60
        async with httpx.AsyncClient() as http:
            while True:
                if proc.poll() is not None:
                    pytest.fail(f"bench.floor exited: {log_path.read_text()[-2000:]}")
                with contextlib.suppress(httpx.HTTPError):
                    if (await http.get(url)).status_code == 200:
                        break
                if time.monotonic() > deadline:
                    pytest.fail(f"bench.floor never listened: {log_path.read_text()[-2000:]}")
                await asyncio.sleep(0.1)
        yield url
    finally:
        proc.terminate()
        try:
            await asyncio.to_thread(proc.wait, 10)
        except subprocess.TimeoutExpired:
            proc.kill()
            await asyncio.to_thread(proc.wait, 10)


async def _stats(url: str) -> dict[str, Any]:
    async with httpx.AsyncClient(timeout=30.0) as http:
        r = await http.get(url)
        r.raise_for_status()
        return dict(r.json())


def _gpu(twin: Any) -> tuple[str, str, dict[str, str]]:
    """(node, uuid, the device's selector) of the twin's first GPU."""
    api = twin.api_client()
    for s in k8s.ResourceV1Api(api).list_resource_slice().items:
        for d in s.spec.devices or []:
            got = (d.attributes or {}).get("uuid")
            if got is not None:
                selector = {"driver": s.spec.driver, "pool": s.spec.pool.name, "device": d.name}
                return str(s.spec.node_name), str(got.string), selector
    raise AssertionError("the twin has no GPU with a uuid attribute")


async def test_firing_alert_starts_one_eager_workflow_that_creates_the_rule(
    floor: str, dev_env: WorkflowEnvironment, twin: Any
) -> None:
    before = await _stats(floor)
    node, uuid, selector = _gpu(twin)
    resolved = {**dcgm_alert(node, uuid, fingerprint="floortest-resolved"), "status": "resolved"}
    body = notification([dcgm_alert(node, uuid, fingerprint="floortest-firing"), resolved])
    rule = PREFIX + taint_rule_name(node, uuid)
    version = taint_version(twin.api_client())
    async with httpx.AsyncClient(timeout=30.0) as http:
        r = await http.post(floor, json=body)
        assert r.status_code == 200, r.text
        wf_id = workflow_id(PREFIX, node, uuid)
        assert r.json() == {"workflows": [wf_id]}
        handle = dev_env.client.get_workflow_handle(wf_id)
        try:
            assert await asyncio.wait_for(handle.result(), 20) == rule

            after = await _stats(floor)
            assert after["started"] - before["started"] == 1
            assert after["eager"] - before["eager"] == 1  # the SDK's flag on the start response
            desc = await handle.describe()
            assert desc.task_queue == TASK_QUEUE
            events = (await handle.fetch_history()).events
            kinds = [e.event_type for e in events]
            assert kinds == [
                EventType.EVENT_TYPE_WORKFLOW_EXECUTION_STARTED,
                EventType.EVENT_TYPE_WORKFLOW_TASK_SCHEDULED,
                EventType.EVENT_TYPE_WORKFLOW_TASK_STARTED,
                EventType.EVENT_TYPE_WORKFLOW_TASK_COMPLETED,
                EventType.EVENT_TYPE_MARKER_RECORDED,  # the local activity: resolve + create
                EventType.EVENT_TYPE_WORKFLOW_EXECUTION_COMPLETED,
            ]
            # The server's own record that it started the first task in the start request.
            assert events[0].workflow_execution_started_event_attributes.eager_execution_accepted

            custom = k8s.CustomObjectsApi(twin.api_client())
            got = cast(
                dict[str, Any],
                custom.get_cluster_custom_object(GROUP, version, "devicetaintrules", rule),
            )
            assert got["spec"]["deviceSelector"] == selector
            creates = [
                rec
                for rec in twin.requests(verb="create", resource="devicetaintrules")
                if rec.status < 300 and rec.user_agent == AGENT
            ]
            assert len(creates) == 1
        finally:
            with contextlib.suppress(ApiException):  # absent when the create never came
                k8s.CustomObjectsApi(twin.api_client()).delete_cluster_custom_object(
                    GROUP, version, "devicetaintrules", rule
                )


async def test_bad_body_is_a_400_and_starts_nothing(floor: str) -> None:
    before = await _stats(floor)
    async with httpx.AsyncClient(timeout=30.0) as http:
        r = await http.post(floor, content=b'{"alerts": [{"status": "firing"}]}')
        assert r.status_code == 400
        assert "not an Alertmanager notification" in r.json()["error"]
        r = await http.post(floor, content=b"not json")
        assert r.status_code == 400
    assert await _stats(floor) == before
