"""Drill: a rolling update's SIGTERM lands on the worker 0.3 s into a burst; the worker stops
cleanly and its successor finishes the burst, nothing doubled.

The stand: 4 nodes x 8 GPUs, twin and demo runbooks 30x, the budget widened to every GPU. 16
GPUs fail at once (one Xid alert each through the webhook); 0.3 s later the worker gets
SIGTERM, as a Deployment's rollout sends it, and a new worker starts once it has exited.

Asserted: the stopped worker exits 0 with no activity cancelled by the stop (before, the budget's
and the ledger's pollers stopped with the remediations', so every remediation still inside its
lease waited for an update nobody polled, was cancelled at the graceful-shutdown timeout and
logged a traceback); every GPU gets exactly one DeviceTaintRule (one successful create each, no
duplicate from the task the stop handed over); one run per workflow id.
"""

from __future__ import annotations

import asyncio
import signal
import time
from pathlib import Path

import httpx
import pytest

from bench.common import dcgm_alert, gpus, notification, set_budget
from contract.names import device_workflow_id
from tests.drills.conftest import drill_stack, run_count
from tests.waiting import until

pytestmark = pytest.mark.devserver

FAILED = 16
STOP_AFTER = 0.3  # seconds after the last alert's answer
WITHIN = 120.0  # seconds for the successor to finish the burst, on a busy machine


async def test_sigterm_mid_burst_stops_clean_and_the_successor_finishes(tmp_path: Path) -> None:
    async with drill_stack(tmp_path, nodes=4, gpus_per_node=8) as d:
        info = d.info
        set_budget(info.runbooks_dir, "100%", "100%")
        token = (Path(d.stack.dir) / "secrets" / "webhook-token").read_text().strip()
        failing = gpus(info.kube_url)[:FAILED]
        async with httpx.AsyncClient(timeout=30.0) as http:
            answers = await asyncio.gather(
                *(
                    http.post(
                        info.webhook_url,
                        json=notification([dcgm_alert(g["node"], g["uuid"], g["index"])]),
                        headers={"Authorization": f"Bearer {token}"},
                    )
                    for g in failing
                )
            )
        assert [a.status_code for a in answers] == [200] * FAILED
        await asyncio.sleep(STOP_AFTER)
        (old,) = [w for w in d.workers() if w.alive()]
        old.popen.send_signal(signal.SIGTERM)
        stopped_at = time.monotonic()
        code = await asyncio.to_thread(old.popen.wait, 90)
        print(f"worker stopped in {time.monotonic() - stopped_at:.1f} s, exit {code}")
        d.stack.children.remove(old)  # stopped on purpose: not a stack failure
        log = old.log_path.read_text(errors="replace")
        assert code == 0, log[-3000:]
        assert "stopping: waiting up to" in log and "worker stopped" in log
        cancelled = [line for line in log.splitlines() if "Activity cancelled" in line]
        assert not cancelled, f"the stop cancelled {len(cancelled)} activities: {cancelled[:3]}"

        d.start_worker()
        await until(lambda: len(d.rule_creates()) >= FAILED, "a rule for every GPU", within=WITHIN)
        await asyncio.sleep(2.0)  # a duplicate create would land in these seconds
        created = [r["created"] for r in d.rule_creates()]
        assert len(created) == FAILED == len(set(created)), created
        for g in failing:
            assert await run_count(d.demo, device_workflow_id(g["node"], g["uuid"])) == 1
