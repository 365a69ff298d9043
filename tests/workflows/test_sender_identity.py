"""Claimed actors vs the Temporal client identity the server recorded (workflows/identity.py).

Runs on the real dev server (it records each signal's and update's client identity in history,
as a production server does), with the production worker options (`sender_identity_options`).

Cases:
- an abort claiming `ceo@example.com` sent by client `mallory-laptop`: the timeline entry keeps
  the claim as `actor` and the server's record as `client_identity`, renders both, marked
  which is which; the outcome text says "claimed" too;
- an approval (an update) and a repaired mark (a signal) record the identity of the client
  that sent each, which differs per client;
- a client that forges the identity header is overruled by the server's record;
- a worker built without the runner records "unknown", never the claimed actor;
- alerts that arrive as signals (the webhook's signal-with-start) record who sent them beside
  the source they claim;
- the CLI's and the notifications' timeline lines show both parts.
"""

from __future__ import annotations

import asyncio
import os
import socket
import uuid
from collections.abc import Sequence
from typing import Any

import pytest
from temporalio.api.common.v1 import Payload
from temporalio.client import (
    Client,
    Interceptor,
    OutboundInterceptor,
    SignalWorkflowInput,
)
from temporalio.testing import WorkflowEnvironment
from temporalio.worker import Worker

from activities.launch import signal_with_start
from activities.notify.messages import timeline_lines
from contract.kube import DeviceRef
from contract.names import SIG_ABORT, SIG_REPAIRED, UPD_APPROVE
from contract.remediation import (
    AbortRequest,
    ApprovalDecision,
    ApprovalResult,
    Phase,
    RemediationInput,
    RemediationResult,
    RepairedRequest,
    TimelineEntry,
)
from tests.workflows.fakes import (
    FakeWorld,
    make_runbook,
    new_worker,
    shipped_runbooks,
    start,
    xid_alert,
)
from tests.workflows.fakes import wait_phase as _wait_phase
from worker.cli import main as cli_main
from worker.converter import DATA_CONVERTER
from workflows.identity import SENDER_HEADER
from workflows.remediation import DeviceRemediationWorkflow


async def wait_phase(handle: Any, phase: Phase) -> None:
    await _wait_phase(handle, phase)  # a generous deadline (fakes.wait_phase), not poll counts


async def client_as(env: WorkflowEnvironment, identity: str, **kw: Any) -> Client:
    return await Client.connect(
        env.client.service_client.config.target_host,
        namespace=env.client.namespace,
        identity=identity,
        data_converter=DATA_CONVERTER,
        **kw,
    )


def entry(result: RemediationResult, action: str) -> TimelineEntry:
    return next(e for e in result.timeline if e.action == action)


async def test_a_claimed_actor_is_recorded_beside_the_client_identity(
    dev_env: WorkflowEnvironment, capsys: pytest.CaptureFixture[str]
) -> None:
    """The issue's case: `sickbay abort ... --actor ceo@example.com`."""
    world = FakeWorld()
    queue = f"id-{uuid.uuid4().hex[:8]}"
    conn = [
        "--address",
        dev_env.client.service_client.config.target_host,
        "--task-queue",
        queue,
        "--cluster",
        "",  # the unnamed cluster: this run has no cluster record to read
    ]
    device = f"{world.node}/{world.gpu_uuid}"
    async with new_worker(dev_env.client, world, task_queue=queue) as worker:
        handle = await start(dev_env.client, worker, world)
        await wait_phase(handle, Phase.HOLDING)
        argv = ["abort", *conn, device, "--actor", "ceo@example.com", "--reason", "trust me"]
        assert await asyncio.to_thread(cli_main, argv) == 0
        result = await handle.result()
    # The CLI's client has the SDK's default identity: this process, on this host.
    cli_identity = f"{os.getpid()}@{socket.gethostname()}"
    abort = entry(result, "abort requested")
    assert (abort.actor, abort.client_identity) == ("ceo@example.com", cli_identity)
    assert (
        abort.who() == f"unverified: claimed actor ceo@example.com; Temporal client {cli_identity}"
    )
    assert result.outcome == "aborted"
    assert f"aborted by ceo@example.com (claimed; Temporal client {cli_identity})" in result.reason
    capsys.readouterr()
    assert await asyncio.to_thread(cli_main, ["timeline", *conn, device]) == 0
    out = capsys.readouterr().out
    assert f"[unverified: claimed actor ceo@example.com; Temporal client {cli_identity}]" in out


async def test_update_and_signal_record_each_senders_identity(
    dev_env: WorkflowEnvironment,
) -> None:
    others = [r for r in shipped_runbooks() if r.name != "inference"]
    gated = make_runbook(
        "inference", 50, match={"ownerKinds": ["Deployment"]}, approval={"required": True}
    )
    world = FakeWorld(runbooks=[*others, gated])
    async with new_worker(dev_env.client, world) as worker:
        handle = await start(dev_env.client, worker, world)
        await wait_phase(handle, Phase.AWAITING_APPROVAL)
        carol = await client_as(dev_env, "carol-web-ui")
        reply = await carol.get_workflow_handle(handle.id).execute_update(
            UPD_APPROVE,
            ApprovalDecision(approve=True, actor="carol", reason="go"),
            result_type=ApprovalResult,
        )
        assert reply.accepted
        await wait_phase(handle, Phase.HOLDING)
        dan = await client_as(dev_env, "dan-oncall-cli")
        await dan.get_workflow_handle(handle.id).signal(
            SIG_REPAIRED, RepairedRequest(actor="dan", note="reseated")
        )
        result = await handle.result()
    approved, repaired = entry(result, "approved"), entry(result, "marked repaired")
    assert (approved.actor, approved.client_identity) == ("carol", "carol-web-ui")
    assert (repaired.actor, repaired.client_identity) == ("dan", "dan-oncall-cli")
    # Sickbay's own entries carry no client identity and render as before.
    quarantined = [e for e in result.timeline if e.actor == "sickbay"]
    assert quarantined and all(e.client_identity is None and e.who() == "" for e in quarantined)


class _ForgeHeader(Interceptor):
    def intercept_client(self, next: OutboundInterceptor) -> OutboundInterceptor:
        return _ForgingOutbound(next)


class _ForgingOutbound(OutboundInterceptor):
    async def signal_workflow(self, input: SignalWorkflowInput) -> None:
        forged = Payload(metadata={"encoding": b"json/plain"}, data=b'"security-team-bot"')
        input.headers = {**input.headers, SENDER_HEADER: forged}
        await super().signal_workflow(input)


async def test_a_forged_identity_header_is_overruled_by_the_servers_record(
    dev_env: WorkflowEnvironment,
) -> None:
    world = FakeWorld()
    async with new_worker(dev_env.client, world) as worker:
        handle = await start(dev_env.client, worker, world)
        await wait_phase(handle, Phase.HOLDING)
        forger = await client_as(dev_env, "eve-laptop", interceptors=[_ForgeHeader()])
        await forger.get_workflow_handle(handle.id).signal(
            SIG_ABORT, AbortRequest(actor="security-team-bot", reason="forged")
        )
        result = await handle.result()
    assert entry(result, "abort requested").client_identity == "eve-laptop"


async def test_without_the_runner_the_identity_is_unknown_not_the_claim(
    dev_env: WorkflowEnvironment,
) -> None:
    world = FakeWorld()
    bare = Worker(
        dev_env.client,
        task_queue=f"bare-{uuid.uuid4().hex[:8]}",
        workflows=[DeviceRemediationWorkflow],
        activities=list(world.activities()),
    )
    async with bare:
        handle = await start(dev_env.client, bare, world)
        await wait_phase(handle, Phase.HOLDING)
        await handle.signal(SIG_ABORT, AbortRequest(actor="ceo@example.com", reason="x"))
        result = await handle.result()
    abort = entry(result, "abort requested")
    assert abort.client_identity == "unknown"
    assert "claimed; Temporal client unknown" in result.reason


async def test_signalled_alerts_record_their_sender(dev_env: WorkflowEnvironment) -> None:
    world = FakeWorld()
    async with new_worker(dev_env.client, world) as worker:
        webhook = await client_as(dev_env, "webhook-pod-7")
        inp = RemediationInput(device=DeviceRef(node=world.node, gpu_uuid=world.gpu_uuid))
        launched = await signal_with_start(
            webhook, inp, task_queue=worker.task_queue, evidence=xid_alert()
        )
        handle = dev_env.client.get_workflow_handle(
            launched.workflow_id, result_type=RemediationResult
        )
        await wait_phase(handle, Phase.HOLDING)
        await handle.signal(SIG_ABORT, AbortRequest(actor="ops", reason="done"))
        result = await handle.result()
    received = entry(result, "alert received")
    assert (received.actor, received.client_identity) == ("alertmanager", "webhook-pod-7")


def test_notification_lines_show_the_claim_and_the_client() -> None:
    from datetime import UTC, datetime

    e = TimelineEntry(
        at=datetime(2026, 12, 1, 12, 0, tzinfo=UTC),
        phase=Phase.HOLDING,
        action="abort requested",
        actor="ceo@example.com",
        client_identity="4242@bastion",
    )
    plain = TimelineEntry(at=e.at, phase=Phase.HOLDING, action="budget lease released")
    lines: Sequence[str] = timeline_lines([e, plain], limit=10)
    assert lines[0].endswith("[claimed actor ceo@example.com; Temporal client 4242@bastion]")
    assert "[" not in lines[1]
