"""The Runbook schema (YAML: apiVersion sickbay/v1, kind Runbook; keys camelCase in YAML) and
its safe bounds (`SAFE_BOUNDS`).
"""

from __future__ import annotations

import re
from datetime import timedelta
from typing import Annotated, Any, ClassVar, Literal

from pydantic import AliasChoices, BaseModel, ConfigDict, Field, field_validator, model_validator
from pydantic.alias_generators import to_camel
from pydantic_core import PydanticCustomError

from contract.activity import Activity
from contract.base import Contract, Duration, format_duration
from contract.capacity import NodePoolTarget
from contract.names import ACT_LOAD_RUNBOOKS, TAINT_KEY
from contract.node_incident import NODE_RUNG_ACTIONS, NodeRungAction

# How a confirmed failure is classified (contract.remediation reports it; runbooks act on it).
FailureClass = Literal["unhealthy", "degraded", "application", "unknown"]


class RunbookModel(BaseModel):
    model_config = ConfigDict(
        extra="forbid", frozen=True, alias_generator=to_camel, populate_by_name=True
    )


class SafeBound(BaseModel):
    """The range a runbook field may take without an acknowledgement: `low`..`high`
    inclusive (a count or a duration), and for a count-or-percent field `percent_high`."""

    model_config = ConfigDict(frozen=True)
    low: int | timedelta
    high: int | timedelta
    percent_high: int | None = None

    def describe(self) -> str:
        def text(v: int | timedelta) -> str:
            if isinstance(v, timedelta):
                days = v.total_seconds() / 86400
                return f"{int(days)}d" if days >= 1 and days.is_integer() else format_duration(v)
            return str(v)

        out = f"{text(self.low)}..{text(self.high)}"
        return out if self.percent_high is None else f"{out} or 0%..{self.percent_high}%"

    def holds(self, value: Any) -> bool:
        if isinstance(value, str) and value.endswith("%"):
            return self.percent_high is not None and int(value[:-1]) <= self.percent_high
        return bool(self.low <= value <= self.high)


_MIN, _H, _D = timedelta(minutes=1), timedelta(hours=1), timedelta(days=1)
# Safe bounds per runbook field, keyed `block.fieldCamel` as in docs/runbooks.md ("Safe bounds",
# kept in step by tests/runbooks/test_reference_doc.py). A value outside them is refused unless
# the same block lists the field under `unsafe:`: a 0 s timeout, a 100 % budget or a pool grown
# by 1000 nodes must be a decision someone wrote down, never a typo.
SAFE_BOUNDS: dict[str, SafeBound] = {
    # Shorter: every alert about a flapping device is "stale"; longer: day-old alerts act.
    "confirm.staleAfter": SafeBound(low=_MIN, high=_D),
    # Shorter than a person can answer a page; longer leaves the device failing unattended.
    "approval.timeout": SafeBound(low=_MIN, high=_D),
    # Shorter than a pod's usual graceful termination (30 s) forces healthy shutdowns.
    "eviction.timeout": SafeBound(low=timedelta(seconds=30), high=6 * _H),
    # Shorter than one scheduling round + image pull scales up (or pages) for nothing.
    "replacement.pendingDeadline": SafeBound(low=_MIN, high=_D),
    "replacement.churnEvictions": SafeBound(low=2, high=20),
    # Nodes per request and the pool's ceiling: each one is a GPU node bought.
    "scaleUp.step": SafeBound(low=1, high=8),
    "scaleUp.maxSize": SafeBound(low=0, high=256),
    "scaleUp.cooldown": SafeBound(low=_MIN, high=_D),
    "scaleUp.capacityDeadline": SafeBound(low=_MIN, high=_D),
    # Blast radius: a storm must never quarantine a whole pool or cluster by default.
    "budget.maxPerPool": SafeBound(low=0, high=64, percent_high=50),
    "budget.maxPerCluster": SafeBound(low=0, high=256, percent_high=25),
    # Shorter than a device's health flapping period releases a still-broken GPU.
    "release.cooldown": SafeBound(low=_MIN, high=7 * _D),
    "release.healthCheckInterval": SafeBound(low=timedelta(seconds=10), high=_H),
    "fallback.nodeTaintBelowHealthy": SafeBound(low=0, high=8),
    "maintenance.maxParallel": SafeBound(low=1, high=16),
    # A restarted device plugin registers within seconds; shorter fails a healthy restart,
    # longer leaves a GPU-less node waiting before the next rung.
    "nodeIncident.gpusBackTimeout": SafeBound(low=timedelta(seconds=30), high=_H),
    # More restarts of a plugin that keeps failing only delay the escalation.
    "nodeIncident.pluginRestarts": SafeBound(low=0, high=3),
    # A GPU Operator plugin pod waits for the driver and toolkit validations (minutes after a
    # reboot); longer leaves a node whose plugin never starts untouched for too long.
    "nodeIncident.startGrace": SafeBound(low=timedelta(0), high=timedelta(minutes=30)),
    # A MIG repartition takes minutes, with a node reboot ten or so; shorter pages for a
    # healthy one, longer leaves GPUs lost under a stuck MIG manager unsaid too long.
    "nodeIncident.plannedGrace": SafeBound(low=timedelta(minutes=5), high=timedelta(hours=6)),
    "nodeIncident.poolWindow": SafeBound(low=_MIN, high=_D),
    "nodeIncident.poolNodes": SafeBound(low=2, high=64),
}


_BOUNDED: dict[tuple[type, int], list[tuple[str, str, Any]]] = {}


class BoundedRunbookModel(RunbookModel):
    """A runbook block whose fields have safe bounds (`SAFE_BOUNDS`); `unsafe` lists the
    camelCase fields of this block deliberately set outside them."""

    unsafe: tuple[str, ...] = ()

    # The block's key under `spec` (e.g. "eviction"), set by each subclass.
    block: ClassVar[str] = ""

    @classmethod
    def _bounded(cls) -> list[tuple[str, str, Any]]:
        """(camelCase key, field name, bound) of the block's bounded fields, computed once per
        class: every runbook a worker validates (each activity result carrying the runbook set)
        would otherwise rebuild it."""
        at = (cls, len(SAFE_BOUNDS))  # bounds added later (the repair blocks') count too
        hit = _BOUNDED.get(at)
        if hit is None:
            hit = _BOUNDED[at] = [
                (key, name, SAFE_BOUNDS[f"{cls.block}.{key}"])
                for name in cls.model_fields
                if name != "unsafe" and f"{cls.block}.{(key := to_camel(name))}" in SAFE_BOUNDS
            ]
        return hit

    @model_validator(mode="after")
    def _within_safe_bounds(self) -> Any:
        for key in self.unsafe:
            if f"{self.block}.{key}" not in SAFE_BOUNDS:
                raise PydanticCustomError(
                    "unsafe_unknown",
                    "unsafe lists '{key}', which is not a bounded field of {block} (bounded: "
                    "{bounded})",
                    {
                        "key": key,
                        "block": self.block,
                        "bounded": ", ".join(
                            k.split(".", 1)[1]
                            for k in SAFE_BOUNDS
                            if k.startswith(self.block + ".")
                        ),
                        "field": "unsafe",
                    },
                )
        for key, name, bound in self._bounded():
            value = getattr(self, name)
            if key in self.unsafe or bound.holds(value):
                continue
            shown = format_duration(value) if isinstance(value, timedelta) else str(value)
            raise PydanticCustomError(
                "unsafe_value",
                "{value} is outside the safe bounds {bounds}; if it is meant, acknowledge it "
                "with `unsafe: [{key}]` in spec.{block}",
                {
                    "value": shown,
                    "bounds": bound.describe(),
                    "key": key,
                    "block": self.block,
                    "field": key,
                },
            )
        return self


ClassAction = Literal["quarantine", "notify", "ignore"]
EscalationReason = Literal[
    "budget-exhausted",
    "approval-timeout",
    "approval-rejected",
    "eviction-timeout",
    "pending-deadline",
    "no-capacity",
    "scale-up-failed",
    "churn",
    "application-error",
    "repair-failed",
    "error",
    "gpu-retired",
    "node-quarantined",
]
ALL_ESCALATION_REASONS: tuple[EscalationReason, ...] = EscalationReason.__args__  # type: ignore[attr-defined]


class RunbookMatch(RunbookModel):
    """All listed criteria must hold; an empty match matches nothing (except `default`)."""

    namespaces: tuple[str, ...] = ()
    namespace_labels: dict[str, str] = Field(default_factory=dict)
    pod_labels: dict[str, str] = Field(default_factory=dict)
    owner_kinds: tuple[str, ...] = ()
    priority_classes: tuple[str, ...] = ()

    @property
    def empty(self) -> bool:
        return not (
            self.namespaces
            or self.namespace_labels
            or self.pod_labels
            or self.owner_kinds
            or self.priority_classes
        )


class ClassActions(RunbookModel):
    unhealthy: ClassAction = "quarantine"
    degraded: ClassAction = "quarantine"
    application: ClassAction = "notify"
    unknown: ClassAction = "quarantine"


class ConfirmPolicy(BoundedRunbookModel):
    block: ClassVar[str] = "confirm"
    stale_after: Duration = timedelta(minutes=30)  # alert older than this + Healthy = stale
    require_unhealthy_status: bool = False  # only act when pod status says Unhealthy


class QuarantinePolicy(RunbookModel):
    effect: Literal["NoExecute", "NoSchedule"] = "NoExecute"
    taint_key: str = TAINT_KEY
    # Every device of the physical GPU (MIG slices, vGPUs, time-slices) goes together: one
    # remediation per physical GPU, one budget unit. Only `true` is accepted; the field stays
    # so runbooks that spell it out keep loading.
    correlate_siblings: bool = True

    @field_validator("correlate_siblings")
    @classmethod
    def _siblings_together(cls, value: bool) -> bool:
        if not value:
            raise ValueError(
                "false is not supported: a failed GPU takes all its MIG slices / vGPUs with it, "
                "so Sickbay always quarantines every device of the physical GPU"
            )
        return value


class ApprovalPolicy(BoundedRunbookModel):
    block: ClassVar[str] = "approval"
    required: bool = False
    timeout: Duration = timedelta(minutes=15)
    on_timeout: Literal["proceed", "abort", "escalate"] = "escalate"


class EvictionPolicy(BoundedRunbookModel):
    block: ClassVar[str] = "eviction"
    mode: Literal["taint", "eviction-api"] = "taint"
    timeout: Duration = timedelta(minutes=5)
    force: Literal["none", "eviction-api", "noexecute", "delete"] = "none"


class ReplacementPolicy(BoundedRunbookModel):
    block: ClassVar[str] = "replacement"
    pending_deadline: Duration = timedelta(minutes=30)
    churn_evictions: int = Field(default=3, ge=2)
    # How churn (a scheduler ignoring the rule: allocate -> evict -> allocate ...) is stopped:
    # `cordon` the device's node (every scheduler honours a cordon; undone on release),
    # `noschedule` (switch the rule to NoSchedule: no more evictions), `none` (escalate only).
    on_churn: Literal["cordon", "noschedule", "none"] = "cordon"


class KarpenterPolicy(RunbookModel):
    """Where Karpenter provisions the failed node's pool (its NodePool named by the node's
    `karpenter.sh/nodepool` label), Sickbay never scales a second way: the Pending deadline
    measures Karpenter's provisioning. At the deadline, a NodePool whose `nvidia.com/gpu` limit
    leaves no room is raised by `gpuStep`, up to `maxGpus`, only with `raiseLimits`."""

    raise_limits: bool = False
    gpu_step: int = Field(default=8, ge=1)
    max_gpus: int = Field(default=0, ge=0)

    @model_validator(mode="after")
    def _raise_needs_max(self) -> KarpenterPolicy:
        if self.raise_limits and self.max_gpus < 1:
            raise ValueError("scaleUp.karpenter.raiseLimits needs scaleUp.karpenter.maxGpus >= 1")
        return self


class ScaleUpPolicy(BoundedRunbookModel):
    block: ClassVar[str] = "scaleUp"
    enabled: bool = False
    pool: NodePoolTarget | None = None
    step: int = Field(default=1, ge=1)
    max_size: int = Field(default=0, ge=0)
    cooldown: Duration = timedelta(minutes=10)
    capacity_deadline: Duration = timedelta(minutes=15)
    approval: bool = False
    # Without `pool`: the failed device's own node pool (ResolvedDevice.node_pool) at this
    # provider, so one shipped runbook serves every pool of a cluster.
    # `karpenter`: only Karpenter's NodePool (the `karpenter` block); no node group is scaled.
    provider: Literal["gke", "aks", "eks", "cluster-api", "http", "twin", "karpenter"] | None = None
    karpenter: KarpenterPolicy = Field(default_factory=KarpenterPolicy)

    @model_validator(mode="after")
    def _pool_when_enabled(self) -> ScaleUpPolicy:
        if self.enabled and self.pool is None and self.provider is None:
            raise ValueError("scaleUp.enabled needs scaleUp.pool or scaleUp.provider")
        if self.enabled and self.max_size < 1:
            raise ValueError("scaleUp.enabled needs scaleUp.maxSize >= 1")
        return self


BudgetLimit = Annotated[int | str, Field(union_mode="left_to_right")]


class BudgetPolicy(BoundedRunbookModel):
    """At most this many physical GPUs quarantined at once: a count (`4`) or a percent
    (`"25%"`) of the pool's / cluster's devices."""

    block: ClassVar[str] = "budget"

    max_per_pool: BudgetLimit = "50%"
    max_per_cluster: BudgetLimit = "10%"

    @field_validator("max_per_pool", "max_per_cluster")
    @classmethod
    def _limit(cls, value: int | str) -> int | str:
        if isinstance(value, int):
            if value < 0:
                raise ValueError("must be >= 0")
            return value
        if not re.fullmatch(r"\d{1,3}%", value) or int(value[:-1]) > 100:
            raise ValueError(f"'{value}' is neither a count nor a percent like '25%'")
        return value

    @staticmethod
    def limit(value: int | str, total: int) -> int:
        """Resolve a count or percent against `total` devices (percent rounds down, min 1
        when the percent is non-zero and total > 0)."""
        if isinstance(value, int):
            return value
        pct = int(value[:-1])
        if pct == 0 or total <= 0:
            return 0
        return max(1, total * pct // 100)


class EscalationPolicy(RunbookModel):
    channels: tuple[str, ...] = ()  # names configured on the worker
    # Where an application error (Xid 13/31/43/45: the program's fault, the GPU fine) is told:
    # the workload owners' channel, never `channels` (on-call). Empty: the Warning Event on the
    # pods is the only notice.
    owner_channels: tuple[str, ...] = ()
    severity: Literal["critical", "error", "warning", "info"] = "error"
    on: tuple[EscalationReason, ...] = Field(default_factory=lambda: tuple(ALL_ESCALATION_REASONS))


class ReleasePolicy(BoundedRunbookModel):
    block: ClassVar[str] = "release"
    mode: Literal["repaired", "healthy-cooldown", "either"] = "either"
    cooldown: Duration = timedelta(minutes=30)
    health_check_interval: Duration = timedelta(minutes=5)


class FallbackPolicy(BoundedRunbookModel):
    """When no DeviceTaintRule is served: evict consumers through the Eviction API and taint
    the node only when fewer than `node_taint_below_healthy` healthy GPUs remain on it."""

    block: ClassVar[str] = "fallback"

    node_taint_below_healthy: int = Field(default=1, ge=0)


class MaintenancePolicy(BoundedRunbookModel):
    block: ClassVar[str] = "maintenance"
    max_parallel: int = Field(default=1, ge=1)


# --------------------------------------------------------------------------------------------
# Closed-loop repair: the `repair:`, `validation:` and `lemons:` blocks and the ladder choice
# --------------------------------------------------------------------------------------------

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

# The commands Sickbay runs when a runbook names none (always allowed: the product's own). The
# images come only from the operator's allowlist (RepairAllowlist): no default image exists.
DEFAULT_RESET_COMMAND = ("nvidia-smi", "-r", "-i", "{uuid}")
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
    xids: tuple[int, ...] = ()
    classes: tuple[FailureClass, ...] = ()
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
    # None: the first reset image of the operator's allowlist; a named one must be in it
    # (the reset pod is privileged: the runbook never chooses what runs as root on a node).
    image: str | None = None
    # Empty: `nvidia-smi -r -i {uuid}`; another must be in the allowlist. `{uuid}` and `{node}`
    # are filled in.
    command: tuple[str, ...] = ()

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
    order: tuple[RungAction, ...] = Field(default_factory=lambda: tuple(RUNG_ACTIONS))
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
    # None: the first validation image of the operator's allowlist; a named one must be in it.
    image: str | None = None
    # Empty: `dcgmi diag -r {level}`; another must be in the allowlist. `{uuid}`, `{node}` and
    # `{level}` are filled in.
    command: tuple[str, ...] = ()
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


# The operator's allowlist of repair images and commands (SICKBAY_REPAIR_ALLOWLIST)
# --------------------------------------------------------------------------------------------

RepairWork = Literal["reset", "validation"]
# `<repository>@sha256:<64 hex>`: a tag can be moved to other content, a digest cannot.
DIGEST_PINNED = re.compile(r"^[^\s@]+@sha256:[0-9a-f]{64}$")
DEFAULT_COMMANDS: dict[RepairWork, tuple[str, ...]] = {
    "reset": DEFAULT_RESET_COMMAND,
    "validation": DEFAULT_VALIDATION_COMMAND,
}


class AllowedWork(Contract):
    """The images (digest-pinned; the first is the default) and the commands (besides the
    default one) one kind of repair pod may run."""

    images: list[str] = Field(default_factory=list)
    commands: list[list[str]] = Field(default_factory=list)

    @field_validator("images")
    @classmethod
    def _pinned(cls, images: list[str]) -> list[str]:
        bad = [i for i in images if not DIGEST_PINNED.match(i)]
        if bad:
            raise ValueError(
                f"{', '.join(bad)}: not pinned by digest (write <repository>@sha256:<64 hex>)"
            )
        return images

    @field_validator("commands")
    @classmethod
    def _placeholders(cls, commands: list[list[str]]) -> list[list[str]]:
        for command in commands:
            if not command:
                raise ValueError("an empty command")
            _check_command(command)
        return commands


class RepairAllowlist(Contract):
    """What repair and validation pods may run, from the operator's deployment settings (not
    the runbooks): whoever edits runbooks must not choose what runs privileged on GPU nodes."""

    reset: AllowedWork = Field(default_factory=AllowedWork)
    validation: AllowedWork = Field(default_factory=AllowedWork)

    def work(self, kind: RepairWork) -> AllowedWork:
        return self.reset if kind == "reset" else self.validation

    def commands(self, kind: RepairWork) -> list[list[str]]:
        return [list(DEFAULT_COMMANDS[kind]), *self.work(kind).commands]

    def image_problem(self, kind: RepairWork, image: str | None) -> str | None:
        images = self.work(kind).images
        if image is None:
            if images:
                return None
            return (
                f"no {kind} image is allowlisted: the operator sets SICKBAY_REPAIR_ALLOWLIST "
                f'({{"{kind}": {{"images": ["<repository>@sha256:<digest>"]}}}})'
            )
        if image in images:
            return None
        return (
            f"image {image!r} is not in the operator's {kind} allowlist "
            f"(SICKBAY_REPAIR_ALLOWLIST {kind}.images: {', '.join(images) or 'none'})"
        )

    def command_problem(self, kind: RepairWork, command: list[str]) -> str | None:
        if not command or command in self.commands(kind):
            return None
        return (
            f"command {command!r} is not in the operator's {kind} allowlist "
            f"(SICKBAY_REPAIR_ALLOWLIST {kind}.commands, or the default "
            f"{list(DEFAULT_COMMANDS[kind])!r})"
        )

    def resolve(
        self, kind: RepairWork, image: str | None, command: list[str]
    ) -> tuple[str, list[str]]:
        """(image, command template) to run; ValueError naming the problem when not allowed."""
        problem = self.image_problem(kind, image) or self.command_problem(kind, command)
        if problem:
            raise ValueError(problem)
        return image or self.work(kind).images[0], list(command or DEFAULT_COMMANDS[kind])

    def runbook_problems(self, runbook: Runbook) -> list[tuple[tuple[str, ...], str]]:
        """(field path, problem) for every image/command the runbook names outside the
        allowlist. Images left unnamed are not checked here (none allowlisted is reported by
        `sickbay doctor` and escalated by the rung)."""
        spec = runbook.spec
        out: list[tuple[tuple[str, ...], str]] = []
        blocks: list[tuple[tuple[str, ...], RepairWork, str | None, list[str]]] = [
            (
                ("spec", "repair", "reset"),
                "reset",
                spec.repair.reset.image,
                list(spec.repair.reset.command),
            ),
            (
                ("spec", "validation"),
                "validation",
                spec.validation.image,
                list(spec.validation.command),
            ),
        ]
        for path, kind, image, command in blocks:
            if image is not None:
                problem = self.image_problem(kind, image)
                if problem:
                    out.append(((*path, "image"), problem))
            problem = self.command_problem(kind, command)
            if problem:
                out.append(((*path, "command"), problem))
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


class NodeIncidentPolicy(BoundedRunbookModel):
    """The node procedure (`sickbay-node-incident`): a node whose GPUs vanished. Read from the
    runbook named `default` (else the first), since no workload picks it."""

    block: ClassVar[str] = "nodeIncident"
    enabled: bool = True  # False: a vanished GPU is only notified, as before
    # GPUs gone while every GPU plugin pod is Ready: diagnose again after this long before
    # touching the node. A kubelet restart shows exactly that for a few seconds (it deletes
    # the node's ResourceSlices, or counts the device plugin's GPUs 0, until the plugin
    # registers again). 0s: act on the first diagnosis. A failing plugin pod never waits.
    settle: Duration = timedelta(seconds=30)
    # GPUs gone while a GPU plugin pod is starting (ContainerCreating, init containers: a node
    # back from a reboot, a plugin rollout): diagnose again every `settle` for up to this
    # long before touching the node. A plugin pod failing meanwhile is acted on at once.
    start_grace: Duration = timedelta(minutes=5)
    # GPUs gone while the GPU Operator's MIG manager repartitions them (its
    # nvidia.com/mig.config.state pending or rebooting): diagnose again every plannedGrace / 30
    # (at least `settle`) for up to this long; then page once, saying the node is left alone.
    planned_grace: Duration = timedelta(minutes=30)
    # Keep new GPU pods off the node: Sickbay's NoSchedule node taint, a cordon, or nothing.
    contain: Literal["taint", "cordon", "none"] = "taint"
    # The node ladder, in order; reboot / replace run only when spec.repair enables them.
    order: tuple[NodeRungAction, ...] = Field(default_factory=lambda: tuple(NODE_RUNG_ACTIONS))
    plugin_restarts: int = Field(default=1, ge=0)  # restart-plugin attempts per incident
    gpus_back_timeout: Duration = timedelta(minutes=5)  # after each rung
    # Escalated (the node stays broken): evict the pods that hold its vanished GPUs (PDBs
    # honoured, within the blast-radius budget) so their controllers start them elsewhere.
    relocate: bool = True
    # Several nodes of one pool vanishing GPUs within poolWindow after a kubelet/runtime
    # change: one pool incident naming every node instead of N pages.
    pool_incident: bool = False
    pool_window: Duration = timedelta(minutes=30)
    pool_nodes: int = Field(default=2, ge=2)  # this many nodes make a pool incident


class RunbookSpec(RunbookModel):
    precedence: int = 0  # with several consumers, the highest precedence wins
    match: RunbookMatch = Field(default_factory=RunbookMatch)
    on: ClassActions = Field(default_factory=ClassActions)
    confirm: ConfirmPolicy = Field(default_factory=ConfirmPolicy)
    quarantine: QuarantinePolicy = Field(default_factory=QuarantinePolicy)
    approval: ApprovalPolicy = Field(default_factory=ApprovalPolicy)
    eviction: EvictionPolicy = Field(default_factory=EvictionPolicy)
    replacement: ReplacementPolicy = Field(default_factory=ReplacementPolicy)
    scale_up: ScaleUpPolicy = Field(default_factory=ScaleUpPolicy)
    budget: BudgetPolicy = Field(default_factory=BudgetPolicy)
    escalation: EscalationPolicy = Field(default_factory=EscalationPolicy)
    release: ReleasePolicy = Field(default_factory=ReleasePolicy)
    fallback: FallbackPolicy = Field(default_factory=FallbackPolicy)
    maintenance: MaintenancePolicy = Field(default_factory=MaintenancePolicy)
    repair: RepairPolicy = Field(default_factory=lambda: RepairPolicy())
    validation: ValidationPolicy = Field(default_factory=lambda: ValidationPolicy())
    lemons: LemonPolicy = Field(default_factory=lambda: LemonPolicy())
    node_incident: NodeIncidentPolicy = Field(default_factory=lambda: NodeIncidentPolicy())
    dry_run: bool = False
    # approve / reject, repaired and unretire only from a verified actor (contract/actors.py):
    # the workflow refuses such an action sent straight through Temporal, and records the
    # refusal with the actor it claimed.
    require_verified_actors: bool = False


class RunbookMetadata(RunbookModel):
    name: str = Field(pattern=r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$", max_length=63)
    description: str = ""


class Runbook(RunbookModel):
    api_version: Literal["sickbay/v1"] = Field(
        validation_alias=AliasChoices("apiVersion", "api_version"), alias="apiVersion"
    )
    kind: Literal["Runbook"]
    metadata: RunbookMetadata
    spec: RunbookSpec = Field(default_factory=RunbookSpec)

    @property
    def name(self) -> str:
        return self.metadata.name


class RunbookSet(Contract):
    """The worker's runbooks. Frozen, its sequences tuples: the workflows reading the same set
    share one decoded value (worker/converter.py)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    runbooks: tuple[Runbook, ...]
    source: str = ""  # directory they came from

    def get(self, name: str) -> Runbook | None:
        return next((r for r in self.runbooks if r.name == name), None)


# --- activities (contract.activity): the name, the input model, the result model ------------
LOAD_RUNBOOKS = Activity(ACT_LOAD_RUNBOOKS, type(None), RunbookSet)
