"""`sickbay worker` as a process: starts against the dev server and the cluster twin, serves
Prometheus metrics, polls its task queue, and stops cleanly on SIGTERM.

Cases:
- the worker registers its workflows/activities, freezes its start-up heap, says so in its log, exposes /metrics with the
  SDK's metrics, and exits 0 after SIGTERM with "worker stopped";
- with invalid runbooks it refuses to start (exit code 5) naming file:line.
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time
import urllib.request
import uuid
from pathlib import Path

import pytest
from temporalio.testing import WorkflowEnvironment

from harness.stack import free_port

pytestmark = pytest.mark.devserver


def _env(dev_env: WorkflowEnvironment, kubeconfig: Path, **extra: str) -> dict[str, str]:
    env = dict(os.environ)
    env.update(
        {
            "SICKBAY_TEMPORAL_ADDRESS": dev_env.client.service_client.config.target_host,
            "SICKBAY_TASK_QUEUE": f"proc-{uuid.uuid4().hex[:8]}",
            "KUBECONFIG": str(kubeconfig),
            "SICKBAY_SWEEP_ENABLED": "false",
            "SICKBAY_GRACEFUL_SHUTDOWN_SECONDS": "2",
            # Sickbay's namespace (the recorded cluster name): one every cluster has.
            "SICKBAY_WATCH_NAMESPACE": "default",
            # The shipped runbooks name channels and a provider these tests do not configure
            # (tests/cli/test_worker_integrations.py covers the refusal without this).
            "SICKBAY_ALLOW_UNCONFIGURED_INTEGRATIONS": "true",
            **extra,
        }
    )
    return env


async def test_worker_starts_serves_metrics_and_stops(
    dev_env: WorkflowEnvironment, tmp_path: Path
) -> None:
    from twin.testing import running_twin

    port = free_port()
    log_path = tmp_path / "worker.log"
    with running_twin(tmp_path, profile="1.36", nodes=1, gpus_per_node=1) as rs:
        env = _env(dev_env, rs.kubeconfig_path, SICKBAY_METRICS_PORT=str(port))
        with log_path.open("w") as log:
            proc = await asyncio.to_thread(
                subprocess.Popen,
                [sys.executable, "-m", "worker.cli", "worker"],
                env=env,
                stdout=log,
                stderr=log,
            )
        try:
            deadline = time.monotonic() + 120  # a busy machine: start-up reads the cluster too
            while "worker polling" not in log_path.read_text():
                assert proc.poll() is None, log_path.read_text()
                assert time.monotonic() < deadline, log_path.read_text()
                await asyncio.sleep(0.1)

            def scrape() -> str:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as r:
                    return r.read().decode()

            metrics = await asyncio.to_thread(scrape)
            assert "temporal_" in metrics
            proc.send_signal(signal.SIGTERM)
            code = await asyncio.to_thread(proc.wait, 30)
        finally:
            if proc.poll() is None:
                proc.kill()
    text = log_path.read_text()
    assert code == 0, text
    assert "worker stopped" in text
    # Start-up objects leave the collector's full scans once warm-up is done, before polling.
    assert text.index("start-up heap frozen:") < text.index("worker polling"), text


async def test_worker_refuses_invalid_runbooks(
    dev_env: WorkflowEnvironment, tmp_path: Path
) -> None:
    from twin.testing import running_twin

    bad = tmp_path / "runbooks"
    bad.mkdir()
    (bad / "default.yaml").write_text(
        "apiVersion: sickbay/v1\nkind: Runbook\nmetadata: {name: default}\nspec:\n  eviction: {force: maybe}\n"
    )
    with running_twin(tmp_path, profile="1.36", nodes=1, gpus_per_node=1) as rs:
        env = _env(
            dev_env, rs.kubeconfig_path, SICKBAY_METRICS_PORT="0", SICKBAY_RUNBOOKS_DIR=str(bad)
        )
        done = await asyncio.to_thread(
            subprocess.run,
            [sys.executable, "-m", "worker.cli", "worker"],
            env=env,
            capture_output=True,
            text=True,
            timeout=60,
        )
    assert done.returncode == 5, done.stderr
    assert f"{bad / 'default.yaml'}:5: spec.eviction.force" in done.stderr
