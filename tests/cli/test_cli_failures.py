"""The operator's commands fail as one clear line, never a traceback: the real `sickbay`
console script in a subprocess, as a person runs it.

Cases:
- Temporal unreachable (a closed port): `status`, `timeline`, `approve`, `abort`,
  `repaired`, `extend-deadline`, `gpus` and `gpus unretire` exit 1 with one line naming the
  address and saying Temporal cannot be reached, and no traceback; so does `launch` of a device
  the cluster (the twin) confirms;
- a node name or device holding a newline, an escape sequence or a right-to-left override is
  shown escaped by `sickbay status`, never raw;
- `extend-deadline --by 0m`, `--by=-5m` and `--by soon` are refused in one line naming the
  flag; durations read as people write them (`runbooks explain`: `30m`, never `0:30:00`;
  `6m24s`, never `384.138064s`), while the exact form still reads back to the same value;
- a reader that closed the pipe (`sickbay status --all | head -c 0`, the dev server up) ends
  the command quietly: no "cannot reach Temporal", nothing on stderr.
"""

from __future__ import annotations

import asyncio
import os
import re
import subprocess
import sys
import uuid
from datetime import timedelta
from pathlib import Path

import pytest
from temporalio.common import SearchAttributeKey, SearchAttributePair, TypedSearchAttributes
from temporalio.testing import WorkflowEnvironment

from contract.base import format_duration, human_duration, parse_duration
from contract.names import SA_DEVICE, SA_NODE, SA_PHASE, WF_REMEDIATE
from harness.stack import free_port
from tests.cli.test_launch_resolve import _node_and_uuid
from twin.testing import RunningTwin

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


def test_launch_with_temporal_unreachable_is_one_line(twin: RunningTwin) -> None:
    """`launch` confirms the device with the Kubernetes API first (the twin has it), then
    cannot reach Temporal: one line, nothing launched."""
    node, gpu_uuid = _node_and_uuid(twin, "gpu-0")
    address = f"127.0.0.1:{free_port()}"
    env = {**_env(address), "KUBECONFIG": str(twin.kubeconfig_path)}
    proc = subprocess.run(
        [SICKBAY, "launch", "--node", node, "--uuid", gpu_uuid],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 1, (proc.returncode, proc.stdout, proc.stderr)
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and f"cannot reach Temporal at {address}" in lines[0], proc.stderr


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


async def test_cluster_supplied_text_is_escaped_in_status(dev_env: WorkflowEnvironment) -> None:
    """A node name or device carrying a newline, an escape sequence or a right-to-left override
    (from labels, alerts) shows as visible escapes in `sickbay status`, never raw."""
    client = dev_env.client
    node = "gpu-node-1\n\x1b[2Jevil\u202eLIVE"
    wf_id = f"sickbay-gpu-escape-{uuid.uuid4().hex[:8]}"
    await client.start_workflow(
        WF_REMEDIATE,
        id=wf_id,
        task_queue=f"nobody-{uuid.uuid4().hex[:8]}",  # no worker: it just stays Running
        search_attributes=TypedSearchAttributes(
            [
                SearchAttributePair(SearchAttributeKey.for_keyword(SA_NODE), node),
                SearchAttributePair(SearchAttributeKey.for_keyword(SA_DEVICE), f"{node}/GPU-1"),
                SearchAttributePair(SearchAttributeKey.for_keyword(SA_PHASE), "holding"),
            ]
        ),
    )
    try:
        address = client.service_client.config.target_host
        out = ""
        for _ in range(100):  # visibility is eventually consistent
            proc = await asyncio.to_thread(
                subprocess.run,
                [SICKBAY, "status"],
                env=_env(address),
                capture_output=True,
                text=True,
                timeout=120,
            )
            out = proc.stdout
            if wf_id in out:
                break
            await asyncio.sleep(0.1)
        row = next(line for line in out.splitlines() if wf_id in line)
        assert "gpu-node-1\\n\\x1b[2Jevil\\u202eLIVE/GPU-1" in row, row
        assert "\x1b" not in out and "\u202e" not in out
        assert not any(line.startswith("\x1b[2Jevil") for line in out.splitlines())
    finally:
        await client.get_workflow_handle(wf_id).terminate("test done")


@pytest.mark.parametrize(
    ("by", "why"), [("0m", "moves nothing"), ("-5m", "is negative"), ("soon", "not a duration")]
)
def test_extend_deadline_by_a_non_positive_duration_is_one_line(by: str, why: str) -> None:
    proc = subprocess.run(
        [SICKBAY, "extend-deadline", WORKFLOW_ID, f"--by={by}", "--reason", "r"],
        env=_env(f"127.0.0.1:{free_port()}"),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 2
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and why in lines[0] and "--by" in lines[0], proc.stderr


def test_durations_read_as_people_write_them() -> None:
    proc = subprocess.run(
        [SICKBAY, "runbooks", "explain", "--namespace", "serving", "--owner-kind", "Deployment"],
        env=_env(f"127.0.0.1:{free_port()}"),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    assert "Healthy for 30m" in proc.stdout and "wait up to 5m" in proc.stdout, proc.stdout
    assert not re.search(r"\d+:\d\d:\d\d", proc.stdout), proc.stdout  # no 0:30:00
    assert human_duration(timedelta(seconds=384.138064)) == "6m24s"
    assert human_duration(timedelta(hours=1, minutes=30)) == "1h30m"
    assert human_duration(timedelta(seconds=2.25)) == "2.2s"
    assert human_duration(timedelta(milliseconds=300)) == "300ms"
    # The exact form (JSON, the Web UI) reads back to the same value.
    exact = timedelta(seconds=384.138064)
    assert (
        format_duration(exact) == "6m24.138064s" and parse_duration(format_duration(exact)) == exact
    )
