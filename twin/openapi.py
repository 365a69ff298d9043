"""OpenAPI v3 for every group-version the twin serves, and field validation from it.

    GET /openapi/v3                      {"paths": {"api/v1": {"serverRelativeURL":
                                          "/openapi/v3/api/v1?hash=<SHA-512>"}, ...}}
    GET /openapi/v3/api/v1[?hash=...]    one OpenAPI 3.0 document: paths + components.schemas
    GET /openapi/v3/apis/<g>/<v>

kubectl reads these documents for three things: `kubectl explain` (the schemas, found by
their `x-kubernetes-group-version-kind`), client-side `apply` (a kind's schema, else its
compiled-in types) and default validation: `--validate=strict` asks the server to validate
(`fieldValidation=Strict`) when the kind's PATCH operation lists that query parameter, and
otherwise downloads OpenAPI v2 to validate itself (the twin serves no v2, so that fallback
fails: "failed to download openapi").

The schemas are generated from the models of the official `kubernetes` Python client (the
Kubernetes API types with their documentation, required fields and JSON names), so they are
the real API's shapes, per version; a kind without a model (Cluster API's MachineDeployment)
gets an open object. The same schemas drive `fieldValidation`: Strict refuses a body with a
field the schema does not declare (400, the apiserver's "strict decoding error: unknown field
\"spec.replicaz\""), Warn answers with a `Warning` header per unknown field, Ignore (and no
parameter) skips the check. Objects declared open (arbitrary JSON such as `fieldsV1`) are not
looked into.
"""

from __future__ import annotations

import functools
import hashlib
import json
import re
import threading
import types
import typing
from datetime import datetime
from typing import Any

from twin import errors
from twin.resources import ResourceType

Schema = dict[str, Any]

META_CLASSES = {
    "V1ObjectMeta",
    "V1ListMeta",
    "V1OwnerReference",
    "V1ManagedFieldsEntry",
    "V1LabelSelector",
    "V1LabelSelectorRequirement",
    "V1Condition",
    "V1Status",
    "V1StatusDetails",
    "V1StatusCause",
    "V1DeleteOptions",
    "V1Preconditions",
}
_PREFIX = re.compile(r"^(?:(Core|Events|Resource|Storage|Discovery)?V\d+(?:alpha\d+|beta\d+)?)")
_OPEN: Schema = {"type": "object", "x-kubernetes-preserve-unknown-fields": True}
_lock = threading.Lock()


def model_name(rt: ResourceType, version: str) -> str:
    """The official client's model class for a kind at a version (V1Pod, V1beta2DeviceTaintRule)."""
    kind = rt.kind
    if rt.group == "" and kind == "Event":
        return "CoreV1Event"
    if rt.group == "events.k8s.io":
        return "EventsV1Event"
    if rt.group == "resource.k8s.io" and version == "v1" and kind == "ResourceClaim":
        return "ResourceV1ResourceClaim"
    return f"{version[0].upper()}{version[1:]}{kind}"


def _client_models() -> Any:
    import kubernetes.client as models  # the API's types; imported on first use (slow)

    return models


def _short(cls_name: str) -> str:
    return _PREFIX.sub("", cls_name) or cls_name


def _version_of(cls_name: str) -> str:
    m = re.match(
        r"^(?:Core|Events|Resource|Storage|Discovery)?(V\d+(?:alpha\d+|beta\d+)?)", cls_name
    )
    return m.group(1).lower() if m else "v1"


class _Builder:
    """Walks client models into components.schemas of one document."""

    def __init__(self, package: str) -> None:
        self.package = package  # "core", "apps", "resource"...
        self.schemas: dict[str, Schema] = {}

    def key(self, cls_name: str) -> str:
        if cls_name in META_CLASSES:
            return f"io.k8s.apimachinery.pkg.apis.meta.v1.{_short(cls_name)}"
        return f"io.k8s.api.{self.package}.{_version_of(cls_name)}.{_short(cls_name)}"

    def model(self, cls: Any, gvk: dict[str, str] | None = None) -> str:
        name = cls.__name__
        key = self.key(name)
        if key in self.schemas:
            return key
        doc = (cls.__doc__ or "").split("\n\n    Attributes:")[0].strip()
        schema: Schema = {"type": "object", "description": " ".join(doc.split())}
        self.schemas[key] = schema
        props: dict[str, Schema] = {}
        required: list[str] = []
        for attr, field in cls.model_fields.items():
            json_name = field.serialization_alias or field.alias or attr
            if attr in cls.model_fields and json_name == attr and "_" in attr:
                json_name = _camel(attr)
            prop = self.annotation(field.annotation)
            if field.description:
                prop["description"] = field.description
            props[json_name] = prop
            if field.is_required() and gvk is None:
                required.append(json_name)
        schema["properties"] = props
        if required:
            schema["required"] = sorted(required)
        if gvk is not None:
            schema["x-kubernetes-group-version-kind"] = [gvk]
        return key

    def annotation(self, ann: Any) -> Schema:
        origin = typing.get_origin(ann)
        args = [a for a in typing.get_args(ann) if a is not type(None)]
        if origin is typing.Annotated:
            return self.annotation(args[0])
        if origin in (typing.Union, types.UnionType):
            kinds = {
                typing.get_args(a)[0] if typing.get_origin(a) is typing.Annotated else a
                for a in args
            }
            if kinds == {int, str}:
                return {
                    "type": "string",
                    "format": "int-or-string",
                    "x-kubernetes-int-or-string": True,
                }
            return self.annotation(args[0]) if len(args) == 1 else dict(_OPEN)
        if origin in (list, typing.List):  # noqa: UP006
            return {"type": "array", "items": self.annotation(args[0]) if args else dict(_OPEN)}
        if origin in (dict, typing.Dict):  # noqa: UP006
            value = args[1] if len(args) > 1 else Any
            if value is Any or value is object:
                return dict(_OPEN)
            return {"type": "object", "additionalProperties": self.annotation(value)}
        if ann is str:
            return {"type": "string"}
        if ann is bool:
            return {"type": "boolean"}
        if ann is int:
            return {"type": "integer", "format": "int64"}
        if ann is float:
            return {"type": "number", "format": "double"}
        if ann is datetime:
            return {"type": "string", "format": "date-time"}
        if isinstance(ann, type) and hasattr(ann, "model_fields"):
            return {"allOf": [{"$ref": f"#/components/schemas/{self.model(ann)}"}], "default": {}}
        return dict(_OPEN)


def _camel(snake: str) -> str:
    head, *rest = snake.split("_")
    return head + "".join(p.capitalize() for p in rest)


_QUERY = {
    "dryRun": "When present, indicates that modifications should not be persisted.",
    "fieldManager": "A name associated with the actor or entity that is making these changes.",
    "fieldValidation": "How the server treats unknown or duplicate fields in the request body: "
    "Ignore, Warn or Strict.",
    "force": "Force is going to force Apply requests (re-acquire conflicting fields).",
}


def _params(*names: str) -> list[Schema]:
    return [
        {
            "name": n,
            "in": "query",
            "description": _QUERY[n],
            "schema": {"type": "boolean" if n == "force" else "string", "uniqueItems": True},
        }
        for n in names
    ]


def _ref(key: str) -> Schema:
    return {"content": {"application/json": {"schema": {"$ref": f"#/components/schemas/{key}"}}}}


def _operations(rt: ResourceType, version: str, key: str | None, prefix: str) -> dict[str, Schema]:
    gvk = {"group": rt.group, "version": version, "kind": rt.kind}
    base = (
        f"{prefix}/namespaces/{{namespace}}/{rt.plural}"
        if rt.namespaced
        else f"{prefix}/{rt.plural}"
    )
    body = _ref(key) if key else {"content": {"application/json": {"schema": dict(_OPEN)}}}
    answer = {"200": {"description": "OK", **body}, "401": {"description": "Unauthorized"}}

    def op(verb: str, action: str, *params: str, request: bool = False) -> Schema:
        out: Schema = {
            "operationId": f"{verb}{rt.kind}",
            "x-kubernetes-action": action,
            "x-kubernetes-group-version-kind": gvk,
            "parameters": _params(*params),
            "responses": answer,
        }
        if request:
            out["requestBody"] = body
        return out

    paths: dict[str, Schema] = {}
    if rt.verbs == ["create"]:
        paths[base] = {
            "post": op("create", "post", "dryRun", "fieldManager", "fieldValidation", request=True)
        }
        return paths
    write = ("dryRun", "fieldManager", "fieldValidation")
    paths[base] = {
        "get": op("list", "list"),
        "post": op("create", "post", *write, request=True),
        "delete": op("deletecollection", "deletecollection", "dryRun"),
    }
    item = {
        "get": op("read", "get"),
        "put": op("replace", "put", *write, request=True),
        "patch": op("patch", "patch", *write, "force", request=True),
        "delete": op("delete", "delete", "dryRun"),
    }
    paths[base + "/{name}"] = item
    for sub in rt.subresources:
        if sub in ("status", "scale"):
            paths[base + "/{name}/" + sub] = {
                "get": op("read", "get"),
                "put": op("replace", "put", *write, request=True),
                "patch": op("patch", "patch", *write, "force", request=True),
            }
    return paths


def _package(group: str) -> str:
    if not group:
        return "core"
    return group.split(".")[0]


@functools.lru_cache(maxsize=64)
def _document(group: str, version: str, keys: tuple[str, ...], git_version: str) -> bytes:
    from twin.resources import BY_KEY

    models = _client_models()
    builder = _Builder(_package(group))
    paths: dict[str, Schema] = {}
    prefix = f"/apis/{group}/{version}" if group else "/api/v1"
    for rkey in keys:
        rt = BY_KEY[rkey]
        cls = getattr(models, model_name(rt, version), None)
        key = None
        if cls is not None and hasattr(cls, "model_fields"):
            key = builder.model(cls, {"group": rt.group, "version": version, "kind": rt.kind})
        paths.update(_operations(rt, version, key, prefix))
    doc = {
        "openapi": "3.0.0",
        "info": {"title": "Kubernetes", "version": git_version},
        "paths": paths,
        "components": {"schemas": builder.schemas},
    }
    return json.dumps(doc, separators=(",", ":"), sort_keys=True).encode()


def _served(profile: Any) -> list[tuple[str, str, tuple[str, ...]]]:
    out = []
    for (group, version), keys in sorted(profile.served.items()):
        if keys:
            out.append((group, version, tuple(sorted(keys))))
    return out


def document(profile: Any, group: str, version: str) -> bytes | None:
    """The OpenAPI document of one served group-version (JSON bytes), or None."""
    keys = profile.served.get((group, version))
    if not keys:
        return None
    with _lock:  # the first build imports the client models; one thread at a time
        return _document(group, version, tuple(sorted(keys)), profile.version_info()["gitVersion"])


def _path(group: str, version: str) -> str:
    return f"apis/{group}/{version}" if group else "api/v1"


def digest(profile: Any, group: str, version: str) -> str:
    """The document's pin: a SHA-512 of what determines it (served kinds, release, client
    models), so the index needs no document built (kubectl fetches only the ones it uses)."""
    import kubernetes

    keys = sorted(profile.served.get((group, version)) or ())
    basis = f"{group}/{version}:{','.join(keys)}:{profile.version_info()['gitVersion']}"
    return hashlib.sha512(f"{basis}:{kubernetes.__version__}".encode()).hexdigest().upper()


def root(profile: Any) -> dict[str, Any]:
    """The /openapi/v3 index: one hash-pinned URL per served group-version."""
    paths: dict[str, Any] = {}
    for group, version, _keys in _served(profile):
        path = _path(group, version)
        pin = digest(profile, group, version)
        paths[path] = {"serverRelativeURL": f"/openapi/v3/{path}?hash={pin}"}
    return {"paths": dict(sorted(paths.items()))}


def lookup(profile: Any, parts: list[str]) -> tuple[bytes, str] | None:
    """/openapi/v3/<parts> → (document, its pin), or None for an unknown path."""
    if parts == ["api", "v1"]:
        group, version = "", "v1"
    elif len(parts) == 3 and parts[0] == "apis":
        group, version = parts[1], parts[2]
    else:
        return None
    doc = document(profile, group, version)
    return None if doc is None else (doc, digest(profile, group, version))


# ---- field validation ----------------------------------------------------------------------


def _schemas(profile: Any, rt: ResourceType, version: str) -> tuple[dict[str, Schema], str] | None:
    doc = document(profile, rt.group, version)
    if doc is None:
        return None
    schemas = _parsed(doc)
    for key, schema in schemas.items():
        for gvk in schema.get("x-kubernetes-group-version-kind") or []:
            if gvk.get("kind") == rt.kind and gvk.get("group") == rt.group:
                return schemas, key
    return None


@functools.lru_cache(maxsize=64)
def _parsed(doc: bytes) -> dict[str, Schema]:
    return dict(json.loads(doc)["components"]["schemas"])


def unknown_fields(profile: Any, rt: ResourceType, version: str, obj: Any) -> list[str]:
    """Paths (`spec.replicaz`, `spec.containers[0].imag`) the kind's schema does not declare."""
    found = _schemas(profile, rt, version)
    if found is None or not isinstance(obj, dict):
        return []
    schemas, key = found
    out: list[str] = []
    _walk(schemas, schemas[key], obj, "", out)
    return out


def _resolve(schemas: dict[str, Schema], schema: Schema) -> Schema:
    while "allOf" in schema and schema["allOf"]:
        ref = schema["allOf"][0].get("$ref", "")
        schema = schemas.get(ref.rsplit("/", 1)[-1], _OPEN)
    return schema


def _walk(
    schemas: dict[str, Schema], schema: Schema, value: Any, path: str, out: list[str]
) -> None:
    schema = _resolve(schemas, schema)
    if schema.get("x-kubernetes-preserve-unknown-fields") or schema.get(
        "x-kubernetes-int-or-string"
    ):
        return
    if isinstance(value, dict):
        props = schema.get("properties")
        extra = schema.get("additionalProperties")
        for k, v in value.items():
            if k.startswith("$"):  # strategic-merge-patch directives
                continue
            sub = f"{path}.{k}" if path else k
            if props is not None and k in props:
                _walk(schemas, props[k], v, sub, out)
            elif isinstance(extra, dict):
                _walk(schemas, extra, v, sub, out)
            elif props is not None and k not in ("apiVersion", "kind"):
                out.append(sub)
    elif isinstance(value, list) and isinstance(schema.get("items"), dict):
        for i, item in enumerate(value):
            _walk(schemas, schema["items"], item, f"{path}[{i}]", out)


def validate(profile: Any, rt: ResourceType, version: str, obj: Any, mode: str | None) -> list[str]:
    """Apply `fieldValidation`: raise 400 for Strict, return Warning texts for Warn."""
    if mode in (None, "", "Ignore"):
        return []
    if mode not in ("Strict", "Warn"):
        raise errors.bad_request(
            f'fieldValidation must be one of "Ignore", "Warn" or "Strict", not {mode!r}'
        )
    unknown = unknown_fields(profile, rt, version, obj)
    if not unknown:
        return []
    if mode == "Strict":
        listed = ", ".join(f'unknown field "{u}"' for u in unknown)
        raise errors.bad_request(
            f'{rt.kind} in version "{version}" cannot be handled as a {rt.kind}: '
            f"strict decoding error: {listed}"
        )
    return [f'299 - "unknown field \\"{u}\\""' for u in unknown]
