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

from pathlib import Path

import pytest

from contract.names import node_workflow_id
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


async def test_a_kubelet_restart_that_republishes_touches_nothing(tmp_path: Path) -> None:
    async with drill_stack(tmp_path, watch=True, nodes=2) as d:
        demo = d.demo
        d.stack.twin("POST", "/twin/gpu-plugins", {})
        node = sorted(await demo.nodes())[0]

        plugins_before = await until_plugin_pods(demo, 4, WITHIN)  # plugin + validator x 2
        # 24 simulated seconds at 30x: back 0.8 s later, within the 1 s settle.
        d.stack.twin("POST", "/twin/upgrades/kubelet-restart", {"node": node, "republishAfter": 24})
        handle = demo.client.get_workflow_handle(
            node_workflow_id(node), result_type=NodeIncidentResult
        )
        result = await node_incident_result(handle, WITHIN)
        assert result.outcome == "recovered", result.timeline
        await assert_node_untouched(demo, node)
        assert await gpu_plugin_pods(demo) == plugins_before  # no plugin pod was restarted
