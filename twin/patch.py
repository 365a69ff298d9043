"""PATCH semantics: JSON merge patch, strategic merge patch, JSON patch, server-side apply.

- merge (application/merge-patch+json): RFC 7386; `null` deletes.
- strategic (application/strategic-merge-patch+json): merge patch where lists with a known
  merge key (containers by name, conditions by type, ...) merge element-wise; `$patch: delete`
  / `$patch: replace` and `$deleteFromPrimitiveList/<field>` directives; finalizers merge as a set.
- json (application/json-patch+json): RFC 6902 add/remove/replace/move/copy/test. A failed
  `test` is 422 Invalid with the apiserver's generic message and no causes.
- apply (application/apply-patch+yaml): field ownership per manager, kept in
  metadata.managedFields (FieldsV1). Changing a field another manager owns, with a different
  value, is 409 Conflict with FieldManagerConflict causes unless force=true, which moves the
  ownership. Fields a manager stops applying are removed when nobody else owns them.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from datetime import datetime
from typing import Any

from twin import errors
from twin.resources import CUSTOM_GROUPS, ResourceType

# list field name → merge key, for strategic merge patch and apply (core and DRA kinds).
MERGE_KEYS: dict[str, str] = {
    "containers": "name",
    "initContainers": "name",
    "ephemeralContainers": "name",
    "volumes": "name",
    "env": "name",
    "volumeMounts": "mountPath",
    "ports": "containerPort",
    "conditions": "type",
    "ownerReferences": "uid",
    "resourceClaims": "name",
    "resourceClaimStatuses": "name",
    "containerStatuses": "name",
    "initContainerStatuses": "name",
    "allocatedResourcesStatus": "name",
    "imagePullSecrets": "name",
    "addresses": "type",
    "claims": "name",
}
_SET_LISTS = {"finalizers"}

_DELETE = object()


def _strategic_merge(target: Any, patch: Any, field: str = "") -> Any:
    if not isinstance(patch, dict):
        return patch
    if patch.get("$patch") == "replace":
        return {k: v for k, v in patch.items() if k != "$patch"}
    if patch.get("$patch") == "delete":
        return _DELETE
    result = dict(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if key.startswith("$setElementOrder/") or key == "$retainKeys":
            continue
        if key.startswith("$deleteFromPrimitiveList/"):
            name = key.split("/", 1)[1]
            result[name] = [v for v in result.get(name) or [] if v not in (value or [])]
            continue
        if value is None:
            result.pop(key, None)
        elif isinstance(value, list) and key in MERGE_KEYS and isinstance(result.get(key), list):
            result[key] = _merge_list_by_key(result[key], value, MERGE_KEYS[key])
        elif isinstance(value, list) and key in _SET_LISTS and isinstance(result.get(key), list):
            merged = list(result[key])
            merged += [v for v in value if v not in merged]
            result[key] = merged
        elif isinstance(value, dict):
            merged_value = _strategic_merge(result.get(key), value, key)
            if merged_value is _DELETE:
                result.pop(key, None)
            else:
                result[key] = merged_value
        else:
            result[key] = value
    return result


def _merge_list_by_key(current: list[Any], patch: list[Any], key: str) -> list[Any]:
    out = list(current)
    if any(isinstance(p, dict) and p.get("$patch") == "replace" for p in patch):
        return [p for p in patch if not (isinstance(p, dict) and "$patch" in p)]
    for item in patch:
        if not isinstance(item, dict) or key not in item:
            out.append(item)
            continue
        idx = next(
            (i for i, c in enumerate(out) if isinstance(c, dict) and c.get(key) == item[key]), None
        )
        if item.get("$patch") == "delete":
            if idx is not None:
                out.pop(idx)
            continue
        if idx is None:
            out.append({k: v for k, v in item.items() if v is not None})
        else:
            out[idx] = _strategic_merge(out[idx], item)
    return out


def merge_patch(target: Any, patch: Any) -> Any:
    """RFC 7386 JSON merge patch."""
    if not isinstance(patch, dict):
        return patch
    result = dict(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if value is None:
            result.pop(key, None)
        else:
            result[key] = merge_patch(result.get(key), value)
    return result


def _pointer(path: str) -> list[str]:
    if path == "":
        return []
    if not path.startswith("/"):
        raise _json_patch_error(f'invalid JSON pointer "{path}"')
    return [p.replace("~1", "/").replace("~0", "~") for p in path[1:].split("/")]


def _json_patch_error(message: str) -> errors.ApiError:
    return errors.ApiError(422, "Invalid", message, {})


def _container(doc: Any, parts: list[str], path: str) -> tuple[Any, str]:
    cur = doc
    for part in parts[:-1]:
        if isinstance(cur, dict) and part in cur:
            cur = cur[part]
        elif isinstance(cur, list) and part.isdigit() and int(part) < len(cur):
            cur = cur[int(part)]
        else:
            raise _json_patch_error(
                f'jsonpatch operation does not apply: doc is missing path: "{path}": missing value'
            )
    return cur, parts[-1]


def _get(doc: Any, path: str) -> Any:
    parts = _pointer(path)
    if not parts:
        return doc
    parent, last = _container(doc, parts, path)
    if isinstance(parent, dict) and last in parent:
        return parent[last]
    if isinstance(parent, list) and last.isdigit() and int(last) < len(parent):
        return parent[int(last)]
    raise _json_patch_error(
        f'jsonpatch operation does not apply: doc is missing path: "{path}": missing value'
    )


def _remove(doc: Any, path: str) -> Any:
    parts = _pointer(path)
    parent, last = _container(doc, parts, path)
    if isinstance(parent, dict) and last in parent:
        return parent.pop(last)
    if isinstance(parent, list) and last.isdigit() and int(last) < len(parent):
        return parent.pop(int(last))
    raise _json_patch_error(
        f'jsonpatch remove operation does not apply: doc is missing path: "{path}": missing value'
    )


def _add(doc: Any, path: str, value: Any, replace: bool = False) -> Any:
    parts = _pointer(path)
    if not parts:
        return value
    parent, last = _container(doc, parts, path)
    if isinstance(parent, dict):
        if replace and last not in parent:
            raise _json_patch_error(
                "jsonpatch replace operation does not apply: doc is missing key: " + path
            )
        parent[last] = value
    elif isinstance(parent, list):
        if last == "-" and not replace:
            parent.append(value)
        elif last.isdigit() and int(last) <= len(parent) - (1 if replace else 0):
            if replace:
                parent[int(last)] = value
            else:
                parent.insert(int(last), value)
        else:
            raise _json_patch_error(
                f'jsonpatch operation does not apply: index out of range: "{path}"'
            )
    else:
        raise _json_patch_error(f'jsonpatch operation does not apply: "{path}"')
    return doc


def json_patch(doc: Any, ops: Any) -> Any:
    if not isinstance(ops, list):
        raise errors.bad_request("json patch must be a list of operations")
    for op in ops:
        if not isinstance(op, dict) or "op" not in op or "path" not in op:
            raise errors.bad_request("json patch operations need 'op' and 'path'")
        kind, path = op["op"], op["path"]
        if kind == "add":
            doc = _add(doc, path, json.loads(json.dumps(op.get("value"))))
        elif kind == "remove":
            _remove(doc, path)
        elif kind == "replace":
            doc = _add(doc, path, json.loads(json.dumps(op.get("value"))), replace=True)
        elif kind == "move":
            value = _remove(doc, op.get("from", ""))
            doc = _add(doc, path, value)
        elif kind == "copy":
            doc = _add(doc, path, json.loads(json.dumps(_get(doc, op.get("from", "")))))
        elif kind == "test":
            try:
                actual = _get(doc, path)
            except errors.ApiError:
                actual = _DELETE
            if actual != op.get("value"):
                raise errors.ApiError(
                    422,
                    "Invalid",
                    "the server rejected our request due to an error in our request",
                    {},
                )
        else:
            raise errors.bad_request(f'unexpected json patch operation "{kind}"')
    return doc


def apply_patch(rt: ResourceType, current: dict[str, Any], body: Any, patch_type: str) -> Any:
    if patch_type == "merge":
        return merge_patch(current, body)
    if patch_type == "strategic":
        if rt.group in CUSTOM_GROUPS:  # custom resources have no strategic-merge schema
            raise errors.ApiError(
                415,
                "UnsupportedMediaType",
                "strategic merge patch is not supported for custom resources; use merge patch",
                {},
            )
        out = _strategic_merge(current, body)
        return current if out is _DELETE else out
    if patch_type == "json":
        return json_patch(current, body)
    raise errors.ApiError(415, "UnsupportedMediaType", "415: Unsupported Media Type", {})


# ---- managed fields (FieldsV1) ------------------------------------------------------------

Path = tuple[str, ...]
_META_TRACKED = ("labels", "annotations", "finalizers", "ownerReferences")


def _element_key(field: str, item: dict[str, Any]) -> str | None:
    key = MERGE_KEYS.get(field)
    if key is None:
        for candidate in ("name", "type", "uid", "key"):
            if candidate in item:
                key = candidate
                break
    if key is None or key not in item:
        return None
    return "k:" + json.dumps({key: item[key]}, separators=(",", ":"))


def leaf_paths(value: Any, prefix: Path = (), field: str = "") -> Iterator[Path]:
    if isinstance(value, dict) and value:
        for k, v in value.items():
            yield from leaf_paths(v, prefix + ("f:" + k,), k)
    elif (
        isinstance(value, list)
        and value
        and all(isinstance(e, dict) and _element_key(field, e) for e in value)
    ):
        for e in value:
            yield from leaf_paths(e, prefix + (str(_element_key(field, e)),), "")
    elif isinstance(value, list) and value and field in _SET_LISTS:
        for e in value:
            yield prefix + ("v:" + json.dumps(e),)
    else:
        yield prefix


def object_paths(obj: dict[str, Any], subresource: str | None) -> set[Path]:
    paths: set[Path] = set()
    for top, value in obj.items():
        if top in ("apiVersion", "kind"):
            continue
        if top == "metadata":
            for k in _META_TRACKED:
                if k in (value or {}):
                    paths.update(leaf_paths(value[k], ("f:metadata", "f:" + k), k))
            continue
        if (top == "status") != (subresource == "status"):
            continue
        paths.update(leaf_paths(value, ("f:" + top,), top))
    return paths


def _value_at(obj: Any, path: Path) -> Any:
    cur = obj
    for part in path:
        if part.startswith("f:"):
            if not isinstance(cur, dict) or part[2:] not in cur:
                return _DELETE
            cur = cur[part[2:]]
        elif part.startswith("k:"):
            want = json.loads(part[2:])
            if not isinstance(cur, list):
                return _DELETE
            match = [
                e
                for e in cur
                if isinstance(e, dict) and all(e.get(k) == v for k, v in want.items())
            ]
            if not match:
                return _DELETE
            cur = match[0]
        elif part.startswith("v:"):
            return (
                json.loads(part[2:])
                if isinstance(cur, list) and json.loads(part[2:]) in cur
                else _DELETE
            )
        else:
            return _DELETE
    return cur


def _delete_at(obj: Any, path: Path) -> None:
    parent = _value_at(obj, path[:-1]) if len(path) > 1 else obj
    last = path[-1]
    if last.startswith("f:") and isinstance(parent, dict):
        parent.pop(last[2:], None)
    elif last.startswith("k:") and isinstance(parent, list):
        want = json.loads(last[2:])
        parent[:] = [
            e
            for e in parent
            if not (isinstance(e, dict) and all(e.get(k) == v for k, v in want.items()))
        ]
    elif last.startswith("v:") and isinstance(parent, list):
        value = json.loads(last[2:])
        if value in parent:
            parent.remove(value)


def to_fields_v1(paths: set[Path]) -> dict[str, Any]:
    root: dict[str, Any] = {}
    for path in sorted(paths):
        node = root
        for i, part in enumerate(path):
            node = node.setdefault(part, {})
            if part.startswith("k:") and i < len(path) - 1:
                node.setdefault(".", {})
    return root


def from_fields_v1(fields: Any, prefix: Path = ()) -> set[Path]:
    out: set[Path] = set()
    if not isinstance(fields, dict):
        return out
    for k, v in fields.items():
        if k == ".":
            continue
        if isinstance(v, dict) and any(key != "." for key in v):
            out |= from_fields_v1(v, prefix + (k,))
        else:
            out.add(prefix + (k,))
    return out


def _entries(obj: dict[str, Any]) -> list[dict[str, Any]]:
    return list(obj.get("metadata", {}).get("managedFields") or [])


def _set_entries(obj: dict[str, Any], entries: list[dict[str, Any]]) -> None:
    entries = [e for e in entries if e.get("fieldsV1")]
    if entries:
        obj["metadata"]["managedFields"] = entries
    else:
        obj["metadata"].pop("managedFields", None)


def _entry(
    manager: str, operation: str, version: str, now: datetime, paths: set[Path], sub: str | None
) -> dict[str, Any]:
    e: dict[str, Any] = {
        "manager": manager,
        "operation": operation,
        "apiVersion": version,
        "time": now.strftime("%Y-%m-%dT%H:%M:%SZ"),
        "fieldsType": "FieldsV1",
        "fieldsV1": to_fields_v1(paths),
    }
    if sub:
        e["subresource"] = sub
    return e


def record_update(
    new: dict[str, Any],
    old: dict[str, Any] | None,
    manager: str,
    operation: str,
    subresource: str | None,
    version: str,
    now: datetime,
) -> None:
    """An Update (create/PUT/PATCH) by `manager`: it takes ownership of the fields it changed."""
    new_paths = object_paths(new, subresource)
    if old is None:
        changed = new_paths
        entries: list[dict[str, Any]] = []
    else:
        changed = {p for p in new_paths if _value_at(new, p) != _value_at(old, p)}
        entries = _entries(old)
    if not changed and old is not None:
        _set_entries(new, entries)
        return
    mine: set[Path] = set()
    kept: list[dict[str, Any]] = []
    for e in entries:
        paths = from_fields_v1(e.get("fieldsV1"))
        if (
            e.get("manager") == manager
            and e.get("operation") == "Update"
            and e.get("subresource") == subresource
        ):
            mine = paths
            continue
        remaining = paths - changed
        if remaining != paths:
            e = dict(e, fieldsV1=to_fields_v1(remaining))
        kept.append(e)
    mine = {p for p in mine | changed if _value_at(new, p) is not _DELETE}
    kept.append(_entry(manager, operation, version, now, mine, subresource))
    _set_entries(new, kept)


def record_apply(
    obj: dict[str, Any],
    current: dict[str, Any] | None,
    body: dict[str, Any],
    manager: str,
    subresource: str | None,
    version: str,
    now: datetime,
) -> None:
    """Set `manager`'s Apply entry to exactly the fields of the applied configuration."""
    applied = object_paths(body, subresource)
    entries = [
        e
        for e in _entries(obj)
        if not (
            e.get("manager") == manager
            and e.get("operation") == "Apply"
            and e.get("subresource") == subresource
        )
    ]
    entries.append(_entry(manager, "Apply", version, now, applied, subresource))
    _set_entries(obj, entries)


def apply_create(
    rt: ResourceType, body: dict[str, Any], name: str, namespace: str | None
) -> dict[str, Any]:
    obj = json.loads(json.dumps(body))
    meta = obj.setdefault("metadata", {})
    if meta.get("name") and meta["name"] != name:
        raise errors.bad_request("the name of the object does not match the name on the URL")
    meta["name"] = name
    if rt.namespaced and namespace:
        meta.setdefault("namespace", namespace)
    return obj


def _apply_merge_values(target: Any, patch: Any, field: str = "") -> Any:
    if isinstance(patch, dict) and isinstance(target, dict):
        out = dict(target)
        for k, v in patch.items():
            out[k] = _apply_merge_values(target.get(k), v, k)
        return out
    if (
        isinstance(patch, list)
        and isinstance(target, list)
        and patch
        and all(isinstance(e, dict) and _element_key(field, e) for e in patch)
    ):
        out_list = list(target)
        for item in patch:
            key = _element_key(field, item)
            idx = next(
                (
                    i
                    for i, c in enumerate(out_list)
                    if isinstance(c, dict) and _element_key(field, c) == key
                ),
                None,
            )
            if idx is None:
                out_list.append(item)
            else:
                out_list[idx] = _apply_merge_values(out_list[idx], item)
        return out_list
    if isinstance(patch, list) and isinstance(target, list) and field in _SET_LISTS:
        return list(target) + [v for v in patch if v not in target]
    return patch


def apply_merge(
    rt: ResourceType,
    current: dict[str, Any],
    body: dict[str, Any],
    manager: str,
    force: bool,
    subresource: str | None,
) -> dict[str, Any]:
    """Merge an applied configuration into `current`, checking ownership conflicts."""
    if not isinstance(body, dict):
        raise errors.bad_request("apply patch body must be an object")
    bmeta = body.get("metadata") or {}
    if bmeta.get("name") and bmeta["name"] != current["metadata"]["name"]:
        raise errors.bad_request("the name of the object does not match the name on the URL")
    applied = object_paths(body, subresource)
    entries = _entries(current)
    conflicts: list[tuple[str, Path]] = []
    previously_mine: set[Path] = set()
    others: set[Path] = set()
    for e in entries:
        paths = from_fields_v1(e.get("fieldsV1"))
        if (e.get("subresource") == "status") != (subresource == "status"):
            continue
        if e.get("manager") == manager and e.get("operation") == "Apply":
            previously_mine = paths
            continue
        others |= paths
        for p in sorted(paths & applied):
            if _value_at(body, p) != _value_at(current, p):
                conflicts.append((str(e.get("manager")), p))
    if conflicts and not force:
        causes = [
            {
                "reason": "FieldManagerConflict",
                "message": f'conflict with "{m}"',
                "field": _dotted(p),
            }
            for m, p in conflicts
        ]
        listing = ", ".join(f'conflict with "{m}": {_dotted(p)}' for m, p in conflicts)
        n = len(conflicts)
        raise errors.ApiError(
            409,
            "Conflict",
            f"Apply failed with {n} conflict{'s' if n > 1 else ''}: {listing}",
            {"causes": causes},
        )
    merged = dict(current)
    for key, value in body.items():
        if key in ("apiVersion", "kind"):
            continue
        if key == "metadata":
            meta = dict(merged["metadata"])
            for mk in _META_TRACKED:
                if mk in value:
                    meta[mk] = _apply_merge_values(meta.get(mk), value[mk], mk)
            merged["metadata"] = meta
            continue
        if (key == "status") != (subresource == "status"):
            continue
        merged[key] = _apply_merge_values(merged.get(key), value, key)
    merged = json.loads(json.dumps(merged))
    # Fields this manager applied before, no longer applies, and nobody else owns: removed.
    for p in sorted(previously_mine - applied - others, key=len, reverse=True):
        _delete_at(merged, p)
    if force and conflicts:
        taken = {p for _, p in conflicts}
        new_entries = []
        for e in entries:
            if e.get("manager") != manager:
                paths = from_fields_v1(e.get("fieldsV1"))
                if paths & taken:
                    e = dict(e, fieldsV1=to_fields_v1(paths - taken))
            new_entries.append(e)
        _set_entries(merged, new_entries)
    return merged


def _dotted(path: Path) -> str:
    out = ""
    for part in path:
        if part.startswith("f:"):
            out += "." + part[2:]
        elif part.startswith("k:"):
            out += (
                "["
                + ",".join(f"{k}={json.dumps(v)}" for k, v in json.loads(part[2:]).items())
                + "]"
            )
        else:
            out += "[" + part[2:] + "]"
    return out
