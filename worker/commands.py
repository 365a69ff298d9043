"""CLI subcommands of the engine: worker, launch, status, timeline, approve / reject / abort /
repaired, runbooks validate / explain.

Every command reads the same `Settings` (env `SICKBAY_*`, overridden by flags) and talks to
Temporal through `worker.temporal.connect`. Devices are named `node/GPU-uuid` (or the workflow
id itself); `launch` also takes node + GPU index or a DRA name and resolves them with the
Kubernetes activities' code before the one signal-with-start path (`activities.launch`).
Exit codes: 0 ok, 1 failed / not found, 2 bad arguments.
"""

from __future__ import annotations

import argparse
import asyncio
import getpass
import json
import logging
import os
import re
import sys
import uuid
from collections.abc import Mapping
from datetime import timedelta
from pathlib import Path
from typing import Any

from temporalio.client import Client, WorkflowHandle

from contract.names import (
    SA_CLUSTER,
    SA_DEVICE,
    SA_ESCALATION,
    SA_NODE,
    SA_OUTCOME,
    SA_PHASE,
    SA_WORKLOAD_CLASS,
    WF_MAINTENANCE,
    WF_REMEDIATE,
    device_workflow_id,
    maintenance_workflow_id,
)
from contract.remediation import RemediationResult
from worker.local_stack import default_state_dir, live_stack
from worker.terminal import safe
from workflows.rejections import RejectionsWorkflow
from workflows.remediation import DeviceRemediationWorkflow

# A remediation's handle, typed by the workflow class: queries, updates and signals are named
# by its methods, so mypy checks their arguments and results.
RemediationHandle = WorkflowHandle[DeviceRemediationWorkflow, RemediationResult]

log = logging.getLogger(__name__)


# ------------------------------------------------------------------------------ helpers ----


def _kv(text: str) -> tuple[str, str]:
    if "=" not in text or text.startswith("="):
        raise argparse.ArgumentTypeError(f"expected key=value, got {text!r}")
    key, value = text.split("=", 1)
    if not key.strip() or not value.strip() or "=" in value or "\x00" in text:
        # `a==b` is no selector: a typo must not select (or drain) something else.
        raise argparse.ArgumentTypeError(
            f"expected key=value with one '=' and both sides non-empty, got {text!r}"
        )
    return key, value


# An NVIDIA GPU (or MIG device) UUID, as nvidia-smi, dcgm-exporter and the DRA driver print it.
_GPU_UUID = re.compile(
    r"(GPU|MIG)-[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}", re.IGNORECASE
)


def _gpu_uuid(text: str) -> str:
    text = _nonempty(text).strip()
    if not _GPU_UUID.fullmatch(text):
        raise argparse.ArgumentTypeError(
            f"{text!r} is not a GPU UUID (GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx, as "
            "nvidia-smi -L and dcgm-exporter's UUID label print it)"
        )
    return text


def _nonempty(text: str) -> str:
    if not text.strip() or "\x00" in text:
        raise argparse.ArgumentTypeError("must be a non-empty string")
    return text


def _duration(text: str) -> timedelta:
    from contract.base import parse_duration

    try:
        value = parse_duration(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from exc
    if not isinstance(value, timedelta):
        raise argparse.ArgumentTypeError(f"not a duration: {text!r} (e.g. 30m, 2h, 90s)")
    return value


def _dra(text: str) -> tuple[str, str, str]:
    parts = text.split("/")
    if len(parts) != 3 or not all(parts):
        raise argparse.ArgumentTypeError(f"expected driver/pool/device, got {text!r}")
    return parts[0], parts[1], parts[2]


def _settings(args: argparse.Namespace) -> Any:
    from worker.settings import Settings

    overrides = {
        k: v
        for k, v in {
            "temporal_address": getattr(args, "address", None),
            "temporal_namespace": getattr(args, "namespace", None),
            "task_queue": getattr(args, "task_queue", None),
            "cluster": getattr(args, "cluster", None),
            "runbooks_dir": getattr(args, "runbooks_dir", None),
            "metrics_port": getattr(args, "metrics_port", None),
        }.items()
        if v is not None
    }
    return Settings(**overrides)


def _cluster(
    args: argparse.Namespace, command: str, *, acting: bool, fallback: str = ""
) -> tuple[Any, Any]:
    """Settings for the cluster `command` addresses (worker/cli_cluster.py: --cluster,
    SICKBAY_CLUSTER, SICKBAY_CLUSTER_FILE, the recorded ConfigMap) and how it was found."""
    from worker.cli_cluster import cluster_settings

    flag = getattr(args, "cluster", None)
    return cluster_settings(_settings(args), flag, command, acting=acting, fallback=fallback)


# What a command does without a cluster name (worker/cli_cluster.py).
AS_GIVEN = "acting on the workflow id as given (it names its cluster)"


def _via(args: argparse.Namespace) -> str | None:
    """The actions endpoint (--via, else SICKBAY_ACTIONS_URL), or None: the direct Temporal
    path, recorded unverified."""
    return getattr(args, "via", None) or _settings(args).actions_url


def _add_via(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--via",
        metavar="URL",
        help="send it through Sickbay's actions endpoint (SICKBAY_ACTIONS_URL) with your "
        "Kubernetes credentials: recorded as a verified actor; without it the action goes "
        "straight to Temporal and is recorded unverified",
    )


def _add_connection(p: argparse.ArgumentParser) -> None:
    p.add_argument("--address", help="Temporal address (SICKBAY_TEMPORAL_ADDRESS)")
    p.add_argument("--namespace", help="Temporal namespace (SICKBAY_TEMPORAL_NAMESPACE)")
    p.add_argument("--task-queue", help="task queue (SICKBAY_TASK_QUEUE)")
    p.add_argument(
        "--cluster",
        help="the Sickbay cluster (else SICKBAY_CLUSTER, SICKBAY_CLUSTER_FILE, then the name "
        "recorded in the cluster): device ids, queue; `status` lists only it",
    )
    p.add_argument("--json", action="store_true", help="print JSON")


def workflow_id_for(target: str, cluster: str = "") -> str:
    """`sickbay-...` ids pass through; `node/GPU-uuid` becomes the device's workflow id in
    `cluster`."""
    if target.startswith("sickbay-"):
        return target
    if target.count("/") == 1:
        node, gpu = target.split("/")
        if node and gpu:
            return device_workflow_id(node, gpu, cluster)
    raise ValueError(
        f"{target!r} is neither a workflow id (sickbay-...) nor a device (node/GPU-uuid)"
    )


async def _acting_id(args: argparse.Namespace) -> str:
    """The workflow id an acting command addresses: the device's in the resolved cluster, or
    the id as given (`sickbay-...`), which needs no cluster name."""
    given = args.target.startswith("sickbay-")
    workflow_id_for(args.target)  # a bad target is refused before anything is read
    settings, _ = await asyncio.to_thread(
        _cluster, args, args.command, acting=True, fallback=AS_GIVEN if given else ""
    )
    return workflow_id_for(args.target, settings.cluster)


async def _timeline_id(args: argparse.Namespace) -> tuple[str | None, str]:
    """(the workflow id `timeline` shows, or None to look the device up in every cluster;
    the device)."""
    if args.target.startswith("sickbay-"):
        return args.target, ""
    workflow_id_for(args.target)
    _, found = await asyncio.to_thread(
        _cluster,
        args,
        "timeline",
        acting=False,
        fallback="looking the device up in every cluster (SickbayDevice); pass --cluster NAME "
        "to name its cluster",
    )
    if found.name is None:
        return None, args.target
    return workflow_id_for(args.target, found.name), args.target


async def _find_device(client: Client, device: str) -> str | None:
    """The one remediation of `device` in any cluster (by SickbayDevice), or None (said why)."""
    if "'" in device or "\\" in device:
        raise ValueError(f"{device!r} is not a device name (node/GPU-uuid)")
    query = f"WorkflowType = '{WF_REMEDIATE}' AND {SA_DEVICE} = '{device}'"
    ids = sorted({wf.id async for wf in client.list_workflows(query)})
    if not ids:
        print(f"no remediation of {device} in any cluster", file=sys.stderr)
        return None
    if len(ids) > 1:
        print(
            f"error: {device} has remediations in several clusters ({', '.join(ids)}): pass "
            "--cluster NAME or give the workflow id",
            file=sys.stderr,
        )
        return None
    print(f"note: {device} is {ids[0]}", file=sys.stderr)
    return ids[0]


class TemporalUnreachable(Exception):
    """The command could not reach Temporal (connect refused, timed out, or the server went
    away mid-command); the message names the address."""


# Exit code of a command whose reader closed the pipe (`sickbay status | head`), as a shell
# reports a process ended by SIGPIPE.
EXIT_PIPE_CLOSED = 141


def _run(coro: Any, address: str = "") -> int:
    from temporalio.client import WorkflowQueryFailedError
    from temporalio.exceptions import TemporalError
    from temporalio.service import RPCError, RPCStatusCode

    try:
        return int(asyncio.run(coro) or 0)
    except BrokenPipeError:
        # The reader left (`| head`): nothing more to say, and nowhere to say it. Point stdout at
        # /dev/null so the interpreter's last flush does not fail again.
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return EXIT_PIPE_CLOSED
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except TemporalUnreachable as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    except RPCError as exc:
        if exc.status in (RPCStatusCode.UNAVAILABLE, RPCStatusCode.DEADLINE_EXCEEDED):
            where = f" at {address}" if address else ""
            print(f"error: cannot reach Temporal{where}: {exc.message or exc}", file=sys.stderr)
        else:  # never a traceback for what Temporal refused: say what it said
            print(f"error: {type(exc).__name__}: {exc}", file=sys.stderr)
        return 1
    except (WorkflowQueryFailedError, TemporalError) as exc:
        # Never a traceback for a workflow the command did not expect: say what Temporal said.
        print(f"error: {type(exc).__name__}: {exc}", file=sys.stderr)
        return 1


# The few words worth showing of the SDK's connect error: the OS's message, else the kind.
_CONNECT_REASONS = (re.compile(r'message: "([^"]+)"'), re.compile(r'ConnectError\("([^"]+)"'))


async def connect_or_explain(settings: Any) -> Client:
    """`worker.temporal.connect`, with a failure to connect raised as TemporalUnreachable
    naming the address and the reason in a few words (the SDK's message is a Rust debug dump)."""
    from worker.temporal import connect

    try:
        return await connect(settings)
    except RuntimeError as exc:
        text = str(exc)
        if not text.startswith("Failed client connect"):
            raise
        found = [m.group(1) for m in (r.search(text) for r in _CONNECT_REASONS) if m]
        reason = found[0].lower() if found else text.splitlines()[0]
        raise TemporalUnreachable(
            f"cannot reach Temporal at {settings.temporal_address} (namespace "
            f"{settings.temporal_namespace}): {reason}"
        ) from None


def ui_url(settings: Any) -> str | None:
    """The Web UI's base URL: SICKBAY_TEMPORAL_UI_URL when set, else the UI of the stack that
    `sickbay-dev up` runs against this Temporal address (it may be on another port than 8233);
    None when neither is known (the CLI then prints no link rather than a wrong one)."""
    if "temporal_ui_url" in settings.model_fields_set:
        return str(settings.temporal_ui_url).rstrip("/") or None

    def same(address: str) -> str:
        return address.replace("localhost:", "127.0.0.1:", 1)

    info = live_stack(default_state_dir())
    if (
        info
        and info.get("ui_url")
        and same(str(info.get("temporal_address"))) == same(settings.temporal_address)
    ):
        return str(info["ui_url"]).rstrip("/")
    return None


def ui_link(settings: Any, workflow_id: str) -> str:
    base = ui_url(settings)
    if base is None:
        return "UI: set SICKBAY_TEMPORAL_UI_URL to get a link"
    return f"UI: {base}/namespaces/{settings.temporal_namespace}/workflows/{workflow_id}"


# How long a command waits for the workflow to show it took a signal in (a worker must run).
CONFIRM_SECONDS = 15.0


async def workflow_problem(handle: WorkflowHandle[Any, Any]) -> tuple[Any, str | None]:
    """(description, why a signal to this workflow would do nothing, or None).

    Closed runs (the text says how they ended), other workflow types, and runs whose workflow
    task keeps failing (e.g. a launch from before input validation) cannot act on a signal:
    the server would accept it and nothing would happen."""
    from temporalio.client import WorkflowExecutionStatus, WorkflowFailureError

    desc = await handle.describe()
    if desc.workflow_type != WF_REMEDIATE:
        return desc, f"{handle.id} is a {desc.workflow_type} workflow, not a remediation"
    if desc.status != WorkflowExecutionStatus.RUNNING:
        how = desc.status.name.lower() if desc.status else "closed"
        if desc.status == WorkflowExecutionStatus.FAILED:
            try:
                await handle.result(follow_runs=False)
            except WorkflowFailureError as exc:
                how += f": {getattr(exc.cause, 'message', None) or exc.cause}"
        return desc, f"{handle.id} is closed ({how})"
    pending = desc.raw_description.pending_workflow_task
    if desc.raw_description.HasField("pending_workflow_task") and pending.attempt > 1:
        return desc, (
            f"{handle.id} is Running but its workflow task has failed {pending.attempt - 1} "
            "time(s): it cannot act on anything until that is fixed (the Web UI shows the "
            f"task failure); end it with `temporal workflow terminate --workflow-id {handle.id}`"
        )
    return desc, None


async def _confirmed(handle: RemediationHandle, action: str, actor: str) -> bool:
    """Wait until the workflow's timeline shows `action` by `actor` (it took the signal in)."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + CONFIRM_SECONDS
    while loop.time() < deadline:
        try:
            entries = await handle.query(
                DeviceRemediationWorkflow.timeline, rpc_timeout=timedelta(seconds=5)
            )
        except Exception:  # no worker yet, or the run just closed: look again
            entries = []
        if any(e.action == action and e.actor == actor for e in entries):
            return True
        desc = await handle.describe()
        if desc.status is not None and desc.status.name != "RUNNING":
            return action in {e.action for e in entries}
        await asyncio.sleep(0.2)
    return False


async def _client(args: argparse.Namespace) -> Client:
    return await connect_or_explain(_settings(args))


def _out(args: argparse.Namespace, payload: Any, text: str) -> None:
    if getattr(args, "json", False):
        print(json.dumps(payload, indent=2, default=str))
    else:  # line by line: a cluster-supplied escape sequence or bidi control shows as such
        print("\n".join(safe(line) for line in text.split("\n")))


# ------------------------------------------------------------------------------ worker -----


def cmd_worker(args: argparse.Namespace) -> int:
    from worker.main import run_worker

    logging.basicConfig(
        level=getattr(logging, args.log_level.upper()),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    return asyncio.run(run_worker(_settings(args)))


# ------------------------------------------------------------------------------ launch -----


async def _resolve(settings: Any, ref: Any) -> Any:
    """node + index / DRA name -> node + GPU UUID, with the resolve-device activity's code,
    called as a plain method (it reads no activity context: no heartbeat, no info)."""
    from activities.kube import KubeActivities
    from contract.kube import ResolveDeviceInput

    kube = KubeActivities(settings.kube_settings())
    try:
        resolved = await kube.resolve_device(ResolveDeviceInput(device=ref))
    finally:
        kube.close()
    if ref.gpu_uuid and ref.gpu_index is not None and resolved.gpu_index != ref.gpu_index:
        # Two selectors that name different GPUs: acting on either could drain the wrong one.
        raise ValueError(
            f"--gpu {ref.gpu_index} and --uuid {ref.gpu_uuid} name different GPUs: "
            f"{ref.gpu_uuid} is GPU "
            f"{resolved.gpu_index if resolved.gpu_index is not None else '(index unknown)'} "
            f"of node {resolved.node}; give one of them"
        )
    return ref.model_copy(update={"node": resolved.node, "gpu_uuid": resolved.gpu_uuid})


async def _api_device(settings: Any, ref: Any) -> Any:
    """The launch's device as the API confirms it (node + GPU UUID), or ValueError naming what
    the cluster does not have: a typo is refused here, before anything starts or pages."""
    from temporalio.exceptions import ApplicationError

    from contract.errors import ERR_DEVICE_NOT_FOUND

    try:
        return await _resolve(settings, ref)
    except ApplicationError as exc:
        if exc.type != ERR_DEVICE_NOT_FOUND:
            raise
        raise ValueError(f"no such device, nothing launched: {exc}") from None
    except ValueError:
        raise
    except Exception as exc:  # no kubeconfig, API unreachable: never a traceback
        raise ValueError(
            f"cannot confirm the device with the Kubernetes API ({type(exc).__name__}: "
            f"{str(exc).strip()[:300]}); nothing launched: check KUBECONFIG / the cluster"
        ) from None


def _check_runbook(settings: Any, name: str | None) -> None:
    """A pinned runbook must exist (no fallback to matching): checked against the runbooks this
    CLI can read; when it can read none, the workflow refuses the run instead (invalid-input)."""
    if not name:
        return
    from activities.runbooks import RunbookError, load_dir

    try:
        known = load_dir(settings.runbooks_dir)
    except (RunbookError, OSError):
        return
    if known.get(name) is None:
        names = ", ".join(sorted(r.name for r in known.runbooks))
        raise ValueError(f"--runbook {name}: no such runbook in {known.source} (known: {names})")


async def _launch(args: argparse.Namespace) -> int:
    from pydantic import ValidationError

    from activities.launch import signal_with_start
    from contract.kube import DeviceRef
    from contract.maintenance import MaintenanceInput, MaintenanceSelector
    from contract.remediation import RemediationInput

    actor = args.requested_by or getpass.getuser()
    selector_given = bool(args.select_node or args.select_label or args.select_attr)
    try:
        if selector_given:
            selector = MaintenanceSelector(
                nodes=args.select_node or [],
                node_labels=dict(args.select_label or []),
                device_attributes=dict(args.select_attr or []),
            )
            maint = MaintenanceInput(
                selector=selector,
                runbook=args.runbook or "maintenance",
                reason=args.reason or "planned maintenance",
                requested_by=actor,
                dry_run=args.dry_run,
            )
        else:
            dra = args.device or (None, None, None)
            ref = DeviceRef(
                node=args.node,
                gpu_uuid=args.uuid,
                gpu_index=args.gpu,
                driver=dra[0],
                pool=dra[1],
                device=dra[2],
            )
    except ValidationError as exc:
        raise ValueError("; ".join(e["msg"] for e in exc.errors())) from exc

    settings, _ = await asyncio.to_thread(_cluster, args, "launch", acting=True)
    _check_runbook(settings, args.runbook)
    via = _via(args)
    if not selector_given and not (via is not None and ref.canonical):
        # Through the endpoint node + UUID is confirmed there (the person's own credentials
        # may not list ResourceSlices); an index or a DRA name is resolved here first.
        ref = await _api_device(settings, ref)
    if via is not None:  # the verified path: the endpoint confirms the device again
        if selector_given or args.runbook or args.dry_run:
            print(
                "error: --via launches one device's remediation (node + GPU): no maintenance "
                "selector, --runbook or --dry-run through the actions endpoint",
                file=sys.stderr,
            )
            return 2
        from worker.actions_cli import send

        body = {
            "action": "launch",
            "target": f"{ref.node}/{ref.gpu_uuid}",
            "reason": args.reason or "",
        }
        return await asyncio.to_thread(send, settings, via, body)
    client = await connect_or_explain(settings)
    if selector_given:
        wf_id = maintenance_workflow_id(uuid.uuid4().hex[:10], settings.cluster)
        handle = await client.start_workflow(
            WF_MAINTENANCE,
            maint,
            id=wf_id,
            task_queue=settings.task_queue,
            static_summary=f"maintenance drain: {maint.reason}"[:200]
            + (" (dry run)" if maint.dry_run else ""),
            static_details=f"selector `{maint.selector.model_dump_json(exclude_defaults=True)}`, "
            f"runbook {maint.runbook}, requested by {maint.requested_by}",
        )
        _out(
            args,
            {"workflow_id": handle.id, "run_id": handle.result_run_id, "started": True},
            f"started maintenance drain {handle.id}"
            + (" (dry run)" if args.dry_run else "")
            + f"\n  follow: sickbay status; {ui_link(settings, handle.id)}",
        )
        return 0
    inp = RemediationInput(
        device=ref,
        trigger="manual",
        runbook=args.runbook,
        dry_run=args.dry_run,
        requested_by=actor,
        reason=args.reason or "",
        cluster=settings.cluster,
    )
    result = await signal_with_start(client, inp, task_queue=settings.task_queue)
    if not result.started:
        # Signalled a run that was already open: say so only if it can act on the evidence.
        _, problem = await workflow_problem(client.get_workflow_handle(result.workflow_id))
        if problem is not None:
            print(f"error: the evidence went to a run that cannot act: {problem}", file=sys.stderr)
            return 1
    verb = "started" if result.started else "signalled running"
    _out(
        args,
        result.model_dump(mode="json"),
        f"{verb} remediation {result.workflow_id} for {result.device}"
        + (" (dry run)" if args.dry_run else "")
        + f"\n  follow: sickbay timeline {result.device}; {ui_link(settings, result.workflow_id)}",
    )
    return 0


def cmd_launch(args: argparse.Namespace) -> int:
    has_device = args.node or args.device or args.uuid or args.gpu is not None
    has_selector = args.select_node or args.select_label or args.select_attr
    if bool(has_device) == bool(has_selector):
        print(
            "error: give a device (--node with --uuid or --gpu, or --device driver/pool/device) "
            "or a maintenance selector (--select-node / --select-label / --select-attr)",
            file=sys.stderr,
        )
        return 2
    return _run(_launch(args))


# ------------------------------------------------------------------------------ status -----


async def _status(args: argparse.Namespace) -> int:
    settings, found = await asyncio.to_thread(
        _cluster,
        args,
        "status",
        acting=False,
        fallback="listing the remediations of every cluster (no SickbayCluster filter); pass "
        "--cluster NAME for one cluster's",
    )
    client = await _client(args)
    from worker.pause_cli import pause_banner, paused_budgets

    paused = await paused_budgets(client, settings.task_queue, found.name)
    query = f"WorkflowType = '{WF_REMEDIATE}'"
    if not args.all:
        query += " AND ExecutionStatus = 'Running'"
    if settings.cluster:  # --cluster / SICKBAY_CLUSTER: that cluster's incidents only
        query += f" AND {SA_CLUSTER} = '{settings.cluster}'"
    rows: list[dict[str, Any]] = []
    async for wf in client.list_workflows(query):
        sa = wf.search_attributes or {}

        def first(name: str, attrs: Mapping[str, Any] = sa) -> str:
            value = attrs.get(name) or [""]
            return str(value[0]) if isinstance(value, list) else str(value)

        status = wf.status.name.lower() if wf.status else ""
        rows.append(
            {
                "workflow_id": wf.id,
                "cluster": first(SA_CLUSTER),
                "device": first(SA_DEVICE),
                "node": first(SA_NODE),
                "workload_class": first(SA_WORKLOAD_CLASS),
                "phase": first(SA_PHASE),
                # A run that failed (e.g. refused input) has no outcome of its own: say failed.
                "outcome": first(SA_OUTCOME) or (status if status not in ("running", "") else ""),
                "escalation": first(SA_ESCALATION),
                "since": wf.start_time.isoformat() if wf.start_time else "",
                "started": wf.start_time.isoformat() if wf.start_time else "",
                "status": status,
            }
        )
    if args.json:
        # stdout stays the rows' JSON; a pause is said on stderr, where people see it.
        for line in pause_banner(paused):
            print(line, file=sys.stderr)
        print(json.dumps(rows, indent=2))
        return 0
    # A paused cluster first: it explains every held incident below.
    for line in pause_banner(paused):
        print(line)
    if not rows:
        print("no open incidents" if not args.all else "no remediations")
    else:
        _print_table(rows)
    if found.name is None:
        print("\nrejected alerts: not shown (the cluster name is not known)", file=sys.stderr)
    else:
        await _print_rejections(client, settings.task_queue)
    return 0


def _print_table(rows: list[dict[str, Any]]) -> None:
    # The CLUSTER column only where a remediation belongs to a named cluster.
    clustered = any(r["cluster"] for r in rows)
    table = [
        {
            k: safe(v)  # cluster-supplied text: never raw into a terminal
            for k, v in {
                **({"CLUSTER": r["cluster"] or "-"} if clustered else {}),
                "PHASE": r["phase"] or "-",
                "OUTCOME": r["outcome"] or "-",
                "ESCALATED": r["escalation"] or "-",
                "SINCE (UTC)": r["since"][:16].replace("T", " ") or "-",
                "CLASS": r["workload_class"] or "-",
                "DEVICE": r["device"] or "-",
                "WORKFLOW": r["workflow_id"],
            }.items()
        }
        for r in rows
    ]
    widths = {k: max(len(k), *(len(t[k]) for t in table)) for k in table[0]}
    print("  ".join(k.ljust(widths[k]) for k in widths).rstrip())
    for t in table:
        print("  ".join(t[k].ljust(widths[k]) for k in widths).rstrip())


async def _print_rejections(client: Any, task_queue: str) -> None:
    """The `rejected alerts` summary: what Sickbay was told but could not use (kept by the
    sickbay-rejections workflow), and the pages not sent because one was already sent."""
    from temporalio.service import RPCError, RPCStatusCode

    from contract.names import rejections_workflow_id

    wid = rejections_workflow_id(task_queue)
    try:
        summary = await client.get_workflow_handle_for(RejectionsWorkflow.run, wid).query(
            RejectionsWorkflow.summary
        )
    except RPCError as exc:
        if exc.status == RPCStatusCode.NOT_FOUND:
            print("\nrejected alerts: none recorded")
            return
        print(f"\nrejected alerts: cannot ask {wid}: {exc}", file=sys.stderr)
        return
    if not summary.reasons:
        print("\nrejected alerts: none in the last 24 h")
        return
    print("\nrejected alerts (last 24 h; alerts Sickbay was told about but could not use):")
    for r in summary.reasons:
        example = f"  e.g. {safe(r.examples[-1])}" if r.examples else ""
        print(f"  {r.reason:<26} {r.count:>6}  last {r.last_at:%Y-%m-%d %H:%M:%S}Z{example}")
    for c in summary.claims:
        if c.suppressed:
            print(
                f"  not paged: {c.suppressed} {safe(c.cause)} on node {safe(c.node)} "
                f"(paged once, by {safe(c.holder)}, at {c.at:%H:%M:%S}Z)"
            )


def cmd_status(args: argparse.Namespace) -> int:
    return _run(_status(args))


# ------------------------------------------------------------------------------ timeline ---


async def _timeline(args: argparse.Namespace) -> int:
    from temporalio.client import (
        WorkflowExecutionStatus,
        WorkflowFailureError,
        WorkflowQueryFailedError,
    )
    from temporalio.service import RPCError, RPCStatusCode

    wf_id, device = await _timeline_id(args)
    client = await _client(args)
    if wf_id is None:
        wf_id = await _find_device(client, device)
        if wf_id is None:
            return 1
    handle: RemediationHandle = client.get_workflow_handle_for(DeviceRemediationWorkflow.run, wf_id)
    try:
        desc, problem = await workflow_problem(handle)
        if desc.workflow_type != WF_REMEDIATE:
            print(f"error: {problem}", file=sys.stderr)
            return 1
        if desc.status is not None and desc.status != WorkflowExecutionStatus.RUNNING:
            # Closed: the result in history holds the timeline; no worker needed to answer.
            try:
                done = await handle.result(follow_runs=False)
                entries, status = done.timeline, done.status
            except WorkflowFailureError:
                print(f"error: {problem}", file=sys.stderr)
                return 1
        elif problem is not None:
            print(f"error: {problem}", file=sys.stderr)
            return 1
        else:
            try:
                entries = await handle.query(DeviceRemediationWorkflow.timeline)
                status = await handle.query(DeviceRemediationWorkflow.status)
            except WorkflowQueryFailedError as exc:
                print(f"error: {wf_id} could not answer the timeline query: {exc}", file=sys.stderr)
                return 1
    except RPCError as exc:
        if exc.status == RPCStatusCode.NOT_FOUND:
            print(f"no remediation {wf_id}", file=sys.stderr)
            return 1
        raise
    if args.json:
        print(
            json.dumps(
                {
                    "status": status.model_dump(mode="json"),
                    "timeline": [e.model_dump(mode="json") for e in entries],
                },
                indent=2,
            )
        )
        return 0
    print(
        f"{wf_id}  device {safe(status.device)}  phase {status.phase.value}  "
        f"runbook {safe(status.runbook)}"
    )
    if status.outcome or status.escalation_reason:
        print(
            f"  outcome {safe(status.outcome or '-')}  "
            f"escalated {safe(status.escalation_reason or '-')}"
        )
    if status.awaiting:
        until = f" until {status.until:%Y-%m-%d %H:%M:%S} UTC" if status.until else ""
        print(f"  waiting for {safe(status.awaiting)}{until}")
    if status.next_action:
        print(f"  next: {safe(status.next_action)}")
    for e in entries:
        line = f"{e.at:%Y-%m-%d %H:%M:%S}  {e.phase.value:<20} {e.action}"
        if e.outcome:
            line += f" -> {e.outcome}"
        if e.who():
            line += f"  [{e.who()}]"
        if e.reason:
            line += f"  ({e.reason})"
        print(safe(line))
    return 0


def cmd_timeline(args: argparse.Namespace) -> int:
    return _run(_timeline(args))


# ------------------------------------------------------------------------------ decisions --


async def _decide(args: argparse.Namespace) -> int:
    from temporalio.client import WorkflowUpdateFailedError
    from temporalio.service import RPCError, RPCStatusCode

    from contract.names import UPD_APPROVE
    from contract.remediation import (
        AbortRequest,
        ApprovalDecision,
        ApprovalResult,
        RepairedRequest,
    )

    actor = args.actor or getpass.getuser()
    if args.command == "abort" and not args.reason:
        print("error: abort needs --reason", file=sys.stderr)
        return 2
    via = _via(args)
    if via is not None:  # the verified path: the cluster says who you are
        from worker.actions_cli import send

        body = {"action": args.command, "target": args.target, "reason": args.reason or ""}
        return await asyncio.to_thread(send, _settings(args), via, body)
    wf_id = await _acting_id(args)
    client = await _client(args)
    handle: RemediationHandle = client.get_workflow_handle_for(DeviceRemediationWorkflow.run, wf_id)
    try:
        _, problem = await workflow_problem(handle)
        if problem is not None:
            print(f"error: nothing sent: {problem}", file=sys.stderr)
            return 1
        if args.command in ("approve", "reject"):
            try:
                result = await handle.execute_update(
                    UPD_APPROVE,
                    ApprovalDecision(
                        approve=args.command == "approve", actor=actor, reason=args.reason or ""
                    ),
                    result_type=ApprovalResult,
                )
            except WorkflowUpdateFailedError as exc:
                print(f"refused: {exc.cause}", file=sys.stderr)
                return 1
            print(f"{args.command}d {wf_id} (phase {result.phase.value})")
            return 0
        if args.command == "abort":
            await handle.signal(
                DeviceRemediationWorkflow.abort, AbortRequest(reason=args.reason, actor=actor)
            )
            action, done = "abort requested", "aborting"
        else:
            await handle.signal(
                DeviceRemediationWorkflow.repaired,
                RepairedRequest(actor=actor, note=args.reason or ""),
            )
            action, done = "marked repaired", "marked repaired"
    except RPCError as exc:
        if exc.status == RPCStatusCode.NOT_FOUND:
            print(f"no running remediation {wf_id}", file=sys.stderr)
            return 1
        raise
    # The server accepting a signal proves nothing: wait for the workflow's own timeline.
    if not await _confirmed(handle, action, actor):
        print(
            f"error: {args.command} sent to {wf_id}, but the workflow has not taken it in within "
            f"{CONFIRM_SECONDS:g} s (is a worker running on its task queue?)",
            file=sys.stderr,
        )
        return 1
    print(f"{wf_id} {done} (taken in by the workflow)")
    return 0


def cmd_decide(args: argparse.Namespace) -> int:
    return _run(_decide(args))


def _positive_duration(text: str, flag: str) -> timedelta | None:
    """`text` as a duration above zero, or None after saying why in one line."""
    from contract.base import format_duration, parse_duration

    try:
        value = None if text.strip().startswith("-") else parse_duration(text.strip())
    except ValueError:
        value = None
    if not isinstance(value, timedelta):
        why = "is negative" if text.strip().startswith("-") else "is not a duration"
        print(f"error: {flag} {text!r} {why}: give how much later, e.g. 30m, 2h", file=sys.stderr)
        return None
    if value <= timedelta(0):
        print(
            f"error: {flag} {format_duration(value)} moves nothing: give how much later, "
            "e.g. 30m, 2h",
            file=sys.stderr,
        )
        return None
    return value


async def _extend_deadline(args: argparse.Namespace) -> int:
    """`extend-deadline`: move the running replacement wait's deadline (an update: the
    workflow's validator answers, refusals name the phase or the bound)."""
    from datetime import UTC, datetime

    from pydantic import ValidationError
    from temporalio.client import WorkflowUpdateFailedError
    from temporalio.service import RPCError, RPCStatusCode

    from contract.base import human_duration
    from contract.names import UPD_EXTEND_DEADLINE
    from contract.remediation import ExtendDeadlineRequest, ExtendDeadlineResult

    if (args.by is None) == (args.until is None):
        print("error: give exactly one of --by (e.g. 30m) or --until (ISO time)", file=sys.stderr)
        return 2
    by = None
    if args.by is not None:
        by = _positive_duration(args.by, "--by")
        if by is None:
            return 2
    via = _via(args)
    if via is not None:  # the verified path: the cluster says who you are
        from worker.actions_cli import send

        body = {"action": "extend", "target": args.target, "reason": args.reason}
        body.update({"by": f"{int(by.total_seconds())}s"} if by else {"until": args.until})
        return await asyncio.to_thread(send, _settings(args), via, body)
    try:
        req = ExtendDeadlineRequest(
            by=by,
            until=datetime.fromisoformat(args.until) if args.until else None,
            reason=args.reason,
            actor=args.actor or getpass.getuser(),
        )
    except ValidationError as exc:  # one line: each field and its problem
        problems = "; ".join(
            f"{'.'.join(str(x) for x in e['loc']) or 'input'}: {e['msg']}" for e in exc.errors()
        )
        print(f"error: {problems}", file=sys.stderr)
        return 2
    except ValueError as exc:  # --until that is not an ISO time
        print(f"error: --until: {exc}", file=sys.stderr)
        return 2
    wf_id = await _acting_id(args)
    client = await _client(args)
    handle = client.get_workflow_handle(wf_id)
    try:
        _, problem = await workflow_problem(handle)
        if problem is not None:
            print(f"error: nothing sent: {problem}", file=sys.stderr)
            return 1
        result = await handle.execute_update(
            UPD_EXTEND_DEADLINE, req, result_type=ExtendDeadlineResult
        )
    except WorkflowUpdateFailedError as exc:
        print(f"refused: {exc.cause}", file=sys.stderr)
        return 1
    except RPCError as exc:
        if exc.status == RPCStatusCode.NOT_FOUND:
            print(f"no running remediation {wf_id}", file=sys.stderr)
            return 1
        raise
    left = result.deadline - datetime.now(UTC)
    print(
        f"{wf_id}: deadline {result.previous:%Y-%m-%d %H:%M:%S} -> "
        f"{result.deadline:%Y-%m-%d %H:%M:%S} UTC (in {human_duration(left)}; "
        f"phase {result.phase.value})"
    )
    return 0


def cmd_extend_deadline(args: argparse.Namespace) -> int:
    return _run(_extend_deadline(args))


# ------------------------------------------------------------------------------ runbooks ---


def cmd_runbooks_validate(args: argparse.Namespace) -> int:
    from activities.runbooks import RunbookError, load_dir

    settings = _settings(args)
    path = Path(args.path) if args.path else settings.runbooks_dir
    try:
        loaded = load_dir(path, settings.repair_allowlist)  # images/commands: the allowlist's
    except RunbookError as exc:
        for problem in exc.problems:
            print(problem, file=sys.stderr)
        return 1
    for rb in loaded.runbooks:
        print(f"ok  {rb.name:<14} precedence {rb.spec.precedence:<4} {rb.metadata.description}")
    if loaded.get("default") is None:
        print("warning: no 'default' runbook; built-in safe defaults apply", file=sys.stderr)
    return 0


def explain_steps(runbook: Any, failure_class: str) -> list[str]:
    """What the workflow would do with `runbook` for a device of `failure_class`, in order."""
    from contract.base import human_duration

    spec = runbook.spec
    action = getattr(spec.on, failure_class)
    steps = [
        f"confirm: gather evidence; an Alertmanager alert older than {human_duration(spec.confirm.stale_after)} "
        "for a device that reports Healthy is stale -> nothing is done",
    ]
    if spec.confirm.require_unhealthy_status:
        steps.append("confirm: act only when pod status reports the device Unhealthy")
    if action == "ignore":
        return [*steps, f"{failure_class}: ignore -> close, nothing tainted"]
    if action == "notify":
        return [
            *steps,
            f"{failure_class}: notify -> Warning Event on the consumer pods and "
            f"the owners' channels {spec.escalation.owner_channels or '(none: the Event only)'}"
            " (never on-call's); nothing tainted",
        ]
    if spec.dry_run:
        steps.append("dry run: preview the DeviceTaintRule (effect None); nothing tainted")
        return steps
    budget = spec.budget
    steps.append(
        f"guard: budget lease, at most {budget.max_per_pool} of the pool and "
        f"{budget.max_per_cluster} of the cluster quarantined; over budget -> no taint, escalate "
        "and wait for a free slot"
    )
    if spec.approval.required:
        steps.append(
            f"approve: wait up to {human_duration(spec.approval.timeout)} for `sickbay approve`; "
            f"then {spec.approval.on_timeout}"
        )
    ev = spec.eviction
    if ev.mode == "eviction-api":
        steps.append(
            "quarantine: DeviceTaintRule NoSchedule, then the Eviction API (honours PDBs), "
            f"then NoExecute as a backstop after {human_duration(ev.timeout)}"
        )
    else:
        steps.append(f"quarantine: DeviceTaintRule {spec.quarantine.effect}")
    if spec.quarantine.effect == "NoSchedule" and ev.mode == "taint":
        steps.append("consumers keep running (NoSchedule blocks only new pods)")
    else:
        force = {
            "none": "escalate",
            "eviction-api": "evict again, then escalate",
            "delete": "delete the pods, then escalate",
        }[ev.force]
        steps.append(
            f"evict: wait up to {human_duration(ev.timeout)} for the consumers to go; then {force}"
        )
        steps.append(
            f"replace: wait up to {human_duration(spec.replacement.pending_deadline)} for replacements to run; "
            f"{spec.replacement.churn_evictions}+ evictions of one owner = churn -> escalate"
        )
        su = spec.scale_up
        if su.enabled:
            pool = su.pool.name if su.pool else f"the device's node pool ({su.provider})"
            steps.append(
                f"scale up: ask {pool} for +{su.step} (max {su.max_size}, cool-down "
                f"{human_duration(su.cooldown)}{', after approval' if su.approval else ''}); wait "
                f"{human_duration(su.capacity_deadline)} for capacity; at max -> escalate"
            )
        else:
            steps.append("scale up: off -> escalate when the Pending deadline passes")
    esc = spec.escalation
    steps.append(
        f"escalate (once): {esc.channels or 'no channels'} severity {esc.severity}, on "
        f"{', '.join(esc.on)}"
    )
    rel = spec.release
    how = {
        "repaired": "only when marked repaired",
        "healthy-cooldown": f"when Healthy for {human_duration(rel.cooldown)}",
        "either": f"when marked repaired or Healthy for {human_duration(rel.cooldown)}",
    }[rel.mode]
    steps.append(
        f"hold and release: {how} (checked every {human_duration(rel.health_check_interval)})"
    )
    return steps


def cmd_runbooks_explain(args: argparse.Namespace) -> int:
    from activities.runbooks import RunbookError, load_dir
    from contract.kube import Consumer, OwnerRef, PodRef
    from workflows.classify import classify_xid
    from workflows.runbook_match import select_runbook

    path = Path(args.path) if args.path else _settings(args).runbooks_dir
    try:
        loaded = load_dir(path)
    except RunbookError as exc:
        for problem in exc.problems:
            print(problem, file=sys.stderr)
        return 1
    owner = (
        OwnerRef(kind=args.owner_kind, name="workload", namespace=args.namespace)
        if args.owner_kind
        else None
    )
    consumer = Consumer(
        pod=PodRef(namespace=args.namespace, name=args.pod or "pod"),
        labels=dict(args.label or []),
        namespace_labels=dict(args.namespace_label or []),
        top_owner=owner,
        priority_class=args.priority_class,
    )
    selection = select_runbook(loaded.runbooks, [consumer], args.runbook)
    failure_class = args.failure_class or (
        classify_xid(args.xid) if args.xid is not None else "unhealthy"
    )
    steps = explain_steps(selection.runbook, failure_class)
    if args.json:
        print(
            json.dumps(
                {
                    "runbook": selection.runbook.name,
                    "why": selection.why,
                    "notes": selection.notes,
                    "class": failure_class,
                    "steps": steps,
                },
                indent=2,
            )
        )
        return 0
    print(f"runbook: {selection.runbook.name}  ({selection.why})")
    for note in selection.notes:
        print(f"note: {note}")
    print(f"failure class: {failure_class}")
    for i, step in enumerate(steps, 1):
        print(f"  {i}. {step}")
    return 0


# ------------------------------------------------------------------------------ register ---


def register(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    p = sub.add_parser("worker", help="run the Temporal worker")
    _add_connection(p)
    p.add_argument("--runbooks-dir", help="runbook directory (SICKBAY_RUNBOOKS_DIR)")
    p.add_argument("--metrics-port", type=int, help="Prometheus port, 0 = off")
    p.add_argument("--log-level", default="info", choices=["debug", "info", "warning", "error"])
    p.set_defaults(func=cmd_worker)

    p = sub.add_parser(
        "launch",
        help="start (or signal) a device's remediation, or a maintenance drain",
        description="Device: --node with --uuid or --gpu INDEX, or --device driver/pool/device. "
        "Maintenance drain: --select-node / --select-label / --select-attr.",
    )
    _add_connection(p)
    p.add_argument("--node", type=_nonempty)
    p.add_argument("--uuid", type=_gpu_uuid, help="GPU UUID (dcgm-exporter's UUID label)")
    p.add_argument("--gpu", type=int, help="GPU index on the node")
    p.add_argument("--device", type=_dra, help="DRA device driver/pool/device")
    p.add_argument("--select-node", action="append", type=_nonempty, help="maintenance: node")
    p.add_argument("--select-label", action="append", type=_kv, help="maintenance: node label k=v")
    p.add_argument(
        "--select-attr", action="append", type=_kv, help="maintenance: device attribute k=v"
    )
    p.add_argument("--runbook", type=_nonempty, help="pin a runbook by name")
    p.add_argument("--reason", type=_nonempty)
    p.add_argument("--requested-by", type=_nonempty)
    p.add_argument("--dry-run", action="store_true", help="preview only: nothing is tainted")
    _add_via(p)
    p.set_defaults(func=cmd_launch)

    p = sub.add_parser(
        "status",
        help="open incidents (phase, outcome, escalation, since when), and the alerts Sickbay "
        "rejected",
    )
    _add_connection(p)
    p.add_argument("--all", action="store_true", help="closed remediations too (with outcome)")
    p.set_defaults(func=cmd_status)

    p = sub.add_parser("timeline", help="a remediation's timeline")
    _add_connection(p)
    p.add_argument("target", type=_nonempty, help="node/GPU-uuid or workflow id")
    p.set_defaults(func=cmd_timeline)

    for name, text in (
        ("approve", "approve a remediation waiting for approval"),
        ("reject", "reject a remediation waiting for approval"),
        ("abort", "stop a remediation and undo its quarantine"),
        ("repaired", "mark the device repaired: release the quarantine"),
    ):
        p = sub.add_parser(name, help=text)
        _add_connection(p)
        p.add_argument("target", type=_nonempty, help="node/GPU-uuid or workflow id")
        p.add_argument("--actor", type=_nonempty)
        p.add_argument("--reason", type=_nonempty)
        _add_via(p)
        p.set_defaults(func=cmd_decide)

    p = sub.add_parser(
        "extend-deadline",
        help="move the Pending (or capacity) deadline of a remediation waiting for replacements",
    )
    _add_connection(p)
    p.add_argument("target", type=_nonempty, help="node/GPU-uuid or workflow id")
    p.add_argument("--by", help="how much later, e.g. 30m, 2h (above zero)")
    p.add_argument("--until", help="the new deadline, ISO 8601 (UTC without an offset)")
    p.add_argument("--reason", type=_nonempty, required=True)
    p.add_argument("--actor", type=_nonempty)
    _add_via(p)
    p.set_defaults(func=cmd_extend_deadline)

    p = sub.add_parser("runbooks", help="validate or explain runbooks")
    rsub = p.add_subparsers(dest="runbooks_command", metavar="ACTION", required=True)
    v = rsub.add_parser("validate", help="check runbook YAML; errors as file:line: field: problem")
    v.add_argument("path", nargs="?", help="file or directory (default SICKBAY_RUNBOOKS_DIR)")
    v.set_defaults(func=cmd_runbooks_validate)
    e = rsub.add_parser("explain", help="which runbook applies to a workload, step by step")
    e.add_argument("--path", help="runbook file or directory (default SICKBAY_RUNBOOKS_DIR)")
    e.add_argument("--namespace", default="default")
    e.add_argument("--pod")
    e.add_argument("--label", action="append", type=_kv, help="pod label k=v")
    e.add_argument("--namespace-label", action="append", type=_kv, help="namespace label k=v")
    e.add_argument("--owner-kind", help="top owner kind (Deployment, Job, JobSet, ...)")
    e.add_argument("--priority-class")
    e.add_argument("--runbook", help="as if the launch pinned this runbook")
    e.add_argument("--xid", type=int, help="classify this Xid code")
    e.add_argument(
        "--class", dest="failure_class", choices=["unhealthy", "degraded", "application", "unknown"]
    )
    e.add_argument("--json", action="store_true")
    e.set_defaults(func=cmd_runbooks_explain)
