"""`sickbay-dev twin up|down`: run the cluster twin in the foreground or in the background.

    sickbay-dev twin up --profile 1.36 --nodes 2 --gpus-per-node 2 [--port N] [--kubeconfig PATH]
                   [--token T] [--no-device-taint-rules] [--seed FILE] [--topology mig]
                   [--detach]
    sickbay-dev twin down

`up` serves on 127.0.0.1 until interrupted (Ctrl-C / SIGTERM), writes a kubeconfig (default
<state dir>/kubeconfig, path printed) and a state file (<state dir>/twin.json: pid, url,
kubeconfig). `--detach` starts the same command in the background, waits until it answers
/twin/healthz and returns; `down` stops it. The state directory is $SICKBAY_STATE_DIR or
~/.sickbay.

Other twin modules extend the command through these hooks:
- `add_twin_up_arguments(parser)`: flags of `twin up` (controllers: --time-scale,
  --alert-webhook...; cloudapi: the cloud API's flags);
- `register_twin_commands(twin_subparsers)`: `twin <command>` subcommands (faults: fail, recover...);
- `make_clock(args)`: the clock the Twin runs on (controllers);
- `configure_twin(twin, args)`: called after seeding, before start (controllers, cloud API).
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import signal
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path
from typing import Any

from twin import cloudapi, faults
from twin.controllers import manager as controllers
from twin.discovery import PROFILES
from twin.seed import TOPOLOGIES

log = logging.getLogger(__name__)

DETACH_READY_TIMEOUT = 30.0  # seconds to wait for a detached twin to answer /twin/healthz
# The dev tools' entry point (`sickbay-dev`, harness/cli.py), which `--detach` starts again in
# the background: run by name, never imported (the twin imports nothing of the harness).
ENTRY_MODULE = "harness.cli"


def state_dir() -> Path:
    return Path(os.environ.get("SICKBAY_STATE_DIR") or Path.home() / ".sickbay")


def register(subparsers: Any) -> None:
    twin = subparsers.add_parser("twin", help="run the Kubernetes cluster twin")
    twin_sub = twin.add_subparsers(dest="twin_command", metavar="TWIN_COMMAND")
    up = twin_sub.add_parser("up", help="start the twin (foreground unless --detach)")
    up.add_argument(
        "--profile", choices=PROFILES, default="1.36", help="Kubernetes release to act as"
    )
    up.add_argument("--nodes", type=int, default=2, help="GPU nodes to seed")
    up.add_argument("--gpus-per-node", type=int, default=2, help="GPUs per node")
    up.add_argument(
        "--pool", default="gpu-pool", help="node-pool name (label sickbay.dev/node-pool)"
    )
    up.add_argument(
        "--product", default=None, help="GPU product name (default NVIDIA H100 80GB HBM3)"
    )
    up.add_argument(
        "--topology", choices=TOPOLOGIES, default="full", help="devices per physical GPU"
    )
    up.add_argument(
        "--slices-per-gpu", type=int, default=2, help="MIG/vGPU/time-slice devices per GPU"
    )
    up.add_argument("--seed", type=Path, default=None, help="YAML cluster description (pools)")
    up.add_argument(
        "--namespace",
        action="append",
        default=[],
        help="also create this namespace (repeatable), e.g. Sickbay's own: sickbay",
    )
    up.add_argument("--port", type=int, default=0, help="port on 127.0.0.1 (default: a free one)")
    up.add_argument("--kubeconfig", type=Path, default=None, help="where to write the kubeconfig")
    up.add_argument(
        "--token",
        default=os.environ.get("SICKBAY_TWIN_TOKEN"),
        help="require this bearer token (env SICKBAY_TWIN_TOKEN)",
    )
    up.add_argument(
        "--no-device-taint-rules",
        action="store_true",
        help="serve 1.35/1.36 as shipped: no DeviceTaintRule",
    )
    up.add_argument(
        "--detach",
        action="store_true",
        help="run in the background; stop with `sickbay-dev twin down`",
    )
    up.add_argument(
        "-v", "--verbose", action="store_true", help="log requests and controller activity"
    )
    up.set_defaults(func=cmd_up)
    down = twin_sub.add_parser("down", help="stop a twin started with --detach")
    down.set_defaults(func=cmd_down)
    status = twin_sub.add_parser("status", help="show the running twin (state file + health)")
    status.set_defaults(func=cmd_status)
    twin.set_defaults(func=lambda args: (twin.print_help(), 2)[1])
    controllers.add_twin_up_arguments(up)
    faults.register_twin_commands(twin_sub)
    cloudapi.add_twin_up_arguments(up)


def _state_file() -> Path:
    return state_dir() / "twin.json"


def _health(url: str, timeout: float = 2.0) -> dict[str, Any] | None:
    try:
        with urllib.request.urlopen(url + "/twin/healthz", timeout=timeout) as resp:
            return json.loads(resp.read())
    except (OSError, ValueError):
        return None


def build_twin(args: argparse.Namespace) -> Any:
    from twin.runtime import Twin

    clock = controllers.make_clock(args)
    twin = Twin(
        profile=args.profile,
        device_taint_rules=not args.no_device_taint_rules,
        token=args.token,
        clock=clock,
        port=args.port,
    )
    if args.seed is not None:
        twin.seed_file(args.seed)
    else:
        kwargs: dict[str, Any] = {
            "nodes": args.nodes,
            "gpus_per_node": args.gpus_per_node,
            "pool": args.pool,
            "topology": args.topology,
            "slices_per_gpu": args.slices_per_gpu,
        }
        if args.product:
            kwargs["product"] = args.product
        twin.seed(**kwargs)
    for namespace in getattr(args, "namespace", None) or []:
        if twin.store.try_get("namespaces", namespace) is None:
            twin.store.create("namespaces", {"metadata": {"name": namespace}})
    controllers.configure_twin(twin, args)
    cloudapi.configure_twin(twin, args)
    return twin


def cmd_up(args: argparse.Namespace) -> int:
    logging.basicConfig(
        level=logging.DEBUG if args.verbose else logging.INFO,
        format="%(asctime)s %(name)s %(message)s",
    )
    if args.detach:
        return _detach(args)
    kubeconfig = args.kubeconfig or state_dir() / "kubeconfig"
    try:
        twin = build_twin(args)
    except (ValueError, OSError) as exc:
        print(f"sickbay-dev twin up: {exc}", file=sys.stderr)
        return 2
    try:
        twin.start()
    except (OSError, RuntimeError) as exc:  # a port in use, a controller that cannot start
        twin.stop()
        print(f"sickbay-dev twin up: {exc}", file=sys.stderr)
        return 2
    twin.write_kubeconfig(kubeconfig)
    state = {
        "pid": os.getpid(),
        "url": twin.url,
        "kubeconfig": str(kubeconfig),
        "profile": args.profile,
    }
    _state_file().parent.mkdir(parents=True, exist_ok=True)
    _state_file().write_text(json.dumps(state))
    print(f"twin (Kubernetes {args.profile}) serving {twin.url}", flush=True)
    print(f"kubeconfig: {kubeconfig}", flush=True)
    print(f"export KUBECONFIG={kubeconfig}", flush=True)
    done = threading.Event()

    def _stop(signum: int, frame: Any) -> None:
        done.set()

    signal.signal(signal.SIGTERM, _stop)
    signal.signal(signal.SIGINT, _stop)
    try:
        while not done.wait(1.0):
            pass
    finally:
        twin.stop()
        try:
            if json.loads(_state_file().read_text()).get("pid") == os.getpid():
                _state_file().unlink()
        except (OSError, ValueError):
            pass
    return 0


def _detach(args: argparse.Namespace) -> int:
    argv = [a for a in sys.argv[1:] if a != "--detach"]
    if not argv or argv[0] != "twin":
        argv = ["twin", "up"] + [a for a in argv if a not in ("twin", "up")]
    log_path = state_dir() / "twin.log"
    log_path.parent.mkdir(parents=True, exist_ok=True)
    old = _read_state()
    with open(log_path, "ab") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", ENTRY_MODULE, *argv],
            stdout=out,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
        )
    deadline = time.monotonic() + DETACH_READY_TIMEOUT
    while time.monotonic() < deadline:
        state = _read_state()
        if state and state.get("pid") == proc.pid and state != old and _health(state["url"]):
            print(f"twin serving {state['url']} (pid {proc.pid})")
            print(f"kubeconfig: {state['kubeconfig']}")
            return 0
        if proc.poll() is not None:
            print(
                f"sickbay-dev twin up: the twin exited (code {proc.returncode}); see {log_path}",
                file=sys.stderr,
            )
            return 1
        time.sleep(0.2)
    print(
        f"sickbay-dev twin up: no answer within {DETACH_READY_TIMEOUT:.0f} s; see {log_path}",
        file=sys.stderr,
    )
    return 1


def _read_state() -> dict[str, Any] | None:
    try:
        return json.loads(_state_file().read_text())
    except (OSError, ValueError):
        return None


def cmd_down(args: argparse.Namespace) -> int:
    state = _read_state()
    if not state:
        print("no twin is running (no state file)", file=sys.stderr)
        return 1
    pid = int(state["pid"])
    try:
        os.kill(pid, signal.SIGTERM)
    except ProcessLookupError:
        _state_file().unlink(missing_ok=True)
        print(f"twin pid {pid} was not running; state cleared")
        return 0
    deadline = time.monotonic() + 10  # seconds; shutdown stops watches within ~1 s
    while time.monotonic() < deadline:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            break
        time.sleep(0.1)
    _state_file().unlink(missing_ok=True)
    print(f"twin pid {pid} stopped")
    return 0


def cmd_status(args: argparse.Namespace) -> int:
    state = _read_state()
    if not state:
        print("no twin is running")
        return 1
    health = _health(state["url"])
    print(json.dumps({**state, "health": health}, indent=2))
    return 0 if health else 1
