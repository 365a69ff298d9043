"""Settings of every Sickbay process (worker, webhook, CLI, demo): one `Settings`.

One prefix, `SICKBAY_`, read from the environment by pydantic-settings (flags override it).
Built in `main()`/lifespans, never at import, so tests can construct their own.
Secrets (API keys, tokens, webhook URLs with keys in them) are read from env or files here and
never put into workflow inputs or histories.

Every field of `Settings` is one variable, `SICKBAY_<FIELD>` (`kubeconfig`: `KUBECONFIG`).
The fields of each process part are declared in its own model, which `Settings` inherits:
`WebhookSettings` (the receiver), `ServerSettings` (its HTTP server), `SweepSettings` (the
health-sweep Schedule), `WatchSettings` (the health watcher); `settings.webhook` (and
`.server`, `.sweep`, `.watch`) is that part of the settings (`SICKBAY_WEBHOOK_PORT` ->
`settings.webhook.webhook_port`). Those models also stand alone (tests, the webhook's flags)
and then read no environment. `env_names()` lists every variable; docs/settings.md is
generated from the fields and their docstrings (worker/settings_docs.py). List variables take
a comma-separated string (`a,b`) or JSON (`["a","b"]`); mappings and models take JSON.
"""

from __future__ import annotations

import json
import re
from datetime import timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    SecretStr,
    field_validator,
    model_validator,
)
from pydantic_settings import BaseSettings, NoDecode, SettingsConfigDict

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

if TYPE_CHECKING:
    from activities.cloud.config import CloudConfig
    from activities.kube.client import KubeSettings

PACKAGED_RUNBOOKS = Path(__file__).resolve().parent.parent / "runbooks"
ENV_PREFIX = "SICKBAY_"
# Health checks within SICKBAY_HEALTH_STALE_SECONDS: one slow answer is not a restart.
HEALTH_CHECKS_PER_STALE = 6


def split_list(value: object) -> object:
    """The one list splitter: `"a, b"` or `'["a","b"]'` -> `["a", "b"]`; lists pass through."""
    if isinstance(value, str):
        text = value.strip()
        if text.startswith("["):
            return json.loads(text)
        return [part.strip() for part in text.split(",") if part.strip()]
    return value


# NoDecode: the environment's text reaches split_list as is (not JSON-decoded first).
StrList = Annotated[list[str], NoDecode, BeforeValidator(split_list)]


def env_name(field: str, alias: object = None) -> str:
    """The variable of a field: `SICKBAY_<FIELD>`, or its alias (`KUBECONFIG`)."""
    return alias if isinstance(alias, str) else ENV_PREFIX + field.upper()


class _Part(BaseModel):
    """A process part's fields: a model of its own, and fields of `Settings` (which inherits
    it). The docstring under each field is its line in docs/settings.md."""

    model_config = ConfigDict(use_attribute_docstrings=True)


class WebhookSettings(_Part):
    """`sickbay webhook` (`SICKBAY_WEBHOOK_*`, `SICKBAY_ALERT_*`): limits, spool, token and the
    mapping of alert labels to a device. Temporal settings are the top-level ones."""

    webhook_host: str = "127.0.0.1"
    """Address the webhook listens on (`--host`; `0.0.0.0` in a pod)."""
    webhook_port: int = Field(default=8080, ge=0, le=65535)
    """Port of the webhook (`--port`)."""
    webhook_token: SecretStr | None = None
    """Bearer token of `POST /v1/alertmanager`, 32+ characters (required, or the file)."""
    webhook_token_file: Path | None = None
    """A file holding the bearer token (re-read when it changes)."""
    webhook_auth_disabled: bool = False
    """No token (`--no-auth`): only for a loopback demo, never in a cluster."""
    webhook_max_body_bytes: int = Field(default=4 * 1024 * 1024, ge=1024)
    """Largest notification body accepted (413 past it)."""
    webhook_max_alerts: int = Field(default=5000, ge=1)
    """Most alerts in one notification."""
    webhook_concurrency: int = Field(default=64, ge=1, le=4096)
    """In-flight Temporal calls for the whole process: enough to keep a frontend busy during
    an alert storm without opening thousands of concurrent RPCs on one connection."""
    webhook_temporal_timeout: float = Field(default=8.0, gt=0)
    """Seconds, upper bound for all Temporal calls of one notification. Past it: 503 and
    Alertmanager retries; below Alertmanager's usual 10 s+ webhook timeout."""
    webhook_dedup_seconds: float = Field(default=60.0, ge=0)
    """Recent-delivery window: an alert identical to one Temporal accepted this many seconds
    ago or less (same workflow, status, fingerprint, startsAt) is acknowledged without another
    call. Covers Alertmanager's retries and overlapping groups during a storm; 0 turns the
    cache off (identical alerts in flight at the same moment still share one call)."""
    webhook_spool_dir: Path | None = None
    """Delivery spool (worker/spool.py). Set: a notification waits for Temporal at most
    `SICKBAY_WEBHOOK_ACK_SECONDS`; the alerts Temporal has not accepted by then are journaled
    to this directory (flushed to disk) before the 200, and delivered in the background,
    across restarts. One directory per webhook process (locked). Unset: a notification is
    answered only once Temporal accepted every alert (or 503 past the Temporal timeout)."""
    webhook_ack_seconds: float = Field(default=0.5, gt=0)
    """With a spool, how long a notification waits for Temporal before journaling: well under
    Alertmanager's webhook timeout; a healthy Temporal answers in milliseconds."""
    webhook_spool_max: int = Field(default=100_000, ge=1)
    """Past this many pending alerts the spool takes no more: notifications wait for Temporal
    (503 past the deadline) as without a spool, so a long outage cannot fill the disk."""
    webhook_spool_max_bytes: int = Field(default=DEFAULT_SPOOL_BYTES, ge=64 * 1024)
    """... and past this many bytes of journal: a full disk would lose alerts already
    acknowledged. deploy/webhook.yaml sizes its emptyDir from it (twice this plus slack)."""
    webhook_max_alert_bytes: int = Field(default=16 * 1024, ge=1024)
    """An alert whose labels and annotations (UTF-8) are larger than this is refused as
    `too-large`: a real DCGM alert is ~2 KB, and every accepted alert is kept in history and,
    when Temporal is slow, in the spool."""
    webhook_spool_retry_seconds: float = Field(default=2.0, gt=0)
    """How often spooled alerts whose call failed are sent again."""
    # Mapping alert labels to a device (defaults: dcgm-exporter, deploy/prometheus-rules.yaml)
    alert_names: StrList = Field(default_factory=lambda: list(DEFAULT_ALERT_NAMES))
    """Alert names acted on (the shipped rules' names)."""
    alert_classes: dict[str, AlertKind] = Field(default_factory=dict)
    """JSON, your own alert names -> failure class (or `xid`): `{"MyGpuDead": "unhealthy"}`;
    merged over the shipped rules' classes, and accepted like `SICKBAY_ALERT_NAMES`."""
    alert_node_labels: StrList = Field(default_factory=lambda: list(DEFAULT_NODE_LABELS))
    """Labels naming the GPU's node, the first present wins."""
    alert_uuid_labels: StrList = Field(default_factory=lambda: ["UUID"])
    """Labels holding the GPU's UUID."""
    alert_index_labels: StrList = Field(default_factory=lambda: ["gpu"])
    """Labels holding the GPU's index on its node."""
    alert_model_labels: StrList = Field(default_factory=lambda: ["modelName"])
    """Labels holding the GPU's model."""
    alert_xid_labels: StrList = Field(default_factory=lambda: ["err_code", "Xid", "xid"])
    """Labels holding the XID error code."""
    alert_value_annotation: str = "value"
    """The annotation holding the alert's value."""

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


class ServerSettings(_Part):
    """The webhook's HTTP server (worker/http_server.py): TLS files and slow-client bounds."""

    webhook_tls_cert_file: Path | None = None
    """PEM certificate (chain): with the key, the webhook serves HTTPS; re-read on change."""
    webhook_tls_key_file: Path | None = None
    """The certificate's private key (PEM); set with the certificate or not at all."""
    webhook_header_timeout: float = Field(default=10.0, gt=0)
    """Seconds a client has to send a request's headers."""
    webhook_body_timeout: float = Field(default=30.0, gt=0)
    """Seconds a client has to send a request's body."""
    webhook_max_connections: int = Field(default=256, ge=1, le=65536)
    """Open connections at most (a quarter of them per client address)."""

    @model_validator(mode="after")
    def _webhook_tls_pair(self) -> ServerSettings:
        if (self.webhook_tls_cert_file is None) != (self.webhook_tls_key_file is None):
            raise ValueError(
                "SICKBAY_WEBHOOK_TLS_CERT_FILE and SICKBAY_WEBHOOK_TLS_KEY_FILE go together: "
                "set both (HTTPS) or neither (plain HTTP)"
            )
        return self

    @property
    def tls(self) -> bool:
        return self.webhook_tls_cert_file is not None


class SweepSettings(_Part):
    """The health-sweep Schedule (`SICKBAY_SWEEP_*`, worker/schedules.py)."""

    sweep_enabled: bool = True
    """False: `sickbay worker` does not create the health-sweep Schedule."""
    sweep_interval: Duration = timedelta(minutes=5)
    """The sweep's period (`30s`, `5m`, `1h`; at least 10 s)."""
    sweep_unknown_timeout: Duration = timedelta(minutes=5)
    """A device reported `Unknown` this long counts as unhealthy."""
    sweep_notify_channels: StrList = Field(default_factory=list)
    """Channel names for missing-GPU and unresolved-health notices."""
    sweep_dry_run: bool = False
    """The sweep reports what it would launch and launches nothing."""

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


class WatchSettings(_Part):
    """The health watcher (`SICKBAY_WATCH_*`, worker/watcher.py)."""

    watch_enabled: bool = True
    """Run the health watcher in `sickbay worker` (false: detection by the sweep and alerts)."""
    watch_namespace: str = Field(default_factory=_own_namespace)
    """Sickbay's namespace (default: the service account's, else `sickbay`): where the
    watcher's Lease and the recorded cluster name (ConfigMap `sickbay-cluster`) live."""
    watch_lease_seconds: float = 15.0
    """The watcher's Lease: a dead holder is replaced after it expires."""
    watch_renew_seconds: float = 10.0
    """A holder that cannot renew its Lease (every 2 s) within this many seconds stops
    watching; below the lease seconds."""

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


class CloudSettings(_Part):
    """Node-pool providers (activities/cloud, docs/cloud.md): the cloud file, and defaults for
    the runbooks that name only a provider (`scaleUp.provider: gke`): its pool is then the
    failed node's pool in this cluster. What the file sets wins over these. Credentials are
    not settings: each SDK's own chain finds them, or a secret reference (docs/settings.md)."""

    cloud_file: Path | None = None
    """YAML: node-pool providers' endpoints, credentials (as secret references) and
    profiles (docs/cloud.md)."""
    gke_project: str | None = None
    """GKE: the project of this cluster (`gke.project`)."""
    gke_location: str | None = None
    """GKE: the cluster's location, region or zone (`gke.location`)."""
    gke_cluster: str | None = None
    """GKE: this cluster's name (`gke.cluster`)."""
    aks_subscription: str | None = None
    """AKS: the subscription id of this cluster (`aks.subscription`)."""
    aks_resource_group: str | None = None
    """AKS: this cluster's resource group (`aks.resource_group`)."""
    aks_cluster: str | None = None
    """AKS: this cluster's name (`aks.cluster`)."""
    aws_region: str | None = None
    """EKS: the region of the pools that name none (`aws.region`); unset: boto3's own
    (`AWS_REGION`, `AWS_DEFAULT_REGION`, the shared config file)."""
    aws_profile: str | None = None
    """EKS: a named profile of the shared AWS config file (`aws.profile`); unset: the
    standard credential chain."""
    eks_cluster: str | None = None
    """EKS: this cluster's name (`aws.cluster`)."""

    def cloud_defaults(self) -> dict[str, dict[str, str | None]]:
        """These settings as defaults of the cloud file's sections."""
        return {
            "gke": {
                "project": self.gke_project,
                "location": self.gke_location,
                "cluster": self.gke_cluster,
            },
            "aks": {
                "subscription": self.aks_subscription,
                "resource_group": self.aks_resource_group,
                "cluster": self.aks_cluster,
            },
            "aws": {
                "region": self.aws_region,
                "profile": self.aws_profile,
                "cluster": self.eks_cluster,
            },
        }

    def cloud_config(self) -> CloudConfig:
        """The providers' configuration: the cloud file over these defaults (ConfigError when
        the file does not load)."""
        from activities.cloud.config import CloudConfig  # httpx, yaml: only where used

        return CloudConfig.load(self.cloud_file, self.cloud_defaults())


def _home_state_dir() -> Path:
    return Path.home() / ".sickbay"


class Settings(
    WebhookSettings, ServerSettings, SweepSettings, WatchSettings, CloudSettings, BaseSettings
):
    """Every setting of every Sickbay process: the shared ones below, and the process parts'
    fields it inherits. Each field is the variable `SICKBAY_<FIELD>`."""

    model_config = SettingsConfigDict(
        env_prefix=ENV_PREFIX, extra="ignore", use_attribute_docstrings=True
    )

    # Temporal
    temporal_address: str = "localhost:7233"
    """Temporal frontend, `host:port`."""
    temporal_namespace: str = DEFAULT_NAMESPACE
    """Temporal namespace."""
    task_queue: str = DEFAULT_TASK_QUEUE
    """Task queue of the worker; `<task_queue>-<cluster>` for a named cluster."""
    cluster: str = ""
    """This cluster's name, when several share one Temporal namespace: part of every workflow
    id, the task queue, the Schedule, the `SickbayCluster` search attribute and every
    notification. Unset: the name recorded in the cluster (ConfigMap `sickbay-cluster`,
    worker/cluster_name.py), derived and recorded once by the first worker; set (even to "",
    the unnamed cluster: single-cluster ids), it must equal the record."""
    cluster_file: Path | None = None
    """The webhook (no Kubernetes API access): a file holding the recorded name (the
    ConfigMap's `name` key, mounted by deploy/webhook.yaml); 503 until it exists. The CLI reads
    it after `--cluster` and `SICKBAY_CLUSTER`, before the ConfigMap."""
    # TLS to Temporal (worker/temporal.py `tls_config`). None of them (and no API key): plaintext.
    temporal_tls: bool = False
    """TLS with the system's trusted roots (implied by any of the other TLS settings)."""
    temporal_tls_cert: Path | None = None
    """Client certificate (mTLS, Temporal Cloud); always with its key."""
    temporal_tls_key: Path | None = None
    """The client certificate's key."""
    temporal_tls_ca: Path | None = None
    """A CA alone: server-side TLS to a self-hosted Temporal whose certificate it signed."""
    temporal_api_key: SecretStr | None = None
    """Temporal Cloud API key (TLS on automatically)."""
    temporal_api_key_file: Path | None = None
    """A file holding the Temporal Cloud API key."""
    temporal_ui_url: str = "http://localhost:8233"
    """Base of the Web UI links in notifications; the CLI links to it only when set (else to
    the UI of the running `sickbay-dev up` stack)."""

    # Kubernetes: KUBECONFIG (standard) or in-cluster config
    kubeconfig: Path | None = Field(default=None, validation_alias="KUBECONFIG")
    """The standard kubeconfig variable (the first file of a `:`-separated list); unset:
    in-cluster config."""
    kube_context: str | None = None
    """A context of the kubeconfig other than its current one."""
    kube_request_timeout: float = 10.0
    """Seconds, every Kubernetes API call."""
    hami_device_cordon: bool = False
    """The cluster runs HAMi v2.10 or later, whose scheduler honours the node annotation
    `hami.io/device-cordon`: a HAMi GPU is quarantined with it. Off (HAMi before v2.10, or
    not known): the GPU's node is tainted NoSchedule and the remediation escalates."""

    # Runbooks
    runbooks_dir: Path = PACKAGED_RUNBOOKS
    """Runbook directory (default: the packaged `runbooks/`)."""

    # Closed-loop repair. Deployment settings, not runbooks: whoever edits the runbooks must not
    # choose what runs privileged on every GPU node (docs/deploy.md).
    repair_namespace: str = REPAIR_NAMESPACE
    """The namespace of the reset and validation Jobs (their own, with the Pod Security level
    their pods need: deploy/namespace.yaml); the worker creates Jobs nowhere else."""
    repair_allowlist: RepairAllowlist = Field(default_factory=RepairAllowlist)
    """JSON, `{"reset": {"images": [...], "commands": [[...]]}, "validation": {...}}`, images
    pinned by digest, the first the default: the only images and commands a repair pod may
    run; a runbook naming others is refused."""

    # Worker
    metrics_port: int = 9464
    """Prometheus metrics of the worker; 0 disables."""
    metrics_host: str = "127.0.0.1"
    """Address the metrics (and `/healthz`) listen on: `0.0.0.0` in a pod, so the kubelet's
    probes and Prometheus reach it (deploy/ lets only the monitoring namespace in)."""
    health_port: int = Field(default=0, ge=0, le=65535)
    """`GET /healthz` (worker/health.py): 200 only while the worker polls Temporal; the
    liveness probe's target. 0 (a local process, so several can run on one host) disables it;
    the image, deploy/ and compose set 9465."""
    health_stale_seconds: float = Field(default=90.0, gt=0)
    """Unhealthy after this many seconds without a passing check. A check (one
    DescribeTaskQueue: cheap for the frontend) runs every sixth of it (15 s of 90): several
    checks, so one slow answer during a Temporal failover does not restart the worker."""
    max_concurrent_activities: int = Field(default=200, ge=1)
    """Short activities the worker runs at once (a page, a repair rung, a verified action's
    check); the long waits below never take one of these."""
    max_open_waits: int = Field(default=400, ge=1)
    """Long waits the worker keeps open at once beside those: the eviction and replacement
    watches, evict-pods, a capacity request the pool scaler holds, a drain's wait. Each
    Kubernetes wait keeps a thread and a watch connection; one per GPU being evicted or
    replaced, so the budget's share of the GPUs this worker serves is the most it needs."""
    max_concurrent_workflow_tasks: int = Field(default=200, ge=2)
    """Workflow tasks in progress at once. A remediation's first task runs its confirm step's
    local activities inside it, holding a task slot for a second or two in a burst; more is not
    better: a process taking on more than its CPU finishes within a task's 10 s timeout replays
    tasks (BENCHMARKS.md, detection burst)."""
    max_concurrent_local_activities: int = Field(default=200, ge=1)
    """Local activities in progress at once."""
    max_cached_workflows: int = 200
    """Workflows kept in memory between tasks (~0.5 MiB each): bounds the worker's RSS; one
    that falls out is replayed from its short history on its next task."""
    graceful_shutdown_seconds: float = 30.0
    """Seconds running activities get to finish when the worker stops."""

    # Notification channels and cloud credentials: see activities/notify and activities/cloud
    channels_file: Path | None = None
    """YAML: escalation channel name -> type + secret reference (docs/notify.md)."""
    allow_unconfigured_integrations: bool = False
    """A runbook that names a channel or provider this worker has not configured stops the
    worker at start-up (worker/integrations.py); true: it starts anyway, degraded, saying so at
    WARNING and in the gauge `sickbay_unconfigured_integrations`."""

    # Verified actors (contract/actors.py)
    actions_key: SecretStr | None = None
    """The key the actions endpoint (webhook) signs a verified identity with and the worker
    checks it with (32+ characters): the same Secret in both. Unset: the endpoint answers 503
    and every action counts as unverified."""
    actions_key_file: Path | None = None
    """A file holding the actions key."""
    actions_url: str | None = None
    """The CLI: send approve/reject/abort/repaired/extend-deadline through this actions
    endpoint (the webhook's URL) with the person's Kubernetes credentials (`--via`)."""
    slack_signing_secret: SecretStr | None = None
    """Slack buttons (`POST /v1/slack/actions`): the Slack app's signing secret."""
    slack_signing_secret_file: Path | None = None
    """A file holding the Slack signing secret."""
    slack_users_file: Path | None = None
    """YAML: Slack user ids -> Kubernetes user + groups (docs/deploy.md)."""

    # The CLI on a workstation
    state_dir: Path = Field(default_factory=_home_state_dir)
    """Where a local stack (`sickbay-dev up`, `sickbay-dev demo --keep`) records itself and the CLI
    finds it (default `~/.sickbay`); `sickbay-dev twin` keeps its state there too."""

    @property
    def health_interval_seconds(self) -> float:
        """Seconds between the health checks: a sixth of the stale limit."""
        return self.health_stale_seconds / HEALTH_CHECKS_PER_STALE

    @property
    def webhook(self) -> WebhookSettings:
        """The webhook's part of these settings."""
        return self

    @property
    def server(self) -> ServerSettings:
        """The webhook HTTP server's part of these settings."""
        return self

    @property
    def cloud(self) -> CloudSettings:
        """The node-pool providers' part of these settings."""
        return self

    @property
    def sweep(self) -> SweepSettings:
        """The health sweep's part of these settings."""
        return self

    @property
    def watch(self) -> WatchSettings:
        """The health watcher's part of these settings."""
        return self

    @classmethod
    def env_names(cls) -> dict[str, str]:
        """Every variable `Settings` reads -> the field it sets."""
        return {
            env_name(name, info.validation_alias): name for name, info in cls.model_fields.items()
        }

    @field_validator("state_dir", mode="before")
    @classmethod
    def _state_dir_or_home(cls, value: object) -> object:
        return value or _home_state_dir()  # SICKBAY_STATE_DIR="": the default

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
    def _temporal_tls_pair(self) -> Settings:
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

    def kube_settings(self) -> KubeSettings:
        """The Kubernetes client's settings (activities.kube.client.KubeSettings) from these."""
        from activities.kube.client import KubeSettings  # kubernetes: only where used

        return KubeSettings(
            kubeconfig=str(self.kubeconfig) if self.kubeconfig else None,
            context=self.kube_context,
            request_timeout=self.kube_request_timeout,
            max_waits=self.max_open_waits,
            hami_device_cordon=self.hami_device_cordon,
        )

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
