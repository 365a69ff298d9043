"""The operator's commands fail as one clear line, never a traceback: the real `sickbay`
console script in a subprocess, as a person runs it.

Cases:
- Temporal unreachable (a closed port): `status`, `timeline`, `launch`, `approve`, `abort`,
  `repaired`, `extend-deadline`, `gpus` and `gpus unretire` exit 1 with one line naming the
  address and saying Temporal cannot be reached, and no traceback;
- a reader that closed the pipe (`sickbay status --all | head -c 0`, the dev server up) ends
  the command quietly: no "cannot reach Temporal", nothing on stderr.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
from pathlib import Path

import pytest
from temporalio.testing import WorkflowEnvironment

from harness.stack import free_port

SICKBAY = str(Path(sys.executable).parent / "sickbay")
WORKFLOW_ID = "sickbay-gpu-gpu-node-1-gpu-0b6b5d9e-3c5c-4c3f-9a39-5f1c2d7e8a11"
DEVICE = "gpu-node-1/GPU-0b6b5d9e-3c5c-4c3f-9a39-5f1c2d7e8a11"


def _env(address: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("SICKBAY_")}
    env.update(SICKBAY_TEMPORAL_ADDRESS=address, SICKBAY_CLUSTER="", KUBECONFIG="/nonexistent")
    return env


COMMANDS = {
    "status": ["status"],
    "timeline": ["timeline", WORKFLOW_ID],
    "launch": ["launch", "--node", "gpu-node-1", "--uuid", DEVICE.split("/")[1]],
    "approve": ["approve", WORKFLOW_ID, "--actor", "alice"],
    "abort": ["abort", WORKFLOW_ID, "--reason", "wrong GPU", "--actor", "alice"],
    "repaired": ["repaired", WORKFLOW_ID, "--actor", "alice"],
    "extend-deadline": ["extend-deadline", WORKFLOW_ID, "--by", "30m", "--reason", "r"],
    "gpus": ["gpus"],
    "gpus-unretire": ["gpus", "unretire", "GPU-0b6b5d9e", "--reason", "r", "--actor", "alice"],
}


@pytest.mark.parametrize("name", sorted(COMMANDS))
def test_unreachable_temporal_is_one_line(name: str) -> None:
    address = f"127.0.0.1:{free_port()}"  # nothing listens there
    proc = subprocess.run(
        [SICKBAY, *COMMANDS[name]],
        env=_env(address),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 1, (proc.returncode, proc.stdout, proc.stderr)
    assert "Traceback" not in proc.stderr, proc.stderr
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert len(lines) == 1, proc.stderr
    assert f"cannot reach Temporal at {address}" in lines[0], lines[0]


async def test_a_closed_pipe_ends_quietly(dev_env: WorkflowEnvironment) -> None:
    address = dev_env.client.service_client.config.target_host
    read, write = os.pipe()
    os.close(read)  # the reader is gone before the first byte: every write meets a closed pipe
    try:
        proc = await asyncio.to_thread(
            subprocess.run,
            [SICKBAY, "status", "--all"],
            env=_env(address),
            stdout=write,
            stderr=subprocess.PIPE,
            text=True,
            timeout=120,
        )
    finally:
        os.close(write)
    assert "cannot reach Temporal" not in proc.stderr, proc.stderr
    assert "Traceback" not in proc.stderr, proc.stderr
    assert proc.stderr.strip() == "", proc.stderr
