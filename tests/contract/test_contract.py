"""The contract package: one home for every error type, and no re-export blob.

Activities raise `ApplicationError(type=...)` and workflows match on those types by name (retry
policies' `non_retryable_error_types`, failure handling), so a type spelled as a literal in one
place and as a constant in another can drift apart without any check noticing. Every such type
is a constant of `contract.errors`.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

import contract.errors
from tests.pysource import parse

ROOT = Path(__file__).resolve().parents[2]
PRODUCT = ("contract", "workflows", "activities", "worker")
ERROR_KEYWORDS = {"type", "non_retryable_error_types"}


def literal_error_types(source: str, name: str) -> list[str]:
    """`name:line: type='X'` for each string literal given as an ApplicationError's `type=` or
    in a `non_retryable_error_types=` list."""
    found = []
    for node in ast.walk(parse(source, name)):
        if not isinstance(node, ast.Call):
            continue
        fn = node.func
        callee = (
            fn.id if isinstance(fn, ast.Name) else fn.attr if isinstance(fn, ast.Attribute) else ""
        )
        for kw in node.keywords:
            if kw.arg not in ERROR_KEYWORDS:
                continue
            if kw.arg == "type" and callee != "ApplicationError":
                continue  # e.g. an Event's type="Warning"
            for c in ast.walk(kw.value):
                if isinstance(c, ast.Constant) and isinstance(c.value, str):
                    found.append(f"{name}:{c.lineno}: {kw.arg}={c.value!r}")
    return found


def test_error_types_are_contract_constants() -> None:
    files = [p for pkg in PRODUCT for p in sorted((ROOT / pkg).rglob("*.py"))]
    assert len(files) > 50, files
    found = [
        hit for p in files for hit in literal_error_types(p.read_text(), str(p.relative_to(ROOT)))
    ]
    assert found == []


@pytest.mark.parametrize(
    "source",
    [
        'raise ApplicationError("gone", type="KubeNotFound")',
        'RetryPolicy(non_retryable_error_types=["ConfigurationError", ERR_X])',
        'raise temporalio.exceptions.ApplicationError("x", type="MaintenanceFailed")',
    ],
)
def test_the_check_sees_a_literal(source: str) -> None:
    assert len(literal_error_types(source, "m.py")) == 1


def test_the_check_leaves_other_types_alone() -> None:
    ok = 'record(type="Warning"); raise ApplicationError("x", type=ERR_CONFIG)'
    assert literal_error_types(ok, "m.py") == []


def test_error_types_are_distinct() -> None:
    values = {k: v for k, v in vars(contract.errors).items() if k.startswith("ERR_")}
    assert len(values) >= 16
    assert len(set(values.values())) == len(values), values


def test_the_package_reexports_nothing() -> None:
    # Callers import from the boundary module (contract.kube, contract.names, ...).
    body = parse((ROOT / "contract" / "__init__.py").read_text()).body
    assert len(body) == 1 and isinstance(body[0], ast.Expr), "only a docstring"
    assert isinstance(body[0].value, ast.Constant) and isinstance(body[0].value.value, str)


def test_already_handled_is_decided_by_the_device_evidence_not_the_label_set() -> None:
    """After a run handled Xid 79 of fingerprint fp-a: its repeat (same startsAt) and the same
    Xid under another label set (exporter restart, pod mapping: new fingerprint, later
    startsAt) are repeats; another Xid, the same series firing again after it resolved, and a
    class alert (a counter's rule) under new labels are new evidence; a person's launch is
    never a repeat."""
    from datetime import UTC, datetime, timedelta

    from contract.remediation import AlertEvidence, HandledAlert, already_handled

    at = datetime(2026, 12, 5, 7, 0, tzinfo=UTC)
    seen = AlertEvidence(
        source="alertmanager",
        alertname="SickbayGpuXidError",
        fingerprint="fp-a",
        xid=79,
        starts_at=at,
    )
    handled = [HandledAlert.of(seen)]
    later = at + timedelta(hours=1)
    assert already_handled(seen, handled) == "instance"
    churn = seen.model_copy(update={"fingerprint": "fp-b", "starts_at": later})
    assert already_handled(churn, handled) == "evidence"
    assert already_handled(churn.model_copy(update={"xid": 48}), handled) == ""
    assert already_handled(seen.model_copy(update={"starts_at": later}), handled) == ""
    ecc = AlertEvidence(
        source="alertmanager",
        alertname="SickbayGpuEccDoubleBitError",
        fingerprint="fp-e",
        failure_class="unhealthy",
        starts_at=at,
    )
    ecc_handled = [HandledAlert.of(ecc)]
    assert already_handled(ecc.model_copy(update={"fingerprint": "fp-f"}), ecc_handled) == ""
    assert already_handled(churn.model_copy(update={"source": "manual"}), handled) == ""
