"""An RBAC-enforcing reverse proxy in front of the cluster twin (test helper).

The twin authenticates (token) but does not authorise. This proxy evaluates every resource
request against the rules of a ClusterRole (e.g. deploy/rbac.yaml), answers 403 Forbidden with
the Status body a real API server sends (k8s_golden/19), answers SelfSubjectAccessReviews
from the same rules, and forwards everything else to the twin, streaming watch responses.
Discovery (/version, /api, /apis/...) is allowed, as system:discovery allows it.
"""

from __future__ import annotations

import http.client
import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

import yaml

DEPLOY = Path(__file__).resolve().parents[3] / "deploy"


def deploy_rules(*roles: str) -> list[dict[str, Any]]:
    """The rules of the (Cluster)Roles deploy/rbac*.yaml ship: the named ones, or all (a cluster
    where every file was applied)."""
    rules: list[dict[str, Any]] = []
    found: set[str] = set()
    for path in sorted([*DEPLOY.glob("rbac*.yaml"), *DEPLOY.glob("components/*/rbac.yaml")]):
        for doc in yaml.safe_load_all(path.read_text()):
            if doc and doc["kind"] in ("ClusterRole", "Role"):
                if roles and doc["metadata"]["name"] not in roles:
                    continue
                found.add(doc["metadata"]["name"])
                rules += doc["rules"]
    missing = set(roles) - found
    assert not missing, f"deploy/ has no ClusterRole {sorted(missing)}"
    return rules


HOP_HEADERS = {"connection", "keep-alive", "transfer-encoding", "content-length", "host"}


def request_attributes(method: str, path: str, query: str) -> dict[str, str] | None:
    """(group, resource, subresource, verb, namespace, name) of a resource request, or None."""
    parts = [p for p in path.split("/") if p]
    if parts[:2] == ["api", "v1"]:
        group, rest = "", parts[2:]
    elif parts[:1] == ["apis"] and len(parts) >= 3:
        group, rest = parts[1], parts[3:]
    else:
        return None
    if not rest:
        return None
    namespace = ""
    if rest[0] == "namespaces" and len(rest) >= 3:
        namespace, rest = rest[1], rest[2:]
    resource = rest[0]
    name = rest[1] if len(rest) > 1 else ""
    sub = rest[2] if len(rest) > 2 else ""
    if resource == "namespaces" and not name and namespace:
        resource, name = "namespaces", namespace
    q = parse_qs(query)
    if method == "GET":
        verb = (
            "get"
            if name
            else ("watch" if q.get("watch", ["false"])[0] in ("true", "1") else "list")
        )
    elif method == "POST":
        verb = "create"
    elif method == "PUT":
        verb = "update"
    elif method == "PATCH":
        verb = "patch"
    elif method == "DELETE":
        verb = "delete" if name else "deletecollection"
    else:
        verb = method.lower()
    return {
        "group": group,
        "resource": resource,
        "subresource": sub,
        "verb": verb,
        "namespace": namespace,
        "name": name,
    }


def role_rules(documents: list[dict[str, Any]]) -> dict[str, list[dict[str, Any]]]:
    """namespace -> rules of every namespaced Role in `documents` (a manifest file's)."""
    out: dict[str, list[dict[str, Any]]] = {}
    for doc in documents:
        if doc and doc.get("kind") == "Role":
            out.setdefault(doc["metadata"]["namespace"], []).extend(doc.get("rules") or [])
    return out


def allows(
    rules: list[dict[str, Any]], group: str, resource: str, sub: str, verb: str, name: str = ""
) -> bool:
    full = f"{resource}/{sub}" if sub else resource
    for rule in rules:
        # resourceNames: only requests for one of those objects (never a create or a list)
        if rule.get("resourceNames") and name not in rule["resourceNames"]:
            continue
        if not ({"*", group} & set(rule.get("apiGroups") or [])):
            continue
        if not ({"*", full} & set(rule.get("resources") or [])):
            continue
        if {"*", verb} & set(rule.get("verbs") or []):
            return True
    return False


class RbacProxy:
    def __init__(
        self,
        upstream: str,
        rules: list[dict[str, Any]],
        user: str = "sickbay",
        roles: dict[str, list[dict[str, Any]]] | None = None,
    ) -> None:
        split = urlsplit(upstream)
        # namespace -> rules of the Roles bound there (deploy/rbac.yaml's Lease Role)
        self.roles = roles or {}
        self.upstream_host = split.hostname or "127.0.0.1"
        self.upstream_port = split.port or 80
        self.rules = rules
        self.user = user
        self.denied: list[dict[str, str]] = []
        self.reviews: list[dict[str, Any]] = []
        proxy = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args: Any) -> None:
                pass

            def _body(self) -> bytes:
                length = int(self.headers.get("Content-Length") or 0)
                return self.rfile.read(length) if length else b""

            def _reply(self, status: int, obj: Any) -> None:
                data = json.dumps(obj).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def _handle(self, method: str) -> None:
                split = urlsplit(self.path)
                body = self._body()
                if method == "POST" and split.path.endswith("/selfsubjectaccessreviews"):
                    review = json.loads(body or b"{}")
                    attrs = (review.get("spec") or {}).get("resourceAttributes") or {}
                    proxy.reviews.append(attrs)
                    allowed = allows(
                        proxy.rules + proxy.roles.get(attrs.get("namespace", ""), []),
                        attrs.get("group", ""),
                        attrs.get("resource", ""),
                        attrs.get("subresource", ""),
                        attrs.get("verb", ""),
                        attrs.get("name", ""),
                    )
                    review["status"] = {"allowed": allowed}
                    self._reply(201, review)
                    return
                attrs = request_attributes(method, split.path, split.query)
                if attrs is not None and not allows(
                    proxy.rules + proxy.roles.get(attrs["namespace"], []),
                    attrs["group"],
                    attrs["resource"],
                    attrs["subresource"],
                    attrs["verb"],
                    attrs["name"],
                ):
                    proxy.denied.append(attrs)
                    res = attrs["resource"] + (
                        f"/{attrs['subresource']}" if attrs["subresource"] else ""
                    )
                    where = (
                        f' in the namespace "{attrs["namespace"]}"' if attrs["namespace"] else ""
                    )
                    self._reply(
                        403,
                        {
                            "apiVersion": "v1",
                            "kind": "Status",
                            "metadata": {},
                            "status": "Failure",
                            "message": f'{res} is forbidden: User "{proxy.user}" cannot '
                            f'{attrs["verb"]} resource "{res}" in API group '
                            f'"{attrs["group"]}"{where}',
                            "reason": "Forbidden",
                            "details": {"kind": attrs["resource"], "name": attrs["name"] or None},
                            "code": 403,
                        },
                    )
                    return
                conn = http.client.HTTPConnection(
                    proxy.upstream_host, proxy.upstream_port, timeout=60
                )
                headers = {k: v for k, v in self.headers.items() if k.lower() not in HOP_HEADERS}
                conn.request(method, self.path, body=body or None, headers=headers)
                resp = conn.getresponse()
                self.send_response(resp.status)
                for k, v in resp.getheaders():
                    if k.lower() not in HOP_HEADERS:
                        self.send_header(k, v)
                self.send_header("Transfer-Encoding", "chunked")
                self.end_headers()
                try:
                    while True:
                        chunk = resp.read1(65536)
                        if not chunk:
                            break
                        self.wfile.write(b"%x\r\n%s\r\n" % (len(chunk), chunk))
                        self.wfile.flush()
                    self.wfile.write(b"0\r\n\r\n")
                except (BrokenPipeError, ConnectionResetError):
                    self.close_connection = True
                finally:
                    conn.close()

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

        class Server(ThreadingHTTPServer):
            def handle_error(self, request: Any, client_address: Any) -> None:
                pass  # a watch cut when the twin stops is not a proxy failure

        self.server = Server(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}"

    def __enter__(self) -> RbacProxy:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.shutdown()
        self.server.server_close()
