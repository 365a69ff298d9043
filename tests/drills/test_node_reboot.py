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

from contract.names import QRY_TIMELINE, node_workflow_id
from contract.node_incident import NodeIncidentResult
from tests.drills.conftest import (
    assert_node_untouched,
    drill_stack,
    gpu_plugin_pods,
    node_incident_result,
    until_plugin_pods,
)

pytestmark = pytest.mark.devserver

WITHIN = 120.0  # real seconds: a hung incident fails here, never a time being judged


async def test_a_reboot_whose_plugin_starts_again_touches_nothing(tmp_path: Path) -> None:
    async with drill_stack(tmp_path, watch=True, nodes=2) as d:
        demo = d.demo
        d.stack.twin("POST", "/twin/gpu-plugins", {})
        node = sorted(await demo.nodes())[0]

        before = await until_plugin_pods(demo, 4, WITHIN)  # plugin + validator x 2
        # The plugin starts until the incident has seen it starting (a real one takes
        # minutes; a fixed window would be a race on a busy machine), then registers.
        d.stack.twin("POST", "/twin/upgrades/reboot", {"node": node, "startsAfter": 1e9})
        handle = demo.client.get_workflow_handle(
            node_workflow_id(node), result_type=NodeIncidentResult
        )
        deadline = time.monotonic() + WITHIN
        while True:
            try:
                timeline = await handle.query(QRY_TIMELINE, result_type=list[str])
            except Exception:  # not started yet
                timeline = []
            if any("plugin starting" in line for line in timeline):
                break
            assert time.monotonic() < deadline, f"the plugin never seen starting: {timeline}"
            await asyncio.sleep(0.2)
        d.stack.twin("POST", "/twin/upgrades/start-now", {"node": node})
        result = await node_incident_result(handle, WITHIN)
        assert result.outcome == "recovered", result.timeline
        assert any("plugin starting" in line for line in result.timeline), result.timeline
        await assert_node_untouched(demo, node)
        assert await gpu_plugin_pods(demo) == before  # the starting pod was not restarted
