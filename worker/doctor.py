"""`sickbay doctor [--probe]`: a read-only preflight before trusting Sickbay with a cluster.

Checks, one line each, `ok` / `warning` / `error` plus what to do:
- API reachable, server version; known-bad releases (1.36.0-1.36.2: the scheduler ignores
  DeviceTaintRules, kubernetes#139651, fixed by the #139681 back-port);
- every permission Sickbay needs (activities/kube/permissions.py), by SelfSubjectAccessReview;
- which resource.k8s.io versions serve DeviceTaintRule (else: the Eviction API fallback);
- with `--probe` only: whether the device-taint eviction controller acts. A short-lived rule
  with effect None that selects no device (a driver name no device has) gets a status condition
  within seconds when the controller runs; the rule is deleted right after. This is the one
  write the doctor makes, and only when asked;
- whether pods report `allocatedResourcesStatus` (ResourceHealthStatus), DRA drivers and
  device classes present and whether their devices carry a uuid attribute.
Exit code 0 when nothing is `error`, 1 otherwise.
"""

from __future__ import annotations

import argparse
import re
import sys
import uuid
from dataclasses import dataclass
from typing import Any, TextIO

from activities.kube.client import ErrorKind, Kube, KubeError, KubeSettings
from activities.kube.devices import list_slice_devices
from activities.kube.discovery import ClusterApis, Discovery
from activities.kube.permissions import PERMISSIONS
from activities.kube.pods import requests_gpu
from activities.kube.quarantine import delete_rule, wait_rule_conditions
from worker.watcher import WatchSettings
from workflows.constants import LABEL_MANAGED_BY, MANAGED_BY_VALUE

PROBE_TIMEOUT = 30.0  # seconds; the controller writes status ~0.2 s after create (10 s cadence)
BAD_136_PATCHES = range(0, 3)  # 1.36.0 - 1.36.2 ship the scheduler without the #139651 fix
POD_SAMPLE = 500  # pods read to look for allocatedResourcesStatus


@dataclass
class Check:
    status: str  # ok | warning | error
    name: str
    detail: str
    fix: str = ""

    def line(self) -> str:
        text = f"{self.status:<8}{self.name:<28}{self.detail}"
        return text + (f"\n{'':<36}-> {self.fix}" if self.fix else "")


class Doctor:
    def __init__(
        self, kube: Kube, probe_timeout: float = PROBE_TIMEOUT, namespace: str | None = None
    ) -> None:
        self.kube = kube
        self.probe_timeout = probe_timeout
        # Sickbay's own namespace: the health watcher's Lease (a namespaced permission)
        self.namespace = namespace or WatchSettings().watch_namespace
        self.checks: list[Check] = []

    def add(self, status: str, name: str, detail: str, fix: str = "") -> None:
        self.checks.append(Check(status, name, detail, fix))

    def run(self, probe: bool = False) -> list[Check]:
        apis = self.reachability()
        if apis is None:
            return self.checks
        self.versions(apis)
        self.permissions()
        self.taint_api(apis)
        if probe:
            self.probe(apis)
        self.health_reporting()
        self.drivers(apis)
        return self.checks

    def reachability(self) -> ClusterApis | None:
        try:
            apis = Discovery(self.kube).discover(every_version=True)
        except KubeError as err:
            self.add(
                "error",
                "api",
                f"cannot reach the API server: {err}",
                "check KUBECONFIG / --kubeconfig / --context, or the in-cluster service account",
            )
            return None
        self.add("ok", "api", f"reachable, Kubernetes {apis.server_version or 'unknown version'}")
        return apis

    def versions(self, apis: ClusterApis) -> None:
        match = re.match(r"v?1\.(\d+)\.(\d+)", apis.server_version)
        if not match:
            self.add("warning", "version", f"cannot parse {apis.server_version!r}")
            return
        minor, patch = int(match.group(1)), int(match.group(2))
        if minor < 34:
            self.add(
                "error",
                "version",
                f"1.{minor} is older than 1.34; DRA resource.k8s.io/v1 is needed",
                "upgrade the control plane to 1.34 or later",
            )
        elif minor == 36 and patch in BAD_136_PATCHES and apis.taint_version:
            self.add(
                "warning",
                "known-bad version",
                f"1.36.{patch}: the scheduler ignores DeviceTaintRules (kubernetes#139651), so "
                "NoExecute quarantines make replacements churn",
                "upgrade to a 1.36 patch with the #139681 back-port; until then Sickbay detects "
                "the churn, stops and escalates",
            )
        else:
            self.add("ok", "version", f"1.{minor}.{patch}: no known DeviceTaintRule defects")

    def permissions(self) -> None:
        missing: list[str] = []
        optional_missing: list[str] = []
        for perm in PERMISSIONS:
            for verb in perm.verbs:
                attrs: dict[str, Any] = {
                    "group": perm.group,
                    "resource": perm.plural,
                    "verb": verb,
                }
                if perm.subresource:
                    attrs["subresource"] = perm.subresource
                if perm.namespaced:
                    attrs["namespace"] = self.namespace
                body = {
                    "apiVersion": "authorization.k8s.io/v1",
                    "kind": "SelfSubjectAccessReview",
                    "spec": {"resourceAttributes": attrs},
                }
                try:
                    review = self.kube.call(
                        self.kube.authz.create_self_subject_access_review,
                        body,
                        verb="create",
                        resource="selfsubjectaccessreviews.authorization.k8s.io",
                    )
                except KubeError as err:
                    if err.kind in (ErrorKind.NOT_FOUND, ErrorKind.INVALID):
                        self.add(
                            "warning",
                            "permissions",
                            "SelfSubjectAccessReview is not served: permissions not checked",
                            "compare the service account's role with deploy/rbac.yaml by hand",
                        )
                        return
                    raise
                if not (review.get("status") or {}).get("allowed"):
                    name = f"{verb} {perm.resource}" + (f".{perm.group}" if perm.group else "")
                    (missing if perm.required else optional_missing).append(name)
        total = sum(len(p.verbs) for p in PERMISSIONS)
        if missing:
            self.add(
                "error",
                "permissions",
                "missing: " + ", ".join(missing),
                "apply deploy/rbac.yaml (ClusterRole sickbay) and bind it to the worker's account",
            )
        if optional_missing:
            self.add(
                "warning",
                "permissions (optional)",
                "missing: " + ", ".join(optional_missing),
                "needed only for the quarantine rule, cordon/force-delete runbooks or Cluster "
                "API scale-up: grant them from deploy/rbac.yaml if you use those",
            )
        if not missing and not optional_missing:
            self.add("ok", "permissions", f"all {total} verbs allowed")

    def taint_api(self, apis: ClusterApis) -> None:
        if not apis.dra:
            self.add(
                "warning",
                "DRA",
                "resource.k8s.io/v1 ResourceSlices not served: device-plugin mode",
                "Sickbay quarantines through the Eviction API and node taints (fallback)",
            )
            return
        if apis.taint_version is None:
            self.add(
                "warning",
                "DeviceTaintRule",
                "not served by any resource.k8s.io version: fallback mode (Eviction API, node "
                "taint below the healthy-GPU threshold)",
                "enable feature gates DRADeviceTaints + DRADeviceTaintRules (and on 1.36 "
                "--runtime-config=resource.k8s.io/v1beta2=true), or upgrade to 1.37",
            )
            return
        served = ", ".join(apis.taint_versions)
        if apis.taint_version == "v1alpha3":
            self.add(
                "warning",
                "DeviceTaintRule",
                f"served in {served}; using v1alpha3 (deprecated in 1.36, removed in 1.39)"
                + ("" if apis.effect_none else "; no effect None (dry runs computed from claims)"),
                "upgrade when you can; v1beta2 (1.36) or v1 (1.37) are preferred",
            )
        else:
            self.add("ok", "DeviceTaintRule", f"served in {served}; using {apis.taint_version}")

    def probe(self, apis: ClusterApis) -> None:
        if apis.taint_version is None or not apis.effect_none:
            self.add(
                "warning",
                "eviction controller",
                "not probed: no DeviceTaintRule with effect None is served",
            )
            return
        version = apis.taint_version
        name = f"sickbay-doctor-probe-{uuid.uuid4().hex[:8]}"
        body = {
            "apiVersion": f"resource.k8s.io/{version}",
            "kind": "DeviceTaintRule",
            "metadata": {
                "name": name,
                "labels": {LABEL_MANAGED_BY: MANAGED_BY_VALUE},
                "annotations": {"sickbay.dev/reason": "sickbay doctor --probe"},
            },
            "spec": {
                # A driver name no device has: the rule selects nothing and changes nothing.
                "deviceSelector": {"driver": "probe.doctor.sickbay.dev"},
                "taint": {"key": "sickbay.dev/doctor-probe", "effect": "None"},
            },
        }
        api = self.kube.resource_by_version[version]
        try:
            self.kube.call(
                api.create_device_taint_rule,
                body,
                verb="create",
                resource="devicetaintrules.resource.k8s.io",
                name=name,
            )
            conditions = wait_rule_conditions(self.kube, version, [name], self.probe_timeout)
        except KubeError as err:
            self.add("error", "eviction controller", f"probe failed: {err}")
            return
        finally:
            try:
                delete_rule(self.kube, version, name)
            except KubeError as err:
                self.add(
                    "error",
                    "probe cleanup",
                    f"could not delete probe rule {name}: {err}",
                    f"kubectl delete devicetaintrule {name}",
                )
        if conditions.get(name):
            cond = conditions[name][0]
            self.add(
                "ok",
                "eviction controller",
                f"acts: probe rule got {cond.get('type')}={cond.get('status')} "
                f"({cond.get('reason')})",
            )
        else:
            self.add(
                "error",
                "eviction controller",
                f"probe rule got no status within {self.probe_timeout:.0f} s: NoExecute rules will "
                "not evict anything",
                "enable DRADeviceTaints + DRADeviceTaintRules in kube-controller-manager (and "
                "the scheduler); until then use runbooks with eviction mode eviction-api",
            )

    def health_reporting(self) -> None:
        body = self.kube.call(
            self.kube.core.list_pod_for_all_namespaces,
            verb="list",
            resource="pods",
            limit=POD_SAMPLE,
        )
        pods = body.get("items") or []
        gpu_pods = [
            p for p in pods if requests_gpu(p) or (p.get("spec") or {}).get("resourceClaims")
        ]
        reporting = [
            p
            for p in gpu_pods
            if any(
                cs.get("allocatedResourcesStatus")
                for cs in (p.get("status") or {}).get("containerStatuses") or []
            )
        ]
        if not gpu_pods:
            self.add(
                "warning",
                "device health in pods",
                f"no GPU pods among {len(pods)} sampled: cannot tell whether kubelets report "
                "allocatedResourcesStatus",
            )
        elif not reporting:
            self.add(
                "warning",
                "device health in pods",
                f"none of {len(gpu_pods)} GPU pods reports allocatedResourcesStatus",
                "enable feature gate ResourceHealthStatus (beta, on by default from 1.36); "
                "Sickbay then relies on alerts and ResourceSlices",
            )
        else:
            self.add(
                "ok",
                "device health in pods",
                f"{len(reporting)}/{len(gpu_pods)} GPU pods report allocatedResourcesStatus",
            )

    def drivers(self, apis: ClusterApis) -> None:
        if not apis.dra:
            nodes = self.kube.call(self.kube.core.list_node, verb="list", resource="nodes")
            gpus = sum(
                int(((n.get("status") or {}).get("capacity") or {}).get("nvidia.com/gpu", 0))
                for n in nodes.get("items") or []
            )
            status = "ok" if gpus else "warning"
            self.add(status, "device plugin", f"{gpus} nvidia.com/gpu across the nodes")
            return
        classes = self.kube.call(
            self.kube.resource_v1.list_device_class, verb="list", resource="deviceclasses"
        )
        names = sorted(
            (c.get("metadata") or {}).get("name", "") for c in classes.get("items") or []
        )
        devices = list_slice_devices(self.kube)
        drivers = sorted({d.driver for d in devices})
        no_uuid = [d.resource_id for d in devices if not d.physical_uuid]
        if not devices:
            self.add(
                "warning",
                "DRA drivers",
                "no ResourceSlice publishes a device",
                "install a DRA driver (e.g. the NVIDIA DRA driver for GPUs)",
            )
        elif no_uuid:
            self.add(
                "warning",
                "DRA drivers",
                f"{len(no_uuid)} device(s) without a uuid attribute (e.g. {no_uuid[0]})",
                "Sickbay keys GPUs by uuid: those devices cannot be remediated",
            )
        else:
            self.add(
                "ok",
                "DRA drivers",
                f"{', '.join(drivers)}: {len(devices)} devices, all with uuid",
            )
        self.add(
            "ok" if names else "warning",
            "device classes",
            ", ".join(names) if names else "none",
            "" if names else "create the driver's DeviceClass",
        )


def run(args: argparse.Namespace, out: TextIO | None = None) -> int:
    out = out or sys.stdout
    from worker.settings import Settings

    settings = Settings()
    kube_settings = KubeSettings.from_settings(settings)
    kube_settings = KubeSettings(
        kubeconfig=args.kubeconfig or kube_settings.kubeconfig,
        context=args.context or kube_settings.context,
        request_timeout=kube_settings.request_timeout,
        max_threads=4,
    )
    try:
        kube = Kube.from_settings(kube_settings)
    except Exception as exc:  # config files missing or malformed: say so, do not trace
        out.write(f"{'error':<8}{'config':<28}cannot load Kubernetes config: {exc}\n")
        return 1
    try:
        checks = Doctor(kube, args.probe_timeout, getattr(args, "namespace", None)).run(
            probe=args.probe
        )
    except KubeError as err:
        checks = [Check("error", "doctor", f"stopped: {err}")]
    finally:
        kube.api_client.close()
    for check in checks:
        out.write(check.line() + "\n")
    errors = sum(c.status == "error" for c in checks)
    warnings = sum(c.status == "warning" for c in checks)
    out.write(f"\n{len(checks)} checks: {errors} error(s), {warnings} warning(s)\n")
    return 1 if errors else 0


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "doctor",
        help="read-only preflight of the cluster Sickbay will act on",
        description=__doc__.split("\n\n", 1)[0] if __doc__ else None,
    )
    parser.add_argument(
        "--probe",
        action="store_true",
        help="create and delete a no-op rule "
        "(effect None, selects nothing) to see whether the eviction controller acts",
    )
    parser.add_argument(
        "--probe-timeout",
        type=float,
        default=PROBE_TIMEOUT,
        help="seconds to wait for the probe rule's status (default %(default)s)",
    )
    parser.add_argument("--kubeconfig", default=None, help="kubeconfig path (default: KUBECONFIG)")
    parser.add_argument("--context", default=None, help="kubeconfig context")
    parser.add_argument(
        "--namespace",
        default=None,
        help="Sickbay's namespace, where the health watcher's Lease lives "
        "(default: SICKBAY_WATCH_NAMESPACE, the service account's, else sickbay)",
    )
    parser.set_defaults(func=run)
