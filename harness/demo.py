"""`sickbay-dev demo`, `sickbay-dev up` and `sickbay-dev down`: the embedded stack for a first look.

    sickbay-dev demo [--scenario NAME] [--keep] [--time-scale N]   # play a scenario, exit 0
    sickbay-dev demo --list                                         # what scenarios there are
    sickbay-dev up [--time-scale N]                                 # the same stack, by hand
    sickbay-dev down                                                # stop a stack left by --keep

`demo` starts the stack (harness/stack.py), plays one scenario (harness/scenarios.py) with a
progress line per step (elapsed time, phase), then prints each incident's timeline (the
workflow's `timeline` query / result), what reached the notification sink, the Web UI links
and a summary, and stops everything. With `--keep` the stack stays up afterwards and the demo
prints exactly how to stop it. `up` starts the same stack and keeps it running until Ctrl-C.

Exit codes: 0 the scenario did what it should; 1 a step failed (the message names it and
where the logs are); 2 the stack could not start; 130 interrupted.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import signal
import time
import traceback
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from harness.scenarios import (
    SCENARIOS,
    Demo,
    DemoFailure,
    Progress,
    format_timeline,
    ui_links,
)
from harness.stack import POOL, Stack, StackConfig, StackError
from worker.local_stack import default_state_dir, live_stack

DEMO_TIME_SCALE = 30.0  # the whole seed story in about a minute
UP_TIME_SCALE = 10.0  # by hand: a 5-minute Pending deadline becomes 30 s, time to look at it


def register(subparsers: argparse._SubParsersAction) -> None:
    demo = subparsers.add_parser(
        "demo",
        help="play a GPU incident end to end on an embedded stack (dev server + twin)",
        description="Start the Temporal dev server, the cluster twin, the worker and the "
        "webhook on loopback, play a scenario, print each incident's timeline, stop everything.",
    )
    demo.add_argument(
        "--scenario",
        choices=sorted(SCENARIOS),
        default="seed",
        help="what to play (default: seed, the four-act seed incident); --list describes them",
    )
    demo.add_argument(
        "--keep",
        action="store_true",
        help="leave the stack running afterwards (prints how to stop it)",
    )
    demo.add_argument(
        "--time-scale",
        type=_positive,
        default=DEMO_TIME_SCALE,
        help=f"twin speed-up; the demo runbooks' durations are divided by it too "
        f"(default {DEMO_TIME_SCALE:g})",
    )
    demo.add_argument("--list", action="store_true", help="list the scenarios and exit")
    demo.set_defaults(func=cmd_demo)

    up = subparsers.add_parser(
        "up",
        help="start the embedded stack and keep it running (Ctrl-C stops all of it)",
        description="The demo's stack, for exploring by hand: Web UI, `sickbay` CLI, "
        "`sickbay-dev twin fail ...`.",
    )
    up.add_argument(
        "--time-scale",
        type=_positive,
        default=UP_TIME_SCALE,
        help=f"twin speed-up and runbook divisor (default {UP_TIME_SCALE:g})",
    )
    up.add_argument(
        "--topology",
        choices=("full", "mig", "vgpu", "timeslice"),
        default="full",
        help="devices per physical GPU on the twin's node (default full)",
    )
    up.set_defaults(func=cmd_up)

    down = subparsers.add_parser(
        "down", help="stop an embedded stack left running by `sickbay-dev demo --keep`"
    )
    down.add_argument(
        "--state-dir",
        type=Path,
        default=None,
        help="the stack's directory (default: the one `sickbay-dev up` / `demo --keep` used)",
    )
    down.set_defaults(func=cmd_down)


def _positive(text: str) -> float:
    value = float(text)
    if not 0 < value <= 600:
        raise argparse.ArgumentTypeError("must be > 0 and <= 600")
    return value


def _busy(state_dir: Path) -> str | None:
    """Why the state directory cannot host a stack now, or None."""
    if live_stack(state_dir):
        return f"a stack is already running from {state_dir}: stop it with `sickbay-dev down` first"
    try:
        pid = int(json.loads((state_dir / "twin.json").read_text())["pid"])
        os.kill(pid, 0)
    except (OSError, ValueError, KeyError, TypeError):
        return None
    return (
        f"a cluster twin (pid {pid}) already runs from {state_dir}: stop it with "
        "`sickbay-dev twin down`, or set SICKBAY_STATE_DIR to another directory"
    )


@contextlib.contextmanager
def _sigterm_as_interrupt() -> Iterator[None]:
    """SIGTERM stops the demo like Ctrl-C does (clean shutdown of every child)."""

    def raise_interrupt(signum: int, frame: Any) -> None:
        raise KeyboardInterrupt

    previous = signal.signal(signal.SIGTERM, raise_interrupt)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def _print_stack(say: Progress, stack: Stack) -> None:
    info = stack.info
    assert info is not None
    say(
        f"Temporal dev server {info.temporal_address}"
        + (f", Web UI {info.ui_url}" if info.ui_url else "")
    )
    say(
        f"cluster twin: Kubernetes 1.36 with DeviceTaintRule at {info.kube_url}, node {info.node} "
        f"with {len(info.gpus)} GPUs in pool {POOL}, {info.time_scale:g}x faster than real time"
    )
    say(
        f"twin cloud API (GKE-shaped) {info.cloud_url}: pool {POOL} may grow to {stack.config.pool_max} nodes"
    )
    say(f"worker (pid {info.pids.get('worker')}) and webhook {info.webhook_url}")
    say(f"notification sink {info.sink_url} (escalations land here: {info.notifications})")
    say(f"{len(info.pids)} processes in process group {info.pgid}; logs in {info.state_dir}/logs")


def _print_runbooks(write: Callable[[str], None], stack: Stack) -> None:
    info = stack.info
    assert info is not None
    write(
        f"Demo runbooks ({info.runbooks_dir}): the shipped runbooks, with these changes so the "
        f"workflow's real-time timers keep pace with the {info.time_scale:g}x twin:"
    )
    for line in info.runbook_changes:
        write(f"  - {line}")


def cmd_demo(args: argparse.Namespace) -> int:
    if args.list:
        for s in SCENARIOS.values():
            print(f"{s.name:<10} {s.title}")
        return 0
    scenario = SCENARIOS[args.scenario]
    write = _printer()
    say = Progress(write)
    write(
        f"sickbay-dev demo --scenario {scenario.name}: {scenario.title} "
        f"(twin time x{args.time_scale:g})"
    )
    state_dir = default_state_dir() if args.keep else None
    busy = _busy(state_dir) if state_dir is not None else None
    if busy:
        write(busy)
        return 2
    stack = Stack(
        StackConfig(
            time_scale=args.time_scale,
            keep=args.keep,
            topology=scenario.topology,
            profile=scenario.profile,
            watch=scenario.watch,
            repair=scenario.repair,
            cloud=scenario.cloud,
            nodes=scenario.nodes,
            pool_max=max(2, scenario.nodes),
            state_dir=state_dir,
            notes=lambda text: say(text, tag="stack"),
        )
    )
    code = 0
    with _sigterm_as_interrupt():
        try:
            say(
                "starting: Temporal dev server, notification sink, cluster twin, worker, webhook",
                tag="stack",
            )
            started = time.monotonic()
            try:
                stack.start()
            except StackError as err:
                code = 2
                write(f"\nthe stack did not start: {err}")
                write(f"logs of every process: {stack.dir}/logs/ (kept)")
                return code
            say(f"up in {time.monotonic() - started:.1f} s", tag="stack")
            _print_stack(say, stack)
            _print_runbooks(write, stack)
            code = asyncio.run(_play(stack, scenario.name, say, write))
        except KeyboardInterrupt:
            code = 130
            write("\ninterrupted")
            return code
        finally:
            if args.keep and code == 0 and stack.info is not None:
                stack.detach()
                _print_keep(write, stack)
            else:
                say("stopping the stack", tag="stack")
                stack.stop(keep_files=code not in (0, 130))
                say("stopped: nothing left running", tag="stack")
    write(f"\nwall time {say.elapsed():.1f} s")
    return code


async def _play(stack: Stack, name: str, say: Progress, write: Callable[[str], None]) -> int:
    demo = await Demo.open(stack, say)
    scenario = SCENARIOS[name]
    code = 0
    try:
        try:
            await scenario.run(demo)
        except (DemoFailure, StackError) as err:
            code = 1
            write(f"\nFAILED: {err}")
            assert stack.info is not None
            write(f"logs of every process: {stack.info.state_dir}/logs/ (kept)")
        except Exception:  # a bug in a scenario or a piece: say so, still report and stop
            code = 1
            write("\nFAILED with an unexpected error:\n" + traceback.format_exc())
        await demo.settle()
        await _report(demo, write)
    finally:
        await demo.close()
    if code == 0:
        write(f"\nscenario {name}: all {len(demo.checks)} checks passed")
    return code


async def _report(demo: Demo, write: Callable[[str], None]) -> None:
    for incident in demo.incidents:
        try:
            entries = await demo.timeline(incident)
        except Exception as err:
            write(f"\n{incident.workflow_id}: timeline unavailable ({err})")
            continue
        outcome = incident.result.outcome if incident.result else "still running"
        write(f"\nTimeline of {incident.workflow_id} - {incident.title} ({outcome}):")
        for line in format_timeline(entries):
            write("  " + line)
    notes = await demo.notifications()
    if notes:
        write(f"\nNotifications received by the sink ({len(notes)}):")
        for n in notes:
            body = n["body"] if isinstance(n["body"], dict) else {}
            summary = (body.get("payload") or {}).get("summary") or body.get("text") or ""
            action = body.get("event_action", "")
            write(f"  {n['kind']} {action} {summary[:120]}".rstrip())
    links = ui_links(demo.stack, demo.incidents)
    if links:
        write("\nTemporal Web UI:")
        for link in links:
            write("  " + link)
    if demo.checks:
        write("\nSummary:")
        for check in demo.checks:
            write(f"  ok  {check}")


def _printer() -> Callable[[str], None]:
    def write(text: str) -> None:
        print(text, flush=True)

    return write


def _print_keep(write: Callable[[str], None], stack: Stack) -> None:
    info = stack.info
    assert info is not None
    write("\nThe stack keeps running (--keep):")
    _print_use(write, stack)
    write("Stop all of it with:")
    write("  sickbay-dev down")
    write(f"  (or: kill -TERM -- -{info.pgid}   # the stack's process group)")


def _print_use(write: Callable[[str], None], stack: Stack) -> None:
    info = stack.info
    assert info is not None
    env = stack.sickbay_env()
    if info.ui_url:
        write(f"  Web UI        {info.ui_url}/namespaces/{info.namespace}/workflows")
    write("  environment for the sickbay CLI and kubectl:")
    for key in (
        "SICKBAY_TEMPORAL_ADDRESS",
        "KUBECONFIG",
        "SICKBAY_TWIN_URL",
        "SICKBAY_RUNBOOKS_DIR",
    ):
        write(f"    export {key}={env[key]}")
    gpus = ", ".join(f"{i} ({u})" for i, u in enumerate(info.gpus))
    write(f"  GPUs of {info.node}: {gpus}")
    gpu0 = f"{info.node}/{info.gpus[0]}" if info.gpus else f"{info.node}/<GPU uuid>"
    write(f"  break one:    sickbay-dev twin fail {info.node} 0 --xid 79")
    write("  watch it:     sickbay status    |    sickbay timeline " + gpu0)
    write(f"  repair it:    sickbay-dev twin recover {info.node} 0 && sickbay repaired {gpu0}")
    write(f"  more faults:  sickbay-dev twin fail {info.node} 1 --xid 13   (the program's fault)")
    write("                sickbay-dev twin known-fault ignore-device-taint-rules on")
    write(f"  logs:         {info.state_dir}/logs/   notifications: {info.notifications}")


def cmd_up(args: argparse.Namespace) -> int:
    write = _printer()
    say = Progress(write)
    state_dir = default_state_dir()
    busy = _busy(state_dir)
    if busy:
        write(busy)
        return 2
    stack = Stack(
        StackConfig(
            time_scale=args.time_scale,
            topology=args.topology,
            state_dir=state_dir,
            sweep=True,
            notes=lambda text: say(text, tag="stack"),
        )
    )
    with _sigterm_as_interrupt():
        try:
            say(
                "starting: Temporal dev server, notification sink, cluster twin, worker, webhook",
                tag="stack",
            )
            try:
                stack.start()
            except StackError as err:
                write(f"\nthe stack did not start: {err}")
                stack.stop()
                return 2
            _print_stack(say, stack)
            _print_runbooks(write, stack)
            write("\nThe stack is up. Explore it:")
            _print_use(write, stack)
            write("Ctrl-C stops all of it.")
            while True:
                stack.check_alive()
                time.sleep(0.5)
        except StackError as err:
            write(f"\n{err}\nstopping everything")
            stack.stop()
            return 1
        except KeyboardInterrupt:
            write("\nstopping everything")
            stack.stop()
            write("stopped: nothing left running")
            return 0


def cmd_down(args: argparse.Namespace) -> int:
    state_dir = args.state_dir or default_state_dir()
    info = live_stack(state_dir)
    if info is None:
        print(f"no running stack recorded in {state_dir}")
        return 1
    pgid = int(info["pgid"])
    with contextlib.suppress(ProcessLookupError):
        os.killpg(pgid, signal.SIGTERM)
    deadline = time.monotonic() + 15  # the worker's graceful shutdown is 5 s
    while time.monotonic() < deadline:
        try:
            os.killpg(pgid, 0)
        except ProcessLookupError:
            break
        time.sleep(0.2)
    else:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(pgid, signal.SIGKILL)
    with contextlib.suppress(OSError):
        (state_dir / "stack.json").unlink()
    print(f"stopped the stack (process group {pgid})")
    return 0
