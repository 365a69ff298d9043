"""Recording workflow histories for the replay tests (tests/histories/*.json).

A history is written when its file is missing or when SICKBAY_RECORD_HISTORIES=1, so normal
runs never rewrite the recorded files. Nothing is released yet: a change to a workflow's
command sequence changes the code and re-records every history here with
SICKBAY_RECORD_HISTORIES=1 (`workflow.patched` starts with the first release).
"""

from __future__ import annotations

import json
import os
from pathlib import Path

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


def save_history(name: str, history: WorkflowHistory) -> None:
    path = HISTORIES / f"{name}.json"
    if path.exists() and os.environ.get("SICKBAY_RECORD_HISTORIES") != "1":
        return
    HISTORIES.mkdir(parents=True, exist_ok=True)
    path.write_text(history.to_json())
