"""The product apart from its dev tools: the operator's CLI, the package and the worker carry
neither the cluster twin nor the demo harness.

- The package (pyproject.toml, what the wheel, the operator's install and the runtime image
  hold) lists the product's packages and no `twin` or `harness`, and one command, `sickbay`;
  the dev install's `sickbay-dev` (harness/cli.py) has `demo`, `up`, `down` and `twin ...`.
- In a fresh interpreter where `twin` and `harness` cannot be imported (as in the image):
  every module of contract, workflows, activities and worker imports; `sickbay --help`,
  `sickbay worker --help`, `sickbay doctor --help`, `sickbay webhook --help` work (exit 0),
  list the operator's commands and none of the dev tools' (`demo`, `up`, `down`, `twin`),
  which the operator's CLI refuses as any unknown command (exit 2).
A package that is present but broken still fails loudly (tests/cli/test_plain_imports.py).
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
import tomllib
from pathlib import Path

from setuptools import find_packages

ROOT = Path(__file__).resolve().parents[2]
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())
PRODUCT = {"contract", "workflows", "activities", "runbooks", "worker"}
DEV_TOOLS = {"twin", "harness"}
DEV_COMMANDS = ("demo", "up", "down", "twin")

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


def _top_level_packages() -> set[str]:
    find = PYPROJECT["tool"]["setuptools"]["packages"]["find"]
    packages = find_packages(
        where=str(ROOT), include=find.get("include", ["*"]), exclude=find.get("exclude", [])
    )
    return {name.split(".")[0] for name in packages}


def test_the_package_holds_the_product_only() -> None:
    packages = _top_level_packages()
    assert packages == PRODUCT, sorted(packages)
    assert not packages & DEV_TOOLS
    assert PYPROJECT["project"]["scripts"] == {"sickbay": "worker.cli:entrypoint"}
    package_data = PYPROJECT["tool"]["setuptools"].get("package-data", {})
    assert not set(package_data) & DEV_TOOLS, package_data


def test_the_dev_commands_are_sickbay_dev() -> None:
    from harness.cli import build_parser

    help_text = build_parser().format_help()
    for command in DEV_COMMANDS:
        assert re.search(rf"^\s+{command}\s", help_text, re.M), (command, help_text)


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
        assert re.search(rf"^\s+{command}\s", top, re.M), (command, top)
    for command in DEV_COMMANDS:
        assert not re.search(rf"^\s+{command}\s", top, re.M), (command, top)
    for argv in ("demo", "up", "down", "twin up --detach"):
        code, out, err = results[argv]
        assert code == 2, (argv, results[argv])
        assert out == "" and "invalid choice" in err, (argv, err)


def test_the_dev_install_adds_sickbay_dev(tmp_path: Path) -> None:
    """harness/devinstall.py (`make venv`): the path file names the checkout and the
    `sickbay-dev` script it writes runs the dev commands from another directory."""
    import os

    from harness.devinstall import install

    site, scripts = tmp_path / "site-packages", tmp_path / "bin"
    site.mkdir()
    scripts.mkdir()
    pth, script = install(ROOT, site, scripts, sys.executable)
    assert pth.read_text().strip() == str(ROOT) and os.access(script, os.X_OK)
    env = {**os.environ, "PYTHONPATH": pth.read_text().strip()}  # what the path file does
    proc = subprocess.run(
        [str(script), "--help"], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith("usage: sickbay-dev")
    for command in DEV_COMMANDS:
        assert re.search(rf"^\s+{command}\s", proc.stdout, re.M), (command, proc.stdout)
