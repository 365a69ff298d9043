"""`sickbay-dev`: the development commands, apart from the operator's `sickbay`.

    sickbay-dev demo [--scenario NAME] [--keep] [--time-scale N]   # harness/demo.py
    sickbay-dev up [--time-scale N] [--topology T]
    sickbay-dev down [--state-dir DIR]
    sickbay-dev twin up|down|status|fail|recover|...               # twin/cli.py

The cluster twin and the embedded stack are not part of the product: the operator's install
(the wheel, whose packages leave out `twin` and `harness`) and the runtime image carry `sickbay`
alone. The dev install (`make venv`, used by `make demo` and `make test`) adds the checkout to
the venv and this command (harness/devinstall.py); `python -m harness.cli` is the same thing.
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence

import harness.demo
import twin.cli
from worker.cli import base_parser, exit_after, run

PROG = "sickbay-dev"


def build_parser() -> argparse.ArgumentParser:
    parser = base_parser(
        PROG,
        "Sickbay's development tools: the cluster twin and the embedded stack "
        "(Temporal dev server, twin, worker, webhook on loopback).",
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    twin.cli.register(sub)  # twin up/down/status/fail/recover/...
    harness.demo.register(sub)  # demo, up, down
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    return run(build_parser(), argv)


def entrypoint() -> None:
    """The `sickbay-dev` command and `python -m harness.cli`."""
    exit_after(main)


if __name__ == "__main__":
    entrypoint()
