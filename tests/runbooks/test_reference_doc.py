"""docs/runbooks.md matches the Runbook schema: every field of `spec` has exactly one row, no row
names a field that does not exist, each row's default is the model's default, the example
runbook in it loads, and its "Safe bounds" table lists exactly `SAFE_BOUNDS` with their ranges
(and its example of `unsafe` loads, and is refused without it)."""

from __future__ import annotations

import re
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
import yaml
from pydantic.alias_generators import to_camel

from activities.runbooks import MAX_FILE_BYTES, MAX_NODES, RunbookError, load_text
from contract.base import parse_duration
from contract.runbook import (
    ALL_ESCALATION_REASONS,
    SAFE_BOUNDS,
    BoundedRunbookModel,
    RunbookModel,
    RunbookSpec,
)

DOC = Path(__file__).resolve().parents[2] / "docs" / "runbooks.md"
ROW = re.compile(r"^\| `([A-Za-z.]+)` \| (.+?) \| .+ \|$")
BOUNDS_HEADING = "## Safe bounds"


def schema_defaults(model: type[RunbookModel] = RunbookSpec, prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for name, field in model.model_fields.items():
        if name == "unsafe" and issubclass(model, BoundedRunbookModel):
            continue  # documented once, in "Safe bounds"
        path = prefix + to_camel(name)
        if isinstance(field.annotation, type) and issubclass(field.annotation, RunbookModel):
            out.update(schema_defaults(field.annotation, path + "."))
        else:
            out[path] = field.get_default(call_default_factory=True)
    return out


def documented(bounds: bool = False) -> dict[str, str]:
    """Field rows of the reference tables (or, with `bounds`, of the "Safe bounds" table)."""
    reference, _, bounds_part = DOC.read_text().partition(BOUNDS_HEADING)
    rows: dict[str, str] = {}
    for line in (bounds_part if bounds else reference).splitlines():
        m = ROW.match(line)
        if m:
            assert m.group(1) not in rows, f"{m.group(1)} documented twice"
            rows[m.group(1)] = m.group(2)
    return rows


def as_value(text: str, like: Any) -> Any:
    """The doc's default column read as the model's type."""
    if text == "none":
        return None
    if text == "every reason":
        return tuple(ALL_ESCALATION_REASONS)
    raw = text.strip("`")
    if isinstance(like, timedelta):
        return parse_duration(raw)
    value = yaml.safe_load(raw)
    return tuple(value) if isinstance(like, tuple) and isinstance(value, list) else value


def test_every_field_documented_once_and_nothing_else() -> None:
    schema, doc = schema_defaults(), documented()
    assert sorted(set(schema) - set(doc)) == [], "fields missing from docs/runbooks.md"
    assert sorted(set(doc) - set(schema)) == [], "docs/runbooks.md names fields that do not exist"


def test_documented_defaults_are_the_schema_defaults() -> None:
    schema, doc = schema_defaults(), documented()
    wrong = {
        path: (doc[path], default)
        for path, default in schema.items()
        if path in doc and as_value(doc[path], default) != default
    }
    assert wrong == {}


def test_the_example_runbook_loads() -> None:
    text = DOC.read_text()
    block = text.split("```yaml\n", 1)[1].split("```", 1)[0]
    (runbook,) = load_text(block, "docs/runbooks.md")
    assert runbook.name == "inference"
    assert runbook.spec.eviction.force == "delete"
    assert runbook.spec.eviction.timeout == timedelta(minutes=2)


def test_the_safe_bounds_table_is_the_schema() -> None:
    doc = {path: text.strip("`") for path, text in documented(bounds=True).items()}
    assert doc == {path: bound.describe() for path, bound in SAFE_BOUNDS.items()}
    assert set(SAFE_BOUNDS) <= set(schema_defaults())  # every bound is a real field


def test_the_documented_limits_are_the_loader_limits() -> None:
    text = DOC.read_text().partition(BOUNDS_HEADING)[2]
    assert f"at most {MAX_FILE_BYTES // 1024} KiB" in text
    assert f"at most {MAX_NODES:,} YAML nodes" in text


def test_the_unsafe_example_loads_and_is_refused_without_its_acknowledgement() -> None:
    block = DOC.read_text().partition(BOUNDS_HEADING)[2].split("```yaml\n", 1)[1]
    spec = block.split("```", 1)[0]
    head = "apiVersion: sickbay/v1\nkind: Runbook\nmetadata:\n  name: example\n"
    (runbook,) = load_text(head + spec, "docs/runbooks.md")
    assert runbook.spec.eviction.timeout == timedelta(seconds=10)
    without = "\n".join(line for line in spec.splitlines() if "unsafe:" not in line)
    with pytest.raises(RunbookError, match="outside the safe bounds"):
        load_text(head + without, "docs/runbooks.md")
