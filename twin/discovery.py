"""Profiles (which Kubernetes release the twin acts as) and the discovery documents they serve.

| profile        | resource.k8s.io versions served        | DeviceTaintRule                     |
|----------------|----------------------------------------|-------------------------------------|
| 1.34           | v1, v1beta2                            | none                                |
| 1.35           | v1, v1beta2, v1alpha3 (rule only)      | v1alpha3 (admin enabled it)         |
| 1.36           | v1, v1beta2, v1alpha3 (rule only)      | v1beta2 + v1alpha3 (admin enabled)  |
| 1.37           | v1                                     | v1                                  |
| device-plugin  | none (no DRA; nodes advertise nvidia.com/gpu)                      |
| hami           | none (device plugin shared by HAMi: twin/hami.py)                  |

`device_taint_rules=False` (`--no-device-taint-rules`) serves 1.35/1.36 as they ship by
default: no DeviceTaintRule, no v1alpha3, and on 1.36 no v1beta2 (it needs runtime-config).
One stored DeviceTaintRule is readable through every served version; v1alpha3 reads carry the
deprecation Warning header recorded from a real 1.36 server.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from twin.resources import CATALOGUE, DRA_GROUP, ResourceType

PROFILES = ("1.34", "1.35", "1.36", "1.37", "device-plugin", "hami")
# Profiles without DRA: GPUs through a device plugin (`hami`: shared by HAMi's vGPU scheduler).
DEVICE_PLUGIN_PROFILES = ("device-plugin", "hami")

_PATCH = {"1.34": "5", "1.35": "3", "1.36": "2", "1.37": "0"}


@dataclass
class Profile:
    name: str = "1.36"
    device_taint_rules: bool = True
    # (group, version) → list of resource keys served there
    served: dict[tuple[str, str], list[str]] = field(default_factory=dict)

    @classmethod
    def make(cls, name: str = "1.36", device_taint_rules: bool = True) -> Profile:
        if name not in PROFILES:
            raise ValueError(f"unknown profile {name!r}: choose one of {', '.join(PROFILES)}")
        p = cls(name=name, device_taint_rules=device_taint_rules)
        dra_core = [
            rt.key for rt in CATALOGUE if rt.group == DRA_GROUP and rt.plural != "devicetaintrules"
        ]
        dtr = "devicetaintrules.resource.k8s.io"
        for rt in CATALOGUE:
            if rt.group != DRA_GROUP:
                for v in rt.versions:
                    p.served.setdefault((rt.group, v), []).append(rt.key)
        if name in DEVICE_PLUGIN_PROFILES:
            return p
        v1 = list(dra_core)
        v1beta2 = list(dra_core)
        v1alpha3: list[str] = []
        if name == "1.34":
            pass
        elif name == "1.35":
            if device_taint_rules:
                v1alpha3 = [dtr]
        elif name == "1.36":
            if device_taint_rules:
                v1beta2.append(dtr)
                v1alpha3 = [dtr]
            else:
                v1beta2 = []  # v1beta2 needs --runtime-config on a stock 1.36
        elif name == "1.37":
            v1.append(dtr)
            v1beta2 = []
        p.served[(DRA_GROUP, "v1")] = v1
        if v1beta2:
            p.served[(DRA_GROUP, "v1beta2")] = v1beta2
        if v1alpha3:
            p.served[(DRA_GROUP, "v1alpha3")] = v1alpha3
        return p

    @property
    def dra(self) -> bool:
        return self.name not in DEVICE_PLUGIN_PROFILES

    @property
    def hami(self) -> bool:
        """HAMi shares the GPUs: its device plugin registers them in node annotations and its
        scheduler records each pod's GPU in pod annotations (twin/hami.py)."""
        return self.name == "hami"

    @property
    def minor(self) -> str:
        return "36" if not self.dra else self.name.split(".")[1]

    def serves(self, group: str, version: str, key: str) -> bool:
        return key in self.served.get((group, version), ())

    def group_versions(self, group: str) -> list[str]:
        order = {"v1": 0, "v1beta2": 1, "v1beta1": 2, "v1alpha3": 3}
        versions = [v for (g, v), keys in self.served.items() if g == group and keys]
        return sorted(versions, key=lambda v: order.get(v, 9))

    def preferred_versions(self) -> dict[str, str]:
        """resource key → the version objects are stamped with in the Python API."""
        out: dict[str, str] = {}
        for rt in CATALOGUE:
            for v in self.group_versions(rt.group):
                if self.serves(rt.group, v, rt.key):
                    out[rt.key] = v
                    break
        return out

    def lookup(self, group: str, version: str, plural: str) -> ResourceType | None:
        for key in self.served.get((group, version), ()):
            rt = _BY_KEY[key]
            if rt.plural == plural:
                return rt
        return None

    def groups(self) -> list[str]:
        """Served groups in kube-apiserver's order (built-in groups first, CRDs last)."""
        order = [
            "apps",
            "events.k8s.io",
            "authentication.k8s.io",
            "authorization.k8s.io",
            "batch",
            "networking.k8s.io",
            "policy",
            "rbac.authorization.k8s.io",
            "coordination.k8s.io",
            DRA_GROUP,
        ]
        seen = [g for g in order if self.group_versions(g)]
        for g, _v in self.served:
            if g and g not in seen and self.group_versions(g):
                seen.append(g)
        return seen

    # ---- documents ---------------------------------------------------------------------

    def version_info(self) -> dict[str, Any]:
        minor = self.minor
        return {
            "major": "1",
            "minor": minor,
            "emulationMajor": "1",
            "emulationMinor": minor,
            "minCompatibilityMajor": "1",
            "minCompatibilityMinor": str(int(minor) - 1),
            "gitVersion": f"v1.{minor}.{_PATCH.get(self.name, '0')}",
            "gitCommit": "0000000000000000000000000000000000000000",
            "gitTreeState": "clean",
            "buildDate": "2026-11-29T00:00:00Z",
            "goVersion": "go1.27.3",
            "compiler": "gc",
            "platform": "linux/amd64",
        }

    def api_versions(self, server_address: str) -> dict[str, Any]:
        return {
            "kind": "APIVersions",
            "versions": ["v1"],
            "serverAddressByClientCIDRs": [
                {"clientCIDR": "0.0.0.0/0", "serverAddress": server_address}
            ],
        }

    def api_group(self, group: str) -> dict[str, Any] | None:
        versions = self.group_versions(group)
        if not versions:
            return None
        gvs = [{"groupVersion": f"{group}/{v}", "version": v} for v in versions]
        return {"name": group, "versions": gvs, "preferredVersion": gvs[0]}

    def api_group_list(self) -> dict[str, Any]:
        groups = [g for g in (self.api_group(name) for name in self.groups()) if g]
        return {"kind": "APIGroupList", "apiVersion": "v1", "groups": groups}

    def resource_list(self, group: str, version: str) -> dict[str, Any] | None:
        keys = self.served.get((group, version))
        if not keys:
            return None
        resources: list[dict[str, Any]] = []
        for key in sorted(keys, key=lambda k: _BY_KEY[k].plural):
            rt = _BY_KEY[key]
            entry: dict[str, Any] = {
                "name": rt.plural,
                "singularName": rt.singular,
                "namespaced": rt.namespaced,
                "kind": rt.kind,
                "verbs": rt.verbs,
            }
            if rt.short_names:
                entry["shortNames"] = list(rt.short_names)
            if rt.categories:
                entry["categories"] = list(rt.categories)
            resources.append(entry)
            for sub in rt.subresources:
                resources.append(_subresource(rt, sub))
        doc: dict[str, Any] = {
            "kind": "APIResourceList",
            "groupVersion": f"{group}/{version}" if group else version,
            "resources": resources,
        }
        if group:
            doc["apiVersion"] = "v1"
        return doc

    def aggregated(self, core: bool) -> dict[str, Any]:
        """apidiscovery.k8s.io/v2 APIGroupDiscoveryList for /api (core) or /apis."""
        names = [""] if core else self.groups()
        items: list[dict[str, Any]] = []
        for g in names:
            versions = []
            for v in self.group_versions(g) if g else ["v1"]:
                res = []
                for key in sorted(self.served.get((g, v), ()), key=lambda k: _BY_KEY[k].plural):
                    rt = _BY_KEY[key]
                    entry: dict[str, Any] = {
                        "resource": rt.plural,
                        "responseKind": {"group": "", "kind": rt.kind, "version": ""},
                        "scope": "Namespaced" if rt.namespaced else "Cluster",
                        "singularResource": rt.singular,
                        "verbs": rt.verbs,
                    }
                    if rt.short_names:
                        entry["shortNames"] = list(rt.short_names)
                    if rt.categories:
                        entry["categories"] = list(rt.categories)
                    if rt.subresources:
                        entry["subresources"] = [
                            {
                                "subresource": s,
                                "responseKind": _sub_kind(rt, s),
                                "verbs": _sub_verbs(s),
                            }
                            for s in sorted(rt.subresources)
                        ]
                    res.append(entry)
                versions.append({"version": v, "resources": res, "freshness": "Current"})
            items.append({"metadata": {"name": g} if g else {}, "versions": versions})
        return {
            "kind": "APIGroupDiscoveryList",
            "apiVersion": "apidiscovery.k8s.io/v2",
            "metadata": {},
            "items": items,
        }

    def deprecation_warning(self, group: str, version: str, rt: ResourceType) -> str | None:
        if group == DRA_GROUP and version == "v1alpha3" and int(self.minor) >= 36:
            return (
                f'299 - "resource.k8s.io/v1alpha3 {rt.kind} is deprecated in v1.{self.minor}+, '
                'unavailable in v1.39+"'
            )
        return None


_BY_KEY = {rt.key: rt for rt in CATALOGUE}


def _sub_verbs(sub: str) -> list[str]:
    if sub in ("eviction", "binding", "token"):
        return ["create"]
    if sub == "log":
        return ["get"]
    return ["get", "patch", "update"]


def _sub_kind(rt: ResourceType, sub: str) -> dict[str, str]:
    if sub == "eviction":
        return {"group": "policy", "kind": "Eviction", "version": "v1"}
    if sub == "binding":
        return {"group": "", "kind": "Binding", "version": ""}
    if sub == "token":
        return {"group": "authentication.k8s.io", "kind": "TokenRequest", "version": "v1"}
    if sub == "scale":
        return {"group": "autoscaling", "kind": "Scale", "version": "v1"}
    return {"group": "", "kind": rt.kind, "version": ""}


def _subresource(rt: ResourceType, sub: str) -> dict[str, Any]:
    entry: dict[str, Any] = {
        "name": f"{rt.plural}/{sub}",
        "singularName": "",
        "namespaced": rt.namespaced,
        "kind": rt.kind,
        "verbs": _sub_verbs(sub),
    }
    if sub == "eviction":
        entry.update(group="policy", version="v1", kind="Eviction")
    elif sub == "binding":
        entry["kind"] = "Binding"
    elif sub == "token":
        entry.update(group="authentication.k8s.io", version="v1", kind="TokenRequest")
    elif sub == "scale":
        entry.update(group="autoscaling", version="v1", kind="Scale")
    return entry
