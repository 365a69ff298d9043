"""Crash drills on an EKS-shaped pool (the embedded stack with `cloud="eks"`: boto3 against the
twin's EKS, EC2 and Auto Scaling shapes; the real `sickbay worker` SIGKILLed and replaced).
In each, the twin acts on the request and then holds its answer, and the worker is killed in
that window: the retried activity runs on a new worker with no memory.

- Xid 79 -> reboot through EC2 RebootInstances (no request token): the retry finds the
  reboot's record on the node and the evidence (Ready changed), asks nothing; one reboot.
- Xid 64 -> replace through Auto Scaling TerminateInstanceInAutoScalingGroup (desired capacity
  kept): the retry finds the instance terminating / its node gone and asks nothing; one
  termination; the new node's GPUs validate and the old GPU's remediation is released.
- The second GPU dies with no free device: scale-up through EKS UpdateNodegroupConfig; the
  worker is killed after EKS accepted the update and before its answer: the retry adopts the
  running update (same clientRequestToken / ListUpdates), one update, the pool grows.
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

import pytest

from contract.remediation import Phase
from harness.scenarios import SeedState, act1_gpu_dies, act2_quarantine
from harness.stack import POOL
from tests.drills.conftest import Drill, closed, drill_stack
from tests.drills.test_repair_kill import instance_calls

pytestmark = [pytest.mark.slow(seconds=180), pytest.mark.devserver]

HOLD = 20.0  # real seconds the twin holds its answer after acting: the kill's window


def cloud(d: Drill, **knobs: object) -> dict[str, object]:
    return dict(d.stack.twin("PUT", f"/twin/pools/{POOL}/cloud", knobs))


async def _until(what: str, ready: object, within: float = 180.0) -> None:
    deadline = time.monotonic() + within
    while not ready():  # type: ignore[operator]
        assert time.monotonic() < deadline, f"never: {what}"
        await asyncio.sleep(0.05)


async def _killed_in_the_window(d: Drill, xid: int, action: str) -> tuple[Any, Any]:
    """Xid `xid` on the pool's GPU; the worker killed after EC2 / Auto Scaling acted on
    `action` and before its answer; a new worker started. (incident, the new worker)"""
    demo = d.demo
    cloud(d, awsAnswerDelay=HOLD)
    await demo.namespace("serving")
    await demo.deployment("serving", "llm")
    [(_pod, device)] = await demo.running("serving", "llm")
    gpu = await demo.gpu(device)
    await demo.fail(gpu, xid=xid)
    incident = await demo.incident(gpu, f"Xid {xid} on EKS, worker killed in the {action} window")
    await _until(f"AWS acted ({action})", lambda: instance_calls(d))
    assert d.kill_worker() == 1
    cloud(d, awsAnswerDelay=0)
    return incident, d.start_worker()


async def test_worker_killed_in_the_reboot_window_reboots_once(tmp_path: Path) -> None:
    async with drill_stack(tmp_path, repair=True, cloud="eks") as d:
        incident, retry = await _killed_in_the_window(d, 79, "reset")
        # The retry comes after the activity's heartbeat timeout (30 s; it beats every 10 s).
        result = await closed(d.demo, incident, within=240.0)
        assert result.outcome == "released", result.reason
        assert "reboot repaired it" in result.reason
        calls = instance_calls(d)
        assert [c[0] for c in calls] == ["reset"], calls  # asked once, acted on once
        log = retry.log_path.read_text(errors="replace")
        assert "NOT asked again" in log, log[-3000:]


async def test_worker_killed_in_the_termination_window_terminates_once(tmp_path: Path) -> None:
    """The replacement node registers while no worker runs (the heartbeat timeout): whether
    its GPUs are still free for validation then is not this drill's question (see
    test_repair_kill.py's `guarded`); that the retry terminates nothing again is."""
    async with drill_stack(tmp_path, repair=True, cloud="eks") as d:
        incident, _retry = await _killed_in_the_window(d, 64, "terminate")

        async def past_the_rung() -> bool:
            status = await d.demo.status(incident.workflow_id)
            return status.phase != Phase.REPAIRING or "after the replace" in status.awaiting

        await d.demo.until("the retried replace rung to end", past_the_rung, 240.0)
        calls = instance_calls(d)
        assert [c[0] for c in calls] == ["terminate"], calls  # asked once, acted on once
        status = await d.demo.status(incident.workflow_id)
        assert status.repair_attempt == 1 and status.repair_rung == "replace", status


async def test_worker_killed_in_the_node_group_update_window_updates_once(
    tmp_path: Path,
) -> None:
    async with drill_stack(tmp_path, cloud="eks") as d:
        demo = d.demo
        st = SeedState()
        await act1_gpu_dies(demo, st)
        await act2_quarantine(demo, st)
        cloud(d, awsAnswerDelay=HOLD)
        nodes_before = set(await demo.nodes())
        st.gpu2 = await demo.gpu(st.device2)
        await demo.fail(st.gpu2, xid=48)
        second = await demo.incident(st.gpu2, "second GPU on EKS, worker killed in EKS's window")
        await _until("EKS accepted the update", lambda: cloud(d)["eksUpdates"] == 1)
        assert d.kill_worker() == 1
        cloud(d, awsAnswerDelay=0)
        d.start_worker()
        await demo.phase(second, {Phase.HOLDING}, within=420.0)
        assert cloud(d)["eksUpdates"] == 1  # the retry adopted it: no second update
        assert set(await demo.nodes()) - nodes_before, "the pool did not grow"
