"""Helpers for the deployment-artefact tests: paths, Compose interpolation, YAML loading, and
what the code accepts (SICKBAY_* environment names, `sickbay` subcommands), so that a key or a
command line in a deployment file that the code would ignore or reject fails a test instead of
a rollout. Everything reads files from the checkout; nothing needs Docker or a cluster.
"""

from __future__ import annotations

import argparse
import os
import re
import shlex
import shutil
from collections.abc import Iterator
from functools import cache
from pathlib import Path
from typing import Any

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy"
COMPOSE_FILE = ROOT / "docker-compose.yml"
DOCKERFILE = ROOT / "Dockerfile"

# `${NAME}`, `${NAME:-default}`, `${NAME-default}`, `${NAME:?error}`, `${NAME?error}`
_INTERPOLATION = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)(?:(:?[-?])([^}]*))?\}")


def interpolate_defaults(value: str) -> str:
    """What Compose makes of `value` with no variables set: defaults filled in.

    `${X:?message}` has no default; it stays as is so a caller can tell it is required.
    """
    return interpolate(value, {})


def interpolate(value: str, variables: dict[str, str]) -> str:
    """What Compose makes of `value` with `variables` set (the operator's environment) and
    nothing else: set names filled in, defaults for the rest, required ones left as they are."""

    def repl(match: re.Match[str]) -> str:
        name, op, arg = match.group(1), match.group(2), match.group(3)
        if name in variables:
            return variables[name]
        if op in (":-", "-"):
            return arg
        return match.group(0)

    return _INTERPOLATION.sub(repl, value)


def required_variables(value: str) -> list[str]:
    """Names in `value` that Compose requires (`${X:?...}`)."""
    return [m.group(1) for m in _INTERPOLATION.finditer(value) if m.group(2) in (":?", "?")]


def load_yaml_documents(path: Path) -> list[dict[str, Any]]:
    docs = [d for d in yaml.safe_load_all(path.read_text()) if d is not None]
    for doc in docs:
        assert isinstance(doc, dict), f"{path.name}: a document is not a mapping: {doc!r}"
    return docs


def manifest_files() -> list[Path]:
    """Every Kubernetes manifest directly under deploy/ and in its components
    (kustomization.yaml files aside)."""
    return sorted(
        p
        for p in [*DEPLOY.glob("*.yaml"), *DEPLOY.glob("components/*/*.yaml")]
        if p.name not in ("kustomization.yaml",) and p.is_file()
    )


def is_kubernetes_object(doc: dict[str, Any]) -> bool:
    return "apiVersion" in doc and "kind" in doc


def command_args(command: Any) -> list[str]:
    """A Compose `command` (list or string) or a container's args as an argv list."""
    if command is None:
        return []
    if isinstance(command, str):
        return shlex.split(command)
    return [str(part) for part in command]


def iter_services(compose: dict[str, Any]) -> Iterator[tuple[str, dict[str, Any]]]:
    yield from compose["services"].items()


_ENV_LITERAL = re.compile(r"\bSICKBAY_[A-Z0-9_]+\b")


@cache
def known_env_names() -> frozenset[str]:
    """Every SICKBAY_* name some part of Sickbay reads.

    - every variable of the one `Settings` (`Settings.env_names()`);
    - names the code spells out literally (e.g. `os.environ["SICKBAY_..."]`), except the
      settings page's list of what is not a setting (worker/settings_docs.py);
    - names the Dockerfile itself sets for its HEALTHCHECK.
    """
    from worker.settings import Settings

    names = {name.upper() for name in Settings.env_names()}
    # tests/containers reads SICKBAY_REQUIRE_DOCKER / SICKBAY_TEST_K3S_IMAGE.
    for package in ("worker", "activities", "twin", "tests/containers"):
        for path in (ROOT / package).rglob("*.py"):
            if path.name != "settings_docs.py":
                names |= set(_ENV_LITERAL.findall(path.read_text()))
    names |= set(_ENV_LITERAL.findall(DOCKERFILE.read_text()))
    return frozenset(names)


def assert_known_env(names: set[str] | list[str], where: str) -> None:
    unknown = sorted(n for n in names if n.startswith("SICKBAY_") and n not in known_env_names())
    assert not unknown, (
        f"{where} sets {unknown}, which no Settings class or code in worker/activities/"
        "twin reads: a typo, or a setting that does not exist yet"
    )


def _subcommands(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            return dict(action.choices)
    return {}


def assert_cli_accepts(argv: list[str], where: str, program: str = "sickbay") -> None:
    """`<program> <argv>` must parse (`sickbay`, or the dev tools' `sickbay-dev`); an unknown
    subcommand fails with its name."""
    if program == "sickbay-dev":
        from harness.cli import build_parser
    else:
        assert program == "sickbay", program
        from worker.cli import build_parser

    parser = build_parser()
    assert argv, f"{where}: empty command"
    commands = _subcommands(parser)
    if argv[0] not in commands:
        pytest.fail(f"{where}: `{program} {argv[0]}` is not a subcommand")
    if len(argv) > 1 and not argv[1].startswith("-"):
        nested = _subcommands(commands[argv[0]])
        if nested and argv[1] not in nested:
            pytest.fail(f"{where}: `{program} {argv[0]} {argv[1]}` is not a subcommand")
    try:
        parser.parse_args(argv)
    except SystemExit as exc:
        pytest.fail(
            f"{where}: `{program} {' '.join(argv)}` is rejected by the CLI (exit {exc.code})"
        )


def repo_path(text: str) -> Path:
    """A path written relative to the repository root (`./x`, `x`) as an absolute path."""
    return (ROOT / text).resolve()


SHELL_ENTRYPOINTS = (["/bin/sh", "-c"], ["sh", "-c"])


def compose_script(service: dict[str, Any]) -> str | None:
    """A service's shell script (entrypoint `sh -c`) as the shell receives it, or None."""
    if service.get("entrypoint") not in SHELL_ENTRYPOINTS:
        return None
    script = " ".join(command_args(service.get("command")))
    return interpolate_defaults(script).replace("$$", "$")


_EXEC = re.compile(r"exec (sickbay(?:-dev)?) ")


def service_program(service: dict[str, Any]) -> str:
    """The command a compose service runs: the image's `sickbay` (its ENTRYPOINT), or what its
    `sh -c` script execs (the twin's image: the dev tools' `sickbay-dev`)."""
    script = compose_script(service)
    if script is None:
        return "sickbay"
    match = _EXEC.search(script)
    assert match, f"the shell script does not `exec sickbay[-dev] ...`: {script}"
    return match.group(1)


def service_argv(service: dict[str, Any]) -> list[str]:
    """The arguments a compose service gives its command (`service_program`): its command, or
    those of the `exec sickbay[-dev] ...` inside its `sh -c` script, with compose defaults
    filled in."""
    script = compose_script(service)
    if script is None:
        return [interpolate_defaults(a) for a in command_args(service.get("command"))]
    match = _EXEC.search(script)
    assert match, f"the shell script does not `exec sickbay[-dev] ...`: {script}"
    return shlex.split(script[match.end() :])


def kubectl_or_skip() -> str:
    """kubectl's path; without it the test skips (fails with SICKBAY_REQUIRE_KUBECTL=1)."""
    kubectl = shutil.which("kubectl")
    if kubectl is None:
        reason = "kubectl is not installed: apt-get install kubectl (the YAML checks ran)"
        if os.environ.get("SICKBAY_REQUIRE_KUBECTL", "").lower() in ("1", "true", "yes"):
            pytest.fail(f"SICKBAY_REQUIRE_KUBECTL is set but {reason}")
        pytest.skip(reason)
    return kubectl
