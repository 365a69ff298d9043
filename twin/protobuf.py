"""Request bodies in `application/vnd.kubernetes.protobuf`, as kubectl's typed clients send them.

kubectl v1.32 sends built-in kinds (`run`, `create namespace|configmap|secret|serviceaccount|
deployment|job|service|poddisruptionbudget|role|rolebinding|clusterrole|clusterrolebinding`,
the Eviction of `drain`, the reviews of `auth can-i` / `auth whoami`) as protobuf: the 4-byte magic
`k8s\\0`, then a `runtime.Unknown` {typeMeta {apiVersion, kind}, raw, contentEncoding,
contentType} whose `raw` is the object in the field numbering of k8s.io/api's generated.proto.
A real kube-apiserver decodes every built-in kind; the twin decodes the kinds in `KINDS`
into the dict its JSON path would have produced, and answers JSON (clients send
`Accept: application/vnd.kubernetes.protobuf, application/json` and decode an answer by its
Content-Type). Refusing the body is no way out: client-go falls back to JSON after a 415 only
for CBOR (KEP-4222), never for protobuf, so a 415 here is kubectl's error.

Go's protobuf encoding writes every non-pointer field, zero or not; JSON omits empty ones
(`omitempty`). So a zero scalar is dropped unless the schema marks it `opt` (a Go pointer,
written only when set: `replicas: 0` stays), and messages are kept even when empty, as Go's
JSON keeps struct fields. A body naming a kind, or carrying a field, that the schema does not
know is refused with 415 and a message naming it: the twin never guesses at bytes it cannot
read.
"""

from __future__ import annotations

import base64
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from twin import errors

CONTENT_TYPE = "application/vnd.kubernetes.protobuf"
MAGIC = b"k8s\x00"


@dataclass(frozen=True)
class F:
    """One field: its JSON name, wire kind and, for `opt`, kept even when zero."""

    name: str
    # string int bool bytes time ios map map_bytes map_qty msg:X list:X strings, or skip: a
    # part the server discards on create (status, computed by the server), not read
    kind: str
    opt: bool = False


def _msg(**fields: tuple[Any, ...]) -> dict[int, F]:
    return {int(num[1:]): F(*spec) for num, spec in fields.items()}


# Field numbers from k8s.io/api and k8s.io/apimachinery generated.proto (v1.32-1.36).
SCHEMAS: dict[str, dict[int, F]] = {
    "TypeMeta": _msg(f1=("apiVersion", "string"), f2=("kind", "string")),
    "Unknown": _msg(
        f1=("typeMeta", "msg:TypeMeta"),
        f2=("raw", "bytes"),
        f3=("contentEncoding", "string"),
        f4=("contentType", "string"),
    ),
    "ObjectMeta": _msg(
        f1=("name", "string"),
        f2=("generateName", "string"),
        f3=("namespace", "string"),
        f4=("selfLink", "string"),
        f5=("uid", "string"),
        f6=("resourceVersion", "string"),
        f7=("generation", "int"),
        f8=("creationTimestamp", "time"),
        f9=("deletionTimestamp", "time"),
        f10=("deletionGracePeriodSeconds", "int", True),
        f11=("labels", "map"),
        f12=("annotations", "map"),
        f13=("ownerReferences", "list:OwnerReference"),
        f14=("finalizers", "strings"),
    ),
    "OwnerReference": _msg(
        f1=("kind", "string"),
        f3=("name", "string"),
        f4=("uid", "string"),
        f5=("apiVersion", "string"),
        f6=("controller", "bool", True),
        f7=("blockOwnerDeletion", "bool", True),
    ),
    "LabelSelector": _msg(
        f1=("matchLabels", "map"), f2=("matchExpressions", "list:LabelSelectorRequirement")
    ),
    "LabelSelectorRequirement": _msg(
        f1=("key", "string"), f2=("operator", "string"), f3=("values", "strings")
    ),
    # core/v1
    "Namespace": _msg(
        f1=("metadata", "msg:ObjectMeta"),
        f2=("spec", "msg:NamespaceSpec"),
        f3=("status", "msg:NamespaceStatus"),
    ),
    "NamespaceSpec": _msg(f1=("finalizers", "strings")),
    "NamespaceStatus": _msg(f1=("phase", "string"), f2=("conditions", "skip")),
    "ConfigMap": _msg(
        f1=("metadata", "msg:ObjectMeta"),
        f2=("data", "map"),
        f3=("binaryData", "map_bytes"),
        f4=("immutable", "bool", True),
    ),
    "Secret": _msg(
        f1=("metadata", "msg:ObjectMeta"),
        f2=("data", "map_bytes"),
        f3=("type", "string"),
        f4=("stringData", "map"),
        f5=("immutable", "bool", True),
    ),
    "Pod": _msg(
        f1=("metadata", "msg:ObjectMeta"),
        f2=("spec", "msg:PodSpec"),
        f3=("status", "skip"),
    ),
    "PodTemplateSpec": _msg(f1=("metadata", "msg:ObjectMeta"), f2=("spec", "msg:PodSpec")),
    "PodSpec": _msg(
        f2=("containers", "list:Container"),
        f3=("restartPolicy", "string"),
        f4=("terminationGracePeriodSeconds", "int", True),
        f5=("activeDeadlineSeconds", "int", True),
        f6=("dnsPolicy", "string"),
        f7=("nodeSelector", "map"),
        f8=("serviceAccountName", "string"),
        f9=("serviceAccount", "string"),
        f10=("nodeName", "string"),
        f11=("hostNetwork", "bool"),
        f12=("hostPID", "bool"),
        f13=("hostIPC", "bool"),
        f14=("securityContext", "msg:Empty"),
        f16=("hostname", "string"),
        f17=("subdomain", "string"),
        f19=("schedulerName", "string"),
        f20=("initContainers", "list:Container"),
        f24=("priorityClassName", "string"),
        f25=("priority", "int", True),
    ),
    "Empty": {},
    "Container": _msg(
        f1=("name", "string"),
        f2=("image", "string"),
        f3=("command", "strings"),
        f4=("args", "strings"),
        f5=("workingDir", "string"),
        f6=("ports", "list:ContainerPort"),
        f7=("env", "list:EnvVar"),
        f8=("resources", "msg:ResourceRequirements"),
        f13=("terminationMessagePath", "string"),
        f14=("imagePullPolicy", "string"),
        f16=("stdin", "bool"),
        f17=("stdinOnce", "bool"),
        f18=("tty", "bool"),
        f20=("terminationMessagePolicy", "string"),
    ),
    "ContainerPort": _msg(
        f1=("name", "string"),
        f2=("hostPort", "int"),
        f3=("containerPort", "int"),
        f4=("protocol", "string"),
        f5=("hostIP", "string"),
    ),
    "EnvVar": _msg(f1=("name", "string"), f2=("value", "string")),
    "ResourceRequirements": _msg(
        f1=("limits", "map_qty"),
        f2=("requests", "map_qty"),
        f3=("claims", "list:ResourceClaim"),
    ),
    "ResourceClaim": _msg(f1=("name", "string"), f2=("request", "string")),
    # apps/v1
    "Deployment": _msg(
        f1=("metadata", "msg:ObjectMeta"),
        f2=("spec", "msg:DeploymentSpec"),
        f3=("status", "skip"),
    ),
    "DeploymentSpec": _msg(
        f1=("replicas", "int", True),
        f2=("selector", "msg:LabelSelector"),
        f3=("template", "msg:PodTemplateSpec"),
        f4=("strategy", "msg:DeploymentStrategy"),
        f5=("minReadySeconds", "int"),
        f6=("revisionHistoryLimit", "int", True),
        f7=("paused", "bool"),
        f9=("progressDeadlineSeconds", "int", True),
    ),
    "DeploymentStrategy": _msg(
        f1=("type", "string"), f2=("rollingUpdate", "msg:RollingUpdateDeployment")
    ),
    "RollingUpdateDeployment": _msg(f1=("maxUnavailable", "ios"), f2=("maxSurge", "ios")),
    "Service": _msg(
        f1=("metadata", "msg:ObjectMeta"),
        f2=("spec", "msg:ServiceSpec"),
        f3=("status", "skip"),
    ),
    "ServiceSpec": _msg(
        f1=("ports", "list:ServicePort"),
        f2=("selector", "map"),
        f3=("clusterIP", "string"),
        f4=("type", "string"),
        f5=("externalIPs", "strings"),
        f7=("sessionAffinity", "string"),
        f8=("loadBalancerIP", "string"),
        f9=("loadBalancerSourceRanges", "strings"),
        f10=("externalName", "string"),
        f11=("externalTrafficPolicy", "string"),
        f12=("healthCheckNodePort", "int"),
        f13=("publishNotReadyAddresses", "bool"),
        f17=("ipFamilyPolicy", "string", True),
        f18=("clusterIPs", "strings"),
        f19=("ipFamilies", "strings"),
        f20=("allocateLoadBalancerNodePorts", "bool", True),
        f21=("loadBalancerClass", "string", True),
        f22=("internalTrafficPolicy", "string", True),
        f23=("trafficDistribution", "string", True),
    ),
    "ServicePort": _msg(
        f1=("name", "string"),
        f2=("protocol", "string"),
        f3=("port", "int"),
        f4=("targetPort", "ios"),
        f5=("nodePort", "int"),
        f6=("appProtocol", "string", True),
    ),
    "ServiceAccount": _msg(
        f1=("metadata", "msg:ObjectMeta"),
        f4=("automountServiceAccountToken", "bool", True),
    ),
    # batch/v1
    "Job": _msg(
        f1=("metadata", "msg:ObjectMeta"),
        f2=("spec", "msg:JobSpec"),
        f3=("status", "skip"),
    ),
    "JobSpec": _msg(
        f1=("parallelism", "int", True),
        f2=("completions", "int", True),
        f3=("activeDeadlineSeconds", "int", True),
        f4=("selector", "msg:LabelSelector"),
        f5=("manualSelector", "bool", True),
        f6=("template", "msg:PodTemplateSpec"),
        f7=("backoffLimit", "int", True),
        f8=("ttlSecondsAfterFinished", "int", True),
        f9=("completionMode", "string", True),
        f10=("suspend", "bool", True),
    ),
    # policy/v1
    "PodDisruptionBudget": _msg(
        f1=("metadata", "msg:ObjectMeta"),
        f2=("spec", "msg:PodDisruptionBudgetSpec"),
        f3=("status", "skip"),
    ),
    "PodDisruptionBudgetSpec": _msg(
        f1=("minAvailable", "ios"),
        f2=("selector", "msg:LabelSelector"),
        f3=("maxUnavailable", "ios"),
        f4=("unhealthyPodEvictionPolicy", "string", True),
    ),
    # rbac.authorization.k8s.io/v1
    "Role": _msg(f1=("metadata", "msg:ObjectMeta"), f2=("rules", "list:PolicyRule")),
    "ClusterRole": _msg(
        f1=("metadata", "msg:ObjectMeta"),
        f2=("rules", "list:PolicyRule"),
        f3=("aggregationRule", "skip"),
    ),
    "PolicyRule": _msg(
        f1=("verbs", "strings"),
        f2=("apiGroups", "strings"),
        f3=("resources", "strings"),
        f4=("resourceNames", "strings"),
        f5=("nonResourceURLs", "strings"),
    ),
    "RoleBinding": _msg(
        f1=("metadata", "msg:ObjectMeta"),
        f2=("subjects", "list:Subject"),
        f3=("roleRef", "msg:RoleRef"),
    ),
    "ClusterRoleBinding": _msg(
        f1=("metadata", "msg:ObjectMeta"),
        f2=("subjects", "list:Subject"),
        f3=("roleRef", "msg:RoleRef"),
    ),
    "Subject": _msg(
        f1=("kind", "string"),
        f2=("apiGroup", "string"),
        f3=("name", "string"),
        f4=("namespace", "string"),
    ),
    "RoleRef": _msg(f1=("apiGroup", "string"), f2=("kind", "string"), f3=("name", "string")),
    # policy/v1
    "Eviction": _msg(f1=("metadata", "msg:ObjectMeta"), f2=("deleteOptions", "msg:DeleteOptions")),
    "DeleteOptions": _msg(
        f1=("gracePeriodSeconds", "int", True),
        f2=("preconditions", "msg:Preconditions"),
        f3=("orphanDependents", "bool", True),
        f4=("propagationPolicy", "string", True),
        f5=("dryRun", "strings"),
        f6=("ignoreStoreReadErrorWithClusterBreakingPotential", "bool", True),
    ),
    "Preconditions": _msg(f1=("uid", "string", True), f2=("resourceVersion", "string", True)),
    # authorization.k8s.io/v1 and authentication.k8s.io/v1
    "SelfSubjectAccessReview": _msg(
        f1=("metadata", "msg:ObjectMeta"),
        f2=("spec", "msg:SelfSubjectAccessReviewSpec"),
        f3=("status", "skip"),
    ),
    "SelfSubjectAccessReviewSpec": _msg(
        f1=("resourceAttributes", "msg:ResourceAttributes"),
        f2=("nonResourceAttributes", "msg:NonResourceAttributes"),
    ),
    "ResourceAttributes": _msg(
        f1=("namespace", "string"),
        f2=("verb", "string"),
        f3=("group", "string"),
        f4=("version", "string"),
        f5=("resource", "string"),
        f6=("subresource", "string"),
        f7=("name", "string"),
        f8=("fieldSelector", "skip"),
        f9=("labelSelector", "skip"),
    ),
    "NonResourceAttributes": _msg(f1=("path", "string"), f2=("verb", "string")),
    "SelfSubjectRulesReview": _msg(
        f1=("metadata", "msg:ObjectMeta"),
        f2=("spec", "msg:SelfSubjectRulesReviewSpec"),
        f3=("status", "skip"),
    ),
    "SelfSubjectRulesReviewSpec": _msg(f1=("namespace", "string")),
    "SelfSubjectReview": _msg(f1=("metadata", "msg:ObjectMeta"), f2=("status", "skip")),
    # authentication.k8s.io/v1 (`kubectl create token`)
    "TokenRequest": _msg(
        f1=("metadata", "msg:ObjectMeta"),
        f2=("spec", "msg:TokenRequestSpec"),
        f3=("status", "skip"),
    ),
    "TokenRequestSpec": _msg(
        f1=("audiences", "strings"),
        f3=("boundObjectRef", "msg:BoundObjectReference"),
        f4=("expirationSeconds", "int", True),
    ),
    "BoundObjectReference": _msg(
        f1=("kind", "string"),
        f2=("apiVersion", "string"),
        f3=("name", "string"),
        f4=("uid", "string"),
    ),
}

# (apiVersion, kind) of the top-level objects the twin decodes.
KINDS = {
    ("v1", "Namespace"),
    ("v1", "Pod"),
    ("v1", "ConfigMap"),
    ("v1", "Secret"),
    ("v1", "Service"),
    ("v1", "ServiceAccount"),
    ("apps/v1", "Deployment"),
    ("batch/v1", "Job"),
    ("policy/v1", "Eviction"),
    ("policy/v1", "PodDisruptionBudget"),
    ("rbac.authorization.k8s.io/v1", "Role"),
    ("rbac.authorization.k8s.io/v1", "ClusterRole"),
    ("rbac.authorization.k8s.io/v1", "RoleBinding"),
    ("rbac.authorization.k8s.io/v1", "ClusterRoleBinding"),
    ("authorization.k8s.io/v1", "SelfSubjectAccessReview"),
    ("authorization.k8s.io/v1", "SelfSubjectRulesReview"),
    ("authentication.k8s.io/v1", "SelfSubjectReview"),
    ("authentication.k8s.io/v1", "TokenRequest"),
}


def _unsupported(message: str) -> errors.ApiError:
    return errors.ApiError(415, "UnsupportedMediaType", message, {})


def _varint(data: bytes, pos: int) -> tuple[int, int]:
    shift = result = 0
    while True:
        if pos >= len(data):
            raise _unsupported("truncated protobuf varint")
        b = data[pos]
        pos += 1
        result |= (b & 0x7F) << shift
        if not b & 0x80:
            return result, pos
        shift += 7


def _fields(data: bytes) -> list[tuple[int, int, Any]]:
    """(field number, wire type, value) triples; values are ints or bytes."""
    out: list[tuple[int, int, Any]] = []
    pos = 0
    while pos < len(data):
        key, pos = _varint(data, pos)
        num, wire = key >> 3, key & 7
        value: int | bytes
        if wire == 0:
            value, pos = _varint(data, pos)
        elif wire == 2:
            size, pos = _varint(data, pos)
            value, pos = data[pos : pos + size], pos + size
        elif wire == 1:
            value, pos = int.from_bytes(data[pos : pos + 8], "little"), pos + 8
        elif wire == 5:
            value, pos = int.from_bytes(data[pos : pos + 4], "little"), pos + 4
        else:
            raise _unsupported(f"unsupported protobuf wire type {wire}")
        out.append((num, wire, value))
    return out


def _signed(value: int) -> int:
    return value - (1 << 64) if value >= 1 << 63 else value


def _map_entry(data: bytes) -> tuple[str, bytes]:
    key, value = "", b""
    for num, _wire, v in _fields(data):
        if num == 1:
            key = v.decode()
        elif num == 2:
            value = v
    return key, value


def _time(data: bytes) -> str | None:
    seconds = 0
    for num, _wire, v in _fields(data):
        if num == 1:
            seconds = _signed(v)
    if seconds == 0:
        return None  # the zero time: JSON null, omitted
    return datetime.fromtimestamp(seconds, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _int_or_string(data: bytes) -> int | str:
    kind, number, text = 0, 0, ""
    for num, _wire, v in _fields(data):
        if num == 1:
            kind = v
        elif num == 2:
            number = _signed(v)
        elif num == 3:
            text = v.decode()
    return text if kind == 1 else number


def decode_message(name: str, data: bytes) -> dict[str, Any]:
    schema = SCHEMAS[name]
    out: dict[str, Any] = {}
    for num, _wire, value in _fields(data):
        field = schema.get(num)
        if field is None:
            raise _unsupported(
                f"the twin cannot decode protobuf field {num} of {name}: send this object as "
                "application/json"
            )
        kind = field.kind
        if kind == "string":
            text = value.decode()
            if text or field.opt:
                out[field.name] = text
        elif kind == "int":
            number = _signed(value)
            if number or field.opt:
                out[field.name] = number
        elif kind == "bool":
            if value or field.opt:
                out[field.name] = bool(value)
        elif kind == "bytes":
            out[field.name] = value
        elif kind == "time":
            stamp = _time(value)
            if stamp is not None:
                out[field.name] = stamp
        elif kind == "ios":
            out[field.name] = _int_or_string(value)
        elif kind == "strings":
            out.setdefault(field.name, []).append(value.decode())
        elif kind in ("map", "map_bytes", "map_qty"):
            key, raw = _map_entry(value)
            if kind == "map":
                shown: Any = raw.decode()
            elif kind == "map_bytes":
                shown = base64.b64encode(raw).decode()
            else:  # resource.Quantity: {string = 1}
                shown = next((v.decode() for n, _w, v in _fields(raw) if n == 1), "")
            out.setdefault(field.name, {})[key] = shown
        elif kind == "skip":
            continue
        elif kind.startswith("msg:"):
            out[field.name] = decode_message(kind[4:], value)
        elif kind.startswith("list:"):
            out.setdefault(field.name, []).append(decode_message(kind[5:], value))
    return out


def decode(body: bytes) -> dict[str, Any]:
    """A protobuf request body → the object as the JSON path would have seen it."""
    if not body.startswith(MAGIC):
        raise _unsupported("a protobuf body must start with the k8s\\0 magic prefix")
    unknown = decode_message("Unknown", body[len(MAGIC) :])
    meta = unknown.get("typeMeta") or {}
    api_version, kind = meta.get("apiVersion", ""), meta.get("kind", "")
    if unknown.get("contentEncoding"):
        raise _unsupported(f"unsupported protobuf content encoding {unknown['contentEncoding']!r}")
    if (api_version, kind) not in KINDS:
        raise _unsupported(
            f"the twin cannot decode {kind or 'an object'} ({api_version or 'no apiVersion'}) "
            "from protobuf: send it as application/json"
        )
    obj = decode_message(kind, unknown.get("raw", b""))
    return {"apiVersion": api_version, "kind": kind, **obj}
