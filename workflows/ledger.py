"""`sickbay-gpu-ledger`: the per-GPU failure ledger, one long-running workflow per cluster and
task queue (`contract.names.ledger_workflow_id`), keyed by GPU UUID.

Remediations reach it through activities holding a Temporal client (activities/ledger.py,
update-with-start like the budget's lease activities), so the ledger survives remediation runs,
worker restarts and its own continue-as-new (the state is carried in the input):

    start (update-with-start) --> serve the updates, one at a time on the workflow's thread:
        record-failure (a confirmed failure; idempotent per incident) -> failures in the
            window, retired or not, and whether this incident asks for the RMA (once per
            retirement); record-failures: several, each decided as its own record-failure
            would be, in order (activities/ledger.py batches a burst's records)
        record-repair (a rung's repair, validated) -> the GPU's counts
        unretire (a person, with a reason; validated: the GPU must be retired; the actor
            checked as verified or recorded unverified, and refused unverified when the runbook
            of the GPU's latest failure requires verified actors) -> the `gpu-unretired`
            signal to the remediation holding the GPU
        query `gpus` (retired and recently repaired GPUs), query `state`
    after `max_updates_per_run` updates or when Temporal suggests it: continue-as-new with the
    (pruned) state as input, on the ledger's own task queue (`ledger_task_queue`: a ledger
    started on the remediation queue moves there).

Pruning on every update keeps the state bounded (contract/ledger.py): entries older than the
retention (the longest window any request named) go, at most `max_entries_per_gpu` per GPU, at
most `max_gpus` GPUs (the oldest not-retired GPU is dropped first; retired ones stay).
"""

from __future__ import annotations

from datetime import datetime, timedelta

from temporalio import workflow
from temporalio.exceptions import ApplicationError

with workflow.unsafe.imports_passed_through():
    from contract.activity import declared_in
    from contract.base import format_duration
    from contract.errors import ERR_UNVERIFIED_ACTOR
    from contract.failover import SHARED_TASK_TIMEOUT
    from contract.ledger import (
        GpuRecord,
        GpuSummary,
        LedgerDecision,
        LedgerDecisions,
        LedgerEntry,
        LedgerQuery,
        LedgerReport,
        LedgerState,
        RecordFailureBatch,
        RecordFailureInput,
        RecordRepairInput,
        UnretireNotice,
        UnretireRequest,
        UnretireResult,
    )
    from contract.names import (
        QRY_LEDGER_REPORT,
        QRY_LEDGER_STATE,
        SIG_GPU_UNRETIRED,
        UPD_LEDGER_FAILURE,
        UPD_LEDGER_FAILURES,
        UPD_LEDGER_REPAIR,
        UPD_LEDGER_UNRETIRE,
        WF_GPU_LEDGER,
        ledger_task_queue,
    )
    from workflows.attestation import REQUIRED_ACTIVITIES as ATTESTATION_ACTIVITIES
    from workflows.attestation import check_actor, prune_nonces
    from workflows.identity import claimed_by, sender_identity

# The activities this workflow calls: the declarations imported here, and verify-actor
# (workflows/attestation.py: a verified actor). The worker checks them.
REQUIRED_ACTIVITIES = (*declared_in(globals()), *ATTESTATION_ACTIVITIES)


def span(value: timedelta) -> str:
    """`7d`, `36h`, `90m`: a lemons window as a person writes it."""
    if value and value % timedelta(days=1) == timedelta(0):
        return f"{value // timedelta(days=1)}d"
    return format_duration(value)


def _day(at: datetime) -> str:
    return at.strftime("%Y-%m-%d %H:%M")


def describe(entry: LedgerEntry) -> str:
    """One history line: `2026-11-28 10:02 failure Xid 48 (unhealthy)`."""
    what: str = entry.kind
    if entry.xid is not None:
        what += f" Xid {entry.xid}"
    if entry.failure_class:
        what += f" ({entry.failure_class})"
    if entry.detail:
        what += f": {entry.detail}"
    if entry.actor and entry.verification == "verified":
        groups = f"; groups {', '.join(entry.groups)}" if entry.groups else ""
        what += f" by {entry.actor} (verified via {entry.via or 'kubernetes'}{groups})"
    elif entry.actor:
        what += f" by {claimed_by(entry.actor, entry.client_identity)}"
        if entry.verification == "unverified":
            what += ", unverified"
    return f"{_day(entry.at)} {what}"


# Sandboxed: its own task queue, and a burst's failures arrive in a few batched updates.
@workflow.defn(name=WF_GPU_LEDGER)
class GpuLedgerWorkflow:
    @workflow.init
    def __init__(self, state: LedgerState) -> None:
        self._state = state
        self._gpus: dict[str, GpuRecord] = {g.gpu_uuid: g for g in state.gpus}
        self._retention = state.retention
        self._updates = 0
        self._wake: list[tuple[str, UnretireNotice]] = []  # holders to tell of an un-retire
        self._seen_nonces = dict(state.seen_nonces)  # verified un-retires (replays refused)

    # ------------------------------------------------------------ updates -------------------

    @workflow.update(name=UPD_LEDGER_FAILURE)
    def record_failure(self, req: RecordFailureInput) -> LedgerDecision:
        self._updates += 1
        return self._record_failure(req)

    @workflow.update(name=UPD_LEDGER_FAILURES)
    def record_failures(self, batch: RecordFailureBatch) -> LedgerDecisions:
        """Each failure decided as its own `record-failure` would be, in the batch's order
        (one handler run: nothing interleaves)."""
        self._updates += 1
        return LedgerDecisions(decisions=[self._record_failure(req) for req in batch.requests])

    @record_failures.validator
    def _validate_failures(self, batch: RecordFailureBatch) -> None:
        for req in batch.requests:
            self._validate_failure(req)

    def _record_failure(self, req: RecordFailureInput) -> LedgerDecision:
        now = workflow.now()
        self._retention = max(self._retention, req.window)
        gpu = self._gpus.get(req.gpu_uuid)
        if gpu is None:
            gpu = self._gpus[req.gpu_uuid] = GpuRecord(gpu_uuid=req.gpu_uuid)
        gpu.node = req.node or gpu.node
        gpu.device_key = req.device_key or gpu.device_key
        gpu.holder = req.holder or gpu.holder
        gpu.require_verified_actors = req.require_verified_actors  # the latest runbook's word
        seen = any(e.kind == "failure" and e.incident == req.incident for e in gpu.entries)
        newly = False
        if not seen:  # an activity retry of the same remediation records nothing twice
            gpu.entries.append(
                LedgerEntry(
                    at=now,
                    kind="failure",
                    incident=req.incident,
                    failure_class=req.failure_class,
                    xid=req.xid,
                    detail=f"{req.evidence} ({req.detail})" if req.detail else req.evidence,
                )
            )
        in_window = gpu.failures_since(now - req.window)
        if gpu.retired_at is None and len(in_window) >= req.failures:
            newly = True
            gpu.retired_at = now
            gpu.retired_reason = (
                f"{len(in_window)} failures within {span(req.window)} (lemons: {req.failures})"
            )
            gpu.entries.append(
                LedgerEntry(
                    at=now, kind="retired", incident=req.incident, detail=gpu.retired_reason
                )
            )
            workflow.logger.info("GPU %s retired: %s", req.gpu_uuid, gpu.retired_reason)
        rma_due = False
        if gpu.retired_at is not None and gpu.rma_claimed_by in (None, req.incident):
            gpu.rma_claimed_by = req.incident
            rma_due = True
        decision = LedgerDecision(
            gpu_uuid=req.gpu_uuid,
            failures_in_window=len(in_window),
            failures=req.failures,
            window=req.window,
            retired=gpu.retired_at is not None,
            newly_retired=newly,
            retired_at=gpu.retired_at,
            rma_due=rma_due,
            history=list(gpu.entries),
        )
        self._prune(now)
        return decision

    @record_failure.validator
    def _validate_failure(self, req: RecordFailureInput) -> None:
        if not req.gpu_uuid.strip() or not req.incident.strip():
            raise ValueError("a failure needs the GPU UUID and the incident that confirmed it")
        if not req.evidence.strip():
            raise ValueError(
                "a failure needs the device evidence that confirmed it (alert, pod health, "
                "driver taint or failed validation): nothing else counts"
            )
        if req.window <= timedelta(0):
            raise ValueError(f"lemons window {format_duration(req.window)} must be positive")

    @workflow.update(name=UPD_LEDGER_REPAIR)
    def record_repair(self, req: RecordRepairInput) -> LedgerDecision:
        self._updates += 1
        now = workflow.now()
        gpu = self._gpus.get(req.gpu_uuid)
        if gpu is None:
            gpu = self._gpus[req.gpu_uuid] = GpuRecord(gpu_uuid=req.gpu_uuid, node=req.node)
        same = [
            e
            for e in gpu.entries
            if e.kind == "repair" and req.incident and e.incident == req.incident
        ]
        if not any(e.detail.startswith(f"{req.rung}:") for e in same):  # idempotent per rung
            detail = f"{req.rung}: {req.detail}" if req.detail else f"{req.rung}:"
            gpu.entries.append(
                LedgerEntry(at=now, kind="repair", incident=req.incident, detail=detail)
            )
        decision = LedgerDecision(
            gpu_uuid=req.gpu_uuid,
            failures_in_window=len(gpu.failures_since(now - self._retention)),
            retired=gpu.retired_at is not None,
            retired_at=gpu.retired_at,
            history=list(gpu.entries),
        )
        self._prune(now)
        return decision

    @record_repair.validator
    def _validate_repair(self, req: RecordRepairInput) -> None:
        if not req.gpu_uuid.strip() or not req.rung.strip():
            raise ValueError("a repair needs the GPU UUID and the rung (or how it was repaired)")

    @workflow.update(name=UPD_LEDGER_UNRETIRE)
    async def unretire(self, req: UnretireRequest) -> UnretireResult:
        """Un-retire a lemon. The actor is checked first (workflows/attestation.py): verified
        when the actions endpoint sent it, else unverified, and then refused when the runbook
        of the GPU's latest failure requires verified actors."""
        self._updates += 1
        identity = sender_identity()  # before any await: the handler's own sender
        who = await check_actor("unretire", req, req.actor, self._seen_nonces)
        try:  # again: another un-retire may have run while the check waited
            self._validate_unretire(req)
        except ValueError as err:  # a handler's ValueError would fail the workflow task
            raise ApplicationError(str(err), non_retryable=True) from None
        gpu = self._gpus[req.gpu_uuid]
        if who.verified is None and gpu.require_verified_actors:
            workflow.logger.warning(
                "un-retire of GPU %s refused: %s", req.gpu_uuid, claimed_by(req.actor, identity)
            )
            raise ApplicationError(
                f"the runbook of GPU {req.gpu_uuid} requires a verified actor for unretire: "
                f"{who.how()} (use `sickbay gpus unretire --via <actions URL>`)",
                type=ERR_UNVERIFIED_ACTOR,
                non_retryable=True,
            )
        now = workflow.now()
        gpu.retired_at = None
        gpu.retired_reason = ""
        gpu.rma_claimed_by = None
        gpu.counted_since = now  # failures before the un-retire no longer count
        gpu.entries.append(
            LedgerEntry(
                at=now,
                kind="unretired",
                detail=f"{req.reason} [{who.problem}]" if who.problem else req.reason,
                actor=who.actor,
                client_identity=identity,
                verification=who.verification,
                via=who.verified.via if who.verified is not None else "",
                groups=list(who.verified.groups) if who.verified is not None else [],
            )
        )
        workflow.logger.info(
            "GPU %s un-retired by %s (%s): %s",
            req.gpu_uuid,
            claimed_by(who.actor, identity),
            who.verification,
            req.reason,
        )
        if gpu.holder:
            notice = UnretireNotice(
                actor=who.actor,
                reason=req.reason,
                client_identity=identity,
                verification=who.verification,
            )
            self._wake.append((gpu.holder, notice))
        self._prune(now)
        return UnretireResult(
            gpu_uuid=req.gpu_uuid,
            was_retired=True,
            holder=gpu.holder,
            verification=who.verification,
        )

    @unretire.validator
    def _validate_unretire(self, req: UnretireRequest) -> None:
        if not req.reason.strip():
            raise ValueError("un-retiring a GPU needs a reason")
        gpu = self._gpus.get(req.gpu_uuid)
        if gpu is None:
            raise ValueError(f"the ledger has no GPU {req.gpu_uuid}")
        if gpu.retired_at is None:
            raise ValueError(f"GPU {req.gpu_uuid} is not retired")

    # ------------------------------------------------------------ queries -------------------

    @workflow.query(name=QRY_LEDGER_REPORT)
    def gpus(self, req: LedgerQuery) -> LedgerReport:
        """Retired GPUs, and those with a repair within `req.since`, newest first."""
        now = workflow.now()
        out = []
        for gpu in self._gpus.values():
            repairs = gpu.repairs()
            recent = [e for e in repairs if e.at >= now - req.since]
            if gpu.retired_at is None and not recent:
                continue
            failures = [e for e in gpu.entries if e.kind == "failure"]
            out.append(
                GpuSummary(
                    gpu_uuid=gpu.gpu_uuid,
                    node=gpu.node,
                    retired=gpu.retired_at is not None,
                    retired_at=gpu.retired_at,
                    retired_reason=gpu.retired_reason,
                    failures_in_window=len(gpu.failures_since(now - self._retention)),
                    failures_total=len(failures),
                    repairs=len(repairs),
                    last_failure=failures[-1].at if failures else None,
                    last_repair=repairs[-1].at if repairs else None,
                    history=list(gpu.entries),
                )
            )
        out.sort(key=lambda g: (not g.retired, -(g.last_failure or now).timestamp()))
        return LedgerReport(gpus=out, tracked=len(self._gpus))

    @workflow.query(name=QRY_LEDGER_STATE)
    def state(self) -> LedgerState:
        return self._snapshot()

    # ------------------------------------------------------------ run -----------------------

    @workflow.run
    async def run(self, state: LedgerState) -> None:
        while True:
            await workflow.wait_condition(
                lambda: (
                    bool(self._wake)
                    or self._updates >= state.max_updates_per_run
                    or workflow.info().is_continue_as_new_suggested()
                )
            )
            if self._wake:
                await self._tell_holders()
                continue
            break
        # Let in-flight updates finish so their callers get an answer, then start fresh.
        await workflow.wait_condition(workflow.all_handlers_finished)
        await self._tell_holders()
        workflow.continue_as_new(
            self._snapshot(),
            task_queue=ledger_task_queue(workflow.info().task_queue),
            task_timeout=SHARED_TASK_TIMEOUT,
        )

    async def _tell_holders(self) -> None:
        wake, self._wake = self._wake, []
        for holder, notice in wake:
            try:
                await workflow.get_external_workflow_handle(holder).signal(
                    SIG_GPU_UNRETIRED, notice
                )
            except Exception as err:  # the remediation closed meanwhile: nobody to tell
                workflow.logger.info("could not tell %s of the un-retire: %s", holder, err)

    def _snapshot(self) -> LedgerState:
        return self._state.model_copy(
            update={
                "gpus": list(self._gpus.values()),
                "retention": self._retention,
                "seen_nonces": prune_nonces(self._seen_nonces, workflow.now()),
            }
        )

    def _prune(self, now: datetime) -> None:
        """Entries older than the retention go (a retired GPU keeps its whole history: it is
        the RMA's evidence); GPUs with nothing left go; then the cap on GPUs and entries."""
        horizon = now - self._retention
        cap = self._state.max_entries_per_gpu
        for key in list(self._gpus):
            gpu = self._gpus[key]
            if gpu.retired_at is None:
                gpu.entries = [e for e in gpu.entries if e.at >= horizon]
            if len(gpu.entries) > cap:
                gpu.entries = gpu.entries[-cap:]
            if not gpu.entries and gpu.retired_at is None:
                del self._gpus[key]
        excess = len(self._gpus) - self._state.max_gpus
        if excess > 0:
            # The oldest not-retired GPUs go first; retired GPUs are never dropped.
            candidates = sorted(
                (g for g in self._gpus.values() if g.retired_at is None),
                key=lambda g: g.last_at() or now,
            )
            for gpu in candidates[:excess]:
                del self._gpus[gpu.gpu_uuid]
                workflow.logger.warning(
                    "ledger full (%d GPUs): dropped %s", self._state.max_gpus, gpu.gpu_uuid
                )
