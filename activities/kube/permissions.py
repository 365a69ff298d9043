"""Every Kubernetes permission the activities and `sickbay doctor` use, with why.

deploy/rbac.yaml grants exactly these (a test compares the two and checks the simulator's
request log against the role); `sickbay doctor` asks the API server about each one with a
SelfSubjectAccessReview. Discovery (/version, /api, /apis/...) is a non-resource URL every
authenticated identity may read (system:discovery), so it is not listed.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Permission:
    group: str
    resource: str  # plural, with "/subresource" when it is one
    verbs: tuple[str, ...]
    why: str
    required: bool = True  # False: only some runbooks/paths need it (doctor warns, not errors)
    namespaced: bool = False  # True: granted in Sickbay's own namespace only (a Role)

    @property
    def plural(self) -> str:
        return self.resource.split("/", 1)[0]

    @property
    def subresource(self) -> str:
        return self.resource.split("/", 1)[1] if "/" in self.resource else ""


DRA = "resource.k8s.io"

PERMISSIONS: tuple[Permission, ...] = (
    Permission("", "nodes", ("get", "list"), "resolve devices, node pools, capacity"),
    Permission("", "nodes", ("watch",), "health watcher: GPU allocatable/capacity drops"),
    Permission(
        "", "nodes", ("patch",), "cordon and the fallback node taint (undone by Sickbay)", False
    ),
    Permission(
        "",
        "pods",
        ("get", "list", "watch"),
        "consumers, health, eviction/replacement waits; the health watcher",
    ),
    Permission(
        "", "pods", ("delete",), "forced deletion when a runbook's force policy says so", False
    ),
    Permission("", "pods/eviction", ("create",), "PDB-respecting eviction and the fallback"),
    Permission("", "namespaces", ("get",), "namespace labels for runbook matching"),
    Permission("", "events", ("list",), "recent events as evidence"),
    Permission("", "events", ("create",), "an Event on every pod, rule and node Sickbay acts on"),
    Permission("apps", "replicasets", ("get",), "owner chain ReplicaSet -> Deployment"),
    Permission("apps", "deployments", ("get",), "replacement selector and desired replicas"),
    Permission("apps", "statefulsets", ("get",), "replacement selector and desired replicas"),
    Permission("batch", "jobs", ("get",), "owner chain Job -> JobSet, replacement selector"),
    Permission(DRA, "resourceslices", ("list",), "devices, uuids, driver taints"),
    Permission(DRA, "resourceslices", ("watch",), "health watcher: driver taints, vanished GPUs"),
    Permission(DRA, "resourceclaims", ("list",), "claims allocated to a device"),
    Permission(DRA, "deviceclasses", ("get", "list"), "device class of a device, free capacity"),
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
        "coordination.k8s.io",
        "leases",
        ("get", "create", "update"),
        "health watcher: one active replica per cluster (Lease in Sickbay's namespace)",
        namespaced=True,
    ),
    Permission(
        "authorization.k8s.io",
        "selfsubjectaccessreviews",
        ("create",),
        "sickbay doctor checks these permissions",
    ),
)


def granted(group: str, resource: str, verb: str) -> bool:
    return any(p.group == group and p.resource == resource and verb in p.verbs for p in PERMISSIONS)
