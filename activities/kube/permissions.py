"""Every Kubernetes permission the activities and `sickbay doctor` use, with why.

deploy/ grants exactly these, each in the ClusterRole `role` names (a test compares the two
and checks the twin's request log against the roles); `sickbay doctor` asks the API
server about each one with a SelfSubjectAccessReview. Discovery (/version, /api, /apis/...)
is a non-resource URL every authenticated identity may read (system:discovery), so it is not
listed.

Two grants only some set-ups use have ClusterRoles (and files) of their own, so operators can
drop them: `sickbay-force-delete` (pods delete: only a runbook with `eviction.force: delete`
deletes pods) and `sickbay-node-fallback` (nodes patch: only where the cluster serves no
DeviceTaintRule does Sickbay mark, taint or cordon nodes); the repair ladder's grants live in
deploy/rbac-repair.yaml: `sickbay-repair` (a Role in Sickbay's namespace: the reset and
validation Jobs, their claims and pod logs) and `sickbay-repair-machines` (Cluster API Machines:
reboot and replace; nodes patch: an AKS reboot's record on its node), needed only by runbooks
with `repair.enabled`. `needed(...)` says, for the loaded
runbooks and the cluster, which optional grants are needed and by what.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from contract.names import CLUSTER_CONFIGMAP, RUNBOOKS_CONFIGMAP
from contract.runbook import Runbook


@dataclass(frozen=True)
class Permission:
    group: str
    resource: str  # plural, with "/subresource" when it is one
    verbs: tuple[str, ...]
    why: str
    required: bool = True  # False: only some runbooks/paths need it (see `needed`)
    role: str = "sickbay"  # the ClusterRole in deploy/ that grants it (or the Role, namespaced)
    namespaced: bool = False  # True: a Role in Sickbay's own namespace grants it
    name: str = ""  # the one object it is granted for (RBAC resourceNames), "" for any

    @property
    def plural(self) -> str:
        return self.resource.split("/", 1)[0]

    @property
    def subresource(self) -> str:
        return self.resource.split("/", 1)[1] if "/" in self.resource else ""


DRA = "resource.k8s.io"
ROLE_FORCE_DELETE = "sickbay-force-delete"  # deploy/rbac-force-delete.yaml
ROLE_NODE_FALLBACK = "sickbay-node-fallback"  # deploy/rbac-node-fallback.yaml
ROLE_HEALTH_WATCHER = "sickbay-health-watcher"  # a Role in Sickbay's namespace (rbac.yaml)
ROLE_CLUSTER_NAME = "sickbay-cluster-name"  # a Role in Sickbay's namespace (rbac.yaml)
ROLE_REPAIR = "sickbay-repair"  # a Role in Sickbay's namespace (deploy/rbac-repair.yaml)
ROLE_REPAIR_MACHINES = "sickbay-repair-machines"  # deploy/rbac-repair.yaml
ROLE_FILES = {
    "sickbay": "deploy/rbac.yaml",
    ROLE_HEALTH_WATCHER: "deploy/rbac.yaml",
    ROLE_CLUSTER_NAME: "deploy/rbac.yaml",
    ROLE_FORCE_DELETE: "deploy/rbac-force-delete.yaml",
    ROLE_NODE_FALLBACK: "deploy/rbac-node-fallback.yaml",
    ROLE_REPAIR: "deploy/rbac-repair.yaml",
    ROLE_REPAIR_MACHINES: "deploy/rbac-repair.yaml",
}

PERMISSIONS: tuple[Permission, ...] = (
    Permission("", "nodes", ("get", "list"), "resolve devices, node pools, capacity"),
    Permission("", "nodes", ("watch",), "health watcher: GPU allocatable/capacity drops"),
    Permission(
        "",
        "nodes",
        ("patch",),
        "without DeviceTaintRule: the GPU recorded on its node, the node taint below the "
        "healthy-GPU threshold, cordon (all undone by Sickbay)",
        False,
        ROLE_NODE_FALLBACK,
    ),
    Permission(
        "",
        "pods",
        ("get", "list", "watch"),
        "consumers, health, eviction/replacement waits; the health watcher",
    ),
    Permission(
        "",
        "pods",
        ("delete",),
        "forced deletion of PDB-protected pods: runbooks with eviction.force: delete",
        False,
        ROLE_FORCE_DELETE,
    ),
    Permission("", "pods/eviction", ("create",), "PDB-respecting eviction and the fallback"),
    Permission("", "namespaces", ("get",), "namespace labels for runbook matching"),
    Permission("", "events", ("list",), "recent events as evidence"),
    Permission("", "events", ("create",), "an Event on every pod, rule and node Sickbay acts on"),
    Permission("", "events", ("patch",), "the count of a repeated Event (aggregation)"),
    Permission("apps", "replicasets", ("get",), "owner chain ReplicaSet -> Deployment"),
    Permission("apps", "deployments", ("get",), "replacement selector and desired replicas"),
    Permission("apps", "statefulsets", ("get",), "replacement selector and desired replicas"),
    Permission("batch", "jobs", ("get",), "owner chain Job -> JobSet, replacement selector"),
    Permission(DRA, "resourceslices", ("list",), "devices, uuids, driver taints"),
    Permission(DRA, "resourceslices", ("watch",), "health watcher: driver taints, vanished GPUs"),
    Permission(DRA, "resourceclaims", ("list",), "claims allocated to a device"),
    Permission(DRA, "deviceclasses", ("list",), "the device class of a device"),
    Permission(
        DRA,
        "devicetaintrules",
        ("get", "list", "watch", "create", "update", "delete"),
        "the quarantine itself (only rules labelled managed-by: sickbay are changed)",
        False,
    ),
    Permission(
        "cluster.x-k8s.io",
        "machinedeployments",
        ("get", "patch"),
        "scale-up through the Cluster API provider (activities/cloud), if configured",
        False,
    ),
    Permission(
        "batch",
        "jobs",
        ("create", "get", "delete"),
        "repair ladder: the reset and validation Jobs (runbooks with repair.enabled)",
        False,
        ROLE_REPAIR,
        namespaced=True,
    ),
    Permission(
        DRA,
        "resourceclaims",
        ("create", "get", "delete"),
        "repair ladder: the validation Job's claim on the repaired device (DRA)",
        False,
        ROLE_REPAIR,
        namespaced=True,
    ),
    Permission(
        "",
        "pods/log",
        ("get",),
        "repair ladder: the summary of a reset / validation Job's output",
        False,
        ROLE_REPAIR,
        namespaced=True,
    ),
    Permission(
        "cluster.x-k8s.io",
        "machines",
        ("get", "list", "patch", "delete"),
        "repair ladder: reboot (remediate-machine) and replace (delete) through Cluster API",
        False,
        ROLE_REPAIR_MACHINES,
    ),
    Permission(
        "",
        "nodes",
        ("patch",),
        "repair ladder: an AKS reboot's record on its node (sickbay.dev/repair-request, "
        "sickbay.dev/restart-record), so a retried attempt restarts the VM at most once",
        False,
        ROLE_REPAIR_MACHINES,
    ),
    Permission(
        "coordination.k8s.io",
        "leases",
        ("get", "create", "update"),
        "health watcher: one active replica per cluster (Lease in Sickbay's namespace)",
        role=ROLE_HEALTH_WATCHER,
        namespaced=True,
    ),
    Permission(
        "",
        "configmaps",
        ("get",),
        "the recorded cluster name (ConfigMap sickbay-cluster in Sickbay's namespace), read "
        "at every start",
        role=ROLE_CLUSTER_NAME,
        namespaced=True,
        name=CLUSTER_CONFIGMAP,
    ),
    Permission(
        "",
        "configmaps",
        ("get",),
        "the runbooks ConfigMap's uid, for the Warning Event when an edit of the runbooks does "
        "not load (ConfigMap sickbay-runbooks in Sickbay's namespace)",
        role=ROLE_CLUSTER_NAME,
        namespaced=True,
        name=RUNBOOKS_CONFIGMAP,
    ),
    Permission(
        "",
        "configmaps",
        ("create",),
        "recording the cluster name once (create cannot be limited to one name; nothing is "
        "ever updated or deleted)",
        role=ROLE_CLUSTER_NAME,
        namespaced=True,
    ),
    Permission(
        "authorization.k8s.io",
        "selfsubjectaccessreviews",
        ("create",),
        "sickbay doctor checks these permissions",
    ),
)


# The webhook's ServiceAccount (sickbay-webhook), only with verified actions on
# (SICKBAY_ACTIONS_KEY_FILE): ClusterRole sickbay-actions in deploy/rbac.yaml.
ROLE_ACTIONS = "sickbay-actions"
WEBHOOK_PERMISSIONS: tuple[Permission, ...] = (
    Permission(
        "authentication.k8s.io",
        "tokenreviews",
        ("create",),
        "verified actors: who a person's bearer token is (POST /v1/actions)",
        role=ROLE_ACTIONS,
    ),
    Permission(
        "authorization.k8s.io",
        "subjectaccessreviews",
        ("create",),
        "verified actors: may that person approve/abort/... (verbs on remediations.sickbay.dev)",
        role=ROLE_ACTIONS,
    ),
)


def granted(group: str, resource: str, verb: str) -> bool:
    return any(p.group == group and p.resource == resource and verb in p.verbs for p in PERMISSIONS)


def _machine_provider(runbook: Runbook) -> str | None:
    """The provider of the runbook's node pool (the repair ladder's node rungs use it too)."""
    scale = runbook.spec.scale_up
    return scale.pool.provider if scale.pool is not None else scale.provider


def _uses_cluster_api(runbook: Runbook) -> bool:
    return runbook.spec.scale_up.enabled and _machine_provider(runbook) == "cluster-api"


def needed(
    permission: Permission, runbooks: Sequence[Runbook], taint_rules_served: bool
) -> list[str]:
    """Why the loaded `runbooks` on this cluster need an optional `permission` (empty: they
    do not, and its grant can be dropped). A required permission is always needed."""
    if permission.required:
        return ["always"]
    if permission.group == "" and permission.resource == "pods":  # delete
        return [
            f"runbook {r.name} (eviction.force: delete)"
            for r in runbooks
            if r.spec.eviction.force == "delete"
        ]
    if permission.resource == "nodes" and permission.role == ROLE_REPAIR_MACHINES:  # patch
        return [
            f"runbook {r.name} (repair: reboot through provider aks)"
            for r in runbooks
            if r.spec.repair.enabled
            and "reboot" in r.spec.repair.order
            and _machine_provider(r) == "aks"
        ]
    if permission.group == "" and permission.resource == "nodes":  # patch
        if taint_rules_served:
            return []
        return ["the fallback: node marks and taints (the cluster serves no DeviceTaintRule)"]
    if permission.resource == "devicetaintrules":
        return (
            ["the quarantine rule (the cluster serves DeviceTaintRule)"]
            if taint_rules_served
            else []
        )
    if permission.role == ROLE_REPAIR:
        return [f"runbook {r.name} (repair.enabled)" for r in runbooks if r.spec.repair.enabled]
    if permission.resource == "machines":
        return [
            f"runbook {r.name} (repair: reboot/replace, if the node's provider is cluster-api)"
            for r in runbooks
            if r.spec.repair.enabled and {"reboot", "replace"} & set(r.spec.repair.order)
        ]
    if permission.resource == "machinedeployments":
        return [
            f"runbook {r.name} (scaleUp provider cluster-api)"
            for r in runbooks
            if _uses_cluster_api(r)
        ]
    return ["(no rule: assumed needed)"]
