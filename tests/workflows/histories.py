"""Recording workflow histories for the replay tests (tests/histories/*.json).

A history is written when its file is missing or when SICKBAY_RECORD_HISTORIES=1, so normal
runs never rewrite the recorded files; re-record after a deliberate, patched change.
"""

from __future__ import annotations

import os
from pathlib import Path

from temporalio.client import WorkflowHistory

HISTORIES = Path(__file__).resolve().parents[1] / "histories"


def save_history(name: str, history: WorkflowHistory) -> None:
    path = HISTORIES / f"{name}.json"
    if path.exists() and os.environ.get("SICKBAY_RECORD_HISTORIES") != "1":
        return
    HISTORIES.mkdir(parents=True, exist_ok=True)
    path.write_text(history.to_json())
