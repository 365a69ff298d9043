"""`sickbay` command line: one dispatcher, subcommands registered by their owners.

Each module in `_REGISTRARS` exposes `register(subparsers)`, adding its subcommands with
`set_defaults(func=...)`; `func(args)` returns the exit code. Modules are imported lazily so a
broken optional piece names itself instead of breaking every command.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Sequence

# (module, what it provides) — the module must define register(subparsers).
_REGISTRARS: tuple[tuple[str, str], ...] = (
    ("worker.commands", "worker, launch, status, timeline, approve, abort, repaired, runbooks"),
    ("worker.webhook_cli", "webhook, schedule"),
    ("worker.doctor", "doctor"),
    ("simulator.cli", "sim up/down/fail/recover"),
    ("worker.demo", "demo, up"),
)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="sickbay",
        description="Remediate failed GPUs in Kubernetes clusters as durable Temporal workflows.",
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for module_name, _ in _REGISTRARS:
        try:
            module = importlib.import_module(module_name)
        except ModuleNotFoundError as exc:
            if exc.name == module_name:
                continue  # not built yet
            raise
        module.register(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    func = getattr(args, "func", None)
    if func is None:
        parser.print_help()
        return 2
    return int(func(args) or 0)


if __name__ == "__main__":
    sys.exit(main())
