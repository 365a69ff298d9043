"""The structure pictures of docs/architecture.md, drawn from the code's own imports.

    python -m harness.structure                 # print both pictures (Mermaid) and the counts
    python -m harness.structure --write         # rewrite the "after" pictures in the doc
    python -m harness.structure --check         # exit 1 when the doc's pictures are stale
    python -m harness.structure --root DIR      # draw another checkout (e.g. an older commit:
                                                #   git worktree add /tmp/old <commit>)

Two pictures: the layers (the project's packages, an arrow for each package another imports,
labelled with how many modules import across it) and the remediation's modules (workflow,
steps, shared parts, the run; an arrow per import, a step-to-step import drawn red). Every
import counts, including those inside functions and `TYPE_CHECKING` blocks: an import is a
dependency wherever it is written. tests/, the twin's and bench's insides and generated files
are left out; they are not the product's structure.
"""

from __future__ import annotations

import argparse
import ast
import sys
import tomllib
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DOC = Path("docs") / "architecture.md"

# The packages of the layers picture, top to bottom; activities' three independent parts are
# drawn apart because their independence is one of the contracts.
PACKAGES = (
    "harness",
    "worker",
    "workflows",
    "activities",
    "activities.kube",
    "activities.cloud",
    "activities.notify",
    "contract",
    "twin",
)
DEV_TOOLS = ("harness", "twin")
PRODUCT = tuple(p for p in PACKAGES if p not in DEV_TOOLS)
REMEDIATION = "workflows.remediation"
# The remediation's run: what every step receives (a tree without the layers contract has no
# other layer, so every other module of it counts as a step there).
RUN = ("actors", "calls", "context", "journal", "outcome", "state", "deadline")
BEGIN = "<!-- structure:{name} (python -m harness.structure --write) -->"
END = "<!-- /structure:{name} -->"


@dataclass
class Imports:
    """module -> the project modules it imports (each at most once)."""

    edges: dict[str, set[str]] = field(default_factory=dict)
    # Modules loaded by their dotted name in a string (importlib), which no import shows.
    by_name: dict[str, set[str]] = field(default_factory=dict)

    def modules(self) -> set[str]:
        return set(self.edges)


def _module_name(root: Path, path: Path) -> str:
    parts = list(path.relative_to(root).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _resolve(name: str, known: set[str]) -> str | None:
    """The longest known module `name` is, or is inside."""
    while name:
        if name in known:
            return name
        name = name.rpartition(".")[0]
    return None


def scan(root: Path) -> Imports:
    tops = {p.split(".")[0] for p in PACKAGES}
    files = [
        p
        for top in sorted(tops)
        for p in sorted((root / top).rglob("*.py"))
        if "__pycache__" not in p.parts and p.resolve() != Path(__file__).resolve()
    ]
    known = {_module_name(root, p) for p in files}
    out = Imports()
    for path in files:
        me = _module_name(root, path)
        package = me if path.name == "__init__.py" else me.rpartition(".")[0]
        targets: set[str] = set()
        named: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Constant) and isinstance(node.value, str):
                if "." in node.value and node.value in known and node.value != me:
                    named.add(node.value)
                continue
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    anchor = package.split(".")
                    anchor = anchor[: len(anchor) - (node.level - 1)]
                    base = ".".join([*anchor, base] if base else anchor)
                # `from pkg import module` names a module; `from module import thing` does not.
                names = [f"{base}.{a.name}" for a in node.names] + [base]
            else:
                continue
            for name in names:
                hit = _resolve(name, known)
                if hit and hit != me:
                    targets.add(hit)
                    break
        out.edges[me] = targets
        out.by_name[me] = named - targets
    return out


def _package_of(module: str) -> str | None:
    best = None
    for p in PACKAGES:
        if (module == p or module.startswith(p + ".")) and (best is None or len(p) > len(best)):
            best = p
    return best


def _node(name: str) -> str:
    return name.replace(".", "_")


def layers_picture(imports: Imports) -> tuple[str, Counter[tuple[str, str]]]:
    arrows: Counter[tuple[str, str]] = Counter()
    named: Counter[tuple[str, str]] = Counter()
    for counter, edges in ((arrows, imports.edges), (named, imports.by_name)):
        for module, targets in edges.items():
            src = _package_of(module)
            for target in targets:
                dst = _package_of(target)
                if src and dst and src != dst:
                    counter[(src, dst)] += 1
    lines = ["flowchart TD"]
    for title, members in (("the product", PRODUCT), ("dev tools", DEV_TOOLS)):
        lines.append(f'    subgraph {_node(title.replace(" ", "_"))}["{title}"]')
        for p in members:
            lines.append(f'        {_node(p)}["{p.replace(".", "/")}/"]')
        lines.append("    end")
    for (src, dst), n in sorted(arrows.items()):
        lines.append(f"    {_node(src)} -->|{n}| {_node(dst)}")
    for (src, dst), n in sorted(named.items()):
        lines.append(f'    {_node(src)} -.->|"{n} by name"| {_node(dst)}')
    return "\n".join(lines), arrows + named


def remediation_layers(root: Path) -> tuple[set[str], set[str]] | None:
    """(steps, shared parts) as the import-linter contract on the remediation names them in
    the checkout's pyproject.toml; None when it has no such contract."""
    config = tomllib.loads((root / "pyproject.toml").read_text())
    for contract in config.get("tool", {}).get("importlinter", {}).get("contracts", []):
        if contract.get("containers") == [REMEDIATION] and contract.get("type") == "layers":
            layers = contract["layers"]
            steps = {m.strip() for m in layers[1].split("|")}
            shared = {m.strip() for m in layers[2].replace("|", ":").split(":")}
            return steps, shared
    return None


def _remediation_layer(module: str, layers: tuple[set[str], set[str]] | None) -> str:
    short = module.removeprefix(REMEDIATION + ".")
    if short == "workflow":
        return "procedure"
    if short in RUN:
        return "run"
    if layers is None or short in layers[0]:
        return "steps"
    return "shared"


def remediation_picture(
    imports: Imports, layers: tuple[set[str], set[str]] | None
) -> tuple[str, list[tuple[str, str]]]:
    mods = sorted(m for m in imports.modules() if m.startswith(REMEDIATION + "."))
    groups: dict[str, list[str]] = {"procedure": [], "steps": [], "shared": [], "run": []}
    for m in mods:
        groups[_remediation_layer(m, layers)].append(m)
    titles = {
        "procedure": "the procedure",
        "steps": "steps",
        "shared": "parts several steps share",
        "run": "the run",
    }
    lines = ["flowchart TD"]
    for layer, members in groups.items():
        if not members:
            continue
        lines.append(f'    subgraph {layer}["{titles[layer]}"]')
        for m in members:
            lines.append(f'        {_node(m)}["{m.rpartition(".")[2]}"]')
        lines.append("    end")
    step_to_step: list[tuple[str, str]] = []
    index = 0
    red: list[int] = []
    for m in mods:
        for t in sorted(imports.edges[m]):
            if not t.startswith(REMEDIATION + "."):
                continue
            lines.append(f"    {_node(m)} --> {_node(t)}")
            if _remediation_layer(m, layers) == _remediation_layer(t, layers) == "steps":
                step_to_step.append((m, t))
                red.append(index)
            index += 1
    if red:
        lines.append(f"    linkStyle {','.join(map(str, red))} stroke:#d00,stroke-width:2px")
    return "\n".join(lines), step_to_step


def pictures(root: Path) -> dict[str, str]:
    imports = scan(root)
    layers, arrows = layers_picture(imports)
    remediation, step_to_step = remediation_picture(imports, remediation_layers(root))
    mods = [m for m in imports.modules() if m.startswith(REMEDIATION + ".")]
    inner = sum(1 for m in mods for t in imports.edges[m] if t.startswith(REMEDIATION + "."))
    return {
        "layers": f"```mermaid\n{layers}\n```\n\n{len(arrows)} package-to-package arrows.",
        "remediation": (
            f"```mermaid\n{remediation}\n```\n\n{len(mods)} modules, {inner} imports between "
            f"them, {len(step_to_step)} from one step to another"
            + (
                ": "
                + ", ".join(
                    f"{a.rpartition('.')[2]} -> {b.rpartition('.')[2]}" for a, b in step_to_step
                )
                if step_to_step
                else ""
            )
            + "."
        ),
    }


def _splice(text: str, name: str, body: str) -> str:
    begin, end = BEGIN.format(name=name), END.format(name=name)
    head, sep, rest = text.partition(begin)
    if not sep:
        raise SystemExit(f"{DOC}: no {begin!r} marker")
    _, sep, tail = rest.partition(end)
    if not sep:
        raise SystemExit(f"{DOC}: no {end!r} marker")
    return f"{head}{begin}\n{body}\n{end}{tail}"


def render_doc(root: Path, text: str) -> str:
    for name, body in pictures(root).items():
        text = _splice(text, f"after:{name}", body)
    return text


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m harness.structure", description=__doc__)
    parser.add_argument("--root", type=Path, default=ROOT, help="the checkout to draw")
    mode = parser.add_mutually_exclusive_group()
    mode.add_argument("--write", action="store_true", help=f"rewrite the pictures in {DOC}")
    mode.add_argument("--check", action="store_true", help=f"exit 1 when {DOC} is stale")
    args = parser.parse_args(argv)
    doc = ROOT / DOC
    if args.write or args.check:
        text = doc.read_text()
        fresh = render_doc(args.root, text)
        if args.check:
            if fresh != text:
                print(f"{DOC} is stale: run python -m harness.structure --write", file=sys.stderr)
                return 1
            return 0
        doc.write_text(fresh)
        print(f"wrote {doc}")
        return 0
    for name, body in pictures(args.root).items():
        print(f"## {name}\n\n{body}\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
