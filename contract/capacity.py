"""Node pools: the provider target, the pool scaler workflow's input/status and the cloud
activities' inputs and results.
"""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Literal

from pydantic import ConfigDict, Field

from contract.activity import Activity
from contract.base import Contract, Duration
from contract.names import (
    ACT_DESCRIBE_POOL,
    ACT_KARPENTER_CAPACITY,
    ACT_REQUEST_CAPACITY,
    ACT_SCALE_POOL,
    ACT_WAIT_POOL_OPERATION,
)


class NodePoolTarget(Contract):
    """Where a node pool lives. Identifiers only; credentials come from the worker's env.
    Frozen: a runbook names one, and a runbook set is shared (worker/converter.py)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    provider: Literal["gke", "aks", "eks", "cluster-api", "http", "twin"]
    name: str  # the pool's name at the provider
    node_pool_label: str | None = None  # value of the node label that marks the pool
    project: str | None = None  # GKE
    location: str | None = None  # GKE; EKS: the AWS region
    cluster: str | None = None  # GKE, AKS, EKS
    subscription: str | None = None  # AKS
    resource_group: str | None = None  # AKS
    namespace: str | None = None  # Cluster API MachineDeployment namespace
    endpoint: str | None = None  # http / twin: base URL (no credentials in it)
    profile: str | None = None  # http: name of a request profile configured on the worker


class CapacityRequest(Contract):
    pool: NodePoolTarget
    need: int = Field(default=1, ge=1)  # extra devices (or nodes, by step) needed
    step: int = Field(default=1, ge=1)
    max_size: int = Field(ge=0)
    cooldown: Duration = timedelta(minutes=10)
    requester: str  # workflow id
    idempotency_key: str


# CapacityResult.status, as the pool scaler replies to each need:
#   satisfied   - the provider finished resizing the pool to target_size (or a resize already
#                 in flight / just finished covers this need)
#   in-progress - the resize was requested but had not finished within the operation timeout
#   requested   - the provider accepted the new size and offers no operation to follow
#   at-max      - the pool is already at the runbook's (or provider's) max size; nothing asked
#   cooldown    - the pool was resized less than the cool-down ago; nothing asked
#   rejected    - the provider refused (quota, auth, invalid) or stayed unavailable; `message`
#                 carries the provider's words
class CapacityResult(Contract):
    status: Literal["requested", "in-progress", "satisfied", "at-max", "cooldown", "rejected"]
    target_size: int | None = None
    current_size: int | None = None
    operation: str | None = None
    message: str = ""


class PoolOperation(Contract):
    """A provider's long-running resize operation."""

    id: str  # provider operation name / URL / synthetic id, opaque to the workflow
    done: bool = False
    error: str | None = None  # provider's message when the operation failed
    target_size: int | None = None


class PoolDescription(Contract):
    current_size: int = Field(ge=0)  # nodes the provider is asked to run now (target size)
    min_size: int | None = None  # provider-side autoscaling bounds, when it has them
    max_size: int | None = None
    pending_operation: PoolOperation | None = None  # a resize still running on the pool
    detail: str = ""


class DescribePoolInput(Contract):
    pool: NodePoolTarget


class ScalePoolInput(Contract):
    pool: NodePoolTarget
    target_size: int = Field(ge=0)
    max_size: int = Field(ge=0)  # checked again by the activity: never above it
    idempotency_key: str = Field(min_length=1)
    dry_run: bool = False


class ScalePoolResult(Contract):
    previous_size: int | None = None
    target_size: int  # the size actually asked for (providers may round per zone)
    operation: PoolOperation | None = None  # None: nothing to follow (no-op, dry run, sync API)
    adopted: bool = False  # `operation` was already running on the pool; nothing new was asked
    message: str = ""


class PoolOperationInput(Contract):
    pool: NodePoolTarget
    operation: str


class PoolScalerInput(Contract):
    """Input of `sickbay-pool-scaler`, one workflow per node pool; also its continue-as-new
    state. Operational knobs come from the worker that starts it (ACT_REQUEST_CAPACITY)."""

    pool: NodePoolTarget
    batch_window: Duration = timedelta(seconds=10)  # gather concurrent needs into one request
    poll_interval: Duration = timedelta(seconds=15)  # how often to look at a resize operation
    operation_timeout: Duration = timedelta(minutes=12)  # then reply in-progress
    idle_timeout: Duration = timedelta(hours=1)  # finish after this long with nothing to do
    dry_run: bool = False
    rounds_per_run: int = Field(default=100, ge=1)  # continue-as-new after this many rounds
    # carried across continue-as-new
    rounds: int = 0
    last_scaled_at: datetime | None = None
    last_cooldown: Duration = timedelta(0)
    last_target: int | None = None
    headroom: int = 0  # nodes of the last resize that no need has claimed yet
    refused_until: datetime | None = None  # provider refused (quota, auth): not asked again
    last_refusal: str = ""  # ... before this time; needs get this message instead
    recent: dict[str, CapacityResult] = Field(default_factory=dict)  # idempotency key -> reply


class PoolScalerStatus(Contract):
    pool: str
    state: Literal["idle", "batching", "describing", "scaling", "waiting-operation"] = "idle"
    waiting: int = 0  # needs waiting for a reply
    rounds: int = 0
    provider_requests: int = 0  # resize requests sent in this run
    last_scaled_at: datetime | None = None
    last_target: int | None = None
    last_result: CapacityResult | None = None


class KarpenterInput(Contract):
    """Does a Karpenter NodePool serve the failed node's workloads (and so their Pending
    replacements), and, with `raise_limits`, raise its `nvidia.com/gpu` limit once per `key`."""

    node: str = Field(min_length=1)  # the failed device's node
    raise_limits: bool = False
    gpu_step: int = Field(default=8, ge=1)  # GPUs added to the limit
    max_gpus: int = Field(default=0, ge=0)  # never past this limit (0: nothing is raised)
    key: str = Field(min_length=1)  # idempotency: one raise per key


class KarpenterResult(Contract):
    node_pool: str | None = None  # None: no Karpenter NodePool serves the node
    gpu_limit: int | None = None  # its spec.limits["nvidia.com/gpu"] (None: no limit)
    gpus_used: int | None = None  # its status.resources["nvidia.com/gpu"]
    at_limit: bool = False  # no room for one more node's GPUs under the limit
    raised_from: int | None = None  # set when this call (or its key's earlier try) raised it
    raised_to: int | None = None
    message: str = ""


# --- activities (contract.activity): the name, the input model, the result model ------------
KARPENTER_CAPACITY = Activity(ACT_KARPENTER_CAPACITY, KarpenterInput, KarpenterResult)
REQUEST_CAPACITY = Activity(ACT_REQUEST_CAPACITY, CapacityRequest, CapacityResult)
DESCRIBE_NODE_POOL = Activity(ACT_DESCRIBE_POOL, DescribePoolInput, PoolDescription)
SCALE_NODE_POOL = Activity(ACT_SCALE_POOL, ScalePoolInput, ScalePoolResult)
WAIT_NODE_POOL_OPERATION = Activity(ACT_WAIT_POOL_OPERATION, PoolOperationInput, PoolOperation)
