"""Strict runbooks: what YAML or a typo would let through is refused with `file:line: field`.

Cases:
- a key written twice (a second `spec:`, a nested `timeout:`) is an error naming the key's
  dotted path and both lines, never last-wins; the same key in different mappings is fine;
- every field of `SAFE_BOUNDS` is refused just outside its bounds (both ends, and a percent
  over the percent bound) on the line of the value, and accepted with `unsafe: [field]` in
  its block; accepted at the bounds themselves;
- the issue's examples (0 s timeouts, 100 %/100 % budgets, maxSize 100000 with step 1000) are
  refused, and all load with acknowledgements;
- `unsafe` naming a field that has no bound is an error;
- a file over `MAX_FILE_BYTES` is refused without being parsed; an alias bomb is refused by its
  node count; the shipped runbooks stay inside every bound.
"""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path
from typing import Any

import annotated_types
import pytest
import yaml
from pydantic import BaseModel
from pydantic.alias_generators import to_camel, to_snake

from activities.runbooks import MAX_FILE_BYTES, RunbookError, load_dir, load_file, load_text
from contract.runbook import SAFE_BOUNDS, Runbook, RunbookSpec, SafeBound

SHIPPED = Path(__file__).resolve().parents[2] / "runbooks"

HEAD = "apiVersion: sickbay/v1\nkind: Runbook\nmetadata:\n  name: strict\n"


def _problems(text: str) -> list[str]:
    with pytest.raises(RunbookError) as info:
        load_text(text, "rb.yaml")
    return info.value.problems


def _doc(spec: dict[str, Any]) -> str:
    return HEAD + yaml.safe_dump({"spec": spec}, sort_keys=False)


def test_a_second_spec_is_an_error_naming_both_lines() -> None:
    text = HEAD + "spec:\n  eviction:\n    force: none\nspec:\n  eviction:\n    force: delete\n"
    assert _problems(text) == [
        "rb.yaml:8: spec: duplicate key (first at line 5); "
        "YAML would silently keep only the last one"
    ]


def test_a_nested_duplicate_names_its_path() -> None:
    text = HEAD + "spec:\n  eviction:\n    timeout: 5m\n    force: none\n    timeout: 0s\n"
    (problem,) = _problems(text)
    assert problem.startswith("rb.yaml:9: spec.eviction.timeout: duplicate key (first at line 7)")


def test_the_same_key_in_different_mappings_is_fine() -> None:
    text = HEAD + "spec:\n  eviction:\n    timeout: 5m\n  approval:\n    timeout: 5m\n"
    (runbook,) = load_text(text, "rb.yaml")
    assert runbook.spec.approval.timeout == runbook.spec.eviction.timeout == timedelta(minutes=5)


def test_duplicates_are_found_in_every_document_of_a_file(tmp_path: Path) -> None:
    path = tmp_path / "two.yaml"
    second = HEAD.replace("name: strict", "name: other\n  name: again")
    path.write_text(HEAD + "spec: {}\n---\n" + second)
    with pytest.raises(RunbookError) as info:
        load_file(path)
    assert info.value.problems == [
        f"{path}:11: metadata.name: duplicate key (first at line 10); "
        "YAML would silently keep only the last one"
    ]


def _attr(block: str) -> str:
    return {"scaleUp": "scale_up"}.get(block, block)


def _hard_low(path: str, bound: SafeBound) -> Any:
    """The lowest value the schema itself accepts (its `ge=`; else 0): below it even `unsafe`
    cannot go, so there is nothing soft to test."""
    if isinstance(bound.low, timedelta):
        return timedelta(0)
    block, key = path.rsplit(".", 1)
    model: Any = RunbookSpec
    for part in block.split("."):  # nested blocks: `repair.reset.timeout`
        model = model.model_fields[to_snake(_attr(part))].annotation
    assert isinstance(model, type) and issubclass(model, BaseModel)
    field = next(f for n, f in model.model_fields.items() if to_camel(n) == key)
    return next((m.ge for m in field.metadata if isinstance(m, annotated_types.Ge)), 0)


def _outside(path: str, bound: SafeBound) -> list[Any]:
    """Values just outside `bound`: above high, below low where the schema allows a value
    there at all, over the percent bound."""
    step: Any = timedelta(seconds=1) if isinstance(bound.high, timedelta) else 1
    values = [bound.high + step]
    if bound.low > _hard_low(path, bound):
        values.append(bound.low - step)
    if bound.percent_high is not None:
        values.append(f"{bound.percent_high + 1}%")
    return values


def _yaml_value(value: Any) -> Any:
    if isinstance(value, timedelta):  # whole seconds as digits: `:g` turns 90 days into 7.776e+06
        seconds = value.total_seconds()
        return f"{int(seconds)}s" if seconds.is_integer() else f"{seconds}s"
    return value


def _spec(block: str, key: str, value: Any, **extra: Any) -> dict[str, Any]:
    body: dict[str, Any] = {key: _yaml_value(value), **extra}
    if block == "scaleUp":
        body.setdefault("provider", "twin")
    for part in reversed(block.split(".")):  # nested blocks: {repair: {reset: {...}}}
        body = {part: body}
    return body


CASES = [(path, value) for path, bound in SAFE_BOUNDS.items() for value in _outside(path, bound)]


@pytest.mark.parametrize(("path", "value"), CASES, ids=lambda x: str(x))
def test_outside_the_bounds_is_refused_on_the_value_line(path: str, value: Any) -> None:
    block, key = path.rsplit(".", 1)
    text = _doc(_spec(block, key, value))
    (problem,) = _problems(text)
    line = next(i for i, t in enumerate(text.splitlines(), 1) if t.strip().startswith(key + ":"))
    assert problem.startswith(f"rb.yaml:{line}: spec.{path}: "), problem
    assert f"outside the safe bounds {SAFE_BOUNDS[path].describe()}" in problem
    assert f"`unsafe: [{key}]` in spec.{block}" in problem


@pytest.mark.parametrize(("path", "value"), CASES, ids=lambda x: str(x))
def test_outside_the_bounds_loads_when_acknowledged(path: str, value: Any) -> None:
    block, key = path.rsplit(".", 1)
    (runbook,) = load_text(_doc(_spec(block, key, value, unsafe=[key])), "rb.yaml")
    found: Any = runbook.spec
    for part in block.split("."):
        found = getattr(found, to_snake(_attr(part)))
    assert key in found.unsafe


@pytest.mark.parametrize("path", sorted(SAFE_BOUNDS))
def test_the_bounds_themselves_are_safe(path: str) -> None:
    block, key = path.rsplit(".", 1)
    bound = SAFE_BOUNDS[path]
    for value in (bound.low, bound.high):
        if path == "scaleUp.maxSize" and value == 0:
            continue  # enabled scale-up needs maxSize >= 1 (a hard rule, not a bound)
        load_text(_doc(_spec(block, key, value)), "rb.yaml")


def test_the_issue_examples_are_refused_then_load_when_acknowledged() -> None:
    spec: dict[str, Any] = {
        "confirm": {"staleAfter": "0s"},
        "eviction": {"timeout": "0s"},
        "replacement": {"pendingDeadline": "0s"},
        "budget": {"maxPerPool": "100%", "maxPerCluster": "100%"},
        "scaleUp": {"enabled": True, "provider": "twin", "maxSize": 100000, "step": 1000},
    }
    fields = {p.split(": ", 2)[1] for p in _problems(_doc(spec))}
    # One error per block (each block reports its first unsafe field).
    assert fields == {
        "spec.confirm.staleAfter",
        "spec.eviction.timeout",
        "spec.replacement.pendingDeadline",
        "spec.budget.maxPerPool",
        "spec.scaleUp.step",
    }
    spec["confirm"]["unsafe"] = ["staleAfter"]
    spec["eviction"]["unsafe"] = ["timeout"]
    spec["replacement"]["unsafe"] = ["pendingDeadline"]
    spec["budget"]["unsafe"] = ["maxPerPool"]  # maxPerCluster still unacknowledged
    spec["scaleUp"]["unsafe"] = ["step", "maxSize"]
    (problem,) = _problems(_doc(spec))
    assert ": spec.budget.maxPerCluster: 100% is outside the safe bounds" in problem
    spec["budget"]["unsafe"] = ["maxPerPool", "maxPerCluster"]
    (runbook,) = load_text(_doc(spec), "rb.yaml")
    assert runbook.spec.scale_up.max_size == 100000
    assert runbook.spec.eviction.timeout == timedelta(0)


def test_unsafe_must_name_a_bounded_field_of_its_block() -> None:
    (problem,) = _problems(_doc({"eviction": {"unsafe": ["force"]}}))
    assert problem.startswith("rb.yaml:")
    assert "spec.eviction.unsafe: unsafe lists 'force', which is not a bounded field" in problem
    assert "(bounded: timeout)" in problem


def test_bounds_hold_for_runbooks_built_in_code_too() -> None:
    with pytest.raises(ValueError, match="outside the safe bounds"):
        RunbookSpec.model_validate({"eviction": {"timeout": "1s"}})
    with pytest.raises(ValueError, match="outside the safe bounds"):
        Runbook.model_validate(
            {
                "apiVersion": "sickbay/v1",
                "kind": "Runbook",
                "metadata": {"name": "x"},
                "spec": {"budget": {"maxPerCluster": "100%"}},
            }
        )


def test_an_oversized_file_is_refused_before_parsing(tmp_path: Path) -> None:
    path = tmp_path / "big.yaml"
    # Broken YAML past the limit: were the file parsed, the error would be a YAML one.
    path.write_text(HEAD + "spec: {}\n#" + "x" * MAX_FILE_BYTES + "\n: : :\n")
    with pytest.raises(RunbookError) as info:
        load_dir(tmp_path)
    assert info.value.problems == [
        f"{path}:1: (file): larger than {MAX_FILE_BYTES // 1024} KiB, the limit for a runbook file"
    ]
    with pytest.raises(RunbookError, match="the limit for a runbook file"):
        load_text(path.read_text(), str(path))


def test_an_alias_bomb_is_refused_by_its_node_count() -> None:
    lines = ['a0: &a0 ["x", "x", "x", "x", "x", "x", "x", "x", "x", "x"]']
    lines += [f"a{i}: &a{i} [{', '.join([f'*a{i - 1}'] * 10)}]" for i in range(1, 9)]
    text = HEAD + "  description: bomb\nx:\n" + "\n".join("  " + line for line in lines) + "\n"
    (problem,) = _problems(text)
    assert "more than 20000 YAML nodes (with aliases expanded)" in problem


@pytest.mark.parametrize("path", sorted(SHIPPED.glob("*.yaml")), ids=lambda p: p.stem)
def test_shipped_runbooks_need_no_acknowledgement(path: Path) -> None:
    (runbook,) = load_text(path.read_text(), str(path))
    blocks = [getattr(runbook.spec, name) for name in type(runbook.spec).model_fields]
    assert [b for b in blocks if getattr(b, "unsafe", None)] == []
