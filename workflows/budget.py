"""`sickbay-budget`: the blast-radius budget, one long-running workflow per namespace and
task queue (`constants.budget_workflow_id`).

Every remediation asks it for a lease before tainting a device (update `acquire`, or
`acquire-many`: the concurrent requests of one worker, decided in order in one update) and
gives the lease back when it releases the device (update `release`). Updates run one at a time on
the workflow's single thread, so two remediations can never both take the last slot, and the
leases live in Temporal history, so a worker crash loses nothing.

    start (update-with-start) --> serve acquire/release updates
        every `reconcile_interval`: ask which holders' workflows have closed
        (reconcile-budget-leases activity) and drop their leases
        after `max_updates_per_run` updates or when Temporal suggests it: continue-as-new
        with the leases as input, on the budget's own task queue (`budget_task_queue`; a
        budget started on another queue moves there)
        a refused holder is remembered as a waiter; when a lease is released (or dropped by
        reconcile) the oldest waiter of that pool (else the oldest) gets the `budget-freed`
        signal, one per freed slot, and retries at once (its own 1-minute retry is the
        backstop).

Pause (`sickbay pause` / `sickbay resume`: updates `pause` and `resume`; the pauser recorded as
a verified actor when the actions endpoint sent it, else unverified): while paused every
new lease, and every larger one (a node-level repair rung), is refused with a decision that
carries the pause; the holder is remembered as a waiter and holds without a page. Resume wakes
every waiter at once. The pause and a log of who paused and resumed it ride in the state
across continue-as-new.

Limits come with each request (resolved by the remediation from its runbook and the device
counts), so one budget workflow serves every runbook; a request is granted only when both the
holder's pool and the whole cluster stay within the limits the request carries.
"""

from __future__ import annotations

from datetime import timedelta

from temporalio import workflow
from temporalio.common import RetryPolicy
from temporalio.exceptions import ActivityError

with workflow.unsafe.imports_passed_through():
    from contract.activity import declared_in
    from contract.budget import (
        PAUSE_LOG_KEEP,
        RECONCILE_BUDGET_LEASES,
        BudgetDecision,
        BudgetDecisions,
        BudgetLease,
        BudgetLeaseBatch,
        BudgetLeaseRequest,
        BudgetPause,
        BudgetReleaseRequest,
        BudgetState,
        BudgetWaiter,
        PauseAnswer,
        PauseNotice,
        PauseRecord,
        PauseRequest,
        ReconcileLeasesInput,
        ResumeRequest,
    )
    from contract.failover import SHARED_TASK_TIMEOUT
    from contract.names import (
        QRY_BUDGET_STATE,
        SIG_BUDGET_FREED,
        SIG_CLUSTER_PAUSED,
        UPD_BUDGET_ACQUIRE,
        UPD_BUDGET_ACQUIRE_MANY,
        UPD_BUDGET_PAUSE,
        UPD_BUDGET_RELEASE,
        UPD_BUDGET_RESUME,
        WF_BUDGET,
        budget_task_queue,
    )
    from workflows.attestation import REQUIRED_ACTIVITIES as ATTESTATION_ACTIVITIES
    from workflows.attestation import check_actor, prune_nonces
    from workflows.execute import execute

# The activities this workflow calls: the declarations imported here, and verify-actor
# (workflows/attestation.py: a verified actor). The worker checks them.
REQUIRED_ACTIVITIES = (*declared_in(globals()), *ATTESTATION_ACTIVITIES)

# Reconcile calls describe each holder (a few RPCs); 30 s covers a slow frontend, 3 attempts,
# and a failed reconcile is just tried again next interval.
RECONCILE_TIMEOUT = timedelta(seconds=30)
RECONCILE_RETRY = RetryPolicy(initial_interval=timedelta(seconds=2), maximum_attempts=3)


def _check_request(req: BudgetLeaseRequest) -> None:
    if not req.holder.strip() or not req.device_key.strip():
        raise ValueError("a budget lease needs a holder workflow id and a device key")


# Not sandboxed, like the remediation workflow: every lease update is a workflow task of this
# one workflow, so the sandbox's per-activation cost sits on every remediation's hot path.
# Deterministic by construction (state from updates, time from workflow.now()); the imports
# contract and the replay tests guard it.
@workflow.defn(name=WF_BUDGET, sandboxed=False)
class BudgetWorkflow:
    @workflow.init
    def __init__(self, state: BudgetState) -> None:
        self._leases: dict[str, BudgetLease] = {lease.holder: lease for lease in state.leases}
        self._state = state
        self._updates = 0
        self._waiters: dict[str, BudgetWaiter] = {w.holder: w for w in state.waiters}
        self._freed: list[str | None] = []  # pools of slots freed since the last wake-up
        self._pause: BudgetPause | None = state.pause
        self._pause_log: list[PauseRecord] = list(state.pause_log)
        self._seen_nonces = dict(state.seen_nonces)  # verified pauses / resumes (replays)
        self._wake_all = False  # resumed: every waiter gets `budget-freed`
        self._tell_holders = False  # paused or resumed: every lease holder gets `cluster-paused`

    @workflow.update(name=UPD_BUDGET_ACQUIRE)
    def acquire(self, req: BudgetLeaseRequest) -> BudgetDecision:
        self._updates += 1
        return self._decide(req)

    @acquire.validator
    def _validate_acquire(self, req: BudgetLeaseRequest) -> None:
        _check_request(req)

    @workflow.update(name=UPD_BUDGET_ACQUIRE_MANY)
    def acquire_many(self, batch: BudgetLeaseBatch) -> BudgetDecisions:
        """Each request decided as its own `acquire` would be, one after the other in the
        batch's order (one handler run: nothing interleaves), so a burst of one worker's
        lease requests costs one update instead of one each."""
        self._updates += 1
        return BudgetDecisions(decisions=[self._decide(req) for req in batch.requests])

    @acquire_many.validator
    def _validate_acquire_many(self, batch: BudgetLeaseBatch) -> None:
        for req in batch.requests:
            _check_request(req)

    def _decide(self, req: BudgetLeaseRequest) -> BudgetDecision:
        held = self._leases.get(req.holder)
        # Leases are the truth between remediations; quarantines seen in the cluster that no
        # lease covers (lost state, terminated holders) still count: the larger number wins.
        # Each lease counts the physical GPUs it takes out (a node rung: the whole node).
        others = [lease for lease in self._leases.values() if lease.holder != req.holder]
        mine = held.gpus if held is not None else 0
        pool_in_use = max(
            sum(lease.gpus for lease in others if lease.node_pool == req.node_pool),
            req.observed_pool_quarantined - mine,
            0,
        )
        cluster_in_use = max(
            sum(lease.gpus for lease in others), req.observed_cluster_quarantined - mine, 0
        )
        if held is not None and req.gpus <= held.gpus:
            # Idempotent: an activity retry of the same holder gets the same answer.
            return BudgetDecision(
                granted=True,
                reason="already held",
                paused=self._pause,  # kept, but what comes after it holds
                pool_in_use=pool_in_use + held.gpus,
                cluster_in_use=cluster_in_use + held.gpus,
            )
        if self._pause is not None:
            # Paused: nothing new is taken out of service (a lease kept as it is stays).
            self._remember(req)
            return BudgetDecision(
                granted=False,
                reason=f"cluster {self._pause.describe()}",
                paused=self._pause,
                pool_in_use=pool_in_use + mine,
                cluster_in_use=cluster_in_use + mine,
            )
        fits_pool = pool_in_use + req.gpus <= req.pool_limit
        fits_cluster = cluster_in_use + req.gpus <= req.cluster_limit
        if held is None and not (fits_pool and fits_cluster):
            self._remember(req)
        what = "" if req.gpus == 1 else f" ({req.gpus} GPUs asked for)"
        if not fits_pool:
            return BudgetDecision(
                granted=False,
                reason=f"pool {req.node_pool} has {pool_in_use} of {req.pool_limit} allowed" + what,
                pool_in_use=pool_in_use + mine,
                cluster_in_use=cluster_in_use + mine,
            )
        if not fits_cluster:
            return BudgetDecision(
                granted=False,
                reason=f"cluster has {cluster_in_use} of {req.cluster_limit} allowed" + what,
                pool_in_use=pool_in_use + mine,
                cluster_in_use=cluster_in_use + mine,
            )
        self._waiters.pop(req.holder, None)
        self._leases[req.holder] = BudgetLease(
            holder=req.holder,
            device_key=req.device_key,
            node_pool=req.node_pool,
            acquired_at=held.acquired_at if held is not None else workflow.now(),
            gpus=req.gpus,
        )
        workflow.logger.info(
            "budget lease granted to %s (%s, %d GPUs)", req.holder, req.device_key, req.gpus
        )
        return BudgetDecision(
            granted=True,
            pool_in_use=pool_in_use + req.gpus,
            cluster_in_use=cluster_in_use + req.gpus,
        )

    @workflow.update(name=UPD_BUDGET_RELEASE)
    def release(self, req: BudgetReleaseRequest) -> BudgetDecision:
        self._updates += 1
        lease = self._leases.pop(req.holder, None)
        self._waiters.pop(req.holder, None)
        if lease is not None:
            workflow.logger.info("budget lease of %s released", req.holder)
            self._slot_freed(lease)
        return BudgetDecision(
            granted=lease is not None,
            reason="released" if lease is not None else "no lease held",
            cluster_in_use=sum(lease.gpus for lease in self._leases.values()),
        )

    @release.validator
    def _validate_release(self, req: BudgetReleaseRequest) -> None:
        if not req.holder.strip():
            raise ValueError("a budget release needs the holder workflow id")

    @workflow.update(name=UPD_BUDGET_PAUSE)
    async def pause(self, req: PauseRequest) -> PauseAnswer:
        """Pause the cluster (a second pause replaces the reason and actor, keeps `since`).
        The pauser is recorded verified or unverified (workflows/attestation.py)."""
        self._updates += 1
        who = await check_actor("pause", req, req.actor.strip(), self._seen_nonces)
        previous = self._pause
        now = workflow.now()
        self._pause = BudgetPause(
            reason=req.reason.strip(),
            actor=who.actor,
            since=previous.since if previous is not None else now,
            verification=who.verification,
            via=who.verified.via if who.verified is not None else "",
        )
        self._record(
            PauseRecord(
                action="pause",
                actor=who.actor,
                reason=req.reason if not who.problem else f"{req.reason} [{who.problem}]",
                at=now,
                verification=who.verification,
                via=self._pause.via,
            )
        )
        self._tell_holders = bool(self._leases)
        workflow.logger.info("cluster %s", self._pause.describe())
        return PauseAnswer(
            pause=self._pause,
            previous=previous,
            held=list(self._waiters),
            verification=who.verification,
        )

    @pause.validator
    def _validate_pause(self, req: PauseRequest) -> None:
        if not req.reason.strip() or not req.actor.strip():
            raise ValueError("a pause needs a reason and an actor (not blank)")

    @workflow.update(name=UPD_BUDGET_RESUME)
    async def resume(self, req: ResumeRequest) -> PauseAnswer:
        """Lift the pause and wake every waiter (each asks again; the budget decides)."""
        self._updates += 1
        who = await check_actor("resume", req, req.actor.strip(), self._seen_nonces)
        previous, self._pause = self._pause, None
        held = list(self._waiters)
        if previous is not None:
            why = req.reason if not who.problem else f"{req.reason} [{who.problem}]".strip()
            self._record(
                PauseRecord(
                    action="resume",
                    actor=who.actor,
                    reason=why,
                    at=workflow.now(),
                    verification=who.verification,
                    via=who.verified.via if who.verified is not None else "",
                )
            )
            self._wake_all = bool(self._waiters)
            self._tell_holders = bool(self._leases)
            workflow.logger.info(
                "cluster resumed by %s (%s, %d held)", who.actor, who.verification, len(held)
            )
        return PauseAnswer(pause=None, previous=previous, held=held, verification=who.verification)

    @resume.validator
    def _validate_resume(self, req: ResumeRequest) -> None:
        if not req.actor.strip():
            raise ValueError("a resume needs an actor (not blank)")

    def _record(self, entry: PauseRecord) -> None:
        self._pause_log = [*self._pause_log, entry][-PAUSE_LOG_KEEP:]

    @workflow.query(name=QRY_BUDGET_STATE)
    def state(self) -> BudgetState:
        return self._snapshot()

    def _snapshot(self) -> BudgetState:
        return self._state.model_copy(
            update={
                "leases": list(self._leases.values()),
                "waiters": list(self._waiters.values()),
                "pause": self._pause,
                "pause_log": list(self._pause_log),
                "seen_nonces": prune_nonces(self._seen_nonces, workflow.now()),
            }
        )

    def _remember(self, req: BudgetLeaseRequest) -> None:
        if req.holder not in self._waiters:
            self._waiters[req.holder] = BudgetWaiter(holder=req.holder, node_pool=req.node_pool)

    def _slot_freed(self, lease: BudgetLease) -> None:
        if self._waiters:
            self._freed.append(lease.node_pool)

    async def _notify_holders(self) -> None:
        """`cluster-paused` to every lease holder: the pause now in force (None: resumed), so
        an open remediation holds before its next eviction force, scale-up or repair rung."""
        self._tell_holders = False
        notice = PauseNotice(pause=self._pause)
        for holder in list(self._leases):
            try:
                await workflow.get_external_workflow_handle(holder).signal(
                    SIG_CLUSTER_PAUSED, notice
                )
            except Exception as err:  # closed meanwhile: reconcile drops its lease
                workflow.logger.info("could not tell %s of the pause: %s", holder, err)

    async def _wake_waiters(self) -> None:
        """One `budget-freed` signal per freed slot: the oldest waiter of the freed pool,
        else the oldest waiter. A woken waiter that is refused again waits anew."""
        freed, self._freed = self._freed, []
        if self._wake_all:  # resumed: everyone held asks again at once
            self._wake_all = False
            freed = [self._waiters[h].node_pool for h in self._waiters]
        elif self._pause is not None:
            return  # paused: a freed slot wakes nobody (they would be refused again)
        for pool in freed:
            if not self._waiters:
                return
            chosen = next(
                (w for w in self._waiters.values() if w.node_pool == pool),
                next(iter(self._waiters.values())),
            )
            del self._waiters[chosen.holder]
            try:
                await workflow.get_external_workflow_handle(chosen.holder).signal(SIG_BUDGET_FREED)
            except Exception as err:  # closed meanwhile (aborted, repaired): nobody to wake
                workflow.logger.info("could not wake %s: %s", chosen.holder, err)

    @workflow.run
    async def run(self, state: BudgetState) -> None:
        await self._serve(state)
        # Let in-flight updates finish so their callers get an answer, then start fresh.
        await workflow.wait_condition(workflow.all_handlers_finished)
        # A budget started on the remediation queue moves to its own queue here; one already
        # there stays.
        workflow.continue_as_new(
            self._snapshot(),
            task_queue=budget_task_queue(workflow.info().task_queue),
            task_timeout=SHARED_TASK_TIMEOUT,
        )

    async def _serve(self, state: BudgetState) -> None:
        """Until continue-as-new is due: wake waiters when slots free, reconcile on time."""
        due = workflow.now() + state.reconcile_interval
        while True:
            try:
                await workflow.wait_condition(
                    lambda: (
                        self._updates >= state.max_updates_per_run
                        or workflow.info().is_continue_as_new_suggested()
                        or bool(self._freed)
                        or self._wake_all
                        or self._tell_holders
                    ),
                    timeout=max(due - workflow.now(), timedelta(seconds=1)),
                )
            except TimeoutError:
                await self._reconcile()
                due = workflow.now() + state.reconcile_interval
                continue
            if self._tell_holders:
                await self._notify_holders()
                continue
            if self._freed or self._wake_all:
                await self._wake_waiters()
                continue
            return  # time to continue as new

    async def _reconcile(self) -> None:
        if not self._leases and not self._waiters:
            return
        try:
            result = await execute(
                RECONCILE_BUDGET_LEASES,
                ReconcileLeasesInput(holders=sorted({*self._leases, *self._waiters})),
                start_to_close_timeout=RECONCILE_TIMEOUT,
                retry_policy=RECONCILE_RETRY,
            )
        except ActivityError as err:
            workflow.logger.warning("lease reconcile failed, retrying next interval: %s", err)
            return
        for holder in result.closed:
            self._waiters.pop(holder, None)
            lease = self._leases.pop(holder, None)
            if lease is not None:
                workflow.logger.info("dropped the lease of %s: its workflow is closed", holder)
                self._slot_freed(lease)
