"""Who is asking, and may they: the twin's authentication, impersonation and RBAC.

Identities, as a real API server would see them:
- a twin started with a token: that bearer token is `kubernetes-admin` in `system:masters`
  (any other token, or none, is 401);
- a twin started without one (`sickbay-dev up`, tests): every request is `system:anonymous` in
  `system:unauthenticated`, and the authorizer allows it everything (AlwaysAllow), as a
  cluster run with anonymous auth and `--authorization-mode=AlwaysAllow` does;
- `Impersonate-User` / `Impersonate-Group` headers (`kubectl --as`, `--as-group`), honoured
  for those two identities: the request then runs as the impersonated user, who gets exactly
  what RBAC grants. ClusterRoles, ClusterRoleBindings, Roles and RoleBindings are served and
  stored like any object (`kubectl apply -f deploy/rbac.yaml` grants the Sickbay service
  account its role), plus the built-in `system:basic-user`, `system:discovery` and
  `system:public-info-viewer` grants every real cluster has.

- a person's bearer token (`Twin.add_user`, a static token file's line): the request runs as
  that person, with exactly what RBAC grants.

A refused request is the 403 Status recorded from a real server (k8s_golden/19). Reviews
answer from the same evaluation: SelfSubjectAccessReview (`kubectl auth can-i`),
SelfSubjectRulesReview (`auth can-i --list`), SelfSubjectReview (`auth whoami`), and for
another identity TokenReview (who a token is) and SubjectAccessReview (may user + groups do
it; system:masters may do anything, everyone else gets RBAC, as on a cluster with the RBAC
authorizer).
"""

from __future__ import annotations

import fnmatch
from dataclasses import dataclass, field
from typing import Any

from twin import errors

ADMIN = "kubernetes-admin"
ANONYMOUS = "system:anonymous"
MASTERS = "system:masters"
AUTHENTICATED = "system:authenticated"
UNAUTHENTICATED = "system:unauthenticated"
RBAC = "rbac.authorization.k8s.io"

# The default grants of every cluster (bootstrap policy), as (groups, rules).
_BASIC_RULES: list[dict[str, Any]] = [
    {
        "apiGroups": ["authorization.k8s.io"],
        "resources": ["selfsubjectaccessreviews", "selfsubjectrulesreviews"],
        "verbs": ["create"],
    },
    {
        "apiGroups": ["authentication.k8s.io"],
        "resources": ["selfsubjectreviews"],
        "verbs": ["create"],
    },
]
_DISCOVERY_RULES: list[dict[str, Any]] = [
    {
        "nonResourceURLs": [
            "/api",
            "/api/*",
            "/apis",
            "/apis/*",
            "/healthz",
            "/livez",
            "/openapi",
            "/openapi/*",
            "/readyz",
            "/version",
            "/version/",
        ],
        "verbs": ["get"],
    }
]
_PUBLIC_RULES: list[dict[str, Any]] = [
    {
        "nonResourceURLs": ["/healthz", "/livez", "/readyz", "/version", "/version/"],
        "verbs": ["get"],
    }
]
BUILTIN: list[tuple[str, str, list[dict[str, Any]]]] = [
    ("system:basic-user", AUTHENTICATED, _BASIC_RULES),
    ("system:discovery", AUTHENTICATED, _DISCOVERY_RULES),
    ("system:public-info-viewer", AUTHENTICATED, _PUBLIC_RULES),
    ("system:public-info-viewer", UNAUTHENTICATED, _PUBLIC_RULES),
]


@dataclass(frozen=True)
class Identity:
    user: str
    groups: tuple[str, ...] = ()
    uid: str = ""
    extra: dict[str, list[str]] = field(default_factory=dict)

    @property
    def unrestricted(self) -> bool:
        """The twin's own identities: system:masters, or anonymous on a token-less twin."""
        return MASTERS in self.groups or (self.user == ANONYMOUS and not self.impersonated)

    @property
    def impersonated(self) -> bool:
        return bool(self.extra.get("impersonated")) or self.extra.get("person") is not None


def bearer_token(header: str) -> str | None:
    """The token of an `Authorization: Bearer <token>` header, read as the API server's
    bearer-token authenticator reads it: surrounding space trimmed, the scheme in any case
    (the official Python client's in-cluster configuration sends `bearer`)."""
    parts = header.strip().split(" ", 2)
    if len(parts) < 2 or parts[0].lower() != "bearer" or not parts[1]:
        return None
    return parts[1]


def service_account(namespace: str, name: str, uid: str = "") -> Identity:
    """A ServiceAccount's identity, as the API server's token authenticator makes it."""
    return Identity(
        f"system:serviceaccount:{namespace}:{name}",
        ("system:serviceaccounts", f"system:serviceaccounts:{namespace}", AUTHENTICATED),
        uid,
    )


def person(user: str, groups: list[str], uid: str = "") -> Identity:
    """A person known by a bearer token (`Twin.add_user`) or named in a SubjectAccessReview:
    only RBAC grants them anything."""
    shown = list(groups)
    if user != ANONYMOUS and AUTHENTICATED not in shown:
        shown.append(AUTHENTICATED)
    return Identity(user, tuple(dict.fromkeys(shown)), uid, {"person": []})


def authenticate(token: str | None, headers: Any, bound: Any = None) -> Identity:
    """The requester (401 when the twin has a token and the request lacks it).

    `bound(token) -> Identity | None` recognises ServiceAccount tokens the twin minted
    (TokenRequest): such a token is that account, with exactly what RBAC grants it, whether
    or not the twin has an admin token."""
    bearer = bearer_token(headers.get("Authorization", ""))
    account = bound(bearer) if bound is not None and bearer else None
    if account is not None:
        me = account
    elif token:
        if bearer != token:
            raise errors.ApiError(401, "Unauthorized", "Unauthorized")
        me = Identity(ADMIN, (MASTERS, AUTHENTICATED))
    else:
        me = Identity(ANONYMOUS, (UNAUTHENTICATED,))
    user = headers.get("Impersonate-User")
    groups = headers.get_all("Impersonate-Group") if hasattr(headers, "get_all") else None
    if not user:
        if groups:
            raise errors.ApiError(
                500,
                "InternalError",
                "Internal error occurred: requested impersonation of groups without a user",
            )
        return me
    if account is not None:  # no ServiceAccount is granted `impersonate`
        raise errors.ApiError(
            403,
            "Forbidden",
            f'users "{user}" is forbidden: User "{account.user}" cannot impersonate resource '
            '"users" in API group "" at the cluster scope',
            {"kind": "users", "name": user},
        )
    return impersonate(user, list(groups or []), headers.get("Impersonate-Uid", ""))


def impersonate(user: str, groups: list[str], uid: str = "") -> Identity:
    shown = list(groups)
    if user.startswith("system:serviceaccount:"):
        ns = user.split(":")[2]
        shown += ["system:serviceaccounts", f"system:serviceaccounts:{ns}"]
    if user != ANONYMOUS and AUTHENTICATED not in shown:
        shown.append(AUTHENTICATED)
    return Identity(user, tuple(dict.fromkeys(shown)), uid, {"impersonated": ["true"]})


# ---- RBAC ----------------------------------------------------------------------------------


def _subject_matches(subject: dict[str, Any], who: Identity, binding_ns: str) -> bool:
    kind, name = subject.get("kind"), subject.get("name", "")
    if kind == "User":
        return name == who.user
    if kind == "Group":
        return name in who.groups
    if kind == "ServiceAccount":
        ns = subject.get("namespace") or binding_ns
        return who.user == f"system:serviceaccount:{ns}:{name}"
    return False


def rules_for(store: Any, who: Identity, namespace: str) -> list[tuple[str, dict[str, Any]]]:
    """(why, rule) for every rule that applies to `who` in `namespace` ("" = cluster scope)."""
    out: list[tuple[str, dict[str, Any]]] = []
    for role, group, rules in BUILTIN:
        if group in who.groups:
            out += [(f'ClusterRoleBinding "{role}" of ClusterRole "{role}"', r) for r in rules]

    def role_rules(kind: str, name: str, ns: str) -> list[dict[str, Any]]:
        found = (
            store.try_get(f"clusterroles.{RBAC}", name)
            if kind == "ClusterRole"
            else store.try_get(f"roles.{RBAC}", name, ns)
        )
        return list((found or {}).get("rules") or [])

    for binding in store.list(f"clusterrolebindings.{RBAC}", copy_objects=False).items:
        if any(_subject_matches(s, who, "") for s in binding.get("subjects") or []):
            ref = binding.get("roleRef") or {}
            why = f'ClusterRoleBinding "{binding["metadata"]["name"]}" of ClusterRole "{ref.get("name")}"'
            out += [(why, r) for r in role_rules("ClusterRole", ref.get("name", ""), "")]
    if namespace:
        for binding in store.list(f"rolebindings.{RBAC}", namespace, copy_objects=False).items:
            if any(_subject_matches(s, who, namespace) for s in binding.get("subjects") or []):
                ref = binding.get("roleRef") or {}
                why = f'RoleBinding "{binding["metadata"]["name"]}/{namespace}" of {ref.get("kind")} "{ref.get("name")}"'
                out += [
                    (why, r)
                    for r in role_rules(ref.get("kind", ""), ref.get("name", ""), namespace)
                ]
    return out


def _has(values: list[str] | None, wanted: str) -> bool:
    return bool(values) and ("*" in values or wanted in values)  # type: ignore[operator]


def _rule_allows(rule: dict[str, Any], attrs: dict[str, str]) -> bool:
    if attrs.get("path") is not None and "resource" not in attrs:
        urls = rule.get("nonResourceURLs") or []
        path = attrs["path"]
        return _has(rule.get("verbs"), attrs["verb"]) and any(
            u == path or u == "*" or (u.endswith("*") and fnmatch.fnmatchcase(path, u))
            for u in urls
        )
    resource = attrs["resource"] + (f"/{attrs['subresource']}" if attrs.get("subresource") else "")
    resources = rule.get("resources") or []
    names = rule.get("resourceNames") or []
    return (
        _has(rule.get("verbs"), attrs["verb"])
        and _has(rule.get("apiGroups"), attrs.get("group", ""))
        and ("*" in resources or resource in resources)
        and (not names or attrs.get("name", "") in names)
    )


def authorize(store: Any, who: Identity, attrs: dict[str, str]) -> tuple[bool, str]:
    """(allowed, reason) for resource attributes {verb, group, resource, subresource,
    namespace, name} or non-resource attributes {verb, path}."""
    if who.unrestricted:
        return True, ""
    for why, rule in rules_for(store, who, attrs.get("namespace", "")):
        if _rule_allows(rule, attrs):
            return True, f"RBAC: allowed by {why} to {_subject(who)}"
    return False, ""


def _subject(who: Identity) -> str:
    if who.user.startswith("system:serviceaccount:"):
        _, _, ns, name = who.user.split(":", 3)
        return f'ServiceAccount "{name}/{ns}"'
    return f'User "{who.user}"'


def forbidden(who: Identity, attrs: dict[str, str]) -> errors.ApiError:
    """The 403 Status a real server answers (k8s_golden/19)."""
    resource = attrs["resource"] + (f"/{attrs['subresource']}" if attrs.get("subresource") else "")
    name = attrs.get("name", "")
    what = f'{resource} "{name}"' if name else resource
    scope = (
        f'in the namespace "{attrs["namespace"]}"'
        if attrs.get("namespace")
        else "at the cluster scope"
    )
    details: dict[str, Any] = {"kind": attrs["resource"]}
    if name:
        details["name"] = name
    if attrs.get("group"):
        details["group"] = attrs["group"]
    return errors.ApiError(
        403,
        "Forbidden",
        f'{what} is forbidden: User "{who.user}" cannot {attrs["verb"]} resource "{resource}" '
        f'in API group "{attrs.get("group", "")}" {scope}',
        details,
    )


# ---- reviews -------------------------------------------------------------------------------


def access_review(store: Any, who: Identity, body: dict[str, Any]) -> dict[str, Any]:
    spec = body.get("spec") or {}
    ra, nra = spec.get("resourceAttributes"), spec.get("nonResourceAttributes")
    if not ra and not nra:
        raise errors.invalid(
            "SelfSubjectAccessReview",
            "",
            [
                errors.cause(
                    "spec.resourceAttributes",
                    "FieldValueRequired",
                    "Required value: exactly one of nonResourceAttributes or resourceAttributes "
                    "must be specified",
                )
            ],
            "authorization.k8s.io",
        )
    if ra:
        attrs = {
            k: str(ra.get(k) or "")
            for k in ("verb", "group", "resource", "subresource", "namespace", "name")
        }
    else:
        nra = nra or {}
        attrs = {"verb": str(nra.get("verb") or ""), "path": str(nra.get("path") or "")}
    allowed, reason = authorize(store, who, attrs)
    status: dict[str, Any] = {"allowed": allowed}
    if reason:
        status["reason"] = reason
    return _review(body, "authorization.k8s.io/v1", "SelfSubjectAccessReview", spec, status)


def rules_review(store: Any, who: Identity, body: dict[str, Any]) -> dict[str, Any]:
    spec = body.get("spec") or {}
    namespace = str(spec.get("namespace") or "")
    resource_rules: list[dict[str, Any]] = []
    non_resource: list[dict[str, Any]] = []
    if who.unrestricted:
        resource_rules.append({"verbs": ["*"], "apiGroups": ["*"], "resources": ["*"]})
        non_resource.append({"verbs": ["*"], "nonResourceURLs": ["*"]})
    for _why, rule in rules_for(store, who, namespace):
        if rule.get("nonResourceURLs"):
            non_resource.append(
                {"verbs": rule.get("verbs") or [], "nonResourceURLs": rule["nonResourceURLs"]}
            )
        else:
            entry = {
                "verbs": rule.get("verbs") or [],
                "apiGroups": rule.get("apiGroups") or [],
                "resources": rule.get("resources") or [],
            }
            if rule.get("resourceNames"):
                entry["resourceNames"] = rule["resourceNames"]
            resource_rules.append(entry)
    status = {
        "resourceRules": resource_rules,
        "nonResourceRules": non_resource,
        "incomplete": False,
    }
    return _review(body, "authorization.k8s.io/v1", "SelfSubjectRulesReview", spec, status)


def self_review(who: Identity) -> dict[str, Any]:
    info: dict[str, Any] = {"username": who.user, "groups": list(who.groups)}
    if who.uid:
        info["uid"] = who.uid
    return {
        "kind": "SelfSubjectReview",
        "apiVersion": "authentication.k8s.io/v1",
        "metadata": {"creationTimestamp": None},
        "status": {"userInfo": info},
    }


def _review(
    body: dict[str, Any], api_version: str, kind: str, spec: dict[str, Any], status: dict[str, Any]
) -> dict[str, Any]:
    meta = dict(body.get("metadata") or {})
    meta.setdefault("creationTimestamp", None)
    return {
        "kind": kind,
        "apiVersion": api_version,
        "metadata": meta,
        "spec": spec,
        "status": status,
    }


def token_review(
    token: str | None, users: dict[str, Identity], body: dict[str, Any]
) -> dict[str, Any]:
    """authentication.k8s.io/v1 TokenReview: who `spec.token` is. An unknown token is a 201
    with `status.user` empty and no `authenticated` (false is omitted), as the API answers."""
    spec = body.get("spec") or {}
    given = str(spec.get("token") or "")
    if not given:
        raise errors.ApiError(
            400, "BadRequest", "token is required for TokenReview in authentication"
        )
    who = users.get(given)
    if who is None and token and given == token:
        who = Identity(ADMIN, (MASTERS, AUTHENTICATED))
    status: dict[str, Any] = {"user": {}}
    if who is not None:
        info: dict[str, Any] = {"username": who.user, "groups": list(who.groups)}
        if who.uid:
            info["uid"] = who.uid
        status = {"authenticated": True, "user": info}
        if spec.get("audiences"):
            status["audiences"] = list(spec["audiences"])
    return _review(body, "authentication.k8s.io/v1", "TokenReview", spec, status)


def subject_access_review(store: Any, body: dict[str, Any]) -> dict[str, Any]:
    """authorization.k8s.io/v1 SubjectAccessReview: may `spec.user` (with `spec.groups`) do
    it, by the RBAC objects the twin stores (and the bootstrap grants). system:masters is
    allowed everything, as on a real cluster."""
    spec = body.get("spec") or {}
    user, groups = str(spec.get("user") or ""), [str(g) for g in spec.get("groups") or []]
    if not user and not groups:
        raise errors.invalid(
            "SubjectAccessReview",
            "",
            [
                errors.cause(
                    "spec.user",
                    "FieldValueInvalid",
                    'Invalid value: "": at least one of user or group must be specified',
                )
            ],
            "authorization.k8s.io",
        )
    who = Identity(user, tuple(groups), str(spec.get("uid") or ""), {"person": []})
    out = access_review(store, who, body)
    out["kind"] = "SubjectAccessReview"
    return out


def review(store: Any, who: Identity, plural: str, body: dict[str, Any]) -> dict[str, Any]:
    if plural == "selfsubjectaccessreviews":
        return access_review(store, who, body)
    if plural == "selfsubjectrulesreviews":
        return rules_review(store, who, body)
    return self_review(who)
