"""`sickbay-dev twin fail|recover|faults|gpus|known-fault|api-fault|resize`: drive a running twin.

    sickbay-dev twin fail gpu-pool-node-0 0 --xid 79
    sickbay-dev twin fail gpu-pool-node-0 gpu-1 --degrade nvlink
    sickbay-dev twin fail gpu-pool-node-0 --vanish             # every GPU of the node
    sickbay-dev twin recover gpu-pool-node-0 [0]
    sickbay-dev twin faults | sickbay-dev twin gpus [NODE]
    sickbay-dev twin known-fault ignore-device-taint-rules on
    sickbay-dev twin api-fault add 429 --verb patch --resource pods --rate 0.5 [--count 3]
    sickbay-dev twin api-fault list | sickbay-dev twin api-fault clear [ID]
    sickbay-dev twin resize gpu-pool 3

They talk HTTP to the twin's `/twin/...` routes (twin/fault_routes.py). The twin is found
by `--url`, else `$SICKBAY_TWIN_URL`, else the state file `sickbay-dev twin up` writes; the bearer
token by `--token`, else `$SICKBAY_TWIN_TOKEN`.

twin/cli.py picks these commands up through `register_twin_commands` in
twin/faults.py, which calls `register_fault_commands(twin_subparsers)` here.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from typing import Any

import httpx

# Real seconds: the twin answers from memory, so anything slower means it is not running.
HTTP_TIMEOUT = 10.0


class CliError(Exception):
    pass


def _base_url(args: argparse.Namespace) -> str:
    url = getattr(args, "url", None) or os.environ.get("SICKBAY_TWIN_URL")
    if url:
        return str(url).rstrip("/")
    try:
        from twin.cli import state_dir

        state = json.loads((state_dir() / "twin.json").read_text())
        return str(state["url"]).rstrip("/")
    except (OSError, ValueError, KeyError, ImportError):
        raise CliError(
            "no running twin found: start one with `sickbay-dev twin up --detach`, "
            "or pass --url / set SICKBAY_TWIN_URL"
        ) from None


def _call(args: argparse.Namespace, method: str, path: str, body: Any = None) -> Any:
    headers = {"Accept": "application/json"}
    token = getattr(args, "token", None) or os.environ.get("SICKBAY_TWIN_TOKEN")
    if token:
        headers["Authorization"] = f"Bearer {token}"
    url = _base_url(args) + path
    try:
        response = httpx.request(method, url, json=body, headers=headers, timeout=HTTP_TIMEOUT)
    except httpx.HTTPError as err:
        raise CliError(f"cannot reach the twin at {url}: {err}") from None
    try:
        data = response.json()
    except ValueError:
        data = {"message": response.text}
    if response.status_code >= 400:
        message = data.get("message") if isinstance(data, dict) else None
        raise CliError(f"{response.status_code}: {message or response.text}")
    return data


def _print(data: Any) -> None:
    print(json.dumps(data, indent=2, sort_keys=True))


def cmd_fail(args: argparse.Namespace) -> int:
    body: dict[str, Any] = {"node": args.node, "driverTaint": args.driver_taint}
    if args.gpu is not None:
        body["gpu"] = args.gpu
    if args.xid is not None:
        body["xid"] = args.xid
    if args.degrade is not None:
        body["degrade"] = args.degrade
    if args.vanish:
        body["vanish"] = True
        body.setdefault("gpu", "all")
    if args.gpu is None and not args.vanish:
        raise CliError("name the GPU (index, UUID or device name), or use --vanish")
    data = _call(args, "POST", "/twin/faults", body)
    for fault in data.get("items", []):
        print(
            f"{fault['node']} GPU {fault['index']} ({fault['gpu_uuid']}): "
            + (f"Xid {fault['xid']}" if fault["kind"] == "xid" else fault["kind"])
            + (f" ({fault['degrade']}, Xid {fault['xid']})" if fault.get("degrade") else "")
            + f" -> {fault['health']}, {len(fault['devices'])} device(s)"
        )
    return 0


def cmd_recover(args: argparse.Namespace) -> int:
    body: dict[str, Any] = {"node": args.node}
    if args.gpu is not None:
        body["gpu"] = args.gpu
    data = _call(args, "POST", "/twin/faults/recover", body)
    items = data.get("items", [])
    for fault in items:
        print(f"{fault['node']} GPU {fault['index']} ({fault['gpu_uuid']}): recovered")
    if not items:
        print("no active fault matched")
    return 0


def cmd_faults(args: argparse.Namespace) -> int:
    _print(_call(args, "GET", "/twin/faults"))
    return 0


def cmd_gpus(args: argparse.Namespace) -> int:
    path = "/twin/gpus" + (f"?node={args.node}" if args.node else "")
    for gpu in _call(args, "GET", path).get("items", []):
        health = sorted({d["health"] for d in gpu["devices"]}) or ["-"]
        print(
            f"{gpu['node']}\t{gpu['index']}\t{gpu['uuid']}\t{gpu['model']}\t"
            f"{len(gpu['devices'])} device(s)\t{'/'.join(health)}"
        )
    return 0


_KNOWN = {
    "ignore-device-taint-rules": "ignoreDeviceTaintRules",
    "expired-toleration": "expiredTolerationBug",
}


def cmd_known_fault(args: argparse.Namespace) -> int:
    if args.name is None:
        _print(_call(args, "GET", "/twin/known-faults"))
        return 0
    if args.state is None:
        raise CliError("say on or off")
    _print(_call(args, "PUT", "/twin/known-faults", {_KNOWN[args.name]: args.state == "on"}))
    return 0


def cmd_api_fault(args: argparse.Namespace) -> int:
    if args.action == "list":
        _print(_call(args, "GET", "/twin/api-faults"))
    elif args.action == "clear":
        path = "/twin/api-faults" + (f"/{args.kind}" if args.kind else "")
        _print(_call(args, "DELETE", path))
    else:
        if not args.kind:
            raise CliError("api-fault add needs a kind: 500, 429, 409, timeout, reset or delay")
        body: dict[str, Any] = {
            "kind": args.kind,
            "verb": args.verb,
            "resource": args.resource,
            "rate": args.rate,
            "timeoutSeconds": args.timeout_seconds,
        }
        if args.count is not None:
            body["count"] = args.count
        if args.match:
            body["match"] = args.match
        _print(_call(args, "POST", "/twin/api-faults", body))
    return 0


def cmd_resize(args: argparse.Namespace) -> int:
    _print(_call(args, "POST", f"/twin/pools/{args.pool}/resize", {"size": args.size}))
    return 0


def _run(func: Any) -> Any:
    def wrapped(args: argparse.Namespace) -> int:
        try:
            return int(func(args))
        except CliError as err:
            print(f"sickbay-dev twin: {err}", file=sys.stderr)
            return 1

    return wrapped


def _common(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--url", default=None, help="twin URL (default: the running one)")
    parser.add_argument("--token", default=None, help="bearer token (env SICKBAY_TWIN_TOKEN)")


def register_fault_commands(twin_subparsers: Any) -> None:
    """Add the fault commands to `sickbay-dev twin`'s subparsers."""
    fail = twin_subparsers.add_parser("fail", help="break a GPU (all its MIG/vGPU devices)")
    fail.add_argument("node")
    fail.add_argument("gpu", nargs="?", default=None, help="GPU index, UUID or device name")
    kind = fail.add_mutually_exclusive_group(required=True)
    kind.add_argument("--xid", type=int, help="report this Xid (79: fell off the bus)")
    kind.add_argument("--degrade", choices=("nvlink", "ecc-sbe"), help="degraded, still usable")
    kind.add_argument("--vanish", action="store_true", help="the driver/plugin loses the GPU")
    fail.add_argument(
        "--driver-taint", action="store_true", help="the DRA driver also taints the devices"
    )
    _common(fail)
    fail.set_defaults(func=_run(cmd_fail))

    recover = twin_subparsers.add_parser("recover", help="repair a GPU (or every GPU of a node)")
    recover.add_argument("node")
    recover.add_argument("gpu", nargs="?", default=None)
    _common(recover)
    recover.set_defaults(func=_run(cmd_recover))

    faults = twin_subparsers.add_parser("faults", help="list active device faults")
    _common(faults)
    faults.set_defaults(func=_run(cmd_faults))

    gpus = twin_subparsers.add_parser("gpus", help="list physical GPUs and their health")
    gpus.add_argument("node", nargs="?", default=None)
    _common(gpus)
    gpus.set_defaults(func=_run(cmd_gpus))

    known = twin_subparsers.add_parser("known-fault", help="switch a known control-plane bug")
    known.add_argument("name", nargs="?", choices=sorted(_KNOWN), default=None)
    known.add_argument("state", nargs="?", choices=("on", "off"), default=None)
    _common(known)
    known.set_defaults(func=_run(cmd_known_fault))

    api = twin_subparsers.add_parser("api-fault", help="inject API errors (500/429/409/...)")
    api.add_argument("action", choices=("add", "list", "clear"))
    api.add_argument("kind", nargs="?", default=None, help="500|429|409|timeout|reset (clear: id)")
    api.add_argument("--verb", default="*")
    api.add_argument("--resource", default="*", help="plural, e.g. pods or pods/eviction")
    api.add_argument("--rate", type=float, default=1.0, help="probability per request (0-1)")
    api.add_argument("--count", type=int, default=None, help="stop after this many")
    api.add_argument(
        "--timeout-seconds", type=float, default=30.0, help="how long a timeout request hangs"
    )
    api.add_argument(
        "--match",
        default="",
        help="only requests whose decoded path+query contain this, e.g. spec.nodeName=node-1",
    )
    _common(api)
    api.set_defaults(func=_run(cmd_api_fault))

    resize = twin_subparsers.add_parser("resize", help="resize a node pool")
    resize.add_argument("pool")
    resize.add_argument("size", type=int)
    _common(resize)
    resize.set_defaults(func=_run(cmd_resize))
