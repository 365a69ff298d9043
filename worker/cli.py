"""`sickbay` command line: one dispatcher, subcommands registered by their owners.

Each module in `REGISTRARS` exposes `register(subparsers)`, adding its subcommands with
`set_defaults(func=...)`; `func(args)` returns the exit code.

The development commands (`twin ...` from the cluster twin, `demo`, `up`, `down` from the
demo harness) are registered only where those packages are installed: the runtime image
carries the product alone, and there they answer with one line saying so (exit 2) while every
operator command works.
"""

from __future__ import annotations

import argparse
import importlib
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


def _dev_only(module: str, commands: tuple[str, ...], what: str) -> Callable[[Any], None]:
    """The `register` of a development package, or, where it is not installed (the runtime
    image), stand-ins for its `commands` that say so and exit 2."""
    package = module.split(".")[0]
    try:
        return importlib.import_module(module).register  # type: ignore[no-any-return]
    except ModuleNotFoundError as exc:
        if exc.name != package:
            raise  # the package is there but broken (a module of it, or what it imports)

    def missing(args: argparse.Namespace) -> int:
        print(
            f"sickbay {args.command}: not in this install: {what} (package "
            f"{package!r}) ships with the source install for development "
            "(pip install -e '.[dev]'), not the runtime image",
            file=sys.stderr,
        )
        return 2

    def register(subparsers: Any) -> None:
        for name in commands:
            stub = subparsers.add_parser(name, help=f"(not installed: {what})", add_help=False)
            stub.add_argument("rest", nargs=argparse.REMAINDER)
            stub.set_defaults(func=missing)

    return register


# Each adds its subcommands to the parser.
REGISTRARS: tuple[Callable[[Any], None], ...] = (
    worker.commands.register,  # worker, launch, status, timeline, approve, abort, extend-deadline, ...
    worker.webhook_cli.register,  # webhook, schedule
    worker.doctor.register,  # doctor
    worker.gpus_cli.register,  # gpus, gpus unretire: the GPU ledger (lemons)
    worker.pause_cli.register,  # pause, resume: a cluster's (or every cluster's) pause
    _dev_only("twin.cli", ("twin",), "the cluster twin"),  # twin up/down/status/fail/recover
    _dev_only("harness.demo", ("demo", "up", "down"), "the demo harness"),  # the local stack
)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="sickbay",
        description="Remediate failed GPUs in Kubernetes clusters as durable Temporal workflows.",
    )
    parser.add_argument(
        "--log-format",
        choices=worker.logs.FORMATS,
        default="text",
        help="text (default) or json: one JSON object a line with workflow id, device, node and "
        "phase where known (put it before the command: sickbay --log-format json worker)",
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for register in REGISTRARS:
        register(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
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
