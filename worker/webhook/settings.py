"""The webhook's settings (`SICKBAY_WEBHOOK_*`, `SICKBAY_ALERT_*`): limits, spool, token, alert mapping."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

from pydantic import Field, SecretStr, field_validator
from pydantic_settings import BaseSettings, NoDecode, SettingsConfigDict

from worker.alerts import (
    DEFAULT_ALERT_CLASSES,
    DEFAULT_ALERT_NAMES,
    DEFAULT_NODE_LABELS,
    AlertKind,
    AlertMapping,
)
from worker.security import check_webhook_token
from worker.spool import DEFAULT_MAX_BYTES as DEFAULT_SPOOL_BYTES
from worker.spool import Spool

StrList = Annotated[list[str], NoDecode]


class WebhookSettings(BaseSettings):
    """Webhook-only settings (`SICKBAY_` prefix); Temporal settings come from `Settings`.

    List settings take JSON (`["a","b"]`) or a comma-separated string (`a,b`).
    """

    model_config = SettingsConfigDict(env_prefix="SICKBAY_", extra="ignore")

    webhook_host: str = "127.0.0.1"
    webhook_port: int = Field(default=8080, ge=0, le=65535)
    webhook_token: SecretStr | None = None
    webhook_token_file: Path | None = None
    webhook_auth_disabled: bool = False  # only for a loopback demo; never in a cluster
    webhook_max_body_bytes: int = Field(default=4 * 1024 * 1024, ge=1024)
    webhook_max_alerts: int = Field(default=5000, ge=1)
    # In-flight Temporal calls for the whole process: enough to keep a frontend busy during
    # an alert storm without opening thousands of concurrent RPCs on one connection.
    webhook_concurrency: int = Field(default=64, ge=1, le=4096)
    # Upper bound for all Temporal calls of one notification. Past it we answer 503 and
    # Alertmanager retries; below Alertmanager's usual 10 s+ webhook timeout.
    webhook_temporal_timeout: float = Field(default=8.0, gt=0)
    # Recent-delivery window: an alert identical to one Temporal accepted this many seconds ago
    # or less (same workflow, status, fingerprint, startsAt) is acknowledged without another
    # call. Covers Alertmanager's retries and overlapping groups during a storm; 0 turns the
    # cache off (identical alerts in flight at the same moment still share one call).
    webhook_dedup_seconds: float = Field(default=60.0, ge=0)
    # At most this many remembered deliveries (~0.5 KB each): the oldest go first.
    webhook_dedup_entries: int = Field(default=50_000, ge=1)
    # Delivery spool (worker/spool.py). Set: a notification waits for Temporal at most
    # webhook_ack_seconds; the alerts Temporal has not accepted by then are journaled to this
    # directory (flushed to disk) before the 200, and delivered in the background, across
    # restarts. One directory per webhook process (locked). Unset: a notification is answered
    # only once Temporal accepted every alert (or 503 past webhook_temporal_timeout).
    webhook_spool_dir: Path | None = None
    # 0.5 s: well under Alertmanager's webhook timeout and the 1 s a storm's sender should
    # wait; a healthy Temporal answers in milliseconds, so only a slow one reaches the spool.
    webhook_ack_seconds: float = Field(default=0.5, gt=0)
    # Past this many pending alerts the spool takes no more: notifications wait for Temporal
    # (503 past the deadline) as without a spool, so a long outage cannot fill the disk.
    webhook_spool_max: int = Field(default=100_000, ge=1)
    # ... and past this many bytes of journal (worker/spool.py): a disk or emptyDir that
    # fills up loses the alerts already acknowledged. deploy/webhook.yaml sizes its emptyDir
    # from it (spool_disk_bytes: twice this plus slack, for a compaction's copy).
    webhook_spool_max_bytes: int = Field(default=DEFAULT_SPOOL_BYTES, ge=64 * 1024)
    # An alert whose labels and annotations (names and values, UTF-8) are larger than this is
    # refused as `too-large`: a real DCGM alert is ~2 KB, and every accepted alert is kept in
    # history and, when Temporal is slow, in the spool.
    webhook_max_alert_bytes: int = Field(default=16 * 1024, ge=1024)
    # How often spooled alerts whose call failed are sent again (Temporal down: every round).
    webhook_spool_retry_seconds: float = Field(default=2.0, gt=0)
    # Mapping alert labels to a device (defaults: dcgm-exporter, deploy/prometheus-rules.yaml)
    alert_names: StrList = Field(default_factory=lambda: list(DEFAULT_ALERT_NAMES))
    # Your own alert names -> failure class (or `xid`), JSON: {"MyGpuDead": "unhealthy"};
    # merged over the shipped rules' classes, and accepted like `alert_names`.
    alert_classes: dict[str, AlertKind] = Field(default_factory=dict)
    alert_node_labels: StrList = Field(default_factory=lambda: list(DEFAULT_NODE_LABELS))
    alert_uuid_labels: StrList = Field(default_factory=lambda: ["UUID"])
    alert_index_labels: StrList = Field(default_factory=lambda: ["gpu"])
    alert_model_labels: StrList = Field(default_factory=lambda: ["modelName"])
    alert_xid_labels: StrList = Field(default_factory=lambda: ["err_code", "Xid", "xid"])
    alert_value_annotation: str = "value"

    @field_validator(
        "alert_names",
        "alert_node_labels",
        "alert_uuid_labels",
        "alert_index_labels",
        "alert_model_labels",
        "alert_xid_labels",
        mode="before",
    )
    @classmethod
    def _split(cls, value: object) -> object:
        if isinstance(value, str):
            text = value.strip()
            if text.startswith("["):
                return json.loads(text)
            return [part.strip() for part in text.split(",") if part.strip()]
        return value

    def mapping(self) -> AlertMapping:
        return AlertMapping(
            alert_names=frozenset(self.alert_names) | frozenset(self.alert_classes),
            alert_classes={**DEFAULT_ALERT_CLASSES, **self.alert_classes},
            node_labels=tuple(self.alert_node_labels),
            uuid_labels=tuple(self.alert_uuid_labels),
            index_labels=tuple(self.alert_index_labels),
            model_labels=tuple(self.alert_model_labels),
            xid_labels=tuple(self.alert_xid_labels),
            value_annotation=self.alert_value_annotation,
            max_alert_bytes=self.webhook_max_alert_bytes,
        )

    def new_spool(self) -> Spool:
        """The delivery spool these settings describe (not opened); needs webhook_spool_dir."""
        assert self.webhook_spool_dir is not None
        return Spool(self.webhook_spool_dir, self.webhook_spool_max, self.webhook_spool_max_bytes)

    def token_bytes(self) -> bytes | None:
        """The bearer token, or None when auth is explicitly disabled.

        Raises RuntimeError when neither a token nor the explicit opt-out is configured, so a
        misconfigured receiver refuses to start instead of accepting anyone.
        """
        if self.webhook_token is not None:
            token = self.webhook_token.get_secret_value().strip()
        elif self.webhook_token_file is not None:
            try:
                token = self.webhook_token_file.read_text().strip()
            except OSError as exc:
                raise RuntimeError(
                    f"cannot read SICKBAY_WEBHOOK_TOKEN_FILE {self.webhook_token_file}: {exc}"
                ) from exc
        elif self.webhook_auth_disabled:
            return None
        else:
            raise RuntimeError(
                "the webhook needs a bearer token: set SICKBAY_WEBHOOK_TOKEN or "
                "SICKBAY_WEBHOOK_TOKEN_FILE (or SICKBAY_WEBHOOK_AUTH_DISABLED=true / "
                "--no-auth for a loopback demo)"
            )
        source = (
            "SICKBAY_WEBHOOK_TOKEN"
            if self.webhook_token is not None
            else f"SICKBAY_WEBHOOK_TOKEN_FILE {self.webhook_token_file}"
        )
        check_webhook_token(token, source)  # WeakTokenError (a RuntimeError) names the problem
        return token.encode()
