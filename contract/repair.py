"""The closed-loop repair contract: the runbook's `repair:`, `validation:` and `lemons:` blocks,
the pure ladder choice (`ladder_for`), and the inputs/results/names of the repair activities.

The ladder is a fixed order of rungs, each a bigger hammer than the last:

    reset (the GPU, or its reset group)  ->  reboot (the node)  ->  replace (the node)

A rung applies to a failure when it lists the failure's Xid; a failure whose Xid no rung lists
(or that has none) goes by its failure class (`classes`). A reset can never apply to an Xid that
means the GPU is off the bus (79): a reset goes through the driver, which cannot reach it.

Pure: stdlib + pydantic + the runbook bases of `workflows.models`, no I/O, so workflows may
import it inside the sandbox.
"""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import ClassVar, Literal

from pydantic import Field, field_validator, model_validator

from workflows.models import (
    SAFE_BOUNDS,
    BoundedRunbookModel,
    ClusterMode,
    Contract,
    Duration,
    FailureClass,
    NodePoolTarget,
    RunbookModel,
    SafeBound,
)

# Activity names (registered on the worker's task queue like the others).
ACT_CHECK_GPU_HOLDERS = "check-gpu-holders"
ACT_FIND_RESET_GROUP = "find-reset-group"
ACT_START_RESET_JOB = "start-reset-job"
ACT_START_VALIDATION_JOB = "start-validation-job"
ACT_WAIT_REPAIR_JOB = "wait-for-repair-job"  # polls: ERR_STILL_WAITING until the Job ends
ACT_CLEAN_UP_REPAIR_JOB = "clean-up-repair-job"
ACT_REBOOT_NODE = "reboot-node"
ACT_REPLACE_NODE = "replace-node"
ACT_WAIT_NODE_GPUS = "wait-for-node-gpus"  # polls: ERR_STILL_WAITING until Ready + published

# Error types (non-retryable unless said otherwise).
ERR_GPU_HELD = "GpuStillHeld"  # something else holds the GPU: no reset (retryable: wait)
ERR_PROVIDER_NOT_CONFIGURED = "RepairProviderNotConfigured"
ERR_PROVIDER_REFUSED = "RepairProviderRefused"

# Sickbay's reset-group convention (the NVIDIA DRA driver publishes no such attribute): every
# device carrying the same value of this ResourceSlice attribute resets together; a node with
# this label set to `node` resets all its GPUs together (device plugin, or drivers that cannot
# publish the attribute). Absent both, a GPU is its own group.
RESET_GROUP_ATTRIBUTE = "sickbay.dev/resetGroup"
RESET_GROUP_LABEL = "sickbay.dev/gpu-reset-group"
LABEL_REPAIR = "sickbay.dev/repair"  # on repair Jobs, their pods and claims: reset | validation
ANN_REPAIR_KEY = "sickbay.dev/repair-key"  # the attempt a Job belongs to
REPAIR_NAMESPACE = "sickbay-system"

RungAction = Literal["reset", "reboot", "replace"]
RUNG_ACTIONS: tuple[RungAction, ...] = ("reset", "reboot", "replace")
# What a rung takes out of service, smallest first: the budget counts every GPU of that scope.
BudgetScope = Literal["reset-group", "node"]
_SCOPE_RANK: dict[str, int] = {"reset-group": 0, "node": 1}
RUNG_SCOPE: dict[RungAction, BudgetScope] = {
    "reset": "reset-group",  # one GPU, or its whole NVSwitch baseboard
    "reboot": "node",
    "replace": "node",
}
# Xid 79 "GPU has fallen off the bus": the driver cannot reach the GPU, so neither can a reset.
RESET_UNREACHABLE_XIDS = frozenset({79})

DEFAULT_RESET_IMAGE = "nvcr.io/nvidia/cuda:12.8.1-base-ubuntu24.04"
DEFAULT_RESET_COMMAND = ("nvidia-smi", "-r", "-i", "{uuid}")
DEFAULT_VALIDATION_IMAGE = "nvcr.io/nvidia/cloud-native/dcgm:4.2.3-1-ubuntu22.04"
DEFAULT_VALIDATION_COMMAND = ("dcgmi", "diag", "-r", "{level}")
PLACEHOLDERS = frozenset({"uuid", "node", "level"})

_MIN, _H, _D = timedelta(minutes=1), timedelta(hours=1), timedelta(days=1)
# Safe bounds of the repair blocks, merged into SAFE_BOUNDS (same rules, same doc table).
REPAIR_SAFE_BOUNDS: dict[str, SafeBound] = {
    # Shorter than a reset of a loaded GPU (seconds to a minute) fails healthy resets.
    "repair.reset.timeout": SafeBound(low=_MIN, high=_H),
    # Shorter than a GPU node's boot (5-15 min with driver load) calls every reboot failed.
    "repair.reboot.timeout": SafeBound(low=5 * _MIN, high=6 * _H),
    # A new node: provisioning + boot + driver + device publication.
    "repair.replace.timeout": SafeBound(low=10 * _MIN, high=_D),
    # Level 3 of dcgmi diag takes ~30 min, level 4 hours.
    "validation.timeout": SafeBound(low=_MIN, high=12 * _H),
    # Fewer than 2 retires a GPU on its first fault; more than 20 never retires anything.
    "lemons.failures": SafeBound(low=2, high=20),
    "lemons.window": SafeBound(low=_D, high=90 * _D),
}
SAFE_BOUNDS.update(REPAIR_SAFE_BOUNDS)


def _check_command(command: list[str]) -> list[str]:
    for arg in command:
        for part in arg.split("{")[1:]:
            name = part.split("}", 1)[0]
            if name not in PLACEHOLDERS:
                raise ValueError(
                    f"unknown placeholder {{{name}}} in {arg!r} (known: "
                    f"{', '.join('{' + p + '}' for p in sorted(PLACEHOLDERS))})"
                )
    return command


class _Rung(BoundedRunbookModel):
    """One rung: which failures it applies to, how long it may take, what the budget counts."""

    action: ClassVar[RungAction]
    xids: list[int] = Field(default_factory=list)
    classes: list[FailureClass] = Field(default_factory=list)
    timeout: Duration = timedelta(minutes=10)
    # None: the rung's own scope (RUNG_SCOPE). A larger scope may be asked for, never a smaller.
    budget_cost: BudgetScope | None = None

    @property
    def cost(self) -> BudgetScope:
        return self.budget_cost or RUNG_SCOPE[self.action]

    @model_validator(mode="after")
    def _cost_covers_scope(self) -> _Rung:
        own = RUNG_SCOPE[self.action]
        if self.budget_cost and _SCOPE_RANK[self.budget_cost] < _SCOPE_RANK[own]:
            raise ValueError(
                f"budgetCost {self.budget_cost} is smaller than what a {self.action} takes out "
                f"of service ({own}): the budget must count every GPU it affects"
            )
        return self

    def applies(self, failure_class: FailureClass, xid: int | None, listed: set[int]) -> bool:
        if xid is not None and xid in listed:
            return xid in self.xids
        return failure_class in self.classes


class ResetRung(_Rung):
    block: ClassVar[str] = "repair.reset"
    action: ClassVar[RungAction] = "reset"
    timeout: Duration = timedelta(minutes=5)
    image: str = DEFAULT_RESET_IMAGE
    # Empty: `nvidia-smi -r -i {uuid}`. `{uuid}` and `{node}` are filled in.
    command: list[str] = Field(default_factory=list)

    @field_validator("command")
    @classmethod
    def _placeholders(cls, command: list[str]) -> list[str]:
        return _check_command(command)

    @field_validator("xids")
    @classmethod
    def _reachable(cls, xids: list[int]) -> list[int]:
        bad = sorted(set(xids) & RESET_UNREACHABLE_XIDS)
        if bad:
            raise ValueError(
                f"Xid {', '.join(map(str, bad))} cannot be reset: the GPU is off the bus and "
                "the driver cannot reach it (use reboot)"
            )
        return xids


class RebootRung(_Rung):
    block: ClassVar[str] = "repair.reboot"
    action: ClassVar[RungAction] = "reboot"
    timeout: Duration = timedelta(minutes=30)


class ReplaceRung(_Rung):
    block: ClassVar[str] = "repair.replace"
    action: ClassVar[RungAction] = "replace"
    timeout: Duration = timedelta(hours=1)


Rung = ResetRung | RebootRung | ReplaceRung


class RepairPolicy(RunbookModel):
    """`spec.repair`: off unless a runbook turns it on."""

    enabled: bool = False
    order: list[RungAction] = Field(default_factory=lambda: list(RUNG_ACTIONS))
    reset: ResetRung = Field(default_factory=ResetRung)
    reboot: RebootRung = Field(default_factory=RebootRung)
    replace: ReplaceRung = Field(default_factory=ReplaceRung)

    @field_validator("order")
    @classmethod
    def _unique(cls, order: list[RungAction]) -> list[RungAction]:
        if len(set(order)) != len(order):
            raise ValueError(f"{order}: a rung may appear only once")
        return order

    def rung(self, action: RungAction) -> Rung:
        rung: Rung = getattr(self, action)
        return rung


class ValidationPolicy(BoundedRunbookModel):
    """`spec.validation`: the Job run on the repaired device before it is released."""

    block: ClassVar[str] = "validation"
    enabled: bool = True
    image: str = DEFAULT_VALIDATION_IMAGE
    # Empty: `dcgmi diag -r {level}`. `{uuid}`, `{node}` and `{level}` are filled in.
    command: list[str] = Field(default_factory=list)
    level: int = Field(default=2, ge=1, le=4)  # dcgmi diag run level: 1 quick .. 4 extended
    timeout: Duration = timedelta(minutes=15)

    @field_validator("command")
    @classmethod
    def _placeholders(cls, command: list[str]) -> list[str]:
        return _check_command(command)


class LemonPolicy(BoundedRunbookModel):
    """`spec.lemons`: a GPU failing `failures` times within `window` is retired."""

    block: ClassVar[str] = "lemons"
    enabled: bool = True
    failures: int = Field(default=3, ge=1)
    window: Duration = timedelta(days=7)


def ladder_for(
    repair: RepairPolicy, failure_class: FailureClass, xid: int | None
) -> list[RungAction]:
    """The rungs to try, in order, for a failure; empty when repair is off or nothing applies.

    A rung applies when it lists the Xid; an Xid no rung lists (or none) goes by its class.
    A reset never applies to an Xid it cannot reach (RESET_UNREACHABLE_XIDS)."""
    if not repair.enabled:
        return []
    listed = {x for action in repair.order for x in repair.rung(action).xids}
    out: list[RungAction] = []
    for action in repair.order:
        if action == "reset" and xid in RESET_UNREACHABLE_XIDS:
            continue
        if repair.rung(action).applies(failure_class, xid, listed):
            out.append(action)
    return out


def fill_command(template: list[str], *, uuid: str, node: str, level: int = 0) -> list[str]:
    values = {"uuid": uuid, "node": node, "level": str(level)}
    out = []
    for arg in template:
        for name, value in values.items():
            arg = arg.replace("{" + name + "}", value)
        out.append(arg)
    return out


# --------------------------------------------------------------------------------------------
# Activity inputs and results
# --------------------------------------------------------------------------------------------


class GpuHoldersInput(Contract):
    node: str
    gpu_uuids: list[str]  # the physical GPUs (a reset group may hold several)
    ignore_pods: list[str] = Field(default_factory=list)  # `ns/name`: Sickbay's own Jobs


class GpuHoldersResult(Contract):
    holders: list[str] = Field(default_factory=list)  # `ns/name (why)`, empty = free


class ResetGroupInput(Contract):
    node: str
    gpu_uuid: str


class ResetGroupResult(Contract):
    gpu_uuids: list[str]  # every GPU that resets together with the asked one, itself included
    source: Literal["attribute", "label", "single"] = "single"


class RepairJobInput(Contract):
    """A reset Job: pinned to `node`, privileged, one try."""

    workflow_id: str
    attempt: int = Field(default=1, ge=1)  # the rung attempt: a new attempt, a new Job
    node: str
    gpu_uuids: list[str] = Field(min_length=1)
    image: str = DEFAULT_RESET_IMAGE
    command: list[str] = Field(default_factory=list)  # empty: DEFAULT_RESET_COMMAND
    namespace: str = REPAIR_NAMESPACE
    timeout: Duration = timedelta(minutes=5)
    dry_run: bool = False


class ValidationJobInput(Contract):
    """A validation Job on the repaired device itself."""

    workflow_id: str
    attempt: int = Field(default=1, ge=1)
    mode: ClusterMode = "dra"
    node: str
    gpu_uuid: str
    driver: str | None = None  # DRA: the device the claim selects
    pool: str | None = None
    device: str | None = None
    device_class: str = "gpu.nvidia.com"
    taint_key: str = "sickbay.dev/unhealthy"  # Sickbay's own taint, tolerated by the claim
    image: str = DEFAULT_VALIDATION_IMAGE
    command: list[str] = Field(default_factory=list)  # empty: DEFAULT_VALIDATION_COMMAND
    level: int = Field(default=2, ge=1, le=4)
    namespace: str = REPAIR_NAMESPACE
    timeout: Duration = timedelta(minutes=15)
    dry_run: bool = False


class RepairJobStarted(Contract):
    namespace: str
    job_name: str
    created: bool  # False: the Job of this attempt existed already (a retried activity)
    claim_name: str | None = None
    dry_run: bool = False
    manifest: dict[str, object] = Field(default_factory=dict)  # with dry_run: what it would create


class WaitRepairJobInput(Contract):
    namespace: str
    job_name: str


class RepairJobOutcome(Contract):
    passed: bool
    summary: str  # the last lines of the pod's log (or the Job's failure reason)
    reason: str = ""


class CleanUpRepairJobInput(Contract):
    namespace: str
    job_name: str
    claim_name: str | None = None


class MachineActionInput(Contract):
    """Reboot or replace one node through its provider, asked for once per attempt."""

    workflow_id: str
    attempt: int = Field(default=1, ge=1)
    action: Literal["reboot", "replace"]
    node: str
    pool: NodePoolTarget | None = None  # where the node's machine lives (provider + ids)
    dry_run: bool = False

    @property
    def idempotency_key(self) -> str:
        return f"{self.workflow_id}/{self.action}/{self.attempt}"


class MachineActionResult(Contract):
    action: Literal["reboot", "replace"]
    node: str
    operation: str = ""  # the provider's id of the request, to follow or look up
    asked: bool = True  # False: found already asked for under this key (a retried activity)
    detail: str = ""
    dry_run: bool = False


class WaitNodeGpusInput(Contract):
    node: str  # the node rebooted, or the node replaced
    replaced: bool = False  # follow the pool's new node instead of the old one
    node_pool: str | None = None  # the pool label value, to find a replacement node
    previous_uuids: list[str] = Field(default_factory=list)  # a replacement has others
    # When the rung was asked for (required): after a reboot the node must be Ready again
    # since then (Ready's lastTransitionTime later: a node still Ready from before has not
    # rebooted yet); after a replace only a node created after it is the replacement (another
    # node of the pool is not, however healthy).
    asked_at: datetime | None = None
    expected_gpus: int = Field(default=1, ge=1)


class NodeGpusResult(Contract):
    node: str
    gpu_uuids: list[str]


def _complete_runbook_schema() -> None:
    """workflows.models refers to the blocks above; when this module was imported first, its
    models could not be completed then, so complete them now (a no-op otherwise)."""
    from workflows import models

    for model in (
        models.RunbookSpec,
        models.Runbook,
        models.RunbookSet,
        models.RemediationCarry,
        models.RemediationInput,
    ):
        model.model_rebuild(raise_errors=False)  # raises nothing mid-import of models


_complete_runbook_schema()
