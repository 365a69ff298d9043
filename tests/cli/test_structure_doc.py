"""docs/architecture.md's structure pictures are the code's: `python -m harness.structure`.

Cases: the committed "after" pictures equal what the tree draws now (a stale doc fails, with
the command that rewrites it); on a small tree of its own, the drawing finds each kind of
arrow it claims to draw: an import inside a function, a relative import, a module loaded by
its dotted name, and a step importing another step (counted, and red), with steps read from
the remediation's import-linter layers contract and, without one, every non-run module.
"""

from __future__ import annotations

from pathlib import Path

from harness import structure

ROOT = Path(__file__).resolve().parents[2]

CONTRACT = """
[[tool.importlinter.contracts]]
name = "remediation layers"
type = "layers"
containers = ["workflows.remediation"]
layers = ["workflow", "confirm | guard", "lease", "state", "deadline"]
"""


def _tree(root: Path, files: dict[str, str], contract: bool = True) -> Path:
    (root / "pyproject.toml").write_text(CONTRACT if contract else "")
    for name, text in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return root


def test_the_docs_pictures_are_the_trees() -> None:
    text = (ROOT / "docs" / "architecture.md").read_text()
    assert structure.render_doc(ROOT, text) == text, (
        "docs/architecture.md's structure pictures are stale: python -m harness.structure --write"
    )


def test_a_stale_picture_is_redrawn() -> None:
    text = (ROOT / "docs" / "architecture.md").read_text()
    head, sep, after = text.rpartition("package-to-package arrows")  # the "after" picture's
    stale = f"{head}arrows, drawn by hand{after}"
    assert sep and stale != text
    assert structure.render_doc(ROOT, stale) == text


def test_every_kind_of_arrow_is_drawn(tmp_path: Path) -> None:
    root = _tree(
        tmp_path,
        {
            "workflows/__init__.py": "",
            "workflows/remediation/__init__.py": "",
            "workflows/remediation/workflow.py": "from . import confirm, guard\n",
            "workflows/remediation/confirm.py": (
                "def run():\n    from workflows.remediation.guard import wait\n    return wait\n"
            ),
            "workflows/remediation/guard.py": "from .lease import ask\nwait = ask\n",
            "workflows/remediation/lease.py": "from .state import State\nask = State\n",
            "workflows/remediation/state.py": "State = object\n",
            "worker/__init__.py": "",
            "worker/cli.py": (
                "import importlib\nDEMO = importlib.import_module('harness.demo')\n"
                "from contract.kube import Device\n"
            ),
            "harness/__init__.py": "",
            "harness/demo.py": "",
            "contract/__init__.py": "",
            "contract/kube.py": "Device = object\n",
        },
    )
    pictures = structure.pictures(root)
    layers, remediation = pictures["layers"], pictures["remediation"]
    assert "worker -->|1| contract" in layers
    assert 'worker -.->|"1 by name"| harness' in layers
    assert "workflows_remediation_lease --> workflows_remediation_state" in remediation
    assert "1 from one step to another: confirm -> guard." in remediation
    assert "linkStyle" in remediation and "stroke:#d00" in remediation


def test_without_the_layers_contract_every_other_module_is_a_step(tmp_path: Path) -> None:
    root = _tree(
        tmp_path,
        {
            "workflows/__init__.py": "",
            "workflows/remediation/__init__.py": "",
            "workflows/remediation/guard.py": "from .lease import ask\n",
            "workflows/remediation/lease.py": "ask = 1\n",
        },
        contract=False,
    )
    assert "1 from one step to another: guard -> lease." in structure.pictures(root)["remediation"]
