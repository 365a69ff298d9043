"""The webhook's HTTP server: uvicorn, with bounds on slow clients and TLS from files.

uvicorn alone bounds neither how long a client may take to send a request nor how many
connections it may hold open: a client trickling one header byte every few seconds keeps its
connection (and a file descriptor, and memory) for as long as it likes, and its
`limit_concurrency` only counts a connection once its headers are complete. So the protocol
here adds, per connection (settings `SICKBAY_WEBHOOK_*`):

    header_timeout   10 s  the request's headers complete within this long of the connection
                           opening (or, kept alive, of the next request's first byte); else
                           408 and the connection is closed
    body_timeout     30 s  the body complete within this long of the headers; else closed
                           (a request being handled sees the client disconnect)
    max_connections  256   connections open at once. One more evicts the connection that
                           has waited longest for its headers or idled longest between
                           requests (408 / closed): a real client sends its headers in
                           milliseconds, so slow clients at the cap give way to it. When every
                           connection is busy (a request read or handled), the new one is
                           answered 503 and closed before a byte of it is read (Alertmanager
                           retries a 503)
    per peer         a quarter of max_connections (at least 4) from one client address. One
                     more evicts that peer's own oldest slow or idle connection; all of its
                     connections busy, the new one is answered 503 and closed. A flood from
                     one address cannot take the slots Alertmanager needs.

A response sent before the request's body was read (a 401 for a missing or wrong token, a 413)
closes the connection with it (`Connection: close`): the body is never read, so a client
without the token holds nothing open, whatever it sends after its headers.

Headers are at most 16 KiB (h11's bound; past it: 400). Idle kept-alive connections close after
30 s (uvicorn's keep-alive timeout). Closed connections are counted and logged at most once a
minute, so a flood of slow clients is visible without flooding the log.

TLS: with `SICKBAY_WEBHOOK_TLS_CERT_FILE` and `SICKBAY_WEBHOOK_TLS_KEY_FILE` the webhook serves
HTTPS (TLS 1.2+). Both files are checked (one stat() each) at every TLS handshake and re-read
when either changed, so a certificate renewed in place (cert-manager rewriting its Secret, the
kubelet updating the mounted files) is served from the next connection on, without a restart;
a pair that does not load (half-written, key and certificate not matching) is logged and the
previous one kept. Over TLS a connection counts from the end of its handshake (asyncio bounds
the handshake itself at 60 s).
"""

from __future__ import annotations

import asyncio
import logging
import os
import ssl
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import h11
import uvicorn
from uvicorn.protocols.http.h11_impl import H11Protocol

from worker.logs import is_json
from worker.settings import ServerSettings

log = logging.getLogger(__name__)

MAX_HEADER_BYTES = 16 * 1024
# One client address may hold a quarter of the connections, and at least this many (Alertmanager
# opens a few per receiver; the storm benchmark 64 against the default 256).
MIN_PER_PEER = 4
KEEP_ALIVE_SECONDS = 30  # Alertmanager keeps connections open between notifications
# In-flight notifications finish on SIGTERM (bounded by the Temporal timeout); below the
# Deployment's 20 s termination grace period.
GRACEFUL_SHUTDOWN_SECONDS = 15
LOG_EVERY_SECONDS = 60.0

_BUSY = (
    b"HTTP/1.1 503 Service Unavailable\r\nConnection: close\r\nContent-Type: text/plain\r\n"
    b"Retry-After: 1\r\nContent-Length: 25\r\n\r\ntoo many open connections"
)
_TOO_SLOW = (
    b"HTTP/1.1 408 Request Timeout\r\nConnection: close\r\nContent-Type: text/plain\r\n"
    b"Content-Length: 26\r\n\r\nrequest headers too slow\r\n"
)


# --------------------------------------------------------------------------------------------
# Slow clients
# --------------------------------------------------------------------------------------------


@dataclass
class ConnectionLimits:
    """The bounds, and how many connections each one closed (shared by a server's
    connections; read by tests and the periodic log line)."""

    header_timeout: float
    body_timeout: float
    max_connections: int
    closed: dict[str, int] = field(
        default_factory=lambda: {
            "headers": 0,
            "body": 0,
            "busy": 0,
            "evicted": 0,
            "peer-busy": 0,
            "peer-evicted": 0,
        }
    )
    # Connections that may give way to a new one (waiting for headers, or idle between
    # requests), with the monotonic time since when; oldest first.
    evictable: dict[BoundedH11Protocol, float] = field(default_factory=dict)
    # Open connections by client address.
    by_peer: dict[str, set[BoundedH11Protocol]] = field(default_factory=dict)
    # Connections (client address and port) that carried a request whose body the app read
    # and answered 2xx: an authenticated client such as Alertmanager. They give way last.
    proven: set[tuple[str, int]] = field(default_factory=set)
    _logged: dict[str, int] = field(default_factory=dict)
    _logged_at: float = 0.0

    @property
    def max_per_peer(self) -> int:
        return max(MIN_PER_PEER, self.max_connections // 4)

    def victim(
        self, newcomer: BoundedH11Protocol, peer: str | None = None
    ) -> BoundedH11Protocol | None:
        """The oldest evictable connection (of `peer` only, when given) but `newcomer`; one
        that has proven itself (an answered request with a body) only when no other is left."""
        candidates = [
            protocol
            for protocol in self.evictable  # insertion order: the oldest first
            if protocol is not newcomer
            and not protocol.transport.is_closing()
            and (peer is None or protocol.peer == peer)
        ]
        for protocol in candidates:
            if protocol.client not in self.proven:
                return protocol
        return candidates[0] if candidates else None

    def note(self, reason: str) -> None:
        self.closed[reason] += 1
        now = time.monotonic()
        if now - self._logged_at < LOG_EVERY_SECONDS and self._logged:
            return
        new = {k: v - self._logged.get(k, 0) for k, v in self.closed.items()}
        self._logged, self._logged_at = dict(self.closed), now
        log.warning(
            "webhook closed slow or surplus connections: %d with headers not complete in %g s, "
            "%d with a body not complete in %g s, %d slow or idle ones to make room and %d new "
            "ones (503) past %d open connections, %d slow or idle ones and %d new ones (503) "
            "of a client address past its %d (since the last such line; said at most every "
            "%g s)",
            new["headers"],
            self.header_timeout,
            new["body"],
            self.body_timeout,
            new["evicted"],
            new["busy"],
            self.max_connections,
            new["peer-evicted"],
            new["peer-busy"],
            self.max_per_peer,
            LOG_EVERY_SECONDS,
        )


class BoundedH11Protocol(H11Protocol):
    """uvicorn's h11 protocol with a deadline for each request's headers and body and a cap on
    open connections. `limits` is set on the subclass `bounded_protocol` makes."""

    limits: ConnectionLimits

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._deadline: asyncio.TimerHandle | None = None
        self._waiting_for = ""
        self.peer = ""

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        peername = transport.get_extra_info("peername")
        self.peer = str(peername[0]) if peername else ""
        mine = self.limits.by_peer.setdefault(self.peer, set())
        mine.add(self)
        if len(mine) > self.limits.max_per_peer and not self._make_room("peer-", self.peer):
            return
        if len(self.connections) > self.limits.max_connections and not self._make_room("", None):
            return
        self._arm("headers")

    def _make_room(self, kind: str, peer: str | None) -> bool:
        """Past a cap: evict the oldest slow or idle connection (of `peer`, when given), or,
        every one busy, refuse this one (503, closed). True when this connection may stay."""
        victim = self.limits.victim(self, peer)
        if victim is None:  # every connection is busy with a request
            self.limits.note(f"{kind}busy")
            self.transport.write(_BUSY)
            self.transport.close()
            return False
        self.limits.note(f"{kind}evicted")
        victim._close_slow()
        return True

    def data_received(self, data: bytes) -> None:
        if self._deadline is None and self.conn.their_state is h11.IDLE:
            self._arm("headers")  # the first byte of the next request on a kept-alive connection
        super().data_received(data)
        self._follow()

    def on_response_complete(self) -> None:
        super().on_response_complete()
        if self.conn.their_state is h11.SEND_BODY:
            # Answered before the body was read (401, 413): the connection closed with the
            # answer (`Connection: close`, set by `close_unread_bodies`); nothing more is read.
            self._disarm()
            self.transport.close()
            return
        if self.conn.their_state is h11.IDLE:
            self._disarm()  # idle between requests: uvicorn's keep-alive timeout applies
            self.limits.evictable[self] = time.monotonic()
        else:
            self._follow()

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        self.limits.evictable.pop(self, None)
        if self.client is not None:
            self.limits.proven.discard(self.client)
        mine = self.limits.by_peer.get(self.peer)
        if mine is not None:
            mine.discard(self)
            if not mine:
                del self.limits.by_peer[self.peer]
        super().connection_lost(exc)

    def _follow(self) -> None:
        state = self.conn.their_state
        if state is not h11.IDLE:
            self.limits.evictable.pop(self, None)  # a request is in: never evicted now
        if state is h11.SEND_BODY:
            if self._waiting_for != "body":
                self._arm("body")
        elif state is not h11.IDLE:  # DONE, MUST_CLOSE, CLOSED, ERROR: nothing more to read
            self._disarm()
        # IDLE with bytes received: the headers are still incomplete; their deadline runs on.

    def _arm(self, what: str) -> None:
        self._disarm()
        if what == "headers":
            self.limits.evictable.pop(self, None)
            self.limits.evictable[self] = time.monotonic()  # to the end: the newest
        timeout = self.limits.header_timeout if what == "headers" else self.limits.body_timeout
        self._waiting_for = what
        self._deadline = self.loop.call_later(timeout, self._expired, what)

    def _disarm(self) -> None:
        if self._deadline is not None:
            self._deadline.cancel()
            self._deadline = None
        self._waiting_for = ""

    def _expired(self, what: str) -> None:
        self._deadline = None
        self._waiting_for = ""
        if self.transport.is_closing():
            return
        self.limits.note(what)
        self._close_slow()

    def _close_slow(self) -> None:
        """Close a connection whose request is not in (408 when it had started one)."""
        self._disarm()
        self.limits.evictable.pop(self, None)
        if self.conn.our_state is h11.IDLE and self.conn.their_state is h11.IDLE:
            self.transport.write(_TOO_SLOW)
        self.transport.close()


def bounded_protocol(limits: ConnectionLimits) -> type[BoundedH11Protocol]:
    return type("BoundedH11Protocol", (BoundedH11Protocol,), {"limits": limits})


def _has_body(scope: dict[str, Any]) -> bool:
    for name, value in scope.get("headers", ()):
        if name == b"transfer-encoding" or (name == b"content-length" and value.strip() != b"0"):
            return True
    return False


def close_unread_bodies(app: Any, limits: ConnectionLimits) -> Any:
    """ASGI wrapper: a response that starts before the request's body was read (the route
    refused the request on its headers: 401, 413) says `Connection: close`, so the server
    closes the connection with it instead of reading a body nobody wants. A 2xx after the
    body was read marks the connection proven (`ConnectionLimits.proven`)."""

    async def wrapped(scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http" or not _has_body(scope):
            await app(scope, receive, send)
            return
        read = False

        async def receiving() -> dict[str, Any]:
            nonlocal read
            message: dict[str, Any] = await receive()
            if message["type"] == "http.disconnect" or not message.get("more_body", False):
                read = True
            return message

        async def sending(message: dict[str, Any]) -> None:
            if message["type"] == "http.response.start":
                if not read:
                    headers = [*message.get("headers", ()), (b"connection", b"close")]
                    message = {**message, "headers": headers}
                elif 200 <= message["status"] < 300 and scope.get("client"):
                    limits.proven.add(tuple(scope["client"]))
            await send(message)

        await app(scope, receiving, sending)

    return wrapped


class QueryRedactingFilter(logging.Filter):
    """The access log names a request's path, never its query string's values (a token put in
    the URL by mistake must not end up in the logs): `?token=...` becomes `?token=<redacted>`."""

    def filter(self, record: logging.LogRecord) -> bool:
        args = record.args
        if isinstance(args, tuple) and len(args) >= 3 and isinstance(args[2], str):
            path, sep, query = args[2].partition("?")
            if sep:
                names = (part.partition("=")[0] for part in query.split("&"))
                redacted = "&".join(f"{name}=<redacted>" for name in names)
                record.args = (*args[:2], f"{path}?{redacted}", *args[3:])
        return True


# --------------------------------------------------------------------------------------------
# TLS
# --------------------------------------------------------------------------------------------


class ReloadingTLS:
    """A server SSLContext for `cert`/`key` that picks up new files at the next handshake.

    `context` is the listening context; its SNI callback (run for every ClientHello, with or
    without a server name) compares the files' stamps and, when they changed, loads them into a
    new context and hands the connection that one. Raises RuntimeError at construction when the
    files do not load, so a bad configuration stops the webhook at start-up."""

    def __init__(self, cert: Path, key: Path) -> None:
        self.cert, self.key = cert, key
        self.reloads = 0
        self._stamp = self._stamps()
        try:
            self._current = self._load()
        except (OSError, ssl.SSLError) as exc:
            raise RuntimeError(
                f"cannot load the webhook TLS certificate {cert} and key {key}: {exc}"
            ) from exc
        self.context = self._current

    def _stamps(self) -> tuple[tuple[int, int, int], ...] | None:
        try:
            stats = [os.stat(p) for p in (self.cert, self.key)]
        except OSError:
            return None
        return tuple((st.st_mtime_ns, st.st_size, st.st_ino) for st in stats)

    def _load(self) -> ssl.SSLContext:
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        ctx.minimum_version = ssl.TLSVersion.TLSv1_2
        ctx.load_cert_chain(self.cert, self.key)
        ctx.sni_callback = self._client_hello
        return ctx

    def refresh(self) -> None:
        """Load the files again if they changed since the last load (or failed load)."""
        stamp = self._stamps()
        if stamp is None or stamp == self._stamp:
            return
        self._stamp = stamp  # a pair that fails is not retried until the files change again
        try:
            self._current = self._load()
        except (OSError, ssl.SSLError) as exc:
            log.warning(
                "webhook TLS: %s / %s changed but do not load (%s); serving the previous "
                "certificate",
                self.cert,
                self.key,
                exc,
            )
            return
        self.reloads += 1
        log.info("webhook TLS: certificate %s reloaded", self.cert)

    def _client_hello(self, sslobj: Any, server_name: str | None, ctx: ssl.SSLContext) -> None:
        try:
            self.refresh()
            if sslobj.context is not self._current:
                sslobj.context = self._current
        except Exception:  # never fail a handshake over the reload itself
            log.exception("webhook TLS: certificate reload check failed")


# --------------------------------------------------------------------------------------------
# The server
# --------------------------------------------------------------------------------------------


def build_config(
    app: Any,
    host: str,
    port: int,
    server: ServerSettings,
    *,
    access_log: bool = False,
    log_level: str = "info",
) -> tuple[uvicorn.Config, ConnectionLimits, ReloadingTLS | None]:
    """A loaded uvicorn Config for the webhook app with the limits and TLS above. Raises
    RuntimeError (with the reason) when the TLS files do not load."""
    tls = None
    if server.webhook_tls_cert_file is not None and server.webhook_tls_key_file is not None:
        tls = ReloadingTLS(server.webhook_tls_cert_file, server.webhook_tls_key_file)
    limits = ConnectionLimits(
        header_timeout=server.webhook_header_timeout,
        body_timeout=server.webhook_body_timeout,
        max_connections=server.webhook_max_connections,
    )
    config = uvicorn.Config(
        close_unread_bodies(app, limits),
        host=host,
        port=port,
        http=bounded_protocol(limits),
        access_log=access_log,
        log_level=log_level,
        timeout_keep_alive=KEEP_ALIVE_SECONDS,
        timeout_graceful_shutdown=GRACEFUL_SHUTDOWN_SECONDS,
        h11_max_incomplete_event_size=MAX_HEADER_BYTES,
        # JSON logs: uvicorn's loggers propagate to the root's JSON handler instead of their own.
        log_config=None if is_json() else uvicorn.config.LOGGING_CONFIG,
        # Given so uvicorn reports the scheme as https; the context is replaced by ours below.
        ssl_certfile=str(server.webhook_tls_cert_file) if tls else None,
        ssl_keyfile=str(server.webhook_tls_key_file) if tls else None,
    )
    config.load()
    access = logging.getLogger("uvicorn.access")
    if not any(isinstance(f, QueryRedactingFilter) for f in access.filters):
        access.addFilter(QueryRedactingFilter())
    if tls is not None:
        config.ssl = tls.context
    return config, limits, tls
