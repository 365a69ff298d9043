"""Runbook loading: YAML files -> validated `Runbook` models, errors as `file:line: field: problem`.

- `load_file(path)` / `load_dir(path)` raise `RunbookError` whose `problems` are one line each,
  e.g. `runbooks/inference.yaml:17: spec.eviction.timeout: invalid duration 'ten minutes'`.
  The line is found by walking the YAML node tree along pydantic's error location.
- Stricter than YAML: a key written twice in one mapping is an error naming both lines (YAML
  loaders keep the last one, so a second `spec:` would silently replace the first); a file is
  at most `MAX_FILE_BYTES` and its node tree (aliases expanded) at most `MAX_NODES`, so a huge
  or alias-bomb file is refused in milliseconds instead of stalling the worker.
- Values outside the documented safe bounds (`contract.runbook.SAFE_BOUNDS`) are refused by
  the schema unless the block acknowledges them with `unsafe: [field]`.
- A repair or validation image / command outside the operator's allowlist
  (`RepairAllowlist`, SICKBAY_REPAIR_ALLOWLIST) is refused, e.g.
  `runbooks/training.yaml:40: spec.repair.reset.image: image '...' is not in the operator's
  reset allowlist (...)`: the runbooks never choose what runs privileged on a node.
- `RunbookActivities.load_runbooks` is the `load-runbooks` activity: it reads
  `Settings.runbooks_dir`, caches the set until a file changes, and keeps serving the last good
  set (logging the problems) when an edit breaks a file, so a typo made during an incident
  cannot stop remediations. The workflow records the set it got in history, so later edits
  never change a running remediation's decisions.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError
from temporalio.exceptions import ApplicationError

from activities.defn import implements_blocking
from contract.errors import ERR_RUNBOOK_INVALID
from contract.runbook import LOAD_RUNBOOKS, RepairAllowlist, Runbook, RunbookSet

log = logging.getLogger(__name__)

SUFFIXES = (".yaml", ".yml")
# The shipped runbooks are ~1 KiB each; 256 KiB leaves room for long match lists and comments
# while a 50 MB file (55 s of YAML parsing) is refused before it is read.
MAX_FILE_BYTES = 256 * 1024
# YAML nodes visited with aliases expanded: a shipped runbook has ~100; a "billion laughs"
# file of a few lines would expand to millions and hang pydantic's validation.
MAX_NODES = 20_000


class _Loader(yaml.SafeLoader):
    """YAML 1.2 booleans: only true/false. (YAML 1.1 reads the runbook key `on:` and values
    like `no` as booleans, which would turn `spec.on` into `spec.True`.)"""


_Loader.yaml_implicit_resolvers = {
    first: [(tag, rx) for tag, rx in resolvers if tag != "tag:yaml.org,2002:bool"]
    for first, resolvers in yaml.SafeLoader.yaml_implicit_resolvers.items()
}
_Loader.add_implicit_resolver(
    "tag:yaml.org,2002:bool",
    re.compile(r"^(?:true|True|TRUE|false|False|FALSE)$"),
    list("tTfF"),
)


class RunbookError(ValueError):
    def __init__(self, problems: list[str]) -> None:
        super().__init__("\n".join(problems))
        self.problems = problems


def _line_of(node: yaml.Node | None, loc: tuple[int | str, ...]) -> int:
    """1-based line of the deepest YAML node reachable along pydantic's error `loc`."""
    line = node.start_mark.line + 1 if node is not None else 1
    for part in loc:
        if isinstance(node, yaml.MappingNode):
            nxt = next(
                (v for k, v in node.value if isinstance(k, yaml.ScalarNode) and k.value == part),
                None,
            )
            if nxt is None:
                # An unknown / missing key: point at the key itself when present, else the map.
                key = next(
                    (
                        k
                        for k, _ in node.value
                        if isinstance(k, yaml.ScalarNode) and k.value == part
                    ),
                    None,
                )
                if key is not None:
                    line = key.start_mark.line + 1
                break
            node = nxt
        elif isinstance(node, yaml.SequenceNode) and isinstance(part, int):
            if part >= len(node.value):
                break
            node = node.value[part]
        else:
            break
        line = node.start_mark.line + 1
    return line


def _field(loc: tuple[int | str, ...]) -> str:
    # pydantic adds union/tag members (e.g. 'int', 'str', 'function-after[...]') to the loc.
    parts = [
        str(p)
        for p in loc
        if not (
            isinstance(p, str) and (p in {"int", "str"} or "[" in p or p.startswith("function"))
        )
    ]
    return ".".join(parts) or "(document)"


def _validate(doc: Any, node: yaml.Node | None, where: str) -> tuple[Runbook | None, list[str]]:
    if not isinstance(doc, dict):
        line = node.start_mark.line + 1 if node is not None else 1
        return None, [f"{where}:{line}: (document): expected a mapping with apiVersion/kind/spec"]
    try:
        return Runbook.model_validate(doc), []
    except ValidationError as exc:
        problems = []
        for err in exc.errors():
            loc = tuple(err["loc"])
            field = (err.get("ctx") or {}).get("field")
            if err["type"].startswith("unsafe_") and isinstance(field, str):
                loc = (*loc, field)  # point at the field itself, not its block
            line = _line_of(node, loc)
            msg = err["msg"]
            if err["type"] == "extra_forbidden":
                msg = "unknown field (check spelling; keys are camelCase)"
            problems.append(f"{where}:{line}: {_field(loc)}: {msg}")
        return None, problems


def _key_path(path: str, key: str) -> str:
    return f"{path}.{key}" if path else key


def _structure_problems(root: yaml.Node, where: str) -> list[str]:
    """Duplicate keys (each named with both lines) and an over-large node tree."""
    problems: list[str] = []
    visited = 0
    stack: list[tuple[yaml.Node, str]] = [(root, "")]
    while stack:
        node, path = stack.pop()
        visited += 1
        if visited > MAX_NODES:
            line = root.start_mark.line + 1
            return [
                f"{where}:{line}: (document): more than {MAX_NODES} YAML nodes (with aliases "
                "expanded); a runbook is a few hundred at most"
            ]
        if isinstance(node, yaml.MappingNode):
            first: dict[str, int] = {}
            for key, value in node.value:
                name = key.value if isinstance(key, yaml.ScalarNode) else None
                if name is not None and name != "<<":
                    line = key.start_mark.line + 1
                    if name in first:
                        problems.append(
                            f"{where}:{line}: {_key_path(path, name)}: duplicate key (first at "
                            f"line {first[name]}); YAML would silently keep only the last one"
                        )
                    else:
                        first[name] = line
                stack.append((value, _key_path(path, name or "?")))
        elif isinstance(node, yaml.SequenceNode):
            stack.extend((item, f"{path}[{i}]") for i, item in enumerate(node.value))
    return sorted(problems, key=lambda p: int(p[len(where) + 1 :].split(":", 1)[0]))


def load_text(text: str, where: str, allowlist: RepairAllowlist | None = None) -> list[Runbook]:
    """All runbooks in one YAML text (one or more documents); each image and command a
    repair block names checked against `allowlist` (None: the empty one, the default)."""
    allowlist = allowlist if allowlist is not None else RepairAllowlist()
    if len(text.encode("utf-8", "surrogatepass")) > MAX_FILE_BYTES:
        raise RunbookError([_too_large(where)])
    try:
        nodes = list(yaml.compose_all(text, Loader=_Loader))
        structure = [p for n in nodes if n is not None for p in _structure_problems(n, where)]
        if structure:
            raise RunbookError(structure)
        docs = list(yaml.load_all(text, Loader=_Loader))  # _Loader is a SafeLoader
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None) or getattr(exc, "context_mark", None)
        line = mark.line + 1 if mark is not None else 1
        problem = getattr(exc, "problem", None) or str(exc)
        raise RunbookError([f"{where}:{line}: (yaml): {problem}"]) from exc
    runbooks: list[Runbook] = []
    problems: list[str] = []
    pairs = [(d, n) for d, n in zip(docs, nodes, strict=True) if d is not None]
    if not pairs:
        raise RunbookError([f"{where}:1: (document): empty file, expected a Runbook"])
    for doc, node in pairs:
        runbook, errs = _validate(doc, node, where)
        problems += errs
        if runbook is not None:
            refused = [
                f"{where}:{_line_of(node, loc)}: {'.'.join(loc)}: {msg}"
                for loc, msg in allowlist.runbook_problems(runbook)
            ]
            problems += refused
            if not refused:
                runbooks.append(runbook)
    if problems:
        raise RunbookError(problems)
    return runbooks


def _too_large(where: str) -> str:
    return (
        f"{where}:1: (file): larger than {MAX_FILE_BYTES // 1024} KiB, the limit for a runbook file"
    )


def load_file(path: Path, allowlist: RepairAllowlist | None = None) -> list[Runbook]:
    try:
        with path.open("rb") as f:
            raw = f.read(MAX_FILE_BYTES + 1)  # never read a huge file whole
        if len(raw) > MAX_FILE_BYTES:
            raise RunbookError([_too_large(str(path))])
        text = raw.decode("utf-8")
    except OSError as exc:
        raise RunbookError([f"{path}:1: (file): cannot read: {exc.strerror}"]) from exc
    except UnicodeDecodeError as exc:
        raise RunbookError([f"{path}:1: (file): not UTF-8 text"]) from exc
    return load_text(text, str(path), allowlist)


def runbook_files(path: Path) -> list[Path]:
    if path.is_file():
        return [path]
    if not path.is_dir():
        raise RunbookError([f"{path}:1: (path): no such file or directory"])
    return sorted(p for p in path.iterdir() if p.suffix in SUFFIXES and p.is_file())


def load_dir(path: Path, allowlist: RepairAllowlist | None = None) -> RunbookSet:
    """Every runbook under `path` (a directory or one file); all problems at once. Repair
    images and commands are checked against `allowlist` (the worker's setting)."""
    problems: list[str] = []
    runbooks: list[Runbook] = []
    where: dict[str, str] = {}
    for file in runbook_files(path):
        try:
            loaded = load_file(file, allowlist)
        except RunbookError as exc:
            problems += exc.problems
            continue
        for runbook in loaded:
            if runbook.name in where:
                problems.append(
                    f"{file}:1: metadata.name: runbook {runbook.name!r} is already defined "
                    f"in {where[runbook.name]}"
                )
                continue
            where[runbook.name] = str(file)
            runbooks.append(runbook)
    if problems:
        raise RunbookError(problems)
    if not runbooks:
        raise RunbookError([f"{path}:1: (path): no runbooks (*.yaml) found"])
    return RunbookSet(runbooks=runbooks, source=str(path))


def _signature(path: Path) -> tuple[tuple[str, int, int], ...]:
    files = runbook_files(path)
    return tuple((str(f), f.stat().st_mtime_ns, f.stat().st_size) for f in files)


class RunbookActivities:
    """Loads the runbooks, reloading them when a file changes (a ConfigMap update lands in the
    mounted files). A bad edit keeps the last good set and is reported once per edit: logged,
    counted (`sickbay_runbook_reload_failures`, gauge `sickbay_runbooks_valid` 0 until a good
    set loads again) and told to `on_invalid` (the worker posts a Warning Event)."""

    def __init__(
        self,
        runbooks_dir: Path,
        allowlist: RepairAllowlist | None = None,
        on_invalid: Callable[[str], object] | None = None,
    ) -> None:
        self._dir = runbooks_dir
        self._allowlist = allowlist
        self._cached: RunbookSet | None = None
        self._signature: tuple[tuple[str, int, int], ...] | None = None
        self._bad_signature: tuple[tuple[str, int, int], ...] | None = None
        self.on_invalid: Callable[[str], object] | None = on_invalid
        self.failed_reloads = 0

    def current(self) -> RunbookSet:
        """The cached set, reloaded when a file changed; the last good set on a bad edit."""
        signature = None
        try:
            signature = _signature(self._dir)
            if self._cached is not None and signature == self._signature:
                return self._cached
            if self._cached is not None and signature == self._bad_signature:
                return self._cached  # the same bad edit: reported already
            loaded = load_dir(self._dir, self._allowlist)
        except RunbookError as exc:
            if self._cached is None:
                raise
            self._bad_signature = signature
            self._report_invalid(str(exc))
            return self._cached
        if self._cached is not None:
            _metrics("valid", 1)
        self._cached, self._signature, self._bad_signature = loaded, signature, None
        log.info("loaded %d runbooks from %s", len(loaded.runbooks), self._dir)
        return loaded

    def _report_invalid(self, problems: str) -> None:
        self.failed_reloads += 1
        log.error(
            "runbooks in %s are invalid; still using the last good set:\n%s", self._dir, problems
        )
        _metrics("failed", 1)
        _metrics("valid", 0)
        if self.on_invalid is not None:
            try:
                self.on_invalid(problems)
            except Exception:  # the report is best effort; the last good set still serves
                log.exception("could not report the invalid runbooks")

    @implements_blocking(LOAD_RUNBOOKS)
    def load_runbooks(self) -> RunbookSet:
        # Sync activity (file reads) on the worker's thread pool; a few ms when cached.
        try:
            return self.current()
        except RunbookError as exc:
            raise ApplicationError(
                f"runbooks in {self._dir} are invalid:\n{exc}",
                type=ERR_RUNBOOK_INVALID,
                non_retryable=True,
            ) from exc


def _metrics(what: str, value: int) -> None:
    """The reload metrics, on the process's Temporal runtime (the worker's Prometheus port)."""
    from temporalio.runtime import Runtime

    meter = Runtime.default().metric_meter
    if what == "failed":
        meter.create_counter(
            "sickbay_runbook_reload_failures",
            "Runbook reloads refused (invalid files); the last good set stays in use",
        ).add(value)
    else:
        meter.create_gauge(
            "sickbay_runbooks_valid", "1 when the runbook files on disk are the set in use"
        ).set(value)
