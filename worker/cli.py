"""`sickbay` command line: one dispatcher, subcommands registered by their owners.

Each module in `REGISTRARS` exposes `register(subparsers)`, adding its subcommands with
`set_defaults(func=...)`; `func(args)` returns the exit code.

The operator's commands only: the cluster twin and the embedded stack (`twin ...`, `demo`,
`up`, `down`) are development tools with their own entry point, `sickbay-dev`
(harness/cli.py), which is not in the operator's install or the runtime image. `run` and
`exit_after` are shared with it.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
from collections.abc import Callable, Sequence
from typing import Any

from pydantic import ValidationError

import worker.commands
import worker.doctor
import worker.gpus_cli
import worker.logs
import worker.pause_cli
import worker.webhook_cli

# Each adds its subcommands to the parser.
REGISTRARS: tuple[Callable[[Any], None], ...] = (
    worker.commands.register,  # worker, launch, status, timeline, approve, abort, extend-deadline, ...
    worker.webhook_cli.register,  # webhook, schedule
    worker.doctor.register,  # doctor
    worker.gpus_cli.register,  # gpus, gpus unretire: the GPU ledger (lemons)
    worker.pause_cli.register,  # pause, resume: a cluster's (or every cluster's) pause
)


def base_parser(prog: str, description: str) -> argparse.ArgumentParser:
    """A top-level parser with the flags every entry point has (`--log-format`)."""
    parser = argparse.ArgumentParser(prog=prog, description=description)
    parser.add_argument(
        "--log-format",
        choices=worker.logs.FORMATS,
        default="text",
        help="text (default) or json: one JSON object a line with workflow id, device, node and "
        f"phase where known (put it before the command: {prog} --log-format json COMMAND)",
    )
    return parser


def build_parser() -> argparse.ArgumentParser:
    parser = base_parser(
        "sickbay",
        "Remediate failed GPUs in Kubernetes clusters as durable Temporal workflows.",
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for register in REGISTRARS:
        register(sub)
    return parser


def run(parser: argparse.ArgumentParser, argv: Sequence[str] | None) -> int:
    """Parse `argv` with `parser` (made by `base_parser`), set up logging and run the chosen
    command; a bad SICKBAY_* setting is one line naming it, not a traceback."""
    args = parser.parse_args(argv)
    worker.logs.configure(args.log_format)
    func = getattr(args, "func", None)
    if func is None:
        parser.print_help()
        return 2
    try:
        return int(func(args) or 0)
    except ValidationError as exc:
        if exc.title != "Settings":
            raise
        problems = "; ".join(str(e["msg"]).removeprefix("Value error, ") for e in exc.errors())
        print(f"{parser.prog}: invalid settings: {problems}", file=sys.stderr)
        return 2


def main(argv: Sequence[str] | None = None) -> int:
    return run(build_parser(), argv)


def exit_after(main: Callable[[], int]) -> None:
    """Run `main`, then leave without interpreter finalisation. The Temporal SDK's runtime
    threads can outlive the event loop and abort the interpreter while it finalises
    (`PyGILState_Release ... finalizing`, SIGABRT), turning a command that succeeded into exit
    code -6; flushing and `os._exit` avoids that."""
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


def entrypoint() -> None:
    """The `sickbay` console script and `python -m worker.cli`."""
    exit_after(main)


if __name__ == "__main__":
    entrypoint()
