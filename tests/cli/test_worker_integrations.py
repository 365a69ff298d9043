"""Every channel and provider a runbook names is configured before the worker starts.

Cases:
- `unconfigured()`: a channel missing from the channels file; a scale-up provider without
  credentials (gke), an http pool naming a profile the cloud file lacks, a reboot/replace
  provider with no node rungs configured; a runbook whose provider is configured (twin URL,
  an http profile with reboot/replace) or that names none is fine;
- `sickbay worker` with the shipped runbooks and no channels file refuses to start (exit 8),
  one ERROR line per problem naming the runbook, the channel and SICKBAY_CHANNELS_FILE;
- with SICKBAY_ALLOW_UNCONFIGURED_INTEGRATIONS=true it starts, says DEGRADED at WARNING and
  exports the gauge sickbay_unconfigured_integrations with the counts; configured, the gauge
  reads 0 and nothing is said.
"""

from __future__ import annotations

import asyncio
import re
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any

import pytest
from temporalio.testing import WorkflowEnvironment

from activities.cloud.config import CloudConfig
from activities.notify.config import ChannelsConfig
from contract.runbook import Runbook
from harness.stack import free_port
from tests.cli.test_worker_process import _env
from worker.integrations import unconfigured


def _runbook(name: str, spec: dict[str, Any]) -> Runbook:
    return Runbook.model_validate(
        {"apiVersion": "sickbay/v1", "kind": "Runbook", "metadata": {"name": name}, "spec": spec}
    )


def _channels(*names: str) -> ChannelsConfig:
    return ChannelsConfig.model_validate(
        {"channels": {n: {"type": "webhook", "url": "https://hooks.invalid/x"} for n in names}}
    )


HTTP_CALL = {"method": "POST", "url": "https://pools.invalid/x"}
PROFILE = {
    "endpoint": "https://pools.invalid",
    "describe": {"method": "GET", "url": "https://pools.invalid/pools/{pool}"},
    "size_path": "size",
    "scale": HTTP_CALL,
}


def test_unconfigured_channels_and_providers() -> None:
    kube_api = object()
    paging = _runbook(
        "paging",
        {"escalation": {"channels": ["oncall", "audit"], "ownerChannels": ["owners", "audit"]}},
    )
    gke = _runbook("gke", {"scaleUp": {"enabled": True, "provider": "gke", "maxSize": 4}})
    http_pool = {"provider": "http", "name": "p", "profile": "missing"}
    http = _runbook("http", {"scaleUp": {"enabled": True, "pool": http_pool, "maxSize": 4}})
    aks_repair = _runbook(
        "aks-repair",
        {"scaleUp": {"provider": "aks", "maxSize": 4}, "repair": {"enabled": True}},
    )
    none = _runbook("none", {"repair": {"enabled": True}})  # names no provider
    found = unconfigured(
        [paging, gke, http, aks_repair, none],
        _channels("audit"),
        CloudConfig.model_validate({"http": {"other": PROFILE}}),
        kube_api,
        channels_file="/etc/channels.yaml",
    )
    lines = [p.line() for p in found]
    assert [(p.runbook, p.kind, p.name) for p in found] == [
        ("paging", "channel", "oncall"),
        ("paging", "channel", "owners"),  # application errors' channel (ownerChannels)
        ("gke", "provider", "gke"),
        ("http", "provider", "http"),
        ("aks-repair", "provider", "aks"),
    ], lines
    assert "SICKBAY_CHANNELS_FILE=/etc/channels.yaml" in lines[0]
    assert "escalation.ownerChannels" in lines[1]
    assert "SICKBAY_CLOUD_FILE is unset" in lines[2]
    assert "repair reset/reboot/replace" not in lines[4] and "repair reboot/replace" in lines[4]

    configured = CloudConfig.model_validate(
        {
            "twin": {"endpoint": "http://127.0.0.1:9"},
            "http": {"missing": {**PROFILE, "reboot": HTTP_CALL, "replace": HTTP_CALL}},
        }
    )
    twin = _runbook(
        "twin",
        {
            "scaleUp": {"enabled": True, "provider": "twin", "maxSize": 4},
            "repair": {"enabled": True},
        },
    )
    http_repair = _runbook(
        "http-repair",
        {
            "scaleUp": {"enabled": True, "pool": http_pool, "maxSize": 4},
            "repair": {"enabled": True},
        },
    )
    assert unconfigured([twin, http_repair, none], _channels(), configured, kube_api) == []


def _metric(text: str, kind: str) -> float:
    match = re.search(
        rf'^sickbay_unconfigured_integrations\{{[^}}]*kind="{kind}"[^}}]*\}} (\S+)$', text, re.M
    )
    assert match, text
    return float(match.group(1))


@pytest.mark.devserver
async def test_worker_refuses_unconfigured_channels(
    dev_env: WorkflowEnvironment, tmp_path: Path
) -> None:
    from twin.testing import running_twin

    with running_twin(tmp_path, profile="1.36", nodes=1, gpus_per_node=1) as rs:
        env = _env(dev_env, rs.kubeconfig_path, SICKBAY_METRICS_PORT="0")
        env.pop("SICKBAY_CHANNELS_FILE", None)
        env.pop("SICKBAY_ALLOW_UNCONFIGURED_INTEGRATIONS", None)
        proc = await asyncio.to_thread(
            subprocess.run,
            [sys.executable, "-m", "worker.cli", "worker"],
            env=env,
            capture_output=True,
            text=True,
            timeout=180,
        )
    assert proc.returncode == 8, proc.stderr
    errors = [ln for ln in proc.stderr.splitlines() if " ERROR " in ln]
    assert errors, proc.stderr
    assert all("refusing to start" in ln for ln in errors), errors
    assert any(
        "runbook default" in ln and "'pagerduty'" in ln and "SICKBAY_CHANNELS_FILE" in ln
        for ln in errors
    ), errors
    assert any("runbook inference" in ln and "provider 'http'" in ln for ln in errors), errors
    assert "worker polling" not in proc.stderr


@pytest.mark.devserver
async def test_worker_starts_degraded_when_allowed(
    dev_env: WorkflowEnvironment, tmp_path: Path
) -> None:
    from twin.testing import running_twin

    port = free_port()
    log_path = tmp_path / "worker.log"
    with running_twin(tmp_path, profile="1.36", nodes=1, gpus_per_node=1) as rs:
        env = _env(
            dev_env,
            rs.kubeconfig_path,
            SICKBAY_METRICS_PORT=str(port),
            SICKBAY_ALLOW_UNCONFIGURED_INTEGRATIONS="true",
        )
        env.pop("SICKBAY_CHANNELS_FILE", None)
        with log_path.open("w") as log:
            proc = await asyncio.to_thread(
                subprocess.Popen,
                [sys.executable, "-m", "worker.cli", "worker"],
                env=env,
                stdout=log,
                stderr=log,
            )
        try:
            deadline = time.monotonic() + 120
            while "worker polling" not in log_path.read_text():
                assert proc.poll() is None, log_path.read_text()
                assert time.monotonic() < deadline, log_path.read_text()
                await asyncio.sleep(0.1)

            def scrape() -> str:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as r:
                    return r.read().decode()

            metrics = await asyncio.to_thread(scrape)
        finally:
            proc.send_signal(signal.SIGTERM)
            await asyncio.to_thread(proc.wait, 30)
    text = log_path.read_text()
    degraded = [ln for ln in text.splitlines() if "DEGRADED" in ln]
    assert degraded and all(" WARNING " in ln for ln in degraded), text
    assert any("'slack'" in ln for ln in degraded), degraded
    assert _metric(metrics, "channel") >= 5  # every shipped runbook names one
    assert _metric(metrics, "provider") >= 1  # inference: provider http
