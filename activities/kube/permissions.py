"""Every Kubernetes permission the activities and `sickbay doctor` use, with why.

deploy/ grants exactly these, each in the ClusterRole `role` names (a test compares the two
and checks the twin's request log against the roles); `sickbay doctor` asks the API
server about each one with a SelfSubjectAccessReview. Discovery (/version, /api, /apis/...)
is a non-resource URL every authenticated identity may read (system:discovery), so it is not
listed.

Grants only some runbooks or clusters use live in roles of their own, each shipped as a
kustomize component (deploy/components/<name>, `kind: Component`) named after what needs it.
`FEATURES` is the one table of what needs them: each code path a runbook setting or the cluster
switches on, the role that carries its grants, and the grants. `sickbay doctor` derives the
needed grants from the loaded runbooks through it (`needed`, `features_in_use`), and a test
holds deploy/ to it: every component grants exactly what its features need. Component `repair`
holds a Role in the repair namespace (SICKBAY_REPAIR_NAMESPACE, the only place the worker
creates Jobs).
The node incident's grants (`sickbay-node-incident`, deploy/rbac-node-incident.yaml: node taint
and condition, the GPU plugin pod's restart) are installed by default, as `nodeIncident.enabled`
is; `needed` names the runbook that enables it.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
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
    # True: a Role grants it in Sickbay's own namespace (in the repair namespace for
    # ROLE_REPAIR's permissions: `in_repair_namespace`)
    namespaced: bool = False
    name: str = ""  # the one object it is granted for (RBAC resourceNames), "" for any

    @property
    def in_repair_namespace(self) -> bool:
        return self.namespaced and self.role == ROLE_REPAIR

    @property
    def plural(self) -> str:
        return self.resource.split("/", 1)[0]

    @property
    def subresource(self) -> str:
        return self.resource.split("/", 1)[1] if "/" in self.resource else ""


DRA = "resource.k8s.io"
ROLE_FORCE_DELETE = "sickbay-force-delete"  # component force-delete
ROLE_NODE_PATCH = "sickbay-node-patch"  # component node-patch
ROLE_HEALTH_WATCHER = "sickbay-health-watcher"  # a Role in Sickbay's namespace (rbac.yaml)
ROLE_CLUSTER_NAME = "sickbay-cluster-name"  # a Role in Sickbay's namespace (rbac.yaml)
ROLE_REPAIR = "sickbay-repair"  # a Role in the repair Jobs' namespace (component repair)
ROLE_REPAIR_MACHINES = "sickbay-repair-machines"  # component repair-cluster-api
ROLE_SCALE_CLUSTER_API = "sickbay-scale-up-cluster-api"  # component scale-up-cluster-api
# The kustomize component (deploy/components/<name>) that carries each optional role.
COMPONENTS = {
    ROLE_FORCE_DELETE: "force-delete",
    ROLE_NODE_PATCH: "node-patch",
    ROLE_REPAIR: "repair",
    ROLE_REPAIR_MACHINES: "repair-cluster-api",
    ROLE_SCALE_CLUSTER_API: "scale-up-cluster-api",
}
ROLE_NODE_INCIDENT = "sickbay-node-incident"  # deploy/rbac-node-incident.yaml (not a component)
ROLE_FILES = {
    "sickbay": "deploy/rbac.yaml",
    ROLE_HEALTH_WATCHER: "deploy/rbac.yaml",
    ROLE_CLUSTER_NAME: "deploy/rbac.yaml",
    **{role: f"deploy/components/{name}/rbac.yaml" for role, name in COMPONENTS.items()},
    ROLE_NODE_INCIDENT: "deploy/rbac-node-incident.yaml",
}

PERMISSIONS: tuple[Permission, ...] = (
    Permission("", "nodes", ("get", "list"), "resolve devices, node pools, capacity"),
    Permission("", "nodes", ("watch",), "health watcher: GPU allocatable/capacity drops"),
    Permission(
        "",
        "nodes",
        ("patch",),
        "the churn stop's cordon (replacement.onChurn: cordon); without DeviceTaintRule the "
        "GPU recorded on its node, the node taint below the healthy-GPU threshold, cordon; a "
        "replaced node cordoned while its GPUs validate; an AKS or EC2 reboot's record on its node "
        "(sickbay.dev/repair-request, sickbay.dev/restart-record); all undone by Sickbay",
        False,
        ROLE_NODE_PATCH,
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
        ROLE_SCALE_CLUSTER_API,
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
        "",
        "events",
        ("list",),
        "repair ladder: why a Job's pod was refused or never started (FailedCreate, image "
        "pull), reported at the next poll",
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
        "",
        "nodes",
        ("patch",),
        "node incident: Sickbay's taint sickbay.dev/gpus-vanished (or cordon) on a node whose "
        "GPUs vanished, the plugin-restart record (all undone by Sickbay)",
        False,
        ROLE_NODE_INCIDENT,
    ),
    Permission(
        "",
        "nodes/status",
        ("patch",),
        "node incident: the node condition GPUDevicesAvailable",
        False,
        ROLE_NODE_INCIDENT,
    ),
    Permission(
        "",
        "pods",
        ("delete",),
        "node incident: restart the GPU plugin pod on the node (once per attempt)",
        False,
        ROLE_NODE_INCIDENT,
    ),
    Permission(
        "node.k8s.io",
        "runtimeclasses",
        ("get",),
        "node incident: the diagnosis checks the RuntimeClass the GPU plugin names",
        False,
        ROLE_NODE_INCIDENT,
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


def _repairs(runbook: Runbook, *rungs: str) -> bool:
    repair = runbook.spec.repair
    return repair.enabled and bool(set(rungs) & set(repair.order))


Grant = tuple[str, str, str]  # (API group, resource, verb)
CLUSTER = "cluster"  # a Feature.uses value: the cluster, not a runbook, decides


@dataclass(frozen=True)
class Feature:
    """A code path some runbooks (or the cluster) switch on, and the grants it needs.

    `uses` says, for one runbook and whether the cluster serves DeviceTaintRule, why that
    runbook needs it ("" when it does not); a cluster-level feature (the fallback) answers
    for the cluster the same for every runbook."""

    name: str
    role: str
    grants: tuple[Grant, ...]
    uses: Callable[[Runbook, bool], str]
    cluster_level: bool = False

    def reasons(self, runbooks: Sequence[Runbook], taint_rules_served: bool) -> list[str]:
        if self.cluster_level:
            why = self.uses(Runbook.model_validate(_EMPTY), taint_rules_served)
            return [why] if why else []
        by_why: dict[str, list[str]] = {}
        for r in runbooks:
            if why := self.uses(r, taint_rules_served):
                by_why.setdefault(why, []).append(r.name)
        return [
            f"runbook{'s' if len(names) > 1 else ''} {', '.join(names)} ({why})"
            for why, names in by_why.items()
        ]


_EMPTY = {"apiVersion": "sickbay/v1", "kind": "Runbook", "metadata": {"name": "cluster"}}
_NODE_PATCH: tuple[Grant, ...] = (("", "nodes", "patch"),)
_REPAIR_JOBS: tuple[Grant, ...] = tuple(
    [("batch", "jobs", v) for v in ("create", "get", "delete")]
    + [(DRA, "resourceclaims", v) for v in ("create", "get", "delete")]
    + [("", "pods/log", "get")]
    + [("", "events", "list")]  # why a Job's pod was refused or never started
)

# Every optional code path and the grants it needs: the one table doctor and the deploy/
# test read. A runbook setting not named here needs only the base role (deploy/rbac.yaml).
FEATURES: tuple[Feature, ...] = (
    Feature(
        "churn-cordon",
        ROLE_NODE_PATCH,
        _NODE_PATCH,
        lambda r, _s: (
            "replacement.onChurn: cordon" if r.spec.replacement.on_churn == "cordon" else ""
        ),
    ),
    Feature(
        "node-fallback",
        ROLE_NODE_PATCH,
        _NODE_PATCH,
        lambda _r, served: (
            ""
            if served
            else "the fallback: node marks and taints (the cluster serves no DeviceTaintRule)"
        ),
        cluster_level=True,
    ),
    Feature(
        "replace-guard",
        ROLE_NODE_PATCH,
        _NODE_PATCH,
        lambda r, _s: (
            "repair: replace cordons the new node while validation runs"
            if _repairs(r, "replace") and r.spec.validation.enabled
            else ""
        ),
    ),
    Feature(
        "repair-reboot-record",
        ROLE_NODE_PATCH,
        _NODE_PATCH,
        lambda r, _s: (
            f"repair: reboot through provider {_machine_provider(r)}"
            # AKS and EC2 take no request token: the ask is recorded on the node first
            if _repairs(r, "reboot") and _machine_provider(r) in ("aks", "eks")
            else ""
        ),
    ),
    Feature(
        "force-delete",
        ROLE_FORCE_DELETE,
        (("", "pods", "delete"),),
        lambda r, _s: "eviction.force: delete" if r.spec.eviction.force == "delete" else "",
    ),
    Feature(
        "repair-jobs",
        ROLE_REPAIR,
        _REPAIR_JOBS,
        lambda r, _s: (
            "repair.enabled"
            if r.spec.repair.enabled
            and ("reset" in r.spec.repair.order or r.spec.validation.enabled)
            else ""
        ),
    ),
    Feature(
        "repair-cluster-api",
        ROLE_REPAIR_MACHINES,
        tuple(("cluster.x-k8s.io", "machines", v) for v in ("get", "list", "patch", "delete")),
        lambda r, _s: (
            "repair: reboot/replace through provider cluster-api"
            if _repairs(r, "reboot", "replace") and _machine_provider(r) == "cluster-api"
            else ""
        ),
    ),
    Feature(
        "scale-up-cluster-api",
        ROLE_SCALE_CLUSTER_API,
        tuple(("cluster.x-k8s.io", "machinedeployments", v) for v in ("get", "patch")),
        lambda r, _s: (
            "scaleUp provider cluster-api"
            if r.spec.scale_up.enabled and _machine_provider(r) == "cluster-api"
            else ""
        ),
    ),
    Feature(
        "quarantine-rule",
        "sickbay",
        tuple(
            (DRA, "devicetaintrules", v)
            for v in ("get", "list", "watch", "create", "update", "delete")
        ),
        lambda _r, served: (
            "the quarantine rule (the cluster serves DeviceTaintRule)" if served else ""
        ),
        cluster_level=True,
    ),
)


def feature_grants(permission: Permission) -> set[Grant]:
    return {(permission.group, permission.resource, v) for v in permission.verbs}


def needed(
    permission: Permission, runbooks: Sequence[Runbook], taint_rules_served: bool
) -> list[str]:
    """Why the loaded `runbooks` on this cluster need an optional `permission` (empty: they
    do not, and its grant can be dropped), from `FEATURES`. A required permission is always
    needed."""
    if permission.required:
        return ["always"]
    if permission.role == ROLE_NODE_INCIDENT:
        # The node incident reads the runbook named default, else the first one.
        chosen = next((r for r in runbooks if r.name == "default"), None) or (
            runbooks[0] if runbooks else None
        )
        if chosen is None or not chosen.spec.node_incident.enabled:
            return []
        return [f"runbook {chosen.name} (nodeIncident.enabled)"]
    grants = feature_grants(permission)
    out: list[str] = []
    for feature in FEATURES:
        if feature.role == permission.role and grants & set(feature.grants):
            out += [w for w in feature.reasons(runbooks, taint_rules_served) if w not in out]
    return out


def features_in_use(runbooks: Sequence[Runbook], taint_rules_served: bool) -> dict[str, list[str]]:
    """Feature name -> why it is in use, for the features the runbooks and cluster switch on."""
    return {f.name: why for f in FEATURES if (why := f.reasons(runbooks, taint_rules_served))}


def components_needed(runbooks: Sequence[Runbook], taint_rules_served: bool) -> list[str]:
    """The deploy/components the loaded runbooks and cluster need, in table order."""
    in_use = features_in_use(runbooks, taint_rules_served)
    names = [COMPONENTS[f.role] for f in FEATURES if f.name in in_use and f.role in COMPONENTS]
    return list(dict.fromkeys(names))
