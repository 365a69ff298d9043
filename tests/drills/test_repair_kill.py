"""Crash drills of the repair ladder's node rungs on the embedded stack (twin 30x, the shipped
ladder on, the real `sickbay worker` SIGKILLed and replaced):

- Xid 79 -> reboot: the worker is killed while the remediation waits for the rebooted node;
  a new worker finishes it (validation, release) and the twin's Compute Engine endpoint acted
  on exactly one reset of the node's VM;
- Xid 64 (row-remap failure) -> replace: the worker is killed while the remediation follows the
  replacement; a new worker closes it for the old GPU, and exactly one recreate was acted on;
- Xid 79 -> reboot through AKS (the pool's nodes as VMSS VMs on the twin's ARM endpoints): the
  worker is killed in the window ARM has no request id for, after ARM acted on the restart and
  before its answer reached the activity (the twin holds the answer); the retried activity on
  a new worker finds the restart's record on the node, sees the evidence, asks nothing, and
  the remediation is released after validation: exactly one restart.
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import pytest
import yaml

from harness.stack import POOL
from tests.drills.conftest import Drill, closed, drill_stack

pytestmark = pytest.mark.devserver


def instance_calls(d: Drill) -> list[list[str]]:
    return list(d.stack.twin("GET", f"/twin/pools/{POOL}/cloud")["instanceCalls"])


async def kill_while(d: Drill, workflow_id: str, awaiting: str, within: float = 90.0) -> None:
    """SIGKILL the worker once the remediation waits for `awaiting`, then start a new one."""
    deadline = time.monotonic() + within
    while True:
        status = await d.demo.status(workflow_id)
        if awaiting in status.awaiting:
            break
        assert time.monotonic() < deadline, f"never waited for {awaiting!r}: {status}"
        await asyncio.sleep(0.05)
    assert d.kill_worker() >= 1
    d.start_worker()


@pytest.mark.parametrize(
    ("xid", "awaiting", "action", "outcome"),
    [
        (79, "reboot (attempt 1): the node Ready", "reset", "reboot repaired it"),
        (64, "replace (attempt 1): the node Ready", "recreate", "replaced"),
    ],
)
async def test_worker_killed_during_a_node_rung_asks_once(
    tmp_path: Path, xid: int, awaiting: str, action: str, outcome: str
) -> None:
    async with drill_stack(tmp_path, repair=True) as d:
        demo = d.demo
        await demo.namespace("serving")
        await demo.deployment("serving", "llm")
        [(_pod, device)] = await demo.running("serving", "llm")
        gpu = await demo.gpu(device)
        await demo.fail(gpu, xid=xid)
        incident = await demo.incident(gpu, f"Xid {xid}, worker killed during the rung")
        await kill_while(d, incident.workflow_id, awaiting)
        result = await closed(demo, incident, within=240.0)
        assert result.outcome == "released", result.reason
        assert outcome in result.reason
        calls = instance_calls(d)
        assert [c[0] for c in calls] == [action], calls  # asked once, acted on once


AKS = {"subscription": "sub-drill", "resourceGroup": "mc_rg_drill", "vmss": "aks-gpu-vmss"}


def aks_worker_env(d: Drill) -> dict[str, str]:
    """A worker whose `aks` provider talks to the twin's ARM endpoints (the twin cloud token)."""
    secrets = Path(d.stack.dir) / "secrets"
    cloud_file = Path(d.stack.dir) / "cloud-aks.yaml"
    cloud_file.write_text(yaml.safe_dump({"aks": {"endpoint": d.info.cloud_url}}))
    return {
        "SICKBAY_CLOUD_FILE": str(cloud_file),
        "SICKBAY_AZURE_TOKEN_FILE": str(secrets / "cloud-token"),
    }


def runbooks_on_aks(d: Drill) -> None:
    """The stack's runbooks' node pool becomes the AKS pool (the rungs' provider)."""
    for path in Path(d.info.runbooks_dir).glob("*.yaml"):
        doc = yaml.safe_load(path.read_text())
        pool = ((doc.get("spec") or {}).get("scaleUp") or {}).get("pool")
        if pool:
            pool.update(
                provider="aks",
                subscription=AKS["subscription"],
                resource_group=AKS["resourceGroup"],
                cluster="drill",
            )
            pool.pop("endpoint", None)
            path.write_text(yaml.safe_dump(doc, sort_keys=False))


async def test_worker_killed_between_arms_restart_and_its_answer_restarts_once(
    tmp_path: Path,
) -> None:
    async with drill_stack(tmp_path, repair=True) as d:
        demo = d.demo
        assert d.kill_worker() >= 1  # the stack's worker has no AKS provider
        d.stack.twin("PUT", f"/twin/pools/{POOL}/cloud", {"aks": AKS, "armAnswerDelay": 20})
        runbooks_on_aks(d)
        env = aks_worker_env(d)
        d.start_worker(extra_env=env)
        await demo.namespace("serving")
        await demo.deployment("serving", "llm")
        [(_pod, device)] = await demo.running("serving", "llm")
        gpu = await demo.gpu(device)
        await demo.fail(gpu, xid=79)
        incident = await demo.incident(gpu, "Xid 79 on AKS, worker killed in ARM's window")
        deadline = time.monotonic() + 180.0
        while not instance_calls(d):  # ARM acted; its answer is held for 20 s
            assert time.monotonic() < deadline, await demo.status(incident.workflow_id)
            await asyncio.sleep(0.05)
        assert d.kill_worker() == 1
        d.stack.twin("PUT", f"/twin/pools/{POOL}/cloud", {"armAnswerDelay": 0})
        retry = d.start_worker(extra_env=env)
        # The retry comes after the activity's start-to-close timeout (2 min, no heartbeat).
        result = await closed(demo, incident, within=420.0)
        assert result.outcome == "released", result.reason
        assert "reboot repaired it" in result.reason
        calls = instance_calls(d)
        assert [c[0] for c in calls] == ["reset"], calls  # asked once, acted on once
        log = retry.log_path.read_text(errors="replace")
        assert "NOT asked again" in log, log[-3000:]
