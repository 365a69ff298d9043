"""The Kubernetes REST API over HTTP, served from a `Twin`'s store.

A `ThreadingHTTPServer` (HTTP/1.1 keep-alive, one thread per connection) on 127.0.0.1. Paths:

    /version /api /api/v1 /apis /apis/<g> /apis/<g>/<v>      discovery (per profile)
    /api/v1/[namespaces/<ns>/]<plural>[/<name>[/<sub>]]      core resources
    /apis/<g>/<v>/[namespaces/<ns>/]<plural>[/<name>[/<sub>]] group resources
    /openapi/v3 /openapi/v3/api/v1 /openapi/v3/apis/<g>/<v>  OpenAPI v3 (twin/openapi.py)
    /healthz /livez /readyz                                   "ok"
    /twin/healthz                                              {"status": "ok", ...}
    /twin/requests   GET (filters: verb, resource, namespace, name, status)  DELETE clears

Verbs: get, list (labelSelector, fieldSelector, limit/continue), watch (?watch=true, chunked
JSON lines, resourceVersion resume, timeoutSeconds, 410 as an ERROR event), create (POST,
generateName, dryRun=All), update (PUT), patch (merge / strategic / json / apply with
fieldManager and force), delete (gracePeriodSeconds, propagationPolicy, preconditions,
dryRun), deletecollection; subresources status, scale, pods/eviction, pods/binding, pods/log
(twin/logs.py). Bodies are JSON, YAML or, for the built-in kinds kubectl's typed clients
send, protobuf (twin/protobuf.py); answers are JSON. `fieldValidation` is honoured from
the OpenAPI schemas. `Accept: ...;as=Table` gets server-side printing (twin/printing.py)
for get, list and watch. SelfSubjectAccessReview/RulesReview, SelfSubjectReview, TokenReview
and SubjectAccessReview are answered, never stored; impersonated users and people's tokens
(`Twin.add_user`) are held to RBAC (twin/authz.py).
Errors are `Status` bodies (or text/plain "404 page not found" for an unknown group, as a
real server answers). With a token configured, requests without `Authorization: Bearer
<token>` get 401 (kubectl never sends a token over plain HTTP: use a token-less twin).
"""

from __future__ import annotations

import contextlib
import json
import logging
import operator
import socket
import ssl
import threading
import time
from collections import deque
from dataclasses import asdict, dataclass
from datetime import timedelta
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, unquote, urlsplit

import yaml

from twin import authz, disruption, errors, logs, openapi, podsecurity, printing, protobuf
from twin.resources import ResourceType
from twin.selectors import EVENTS_V1_FIELDS, parse_field_selector, parse_label_selector
from twin.store import (
    ADDED,
    DELETED,
    MODIFIED,
    format_time,
)

log = logging.getLogger(__name__)

WATCH_DEFAULT_TIMEOUT = 1800  # seconds; kube-apiserver's --min-request-timeout default
_POLL = 0.5  # how often an idle watch checks for server shutdown (seconds)
ENCODE_CACHE_SIZE = 50_000  # encoded objects kept (keyed by uid + resourceVersion)
BOOKMARK_INTERVAL = 30.0  # idle seconds between BOOKMARK events when a client allows them

# Registries that answer DELETE with the deleted object (the others answer a Status).
RETURNS_DELETED_OBJECT = frozenset(
    {
        "pods",
        "namespaces",
        "deviceclasses.resource.k8s.io",
        "resourceslices.resource.k8s.io",
        "resourceclaims.resource.k8s.io",
        "resourceclaimtemplates.resource.k8s.io",
        "devicetaintrules.resource.k8s.io",
    }
)

PATCH_TYPES = {
    "application/merge-patch+json": "merge",
    "application/strategic-merge-patch+json": "strategic",
    "application/json-patch+json": "json",
    "application/apply-patch+yaml": "apply",
    "application/apply-patch+cbor": "apply",
}


@dataclass
class RequestRecord:
    time: float
    method: str
    path: str
    query: str
    verb: str
    group: str
    version: str
    resource: str  # plural, with "/<sub>" for subresources
    namespace: str
    name: str
    status: int
    duration_ms: float
    user_agent: str
    # The object a successful create made (`metadata.name`, generateName resolved): the path
    # of a create names no object, so this is how a reader tells which create made what, as
    # the API server's audit log does (objectRef.name, filled from the request's object).
    created: str = ""


class RequestLog:
    """Every API request the server answered (bounded), for tests and RBAC checks."""

    def __init__(self, maxlen: int = 200_000) -> None:
        self._lock = threading.Lock()
        self._items: deque[RequestRecord] = deque(maxlen=maxlen)

    def add(self, rec: RequestRecord) -> None:
        with self._lock:
            self._items.append(rec)

    def entries(self, **filters: Any) -> list[RequestRecord]:
        """Records whose fields equal every given filter, e.g. entries(verb="create")."""
        with self._lock:
            items = list(self._items)
        if not filters:
            return items
        # One attrgetter for every filter: benchmarks poll a log of tens of thousands of
        # records several times a second, on the twin's CPU and GIL.
        get = operator.attrgetter(*filters)
        want = tuple(filters.values()) if len(filters) > 1 else next(iter(filters.values()))
        return [r for r in items if get(r) == want]

    def count(self, **filters: Any) -> int:
        return len(self.entries(**filters))

    def clear(self) -> None:
        with self._lock:
            self._items.clear()

    def as_dicts(self, **filters: Any) -> list[dict[str, Any]]:
        return [asdict(r) for r in self.entries(**filters)]

    def rbac_rules(self, **filters: Any) -> list[dict[str, list[str]]]:
        """The RBAC rules the logged API calls needed, one per (group, resource), sorted.

        Compare with a ClusterRole's rules to prove it grants what a remediation used;
        `resource` includes the subresource ("pods/eviction") as RBAC spells it.
        """
        needed: dict[tuple[str, str], set[str]] = {}
        for r in self.entries(**filters):
            if r.verb and r.resource:
                needed.setdefault((r.group, r.resource), set()).add(r.verb)
        return [
            {"apiGroups": [group], "resources": [resource], "verbs": sorted(verbs)}
            for (group, resource), verbs in sorted(needed.items())
        ]


# ---- events.k8s.io/v1 <-> core/v1 Event ---------------------------------------------------

_EV_MAP = (
    ("involvedObject", "regarding"),
    ("message", "note"),
    ("source", "deprecatedSource"),
    ("firstTimestamp", "deprecatedFirstTimestamp"),
    ("lastTimestamp", "deprecatedLastTimestamp"),
    ("count", "deprecatedCount"),
    ("reportingComponent", "reportingController"),
)
_EV_SAME = (
    "metadata",
    "eventTime",
    "series",
    "reportingInstance",
    "action",
    "reason",
    "related",
    "type",
)


def event_to_v1(core: dict[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {"apiVersion": "events.k8s.io/v1", "kind": "Event"}
    for k in _EV_SAME:
        if k in core:
            out[k] = core[k]
    out.setdefault("eventTime", None)
    for ck, vk in _EV_MAP:
        if ck in core:
            out[vk] = core[ck]
    if "deprecatedSource" not in out:
        out["deprecatedSource"] = {}
    out.setdefault("deprecatedFirstTimestamp", None)
    out.setdefault("deprecatedLastTimestamp", None)
    if isinstance(out.get("series"), dict) and "lastObservedTime" in out["series"]:
        out["series"] = {
            "count": out["series"].get("count"),
            "lastObservedTime": out["series"]["lastObservedTime"],
        }
    return out


def event_from_v1(v1: dict[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {"apiVersion": "v1", "kind": "Event"}
    for k in _EV_SAME:
        if k in v1:
            out[k] = v1[k]
    for ck, vk in _EV_MAP:
        if vk in v1 and v1[vk] is not None:
            out[ck] = v1[vk]
    if not out.get("source"):
        out["source"] = {}
    out.setdefault("firstTimestamp", None)
    out.setdefault("lastTimestamp", None)
    return out


# ---- request handling ---------------------------------------------------------------------


@dataclass(frozen=True)
class RequestInfo:
    """What a request interceptor sees (see Twin.add_request_interceptor)."""

    method: str
    verb: str
    group: str
    version: str
    resource: str
    subresource: str | None
    namespace: str | None
    name: str | None


def _verb(method: str, tgt: Target, query: dict[str, str]) -> str:
    if method == "GET":
        if tgt.name is None:
            return "watch" if query.get("watch") in ("true", "1") else "list"
        return "get"
    if method == "DELETE":
        return "delete" if tgt.name else "deletecollection"
    return {"POST": "create", "PUT": "update", "PATCH": "patch"}.get(method, method.lower())


class _NotFoundText(Exception):
    """Unknown group/version: a real server answers text/plain, not a Status."""


@dataclass
class Target:
    group: str
    version: str
    rt: ResourceType
    namespace: str | None
    name: str | None
    sub: str | None


def _content_type(headers: Any) -> str:
    return str(headers.get("Content-Type") or "").split(";")[0].strip().lower()


def _json(obj: Any) -> bytes:
    return json.dumps(obj, separators=(",", ":")).encode()


class _Server(ThreadingHTTPServer):
    def handle_error(self, request: Any, client_address: Any) -> None:
        """Dropped connections (clients gone, shutdown) are routine: log them quietly."""
        import sys

        exc = sys.exc_info()[1]
        if isinstance(exc, ConnectionError | TimeoutError | ssl.SSLError):
            log.debug("connection from %s dropped: %s", client_address, exc)
            return
        log.exception("error serving %s", client_address)


class ApiServer:
    def __init__(self, twin: Any, host: str = "127.0.0.1", port: int = 0) -> None:
        self.twin = twin
        self.store = twin.store
        self.profile = twin.profile
        self.request_log = RequestLog()
        self.encode_cache: dict[tuple[Any, ...], bytes] = {}
        self.stopping = threading.Event()
        self._conns: set[socket.socket] = set()
        self._conns_lock = threading.Lock()
        server = self

        class Handler(_Handler):
            api = server

        try:
            self.httpd = _Server((host, port), Handler)
        except OSError as exc:
            raise OSError(
                exc.errno, f"the Kubernetes API cannot listen on {host}:{port}: {exc.strerror}"
            ) from exc
        if twin.tls is not None:
            # The handshake runs on the connection's own thread (setup), never on the
            # accepting loop: one slow or broken client does not stall the others.
            self.httpd.socket = twin.tls.server_context().wrap_socket(
                self.httpd.socket, server_side=True, do_handshake_on_connect=False
            )
        self.httpd.daemon_threads = True
        self.httpd.request_queue_size = 256
        self.port = self.httpd.server_address[1]
        self.host = host
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        self._thread = threading.Thread(
            target=self.httpd.serve_forever,
            kwargs={"poll_interval": 0.2},
            name="twin-api",
            daemon=True,
        )
        self._thread.start()

    def stop(self) -> None:
        self.stopping.set()
        self.httpd.shutdown()
        with self._conns_lock:
            conns = list(self._conns)
        for c in conns:
            try:
                c.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
        self.httpd.server_close()
        if self._thread is not None:
            self._thread.join(timeout=5)  # serve_forever returns within one poll interval

    def track(self, conn: socket.socket, add: bool) -> None:
        with self._conns_lock:
            if add:
                self._conns.add(conn)
            else:
                self._conns.discard(conn)

    # ---- routing -------------------------------------------------------------------

    def resolve(self, parts: list[str]) -> tuple[str, str, list[str]] | None:
        """Split /api/v1/... or /apis/g/v/... into (group, version, rest)."""
        if parts[:2] == ["api", "v1"]:
            return "", "v1", parts[2:]
        if len(parts) >= 3 and parts[0] == "apis":
            group, version = parts[1], parts[2]
            if version not in self.profile.group_versions(group):
                raise _NotFoundText()
            return group, version, parts[3:]
        return None

    def target(self, group: str, version: str, rest: list[str]) -> Target:
        namespace = None
        if len(rest) >= 3 and rest[0] == "namespaces" and rest[2] not in ("status", "finalize"):
            namespace, rest = rest[1], rest[2:]
        if not rest or len(rest) > 3:
            raise errors.unknown_resource()
        rt = self.profile.lookup(group, version, rest[0])
        if rt is None:
            raise errors.unknown_resource()
        if rt.namespaced and namespace is None and len(rest) > 1:
            raise errors.unknown_resource()
        if not rt.namespaced and namespace is not None:
            raise errors.unknown_resource()
        name = rest[1] if len(rest) > 1 else None
        sub = rest[2] if len(rest) > 2 else None
        if sub is not None and sub not in rt.subresources:
            raise errors.unknown_resource()
        return Target(group, version, rt, namespace, name, sub)


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server_version = "sickbay-twin"
    api: ApiServer

    def setup(self) -> None:
        if isinstance(self.request, ssl.SSLSocket):
            self.request.settimeout(30.0)  # a client that never finishes its handshake
            self.request.do_handshake()
            self.request.settimeout(None)
        super().setup()
        # Headers and body go out in separate writes: without TCP_NODELAY, Nagle plus the
        # client's delayed ACK would add ~40 ms to every keep-alive request.
        self.connection.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.api.track(self.connection, True)

    def finish(self) -> None:
        self.api.track(self.connection, False)
        try:
            super().finish()
        except OSError:
            pass

    def log_message(self, format: str, *args: Any) -> None:
        log.debug("%s " + format, self.address_string(), *args)

    # Every method funnels into _handle.
    def do_GET(self) -> None:
        self._handle("GET")

    def do_POST(self) -> None:
        self._handle("POST")

    def do_PUT(self) -> None:
        self._handle("PUT")

    def do_PATCH(self) -> None:
        self._handle("PATCH")

    def do_DELETE(self) -> None:
        self._handle("DELETE")

    # ---- plumbing --------------------------------------------------------------------

    def _read_body(self) -> bytes:
        length = int(self.headers.get("Content-Length") or 0)
        if length:
            return self.rfile.read(length)
        if self.headers.get("Transfer-Encoding", "").lower() == "chunked":
            data = b""
            while True:
                size = int(self.rfile.readline().strip() or b"0", 16)
                if size == 0:
                    self.rfile.readline()
                    return data
                data += self.rfile.read(size)
                self.rfile.readline()
        return b""

    def _send(
        self,
        status: int,
        body: bytes,
        content_type: str = "application/json",
        headers: dict[str, str] | None = None,
    ) -> None:
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        self.send_header("Cache-Control", "no-cache, private")
        for k, v in (headers or {}).items():
            self.send_header(k, v)
        self._status = status
        self._record()  # before the body leaves: a client that got the answer sees the record
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    def _send_json(self, status: int, obj: Any) -> None:
        self._send(status, _json(obj), headers=self._extra_headers)

    def _handle(self, method: str) -> None:
        self._start = time.perf_counter()
        self._status = 0
        self._recorded = False
        self._extra_headers: dict[str, str] = {}
        split = urlsplit(self.path)
        self._split = split
        path = split.path
        self._query = {k: v[-1] for k, v in parse_qs(split.query, keep_blank_values=True).items()}
        info = {"verb": "", "group": "", "version": "", "resource": "", "namespace": "", "name": ""}
        self._info = info
        body = b""
        self._body = b""
        try:
            body = self._read_body()
            self._body = body
            self._dispatch(method, path, body)
        except _NotFoundText:
            self._send(404, b"404 page not found\n", "text/plain; charset=utf-8")
        except errors.ApiError as exc:
            self._send_json(exc.code, exc.to_status())
        except (BrokenPipeError, ConnectionResetError):
            self.close_connection = True
            self._status = self._status or 499
        except Exception as exc:  # a bug in the twin: answer 500 and say so in the log
            log.exception("internal error on %s %s", method, self.path)
            try:
                self._send_json(
                    500,
                    errors.ApiError(
                        500, "InternalError", f"Internal error occurred: {exc}"
                    ).to_status(),
                )
            except OSError:
                self.close_connection = True
        finally:
            self._record()

    def _record(self) -> None:
        """Add this request to the log once (on the first answer, or at the end)."""
        if self._recorded or self._split.path.startswith("/twin/"):
            return
        self._recorded = True
        info = self._info
        self.api.request_log.add(
            RequestRecord(
                time=time.time(),
                method=self.command,
                path=self._split.path,
                query=self._split.query,
                verb=info["verb"],
                group=info["group"],
                version=info["version"],
                resource=info["resource"],
                namespace=info["namespace"],
                name=info["name"],
                status=self._status,
                duration_ms=(time.perf_counter() - self._start) * 1000.0,
                user_agent=self.headers.get("User-Agent", ""),
                created=info.get("created", ""),
            )
        )

    def _dispatch(self, method: str, path: str, body: bytes) -> None:
        parts = [unquote(p) for p in path.split("/") if p]
        if parts and parts[0] == "twin":
            return self._twin_endpoint(method, parts[1:])
        self._who = authz.authenticate(
            self.api.twin.token, self.headers, self.api.twin.token_identity
        )
        profile = self.api.profile
        if method == "GET":
            if path in ("/healthz", "/livez", "/readyz"):
                return self._send(200, b"ok", "text/plain; charset=utf-8")
            if parts == ["version"]:
                return self._send_json(200, profile.version_info())
            if parts[:2] == ["openapi", "v3"]:
                return self._openapi(parts[2:])
            accept = self.headers.get("Accept", "")
            if parts == ["api"]:
                if "as=APIGroupDiscoveryList" in accept:
                    return self._send(
                        200,
                        _json(profile.aggregated(core=True)),
                        "application/json;g=apidiscovery.k8s.io;v=v2;as=APIGroupDiscoveryList",
                    )
                host = f"{self.api.host}:{self.api.port}"
                return self._send_json(200, profile.api_versions(host))
            if parts == ["apis"]:
                if "as=APIGroupDiscoveryList" in accept:
                    return self._send(
                        200,
                        _json(profile.aggregated(core=False)),
                        "application/json;g=apidiscovery.k8s.io;v=v2;as=APIGroupDiscoveryList",
                    )
                return self._send_json(200, profile.api_group_list())
            if parts == ["api", "v1"]:
                return self._send_json(200, profile.resource_list("", "v1"))
            if len(parts) == 2 and parts[0] == "apis":
                doc = profile.api_group(parts[1])
                if doc is None:
                    raise _NotFoundText()
                return self._send_json(200, {"kind": "APIGroup", "apiVersion": "v1", **doc})
            if len(parts) == 3 and parts[0] == "apis":
                doc = profile.resource_list(parts[1], parts[2])
                if doc is None:
                    raise _NotFoundText()
                return self._send_json(200, doc)
        resolved = self.api.resolve(parts)
        if resolved is None:
            raise _NotFoundText()
        group, version, rest = resolved
        tgt = self.api.target(group, version, rest)
        info = self._info
        info.update(
            group=group,
            version=version,
            resource=tgt.rt.plural + (f"/{tgt.sub}" if tgt.sub else ""),
            namespace=tgt.namespace or "",
            name=tgt.name or "",
        )
        warning = profile.deprecation_warning(group, version, tgt.rt)
        if warning:
            self._extra_headers["Warning"] = warning
        verb = _verb(method, tgt, self._query)
        if not self._who.unrestricted:
            attrs = {
                "verb": verb,
                "group": group,
                "resource": tgt.rt.plural,
                "subresource": tgt.sub or "",
                "namespace": tgt.namespace or "",
                "name": tgt.name or "",
            }
            if not authz.authorize(self.api.store, self._who, attrs)[0]:
                info["verb"] = verb
                raise authz.forbidden(self._who, attrs)
        for interceptor in list(self.api.twin.request_interceptors):
            outcome = interceptor(
                RequestInfo(
                    method, verb, group, version, tgt.rt.plural, tgt.sub, tgt.namespace, tgt.name
                )
            )
            if outcome is None:
                continue
            info["verb"] = verb
            if isinstance(outcome, errors.ApiError):
                raise outcome
            if outcome == "reset":
                self._status = 0
                self.close_connection = True
                self.connection.setsockopt(
                    socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\x00\x00\x00\x00\x00\x00\x00"
                )
                self.connection.close()
                return None
            if isinstance(outcome, int | float):
                time.sleep(float(outcome))  # injected latency (a drill's "timeout")
        if tgt.rt.create_only:
            return self._review(method, tgt, body)
        if method == "GET":
            if tgt.name is None:
                if self._query.get("watch") in ("true", "1"):
                    info["verb"] = "watch"
                    return self._watch(tgt)
                info["verb"] = "list"
                return self._list(tgt)
            info["verb"] = "get"
            return self._get(tgt)
        if method == "POST":
            info["verb"] = "create"
            return self._create(tgt, body)
        if method == "PUT":
            info["verb"] = "update"
            return self._update(tgt, body)
        if method == "PATCH":
            info["verb"] = "patch"
            return self._patch(tgt, body)
        if method == "DELETE":
            info["verb"] = "delete" if tgt.name else "deletecollection"
            return self._delete(tgt, body)
        raise errors.method_not_allowed(
            "the server does not allow this method on the requested resource"
        )

    def _review(self, method: str, tgt: Target, body: bytes) -> None:
        """SelfSubject{Access,Rules}Review / SelfSubjectReview: answered, never stored."""
        self._info["verb"] = "create"
        if method != "POST" or tgt.name is not None:
            raise errors.method_not_allowed(
                "the server does not allow this method on the requested resource"
            )
        data = self._decode_object(tgt, body)
        if tgt.rt.plural == "tokenreviews":
            answer = authz.token_review(self.api.twin.token, self.api.twin.users, data)
        elif tgt.rt.plural == "subjectaccessreviews":
            answer = authz.subject_access_review(self.api.store, data)
        else:
            answer = authz.review(self.api.store, self._who, tgt.rt.plural, data)
        self._send_json(201, answer)

    def _openapi(self, parts: list[str]) -> None:
        profile = self.api.profile
        if not parts:  # the real server answers the index as text/plain (k8s_golden/112)
            return self._send(200, _json(openapi.root(profile)), "text/plain; charset=utf-8")
        found = openapi.lookup(profile, parts)
        if found is None:
            raise _NotFoundText()
        doc, pin = found
        cache = {"Cache-Control": "public, immutable"} if "hash" in self._query else {}
        self._send(200, doc, "application/json", {"Etag": f'"{pin}"', **cache})

    def _validate_fields(self, tgt: Target, data: Any) -> None:
        """fieldValidation=Strict refuses unknown fields (400); Warn adds Warning headers."""
        if tgt.rt.group == "events.k8s.io":
            return  # the body was already converted to the core/v1 shape the store keeps
        warnings = openapi.validate(
            self.api.profile, tgt.rt, tgt.version, data, self._query.get("fieldValidation")
        )
        if warnings:
            known = self._extra_headers.get("Warning")
            self._extra_headers["Warning"] = ", ".join(([known] if known else []) + warnings)

    def _twin_endpoint(self, method: str, parts: list[str]) -> None:
        if parts == ["healthz"]:
            store = self.api.store
            return self._send_json(
                200,
                {
                    "status": "ok",
                    "profile": self.api.profile.name,
                    "resourceVersion": str(store.resource_version),
                    "nodes": store.count("nodes"),
                    "pods": store.count("pods"),
                    "watches": store.watch_count,
                },
            )
        if parts == ["requests"]:
            if method == "DELETE":
                self.api.request_log.clear()
                return self._send_json(200, {"cleared": True})
            filters: dict[str, Any] = {}
            for key in ("verb", "resource", "namespace", "name", "group", "method"):
                if key in self._query:
                    filters[key] = self._query[key]
            if "status" in self._query:
                filters["status"] = int(self._query["status"])
            return self._send_json(200, {"items": self.api.request_log.as_dicts(**filters)})
        handler = self.api.twin.http_handlers.get(parts[0]) if parts else None
        if handler is not None:
            status, payload = handler(method, parts[1:], dict(self._query), self._body)
            return self._send_json(status, payload)
        raise _NotFoundText()

    # ---- representation --------------------------------------------------------------

    def _present(self, tgt: Target, obj: dict[str, Any]) -> dict[str, Any]:
        if tgt.rt.group == "events.k8s.io":
            return event_to_v1(obj)
        out = dict(obj)
        out["apiVersion"] = tgt.rt.api_version(tgt.version)
        out["kind"] = tgt.rt.kind
        return out

    def _decode(self, tgt: Target, body: bytes, yaml_ok: bool = False) -> Any:
        if not body:
            raise errors.bad_request("the body of the request was in an unknown format")
        if _content_type(self.headers) == protobuf.CONTENT_TYPE:
            return protobuf.decode(body)  # kubectl's typed clients (create, drain, auth)
        try:
            data = yaml.safe_load(body) if yaml_ok else json.loads(body)
        except (ValueError, yaml.YAMLError) as exc:
            raise errors.bad_request(
                f"the body of the request was in an unknown format: {exc}"
            ) from None
        return data

    def _decode_object(self, tgt: Target, body: bytes) -> dict[str, Any]:
        ctype = _content_type(self.headers) or "application/json"
        if ctype not in ("application/json", "application/yaml", "*/*", protobuf.CONTENT_TYPE):
            raise errors.ApiError(415, "UnsupportedMediaType", "415: Unsupported Media Type", {})
        data = self._decode(tgt, body, yaml_ok=ctype == "application/yaml")
        if not isinstance(data, dict):
            raise errors.bad_request("the body of the request must be a JSON object")
        expected = tgt.rt.api_version(tgt.version)
        if data.get("apiVersion") and data["apiVersion"] != expected:
            raise errors.bad_request(
                f"the API version in the data ({data['apiVersion']}) does not match the expected "
                f"API version ({expected})"
            )
        if data.get("kind") and data["kind"] != tgt.rt.kind:
            raise errors.bad_request(
                f"the kind in the data ({data['kind']}) does not match the expected kind ({tgt.rt.kind})"
            )
        if not isinstance(data.get("metadata", {}), dict):
            raise errors.bad_request("metadata must be an object")
        if tgt.rt.group == "events.k8s.io":
            data = event_from_v1(data)
        return data

    def _dry_run(self) -> bool:
        value = self._query.get("dryRun")
        if value in (None, ""):
            return False
        if value != "All":
            raise errors.invalid(
                "",
                "",
                [
                    errors.cause(
                        "dryRun",
                        "FieldValueNotSupported",
                        f'Unsupported value: "{value}": supported values: "All"',
                    )
                ],
            )
        return True

    def _manager(self) -> str:
        manager = self._query.get("fieldManager")
        if manager:
            return manager
        agent = self.headers.get("User-Agent", "") or "unknown"
        return agent.split("/")[0] or "unknown"

    # ---- verbs -----------------------------------------------------------------------

    def _get(self, tgt: Target) -> None:
        store = self.api.store
        assert tgt.name is not None
        if tgt.sub in ("eviction", "binding"):
            raise errors.method_not_allowed(
                "the server does not allow this method on the requested resource"
            )
        if tgt.rt.storage == "poddisruptionbudgets.policy":
            disruption.refresh(store, tgt.namespace or "", tgt.name)
        obj = store.get_ref(tgt.rt, tgt.name, tgt.namespace)
        if obj is None:
            raise errors.not_found(tgt.rt.plural, tgt.name, tgt.rt.group)
        if tgt.sub == "scale":
            return self._send_json(200, self._scale(tgt, obj))
        if tgt.sub == "log":
            output = self.api.twin.extensions.get("container_output")
            text = logs.pod_log(obj, self._query, self.api.store.now(), output)
            return self._send(200, text.encode(), "text/plain", self._extra_headers)
        if tgt.sub is None and "as=Table" in self.headers.get("Accept", ""):
            meta = {"resourceVersion": obj["metadata"].get("resourceVersion", "")}
            return self._send(
                200,
                _json(self._table(tgt, [obj], meta)),
                "application/json;as=Table;v=v1;g=meta.k8s.io",
                self._extra_headers,
            )
        self._send_json(200, self._present(tgt, obj))

    def _scale(self, tgt: Target, obj: dict[str, Any]) -> dict[str, Any]:
        meta = obj["metadata"]
        spec, status = obj.get("spec") or {}, obj.get("status") or {}
        selector = status.get("selector")
        if selector is None:
            match = (spec.get("selector") or {}).get("matchLabels") or {}
            selector = ",".join(f"{k}={v}" for k, v in sorted(match.items()))
        return {
            "apiVersion": "autoscaling/v1",
            "kind": "Scale",
            "metadata": {
                "name": meta["name"],
                "namespace": meta.get("namespace"),
                "uid": meta.get("uid"),
                "resourceVersion": meta.get("resourceVersion"),
                "creationTimestamp": meta.get("creationTimestamp"),
            },
            "spec": {"replicas": spec.get("replicas", 0)},
            "status": {"replicas": status.get("replicas", 0), "selector": selector},
        }

    def _list(self, tgt: Target) -> None:
        store = self.api.store
        q = self._query
        fs = parse_field_selector(tgt.rt.key, q.get("fieldSelector"))  # events.k8s.io: regarding.*
        ls = parse_label_selector(q.get("labelSelector"))
        limit = None
        if q.get("limit"):
            try:
                limit = int(q["limit"])
            except ValueError:
                raise errors.bad_request(f"invalid limit {q['limit']!r}") from None
        result = store.list(
            tgt.rt,
            tgt.namespace,
            ls,
            fs,
            limit=limit if limit and limit > 0 else None,
            continue_token=q.get("continue") or None,
            copy_objects=False,
        )
        meta: dict[str, Any] = {"resourceVersion": str(result.resource_version)}
        if result.continue_token:
            meta["continue"] = result.continue_token
            if result.remaining_item_count is not None:  # unset when a selector filtered
                meta["remainingItemCount"] = result.remaining_item_count
        accept = self.headers.get("Accept", "")
        if "as=PartialObjectMetadataList" in accept:
            doc = {
                "kind": "PartialObjectMetadataList",
                "apiVersion": "meta.k8s.io/v1",
                "metadata": meta,
                "items": [
                    {
                        "kind": "PartialObjectMetadata",
                        "apiVersion": "meta.k8s.io/v1",
                        "metadata": o["metadata"],
                    }
                    for o in result.items
                ],
            }
            return self._send(
                200,
                _json(doc),
                "application/json;as=PartialObjectMetadataList;v=v1;g=meta.k8s.io",
                self._extra_headers,
            )
        if "as=Table" in accept:
            return self._send(
                200,
                _json(self._table(tgt, result.items, meta)),
                "application/json;as=Table;v=v1;g=meta.k8s.io",
                self._extra_headers,
            )
        # Objects are immutable per resourceVersion, so their encoding is cached: a list is a
        # join of cached item bytes (json.dumps of 1,000 pods alone takes ~30 ms).
        items = b",".join(self._encoded(tgt, o, in_list=True) for o in result.items)
        head = _json(
            {
                "kind": tgt.rt.list_kind,
                "apiVersion": tgt.rt.api_version(tgt.version),
                "metadata": meta,
            }
        )
        self._send(200, head[:-1] + b',"items":[' + items + b"]}", headers=self._extra_headers)

    def _encoded(self, tgt: Target, obj: dict[str, Any], in_list: bool = False) -> bytes:
        meta = obj["metadata"]
        key = (
            tgt.rt.group,
            tgt.rt.storage,
            tgt.version,
            meta.get("uid"),
            meta.get("resourceVersion"),
            in_list,
        )
        cache = self.api.encode_cache
        data = cache.get(key)
        if data is None:
            shown = self._present(tgt, obj)
            if in_list:
                shown.pop("apiVersion", None)
                shown.pop("kind", None)
            data = _json(shown)
            if len(cache) >= ENCODE_CACHE_SIZE:
                cache.clear()  # crude bound: re-encoding is cheap compared to a leak
            cache[key] = data
        return data

    def _table(
        self, tgt: Target, items: list[dict[str, Any]], meta: dict[str, Any]
    ) -> dict[str, Any]:
        """meta.k8s.io/v1 Table (kubectl get): columns as kube-apiserver prints them."""
        return printing.table(
            tgt.rt,
            items,
            self.api.store.now(),
            meta["resourceVersion"],
            lambda o: self._present(tgt, o),
            include=self._query.get("includeObject") or "Metadata",
        )

    def _watch(self, tgt: Target) -> None:
        store = self.api.store
        q = self._query
        fs = parse_field_selector(tgt.rt.key, q.get("fieldSelector"))
        ls = parse_label_selector(q.get("labelSelector"))
        try:
            timeout = float(q.get("timeoutSeconds") or WATCH_DEFAULT_TIMEOUT)
        except ValueError:
            raise errors.bad_request("invalid timeoutSeconds") from None
        rv: str | int | None = q.get("resourceVersion") or None
        bookmarks = q.get("allowWatchBookmarks") in ("true", "1")
        initial = q.get("sendInitialEvents") in ("true", "1")
        if initial and not bookmarks:
            raise errors.invalid(
                "ListOptions",
                "",
                [
                    errors.cause(
                        "allowWatchBookmarks",
                        "FieldValueForbidden",
                        "Forbidden: sendInitialEvents requires setting allowWatchBookmarks=true",
                    )
                ],
                "meta.k8s.io",
            )
        error_event: dict[str, Any] | None = None
        watch = None
        initial_items: list[dict[str, Any]] = []
        try:
            with store.lock:  # the initial list and the watch start at one resourceVersion
                if initial:
                    listed = store.list(tgt.rt, tgt.namespace, ls, fs, copy_objects=False)
                    initial_items, rv = listed.items, listed.resource_version
                watch = store.watch(tgt.rt, tgt.namespace, ls, fs, rv, copy_objects=False)
        except errors.ApiError as exc:
            if exc.code != 410:
                raise
            error_event = {"type": "ERROR", "object": exc.to_status()}
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Transfer-Encoding", "chunked")
        self.send_header("Cache-Control", "no-cache, private")
        for k, v in self._extra_headers.items():
            self.send_header(k, v)
        self._status = 200
        self._record()
        self.end_headers()

        def chunk(data: bytes) -> None:
            self.wfile.write(f"{len(data):x}\r\n".encode() + data + b"\r\n")
            self.wfile.flush()

        try:
            if error_event is not None:
                chunk(_json(error_event) + b"\n")
                return
            assert watch is not None
            last_rv = str(rv or store.resource_version)

            def bookmark(annotations: dict[str, str] | None = None) -> None:
                nonlocal last_rv
                # Like kube-apiserver's watch cache: a bookmark says "nothing for you up to the
                # current resourceVersion", so an idle watch moves on while other kinds change.
                # Only with nothing queued for this watch: it must never skip an event.
                with store.lock:
                    if watch.idle:
                        last_rv = str(max(int(last_rv), store.resource_version))
                meta: dict[str, Any] = {"resourceVersion": last_rv}
                if annotations:
                    meta["annotations"] = annotations
                obj = {
                    "kind": tgt.rt.kind,
                    "apiVersion": tgt.rt.api_version(tgt.version),
                    "metadata": meta,
                }
                chunk(_json({"type": "BOOKMARK", "object": obj}) + b"\n")

            as_table = "as=Table" in self.headers.get("Accept", "")
            headers_sent = [False]

            def encoded(obj: dict[str, Any]) -> bytes:
                """The event's object; a one-row Table for `kubectl get -w` (columns once)."""
                if not as_table:
                    return self._encoded(tgt, obj)
                doc = printing.table(
                    tgt.rt,
                    [obj],
                    store.now(),
                    obj["metadata"].get("resourceVersion", ""),
                    lambda o: self._present(tgt, o),
                    with_columns=not headers_sent[0],
                    include=self._query.get("includeObject") or "Metadata",
                )
                headers_sent[0] = True
                return _json(doc)

            for item in initial_items:
                chunk(b'{"type":"ADDED","object":' + encoded(item) + b"}\n")
            if initial:
                bookmark({"k8s.io/initial-events-end": "true"})
            deadline = time.monotonic() + timeout
            last_sent = time.monotonic()
            stopping = self.api.stopping
            while not stopping.is_set():
                left = deadline - time.monotonic()
                if left <= 0:
                    if bookmarks:
                        bookmark()
                    break
                ev = watch.get(timeout=min(_POLL, left))
                if ev is None:
                    if watch.closed:
                        break
                    if bookmarks and time.monotonic() - last_sent > BOOKMARK_INTERVAL:
                        bookmark()
                        last_sent = time.monotonic()
                    continue
                etype = ev.type if ev.type in (ADDED, MODIFIED, DELETED) else MODIFIED
                last_rv = ev.object["metadata"]["resourceVersion"]
                chunk(b'{"type":"' + etype.encode() + b'","object":' + encoded(ev.object) + b"}\n")
                last_sent = time.monotonic()
        finally:
            if watch is not None:
                watch.close()
                if watch.aborted:  # a dropped connection (fault): no clean end of stream
                    with contextlib.suppress(OSError):
                        self.connection.shutdown(socket.SHUT_RDWR)
            try:
                self.wfile.write(b"0\r\n\r\n")
                self.wfile.flush()
            except OSError:
                self.close_connection = True

    def _create(self, tgt: Target, body: bytes) -> None:
        store = self.api.store
        if tgt.name is not None:
            if tgt.sub == "eviction":
                data = self._decode(tgt, body)
                disruption.evict(
                    store,
                    tgt.namespace or "",
                    tgt.name,
                    data if isinstance(data, dict) else {},
                    self._dry_run(),
                )
                return self._send_json(
                    201,
                    {
                        "kind": "Status",
                        "apiVersion": "v1",
                        "metadata": {},
                        "status": "Success",
                        "code": 201,
                    },
                )
            if tgt.sub == "binding":
                return self._bind(tgt, body)
            if tgt.sub == "token":
                return self._token_request(tgt, body)
            raise errors.method_not_allowed(
                "the server does not allow this method on the requested resource"
            )
        obj = self._decode_object(tgt, body)
        self._validate_fields(tgt, obj)
        created = store.create(
            tgt.rt, obj, tgt.namespace, dry_run=self._dry_run(), manager=self._manager()
        )
        self._info["created"] = str((created.get("metadata") or {}).get("name") or "")
        if tgt.rt.namespaced:
            # Pod Security admission's warnings: a pod failing the `warn` level, a workload
            # whose pod template its namespace's levels would refuse (nothing refused here).
            found = podsecurity.warnings(
                store.namespace_labels(tgt.namespace), tgt.rt.storage, created
            )
            if found:
                known = self._extra_headers.get("Warning")
                # A quoted-string: the server escapes `"` and `\` (kubectl shows the text).
                quoted = (w.replace("\\", "\\\\").replace('"', '\\"') for w in found)
                texts = [f'299 - "{q}"' for q in quoted]
                self._extra_headers["Warning"] = ", ".join(([known] if known else []) + texts)
        self._send_json(201, self._present(tgt, created))

    def _token_request(self, tgt: Target, body: bytes) -> None:
        """TokenRequest (`kubectl create token`, the kubelet's projected token): a bearer
        token for the ServiceAccount, answered with the request's spec, defaults filled in."""
        assert tgt.name is not None and tgt.namespace is not None
        data = self._decode(tgt, body)
        spec = dict((data or {}).get("spec") or {}) if isinstance(data, dict) else {}
        # The API server's defaults: one hour, its own audience.
        seconds = int(spec.get("expirationSeconds") or 3600)
        if seconds < 600:
            raise errors.invalid(
                "TokenRequest",
                tgt.name,
                [
                    errors.cause(
                        "spec.expirationSeconds",
                        "FieldValueInvalid",
                        f"Invalid value: {seconds}: may not specify a duration less than 10 minutes",
                    )
                ],
            )
        spec["expirationSeconds"] = seconds
        spec.setdefault("audiences", ["https://kubernetes.default.svc.cluster.local"])
        spec.setdefault("boundObjectRef", None)
        token = self.api.twin.mint_token(tgt.namespace, tgt.name)  # 404 when there is none
        now = self.api.store.clock.now()
        expires = now + timedelta(seconds=seconds)
        self._send_json(
            201,
            {
                "kind": "TokenRequest",
                "apiVersion": "authentication.k8s.io/v1",
                "metadata": {
                    "name": tgt.name,
                    "namespace": tgt.namespace,
                    "creationTimestamp": None,
                },
                "spec": spec,
                "status": {
                    "token": token,
                    "expirationTimestamp": expires.strftime("%Y-%m-%dT%H:%M:%SZ"),
                },
            },
        )

    def _bind(self, tgt: Target, body: bytes) -> None:
        data = self._decode(tgt, body)
        node = ((data or {}).get("target") or {}).get("name") if isinstance(data, dict) else None
        if not node:
            raise errors.invalid("Binding", tgt.name or "", [errors.required("target.name")])
        store = self.api.store
        now = format_time(store.now())

        def bind(pod: dict[str, Any]) -> None:
            current = (pod.get("spec") or {}).get("nodeName")
            if current:
                raise errors.conflict(
                    "pods",
                    tgt.name or "",
                    "",
                    f'pod {tgt.name} is already assigned to node "{current}"',
                )
            pod["spec"]["nodeName"] = node

        store.mutate("pods", tgt.name or "", bind, tgt.namespace, manager=self._manager())

        def scheduled(pod: dict[str, Any]) -> None:
            conds = [
                c
                for c in pod.setdefault("status", {}).get("conditions") or []
                if c.get("type") != "PodScheduled"
            ]
            conds.append(
                {
                    "type": "PodScheduled",
                    "status": "True",
                    "lastProbeTime": None,
                    "lastTransitionTime": now,
                }
            )
            pod["status"]["conditions"] = conds

        store.mutate("pods", tgt.name or "", scheduled, tgt.namespace, subresource="status")
        self._send_json(
            201,
            {
                "kind": "Status",
                "apiVersion": "v1",
                "metadata": {},
                "status": "Success",
                "code": 201,
            },
        )

    def _update(self, tgt: Target, body: bytes) -> None:
        store = self.api.store
        if tgt.name is None or tgt.sub in ("eviction", "binding"):
            raise errors.method_not_allowed(
                "the server does not allow this method on the requested resource"
            )
        if tgt.sub == "scale":
            data = self._decode(tgt, body)
            replicas = (
                ((data or {}).get("spec") or {}).get("replicas") if isinstance(data, dict) else None
            )
            return self._set_replicas(
                tgt,
                replicas,
                (data.get("metadata") or {}).get("resourceVersion")
                if isinstance(data, dict)
                else None,
            )
        obj = self._decode_object(tgt, body)
        self._validate_fields(tgt, obj)
        updated = store.update(
            tgt.rt,
            obj,
            subresource=tgt.sub,
            dry_run=self._dry_run(),
            manager=self._manager(),
            namespace=tgt.namespace,
            name=tgt.name,
        )
        self._send_json(200, self._present(tgt, updated))

    def _set_replicas(self, tgt: Target, replicas: Any, rv: str | None) -> None:
        if not isinstance(replicas, int) or replicas < 0:
            raise errors.invalid(
                "Scale",
                tgt.name or "",
                [
                    errors.cause(
                        "spec.replicas",
                        "FieldValueInvalid",
                        f"Invalid value: {replicas!r}: must be greater than or equal to 0",
                    )
                ],
                "autoscaling",
            )
        store = self.api.store

        def scale(obj: dict[str, Any]) -> None:
            if rv and rv != obj["metadata"]["resourceVersion"]:
                raise errors.conflict(tgt.rt.plural, tgt.name or "", tgt.rt.group)
            obj.setdefault("spec", {})["replicas"] = replicas

        updated = store.mutate(
            tgt.rt, tgt.name or "", scale, tgt.namespace, manager=self._manager()
        )
        self._send_json(200, self._scale(tgt, updated))

    def _patch(self, tgt: Target, body: bytes) -> None:
        store = self.api.store
        if tgt.name is None or tgt.sub in ("eviction", "binding"):
            raise errors.method_not_allowed(
                "the server does not allow this method on the requested resource"
            )
        ctype = (self.headers.get("Content-Type") or "").split(";")[0].strip().lower()
        patch_type = PATCH_TYPES.get(ctype)
        if patch_type is None:
            raise errors.ApiError(415, "UnsupportedMediaType", "415: Unsupported Media Type", {})
        dry_run = self._dry_run()
        if patch_type == "apply":
            data = self._decode(tgt, body, yaml_ok=True)
            if not isinstance(data, dict):
                raise errors.bad_request("apply patch body must be an object")
            self._validate_fields(tgt, data)
            force = self._query.get("force") in ("true", "1")
            obj, created = store.apply(
                tgt.rt,
                tgt.name,
                data,
                tgt.namespace,
                manager=self._query.get("fieldManager", ""),
                force=force,
                subresource=tgt.sub,
                dry_run=dry_run,
            )
            return self._send_json(201 if created else 200, self._present(tgt, obj))
        data = self._decode(tgt, body)
        if patch_type in ("merge", "strategic") and tgt.sub != "scale":
            self._validate_fields(tgt, data)
        if tgt.sub == "scale":
            current = store.get(tgt.rt, tgt.name, tgt.namespace)
            from twin.patch import apply_patch

            patched = apply_patch(
                tgt.rt,
                self._scale(tgt, current),
                data,
                "merge" if patch_type == "strategic" else patch_type,
            )
            return self._set_replicas(tgt, (patched.get("spec") or {}).get("replicas"), None)
        if tgt.rt.group == "events.k8s.io":
            current = store.get(tgt.rt, tgt.name, tgt.namespace)
            from twin.patch import apply_patch

            patched = event_from_v1(
                apply_patch(
                    tgt.rt,
                    event_to_v1(current),
                    data,
                    "merge" if patch_type == "strategic" else patch_type,
                )
            )
            updated = store.update(
                tgt.rt,
                patched,
                dry_run=dry_run,
                manager=self._manager(),
                namespace=tgt.namespace,
                name=tgt.name,
            )
            return self._send_json(200, self._present(tgt, updated))
        updated = store.patch(
            tgt.rt,
            tgt.name,
            data,
            tgt.namespace,
            patch_type=patch_type,
            subresource=tgt.sub,
            manager=self._manager(),
            dry_run=dry_run,
        )
        self._send_json(200, self._present(tgt, updated))

    def _delete_options(self, tgt: Target, body: bytes) -> dict[str, Any]:
        opts: dict[str, Any] = {}
        if body.strip():
            data = self._decode(tgt, body)
            if isinstance(data, dict):
                opts.update(data)
        q = self._query
        if "gracePeriodSeconds" in q:
            try:
                opts["gracePeriodSeconds"] = int(q["gracePeriodSeconds"])
            except ValueError:
                raise errors.bad_request("invalid gracePeriodSeconds") from None
        if "propagationPolicy" in q:
            opts["propagationPolicy"] = q["propagationPolicy"]
        if q.get("orphanDependents") == "true" and "propagationPolicy" not in opts:
            opts["propagationPolicy"] = "Orphan"
        if opts.get("orphanDependents") is True and "propagationPolicy" not in opts:
            opts["propagationPolicy"] = "Orphan"
        if isinstance(opts.get("dryRun"), list) and opts["dryRun"]:
            self._query["dryRun"] = opts["dryRun"][0]
        return opts

    def _delete(self, tgt: Target, body: bytes) -> None:
        store = self.api.store
        opts = self._delete_options(tgt, body)
        dry_run = self._dry_run()
        if tgt.name is None:
            fs_text = self._query.get("fieldSelector")
            deleted = store.delete_collection(
                tgt.rt,
                tgt.namespace,
                self._query.get("labelSelector"),
                fs_text if tgt.rt.group != "events.k8s.io" else _events_fs(fs_text),
                opts.get("gracePeriodSeconds"),
                opts.get("propagationPolicy"),
                dry_run,
            )
            items = [self._present(tgt, o) for o in deleted]
            return self._send_json(
                200,
                {
                    "kind": tgt.rt.list_kind,
                    "apiVersion": tgt.rt.api_version(tgt.version),
                    "metadata": {"resourceVersion": str(store.resource_version)},
                    "items": items,
                },
            )
        if tgt.sub is not None:
            raise errors.method_not_allowed(
                "the server does not allow this method on the requested resource"
            )
        result = store.delete(
            tgt.rt,
            tgt.name,
            tgt.namespace,
            opts.get("gracePeriodSeconds"),
            opts.get("propagationPolicy"),
            opts.get("preconditions"),
            dry_run,
        )
        if result.removed and tgt.rt.storage not in RETURNS_DELETED_OBJECT:
            meta = result.object["metadata"]
            details: dict[str, Any] = {
                "name": meta["name"],
                "kind": tgt.rt.plural,
                "uid": meta.get("uid"),
            }
            if tgt.rt.group:
                details["group"] = tgt.rt.group
            return self._send_json(
                200,
                {
                    "kind": "Status",
                    "apiVersion": "v1",
                    "metadata": {},
                    "status": "Success",
                    "details": details,
                },
            )
        self._send_json(200, self._present(tgt, result.object))


def _events_fs(text: str | None) -> str | None:
    if not text:
        return text
    out = []
    for part in text.split(","):
        for name, core in EVENTS_V1_FIELDS.items():
            if part.startswith(name + "=") or part.startswith(name + "!="):
                part = core + part[len(name) :]
                break
        out.append(part)
    return ",".join(out)
