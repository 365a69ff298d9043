"""Crash drill of the node incident's plugin restart on the embedded stack (twin 60x, the
health watcher on, the real `sickbay worker` SIGKILLed and replaced):

- a kubelet upgrade leaves a node's DRA plugin unregistered (its ResourceSlice empties); the
  node incident restarts the plugin; its pod DELETE is held by a slow API server (an API
  fault `delay`) and the worker is killed right then; the server then deletes the pod and the
  DaemonSet starts a new one. A new worker retries the same attempt: the pod that attempt
  chose (recorded on the Node before the delete) is gone, so nothing more is deleted; the new
  pod is never touched, the GPUs come back and the node is released: `healed`.
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import pytest

from contract.names import ANN_PLUGIN_RESTART, node_workflow_id
from contract.node_incident import NodeIncidentResult
from tests.drills.conftest import Drill, drill_stack

pytestmark = pytest.mark.devserver

PLUGIN = "nvidia-dra-driver-gpu-kubelet-plugin"


async def _plugins_ready(d: Drill) -> list[dict[str, object]]:
    deadline = time.monotonic() + 60
    while True:
        pods = (await d.demo.k("GET", "/api/v1/namespaces/gpu-operator/pods"))["items"]
        ready = [
            p
            for p in pods
            if PLUGIN in p["metadata"]["name"]
            and all(c.get("ready") for c in p["status"].get("containerStatuses") or [{}])
        ]
        if len(ready) == 2:
            return ready
        assert time.monotonic() < deadline, pods
        await asyncio.sleep(0.1)


async def test_worker_killed_during_the_plugin_restart_restarts_once(tmp_path: Path) -> None:
    async with drill_stack(tmp_path, watch=True, nodes=2, pool_max=2) as d:
        demo = d.demo
        d.stack.twin("POST", "/twin/gpu-plugins", {})
        node = sorted(await demo.nodes())[0]
        [plugin] = [p for p in await _plugins_ready(d) if p["spec"]["nodeName"] == node]  # type: ignore[index]
        rule = d.api_fault(
            "delay", verb="delete", resource="pods", match=PLUGIN, count=1, timeoutSeconds=4
        )
        d.stack.twin(
            "POST", "/twin/upgrades", {"node": node, "kubelet": "v1.36.3", "breaks": "socket"}
        )

        deadline = time.monotonic() + 60
        while d.api_fault_hits(rule) < 1:  # the restart's DELETE is in flight: kill now
            assert time.monotonic() < deadline, "the plugin restart never came"
            await asyncio.sleep(0.05)
        assert d.kill_worker() >= 1
        d.start_worker()

        wid = node_workflow_id(node)
        handle = demo.client.get_workflow_handle(wid, result_type=NodeIncidentResult)
        result = await asyncio.wait_for(handle.result(), timeout=180)
        assert result.outcome == "healed" and result.rung == "restart-plugin", result.timeline

        deletes = [
            r
            for r in d.kube_requests(verb="delete", resource="pods")
            if PLUGIN in str(r.get("name", ""))
        ]
        done = [r for r in deletes if r["status"] < 300]
        assert len(done) == 1, deletes  # once, though the attempt ran twice (never the new pod)
        assert done[0]["name"] == plugin["metadata"]["name"]  # type: ignore[index]
        # The restart activity ran twice (the killed try, then the retry on the new worker).
        history = await handle.fetch_history()
        scheduled = {
            e.event_id
            for e in history.events
            if e.activity_task_scheduled_event_attributes.activity_type.name == "restart-gpu-plugin"
        }
        attempts = [
            e.activity_task_started_event_attributes.attempt
            for e in history.events
            if e.activity_task_started_event_attributes.scheduled_event_id in scheduled
        ]
        assert attempts and max(attempts) >= 2, attempts
        node_obj = await demo.k("GET", f"/api/v1/nodes/{node}")
        record = node_obj["metadata"]["annotations"][ANN_PLUGIN_RESTART]
        assert wid in record and '"uids"' in record
        # The DaemonSet's new pod is Ready and was never deleted.
        [new] = [p for p in await _plugins_ready(d) if p["spec"]["nodeName"] == node]  # type: ignore[index]
        assert new["metadata"]["name"] != plugin["metadata"]["name"]  # type: ignore[index]
