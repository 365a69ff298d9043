"""The per-GPU failure ledger (`sickbay-gpu-ledger`, one per cluster): its state, the entries it
keeps per GPU UUID, and the inputs/results of its updates and activities.

A GPU that fails `lemons.failures` times within `lemons.window` (runbook knobs) is *retired*: it
stays quarantined, is never released automatically, and one escalation asks for an RMA with the
entries below as its history. A person un-retires it with a reason (`sickbay gpus unretire`);
failures before the un-retire no longer count.

Bounded: entries older than the longest window any request named (at least `min_retention`) are
pruned, at most `max_entries_per_gpu` entries are kept per GPU (the newest), and at most
`max_gpus` GPUs are tracked; past that, the GPU with the oldest entry that is *not* retired is
dropped first. Retired GPUs are never dropped by the cap (they wait for an RMA and an un-retire).
"""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Literal

from pydantic import Field

from contract.activity import Activity
from contract.actors import Verification, VerifiedActor
from contract.base import Contract, Duration, PersonInput
from contract.names import ACT_RECORD_GPU_FAILURE, ACT_RECORD_GPU_REPAIR

LedgerEntryKind = Literal["failure", "repair", "retired", "unretired"]

# Defaults of the bounds; documented in docs/architecture.md ("The GPU ledger").
MAX_LEDGER_GPUS = 5_000
MAX_ENTRIES_PER_GPU = 50
MIN_RETENTION = timedelta(days=7)


class LedgerEntry(Contract):
    at: datetime
    kind: LedgerEntryKind
    incident: str = ""  # the remediation (workflow id and first run id) that wrote it
    failure_class: str | None = None
    xid: int | None = None
    detail: str = ""  # why it failed, the repair rung and its result, the un-retire reason
    actor: str = ""  # un-retire: who claimed to act, and the Temporal client identity
    client_identity: str | None = None
    # un-retire: "verified" (the actions endpoint checked the person with the cluster and the
    # worker its signature: contract/actors.py) or "unverified" (the actor is a claim).
    verification: Verification = ""
    via: str = ""  # of a verified actor: kubernetes | slack
    groups: list[str] = Field(default_factory=list)  # of a verified actor


class GpuRecord(Contract):
    gpu_uuid: str
    node: str = ""
    device_key: str = ""
    entries: list[LedgerEntry] = Field(default_factory=list)  # oldest first
    retired_at: datetime | None = None
    retired_reason: str = ""
    # The incident whose escalation asks for the RMA (claimed once per retirement).
    rma_claimed_by: str | None = None
    holder: str | None = None  # the remediation workflow id that last recorded a failure
    counted_since: datetime | None = None  # the last un-retire: earlier failures do not count
    # The runbook of the latest recorded failure requires verified actors: an un-retire sent
    # straight through Temporal is refused (contract/runbook.py `require_verified_actors`).
    require_verified_actors: bool = False

    def failures_since(self, since: datetime) -> list[LedgerEntry]:
        start = max(since, self.counted_since) if self.counted_since else since
        return [e for e in self.entries if e.kind == "failure" and e.at >= start]

    def repairs(self) -> list[LedgerEntry]:
        return [e for e in self.entries if e.kind == "repair"]

    def last_at(self) -> datetime | None:
        return self.entries[-1].at if self.entries else self.retired_at


class LedgerState(Contract):
    """Input of the `sickbay-gpu-ledger` workflow and its continue-as-new state."""

    gpus: list[GpuRecord] = Field(default_factory=list)
    # The longest `lemons.window` any request named: entries older than it are pruned.
    retention: Duration = MIN_RETENTION
    max_gpus: int = Field(default=MAX_LEDGER_GPUS, ge=1)
    max_entries_per_gpu: int = Field(default=MAX_ENTRIES_PER_GPU, ge=1)
    max_updates_per_run: int = Field(default=500, ge=1)  # continue-as-new after this many
    # Nonces of the verified un-retires of the last ATTESTATION_TTL (replays refused).
    seen_nonces: dict[str, datetime] = Field(default_factory=dict)


class RecordFailureInput(Contract):
    gpu_uuid: str = Field(min_length=1)
    node: str = ""
    device_key: str = ""
    incident: str = Field(min_length=1)  # idempotency key: one failure per remediation
    holder: str = ""  # the remediation workflow id (told when the GPU is un-retired)
    failure_class: str | None = None
    xid: int | None = None
    detail: str = ""
    # The confirmed device evidence that makes this a failure (an unhealthy/degraded alert on
    # the resolved device, pod device health, a driver taint, a failed validation): the ledger
    # refuses a failure without it, so a maintenance drain or a bare launch never counts.
    evidence: str = ""
    failures: int = Field(ge=1)  # lemons.failures
    window: Duration  # lemons.window
    # The remediation's runbook requires verified actors (approve, repaired, unretire).
    require_verified_actors: bool = False


class LedgerDecision(Contract):
    gpu_uuid: str
    failures_in_window: int = 0
    failures: int = 0  # the threshold that applied
    window: Duration = MIN_RETENTION
    retired: bool = False
    newly_retired: bool = False  # this failure retired it
    retired_at: datetime | None = None
    # The caller's incident is the one that asks for the RMA (once per retirement).
    rma_due: bool = False
    history: list[LedgerEntry] = Field(default_factory=list)


class RecordFailureBatch(Contract):
    """Failures recorded together (activities/ledger.py batches concurrent records; a burst
    of failures costs a handful of updates), decided in order."""

    requests: list[RecordFailureInput] = Field(min_length=1)


class LedgerDecisions(Contract):
    decisions: list[LedgerDecision]  # one per request, in order


class RecordRepairInput(Contract):
    gpu_uuid: str = Field(min_length=1)
    node: str = ""
    incident: str = ""
    rung: str = Field(min_length=1)  # reset / reboot / replace, or how a person repaired it
    detail: str = ""  # e.g. "validation passed"


class UnretireRequest(PersonInput):
    """`sickbay gpus unretire` (or the Web UI's update): strict, like every person's input."""

    gpu_uuid: str = Field(min_length=1)
    reason: str = Field(min_length=1)
    actor: str = Field(min_length=1)
    # Set by the actions endpoint only (contract/actors.py); checked by the ledger workflow.
    verified: VerifiedActor | None = None


class UnretireResult(Contract):
    gpu_uuid: str
    was_retired: bool
    holder: str | None = None  # the remediation told to release normally again
    verification: Verification = ""  # how the ledger recorded the actor


class UnretireNotice(Contract):
    """The `gpu-unretired` signal to the remediation holding the retired GPU."""

    actor: str
    reason: str
    client_identity: str | None = None
    verification: Verification = ""


class LedgerQuery(Contract):
    """What `sickbay gpus` asks for: retired GPUs and those repaired within `since`."""

    since: Duration = timedelta(days=7)


class GpuSummary(Contract):
    gpu_uuid: str
    node: str = ""
    retired: bool = False
    retired_at: datetime | None = None
    retired_reason: str = ""
    failures_in_window: int = 0  # within the retention window, since the last un-retire
    failures_total: int = 0  # every failure the ledger still keeps
    repairs: int = 0
    last_failure: datetime | None = None
    last_repair: datetime | None = None
    history: list[LedgerEntry] = Field(default_factory=list)


class LedgerReport(Contract):
    gpus: list[GpuSummary] = Field(default_factory=list)
    tracked: int = 0  # GPUs the ledger keeps in all


# --- activities (contract.activity): the name, the input model, the result model ------------
RECORD_GPU_FAILURE = Activity(ACT_RECORD_GPU_FAILURE, RecordFailureInput, LedgerDecision)
RECORD_GPU_REPAIR = Activity(ACT_RECORD_GPU_REPAIR, RecordRepairInput, LedgerDecision)
