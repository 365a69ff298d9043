"""List-then-watch of one kind, kept up for the life of a process, the way client-go's
Reflector does it (used by the health watcher, `worker/watcher.py`).

- A paginated LIST (`limit`/`continue`) gives the full state and a resourceVersion; the handler
  gets it as one replace (`begin_replace`, `upsert` per item, `end_replace`): whatever it held
  that the list no longer has is gone.
- A WATCH from that resourceVersion with `allowWatchBookmarks=true` and a server-side
  `timeoutSeconds` window; every event and BOOKMARK moves the resourceVersion on, so the next
  window (or a reconnect after a dropped connection or an API-server restart) resumes exactly
  where the last one stopped: no change is missed and none is delivered twice.
- `410 Gone` (the resourceVersion left the server's watch cache; as an ERROR event or as the
  HTTP status) re-lists; nothing else does, so while watches are healthy no LIST is sent.
- Any other failure (connection refused or reset, 5xx, 429, a truncated stream) waits with
  exponential backoff and jitter (0.5 s doubling to 30 s, reset once a watch stays up) and
  reconnects from the last resourceVersion.

Objects are parsed once from the stream's JSON lines (no model deserialisation) and handed to
the handler, which keeps only what it needs: the reflector stores nothing but the
resourceVersion. Blocking: `run()` on a thread of its own; `stop()` from any thread cuts the
open connection.
"""

from __future__ import annotations

import json
import logging
import random
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any, Protocol

from kubernetes.watch.watch import iter_resp_lines

from activities.kube.client import ErrorKind, Kube, KubeError, classify

log = logging.getLogger(__name__)

# Server-side window of one watch request (seconds). client-go picks 5-10 minutes at random;
# a fixed 5 minutes is one request per kind every 5 minutes while nothing happens.
WATCH_WINDOW = 300
# Read timeout beyond the window: a connection that went silent (no bookmark, no end) is
# noticed this long after the server should have closed it.
READ_MARGIN = 30.0
BACKOFF_INITIAL = 0.5  # seconds; doubled per consecutive failure (client-go: 800 ms)
BACKOFF_MAX = 30.0
HEALTHY_AFTER = 10.0  # a watch that stays up this long resets the backoff
NOT_SERVED_RECHECK = 300.0  # seconds between looks at a kind the cluster does not serve
# Items per LIST page. Small pages keep what a full list leaves behind small: the handler keeps
# a summary of each item, allocated among the page's parsed objects, so large pages leave the
# process's heap fragmented. Measured (bench/watch.py's watcher alone, 8,000 pods, 1,000 nodes
# and slices): RSS after the first sync 150 MiB with pages of 500, 119 MiB with 100, 115 MiB
# with 50; a page is one request, so 100 is 100 requests for that cluster's first sync.
LIST_PAGE_SIZE = 100


class Handler(Protocol):
    def begin_replace(self) -> None: ...
    def upsert(self, obj: dict[str, Any]) -> None: ...
    def delete(self, obj: dict[str, Any]) -> None: ...
    def end_replace(self) -> None: ...


@dataclass
class ReflectorStats:
    lists: int = 0  # full LISTs (the first one and every relist)
    relists: int = 0  # LISTs after 410 Gone
    list_pages: int = 0
    watches: int = 0  # watch requests opened
    events: int = 0  # ADDED / MODIFIED / DELETED
    bookmarks: int = 0
    errors: int = 0  # failed requests or broken streams (each followed by a backoff)
    not_served: bool = False  # the cluster does not serve the kind (404 on the LIST)
    resource_version: str = ""


class Gone(Exception):
    """410: the resourceVersion is older than the server's watch cache."""


class Reflector:
    def __init__(
        self,
        kube: Kube,
        list_fn: Callable[..., Any],
        *,
        resource: str,
        handler: Handler,
        field_selector: str | None = None,
        label_selector: str | None = None,
        page_size: int = LIST_PAGE_SIZE,
        window: int = WATCH_WINDOW,
        backoff_initial: float = BACKOFF_INITIAL,
        backoff_max: float = BACKOFF_MAX,
    ) -> None:
        self._kube = kube
        self._list_fn = list_fn
        self.resource = resource
        self._handler = handler
        self._selectors: dict[str, Any] = {}
        if field_selector:
            self._selectors["field_selector"] = field_selector
        if label_selector:
            self._selectors["label_selector"] = label_selector
        self._page_size = page_size
        self._window = window
        self._backoff_initial = backoff_initial
        self._backoff_max = backoff_max
        self._stop = threading.Event()
        self._resp_lock = threading.Lock()
        self._resp: Any = None
        self.synced = threading.Event()  # set after the first full LIST reached the handler
        self.stats = ReflectorStats()

    # ---- control ------------------------------------------------------------------------

    def stop(self) -> None:
        self._stop.set()
        with self._resp_lock:
            resp = self._resp
        if resp is not None:
            _cut(resp)

    @property
    def stopped(self) -> bool:
        return self._stop.is_set()

    def run(self) -> None:
        """List, then watch, until stop(); never raises for API trouble (logs and backs off)."""
        rv = ""
        failures = 0
        while not self._stop.is_set():
            try:
                if not rv:
                    rv = self._list()
                started = time.monotonic()
                rv = self._watch(rv)
                if time.monotonic() - started >= HEALTHY_AFTER:
                    failures = 0
                continue
            except Gone:
                log.info("%s: resourceVersion %s too old (410); re-listing", self.resource, rv)
                self.stats.relists += 1
                rv = ""
                continue
            except KubeError as err:
                if self._stop.is_set():
                    return
                if err.kind is ErrorKind.NOT_FOUND and not rv:
                    # The kind is not served (resource.k8s.io on a device-plugin cluster):
                    # nothing of it exists. Look again now and then, in case it gets enabled.
                    if not self.synced.is_set():
                        log.info("%s is not served by this cluster; not watching it", self.resource)
                        self._handler.begin_replace()
                        self._handler.end_replace()
                        self.stats.not_served = True
                        self.synced.set()
                    self._stop.wait(NOT_SERVED_RECHECK)
                    continue
                self.stats.errors += 1
                failures += 1
                level = logging.ERROR if err.kind is ErrorKind.FORBIDDEN else logging.WARNING
                log.log(level, "%s watch: %s (retrying)", self.resource, err)
            delay = min(self._backoff_max, self._backoff_initial * 2 ** (failures - 1))
            self._stop.wait(delay * random.uniform(0.8, 1.2))

    # ---- list ---------------------------------------------------------------------------

    def _list(self) -> str:
        token: str | None = None
        rv = ""
        self._handler.begin_replace()
        while True:
            try:
                body = self._kube.call(
                    self._list_fn,
                    verb="list",
                    resource=self.resource,
                    limit=self._page_size,
                    _continue=token,
                    **self._selectors,
                )
            except KubeError as err:
                if err.status == 410:  # the continue token expired: list again from scratch
                    raise Gone() from err
                raise
            self.stats.list_pages += 1
            for obj in body.get("items") or []:
                self._handler.upsert(obj)
            meta = body.get("metadata") or {}
            rv = rv or str(meta.get("resourceVersion") or "")
            token = meta.get("continue") or None
            if not token:
                break
        self._handler.end_replace()
        self.stats.lists += 1
        self.stats.resource_version = rv
        self.synced.set()
        return rv

    # ---- watch --------------------------------------------------------------------------

    def _watch(self, rv: str) -> str:
        """One watch window from `rv`; returns the resourceVersion reached."""
        try:
            resp = self._list_fn(
                watch=True,
                resource_version=rv,
                allow_watch_bookmarks=True,
                timeout_seconds=self._window,
                _preload_content=False,
                _request_timeout=(self._kube.timeout, self._window + READ_MARGIN),
                **self._selectors,
            )
        except Exception as exc:
            err = classify(exc, verb="watch", resource=self.resource)
            if err.status == 410:
                raise Gone() from exc
            raise err from exc
        status = getattr(resp, "status", 200)
        if isinstance(status, int) and not 200 <= status <= 299:
            try:
                body = json.loads(resp.data or b"{}")
            except ValueError:
                body = {}
            resp.release_conn()
            if status == 410:
                raise Gone()
            err_kind = ErrorKind.FORBIDDEN if status == 403 else ErrorKind.TRANSIENT
            raise KubeError(
                err_kind,
                status=status,
                verb="watch",
                resource=self.resource,
                message=str(body.get("message", "")) if isinstance(body, dict) else "",
            )
        self.stats.watches += 1
        with self._resp_lock:
            self._resp = resp
        if self._stop.is_set():
            _cut(resp)
        try:
            for event in self._events(resp):
                kind = event.get("type")
                obj = event.get("object") or {}
                if kind == "ERROR":
                    code = obj.get("code") if isinstance(obj, dict) else None
                    if code == 410:
                        raise Gone()
                    raise KubeError(
                        ErrorKind.TRANSIENT,
                        status=code,
                        verb="watch",
                        resource=self.resource,
                        message=str(obj.get("message", "")) if isinstance(obj, dict) else "",
                    )
                new_rv = str((obj.get("metadata") or {}).get("resourceVersion") or "")
                if kind == "BOOKMARK":
                    self.stats.bookmarks += 1
                elif kind in ("ADDED", "MODIFIED"):
                    self._handler.upsert(obj)
                    self.stats.events += 1
                elif kind == "DELETED":
                    self._handler.delete(obj)
                    self.stats.events += 1
                if new_rv:  # only after the handler has the change: a cut never skips it
                    rv = new_rv
                    self.stats.resource_version = rv
        except (KubeError, Gone):
            raise
        except Exception as exc:  # a stream cut mid-way (reset, truncated chunk, timeout)
            if not self._stop.is_set():
                raise classify(exc, verb="watch", resource=self.resource) from exc
        finally:
            with self._resp_lock:
                self._resp = None
            resp.close()
            resp.release_conn()
        return rv

    def _events(self, resp: Any) -> Iterator[dict[str, Any]]:
        for line in iter_resp_lines(resp):
            if self._stop.is_set():
                return
            if not line.strip():
                continue
            try:
                event = json.loads(line)
            except ValueError as exc:
                raise KubeError(
                    ErrorKind.TRANSIENT,
                    status=None,
                    verb="watch",
                    resource=self.resource,
                    message=f"undecodable watch line: {exc}",
                ) from exc
            if isinstance(event, dict):
                yield event


def _cut(resp: Any) -> None:
    """Unblock a thread reading `resp` (as kubernetes.watch.Watch.stop does)."""
    import socket

    conn = getattr(resp, "connection", None)
    sock = getattr(conn, "sock", None) if conn else None
    if sock is not None:
        try:
            sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
