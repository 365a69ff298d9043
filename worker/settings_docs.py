"""docs/settings.md, generated from `Settings` (worker/settings.py): every variable, its default
and its field's docstring. `python -m worker.settings_docs` rewrites the file;
tests/cli/test_settings_docs.py fails when the committed one differs.

Besides the settings, the page lists the variables Sickbay reads that are not settings: the
secret references the cloud config defaults to (read at each use, so a rotated token is picked
up), the standard variables each SDK reads itself, and the development tools' own.
"""

from __future__ import annotations

import re
import sys
from datetime import timedelta
from pathlib import Path
from typing import Any

from pydantic import BaseModel, SecretStr
from pydantic.fields import FieldInfo
from pydantic_core import PydanticUndefined

from contract.base import format_duration
from worker.settings import (
    CloudSettings,
    ServerSettings,
    Settings,
    SweepSettings,
    WatchSettings,
    WebhookSettings,
    env_name,
)

DOC = Path(__file__).resolve().parent.parent / "docs" / "settings.md"

# (title, the model whose own fields the section lists), in the page's order.
SECTIONS: list[tuple[str, type[BaseModel]]] = [
    ("Every process: Temporal, Kubernetes, runbooks, repair, the worker, actions", Settings),
    ("The webhook (`sickbay webhook`)", WebhookSettings),
    ("The webhook's HTTP server", ServerSettings),
    ("The health sweep", SweepSettings),
    ("The health watcher", WatchSettings),
    ("Node-pool providers", CloudSettings),
]

# Defaults that depend on the machine, shown as what they mean.
DEFAULT_TEXT = {
    "runbooks_dir": "the packaged `runbooks/`",
    "watch_namespace": "the service account's namespace, else `sickbay`",
    "state_dir": "`~/.sickbay`",
    "repair_allowlist": "none (no repair pod may run)",
}

# Read by an SDK (or the platform), never by Sickbay's settings: variable -> who reads it.
SDK_VARIABLES = {
    "GOOGLE_APPLICATION_CREDENTIALS": "google-auth (GKE, when no `SICKBAY_GKE_TOKEN`)",
    "AZURE_CLIENT_ID, AZURE_TENANT_ID, AZURE_FEDERATED_TOKEN_FILE": "azure-identity (AKS "
    "workload identity, injected by its webhook)",
    "AZURE_CLIENT_SECRET, AZURE_CLIENT_CERTIFICATE_PATH": "azure-identity (a service principal)",
    "AZURE_AUTHORITY_HOST": "azure-identity (sovereign clouds; else `aks.authority`)",
    "AWS_REGION, AWS_DEFAULT_REGION, AWS_PROFILE, AWS_ACCESS_KEY_ID, ...": "boto3's standard "
    "chain (EKS Pod Identity, IRSA, environment, shared files, instance profile)",
    "POD_NAME": "the worker's Kubernetes Events: their reporting instance (unset: the host "
    "name, a pod's name)",
}

# SICKBAY_* variables that are not the product's settings, and who reads them.
NOT_SETTINGS = {
    "SICKBAY_HEALTHCHECK_URL": "the image's HEALTHCHECK (Dockerfile; each role sets its URL)",
    "SICKBAY_HOST_KUBECONFIG": "docker-compose.yml interpolation",
    "SICKBAY_IMAGE_TAG": "docker-compose.yml interpolation",
    "SICKBAY_METRICS_HOST_PORT": "docker-compose.yml interpolation",
    "SICKBAY_PUBLISH_ADDRESS": "docker-compose.yml interpolation",
    "SICKBAY_WEBHOOK_HOST_PORT": "docker-compose.yml interpolation",
    "SICKBAY_WEBHOOK_TOKEN_SECRET": "docker-compose.yml interpolation (the token file)",
    "SICKBAY_TWIN_ALERT_TOKEN": "the cluster twin (twin/): its alerts' bearer token",
    "SICKBAY_TWIN_CLOUD_TOKEN": "the cluster twin (twin/): the token its cloud API requires "
    "(and the worker's secret reference `twin.token`)",
    "SICKBAY_TWIN_TIME_SCALE": "docker-compose.yml: the twin's `--time-scale`",
    "SICKBAY_TWIN_TOKEN": "the cluster twin (twin/): the token its API requires",
    "SICKBAY_TWIN_URL": "`sickbay-dev twin fail ...`: the twin's URL (else its state file)",
    "SICKBAY_RECORD_HISTORIES": "tests (re-record the replay histories)",
    "SICKBAY_REQUIRE_DOCKER": "tests (a missing Docker engine fails instead of skipping)",
    "SICKBAY_REQUIRE_MONITORING": "tests (missing Prometheus binaries fail instead of skipping)",
}


def _cell(text: str) -> str:
    return re.sub(r"\s+", " ", text).strip().replace("|", "\\|")


def _default(name: str, info: FieldInfo) -> str:
    if name in DEFAULT_TEXT:
        return DEFAULT_TEXT[name]
    if info.default is not PydanticUndefined:
        value: Any = info.default
    elif info.default_factory is not None:
        value = info.default_factory()  # type: ignore[call-arg]
    else:
        return "(required)"
    if value is None or value == "" and name != "cluster":
        return "—"
    if isinstance(value, bool):
        return f"`{str(value).lower()}`"
    if isinstance(value, timedelta):
        return f"`{format_duration(value)}`"
    if isinstance(value, list):
        return f"`{','.join(value)}`" if value else "—"
    if isinstance(value, dict):
        return "—" if not value else f"`{value}`"
    if isinstance(value, SecretStr):
        return "—"
    if name == "cluster":
        return "— (the recorded name)"
    return f"`{value}`"


def _secret_refs(model: BaseModel, path: str = "") -> list[tuple[str, str]]:
    """(variable, config path) of every secret reference in `model`'s defaults."""
    from activities.outbound import SecretRef

    out: list[tuple[str, str]] = []
    for name in type(model).model_fields:
        value = getattr(model, name)
        where = f"{path}.{name}" if path else name
        if isinstance(value, SecretRef) and value.env:
            out.append((value.env, where))
        elif isinstance(value, BaseModel):
            out += _secret_refs(value, where)
    return out


def secret_reference_variables() -> set[str]:
    """The variables (and their `_FILE`) of the cloud config's default secret references."""
    from activities.cloud.config import CloudConfig

    names = {var for var, _ in _secret_refs(CloudConfig())}
    return names | {f"{var}_FILE" for var in names}


def render() -> str:
    from activities.cloud.config import CloudConfig

    lines = [
        "# Settings",
        "",
        "<!-- Generated from worker/settings.py by `python -m worker.settings_docs`; "
        "do not edit. -->",
        "",
        "Every Sickbay process (worker, webhook, CLI) reads its settings from `SICKBAY_*`",
        "variables (flags override them): one `Settings` (worker/settings.py), one variable per",
        'field. List variables take `a,b` or JSON (`["a","b"]`); mappings and models take',
        "JSON; durations `30s`, `5m`, `1h30m`. A `..._FILE` variable names a file holding the",
        "secret of the variable without `_FILE`.",
        "",
    ]
    own = set(Settings.model_fields)
    for _, model in SECTIONS[1:]:
        own -= set(model.model_fields)
    for title, model in SECTIONS:
        names = own if model is Settings else set(model.model_fields)
        lines += [f"## {title}", "", "| Variable | Default | What it does |", "| --- | --- | --- |"]
        for name, info in Settings.model_fields.items():
            if name not in names:
                continue
            var = env_name(name, info.validation_alias)
            text = _cell(info.description or "")
            lines.append(f"| `{var}` | {_cell(_default(name, info))} | {text} |")
        lines.append("")
    lines += [
        "## Secret references of the cloud config",
        "",
        "Not settings: the cloud config's default secret references (docs/cloud.md), read at",
        "each use so a rotated token is picked up without a restart; `<VAR>_FILE` names a file",
        "holding it instead. The cloud file may point them elsewhere.",
        "",
        "| Variable | Used as |",
        "| --- | --- |",
    ]
    for var, where in _secret_refs(CloudConfig()):
        lines.append(f"| `{var}` / `{var}_FILE` | `{where}` |")
    lines += [
        "",
        "## Read by the SDKs",
        "",
        "Standard variables Sickbay leaves to the libraries that define them (`KUBECONFIG`,",
        "standard too, is a setting above).",
        "",
        "| Variable | Read by |",
        "| --- | --- |",
    ]
    lines += [f"| `{var}` | {_cell(who)} |" for var, who in SDK_VARIABLES.items()]
    lines += [
        "",
        "## Not settings of the product",
        "",
        "Variables of the image, compose, the development tools and the tests.",
        "",
        "| Variable | Read by |",
        "| --- | --- |",
    ]
    lines += [f"| `{var}` | {_cell(who)} |" for var, who in sorted(NOT_SETTINGS.items())]
    return "\n".join(lines) + "\n"


def main() -> int:
    DOC.write_text(render())
    print(f"wrote {DOC}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
