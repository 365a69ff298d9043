"""Static guard for the workflow code that runs outside Temporal's sandbox.

The remediation and budget workflows are `sandboxed=False` (the sandbox's per-run re-import
sat on the alert -> taint hot path), so nothing at run time stops them from reading a clock,
randomness, the environment or the network. This test is that check, done on the source:

- every `workflows/` and `contract/` module (workflows run the contract's validators and
  properties too) imports only the standard-library modules listed here, `temporalio`,
  `pydantic`, `workflows.*` and `contract.*` (lint-imports keeps kubernetes/httpx/twin out;
  this also keeps `time`, `random`, `os`, `socket`, `threading`... out);
- no module calls a wall clock or an entropy source by attribute (`datetime.now()`,
  `datetime.utcnow()`, `date.today()`, `uuid.uuid4()`, `uuid.uuid1()`) or `open()`/`input()`;
- the modules with `sandboxed=False` are exactly the ones this file names, so a new
  unsandboxed workflow is a conscious, reviewed choice;
- the checker itself flags a module that breaks each rule (so it cannot pass vacuously).
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from tests.pysource import parse

ROOT = Path(__file__).resolve().parents[2]
WORKFLOWS = ROOT / "workflows"
CONTRACT = ROOT / "contract"

# Deterministic standard-library modules workflow code may import.
ALLOWED_STDLIB = {
    "__future__",
    "asyncio",  # Temporal's deterministic event loop (workflow.sleep / wait / gather)
    "collections",
    "contextvars",  # per-task state (workflows/identity.py: the sender of the current signal)
    "dataclasses",
    "datetime",  # types and arithmetic; the clock calls are refused below
    "enum",
    "functools",
    "hashlib",
    "itertools",
    "json",
    "math",
    "re",
    "string",
    "typing",
}
ALLOWED_ROOTS = ALLOWED_STDLIB | {
    "temporalio",
    "pydantic",
    "pydantic_core",
    "workflows",
    "contract",
}
FORBIDDEN_CALLS = {"now", "utcnow", "today", "uuid1", "uuid4", "getenv"}
FORBIDDEN_BUILTINS = {"open", "input", "print"}
UNSANDBOXED = {"budget.py", "remediation/workflow.py"}


def problems(source: str, name: str) -> list[str]:
    found: list[str] = []
    for node in ast.walk(parse(source, name)):
        if isinstance(node, ast.Import):
            roots = [a.name.split(".")[0] for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            roots = [] if node.level else [(node.module or "").split(".")[0]]
        else:
            roots = []
        found += [f"{name}:{node.lineno}: imports {r}" for r in roots if r not in ALLOWED_ROOTS]
        if isinstance(node, ast.Call):
            fn = node.func
            if isinstance(fn, ast.Attribute) and fn.attr in FORBIDDEN_CALLS:
                owner = fn.value
                # workflow.now() / workflow.uuid4() are Temporal's deterministic versions.
                if not (isinstance(owner, ast.Name) and owner.id == "workflow"):
                    found.append(f"{name}:{node.lineno}: calls .{fn.attr}()")
            if isinstance(fn, ast.Name) and fn.id in FORBIDDEN_BUILTINS:
                found.append(f"{name}:{node.lineno}: calls {fn.id}()")
    return found


def unsandboxed(source: str) -> bool:
    for node in ast.walk(parse(source)):
        if isinstance(node, ast.keyword) and node.arg == "sandboxed":
            return isinstance(node.value, ast.Constant) and node.value.value is False
    return False


def modules() -> list[Path]:
    """Every module under workflows/, packages (workflows/remediation/) included."""
    return sorted(WORKFLOWS.rglob("*.py"))


def test_workflow_modules_use_no_clock_entropy_or_io() -> None:
    modules_ = modules()
    contract = sorted(CONTRACT.glob("*.py"))
    assert len(modules_) >= 8 and len(contract) >= 12, (modules_, contract)
    assert WORKFLOWS / "remediation" / "workflow.py" in modules_
    found = [
        p for m in modules_ + contract for p in problems(m.read_text(), str(m.relative_to(ROOT)))
    ]
    assert found == []


def test_unsandboxed_workflows_are_the_reviewed_ones() -> None:
    flagged = {m.relative_to(WORKFLOWS).as_posix() for m in modules() if unsandboxed(m.read_text())}
    assert flagged == UNSANDBOXED


@pytest.mark.parametrize(
    ("source", "expected"),
    [
        ("import time\n", "imports time"),
        ("from random import random\n", "imports random"),
        ("import os.path\n", "imports os"),
        ("from datetime import datetime\nx = datetime.now()\n", "calls .now()"),
        ("import datetime\nx = datetime.datetime.utcnow()\n", "calls .utcnow()"),
        ("import uuid\n", "imports uuid"),
        ("x = open('f')\n", "calls open()"),
    ],
)
def test_checker_flags_each_rule(source: str, expected: str) -> None:
    assert any(expected in p for p in problems(source, "bad.py")), problems(source, "bad.py")


def test_checker_accepts_the_deterministic_forms() -> None:
    ok = "from temporalio import workflow\nx = workflow.now()\ny = workflow.uuid4()\n"
    assert problems(ok, "ok.py") == []
