"""The `Twin`: one store + one HTTP API server + controllers + a clock.

    twin = Twin(profile="1.36")
    twin.seed(nodes=2, gpus_per_node=2)          # twin/seed.py
    twin.add_controller(MyController())          # any object with start(twin) / stop()
    twin.start()                                 # serves http://127.0.0.1:<port>
    twin.write_kubeconfig(path)
    ...
    twin.stop()

Controllers (twin/controllers/, issue 4) act only through `twin.store` (see store.py for
its API: get/list/create/update/update_status/patch/mutate/delete/watch/watch_async/subscribe)
and take time from `twin.clock` (an object with `now() -> datetime` and `sleep(seconds)`;
twin/clock.py provides a time-scaled one; pass it as `Twin(clock=...)`).
`start(twin)` is called once the server is listening; it must not block (start a thread or an
asyncio task). `stop()` is called in reverse order on shutdown.

A built-in disruption controller keeps PodDisruptionBudget status current (twin/disruption.py).
Served with TLS (`Twin(tls=twin.tls.throwaway_pki(...))`: https, the CA in the kubeconfig), it
also publishes ConfigMap kube-root-ca.crt in every namespace (twin/rootca.py). ServiceAccount
tokens minted through TokenRequest (`kubectl create token`, the projected token of a pod)
authenticate as their account, with what RBAC grants it (twin/authz.py).

Extension points for fault injection and extra HTTP routes (no need to touch the server):
- `twin.add_request_interceptor(fn)`: fn(twin.server.RequestInfo) returns None (proceed),
  an ApiError (answer it: 500, 429, 409...), "reset" (drop the connection) or seconds to delay.
- `twin.add_http_handler(name, fn)`: fn(method, path_parts, query, body) -> (status, json),
  served at /twin/<name>/... next to /twin/healthz and /twin/requests.
- `twin.requests` (twin.server.RequestLog): entries(**filters), count(), clear(),
  rbac_rules() - every API call the server answered.
"""

from __future__ import annotations

import logging
import threading
from pathlib import Path
from typing import Any, Protocol

import yaml

from twin.discovery import Profile
from twin.store import Clock, Store, SystemClock

log = logging.getLogger(__name__)


class Controller(Protocol):
    def start(self, twin: Twin) -> None: ...

    def stop(self) -> None: ...


class Twin:
    def __init__(
        self,
        profile: str = "1.36",
        device_taint_rules: bool = True,
        token: str | None = None,
        clock: Clock | None = None,
        host: str = "127.0.0.1",
        port: int = 0,
        history: int = 20_000,
        tls: Any = None,
    ) -> None:
        from twin.validation import Admission

        self.profile = Profile.make(profile, device_taint_rules)
        self.clock: Any = clock or SystemClock()
        self.token = token
        # twin.tls.Pki: serve https with its certificate (None: plain http, as before).
        self.tls = tls
        # ServiceAccount tokens minted through TokenRequest (serviceaccounts/<name>/token):
        # token -> (namespace, name, uid of the account it was minted for).
        self.service_account_tokens: dict[str, tuple[str, str, str]] = {}
        # Bearer token -> person (a static token file's entries): who TokenReview says the
        # token is, and who a request presenting it runs as (with RBAC). `add_user()`.
        self.users: dict[str, Any] = {}
        self.host = host
        self.port = port
        self.store = Store(
            clock=self.clock,
            admission=Admission(self.profile),
            history=history,
            api_versions=self.profile.preferred_versions(),
        )
        self._controllers: list[Any] = []
        self._started: list[Any] = []
        self.server: Any = None
        self._lock = threading.Lock()
        self.extensions: dict[str, Any] = {}  # room for faults/cloud/alerts to hang state on
        # fn(RequestInfo) -> None | ApiError | "reset" | seconds: API fault injection for drills.
        self.request_interceptors: list[Any] = []
        # name -> fn(method, path_parts, query, body) -> (status, json): served at /twin/<name>/...
        self.http_handlers: dict[str, Any] = {}
        self.seed_info: dict[str, Any] = {}
        from twin.seed import ensure_system_namespaces

        ensure_system_namespaces(self.store)

    # ---- lifecycle ---------------------------------------------------------------------

    def add_controller(self, controller: Any) -> None:
        """Register a controller; started now if the twin already runs."""
        with self._lock:
            self._controllers.append(controller)
            running = self.server is not None
        if running:
            controller.start(self)
            self._started.append(controller)

    def add_request_interceptor(self, fn: Any) -> None:
        """Consult `fn(info)` for every API request (twin.server.RequestInfo).

        Return None to proceed, an `ApiError` to answer with it (e.g. 500, 429, 409), the
        string "reset" to drop the connection, or a number of seconds to delay the request.
        """
        self.request_interceptors.append(fn)

    def remove_request_interceptor(self, fn: Any) -> None:
        if fn in self.request_interceptors:
            self.request_interceptors.remove(fn)

    def add_http_handler(self, name: str, fn: Any) -> None:
        """Serve `fn(method, parts, query, body) -> (status, json_payload)` at /twin/<name>/..."""
        if name in ("healthz", "requests"):
            raise ValueError(f"/twin/{name} is reserved")
        self.http_handlers[name] = fn

    def seed(self, **kwargs: Any) -> dict[str, Any]:
        from twin.seed import seed_cluster

        info = seed_cluster(self.store, self.profile, **kwargs)
        self.seed_info = info
        return info

    def seed_file(self, path: str | Path) -> dict[str, Any]:
        from twin.seed import seed_from_yaml

        info = seed_from_yaml(self.store, self.profile, Path(path))
        self.seed_info = info
        return info

    def start(self) -> Twin:
        from twin.disruption import DisruptionController
        from twin.server import ApiServer

        # The watch cache starts here, as after an apiserver restart: older RVs are 410.
        self.store.compact()
        self.server = ApiServer(self, self.host, self.port)
        self.server.start()
        self.port = self.server.port
        builtins: list[Any] = [DisruptionController()]
        if self.tls is not None:
            from twin.rootca import RootCaPublisher

            builtins.append(RootCaPublisher(self.tls.ca_pem))
        for builtin in builtins:
            builtin.start(self)
            self._started.append(builtin)
        for c in list(self._controllers):
            c.start(self)
            self._started.append(c)
        log.info("twin (profile %s) serving %s", self.profile.name, self.url)
        return self

    def stop(self) -> None:
        for c in reversed(self._started):
            try:
                c.stop()
            except Exception:
                log.exception("controller %r failed to stop", c)
        self._started.clear()
        if self.server is not None:
            self.server.stop()
            self.server = None

    def __enter__(self) -> Twin:
        return self.start() if self.server is None else self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # ---- access ------------------------------------------------------------------------

    @property
    def url(self) -> str:
        scheme = "https" if self.tls is not None else "http"
        return f"{scheme}://{self.host}:{self.port}"

    def mint_token(self, namespace: str, name: str) -> str:
        """A bearer token for ServiceAccount namespace/name (what TokenRequest answers): the
        API authenticates it as system:serviceaccount:<namespace>:<name> for as long as that
        account (the same uid) exists, and RBAC decides the rest."""
        import secrets

        account = self.store.get("serviceaccounts", name, namespace)
        token = secrets.token_urlsafe(32)
        self.service_account_tokens[token] = (namespace, name, account["metadata"]["uid"])
        return token

    def token_identity(self, token: str) -> Any:
        """Who a bearer token other than the admin's is: a person added with `add_user`, the
        ServiceAccount a minted token is bound to, or None (unknown, account gone)."""
        from twin import authz

        if token in self.users:
            return self.users[token]
        bound = self.service_account_tokens.get(token)
        if bound is None:
            return None
        namespace, name, uid = bound
        account = self.store.try_get("serviceaccounts", name, namespace)
        if account is None or account["metadata"].get("uid") != uid:
            return None
        return authz.service_account(namespace, name, uid)

    @property
    def requests(self) -> Any:
        """The request log (twin.server.RequestLog)."""
        return self.server.request_log if self.server is not None else None

    def add_user(self, token: str, user: str, groups: list[str] | tuple[str, ...] = ()) -> None:
        """A person's bearer token, as a static token file line `token,user,uid,"groups"`:
        requests presenting it run as `user` (RBAC decides), TokenReview authenticates it."""
        from twin.authz import person

        self.users[token] = person(user, list(groups), uid=f"uid-{user}")

    def kubeconfig(self, token: str | None = None) -> dict[str, Any]:
        user: dict[str, Any] = {}
        tok = token if token is not None else self.token
        if tok:
            user["token"] = tok
        cluster: dict[str, Any] = {"server": self.url}
        if self.tls is not None:
            import base64

            cluster["certificate-authority-data"] = base64.b64encode(self.tls.ca_pem).decode()
        return {
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [{"name": "sickbay-twin", "cluster": cluster}],
            "users": [{"name": "sickbay-twin", "user": user}],
            "contexts": [
                {
                    "name": "sickbay-twin",
                    "context": {"cluster": "sickbay-twin", "user": "sickbay-twin"},
                }
            ],
            "current-context": "sickbay-twin",
        }

    def write_kubeconfig(self, path: str | Path, token: str | None = None) -> Path:
        p = Path(path)
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(yaml.safe_dump(self.kubeconfig(token), sort_keys=False))
        p.chmod(0o600)
        return p
