"""The node incident's Contain, end to end on the embedded stack (twin 30x, the health watcher
on, the real `sickbay worker`), with the default runbook's scale-up on (shipped off):

- a pool of 2 GPU nodes, every GPU held by one inference Deployment's 4 pods; a kubelet upgrade
  breaks one node's container toolkit hook (a restart cannot fix it). One node incident:
  escalated at once, the node tainted; its 2 workloads evicted within the budget; their
  replacements have no free GPU and stay Pending past `replacement.pendingDeadline`; the
  incident asks the node pool for one more node (a budget lease for the node's GPUs), the new
  node comes up with its GPU plugin, and the replacements run there. The timeline says each
  step; no per-GPU remediation for the vanished GPUs. The fixed toolkit then brings the GPUs
  back and the node is released.
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

import pytest

from contract.names import QRY_NODE_STATUS, QRY_TIMELINE, WF_REMEDIATE, node_workflow_id
from contract.node_incident import NodeIncidentResult, NodeIncidentStatus
from tests.drills.conftest import drill_stack

pytestmark = pytest.mark.devserver

WITHIN = 240.0  # real seconds: a hung incident fails here, never a time being judged
SCALE_UP = {
    "default": {
        # The shipped default leaves scaleUp off; on here, as an operator would turn it on.
        "scaleUp": {"enabled": True, "step": 1, "cooldown": "10m", "capacityDeadline": "15m"},
        "replacement": {"pendingDeadline": "5m"},
        # 4 GPUs: the shipped 10% per cluster allows none of the node's 2 to move (the
        # refusal is its own case in tests/workflows/test_node_incident.py).
        "budget": {
            "maxPerPool": "100%",
            "maxPerCluster": "100%",
            "unsafe": ["maxPerPool", "maxPerCluster"],
        },
    }
}


async def _until(what: str, probe: Any) -> Any:
    deadline = time.monotonic() + WITHIN
    while True:
        try:
            got = await probe()
        except Exception:  # a query racing the workflow's start
            got = None
        if got:
            return got
        assert time.monotonic() < deadline, f"not reached within {WITHIN:.0f} s: {what}"
        await asyncio.sleep(0.1)


async def test_evicted_workloads_pending_get_a_node_and_run_there(tmp_path: Path) -> None:
    async with drill_stack(
        tmp_path, watch=True, nodes=2, pool_max=3, runbook_overrides=SCALE_UP
    ) as d:
        demo = d.demo
        d.stack.twin("POST", "/twin/gpu-plugins", {})
        nodes = sorted(await demo.nodes())
        ns = "contain"
        await demo.namespace(ns)
        await demo.deployment(ns, "llm", replicas=4)
        running = await demo.running(ns, "llm", count=4)
        node = nodes[0]
        moved = sorted(p["metadata"]["name"] for p, _ in running if p["spec"]["nodeName"] == node)
        assert len(moved) == 2, [(p["metadata"]["name"], p["spec"]["nodeName"]) for p, _ in running]
        wid = node_workflow_id(node)

        d.stack.twin(
            "POST", "/twin/upgrades", {"node": node, "kubelet": "v1.36.7", "breaks": "hook"}
        )
        handle = demo.client.get_workflow_handle(wid, result_type=NodeIncidentResult)

        async def held() -> bool:
            st = await handle.query(QRY_NODE_STATUS, result_type=NodeIncidentStatus)
            return st.phase == "held"

        await _until("the incident escalated and holding", held)
        timeline: list[str] = await handle.query(QRY_TIMELINE, result_type=list[str])
        text = "\n".join(timeline)
        # Each step, in the order the procedure takes them.
        steps = [
            "restart-plugin skipped",
            "budget lease",
            "workloads evicted",
            "following the replacements",
            "capacity requested",
            "replacements Running elsewhere",
        ]
        at = [next((i for i, line in enumerate(timeline) if s in line), -1) for s in steps]
        assert -1 not in at and at == sorted(at), text
        [requested] = [line for line in timeline if "capacity requested" in line]
        assert "asked 2 -> 3" in requested, requested

        # The replacements run on the node the pool added, none on the broken one.
        now = await demo.nodes()
        [added] = sorted(set(now) - set(nodes))
        pods = [
            p
            for p in await demo.pods(ns, "llm")
            if not p["metadata"].get("deletionTimestamp")
            and (p.get("status") or {}).get("phase") == "Running"
        ]
        assert len(pods) == 4, [(p["metadata"]["name"], p["spec"].get("nodeName")) for p in pods]
        assert {p["spec"]["nodeName"] for p in pods} == {nodes[1], added}
        assert not {p["metadata"]["name"] for p in pods} & set(moved)
        [line] = [x for x in timeline if "replacements Running elsewhere" in x]
        assert added in line, line

        # The page said it at once; no per-GPU remediation for a GPU that merely vanished.
        pages = [
            n
            for n in await demo.notifications()
            if n["kind"] == "pagerduty" and n["body"].get("dedup_key", "").startswith(wid[:60])
        ]
        assert pages and pages[0]["body"]["event_action"] == "trigger", pages
        listed = [
            w
            async for w in demo.client.list_workflows(
                f"WorkflowType = '{WF_REMEDIATE}' AND SickbayNode = '{node}'"
            )
        ]
        assert listed == [], [w.id for w in listed]

        # The fixed toolkit: the GPUs come back, are validated, the node released.
        d.stack.twin("POST", "/twin/upgrades/recover", {"node": node})
        result = await asyncio.wait_for(handle.result(), timeout=WITHIN)
        assert result.outcome == "healed", result.timeline
