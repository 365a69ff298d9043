"""A HAMi GPU its node could not be kept off alone (no per-GPU cordon: HAMi before v2.10, or
SICKBAY_HAMI_DEVICE_CORDON off): the quarantine tainted the whole node and evicted the
consumers itself, so the remediation escalates `node-quarantined` saying so, holds the node
until the GPU is repaired, and the release lifts the node taint."""

from __future__ import annotations

from temporalio import activity
from temporalio.testing import WorkflowEnvironment

from contract.kube import QuarantineInput, QuarantineResult
from contract.names import (
    ACT_QUARANTINE,
    ACT_RELEASE_QUARANTINE,
    ACT_WAIT_REPLACEMENT,
    SIG_REPAIRED,
)
from contract.remediation import Phase, RepairedRequest
from tests.workflows.fakes import FakeWorld, deployment_consumer, new_worker, start, wait_phase

WHY = (
    "HAMi's scheduler cannot be kept off GPU GPU-x alone (its per-GPU hami.io/device-cordon "
    "needs HAMi v2.10+ and SICKBAY_HAMI_DEVICE_CORDON): node n tainted NoSchedule"
)


async def test_node_level_quarantine_escalates_and_holds(
    time_skipping_env: WorkflowEnvironment,
) -> None:
    client = time_skipping_env.client
    pod = deployment_consumer().pod
    world = FakeWorld()

    @activity.defn(name=ACT_QUARANTINE)
    async def node_level(req: QuarantineInput) -> QuarantineResult:
        world.calls.append((ACT_QUARANTINE, req))
        return QuarantineResult(
            mode="fallback", action="created", evicted=[pod], node_tainted=True, node_level=WHY
        )

    async with new_worker(client, world, extra_activities=[node_level]) as worker:
        handle = await start(client, worker, world)
        await wait_phase(handle, Phase.HOLDING)
        await handle.signal(SIG_REPAIRED, RepairedRequest(actor="erin"))
        result = await handle.result()
    assert result.status.escalation_reason == "node-quarantined"
    escalation = next(e for e in result.timeline if e.action == "escalate")
    assert escalation.reason == WHY
    assert ACT_WAIT_REPLACEMENT not in world.names()  # the quarantine evicted; nothing to wait
    (release,) = world.args(ACT_RELEASE_QUARANTINE)
    assert release.node_tainted  # the node taint is lifted with the GPU's release
