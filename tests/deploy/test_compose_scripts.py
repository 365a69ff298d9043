"""The compose stack's one-shot scripts (deploy/compose/*.sh), run by /bin/sh with stub
`temporal-sql-tool`, `temporal` and `nc` programs on PATH that record their arguments.

Cases:
- setup-postgres.sh: for both databases, create → setup-schema -v 0.0 → update-schema with the
  matching versioned directory; "already exists" from create is success (the postgres image
  creates `temporal` itself; a kept volume has both); any other create failure stops the
  script before touching a schema; a missing required variable is named;
- create-namespace.sh: waits for cluster health, creates a missing namespace (30-day
  retention) and only the search attributes that are missing; an existing namespace is left.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from tests.deploy.helpers import DEPLOY

SCRIPTS = DEPLOY / "compose"


def _stub(bin_dir: Path, name: str, body: str) -> None:
    path = bin_dir / name
    path.write_text(f'#!/bin/sh\necho "{name} $*" >> "$CALLS"\n{body}\n')
    path.chmod(0o755)


def _run(script: str, tmp_path: Path, env: dict[str, str]) -> tuple[int, str, list[str]]:
    calls = tmp_path / "calls"
    calls.touch()
    full = {
        "PATH": f"{tmp_path / 'bin'}{os.pathsep}/usr/bin:/bin",
        "CALLS": str(calls),
        **env,
    }
    done = subprocess.run(
        ["/bin/sh", str(SCRIPTS / script)], env=full, capture_output=True, text=True, timeout=30
    )
    return done.returncode, done.stdout + done.stderr, calls.read_text().splitlines()


@pytest.fixture
def bin_dir(tmp_path: Path) -> Path:
    path = tmp_path / "bin"
    path.mkdir()
    _stub(path, "nc", "exit 0")
    return path


PG_ENV = {"POSTGRES_SEEDS": "postgresql", "POSTGRES_USER": "temporal", "SQL_PASSWORD": "pw"}


def test_schema_setup_order_and_existing_database(bin_dir: Path, tmp_path: Path) -> None:
    _stub(
        bin_dir,
        "temporal-sql-tool",
        'case "$*" in *"--db temporal create"*) '
        "echo 'pq: database \"temporal\" already exists' >&2; exit 1;; esac; exit 0",
    )
    code, out, calls = _run("setup-postgres.sh", tmp_path, PG_ENV)
    assert code == 0, out
    tool = [c.split("-p 5432 ", 1)[1] for c in calls if c.startswith("temporal-sql-tool")]
    root = "/etc/temporal/schema/postgresql/v12"
    assert tool == [
        "--db temporal create",
        "--db temporal setup-schema -v 0.0",
        f"--db temporal update-schema -d {root}/temporal/versioned",
        "--db temporal_visibility create",
        "--db temporal_visibility setup-schema -v 0.0",
        f"--db temporal_visibility update-schema -d {root}/visibility/versioned",
    ]
    assert "database temporal already exists" in out
    assert all("--plugin postgres12 --ep postgresql -u temporal" in c for c in calls[1:])


def test_schema_setup_stops_on_a_real_create_failure(bin_dir: Path, tmp_path: Path) -> None:
    _stub(
        bin_dir,
        "temporal-sql-tool",
        'case "$*" in *create*) echo "dial tcp: connection refused" >&2; exit 1;; esac; exit 0',
    )
    code, out, calls = _run("setup-postgres.sh", tmp_path, PG_ENV)
    assert code == 1
    assert "connection refused" in out and "cannot create database temporal" in out
    assert not [c for c in calls if "schema" in c], "no schema step after a failed create"


def test_schema_setup_names_a_missing_variable(bin_dir: Path, tmp_path: Path) -> None:
    code, out, _ = _run("setup-postgres.sh", tmp_path, {**PG_ENV, "SQL_PASSWORD": ""})
    assert code != 0 and "SQL_PASSWORD" in out


def test_namespace_and_missing_search_attributes(bin_dir: Path, tmp_path: Path) -> None:
    _stub(
        bin_dir,
        "temporal",
        'case "$*" in\n'
        '  *"namespace describe"*) exit 1;;\n'
        '  *"search-attribute list"*) echo "SickbayDevice  Keyword";;\n'
        "esac\nexit 0",
    )
    env = {
        "TEMPORAL_ADDRESS": "temporal:7233",
        "NAMESPACE": "default",
        "SEARCH_ATTRIBUTES": "SickbayDevice SickbayNode SickbayPhase",
    }
    code, out, calls = _run("create-namespace.sh", tmp_path, env)
    assert code == 0, out
    assert calls[0].startswith("temporal operator cluster health --address temporal:7233")
    assert any("namespace create" in c and "--retention 30d" in c for c in calls)
    created = [c.split("--name ")[1].split()[0] for c in calls if "search-attribute create" in c]
    assert created == ["SickbayNode", "SickbayPhase"]


def test_existing_namespace_is_left_alone(bin_dir: Path, tmp_path: Path) -> None:
    _stub(bin_dir, "temporal", "exit 0")
    env = {"TEMPORAL_ADDRESS": "temporal:7233", "NAMESPACE": "default", "SEARCH_ATTRIBUTES": ""}
    code, out, calls = _run("create-namespace.sh", tmp_path, env)
    assert code == 0, out
    assert not [c for c in calls if "namespace create" in c]
    assert "namespace default exists" in out
