"""The operator's CLI and the worker work where the twin and the demo harness are not installed
(the runtime image carries the product only; Dockerfile).

In a fresh interpreter where `twin` and `harness` cannot be imported (as in the image, whose
wheel is built without them):
- every module of contract, workflows, activities and worker imports;
- `sickbay --help`, `sickbay worker --help`, `sickbay doctor --help`, `sickbay webhook --help`
  work (exit 0) and list the operator's commands;
- the development commands (`twin ...`, `demo`, `up`, `down`) exit 2 with one line saying
  they are not in this install and which package brings them; nothing else is printed.
A package that is present but broken still fails loudly (tests/cli/test_plain_imports.py).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

SCRIPT = r"""
import contextlib, importlib, io, json, pkgutil, sys

class Absent:
    # As in the image: `import twin.cli` fails on its parent, ModuleNotFoundError(name="twin").
    def find_spec(self, name, path=None, target=None):
        if name in ("twin", "harness"):
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
        return None

sys.meta_path.insert(0, Absent())
imported = []
for top in ("contract", "workflows", "activities", "worker"):
    package = importlib.import_module(top)
    for info in pkgutil.walk_packages(package.__path__, top + "."):
        importlib.import_module(info.name)
        imported.append(info.name)
from worker.cli import main
results = {}
for argv in (["--help"], ["worker", "--help"], ["doctor", "--help"], ["webhook", "--help"],
             ["demo"], ["up"], ["down"], ["twin", "up", "--detach"]):
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            code = main(argv)
        except SystemExit as exc:
            code = exc.code
    results[" ".join(argv)] = [code, out.getvalue(), err.getvalue()]
print(json.dumps({"imported": imported, "results": results}))
"""


def test_operator_commands_work_without_twin_and_harness() -> None:
    proc = subprocess.run(
        [sys.executable, "-c", SCRIPT], cwd=ROOT, capture_output=True, text=True, timeout=180
    )
    assert proc.returncode == 0, proc.stderr
    found = json.loads(proc.stdout.strip().splitlines()[-1])
    assert "worker.main" in found["imported"] and "worker.doctor" in found["imported"]
    results = found["results"]
    for argv in ("--help", "worker --help", "doctor --help", "webhook --help"):
        code, out, _err = results[argv]
        assert code == 0, (argv, results[argv])
    top = results["--help"][1]
    for command in ("worker", "doctor", "webhook", "launch", "status"):
        assert command in top
    for argv, package in (
        ("demo", "harness"),
        ("up", "harness"),
        ("down", "harness"),
        ("twin up --detach", "twin"),
    ):
        code, out, err = results[argv]
        assert code == 2, (argv, results[argv])
        assert out == "" and len(err.strip().splitlines()) == 1, (argv, err)
        assert "not in this install" in err and f"'{package}'" in err, (argv, err)
