"""Recording workflow histories for the replay tests (tests/histories/*.json).

A history is written when its file is missing or when SICKBAY_RECORD_HISTORIES=1, so normal
runs never rewrite the recorded files. Nothing is released yet: a change to a workflow's
command sequence changes the code and re-records every history here with
SICKBAY_RECORD_HISTORIES=1 (`workflow.patched` starts with the first release).
"""

from __future__ import annotations

import json
import os
from datetime import timedelta
from pathlib import Path
from typing import Any

from temporalio.api.enums.v1 import EventType
from temporalio.client import WorkflowHistory

HISTORIES = Path(__file__).resolve().parents[1] / "histories"
# The marker the SDK records for each `workflow.patched(...)` a run passed.
PATCH_MARKER = "core_patch"


def patch_markers(history: WorkflowHistory) -> list[str]:
    """The patch ids a run recorded (none while nothing is released)."""
    return [
        json.loads(e.marker_recorded_event_attributes.details["patch-data"].payloads[0].data)["id"]
        for e in history.events
        if e.event_type == EventType.EVENT_TYPE_MARKER_RECORDED
        and e.marker_recorded_event_attributes.marker_name == PATCH_MARKER
    ]


def scheduled_heartbeats(history: WorkflowHistory) -> dict[str, timedelta]:
    """The heartbeat timeout each activity type was scheduled with (the last scheduling)."""
    return {
        e.activity_task_scheduled_event_attributes.activity_type.name: (
            e.activity_task_scheduled_event_attributes.heartbeat_timeout.ToTimedelta()
        )
        for e in history.events
        if e.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED
    }


def _without_stack_traces(node: Any) -> Any:
    """A failure's `stackTrace` names the recording machine's file paths; replay never reads
    it, so recorded histories carry it empty."""
    if isinstance(node, dict):
        return {k: "" if k == "stackTrace" else _without_stack_traces(v) for k, v in node.items()}
    if isinstance(node, list):
        return [_without_stack_traces(v) for v in node]
    return node


def save_history(name: str, history: WorkflowHistory) -> None:
    path = HISTORIES / f"{name}.json"
    if path.exists() and os.environ.get("SICKBAY_RECORD_HISTORIES") != "1":
        return
    HISTORIES.mkdir(parents=True, exist_ok=True)
    doc = _without_stack_traces(json.loads(history.to_json()))
    path.write_text(json.dumps(doc, indent=2) + "\n")
