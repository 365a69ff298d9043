"""Drill: the Temporal dev server restarts mid-remediation (SQLite file persistence).

The embedded stack's dev server is started with `--db-filename` (state in a SQLite file in
the stack's directory). A GPU fails under a 2-replica inference Deployment on a 1-node x
2-GPU twin, so the evicted replica's replacement is Pending (no healthy GPU) and the
remediation waits under the Pending deadline. The server is stopped (SIGTERM) in that wait
and started again on the same port and file 3 s later. The worker and webhook reconnect by
themselves; the remediation resumes: the Pending deadline passes, the pool is scaled once,
the replacement runs on the new node, the GPU is held; marked repaired, it is released.
Counted: one remediation run, one successful rule create, one resize operation, no
escalation.
"""

from __future__ import annotations

import asyncio
import signal
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest

import tests.drills.conftest as drills
from contract.remediation import Phase
from harness.stack import Child, Stack

pytestmark = [pytest.mark.slow, pytest.mark.devserver]


class PersistentStack(Stack):
    """The embedded stack with the dev server's state in a SQLite file, restartable."""

    temporal_argv: list[str] = []
    temporal_env: dict[str, str] = {}

    def _spawn(self, name: str, argv: list[str], env: dict[str, str]) -> Child:
        if name == "temporal":
            argv = [*argv, "--db-filename", str(Path(self.dir) / "temporal.sqlite")]
            self.temporal_argv, self.temporal_env = argv, env
        return super()._spawn(name, argv, env)

    def restart_temporal(self, down_for: float) -> None:
        old = next(c for c in self.children if c.name == "temporal")
        old.popen.send_signal(signal.SIGTERM)
        try:
            old.popen.wait(15)
        except subprocess.TimeoutExpired:
            old.popen.kill()
            old.popen.wait(5)
        index = self.children.index(old)
        self.children.remove(old)
        time.sleep(down_for)
        new = super()._spawn("temporal", self.temporal_argv, self.temporal_env)
        # Keep the stop order: the server stops after the processes that use it.
        self.children.remove(new)
        self.children.insert(index, new)


async def test_dev_server_restart_mid_remediation(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(drills, "Stack", PersistentStack)
    async with drills.drill_stack(tmp_path) as d:
        stack: Any = d.stack
        assert isinstance(stack, PersistentStack)
        demo = d.demo
        ns = "drill-restart"
        await demo.namespace(ns)
        await demo.deployment(ns, "serve", replicas=2)
        running = await demo.running(ns, "serve", count=2)
        gpu = await demo.gpu(running[0][1])
        await demo.fail(gpu)
        incident = await demo.incident(gpu, "drill: dev server restart")
        await demo.phase(incident, {Phase.AWAITING_REPLACEMENT}, within=60)

        await asyncio.to_thread(stack.restart_temporal, 3.0)

        async def server_back() -> bool:
            try:
                await demo.handle(incident.workflow_id).describe()
                return True
            except Exception:  # the client reconnects once the server listens again
                return False

        await demo.until("the dev server to answer again", server_back, within=60)
        await demo.phase(incident, {Phase.HOLDING}, within=150)
        await demo.running(ns, "serve", count=2)
        await demo.repaired(incident, actor="drill")
        result = await drills.closed(demo, incident, within=60)
        assert result.outcome == "released", (result.outcome, result.reason)
        runs = [
            r async for r in demo.client.list_workflows(f"WorkflowId = '{incident.workflow_id}'")
        ]
        assert len(runs) == 1
        assert len(d.rule_creates()) == 1
        assert len(d.resize_operations()) == 1
        assert d.notifications() == []
