"""Which resource.k8s.io versions the cluster serves, cached for the life of the worker.

DeviceTaintRule: prefer v1 (1.37) > v1beta2 (1.36, runtime-config) > v1alpha3 (1.35 with
gates; 1.34's v1alpha3 has the old schema without `effect: None` and rule status). The
feature is per resource, so each version's resource list is checked for `devicetaintrules`,
not only the group's version list. A cluster without resource.k8s.io/v1 resourceslices is
treated as a device-plugin cluster.

Cost: 2-4 GETs the first time, none afterwards (the served versions only change with a control
plane upgrade, which restarts nothing here; `invalidate()` forces a re-read, e.g. after a 404
on a rule path).
"""

from __future__ import annotations

import re
import threading
from dataclasses import dataclass

from activities.kube.client import ErrorKind, Kube, KubeError

TAINT_VERSION_PREFERENCE = ("v1", "v1beta2", "v1alpha3")
DRA_GROUP = "resource.k8s.io"


@dataclass(frozen=True)
class ClusterApis:
    dra: bool  # resource.k8s.io/v1 resourceslices served
    taint_version: str | None  # DeviceTaintRule version to use, None = not served
    taint_versions: tuple[str, ...]  # every version serving devicetaintrules
    served_versions: tuple[str, ...]  # resource.k8s.io versions
    server_version: str  # gitVersion, e.g. v1.36.2
    minor: int | None

    @property
    def mode(self) -> str:
        return "dra" if self.dra else "device-plugin"

    @property
    def effect_none(self) -> bool:
        """`effect: None` + rule status exist from 1.35 (the 1.34 v1alpha3 schema lacks them)."""
        if self.taint_version is None:
            return False
        if self.taint_version == "v1alpha3":
            return self.minor is None or self.minor >= 35
        return True


def parse_minor(version: dict[str, object]) -> int | None:
    minor = str(version.get("minor") or "")
    match = re.match(r"\d+", minor)
    if match:
        return int(match.group())
    git = re.match(r"v?\d+\.(\d+)", str(version.get("gitVersion") or ""))
    return int(git.group(1)) if git else None


class Discovery:
    """Per-worker cache of ClusterApis."""

    def __init__(self, kube: Kube) -> None:
        self._kube = kube
        self._lock = threading.Lock()
        self._cached: ClusterApis | None = None

    def invalidate(self) -> None:
        with self._lock:
            self._cached = None

    def get(self) -> ClusterApis:
        with self._lock:
            if self._cached is None:
                self._cached = self.discover()
            return self._cached

    def discover(self, *, every_version: bool = False) -> ClusterApis:
        """Read discovery now.

        Normal path (cheap): the version documents in preference order, stopping at the first
        serving DeviceTaintRule (1.37: one GET; a device-plugin cluster: one 404); /version
        only when v1alpha3 is chosen (its schema depends on the release). `every_version`
        (doctor) also reads /version and the group document and checks every version.
        """
        kube = self._kube
        served: tuple[str, ...] = ()
        if every_version:
            try:
                group = kube.get_path(f"/apis/{DRA_GROUP}", resource=DRA_GROUP)
            except KubeError as err:
                if err.kind is not ErrorKind.NOT_FOUND:
                    raise
                group = {}
            served = tuple(v.get("version", "") for v in group.get("versions", []) or [])
        dra = False
        taint_versions: list[str] = []
        # v1 first: it tells both "DRA served" and "rule served in v1"; v1beta1 is never read
        # (no DeviceTaintRule there, and Sickbay reads slices and claims through v1).
        for ver in TAINT_VERSION_PREFERENCE:
            if every_version and ver not in served:
                continue
            if taint_versions and not every_version:
                break
            try:
                resources = kube.get_path(f"/apis/{DRA_GROUP}/{ver}", resource=DRA_GROUP)
            except KubeError as err:
                if err.kind is ErrorKind.NOT_FOUND:
                    if ver == "v1" and not every_version:
                        break  # no resource.k8s.io/v1 at all: a device-plugin cluster
                    continue
                raise
            names = {r.get("name") for r in resources.get("resources", []) or []}
            if ver == "v1" and "resourceslices" in names:
                dra = True
            if "devicetaintrules" in names:
                taint_versions.append(ver)
        ordered = tuple(v for v in TAINT_VERSION_PREFERENCE if v in taint_versions)
        version: dict[str, object] = {}
        if every_version or (ordered and ordered[0] == "v1alpha3"):
            version = kube.call(kube.version_api.get_code, verb="get", resource="version")
        return ClusterApis(
            dra=dra,
            taint_version=ordered[0] if ordered else None,
            taint_versions=ordered,
            served_versions=served or ordered,
            server_version=str(version.get("gitVersion", "")),
            minor=parse_minor(version) if version else None,
        )
