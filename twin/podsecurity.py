"""Pod Security admission as the API server runs it (on by default since 1.25), per namespace.

A namespace's labels choose the levels: `pod-security.kubernetes.io/enforce` (a pod that
violates it is refused: 403 for a direct create, a `FailedCreate` Warning Event on the owner for
a controller's create), `warn` (a `Warning` response header, nothing refused) and `audit` (an
audit annotation: the twin keeps no audit log, so it only reads it). `<mode>-version` labels
name the policy version; every version is judged by the checks of `latest` (the checks the
twin models did not change after 1.25) and is echoed in the message, as the server does.

The checks and their message format are the upstream ones (k8s.io/pod-security-admission):
`violates PodSecurity "<level>:<version>": <reason> (<detail>), <reason> (<detail>)`, baseline
checks first, then the restricted ones (a restricted check replaces the baseline check it
tightens: capabilities, volumes, seccomp). Modelled:

- baseline: host namespaces, privileged, non-default capabilities (added beyond the default
  container runtime set), hostPath volumes, hostPort, seccompProfile Unconfined;
- restricted: all of baseline, plus allowPrivilegeEscalation != false, unrestricted
  capabilities (drop ALL; only NET_BIND_SERVICE may be added), restricted volume types,
  runAsNonRoot != true, runAsUser=0, seccompProfile RuntimeDefault or Localhost.

Not modelled (no Sickbay pod or test uses them): AppArmor, SELinux options, procMount,
sysctls, Windows host process; exemptions configured on the API server.
"""

from __future__ import annotations

from typing import Any

LABEL = "pod-security.kubernetes.io/"
LEVELS = ("privileged", "baseline", "restricted")
_RANK = {level: i for i, level in enumerate(LEVELS)}

# The container runtime's default capabilities, which baseline lets a container add back.
BASELINE_CAPABILITIES = frozenset(
    {
        "AUDIT_WRITE",
        "CHOWN",
        "DAC_OVERRIDE",
        "FOWNER",
        "FSETID",
        "KILL",
        "MKNOD",
        "NET_BIND_SERVICE",
        "SETFCAP",
        "SETGID",
        "SETPCAP",
        "SETUID",
        "SYS_CHROOT",
    }
)
# Volume types restricted allows (everything else, hostPath included, is refused).
RESTRICTED_VOLUMES = frozenset(
    {
        "configMap",
        "csi",
        "downwardAPI",
        "emptyDir",
        "ephemeral",
        "image",
        "persistentVolumeClaim",
        "projected",
        "secret",
    }
)
# Workload kinds whose pod template is checked on create/update (a Warning, never a refusal).
TEMPLATE_PATHS: dict[str, tuple[str, ...]] = {
    "jobs.batch": ("spec", "template"),
    "cronjobs.batch": ("spec", "jobTemplate", "spec", "template"),
    "deployments.apps": ("spec", "template"),
    "replicasets.apps": ("spec", "template"),
    "statefulsets.apps": ("spec", "template"),
    "daemonsets.apps": ("spec", "template"),
    "replicationcontrollers": ("spec", "template"),
}


def _plural(n: int, one: str, many: str) -> str:
    return one if n == 1 else many


def _quote(names: list[str]) -> str:
    return ", ".join(f'"{n}"' for n in names)


def _who(names: list[str]) -> str:
    return f"{_plural(len(names), 'container', 'containers')} {_quote(names)}"


def _containers(spec: dict[str, Any]) -> list[dict[str, Any]]:
    return [
        *(spec.get("initContainers") or []),
        *(spec.get("containers") or []),
        *(spec.get("ephemeralContainers") or []),
    ]


def _sc(container: dict[str, Any]) -> dict[str, Any]:
    return container.get("securityContext") or {}


def _volume_type(volume: dict[str, Any]) -> str:
    return next((k for k in volume if k != "name"), "")


# -- baseline ----------------------------------------------------------------------------------


def _host_namespaces(spec: dict[str, Any]) -> str | None:
    set_ = [f"{k}=true" for k in ("hostNetwork", "hostPID", "hostIPC") if spec.get(k)]
    return ", ".join(set_) or None


def _privileged(spec: dict[str, Any]) -> str | None:
    bad = [c.get("name", "") for c in _containers(spec) if _sc(c).get("privileged")]
    return f"{_who(bad)} must not set securityContext.privileged=true" if bad else None


def _capabilities_baseline(spec: dict[str, Any]) -> str | None:
    bad, caps = [], set()
    for c in _containers(spec):
        added = [a for a in (_sc(c).get("capabilities") or {}).get("add") or []]
        extra = [a for a in added if a not in BASELINE_CAPABILITIES]
        if extra:
            bad.append(c.get("name", ""))
            caps.update(extra)
    if not bad:
        return None
    return (
        f"{_who(bad)} must not include {_quote(sorted(caps))} in securityContext.capabilities.add"
    )


def _host_path(spec: dict[str, Any]) -> str | None:
    bad = [v.get("name", "") for v in spec.get("volumes") or [] if "hostPath" in v]
    return f"{_plural(len(bad), 'volume', 'volumes')} {_quote(bad)}" if bad else None


def _host_ports(spec: dict[str, Any]) -> str | None:
    bad, ports = [], []
    for c in _containers(spec):
        mine = [str(p["hostPort"]) for p in c.get("ports") or [] if p.get("hostPort")]
        if mine:
            bad.append(c.get("name", ""))
            ports.extend(mine)
    if not bad:
        return None
    return f"{_who(bad)} {_plural(len(bad), 'uses', 'use')} {_plural(len(ports), 'hostPort', 'hostPorts')} {', '.join(ports)}"


def _seccomp_baseline(spec: dict[str, Any]) -> str | None:
    out = []
    pod = ((spec.get("securityContext") or {}).get("seccompProfile") or {}).get("type")
    if pod == "Unconfined":
        out.append("pod")
    bad = [
        c.get("name", "")
        for c in _containers(spec)
        if (_sc(c).get("seccompProfile") or {}).get("type") == "Unconfined"
    ]
    if bad:
        out.append(_who(bad))
    if not out:
        return None
    return f'{" and ".join(out)} must not set securityContext.seccompProfile.type to "Unconfined"'


# -- restricted --------------------------------------------------------------------------------


def _allow_privilege_escalation(spec: dict[str, Any]) -> str | None:
    bad = [
        c.get("name", "")
        for c in _containers(spec)
        if _sc(c).get("allowPrivilegeEscalation") is not False
    ]
    return f"{_who(bad)} must set securityContext.allowPrivilegeEscalation=false" if bad else None


def _capabilities_restricted(spec: dict[str, Any]) -> str | None:
    no_drop, adding, caps = [], [], set()
    for c in _containers(spec):
        capabilities = _sc(c).get("capabilities") or {}
        if "ALL" not in (capabilities.get("drop") or []):
            no_drop.append(c.get("name", ""))
        extra = [a for a in capabilities.get("add") or [] if a != "NET_BIND_SERVICE"]
        if extra:
            adding.append(c.get("name", ""))
            caps.update(extra)
    details = []
    if no_drop:
        details.append(f'{_who(no_drop)} must set securityContext.capabilities.drop=["ALL"]')
    if adding:
        details.append(
            f"{_who(adding)} must not include {_quote(sorted(caps))} in "
            "securityContext.capabilities.add"
        )
    return "; ".join(details) or None


def _restricted_volumes(spec: dict[str, Any]) -> str | None:
    bad, kinds = [], []
    for v in spec.get("volumes") or []:
        kind = _volume_type(v)
        if kind and kind not in RESTRICTED_VOLUMES:
            bad.append(v.get("name", ""))
            if kind not in kinds:
                kinds.append(kind)
    if not bad:
        return None
    return (
        f"{_plural(len(bad), 'volume', 'volumes')} {_quote(bad)} "
        f"{_plural(len(bad), 'uses', 'use')} restricted volume "
        f"{_plural(len(kinds), 'type', 'types')} {_quote(sorted(kinds))}"
    )


def _run_as_non_root(spec: dict[str, Any]) -> str | None:
    pod = (spec.get("securityContext") or {}).get("runAsNonRoot")
    setters = ["pod"] if pod is False else []
    explicit = [c.get("name", "") for c in _containers(spec) if _sc(c).get("runAsNonRoot") is False]
    if explicit:
        setters.append(_who(explicit))
    if setters:
        return f"{' and '.join(setters)} must not set securityContext.runAsNonRoot=false"
    if pod is True:
        return None
    implicit = [c.get("name", "") for c in _containers(spec) if _sc(c).get("runAsNonRoot") is None]
    if implicit:
        return f"pod or {_who(implicit)} must set securityContext.runAsNonRoot=true"
    return None


def _run_as_user(spec: dict[str, Any]) -> str | None:
    out = []
    if (spec.get("securityContext") or {}).get("runAsUser") == 0:
        out.append("pod")
    bad = [c.get("name", "") for c in _containers(spec) if _sc(c).get("runAsUser") == 0]
    if bad:
        out.append(_who(bad))
    return f"{' and '.join(out)} must not set runAsUser=0" if out else None


def _seccomp_restricted(spec: dict[str, Any]) -> str | None:
    allowed = ("RuntimeDefault", "Localhost")
    pod = ((spec.get("securityContext") or {}).get("seccompProfile") or {}).get("type")
    explicit = ["pod"] if pod is not None and pod not in allowed else []
    bad = [
        c.get("name", "")
        for c in _containers(spec)
        if (t := (_sc(c).get("seccompProfile") or {}).get("type")) is not None and t not in allowed
    ]
    if bad:
        explicit.append(_who(bad))
    if explicit:
        return (
            f"{' and '.join(explicit)} must not set securityContext.seccompProfile.type to "
            '"Unconfined"'
        )
    if pod in allowed:
        return None
    implicit = [c.get("name", "") for c in _containers(spec) if not _sc(c).get("seccompProfile")]
    if implicit:
        return (
            f"pod or {_who(implicit)} must set securityContext.seccompProfile.type to "
            '"RuntimeDefault" or "Localhost"'
        )
    return None


# (reason, check), in the order the server reports them.
BASELINE = (
    ("non-default capabilities", _capabilities_baseline),
    ("host namespaces", _host_namespaces),
    ("hostPath volumes", _host_path),
    ("hostPort", _host_ports),
    ("privileged", _privileged),
    ("seccompProfile", _seccomp_baseline),
)
# Restricted replaces these baseline checks with its stricter versions.
_REPLACED = {"non-default capabilities", "hostPath volumes", "seccompProfile"}
RESTRICTED = (
    *((r, c) for r, c in BASELINE if r not in _REPLACED),
    ("allowPrivilegeEscalation != false", _allow_privilege_escalation),
    ("unrestricted capabilities", _capabilities_restricted),
    ("restricted volume types", _restricted_volumes),
    ("runAsNonRoot != true", _run_as_non_root),
    ("runAsUser=0", _run_as_user),
    ("seccompProfile", _seccomp_restricted),
)


def violations(level: str, pod_spec: dict[str, Any]) -> list[str]:
    """`reason (detail)` of every check of `level` the pod spec fails; empty: admitted."""
    if level == "privileged" or level not in _RANK:
        return []
    checks = BASELINE if level == "baseline" else RESTRICTED
    out = []
    for reason, check in checks:
        detail = check(pod_spec)
        if detail:
            out.append(f"{reason} ({detail})")
    return out


def policy(labels: dict[str, str] | None, mode: str) -> tuple[str, str]:
    """(level, version) of a namespace for `mode` (enforce / warn / audit); unset or an
    unknown level reads as privileged (the server's default with no admission config)."""
    labels = labels or {}
    level = labels.get(f"{LABEL}{mode}", "privileged")
    if level not in _RANK:
        level = "privileged"
    return level, labels.get(f"{LABEL}{mode}-version") or "latest"


def verdict(
    labels: dict[str, str] | None, mode: str, pod_spec: dict[str, Any], would: bool = False
) -> str | None:
    """`violates PodSecurity "<level>:<version>": ...` (`would violate ...` for a warning) when
    the pod spec fails the namespace's `mode` level, else None."""
    level, version = policy(labels, mode)
    found = violations(level, pod_spec)
    if not found:
        return None
    verb = "would violate" if would else "violates"
    return f'{verb} PodSecurity "{level}:{version}": {", ".join(found)}'


def template_spec(resource: str, obj: dict[str, Any]) -> dict[str, Any] | None:
    """The pod spec inside a workload object's template, None for other resources."""
    path = TEMPLATE_PATHS.get(resource)
    if path is None:
        return None
    node: Any = obj
    for key in path:
        node = (node or {}).get(key) if isinstance(node, dict) else None
    spec = (node or {}).get("spec") if isinstance(node, dict) else None
    return spec if isinstance(spec, dict) else None


def warnings(labels: dict[str, str] | None, resource: str, obj: dict[str, Any]) -> list[str]:
    """Warning header texts for a create: a pod failing the `warn` level; a workload whose
    template fails the `enforce` or `warn` level (its pods would be refused)."""
    out: list[str] = []
    if resource == "pods":
        text = verdict(labels, "warn", obj.get("spec") or {}, would=True)
        if text:
            out.append(text)
        return out
    spec = template_spec(resource, obj)
    if spec is None:
        return out
    seen = set()
    for mode in ("enforce", "warn"):
        text = verdict(labels, mode, spec, would=True)
        if text and text not in seen:
            seen.add(text)
            out.append(text)
    return out
