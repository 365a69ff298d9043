"""A routine kubelet restart is not a node whose GPUs vanished, end to end on the embedded stack
(twin 30x, DRA, the health watcher on, the real `sickbay worker`, the demo runbooks: the
default runbook's `nodeIncident.settle` 30s becomes 1 s).

The restarted kubelet deletes the node's ResourceSlices and the running DRA plugin publishes
them again when it registers (here 0.8 s later, real time): the watcher starts the node
incident, which finds every GPU plugin pod Ready and looks again after the settle time. The
GPUs are back: closed `recovered`; the node never got Sickbay's condition or taint, the plugin
was not restarted, and no GPU became a per-GPU remediation.
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import pytest

from contract.names import WF_REMEDIATE, node_workflow_id
from contract.node_incident import CONDITION_GPU_DEVICES, NodeIncidentResult
from tests.drills.conftest import drill_stack

pytestmark = pytest.mark.devserver

WITHIN = 120.0  # real seconds: a hung incident fails here, never a time being judged


async def test_a_kubelet_restart_that_republishes_touches_nothing(tmp_path: Path) -> None:
    async with drill_stack(tmp_path, watch=True, nodes=2) as d:
        demo = d.demo
        d.stack.twin("POST", "/twin/gpu-plugins", {})
        node = sorted(await demo.nodes())[0]

        async def plugin_pods() -> set[str]:
            body = await demo.k("GET", "/api/v1/namespaces/gpu-operator/pods")
            return {p["metadata"]["name"] for p in body["items"]}

        deadline = time.monotonic() + WITHIN
        while len(plugins_before := await plugin_pods()) < 4:  # plugin + validator, 2 nodes
            assert time.monotonic() < deadline, f"GPU plugin pods: {plugins_before}"
            await asyncio.sleep(0.2)
        wid = node_workflow_id(node)
        # 24 simulated seconds at 30x: back 0.8 s later, within the 1 s settle.
        d.stack.twin("POST", "/twin/upgrades/kubelet-restart", {"node": node, "republishAfter": 24})
        handle = demo.client.get_workflow_handle(wid, result_type=NodeIncidentResult)
        deadline = time.monotonic() + WITHIN
        while True:
            try:
                result = await asyncio.wait_for(handle.result(), timeout=5)
                break
            except Exception:  # not started yet, or still settling
                assert time.monotonic() < deadline, f"no closed node incident {wid}"
                await asyncio.sleep(0.2)
        assert result.outcome == "recovered", result.timeline
        obj = await demo.k("GET", f"/api/v1/nodes/{node}")
        conditions = [c["type"] for c in obj["status"].get("conditions") or []]
        assert CONDITION_GPU_DEVICES not in conditions, obj["status"]["conditions"]
        assert not [t for t in obj["spec"].get("taints") or [] if "sickbay" in t["key"]]
        assert await plugin_pods() == plugins_before  # no plugin pod was restarted
        listed = [
            w
            async for w in demo.client.list_workflows(
                f"WorkflowType = '{WF_REMEDIATE}' AND SickbayNode = '{node}'"
            )
        ]
        assert listed == [], [w.id for w in listed]
