"""Each part of the remediation's state is written only by the module that owns it.

`workflows/remediation/state.py` declares the owner of every part of `RemediationState`
(`OWNERS`: the part's name, or `status.<field>` for a field of the status query's model);
other modules read. The check walks the source of `workflows/remediation/*.py`:

- every write to the state (an assignment, augmented assignment or `del` of an attribute or
  item under it, or a mutating call: `append`, `pop`, `update`, ... and the Pending
  deadline's `start` / `stop` / `extend`) is found, through `r.s`, `self._r.s`, the journal's
  `self._s` and any local name bound to a part of them (`s = r.s`, `st = s.status`);
- each write is made by its part's owner: none writes into a part it does not own;
- every field of `RemediationState` and of `RemediationStatus` has a declared owner (a new
  field cannot escape the map), and every owner named is a module of the package;
- the checker flags a planted write into another module's part, made directly, through an
  alias, by a mutating call and by an augmented assignment (so it cannot pass vacuously).

What it cannot see: a part handed as an argument to a function of another module that
writes into it (no function takes a part: they take the `Remediation`), or a method of a part
that writes into it other than the Pending deadline's, which are counted.
"""

from __future__ import annotations

import ast
import dataclasses
from pathlib import Path
from typing import NamedTuple

from contract.remediation import RemediationStatus
from tests.pysource import parse
from workflows.remediation.state import OWNERS, RemediationState

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "workflows" / "remediation"

# Calls that change the object they are called on: containers, and the Pending deadline's.
MUTATORS = {
    "append",
    "extend",
    "insert",
    "pop",
    "popitem",
    "remove",
    "clear",
    "add",
    "discard",
    "update",
    "setdefault",
    "sort",
    "reverse",
    "start",  # PendingDeadline
    "stop",  # PendingDeadline
}
# What holds the whole state: `r.s`, `self._r.s` (a Remediation's), the journal's and the
# calls' own reference to it.
STATE_ATTRS = {"s", "_s", "_state"}


class Write(NamedTuple):
    module: str
    line: int
    path: tuple[str, ...]  # under the state: ("ledger", "retired"), ("status", "paused")

    @property
    def part(self) -> str:
        if self.path[0] == "status" and len(self.path) > 1:
            return f"status.{self.path[1]}"
        return self.path[0]


def _path(node: ast.expr, aliases: dict[str, tuple[str, ...]]) -> tuple[str, ...] | None:
    """The attribute path under the state `node` names, or None when it is not the state's."""
    attrs: list[str] = []
    while isinstance(node, ast.Attribute | ast.Subscript):
        if isinstance(node, ast.Attribute):
            if node.attr in STATE_ATTRS and not isinstance(node.value, ast.Subscript):
                return tuple(reversed(attrs))
            attrs.append(node.attr)
        node = node.value
    if isinstance(node, ast.Name) and node.id in aliases:
        return aliases[node.id] + tuple(reversed(attrs))
    return None


def _targets(target: ast.expr) -> list[ast.expr]:
    if isinstance(target, ast.Tuple | ast.List):
        return [t for e in target.elts for t in _targets(e)]
    return [target]


class _Finder(ast.NodeVisitor):
    def __init__(self, module: str) -> None:
        self.module = module
        self.writes: list[Write] = []
        self.aliases: dict[str, tuple[str, ...]] = {}

    def _function(self, node: ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda) -> None:
        outer = self.aliases
        self.aliases = dict(outer)  # a nested function sees its enclosing aliases
        self.generic_visit(node)
        self.aliases = outer

    visit_FunctionDef = visit_AsyncFunctionDef = visit_Lambda = _function

    def _written(self, target: ast.expr) -> None:
        if isinstance(target, ast.Name):
            return
        if isinstance(target, ast.Starred):
            target = target.value
        path = _path(target, self.aliases)
        if path:
            self.writes.append(Write(self.module, target.lineno, path))

    def _alias(self, target: ast.expr, value: ast.expr) -> None:
        if isinstance(target, ast.Tuple) and isinstance(value, ast.Tuple):
            for t, v in zip(target.elts, value.elts, strict=False):
                self._alias(t, v)
        elif isinstance(target, ast.Name):
            path = _path(value, self.aliases)
            if path is not None:
                self.aliases[target.id] = path
            else:
                self.aliases.pop(target.id, None)

    def visit_Assign(self, node: ast.Assign) -> None:
        self.generic_visit(node)
        for target in node.targets:
            for t in _targets(target):
                self._written(t)
            self._alias(target, node.value)

    def visit_AnnAssign(self, node: ast.AnnAssign) -> None:
        self.generic_visit(node)
        self._written(node.target)
        if node.value is not None:
            self._alias(node.target, node.value)

    def visit_AugAssign(self, node: ast.AugAssign) -> None:
        self.generic_visit(node)
        self._written(node.target)

    def visit_Delete(self, node: ast.Delete) -> None:
        self.generic_visit(node)
        for target in node.targets:
            self._written(target)

    def visit_Call(self, node: ast.Call) -> None:
        self.generic_visit(node)
        func = node.func
        if isinstance(func, ast.Attribute) and func.attr in MUTATORS:
            path = _path(func.value, self.aliases)
            if path:
                self.writes.append(Write(self.module, node.lineno, path))


def state_writes(source: str, module: str) -> list[Write]:
    """Every write to the state in `source` (module `module`), in order."""
    finder = _Finder(module)
    finder.visit(parse(source, f"{module}.py"))
    return finder.writes


def package_writes() -> list[Write]:
    return [
        w
        for path in sorted(PACKAGE.glob("*.py"))
        for w in state_writes(path.read_text(), path.stem)
    ]


def foreign(writes: list[Write]) -> list[str]:
    """The writes made by a module other than their part's owner (or into an unowned part)."""
    return [
        f"{w.module}.py:{w.line} writes {'.'.join(w.path)} "
        f"(owned by {OWNERS.get(w.part, 'nobody')})"
        for w in writes
        if OWNERS.get(w.part) != w.module
    ]


def test_each_part_is_written_only_by_its_owner() -> None:
    writes = package_writes()
    assert len(writes) > 50  # the walk sees the writes (it would pass vacuously otherwise)
    assert foreign(writes) == []


def test_every_owner_writes_its_part() -> None:
    """No stale entry: each declared owner writes the part (or the state builds it)."""
    written = {(w.part, w.module) for w in package_writes()}
    unwritten = {
        part: owner
        for part, owner in OWNERS.items()
        if owner != "state" and (part, owner) not in written
    }
    assert unwritten == {}


def test_every_field_has_an_owner() -> None:
    fields = {f.name for f in dataclasses.fields(RemediationState)}
    status = {f"status.{name}" for name in RemediationStatus.model_fields}
    assert fields <= OWNERS.keys()
    assert status <= OWNERS.keys()
    assert set(OWNERS) <= fields | status | {"status"}
    modules = {p.stem for p in PACKAGE.glob("*.py")}
    assert set(OWNERS.values()) <= modules


PLANTED = """
async def hold_and_release(r):
    s, j = r.s, r.j
    r.s.confirm.device = None
    part = s.ledger
    part.retired = False
    s.journal.timeline.append(None)
    s.status.repair_attempt += 1
    s.hold.healthy_since = None
"""


def test_a_planted_foreign_write_is_caught() -> None:
    writes = state_writes(PLANTED, "hold")
    assert [w.path for w in writes] == [
        ("confirm", "device"),
        ("ledger", "retired"),
        ("journal", "timeline"),
        ("status", "repair_attempt"),
        ("hold", "healthy_since"),
    ]
    assert [f.split(" writes ")[1] for f in foreign(writes)] == [
        "confirm.device (owned by confirm)",
        "ledger.retired (owned by lemons)",
        "journal.timeline (owned by journal)",
        "status.repair_attempt (owned by repair)",
    ]
