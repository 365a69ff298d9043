"""Drill: SIGKILL the worker mid-remediation; a new worker finishes the job, nothing doubled.

One embedded stack (1 node x 2 GPUs, pool may grow to 2 nodes; twin and runbooks 30x), the
seed incident's path, with the worker killed (SIGKILL: no graceful shutdown) at three points:

1. confirm + quarantine: the twin holds the DeviceTaintRule create (API fault `timeout`, once)
   while the worker runs the hot path's local activities (resolve, evidence, consumers,
   budget lease, quarantine: one workflow task); the worker is killed there. A new worker
   redoes the task after the workflow-task timeout: GPU A gets exactly one rule, the pod moves
   to GPU B, the remediation holds.
2. Pending wait: GPU B fails; its replacement cannot schedule (no healthy GPU), the remediation
   waits for it under the Pending deadline; the worker is killed in that wait. After the
   activity's heartbeat timeout a new worker resumes the wait, the deadline passes, the pool is
   scaled (exactly one resize request), the replacement runs on the new node.
3. release: GPU A is marked repaired and the twin holds the rule's delete (API fault
   `timeout`, once) while the worker releases it; the worker is killed there. A new worker
   redoes the release: the rule is deleted once, the lease returned, the remediation closes.
GPU B is marked repaired too: both close as released.

Counted from the twin: successful DeviceTaintRule creates (one per GPU), rules left (none),
resize operations of the twin's cloud API (one), escalations at the sink (none: a happy path).
Kill points not drilled here (each costs a heartbeat timeout of 45-60 s or a notification's
30 s start-to-close on a 2-core time budget): eviction wait, the scale-up call itself,
escalation; see docs/reliability.md.
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from tests.drills.conftest import closed, drill_stack
from workflows.models import Phase

pytestmark = [pytest.mark.slow, pytest.mark.devserver]

# A killed worker's workflow task is retried after the 10 s workflow-task timeout; a killed
# wait activity after its 60 s heartbeat timeout (WAIT_HEARTBEAT); plus worker start-up and
# the 30x-scaled deadlines on a loaded 2-core machine.
AFTER_KILL = 150.0


async def test_sigkill_at_quarantine_pending_wait_and_release(tmp_path: Path) -> None:
    async with drill_stack(tmp_path) as d:
        demo = d.demo
        ns = "drill-kill"
        await demo.namespace(ns)
        await demo.deployment(ns, "serve", replicas=1)
        [(_, device_a)] = await demo.running(ns, "serve")
        gpu_a = await demo.gpu(device_a)

        # 1. kill inside the hot path (the rule's create is held by the twin for 8 s).
        fault = d.api_fault("timeout", "create", "devicetaintrules", count=1, timeoutSeconds=8)
        await demo.fail(gpu_a)
        inc_a = await demo.incident(gpu_a, "drill: kill at quarantine")

        async def create_held() -> bool:
            rules = {r["id"]: r for r in d.api_faults()}
            return rules.get(fault, {}).get("injected", 0) >= 1

        await demo.until("the rule create to be held by the twin", create_held, within=60)
        assert d.kill_worker() == 1
        assert d.rule_creates() == [], "the held create must not have created the rule"
        d.start_worker()
        await demo.phase(inc_a, {Phase.HOLDING}, within=AFTER_KILL)
        [(_, device_b)] = await demo.running(ns, "serve")
        assert device_b != device_a
        assert len(d.rule_creates()) == 1

        # 2. kill in the Pending wait (no healthy GPU left for the replacement).
        gpu_b = await demo.gpu(device_b)
        await demo.fail(gpu_b)
        inc_b = await demo.incident(gpu_b, "drill: kill in the Pending wait")
        await demo.phase(inc_b, {Phase.AWAITING_REPLACEMENT}, within=60)
        assert d.kill_worker() == 1
        killed_at = time.monotonic()
        d.start_worker()
        await demo.phase(inc_b, {Phase.HOLDING}, within=AFTER_KILL + 60)
        resumed_after = time.monotonic() - killed_at
        await demo.running(ns, "serve")  # on the node the scale-up added

        # 3. kill inside the release of GPU A (the rule's delete is held by the twin).
        fault = d.api_fault("timeout", "delete", "devicetaintrules", count=1, timeoutSeconds=8)
        await demo.repaired(inc_a, actor="drill")

        async def delete_held() -> bool:
            rules = {r["id"]: r for r in d.api_faults()}
            return rules.get(fault, {}).get("injected", 0) >= 1

        await demo.until("the rule delete to be held by the twin", delete_held, within=60)
        assert d.kill_worker() == 1
        d.start_worker()
        await demo.repaired(inc_b, actor="drill")
        results = [await closed(demo, inc, within=AFTER_KILL) for inc in (inc_a, inc_b)]
        assert [r.outcome for r in results] == ["released", "released"], [
            (r.outcome, r.reason) for r in results
        ]
        assert len(d.rule_creates()) == 2, "exactly one taint per GPU"
        deletes = [
            r
            for r in d.kube_requests(verb="delete", resource="devicetaintrules")
            if r["status"] < 300
        ]
        assert len(deletes) == 2, f"one successful delete per rule: {deletes}"
        assert d.rules() == []
        assert len(d.resize_operations()) == 1, d.resize_operations()
        assert d.notifications() == [], "a happy path escalates nothing"
        print(f"Pending-wait kill: resumed and held {resumed_after:.0f} s after SIGKILL")
