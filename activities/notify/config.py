"""Escalation channels, configured by name on the worker.

The YAML file named by `Settings.channels_file` (`SICKBAY_CHANNELS_FILE`) maps channel names,
which runbooks list under `escalation.channels`, to a type and its settings. Secrets (routing
keys, webhook URLs, tokens) are references, `{env: VAR}` or `{file: PATH}`, resolved at send
time; they never appear in runbooks, workflow inputs or history.

    channels:
      oncall:
        type: pagerduty
        routingKey: {env: PAGERDUTY_ROUTING_KEY}
        fallback: gpu-team          # used when PagerDuty refuses or keeps failing
      gpu-team:
        type: slack
        webhookUrl: {file: /var/run/secrets/sickbay/slack-webhook}
      audit:
        type: webhook
        url: https://hooks.example.internal/sickbay
        headers: {Authorization: {env: AUDIT_HOOK_AUTH}}
        signingSecret: {env: AUDIT_HOOK_SECRET}   # X-Sickbay-Signature: sha256=<hmac>
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator
from pydantic.alias_generators import to_camel

from activities.outbound import SecretRef, load_yaml_model

PAGERDUTY_EVENTS_URL = "https://events.pagerduty.com/v2/enqueue"


class _Model(BaseModel):
    model_config = ConfigDict(
        extra="forbid", frozen=True, alias_generator=to_camel, populate_by_name=True
    )


class _ChannelBase(_Model):
    fallback: str | None = None  # another channel name, tried when this one fails
    fallback_after_attempts: int = Field(default=2, ge=1)  # on retryable failures, from try N
    timeout: float = 10.0  # seconds per HTTP call: these APIs answer in well under a second


class PagerDutyChannel(_ChannelBase):
    type: Literal["pagerduty"]
    routing_key: SecretRef
    url: str = PAGERDUTY_EVENTS_URL
    source: str = "sickbay"  # used when the incident has no node
    event_class: str = "gpu-remediation"
    max_timeline: int = Field(default=20, ge=0)  # timeline lines in custom_details


class SlackChannel(_ChannelBase):
    type: Literal["slack"]
    webhook_url: SecretRef  # the incoming-webhook URL is itself the credential
    max_done: int = Field(default=8, ge=1)


class WebhookChannel(_ChannelBase):
    type: Literal["webhook"]
    url: str | SecretRef
    headers: dict[str, str | SecretRef] = Field(default_factory=dict)
    signing_secret: SecretRef | None = None


Channel = Annotated[PagerDutyChannel | SlackChannel | WebhookChannel, Field(discriminator="type")]


class ChannelsConfig(_Model):
    channels: dict[str, Channel] = Field(default_factory=dict)

    @model_validator(mode="after")
    def _fallbacks_exist(self) -> ChannelsConfig:
        for name, channel in self.channels.items():
            if channel.fallback is None:
                continue
            if channel.fallback not in self.channels:
                raise ValueError(f"channel {name!r}: fallback {channel.fallback!r} is not defined")
            if channel.fallback == name:
                raise ValueError(f"channel {name!r}: cannot be its own fallback")
        return self

    @classmethod
    def load(cls, path: Path | None) -> ChannelsConfig:
        if path is None:
            return cls()
        return load_yaml_model(cls, path, "channels file")
