"""`sickbay pause` / `sickbay resume`: stop every new remediation step of a cluster at once.

- `sickbay pause --reason ... [--actor ...] [--cluster NAME | --all-clusters]`: the cluster's
  `sickbay-budget` workflow refuses every new lease from now on: new incidents are recorded,
  confirmed and shown but nothing is quarantined, and open remediations start no new eviction
  force, scale-up or node-level repair rung (docs/architecture.md, "Pause").
- `sickbay resume [--reason ...] [--actor ...] [--cluster NAME | --all-clusters]`: lifts it and
  wakes every held remediation at once.
- `sickbay status` shows `PAUSED since ... by ... (reason)` at the top (`pause_banner`).

The pause goes to the budget workflow by update-with-start (a cluster with no budget workflow
yet gets one, paused), so it holds even before the first incident. `--all-clusters` pauses
every cluster whose budget workflow runs on this Temporal namespace (found through
visibility). Straight through Temporal the actor is the one the sender claims (default: the
login), recorded *unverified*; with `--via URL` (or SICKBAY_ACTIONS_URL) the pause goes through
the webhook's actions endpoint, which checks the person's Kubernetes credentials and RBAC (verbs
`pause` / `resume` on `remediations.sickbay.dev`, name: the budget workflow id) and the budget
records the pauser as a *verified* actor.
Exit codes: 0 ok, 1 failed / refused, 2 bad arguments.
"""

from __future__ import annotations

import argparse
import getpass
import sys
from typing import Any

from activities.update_with_start import UpdateSender
from contract.budget import BudgetState, PauseAnswer, PauseRequest, ResumeRequest
from contract.names import (
    QRY_BUDGET_STATE,
    UPD_BUDGET_PAUSE,
    UPD_BUDGET_RESUME,
    WF_BUDGET,
    budget_task_queue,
    budget_workflow_id,
)
from worker.commands import (
    _add_connection,
    _add_via,
    _client,
    _cluster,
    _nonempty,
    _run,
    _settings,
    _via,
)
from worker.terminal import safe

FLEET = "fleet"  # the actions endpoint's target for every cluster (worker/webhook/actions.py)
RUNNING_BUDGETS = f"WorkflowType = '{WF_BUDGET}' AND ExecutionStatus = 'Running'"


async def _targets(client: Any, args: argparse.Namespace) -> tuple[list[str], str]:
    """The budget workflow ids to act on, and the remediation task queue."""
    import asyncio

    if args.all_clusters:
        settings, _ = await asyncio.to_thread(
            _cluster, args, args.command, acting=False, fallback="--all-clusters"
        )
        ids = sorted({wf.id async for wf in client.list_workflows(RUNNING_BUDGETS)})
        return ids, settings.task_queue
    settings, _ = await asyncio.to_thread(_cluster, args, args.command, acting=True)
    return [budget_workflow_id(settings.task_queue, settings.cluster)], settings.task_queue


async def _pause_or_resume(args: argparse.Namespace) -> int:
    if args.all_clusters and args.cluster is not None:
        print("error: --cluster and --all-clusters exclude each other", file=sys.stderr)
        return 2
    via = _via(args)
    if via is not None:  # the verified path: the cluster says who you are
        import asyncio

        from worker.actions_cli import send

        target = FLEET
        if not args.all_clusters:
            settings, _ = await asyncio.to_thread(_cluster, args, args.command, acting=True)
            target = budget_workflow_id(settings.task_queue, settings.cluster)
        body = {"action": args.command, "target": target, "reason": args.reason or ""}
        return await asyncio.to_thread(send, _settings(args), via, body)
    actor = args.actor or getpass.getuser()
    client = await _client(args)
    ids, queue = await _targets(client, args)
    if not ids:
        print(
            "error: no cluster's budget workflow runs on this namespace (no remediation yet); "
            "pause one cluster with --cluster NAME",
            file=sys.stderr,
        )
        return 1
    request: PauseRequest | ResumeRequest
    if args.command == "pause":
        request, update = PauseRequest(reason=args.reason, actor=actor), UPD_BUDGET_PAUSE
    else:
        request, update = ResumeRequest(reason=args.reason or "", actor=actor), UPD_BUDGET_RESUME
    for wf_id in ids:
        sender = UpdateSender(
            client,
            WF_BUDGET,
            BudgetState(),
            workflow_id=wf_id,
            task_queue=budget_task_queue(queue),
            what="budget",
        )
        answer = await sender.send(update, request, PauseAnswer)
        held = f"; {len(answer.held)} remediation(s) held" if answer.held else ""
        if args.command == "pause":
            assert answer.pause is not None
            print(f"{wf_id}: {safe(answer.pause.describe())}{held}")
        elif answer.previous is None:
            print(f"{wf_id}: was not paused")
        else:
            who = f"{actor} ({answer.verification})" if answer.verification else actor
            print(f"{wf_id}: resumed by {safe(who)} ({safe(answer.previous.describe())}){held}")
    return 0


def cmd_pause(args: argparse.Namespace) -> int:
    return _run(_pause_or_resume(args))


async def paused_budgets(
    client: Any, task_queue: str, cluster: str | None
) -> dict[str, BudgetState]:
    """The paused budgets by workflow id: `cluster`'s (a name known), else every running
    budget workflow of the namespace."""
    from temporalio.service import RPCError

    if cluster is not None:
        ids = [budget_workflow_id(task_queue, cluster)]
    else:
        ids = sorted({wf.id async for wf in client.list_workflows(RUNNING_BUDGETS)})
    paused = {}
    for wf_id in ids:
        try:
            state = await client.get_workflow_handle(wf_id).query(
                QRY_BUDGET_STATE, result_type=BudgetState
            )
        except RPCError:
            continue  # no budget yet: nothing paused
        if state.pause is not None:
            paused[wf_id] = state
    return paused


def pause_banner(paused: dict[str, BudgetState]) -> list[str]:
    """`PAUSED since ... by ... (reason)` for each paused cluster."""
    lines = []
    for wf_id, state in paused.items():
        pause = state.pause
        assert pause is not None
        since = f"since {pause.since:%Y-%m-%d %H:%M:%S}Z " if pause.since else ""
        held = f"; {len(state.waiters)} remediation(s) held" if state.waiters else ""
        lines.append(
            safe(
                f"PAUSED {since}by {pause.who()} ({pause.reason}) [{wf_id}]{held}; "
                "`sickbay resume` lifts it"
            )
        )
    return lines


def register(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    for name, text in (
        ("pause", "pause a cluster: nothing new is quarantined, evicted, scaled or repaired"),
        ("resume", "lift a pause: held remediations go on at once"),
    ):
        p = sub.add_parser(name, help=text)
        _add_connection(p)
        p.add_argument(
            "--all-clusters",
            action="store_true",
            help="every cluster whose budget workflow runs on this Temporal namespace",
        )
        p.add_argument("--reason", type=_nonempty, required=name == "pause", help="why (recorded)")
        p.add_argument("--actor", type=_nonempty, help="who (default: your login; recorded)")
        _add_via(p)
        p.set_defaults(func=cmd_pause)
