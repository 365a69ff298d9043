"""The processes import what they run: a part that cannot be imported stops the process loudly.

Every workflow, activity module, CLI subcommand owner and twin extension is part of the
build, so none of them is looked up by name and skipped when its import fails: a broken module
must fail the import of the process that needs it, never leave a worker without a workflow or
a CLI without a subcommand.

Cases (each in a fresh interpreter in which one module is made unimportable):
- the worker without `workflows.sweep` / `workflows.pool_scaler` / `activities.notify.activities`;
- the `sickbay` CLI without `worker.doctor`; the dev tools' `sickbay-dev` without `twin.cli` /
  `harness.demo`;
- `sickbay-dev twin` without one of its extensions (`twin.faults`, `twin.cloudapi`).
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

# (module made unimportable, code run after that) — the code must fail with ImportError.
TWIN_REGISTER = (
    "import argparse, twin.cli as c; c.register(argparse.ArgumentParser().add_subparsers())"
)
CASES = [
    ("workflows.sweep", "import worker.main"),
    ("workflows.pool_scaler", "import worker.main"),
    ("activities.notify.activities", "import worker.main"),
    ("worker.doctor", "from worker.cli import build_parser; build_parser()"),
    ("twin.cli", "from harness.cli import build_parser; build_parser()"),
    ("harness.demo", "from harness.cli import build_parser; build_parser()"),
    ("twin.faults", TWIN_REGISTER),
    ("twin.cloudapi", TWIN_REGISTER),
]


@pytest.mark.parametrize(("blocked", "code"), CASES, ids=[c[0] for c in CASES])
def test_an_unimportable_part_fails_the_process(blocked: str, code: str) -> None:
    # sys.modules[name] = None makes `import name` raise ModuleNotFoundError(name=name).
    script = f"import sys\nsys.modules[{blocked!r}] = None\n{code}\n"
    proc = subprocess.run(
        [sys.executable, "-c", script],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert proc.returncode != 0, f"{blocked} missing went unnoticed:\n{proc.stderr}"
    assert "ModuleNotFoundError" in proc.stderr, proc.stderr
    assert blocked in proc.stderr
