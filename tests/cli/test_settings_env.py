"""One `Settings` reads every documented `SICKBAY_*` variable.

The variables are collected from docs/, deploy/, docker-compose.yml and README.md, so a
variable documented there but unknown to `Settings` fails here (and so does one renamed in the
code but not in the docs).

Cases:
- every documented variable is a `Settings` variable, or named in NOT_SETTINGS with the part of
  Sickbay that reads it instead (and every NOT_SETTINGS entry is still documented, and is not
  also a `Settings` variable);
- each `Settings` variable, set in the environment to a value other than its default, arrives in
  the field it names, sub-models (webhook, server, sweep, watch) included;
- the list variables take a comma-separated or a JSON list, through the one splitter;
- an invalid value names its variable.
"""

from __future__ import annotations

import os
import re
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from pydantic import BaseModel, SecretStr, ValidationError

from worker.settings import Settings

ROOT = Path(__file__).resolve().parents[2]
DOCUMENTED_IN = [
    ROOT / "README.md",
    ROOT / "docker-compose.yml",
    *sorted((ROOT / "docs").rglob("*.md")),
]
DOCUMENTED_IN += sorted(p for p in (ROOT / "deploy").rglob("*") if p.is_file())

# Documented variables that are not process settings, and who reads them.
NOT_SETTINGS = {
    "SICKBAY_AKS_CLUSTER": "activities/cloud (CloudConfig, env-only AKS pool)",
    "SICKBAY_AKS_RESOURCE_GROUP": "activities/cloud (CloudConfig)",
    "SICKBAY_AKS_SUBSCRIPTION": "activities/cloud (CloudConfig)",
    "SICKBAY_AZURE_TOKEN": "activities/cloud (a secret reference of the cloud file)",
    "SICKBAY_CLOUD_FILE": "activities/cloud (CloudConfig.load)",
    "SICKBAY_AWS_REGION": "activities/cloud (CloudConfig, AwsConfig)",
    "SICKBAY_AWS_PROFILE": "activities/cloud (CloudConfig, AwsConfig)",
    "SICKBAY_EKS_CLUSTER": "activities/cloud (CloudConfig, env-only EKS pool)",
    "SICKBAY_GKE_CLUSTER": "activities/cloud (CloudConfig)",
    "SICKBAY_GKE_LOCATION": "activities/cloud (CloudConfig)",
    "SICKBAY_GKE_PROJECT": "activities/cloud (CloudConfig)",
    "SICKBAY_GKE_TOKEN": "activities/cloud (a secret reference of the cloud file)",
    "SICKBAY_GKE_TOKEN_FILE": "activities/cloud (a secret reference of the cloud file)",
    "SICKBAY_HEALTHCHECK_URL": "the Dockerfile's HEALTHCHECK",
    "SICKBAY_HOST_KUBECONFIG": "docker-compose.yml interpolation",
    "SICKBAY_IMAGE_TAG": "docker-compose.yml interpolation",
    "SICKBAY_METRICS_HOST_PORT": "docker-compose.yml interpolation",
    "SICKBAY_PUBLISH_ADDRESS": "docker-compose.yml interpolation",
    "SICKBAY_WEBHOOK_HOST_PORT": "docker-compose.yml interpolation",
    "SICKBAY_WEBHOOK_TOKEN_SECRET": "docker-compose.yml interpolation (the token file)",
    "SICKBAY_RECORD_HISTORIES": "tests (re-record the replay histories)",
    "SICKBAY_REQUIRE_DOCKER": "tests (a missing Docker engine fails instead of skipping)",
    "SICKBAY_REQUIRE_MONITORING": "tests (missing Prometheus binaries fail instead of skipping)",
    "SICKBAY_TWIN_ALERT_TOKEN": "the twin (twin/)",
    "SICKBAY_TWIN_CLOUD_TOKEN": "the twin (twin/)",
    "SICKBAY_TWIN_CLOUD_URL": "the twin (twin/)",
    "SICKBAY_TWIN_TIME_SCALE": "the twin (twin/)",
    "SICKBAY_STATE_DIR": "the CLI's local state (sickbay-dev twin / up / down)",
}
# Prefixes the docs write for a family ("SICKBAY_TEMPORAL_*", "SICKBAY_REQUIRE_<X>").
FRAGMENTS = {"SICKBAY_TEMPORAL_", "SICKBAY_REQUIRE_"}


# Variables that only go in pairs: setting one sets its partner too.
PARTNERS = {
    "SICKBAY_WEBHOOK_TLS_CERT_FILE": "SICKBAY_WEBHOOK_TLS_KEY_FILE",
    "SICKBAY_WEBHOOK_TLS_KEY_FILE": "SICKBAY_WEBHOOK_TLS_CERT_FILE",
    "SICKBAY_TEMPORAL_TLS_CERT": "SICKBAY_TEMPORAL_TLS_KEY",
    "SICKBAY_TEMPORAL_TLS_KEY": "SICKBAY_TEMPORAL_TLS_CERT",
}


def documented() -> set[str]:
    names: set[str] = set()
    for path in DOCUMENTED_IN:
        names |= set(re.findall(r"SICKBAY_[A-Z0-9_]+", path.read_text(errors="replace")))
    return names - FRAGMENTS


def _sample(field: str, value: Any) -> str:
    """An environment value other than the field's default `value`."""
    if field == "repair_allowlist":  # JSON, images pinned by digest
        return '{"reset": {"images": ["registry.invalid/r@sha256:' + "f" * 64 + '"]}}'
    if isinstance(value, bool):
        return "false" if value else "true"
    if isinstance(value, int):
        return str(value + 1)
    if isinstance(value, float):
        return str(value + 1.5)
    if isinstance(value, timedelta):
        return "17m"
    if isinstance(value, list):
        return "alpha,beta"
    if isinstance(value, dict):
        return '{"MyGpuDead": "unhealthy"}'
    if field == "cluster":
        return "east-1"
    if field == "repair_namespace":
        return "gpu-repairs"
    if field.endswith(("_dir", "_file", "_cert", "_key", "_ca")) or field == "kubeconfig":
        return "/tmp/sickbay-sample"
    return "sample-value-0123456789abcdef0123456789abcdef"


def _plain(value: Any) -> Any:
    if isinstance(value, SecretStr):
        return value.get_secret_value()
    if isinstance(value, BaseModel):
        return value.model_dump()
    if isinstance(value, Path):
        return str(value)
    return value


def test_every_documented_variable_is_a_setting() -> None:
    names = Settings.env_names()
    docs = documented()
    assert docs, "no SICKBAY_ variable found in the docs"
    unknown = sorted(n for n in docs if n not in names and n not in NOT_SETTINGS)
    assert not unknown, f"documented but unknown to Settings (and not in NOT_SETTINGS): {unknown}"
    stale = sorted(set(NOT_SETTINGS) - docs)
    assert not stale, f"NOT_SETTINGS names variables no doc mentions any more: {stale}"
    both = sorted(set(NOT_SETTINGS) & set(names))
    assert not both, f"NOT_SETTINGS names Settings variables: {both}"


@pytest.mark.parametrize("env_name", sorted(Settings.env_names()))
def test_each_variable_reaches_its_field(env_name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    path = Settings.env_names()[env_name]
    for name in list(os.environ):
        if name.upper().startswith("SICKBAY_"):
            monkeypatch.delenv(name)
    default = Settings()
    owner: Any = default
    for part in path[:-1]:
        owner = getattr(owner, part)
    field = path[-1]
    before = getattr(owner, field)
    if before is None:
        hint = type(owner).model_fields[field].annotation
        before = SecretStr("") if "SecretStr" in str(hint) else ""
    sample = _sample(field, _plain(before))
    monkeypatch.setenv(env_name, sample)
    if env_name in PARTNERS:
        monkeypatch.setenv(PARTNERS[env_name], "/tmp/sickbay-partner")
    loaded: Any = Settings()
    for part in path:
        loaded = getattr(loaded, part)
    assert _plain(loaded) != _plain(getattr(owner, field)), f"{env_name} did not reach {path}"


@pytest.mark.parametrize("text", ["a, b,,c", '["a", "b", "c"]'])
def test_lists_take_commas_or_json(text: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SICKBAY_ALERT_NODE_LABELS", text)
    monkeypatch.setenv("SICKBAY_SWEEP_NOTIFY_CHANNELS", text)
    settings = Settings()
    expected = ["a", "b", "c"]
    assert settings.webhook.alert_node_labels == expected
    assert settings.sweep.sweep_notify_channels == expected


@pytest.mark.parametrize(
    ("env_name", "value"),
    [
        ("SICKBAY_WEBHOOK_PORT", "70000"),
        ("SICKBAY_SWEEP_INTERVAL", "1s"),
        ("SICKBAY_WATCH_RENEW_SECONDS", "99"),
        ("SICKBAY_WEBHOOK_HEADER_TIMEOUT", "0"),
        ("SICKBAY_ALERT_CLASSES", "{not json"),
    ],
)
def test_an_invalid_value_names_its_variable(
    env_name: str, value: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(env_name, value)
    with pytest.raises((ValidationError, ValueError)) as err:
        Settings()
    field = env_name.removeprefix("SICKBAY_").lower()
    assert field in str(err.value) or env_name in str(err.value)


def test_sub_models_are_models_not_settings() -> None:
    """One BaseSettings: the sub-models never read the environment on their own."""
    from pydantic_settings import BaseSettings

    for name in ("webhook", "server", "sweep", "watch"):
        sub = type(getattr(Settings(), name))
        assert issubclass(sub, BaseModel) and not issubclass(sub, BaseSettings), name
