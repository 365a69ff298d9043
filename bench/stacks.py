"""The embedded stack each benchmark runs on: harness/stack.py's Stack, unchanged.

`open_stack()` starts the dev server, sink, twin, `sickbay worker` and `sickbay webhook` as
child processes on free loopback ports (no Web UI) and returns the Stack; `webhook_token()`
reads the bearer token the stack wrote. SICKBAY_BENCH_WORKER may name a worker script to run
instead of `sickbay worker` (only while the worker process is being built).
"""

from __future__ import annotations

import compileall
import logging
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench.common import ROOT, set_budget
from harness.stack import Stack, StackConfig, free_port

log = logging.getLogger("bench")


def worker_argv() -> list[str]:
    override = os.environ.get("SICKBAY_BENCH_WORKER")
    return [override] if override else ["-m", "worker.cli", "worker"]


def open_stack(**overrides: Any) -> Stack:
    # Installed images carry bytecode (pip compiles at install); a checkout run with
    # PYTHONDONTWRITEBYTECODE=1 has none, and a sandboxed workflow module is then compiled
    # again for every workflow instance the worker creates (~8 ms of CPU each). Compile the
    # project once, as an install would, so every benchmark measures the installed shape.
    for package in ("workflows", "activities", "worker"):
        compileall.compile_dir(ROOT / package, quiet=1)
    config = StackConfig(
        temporal_port=free_port(),
        ui=False,
        worker_argv=worker_argv(),
        notes=lambda text: log.info("stack: %s", text),
        **overrides,
    )
    stack = Stack(config)
    stack.__enter__()
    return stack


def webhook_token(stack: Stack) -> str:
    return (Path(stack.dir) / "secrets" / "webhook-token").read_text().strip()


def worker_pid(stack: Stack) -> int:
    assert stack.info is not None
    return stack.info.pids["worker"]


@dataclass
class Consumers:
    """A stack's Deployment of GPU consumers, running: `targets` is each replica's GPU (the
    twin's /twin/gpus item), `client` a Temporal client, `demo` the scenario helper."""

    client: Any
    demo: Any
    token: str
    targets: list[dict[str, Any]]


async def run_consumers(
    stack: Stack, ns: str, replicas: int, budget: tuple[str, str] = ("100%", "100%")
) -> Consumers:
    """Set every runbook's budget (per pool, per cluster), then run a Deployment of `replicas`
    in namespace `ns`, each replica holding one GPU through a ResourceClaim, until all run."""
    from harness.scenarios import Demo, Progress
    from worker.settings import Settings
    from worker.temporal import connect

    info = stack.info
    assert info is not None
    set_budget(info.runbooks_dir, *budget)
    client = await connect(
        Settings(temporal_address=info.temporal_address, temporal_namespace=info.namespace)
    )
    demo = await Demo.open(stack, Progress(lambda line: log.info("%s", line)))
    await demo.namespace(ns)
    await demo.deployment(ns, "serve", replicas=replicas)
    running = await demo.running(ns, "serve", replicas)
    targets = [await demo.gpu(device) for _pod, device in running]
    return Consumers(client, demo, webhook_token(stack), targets)
