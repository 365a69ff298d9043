"""Defaulting and validation: what kube-apiserver's registry strategies do before storing.

`Admission(profile).admit(op, rt, obj, old, subresource, now)` fills defaults in place and raises
a 422 Invalid `ApiError` whose `details.causes` name every offending field (FieldValueRequired,
FieldValueInvalid, FieldValueNotSupported, FieldValueForbidden), with the apiserver's wording
where tests/k8s_golden/ recorded it. It runs for every store write, from HTTP or from Python.
"""

from __future__ import annotations

import random
import re
from collections.abc import Callable
from datetime import datetime
from typing import Any

from twin import errors
from twin.discovery import Profile
from twin.resources import ResourceType
from twin.selectors import selector_from_label_selector_object

_DNS1123_SUB = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
_DNS1123_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
_QNAME = re.compile(r"^([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]$")
_LABEL_VALUE = re.compile(r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$")
_QNAME_MSG = (
    "name part must consist of alphanumeric characters, '-', '_' or '.', and must start and end "
    "with an alphanumeric character (e.g. 'MyName',  or 'my.name',  or '123-abc', regex used for "
    "validation is '([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]')"
)
_SUB_MSG = (
    "a lowercase RFC 1123 subdomain must consist of lower case alphanumeric characters, '-' or "
    "'.', and must start and end with an alphanumeric character (e.g. 'example.com', regex used "
    "for validation is '[a-z0-9]([-a-z0-9]*[a-z0-9])?(\\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*')"
)
_LABEL_MSG = (
    "a lowercase RFC 1123 label must consist of lower case alphanumeric characters or '-', and "
    "must start and end with an alphanumeric character (e.g. 'my-name',  or '123-abc', regex "
    "used for validation is '[a-z0-9]([-a-z0-9]*[a-z0-9])?')"
)

TAINT_EFFECTS = ("NoExecute", "NoSchedule", "None")

Causes = list[dict[str, str]]


def _req(field: str, detail: str = "") -> dict[str, str]:
    return errors.required(field, detail)


def _inv(field: str, value: Any, detail: str) -> dict[str, str]:
    shown = f'"{value}"' if isinstance(value, str) else repr(value)
    return errors.cause(field, "FieldValueInvalid", f"Invalid value: {shown}: {detail}")


def _unsupported(field: str, value: Any, supported: tuple[str, ...]) -> dict[str, str]:
    listed = ", ".join(f'"{s}"' for s in supported)
    return errors.cause(
        field,
        "FieldValueNotSupported",
        f'Unsupported value: "{value}": supported values: {listed}',
    )


def _qualified_name(field: str, value: str) -> Causes:
    """apimachinery's IsQualifiedName, reported as the apiserver does (two causes when empty)."""
    causes: Causes = []
    name = value
    if "/" in value:
        prefix, name = value.split("/", 1)
        if not prefix or not _DNS1123_SUB.match(prefix):
            causes.append(_inv(field, value, "prefix part " + _SUB_MSG))
    if not name:
        causes.append(_inv(field, value, "name part must be non-empty"))
        causes.append(_inv(field, value, _QNAME_MSG))
    elif len(name) > 63:
        causes.append(_inv(field, value, "name part must be no more than 63 characters"))
    elif not _QNAME.match(name):
        causes.append(_inv(field, value, _QNAME_MSG))
    return causes


def _object_meta(rt: ResourceType, meta: dict[str, Any]) -> Causes:
    causes: Causes = []
    name = meta.get("name", "")
    if rt.storage in ("namespaces",):
        if not _DNS1123_LABEL.match(name) or len(name) > 63:
            causes.append(_inv("metadata.name", name, _LABEL_MSG))
    elif rt.storage != "events" and (not _DNS1123_SUB.match(name) or len(name) > 253):
        causes.append(_inv("metadata.name", name, _SUB_MSG))
    for key, value in (meta.get("labels") or {}).items():
        causes += _qualified_name("metadata.labels", str(key))
        if not isinstance(value, str) or len(value) > 63 or not _LABEL_VALUE.match(value):
            causes.append(
                _inv(
                    "metadata.labels",
                    value,
                    "a valid label must be an empty string or consist of alphanumeric "
                    "characters, '-', '_' or '.', and must start and end with an alphanumeric "
                    "character",
                )
            )
    for i, ref in enumerate(meta.get("ownerReferences") or []):
        for f in ("apiVersion", "kind", "name", "uid"):
            if not ref.get(f):
                causes.append(_req(f"metadata.ownerReferences[{i}].{f}"))
    return causes


# ---- defaults ------------------------------------------------------------------------------


def default_pod_spec(spec: dict[str, Any]) -> None:
    spec.setdefault("restartPolicy", "Always")
    spec.setdefault("dnsPolicy", "ClusterFirst")
    spec.setdefault("schedulerName", "default-scheduler")
    spec.setdefault("terminationGracePeriodSeconds", 30)
    spec.setdefault("securityContext", {})
    for c in list(spec.get("containers") or []) + list(spec.get("initContainers") or []):
        if not isinstance(c, dict):
            continue
        image = str(c.get("image", ""))
        tag_latest = ":" not in image.rsplit("/", 1)[-1] or image.endswith(":latest")
        c.setdefault(
            "imagePullPolicy", "Always" if tag_latest and "@" not in image else "IfNotPresent"
        )
        c.setdefault("terminationMessagePath", "/dev/termination-log")
        c.setdefault("terminationMessagePolicy", "File")
        c.setdefault("resources", {})


SA_MOUNT_PATH = "/var/run/secrets/kubernetes.io/serviceaccount"
_SUFFIX = "bcdfghjklmnpqrstvwxz2456789"


def _inject_service_account_volume(spec: dict[str, Any], account: dict[str, Any] | None) -> None:
    """The ServiceAccount admission plugin's projected token volume (kube-api-access-xxxxx):
    not when the pod, or (the pod saying nothing) its ServiceAccount, turns automount off."""
    automount = spec.get("automountServiceAccountToken")
    if automount is None and account is not None:
        automount = account.get("automountServiceAccountToken")
    if automount is False:
        return
    containers = [
        c
        for c in (spec.get("containers") or []) + (spec.get("initContainers") or [])
        if isinstance(c, dict)
    ]
    if any(
        m.get("mountPath") == SA_MOUNT_PATH
        for c in containers
        for m in c.get("volumeMounts") or []
        if isinstance(m, dict)
    ):
        return
    name = "kube-api-access-" + "".join(random.choices(_SUFFIX, k=5))
    volumes = spec.setdefault("volumes", [])
    if not isinstance(volumes, list):
        return
    volumes.append(
        {
            "name": name,
            "projected": {
                "defaultMode": 420,
                "sources": [
                    {"serviceAccountToken": {"expirationSeconds": 3607, "path": "token"}},
                    {
                        "configMap": {
                            "name": "kube-root-ca.crt",
                            "items": [{"key": "ca.crt", "path": "ca.crt"}],
                        }
                    },
                    {
                        "downwardAPI": {
                            "items": [
                                {
                                    "path": "namespace",
                                    "fieldRef": {
                                        "apiVersion": "v1",
                                        "fieldPath": "metadata.namespace",
                                    },
                                }
                            ]
                        }
                    },
                ],
            },
        }
    )
    for c in containers:
        mounts = c.setdefault("volumeMounts", [])
        if isinstance(mounts, list):
            mounts.append({"name": name, "mountPath": SA_MOUNT_PATH, "readOnly": True})


def _default_pod(pod: dict[str, Any], accounts: Any = None) -> None:
    spec = pod.setdefault("spec", {})
    if not isinstance(spec, dict):
        return
    default_pod_spec(spec)
    account = None
    namespace = (pod.get("metadata") or {}).get("namespace")
    if accounts is not None and namespace:
        account = accounts(namespace, spec.get("serviceAccountName") or "default")
    _inject_service_account_volume(spec, account)
    spec.setdefault("enableServiceLinks", True)
    spec.setdefault("preemptionPolicy", "PreemptLowerPriority")
    spec.setdefault("priority", 0)
    spec.setdefault("serviceAccountName", spec.get("serviceAccount", "default"))
    spec.setdefault("serviceAccount", spec["serviceAccountName"])
    tolerations = spec.setdefault("tolerations", [])
    keys = {t.get("key") for t in tolerations if isinstance(t, dict)}
    for key in ("node.kubernetes.io/not-ready", "node.kubernetes.io/unreachable"):
        if key not in keys:
            tolerations.append(
                {"key": key, "operator": "Exists", "effect": "NoExecute", "tolerationSeconds": 300}
            )
    status = pod.setdefault("status", {})
    status.setdefault("phase", "Pending")
    status.setdefault("qosClass", _qos(spec))


def _qos(spec: dict[str, Any]) -> str:
    requests = limits = False
    guaranteed = True
    for c in spec.get("containers") or []:
        res = c.get("resources") or {} if isinstance(c, dict) else {}
        r, lim = res.get("requests") or {}, res.get("limits") or {}
        requests = requests or bool(r)
        limits = limits or bool(lim)
        if not lim or any(r.get(k, lim[k]) != lim[k] for k in lim) or set(lim) < {"cpu", "memory"}:
            guaranteed = False
    if not requests and not limits:
        return "BestEffort"
    return "Guaranteed" if guaranteed else "Burstable"


def _default_template(obj: dict[str, Any]) -> None:
    template = (obj.get("spec") or {}).get("template")
    if isinstance(template, dict) and isinstance(template.get("spec"), dict):
        default_pod_spec(template["spec"])
        template.setdefault("metadata", {})


def _default_claim_spec(spec: dict[str, Any]) -> None:
    for req in (spec.get("devices") or {}).get("requests") or []:
        if not isinstance(req, dict):
            continue
        for sub in [req.get("exactly")] + list(req.get("firstAvailable") or []):
            if isinstance(sub, dict):
                sub.setdefault("allocationMode", "ExactCount")
                if sub["allocationMode"] == "ExactCount":
                    sub.setdefault("count", 1)


# ---- per-kind validators ------------------------------------------------------------------


_CONTAINER_FIELD_TYPES: dict[str, type] = {
    "name": str,
    "image": str,
    "resources": dict,
    "env": list,
    "ports": list,
    "command": list,
    "args": list,
    "volumeMounts": list,
}
_TYPE_WORDS: dict[type, str] = {str: "a string", dict: "an object", list: "a list"}


def _pod_spec(spec: Any, path: str) -> Causes:
    causes: Causes = []
    if not isinstance(spec, dict):
        return [_req(path)]
    containers = spec.get("containers")
    if not containers:
        return [_req(f"{path}.containers")]
    if not isinstance(containers, list):
        return [_inv(f"{path}.containers", containers, "must be a list")]
    names: set[str] = set()
    for i, c in enumerate(containers):
        cp = f"{path}.containers[{i}]"
        if not isinstance(c, dict):
            causes.append(_inv(cp, c, "must be an object"))
            continue
        name = c.get("name")
        if not name:
            causes.append(_req(f"{cp}.name"))
        elif not _DNS1123_LABEL.match(name):
            causes.append(_inv(f"{cp}.name", name, _LABEL_MSG))
        elif name in names:
            causes.append(
                errors.cause(f"{cp}.name", "FieldValueDuplicate", f'Duplicate value: "{name}"')
            )
        else:
            names.add(name)
        if not c.get("image"):
            causes.append(_req(f"{cp}.image"))
        for field, typ in _CONTAINER_FIELD_TYPES.items():
            if field in c and c[field] is not None and not isinstance(c[field], typ):
                causes.append(_inv(f"{cp}.{field}", c[field], f"must be {_TYPE_WORDS[typ]}"))
    rp = spec.get("restartPolicy", "Always")
    if rp not in ("Always", "OnFailure", "Never"):
        causes.append(_unsupported(f"{path}.restartPolicy", rp, ("Always", "OnFailure", "Never")))
    claim_names = set()
    for i, rc in enumerate(spec.get("resourceClaims") or []):
        if not rc.get("name"):
            causes.append(_req(f"{path}.resourceClaims[{i}].name"))
        claim_names.add(rc.get("name"))
        if bool(rc.get("resourceClaimName")) == bool(rc.get("resourceClaimTemplateName")):
            causes.append(
                _inv(
                    f"{path}.resourceClaims[{i}]",
                    "",
                    "must specify one of: `resourceClaimName`, `resourceClaimTemplateName`",
                )
            )
    for i, c in enumerate(containers):
        if not isinstance(c, dict):
            continue
        for j, claim in enumerate((c.get("resources") or {}).get("claims") or []):
            if claim.get("name") not in claim_names:
                causes.append(
                    errors.cause(
                        f"{path}.containers[{i}].resources.claims[{j}].name",
                        "FieldValueNotFound",
                        f'Not found: "{claim.get("name")}"',
                    )
                )
    return causes


def _label_selector(sel: Any, path: str, labels: dict[str, str] | None, tmpl_path: str) -> Causes:
    if not isinstance(sel, dict):
        return [_req(path)]
    if not sel.get("matchLabels") and not sel.get("matchExpressions"):
        return [_inv(path, sel, "empty selector is invalid for deployment")]
    parsed = selector_from_label_selector_object(sel)
    if parsed is not None and not parsed.matches(labels or {}):
        return [_inv(tmpl_path, labels or {}, "`selector` does not match template `labels`")]
    return []


def _workload(obj: dict[str, Any], kind_selector_required: bool = True) -> Causes:
    spec = obj.get("spec")
    if not isinstance(spec, dict):
        return [_req("spec")]
    causes: Causes = []
    template = spec.get("template")
    if not isinstance(template, dict):
        return [_req("spec.template")]
    labels = (template.get("metadata") or {}).get("labels")
    if kind_selector_required:
        causes += _label_selector(
            spec.get("selector"), "spec.selector", labels, "spec.template.metadata.labels"
        )
    replicas = spec.get("replicas", 0)
    if not isinstance(replicas, int) or replicas < 0:
        causes.append(_inv("spec.replicas", replicas, "must be greater than or equal to 0"))
    causes += _pod_spec(template.get("spec"), "spec.template.spec")
    return causes


def _validate_pod(obj: dict[str, Any], old: dict[str, Any] | None) -> Causes:
    causes = _pod_spec(obj.get("spec"), "spec")
    if old is not None and not causes:
        # Pod specs are mostly immutable; binding (nodeName from empty) is allowed.
        new_spec, old_spec = dict(obj.get("spec") or {}), dict(old.get("spec") or {})
        for mutable in ("tolerations", "activeDeadlineSeconds", "schedulingGates"):
            new_spec.pop(mutable, None)
            old_spec.pop(mutable, None)
        if not old_spec.get("nodeName"):
            new_spec.pop("nodeName", None)
            old_spec.pop("nodeName", None)
        for spec in (new_spec, old_spec):
            spec["containers"] = [
                {k: v for k, v in c.items() if k != "image"} for c in spec.get("containers") or []
            ]
        if new_spec != old_spec:
            causes.append(
                errors.cause(
                    "spec",
                    "FieldValueForbidden",
                    "Forbidden: pod updates may not change fields other than `spec.containers[*]"
                    ".image`,`spec.initContainers[*].image`,`spec.activeDeadlineSeconds`,`spec."
                    "tolerations` (only additions to existing tolerations),`spec.schedulingGates`",
                )
            )
    return causes


def _validate_job(obj: dict[str, Any], old: dict[str, Any] | None) -> Causes:
    causes = _workload(obj, kind_selector_required=False)
    tspec = ((obj.get("spec") or {}).get("template") or {}).get("spec") or {}
    rp = tspec.get("restartPolicy")
    if rp not in ("OnFailure", "Never"):
        causes.append(
            errors.cause(
                "spec.template.spec.restartPolicy",
                "FieldValueRequired" if rp is None else "FieldValueNotSupported",
                f'Unsupported value: "{rp}": supported values: "OnFailure", "Never"',
            )
        )
    return causes


def _validate_pdb(obj: dict[str, Any], old: dict[str, Any] | None) -> Causes:
    spec = obj.get("spec")
    if not isinstance(spec, dict):
        return [_req("spec")]
    sel = spec.get("selector")
    if sel is not None and (
        not isinstance(sel, dict)
        or not isinstance(sel.get("matchLabels") or {}, dict)
        or not isinstance(sel.get("matchExpressions") or [], list)
    ):
        return [_inv("spec.selector", sel, "must be a label selector")]
    if "minAvailable" in spec and "maxUnavailable" in spec:
        return [
            _inv("spec", spec, "minAvailable and maxUnavailable cannot be both set"),
        ]
    causes: Causes = []
    for f in ("minAvailable", "maxUnavailable"):
        if f in spec and spec[f] is None:
            del spec[f]  # an explicit null means "unset"
        v = spec.get(f)
        if v is not None and (isinstance(v, bool) or not isinstance(v, int | str)):
            causes.append(_inv(f"spec.{f}", v, "must be an integer or a percentage"))
        elif isinstance(v, int) and v < 0:
            causes.append(_inv(f"spec.{f}", v, "must be greater than or equal to 0"))
        elif isinstance(v, str) and not re.match(r"^\d+%$", v):
            causes.append(
                _inv(
                    f"spec.{f}",
                    v,
                    "a valid percent string must be a numeric string followed by an ending '%'",
                )
            )
    return causes


def _device_requests(devices: Any, path: str) -> Causes:
    causes: Causes = []
    if devices is None:
        return causes
    for i, req in enumerate((devices or {}).get("requests") or []):
        rp = f"{path}.requests[{i}]"
        if not req.get("name"):
            causes.append(_req(f"{rp}.name"))
        exactly, first = req.get("exactly"), req.get("firstAvailable")
        if bool(exactly) == bool(first):
            causes.append(_req(rp, "exactly one of `exactly` or `firstAvailable` is required"))
        if exactly and not exactly.get("deviceClassName"):
            causes.append(_req(f"{rp}.exactly.deviceClassName"))
        for j, sub in enumerate(first or []):
            if not sub.get("name"):
                causes.append(_req(f"{rp}.firstAvailable[{j}].name"))
            if not sub.get("deviceClassName"):
                causes.append(_req(f"{rp}.firstAvailable[{j}].deviceClassName"))
        for sub_path, sub in [(f"{rp}.exactly", exactly)] + [
            (f"{rp}.firstAvailable[{j}]", s) for j, s in enumerate(first or [])
        ]:
            if not isinstance(sub, dict):
                continue
            mode = sub.get("allocationMode", "ExactCount")
            if mode not in ("ExactCount", "All"):
                causes.append(
                    _unsupported(f"{sub_path}.allocationMode", mode, ("All", "ExactCount"))
                )
            for k, tol in enumerate(sub.get("tolerations") or []):
                causes += _toleration(tol, f"{sub_path}.tolerations[{k}]")
    return causes


def _toleration(tol: dict[str, Any], path: str) -> Causes:
    causes: Causes = []
    op = tol.get("operator", "Equal")
    if op not in ("Exists", "Equal"):
        causes.append(_unsupported(f"{path}.operator", op, ("Equal", "Exists")))
    if tol.get("key"):
        causes += _qualified_name(f"{path}.key", tol["key"])
    elif op != "Exists":
        causes.append(_inv(f"{path}.operator", op, "value must be Exists when `key` is empty"))
    eff = tol.get("effect")
    if eff and eff not in ("NoExecute", "NoSchedule"):
        causes.append(_unsupported(f"{path}.effect", eff, ("NoExecute", "NoSchedule")))
    return causes


def _validate_claim(obj: dict[str, Any], old: dict[str, Any] | None) -> Causes:
    spec = obj.get("spec")
    if not isinstance(spec, dict):
        return [_req("spec")]
    causes = _device_requests(spec.get("devices"), "spec.devices")
    if old is not None and spec != old.get("spec"):
        causes.append(_inv("spec", "", "field is immutable"))
    return causes


def _validate_claim_template(obj: dict[str, Any], old: dict[str, Any] | None) -> Causes:
    spec = obj.get("spec")
    if not isinstance(spec, dict) or not isinstance(spec.get("spec"), dict):
        return [_req("spec.spec")]
    return _device_requests(spec["spec"].get("devices"), "spec.spec.devices")


def _validate_slice(obj: dict[str, Any], old: dict[str, Any] | None) -> Causes:
    spec = obj.get("spec")
    if not isinstance(spec, dict):
        return [_req("spec")]
    causes: Causes = []
    if not spec.get("driver"):
        causes.append(_req("spec.driver"))
    pool = spec.get("pool")
    if not isinstance(pool, dict):
        causes.append(_req("spec.pool"))
    else:
        if not pool.get("name"):
            causes.append(_req("spec.pool.name"))
        if not isinstance(pool.get("resourceSliceCount"), int) or pool["resourceSliceCount"] < 1:
            causes.append(
                _inv(
                    "spec.pool.resourceSliceCount",
                    pool.get("resourceSliceCount", 0),
                    "must be greater than zero",
                )
            )
    chosen = [
        f for f in ("nodeName", "nodeSelector", "allNodes", "perDeviceNodeSelection") if spec.get(f)
    ]
    if len(chosen) != 1:
        causes.append(
            _req(
                "spec",
                "exactly one of `nodeName`, `nodeSelector`, `allNodes`, `perDeviceNodeSelection` is required",
            )
        )
    seen: set[str] = set()
    for i, dev in enumerate(spec.get("devices") or []):
        name = dev.get("name") if isinstance(dev, dict) else None
        if not name:
            causes.append(_req(f"spec.devices[{i}].name"))
        elif name in seen:
            causes.append(
                errors.cause(
                    f"spec.devices[{i}].name", "FieldValueDuplicate", f'Duplicate value: "{name}"'
                )
            )
        else:
            seen.add(name)
        for j, taint in enumerate((dev or {}).get("taints") or []):
            causes += _taint(taint, f"spec.devices[{i}].taints[{j}]", ("NoExecute", "NoSchedule"))
    return causes


def _taint(taint: Any, path: str, effects: tuple[str, ...]) -> Causes:
    if not isinstance(taint, dict):
        return [_req(path)]
    causes = _qualified_name(f"{path}.key", str(taint.get("key") or ""))
    value = taint.get("value")
    if value and (len(value) > 63 or not _LABEL_VALUE.match(value)):
        causes.append(
            _inv(
                f"{path}.value",
                value,
                "a valid label must be an empty string or consist of alphanumeric characters, '-', '_' or '.', and must start and end with an alphanumeric character",
            )
        )
    effect = taint.get("effect")
    if not effect:
        causes.append(_req(f"{path}.effect"))
    elif effect not in effects:
        causes.append(_unsupported(f"{path}.effect", effect, effects))
    return causes


def _validate_dtr(obj: dict[str, Any], old: dict[str, Any] | None) -> Causes:
    spec = obj.get("spec")
    if not isinstance(spec, dict):
        return [_req("spec")]
    causes: Causes = []
    if "taint" not in spec:
        causes.append(_req("spec.taint"))
    else:
        causes += _taint(spec["taint"], "spec.taint", TAINT_EFFECTS)
    sel = spec.get("deviceSelector")
    if sel is not None and not isinstance(sel, dict):
        causes.append(_inv("spec.deviceSelector", sel, "must be an object"))
    return causes


def _validate_event(obj: dict[str, Any], old: dict[str, Any] | None) -> Causes:
    causes: Causes = []
    inv = obj.get("involvedObject")
    if not isinstance(inv, dict):
        causes.append(_req("involvedObject"))
    ns = (obj.get("metadata") or {}).get("namespace")
    if isinstance(inv, dict) and inv.get("namespace") and ns and inv["namespace"] != ns:
        causes.append(
            _inv("involvedObject.namespace", inv["namespace"], "does not match event.namespace")
        )
    return causes


def _validate_md(obj: dict[str, Any], old: dict[str, Any] | None) -> Causes:
    spec = obj.get("spec")
    if not isinstance(spec, dict):
        return [_req("spec")]
    causes: Causes = []
    if not spec.get("clusterName"):
        causes.append(_req("spec.clusterName"))
    if not isinstance(spec.get("template"), dict):
        causes.append(_req("spec.template"))
    return causes


def _validate_node(obj: dict[str, Any], old: dict[str, Any] | None) -> Causes:
    causes: Causes = []
    for i, taint in enumerate((obj.get("spec") or {}).get("taints") or []):
        causes += _taint(
            taint, f"spec.taints[{i}]", ("NoExecute", "NoSchedule", "PreferNoSchedule")
        )
    return causes


def _validate_rs(obj: dict[str, Any], old: dict[str, Any] | None) -> Causes:
    return _workload(obj)


_VALIDATORS: dict[str, Callable[[dict[str, Any], dict[str, Any] | None], Causes]] = {
    "pods": _validate_pod,
    "nodes": _validate_node,
    "events": _validate_event,
    "deployments.apps": _validate_rs,
    "replicasets.apps": _validate_rs,
    "statefulsets.apps": _validate_rs,
    "jobs.batch": _validate_job,
    "poddisruptionbudgets.policy": _validate_pdb,
    "resourceclaims.resource.k8s.io": _validate_claim,
    "resourceclaimtemplates.resource.k8s.io": _validate_claim_template,
    "resourceslices.resource.k8s.io": _validate_slice,
    "devicetaintrules.resource.k8s.io": _validate_dtr,
    "machinedeployments.cluster.x-k8s.io": _validate_md,
}


def _default_secret(secret: dict[str, Any]) -> None:
    """stringData is write-only: merged into data (base64), as the apiserver does."""
    import base64

    secret.setdefault("type", "Opaque")
    for k, v in (secret.pop("stringData", None) or {}).items():
        secret.setdefault("data", {})[k] = base64.b64encode(str(v).encode()).decode()


def _default_service(svc: dict[str, Any]) -> None:
    """ClusterIP allocation (10.96.0.0/12, derived from the uid) and the usual defaults."""
    spec = svc["spec"]
    spec.setdefault("type", "ClusterIP")
    spec.setdefault("sessionAffinity", "None")
    if spec["type"] != "ExternalName":
        if not spec.get("clusterIP"):
            n = int(svc["metadata"]["uid"].replace("-", "")[:8], 16) % 65000 + 2
            spec["clusterIP"] = f"10.96.{n // 256}.{n % 256}"
        if spec["clusterIP"] != "None":
            spec.setdefault("clusterIPs", [spec["clusterIP"]])
        spec.setdefault("ipFamilies", ["IPv4"])
        spec.setdefault("ipFamilyPolicy", "SingleStack")
        spec.setdefault("internalTrafficPolicy", "Cluster")
    for port in spec.get("ports") or []:
        if isinstance(port, dict):
            port.setdefault("protocol", "TCP")
            port.setdefault("targetPort", port.get("port"))
    svc.setdefault("status", {"loadBalancer": {}})


def _format(now: datetime) -> str:
    return now.strftime("%Y-%m-%dT%H:%M:%SZ")


_GO_TYPES = {
    dict: "object",
    list: "array",
    str: "string",
    int: "number",
    float: "number",
    bool: "bool",
}


def _type_error(
    rt: ResourceType, version: str, field: str, value: Any, want: str
) -> errors.ApiError:
    got = _GO_TYPES.get(type(value), "null" if value is None else type(value).__name__)
    return errors.bad_request(
        f'{rt.kind} in version "{version}" cannot be handled as a {rt.kind}: json: cannot '
        f"unmarshal {got} into Go struct field {field} of type {want}"
    )


def check_types(rt: ResourceType, obj: Any) -> None:
    """Reject bodies whose well-known fields have the wrong JSON type (400, as decoding does)."""
    version = "v1"
    if isinstance(obj, dict) and isinstance(obj.get("apiVersion"), str):
        version = obj["apiVersion"].rsplit("/", 1)[-1]
    if not isinstance(obj, dict):
        raise errors.bad_request(f"the body of the request must be a {rt.kind} object")
    meta = obj.get("metadata", {})
    if not isinstance(meta, dict):
        raise _type_error(rt, version, "ObjectMeta.metadata", meta, "v1.ObjectMeta")
    for f in ("name", "generateName", "namespace", "resourceVersion", "uid"):
        if f in meta and meta[f] is not None and not isinstance(meta[f], str):
            raise _type_error(rt, version, f"ObjectMeta.metadata.{f}", meta[f], "string")
    for f in ("labels", "annotations"):
        value = meta.get(f)
        if value is None:
            continue
        if not isinstance(value, dict) or not all(
            isinstance(k, str) and isinstance(v, str) for k, v in value.items()
        ):
            raise _type_error(rt, version, f"ObjectMeta.metadata.{f}", value, "map[string]string")
    finalizers = meta.get("finalizers")
    if finalizers is not None and (
        not isinstance(finalizers, list) or not all(isinstance(x, str) for x in finalizers)
    ):
        raise _type_error(rt, version, "ObjectMeta.metadata.finalizers", finalizers, "[]string")
    refs = meta.get("ownerReferences")
    if refs is not None and (
        not isinstance(refs, list) or not all(isinstance(r, dict) for r in refs)
    ):
        raise _type_error(
            rt, version, "ObjectMeta.metadata.ownerReferences", refs, "[]v1.OwnerReference"
        )
    for f in ("spec", "status"):
        if f in obj and obj[f] is not None and not isinstance(obj[f], dict):
            raise _type_error(
                rt, version, f"{rt.kind}.{f}", obj[f], f"v1.{rt.kind}{f.capitalize()}"
            )


def _drop_omitted_zero_values(rt: ResourceType, obj: dict[str, Any]) -> None:
    """Fields a real server drops because Go's `omitempty` omits their zero value.

    The apiserver decodes every write into a typed object and encodes it back, so a patch (or
    create, or update) setting Node `spec.unschedulable: false` reads back without the key."""
    if rt.storage == "nodes":
        spec = obj.get("spec")
        if isinstance(spec, dict) and spec.get("unschedulable") is False:
            del spec["unschedulable"]


class Admission:
    def __init__(self, profile: Profile) -> None:
        self.profile = profile
        # (namespace, name) -> the ServiceAccount or None; set by the store it admits for.
        self.accounts: Any = None

    def admit(
        self,
        op: str,
        rt: ResourceType,
        new: dict[str, Any],
        old: dict[str, Any] | None,
        subresource: str | None,
        now: datetime,
    ) -> None:
        check_types(rt, new)
        meta = new.get("metadata") or {}
        for empty in ("labels", "annotations"):  # omitempty maps: `{}` decodes to absent
            if meta.get(empty) == {}:
                del meta[empty]
        try:
            _drop_omitted_zero_values(rt, new)
            if op == "CREATE":
                self._default(rt, new, now)
            elif rt.storage == "devicetaintrules.resource.k8s.io" and subresource is None:
                self._dtr_time_added(new, old, now)
            if subresource == "status":
                return  # status writes keep the validated spec
            causes = _object_meta(rt, meta)
            validator = _VALIDATORS.get(rt.storage)
            if validator is not None and isinstance(new, dict):
                causes += validator(new, old)
        except (AttributeError, TypeError, KeyError, ValueError, IndexError) as exc:
            # A field deeper down has the wrong JSON type: decoding would have failed (400).
            version = str(new.get("apiVersion", "v1")).rsplit("/", 1)[-1]
            raise errors.bad_request(
                f'{rt.kind} in version "{version}" cannot be handled as a {rt.kind}: {exc}'
            ) from None
        if causes:
            raise errors.invalid(rt.kind, meta.get("name", ""), causes, rt.group)

    def _default(self, rt: ResourceType, obj: dict[str, Any], now: datetime) -> None:
        key = rt.storage
        spec = obj.get("spec")
        if key == "pods":
            _default_pod(obj, self.accounts)
        elif key == "namespaces":
            obj.setdefault("spec", {"finalizers": ["kubernetes"]})
            obj.setdefault("status", {"phase": "Active"})
            obj["metadata"].setdefault("labels", {})["kubernetes.io/metadata.name"] = obj[
                "metadata"
            ]["name"]
        elif key == "deployments.apps" and isinstance(spec, dict):
            spec.setdefault("replicas", 1)
            spec.setdefault("revisionHistoryLimit", 10)
            spec.setdefault("progressDeadlineSeconds", 600)
            strategy = spec.setdefault("strategy", {})
            if isinstance(strategy, dict):  # `strategy: {}` (kubectl create) is defaulted too
                strategy.setdefault("type", "RollingUpdate")
                if strategy["type"] == "RollingUpdate":
                    rolling = strategy.setdefault("rollingUpdate", {})
                    if isinstance(rolling, dict):
                        rolling.setdefault("maxSurge", "25%")
                        rolling.setdefault("maxUnavailable", "25%")
            _default_template(obj)
        elif key == "replicasets.apps" and isinstance(spec, dict):
            spec.setdefault("replicas", 1)
            obj.setdefault("status", {"replicas": 0})
            _default_template(obj)
        elif key == "statefulsets.apps" and isinstance(spec, dict):
            spec.setdefault("replicas", 1)
            spec.setdefault("podManagementPolicy", "OrderedReady")
            spec.setdefault("revisionHistoryLimit", 10)
            spec.setdefault(
                "updateStrategy", {"type": "RollingUpdate", "rollingUpdate": {"partition": 0}}
            )
            spec.setdefault(
                "persistentVolumeClaimRetentionPolicy",
                {"whenDeleted": "Retain", "whenScaled": "Retain"},
            )
            obj.setdefault("status", {"replicas": 0, "availableReplicas": 0})
            _default_template(obj)
        elif key == "jobs.batch" and isinstance(spec, dict):
            self._default_job(obj)
        elif key == "resourceclaims.resource.k8s.io" and isinstance(spec, dict):
            _default_claim_spec(spec)
        elif key == "resourceclaimtemplates.resource.k8s.io" and isinstance(spec, dict):
            spec.setdefault("metadata", {})
            if isinstance(spec.get("spec"), dict):
                _default_claim_spec(spec["spec"])
        elif key == "devicetaintrules.resource.k8s.io" and isinstance(spec, dict):
            taint = spec.get("taint")
            if isinstance(taint, dict):
                taint.setdefault("timeAdded", _format(now))
        elif key == "poddisruptionbudgets.policy":
            obj.setdefault(
                "status",
                {
                    "currentHealthy": 0,
                    "desiredHealthy": 0,
                    "disruptionsAllowed": 0,
                    "expectedPods": 0,
                },
            )
        elif key == "machinedeployments.cluster.x-k8s.io" and isinstance(spec, dict):
            spec.setdefault("replicas", 1)
            spec.setdefault("minReadySeconds", 0)
            spec.setdefault("revisionHistoryLimit", 1)
            spec.setdefault("selector", {"matchLabels": {}})
            spec["selector"].setdefault("matchLabels", {})["cluster.x-k8s.io/cluster-name"] = (
                spec.get("clusterName", "")
            )
            spec["selector"]["matchLabels"]["cluster.x-k8s.io/deployment-name"] = obj["metadata"][
                "name"
            ]
        elif key == "nodes":
            obj.setdefault("spec", {})
            obj.setdefault("status", {})
        elif key == "secrets":
            _default_secret(obj)
        elif key == "services" and isinstance(spec, dict):
            _default_service(obj)
        elif key == "events":
            obj.setdefault("count", 1) if obj.get("firstTimestamp") else None
            obj.setdefault("type", "Normal")
            # Zero structs and plain strings survive Go's omitempty: a real server answers
            # with these keys present (eventTime null) whatever the request left out.
            for field in ("eventTime", "firstTimestamp", "lastTimestamp"):
                obj.setdefault(field, None)
            obj.setdefault("source", {})
            obj.setdefault("reportingComponent", "")
            obj.setdefault("reportingInstance", "")

    def _default_job(self, job: dict[str, Any]) -> None:
        spec = job["spec"]
        uid = job["metadata"]["uid"]
        name = job["metadata"]["name"]
        spec.setdefault("parallelism", 1)
        if spec.get("completions") is None and spec.get("completionMode") != "Indexed":
            spec.setdefault("completions", 1)
        spec.setdefault("backoffLimit", 6)
        spec.setdefault("completionMode", "NonIndexed")
        spec.setdefault("suspend", False)
        spec.setdefault("podReplacementPolicy", "TerminatingOrFailed")
        spec.setdefault("manualSelector", None)
        if spec["manualSelector"] is None:
            spec.pop("manualSelector")
        if not spec.get("manualSelector"):
            spec["selector"] = {"matchLabels": {"batch.kubernetes.io/controller-uid": uid}}
            template = spec.setdefault("template", {})
            if isinstance(template, dict):
                labels = template.setdefault("metadata", {}).setdefault("labels", {})
                labels.update(
                    {
                        "batch.kubernetes.io/controller-uid": uid,
                        "batch.kubernetes.io/job-name": name,
                        "controller-uid": uid,
                        "job-name": name,
                    }
                )
        _default_template(job)

    def _dtr_time_added(
        self, new: dict[str, Any], old: dict[str, Any] | None, now: datetime
    ) -> None:
        """timeAdded is server-set; a changed effect bumps it (1.36+), else it is kept."""
        taint = (new.get("spec") or {}).get("taint")
        old_taint = ((old or {}).get("spec") or {}).get("taint") or {}
        if not isinstance(taint, dict):
            return
        if old_taint.get("effect") != taint.get("effect") and self.profile.minor >= "36":
            taint["timeAdded"] = _format(now)
        elif "timeAdded" not in taint or taint.get("timeAdded") == old_taint.get("timeAdded"):
            if old_taint.get("timeAdded"):
                taint["timeAdded"] = old_taint["timeAdded"]
            else:
                taint.setdefault("timeAdded", _format(now))
