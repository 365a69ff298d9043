"""`NotifyActivities`: `send-notification` (contract.notify.SEND_NOTIFICATION) sends one incident
event to one named channel.

Failures and retries, so that an escalation is never lost:
- 429 / 5xx / timeouts -> retryable ApplicationError ERR_CHANNEL_UNAVAILABLE (Retry-After kept);
- other 4xx (bad routing key, invalid payload, archived channel) -> non-retryable
  ERR_CHANNEL_REJECTED with the service's words; a missing secret or unknown channel ->
  non-retryable ERR_CONFIG;
- a channel with `fallback` hands the message to that channel when it is refused, and from
  try `fallbackAfterAttempts` on when it keeps failing; the result says `delivered_via`;
- each failed try is remembered in the activity's heartbeat details, which Temporal hands to
  the next try, so the result lists `earlier_failures` (one line per try) for the timeline.
"""

from __future__ import annotations

import hashlib
import hmac
import json
from datetime import timedelta
from typing import Any
from urllib.parse import quote

import httpx
from temporalio import activity
from temporalio.exceptions import ApplicationError

from activities.defn import implements
from activities.notify.config import (
    Channel,
    ChannelsConfig,
    PagerDutyChannel,
    SlackChannel,
    WebhookChannel,
)
from activities.notify.messages import pagerduty_event, slack_message, webhook_body
from activities.outbound import ConfigError, SecretRef, provider_message, retry_after_seconds
from contract.errors import ERR_CHANNEL_REJECTED, ERR_CHANNEL_UNAVAILABLE, ERR_CONFIG
from contract.notify import SEND_NOTIFICATION, NotifyInput, NotifyResult


class ChannelRejected(Exception):
    pass


class ChannelUnavailable(Exception):
    def __init__(self, message: str, retry_after: float | None = None) -> None:
        super().__init__(message)
        self.retry_after = retry_after


def _secret(value: str | SecretRef) -> str:
    return value.resolve() if isinstance(value, SecretRef) else value


class NotifyActivities:
    def __init__(
        self,
        channels: ChannelsConfig | None = None,
        *,
        http: httpx.AsyncClient | None = None,
        ui_url: str | None = None,
    ) -> None:
        self._channels = channels or ChannelsConfig()
        self._http = http or httpx.AsyncClient()
        self._ui_url = ui_url.rstrip("/") if ui_url else None  # Temporal Web UI base URL

    async def aclose(self) -> None:
        await self._http.aclose()

    @property
    def channel_names(self) -> list[str]:
        return sorted(self._channels.channels)

    @implements(SEND_NOTIFICATION)
    async def notify(self, req: NotifyInput) -> NotifyResult:
        info = activity.info()
        earlier: list[str] = []
        if info.heartbeat_details:
            earlier = [str(line) for line in info.heartbeat_details[0]]
        channel = self._channels.channels.get(req.channel)
        if channel is None:
            raise ApplicationError(
                f"notification channel {req.channel!r} is not configured on this worker "
                f"(configured: {', '.join(self.channel_names) or 'none'}; see channels_file)",
                type=ERR_CONFIG,
                non_retryable=True,
            )
        if req.incident.ui_url is None and self._ui_url:
            # The workflow cannot know the UI's address; the worker does.
            link = (
                f"{self._ui_url}/namespaces/{quote(info.namespace, safe='')}"
                f"/workflows/{quote(req.incident.id, safe='')}"
            )
            req = req.model_copy(
                update={"incident": req.incident.model_copy(update={"ui_url": link})}
            )
        try:
            detail = await self.deliver(channel, req)
        except (ChannelRejected, ChannelUnavailable, ConfigError) as exc:
            earlier.append(f"try {info.attempt} {req.channel}: {exc}")
            result = await self._fallback(channel, req, exc, info.attempt, earlier)
            if result is not None:
                return result
            activity.heartbeat(earlier)  # the next try sees the history of failures
            raise self._error(req.channel, exc) from exc
        activity.logger.info(
            "notified %s (%s) of %s: %s", req.channel, req.action, req.incident.id, detail
        )
        return NotifyResult(
            channel=req.channel,
            delivered=True,
            detail=detail,
            attempt=info.attempt,
            earlier_failures=earlier,
        )

    async def _fallback(
        self,
        channel: Channel,
        req: NotifyInput,
        exc: Exception,
        attempt: int,
        earlier: list[str],
    ) -> NotifyResult | None:
        name = channel.fallback
        permanent = not isinstance(exc, ChannelUnavailable)
        if name is None or not (permanent or attempt >= channel.fallback_after_attempts):
            return None
        try:
            detail = await self.deliver(self._channels.channels[name], req)
        except (ChannelRejected, ChannelUnavailable, ConfigError) as fb_exc:
            earlier.append(f"try {attempt} fallback {name}: {fb_exc}")
            return None
        activity.logger.warning(
            "channel %s failed (%s); delivered %s via fallback %s",
            req.channel,
            exc,
            req.action,
            name,
        )
        return NotifyResult(
            channel=req.channel,
            delivered=True,
            detail=f"via fallback {name}: {detail}",
            attempt=attempt,
            earlier_failures=earlier,
            delivered_via=name,
        )

    @staticmethod
    def _error(channel: str, exc: Exception) -> ApplicationError:
        if isinstance(exc, ChannelUnavailable):
            delay = timedelta(seconds=exc.retry_after) if exc.retry_after is not None else None
            return ApplicationError(
                f"channel {channel}: {exc}", type=ERR_CHANNEL_UNAVAILABLE, next_retry_delay=delay
            )
        if isinstance(exc, ConfigError):
            return ApplicationError(
                f"channel {channel}: {exc}", type=ERR_CONFIG, non_retryable=True
            )
        return ApplicationError(
            f"channel {channel}: {exc}", type=ERR_CHANNEL_REJECTED, non_retryable=True
        )

    # --- delivery per type ----------------------------------------------------------------

    async def deliver(self, channel: Channel, req: NotifyInput) -> str:
        if isinstance(channel, PagerDutyChannel):
            return await self._pagerduty(channel, req)
        if isinstance(channel, SlackChannel):
            return await self._slack(channel, req)
        return await self._webhook(channel, req)

    async def _pagerduty(self, channel: PagerDutyChannel, req: NotifyInput) -> str:
        event = pagerduty_event(
            req.incident,
            req.action,
            channel.routing_key.resolve(),
            source=channel.source,
            event_class=channel.event_class,
            max_timeline=channel.max_timeline,
        )
        response = await self._post(channel.url, event, {}, channel.timeout, "PagerDuty")
        try:
            body = response.json()
        except ValueError:
            body = {}
        dedup = body.get("dedup_key", event["dedup_key"])
        return f"PagerDuty {body.get('message', 'accepted')} (dedup_key {dedup})"

    async def _slack(self, channel: SlackChannel, req: NotifyInput) -> str:
        message = slack_message(req.incident, req.action, max_done=channel.max_done)
        response = await self._post(
            channel.webhook_url.resolve(), message, {}, channel.timeout, "Slack"
        )
        return f"Slack {response.text.strip() or 'ok'}"

    async def _webhook(self, channel: WebhookChannel, req: NotifyInput) -> str:
        body = json.dumps(webhook_body(req.incident, req.action)).encode()
        headers = {name: _secret(value) for name, value in channel.headers.items()}
        if channel.signing_secret is not None:
            digest = hmac.new(channel.signing_secret.resolve().encode(), body, hashlib.sha256)
            headers["X-Sickbay-Signature"] = f"sha256={digest.hexdigest()}"
        response = await self._post(_secret(channel.url), body, headers, channel.timeout, "webhook")
        return f"webhook HTTP {response.status_code}"

    async def _post(
        self, url: str, body: Any, headers: dict[str, str], seconds: float, service: str
    ) -> httpx.Response:
        """POST without ever putting the URL in an error (Slack's URL is its secret)."""
        send_headers = {"Content-Type": "application/json", **headers}
        content = body if isinstance(body, bytes) else json.dumps(body).encode()
        try:
            response = await self._http.post(
                url, content=content, headers=send_headers, timeout=seconds
            )
        except httpx.TimeoutException as exc:
            raise ChannelUnavailable(f"{service} did not answer in {seconds:g}s") from exc
        except httpx.TransportError as exc:
            raise ChannelUnavailable(f"{service} unreachable: {type(exc).__name__}") from exc
        if response.status_code in (408, 429) or response.status_code >= 500:
            raise ChannelUnavailable(
                f"{service} {provider_message(response)}", retry_after_seconds(response)
            )
        if response.status_code >= 400:
            raise ChannelRejected(f"{service} {_rejection(response)}")
        return response


def _rejection(response: httpx.Response) -> str:
    """PagerDuty's `errors` list is the useful part of its 400s."""
    message = provider_message(response)
    try:
        errors = response.json().get("errors")
    except (ValueError, AttributeError):
        errors = None
    if errors:
        message += f" ({'; '.join(str(e) for e in errors)})"
    return message[:500]
