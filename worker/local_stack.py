"""Where a local stack (`sickbay-dev up`, `sickbay-dev demo --keep`) records itself, read by the CLI.

The stack writes `stack.json` (process group, Temporal address, Web UI URL...) in the state
directory, the one `sickbay-dev twin ...` reads its `twin.json` from; the CLI reads it to link a
workflow to that stack's Web UI.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any


def default_state_dir() -> Path:
    """Where `up` / `demo --keep` keep their stack (`SICKBAY_STATE_DIR`, worker/settings.py):
    the state directory `sickbay-dev twin ...` reads (its twin.json), so `sickbay-dev twin fail`
    finds the twin without flags."""
    from worker.settings import Settings

    return Settings().state_dir


def live_stack(state_dir: Path) -> dict[str, Any] | None:
    """The stack recorded in `state_dir`, or None when none is recorded or its processes
    are gone."""
    try:
        info = json.loads((state_dir / "stack.json").read_text())
    except (OSError, ValueError):
        return None
    pgid = info.get("pgid")
    if not pgid:
        return None
    try:
        os.killpg(int(pgid), 0)
    except (ProcessLookupError, PermissionError):
        return None
    return info
