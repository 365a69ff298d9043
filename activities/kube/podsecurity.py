"""Which Pod Security Standards level a pod spec needs: what `sickbay doctor` holds against the
repair namespace's `pod-security.kubernetes.io/enforce` label before a reset or validation Job
is ever refused by it (Pod Security admission refuses the Job's pods, not the Job).

The checks are the standard's (kubernetes.io/docs/concepts/security/pod-security-standards),
named as the API server names them in its refusals: baseline forbids privileged containers,
host namespaces, hostPath volumes, host ports, capabilities beyond the runtime's default set
and an Unconfined seccomp profile; restricted also requires allowPrivilegeEscalation false,
capabilities drop ALL (only NET_BIND_SERVICE added back), only the ephemeral/projected volume
types, runAsNonRoot true, no runAsUser 0 and a RuntimeDefault or Localhost seccomp profile.
AppArmor, SELinux, procMount and sysctls are not checked (no repair pod sets them).
"""

from __future__ import annotations

from typing import Any

LEVELS = ("privileged", "baseline", "restricted")
ENFORCE_LABEL = "pod-security.kubernetes.io/enforce"
ENFORCE_VERSION_LABEL = "pod-security.kubernetes.io/enforce-version"

_DEFAULT_CAPS = frozenset(
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
_RESTRICTED_VOLUMES = frozenset(
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


def _containers(spec: dict[str, Any]) -> list[dict[str, Any]]:
    return [*(spec.get("initContainers") or []), *(spec.get("containers") or [])]


def _sc(c: dict[str, Any]) -> dict[str, Any]:
    return c.get("securityContext") or {}


def _seccomp(obj: dict[str, Any]) -> str | None:
    return ((obj.get("securityContext") or {}).get("seccompProfile") or {}).get("type")


def baseline_problems(spec: dict[str, Any]) -> list[str]:
    out = []
    cs = _containers(spec)
    if any(spec.get(k) for k in ("hostNetwork", "hostPID", "hostIPC")):
        out.append("host namespaces")
    if any(_sc(c).get("privileged") for c in cs):
        out.append("privileged")
    if any(set((_sc(c).get("capabilities") or {}).get("add") or []) - _DEFAULT_CAPS for c in cs):
        out.append("non-default capabilities")
    if any("hostPath" in v for v in spec.get("volumes") or []):
        out.append("hostPath volumes")
    if any(p.get("hostPort") for c in cs for p in c.get("ports") or []):
        out.append("hostPort")
    if _seccomp(spec) == "Unconfined" or any(
        (_sc(c).get("seccompProfile") or {}).get("type") == "Unconfined" for c in cs
    ):
        out.append("seccompProfile")
    return out


def restricted_problems(spec: dict[str, Any]) -> list[str]:
    out = baseline_problems(spec)
    cs = _containers(spec)
    if any(_sc(c).get("allowPrivilegeEscalation") is not False for c in cs):
        out.append("allowPrivilegeEscalation != false")
    for c in cs:
        caps = _sc(c).get("capabilities") or {}
        if "ALL" not in (caps.get("drop") or []) or set(caps.get("add") or []) - {
            "NET_BIND_SERVICE"
        }:
            out.append("unrestricted capabilities")
            break
    kinds = {next((k for k in v if k != "name"), "") for v in spec.get("volumes") or []}
    if kinds - _RESTRICTED_VOLUMES - {""}:
        out.append("restricted volume types")
    pod_non_root = (spec.get("securityContext") or {}).get("runAsNonRoot")
    if (
        pod_non_root is False
        or any(_sc(c).get("runAsNonRoot") is False for c in cs)
        or (pod_non_root is None and any(_sc(c).get("runAsNonRoot") is None for c in cs))
    ):
        out.append("runAsNonRoot != true")
    if (spec.get("securityContext") or {}).get("runAsUser") == 0 or any(
        _sc(c).get("runAsUser") == 0 for c in cs
    ):
        out.append("runAsUser=0")
    allowed = ("RuntimeDefault", "Localhost")
    pod = _seccomp(spec)
    own = [(_sc(c).get("seccompProfile") or {}).get("type") for c in cs]
    if (
        (pod is not None and pod not in allowed)
        or any(t is not None and t not in allowed for t in own)
        or (pod is None and any(t is None for t in own))
    ):
        if "seccompProfile" not in out:
            out.append("seccompProfile")
    return out


def problems(level: str, spec: dict[str, Any]) -> list[str]:
    """The checks of `level` the pod spec fails (the server's reasons); empty: admitted."""
    if level == "baseline":
        return baseline_problems(spec)
    if level == "restricted":
        return restricted_problems(spec)
    return []


def strictest_level(spec: dict[str, Any]) -> str:
    """The strictest level that still admits the pod spec (what its namespace must enforce at
    most)."""
    if not baseline_problems(spec):
        return "restricted" if not restricted_problems(spec) else "baseline"
    return "privileged"


def admits(level: str, needed: str) -> bool:
    """Whether an enforce `level` admits a pod whose strictest admitting level is `needed`
    (an unset or unknown level reads as privileged, as the API server's default)."""
    have = LEVELS.index(level) if level in LEVELS else 0
    return have <= LEVELS.index(needed)
