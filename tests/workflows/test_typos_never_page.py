"""Typos never page: a person's launch naming what the cluster has not got is invalid input.

Cases:
- a Web UI / CLI launch (trigger `ui` or `manual`) of a GPU UUID the node has not got (the
  resolve-device activity answers DeviceNotFound): the run fails at once with `InvalidInput`
  naming the device, `SickbayOutcome=invalid-input`, no escalation, no page, no ledger count;
  the same answer for an alert still escalates (the rejections workflow decides the page);
- a pinned runbook that does not exist (`--runbook nosuch`): invalid input, not a fallback to
  matching;
- an application Xid (13) under the shipped default runbook tells the owners' channel
  (`ownerChannels`: slack), never on-call's (`channels`: pagerduty), and two incidents of one
  GPU carry different dedup keys.
"""

from __future__ import annotations

import pytest
from temporalio.client import WorkflowFailureError
from temporalio.exceptions import ApplicationError
from temporalio.testing import WorkflowEnvironment

from activities.kube import KubeActivities
from contract.errors import ERR_DEVICE_NOT_FOUND, ERR_INVALID_INPUT
from contract.kube import ResolvedDevice, ResolveDeviceInput
from contract.names import ACT_NOTIFY, ACT_QUARANTINE, ACT_RECORD_GPU_FAILURE, SA_OUTCOME
from contract.remediation import Phase
from tests.workflows.fakes import FakeWorld, fake_of, new_worker, start, xid_alert


@fake_of(KubeActivities.resolve_device)
async def not_found(req: ResolveDeviceInput) -> ResolvedDevice:
    raise ApplicationError(
        f"no ResourceSlice device on node {req.device.node} has uuid {req.device.gpu_uuid}",
        type=ERR_DEVICE_NOT_FOUND,
        non_retryable=True,
    )


@pytest.mark.parametrize("trigger", ["ui", "manual"])
async def test_a_device_the_node_has_not_got_is_invalid_input(
    time_skipping_env: WorkflowEnvironment, trigger: str
) -> None:
    client = time_skipping_env.client
    world = FakeWorld()
    async with new_worker(client, world, extra_activities=[not_found]) as worker:
        handle = await start(client, worker, world, alerts=[], trigger=trigger)
        with pytest.raises(WorkflowFailureError) as failed:
            await handle.result()
        desc = await handle.describe()
    cause = failed.value.cause
    assert isinstance(cause, ApplicationError) and cause.type == ERR_INVALID_INPUT
    assert world.gpu_uuid in cause.message and "no ResourceSlice device" in cause.message
    assert desc.search_attributes.get(SA_OUTCOME) == ["invalid-input"]
    assert world.args(ACT_NOTIFY) == [] and world.args(ACT_RECORD_GPU_FAILURE) == []


async def test_an_alert_for_a_missing_device_still_escalates(
    time_skipping_env: WorkflowEnvironment,
) -> None:
    client = time_skipping_env.client
    world = FakeWorld()
    async with new_worker(client, world, extra_activities=[not_found]) as worker:
        handle = await start(client, worker, world)
        result = await handle.result()
    assert result.outcome == "escalated"
    assert result.status.escalation_reason == "error"


async def test_an_unknown_pinned_runbook_is_invalid_input(
    time_skipping_env: WorkflowEnvironment,
) -> None:
    client = time_skipping_env.client
    world = FakeWorld()
    async with new_worker(client, world) as worker:
        handle = await start(client, worker, world, trigger="ui", runbook="nosuch")
        with pytest.raises(WorkflowFailureError) as failed:
            await handle.result()
    cause = failed.value.cause
    assert isinstance(cause, ApplicationError) and cause.type == ERR_INVALID_INPUT
    assert "no runbook named 'nosuch'" in cause.message and "default" in cause.message
    assert world.args(ACT_QUARANTINE) == [] and world.args(ACT_NOTIFY) == []


async def test_application_xid_tells_the_owners_never_on_call(
    time_skipping_env: WorkflowEnvironment,
) -> None:
    client = time_skipping_env.client
    world = FakeWorld(consumers=[], health=None)  # no consumer: the shipped default runbook
    async with new_worker(client, world) as worker:
        first = await start(client, worker, world, alerts=[xid_alert(13, "fp-13a")])
        one = await first.result()
        second = await start(client, worker, world, alerts=[xid_alert(13, "fp-13b")])
        two = await second.result()
    assert (one.status.runbook, one.outcome) == ("default", "not-quarantined")
    assert two.outcome == "not-quarantined"
    sent = world.args(ACT_NOTIFY)
    assert [n.channel for n in sent] == ["slack", "slack"]  # never pagerduty
    assert all(n.incident.reason == "application-error" for n in sent)
    keys = [n.incident.dedup_key for n in sent]
    assert keys[0] != keys[1] and all(k.startswith(first.id + "/") for k in keys)
    assert world.args(ACT_QUARANTINE) == []
    assert one.status.phase is Phase.CLOSED


async def test_conflicting_index_and_uuid_are_invalid_input(
    time_skipping_env: WorkflowEnvironment,
) -> None:
    """The Web UI form with `gpu_index` 1 and GPU 0's UUID: refused, nothing done."""
    from contract.kube import DeviceRef
    from contract.names import WF_REMEDIATE, device_workflow_id
    from contract.remediation import RemediationInput, RemediationResult

    client = time_skipping_env.client
    world = FakeWorld()

    @fake_of(KubeActivities.resolve_device)
    async def gpu_zero(req: ResolveDeviceInput) -> ResolvedDevice:
        return world.device.model_copy(update={"gpu_index": 0})

    async with new_worker(client, world, extra_activities=[gpu_zero]) as worker:
        handle = await client.start_workflow(
            WF_REMEDIATE,
            RemediationInput(
                device=DeviceRef(node=world.node, gpu_uuid=world.gpu_uuid, gpu_index=1)
            ),
            id=device_workflow_id(world.node, world.gpu_uuid),
            task_queue=worker.task_queue,
            result_type=RemediationResult,
        )
        with pytest.raises(WorkflowFailureError) as failed:
            await handle.result()
    cause = failed.value.cause
    assert isinstance(cause, ApplicationError) and cause.type == ERR_INVALID_INPUT
    assert "name different GPUs" in cause.message
    assert world.args(ACT_QUARANTINE) == [] and world.args(ACT_NOTIFY) == []
