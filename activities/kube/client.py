"""The one Kubernetes client Sickbay's activities use, and the one place errors are classified.

`Kube` wraps the official `kubernetes` client (37.x). Every call:
- goes through `Kube.call()`, which sets a per-call timeout and asks for the raw response
  (`_preload_content=False`), so results are plain dicts shaped exactly like the API server's
  JSON: no model (de)serialisation, no dropped fields across resource.k8s.io versions;
- is synchronous. Activities never call it on the event loop: `KubeActivities` runs each
  activity body on its own bounded ThreadPoolExecutor (see activities.py), so a slow API
  server can never block the worker's event loop.

Errors are classified once, in `classify()`:
- 404 on the target     -> `KubeError(kind=NOT_FOUND)`; callers turn it into an outcome
                           ("already gone", "absent is success", ERR_DEVICE_NOT_FOUND).
- 403                   -> non-retryable ApplicationError ERR_FORBIDDEN naming verb + resource.
- 409                   -> `KubeError(kind=CONFLICT)`; callers re-read and converge.
- 429, 5xx, timeouts, connection resets -> retryable (Temporal backs off and retries).
- 400/422               -> non-retryable ERR_INVALID_INPUT with the server's message.
- 401                   -> non-retryable ERR_CONFIG (credentials rejected).
`to_application_error()` turns any `KubeError` that escapes an activity into the
ApplicationError Temporal sees.
"""

from __future__ import annotations

import enum
import json
import logging
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Any

import urllib3
from kubernetes import client as k8s
from kubernetes import config as k8s_config
from kubernetes.client.exceptions import ApiException
from temporalio.exceptions import ApplicationError

from contract.errors import (
    ERR_CONFIG,
    ERR_FORBIDDEN,
    ERR_INVALID_INPUT,
    ERR_KUBE_CONFLICT,
    ERR_KUBE_NOT_FOUND,
    ERR_KUBE_UNAVAILABLE,
)

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class KubeSettings:
    """Plain configuration; the worker builds it from its Settings (`Settings.kube_settings()`:
    activities never import worker).

    kubeconfig None and no in-cluster service account -> ~/.kube/config, like kubectl.
    """

    kubeconfig: str | None = None
    context: str | None = None
    request_timeout: float = 10.0  # seconds per API call; Settings.kube_request_timeout
    max_threads: int = 32  # concurrent short blocking client calls (the hot path's)
    # Concurrent waits (wait-for-eviction / -replacement, evict-pods): each holds a thread
    # and a connection for its whole wait, on a pool of their own, so open waits never hold
    # up a short call. The worker sets its max_open_waits (the most it keeps open).
    max_waits: int = 200
    # HAMi v2.10+ honours `hami.io/device-cordon`: quarantine a HAMi GPU with it. Off: HAMi
    # cannot be kept off one GPU, so its whole node is tainted (Settings.hami_device_cordon).
    hami_device_cordon: bool = False


class ErrorKind(enum.StrEnum):
    NOT_FOUND = "not-found"
    FORBIDDEN = "forbidden"
    CONFLICT = "conflict"
    THROTTLED = "throttled"  # 429: API priority & fairness, or a PDB refusing an eviction
    TRANSIENT = "transient"  # 5xx, timeouts, resets
    INVALID = "invalid"  # 400, 405, 415, 422
    UNAUTHORIZED = "unauthorized"


class KubeError(Exception):
    """A classified failure of one API call."""

    def __init__(
        self,
        kind: ErrorKind,
        *,
        status: int | None,
        verb: str,
        resource: str,
        name: str = "",
        message: str = "",
        body: dict[str, Any] | None = None,
    ) -> None:
        self.kind = kind
        self.status = status
        self.verb = verb
        self.resource = resource
        self.name = name
        self.message = message
        self.body = body or {}
        target = f"{resource}/{name}" if name else resource
        super().__init__(f"{verb} {target}: {status or ''} {message}".strip())


def _status_body(exc: ApiException) -> dict[str, Any]:
    try:
        body = json.loads(exc.body) if exc.body else {}
    except (TypeError, ValueError):
        return {}
    return body if isinstance(body, dict) else {}


def classify(exc: BaseException, *, verb: str, resource: str, name: str = "") -> KubeError:
    """The single mapping from a client exception to an ErrorKind."""
    if isinstance(exc, KubeError):
        return exc
    if isinstance(exc, ApiException):
        status = exc.status or 0
        body = _status_body(exc)
        message = str(body.get("message") or exc.reason or "")
        if status == 404:
            kind = ErrorKind.NOT_FOUND
        elif status == 403:
            kind = ErrorKind.FORBIDDEN
        elif status == 409:
            kind = ErrorKind.CONFLICT
        elif status == 429:
            kind = ErrorKind.THROTTLED
        elif status == 401:
            kind = ErrorKind.UNAUTHORIZED
        elif status >= 500 or status == 0:
            kind = ErrorKind.TRANSIENT
        else:
            kind = ErrorKind.INVALID
        return KubeError(
            kind, status=status, verb=verb, resource=resource, name=name, message=message, body=body
        )
    if isinstance(exc, urllib3.exceptions.HTTPError | OSError | TimeoutError):
        return KubeError(
            ErrorKind.TRANSIENT,
            status=None,
            verb=verb,
            resource=resource,
            name=name,
            message=f"{type(exc).__name__}: {exc}",
        )
    raise exc


def to_application_error(err: KubeError) -> ApplicationError:
    """What Temporal sees when a KubeError escapes an activity."""
    target = f"{err.resource} {err.name!r}" if err.name else err.resource
    if err.kind is ErrorKind.FORBIDDEN:
        return ApplicationError(
            f"forbidden: Sickbay's service account may not '{err.verb}' {err.resource}"
            f" ({target}); grant verb '{err.verb}' on '{err.resource}' as deploy/ does"
            " (optional grants are components: deploy/components/<name>, docs/deploy.md)"
            f" and run `sickbay doctor`. Server said: {err.message}",
            type=ERR_FORBIDDEN,
            non_retryable=True,
        )
    if err.kind is ErrorKind.UNAUTHORIZED:
        return ApplicationError(
            f"the API server rejected Sickbay's credentials on {err.verb} {target}: "
            f"{err.message}; check KUBECONFIG / the service account token",
            type=ERR_CONFIG,
            non_retryable=True,
        )
    if err.kind is ErrorKind.INVALID:
        return ApplicationError(
            f"the API server refused {err.verb} {target} as invalid ({err.status}): {err.message}",
            type=ERR_INVALID_INPUT,
            non_retryable=True,
        )
    if err.kind is ErrorKind.NOT_FOUND:
        # Reaching here means a 404 on something that is not the activity's target (e.g. an
        # owner deleted mid-read): the next attempt reads a fresher state.
        return ApplicationError(f"{err.verb} {target}: not found", type=ERR_KUBE_NOT_FOUND)
    if err.kind is ErrorKind.CONFLICT:
        return ApplicationError(
            f"{err.verb} {target}: conflict ({err.message}); will re-read and retry",
            type=ERR_KUBE_CONFLICT,
        )
    return ApplicationError(
        f"{err.verb} {target}: Kubernetes API unavailable ({err.status or 'no response'}: "
        f"{err.message}); will retry",
        type=ERR_KUBE_UNAVAILABLE,
    )


def load_api_client(settings: KubeSettings) -> k8s.ApiClient:
    """ApiClient from a kubeconfig (path, context) or the in-cluster service account."""
    configuration = k8s.Configuration()
    if settings.kubeconfig or settings.context:
        k8s_config.load_kube_config(
            config_file=settings.kubeconfig,
            context=settings.context,
            client_configuration=configuration,
        )
    else:
        try:
            k8s_config.load_incluster_config(client_configuration=configuration)
        except k8s_config.ConfigException:
            k8s_config.load_kube_config(client_configuration=configuration)
    # Temporal owns retries (with backoff and a bound); urllib3 must not retry behind it.
    configuration.retries = urllib3.Retry(total=0, connect=0, read=0, redirect=0, status=0)
    configuration.connection_pool_maxsize = max(settings.max_threads + settings.max_waits, 4)
    return k8s.ApiClient(configuration)


class Kube:
    """Typed API groups plus `call()`. One per worker; thread-safe (urllib3 pool)."""

    def __init__(self, api_client: k8s.ApiClient, request_timeout: float = 10.0) -> None:
        self.api_client = api_client
        self.timeout = request_timeout
        self.core = k8s.CoreV1Api(api_client)
        self.apps = k8s.AppsV1Api(api_client)
        self.batch = k8s.BatchV1Api(api_client)
        self.resource_v1 = k8s.ResourceV1Api(api_client)
        self.resource_by_version: dict[str, Any] = {
            "v1": self.resource_v1,
            "v1beta2": k8s.ResourceV1beta2Api(api_client),
            "v1alpha3": k8s.ResourceV1alpha3Api(api_client),
        }
        self.custom = k8s.CustomObjectsApi(api_client)
        self.authz = k8s.AuthorizationV1Api(api_client)
        self.version_api = k8s.VersionApi(api_client)
        self._cache: dict[Any, tuple[float, Any]] = {}
        self._cache_lock = threading.Lock()
        # Loads under way, per key: concurrent readers of an expired entry wait for one load
        # instead of all re-reading it (a storm of remediations must not list the cluster's
        # ResourceSlices once each).
        self._inflight: dict[Any, Future[Any]] = {}
        self._derived: dict[Any, tuple[Any, Any]] = {}

    def cached(self, key: Any, ttl: float, load: Callable[[], Any], *, stale: float = 0.0) -> Any:
        """Per-worker cache for slow-changing reads (DeviceClasses, namespace labels,
        ResourceSlice inventory), so a remediation does not pay for them in every activity.
        Pods and nodes only with a max age of seconds, to share one list between consecutive
        steps of one remediation (consumers.list_node_pods, devices.list_nodes); node writes
        drop the node list. Claims only with `ttl` 0, which
        serves nothing from the cache and only lets concurrent readers share a load under way
        (consumers.list_claims); Sickbay's rules for a second (quarantine.managed_rule_keys).

        `stale`: while one caller reloads an expired entry, the others get the entry it
        replaces if that is younger than `ttl + stale`, instead of waiting. Each waiter holds
        a thread of the Kubernetes pool, so a storm of remediations all waiting for one
        cluster-wide list (the budget count's inventory, the node list) left none for their
        other reads: 200 GPUs failing together waited seconds for one list."""
        now = time.monotonic()
        with self._cache_lock:
            hit = self._cache.get(key)
            if hit is not None and now - hit[0] < ttl:
                return hit[1]
            flight = self._inflight.get(key)
            leader = flight is None
            if flight is None:
                flight = self._inflight[key] = Future()
            elif hit is not None and now - hit[0] < ttl + stale:
                return hit[1]  # being reloaded: the value it replaces, without waiting
        if not leader:
            return flight.result()  # started after we asked: at least as fresh as we need
        try:
            value = load()
        except BaseException as exc:
            with self._cache_lock:
                self._inflight.pop(key, None)
            flight.set_exception(exc)
            raise
        with self._cache_lock:
            self._cache[key] = (now, value)
            self._inflight.pop(key, None)
        flight.set_result(value)
        return value

    def peek(self, key: Any, ttl: float) -> Any | None:
        """The cached value if it is younger than `ttl`, without loading it."""
        with self._cache_lock:
            hit = self._cache.get(key)
        if hit is not None and time.monotonic() - hit[0] < ttl:
            return hit[1]
        return None

    def store_cached(self, key: Any, value: Any) -> None:
        with self._cache_lock:
            self._cache[key] = (time.monotonic(), value)

    def derived(self, key: Any, source: Any, compute: Callable[[Any], Any]) -> Any:
        """`compute(source)`, remembered while `source` is the very object it was computed
        from (a cached list: a summary of it is computed once per list, not per caller)."""
        with self._cache_lock:
            hit = self._derived.get(key)
        if hit is not None and hit[0] is source:
            return hit[1]
        value = compute(source)
        with self._cache_lock:
            self._derived[key] = (source, value)
        return value

    def forget(self, key: Any) -> None:
        """Drop a cached value after this worker changed what it describes."""
        with self._cache_lock:
            self._cache.pop(key, None)

    def amend_cached(self, key: Any, change: Callable[[Any], Any]) -> None:
        """Apply this worker's own change to a cached value (`change(old) -> new`, never
        mutating `old`: readers may hold it), keeping its age; nothing when none is cached."""
        with self._cache_lock:
            hit = self._cache.get(key)
            if hit is not None:
                self._cache[key] = (hit[0], change(hit[1]))

    @classmethod
    def from_settings(cls, settings: KubeSettings) -> Kube:
        return cls(load_api_client(settings), settings.request_timeout)

    def call(
        self,
        fn: Callable[..., Any],
        *args: Any,
        verb: str,
        resource: str,
        name: str = "",
        timeout: float | None = None,
        **kwargs: Any,
    ) -> dict[str, Any]:
        """Run one API call; return the parsed JSON body or raise a classified KubeError."""
        try:
            resp = fn(
                *args,
                _preload_content=False,
                _request_timeout=timeout or self.timeout,
                **kwargs,
            )
            data = resp.data
        except Exception as exc:  # classify() re-raises anything it does not recognise
            raise classify(exc, verb=verb, resource=resource, name=name) from exc
        if not data:
            return {}
        try:
            parsed = json.loads(data)
        except ValueError:
            return {"raw": data.decode("utf-8", "replace")}
        return parsed if isinstance(parsed, dict) else {"items": parsed}

    def get_path(self, path: str, *, resource: str) -> dict[str, Any]:
        """GET a path the typed APIs have no method for (discovery documents)."""
        try:
            params = self.api_client.param_serialize(
                method="GET",
                resource_path=path,
                header_params={"Accept": "application/json"},
                auth_settings=["BearerToken"],
            )
            resp = self.api_client.call_api(*params, _request_timeout=self.timeout)
            resp.read()
            if not 200 <= resp.status <= 299:
                raise ApiException.from_response(http_resp=resp, body=None, data=None)
            return json.loads(resp.data) if resp.data else {}
        except Exception as exc:
            raise classify(exc, verb="get", resource=resource, name=path) from exc
