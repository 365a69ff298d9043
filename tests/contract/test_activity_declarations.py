"""Activity interfaces are declared once (`contract.activity.Activity[I, R]`), and type checking
holds both sides to the declaration.

Cases:
- every activity name of `contract.names` has exactly one declaration, named after it
  (`quarantine-device` -> `QUARANTINE_DEVICE`), and no declaration is unnamed there;
- the product (activities, workflows, worker) never names an activity by its bare string
  constant: it implements and calls the declarations;
- mypy, on snippets beside the code: an implementation taking another input model than the
  declaration's, or answering another result, is an error; a call with another input model,
  or expecting another result, is an error; the matching implementation and call are clean;
- `declared_in` lists the declarations a module imported, once each, in order.
"""

from __future__ import annotations

import ast
import importlib
import pkgutil
import re
import textwrap
from pathlib import Path
from typing import Any

from mypy import api as mypy_api

import contract
import contract.names
from contract.activity import Activity, declared_in
from contract.kube import QUARANTINE_DEVICE, RELEASE_QUARANTINE
from tests.pysource import parse

ROOT = Path(__file__).resolve().parents[2]
PRODUCT = ("activities", "workflows", "worker")


def _declarations() -> dict[str, tuple[str, Activity[Any, Any]]]:
    """Every declaration of the contract package: `module.VARIABLE` -> (name, declaration)."""
    found: dict[str, tuple[str, Activity[Any, Any]]] = {}
    for info in pkgutil.iter_modules(contract.__path__):
        module = importlib.import_module(f"contract.{info.name}")
        imported = _imported_names(module)
        for variable, value in vars(module).items():
            if isinstance(value, Activity) and variable not in imported:
                found[f"{info.name}.{variable}"] = (value.name, value)
    return found


def _imported_names(module: Any) -> set[str]:
    tree = parse(Path(module.__file__).read_text(), module.__file__)
    return {
        alias.asname or alias.name
        for node in ast.walk(tree)
        if isinstance(node, ast.ImportFrom)
        for alias in node.names
    }


def test_every_activity_name_has_one_declaration_named_after_it() -> None:
    names = {v for k, v in vars(contract.names).items() if k.startswith("ACT_")}
    declared = _declarations()
    by_name: dict[str, list[str]] = {}
    for where, (name, _decl) in declared.items():
        by_name.setdefault(name, []).append(where)
    assert {n: w for n, w in by_name.items() if len(w) > 1} == {}, "declared twice"
    assert names - set(by_name) == set(), "activity names without a declaration"
    assert set(by_name) - names == set(), "declarations whose name is not in contract.names"
    for where, (name, _decl) in declared.items():
        assert where.split(".")[1] == name.replace("-", "_").upper(), where


def test_the_product_names_activities_only_through_their_declarations() -> None:
    """No bare `ACT_*` name in activities/, workflows/ or worker/: an activity implemented or
    called by its string would escape the type check the declaration gives."""
    found = []
    for package in PRODUCT:
        for path in sorted((ROOT / package).rglob("*.py")):
            tree = parse(path.read_text(), str(path))
            for node in ast.walk(tree):
                if isinstance(node, ast.Name) and node.id.startswith("ACT_"):
                    found.append(f"{path.relative_to(ROOT)}:{node.lineno}: {node.id}")
                if isinstance(node, ast.alias) and node.name.startswith("ACT_"):
                    found.append(f"{path.relative_to(ROOT)}: imports {node.name}")
    assert found == []


HEADER = """\
from __future__ import annotations

from activities.defn import implements
from contract.kube import (
    QUARANTINE_DEVICE,
    QuarantineInput,
    QuarantineResult,
    ReleaseInput,
    ReleaseResult,
)
from workflows.execute import execute, execute_local
"""

# Each bad snippet marks the line mypy must report with `# expect-error`.
SNIPPETS = {
    "matching": """
        class Activities:
            @implements(QUARANTINE_DEVICE)
            async def quarantine(self, inp: QuarantineInput) -> QuarantineResult:
                return QuarantineResult(mode="rule")


        async def caller(inp: QuarantineInput) -> QuarantineResult:
            local: QuarantineResult = await execute_local(QUARANTINE_DEVICE, inp)
            return local if local.rule_name else await execute(QUARANTINE_DEVICE, inp)
    """,
    "implements_wrong_input": """
        class Activities:
            @implements(QUARANTINE_DEVICE)  # expect-error
            async def quarantine(self, inp: ReleaseInput) -> QuarantineResult:
                return QuarantineResult(mode="rule")
    """,
    "implements_wrong_result": """
        class Activities:
            @implements(QUARANTINE_DEVICE)  # expect-error
            async def quarantine(self, inp: QuarantineInput) -> ReleaseResult:
                return ReleaseResult(removed=True)
    """,
    "calls_with_wrong_input": """
        async def caller(inp: ReleaseInput) -> QuarantineResult:
            return await execute(QUARANTINE_DEVICE, inp)  # expect-error
    """,
    "calls_expecting_wrong_result": """
        async def caller(inp: QuarantineInput) -> ReleaseResult:
            return await execute_local(QUARANTINE_DEVICE, inp)  # expect-error
    """,
}


def _errors_by_file(out: str) -> dict[str, set[int]]:
    errors: dict[str, set[int]] = {}
    for line in out.splitlines():
        m = re.match(r"(?:.*/)?(\w+)\.py:(\d+): error:", line)
        if m:
            errors.setdefault(m.group(1), set()).add(int(m.group(2)))
    return errors


def test_mypy_holds_the_implementation_and_the_call_to_the_declaration(tmp_path: Path) -> None:
    expected: dict[str, set[int]] = {}
    for name, body in SNIPPETS.items():
        text = HEADER + textwrap.dedent(body)
        (tmp_path / f"{name}.py").write_text(text)
        marked = {i for i, line in enumerate(text.splitlines(), 1) if "# expect-error" in line}
        if marked:
            expected[name] = marked
    out, err, _status = mypy_api.run(
        [
            *(str(tmp_path / f"{name}.py") for name in SNIPPETS),
            "--config-file",
            str(ROOT / "pyproject.toml"),
            "--cache-dir",
            str(tmp_path / ".mypy_cache"),
            "--no-error-summary",
        ]
    )
    assert err == ""
    assert _errors_by_file(out) == expected, out


def test_declared_in_lists_a_modules_declarations_once_in_order() -> None:
    namespace = {"a": RELEASE_QUARANTINE, "b": 3, "c": QUARANTINE_DEVICE, "d": RELEASE_QUARANTINE}
    assert declared_in(namespace) == (RELEASE_QUARANTINE, QUARANTINE_DEVICE)
    assert declared_in({}, namespace, {"e": QUARANTINE_DEVICE}) == (
        RELEASE_QUARANTINE,
        QUARANTINE_DEVICE,
    )
