"""requirements.lock, the runtime image's install set, agrees with pyproject.toml.

Cases:
- every runtime dependency (`project.dependencies`) and the build backend
  (`build-system.requires`) is pinned in the lock (`name==version`) with a version its
  specifier allows, and every pinned package carries at least one sha256 hash (pip's
  `--require-hashes` refuses the file otherwise);
- nothing only development needs is locked (the Temporal dev server, test tools), and no
  package is pinned twice unless under different markers;
- the lock's header names the command that made it from pyproject.toml (`make lock`).
"""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

ROOT = Path(__file__).resolve().parents[2]
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())
LOCK = (ROOT / "requirements.lock").read_text()


def _entries() -> list[tuple[str, str, str, list[str]]]:
    """(name, version, marker, hashes) per pinned requirement of the lock."""
    out = []
    for block in re.split(r"\n(?=\S)", LOCK):
        if block.startswith("#") or not block.strip():
            continue
        head, *rest = block.split("\\\n")
        req = Requirement(head.strip())
        (spec,) = list(req.specifier)
        assert spec.operator == "==", head
        hashes = re.findall(r"--hash=sha256:([0-9a-f]{64})", block)
        out.append((canonicalize_name(req.name), spec.version, str(req.marker or ""), hashes))
    return out


def test_every_runtime_and_build_requirement_is_pinned_with_hashes() -> None:
    entries = _entries()
    pinned: dict[str, list[str]] = {}
    for name, version, _marker, hashes in entries:
        assert hashes, f"{name}=={version} has no hash"
        pinned.setdefault(name, []).append(version)
    wanted = PYPROJECT["project"]["dependencies"] + PYPROJECT["build-system"]["requires"]
    for text in wanted:
        req = Requirement(text)
        versions = pinned.get(canonicalize_name(req.name))
        assert versions, f"{req.name} (pyproject.toml) is not in requirements.lock: make lock"
        for version in versions:
            assert req.specifier.contains(version, prereleases=True), (
                f"requirements.lock pins {req.name}=={version}, pyproject.toml wants "
                f"{req.specifier}: make lock"
            )


def test_nothing_development_only_is_locked() -> None:
    names = {name for name, *_ in _entries()}
    dev = {Requirement(t).name for t in PYPROJECT["project"]["optional-dependencies"]["dev"]}
    runtime = {Requirement(t).name for t in PYPROJECT["project"]["dependencies"]}
    only_dev = {canonicalize_name(n) for n in dev - runtime}
    assert not names & only_dev, f"development-only packages locked: {sorted(names & only_dev)}"
    seen: dict[tuple[str, str], int] = {}
    for name, _version, marker, _hashes in _entries():
        seen[(name, marker)] = seen.get((name, marker), 0) + 1
    assert all(n == 1 for n in seen.values()), seen


def test_the_lock_says_how_it_was_made() -> None:
    header = LOCK.splitlines()[:3]
    assert any(
        "pip compile pyproject.toml" in line and "--generate-hashes" in line for line in header
    )
    makefile = (ROOT / "Makefile").read_text()
    assert re.search(r"^lock:", makefile, re.M), "make lock regenerates requirements.lock"
