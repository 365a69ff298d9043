"""Karpenter at the Pending deadline (workflows/remediation/replace.py `_karpenter`), on the
time-skipping server with fake activities.

Cases:
- a Karpenter NodePool serves the failed node's workloads and is under its GPU limit: the
  Pending deadline measured Karpenter's provisioning; the remediation escalates `no-capacity`
  naming the NodePool, and Sickbay asks no node pool for capacity (no second scale-up path);
- the NodePool is at its GPU limit, `raiseLimits` off: escalates naming the knob, nothing
  raised, no scale-up;
- at its limit with `raiseLimits` (maxGpus bound): the limit is raised once (the request's
  key), a GPUKarpenterLimitRaised Event says so, the capacity deadline then measures
  Karpenter; the replacement runs; still no node-pool scale-up;
- `scaleUp.provider: karpenter` on a node no Karpenter NodePool provisioned: escalates
  `scale-up-failed`, nothing scaled;
- no Karpenter: the node pool is scaled as before.
"""

from __future__ import annotations

from typing import Any

from temporalio.testing import WorkflowEnvironment

from contract.capacity import KarpenterResult
from contract.kube import ReplacementReport
from contract.names import (
    ACT_KARPENTER_CAPACITY,
    ACT_RECORD_EVENT,
    ACT_REQUEST_CAPACITY,
    SIG_REPAIRED,
)
from contract.remediation import Phase, RepairedRequest
from tests.workflows.fakes import (
    FakeWorld,
    make_runbook,
    new_worker,
    past_deadline,
    shipped_runbooks,
    skipping_watches,
    start,
    wait_phase,
    without_repair,
)

PENDING = ReplacementReport(status="pending", unschedulable_message="0/2 nodes are available")


def with_scale_up(**scale_up: Any) -> list[Any]:
    shipped = without_repair(shipped_runbooks())
    others = [r for r in shipped if r.name != "inference"]
    base = next(r for r in shipped if r.name == "inference")
    spec = base.spec.model_dump(by_alias=True, exclude_none=True, mode="json")
    spec["scaleUp"] = {**spec["scaleUp"], **scale_up}
    spec.pop("precedence", None)
    return [*others, make_runbook("inference", base.spec.precedence, **spec)]


def said(result: Any) -> str:
    """Everything the timeline says (the escalation's words among it)."""
    return " | ".join(f"{e.action}: {e.outcome} {e.reason}" for e in result.timeline)


async def run(env: WorkflowEnvironment, world: FakeWorld) -> Any:
    async with new_worker(env.client, world) as worker:
        handle = await start(env.client, worker, world)
        await past_deadline(env, handle, world, Phase.AWAITING_REPLACEMENT)
        # The capacity wait after the scale-up is a second watch with its own deadline.
        await skipping_watches(env, world, wait_phase(handle, Phase.HOLDING))
        await handle.signal(SIG_REPAIRED, RepairedRequest(actor="kim"))
        return await handle.result()


async def test_karpenter_serves_them_no_second_scale_up(
    time_skipping_env: WorkflowEnvironment,
) -> None:
    world = FakeWorld(
        replacement_reports=[PENDING],
        karpenter=KarpenterResult(
            node_pool="gpu", gpu_limit=64, gpus_used=16, message="NodePool gpu: 16 of 64 used"
        ),
    )
    result = await run(time_skipping_env, world)
    assert result.outcome == "escalated"
    assert result.status.escalation_reason == "no-capacity"
    assert "Karpenter NodePool gpu serves them" in said(result)
    assert "did not provision" in said(result)
    assert ACT_REQUEST_CAPACITY not in world.names()
    [asked] = world.args(ACT_KARPENTER_CAPACITY)
    assert asked.node == world.node and not asked.raise_limits


async def test_at_its_limit_without_the_knob_nothing_is_raised(
    time_skipping_env: WorkflowEnvironment,
) -> None:
    world = FakeWorld(
        replacement_reports=[PENDING],
        karpenter=KarpenterResult(node_pool="gpu", gpu_limit=16, gpus_used=16, at_limit=True),
    )
    result = await run(time_skipping_env, world)
    assert result.status.escalation_reason == "no-capacity"
    assert "raiseLimits is off" in said(result)
    assert [a.raise_limits for a in world.args(ACT_KARPENTER_CAPACITY)] == [False]
    assert ACT_REQUEST_CAPACITY not in world.names()


async def test_the_limit_is_raised_when_the_runbook_says_so(
    time_skipping_env: WorkflowEnvironment,
) -> None:
    world = FakeWorld(
        runbooks=with_scale_up(karpenter={"raiseLimits": True, "gpuStep": 8, "maxGpus": 20}),
        replacement_reports=[PENDING, ReplacementReport(status="running")],
        karpenter=KarpenterResult(node_pool="gpu", gpu_limit=16, gpus_used=16, at_limit=True),
    )
    result = await run(time_skipping_env, world)
    assert result.outcome == "released", said(result)
    asks = world.args(ACT_KARPENTER_CAPACITY)
    assert [a.raise_limits for a in asks] == [False, True]
    assert asks[1].max_gpus == 20 and asks[0].key == asks[1].key
    assert ACT_REQUEST_CAPACITY not in world.names()
    raised = [e for e in world.args(ACT_RECORD_EVENT) if e.reason == "GPUKarpenterLimitRaised"]
    assert raised and "16 -> 20" in raised[0].message


async def test_provider_karpenter_without_karpenter_escalates(
    time_skipping_env: WorkflowEnvironment,
) -> None:
    world = FakeWorld(runbooks=with_scale_up(provider="karpenter"), replacement_reports=[PENDING])
    result = await run(time_skipping_env, world)
    assert result.status.escalation_reason == "scale-up-failed"
    assert "scaleUp.provider is karpenter" in said(result)
    assert ACT_REQUEST_CAPACITY not in world.names()


async def test_without_karpenter_the_pool_is_scaled(
    time_skipping_env: WorkflowEnvironment,
) -> None:
    world = FakeWorld(replacement_reports=[PENDING, ReplacementReport(status="running")])
    result = await run(time_skipping_env, world)
    assert result.outcome == "released"
    assert world.names().index(ACT_KARPENTER_CAPACITY) < world.names().index(ACT_REQUEST_CAPACITY)
