"""Settings shared by every Sickbay process (worker, webhook, CLI, demo).

One prefix, `SICKBAY_`, read from the environment (and flags, which override it). Built in
`main()`/lifespans, never at import, so tests can construct their own.
Secrets (API keys, tokens, webhook URLs with keys in them) are read from env or files here and
never put into workflow inputs or histories.
"""

from __future__ import annotations

from pathlib import Path

from pydantic import Field, SecretStr, field_validator, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from contract.names import (
    DEFAULT_NAMESPACE,
    DEFAULT_TASK_QUEUE,
    check_cluster_name,
    cluster_task_queue,
)

PACKAGED_RUNBOOKS = Path(__file__).resolve().parent.parent / "runbooks"


class Settings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="SICKBAY_", extra="ignore")

    # Temporal
    temporal_address: str = "localhost:7233"
    temporal_namespace: str = DEFAULT_NAMESPACE
    task_queue: str = DEFAULT_TASK_QUEUE  # becomes `<task_queue>-<cluster>` for a named cluster
    # The cluster this process serves, when several share one Temporal namespace: part of
    # every workflow id, the task queue, the Schedule, the `SickbayCluster` search attribute
    # and every notification. "" (unset): the single-cluster names of earlier releases.
    cluster: str = ""
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

    # Runbooks
    runbooks_dir: Path = PACKAGED_RUNBOOKS

    # Worker
    metrics_port: int = 9464  # Prometheus metrics of the worker; 0 disables
    # Address the metrics listen on: loopback unless the operator says otherwise (in a pod,
    # 0.0.0.0 so the kubelet's probes and Prometheus reach it; deploy/ sets that and a
    # NetworkPolicy that lets only the monitoring namespace in).
    metrics_host: str = "127.0.0.1"
    max_concurrent_activities: int = 200
    # Workflows kept in the worker's memory between tasks (~0.5 MiB each). A remediation that
    # falls out of the cache is replayed from its (short) history on its next task, so a
    # bounded cache keeps RSS flat with thousands of remediations holding.
    max_cached_workflows: int = 200
    graceful_shutdown_seconds: float = 30.0

    # Notification channels and cloud credentials: see activities/notify and activities/cloud
    channels_file: Path | None = None  # YAML: channel name -> type + secret reference

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

    @field_validator("kubeconfig", mode="before")
    @classmethod
    def _first_kubeconfig(cls, value: object) -> object:
        # KUBECONFIG may be a ':'-separated list; the client loads the first file.
        if isinstance(value, str) and ":" in value:
            return value.split(":", 1)[0]
        return value

    def api_key(self) -> str | None:
        if self.temporal_api_key is not None:
            return self.temporal_api_key.get_secret_value()
        if self.temporal_api_key_file is not None:
            return self.temporal_api_key_file.read_text().strip()
        return None
