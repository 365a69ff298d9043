"""The dev install's part beyond `pip install -e .`: the checkout's dev tools and `sickbay-dev`.

The package (pyproject.toml) holds the product only: its wheel, the operator's install and the
runtime image have no `twin` and no `harness`, and its one command is `sickbay`. A
development venv (`make venv`, behind `make demo` and `make test`) runs this afterwards:

    python -m harness.devinstall    # from the checkout's root, with the venv's python

- `<site-packages>/sickbay-dev.pth` puts the checkout on the venv's path, so `twin`, `harness`
  (and `tests`, `bench`) import from any directory, with their data files in place;
- `<venv>/bin/sickbay-dev` runs harness/cli.py (`demo`, `up`, `down`, `twin ...`).

The twin's image (Dockerfile, stage `twin`) does the same with its copy of twin/ and harness/.
"""

from __future__ import annotations

import argparse
import os
import sys
import sysconfig
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PTH = "sickbay-dev.pth"
SCRIPT = "sickbay-dev"


def install(root: Path, site_packages: Path, scripts: Path, python: str) -> list[Path]:
    """Write the path file and the `sickbay-dev` command; return what was written."""
    pth = site_packages / PTH
    pth.write_text(f"{root}\n")
    script = scripts / SCRIPT
    script.write_text(
        f"#!{python}\n"
        "# Written by `python -m harness.devinstall` (the dev install): Sickbay's dev commands.\n"
        "from harness.cli import entrypoint\n"
        "\n"
        "entrypoint()\n"
    )
    script.chmod(0o755)
    return [pth, script]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m harness.devinstall",
        description="Add the checkout's dev tools and the sickbay-dev command to this venv.",
    )
    parser.add_argument("--root", type=Path, default=ROOT, help="the checkout (default: this one)")
    args = parser.parse_args(argv)
    paths = sysconfig.get_paths()
    for path in install(
        args.root.resolve(), Path(paths["purelib"]), Path(paths["scripts"]), sys.executable
    ):
        print(f"wrote {os.fspath(path)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
