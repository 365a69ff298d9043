"""Worker-side configuration of node-pool providers: where each API lives and where its
credentials are. Loaded from the YAML file the worker's settings name (`SICKBAY_CLOUD_FILE`,
optional) over the defaults those settings give (`SICKBAY_GKE_PROJECT`, `SICKBAY_AWS_REGION`,
...: worker/settings.py `CloudSettings`); this module reads no variable itself. A worker with
only `SICKBAY_GKE_TOKEN_FILE` set can already scale GKE pools: the providers' token defaults
are secret references to well-known variables, read at each use.

Runbooks name the pool (`NodePoolTarget`); this file says how to reach it. Secrets are
`{env: VAR}` or `{file: PATH}` references (see `SecretRef`) and never appear in runbooks,
workflow inputs or history.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from activities.outbound import SecretRef, load_yaml_model


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class GkeConfig(_Model):
    endpoint: str = "https://container.googleapis.com"
    # A ready bearer token: $SICKBAY_GKE_TOKEN, or the file named by $SICKBAY_GKE_TOKEN_FILE.
    # Unset: google-auth's Application Default Credentials (the GKE metadata server with
    # Workload Identity, $GOOGLE_APPLICATION_CREDENTIALS, ...; activities/cloud/credentials.py).
    token: SecretRef = SecretRef(env="SICKBAY_GKE_TOKEN")
    # Defaults for runbooks that name only the provider (`scaleUp.provider: gke`): the pool is
    # then the failed node's pool in this cluster.
    project: str | None = None
    location: str | None = None
    cluster: str | None = None
    # Hosts the token may be sent to when following instance-group URLs (besides `endpoint`).
    compute_hosts: list[str] = Field(
        default_factory=lambda: ["https://www.googleapis.com", "https://compute.googleapis.com"]
    )


class AksConfig(_Model):
    endpoint: str = "https://management.azure.com"
    api_version: str = "2024-09-01"
    # Defaults for runbooks that name only the provider (`scaleUp.provider: aks`).
    subscription: str | None = None
    resource_group: str | None = None
    cluster: str | None = None
    # A ready bearer token ($SICKBAY_AZURE_TOKEN / _FILE); unset: azure-identity's credential
    # chain (environment, AKS workload identity, managed identity; credentials.py), which reads
    # AZURE_TENANT_ID, AZURE_CLIENT_ID, AZURE_FEDERATED_TOKEN_FILE, ... itself.
    token: SecretRef = SecretRef(env="SICKBAY_AZURE_TOKEN")
    # Microsoft Entra's host for sovereign clouds (login.microsoftonline.us, ...); None:
    # $AZURE_AUTHORITY_HOST, else the public cloud.
    authority: str | None = None
    # The user-assigned managed identity to sign in as, when the nodes have several.
    managed_identity_client_id: str | None = None


class AwsConfig(_Model):
    """EKS managed node groups and their EC2 instances, through boto3. Credentials are never in
    this file: boto3's standard chain finds them (EKS Pod Identity, IRSA web identity, the
    environment, a shared config profile, the instance profile) and botocore signs every
    request."""

    # The region of the runbooks' pools when a pool names none (`location`); boto3's own
    # defaults ($AWS_REGION / $AWS_DEFAULT_REGION, the shared config file) otherwise.
    region: str | None = None
    # A named profile of the shared config file; None: the standard chain.
    profile: str | None = None
    cluster: str | None = None
    # Service -> endpoint URL (`eks`, `ec2`, `autoscaling`, `sts` for `sickbay doctor`): VPC
    # endpoints, or the twin's AWS shapes in tests and the demo. Unset: AWS's own endpoints.
    endpoints: dict[Literal["eks", "ec2", "autoscaling", "sts"], str] = Field(default_factory=dict)


class TwinConfig(_Model):
    """The cluster twin's GKE-shaped API (twin/cloudapi.py); the pool's `endpoint` is its
    base URL."""

    token: SecretRef = SecretRef(env="SICKBAY_TWIN_CLOUD_TOKEN")
    # Used when the runbook's pool has no `endpoint` (`scaleUp.provider: twin`).
    endpoint: str | None = None
    project: str = "twin"
    location: str = "local"
    cluster: str = "twin"


class HttpCall(_Model):
    """One templated HTTP call. `url`, header values and every string in `body` may use
    `{name}`, `{size}`, `{cluster}`, `{project}`, `{location}`, `{namespace}`, `{endpoint}`,
    `{resource_group}`, `{subscription}`, `{idempotency_key}`, `{operation}`. A string that is
    exactly one placeholder (`"{size}"`) keeps its type, so `{"count": "{size}"}` sends a number.
    """

    method: Literal["GET", "POST", "PUT", "PATCH", "DELETE"] = "GET"
    url: str
    headers: dict[str, str | SecretRef] = Field(default_factory=dict)
    body: Any = None
    ok_status: list[int] = Field(default_factory=lambda: [200, 201, 202, 204])


class HttpOperation(_Model):
    """How to follow an operation: poll `call`; `done_path` (dotted JSON path) equal to one of
    `done_values` means finished, one of `failed_values` means failed (`message_path` says why)."""

    call: HttpCall
    done_path: str = "status"
    done_values: list[Any] = Field(default_factory=lambda: ["DONE", "Succeeded", "succeeded"])
    failed_values: list[Any] = Field(default_factory=lambda: ["FAILED", "Failed", "failed"])
    message_path: str = "message"


class HttpProfile(_Model):
    """A generic REST node-pool API (in-house, OpenStack Magnum-style, ...)."""

    headers: dict[str, str | SecretRef] = Field(default_factory=dict)  # sent on every call
    # Base URL used when the runbook's pool gives no `endpoint`; and the origins a runbook's
    # `endpoint` may point at (default: just `endpoint`), so the profile's credentials are
    # never sent to a host the worker's operator did not list.
    endpoint: str | None = None
    allowed_endpoints: list[str] = Field(default_factory=list)
    describe: HttpCall
    size_path: str  # dotted JSON path of the current size in the describe response
    min_path: str | None = None
    max_path: str | None = None
    scale: HttpCall
    idempotency_header: str | None = "Idempotency-Key"  # None: do not send one
    operation_id_path: str | None = None  # where the scale response names its operation
    operation_id_header: str | None = None  # or a header (e.g. Location)
    operation: HttpOperation | None = None  # None: the scale call is synchronous
    # Without an operation: describe until the size is reached (the call only accepted it).
    poll_size_after_scale: bool = True
    # The repair ladder's node rungs (None: this profile cannot do them). Besides the pool's
    # placeholders: `{node}` (the Kubernetes node name) and `{provider_id}` (its spec.providerID).
    # The idempotency header carries the attempt's key: the API must act once per key.
    reboot: HttpCall | None = None
    replace: HttpCall | None = None


class CloudConfig(_Model):
    gke: GkeConfig = Field(default_factory=GkeConfig)
    aks: AksConfig = Field(default_factory=AksConfig)
    aws: AwsConfig = Field(default_factory=AwsConfig)
    twin: TwinConfig = Field(default_factory=TwinConfig)
    http: dict[str, HttpProfile] = Field(default_factory=dict)  # profile name -> profile
    request_timeout: float = 30.0  # seconds per HTTP call: ARM and GKE answer well within this

    @classmethod
    def load(
        cls, path: Path | None = None, defaults: Mapping[str, Mapping[str, Any]] | None = None
    ) -> CloudConfig:
        """From the YAML file `path` over `defaults` (section -> key -> value, None values
        ignored; what the file sets wins); neither: the built-in defaults."""
        return load_yaml_model(cls, path, "cloud config", defaults)
