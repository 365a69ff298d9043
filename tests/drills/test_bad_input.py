"""Bad-input drills (hypothesis): every way in refuses bad input with a clear error.

Webhook payloads are fuzzed over real HTTP in tests/webhook/test_webhook_failures.py (random
bytes/JSON, one broken field, odd label values: 4xx, nothing started, never 5xx); this
module covers the other ways in, without servers:

- runbooks: a shipped runbook with one field replaced by a random value, and random YAML
  documents -> `RunbookError` whose every problem names `file:line: field: problem` (never
  another exception type, never a half-loaded set)
- UI input (the Web UI's "Start workflow" JSON for `remediate-gpu-device`): a valid
  RemediationInput with one field broken or random JSON -> pydantic `ValidationError` naming
  the field, never another exception; the workflow's refusal message names every bad field
- webhook mapping: arbitrary Alertmanager label sets map to a device or to an `Unmapped` with
  a reason; never an exception (that would be a 500)
- CLI: random argument lists for `sickbay launch` (when the command is registered) exit with
  argparse's usage error (code 2) or a clear message, never a traceback, before anything
  connects to Temporal
"""

from __future__ import annotations

import contextlib
import io
import json
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pydantic import ValidationError

from activities.runbooks import RunbookError, load_text
from contract.base import input_problems
from contract.remediation import RemediationInput
from worker.alerts import AlertMapping, AmAlert, MappedAlert, Unmapped, map_alert

RUNBOOKS = Path(__file__).resolve().parents[2] / "runbooks"


def _yaml12_keys(doc: Any) -> Any:
    """PyYAML reads the runbook key `on:` as True (YAML 1.1); the loader reads YAML 1.2."""
    if isinstance(doc, dict):
        return {("on" if k is True else k): _yaml12_keys(v) for k, v in doc.items()}
    if isinstance(doc, list):
        return [_yaml12_keys(v) for v in doc]
    return doc


SHIPPED = {
    p.name: _yaml12_keys(yaml.safe_load(p.read_text())) for p in sorted(RUNBOOKS.glob("*.yaml"))
}
FAST = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])

json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=20),
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner, max_size=3)
    ),
    max_leaves=8,
)


def _paths(doc: Any, prefix: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    out = [prefix] if prefix else []
    if isinstance(doc, dict):
        for k, v in doc.items():
            out += _paths(v, (*prefix, k))
    elif isinstance(doc, list):
        for i, v in enumerate(doc):
            out += _paths(v, (*prefix, i))
    return out


def _replace(doc: Any, path: tuple[Any, ...], value: Any) -> Any:
    doc = json.loads(json.dumps(doc, default=str))
    target = doc
    for part in path[:-1]:
        target = target[part]
    target[path[-1]] = value
    return doc


@FAST
@given(data=st.data(), value=json_values)
def test_runbook_with_one_broken_field_is_refused_clearly(data: Any, value: Any) -> None:
    name = data.draw(st.sampled_from(sorted(SHIPPED)))
    doc = SHIPPED[name]
    path = data.draw(st.sampled_from(_paths(doc)))
    text = yaml.safe_dump(_replace(doc, path, value), sort_keys=False)
    try:
        runbooks = load_text(text, f"runbooks/{name}")
    except RunbookError as err:
        assert err.problems, "an error with no problem listed"
        for line in err.problems:
            assert line.startswith(f"runbooks/{name}:"), line
            assert line.split(":", 2)[1].isdigit(), f"no line number in {line!r}"
        return
    # Accepted: the value was valid there (e.g. another duration); it must round-trip.
    assert runbooks and all(r.name for r in runbooks)


@FAST
@given(text=st.text(max_size=200))
def test_random_yaml_is_refused_clearly(text: str) -> None:
    try:
        load_text(text, "runbooks/fuzz.yaml")
    except RunbookError as err:
        assert all(p.startswith("runbooks/fuzz.yaml:") for p in err.problems), err.problems


VALID_UI_INPUT: dict[str, Any] = {
    "device": {"node": "gpu-node-0", "gpu_uuid": "GPU-0f3c2a8e-1111-2222-3333-444455556666"},
    "trigger": "ui",
    "reason": "drill",
}


@FAST
@given(data=st.data(), value=json_values)
def test_ui_input_with_one_broken_field_names_it(data: Any, value: Any) -> None:
    path = data.draw(st.sampled_from(_paths(VALID_UI_INPUT)))
    raw = json.dumps(_replace(VALID_UI_INPUT, path, value))
    try:
        RemediationInput.model_validate_json(raw)
    except ValidationError as err:
        assert err.errors(), "a validation error with no location"
        assert all(e["loc"] for e in err.errors())
        # The workflow's refusal message (what the Web UI shows) names every bad field.
        problems = input_problems(err, RemediationInput)
        for e in err.errors():
            assert ".".join(str(p) for p in e["loc"]) + ":" in problems, problems


@FAST
@given(raw=st.one_of(st.binary(max_size=100), json_values.map(json.dumps)))
def test_random_ui_input_is_a_validation_error(raw: Any) -> None:
    try:
        RemediationInput.model_validate_json(raw)
    except ValidationError:
        pass


@FAST
@given(
    labels=st.dictionaries(
        st.sampled_from(["alertname", "Hostname", "UUID", "gpu", "err_code", "pod", "namespace"])
        | st.text(max_size=10),
        st.text(max_size=40),
        max_size=8,
    ),
    status=st.sampled_from(["firing", "resolved"]),
)
def test_any_label_set_maps_or_says_why(labels: dict[str, str], status: str) -> None:
    alert = AmAlert.model_validate(
        {
            "status": status,
            "labels": labels,
            "startsAt": datetime.now(UTC).isoformat(),
            "fingerprint": "f",
        }
    )
    mapped = map_alert(0, alert, AlertMapping(alert_names=frozenset({"*"})))
    assert isinstance(mapped, (MappedAlert, Unmapped))
    if isinstance(mapped, Unmapped):
        assert mapped.reason and mapped.detail


class _Connected(Exception):
    """Raised instead of connecting to Temporal: the input passed every check."""


def _launch_registered() -> None:
    from worker.cli import build_parser

    sub = next(a for a in build_parser()._actions if a.dest == "command")
    # Without it every argv below would be refused as an unknown command: a vacuous pass.
    assert "launch" in (sub.choices or {}), "`sickbay launch` is not a subcommand"


TOKENS = st.sampled_from(
    [
        "--node",
        "--uuid",
        "--gpu",
        "--device",
        "--select-node",
        "--select-label",
        "--select-attr",
        "--runbook",
        "--reason",
        "--dry-run",
        "n1",
        "GPU-1",
        "0",
        "-1",
        "x/y/z",
        "a=b",
        "=",
        "",
        "--",
        "\x00",
        "ümlaut",
        "9" * 30,
    ]
)


@FAST
@given(argv=st.lists(TOKENS | st.text(max_size=12), max_size=7))
def test_launch_cli_refuses_bad_arguments_before_connecting(argv: list[str]) -> None:
    """`sickbay launch` with any arguments: usage error (2), a clear message and a non-zero
    code, or - only for a complete, valid request - an attempt to connect; never a
    traceback, and never a connection attempt for an invalid request."""
    _launch_registered()
    from worker.cli import main

    async def refuse(*args: Any, **kwargs: Any) -> Any:
        raise _Connected

    err = io.StringIO()
    with (
        pytest.MonkeyPatch.context() as mp,
        contextlib.redirect_stderr(err),
        contextlib.redirect_stdout(io.StringIO()),
    ):
        mp.setattr("worker.temporal.connect", refuse)
        try:
            code = main(["launch", *argv])
        except SystemExit as exc:
            assert exc.code in (0, 2), exc.code
            return
        except _Connected:
            # It got as far as Temporal: the request must name a device or a selector.
            assert any(a in argv for a in ("--node", "--device", "--uuid", "--gpu")) or any(
                a.startswith("--select") for a in argv
            ), argv
            return
    assert code != 0 and err.getvalue().strip(), (argv, code, err.getvalue())
