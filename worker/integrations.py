"""Is every escalation channel and node-pool provider a runbook names configured on this worker?

Read by the worker at start-up (it refuses to start, or with SICKBAY_ALLOW_UNCONFIGURED_INTEGRATIONS
starts degraded and says so) and by `sickbay doctor`, so the first escalation is never where a
missing channel is found out.

- channels: `escalation.channels` and `escalation.ownerChannels` of every runbook against the file SICKBAY_CHANNELS_FILE names
  (activities/notify/config.py);
- providers: the runbook's node-pool provider (`scaleUp.pool.provider`, else `scaleUp.provider`)
  when it scales up (`scaleUp.enabled`) or its repair ladder has a reboot or replace rung,
  against the worker's cloud configuration (SICKBAY_CLOUD_FILE and the providers' environment
  defaults, activities/cloud/config.py), exactly as the activities build their providers.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import httpx

from activities.cloud.config import CloudConfig
from activities.cloud.machines import machine_providers
from activities.notify.config import ChannelsConfig
from contract.runbook import Runbook

CHANNELS_ENV = "SICKBAY_CHANNELS_FILE"


@dataclass(frozen=True)
class Unconfigured:
    runbook: str
    kind: str  # "channel" | "provider"
    name: str
    use: str  # what the runbook uses it for
    setting: str  # the setting to fix

    def line(self) -> str:
        return (
            f"runbook {self.runbook} names {self.kind} {self.name!r} ({self.use}), which is "
            f"not configured: {self.setting}"
        )


def _provider(runbook: Runbook) -> str | None:
    scale = runbook.spec.scale_up
    return scale.pool.provider if scale.pool is not None else scale.provider


def configured_machine_providers(config: CloudConfig, kube_api: Any) -> set[str]:
    """The reboot / replace providers the worker builds from `config` (no call is made)."""
    client = httpx.AsyncClient()  # only held by the providers built here, never sent on
    return set(machine_providers(config, client, kube_api))


def _scale_configured(runbook: Runbook, config: CloudConfig, machines: set[str]) -> bool:
    scale = runbook.spec.scale_up
    provider = _provider(runbook)
    pool = scale.pool
    if provider == "http":
        if pool is not None and pool.profile:
            return pool.profile in config.http
        return bool(config.http)
    if provider == "twin" and pool is not None and pool.endpoint:
        return True
    return provider in machines  # cluster-api, gke, aks, twin: built from the same config


def unconfigured(
    runbooks: Sequence[Runbook],
    channels: ChannelsConfig,
    cloud: CloudConfig,
    kube_api: Any,
    *,
    channels_file: str = "",
    cloud_file: str = "",
) -> list[Unconfigured]:
    """Every channel and provider a runbook names that this worker has not configured."""
    out: list[Unconfigured] = []
    where = f"{CHANNELS_ENV}={channels_file}" if channels_file else f"{CHANNELS_ENV} is unset"
    for runbook in runbooks:
        esc = runbook.spec.escalation
        named = [(n, "escalation.channels") for n in esc.channels]
        named += [(n, "escalation.ownerChannels") for n in esc.owner_channels]
        for name, field in named:
            if name not in channels.channels:
                out.append(
                    Unconfigured(
                        runbook.name,
                        "channel",
                        name,
                        field,
                        f"add channel {name!r} to the channels file ({where})",
                    )
                )
    machines = configured_machine_providers(cloud, kube_api)
    cloud_where = (
        f"SICKBAY_CLOUD_FILE={cloud_file}" if cloud_file else "SICKBAY_CLOUD_FILE is unset"
    )
    for runbook in runbooks:
        provider = _provider(runbook)
        if provider is None:
            continue
        fix = (
            f"configure provider {provider!r} in the cloud file ({cloud_where}) or its "
            "environment (docs/cloud.md)"
        )
        if runbook.spec.scale_up.enabled and not _scale_configured(runbook, cloud, machines):
            out.append(Unconfigured(runbook.name, "provider", provider, "scaleUp", fix))
        repair = runbook.spec.repair
        rungs = [a for a in repair.order if a in ("reboot", "replace")] if repair.enabled else []
        if rungs and provider not in machines:
            out.append(
                Unconfigured(runbook.name, "provider", provider, f"repair {'/'.join(rungs)}", fix)
            )
    return out


def load_and_check(runbooks: Sequence[Runbook], settings: Any, kube_api: Any) -> list[Unconfigured]:
    """`unconfigured` with the worker's own configuration (`settings`, worker.settings.Settings:
    SICKBAY_CHANNELS_FILE, SICKBAY_CLOUD_FILE and the providers' defaults, as the worker loads
    them)."""
    return unconfigured(
        runbooks,
        ChannelsConfig.load(settings.channels_file),
        settings.cloud.cloud_config(),
        kube_api,
        channels_file=str(settings.channels_file or ""),
        cloud_file=str(settings.cloud.cloud_file or ""),
    )
