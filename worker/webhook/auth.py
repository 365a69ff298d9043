"""The webhook's bearer token: read (and re-read when its file changes), checked, refusals logged."""

from __future__ import annotations

import hmac
import logging
import time

from fastapi import Request

from worker.settings import WebhookSettings

log = logging.getLogger(__name__)


class TokenSource:
    """The bearer token; a token file is re-read when it changes (a rotated Kubernetes Secret
    shows up in the mounted file without a restart). One stat() per request."""

    def __init__(self, webhook: WebhookSettings) -> None:
        self._webhook = webhook
        self._token = webhook.token_bytes()  # fail at start-up, not at the first alert
        self._stamp = self._file_stamp()

    def _file_stamp(self) -> tuple[int, int] | None:
        path = self._webhook.webhook_token_file
        if self._webhook.webhook_token is not None or path is None:
            return None
        try:
            st = path.stat()
        except OSError:
            return None
        return (st.st_mtime_ns, st.st_size)

    def current(self) -> bytes | None:
        stamp = self._file_stamp()
        if stamp is not None and stamp != self._stamp:
            try:
                self._token = self._webhook.token_bytes()
                self._stamp = stamp
                log.info("webhook token file changed; using the new token")
            except RuntimeError as exc:  # mid-write or emptied: keep the last good token
                log.warning("%s; keeping the previous token", exc)
        return self._token


# A wrong token is said at most once per this many seconds (Alertmanager retries every flush).
UNAUTHORIZED_LOG_SECONDS = 60.0


class Unauthorized:
    """Logs refused notifications (401), rate-limited: the first at once, then at most one
    line per UNAUTHORIZED_LOG_SECONDS with how many were refused meanwhile. Never the token."""

    def __init__(self) -> None:
        self._last: float | None = None
        self._quiet = 0

    def note(self, request: Request) -> None:
        now = time.monotonic()
        if self._last is not None and now - self._last < UNAUTHORIZED_LOG_SECONDS:
            self._quiet += 1
            return
        header = request.headers.get("authorization", "")
        scheme = header.partition(" ")[0] or "no Authorization header"
        peer = request.client.host if request.client else "unknown"
        since = f" ({self._quiet} more since the last line)" if self._quiet else ""
        log.warning(
            "refused a notification from %s with 401: missing or wrong bearer token (%s); "
            "check the receiver's credentials_file%s",
            peer,
            scheme,
            since,
        )
        self._last, self._quiet = now, 0


def authorized(request: Request, token: bytes | None) -> bool:
    if token is None:
        return True
    header = request.headers.get("authorization", "")
    scheme, _, given = header.partition(" ")
    if scheme.lower() != "bearer":
        return False
    # Headers arrive latin-1 decoded; compare bytes (compare_digest refuses non-ASCII str).
    return hmac.compare_digest(given.strip().encode("latin-1"), token)
