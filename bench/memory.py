"""Benchmark 4: the worker's memory with `count` remediations in flight.

A twin of count/8 nodes x 8 GPUs, budget widened to 100%, time scale 1 (the shipped
runbooks' real durations: each remediation quarantines, finds no consumers and holds,
waiting on its release timers). Alerts go to the webhook in notifications of 50; the worker's
RSS (from /proc) is sampled before, during and once every GPU holds.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from typing import Any

import httpx

from bench.common import dcgm_alert, gpus, notification, rss_mb, set_budget, until, worker_log_signs
from bench.stacks import open_stack, webhook_token, worker_pid
from contract.names import WF_REMEDIATE


async def run(count: int = 1000, per_notification: int = 20, rate: float = 5.0) -> dict[str, Any]:
    from worker.settings import Settings
    from worker.temporal import connect

    signs: dict[str, int] = {}  # filled from the worker's log when the stack stops
    nodes = max(1, (count + 7) // 8)
    stack = await asyncio.to_thread(open_stack, nodes=nodes, gpus_per_node=8, time_scale=1.0)
    try:
        info = stack.info
        assert info is not None
        set_budget(info.runbooks_dir, "100%", "100%")
        pid = worker_pid(stack)
        idle = rss_mb(pid)
        chosen = gpus(info.kube_url)[:count]
        alerts = [dcgm_alert(g["node"], g["uuid"], g["index"]) for g in chosen]
        token = webhook_token(stack)
        client = await connect(
            Settings(temporal_address=info.temporal_address, temporal_namespace=info.namespace)
        )
        samples: list[tuple[float, float]] = [(0.0, idle)]
        t0 = time.monotonic()
        async with httpx.AsyncClient(timeout=60.0) as http:
            for i in range(0, len(alerts), per_notification):
                # Paced (`rate` alerts/s): this measures memory in flight; the storm measures
                # arrival at 2,000/s.
                await asyncio.sleep(max(0.0, t0 + i / rate - time.monotonic()))
                await http.post(
                    info.webhook_url,
                    json=notification(alerts[i : i + per_notification]),
                    headers={"Authorization": f"Bearer {token}"},
                )
                samples.append((time.monotonic() - t0, rss_mb(pid)))

        async def settled() -> bool:
            samples.append((time.monotonic() - t0, rss_mb(pid)))
            held = await client.count_workflows(
                f"WorkflowType = '{WF_REMEDIATE}' AND SickbayPhase = 'holding'"
            )
            ended = await client.count_workflows(
                f"WorkflowType = '{WF_REMEDIATE}' AND ExecutionStatus != 'Running'"
            )
            return held.count + ended.count >= count

        with contextlib.suppress(TimeoutError):
            await until(f"{count} remediations holding or ended", settled, 240.0, 1.0)
        held = (
            await client.count_workflows(
                f"WorkflowType = '{WF_REMEDIATE}' AND SickbayPhase = 'holding'"
            )
        ).count
        all_in = time.monotonic() - t0
        failed = (
            await client.count_workflows(
                f"WorkflowType = '{WF_REMEDIATE}' AND ExecutionStatus = 'Failed'"
            )
        ).count
        await asyncio.sleep(5.0)  # settle: the cache holds every workflow now
        in_flight = rss_mb(pid)
        samples.append((time.monotonic() - t0, in_flight))
        return {
            "remediations": count,
            "holding": held,
            "failed": failed,
            "alert_rate": rate,
            "max_cached_workflows": Settings().max_cached_workflows,
            "worker_log": signs,
            "seconds_to_all_holding": round(all_in, 1),
            "rss_idle_mb": round(idle, 1),
            "rss_in_flight_mb": round(in_flight, 1),
            "rss_peak_mb": round(max(v for _, v in samples), 1),
            "samples": samples,
        }
    finally:
        signs.update(worker_log_signs(stack.dir))
        await asyncio.to_thread(stack.stop)
