"""Name-matched activity fakes for the remediation workflow tests.

`FakeWorld` plays the cluster, the budget, the node pool and the channels: each activity is a
`@fake_of(RealActivities.method)` closure, registered under the real activity's name and held
by mypy to its input and result types, that records its call and answers from the scripted
state, so a test changes one field (e.g. `eviction_reports`) to drive one branch.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any, Protocol, TypeVar, overload

from temporalio import activity
from temporalio.api.testservice.v1 import LockTimeSkippingRequest, UnlockTimeSkippingRequest
from temporalio.client import Client, WorkflowHandle
from temporalio.exceptions import ApplicationError
from temporalio.service import RPCError
from temporalio.testing import WorkflowEnvironment
from temporalio.worker import Worker

from activities.actors import ActorActivities
from activities.budget_client import BudgetActivities
from activities.capacity import CapacityActivities
from activities.kube import KubeActivities
from activities.launch import LaunchActivities
from activities.ledger import LedgerActivities
from activities.notify.activities import NotifyActivities
from activities.runbooks import RunbookActivities, load_dir
from contract.budget import BudgetDecision, BudgetLeaseRequest, BudgetReleaseRequest
from contract.capacity import CapacityRequest, CapacityResult, KarpenterInput, KarpenterResult
from contract.kube import (
    CheckHealthInput,
    Consumer,
    ConsumersResult,
    CordonInput,
    CordonResult,
    CountDevicesInput,
    DeviceCounts,
    DeviceRef,
    DraDevice,
    EvictionReport,
    EvictPodsInput,
    EvictPodsResult,
    Evidence,
    EvidenceInput,
    FindConsumersInput,
    HealthResult,
    OwnerRef,
    PodRef,
    QuarantineInput,
    QuarantineResult,
    RecordEventInput,
    ReleaseInput,
    ReleaseResult,
    ReplacementReport,
    ResolvedDevice,
    ResolveDeviceInput,
    WaitEvictionInput,
    WaitReplacementInput,
)
from contract.ledger import LedgerDecision, RecordFailureInput, RecordRepairInput
from contract.names import (
    ACT_ACQUIRE_BUDGET,
    ACT_CHECK_HEALTH,
    ACT_CLAIM_ESCALATION,
    ACT_CORDON,
    ACT_COUNT_DEVICES,
    ACT_EVICT_PODS,
    ACT_FIND_CONSUMERS,
    ACT_GATHER_EVIDENCE,
    ACT_KARPENTER_CAPACITY,
    ACT_LOAD_RUNBOOKS,
    ACT_NOTIFY,
    ACT_PREVIEW_QUARANTINE,
    ACT_QUARANTINE,
    ACT_RECORD_EVENT,
    ACT_RECORD_GPU_FAILURE,
    ACT_RECORD_GPU_REPAIR,
    ACT_RELEASE_BUDGET,
    ACT_RELEASE_QUARANTINE,
    ACT_REQUEST_CAPACITY,
    ACT_RESOLVE_DEVICE,
    ACT_WAIT_EVICTION,
    ACT_WAIT_REPLACEMENT,
    QRY_STATUS,
    WF_REMEDIATE,
    device_workflow_id,
    taint_rule_name,
)
from contract.notify import EscalationClaim, EscalationClaimResult, NotifyInput, NotifyResult
from contract.remediation import (
    AlertEvidence,
    Phase,
    RemediationInput,
    RemediationResult,
    RemediationStatus,
)
from contract.runbook import Runbook, RunbookSet
from worker.main import WORKFLOWS, sender_identity_options

RUNBOOKS_DIR = Path(__file__).resolve().parents[2] / "runbooks"
NODE = "gpu-node-1"

In = TypeVar("In")
Out = TypeVar("Out")


@overload
def fake_of(
    real: Callable[[Any], Out],
) -> Callable[[Callable[[], Awaitable[Out]]], Callable[[], Awaitable[Out]]]: ...
@overload
def fake_of(
    real: Callable[[Any, In], Awaitable[Out]],
) -> Callable[[Callable[[In], Awaitable[Out]]], Callable[[In], Awaitable[Out]]]: ...
def fake_of(real: Callable[..., Any]) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """`@fake_of(RealActivities.method)`: the fake registers under the real activity's name and
    mypy holds it to the real method's input and result types (a drift is a type error)."""
    name = _activity_name(real)

    def stand_in(fn: Callable[..., Any]) -> Callable[..., Any]:
        return activity.defn(name=name)(fn)

    return stand_in


def shipped_runbooks() -> list[Runbook]:
    return list(load_dir(RUNBOOKS_DIR).runbooks)


def without_repair(runbooks: list[Runbook]) -> list[Runbook]:
    """The runbooks with `repair.enabled: false`: the procedure as before the ladder (the
    ladder's own tests are in test_repair.py)."""
    out = []
    for rb in runbooks:
        repair = rb.spec.repair.model_copy(update={"enabled": False})
        out.append(rb.model_copy(update={"spec": rb.spec.model_copy(update={"repair": repair})}))
    return out


def make_runbook(name: str, precedence: int = 10, **spec: Any) -> Runbook:
    """A runbook from camelCase spec keys, as it would be written in YAML."""
    return Runbook.model_validate(
        {
            "apiVersion": "sickbay/v1",
            "kind": "Runbook",
            "metadata": {"name": name},
            "spec": {"precedence": precedence, **spec},
        }
    )


def xid_alert(xid: int = 79, fingerprint: str = "fp-79", **kw: Any) -> AlertEvidence:
    return AlertEvidence(
        source="alertmanager",
        alertname="GpuXidError",
        fingerprint=fingerprint,
        xid=xid,
        labels={"Hostname": NODE},
        **kw,
    )


def deployment_consumer(name: str = "llm-7d9f-abcde", ns: str = "serving") -> Consumer:
    return Consumer(
        pod=PodRef(namespace=ns, name=name, uid=f"uid-{name}"),
        node=NODE,
        phase="Running",
        claim=f"{name}-gpu",
        owner=OwnerRef(kind="ReplicaSet", name="llm-7d9f", namespace=ns),
        top_owner=OwnerRef(kind="Deployment", name="llm", namespace=ns),
    )


@dataclass
class FakeWorld:
    node: str = NODE
    gpu_uuid: str = field(default_factory=lambda: f"GPU-{uuid.uuid4()}")  # unique per test
    node_pool: str = "pool-a"
    health: str | None = "Unhealthy"
    later_health: str | None = "Unhealthy"  # check-device-health during the hold
    # karpenter-capacity's answer (default: the node is no Karpenter node)
    karpenter: KarpenterResult = field(
        default_factory=lambda: KarpenterResult(message="node was not provisioned by Karpenter")
    )
    consumers: list[Consumer] = field(default_factory=lambda: [deployment_consumer()])
    runbooks: list[Runbook] = field(default_factory=lambda: without_repair(shipped_runbooks()))
    counts: DeviceCounts = field(
        default_factory=lambda: DeviceCounts(pool_devices=8, cluster_devices=16)
    )
    budget_granted: bool = True
    # Set: the fake budget decides as the real one does for a pool with this many GPUs out
    # (granted only within the request's pool limit); None: `budget_granted` decides.
    budget_pool_in_use: int | None = None
    use_real_budget: bool = False
    use_real_ledger: bool = False  # the caller passes LedgerActivities (the real workflow)
    budget_release_fails: bool = False  # release-budget-lease raises (non-retryable)
    eviction_reports: list[EvictionReport] = field(default_factory=list)  # consumed in order
    evict_results: list[EvictPodsResult] = field(default_factory=list)  # evict-pods, in order
    # wait-replacement, in order. A "pending" report is what the watch never returns: the
    # watch heartbeats until the workflow's deadline timer cancels it, and the look at the
    # deadline (`look_once`) returns the report. Empty: the watch reports "running".
    replacement_reports: list[Any] = field(default_factory=list)
    watch_cancelled: int = 0  # watches the workflow cancelled (its deadline timer fired)
    watching: bool = False  # a watch is running (and gave back its time-skipping hold)
    heartbeats: int = 0  # heartbeats of the watches
    stepping: bool = False  # the test skips time on the watch's hold (`skip_step`)
    capacity: CapacityResult | ApplicationError = field(
        default_factory=lambda: CapacityResult(status="requested", current_size=2, target_size=3)
    )
    evidence_delay: timedelta | None = None  # gather-evidence answers after this (real time)
    consumers_delay: timedelta | None = None  # find-consumers answers after this (real time)
    notify_failures: int = 0  # first N notify calls raise a retryable error
    calls: list[tuple[str, Any]] = field(default_factory=list)

    @property
    def device(self) -> ResolvedDevice:
        return ResolvedDevice(
            node=self.node,
            gpu_uuid=self.gpu_uuid,
            node_pool=self.node_pool,
            devices=[DraDevice(driver="gpu.nvidia.com", pool=self.node, device="gpu-0")],
            device_class="gpu.nvidia.com",
            taint_api_version="v1",
        )

    def names(self) -> list[str]:
        return [name for name, _ in self.calls]

    def args(self, name: str) -> list[Any]:
        return [arg for n, arg in self.calls if n == name]

    def activities(self, *replace: Callable[..., Any]) -> list[Callable[..., Any]]:
        """The fake activities; each of `replace` stands in for the fake of the same name."""
        world = self

        @fake_of(RunbookActivities.load_runbooks)
        async def load_runbooks() -> RunbookSet:
            world.calls.append((ACT_LOAD_RUNBOOKS, None))
            return RunbookSet(runbooks=world.runbooks, source="test")

        @fake_of(KubeActivities.resolve_device)
        async def resolve(req: ResolveDeviceInput) -> ResolvedDevice:
            world.calls.append((ACT_RESOLVE_DEVICE, req))
            if req.device.gpu_uuid and req.device.gpu_uuid != world.gpu_uuid:
                # Several devices in one test (budget race): echo what was asked for.
                return world.device.model_copy(
                    update={"node": req.device.node, "gpu_uuid": req.device.gpu_uuid}
                )
            return world.device

        @fake_of(KubeActivities.gather_evidence)
        async def evidence(req: EvidenceInput) -> Evidence:
            if world.evidence_delay:  # recorded when it answers, after the delay
                await asyncio.sleep(world.evidence_delay.total_seconds())
            world.calls.append((ACT_GATHER_EVIDENCE, req))
            return Evidence(health=world.health)  # type: ignore[arg-type]

        @fake_of(KubeActivities.find_consumers)
        async def consumers(req: FindConsumersInput) -> ConsumersResult:
            if world.consumers_delay:  # recorded when it answers, after the delay
                await asyncio.sleep(world.consumers_delay.total_seconds())
            world.calls.append((ACT_FIND_CONSUMERS, req))
            return ConsumersResult(consumers=world.consumers)

        @fake_of(KubeActivities.count_devices)
        async def count(req: CountDevicesInput) -> DeviceCounts:
            world.calls.append((ACT_COUNT_DEVICES, req))
            # Counted by node (while resolving): every node of the fake world is in its pool.
            return world.counts.model_copy(
                update={"node_pool": req.node_pool or (world.node_pool if req.node else None)}
            )

        @fake_of(BudgetActivities.acquire_budget_lease)
        async def acquire(req: BudgetLeaseRequest) -> BudgetDecision:
            world.calls.append((ACT_ACQUIRE_BUDGET, req))
            out = world.budget_pool_in_use
            if out is not None:
                if out + req.gpus <= req.pool_limit:
                    return BudgetDecision(granted=True, pool_in_use=out + req.gpus)
                return BudgetDecision(
                    granted=False,
                    reason=f"pool {req.node_pool} has {out} of {req.pool_limit} allowed",
                    pool_in_use=out,
                )
            if world.budget_granted:
                return BudgetDecision(granted=True, pool_in_use=1, cluster_in_use=1)
            return BudgetDecision(
                granted=False, reason="pool pool-a has 4 of 4 allowed", pool_in_use=4
            )

        @fake_of(BudgetActivities.release_budget_lease)
        async def release_budget(req: BudgetReleaseRequest) -> BudgetDecision:
            world.calls.append((ACT_RELEASE_BUDGET, req))
            if world.budget_release_fails:
                raise ApplicationError("budget workflow unreachable", non_retryable=True)
            return BudgetDecision(granted=True, reason="released")

        @fake_of(KubeActivities.quarantine_device)
        async def quarantine(req: QuarantineInput) -> QuarantineResult:
            world.calls.append((ACT_QUARANTINE, req))
            return QuarantineResult(
                mode="rule",
                rule_name=taint_rule_name(req.device.node, req.device.gpu_uuid),
                api_version="resource.k8s.io/v1",
                action="created",
            )

        @fake_of(KubeActivities.preview_quarantine)
        async def preview(req: QuarantineInput) -> QuarantineResult:
            world.calls.append((ACT_PREVIEW_QUARANTINE, req))
            return QuarantineResult(
                mode="dry-run", action="skipped", would_evict=[c.pod for c in world.consumers]
            )

        @fake_of(KubeActivities.evict_pods)
        async def evict(req: EvictPodsInput) -> EvictPodsResult:
            world.calls.append((ACT_EVICT_PODS, req))
            if world.evict_results:
                return world.evict_results.pop(0)
            if req.delete_if_blocked:
                return EvictPodsResult(deleted=req.pods)
            return EvictPodsResult(evicted=req.pods)

        @fake_of(KubeActivities.wait_for_eviction)
        async def wait_eviction(req: WaitEvictionInput) -> EvictionReport:
            world.calls.append((ACT_WAIT_EVICTION, req))
            if world.eviction_reports:
                return world.eviction_reports.pop(0)
            return EvictionReport(gone=req.pods)

        @fake_of(KubeActivities.wait_for_replacement)
        async def wait_replacement(req: WaitReplacementInput) -> ReplacementReport:
            world.calls.append((ACT_WAIT_REPLACEMENT, req))
            head = world.replacement_reports[0] if world.replacement_reports else None
            if req.look_once:
                return (
                    world.replacement_reports.pop(0)
                    if head
                    else ReplacementReport(status="running")
                )
            if head is not None and getattr(head, "status", None) == "pending":
                await watch_until_cancelled(world)
            if world.replacement_reports:
                return world.replacement_reports.pop(0)
            return ReplacementReport(status="running")

        @fake_of(CapacityActivities.request_capacity)
        async def request_capacity(req: CapacityRequest) -> CapacityResult:
            world.calls.append((ACT_REQUEST_CAPACITY, req))
            if isinstance(world.capacity, ApplicationError):
                raise world.capacity
            return world.capacity

        @fake_of(NotifyActivities.notify)
        async def notify(req: NotifyInput) -> NotifyResult:
            world.calls.append((ACT_NOTIFY, req))
            attempt = activity.info().attempt
            if attempt <= world.notify_failures:
                raise ApplicationError(f"channel {req.channel} answered 503 (try {attempt})")
            return NotifyResult(channel=req.channel, delivered=True, attempt=attempt)

        @fake_of(KubeActivities.record_event)
        async def record_event(req: RecordEventInput) -> None:
            world.calls.append((ACT_RECORD_EVENT, req))

        @fake_of(KubeActivities.release_quarantine)
        async def release(req: ReleaseInput) -> ReleaseResult:
            world.calls.append((ACT_RELEASE_QUARANTINE, req))
            return ReleaseResult(removed=True)

        @fake_of(LaunchActivities.claim_escalation)
        async def claim_escalation(req: EscalationClaim) -> EscalationClaimResult:
            world.calls.append((ACT_CLAIM_ESCALATION, req))
            return EscalationClaimResult(granted=True, holder=req.holder)

        @fake_of(KubeActivities.check_device_health)
        async def check_health(req: CheckHealthInput) -> HealthResult:
            world.calls.append((ACT_CHECK_HEALTH, req))
            return HealthResult(health=world.later_health)  # type: ignore[arg-type]

        @fake_of(KubeActivities.karpenter_capacity)
        async def karpenter(req: KarpenterInput) -> KarpenterResult:
            world.calls.append((ACT_KARPENTER_CAPACITY, req))
            found = world.karpenter
            if req.raise_limits and found.at_limit and found.gpu_limit is not None:
                new = min(found.gpu_limit + req.gpu_step, req.max_gpus)
                if new > found.gpu_limit:
                    return found.model_copy(
                        update={"raised_from": found.gpu_limit, "raised_to": new}
                    )
            return found

        @fake_of(KubeActivities.cordon_node)
        async def cordon(req: CordonInput) -> CordonResult:
            world.calls.append((ACT_CORDON, req))
            return CordonResult(changed=True, message="cordoned" if req.cordon else "uncordoned")

        @fake_of(LedgerActivities.record_gpu_failure)
        async def record_failure(req: RecordFailureInput) -> LedgerDecision:
            world.calls.append((ACT_RECORD_GPU_FAILURE, req))  # a first failure
            return LedgerDecision(gpu_uuid=req.gpu_uuid, failures_in_window=1)

        @fake_of(LedgerActivities.record_gpu_repair)
        async def record_repair(req: RecordRepairInput) -> LedgerDecision:
            world.calls.append((ACT_RECORD_GPU_REPAIR, req))
            return LedgerDecision(gpu_uuid=req.gpu_uuid)

        acts: list[Callable[..., Any]] = [
            load_runbooks,
            resolve,
            evidence,
            consumers,
            count,
            quarantine,
            preview,
            evict,
            wait_eviction,
            wait_replacement,
            request_capacity,
            notify,
            record_event,
            release,
            check_health,
            claim_escalation,
            cordon,
            karpenter,
            # The real check, with the test key: it is pure (no cluster), so never faked.
            ActorActivities(ACTIONS_TEST_KEY).verify_actor,
        ]
        if not self.use_real_budget:
            acts += [acquire, release_budget]
        if not self.use_real_ledger:
            acts += [record_failure, record_repair]
        replaced = {_activity_name(a) for a in replace}
        return [a for a in acts if _activity_name(a) not in replaced] + list(replace)


class Watching(Protocol):
    """What the watch fake counts (FakeWorld, the node incident's World)."""

    watching: bool
    heartbeats: int
    watch_cancelled: int
    stepping: bool  # a skip borrows the watch's hold (`skip_step`): a cancelled watch waits


async def watch_until_cancelled(world: Watching) -> None:
    """The deadline-free watch seeing nothing: heartbeat until the workflow cancels it. The
    time-skipping server holds time still while it runs, as it does for a real watch: the
    test moves time on (`past_deadline`, `result_skipping_watches`), in steps shorter than
    the heartbeat timeout, never the activity itself. (A fake that gave the server's hold
    back from inside the activity could not take it back in step with the server: time ran
    on while later activities and workflow tasks ran, up to the ten-year default execution
    timeout: tests/workflows/test_watch_fake_time.py.)"""
    world.watching = True
    try:
        while True:
            activity.heartbeat()
            world.heartbeats += 1
            await asyncio.sleep(0.02)
    except asyncio.CancelledError:
        details = activity.cancellation_details()
        if details and details.cancel_requested:  # by the workflow (not a timeout/shutdown)
            world.watch_cancelled += 1
        for _ in range(6000):  # its hold is lent to the test's skip: keep it until returned
            if not world.stepping:
                break
            await asyncio.sleep(0.005)
        raise
    finally:
        world.watching = False


WATCH_STEP = timedelta(seconds=20)  # a third of the shortest watch heartbeat timeout (60 s)


async def skip_step(
    env: WorkflowEnvironment,
    step: timedelta,
    *,
    test_holds: bool,
    world: Watching | None = None,
    busy: float = 0.0,
) -> None:
    """Skip the test server's time by `step` while an activity runs. The server holds time
    still once for the running activity and once for the test's client, except while the
    client awaits a workflow result; `env.sleep` gives back one hold for the step, so a test
    that is not awaiting a result (`test_holds`) gives its own back around the step too.

    The step borrows the watch's hold: the server counts holds, not their owners, and takes
    the borrowed one back when the step ends. A watch the workflow cancels inside the step
    (its deadline passed) gives its hold back too, and if that came before the test's own was
    back, nothing held time when the workflow went on to wait for an approval: the server ran
    its clock to the approval's timeout at once. So `world`'s cancelled watch keeps its hold
    until the test has its own back. `busy`: seconds the test takes to ask for its hold back,
    as on a loaded machine (the test of this)."""
    if world is not None:
        world.stepping = True
    try:
        if not test_holds:
            await env.sleep(step)
            return
        await _skip_on_borrowed_hold(env, step, busy)
    finally:
        if world is not None:
            world.stepping = False


async def _skip_on_borrowed_hold(env: WorkflowEnvironment, step: timedelta, busy: float) -> None:
    test_service = env.client.test_service
    end = await env.get_current_time() + step
    await test_service.unlock_time_skipping(UnlockTimeSkippingRequest())
    refused = False
    try:
        await env.sleep(step)
    except RPCError:
        # No activity held time after all (a stopped worker reported its watch's end): the
        # client's hold was the only one, and the server refuses to give it back twice
        # ("Unbalanced lock and unlock calls"), after it scheduled the sleep's re-lock. With
        # no hold left the clock runs to that re-lock, which is the client's hold from then
        # on: wait for it, and take no other (one more would keep time from ever skipping
        # again while the test awaits a result).
        refused = True
    finally:
        if not refused:
            if busy:
                await asyncio.sleep(busy)
            await test_service.lock_time_skipping(LockTimeSkippingRequest())
    while refused:  # the re-lock comes when the clock reaches the step's end
        if await env.get_current_time() >= end:
            break
        await asyncio.sleep(0.01)


async def skip_while_watching(
    env: WorkflowEnvironment, world: Watching, until: asyncio.Future[Any], *, test_holds: bool
) -> None:
    """Until `until` is done: whenever the world's watch runs, skip the test server's time
    one step, then wait for heartbeats at the new time before the next step, as a live watch
    heartbeats while the minutes pass. Time never runs on outside those steps."""
    loop = asyncio.get_running_loop()
    while not until.done():
        if not world.watching:
            await asyncio.wait([until], timeout=0.02)
            continue
        beats = world.heartbeats
        await skip_step(env, WATCH_STEP, test_holds=test_holds, world=world)
        await heartbeats_after(world, beats, give_up=loop.time() + 30.0)


async def heartbeats_after(world: Watching, beats: int, give_up: float) -> None:
    """Wait (until the loop time `give_up`) for the watch's heartbeats at the new time before
    the next step, as a live watch heartbeats while the hours pass, or for the watch's end."""
    loop = asyncio.get_running_loop()
    while loop.time() < give_up:
        if not world.watching or world.heartbeats >= beats + 3:
            break
        await asyncio.sleep(0.01)


async def skipping_watches(
    env: WorkflowEnvironment, world: Watching, aw: Awaitable[Out], *, test_holds: bool = True
) -> Out:
    """`aw`'s result, moving time on while the world's watches wait for their deadline;
    `test_holds` unless `aw` is a workflow result (see `skip_step`)."""
    task = asyncio.ensure_future(aw)
    try:
        await skip_while_watching(env, world, task, test_holds=test_holds)
        return await task
    finally:
        task.cancel()


async def result_skipping_watches(
    env: WorkflowEnvironment, handle: WorkflowHandle[Any, Out], world: Watching
) -> Out:
    """The workflow's result, moving time on while its watches wait for their deadline (the
    result wait itself lets the server skip to timers while no activity runs)."""
    return await skipping_watches(env, world, handle.result(), test_holds=False)


# The actions key the fake worlds' workers hold (tests sign verified actors with it).
ACTIONS_TEST_KEY = b"test-actions-key-0123456789abcdef0123456789"


def new_worker(
    client: Client,
    world: FakeWorld,
    extra_activities: Sequence[Callable[..., Any]] = (),
    task_queue: str | None = None,
    replay_every_task: bool = False,
) -> Worker:
    # 0: every task replays from history, which catches non-determinism (costs a 10 s
    # task timeout when a signal races an eviction on the test server; used selectively).
    cache: dict[str, Any] = {"max_cached_workflows": 0} if replay_every_task else {}
    return Worker(
        client,
        task_queue=task_queue or f"tq-{uuid.uuid4()}",
        workflows=WORKFLOWS,  # the production registration list
        activities=world.activities(*extra_activities),  # same name: replaces the fake
        **cache,
        **sender_identity_options(),
        # Heartbeats reach the server at once (not every 48 s of real time): a watch's
        # heartbeat timeout never fires while the tests skip time, and its cancellation
        # arrives within milliseconds.
        max_heartbeat_throttle_interval=timedelta(milliseconds=20),
    )


async def start(
    client: Client,
    worker: Worker,
    world: FakeWorld,
    *,
    alerts: list[AlertEvidence] | None = None,
    gpu_uuid: str | None = None,
    **kw: Any,
) -> WorkflowHandle[Any, RemediationResult]:
    node, gpu_uuid = world.node, gpu_uuid or world.gpu_uuid
    inp = RemediationInput(
        device=DeviceRef(node=node, gpu_uuid=gpu_uuid),
        alerts=alerts if alerts is not None else [xid_alert()],
        **{"trigger": "alert", **kw},
    )
    return await client.start_workflow(
        WF_REMEDIATE,
        inp,
        id=device_workflow_id(node, gpu_uuid),
        task_queue=worker.task_queue,
        result_type=RemediationResult,
    )


async def query_status(handle: WorkflowHandle[Any, Any]) -> RemediationStatus:
    """The status query, asked again when the test server reset the call's HTTP/2 stream (it
    does under load, mid-test: "h2 protocol error"); a query changes nothing, so asking again
    is safe. Any other error is raised."""
    for attempt in range(5):
        try:
            return await handle.query(QRY_STATUS, result_type=RemediationStatus)
        except RPCError as err:
            if "h2 protocol error" not in err.message or attempt == 4:
                raise
            await asyncio.sleep(0.2)
    raise AssertionError("unreachable")


async def wait_phase(
    handle: WorkflowHandle[Any, Any], phase: Phase, within: float = 120.0
) -> RemediationStatus:
    """Poll the status query until the workflow reaches `phase` (real time, 20 ms steps), for
    at most `within` seconds: a deadline, not a count of polls, since each query slows down on
    a busy machine."""
    loop = asyncio.get_running_loop()
    give_up = loop.time() + within
    status: RemediationStatus | None = None
    while loop.time() < give_up:
        status = await query_status(handle)
        if status.phase is phase:
            return status
        await asyncio.sleep(0.02)
    raise AssertionError(f"workflow never reached {phase} in {within:.0f} s; last status {status}")


def _activity_name(fn: Callable[..., Any]) -> str:
    return str(getattr(fn, "__temporal_activity_definition").name)


async def past_deadline(
    env: WorkflowEnvironment,
    handle: WorkflowHandle[Any, Any],
    world: FakeWorld,
    phase: Phase,
    past: timedelta = timedelta(seconds=1),
) -> RemediationStatus:
    """Wait for the replacement watch in `phase`, then skip the test server's time to `past`
    after its deadline, in steps shorter than the watch's heartbeat timeout with a heartbeat
    between them (as a live watch heartbeats while the hours pass); the status of the wait."""
    loop = asyncio.get_running_loop()
    give_up = loop.time() + 120.0
    status = await wait_phase(handle, phase)
    while (status.deadline is None or not world.watching) and loop.time() < give_up:
        await asyncio.sleep(0.02)
        status = await query_status(handle)
    assert status.deadline is not None and world.watching, f"no watch in {phase}: {status}"
    target = status.deadline + past
    while (now := await env.get_current_time()) < target and world.watching:
        beats = world.heartbeats
        await skip_step(env, next_step(now, status.deadline, target), test_holds=True, world=world)
        await heartbeats_after(world, beats, give_up)
    return status


def next_step(now: datetime, deadline: datetime, target: datetime) -> timedelta:
    """The next skip of `past_deadline`: WATCH_STEP at most, and the one that crosses the
    deadline goes all the way to `target`. A step ending between the two would be followed by
    one more while the workflow, its deadline passed, cancels the watch: if the watch's hold
    is gone by the time that step gives back the test's own, no hold is left and the server
    runs its clock to the next timer (an approval's timeout, 20 minutes on)."""
    if now + WATCH_STEP < deadline:
        return WATCH_STEP
    return max(target - now, timedelta(0))
