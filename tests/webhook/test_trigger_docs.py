"""docs/triggers.md stays true: its JSON inputs validate and its CLI command works.

Cases:
- every ```json block marked `<!-- input: Model -->` validates as that model; a marked
  workflow id equals the id Sickbay derives from the device (so a UI launch meets alerts)
- the `temporal workflow signal-with-start` example, run against the dev server with the
  `temporal` binary, starts `remediate-gpu-device` with that id and an `alert` signal whose
  payload decodes as AlertEvidence
- the workflow type and task queue the docs name are the constants
- a RemediationInput needs nothing but the device (what the Web UI form relies on)
- every `sickbay launch` example parses with the real CLI; the single-GPU one, run against
  the dev server, starts that GPU's workflow with the documented reason and dry run
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import shlex
import sys
import uuid
from pathlib import Path

import pytest
from temporalio.testing import WorkflowEnvironment

from contract.kube import DeviceRef
from contract.maintenance import MaintenanceInput
from contract.names import DEFAULT_TASK_QUEUE, SIG_ALERT, WF_MAINTENANCE, WF_REMEDIATE
from contract.remediation import AlertEvidence, RemediationInput
from tests.webhook.helpers import signal_names
from twin.testing import RunningTwin

DOC = Path(__file__).resolve().parents[2] / "docs" / "triggers.md"
INPUTS = {"RemediationInput": RemediationInput, "MaintenanceInput": MaintenanceInput}
MARKED = re.compile(r"<!-- input: (\w+)(?: id: (\S+))? -->\s*```json\n(.*?)```", re.S)


def test_marked_inputs_validate() -> None:
    text = DOC.read_text()
    blocks = MARKED.findall(text)
    assert len(blocks) >= 3, "docs/triggers.md lost its Web UI inputs"
    kinds = set()
    for model_name, workflow_id, body in blocks:
        model = INPUTS[model_name]
        value = model.model_validate_json(body)
        kinds.add(model_name)
        if workflow_id:
            assert value.device.workflow_id() == workflow_id
    assert kinds == {"RemediationInput", "MaintenanceInput"}


def test_names_match_constants() -> None:
    text = DOC.read_text()
    for name in (WF_REMEDIATE, WF_MAINTENANCE, DEFAULT_TASK_QUEUE):
        assert f"`{name}`" in text


def _cli_example() -> list[str]:
    text = DOC.read_text()
    block = re.search(r"```bash\n(temporal workflow signal-with-start.*?)```", text, re.S)
    assert block, "the temporal CLI example is gone"
    return shlex.split(block.group(1).replace("\\\n", " "))


@pytest.mark.devserver
async def test_cli_example_runs(dev_env: WorkflowEnvironment, temporal_cli_path: str) -> None:
    argv = _cli_example()
    queue = f"docs-{uuid.uuid4().hex[:8]}"
    argv[argv.index("--task-queue") + 1] = queue
    workflow_id = argv[argv.index("--workflow-id") + 1]
    address = dev_env.client.service_client.config.target_host
    proc = await asyncio.create_subprocess_exec(
        temporal_cli_path,
        *argv[1:],
        "--address",
        address,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    out, err = await proc.communicate()
    assert proc.returncode == 0, (out, err)
    handle = dev_env.client.get_workflow_handle(workflow_id)
    try:
        desc = await handle.describe()
        assert desc.workflow_type == WF_REMEDIATE and desc.task_queue == queue
        assert await signal_names(dev_env.client, workflow_id) == [SIG_ALERT]
        history = await handle.fetch_history()
        start = history.events[0].workflow_execution_started_event_attributes
        RemediationInput.model_validate_json(start.input.payloads[0].data)
        signalled = next(
            e for e in history.events if e.HasField("workflow_execution_signaled_event_attributes")
        )
        data = signalled.workflow_execution_signaled_event_attributes.input.payloads[0].data
        assert AlertEvidence.model_validate_json(data).xid == 79
        assert json.loads(data)["source"] == "manual"
    finally:
        await handle.terminate("docs test done")


def test_only_device_required() -> None:
    # The Web UI form can launch with nothing but the device (as the docs say).
    value = RemediationInput.model_validate_json('{"device": {"node": "n", "gpu_uuid": "GPU-1"}}')
    assert value.device.key == "n/GPU-1" and value.alerts == [] and not value.dry_run


def _launch_lines() -> list[list[str]]:
    block = re.search(r"<!-- cli: sickbay -->\s*```bash\n(.*?)```", DOC.read_text(), re.S)
    assert block, "the sickbay launch examples are gone"
    return [
        shlex.split(line)
        for line in block.group(1).splitlines()
        if line.strip() and not line.lstrip().startswith("#")
    ]


def test_launch_examples_parse() -> None:
    from worker.cli import build_parser

    parser = build_parser()
    lines = _launch_lines()
    assert len(lines) >= 4
    for argv in lines:
        assert argv[0] == "sickbay"
        args = parser.parse_args(argv[1:])  # SystemExit (exit 2) on a flag that does not exist
        assert args.command == "launch"


@pytest.mark.devserver
async def test_launch_example_runs(dev_env: WorkflowEnvironment, twin: RunningTwin) -> None:
    argv = list(_launch_lines()[0])  # the single-GPU launch, on a GPU the twin has
    rs = twin.store.list("resourceslices.resource.k8s.io").items[0]
    dev = next(d for d in rs["spec"]["devices"] if d["name"] == "gpu-0")
    argv[argv.index("--node") + 1] = rs["spec"]["nodeName"]
    argv[argv.index("--uuid") + 1] = dev["attributes"]["uuid"]["string"]
    queue = f"docs-launch-{uuid.uuid4().hex[:8]}"
    address = dev_env.client.service_client.config.target_host
    sickbay = str(Path(sys.executable).parent / "sickbay")
    proc = await asyncio.create_subprocess_exec(
        sickbay,
        *argv[1:],
        "--address",
        address,
        "--task-queue",
        queue,
        "--cluster",
        "",  # the unnamed cluster: this run has no cluster record to read
        "--json",
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        env={**os.environ, "KUBECONFIG": str(twin.kubeconfig_path)},  # the launch asks the API
    )
    out, err = await proc.communicate()
    assert proc.returncode == 0, (out, err)
    result = json.loads(out)
    node, gpu = argv[argv.index("--node") + 1], argv[argv.index("--uuid") + 1]
    assert result["workflow_id"] == DeviceRef(node=node, gpu_uuid=gpu).workflow_id()
    assert result["started"] is True
    handle = dev_env.client.get_workflow_handle(result["workflow_id"])
    try:
        desc = await handle.describe()
        assert desc.workflow_type == WF_REMEDIATE and desc.task_queue == queue
        history = await handle.fetch_history()
        start = history.events[0].workflow_execution_started_event_attributes
        inp = RemediationInput.model_validate_json(start.input.payloads[0].data)
        assert inp.dry_run and inp.trigger == "manual" and inp.reason == "Xid 79 seen by hand"
    finally:
        await handle.terminate("docs test done")
