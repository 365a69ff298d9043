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

from contract.base import Contract, Duration, format_duration
from contract.capacity import NodePoolTarget
from contract.names import TAINT_KEY


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
}


class BoundedRunbookModel(RunbookModel):
    """A runbook block whose fields have safe bounds (`SAFE_BOUNDS`); `unsafe` lists the
    camelCase fields of this block deliberately set outside them."""

    unsafe: list[str] = Field(default_factory=list)

    # The block's key under `spec` (e.g. "eviction"), set by each subclass.
    block: ClassVar[str] = ""

    @model_validator(mode="after")
    def _within_safe_bounds(self) -> Any:
        fields = {to_camel(name): name for name in type(self).model_fields if name != "unsafe"}
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
        for key, name in fields.items():
            bound = SAFE_BOUNDS.get(f"{self.block}.{key}")
            value = getattr(self, name)
            if bound is None or key in self.unsafe or bound.holds(value):
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
    "error",
]
ALL_ESCALATION_REASONS: tuple[EscalationReason, ...] = EscalationReason.__args__  # type: ignore[attr-defined]


class RunbookMatch(RunbookModel):
    """All listed criteria must hold; an empty match matches nothing (except `default`)."""

    namespaces: list[str] = Field(default_factory=list)
    namespace_labels: dict[str, str] = Field(default_factory=dict)
    pod_labels: dict[str, str] = Field(default_factory=dict)
    owner_kinds: list[str] = Field(default_factory=list)
    priority_classes: list[str] = Field(default_factory=list)

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
    provider: Literal["gke", "aks", "cluster-api", "http", "sim"] | None = None

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
    channels: list[str] = Field(default_factory=list)  # names configured on the worker
    severity: Literal["critical", "error", "warning", "info"] = "error"
    on: list[EscalationReason] = Field(default_factory=lambda: list(ALL_ESCALATION_REASONS))


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
    dry_run: bool = False


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
    runbooks: list[Runbook]
    source: str = ""  # directory they came from

    def get(self, name: str) -> Runbook | None:
        return next((r for r in self.runbooks if r.name == name), None)
