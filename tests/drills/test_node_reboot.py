"""A GPU node rebooted outside Sickbay (a kernel patch, a driver update) is not a node whose GPUs
vanished, end to end on the embedded stack (twin 30x, DRA, the health watcher on, the real
`sickbay worker`, the demo runbooks: `nodeIncident.settle` 1 s, `startGrace` 30 s).

The kubelet comes back without the node's ResourceSlices and the GPU plugin pod's container,
ended with the node (restarted once, last state Unknown, exit code 255), starts again
(ContainerCreating until the incident has seen it so, as a GPU Operator's validations take
minutes on real nodes): the watcher starts the node incident, which finds the plugin pod
starting and looks again every `settle`. The GPUs are back: closed `recovered`; the node
never got Sickbay's condition or taint, its starting plugin pod was not restarted, and no GPU
became a per-GPU remediation. (Before `startGrace`, the incident tainted the node and
restarted the plugin.)
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import pytest

from contract.names import QRY_TIMELINE, WF_REMEDIATE, node_workflow_id
from contract.node_incident import CONDITION_GPU_DEVICES, NodeIncidentResult
from tests.drills.conftest import drill_stack

pytestmark = pytest.mark.devserver

WITHIN = 120.0  # real seconds: a hung incident fails here, never a time being judged


async def test_a_reboot_whose_plugin_starts_again_touches_nothing(tmp_path: Path) -> None:
    async with drill_stack(tmp_path, watch=True, nodes=2) as d:
        demo = d.demo
        d.stack.twin("POST", "/twin/gpu-plugins", {})
        node = sorted(await demo.nodes())[0]

        async def plugin_pods() -> set[str]:
            body = await demo.k("GET", "/api/v1/namespaces/gpu-operator/pods")
            return {p["metadata"]["name"] for p in body["items"]}

        deadline = time.monotonic() + WITHIN
        while len(before := await plugin_pods()) < 4:  # plugin + validator, 2 nodes
            assert time.monotonic() < deadline, "GPU plugin pods never ran"
            await asyncio.sleep(0.2)
        wid = node_workflow_id(node)
        # The plugin starts until the incident has seen it starting (a real one takes
        # minutes; a fixed window would be a race on a busy machine), then registers.
        d.stack.twin("POST", "/twin/upgrades/reboot", {"node": node, "startsAfter": 1e9})
        handle = demo.client.get_workflow_handle(wid, result_type=NodeIncidentResult)
        deadline = time.monotonic() + WITHIN
        while True:
            try:
                timeline = await handle.query(QRY_TIMELINE, result_type=list[str])
            except Exception:  # not started yet
                timeline = []
            if any("plugin starting" in line for line in timeline):
                break
            assert time.monotonic() < deadline, (
                f"the incident never saw the plugin starting: {timeline}"
            )
            await asyncio.sleep(0.2)
        d.stack.twin("POST", "/twin/upgrades/start-now", {"node": node})
        while True:
            try:
                result = await asyncio.wait_for(handle.result(), timeout=5)
                break
            except Exception:  # not started yet, or still looking
                assert time.monotonic() < deadline, f"no closed node incident {wid}"
                await asyncio.sleep(0.2)
        assert result.outcome == "recovered", result.timeline
        assert any("plugin starting" in line for line in result.timeline), result.timeline
        obj = await demo.k("GET", f"/api/v1/nodes/{node}")
        conditions = [c["type"] for c in obj["status"].get("conditions") or []]
        assert CONDITION_GPU_DEVICES not in conditions, obj["status"]["conditions"]
        assert not [t for t in obj["spec"].get("taints") or [] if "sickbay" in t["key"]]
        assert await plugin_pods() == before  # the starting pod was not restarted (deleted)
        listed = [
            w
            async for w in demo.client.list_workflows(
                f"WorkflowType = '{WF_REMEDIATE}' AND SickbayNode = '{node}'"
            )
        ]
        assert listed == [], [w.id for w in listed]
