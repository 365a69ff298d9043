"""Label and field selectors with kube-apiserver's grammar and error messages.

Label selectors: `a=b`, `a==b`, `a!=b`, `a in (x,y)`, `a notin (x)`, `a`, `!a`, comma = AND.
Field selectors: `f=v`, `f==v`, `f!=v`, comma = AND, over the fields each kind supports
(`FIELDS`); an unsupported field is 400 "field label not supported: <f>" for the kinds listed
there and `"<f>" is not a known field selector: only "metadata.name", "metadata.namespace"` for
the others (apimachinery's default conversion), as a real server says.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from twin.errors import bad_request

_VALUE_RE = re.compile(r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$")
_NAME_RE = re.compile(r"^([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]$")
_PREFIX_RE = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")


@dataclass(frozen=True)
class Requirement:
    key: str
    op: str  # "=", "!=", "in", "notin", "exists", "!"
    values: tuple[str, ...] = ()

    def matches(self, labels: dict[str, str]) -> bool:
        has = self.key in labels
        if self.op == "exists":
            return has
        if self.op == "!":
            return not has
        if self.op in ("=", "in"):
            return has and labels[self.key] in self.values
        # "!=" and "notin" match objects without the label, as in Kubernetes.
        return not has or labels[self.key] not in self.values


class LabelSelector:
    def __init__(self, requirements: list[Requirement]) -> None:
        self.requirements = requirements

    def matches(self, labels: dict[str, str] | None) -> bool:
        labels = labels or {}
        return all(r.matches(labels) for r in self.requirements)

    def equality_value(self, key: str) -> str | None:
        for r in self.requirements:
            if r.key == key and r.op in ("=", "in") and len(r.values) == 1:
                return r.values[0]
        return None


_TOKEN_RE = re.compile(r"\s*(==|!=|=|!|\(|\)|,|[^\s=!(),]+)")


def _tokens(text: str) -> list[str]:
    out: list[str] = []
    pos = 0
    text = text.strip()
    while pos < len(text):
        m = _TOKEN_RE.match(text, pos)
        if m is None:  # only trailing whitespace can fail to match
            break
        out.append(m.group(1))
        pos = m.end()
    return out


def _check_key(key: str) -> None:
    name = key
    if "/" in key:
        prefix, name = key.split("/", 1)
        if not prefix or len(prefix) > 253 or not _PREFIX_RE.match(prefix):
            raise bad_request(
                f'unable to parse requirement: invalid label key "{key}": prefix part must be '
                "a lowercase RFC 1123 subdomain"
            )
    if not name or len(name) > 63 or not _NAME_RE.match(name):
        raise bad_request(
            f'unable to parse requirement: invalid label key "{key}": name part must consist '
            "of alphanumeric characters, '-', '_' or '.', and must start and end with an "
            "alphanumeric character"
        )


def _check_value(value: str) -> None:
    if len(value) > 63 or not _VALUE_RE.match(value):
        raise bad_request(
            f'unable to parse requirement: invalid label value: "{value}": a valid label must '
            "be an empty string or consist of alphanumeric characters, '-', '_' or '.', and must "
            "start and end with an alphanumeric character"
        )


_SPECIAL = {"==", "!=", "=", "!", "(", ")", ","}


def parse_label_selector(text: str | None) -> LabelSelector:
    """Parse a label selector string; raise ApiError 400 on syntax errors."""
    if not text or not text.strip():
        return LabelSelector([])
    toks = _tokens(text)
    reqs: list[Requirement] = []
    i = 0

    def peek(k: int = 0) -> str | None:
        return toks[i + k] if i + k < len(toks) else None

    while i < len(toks):
        tok = toks[i]
        if tok == "!":
            key = peek(1)
            if key is None or key in _SPECIAL:
                raise bad_request(
                    f"unable to parse requirement: found '{key or ''}', expected: identifier"
                )
            _check_key(key)
            reqs.append(Requirement(key, "!"))
            i += 2
        elif tok in _SPECIAL:
            raise bad_request(f"found '{tok}', expected: !, identifier, or 'end of string'")
        else:
            key = tok
            _check_key(key)
            nxt = peek(1)
            if nxt is None or nxt == ",":
                reqs.append(Requirement(key, "exists"))
                i += 1
            elif nxt in ("=", "==", "!="):
                value = peek(2)
                if value is None or value == ",":
                    value = ""
                    i += 2
                elif value in _SPECIAL:
                    raise bad_request(
                        f"unable to parse requirement: found '{value}', expected: identifier"
                    )
                else:
                    i += 3
                _check_value(value)
                reqs.append(Requirement(key, "!=" if nxt == "!=" else "=", (value,)))
            elif nxt in ("in", "notin"):
                if peek(2) != "(":
                    raise bad_request(
                        f"unable to parse requirement: found '{peek(2) or ''}' expected: '('"
                    )
                j = i + 3
                values: list[str] = []
                while True:
                    t = toks[j] if j < len(toks) else None
                    if t is None:
                        raise bad_request("unable to parse requirement: found '', expected: ')'")
                    if t == ")":
                        j += 1
                        break
                    if t == ",":
                        j += 1
                        continue
                    if t in _SPECIAL:
                        raise bad_request(
                            f"unable to parse requirement: found '{t}', expected: ',' or ')'"
                        )
                    _check_value(t)
                    values.append(t)
                    j += 1
                reqs.append(Requirement(key, "in" if nxt == "in" else "notin", tuple(values)))
                i = j
            else:
                raise bad_request(
                    f"unable to parse requirement: found '{nxt}', expected: "
                    "in, notin, =, ==, !=, gt, lt"
                )
        if i < len(toks):
            if toks[i] != ",":
                raise bad_request(f"found '{toks[i]}', expected: ',' or 'end of string'")
            i += 1
    return LabelSelector(reqs)


def selector_from_label_selector_object(sel: dict[str, Any] | None) -> LabelSelector | None:
    """A metav1.LabelSelector object ({matchLabels, matchExpressions}) → LabelSelector.

    None means "selects nothing" for a nil selector, as PDBs treat it; `{}` selects everything.
    """
    if sel is None:
        return None
    if not isinstance(sel, dict):
        return LabelSelector([Requirement("", "in", ())])  # malformed: selects nothing
    reqs = [Requirement(k, "=", (str(v),)) for k, v in (sel.get("matchLabels") or {}).items()]
    ops = {"In": "in", "NotIn": "notin", "Exists": "exists", "DoesNotExist": "!"}
    for expr in sel.get("matchExpressions") or []:
        op = ops.get(expr.get("operator", ""))
        if op is not None:
            reqs.append(Requirement(expr.get("key", ""), op, tuple(expr.get("values") or ())))
    return LabelSelector(reqs)


# --- field selectors ---------------------------------------------------------------------


def _path(obj: dict[str, Any], dotted: str) -> str:
    cur: Any = obj
    for part in dotted.split("."):
        if not isinstance(cur, dict):
            return ""
        cur = cur.get(part)
    if cur is None:
        return ""
    if isinstance(cur, bool):
        return "true" if cur else "false"
    return str(cur)


_META = ("metadata.name", "metadata.namespace")
_EVENT_CORE = (
    "involvedObject.kind",
    "involvedObject.namespace",
    "involvedObject.name",
    "involvedObject.uid",
    "involvedObject.apiVersion",
    "involvedObject.resourceVersion",
    "involvedObject.fieldPath",
    "reason",
    "reportingComponent",
    "source",
    "type",
)
# events.k8s.io field names → the core Event paths they are stored under.
EVENTS_V1_FIELDS = {
    "regarding.kind": "involvedObject.kind",
    "regarding.namespace": "involvedObject.namespace",
    "regarding.name": "involvedObject.name",
    "regarding.uid": "involvedObject.uid",
    "regarding.apiVersion": "involvedObject.apiVersion",
    "regarding.resourceVersion": "involvedObject.resourceVersion",
    "regarding.fieldPath": "involvedObject.fieldPath",
    "reason": "reason",
    "reportingController": "reportingComponent",
    "deprecatedSource": "source",
    "type": "type",
}

FIELDS: dict[str, tuple[str, ...]] = {
    "pods": _META
    + (
        "spec.nodeName",
        "spec.restartPolicy",
        "spec.schedulerName",
        "spec.serviceAccountName",
        "spec.hostNetwork",
        "status.phase",
        "status.podIP",
        "status.podIPs",
        "status.nominatedNodeName",
    ),
    "events": _META + _EVENT_CORE,
    "events.events.k8s.io": _META + tuple(EVENTS_V1_FIELDS),
    "nodes": _META + ("spec.unschedulable",),
    "namespaces": _META + ("status.phase",),
    "replicasets.apps": _META + ("status.replicas",),
    "jobs.batch": _META + ("status.successful",),
    "resourceslices.resource.k8s.io": _META + ("spec.nodeName", "spec.driver"),
}


def _field_value(resource_key: str, obj: dict[str, Any], name: str) -> str:
    if name == "source" and resource_key == "events":
        return _path(obj, "source.component")
    if resource_key == "events.events.k8s.io":
        if name == "deprecatedSource":
            return _path(obj, "source.component")
        name = EVENTS_V1_FIELDS.get(name, name)
    return _path(obj, name)


FieldMatcher = Callable[[dict[str, Any]], bool]


@dataclass(frozen=True)
class FieldTerm:
    field: str
    op: str  # "=" or "!="
    value: str


class FieldSelector:
    def __init__(self, resource_key: str, terms: list[FieldTerm]) -> None:
        self.resource_key = resource_key
        self.terms = terms

    def matches(self, obj: dict[str, Any]) -> bool:
        for t in self.terms:
            actual = _field_value(self.resource_key, obj, t.field)
            if (actual == t.value) != (t.op == "="):
                return False
        return True

    def equality_value(self, name: str) -> str | None:
        for t in self.terms:
            if t.field == name and t.op == "=":
                return t.value
        return None


def parse_field_selector(resource_key: str, text: str | None) -> FieldSelector:
    if not text or not text.strip():
        return FieldSelector(resource_key, [])
    supported = FIELDS.get(resource_key, _META)
    terms: list[FieldTerm] = []
    for raw in text.split(","):
        part = raw.strip()
        if not part:
            continue
        for op in ("!=", "==", "="):
            if op in part:
                name, value = part.split(op, 1)
                break
        else:
            raise bad_request(f"invalid selector: '{text}'; can't understand '{part}'")
        name = name.strip()
        if name not in supported:
            if resource_key in FIELDS:
                raise bad_request(f"field label not supported: {name}")
            # Kinds without their own field-label conversion use apimachinery's default.
            raise bad_request(
                f'"{name}" is not a known field selector: only "metadata.name", '
                '"metadata.namespace"'
            )
        terms.append(FieldTerm(name, "!=" if op == "!=" else "=", value.strip()))
    return FieldSelector(resource_key, terms)
