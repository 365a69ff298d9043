"""The worker's `/healthz` (worker/health.py): healthy only while it polls Temporal.

Cases:
- `sickbay worker` as a process with its own Temporal dev server: /healthz answers 200 once
  the server lists the worker among the task queue's pollers; the dev server is shut down:
  /healthz turns 503 naming Temporal, while the metrics port (the old probe's target) still
  answers 200;
- `check_once`: a worker whose run task ended fails; a poller the server lists but whose
  newest poll time stops moving fails after POLL_SILENCE (a fake clock, the server's
  timestamps compared only with themselves); a worker not among the pollers fails;
- the snapshot is unhealthy before any passing check, and after `stale_after` without one.
"""

from __future__ import annotations

import asyncio
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import pytest
from google.protobuf.timestamp_pb2 import Timestamp
from temporalio.api.taskqueue.v1 import PollerInfo
from temporalio.api.workflowservice.v1 import DescribeTaskQueueResponse

from harness.stack import free_port
from tests.cli.test_worker_process import _env
from tests.conftest import start_dev_server
from worker.health import POLL_SILENCE, PollingHealth, check_once


def _get(url: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(url, timeout=5) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as err:
        return err.code, err.read().decode()
    except OSError as err:
        return 0, str(err)


def _tail(log: Path) -> str:
    return log.read_text()[-3000:]


async def _until(url: str, status: int, proc: subprocess.Popen[bytes], log: Path) -> str:
    """Poll `url` until it answers `status` (a condition; the bound only stops a hung test)."""
    deadline = time.monotonic() + 120
    while True:
        code, body = await asyncio.to_thread(_get, url)
        if code == status:
            return body
        assert proc.poll() is None, _tail(log)
        assert time.monotonic() < deadline, f"{url}: {code} {body}\n{_tail(log)}"
        await asyncio.sleep(0.2)


@pytest.mark.devserver
async def test_healthz_fails_when_temporal_is_gone(temporal_cli_path: str, tmp_path: Path) -> None:
    from twin.testing import running_twin

    server = await start_dev_server(temporal_cli_path)
    health, metrics = free_port(), free_port()
    log_path = tmp_path / "worker.log"
    stopped = False
    with running_twin(tmp_path, profile="1.36", nodes=1, gpus_per_node=1) as rs:
        env = _env(
            server,
            rs.kubeconfig_path,
            SICKBAY_METRICS_PORT=str(metrics),
            SICKBAY_HEALTH_PORT=str(health),
            SICKBAY_HEALTH_STALE_SECONDS="3",  # a check every 0.5 s
            SICKBAY_WATCH_ENABLED="false",
        )
        with log_path.open("w") as log:
            proc = await asyncio.to_thread(
                subprocess.Popen,
                [sys.executable, "-m", "worker.cli", "worker"],
                env=env,
                stdout=log,
                stderr=log,
            )
        try:
            url = f"http://127.0.0.1:{health}/healthz"
            body = await _until(url, 200, proc, log_path)
            assert body.startswith("ok: polling task queue"), body
            await server.shutdown()
            stopped = True
            body = await _until(url, 503, proc, log_path)
            assert "Temporal does not answer" in body, body
            code, _ = await asyncio.to_thread(_get, f"http://127.0.0.1:{metrics}/metrics")
            assert code == 200  # the metrics port alone would have said "alive"
        finally:
            proc.send_signal(signal.SIGTERM)
            try:
                await asyncio.to_thread(proc.wait, 30)
            except subprocess.TimeoutExpired:
                proc.kill()
            if not stopped:
                await server.shutdown()


class _Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


class _Service:
    def __init__(self, pollers: list[PollerInfo]) -> None:
        self.pollers = pollers

    async def describe_task_queue(self, _req: Any) -> DescribeTaskQueueResponse:
        return DescribeTaskQueueResponse(pollers=self.pollers)


class _Client:
    namespace = "default"

    def __init__(self, service: _Service) -> None:
        self.workflow_service = service


def _poller(identity: str, seconds: int) -> PollerInfo:
    return PollerInfo(identity=identity, last_access_time=Timestamp(seconds=seconds))


async def test_check_once_needs_a_running_worker_whose_polls_move() -> None:
    clock = _Clock()
    state = PollingHealth(stale_after=30, clock=clock)
    assert not state.snapshot().healthy  # nothing passed yet
    service = _Service([_poller("me", 100), _poller("other", 500)])
    client: Any = _Client(service)

    await check_once(client, "q", "me", lambda: True, state, limit=1)
    assert state.snapshot().healthy

    clock.now += POLL_SILENCE / 2  # the same poll time, not yet silent long enough
    await check_once(client, "q", "me", lambda: True, state, limit=1)
    assert state.snapshot().healthy
    clock.now += POLL_SILENCE  # still the same poll time: the poller stopped
    await check_once(client, "q", "me", lambda: True, state, limit=1)
    clock.now += 31
    snap = state.snapshot()
    assert not snap.healthy and "no new poll" in snap.reason

    service.pollers = [_poller("me", 200)]  # polls again
    await check_once(client, "q", "me", lambda: True, state, limit=1)
    assert state.snapshot().healthy

    await check_once(client, "q", "me", lambda: False, state, limit=1)  # run task ended
    clock.now += 31
    snap = state.snapshot()
    assert not snap.healthy and "stopped running" in snap.reason

    service.pollers = [_poller("other", 900)]
    await check_once(client, "q", "me", lambda: True, state, limit=1)
    clock.now += 31
    snap = state.snapshot()
    assert not snap.healthy and "not among the pollers" in snap.reason
