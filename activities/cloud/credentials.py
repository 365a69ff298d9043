"""Bearer tokens for GKE and ARM through each cloud's own library: `google-auth` and
`azure-identity`. Sickbay keeps no token protocol code of its own: no metadata-server calls,
no Microsoft Entra token requests, no caching rules; the libraries refresh tokens ahead of
expiry, know Workload Identity Federation, managed identity, sovereign clouds and proxies.

- GKE: a ready token (`gke.token`: `$SICKBAY_GKE_TOKEN` / `_FILE`, the twin's) when set, else
  Application Default Credentials (`google.auth.default`): the GKE metadata server (Workload
  Identity), `GOOGLE_APPLICATION_CREDENTIALS` (a Workload Identity Federation config, or a
  service-account key where a user insists), gcloud's application-default login.
- AKS: a ready token (`aks.token`: `$SICKBAY_AZURE_TOKEN` / `_FILE`) when set, else
  `DefaultAzureCredential` limited to the non-interactive ways a server signs in: the
  environment (client secret or certificate), AKS workload identity (the federated token file
  the webhook mounts), managed identity (IMDS).

Both libraries are synchronous: their calls run in a worker thread, never on the event loop.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

from activities.cloud.base import CloudRejected, CloudUnavailable
from activities.cloud.config import AksConfig, GkeConfig
from activities.outbound import ConfigError, SecretRef

GOOGLE_SCOPES = ("https://www.googleapis.com/auth/cloud-platform",)
# A token is used until this many seconds before it expires (then asked again): a call made
# with it must still reach the API in time.
AZURE_TOKEN_MARGIN = 120.0


class StaticToken:
    """A ready bearer token (the twin's, or one a user mints): read at each use, so a rotated
    file is picked up."""

    def __init__(self, ref: SecretRef) -> None:
        self._ref = ref

    async def get(self) -> str:
        return self._ref.resolve()


class GoogleToken:
    """An access token for Google APIs: the configured one, else google-auth's ADC."""

    def __init__(self, config: GkeConfig) -> None:
        self._config = config
        self._credentials: Any = None
        self._lock = asyncio.Lock()

    async def get(self) -> str:
        if self._config.token.available():
            return self._config.token.resolve()
        async with self._lock:  # one refresh at a time; the others take its token
            if self._credentials is None:
                self._credentials = await asyncio.to_thread(self._default)
            if not self._credentials.valid:
                await asyncio.to_thread(self._refresh)
            return str(self._credentials.token)

    def _default(self) -> Any:
        import google.auth
        from google.auth.exceptions import DefaultCredentialsError

        try:
            credentials, _project = google.auth.default(scopes=list(GOOGLE_SCOPES))
        except DefaultCredentialsError as exc:
            raise ConfigError(
                f"no GKE credentials: {self._config.token.describe()} is not set and "
                f"google-auth found no Application Default Credentials ({exc}); on GKE bind "
                "the ServiceAccount with Workload Identity (docs/cloud.md)"
            ) from exc
        return credentials

    def _refresh(self) -> None:
        from google.auth.exceptions import RefreshError, TransportError
        from google.auth.transport.requests import Request

        try:
            self._credentials.refresh(Request())
        except TransportError as exc:
            raise CloudUnavailable(f"Google token refresh failed: {exc}") from exc
        except RefreshError as exc:
            if getattr(exc, "retryable", False):
                raise CloudUnavailable(f"Google token refresh failed: {exc}") from exc
            raise CloudRejected(f"Google token refresh refused: {exc}") from exc


class AzureToken:
    """A bearer token for ARM: the configured one, else azure-identity's credential chain."""

    def __init__(self, config: AksConfig, credential: Any = None) -> None:
        self._config = config
        self._credential = credential  # tests may pass any azure-identity credential
        self._token: str | None = None
        self._expires = 0.0
        self._lock = asyncio.Lock()

    @property
    def scope(self) -> str:
        return f"{self._config.endpoint.rstrip('/')}/.default"

    async def get(self) -> str:
        if self._config.token.available():
            return self._config.token.resolve()
        async with self._lock:
            if self._token is not None and time.time() < self._expires - AZURE_TOKEN_MARGIN:
                return self._token
            token, self._expires = await asyncio.to_thread(self._fetch)
            self._token = token
            return token

    def credential(self) -> Any:
        if self._credential is None:
            from azure.identity import DefaultAzureCredential

            cfg = self._config
            self._credential = DefaultAzureCredential(
                authority=cfg.authority,
                managed_identity_client_id=cfg.managed_identity_client_id,
                # A server signs in without a person: no developer tools, no browser.
                exclude_cli_credential=True,
                exclude_developer_cli_credential=True,
                exclude_powershell_credential=True,
                exclude_visual_studio_code_credential=True,
                exclude_shared_token_cache_credential=True,
                exclude_interactive_browser_credential=True,
                exclude_broker_credential=True,
            )
        return self._credential

    def _fetch(self) -> tuple[str, float]:
        from azure.core.exceptions import ClientAuthenticationError, ServiceRequestError
        from azure.identity import CredentialUnavailableError

        try:
            token = self.credential().get_token(self.scope)
        except CredentialUnavailableError as exc:
            raise ConfigError(
                f"no Azure credentials: {self._config.token.describe()} is not set and "
                f"azure-identity found none ({str(exc)[:400]}); on AKS bind the ServiceAccount "
                "with workload identity (AZURE_CLIENT_ID, AZURE_TENANT_ID, "
                "AZURE_FEDERATED_TOKEN_FILE), or give the nodes a managed identity"
            ) from exc
        except ServiceRequestError as exc:
            raise CloudUnavailable(f"Microsoft Entra sign-in failed: {exc}") from exc
        except ClientAuthenticationError as exc:
            raise CloudRejected(f"Microsoft Entra sign-in refused: {str(exc)[:400]}") from exc
        return str(token.token), float(token.expires_on)
