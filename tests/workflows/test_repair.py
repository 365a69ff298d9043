"""The repair ladder in the remediation workflow, on the time-skipping server with the
activity fakes (the procedure's from fakes.py, the rungs' from repair_fakes.py).

Cases:
- reset passes: Xid 48 -> quarantine -> replacement -> reset Job (holders checked first) ->
  validation passes -> released with no human step (no hold, no page); the status query and
  the timeline show the rung and the validation's summary; Events for the validation;
- reset fails validation -> reboot (provider preflight, node cordoned and drained through the
  Eviction API with PodDisruptionBudgets honoured, the budget lease grown to the node's GPUs,
  the reboot asked once under the attempt's key, logged before and after) -> validation
  passes -> released;
- Xid 79: reset not applicable (off the bus) -> reboot -> released; the timeline says why
  the reset was skipped;
- every rung fails validation -> escalated "repair-failed" naming each, device held until
  repaired;
- no provider for the node rung (runbook names none) -> escalated, nothing drained; the
  provider refusing at the preflight -> escalated naming it, nothing drained;
- replace: Xid 64 -> the node replaced -> the remediation follows the new node, cordoned the
  moment it is seen, runs one validation Job per new GPU; all pass -> the new node uncordoned,
  closed for the old GPU (rule removed, lease given back) with the validation in the
  timeline, Events and outcome; one fails -> escalated "repair-failed" naming it, the new
  node kept cordoned until a person releases; a new GPU a pod took before the guard ->
  not validated, not evicted, named in the escalation; validation.enabled false -> the timeline and
  outcome say the new GPUs were not validated; dry run says it would validate them;
- budget with node-wide rungs: the budget refuses the node's GPUs -> escalated
  budget-exhausted, the node never rebooted; a reset group of 4 asks for 4;
- the budget workflow counts GPUs per lease: an extension fits or is refused, the lease
  stays as it was when refused;
- dry run: the timeline and result say what each rung would do; no rung activity runs;
- repair.enabled false (the runbook's off switch): held as before, no rung activity runs;
- a drain blocked by a PodDisruptionBudget: escalated eviction-timeout, never forced;
- a reset Job whose pod the API refuses (RepairJobRefused with the FailedCreate text) ->
  escalated "repair-failed" with that text in the timeline and the page, no reboot tried; a
  validation image outside the allowlist (RepairNotAllowed at its start) -> the same, naming it.
"""

from __future__ import annotations

import uuid
from typing import Any

import pytest
from temporalio.exceptions import ApplicationError
from temporalio.testing import WorkflowEnvironment
from temporalio.worker import Worker

from activities.budget_client import BudgetActivities
from contract.budget import BudgetDecision, BudgetLeaseRequest, BudgetState
from contract.errors import (
    ERR_PROVIDER_NOT_CONFIGURED,
    ERR_REPAIR_JOB_REFUSED,
    ERR_REPAIR_NOT_ALLOWED,
    ERR_STILL_WAITING,
)
from contract.kube import EvictionReport, EvictPodsResult, PodRef
from contract.names import (
    ACT_ACQUIRE_BUDGET,
    ACT_CHECK_GPU_HOLDERS,
    ACT_CORDON,
    ACT_EVICT_PODS,
    ACT_NOTIFY,
    ACT_REBOOT_NODE,
    ACT_RECORD_EVENT,
    ACT_RELEASE_QUARANTINE,
    ACT_REPLACE_NODE,
    ACT_START_RESET_JOB,
    ACT_START_VALIDATION_JOB,
    ACT_WAIT_NODE_GPUS,
    QRY_BUDGET_STATE,
    SIG_REPAIRED,
    budget_task_queue,
)
from contract.remediation import Phase, RepairedRequest, TimelineEntry
from contract.runbook import Runbook
from tests.workflows.fakes import (
    FakeWorld,
    fake_of,
    new_worker,
    shipped_runbooks,
    start,
    wait_phase,
    xid_alert,
)
from tests.workflows.histories import save_history
from tests.workflows.repair_fakes import RepairScript, repair_activities
from workflows.budget import BudgetWorkflow

REPAIR_ACTS = {
    ACT_START_RESET_JOB,
    ACT_START_VALIDATION_JOB,
    ACT_REBOOT_NODE,
    ACT_REPLACE_NODE,
    ACT_WAIT_NODE_GPUS,
    ACT_CHECK_GPU_HOLDERS,
}


def actions(timeline: list[TimelineEntry]) -> list[str]:
    return [e.action for e in timeline]


def entry(timeline: list[TimelineEntry], action: str) -> TimelineEntry:
    return next(e for e in timeline if e.action == action)


def runbooks(provider: str | None = "cluster-api", **repair: Any) -> list[Runbook]:
    """The shipped runbooks, the node rungs' provider set (or none) and `repair` overrides."""
    out = []
    for rb in shipped_runbooks():
        spec = rb.spec
        scale = spec.scale_up.model_copy(
            update={"provider": provider, "enabled": spec.scale_up.enabled and bool(provider)}
        )
        rep = spec.repair.model_copy(update=repair) if repair else spec.repair
        out.append(
            rb.model_copy(
                update={"spec": spec.model_copy(update={"scale_up": scale, "repair": rep})}
            )
        )
    return out


def worker_for(client: Any, world: FakeWorld, script: RepairScript, *extra: Any) -> Worker:
    return new_worker(client, world, extra_activities=[*repair_activities(world, script), *extra])


async def test_reset_passes_validation_and_releases(time_skipping_env: WorkflowEnvironment) -> None:
    client = time_skipping_env.client
    world = FakeWorld(runbooks=runbooks())
    async with new_worker(
        client,
        world,
        extra_activities=repair_activities(world, RepairScript()),
        replay_every_task=True,
    ) as worker:
        handle = await start(client, worker, world, alerts=[xid_alert(48, "fp-48")])
        result = await handle.result()
    assert result.outcome == "released", result.reason
    assert "reset repaired it; validation passed" in result.reason
    names = world.names()
    # Rung only after the consumers are gone; holders checked before the reset Job.
    assert names.index("wait-for-replacement") < names.index(ACT_CHECK_GPU_HOLDERS)
    assert names.index(ACT_CHECK_GPU_HOLDERS) < names.index(ACT_START_RESET_JOB)
    assert names.index(ACT_START_RESET_JOB) < names.index(ACT_START_VALIDATION_JOB)
    assert names.index(ACT_START_VALIDATION_JOB) < names.index(ACT_RELEASE_QUARANTINE)
    assert ACT_NOTIFY not in names and ACT_REBOOT_NODE not in names  # no page, no reboot
    reset = world.args(ACT_START_RESET_JOB)[0]
    assert reset.gpu_uuids == [world.gpu_uuid] and reset.attempt == 1
    validation = world.args(ACT_START_VALIDATION_JOB)[0]
    assert validation.gpu_uuid == world.gpu_uuid and validation.device == "gpu-0"
    assert validation.taint_key == "sickbay.dev/unhealthy" and validation.level == 2
    acts = actions(result.timeline)
    assert "marked repaired" not in acts and "holding" not in [e.phase for e in result.timeline]
    assert entry(result.timeline, "repair ladder").outcome == "reset -> reboot -> replace"
    assert "Diagnostic | PASS" in entry(result.timeline, "validation passed").reason
    assert result.status.repair_rung == "reset" and result.status.repair_attempt == 1
    assert result.status.validation == "passed after reset: Diagnostic | PASS"
    assert Phase.VALIDATING in [e.phase for e in result.timeline]
    reasons = [e.reason for e in world.args(ACT_RECORD_EVENT)]
    assert "GPUValidationPassed" in reasons
    # Only the device's own GPU taken out: no budget extension.
    assert [a.gpus for a in world.args(ACT_ACQUIRE_BUDGET)] == [1]
    save_history("repair_reset_pass", await handle.fetch_history())


async def test_reset_fails_then_reboot_passes(time_skipping_env: WorkflowEnvironment) -> None:
    client = time_skipping_env.client
    world = FakeWorld(runbooks=runbooks())
    other = PodRef(namespace="batch", name="sibling-job-xyz")
    script = RepairScript(
        validations=[False, True], node_gpus=[world.gpu_uuid, "GPU-b"], node_pods=[other]
    )
    async with new_worker(
        client, world, extra_activities=repair_activities(world, script), replay_every_task=True
    ) as worker:
        handle = await start(client, worker, world, alerts=[xid_alert(48, "fp-48")])
        result = await handle.result()
    assert result.outcome == "released", result.reason
    assert "reboot repaired it" in result.reason
    reboots = world.args(ACT_REBOOT_NODE)
    # A preflight that asks nothing, then exactly one real request under attempt 2's key.
    assert [r.dry_run for r in reboots] == [True, False]
    asked = reboots[1]
    assert asked.attempt == 2 and asked.pool is not None and asked.pool.provider == "cluster-api"
    assert asked.idempotency_key.startswith(handle.id + "/") and asked.idempotency_key.endswith(
        "/reboot/2"
    )
    names = world.names()
    # Drained before the reboot: cordon, Eviction API honouring PDBs (never delete).
    assert names.index(ACT_CORDON) < names.index(ACT_EVICT_PODS)
    evict = world.args(ACT_EVICT_PODS)[-1]
    assert evict.pods == [other] and not evict.delete_if_blocked and evict.retry_blocked_for
    assert names.index(ACT_EVICT_PODS) < len(names) - names[::-1].index(ACT_REBOOT_NODE) - 1
    # The budget counts every GPU of the node for the reboot.
    assert [a.gpus for a in world.args(ACT_ACQUIRE_BUDGET)] == [1, 2]
    acts = actions(result.timeline)
    assert acts.index("reboot requested") < acts.index("reboot asked")
    assert "validation failed" in acts and "validation passed" in acts
    assert [v.attempt for v in world.args(ACT_START_VALIDATION_JOB)] == [1, 2]
    wait = world.args(ACT_WAIT_NODE_GPUS)[0]
    assert not wait.replaced and wait.expected_gpus == 2 and wait.asked_at is not None
    # The node Sickbay cordoned for the drain is uncordoned once the reboot is done (before
    # the validation pod must land there); the device itself stays under its rule.
    assert [c.cordon for c in world.args(ACT_CORDON)] == [True, False]
    uncordon = len(names) - names[::-1].index(ACT_CORDON) - 1
    assert uncordon < len(names) - names[::-1].index(ACT_START_VALIDATION_JOB) - 1
    save_history("repair_reset_fail_reboot", await handle.fetch_history())


async def test_xid_79_skips_reset_and_reboots(time_skipping_env: WorkflowEnvironment) -> None:
    client = time_skipping_env.client
    world = FakeWorld(runbooks=runbooks())
    async with worker_for(client, world, RepairScript()) as worker:
        handle = await start(client, worker, world, alerts=[xid_alert(79)])
        result = await handle.result()
    assert result.outcome == "released", result.reason
    assert ACT_START_RESET_JOB not in world.names()
    ladder = entry(result.timeline, "repair ladder")
    assert ladder.outcome == "reboot -> replace"
    assert "reset not applicable: Xid 79" in ladder.reason
    assert [r.attempt for r in world.args(ACT_REBOOT_NODE) if not r.dry_run] == [1]


async def test_ladder_exhausted_escalates_and_holds(time_skipping_env: WorkflowEnvironment) -> None:
    client = time_skipping_env.client
    world = FakeWorld(runbooks=runbooks(order=["reset", "reboot"]))
    script = RepairScript(validations=[False, False])
    async with worker_for(client, world, script) as worker:
        handle = await start(client, worker, world, alerts=[xid_alert(48, "fp-48")])
        status = await wait_phase(handle, Phase.HOLDING)
        assert status.escalation_reason == "repair-failed"
        assert status.validation is not None and status.validation.startswith("failed after reboot")
        await handle.signal(SIG_REPAIRED, RepairedRequest(actor="alice", note="RMA done"))
        result = await handle.result()
    assert result.outcome == "escalated"
    notes = world.args(ACT_NOTIFY)
    assert notes and "repair ladder exhausted" in notes[0].incident.summary
    assert "reset: validation failed" in notes[0].incident.summary
    assert "reboot: validation failed" in notes[0].incident.summary


@pytest.mark.parametrize("provider", [None, "karpenter"])  # Karpenter reboots nothing
async def test_no_provider_escalates_before_draining(
    time_skipping_env: WorkflowEnvironment, provider: str | None
) -> None:
    client = time_skipping_env.client
    world = FakeWorld(runbooks=runbooks(provider=provider))
    async with worker_for(client, world, RepairScript()) as worker:
        handle = await start(client, worker, world, alerts=[xid_alert(79)])
        status = await wait_phase(handle, Phase.HOLDING)
        await handle.signal(SIG_REPAIRED, RepairedRequest(actor="alice", note="rebooted by hand"))
        result = await handle.result()
    assert status.escalation_reason == "repair-failed"
    assert "no provider configured" in world.args(ACT_NOTIFY)[0].incident.summary
    assert ACT_REBOOT_NODE not in world.names() and ACT_CORDON not in world.names()
    assert result.outcome == "escalated"


async def test_provider_refusal_escalates_naming_it(time_skipping_env: WorkflowEnvironment) -> None:
    client = time_skipping_env.client
    world = FakeWorld(runbooks=runbooks(provider="gke"))
    refusal = ApplicationError(
        "no reboot provider for node gpu-node-1: 'gke' is not configured (configured: cluster-api)",
        type=ERR_PROVIDER_NOT_CONFIGURED,
        non_retryable=True,
    )
    script = RepairScript(machine_errors={"reboot": refusal})
    async with worker_for(client, world, script) as worker:
        handle = await start(client, worker, world, alerts=[xid_alert(79)])
        status = await wait_phase(handle, Phase.HOLDING)
        await handle.signal(SIG_REPAIRED, RepairedRequest(actor="alice", note="done"))
        await handle.result()
    assert status.escalation_reason == "repair-failed"
    summary = world.args(ACT_NOTIFY)[0].incident.summary
    assert "'gke' is not configured" in summary and "RepairProviderNotConfigured" in summary
    assert [r.dry_run for r in world.args(ACT_REBOOT_NODE)] == [True]  # preflight only
    assert ACT_CORDON not in world.names() and ACT_EVICT_PODS not in world.names()


def without_validation(rbs: list[Runbook]) -> list[Runbook]:
    out = []
    for rb in rbs:
        val = rb.spec.validation.model_copy(update={"enabled": False})
        out.append(rb.model_copy(update={"spec": rb.spec.model_copy(update={"validation": val})}))
    return out


NEW_GPUS = ["GPU-new-0", "GPU-new-1"]


async def test_replace_validates_new_gpus_then_closes(
    time_skipping_env: WorkflowEnvironment,
) -> None:
    client = time_skipping_env.client
    world = FakeWorld(runbooks=runbooks())
    script = RepairScript(new_gpus=NEW_GPUS, node_gpus=[world.gpu_uuid, "GPU-old-1"])
    async with worker_for(client, world, script) as worker:
        handle = await start(client, worker, world, alerts=[xid_alert(64, "fp-64")])
        result = await handle.result()
    assert result.outcome == "released", result.reason
    assert result.reason.startswith("replaced:") and "new node gpu-node-new" in result.reason
    assert "no longer exists" in result.reason
    assert "validated: dcgmi diag level 2 passed on GPU-new-0, GPU-new-1" in result.reason
    wait = world.args(ACT_WAIT_NODE_GPUS)[0]
    assert wait.replaced and wait.previous_uuids == [world.gpu_uuid, "GPU-old-1"]
    # The guard goes on the new node the moment it is seen (before its GPUs are published).
    assert wait.guard_workflow_id == handle.id
    assert [r.dry_run for r in world.args(ACT_REPLACE_NODE)] == [True, False]
    # One validation Job per new GPU, on the new node, started before any is waited for.
    jobs = world.args(ACT_START_VALIDATION_JOB)
    assert [(j.node, j.gpu_uuid) for j in jobs] == [("gpu-node-new", u) for u in NEW_GPUS]
    assert all(j.device is None and j.pool is None for j in jobs)  # resolved on the new node
    assert len({j.incident for j in jobs}) == 2  # a Job of its own per GPU
    names = world.names()
    assert names.index(ACT_START_VALIDATION_JOB) < names.index(ACT_RELEASE_QUARANTINE)
    # The old node (gone) is never uncordoned; the new one is once every GPU passed.
    cordons = [(c.node, c.cordon) for c in world.args(ACT_CORDON)]
    assert cordons == [(world.node, True), ("gpu-node-new", False)]
    assert names.index(ACT_CORDON, names.index(ACT_START_VALIDATION_JOB)) < names.index(
        ACT_RELEASE_QUARANTINE
    )
    acts = actions(result.timeline)
    assert "new GPUs guarded" in acts and "validation passed" in acts
    passed = [e for e in result.timeline if e.action == "validation passed"]
    assert [e.outcome for e in passed] == [f"GPU {u} after replace" for u in NEW_GPUS]
    events = [(e.reason, e.message) for e in world.args(ACT_RECORD_EVENT)]
    passed_events = [m for r, m in events if r == "GPUValidationPassed"]
    assert [m.split(": ", 1)[1] for m in passed_events] == [
        f"validation of new GPU {u} on gpu-node-new after replace passed: Diagnostic | PASS"
        for u in NEW_GPUS
    ]
    # The budget: the lease that counted the old node's 2 GPUs covers the 2 new ones.
    leases = [a.gpus for a in world.args(ACT_ACQUIRE_BUDGET)]
    assert leases[-1] == 2 and ACT_NOTIFY not in names


async def test_replace_new_gpu_fails_validation_escalates_and_keeps_it_guarded(
    time_skipping_env: WorkflowEnvironment,
) -> None:
    client = time_skipping_env.client
    world = FakeWorld(runbooks=runbooks())
    script = RepairScript(new_gpus=NEW_GPUS, validations=[True, False])
    async with worker_for(client, world, script) as worker:
        handle = await start(client, worker, world, alerts=[xid_alert(64, "fp-64")])
        status = await wait_phase(handle, Phase.HOLDING)
        assert status.escalation_reason == "repair-failed"
        assert status.validation is not None and "GPU-new-1" in status.validation
        # Held: the new node stays cordoned (its unvalidated GPUs out of service).
        assert [c.cordon for c in world.args(ACT_CORDON)] == [True]
        assert ACT_RELEASE_QUARANTINE not in world.names()
        await handle.signal(SIG_REPAIRED, RepairedRequest(actor="alice", note="GPU swapped"))
        result = await handle.result()
    assert result.outcome == "escalated"
    summary = world.args(ACT_NOTIFY)[0].incident.summary
    assert "new node gpu-node-new" in summary and "GPU-new-1 failed validation" in summary
    assert "Memory | FAIL: ECC DBE" in summary and "GPU-new-0" in summary  # passed, named
    assert "kept cordoned" in summary
    events = [(e.reason, e.type) for e in world.args(ACT_RECORD_EVENT)]
    assert ("GPUValidationFailed", "Warning") in events
    # Released by the person: Sickbay's cordon of the new node goes with the quarantine.
    assert [(c.node, c.cordon) for c in world.args(ACT_CORDON)][-1] == ("gpu-node-new", False)


async def test_replace_new_gpu_taken_before_the_guard_is_named_not_validated(
    time_skipping_env: WorkflowEnvironment,
) -> None:
    client = time_skipping_env.client
    world = FakeWorld(runbooks=runbooks())
    pod = PodRef(namespace="serving", name="llm-new", uid="u-new")
    script = RepairScript(new_gpus=NEW_GPUS, new_gpu_holders={"GPU-new-1": [pod]})
    async with worker_for(client, world, script) as worker:
        handle = await start(client, worker, world, alerts=[xid_alert(64, "fp-64")])
        status = await wait_phase(handle, Phase.HOLDING)
        assert status.escalation_reason == "repair-failed"
        # Only the free GPU is validated; the workload is not evicted from the other.
        jobs = world.args(ACT_START_VALIDATION_JOB)
        assert [j.gpu_uuid for j in jobs] == ["GPU-new-0"]
        assert ACT_EVICT_PODS not in world.names()[world.names().index(ACT_REPLACE_NODE) :]
        await handle.signal(SIG_REPAIRED, RepairedRequest(actor="alice", note="checked"))
        await handle.result()
    summary = world.args(ACT_NOTIFY)[0].incident.summary
    assert "GPU GPU-new-1 not validated: in use by serving/llm-new" in summary
    assert "passed: GPU-new-0" in summary and "kept cordoned" in summary
    reasons = [(e.reason, e.type) for e in world.args(ACT_RECORD_EVENT)]
    assert ("GPUValidationSkipped", "Warning") in reasons


async def test_replace_without_validation_says_the_new_gpus_were_not_validated(
    time_skipping_env: WorkflowEnvironment,
) -> None:
    client = time_skipping_env.client
    world = FakeWorld(runbooks=without_validation(runbooks()))
    async with worker_for(client, world, RepairScript(new_gpus=NEW_GPUS)) as worker:
        handle = await start(client, worker, world, alerts=[xid_alert(64, "fp-64")])
        result = await handle.result()
    assert result.outcome == "released", result.reason
    assert "not validated (validation.enabled is false)" in result.reason
    assert ACT_START_VALIDATION_JOB not in world.names()
    assert world.args(ACT_WAIT_NODE_GPUS)[0].guard_workflow_id is None  # nothing to guard
    note = entry(result.timeline, "not validated")
    assert "GPU-new-0, GPU-new-1" in note.reason and "gpu-node-new" in note.reason
    assert [c.cordon for c in world.args(ACT_CORDON)] == [True]


async def test_dry_run_of_a_replace_says_it_would_validate_the_new_gpus(
    time_skipping_env: WorkflowEnvironment,
) -> None:
    client = time_skipping_env.client
    world = FakeWorld(runbooks=runbooks())
    async with worker_for(client, world, RepairScript()) as worker:
        handle = await start(client, worker, world, alerts=[xid_alert(64, "fp-64")], dry_run=True)
        result = await handle.result()
    would = [e.reason for e in result.timeline if e.action == "dry run: would repair"]
    assert len(would) == 2 and "replace node" in would[0]
    assert "cordon the new node as soon as it registers" in would[1]
    assert "one validation Job per new GPU" in would[1]
    assert not REPAIR_ACTS & set(world.names())


async def test_budget_refuses_node_rung(time_skipping_env: WorkflowEnvironment) -> None:
    client = time_skipping_env.client
    world = FakeWorld(runbooks=runbooks())

    @fake_of(BudgetActivities.acquire_budget_lease)
    async def acquire(req: BudgetLeaseRequest) -> BudgetDecision:
        world.calls.append((ACT_ACQUIRE_BUDGET, req))
        if req.gpus > 1:
            return BudgetDecision(granted=False, reason="pool pool-a has 1 of 4 allowed")
        return BudgetDecision(granted=True, pool_in_use=1, cluster_in_use=1)

    script = RepairScript(node_gpus=[world.gpu_uuid, *(f"GPU-{i}" for i in range(7))])
    async with worker_for(client, world, script, acquire) as worker:
        handle = await start(client, worker, world, alerts=[xid_alert(79)])
        status = await wait_phase(handle, Phase.HOLDING)
        await handle.signal(SIG_REPAIRED, RepairedRequest(actor="alice", note="done"))
        await handle.result()
    assert status.escalation_reason == "budget-exhausted"
    assert [a.gpus for a in world.args(ACT_ACQUIRE_BUDGET)] == [1, 8]
    assert "would take 8 GPUs out of service" in world.args(ACT_NOTIFY)[0].incident.summary
    assert [r.dry_run for r in world.args(ACT_REBOOT_NODE)] == [True]  # never asked
    assert ACT_EVICT_PODS not in world.names()


async def test_reset_group_counts_every_gpu(time_skipping_env: WorkflowEnvironment) -> None:
    client = time_skipping_env.client
    world = FakeWorld(runbooks=runbooks())
    group = [world.gpu_uuid, "GPU-g1", "GPU-g2", "GPU-g3"]
    sibling = PodRef(namespace="train", name="on-gpu-g1")
    script = RepairScript(group=group, node_pods=[sibling])
    async with worker_for(client, world, script) as worker:
        handle = await start(client, worker, world, alerts=[xid_alert(48, "fp-48")])
        result = await handle.result()
    assert result.outcome == "released", result.reason
    assert [a.gpus for a in world.args(ACT_ACQUIRE_BUDGET)] == [1, 4]
    assert world.args(ACT_START_RESET_JOB)[0].gpu_uuids == group
    assert world.args(ACT_EVICT_PODS)[-1].pods == [sibling]  # the group drained first
    assert world.names().index(ACT_EVICT_PODS) < world.names().index(ACT_START_RESET_JOB)


async def test_drain_blocked_by_pdb_escalates(time_skipping_env: WorkflowEnvironment) -> None:
    client = time_skipping_env.client
    world = FakeWorld(runbooks=runbooks())
    guarded = PodRef(namespace="db", name="primary-0")
    world.evict_results = [EvictPodsResult(blocked=[guarded])]
    world.eviction_reports = [EvictionReport(gone=[]), EvictionReport(remaining=[guarded])]
    script = RepairScript(node_pods=[guarded])
    async with worker_for(client, world, script) as worker:
        handle = await start(client, worker, world, alerts=[xid_alert(79)])
        status = await wait_phase(handle, Phase.HOLDING)
        await handle.signal(SIG_REPAIRED, RepairedRequest(actor="alice", note="done"))
        await handle.result()
    assert status.escalation_reason == "eviction-timeout"
    assert "db/primary-0 (PodDisruptionBudget)" in world.args(ACT_NOTIFY)[0].incident.summary
    assert [r.dry_run for r in world.args(ACT_REBOOT_NODE)] == [True]
    assert not any(e.delete_if_blocked for e in world.args(ACT_EVICT_PODS))


async def test_dry_run_says_what_each_rung_would_do(time_skipping_env: WorkflowEnvironment) -> None:
    client = time_skipping_env.client
    world = FakeWorld(runbooks=runbooks())
    async with worker_for(client, world, RepairScript()) as worker:
        handle = await start(client, worker, world, alerts=[xid_alert(48, "fp-48")], dry_run=True)
        result = await handle.result()
    assert result.outcome == "dry-run"
    would = [e.reason for e in result.timeline if e.action == "dry run: would repair"]
    assert len(would) == 4  # reset, reboot, replace, validation
    assert would[0].startswith(f"reset GPU {world.gpu_uuid}")
    assert "reboot node" in would[1] and "provider cluster-api" in would[1]
    assert "validate with dcgmi diag level 2" in would[3]
    assert "then reset GPU" in result.reason
    assert not REPAIR_ACTS & set(world.names())


async def test_repair_disabled_holds_as_before(time_skipping_env: WorkflowEnvironment) -> None:
    client = time_skipping_env.client
    world = FakeWorld(runbooks=runbooks(enabled=False))
    async with worker_for(client, world, RepairScript()) as worker:
        handle = await start(client, worker, world, alerts=[xid_alert(48, "fp-48")])
        await wait_phase(handle, Phase.HOLDING)
        await handle.signal(SIG_REPAIRED, RepairedRequest(actor="alice", note="done"))
        result = await handle.result()
    assert result.outcome == "released"
    assert not REPAIR_ACTS & set(world.names())
    assert "repair ladder" not in actions(result.timeline)


def _lease(holder: str, gpus: int = 1) -> BudgetLeaseRequest:
    return BudgetLeaseRequest(
        holder=holder,
        device_key=f"{holder}/gpu",
        node_pool="pool-a",
        pool_limit=4,
        cluster_limit=10,
        gpus=gpus,
    )


async def test_budget_counts_gpus_per_lease(time_skipping_env: WorkflowEnvironment) -> None:
    client = time_skipping_env.client
    queue = f"tq-{uuid.uuid4()}"
    budget_id = f"sickbay-budget-{uuid.uuid4().hex[:8]}"
    budget = BudgetActivities(client, queue, workflow_id=budget_id)
    async with Worker(
        client,
        task_queue=budget_task_queue(queue),
        workflows=[BudgetWorkflow],
        activities=[budget.reconcile_budget_leases],
    ):
        a = await budget.acquire_budget_lease(_lease("wf-a"))
        b = await budget.acquire_budget_lease(_lease("wf-b"))
        too_big = await budget.acquire_budget_lease(_lease("wf-a", gpus=4))  # 1 other + 4 > 4
        fits = await budget.acquire_budget_lease(_lease("wf-a", gpus=3))  # 1 + 3 = 4
        again = await budget.acquire_budget_lease(_lease("wf-a", gpus=2))  # within its lease
        full = await budget.acquire_budget_lease(_lease("wf-c"))
        handle = client.get_workflow_handle(budget_id)
        state = await handle.query(QRY_BUDGET_STATE, result_type=BudgetState)
        await handle.terminate("test done")
    assert a.granted and b.granted
    assert not too_big.granted and "4 GPUs asked for" in too_big.reason
    assert fits.granted and fits.pool_in_use == 4
    assert again.granted and again.reason == "already held"
    assert not full.granted
    assert {lease.holder: lease.gpus for lease in state.leases} == {"wf-a": 3, "wf-b": 1}


def test_a_poll_that_ran_out_of_time_says_what_it_still_waited_for() -> None:
    """A wait for a node (schedule-to-close = the rung's timeout) ends in a TimeoutError whose
    cause is the last StillWaiting: the rung's failure names it, e.g. the replacement Sickbay
    left cordoned, instead of only "activity ScheduleToClose timeout"."""
    from temporalio.exceptions import TimeoutError as TemporalTimeoutError
    from temporalio.exceptions import TimeoutType

    from workflows.remediation.calls import error_text

    timeout = TemporalTimeoutError(
        "activity ScheduleToClose timeout",
        type=TimeoutType.SCHEDULE_TO_CLOSE,
        last_heartbeat_details=[],
    )
    timeout.__cause__ = ApplicationError(
        "waiting for a replacement of gpu-node-1: gpu-node-9: not Ready, 0 GPUs (cordoned by "
        "Sickbay for wf-1: its GPUs are unvalidated; uncordon it once they are checked)",
        type=ERR_STILL_WAITING,
    )
    text = error_text(timeout)
    assert text.startswith("TimeoutError: activity ScheduleToClose timeout; last: StillWaiting:")
    assert "gpu-node-9: not Ready, 0 GPUs (cordoned by Sickbay for wf-1" in text
    bare = TemporalTimeoutError(
        "activity StartToClose timeout", type=None, last_heartbeat_details=[]
    )
    assert error_text(bare) == "TimeoutError: activity StartToClose timeout"


FAILED_CREATE = (
    "Job sickbay-repair/sickbay-reset-1 cannot create its pod: FailedCreate: Error creating: pods "
    '"sickbay-reset-1-x7k2p" is forbidden: violates PodSecurity "restricted:latest": privileged '
    '(container "reset" must not set securityContext.privileged=true)'
)


async def test_a_refused_reset_job_escalates_with_the_apis_reason(
    time_skipping_env: WorkflowEnvironment,
) -> None:
    client = time_skipping_env.client
    world = FakeWorld(runbooks=runbooks())
    refused = ApplicationError(FAILED_CREATE, type=ERR_REPAIR_JOB_REFUSED, non_retryable=True)
    script = RepairScript(job_errors={"reset": refused})
    async with worker_for(client, world, script) as worker:
        handle = await start(client, worker, world, alerts=[xid_alert(48, "fp-48")])
        status = await wait_phase(handle, Phase.HOLDING)
        await handle.signal(SIG_REPAIRED, RepairedRequest(actor="alice", note="namespace fixed"))
        result = await handle.result()
    assert status.escalation_reason == "repair-failed"
    said = entry(result.timeline, "reset Job cannot run")
    assert 'violates PodSecurity "restricted:latest": privileged' in said.reason
    summary = world.args(ACT_NOTIFY)[0].incident.summary
    assert "reset Job cannot run" in summary and "FailedCreate" in summary
    # A configuration problem: no bigger hammer is tried, no validation runs.
    assert ACT_REBOOT_NODE not in world.names() and ACT_START_VALIDATION_JOB not in world.names()


async def test_a_validation_image_outside_the_allowlist_escalates_naming_it(
    time_skipping_env: WorkflowEnvironment,
) -> None:
    client = time_skipping_env.client
    world = FakeWorld(runbooks=runbooks())
    text = "validation Job not created: image 'x/dcgm:latest' is not in the operator's allowlist"
    refused = ApplicationError(text, type=ERR_REPAIR_NOT_ALLOWED, non_retryable=True)
    script = RepairScript(job_errors={"start-validation": refused})
    async with worker_for(client, world, script) as worker:
        handle = await start(client, worker, world, alerts=[xid_alert(48, "fp-48")])
        status = await wait_phase(handle, Phase.HOLDING)
        await handle.signal(SIG_REPAIRED, RepairedRequest(actor="alice", note="fixed"))
        await handle.result()
    assert status.escalation_reason == "repair-failed"
    summary = world.args(ACT_NOTIFY)[0].incident.summary
    assert "validation Job cannot run" in summary and "x/dcgm:latest" in summary
    assert ACT_REBOOT_NODE not in world.names()
