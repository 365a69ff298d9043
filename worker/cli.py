"""`sickbay` command line: one dispatcher, subcommands registered by their owners.

Each module in `REGISTRARS` exposes `register(subparsers)`, adding its subcommands with
`set_defaults(func=...)`; `func(args)` returns the exit code.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
from collections.abc import Callable, Sequence
from typing import Any

from pydantic import ValidationError

import harness.demo
import twin.cli
import worker.commands
import worker.doctor
import worker.gpus_cli
import worker.webhook_cli

# Each adds its subcommands to the parser.
REGISTRARS: tuple[Callable[[Any], None], ...] = (
    worker.commands.register,  # worker, launch, status, timeline, approve, abort, extend-deadline, ...
    worker.webhook_cli.register,  # webhook, schedule
    worker.doctor.register,  # doctor
    worker.gpus_cli.register,  # gpus, gpus unretire: the GPU ledger (lemons)
    twin.cli.register,  # twin up/down/status/fail/recover
    harness.demo.register,  # demo, up, down: the local stack
)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="sickbay",
        description="Remediate failed GPUs in Kubernetes clusters as durable Temporal workflows.",
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for register in REGISTRARS:
        register(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    func = getattr(args, "func", None)
    if func is None:
        parser.print_help()
        return 2
    try:
        return int(func(args) or 0)
    except ValidationError as exc:
        if exc.title != "Settings":
            raise
        # A bad SICKBAY_* setting: one line naming it, not a traceback.
        problems = "; ".join(str(e["msg"]).removeprefix("Value error, ") for e in exc.errors())
        print(f"sickbay: invalid settings: {problems}", file=sys.stderr)
        return 2


def entrypoint() -> None:
    """The `sickbay` console script and `python -m worker.cli`: run `main`, then leave without
    interpreter finalisation. The Temporal SDK's runtime threads can outlive the event loop and
    abort the interpreter while it finalises (`PyGILState_Release ... finalizing`, SIGABRT),
    turning a command that succeeded into exit code -6; flushing and `os._exit` avoids that."""
    try:
        code = main()
    except SystemExit as exc:  # argparse errors, --help
        code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
    except KeyboardInterrupt:
        code = 130
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


if __name__ == "__main__":
    entrypoint()
