"""Every Temporal name: workflow, activity, signal, query and update names, task queues,
workflow ids, search attributes, and the Kubernetes labels Sickbay writes.

Temporal matches them by *name*, so every such name lives here once (error types: in
`contract.errors`). Changing one breaks running workflows and recorded
histories: add new names, never rename.
"""

from __future__ import annotations

import re

DEFAULT_TASK_QUEUE = "sickbay"
DEFAULT_NAMESPACE = "default"

# --- workflow types -------------------------------------------------------------------------
WF_REMEDIATE = "remediate-gpu-device"
WF_BUDGET = "sickbay-budget"
WF_SWEEP = "sickbay-health-sweep"
WF_POOL_SCALER = "sickbay-pool-scaler"
WF_MAINTENANCE = "sickbay-maintenance-drain"
WF_REJECTIONS = "sickbay-rejections"
WF_GPU_LEDGER = "sickbay-gpu-ledger"
WF_NODE_INCIDENT = "sickbay-node-incident"  # one per node whose GPUs vanished

# Singleton workflow ids.
BUDGET_WORKFLOW_ID = "sickbay-budget"
SWEEP_SCHEDULE_ID = "sickbay-health-sweep"

# --- signals / updates / queries on the remediation workflow ---------------------------------
SIG_ALERT = "alert"  # more evidence (AlertEvidence)
SIG_ALERTS = "alerts"  # several alerts at once (list[AlertEvidence]), each as SIG_ALERT
SIG_ALERT_RESOLVED = "alert-resolved"  # AlertResolved
SIG_ABORT = "abort"  # AbortRequest
SIG_REPAIRED = "repaired"  # RepairedRequest
SIG_CLUSTER_PAUSED = "cluster-paused"  # from sickbay-budget: paused (or resumed: no pause)
SIG_BUDGET_FREED = "budget-freed"  # from sickbay-budget: a slot freed, retry the lease now
UPD_APPROVE = "approve"  # ApprovalDecision -> ApprovalResult (validated)
# ExtendDeadlineRequest -> ExtendDeadlineResult (validated: only while a replacement wait runs)
UPD_EXTEND_DEADLINE = "extend-deadline"
QRY_TIMELINE = "timeline"
QRY_STATUS = "status"

# --- budget workflow -----------------------------------------------------------------------
UPD_BUDGET_ACQUIRE = "acquire"
UPD_BUDGET_RELEASE = "release"
# Several acquires in one update, answered in order (activities/budget_client.py batches concurrent
# lease requests of one worker into it).
UPD_BUDGET_ACQUIRE_MANY = "acquire-many"
QRY_BUDGET_STATE = "state"
UPD_BUDGET_PAUSE = "pause"  # sickbay pause: no new lease until resumed
UPD_BUDGET_RESUME = "resume"  # sickbay resume: lift the pause, wake every held remediation

# --- GPU ledger workflow: per-GPU failures, repairs, retirement (lemons) ----------------------
UPD_LEDGER_FAILURE = "record-failure"  # RecordFailureInput -> LedgerDecision
UPD_LEDGER_FAILURES = "record-failures"  # RecordFailureBatch -> LedgerDecisions (in order)
UPD_LEDGER_REPAIR = "record-repair"  # RecordRepairInput -> LedgerDecision
UPD_LEDGER_UNRETIRE = "unretire"  # UnretireRequest -> UnretireResult (validated)
QRY_LEDGER_REPORT = "gpus"  # LedgerQuery -> LedgerReport
QRY_LEDGER_STATE = "state"  # -> LedgerState
SIG_GPU_UNRETIRED = "gpu-unretired"  # ledger -> remediation: UnretireNotice

# --- maintenance drain workflow -------------------------------------------------------------
QRY_MAINTENANCE_PROGRESS = "progress"  # -> MaintenanceResult so far

# --- rejections workflow: alerts Sickbay could not use, and one page per cause and node -----
SIG_REJECTED = "rejected"  # RejectedAlerts, from the webhook
UPD_CLAIM_ESCALATION = "claim-escalation"  # EscalationClaim -> EscalationClaimResult
QRY_REJECTIONS = "rejections"  # -> RejectionsSummary

# --- node incident workflow: signals and query -----------------------------------------------
SIG_NODE_FINDING = "node-finding"  # NodeFinding: the watcher / sweep saw the node short again
QRY_NODE_STATUS = "node-status"  # -> NodeIncidentStatus
# (`abort` is SIG_ABORT, as on the remediation)

# --- pool scaler workflow --------------------------------------------------------------------
UPD_POOL_NEED = "need-capacity"
QRY_POOL_SCALER_STATUS = "pool-status"

# --- activity names ------------------------------------------------------------------------
ACT_LOAD_RUNBOOKS = "load-runbooks"
ACT_RESOLVE_DEVICE = "resolve-device"
ACT_GATHER_EVIDENCE = "gather-evidence"
ACT_FIND_CONSUMERS = "find-consumers"
ACT_COUNT_DEVICES = "count-devices"
ACT_ACQUIRE_BUDGET = "acquire-budget-lease"
ACT_RELEASE_BUDGET = "release-budget-lease"
ACT_QUARANTINE = "quarantine-device"
ACT_PREVIEW_QUARANTINE = "preview-quarantine"
ACT_EVICT_PODS = "evict-pods"
ACT_WAIT_EVICTION = "wait-for-eviction"
ACT_WAIT_REPLACEMENT = "wait-for-replacement"
ACT_RELEASE_QUARANTINE = "release-quarantine"
ACT_CHECK_HEALTH = "check-device-health"
ACT_RECORD_EVENT = "record-event"
ACT_CORDON = "cordon-node"
ACT_KARPENTER_CAPACITY = "karpenter-capacity"
ACT_REQUEST_CAPACITY = "request-capacity"  # engine -> pool scaler workflow
ACT_SCALE_POOL = "scale-node-pool"  # pool scaler -> cloud provider
ACT_DESCRIBE_POOL = "describe-node-pool"
ACT_WAIT_POOL_OPERATION = "wait-node-pool-operation"  # polls: ERR_STILL_WAITING until done
ACT_NOTIFY = "send-notification"
ACT_SWEEP_CLUSTER = "sweep-cluster"
ACT_SIGNAL_WITH_START = "signal-with-start-remediation"
ACT_CLAIM_ESCALATION = "claim-escalation"  # engine -> rejections workflow
ACT_RECONCILE_LEASES = "reconcile-budget-leases"
ACT_SELECT_DEVICES = "select-devices"  # maintenance selector -> physical GPUs
ACT_AWAIT_REMEDIATION = "await-remediation-phase"  # maintenance: wait for a drain to finish
ACT_RECORD_GPU_FAILURE = "record-gpu-failure"  # engine -> GPU ledger workflow
ACT_RECORD_GPU_REPAIR = "record-gpu-repair"  # engine -> GPU ledger workflow
# Node incident (a node whose GPUs vanished): activities/kube/node_diagnosis.py
ACT_DIAGNOSE_NODE = "diagnose-node-gpus"
ACT_CONTAIN_NODE = "contain-node-gpus"  # condition + Sickbay's node taint / cordon + Event
ACT_RELEASE_NODE = "release-node-gpus"  # condition True, taint / cordon undone
ACT_RESTART_GPU_PLUGIN = "restart-gpu-plugin"  # once per attempt (node annotation)
ACT_WAIT_GPUS_BACK = "wait-for-gpus-back"  # polls: ERR_STILL_WAITING until published again
ACT_FIND_GPU_PODS = "find-gpu-pods-on-node"  # the workloads whose GPUs vanished
ACT_START_NODE_INCIDENT = "signal-with-start-node-incident"  # sweep -> node incident

# --- search attributes (Keyword) -----------------------------------------------------------
SA_DEVICE = "SickbayDevice"
SA_NODE = "SickbayNode"
SA_WORKLOAD_CLASS = "SickbayWorkloadClass"
SA_PHASE = "SickbayPhase"
SA_OUTCOME = "SickbayOutcome"  # set when the run closes: released, escalated, aborted, ...
SA_ESCALATION = "SickbayEscalation"  # the escalation reason, set when the run escalates
SA_CLUSTER = "SickbayCluster"  # the cluster a remediation belongs to (SICKBAY_CLUSTER)
# "paused" while a remediation is held by `sickbay pause` (cleared when it goes on)
SA_PAUSED = "SickbayPaused"
SEARCH_ATTRIBUTES = (
    SA_DEVICE,
    SA_NODE,
    SA_WORKLOAD_CLASS,
    SA_PHASE,
    SA_OUTCOME,
    SA_ESCALATION,
    SA_CLUSTER,
    SA_PAUSED,
)

# --- Kubernetes labels and annotations -----------------------------------------------------
LABEL_WORKLOAD_CLASS = "sickbay.dev/workload-class"
LABEL_MANAGED_BY = "app.kubernetes.io/managed-by"
MANAGED_BY_VALUE = "sickbay"
ANN_WORKFLOW_ID = "sickbay.dev/workflow-id"
ANN_REASON = "sickbay.dev/reason"
ANN_DEVICE_KEY = "sickbay.dev/device"
TAINT_KEY = "sickbay.dev/unhealthy"
EVENT_COMPONENT = "sickbay"

_NON_ID = re.compile(r"[^a-z0-9]+")


def normalise_id_part(value: str) -> str:
    """Lower-case and fold every run of characters outside [a-z0-9] into one '-'."""
    return _NON_ID.sub("-", value.lower()).strip("-")


# --- many clusters on one Temporal namespace -------------------------------------------------
# Every id, task queue and schedule of one cluster starts with `sickbay-<cluster>-`, so clusters
# sharing a namespace never meet: `scoped(cluster, "gpu-n1-GPU-1")` -> `sickbay-east-gpu-n1-...`.
# The unnamed cluster ("") keeps the single-cluster names (`sickbay-gpu-...`, `sickbay-budget`,
# queue `sickbay`), so a deployment that never set SICKBAY_CLUSTER goes on exactly as before.
CLUSTER_NAME = re.compile(r"^[a-z0-9]([-a-z0-9]{0,38}[a-z0-9])?$")


# The first word of every name `scoped()` makes: a cluster named (or starting with) one of
# these could produce the unnamed cluster's ids (cluster "gpu" + node "x" and the unnamed
# cluster's node "gpu-x" would both be `sickbay-gpu-gpu-x-...`).
RESERVED_CLUSTER_WORDS = frozenset(
    {"gpu", "budget", "pool", "health", "node", "maintenance", "ledger"}
)


def check_cluster_name(cluster: str) -> str:
    """`cluster` if it is "" or a lower-case DNS label of at most 40 characters whose first
    word is none of `RESERVED_CLUSTER_WORDS`."""
    if cluster and not CLUSTER_NAME.fullmatch(cluster):
        raise ValueError(
            f"cluster name {cluster!r} must be a lower-case DNS label (a-z, 0-9, '-'), at most "
            "40 characters: it is part of every workflow id, task queue and schedule"
        )
    if cluster and cluster.split("-", 1)[0] in RESERVED_CLUSTER_WORDS:
        raise ValueError(
            f"cluster name {cluster!r} may not start with "
            f"{'/'.join(sorted(RESERVED_CLUSTER_WORDS))}: its ids could equal those of the "
            "unnamed cluster"
        )
    return cluster


# The cluster's name, recorded once in Sickbay's namespace (worker/cluster_name.py): the first
# worker to start writes it, nobody overwrites it, every Sickbay process reads it at start.
CLUSTER_CONFIGMAP = "sickbay-cluster"
# The runbooks as deploy/ ships them (mounted at SICKBAY_RUNBOOKS_DIR); a bad edit is an Event on it.
RUNBOOKS_CONFIGMAP = "sickbay-runbooks"
CLUSTER_CONFIGMAP_KEY = "name"
DERIVED_CLUSTER_PREFIX = "k-"


def derived_cluster_name(kube_system_uid: str) -> str:
    """The default cluster name: `k-<first 8 hex digits of the kube-system namespace uid>`,
    fixed for the life of the cluster and (almost surely) different in every cluster."""
    digits = "".join(c for c in kube_system_uid.lower() if c in "0123456789abcdef")
    if len(digits) < 8:
        raise ValueError(f"the kube-system uid {kube_system_uid!r} has fewer than 8 hex digits")
    return check_cluster_name(DERIVED_CLUSTER_PREFIX + digits[:8])


def scoped(cluster: str, name: str) -> str:
    """`sickbay-<cluster>-<name>`, or `sickbay-<name>` for the unnamed cluster."""
    check_cluster_name(cluster)
    return f"sickbay-{cluster}-{name}" if cluster else f"sickbay-{name}"


def cluster_task_queue(task_queue: str, cluster: str) -> str:
    """The task queue of `cluster`'s workers: `<task_queue>-<cluster>` (idempotent), so two
    clusters' workers never take each other's tasks even when configured with one queue."""
    check_cluster_name(cluster)
    if not cluster or task_queue.endswith(f"-{cluster}"):
        return task_queue
    return f"{task_queue}-{cluster}"


def device_workflow_id(node: str, gpu_uuid: str, cluster: str = "") -> str:
    """The one workflow id per physical GPU: `sickbay-[<cluster>-]gpu-<node>-<uuid>`.

    Computable from any trigger without a cluster call (dcgm-exporter's Hostname + UUID, a
    ResourceSlice device's uuid attribute, a device plugin's device ID), so an alert, the
    sweep and a person launching by hand all reach the same workflow.
    """
    if not node or not gpu_uuid:
        raise ValueError("a device workflow id needs both the node and the GPU UUID")
    return scoped(cluster, f"gpu-{normalise_id_part(node)}-{normalise_id_part(gpu_uuid)}")


def pool_scaler_workflow_id(
    pool_name: str, cluster: str | None = None, sickbay_cluster: str = ""
) -> str:
    """The one pool-scaler workflow per node pool:
    `sickbay-[<sickbay cluster>-]pool-[<provider cluster>-]<pool>`."""
    if not pool_name:
        raise ValueError("a pool scaler workflow id needs the pool name")
    parts = [normalise_id_part(cluster)] if cluster else []
    return scoped(sickbay_cluster, "pool-" + "-".join([*parts, normalise_id_part(pool_name)]))


def sweep_schedule_id(cluster: str = "") -> str:
    """The health-sweep Schedule of `cluster`: `sickbay-[<cluster>-]health-sweep`."""
    return scoped(cluster, "health-sweep")


def node_notice_workflow_id(node: str, cluster: str = "") -> str:
    """One node-capacity notice per node (channels dedup on it)."""
    return scoped(cluster, f"node-gpus-{node}")


def node_workflow_id(node: str, cluster: str = "") -> str:
    """The one node incident per node: `sickbay-[<cluster>-]node-<node>`."""
    if not node:
        raise ValueError("a node incident id needs the node")
    return scoped(cluster, f"node-{normalise_id_part(node)}")


# Sickbay's node taint while a node incident holds the node (contain: taint).
NODE_TAINT_KEY = "sickbay.dev/gpus-vanished"
# On the Node: the incident attempt whose plugin restart already ran (once per attempt).
ANN_PLUGIN_RESTART = "sickbay.dev/plugin-restart"


def maintenance_workflow_id(suffix: str, cluster: str = "") -> str:
    return scoped(cluster, f"maintenance-{suffix}")


def budget_workflow_id(task_queue: str = DEFAULT_TASK_QUEUE, cluster: str = "") -> str:
    """The blast-radius budget workflow of `cluster`'s workers on `task_queue`.

    One per cluster (`sickbay-<cluster>-budget`; `sickbay-budget` for the unnamed cluster), and
    scoped to the task queue of the workers that serve it: on a queue other than the cluster's
    default one the id ends `-<queue>`. A budget started by one deployment (or test) is never
    left waiting for pollers of another queue, and two clusters never share one budget.
    Quarantines seen in the cluster without a lease still count against every budget.
    """
    base = scoped(cluster, "budget")
    if task_queue == cluster_task_queue(DEFAULT_TASK_QUEUE, cluster):
        return base
    return f"{base}-{normalise_id_part(task_queue)}"


BUDGET_QUEUE_SUFFIX = "-budget"


def ledger_workflow_id(task_queue: str = DEFAULT_TASK_QUEUE, cluster: str = "") -> str:
    """The GPU ledger of `cluster`'s workers on `task_queue`, scoped like the budget's:
    `sickbay-[<cluster>-]ledger`, ending `-<queue>` on a queue other than the cluster's
    default one. GPU UUIDs are unique, but a ledger per cluster keeps each cluster's lemons
    (and their un-retirement) with the deployment that quarantines them."""
    base = scoped(cluster, "ledger")
    if task_queue == cluster_task_queue(DEFAULT_TASK_QUEUE, cluster):
        return base
    return f"{base}-{normalise_id_part(task_queue)}"


def rejections_workflow_id(task_queue: str = DEFAULT_TASK_QUEUE) -> str:
    """The rejections workflow of the workers on `task_queue` (scoped like the budget's):
    `sickbay-rejections`, or `sickbay-rejections-<queue>` on another queue."""
    if task_queue == DEFAULT_TASK_QUEUE:
        return WF_REJECTIONS
    return f"{WF_REJECTIONS}-{task_queue}"


def budget_task_queue(task_queue: str = DEFAULT_TASK_QUEUE) -> str:
    """The task queue the budget workflow of the workers on `task_queue` runs on.

    Its own queue (`<task_queue>-budget`, polled by the same worker processes with their own
    pollers), so a lease update never waits behind remediation workflow tasks. Idempotent:
    a queue that already is a budget queue maps to itself.
    """
    if task_queue.endswith(BUDGET_QUEUE_SUFFIX):
        return task_queue
    return task_queue + BUDGET_QUEUE_SUFFIX


LEDGER_QUEUE_SUFFIX = "-ledger"


def ledger_task_queue(task_queue: str = DEFAULT_TASK_QUEUE) -> str:
    """The task queue the GPU ledger of the workers on `task_queue` runs on: its own
    (`<task_queue>-ledger`, polled by the same worker processes with their own pollers), as the
    budget's, so a burst of failure records never waits behind remediation workflow tasks.
    Idempotent: a ledger queue maps to itself."""
    if task_queue.endswith(LEDGER_QUEUE_SUFFIX):
        return task_queue
    return task_queue + LEDGER_QUEUE_SUFFIX


def taint_rule_name(node: str, gpu_uuid: str) -> str:
    """DeviceTaintRule name for a physical GPU (a DNS-1123 subdomain, <= 253 chars). It lives
    in the GPU's own cluster, so it never carries the cluster name."""
    return device_workflow_id(node, gpu_uuid)[:253].rstrip("-")


# Closed-loop repair: activity names, labels and annotations of repair Jobs.
ACT_CHECK_GPU_HOLDERS = "check-gpu-holders"
ACT_FIND_RESET_GROUP = "find-reset-group"
ACT_START_RESET_JOB = "start-reset-job"
ACT_START_VALIDATION_JOB = "start-validation-job"
ACT_WAIT_REPAIR_JOB = "wait-for-repair-job"  # polls: ERR_STILL_WAITING until the Job ends
ACT_CLEAN_UP_REPAIR_JOB = "clean-up-repair-job"
ACT_REBOOT_NODE = "reboot-node"
ACT_REPLACE_NODE = "replace-node"
ACT_FIND_DRAIN_PODS = "find-drain-pods"  # the pods a rung must evict first (group or node)
ACT_WAIT_NODE_GPUS = "wait-for-node-gpus"  # polls: ERR_STILL_WAITING until Ready + published

# Sickbay's reset-group convention (the NVIDIA DRA driver publishes no such attribute): every
# device carrying the same value of this ResourceSlice attribute resets together; a node with
# this label set to `node` resets all its GPUs together (device plugin, or drivers that cannot
# publish the attribute). Absent both, a GPU is its own group.
RESET_GROUP_ATTRIBUTE = "sickbay.dev/resetGroup"
RESET_GROUP_LABEL = "sickbay.dev/gpu-reset-group"
LABEL_REPAIR = "sickbay.dev/repair"  # on repair Jobs, their pods and claims: reset | validation
ANN_REPAIR_KEY = "sickbay.dev/repair-key"  # the attempt a Job belongs to
# Where the reset and validation Jobs run (SICKBAY_REPAIR_NAMESPACE; deploy/namespace.yaml,
# components/repair): their own namespace, Pod Security `privileged` for the reset pod, apart
# from Sickbay's `restricted` one. Their pods run as REPAIR_SERVICE_ACCOUNT (no permissions).
REPAIR_NAMESPACE = "sickbay-repair"
REPAIR_SERVICE_ACCOUNT = "sickbay-repair"

# --- verified actors (contract/actors.py) -----------------------------------------------------
ACT_VERIFY_ACTOR = "verify-actor"  # local: the worker checks an actions-endpoint signature
