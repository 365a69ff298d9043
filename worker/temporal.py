"""Connecting to Temporal the same way from every process, registering search attributes, and
keeping the long-lived start-up heap out of the garbage collector's full scans."""

from __future__ import annotations

import gc
import logging

from temporalio.api.enums.v1 import IndexedValueType
from temporalio.api.operatorservice.v1 import (
    AddSearchAttributesRequest,
    ListSearchAttributesRequest,
)
from temporalio.client import Client, TLSConfig
from temporalio.service import RPCError, RPCStatusCode

from contract.names import SEARCH_ATTRIBUTES
from worker.converter import DATA_CONVERTER
from worker.settings import Settings

log = logging.getLogger(__name__)


def tls_config(settings: Settings) -> TLSConfig | bool:
    """What `Client.connect(tls=...)` gets: a `TLSConfig` when a CA or a client certificate is
    set (the CA alone: server-side TLS to a self-hosted Temporal), True for TLS with the
    system's roots (SICKBAY_TEMPORAL_TLS, or an API key: Temporal Cloud API keys need TLS),
    False for plaintext. A certificate without its key never gets here: `Settings` refuses it.
    """
    cert, key, ca = settings.temporal_tls_cert, settings.temporal_tls_key, settings.temporal_tls_ca
    if (cert is None) != (key is None):  # Settings checks it; a model_copy could skip that
        raise ValueError(
            "SICKBAY_TEMPORAL_TLS_CERT and SICKBAY_TEMPORAL_TLS_KEY must be set together"
        )
    if cert is not None or ca is not None:
        return TLSConfig(
            client_cert=cert.read_bytes() if cert is not None else None,
            client_private_key=key.read_bytes() if key is not None else None,
            server_root_ca_cert=ca.read_bytes() if ca is not None else None,
        )
    return settings.temporal_tls or settings.api_key() is not None


async def connect(settings: Settings) -> Client:
    """A client with the pydantic data converter, TLS / API key as configured."""
    tls = tls_config(settings)
    api_key = settings.api_key()
    return await Client.connect(
        settings.temporal_address,
        namespace=settings.temporal_namespace,
        data_converter=DATA_CONVERTER,
        tls=tls,
        api_key=api_key,
    )


def search_attribute_commands(namespace: str) -> list[str]:
    """What an operator runs where Sickbay may not register search attributes itself."""
    cloud = [
        f"tcld namespace search-attributes add --namespace {namespace} "
        f"--search-attribute '{name}=Keyword'"
        for name in SEARCH_ATTRIBUTES
    ]
    self_hosted = [
        f"temporal operator search-attribute create --namespace {namespace} "
        f"--name {name} --type Keyword"
        for name in SEARCH_ATTRIBUTES
    ]
    return cloud + self_hosted


async def ensure_search_attributes(client: Client, namespace: str) -> list[str]:
    """Register the Keyword search attributes Sickbay uses if they are missing.

    Returns the names that were added. Where the server refuses (Temporal Cloud, missing
    permission) raises RuntimeError naming exactly what to run instead.
    """
    try:
        listed = await client.operator_service.list_search_attributes(
            ListSearchAttributesRequest(namespace=namespace)
        )
        missing = [n for n in SEARCH_ATTRIBUTES if n not in listed.custom_attributes]
        if not missing:
            return []
        await client.operator_service.add_search_attributes(
            AddSearchAttributesRequest(
                namespace=namespace,
                search_attributes={n: IndexedValueType.INDEXED_VALUE_TYPE_KEYWORD for n in missing},
            )
        )
        log.info("registered search attributes %s on namespace %s", missing, namespace)
        return missing
    except RPCError as exc:
        if exc.status in (
            RPCStatusCode.PERMISSION_DENIED,
            RPCStatusCode.UNIMPLEMENTED,
            RPCStatusCode.UNAUTHENTICATED,
        ):
            howto = "\n  ".join(search_attribute_commands(namespace))
            raise RuntimeError(
                f"cannot register search attributes on namespace {namespace!r} "
                f"({exc.status.name}: {exc.message}). Register them once, e.g.:\n  {howto}"
            ) from exc
        raise


def freeze_startup_heap() -> int:
    """Collect once, then move every object alive now (imported modules, the SDK, the
    Kubernetes client's models, runbooks, warmed caches) into the collector's permanent
    generation, so a full (generation 2) collection no longer walks them. Measured on the
    latency benchmark's worker: gen-2 collections that freed nothing paused the process for
    70-165 ms, the slowest alert -> taint times. Call once, when start-up is done; returns
    the number of objects frozen."""
    gc.collect()
    gc.freeze()
    return gc.get_freeze_count()
