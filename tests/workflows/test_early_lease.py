"""The budget lease does not wait for the consumers: asked within the strictest budget of any
runbook the consumers could choose, as soon as the device and its counts are known.

Cases:
- the consumers answer late: the lease is asked before they answer, the device counted once,
  by the alert's node, while it was still being resolved;
- granted within the strictest budget: one request, reported within the chosen runbook's;
- refused within the strictest budget, the chosen runbook allows more: asked again within the
  chosen one's and quarantined, nobody paged;
- refused within the chosen runbook's budget too: escalated once, naming its limit;
- a runbook that could be chosen is a dry run: the lease waits for the consumers, and a dry
  run chosen asks for nothing;
- the count by the alert's node fails: the device's pool is counted instead, nothing escalated.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from temporalio.exceptions import ApplicationError
from temporalio.testing import WorkflowEnvironment

from activities.kube import KubeActivities
from contract.kube import CountDevicesInput, DeviceCounts
from contract.names import (
    ACT_ACQUIRE_BUDGET,
    ACT_COUNT_DEVICES,
    ACT_FIND_CONSUMERS,
    ACT_NOTIFY,
    ACT_QUARANTINE,
    SIG_REPAIRED,
)
from contract.remediation import Phase, RemediationResult, RepairedRequest
from tests.workflows.fakes import (
    FakeWorld,
    fake_of,
    make_runbook,
    new_worker,
    start,
    wait_phase,
    without_repair,
)

INFERENCE_MATCH = {"ownerKinds": ["Deployment"]}  # the fake consumer is a Deployment's pod


def two_budgets(*, default_pool: int = 2, chosen_pool: int = 6, **chosen: Any) -> list[Any]:
    """`default` allows `default_pool` GPUs out per pool; `inference` (the consumer's match)
    allows `chosen_pool`; the cluster limit is loose in both."""
    budget = {"maxPerCluster": 16}
    return without_repair(
        [
            make_runbook("default", 0, budget={**budget, "maxPerPool": default_pool}),
            make_runbook(
                "inference",
                10,
                match=INFERENCE_MATCH,
                budget={**budget, "maxPerPool": chosen_pool},
                **chosen,
            ),
        ]
    )


async def quarantine_and_close(
    env: WorkflowEnvironment, world: FakeWorld, extra_activities: list[Any] | None = None
) -> RemediationResult:
    async with new_worker(env.client, world, extra_activities=extra_activities or []) as worker:
        handle = await start(env.client, worker, world)
        await wait_phase(handle, Phase.HOLDING)
        await handle.signal(SIG_REPAIRED, RepairedRequest(actor="bob"))
        return await handle.result()


def acquired(result: RemediationResult) -> str:
    return next(e.outcome for e in result.timeline if e.action == "budget lease acquired")


async def test_the_lease_does_not_wait_for_the_consumers(
    time_skipping_env: WorkflowEnvironment,
) -> None:
    world = FakeWorld(consumers_delay=timedelta(milliseconds=300))
    result = await quarantine_and_close(time_skipping_env, world)
    names = world.names()
    assert names.index(ACT_ACQUIRE_BUDGET) < names.index(ACT_FIND_CONSUMERS)
    counted = world.args(ACT_COUNT_DEVICES)
    assert [(c.node, c.node_pool) for c in counted] == [(world.node, None)]  # once, by node
    assert len(world.args(ACT_ACQUIRE_BUDGET)) == 1 and len(world.args(ACT_QUARANTINE)) == 1
    assert result.outcome == "released"


async def test_granted_within_the_strictest_budget_is_reported_within_the_chosen(
    time_skipping_env: WorkflowEnvironment,
) -> None:
    world = FakeWorld(runbooks=two_budgets(), budget_pool_in_use=1)
    result = await quarantine_and_close(time_skipping_env, world)
    asked = world.args(ACT_ACQUIRE_BUDGET)
    assert [a.pool_limit for a in asked] == [2]  # the strictest: default's
    assert result.status.runbook == "inference"
    assert acquired(result).startswith("pool 2/6,")  # within the chosen runbook's budget
    assert world.args(ACT_NOTIFY) == []


async def test_refused_within_the_strictest_is_asked_within_the_chosen(
    time_skipping_env: WorkflowEnvironment,
) -> None:
    world = FakeWorld(runbooks=two_budgets(), budget_pool_in_use=3)
    result = await quarantine_and_close(time_skipping_env, world)
    assert [a.pool_limit for a in world.args(ACT_ACQUIRE_BUDGET)] == [2, 6]
    assert len(world.args(ACT_QUARANTINE)) == 1
    assert acquired(result).startswith("pool 4/6,")
    assert "budget denied" not in [e.action for e in result.timeline]
    assert world.args(ACT_NOTIFY) == []  # nobody paged


async def test_refused_within_the_chosen_budget_escalates_naming_it(
    time_skipping_env: WorkflowEnvironment,
) -> None:
    world = FakeWorld(runbooks=two_budgets(), budget_pool_in_use=6)
    async with new_worker(time_skipping_env.client, world) as worker:
        handle = await start(time_skipping_env.client, worker, world)
        await wait_phase(handle, Phase.ESCALATED)
        await handle.signal(SIG_REPAIRED, RepairedRequest(actor="ops"))
        result = await handle.result()
    assert [a.pool_limit for a in world.args(ACT_ACQUIRE_BUDGET)[:2]] == [2, 6]
    assert ACT_QUARANTINE not in world.names()
    denied = next(e for e in result.timeline if e.action == "budget denied")
    assert "6/6 of 8 devices" in denied.reason and "has 6 of 6 allowed" in denied.reason
    assert result.status.escalation_reason == "budget-exhausted"
    assert sum(e.action == "escalate" for e in result.timeline) == 1


async def test_a_dry_run_that_could_be_chosen_keeps_the_lease_for_the_chosen(
    time_skipping_env: WorkflowEnvironment,
) -> None:
    # `default` is a dry run the consumer does not choose: the lease waits for the consumers.
    world = FakeWorld(
        runbooks=[
            *(rb for rb in two_budgets() if rb.name != "default"),
            make_runbook("default", 0, dryRun=True),
        ],
        consumers_delay=timedelta(milliseconds=300),
    )
    result = await quarantine_and_close(time_skipping_env, world)
    names = world.names()
    assert names.index(ACT_FIND_CONSUMERS) < names.index(ACT_ACQUIRE_BUDGET)
    assert [a.pool_limit for a in world.args(ACT_ACQUIRE_BUDGET)] == [6]
    assert result.outcome == "released"
    # The dry run chosen (no consumers): nothing asked of the budget, nothing tainted.
    dry = FakeWorld(runbooks=world.runbooks, consumers=[])
    async with new_worker(time_skipping_env.client, dry) as worker:
        handle = await start(time_skipping_env.client, worker, dry)
        outcome = await handle.result()
    assert outcome.outcome == "dry-run"
    assert dry.args(ACT_ACQUIRE_BUDGET) == [] and ACT_QUARANTINE not in dry.names()


async def test_a_failed_count_by_node_is_counted_again_by_pool(
    time_skipping_env: WorkflowEnvironment,
) -> None:
    """The count taken while resolving fails: never the step's failure; the device's pool is
    counted once it is known, and the lease asked within it."""
    world = FakeWorld()

    @fake_of(KubeActivities.count_devices)
    async def by_pool_only(req: CountDevicesInput) -> DeviceCounts:
        world.calls.append((ACT_COUNT_DEVICES, req))
        if req.node_pool is None:
            raise ApplicationError("the API server is gone", non_retryable=True)
        return world.counts.model_copy(update={"node_pool": req.node_pool})

    result = await quarantine_and_close(time_skipping_env, world, [by_pool_only])
    counted = [(c.node, c.node_pool) for c in world.args(ACT_COUNT_DEVICES)]
    assert counted == [(world.node, None), (None, world.node_pool)]
    assert len(world.args(ACT_ACQUIRE_BUDGET)) == 1 and len(world.args(ACT_QUARANTINE)) == 1
    assert result.outcome == "released"
