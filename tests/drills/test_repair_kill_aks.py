"""Crash drill of the AKS reboot (the retry waits out the activity's 30 s heartbeat
timeout), on the embedded stack (twin 30x, the shipped ladder on, the real
`sickbay worker` SIGKILLed and replaced):

- Xid 79 -> reboot through AKS (the pool's nodes as VMSS VMs on the twin's ARM endpoints,
  which take no request id): the worker is killed after ARM acted on the restart and before
  its answer reached the activity (the twin holds the answer); the retried activity on a new
  worker finds the restart's record on the node, sees the evidence, asks nothing, and the
  remediation is released after validation: exactly one restart.
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import pytest
import yaml

from harness.stack import POOL
from tests.drills.conftest import Drill, closed, drill_stack
from tests.drills.test_repair_kill import instance_calls

pytestmark = [pytest.mark.slow, pytest.mark.devserver]


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
        # The retry comes after the activity's heartbeat timeout (30 s; it beats every 10 s).
        result = await closed(demo, incident, within=420.0)
        assert result.outcome == "released", result.reason
        assert "reboot repaired it" in result.reason
        calls = instance_calls(d)
        assert [c[0] for c in calls] == ["reset"], calls  # asked once, acted on once
        log = retry.log_path.read_text(errors="replace")
        assert "NOT asked again" in log, log[-3000:]
