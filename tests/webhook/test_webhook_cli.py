"""`sickbay webhook` as an operator runs it: a separate process on a loopback port.

Cases:
- it connects to Temporal from SICKBAY_* settings, reports it on /healthz, accepts a DCGM
  alert with the token from SICKBAY_WEBHOOK_TOKEN_FILE and starts the workflow
- the token file is rotated: the old token gets 401, the new one 200, without a restart
- SIGTERM stops it gracefully (uvicorn finishes, then re-raises the signal)
- without a token and without --no-auth it refuses to start (exit 2, says what to set)
- an invalid setting in the environment (webhook, its server, or any other part of the one
  Settings) stops it with exit 2 and one line naming the setting, not a traceback
"""

from __future__ import annotations

import asyncio
import os
import signal
import sys
import uuid
from pathlib import Path

import httpx
import pytest
from temporalio.testing import WorkflowEnvironment

from contract.names import device_workflow_id
from tests.webhook.helpers import (
    count_runs,
    free_socket,
    payload,
    unique_device,
    xid_alert,
)

pytestmark = pytest.mark.devserver  # the session's Temporal dev server (dev_env)

SICKBAY = str(Path(sys.executable).parent / "sickbay")


def clean_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("SICKBAY_")}
    env.update(extra)
    return env


async def wait_healthy(url: str) -> dict:
    async with asyncio.timeout(20), httpx.AsyncClient() as http:
        while True:
            try:
                resp = await http.get(f"{url}/healthz")
                if resp.status_code == 200:
                    return resp.json()
            except httpx.HTTPError:
                pass
            await asyncio.sleep(0.1)


async def test_cli_webhook_serves_and_rotates_token(
    dev_env: WorkflowEnvironment, tmp_path: Path
) -> None:
    sock = free_socket()
    port = sock.getsockname()[1]
    sock.close()
    token_file = tmp_path / "token"
    token_file.write_text("first-token-0123456789abcdef0123\n")
    queue = f"cli-{uuid.uuid4().hex[:8]}"
    proc = await asyncio.create_subprocess_exec(
        SICKBAY,
        *("webhook", "--host", "127.0.0.1", "--port", str(port)),
        env=clean_env(
            SICKBAY_TEMPORAL_ADDRESS=dev_env.client.service_client.config.target_host,
            SICKBAY_TASK_QUEUE=queue,
            SICKBAY_WEBHOOK_TOKEN_FILE=str(token_file),
        ),
        stdout=asyncio.subprocess.DEVNULL,
        stderr=asyncio.subprocess.PIPE,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        assert await wait_healthy(url) == {"status": "ok", "temporal_connected": True}
        node, gpu = unique_device()
        body = payload(xid_alert(node, gpu))
        async with httpx.AsyncClient(base_url=url, timeout=30) as http:
            resp = await http.post(
                "/v1/alertmanager",
                json=body,
                headers={"Authorization": "Bearer first-token-0123456789abcdef0123"},
            )
            assert resp.status_code == 200 and resp.json()["started"] == 1
            token_file.write_text("second-token-longer-0123456789abcdef\n")
            old = await http.post(
                "/v1/alertmanager",
                json=body,
                headers={"Authorization": "Bearer first-token-0123456789abcdef0123"},
            )
            assert old.status_code == 401
            new = await http.post(
                "/v1/alertmanager",
                json=body,
                headers={"Authorization": "Bearer second-token-longer-0123456789abcdef"},
            )
            # The same alert again: answered from the recent-delivery cache.
            assert new.status_code == 200 and new.json()["duplicates"] == 1
        wid = device_workflow_id(node, gpu)
        assert await count_runs(dev_env.client, f"WorkflowId = '{wid}'", expect=1) == 1
        await dev_env.client.get_workflow_handle(wid).terminate("test done")
    finally:
        if proc.returncode is None:
            proc.send_signal(signal.SIGTERM)
        async with asyncio.timeout(20):
            code = await proc.wait()
    assert proc.stderr is not None
    logs = (await proc.stderr.read()).decode()
    # uvicorn shuts down gracefully, then re-raises the signal it caught (exit -15).
    assert code in (0, -signal.SIGTERM), logs
    assert "Finished server process" in logs
    assert (
        "first-token-0123456789abcdef0123" not in logs and "second-token" not in logs
    )  # never logged


async def test_cli_refuses_to_start_without_token() -> None:
    proc = await asyncio.create_subprocess_exec(
        SICKBAY,
        "webhook",
        env=clean_env(SICKBAY_TEMPORAL_ADDRESS="127.0.0.1:1"),
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    async with asyncio.timeout(30):
        _, err = await proc.communicate()
    assert proc.returncode == 2
    assert b"SICKBAY_WEBHOOK_TOKEN" in err


@pytest.mark.parametrize(
    ("name", "value", "field"),
    [
        ("SICKBAY_WEBHOOK_PORT", "70000", "webhook_port"),
        ("SICKBAY_WEBHOOK_HEADER_TIMEOUT", "0", "webhook_header_timeout"),
        ("SICKBAY_WATCH_RENEW_SECONDS", "99", "watch_renew_seconds"),
    ],
)
async def test_cli_refuses_an_invalid_setting_by_name(name: str, value: str, field: str) -> None:
    """A bad value in the environment stops the webhook with one line naming the setting
    (exit 2), not a traceback."""
    proc = await asyncio.create_subprocess_exec(
        SICKBAY,
        "webhook",
        "--no-auth",
        env=clean_env(SICKBAY_TEMPORAL_ADDRESS="127.0.0.1:1", **{name: value}),
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    async with asyncio.timeout(30):
        _, err = await proc.communicate()
    assert proc.returncode == 2, err.decode()
    assert field.encode() in err and b"Traceback" not in err, err.decode()
