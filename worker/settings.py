"""Settings of every Sickbay process (worker, webhook, CLI, demo): one `Settings`.

One prefix, `SICKBAY_`, read from the environment (and flags, which override it). Built in
`main()`/lifespans, never at import, so tests can construct their own.
Secrets (API keys, tokens, webhook URLs with keys in them) are read from env or files here and
never put into workflow inputs or histories.

`Settings` holds the shared ones (Temporal, Kubernetes, runbooks, the worker) and one sub-model
per process part: `webhook` (the receiver), `server` (its HTTP server), `sweep` (the health-sweep
Schedule), `watch` (the health watcher). A sub-model's fields keep their flat variable names,
`SICKBAY_<FIELD>` (`SICKBAY_WEBHOOK_PORT` -> `settings.webhook.webhook_port`); `env_names()`
lists every variable. List variables take a comma-separated string (`a,b`) or JSON (`["a","b"]`).
"""

from __future__ import annotations

import json
import os
import re
from datetime import timedelta
from pathlib import Path
from typing import Annotated, Any, get_args, get_origin

from pydantic import (
    BaseModel,
    BeforeValidator,
    Field,
    SecretStr,
    field_validator,
    model_validator,
)
from pydantic.fields import FieldInfo
from pydantic_settings import (
    BaseSettings,
    PydanticBaseSettingsSource,
    SettingsConfigDict,
    SettingsError,
)

from contract.base import Duration
from contract.names import (
    DEFAULT_NAMESPACE,
    DEFAULT_TASK_QUEUE,
    REPAIR_NAMESPACE,
    check_cluster_name,
    cluster_task_queue,
)
from contract.runbook import RepairAllowlist
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

PACKAGED_RUNBOOKS = Path(__file__).resolve().parent.parent / "runbooks"
ENV_PREFIX = "SICKBAY_"


def split_list(value: object) -> object:
    """The one list splitter: `"a, b"` or `'["a","b"]'` -> `["a", "b"]`; lists pass through."""
    if isinstance(value, str):
        text = value.strip()
        if text.startswith("["):
            return json.loads(text)
        return [part.strip() for part in text.split(",") if part.strip()]
    return value


StrList = Annotated[list[str], BeforeValidator(split_list)]


class WebhookSettings(BaseModel):
    """`sickbay webhook` (`SICKBAY_WEBHOOK_*`, `SICKBAY_ALERT_*`): limits, spool, token and the
    mapping of alert labels to a device. Temporal settings are the top-level ones."""

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


class ServerSettings(BaseModel):
    """The webhook's HTTP server (worker/http_server.py): TLS files and slow-client bounds."""

    webhook_tls_cert_file: Path | None = None  # PEM certificate (chain); with the key: HTTPS
    webhook_tls_key_file: Path | None = None
    webhook_header_timeout: float = Field(default=10.0, gt=0)
    webhook_body_timeout: float = Field(default=30.0, gt=0)
    webhook_max_connections: int = Field(default=256, ge=1, le=65536)

    @model_validator(mode="after")
    def _tls_pair(self) -> ServerSettings:
        if (self.webhook_tls_cert_file is None) != (self.webhook_tls_key_file is None):
            raise ValueError(
                "SICKBAY_WEBHOOK_TLS_CERT_FILE and SICKBAY_WEBHOOK_TLS_KEY_FILE go together: "
                "set both (HTTPS) or neither (plain HTTP)"
            )
        return self

    @property
    def tls(self) -> bool:
        return self.webhook_tls_cert_file is not None


class SweepSettings(BaseModel):
    """The health-sweep Schedule (`SICKBAY_SWEEP_*`, worker/schedules.py)."""

    sweep_enabled: bool = True  # False: `sickbay worker` does not create the Schedule
    sweep_interval: Duration = timedelta(minutes=5)
    sweep_unknown_timeout: Duration = timedelta(minutes=5)
    sweep_notify_channels: StrList = Field(default_factory=list)
    sweep_dry_run: bool = False

    @field_validator("sweep_interval")
    @classmethod
    def _min_interval(cls, value: timedelta) -> timedelta:
        if value < timedelta(seconds=10):
            raise ValueError("the sweep interval must be at least 10s")
        return value


SA_NAMESPACE_FILE = "/var/run/secrets/kubernetes.io/serviceaccount/namespace"


def _own_namespace() -> str:
    try:
        with open(SA_NAMESPACE_FILE) as fh:
            return fh.read().strip() or "sickbay"
    except OSError:
        return "sickbay"


class WatchSettings(BaseModel):
    """The health watcher (`SICKBAY_WATCH_*`, worker/watcher.py)."""

    watch_enabled: bool = True  # False: detection by the sweep (and alerts) only
    watch_namespace: str = Field(default_factory=_own_namespace)  # where the Lease lives
    watch_lease_seconds: float = 15.0
    watch_renew_seconds: float = 10.0
    watch_retry_seconds: float = 2.0

    @field_validator("watch_renew_seconds")
    @classmethod
    def _renew_below_lease(cls, value: float, info: Any) -> float:
        lease = info.data.get("watch_lease_seconds", 15.0)
        if not 0 < value < lease:
            raise ValueError(
                f"watch_renew_seconds ({value}) must be above 0 and below "
                f"watch_lease_seconds ({lease}): a holder must stop before others may take over"
            )
        return value


# Settings' sub-models: field name -> model. Their fields are read from SICKBAY_<FIELD>.
SUB_MODELS: dict[str, type[BaseModel]] = {
    "webhook": WebhookSettings,
    "server": ServerSettings,
    "sweep": SweepSettings,
    "watch": WatchSettings,
}


def _is_mapping(info: FieldInfo) -> bool:
    hint = info.annotation
    kinds = [hint, *get_args(hint)]
    return any(k is dict or get_origin(k) is dict for k in kinds)


class _FlatSubModelSource(PydanticBaseSettingsSource):
    """Each sub-model's fields from their flat variables (`SICKBAY_WEBHOOK_PORT` for
    `webhook.webhook_port`), so no variable name changes with the grouping. Names are
    case-insensitive, as for the top-level fields; mappings are JSON."""

    def get_field_value(self, field: FieldInfo, field_name: str) -> tuple[Any, str, bool]:
        return None, field_name, False  # __call__ reads every sub-model at once

    def __call__(self) -> dict[str, Any]:
        env = {name.upper(): value for name, value in os.environ.items()}
        out: dict[str, Any] = {}
        for name, model in SUB_MODELS.items():
            values: dict[str, Any] = {}
            for sub, info in model.model_fields.items():
                var = ENV_PREFIX + sub.upper()
                if var not in env:
                    continue
                raw = env[var]
                if _is_mapping(info):
                    try:
                        values[sub] = json.loads(raw)
                    except ValueError as exc:
                        raise SettingsError(f"{var} ({sub}) is not JSON: {exc}") from exc
                else:
                    values[sub] = raw
            if values:
                out[name] = values
        return out


class Settings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="SICKBAY_", extra="ignore")

    # Temporal
    temporal_address: str = "localhost:7233"
    temporal_namespace: str = DEFAULT_NAMESPACE
    task_queue: str = DEFAULT_TASK_QUEUE  # becomes `<task_queue>-<cluster>` for a named cluster
    # The cluster this process serves, when several share one Temporal namespace: part of
    # every workflow id, the task queue, the Schedule, the `SickbayCluster` search attribute
    # and every notification. Unset: the name recorded in the cluster (ConfigMap
    # sickbay-cluster, worker/cluster_name.py), derived and recorded once by the first worker;
    # set (even to "", the unnamed cluster: single-cluster ids): it must equal the record.
    cluster: str = ""
    # The webhook (no Kubernetes API access): a file holding the recorded name (the
    # ConfigMap's `name` key, mounted by deploy/webhook.yaml). Until it exists: 503.
    cluster_file: Path | None = None
    # TLS to Temporal (worker/temporal.py `tls_config`): a client certificate and its key
    # (mTLS, Temporal Cloud) always as a pair; a CA alone is server-side TLS to a self-hosted
    # Temporal whose certificate that CA signed; SICKBAY_TEMPORAL_TLS=true alone is TLS with
    # the system's trusted roots. None of them (and no API key): plaintext.
    temporal_tls: bool = False
    temporal_tls_cert: Path | None = None  # client certificate (mTLS, Temporal Cloud)
    temporal_tls_key: Path | None = None
    temporal_tls_ca: Path | None = None
    temporal_api_key: SecretStr | None = None  # Temporal Cloud API key
    temporal_api_key_file: Path | None = None
    temporal_ui_url: str = "http://localhost:8233"

    # Kubernetes: KUBECONFIG (standard) or in-cluster config; optional context
    kubeconfig: Path | None = Field(default=None, validation_alias="KUBECONFIG")
    kube_context: str | None = None
    kube_request_timeout: float = 10.0  # seconds, every API call
    # The cluster runs HAMi v2.10 or later, whose scheduler honours the node annotation
    # `hami.io/device-cordon`: a HAMi GPU is quarantined with it. Off (HAMi before v2.10, or
    # not known): the GPU's node is tainted NoSchedule and the remediation escalates.
    hami_device_cordon: bool = False

    # Runbooks
    runbooks_dir: Path = PACKAGED_RUNBOOKS

    # Closed-loop repair. The namespace of the reset and validation Jobs (their own, with the
    # Pod Security level their pods need: deploy/namespace.yaml); the worker creates Jobs
    # nowhere else. The allowlist (JSON, `{"reset": {"images": [...], "commands": [[...]]},
    # "validation": {...}}`, images pinned by digest, the first the default): the only images
    # and commands a repair pod may run. Deployment settings, not runbooks: whoever edits the
    # runbooks must not choose what runs privileged on every GPU node (docs/deploy.md).
    repair_namespace: str = REPAIR_NAMESPACE
    repair_allowlist: RepairAllowlist = Field(default_factory=RepairAllowlist)

    # Worker
    metrics_port: int = 9464  # Prometheus metrics of the worker; 0 disables
    # Address the metrics listen on: loopback unless the operator says otherwise (in a pod,
    # 0.0.0.0 so the kubelet's probes and Prometheus reach it; deploy/ sets that and a
    # NetworkPolicy that lets only the monitoring namespace in).
    metrics_host: str = "127.0.0.1"
    # `GET /healthz` (worker/health.py), at metrics_host: 200 only while the worker polls
    # Temporal; the liveness probe's target. 0 (the default of a local process, so several
    # can run on one host) disables it; the image, deploy/ and compose set 9465.
    health_port: int = Field(default=0, ge=0, le=65535)
    # A check every 15 s (one DescribeTaskQueue: cheap for the frontend); unhealthy after 90 s
    # without a passing one: several checks, so one slow answer during a Temporal failover
    # does not restart the worker, yet a dead connection is seen well within two minutes.
    health_interval_seconds: float = Field(default=15.0, gt=0)
    health_stale_seconds: float = Field(default=90.0, gt=0)
    max_concurrent_activities: int = 200
    # Workflow tasks and local activities in progress at once. A remediation's first task runs
    # its confirm step's local activities inside it, holding a task slot for a second or two
    # in a burst: with the SDK's 100, the second hundred of 200 GPUs failing together waited
    # for the first hundred to finish confirming. More is not better: with 400 the one
    # process took on more than its CPU finished within a task's 10 s timeout, and timed-out
    # tasks were replayed and their local activities run again (BENCHMARKS.md, detection
    # burst: last rule 14.4 s with 100, 11.7 s with 200, 22-39 s with 400, 200 remediations
    # already holding).
    max_concurrent_workflow_tasks: int = Field(default=200, ge=2)
    max_concurrent_local_activities: int = Field(default=200, ge=1)
    # Workflows kept in the worker's memory between tasks (~0.5 MiB each). A remediation that
    # falls out of the cache is replayed from its (short) history on its next task, so a
    # bounded cache keeps RSS flat with thousands of remediations holding.
    max_cached_workflows: int = 200
    graceful_shutdown_seconds: float = 30.0

    # Notification channels and cloud credentials: see activities/notify and activities/cloud
    channels_file: Path | None = None  # YAML: channel name -> type + secret reference
    # A runbook that names a channel or provider this worker has not configured stops the
    # worker at start-up (worker/integrations.py); true: it starts anyway, degraded, saying so
    # at WARNING and in the gauge sickbay_unconfigured_integrations (escalations to those
    # channels, scale-ups and node rungs through those providers then fail when they come).
    allow_unconfigured_integrations: bool = False

    # Verified actors (contract/actors.py): the key the actions endpoint (webhook) signs a
    # verified identity with and the worker checks it with: the same Secret in both. Unset:
    # the endpoint answers 503 and every action counts as unverified.
    actions_key: SecretStr | None = None
    actions_key_file: Path | None = None
    # The CLI: send approve/reject/abort/repaired/extend-deadline through this actions
    # endpoint (the webhook's URL) with the person's Kubernetes credentials (`--via`).
    actions_url: str | None = None
    # Slack buttons (POST /v1/slack/actions): the Slack app's signing secret, and the YAML
    # mapping of Slack user ids to Kubernetes user + groups (docs/deploy.md).
    slack_signing_secret: SecretStr | None = None
    slack_signing_secret_file: Path | None = None
    slack_users_file: Path | None = None

    # The process parts (SUB_MODELS), each from its own flat SICKBAY_* variables.
    webhook: WebhookSettings = Field(default_factory=WebhookSettings)
    server: ServerSettings = Field(default_factory=ServerSettings)
    sweep: SweepSettings = Field(default_factory=SweepSettings)
    watch: WatchSettings = Field(default_factory=WatchSettings)

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        # Arguments first, then the sub-models' flat variables, then the top-level ones.
        return (
            init_settings,
            _FlatSubModelSource(settings_cls),
            env_settings,
            dotenv_settings,
            file_secret_settings,
        )

    @classmethod
    def env_names(cls) -> dict[str, tuple[str, ...]]:
        """Every variable `Settings` reads -> the field it sets (a path into the sub-models)."""
        names: dict[str, tuple[str, ...]] = {}
        for name, info in cls.model_fields.items():
            if name in SUB_MODELS:
                for sub in SUB_MODELS[name].model_fields:
                    names[ENV_PREFIX + sub.upper()] = (name, sub)
            elif isinstance(info.validation_alias, str):
                names[info.validation_alias] = (name,)
            else:
                names[ENV_PREFIX + name.upper()] = (name,)
        return names

    @field_validator("repair_namespace")
    @classmethod
    def _namespace_name(cls, value: str) -> str:
        if not re.fullmatch(r"[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?", value):
            raise ValueError(f"{value!r} is not a namespace name (RFC 1123 label)")
        return value

    @field_validator("cluster")
    @classmethod
    def _cluster_name(cls, value: str) -> str:
        return check_cluster_name(value.strip())

    @model_validator(mode="after")
    def _cluster_queue(self) -> Settings:
        # Computed once, here, so every process (worker, webhook, CLI) of one cluster uses the
        # same queue and no two clusters share one.
        self.task_queue = cluster_task_queue(self.task_queue, self.cluster)
        return self

    @model_validator(mode="after")
    def _tls_pair(self) -> Settings:
        # A certificate without its key (or the reverse) must not fall back to plaintext.
        if (self.temporal_tls_cert is None) != (self.temporal_tls_key is None):
            given, absent = (
                ("SICKBAY_TEMPORAL_TLS_CERT", "SICKBAY_TEMPORAL_TLS_KEY")
                if self.temporal_tls_cert is not None
                else ("SICKBAY_TEMPORAL_TLS_KEY", "SICKBAY_TEMPORAL_TLS_CERT")
            )
            raise ValueError(
                f"{given} is set but {absent} is not: a Temporal client certificate needs its "
                "key (set both SICKBAY_TEMPORAL_TLS_CERT and SICKBAY_TEMPORAL_TLS_KEY for mTLS, "
                "or neither; SICKBAY_TEMPORAL_TLS_CA alone is server-side TLS)"
            )
        return self

    @property
    def cluster_explicit(self) -> bool:
        """True when SICKBAY_CLUSTER (or an argument) set the name, even to "" (unnamed)."""
        return "cluster" in self.model_fields_set

    def with_cluster(self, cluster: str) -> Settings:
        """These settings for the recorded `cluster`: its name and its task queue. Only from
        an unset name (the queue is still the base one) or to the name already set."""
        check_cluster_name(cluster)
        if cluster == self.cluster:
            return self
        if self.cluster:
            raise ValueError(f"cluster name {self.cluster!r} is set; it cannot become {cluster!r}")
        return self.model_copy(
            update={"cluster": cluster, "task_queue": cluster_task_queue(self.task_queue, cluster)}
        )

    @field_validator("kubeconfig", mode="before")
    @classmethod
    def _first_kubeconfig(cls, value: object) -> object:
        # KUBECONFIG may be a ':'-separated list; the client loads the first file.
        if isinstance(value, str) and ":" in value:
            return value.split(":", 1)[0]
        return value

    def actions_key_bytes(self) -> bytes | None:
        """The actions key (None: not configured). RuntimeError when it is unreadable or
        shorter than 32 bytes: a guessable key would let anyone forge a verified actor."""
        return _secret(self.actions_key, self.actions_key_file, "SICKBAY_ACTIONS_KEY", 32)

    def slack_signing_secret_bytes(self) -> bytes | None:
        return _secret(
            self.slack_signing_secret,
            self.slack_signing_secret_file,
            "SICKBAY_SLACK_SIGNING_SECRET",
            16,
        )

    def api_key(self) -> str | None:
        if self.temporal_api_key is not None:
            return self.temporal_api_key.get_secret_value()
        if self.temporal_api_key_file is not None:
            return self.temporal_api_key_file.read_text().strip()
        return None


def _secret(value: SecretStr | None, path: Path | None, var: str, min_len: int) -> bytes | None:
    if value is not None:
        text = value.get_secret_value().strip()
    elif path is not None:
        try:
            text = path.read_text().strip()
        except OSError as exc:
            raise RuntimeError(f"cannot read {var}_FILE {path}: {exc}") from exc
    else:
        return None
    if len(text) < min_len:
        raise RuntimeError(f"{var} is shorter than {min_len} characters: refused")
    return text.encode()
