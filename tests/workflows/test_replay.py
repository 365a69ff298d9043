"""Replay of recorded histories (tests/histories/*.json) against today's workflow code.

Cases: every recorded history (one per branch a workflow test drives: happy path, application
Xid, dry run, hand-over, budget exhausted, budget wait and its continue-as-new resume, approval
approve/reject, abort, forced eviction, eviction-api backstop, scale-up, churn, hold
continue-as-new, healthy cool-down) replays without non-determinism, using the worker's own
WORKFLOWS list and the pydantic data converter, and none carries a patch marker.

Nothing is released yet, so no running workflow needs an old branch: a change to the command
sequence changes the code and re-records the histories (SICKBAY_RECORD_HISTORIES=1, see
tests/workflows/histories.py); until then it fails here. `workflow.patched` starts with the
first release.
"""

from __future__ import annotations

import base64
import json
from pathlib import Path

import pytest
from temporalio.client import WorkflowHistory
from temporalio.worker import Replayer

from contract.names import device_workflow_id, node_workflow_id
from tests.workflows.histories import patch_markers
from worker.converter import DATA_CONVERTER
from worker.main import WORKFLOWS

HISTORIES = Path(__file__).resolve().parents[1] / "histories"
RECORDED = sorted(HISTORIES.glob("*.json"))
TEXTS = {path: path.read_text() for path in RECORDED}


def test_histories_recorded() -> None:
    names = {p.stem for p in RECORDED}
    assert {"happy_path", "budget_exhausted", "scale_up_success", "abort"} <= names


def recorded_workflow_id(text: str) -> str:
    """The remediation's id, derived from its input like the workflow itself does (the
    history JSON does not carry the workflow id, and the workflow checks its own id)."""
    started = json.loads(text)["events"][0]["workflowExecutionStartedEventAttributes"]
    payload = json.loads(base64.b64decode(started["input"]["payloads"][0]["data"]))
    if "device" not in payload and "node" not in payload:  # the GPU ledger, the budget
        return "sickbay-replayed"  # neither reads its own id on replay
    if "device" not in payload:  # a node incident (NodeIncidentInput)
        return node_workflow_id(payload["node"], payload.get("cluster", ""))
    return device_workflow_id(payload["device"]["node"], payload["device"]["gpu_uuid"])


@pytest.mark.parametrize("path", RECORDED, ids=lambda p: p.stem)
def test_recorded_without_patches(path: Path) -> None:
    text = TEXTS[path]
    history = WorkflowHistory.from_json(recorded_workflow_id(text), text)
    assert patch_markers(history) == []
    assert "TemporalChangeVersion" not in text


@pytest.mark.parametrize("path", RECORDED, ids=lambda p: p.stem)
async def test_replay(path: Path) -> None:
    text = TEXTS[path]
    workflow_id = recorded_workflow_id(text)
    replayer = Replayer(workflows=WORKFLOWS, data_converter=DATA_CONVERTER)
    result = await replayer.replay_workflow(WorkflowHistory.from_json(workflow_id, text))
    assert result.replay_failure is None
