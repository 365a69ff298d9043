"""The real monitoring binaries (Debian 12: `prometheus` gives prometheus + promtool,
`prometheus-alertmanager` gives prometheus-alertmanager + amtool).

Absent, the tests skip and say how to install them; SICKBAY_REQUIRE_MONITORING=1 (set by
.ci/run) turns that skip into a failure.
"""

from __future__ import annotations

import os
import shutil

import pytest

INSTALL = "apt-get install prometheus prometheus-alertmanager"


def binary(*names: str) -> str:
    """The first of `names` on PATH; skip (fail under SICKBAY_REQUIRE_MONITORING=1) if none."""
    for name in names:
        path = shutil.which(name)
        if path:
            return path
    reason = f"{' / '.join(names)} not found: {INSTALL} (Debian/Ubuntu)"
    if os.environ.get("SICKBAY_REQUIRE_MONITORING") == "1":
        pytest.fail(f"SICKBAY_REQUIRE_MONITORING=1 but {reason}")
    pytest.skip(reason)
