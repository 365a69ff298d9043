"""`sickbay gpus`: the GPU ledger (lemons) from the command line.

- `sickbay gpus [--since 7d] [--json]`: retired GPUs and GPUs repaired within `--since`, with
  their counts (failures in the lemons window, failures kept, repairs) and history (`--json`);
- `sickbay gpus unretire <GPU-uuid> --reason ... [--actor ...] [--via URL]`: un-retire a lemon.
  The reason is required; the ledger records it with the actor, verified (`--via`: the actions
  endpoint checked your Kubernetes credentials) or as a claim beside the Temporal client
  identity the server saw (unverified: refused when the GPU's runbook requires verified
  actors), and tells the remediation holding the GPU, which then releases it normally.

Talks to the cluster's `sickbay-gpu-ledger` workflow (`contract.names.ledger_workflow_id`)
through typed handles. Exit codes: 0 ok, 1 failed / refused, 2 bad arguments.
"""

from __future__ import annotations

import argparse
import getpass
import sys
from typing import Any

from temporalio.client import WorkflowHandle

from contract.base import parse_duration
from contract.ledger import GpuSummary, LedgerQuery, UnretireRequest, UnretireResult
from contract.names import UPD_LEDGER_UNRETIRE, ledger_workflow_id
from worker.commands import (
    _add_connection,
    _add_via,
    _client,
    _nonempty,
    _out,
    _run,
    _settings,
    _via,
)
from worker.terminal import safe
from workflows.ledger import GpuLedgerWorkflow, describe

LedgerHandle = WorkflowHandle[GpuLedgerWorkflow, None]


def _handle(client: Any, args: argparse.Namespace) -> tuple[LedgerHandle, str]:
    settings = _settings(args)
    wf_id = ledger_workflow_id(settings.task_queue, settings.cluster)
    return client.get_workflow_handle_for(GpuLedgerWorkflow.run, wf_id), wf_id


def _since(text: str) -> Any:
    value = parse_duration(text)
    if isinstance(value, str):
        raise argparse.ArgumentTypeError(f"expected a duration such as 7d or 12h, got {text!r}")
    return value


def _row(g: GpuSummary) -> dict[str, str]:
    return {
        "GPU": safe(g.gpu_uuid),
        "NODE": safe(g.node or "-"),
        "STATE": "retired" if g.retired else "repaired",
        "FAILURES (WINDOW)": str(g.failures_in_window),
        "FAILURES (KEPT)": str(g.failures_total),
        "REPAIRS": str(g.repairs),
        "LAST FAILURE (UTC)": g.last_failure.strftime("%Y-%m-%d %H:%M") if g.last_failure else "-",
        "RETIRED (UTC)": g.retired_at.strftime("%Y-%m-%d %H:%M") if g.retired_at else "-",
    }


def _table(rows: list[dict[str, str]]) -> str:
    widths = {k: max(len(k), *(len(r[k]) for r in rows)) for k in rows[0]}
    lines = ["  ".join(k.ljust(widths[k]) for k in widths).rstrip()]
    lines += ["  ".join(r[k].ljust(widths[k]) for k in widths).rstrip() for r in rows]
    return "\n".join(lines)


async def _list(args: argparse.Namespace) -> int:
    from temporalio.service import RPCError, RPCStatusCode

    client = await _client(args)
    handle, wf_id = _handle(client, args)
    try:
        report = await handle.query(GpuLedgerWorkflow.gpus, LedgerQuery(since=args.since))
    except RPCError as exc:
        if exc.status != RPCStatusCode.NOT_FOUND:
            raise
        _out(
            args,
            {"ledger": wf_id, "gpus": [], "tracked": 0},
            f"no GPU ledger {wf_id} yet: no failure has been recorded",
        )
        return 0
    payload = {"ledger": wf_id, **report.model_dump(mode="json")}
    if not report.gpus:
        text = f"no retired GPU, none repaired within {args.since} ({report.tracked} tracked)"
    else:
        text = _table([_row(g) for g in report.gpus])
        retired = [g for g in report.gpus if g.retired]
        for g in retired:
            text += f"\n\n{g.gpu_uuid} (retired: {g.retired_reason}):\n  " + "\n  ".join(
                describe(e) for e in g.history
            )
    _out(args, payload, text)
    return 0


async def _unretire(args: argparse.Namespace) -> int:
    from temporalio.client import WorkflowUpdateFailedError
    from temporalio.service import RPCError, RPCStatusCode

    via = _via(args)
    if via is not None:  # the verified path: the cluster says who you are
        import asyncio

        from worker.actions_cli import send

        body = {"action": "unretire", "target": args.gpu_uuid, "reason": args.reason}
        return await asyncio.to_thread(send, _settings(args), via, body)
    actor = args.actor or getpass.getuser()
    client = await _client(args)
    handle, wf_id = _handle(client, args)
    try:
        # By name: the SDK's typed overloads read an async handler's result as a coroutine.
        result = await handle.execute_update(
            UPD_LEDGER_UNRETIRE,
            UnretireRequest(gpu_uuid=args.gpu_uuid, reason=args.reason, actor=actor),
            result_type=UnretireResult,
        )
    except WorkflowUpdateFailedError as exc:
        print(f"refused: {exc.cause}", file=sys.stderr)
        return 1
    except RPCError as exc:
        if exc.status == RPCStatusCode.NOT_FOUND:
            print(f"error: no GPU ledger {wf_id}: nothing is retired", file=sys.stderr)
            return 1
        raise
    told = f"; {result.holder} told to release it normally" if result.holder else ""
    _out(
        args,
        result.model_dump(mode="json"),
        f"{args.gpu_uuid} un-retired by {actor} (unverified: without --via the actor is a "
        f"claim){told}",
    )
    return 0


def cmd_gpus(args: argparse.Namespace) -> int:
    if getattr(args, "gpus_command", None) == "unretire":
        return _run(_unretire(args))
    return _run(_list(args))


def register(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    p = sub.add_parser("gpus", help="retired (lemon) and recently repaired GPUs; unretire")
    _add_connection(p)
    p.add_argument(
        "--since",
        type=_since,
        default=parse_duration("7d"),
        help="list GPUs repaired within this long (default 7d); retired ones are always listed",
    )
    p.set_defaults(func=cmd_gpus)
    gsub = p.add_subparsers(dest="gpus_command", metavar="ACTION")
    u = gsub.add_parser("unretire", help="un-retire a lemon GPU (reason required, recorded)")
    _add_connection(u)
    u.add_argument("gpu_uuid", type=_nonempty, help="the GPU UUID (GPU-...)")
    u.add_argument("--reason", type=_nonempty, required=True, help="why (recorded)")
    u.add_argument("--actor", type=_nonempty, help="who (default: your login; recorded)")
    _add_via(u)
    u.set_defaults(func=cmd_gpus)
