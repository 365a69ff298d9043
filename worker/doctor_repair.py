"""`sickbay doctor`: the repair namespace, when a loaded runbook repairs.

- the namespace (SICKBAY_REPAIR_NAMESPACE) exists;
- its Pod Security `enforce` level admits the pods Sickbay will create there: the reset pod
  (a runbook with the reset rung) and the validation pod (a runbook with validation on), built
  by the very code the repair activities run (activities/kube/repair_jobs.py) and judged by the
  standard's checks (activities/kube/podsecurity.py). A level that refuses one is an error
  naming the level it needs: on a real cluster the Jobs would be accepted and every pod refused;
- the operator's allowlist (SICKBAY_REPAIR_ALLOWLIST) names an image for each kind of pod the
  runbooks need: without one, the rung escalates instead of running.
"""

from __future__ import annotations

from typing import Any

from activities.kube import podsecurity
from activities.kube.client import ErrorKind, Kube, KubeError
from activities.kube.repair_jobs import RepairConfig, reset_job_manifest, validation_manifests
from contract.repair_rungs import RepairJobInput, ValidationJobInput
from contract.runbook import AllowedWork, RepairAllowlist, RepairWork, Runbook
from worker.doctor import Check

# Only to build the pod specs the checks judge (the image does not change the verdict).
_PLACEHOLDER_IMAGE = "registry.invalid/sickbay-doctor@sha256:" + "0" * 64


def needed_pods(runbooks: list[Runbook]) -> dict[RepairWork, list[str]]:
    """Which repair pods the runbooks will have Sickbay create, and the runbooks that do."""
    out: dict[RepairWork, list[str]] = {}
    for rb in runbooks:
        repair = rb.spec.repair
        if not repair.enabled:
            continue
        if "reset" in repair.order:
            out.setdefault("reset", []).append(rb.name)
        if rb.spec.validation.enabled:
            out.setdefault("validation", []).append(rb.name)
    return out


def repair_pod_specs(allowlist: RepairAllowlist) -> dict[RepairWork, dict[str, Any]]:
    """The pod specs of a reset and a validation Job, exactly as the activities build them."""
    images = RepairAllowlist(
        reset=AllowedWork(images=allowlist.reset.images or [_PLACEHOLDER_IMAGE]),
        validation=AllowedWork(images=allowlist.validation.images or [_PLACEHOLDER_IMAGE]),
    )
    config = RepairConfig(allowlist=images)
    reset = reset_job_manifest(
        RepairJobInput(
            workflow_id="doctor", incident="doctor/1", node="node", gpu_uuids=["GPU-doctor"]
        ),
        config,
    )
    validation, _claim = validation_manifests(
        None,
        ValidationJobInput(
            workflow_id="doctor",
            incident="doctor/1",
            node="node",
            gpu_uuid="GPU-doctor",
            driver="gpu.nvidia.com",
            pool="node",
            device="gpu-0",
        ),
        config,
    )
    return {
        "reset": reset["spec"]["template"]["spec"],
        "validation": validation["spec"]["template"]["spec"],
    }


def repair_namespace_checks(
    kube: Kube, namespace: str, allowlist: RepairAllowlist, runbooks: list[Runbook] | None
) -> list[Check]:
    if runbooks is None:
        return []  # not loaded: the runbooks line says why
    needed = needed_pods(runbooks)
    if not needed:
        return [Check("ok", "repair namespace", "no runbook repairs: not needed")]
    checks = []
    for kind, names in needed.items():
        if not allowlist.work(kind).images:
            checks.append(
                Check(
                    "error",
                    f"repair images ({kind})",
                    f"no {kind} image is allowlisted; runbooks {', '.join(names)} need one "
                    "(their rung escalates instead of running)",
                    f'set SICKBAY_REPAIR_ALLOWLIST {{"{kind}": {{"images": '
                    '["<repository>@sha256:<digest>"]}} on the worker',
                )
            )
    try:
        ns = kube.call(
            kube.core.read_namespace, namespace, verb="get", resource="namespaces", name=namespace
        )
    except KubeError as err:
        if err.kind is not ErrorKind.NOT_FOUND:
            raise
        checks.append(
            Check(
                "error",
                "repair namespace",
                f"{namespace} does not exist: the reset and validation Jobs cannot be created",
                "kubectl apply -k deploy/ (deploy/namespace.yaml), or set "
                "SICKBAY_REPAIR_NAMESPACE to the namespace you made for them",
            )
        )
        return checks
    labels = (ns.get("metadata") or {}).get("labels") or {}
    level = labels.get(podsecurity.ENFORCE_LABEL, "privileged")
    version = labels.get(podsecurity.ENFORCE_VERSION_LABEL, "latest")
    specs = repair_pod_specs(allowlist)
    refused = []
    need = "restricted"
    for kind in needed:
        strictest = podsecurity.strictest_level(specs[kind])
        if podsecurity.LEVELS.index(strictest) < podsecurity.LEVELS.index(need):
            need = strictest
        if not podsecurity.admits(level, strictest):
            why = ", ".join(podsecurity.problems(level, specs[kind]))
            refused.append(f"the {kind} pod ({why})")
    if refused:
        checks.append(
            Check(
                "error",
                "repair namespace",
                f"{namespace}: Pod Security enforce {level}:{version} refuses "
                f"{' and '.join(refused)}; the Jobs would be accepted and their pods refused. "
                f"It needs {need}",
                f"kubectl label namespace {namespace} "
                f"{podsecurity.ENFORCE_LABEL}={need} --overwrite (or use deploy/namespace.yaml)",
            )
        )
    else:
        checks.append(
            Check(
                "ok",
                "repair namespace",
                f"{namespace}: enforce {level}:{version} admits the "
                f"{' and '.join(needed)} pods (they need {need})",
            )
        )
    return checks
