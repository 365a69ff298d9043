"""docs/settings.md is generated from `Settings` (worker/settings_docs.py) and committed.

Cases:
- the committed page equals what `render()` makes now: a variable added, removed, renamed or
  redescribed in worker/settings.py without `python -m worker.settings_docs` fails here;
- every `Settings` variable has its row, and the page names no `SICKBAY_*` variable Sickbay
  does not read (a setting, a secret reference of the cloud config, or a listed non-setting).
"""

from __future__ import annotations

import re

import pytest

from worker.settings import Settings
from worker.settings_docs import DOC, NOT_SETTINGS, render, secret_reference_variables


@pytest.fixture(autouse=True)
def _machine_independent(monkeypatch: pytest.MonkeyPatch) -> None:
    # Defaults come from the fields, never from this machine's environment.
    import os

    for name in list(os.environ):
        if name.upper().startswith("SICKBAY_"):
            monkeypatch.delenv(name)


def test_the_committed_page_is_the_generated_one() -> None:
    assert DOC.read_text() == render(), (
        "docs/settings.md is out of date: run `python -m worker.settings_docs` and commit it"
    )


def test_every_setting_has_its_row_and_nothing_else_is_invented() -> None:
    text = DOC.read_text()
    rows = set(re.findall(r"^\| `([A-Z][A-Z0-9_]+)`", text, re.MULTILINE))
    assert set(Settings.env_names()) <= rows
    named = set(re.findall(r"SICKBAY_[A-Z0-9_]*[A-Z0-9]", text))
    known = set(Settings.env_names()) | set(NOT_SETTINGS) | secret_reference_variables()
    assert named <= known, sorted(named - known)
