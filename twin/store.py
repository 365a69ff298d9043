"""In-memory object store with Kubernetes API semantics: the twin's etcd + registry.

Everything that changes cluster state goes through a `Store`: the HTTP server, the seeding code,
and the controllers that run inside the twin (scheduler, kubelet stand-in, ...). It is
thread-safe: one re-entrant lock serialises writes, and reads return deep copies.

Resources are named like kubectl does: `pods`, `nodes`, `deployments.apps`,
`resourceclaims.resource.k8s.io`, `machinedeployments.cluster.x-k8s.io` (a bare plural or Kind
also resolves when unambiguous). Core `events` hold Event objects in core/v1 form; the server
translates events.k8s.io/v1 on the way in and out.

Python API (stable; controllers build on it)::

    store.get(res, name, namespace=None) -> dict               # 404 ApiError when missing
    store.try_get(res, name, namespace=None) -> dict | None
    store.list(res, namespace=None, label_selector=None, field_selector=None,
               limit=None, continue_token=None) -> ListResult  # .items, .resource_version
    store.create(res, obj, namespace=None, dry_run=False, manager=None) -> dict
    store.update(res, obj, subresource=None, dry_run=False, manager=None) -> dict
    store.update_status(res, obj, ...) -> dict                 # update(subresource="status")
    store.patch(res, name, body, namespace=None, patch_type="merge"|"strategic"|"json",
                subresource=None, manager=None, dry_run=False) -> dict
    store.apply(res, name, body, namespace=None, manager=..., force=False, ...) -> (dict, created)
    store.mutate(res, name, fn, namespace=None, subresource=None) -> dict
        # read-modify-write under the lock: fn(obj) edits obj in place (or returns a new one)
    store.delete(res, name, namespace=None, grace_period_seconds=None,
                 propagation_policy=None, preconditions=None, dry_run=False) -> DeleteResult
    store.delete_collection(res, namespace=None, label_selector=None, field_selector=None)
    store.watch(res=None, namespace=None, label_selector=None, field_selector=None,
                resource_version=None) -> Watch     # iterate, .get(timeout), .close()
    store.watch_async(res=None, ...) -> AsyncWatch   # `async for event in w`, from a running loop
    store.subscribe(callback, resources=None) -> unsubscribe
        # callback(StoreEvent) runs synchronously under the store lock, in commit order;
        # it must be quick, must not block and must not mutate event.object.
    store.dependents(owner_uid) -> list[(res, namespace, name)]
    store.get_by_uid(uid) -> dict | None
    store.resource_version -> int  (global, monotonic; every write bumps it)

Create ignores a client-sent `status` for kinds whose status belongs to a subresource (pods,
workloads, PDBs, ResourceClaims, DeviceTaintRules): write it afterwards with update_status /
mutate(subresource="status"). Nodes, namespaces and MachineDeployments keep theirs.
Defaults and validation (twin/validation.py) apply to Python writes too (422 ApiError).

Semantics (as kube-apiserver): `metadata.resourceVersion` on update/patch bodies is an
optimistic-concurrency precondition (409 Conflict when stale); create of an existing name is
409 AlreadyExists; `generateName` gets a 5-character random suffix; generation bumps when
anything outside metadata/status changes; writes to the main resource keep `status` for kinds
with a status subresource and status writes keep everything else. Deleting a pod bound to a
node (spec.nodeName set) with a grace period > 0 only sets `deletionTimestamp` (now + grace,
default spec.terminationGracePeriodSeconds or 30 s) and `deletionGracePeriodSeconds`: the
kubelet stand-in finishes it with `grace_period_seconds=0`. Unbound pods go at once (MODIFIED
then DELETED, as a real watch shows). Objects with finalizers stay until the last finalizer is
removed. When an object is removed its dependents (ownerReferences) are deleted too
(background propagation) or orphaned (`propagation_policy="Orphan"`). Deleting a namespace
removes everything in it at once (no Terminating phase). `Foreground` propagation is treated
as `Background`.

Watches see every event after `resource_version` (exclusive); a resource version older than the
retained history gives 410 Expired ("too old resource version"). `compact()` drops history (the
twin calls it after seeding, like an apiserver whose watch cache starts after a restart).
"""

from __future__ import annotations

import asyncio
import base64
import bisect
import builtins
import itertools
import json
import logging
import queue
import random
import threading
import uuid
from collections import deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any, Protocol

from twin import errors, podsecurity
from twin.resources import CATALOGUE, ResourceType, resolve
from twin.selectors import (
    FieldSelector,
    LabelSelector,
    parse_field_selector,
    parse_label_selector,
)
from twin.validation import check_types

log = logging.getLogger(__name__)

ADDED, MODIFIED, DELETED = "ADDED", "MODIFIED", "DELETED"
DEFAULT_HISTORY = 20_000  # events kept per resource for watch resume
_SUFFIX_CHARS = "bcdfghjklmnpqrstvwxz2456789"  # apimachinery's generateName alphabet


class Clock(Protocol):
    """What the store needs from a clock (twin/clock.py provides a time-scaled one)."""

    def now(self) -> datetime: ...


class SystemClock:
    def now(self) -> datetime:
        return datetime.now(UTC)

    def sleep(self, seconds: float) -> None:
        threading.Event().wait(seconds)


def format_time(t: datetime) -> str:
    return t.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def format_micro_time(t: datetime) -> str:
    return t.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def parse_time(text: str) -> datetime:
    return datetime.fromisoformat(text.replace("Z", "+00:00"))


class Admission(Protocol):
    """Defaulting + validation hook (twin/validation.py). Mutates `new` or raises 422."""

    def admit(
        self,
        op: str,
        rt: ResourceType,
        new: dict[str, Any],
        old: dict[str, Any] | None,
        subresource: str | None,
        now: datetime,
    ) -> None: ...


@dataclass(frozen=True)
class StoreEvent:
    type: str  # ADDED | MODIFIED | DELETED
    resource: str  # storage key, e.g. "pods", "deployments.apps"
    object: dict[str, Any]  # shared snapshot: never mutate
    old: dict[str, Any] | None
    resource_version: int


@dataclass
class ListResult:
    items: list[dict[str, Any]]
    resource_version: int
    continue_token: str | None = None
    remaining_item_count: int | None = None


@dataclass
class DeleteResult:
    object: dict[str, Any]
    removed: bool  # False while the object lingers (graceful pod deletion, finalizers)


def fast_copy(obj: Any) -> Any:
    """Deep copy of JSON-shaped data (dict/list/scalars), much faster than copy.deepcopy."""
    if isinstance(obj, dict):
        return {k: fast_copy(v) for k, v in obj.items()}
    if isinstance(obj, list):
        return [fast_copy(v) for v in obj]
    return obj


def _meta(obj: dict[str, Any]) -> dict[str, Any]:
    m = obj.get("metadata")
    if not isinstance(m, dict):
        m = {}
        obj["metadata"] = m
    return m


def _content(obj: dict[str, Any]) -> dict[str, Any]:
    """The parts of an object that count for `generation`: everything but metadata/status."""
    return {k: v for k, v in obj.items() if k not in ("metadata", "status", "apiVersion", "kind")}


# Kinds whose objects carry no metadata.generation in a real cluster.
NO_GENERATION = frozenset(
    {
        "events",
        "namespaces",
        "nodes",
        "configmaps",
        "resourceclaims.resource.k8s.io",
        "resourceclaimtemplates.resource.k8s.io",
    }
)

# Kinds whose create ignores a client-sent status (the status subresource owns it).
_STATUS_RESET_ON_CREATE = frozenset(
    {
        "pods",
        "deployments.apps",
        "replicasets.apps",
        "statefulsets.apps",
        "jobs.batch",
        "poddisruptionbudgets.policy",
        "resourceclaims.resource.k8s.io",
        "devicetaintrules.resource.k8s.io",
    }
)

# Field indexes kept for fast field-selector lookups (resource → field paths).
_INDEXED_FIELDS: dict[str, tuple[str, ...]] = {
    "pods": ("spec.nodeName",),
    "resourceslices.resource.k8s.io": ("spec.nodeName",),
}


def _field(obj: dict[str, Any], dotted: str) -> str:
    cur: Any = obj
    for part in dotted.split("."):
        if not isinstance(cur, dict):
            return ""
        cur = cur.get(part)
    return "" if cur is None else str(cur)


class _Bucket:
    """Objects of one storage key with their indexes and watch history."""

    def __init__(self, rt: ResourceType, history: int) -> None:
        self.rt = rt
        self.objects: dict[tuple[str, str], dict[str, Any]] = {}
        self.sorted_keys: list[tuple[str, str]] | None = None
        self.by_namespace: dict[str, set[tuple[str, str]]] = {}
        self.indexes: dict[str, dict[str, set[tuple[str, str]]]] = {
            f: {} for f in _INDEXED_FIELDS.get(rt.storage, ())
        }
        self.history: deque[StoreEvent] = deque(maxlen=history)
        self.floor = 0  # events with resource_version <= floor are no longer replayable

    def keys_sorted(self) -> list[tuple[str, str]]:
        if self.sorted_keys is None:
            self.sorted_keys = sorted(self.objects)
        return self.sorted_keys

    def put(self, key: tuple[str, str], obj: dict[str, Any]) -> None:
        old = self.objects.get(key)
        if old is None:
            self.sorted_keys = None
            self.by_namespace.setdefault(key[0], set()).add(key)
        for path, index in self.indexes.items():
            if old is not None:
                index.get(_field(old, path), set()).discard(key)
            index.setdefault(_field(obj, path), set()).add(key)
        self.objects[key] = obj

    def remove(self, key: tuple[str, str]) -> None:
        old = self.objects.pop(key, None)
        if old is None:
            return
        self.sorted_keys = None
        self.by_namespace.get(key[0], set()).discard(key)
        for path, index in self.indexes.items():
            index.get(_field(old, path), set()).discard(key)


class Watch:
    """A blocking watch: iterate for `StoreEvent`s (copies), or `get(timeout)`; `close()` ends it."""

    _CLOSED = object()

    def __init__(
        self,
        store: Store,
        storages: set[str] | None,
        namespace: str | None,
        label_selector: LabelSelector | None,
        field_selector: FieldSelector | None,
        copy_objects: bool = True,
    ) -> None:
        self._store = store
        self.storages = storages
        self.namespace = namespace
        self.label_selector = label_selector
        self.field_selector = field_selector
        self.copy_objects = copy_objects
        self._queue: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self.closed = False
        self.aborted = False  # closed by a fault: the server drops the connection mid-stream

    def _matches(self, obj: dict[str, Any] | None) -> bool:
        if obj is None:
            return False
        meta = obj.get("metadata") or {}
        if self.namespace is not None and meta.get("namespace") != self.namespace:
            return False
        if self.label_selector is not None and not self.label_selector.matches(meta.get("labels")):
            return False
        return self.field_selector is None or self.field_selector.matches(obj)

    def _translate(self, ev: StoreEvent) -> StoreEvent | None:
        """Filter an event; a change into/out of the selection becomes ADDED/DELETED."""
        if self.storages is not None and ev.resource not in self.storages:
            return None
        now = self._matches(ev.object)
        if ev.type == MODIFIED:
            before = self._matches(ev.old)
            if now and not before:
                return StoreEvent(ADDED, ev.resource, ev.object, ev.old, ev.resource_version)
            if before and not now:
                return StoreEvent(DELETED, ev.resource, ev.object, ev.old, ev.resource_version)
        return ev if now else None

    def _offer(self, ev: StoreEvent) -> None:
        if self.closed:
            return
        out = self._translate(ev)
        if out is not None:
            self._deliver(out)

    def _deliver(self, ev: StoreEvent) -> None:
        self._queue.put(ev)

    @property
    def idle(self) -> bool:
        """Nothing queued: every event up to the store's resourceVersion was handed out (read
        under the store lock, which every write holds while it offers its event)."""
        return self._queue.empty()

    def get(self, timeout: float | None = None) -> StoreEvent | None:
        """Next event, or None on timeout or once closed."""
        try:
            item = self._queue.get(timeout=timeout)
        except queue.Empty:
            return None
        if item is self._CLOSED:
            self._queue.put(item)
            return None
        if self.copy_objects:
            return StoreEvent(
                item.type, item.resource, fast_copy(item.object), None, item.resource_version
            )
        return item

    def __iter__(self) -> Iterator[StoreEvent]:
        while True:
            ev = self.get()
            if ev is None:
                return
            yield ev

    def close(self) -> None:
        if not self.closed:
            self.closed = True
            self._store._remove_watch(self)
            self._queue.put(self._CLOSED)


class AsyncWatch(Watch):
    """A watch delivering into an asyncio queue of the loop that created it."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._loop = asyncio.get_running_loop()
        self._aqueue: asyncio.Queue[Any] = asyncio.Queue()

    def _deliver(self, ev: StoreEvent) -> None:
        try:
            self._loop.call_soon_threadsafe(self._aqueue.put_nowait, ev)
        except RuntimeError:  # the loop is closed: nobody listens any more
            self.closed = True

    def close(self) -> None:
        if not self.closed:
            self.closed = True
            self._store._remove_watch(self)
            self._loop.call_soon_threadsafe(self._aqueue.put_nowait, self._CLOSED)

    async def aget(self, timeout: float | None = None) -> StoreEvent | None:  # noqa: ASYNC109
        try:
            item = await asyncio.wait_for(self._aqueue.get(), timeout)
        except TimeoutError:
            return None
        if item is self._CLOSED:
            self._aqueue.put_nowait(item)
            return None
        return StoreEvent(
            item.type, item.resource, fast_copy(item.object), None, item.resource_version
        )

    def __aiter__(self) -> AsyncWatch:
        return self

    async def __anext__(self) -> StoreEvent:
        ev = await self.aget()
        if ev is None:
            raise StopAsyncIteration
        return ev


class Store:
    def __init__(
        self,
        clock: Clock | None = None,
        admission: Admission | None = None,
        history: int = DEFAULT_HISTORY,
        api_versions: dict[str, str] | None = None,
    ) -> None:
        self.clock: Clock = clock or SystemClock()
        self.admission = admission
        if admission is not None and hasattr(admission, "accounts"):
            # The ServiceAccount admission plugin reads the pod's account.
            admission.accounts = lambda ns, name: self.try_get("serviceaccounts", name, ns)
        self._lock = threading.RLock()
        self._rv = 1
        self._buckets: dict[str, _Bucket] = {}
        for rt in CATALOGUE:
            if rt.storage not in self._buckets:
                self._buckets[rt.storage] = _Bucket(rt, history)
        self._owners: dict[str, set[tuple[str, str, str]]] = {}  # owner uid → dependents
        self._uids: dict[str, tuple[str, str, str]] = {}  # uid → (storage, namespace, name)
        self._watches: list[Watch] = []
        self._subscribers: list[tuple[Callable[[StoreEvent], None], set[str] | None]] = []
        # apiVersion stamped on objects handed to Python callers (the server rewrites it).
        self.api_versions: dict[str, str] = dict(api_versions or {})
        # Managed-fields bookkeeping is delegated to twin.patch (set lazily to avoid a cycle).
        self._managed: Any = None

    # ---- helpers ----------------------------------------------------------------------

    @property
    def lock(self) -> threading.RLock:
        return self._lock

    @property
    def resource_version(self) -> int:
        return self._rv

    def now(self) -> datetime:
        return self.clock.now()

    def _rt(self, resource: str | ResourceType) -> ResourceType:
        if isinstance(resource, ResourceType):
            return resource
        try:
            rt = resolve(resource)
        except KeyError:
            raise errors.unknown_resource() from None
        return rt

    def _bucket(self, rt: ResourceType) -> _Bucket:
        return self._buckets[rt.storage]

    def _key(self, rt: ResourceType, name: str, namespace: str | None) -> tuple[str, str]:
        if rt.namespaced:
            if not namespace:
                raise errors.bad_request("namespace is required for a namespaced resource")
            return (namespace, name)
        return ("", name)

    def _stamp(self, rt: ResourceType, obj: dict[str, Any]) -> dict[str, Any]:
        version = self.api_versions.get(rt.key) or rt.versions[0]
        obj["apiVersion"] = rt.api_version(version)
        obj["kind"] = rt.kind
        return obj

    def _out(self, rt: ResourceType, obj: dict[str, Any]) -> dict[str, Any]:
        return self._stamp(rt, fast_copy(obj))

    def _next_rv(self) -> int:
        self._rv += 1
        return self._rv

    def _emit(
        self, rt: ResourceType, etype: str, obj: dict[str, Any], old: dict[str, Any] | None
    ) -> None:
        ev = StoreEvent(etype, rt.storage, obj, old, int(obj["metadata"]["resourceVersion"]))
        bucket = self._bucket(rt)
        if len(bucket.history) == bucket.history.maxlen:
            bucket.floor = bucket.history[0].resource_version
        bucket.history.append(ev)
        for w in list(self._watches):
            w._offer(ev)
        for cb, resources in list(self._subscribers):
            if resources is None or ev.resource in resources:
                try:
                    cb(ev)
                except Exception:  # a faulty subscriber must not break a write
                    log.exception("store subscriber %r failed on %s %s", cb, etype, rt.storage)

    def _track_owners(
        self, rt: ResourceType, obj: dict[str, Any], old: dict[str, Any] | None
    ) -> None:
        ident = (rt.storage, obj["metadata"].get("namespace", ""), obj["metadata"]["name"])
        if old is not None:
            for ref in old["metadata"].get("ownerReferences") or []:
                self._owners.get(ref.get("uid", ""), set()).discard(ident)
        for ref in obj["metadata"].get("ownerReferences") or []:
            self._owners.setdefault(ref.get("uid", ""), set()).add(ident)

    def _admit(
        self,
        op: str,
        rt: ResourceType,
        new: dict[str, Any],
        old: dict[str, Any] | None,
        subresource: str | None,
    ) -> None:
        if self.admission is not None:
            self.admission.admit(op, rt, new, old, subresource, self.now())

    def _managed_fields(
        self,
        rt: ResourceType,
        new: dict[str, Any],
        old: dict[str, Any] | None,
        manager: str | None,
        operation: str,
        subresource: str | None,
    ) -> None:
        if manager is None:
            if old is not None and "managedFields" not in new["metadata"]:
                if "managedFields" in old["metadata"]:
                    new["metadata"]["managedFields"] = old["metadata"]["managedFields"]
            return
        from twin import patch as patch_mod

        version = new.get("apiVersion") or rt.api_version(
            self.api_versions.get(rt.key) or rt.versions[0]
        )
        patch_mod.record_update(new, old, manager, operation, subresource, version, self.now())

    # ---- reads -------------------------------------------------------------------------

    def try_get(
        self, resource: str | ResourceType, name: str, namespace: str | None = None
    ) -> dict[str, Any] | None:
        rt = self._rt(resource)
        with self._lock:
            obj = self._bucket(rt).objects.get(self._key(rt, name, namespace))
            return None if obj is None else self._out(rt, obj)

    def get(
        self, resource: str | ResourceType, name: str, namespace: str | None = None
    ) -> dict[str, Any]:
        rt = self._rt(resource)
        obj = self.try_get(rt, name, namespace)
        if obj is None:
            raise errors.not_found(rt.plural, name, rt.group)
        return obj

    def get_ref(
        self, resource: str | ResourceType, name: str, namespace: str | None = None
    ) -> dict[str, Any] | None:
        """The stored object itself, without a copy: read-only, for the server's hot paths."""
        rt = self._rt(resource)
        return self._bucket(rt).objects.get(self._key(rt, name, namespace))

    def list(
        self,
        resource: str | ResourceType,
        namespace: str | None = None,
        label_selector: str | LabelSelector | None = None,
        field_selector: str | FieldSelector | None = None,
        limit: int | None = None,
        continue_token: str | None = None,
        copy_objects: bool = True,
    ) -> ListResult:
        """Objects sorted by namespace/name. `copy_objects=False` hands out shared snapshots."""
        rt = self._rt(resource)
        ls = (
            parse_label_selector(label_selector)
            if isinstance(label_selector, str | None)
            else label_selector
        )
        fs = (
            parse_field_selector(rt.key, field_selector)
            if isinstance(field_selector, str | None)
            else field_selector
        )
        start: tuple[str, str] | None = None
        list_rv: int | None = None
        if continue_token:
            start, list_rv = _decode_continue(continue_token)
        with self._lock:
            bucket = self._bucket(rt)
            keys: list[tuple[str, str]] | None = None
            for path, index in bucket.indexes.items():
                value = fs.equality_value(path) if fs is not None else None
                if value is not None:
                    keys = sorted(index.get(value, ()))
                    break
            if keys is None:
                if namespace:
                    keys = sorted(bucket.by_namespace.get(namespace, ()))
                else:
                    keys = bucket.keys_sorted()
            items: list[dict[str, Any]] = []
            rv = list_rv or self._rv
            matched = 0
            next_start: tuple[str, str] | None = None
            # With a selector the API server leaves remainingItemCount unset (the count would
            # need every later object matched): a page then stops at its limit, so a paginated
            # LIST costs the size of the list, not its square.
            selecting = bool((ls is not None and ls.requirements) or (fs is not None and fs.terms))
            first = bisect.bisect_right(keys, start) if start is not None else 0
            for key in itertools.islice(keys, first, None):
                if namespace and key[0] != namespace:
                    continue
                obj = bucket.objects[key]
                if (
                    ls is not None
                    and ls.requirements
                    and not ls.matches(obj["metadata"].get("labels"))
                ):
                    continue
                if fs is not None and fs.terms and not fs.matches(obj):
                    continue
                matched += 1
                if limit and len(items) >= limit:
                    if next_start is None:
                        next_start = (
                            items[-1]["metadata"].get("namespace", ""),
                            items[-1]["metadata"]["name"],
                        )
                    if selecting:
                        break
                    continue
                items.append(obj)
            out = [self._out(rt, o) for o in items] if copy_objects else items
        result = ListResult(out, rv)
        if next_start is not None:
            result.continue_token = _encode_continue(next_start, rv)
            if not selecting:
                result.remaining_item_count = matched - len(items)
        return result

    def count(self, resource: str | ResourceType) -> int:
        return len(self._bucket(self._rt(resource)).objects)

    def get_by_uid(self, uid: str) -> dict[str, Any] | None:
        """The live object with this uid (any kind), or None."""
        with self._lock:
            where = self._uids.get(uid)
            if where is None:
                return None
            bucket = self._buckets[where[0]]
            obj = bucket.objects.get((where[1], where[2]))
            return None if obj is None else self._out(bucket.rt, obj)

    def dependents(self, owner_uid: str) -> builtins.list[tuple[str, str, str]]:
        """(resource, namespace, name) of objects whose ownerReferences name `owner_uid`."""
        with self._lock:
            return sorted(self._owners.get(owner_uid, ()))

    # ---- writes ------------------------------------------------------------------------

    def create(
        self,
        resource: str | ResourceType,
        obj: dict[str, Any],
        namespace: str | None = None,
        dry_run: bool = False,
        manager: str | None = None,
    ) -> dict[str, Any]:
        rt = self._rt(resource)
        check_types(rt, obj)
        new = fast_copy(obj)
        meta = _meta(new)
        if rt.namespaced:
            ns = meta.get("namespace") or namespace
            if namespace and meta.get("namespace") and meta["namespace"] != namespace:
                raise errors.bad_request(
                    "the namespace of the provided object does not match the namespace sent "
                    "on the request"
                )
            if not ns:
                raise errors.bad_request("namespace is required for a namespaced resource")
            meta["namespace"] = ns
        else:
            meta.pop("namespace", None)
        with self._lock:
            if not meta.get("name") and meta.get("generateName"):
                meta["name"] = self._generate_name(rt, meta["generateName"], meta.get("namespace"))
            if not meta.get("name"):
                raise errors.invalid(
                    rt.kind,
                    "",
                    [errors.required("metadata.name", "name or generateName is required")],
                    rt.group,
                )
            if rt.namespaced and rt.storage != "namespaces":
                ns_obj = self._buckets["namespaces"].objects.get(("", meta["namespace"]))
                if ns_obj is None:
                    raise errors.not_found("namespaces", meta["namespace"])
                if ns_obj["metadata"].get("deletionTimestamp"):
                    raise errors.ApiError(
                        403,
                        "Forbidden",
                        f'{rt.plural} "{meta["name"]}" is forbidden: unable to create new content '
                        f"in namespace {meta['namespace']} because it is being terminated",
                    )
            key = self._key(rt, meta["name"], meta.get("namespace"))
            bucket = self._bucket(rt)
            if key in bucket.objects:
                raise errors.already_exists(rt.plural, meta["name"], rt.group)
            now = self.now()
            for k in ("resourceVersion", "deletionTimestamp", "deletionGracePeriodSeconds"):
                meta.pop(k, None)
            if rt.storage in _STATUS_RESET_ON_CREATE:
                new.pop("status", None)
            meta["uid"] = str(uuid.uuid4())
            meta["creationTimestamp"] = format_time(now)
            if rt.storage not in NO_GENERATION:
                meta["generation"] = 1
            else:
                meta.pop("generation", None)
            self._stamp(rt, new)
            self._admit("CREATE", rt, new, None, None)
            if rt.storage == "pods":
                self._pod_security(new)
            if rt.has_status and "status" not in new:
                new["status"] = {}
            self._managed_fields(rt, new, None, manager, "Update", None)
            if dry_run:
                return self._out(rt, new)
            meta["resourceVersion"] = str(self._next_rv())
            bucket.put(key, new)
            self._uids[meta["uid"]] = (rt.storage, key[0], key[1])
            self._track_owners(rt, new, None)
            self._emit(rt, ADDED, new, None)
            return self._out(rt, new)

    def _pod_security(self, pod: dict[str, Any]) -> None:
        """Pod Security admission's enforce level of the pod's namespace (twin/podsecurity.py):
        403 Forbidden with the server's text, for a direct create and a controller's alike."""
        meta = _meta(pod)
        ns_obj = self._buckets["namespaces"].objects.get(("", meta.get("namespace") or ""))
        labels = (ns_obj or {}).get("metadata", {}).get("labels")
        refused = podsecurity.verdict(labels, "enforce", pod.get("spec") or {})
        if refused:
            raise errors.ApiError(
                403,
                "Forbidden",
                f'pods "{meta["name"]}" is forbidden: {refused}',
                {"name": meta["name"], "kind": "pods"},
            )

    def namespace_labels(self, namespace: str | None) -> dict[str, str]:
        ns_obj = self._buckets["namespaces"].objects.get(("", namespace or ""))
        return dict(((ns_obj or {}).get("metadata") or {}).get("labels") or {})

    def _generate_name(self, rt: ResourceType, prefix: str, namespace: str | None) -> str:
        bucket = self._bucket(rt)
        for _ in range(100):
            name = prefix[:58] + "".join(random.choices(_SUFFIX_CHARS, k=5))
            if self._key(rt, name, namespace) not in bucket.objects:
                return name
        raise errors.ApiError(500, "AlreadyExists", "could not generate a unique name")

    def update(
        self,
        resource: str | ResourceType,
        obj: dict[str, Any],
        subresource: str | None = None,
        dry_run: bool = False,
        manager: str | None = None,
        namespace: str | None = None,
        name: str | None = None,
        operation: str = "Update",
    ) -> dict[str, Any]:
        """Replace an object (PUT). `subresource="status"` replaces only its status."""
        rt = self._rt(resource)
        check_types(rt, obj)
        body = fast_copy(obj)
        meta = _meta(body)
        name = name or meta.get("name")
        if not name:
            raise errors.invalid(rt.kind, "", [errors.required("metadata.name")], rt.group)
        if meta.get("name") and meta["name"] != name:
            raise errors.bad_request(
                "the name of the object "
                f"({meta['name']}) does not match the name on the URL ({name})"
            )
        ns = meta.get("namespace") or namespace if rt.namespaced else None
        if rt.namespaced and namespace and meta.get("namespace") and meta["namespace"] != namespace:
            raise errors.bad_request(
                "the namespace of the provided object does not match the namespace sent on the "
                "request"
            )
        with self._lock:
            key = self._key(rt, name, ns)
            current = self._bucket(rt).objects.get(key)
            if current is None:
                raise errors.not_found(rt.plural, name, rt.group)
            rv = meta.get("resourceVersion")
            if rv and rv != current["metadata"]["resourceVersion"]:
                raise errors.conflict(rt.plural, name, rt.group)
            return self._commit_update(
                rt, key, current, body, subresource, dry_run, manager, operation
            )

    def update_status(
        self, resource: str | ResourceType, obj: dict[str, Any], **kwargs: Any
    ) -> dict[str, Any]:
        return self.update(resource, obj, subresource="status", **kwargs)

    def _commit_update(
        self,
        rt: ResourceType,
        key: tuple[str, str],
        current: dict[str, Any],
        body: dict[str, Any],
        subresource: str | None,
        dry_run: bool,
        manager: str | None,
        operation: str = "Update",
    ) -> dict[str, Any]:
        cur_meta = current["metadata"]
        if subresource == "status":
            new = fast_copy(current)
            if "status" in body:
                new["status"] = body["status"]
        else:
            new = body
            meta = _meta(new)
            for k in (
                "uid",
                "creationTimestamp",
                "name",
                "namespace",
                "deletionTimestamp",
                "deletionGracePeriodSeconds",
                "generation",
            ):
                if k in cur_meta:
                    meta[k] = cur_meta[k]
                else:
                    meta.pop(k, None)
            if rt.has_status:
                if "status" in current:
                    new["status"] = current["status"]
                else:
                    new.pop("status", None)
        self._stamp(rt, new)
        meta = new["metadata"]
        self._admit("UPDATE", rt, new, current, subresource)
        if rt.storage not in NO_GENERATION and _content(new) != _content(current):
            meta["generation"] = int(cur_meta.get("generation", 1)) + 1
        self._managed_fields(rt, new, current, manager, operation, subresource)
        meta["resourceVersion"] = cur_meta["resourceVersion"]
        if new == current:
            return self._out(rt, current)  # no-op writes do not bump resourceVersion
        if dry_run:
            return self._out(rt, new)
        meta["resourceVersion"] = str(self._next_rv())
        bucket = self._bucket(rt)
        bucket.put(key, new)
        self._track_owners(rt, new, current)
        self._emit(rt, MODIFIED, new, current)
        if meta.get("deletionTimestamp") and not meta.get("finalizers"):
            if not (rt.storage == "pods" and meta.get("deletionGracePeriodSeconds")):
                self._remove(rt, key, "Background")
        return self._out(rt, new)

    def mutate(
        self,
        resource: str | ResourceType,
        name: str,
        fn: Callable[[dict[str, Any]], dict[str, Any] | None],
        namespace: str | None = None,
        subresource: str | None = None,
        manager: str | None = None,
    ) -> dict[str, Any]:
        """Read-modify-write under the store lock: no conflict is possible."""
        rt = self._rt(resource)
        with self._lock:
            key = self._key(rt, name, namespace)
            current = self._bucket(rt).objects.get(key)
            if current is None:
                raise errors.not_found(rt.plural, name, rt.group)
            work = self._out(rt, current)
            result = fn(work)
            body = work if result is None else result
            return self._commit_update(rt, key, current, body, subresource, False, manager)

    def patch(
        self,
        resource: str | ResourceType,
        name: str,
        body: Any,
        namespace: str | None = None,
        patch_type: str = "merge",
        subresource: str | None = None,
        manager: str | None = None,
        dry_run: bool = False,
    ) -> dict[str, Any]:
        """merge (RFC 7386), strategic (core kinds' list-merge keys) or json (RFC 6902)."""
        from twin import patch as patch_mod

        rt = self._rt(resource)
        with self._lock:
            key = self._key(rt, name, namespace)
            current = self._bucket(rt).objects.get(key)
            if current is None:
                raise errors.not_found(rt.plural, name, rt.group)
            work = self._out(rt, current)
            patched = patch_mod.apply_patch(rt, work, body, patch_type)
            if not isinstance(patched, dict):
                raise errors.ApiError(422, "Invalid", "the patch did not produce an object", {})
            check_types(rt, patched)
            pmeta = _meta(patched)
            rv = pmeta.get("resourceVersion")
            if rv and rv != current["metadata"]["resourceVersion"]:
                raise errors.conflict(rt.plural, name, rt.group)
            if pmeta.get("name", name) != name:
                raise errors.bad_request("metadata.name in the patch does not match the URL")
            pmeta["name"] = name
            return self._commit_update(rt, key, current, patched, subresource, dry_run, manager)

    def apply(
        self,
        resource: str | ResourceType,
        name: str,
        body: dict[str, Any],
        namespace: str | None = None,
        manager: str = "",
        force: bool = False,
        subresource: str | None = None,
        dry_run: bool = False,
    ) -> tuple[dict[str, Any], bool]:
        """Server-side apply: (object, created). Conflicts with other managers → 409."""
        from twin import patch as patch_mod

        rt = self._rt(resource)
        if not manager:
            raise errors.ApiError(
                422,
                "Invalid",
                'PatchOptions.meta.k8s.io "" is invalid: fieldManager: Required value: is '
                "required for apply patch",
                {
                    "causes": [
                        errors.required("fieldManager", "is required for apply patch"),
                    ],
                    "group": "meta.k8s.io",
                    "kind": "PatchOptions",
                },
            )
        check_types(rt, body)
        with self._lock:
            key = self._key(rt, name, namespace)
            current = self._bucket(rt).objects.get(key)
            if current is None:
                new = patch_mod.apply_create(rt, body, name, namespace)
                version = body.get("apiVersion") or rt.api_version(
                    self.api_versions.get(rt.key) or rt.versions[0]
                )
                patch_mod.record_apply(new, None, body, manager, subresource, version, self.now())
                return self.create(rt, new, namespace=namespace, dry_run=dry_run), True
            work = self._out(rt, current)
            merged = patch_mod.apply_merge(rt, work, body, manager, force, subresource)
            stamped_version = body.get("apiVersion") or work["apiVersion"]
            patch_mod.record_apply(
                merged, current, body, manager, subresource, stamped_version, self.now()
            )
            return self._commit_update(rt, key, current, merged, subresource, dry_run, None), False

    def delete(
        self,
        resource: str | ResourceType,
        name: str,
        namespace: str | None = None,
        grace_period_seconds: int | None = None,
        propagation_policy: str | None = None,
        preconditions: dict[str, str] | None = None,
        dry_run: bool = False,
    ) -> DeleteResult:
        rt = self._rt(resource)
        if propagation_policy not in (None, "Orphan", "Background", "Foreground"):
            raise errors.invalid(
                "DeleteOptions",
                "",
                [
                    errors.cause(
                        "propagationPolicy",
                        "FieldValueNotSupported",
                        f'Unsupported value: "{propagation_policy}": supported values: '
                        '"Foreground", "Background", "Orphan", "nil"',
                    )
                ],
                "meta.k8s.io",
            )
        if grace_period_seconds is not None and grace_period_seconds < 0:
            grace_period_seconds = 1  # kube-apiserver turns negative grace into 1 s
        with self._lock:
            key = self._key(rt, name, namespace)
            current = self._bucket(rt).objects.get(key)
            if current is None:
                raise errors.not_found(rt.plural, name, rt.group)
            cur_meta = current["metadata"]
            if preconditions:
                if preconditions.get("uid") and preconditions["uid"] != cur_meta.get("uid"):
                    raise errors.conflict(
                        rt.plural,
                        name,
                        rt.group,
                        f"Precondition failed: UID in precondition: {preconditions['uid']}, "
                        f"UID in object meta: {cur_meta.get('uid')}",
                    )
                if preconditions.get("resourceVersion") and preconditions[
                    "resourceVersion"
                ] != cur_meta.get("resourceVersion"):
                    raise errors.conflict(
                        rt.plural,
                        name,
                        rt.group,
                        "Precondition failed: ResourceVersion in precondition: "
                        f"{preconditions['resourceVersion']}, ResourceVersion in object meta: "
                        f"{cur_meta.get('resourceVersion')}",
                    )
            is_pod = rt.storage == "pods"
            grace = 0
            if is_pod:
                default = (current.get("spec") or {}).get("terminationGracePeriodSeconds", 30)
                grace = default if grace_period_seconds is None else grace_period_seconds
                if not (current.get("spec") or {}).get("nodeName"):
                    grace = 0  # never scheduled: nothing to stop, delete at once
                phase = (current.get("status") or {}).get("phase")
                if phase in ("Succeeded", "Failed"):
                    grace = 0
            now = self.now()
            if dry_run:
                return DeleteResult(self._out(rt, current), False)
            if cur_meta.get("deletionTimestamp"):
                # Already terminating: only a shorter grace period changes anything.
                remaining = cur_meta.get("deletionGracePeriodSeconds")
                if not is_pod or remaining is None or grace >= remaining:
                    if not cur_meta.get("finalizers") and (not is_pod or grace == 0):
                        return self._finish_delete(rt, key, current, propagation_policy, now, grace)
                    return DeleteResult(self._out(rt, current), False)
            if is_pod and grace > 0:
                new = fast_copy(current)
                m = new["metadata"]
                m["deletionTimestamp"] = format_time(now + timedelta(seconds=grace))
                m["deletionGracePeriodSeconds"] = grace
                if "generation" in m:
                    m["generation"] = int(m["generation"]) + 1
                m["resourceVersion"] = str(self._next_rv())
                self._bucket(rt).put(key, new)
                self._emit(rt, MODIFIED, new, current)
                if propagation_policy == "Orphan":
                    self._orphan(cur_meta.get("uid", ""))
                return DeleteResult(self._out(rt, new), False)
            if cur_meta.get("finalizers"):
                new = fast_copy(current)
                m = new["metadata"]
                m["deletionTimestamp"] = format_time(now)
                m["deletionGracePeriodSeconds"] = 0
                if "generation" in m:
                    m["generation"] = int(m["generation"]) + 1
                m["resourceVersion"] = str(self._next_rv())
                self._bucket(rt).put(key, new)
                self._emit(rt, MODIFIED, new, current)
                if propagation_policy == "Orphan":
                    self._orphan(cur_meta.get("uid", ""))
                return DeleteResult(self._out(rt, new), False)
            return self._finish_delete(rt, key, current, propagation_policy, now, grace)

    def _finish_delete(
        self,
        rt: ResourceType,
        key: tuple[str, str],
        current: dict[str, Any],
        policy: str | None,
        now: datetime,
        grace: int,
    ) -> DeleteResult:
        if rt.storage == "pods":
            # A real apiserver first writes deletionTimestamp=now with grace 0 (MODIFIED).
            new = fast_copy(current)
            m = new["metadata"]
            if m.get("deletionGracePeriodSeconds") != 0:
                m["deletionTimestamp"] = format_time(now)
                m["deletionGracePeriodSeconds"] = 0
                if "generation" in m and not current["metadata"].get("deletionTimestamp"):
                    m["generation"] = int(m["generation"]) + 1
                m["resourceVersion"] = str(self._next_rv())
                self._bucket(rt).put(key, new)
                self._emit(rt, MODIFIED, new, current)
            current = new
        removed = self._remove(rt, key, policy or "Background")
        return DeleteResult(self._out(rt, removed), True)

    def _remove(self, rt: ResourceType, key: tuple[str, str], policy: str) -> dict[str, Any]:
        bucket = self._bucket(rt)
        current = bucket.objects[key]
        gone = fast_copy(current)
        gone["metadata"]["resourceVersion"] = str(self._next_rv())
        bucket.remove(key)
        self._uids.pop(current["metadata"].get("uid", ""), None)
        self._track_owners(rt, {"metadata": {"name": key[1], "namespace": key[0]}}, current)
        self._emit(rt, DELETED, gone, current)
        uid = current["metadata"].get("uid", "")
        if rt.storage == "namespaces":
            self._purge_namespace(key[1])
        if policy == "Orphan":
            self._orphan(uid)
        else:
            self._collect(uid)
        return gone

    def _purge_namespace(self, namespace: str) -> None:
        for bucket in self._buckets.values():
            if not bucket.rt.namespaced:
                continue
            for key in sorted(bucket.by_namespace.get(namespace, ())):
                if key in bucket.objects:
                    self._remove(bucket.rt, key, "Background")

    def _orphan(self, uid: str) -> None:
        for storage, ns, name in sorted(self._owners.pop(uid, set())):
            rt = self._buckets[storage].rt
            key = (ns, name)
            cur = self._buckets[storage].objects.get(key)
            if cur is None:
                continue
            new = fast_copy(cur)
            refs = [r for r in new["metadata"].get("ownerReferences") or [] if r.get("uid") != uid]
            if refs:
                new["metadata"]["ownerReferences"] = refs
            else:
                new["metadata"].pop("ownerReferences", None)
            new["metadata"]["resourceVersion"] = str(self._next_rv())
            self._buckets[storage].put(key, new)
            self._emit(rt, MODIFIED, new, cur)

    def _collect(self, uid: str) -> None:
        """Garbage-collect dependents whose owners are all gone (background propagation)."""
        for storage, ns, name in sorted(self._owners.pop(uid, set())):
            bucket = self._buckets[storage]
            cur = bucket.objects.get((ns, name))
            if cur is None or cur["metadata"].get("deletionTimestamp"):
                continue
            alive = [
                r
                for r in cur["metadata"].get("ownerReferences") or []
                if r.get("uid") != uid and r.get("uid") in self._uids
            ]
            if alive:
                continue
            try:
                self.delete(bucket.rt, name, ns or None)
            except errors.ApiError:
                log.debug("garbage collection of %s %s/%s skipped", storage, ns, name)

    def delete_collection(
        self,
        resource: str | ResourceType,
        namespace: str | None = None,
        label_selector: str | None = None,
        field_selector: str | None = None,
        grace_period_seconds: int | None = None,
        propagation_policy: str | None = None,
        dry_run: bool = False,
    ) -> builtins.list[dict[str, Any]]:
        rt = self._rt(resource)
        with self._lock:
            listed = self.list(rt, namespace, label_selector, field_selector)
            out: list[dict[str, Any]] = []
            for obj in listed.items:
                m = obj["metadata"]
                try:
                    res = self.delete(
                        rt,
                        m["name"],
                        m.get("namespace"),
                        grace_period_seconds,
                        propagation_policy,
                        dry_run=dry_run,
                    )
                except errors.ApiError:
                    continue
                out.append(res.object)
            return out

    # ---- watches -----------------------------------------------------------------------

    def _make_watch(
        self,
        cls: type[Watch],
        resource: str | ResourceType | builtins.list[str] | None,
        namespace: str | None,
        label_selector: str | LabelSelector | None,
        field_selector: str | FieldSelector | None,
        resource_version: str | int | None,
        copy_objects: bool,
    ) -> Watch:
        storages: set[str] | None
        rts: list[ResourceType] = []
        if resource is None:
            storages = None
        elif isinstance(resource, list):
            rts = [self._rt(r) for r in resource]
            storages = {rt.storage for rt in rts}
        else:
            rts = [self._rt(resource)]
            storages = {rts[0].storage}
        ls = (
            parse_label_selector(label_selector)
            if isinstance(label_selector, str)
            else label_selector
        )
        fs = field_selector
        if isinstance(field_selector, str):
            if len(rts) != 1:
                raise errors.bad_request("a field selector needs exactly one resource")
            fs = parse_field_selector(rts[0].key, field_selector)
        w = cls(self, storages, namespace, ls, fs, copy_objects)  # type: ignore[arg-type]
        with self._lock:
            if resource_version in (None, "", "0", 0):
                # Synthetic ADDED events for the current state, then live events.
                for rt in rts:
                    bucket = self._bucket(rt)
                    for key in bucket.keys_sorted():
                        obj = bucket.objects[key]
                        if w._matches(obj):
                            w._deliver(
                                StoreEvent(
                                    ADDED,
                                    rt.storage,
                                    self._stamp(rt, obj),
                                    None,
                                    int(obj["metadata"]["resourceVersion"]),
                                )
                            )
            else:
                try:
                    since = int(resource_version)
                except (TypeError, ValueError):
                    raise errors.bad_request(
                        f'invalid resource version "{resource_version}"'
                    ) from None
                buckets = [self._bucket(rt) for rt in rts] if rts else list(self._buckets.values())
                replay: list[StoreEvent] = []
                for bucket in buckets:
                    if since < bucket.floor:
                        raise errors.gone(f"too old resource version: {since} ({bucket.floor})")
                    replay.extend(ev for ev in bucket.history if ev.resource_version > since)
                replay.sort(key=lambda e: e.resource_version)
                for ev in replay:
                    w._offer(ev)
            self._watches.append(w)
        return w

    def watch(
        self,
        resource: str | ResourceType | builtins.list[str] | None = None,
        namespace: str | None = None,
        label_selector: str | LabelSelector | None = None,
        field_selector: str | FieldSelector | None = None,
        resource_version: str | int | None = None,
        copy_objects: bool = True,
    ) -> Watch:
        """Blocking watch. Without resource_version: ADDED for every current object first."""
        return self._make_watch(
            Watch,
            resource,
            namespace,
            label_selector,
            field_selector,
            resource_version,
            copy_objects,
        )

    def watch_async(
        self,
        resource: str | ResourceType | builtins.list[str] | None = None,
        namespace: str | None = None,
        label_selector: str | LabelSelector | None = None,
        field_selector: str | FieldSelector | None = None,
        resource_version: str | int | None = None,
    ) -> AsyncWatch:
        """Like watch(), delivering into the running asyncio loop: `async for ev in w`."""
        w = self._make_watch(
            AsyncWatch, resource, namespace, label_selector, field_selector, resource_version, True
        )
        assert isinstance(w, AsyncWatch)
        return w

    def _remove_watch(self, w: Watch) -> None:
        with self._lock:
            if w in self._watches:
                self._watches.remove(w)

    @property
    def watch_count(self) -> int:
        return len(self._watches)

    def drop_watches(self, abort: bool = True) -> int:
        """End every open watch (fault injection): `abort` drops the connection mid-stream
        (a network cut or an API server killed), else the stream ends cleanly. Returns how many."""
        with self._lock:
            watches = list(self._watches)
        for w in watches:
            w.aborted = abort
            w.close()
        return len(watches)

    def subscribe(
        self, callback: Callable[[StoreEvent], None], resources: builtins.list[str] | None = None
    ) -> Callable[[], None]:
        storages = None if resources is None else {self._rt(r).storage for r in resources}
        entry = (callback, storages)
        with self._lock:
            self._subscribers.append(entry)

        def unsubscribe() -> None:
            with self._lock:
                if entry in self._subscribers:
                    self._subscribers.remove(entry)

        return unsubscribe

    def compact(self) -> None:
        """Forget watch history: resuming from an older resourceVersion gives 410 Expired."""
        with self._lock:
            for bucket in self._buckets.values():
                bucket.history.clear()
                bucket.floor = self._rv

    def history_floor(self, resource: str | ResourceType) -> int:
        return self._bucket(self._rt(resource)).floor


def _encode_continue(start: tuple[str, str], rv: int) -> str:
    key = f"{start[0]}/{start[1]}" if start[0] else start[1]
    raw = json.dumps(
        {"v": "meta.k8s.io/v1", "rv": rv, "start": key + "\u0000"}, separators=(",", ":")
    )
    return base64.urlsafe_b64encode(raw.encode()).decode().rstrip("=")


def _decode_continue(token: str) -> tuple[tuple[str, str], int]:
    try:
        raw = base64.urlsafe_b64decode(token + "=" * (-len(token) % 4))
        data = json.loads(raw)
        start = str(data["start"]).rstrip("\u0000")
        rv = int(data["rv"])
    except (ValueError, KeyError, TypeError):
        raise errors.bad_request("continue key is not valid: illegal base64 data") from None
    ns, _, name = start.rpartition("/")
    return (ns, name), rv
