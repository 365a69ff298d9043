"""`sickbay doctor [--probe]`: a read-only preflight before trusting Sickbay with a cluster.

Checks, one line each, `ok` / `warning` / `error` plus what to do:
- API reachable, server version; known-bad releases (1.36.0-1.36.2: the scheduler ignores
  DeviceTaintRules, kubernetes#139651, fixed by the #139681 back-port);
- every permission Sickbay needs (activities/kube/permissions.py), by SelfSubjectAccessReview;
- `grants`: which optional grants the loaded runbooks (`--runbooks`, default
  SICKBAY_RUNBOOKS_DIR) and this cluster need: pods delete for `eviction.force: delete`
  runbooks, nodes patch where no DeviceTaintRule is served, ...; one that is needed and not
  granted is an error naming the runbook, one nothing needs can be dropped (its file named);
- `components`: the deploy/components those grants make (activities/kube/permissions.py
  FEATURES maps each runbook feature to its grants, e.g. replacement.onChurn: cordon -> nodes
  patch -> node-patch);
- `integrations`: every escalation channel and node-pool provider a loaded runbook names is
  configured (worker/integrations.py; the worker refuses to start otherwise);
- Temporal, unless `--no-temporal`: reachable with the worker's TLS / API key settings, the
  namespace exists, Sickbay's search attributes are registered, a worker polls the task queue
  (describe_task_queue; the recorded cluster's queue unless SICKBAY_CLUSTER says);
- which resource.k8s.io versions serve DeviceTaintRule (else: the Eviction API fallback);
- with `--probe` only: whether the device-taint eviction controller acts. A short-lived rule
  with effect None that selects no device (a driver name no device has) gets a status condition
  within seconds when the controller runs; the rule is deleted right after;
- with `--probe` only: whether the scheduler honours DeviceTaintRules, by behaviour (a patched
  1.36.2 build is fine, a stock one is not: kubernetes#139651). One free device gets a
  NoSchedule rule, and a pod (an image that is never pulled) asks for exactly that device
  through its own ResourceClaim: a scheduler that honours the rule leaves it Unschedulable, a
  broken one binds it (tried twice, so a scheduler that had not seen the rule yet is not
  blamed). Pod, claim and rule are deleted right after. These are the only writes the doctor
  makes, and only when asked (`--probe-namespace`, default `default`; needs create/delete of
  pods and resourceclaims there, which Sickbay's own role does not have: run it as an admin);
- what Sickbay cannot see: the stock 1.36.2 scheduler also panics (`interface conversion:
  interface {} is *v1beta2.DeviceTaintRule, not *v1alpha3.DeviceTaintRule`, tracker.go) when a
  ResourceSlice changes while any DeviceTaintRule exists, and crash-loops while that lasts:
  the doctor says so on 1.36.0-1.36.2 builds serving v1beta2 rules (watch kube-scheduler's
  restarts); a quarantine (or this probe) on such a cluster can set it off;
- whether pods report `allocatedResourcesStatus` (ResourceHealthStatus), DRA drivers and
  device classes present and whether their devices carry a uuid attribute;
- `open waits`: the most GPUs the loaded runbooks' budgets let be quarantined at once over the
  GPUs counted (as the budget counts them), each keeping one long wait open while its pods
  leave and their replacement starts, against what one worker keeps (SICKBAY_MAX_OPEN_WAITS):
  a warning past it (docs/deploy.md, Sizing the workers);
- the repair namespace (worker/doctor_repair.py): it exists and its Pod Security enforce level
  admits the reset / validation pods the runbooks will have Sickbay create; the allowlist
  names their images.
Exit code 0 when nothing is `error`, 1 otherwise.
"""

from __future__ import annotations

import argparse
import re
import sys
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TextIO

from activities.kube.client import ErrorKind, Kube, KubeError, KubeSettings
from activities.kube.devices import _device_class_for, list_slice_devices
from activities.kube.discovery import ClusterApis, Discovery
from activities.kube.permissions import (
    COMPONENTS,
    PERMISSIONS,
    Permission,
    components_needed,
    needed,
)
from activities.kube.pods import requests_gpu
from activities.kube.quarantine import count_devices, delete_rule, wait_rule_conditions
from contract.names import LABEL_MANAGED_BY, MANAGED_BY_VALUE, REPAIR_NAMESPACE
from contract.runbook import BudgetPolicy, Runbook
from worker.settings import WatchSettings

PROBE_TIMEOUT = 30.0  # seconds; the controller writes status ~0.2 s after create (10 s cadence)
PROBE_POLL = 0.2  # seconds between reads of the scheduler probe pod (a decision takes ms)
PROBE_IMAGE = "registry.invalid/sickbay-doctor-probe:never-pulled"  # nothing ever runs
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
        self,
        kube: Kube,
        probe_timeout: float = PROBE_TIMEOUT,
        runbooks: list[Runbook] | None = None,
        namespace: str | None = None,
        repair_namespace: str = REPAIR_NAMESPACE,
        max_open_waits: int | None = None,
    ) -> None:
        self.kube = kube
        # SICKBAY_MAX_OPEN_WAITS of the worker (None: the open-waits line is left out)
        self.max_open_waits = max_open_waits
        self.probe_timeout = probe_timeout
        self.runbooks = runbooks  # None: not loaded (the grants line is left out)
        # Sickbay's own namespace: the health watcher's Lease (a namespaced permission)
        self.namespace = namespace or WatchSettings().watch_namespace
        self.repair_namespace = repair_namespace  # where the repair Role's grants must be
        self.checks: list[Check] = []

    def add(self, status: str, name: str, detail: str, fix: str = "") -> None:
        self.checks.append(Check(status, name, detail, fix))

    def run(self, probe: bool = False, probe_namespace: str = "default") -> list[Check]:
        apis = self.reachability()
        if apis is None:
            return self.checks
        self.versions(apis, probed=probe)
        self.permissions(apis)
        self.taint_api(apis)
        if probe:
            self.probe(apis)
            self.probe_scheduler(apis, probe_namespace)
        self.health_reporting()
        self.drivers(apis)
        self.open_waits(apis)
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

    def versions(self, apis: ClusterApis, probed: bool = False) -> None:
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
            if not probed:  # --probe tells by behaviour instead (a patched build is fine)
                self.add(
                    "warning",
                    "known-bad version",
                    f"1.36.{patch}: a stock build's scheduler ignores DeviceTaintRules "
                    "(kubernetes#139651), so NoExecute quarantines make replacements churn; "
                    "told by the version only, a build with the #139681 back-port is fine",
                    "run `sickbay doctor --probe` to tell by behaviour; on a stock build "
                    "upgrade, until then Sickbay detects the churn, stops it (runbook "
                    "replacement.onChurn) and escalates",
                )
            if apis.taint_version == "v1beta2":
                self.add(
                    "warning",
                    "scheduler crash",
                    f"1.36.{patch}: a stock scheduler panics (interface conversion, "
                    "*v1beta2.DeviceTaintRule, tracker.go) when a ResourceSlice changes while "
                    "any DeviceTaintRule exists, and crash-loops while that lasts; Sickbay "
                    "cannot see the scheduler",
                    "watch kube-scheduler restarts (kubectl -n kube-system get pods -l "
                    "component=kube-scheduler); a build with the #139681 back-port is fine",
                )
        else:
            self.add("ok", "version", f"1.{minor}.{patch}: no known DeviceTaintRule defects")

    def permissions(self, apis: ClusterApis | None = None) -> None:
        missing: list[str] = []
        optional_missing: list[str] = []
        granted: dict[Permission, bool] = {}
        for perm in PERMISSIONS:
            granted[perm] = True
            for verb in perm.verbs:
                attrs: dict[str, Any] = {
                    "group": perm.group,
                    "resource": perm.plural,
                    "verb": verb,
                }
                if perm.subresource:
                    attrs["subresource"] = perm.subresource
                if perm.namespaced:
                    repair = perm.in_repair_namespace
                    attrs["namespace"] = self.repair_namespace if repair else self.namespace
                if perm.name:
                    attrs["name"] = perm.name
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
                        self.grants(apis, None)
                        return
                    raise
                if not (review.get("status") or {}).get("allowed"):
                    name = f"{verb} {perm.resource}" + (f".{perm.group}" if perm.group else "")
                    (missing if perm.required else optional_missing).append(name)
                    granted[perm] = False
        total = sum(len(p.verbs) for p in PERMISSIONS if p.required)
        if missing:
            self.add(
                "error",
                "permissions",
                "missing: " + ", ".join(missing),
                "apply deploy/rbac.yaml (ClusterRole sickbay) and bind it to the worker's account",
            )
        if not missing:
            optional = f"; optional ones not granted: {', '.join(optional_missing)}"
            self.add(
                "ok",
                "permissions",
                f"all {total} required verbs allowed" + (optional if optional_missing else ""),
            )
        self.grants(apis, granted)

    def grants(self, apis: ClusterApis | None, granted: dict[Permission, bool] | None) -> None:
        """Which optional grants the loaded runbooks and this cluster need (`granted`: what the
        access reviews said, None when they could not be asked)."""
        if self.runbooks is None or apis is None:
            return
        served = apis.taint_version is not None
        parts: list[str] = []
        fixes: list[str] = []
        needed_missing = False
        for perm in PERMISSIONS:
            if perm.required:
                continue
            name = (
                ",".join(perm.verbs)
                + f" {perm.resource}"
                + (f".{perm.group}" if perm.group else "")
            )
            why = needed(perm, self.runbooks, served)
            has = None if granted is None else granted[perm]
            component = COMPONENTS.get(perm.role)
            where = f"deploy/components/{component}" if component else "deploy/rbac.yaml"
            if why:
                text = f"{name}: needed by {', '.join(why)}"
                if has is False:
                    needed_missing = True
                    text += " but NOT granted"
                    fixes.append(
                        f"add component {where} (kustomization.yaml components:)"
                        if component
                        else f"grant {name} ({where})"
                    )
            elif has is False:
                text = f"{name}: not needed; not granted ({perm.role})"
            else:
                drop = (
                    f"component {where} can be dropped" if component else "its rule can be removed"
                )
                text = f"{name}: not needed ({drop})"
            parts.append(text)
        self.add(
            "error" if needed_missing else "ok",
            "grants",
            f"{len(self.runbooks)} runbook(s), DeviceTaintRule "
            + ("served" if served else "not served")
            + ": "
            + "; ".join(parts),
            "; ".join(dict.fromkeys(fixes)),
        )
        wanted = components_needed(self.runbooks, served)
        self.add(
            "ok",
            "components",
            "these runbooks and this cluster need deploy/components: "
            + (", ".join(wanted) if wanted else "none"),
        )

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

    def probe_scheduler(self, apis: ClusterApis, namespace: str) -> None:
        """Does the scheduler honour DeviceTaintRules? Told by what it does (module doc)."""
        name = "scheduler"
        if apis.taint_version is None or not apis.dra:
            self.add("warning", name, "not probed: no DeviceTaintRule is served")
            return
        target = self._free_device()
        if target is None:
            self.add(
                "warning",
                name,
                "not probed: no free device with a uuid attribute and a DeviceClass",
                "run again when a GPU is free",
            )
            return
        verdicts: list[str] = []
        for attempt in (1, 2):
            try:
                verdict = self._sched_attempt(apis.taint_version, namespace, target, attempt)
            except KubeError as err:
                self.add(
                    "warning",
                    name,
                    f"not probed: {err}",
                    f"run as a user who may create and delete pods and resourceclaims in "
                    f"{namespace} (or pass --probe-namespace)",
                )
                return
            verdicts.append(verdict)
            if verdict != "bound":
                break
        device = f"{target['driver']}/{target['pool']}/{target['device']}"
        last = verdicts[-1]
        if last == "unschedulable":
            self.add(
                "ok",
                name,
                f"honours DeviceTaintRules: a pod asking for {device} under a NoSchedule rule "
                "stayed Unschedulable",
            )
        elif last == "bound":
            self.add(
                "error",
                name,
                f"ignores DeviceTaintRules: a pod asking for {device} under a NoSchedule rule "
                f"was bound to it ({len(verdicts)} tries) - kubernetes#139651",
                "upgrade kube-scheduler to a build with the fix (#139681 on 1.36); until then "
                "NoExecute quarantines churn (Sickbay stops it per replacement.onChurn)",
            )
        else:
            self.add(
                "warning",
                name,
                f"no scheduling decision for the probe pod within {self.probe_timeout:.0f} s",
                "is kube-scheduler running? (a stock 1.36.2 one crash-loops after a "
                "ResourceSlice change while a DeviceTaintRule exists)",
            )

    def _free_device(self) -> dict[str, str] | None:
        """A device no claim holds, with a uuid attribute (the CEL selector pins it) and a
        DeviceClass of its driver."""
        body = self.kube.call(
            self.kube.resource_v1.list_resource_slice, verb="list", resource="resourceslices"
        )
        claims = self.kube.call(
            self.kube.resource_v1.list_resource_claim_for_all_namespaces,
            verb="list",
            resource="resourceclaims.resource.k8s.io",
        )
        taken = {
            (r.get("driver"), r.get("pool"), r.get("device"))
            for c in claims.get("items") or []
            for r in (((c.get("status") or {}).get("allocation") or {}).get("devices") or {}).get(
                "results"
            )
            or []
        }
        for item in body.get("items") or []:
            spec = item.get("spec") or {}
            driver, pool = spec.get("driver", ""), (spec.get("pool") or {}).get("name", "")
            for dev in spec.get("devices") or []:
                if (driver, pool, dev.get("name")) in taken or dev.get("taints"):
                    continue
                for key, attr in (dev.get("attributes") or {}).items():
                    domain, _, ident = key.rpartition("/")
                    if (
                        ident.lower() != "uuid"
                        or not isinstance(attr, dict)
                        or "string" not in attr
                    ):
                        continue
                    cls = _device_class_for(self.kube, driver, partition=False)
                    if cls is None:
                        continue
                    return {
                        "driver": driver,
                        "pool": pool,
                        "device": str(dev.get("name")),
                        "domain": domain or driver,
                        "attr": ident,
                        "uuid": str(attr["string"]),
                        "class": cls,
                    }
        return None

    def _sched_attempt(
        self, version: str, namespace: str, target: dict[str, str], attempt: int
    ) -> str:
        """bound | unschedulable | undecided, for one probe pod; everything deleted after."""
        suffix = f"{uuid.uuid4().hex[:8]}-{attempt}"
        rule_name = f"sickbay-doctor-sched-{suffix}"
        claim_name = f"sickbay-doctor-sched-{suffix}"
        pod_name = f"sickbay-doctor-sched-{suffix}"
        labels = {LABEL_MANAGED_BY: MANAGED_BY_VALUE}
        api = self.kube.resource_by_version[version]
        core = self.kube.core
        made: list[str] = []
        try:
            self.kube.call(
                api.create_device_taint_rule,
                {
                    "apiVersion": f"resource.k8s.io/{version}",
                    "kind": "DeviceTaintRule",
                    "metadata": {"name": rule_name, "labels": labels},
                    "spec": {
                        "deviceSelector": {
                            "driver": target["driver"],
                            "pool": target["pool"],
                            "device": target["device"],
                        },
                        "taint": {"key": "sickbay.dev/doctor-probe", "effect": "NoSchedule"},
                    },
                },
                verb="create",
                resource="devicetaintrules.resource.k8s.io",
                name=rule_name,
            )
            made.append("rule")
            expression = (
                f'device.attributes["{target["domain"]}"].{target["attr"]} == "{target["uuid"]}"'
            )
            self.kube.call(
                self.kube.resource_v1.create_namespaced_resource_claim,
                namespace,
                {
                    "apiVersion": "resource.k8s.io/v1",
                    "kind": "ResourceClaim",
                    "metadata": {"name": claim_name, "labels": labels},
                    "spec": {
                        "devices": {
                            "requests": [
                                {
                                    "name": "gpu",
                                    "exactly": {
                                        "deviceClassName": target["class"],
                                        "selectors": [{"cel": {"expression": expression}}],
                                    },
                                }
                            ]
                        }
                    },
                },
                verb="create",
                resource="resourceclaims.resource.k8s.io",
                name=claim_name,
            )
            made.append("claim")
            self.kube.call(
                core.create_namespaced_pod,
                namespace,
                {
                    "apiVersion": "v1",
                    "kind": "Pod",
                    "metadata": {"name": pod_name, "labels": labels},
                    "spec": {
                        "restartPolicy": "Never",
                        "terminationGracePeriodSeconds": 0,
                        "resourceClaims": [{"name": "gpu", "resourceClaimName": claim_name}],
                        "containers": [
                            {
                                "name": "probe",
                                "image": PROBE_IMAGE,
                                "resources": {"claims": [{"name": "gpu"}]},
                            }
                        ],
                    },
                },
                verb="create",
                resource="pods",
                name=pod_name,
            )
            made.append("pod")
            deadline = time.monotonic() + self.probe_timeout
            while time.monotonic() < deadline:
                pod = self.kube.call(
                    core.read_namespaced_pod,
                    pod_name,
                    namespace,
                    verb="get",
                    resource="pods",
                    name=pod_name,
                )
                if (pod.get("spec") or {}).get("nodeName"):
                    return "bound"
                for cond in (pod.get("status") or {}).get("conditions") or []:
                    if cond.get("type") == "PodScheduled" and cond.get("reason") == "Unschedulable":
                        return "unschedulable"
                time.sleep(PROBE_POLL)
            return "undecided"
        finally:
            self._cleanup(version, namespace, made, rule_name, claim_name, pod_name)

    def _cleanup(
        self,
        version: str,
        namespace: str,
        made: list[str],
        rule_name: str,
        claim_name: str,
        pod_name: str,
    ) -> None:
        core = self.kube.core
        steps: list[tuple[str, Any, tuple[Any, ...], dict[str, Any], str, str]] = []
        if "pod" in made:
            steps.append(
                (
                    "pod",
                    core.delete_namespaced_pod,
                    (pod_name, namespace),
                    {"grace_period_seconds": 0},
                    "pods",
                    f"kubectl -n {namespace} delete pod {pod_name}",
                )
            )
        if "claim" in made:
            steps.append(
                (
                    "claim",
                    self.kube.resource_v1.delete_namespaced_resource_claim,
                    (claim_name, namespace),
                    {},
                    "resourceclaims.resource.k8s.io",
                    f"kubectl -n {namespace} delete resourceclaim {claim_name}",
                )
            )
        for what, fn, args, kwargs, resource, fix in steps:
            try:
                self.kube.call(fn, *args, verb="delete", resource=resource, name=args[0], **kwargs)
            except KubeError as err:
                if err.kind is not ErrorKind.NOT_FOUND:
                    self.add("error", "probe cleanup", f"could not delete probe {what}: {err}", fix)
        if "rule" in made:
            try:
                delete_rule(self.kube, version, rule_name)
            except KubeError as err:
                self.add(
                    "error",
                    "probe cleanup",
                    f"could not delete probe rule {rule_name}: {err}",
                    f"kubectl delete devicetaintrule {rule_name}",
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

    def open_waits(self, apis: ClusterApis) -> None:
        """Whether one worker's long waits cover the GPUs the budget lets be quarantined at
        once: each keeps one open while its pods leave and their replacement starts, and the
        worker that polls it runs it (not spread evenly)."""
        if self.runbooks is None or self.max_open_waits is None:
            return
        gpus = count_devices(self.kube, apis, None).cluster_devices
        if not gpus:
            self.add("ok", "open waits", "no GPUs counted: nothing to wait for yet")
            return

        def most_of(rb: Runbook) -> tuple[int, str]:
            return BudgetPolicy.limit(rb.spec.budget.max_per_cluster, gpus), rb.name

        widest = max(self.runbooks, key=most_of)
        most = most_of(widest)[0]
        said = (
            f"the budget lets up to {most} of {gpus} GPUs be quarantined at once (runbook "
            f"{widest.name}: maxPerCluster {widest.spec.budget.max_per_cluster}), one open "
            "wait each; a worker "
            f"keeps up to {self.max_open_waits} (SICKBAY_MAX_OPEN_WAITS)"
        )
        if most <= self.max_open_waits:
            self.add("ok", "open waits", said)
            return
        self.add(
            "warning",
            "open waits",
            said,
            f"raise SICKBAY_MAX_OPEN_WAITS to {most} or more (a thread and a watch connection "
            "each): a worker polls waits as they come, so more replicas share them unevenly; "
            "past the ceiling a wait takes a short activity's slot and pages queue "
            "(docs/deploy.md, Sizing the workers)",
        )


def _load_runbooks(path: Path) -> tuple[list[Runbook] | None, Check]:
    from activities.runbooks import RunbookError, load_dir

    try:
        loaded = load_dir(path)
    except RunbookError as exc:
        problems = exc.problems
        shown = "; ".join(problems[:3]) + (
            f" (+{len(problems) - 3} more)" if len(problems) > 3 else ""
        )
        return None, Check(
            "error",
            "runbooks",
            f"{path} does not load: {shown}",
            f"sickbay runbooks validate {path}",
        )
    names = ", ".join(r.name for r in loaded.runbooks)
    return list(loaded.runbooks), Check(
        "ok", "runbooks", f"{len(loaded.runbooks)} from {path}: {names}"
    )


def _recorded_name(kube: Kube, namespace: str) -> str | None:
    from worker.cluster_name import ClusterNameError, read_recorded

    try:
        return read_recorded(kube, namespace)
    except (KubeError, ClusterNameError):
        return None


def cluster_name_check(kube: Kube, namespace: str, explicit: str | None) -> Check:
    """The recorded cluster name (worker/cluster_name.py) and whether SICKBAY_CLUSTER (when
    set: `explicit`) agrees with it; read-only, records nothing."""
    from contract.names import CLUSTER_CONFIGMAP, derived_cluster_name
    from worker.cluster_name import ClusterNameError, kube_system_uid, read_recorded, shown

    where = f"ConfigMap {namespace}/{CLUSTER_CONFIGMAP}"
    try:
        recorded = read_recorded(kube, namespace)
    except ClusterNameError as exc:
        return Check("error", "cluster name", str(exc), "docs/deploy.md, 'Many clusters'")
    except KubeError as exc:
        return Check(
            "warning",
            "cluster name",
            f"cannot read {where}: {exc}",
            "apply deploy/rbac.yaml (Role sickbay-cluster-name)",
        )
    if recorded is None:
        if explicit is not None:
            first = shown(explicit) + " (SICKBAY_CLUSTER)"
        else:
            try:
                first = f"{derived_cluster_name(kube_system_uid(kube))!r} (derived)"
            except (KubeError, ClusterNameError, ValueError) as exc:
                first = f"a derived name (kube-system uid unreadable: {exc})"
        return Check(
            "ok", "cluster name", f"not recorded yet in {where}: the first worker records {first}"
        )
    if explicit is not None and explicit != recorded:
        return Check(
            "error",
            "cluster name",
            f"SICKBAY_CLUSTER is {shown(explicit)} but {where} records {shown(recorded)}: "
            "worker and webhook refuse to start",
            "unset SICKBAY_CLUSTER, or migrate (docs/deploy.md, 'Many clusters on one Temporal')",
        )
    return Check("ok", "cluster name", f"{shown(recorded)}, recorded in {where}")


TEMPORAL_TIMEOUT = 10.0  # seconds for all Temporal checks: a healthy frontend answers in ms


def temporal_checks(settings: Any, timeout: float = TEMPORAL_TIMEOUT) -> list[Check]:
    """Temporal as the worker will use it: reachable (with the TLS / API key settings),
    the namespace exists, Sickbay's search attributes are registered, and a worker polls the
    task queue (`describe_task_queue`, workflow and activity pollers)."""
    import asyncio

    try:
        return asyncio.run(asyncio.wait_for(_temporal_checks(settings), timeout))
    except TimeoutError:
        return [
            Check(
                "error",
                "temporal",
                f"no answer from {settings.temporal_address} within {timeout:.0f} s",
                "check SICKBAY_TEMPORAL_ADDRESS and the network policy's egress to Temporal",
            )
        ]


async def _temporal_checks(settings: Any) -> list[Check]:
    from temporalio.api.enums.v1 import TaskQueueType
    from temporalio.api.operatorservice.v1 import ListSearchAttributesRequest
    from temporalio.api.taskqueue.v1 import TaskQueue
    from temporalio.api.workflowservice.v1 import (
        DescribeNamespaceRequest,
        DescribeTaskQueueRequest,
    )
    from temporalio.service import RPCError, RPCStatusCode

    from contract.names import SEARCH_ATTRIBUTES
    from worker.temporal import connect, search_attribute_commands

    address, namespace = settings.temporal_address, settings.temporal_namespace
    try:
        client = await connect(settings)
    except Exception as exc:  # unreachable, TLS or credentials refused: one line, no trace
        return [
            Check(
                "error",
                "temporal",
                f"cannot connect to {address}: {exc}",
                "check SICKBAY_TEMPORAL_ADDRESS and its TLS / API key settings (docs/deploy.md)",
            )
        ]
    checks = [Check("ok", "temporal", f"reachable at {address}")]
    try:
        await client.workflow_service.describe_namespace(
            DescribeNamespaceRequest(namespace=namespace)
        )
    except RPCError as exc:
        checks.append(
            Check(
                "error",
                "temporal namespace",
                f"{namespace!r}: {exc.status.name} {exc.message}",
                "create it (temporal operator namespace create) or fix SICKBAY_TEMPORAL_NAMESPACE",
            )
        )
        return checks
    checks.append(Check("ok", "temporal namespace", f"{namespace!r} exists"))
    try:
        listed = await client.operator_service.list_search_attributes(
            ListSearchAttributesRequest(namespace=namespace)
        )
        missing = [n for n in SEARCH_ATTRIBUTES if n not in listed.custom_attributes]
        if missing:
            checks.append(
                Check(
                    "warning",
                    "search attributes",
                    f"not registered on {namespace!r}: {', '.join(missing)}; the worker "
                    "registers them at start where the server allows it, else refuses to start",
                    "; ".join(search_attribute_commands(namespace)[len(SEARCH_ATTRIBUTES) :][:1])
                    + " (and the others likewise)",
                )
            )
        else:
            checks.append(
                Check("ok", "search attributes", f"all {len(SEARCH_ATTRIBUTES)} registered")
            )
    except RPCError as exc:
        status = "warning" if exc.status is not RPCStatusCode.UNAVAILABLE else "error"
        checks.append(
            Check(status, "search attributes", f"cannot list: {exc.status.name} {exc.message}")
        )
    queue = settings.task_queue
    pollers: dict[str, int] = {}
    for kind, value in (
        ("workflow", TaskQueueType.TASK_QUEUE_TYPE_WORKFLOW),
        ("activity", TaskQueueType.TASK_QUEUE_TYPE_ACTIVITY),
    ):
        try:
            described = await client.workflow_service.describe_task_queue(
                DescribeTaskQueueRequest(
                    namespace=namespace, task_queue=TaskQueue(name=queue), task_queue_type=value
                )
            )
        except RPCError as exc:
            checks.append(
                Check("warning", "worker", f"cannot describe task queue {queue!r}: {exc.message}")
            )
            return checks
        pollers[kind] = len(described.pollers)
    if all(pollers.values()):
        checks.append(
            Check(
                "ok",
                "worker",
                f"task queue {queue!r}: {pollers['workflow']} workflow and "
                f"{pollers['activity']} activity poller(s)",
            )
        )
    else:
        idle = [k for k, n in pollers.items() if not n]
        checks.append(
            Check(
                "warning",
                "worker",
                f"no {' or '.join(idle)} poller on task queue {queue!r} (seen in the last "
                "minutes): remediations started now would wait for a worker",
                "start the worker (kubectl -n sickbay rollout status deploy/sickbay-worker) "
                "and check SICKBAY_TASK_QUEUE / SICKBAY_CLUSTER match it",
            )
        )
    return checks


def integrations_check(runbooks: list[Runbook] | None, settings: Any, kube_api: Any) -> Check:
    """Every channel and provider a loaded runbook names is configured (worker/integrations.py;
    the worker refuses to start otherwise)."""
    from worker.integrations import load_and_check

    if runbooks is None:
        return Check("warning", "integrations", "not checked: the runbooks did not load")
    try:
        problems = load_and_check(runbooks, settings, kube_api)
    except Exception as exc:  # the channels or cloud file does not load
        return Check(
            "error",
            "integrations",
            f"cannot load the channels / cloud configuration: {exc}",
            "fix the file SICKBAY_CHANNELS_FILE / SICKBAY_CLOUD_FILE names",
        )
    if not problems:
        return Check(
            "ok", "integrations", "every channel and provider the runbooks name is configured"
        )
    grouped: dict[tuple[str, str, str], list[str]] = {}
    for p in problems:
        grouped.setdefault((p.kind, p.name, p.setting), []).append(f"{p.runbook} ({p.use})")
    return Check(
        "error",
        "integrations",
        "not configured: "
        + "; ".join(
            f"{kind} {name!r}, named by runbook(s) {', '.join(users)}: {setting}"
            for (kind, name, setting), users in grouped.items()
        ),
        "the worker refuses to start until they are configured (or starts degraded with "
        "SICKBAY_ALLOW_UNCONFIGURED_INTEGRATIONS=true)",
    )


def run(args: argparse.Namespace, out: TextIO | None = None) -> int:
    out = out or sys.stdout
    from worker.settings import Settings

    settings = Settings()
    runbooks, loaded = _load_runbooks(
        Path(args.runbooks) if args.runbooks else settings.runbooks_dir
    )
    kube_settings = settings.kube_settings()
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
    namespace = getattr(args, "namespace", None) or settings.watch.watch_namespace
    try:
        checks = [
            loaded,
            *Doctor(
                kube,
                args.probe_timeout,
                runbooks,
                namespace,
                settings.repair_namespace,
                max_open_waits=settings.max_open_waits,
            ).run(probe=args.probe, probe_namespace=args.probe_namespace),
        ]
        recorded: str | None = None
        if any(c.name == "api" and c.status != "error" for c in checks):  # it answered
            explicit = settings.cluster if settings.cluster_explicit else None
            checks.append(cluster_name_check(kube, namespace, explicit))
            if explicit is None:
                recorded = _recorded_name(kube, namespace)
            from worker.doctor_repair import repair_namespace_checks

            checks += repair_namespace_checks(
                kube, settings.repair_namespace, settings.repair_allowlist, runbooks
            )
        checks.append(integrations_check(runbooks, settings, kube.api_client))
        if args.temporal:
            # The queue the worker polls: the recorded cluster's, unless SICKBAY_CLUSTER says.
            if recorded is not None:
                settings = settings.with_cluster(recorded)
            checks += temporal_checks(settings)
        from worker.doctor_cloud import cloud_checks  # the clouds: worker/doctor_cloud.py

        checks.extend(cloud_checks(runbooks, settings=settings))
    except KubeError as err:
        checks = [loaded, Check("error", "doctor", f"stopped: {err}")]
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
        help="create and delete a no-op rule (effect None, selects nothing) to see whether "
        "the eviction controller acts, and a NoSchedule rule on one free device plus a pod "
        "asking for it to see whether the scheduler honours DeviceTaintRules",
    )
    parser.add_argument(
        "--probe-namespace",
        default="default",
        help="namespace of the scheduler probe's pod and claim (default %(default)s)",
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
        "--runbooks",
        default=None,
        help="runbook directory whose grant needs to check (default: SICKBAY_RUNBOOKS_DIR)",
    )
    parser.add_argument(
        "--namespace",
        default=None,
        help="Sickbay's namespace, where the health watcher's Lease lives "
        "(default: SICKBAY_WATCH_NAMESPACE, the service account's, else sickbay)",
    )
    parser.add_argument(
        "--no-temporal",
        dest="temporal",
        action="store_false",
        help="skip the Temporal checks (reachable, namespace, search attributes, a worker "
        "polling the task queue), e.g. where Temporal is not reachable from here",
    )
    parser.set_defaults(func=run)
