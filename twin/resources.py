"""The catalogue of kinds the twin serves, independent of any profile.

A `ResourceType` names one REST resource (group + plural). `storage` is the store bucket:
core `events` and `events.k8s.io` events share one bucket, as they share etcd in a real
cluster. Which versions are actually served is decided by the profile (twin/discovery.py).
Resources are addressed in Python as `plural` for the core group and `plural.group` otherwise
(`pods`, `deployments.apps`, `devicetaintrules.resource.k8s.io`), the way kubectl spells them.
"""

from __future__ import annotations

from dataclasses import dataclass, field

DRA_GROUP = "resource.k8s.io"
CAPI_GROUP = "cluster.x-k8s.io"
KARPENTER_GROUP = "karpenter.sh"
CUSTOM_GROUPS = frozenset({CAPI_GROUP, KARPENTER_GROUP})  # custom resources (CRDs)
COORDINATION_GROUP = "coordination.k8s.io"
AUTHZ_GROUP = "authorization.k8s.io"
AUTHN_GROUP = "authentication.k8s.io"
RBAC_GROUP = "rbac.authorization.k8s.io"


@dataclass(frozen=True)
class ResourceType:
    group: str
    plural: str
    kind: str
    namespaced: bool
    versions: tuple[str, ...]
    singular: str = ""
    short_names: tuple[str, ...] = ()
    categories: tuple[str, ...] = ()
    subresources: tuple[str, ...] = ()  # e.g. "status", "scale", "eviction"
    storage_key: str = ""  # bucket shared with another resource (events)
    extra_verbs: tuple[str, ...] = field(default=())
    create_only: bool = False  # a review (SelfSubjectAccessReview...): POST only, never stored

    @property
    def key(self) -> str:
        return f"{self.plural}.{self.group}" if self.group else self.plural

    @property
    def storage(self) -> str:
        return self.storage_key or self.key

    @property
    def list_kind(self) -> str:
        return self.kind + "List"

    @property
    def has_status(self) -> bool:
        return "status" in self.subresources

    def api_version(self, version: str) -> str:
        return f"{self.group}/{version}" if self.group else version

    @property
    def verbs(self) -> list[str]:
        if self.create_only:
            return ["create"]
        if self.plural == "namespaces":
            return ["create", "delete", "get", "list", "patch", "update", "watch"]
        return ["create", "delete", "deletecollection", "get", "list", "patch", "update", "watch"]


_DRA_STABLE = ("v1", "v1beta2", "v1beta1")

CATALOGUE: tuple[ResourceType, ...] = (
    ResourceType(
        "", "namespaces", "Namespace", False, ("v1",), "namespace", ("ns",), (), ("status",)
    ),
    ResourceType("", "nodes", "Node", False, ("v1",), "node", ("no",), (), ("status",)),
    ResourceType(
        "",
        "pods",
        "Pod",
        True,
        ("v1",),
        "pod",
        ("po",),
        ("all",),
        ("status", "eviction", "binding", "log"),
    ),
    ResourceType("", "events", "Event", True, ("v1",), "event", ("ev",)),
    ResourceType("", "configmaps", "ConfigMap", True, ("v1",), "configmap", ("cm",)),
    ResourceType("", "secrets", "Secret", True, ("v1",), "secret"),
    ResourceType(
        "",
        "serviceaccounts",
        "ServiceAccount",
        True,
        ("v1",),
        "serviceaccount",
        ("sa",),
        (),
        ("token",),
    ),
    ResourceType(
        "", "services", "Service", True, ("v1",), "service", ("svc",), ("all",), ("status",)
    ),
    ResourceType(COORDINATION_GROUP, "leases", "Lease", True, ("v1",), "lease"),
    ResourceType(RBAC_GROUP, "clusterroles", "ClusterRole", False, ("v1",), "clusterrole"),
    ResourceType(
        RBAC_GROUP,
        "clusterrolebindings",
        "ClusterRoleBinding",
        False,
        ("v1",),
        "clusterrolebinding",
    ),
    ResourceType(RBAC_GROUP, "roles", "Role", True, ("v1",), "role"),
    ResourceType(RBAC_GROUP, "rolebindings", "RoleBinding", True, ("v1",), "rolebinding"),
    ResourceType(
        AUTHZ_GROUP,
        "selfsubjectaccessreviews",
        "SelfSubjectAccessReview",
        False,
        ("v1",),
        "selfsubjectaccessreview",
        create_only=True,
    ),
    ResourceType(
        AUTHZ_GROUP,
        "selfsubjectrulesreviews",
        "SelfSubjectRulesReview",
        False,
        ("v1",),
        "selfsubjectrulesreview",
        create_only=True,
    ),
    ResourceType(
        AUTHZ_GROUP,
        "subjectaccessreviews",
        "SubjectAccessReview",
        False,
        ("v1",),
        "subjectaccessreview",
        create_only=True,
    ),
    ResourceType(
        AUTHN_GROUP,
        "tokenreviews",
        "TokenReview",
        False,
        ("v1",),
        "tokenreview",
        create_only=True,
    ),
    ResourceType(
        AUTHN_GROUP,
        "selfsubjectreviews",
        "SelfSubjectReview",
        False,
        ("v1",),
        "selfsubjectreview",
        create_only=True,
    ),
    ResourceType(
        "events.k8s.io", "events", "Event", True, ("v1",), "event", ("ev",), storage_key="events"
    ),
    ResourceType(
        "apps",
        "deployments",
        "Deployment",
        True,
        ("v1",),
        "deployment",
        ("deploy",),
        ("all",),
        ("status", "scale"),
    ),
    ResourceType(
        "apps",
        "replicasets",
        "ReplicaSet",
        True,
        ("v1",),
        "replicaset",
        ("rs",),
        ("all",),
        ("status", "scale"),
    ),
    ResourceType(
        "apps",
        "statefulsets",
        "StatefulSet",
        True,
        ("v1",),
        "statefulset",
        ("sts",),
        ("all",),
        ("status", "scale"),
    ),
    ResourceType("batch", "jobs", "Job", True, ("v1",), "job", (), ("all",), ("status",)),
    ResourceType(
        "policy",
        "poddisruptionbudgets",
        "PodDisruptionBudget",
        True,
        ("v1",),
        "poddisruptionbudget",
        ("pdb",),
        (),
        ("status",),
    ),
    ResourceType(
        "networking.k8s.io",
        "networkpolicies",
        "NetworkPolicy",
        True,
        ("v1",),
        "networkpolicy",
        ("netpol",),
    ),
    ResourceType(DRA_GROUP, "deviceclasses", "DeviceClass", False, _DRA_STABLE, "deviceclass"),
    ResourceType(DRA_GROUP, "resourceslices", "ResourceSlice", False, _DRA_STABLE, "resourceslice"),
    ResourceType(
        DRA_GROUP,
        "resourceclaims",
        "ResourceClaim",
        True,
        _DRA_STABLE,
        "resourceclaim",
        subresources=("status",),
    ),
    ResourceType(
        DRA_GROUP,
        "resourceclaimtemplates",
        "ResourceClaimTemplate",
        True,
        _DRA_STABLE,
        "resourceclaimtemplate",
    ),
    ResourceType(
        DRA_GROUP,
        "devicetaintrules",
        "DeviceTaintRule",
        False,
        ("v1", "v1beta2", "v1alpha3"),
        "devicetaintrule",
        subresources=("status",),
    ),
    ResourceType(
        CAPI_GROUP,
        "machinedeployments",
        "MachineDeployment",
        True,
        ("v1beta1",),
        "machinedeployment",
        ("md",),
        ("cluster-api",),
        ("status", "scale"),
    ),
    ResourceType(
        CAPI_GROUP,
        "machines",
        "Machine",
        True,
        ("v1beta1",),
        "machine",
        ("ma",),
        ("cluster-api",),
        ("status",),
    ),
    ResourceType(  # Karpenter's NodePool (its CRD, karpenter.sh/v1): limits and usage
        KARPENTER_GROUP,
        "nodepools",
        "NodePool",
        False,
        ("v1",),
        "nodepool",
        (),
        ("karpenter",),
        ("status",),
    ),
)

BY_KEY: dict[str, ResourceType] = {rt.key: rt for rt in CATALOGUE}
BY_KIND: dict[tuple[str, str], ResourceType] = {(rt.group, rt.kind): rt for rt in CATALOGUE}


def resolve(name: str) -> ResourceType:
    """`pods`, `deployments.apps`, `deployments`, `Deployment` or `apps/Deployment` → type."""
    if name in BY_KEY:
        return BY_KEY[name]
    matches = [rt for rt in CATALOGUE if name in (rt.plural, rt.kind, rt.singular)]
    if "/" in name:
        group, kind = name.rsplit("/", 1)
        matches = [rt for rt in CATALOGUE if rt.kind == kind and (rt.group == group)]
    # Prefer the core group when a plural exists in two groups (events).
    if len(matches) > 1:
        core = [rt for rt in matches if rt.group == ""]
        matches = core or matches
    if len(matches) != 1:
        raise KeyError(f"unknown resource {name!r}")
    return matches[0]
