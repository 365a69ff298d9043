"""docker-compose.yml and its override files, read as data (no Docker needed).

Cases:
- the file parses; the expected services exist; the twin is only in profile `twin`;
- images are pinned (no `latest`, no untagged image), the deprecated temporalio/auto-setup
  image is not used, server and admin-tools share one version;
- every file it references exists: build context and Dockerfile, bind-mounted host files
  (with `${VAR:-default}` defaults filled in), env files, secret files;
- the Temporal start-up order: schema job after PostgreSQL is healthy, server after the
  schema job completed, worker/webhook after the namespace job completed;
- health checks on every long-running service;
- every SICKBAY_* name it sets is read by the code; the webhook token comes from a file
  (secret), never from a literal in the file;
- the worker/webhook commands are accepted by the `sickbay` CLI, the twin's by the dev tools'
  `sickbay-dev` (the twin's image has it; the runtime image has `sickbay` only);
- the Temporal Cloud overrides set address, namespace and credentials files, all required;
- the schema and namespace scripts are executable POSIX sh with `set -eu` that `sh -n`
  parses, each mounted by a service;
- safe by default: every published port binds to 127.0.0.1 unless SICKBAY_PUBLISH_ADDRESS is
  set; no password or token has a default (the PostgreSQL password and the webhook token
  secret are required variables), no example token file ships; the worker's metrics listen on
  0.0.0.0 only inside its container (published on loopback); the UI auth override turns on
  OIDC with its client secret required from the operator's environment; the webhook TLS
  override sets the cert/key settings the code reads to mounted secrets of required files and
  probes HTTPS.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.deploy.helpers import (
    COMPOSE_FILE,
    DEPLOY,
    ROOT,
    assert_cli_accepts,
    assert_known_env,
    compose_script,
    interpolate_defaults,
    repo_path,
    required_variables,
    service_argv,
    service_program,
)

SICKBAY_SERVICES = ("worker", "webhook", "twin")
LONG_RUNNING = ("postgresql", "temporal", "temporal-ui", "worker", "webhook", "twin")
OVERRIDES = sorted((DEPLOY / "compose").glob("temporal-cloud*.yml"))


def _env(service: dict[str, Any]) -> dict[str, str]:
    env = service.get("environment") or {}
    if isinstance(env, list):
        return dict(item.split("=", 1) if "=" in item else (item, "") for item in env)
    return {str(k): "" if v is None else str(v) for k, v in env.items()}


def _env_file_paths(service: dict[str, Any]) -> list[tuple[str, bool]]:
    entries = service.get("env_file") or []
    if isinstance(entries, str):
        entries = [entries]
    out = []
    for entry in entries:
        if isinstance(entry, dict):
            out.append((entry["path"], bool(entry.get("required", True))))
        else:
            out.append((entry, True))
    return out


def _bind_sources(service: dict[str, Any]) -> list[str]:
    sources = []
    for volume in service.get("volumes") or []:
        if isinstance(volume, dict):
            if volume.get("type") == "bind":
                sources.append(volume["source"])
            continue
        source = interpolate_defaults(volume).split(":", 1)[0]
        if source.startswith((".", "/", "~")):
            sources.append(source)
    return sources


def test_expected_services(compose: dict[str, Any]) -> None:
    services = set(compose["services"])
    expected = {
        "postgresql",
        "temporal-schema",
        "temporal",
        "temporal-namespace",
        "temporal-ui",
        "worker",
        "webhook",
        "twin",
    }
    assert expected <= services, f"missing services: {sorted(expected - services)}"


def test_twin_only_in_its_profile(compose: dict[str, Any]) -> None:
    for name, service in compose["services"].items():
        profiles = service.get("profiles") or []
        if name == "twin":
            assert profiles == ["twin"]
        else:
            assert not profiles, f"{name} must start without a profile, has {profiles}"


def test_images_pinned_and_no_auto_setup(compose: dict[str, Any]) -> None:
    tags: dict[str, str] = {}
    for name, service in compose["services"].items():
        image = interpolate_defaults(str(service.get("image", "")))
        assert image, f"{name} has no image"
        assert "auto-setup" not in image, f"{name}: temporalio/auto-setup is deprecated"
        repo, _, tag = image.rpartition(":")
        assert repo and tag and "/" not in tag, f"{name}: image {image!r} is not pinned to a tag"
        assert tag != "latest", f"{name}: image {image!r} uses latest"
        tags[repo] = tag
    assert tags["temporalio/server"] == tags["temporalio/admin-tools"], (
        "the schema must come from the admin-tools of the same version as the server"
    )


def test_sickbay_services_build_from_the_repo(compose: dict[str, Any]) -> None:
    for name in SICKBAY_SERVICES:
        build = compose["services"][name]["build"]
        context = repo_path(build["context"])
        assert context == ROOT, f"{name}: build context {context} is not the repository"
        assert (context / build.get("dockerfile", "Dockerfile")).is_file()


def test_every_referenced_file_exists(compose: dict[str, Any]) -> None:
    missing = []
    for name, service in compose["services"].items():
        for source in _bind_sources(service):
            path = interpolate_defaults(source)
            assert not required_variables(path), f"{name}: bind source {source} has no default"
            if not repo_path(path).exists():
                missing.append(f"{name}: volume {source} -> {path}")
        for path, required in _env_file_paths(service):
            if required and not repo_path(interpolate_defaults(path)).is_file():
                missing.append(f"{name}: env_file {path}")
    for name, secret in (compose.get("secrets") or {}).items():
        path = interpolate_defaults(secret["file"])
        if required_variables(path):  # the operator's own file (no default: checked elsewhere)
            continue
        if not repo_path(path).is_file():
            missing.append(f"secret {name}: {secret['file']} -> {path}")
    assert not missing, "files referenced by docker-compose.yml are missing:\n" + "\n".join(missing)


def test_secrets_used_are_declared(compose: dict[str, Any]) -> None:
    declared = set(compose.get("secrets") or {})
    for name, service in compose["services"].items():
        for secret in service.get("secrets") or []:
            secret_name = secret if isinstance(secret, str) else secret["source"]
            assert secret_name in declared, f"{name} uses undeclared secret {secret_name}"


def test_temporal_startup_order(compose: dict[str, Any]) -> None:
    services = compose["services"]

    def condition(service: str, dependency: str) -> str:
        return services[service]["depends_on"][dependency]["condition"]

    assert condition("temporal-schema", "postgresql") == "service_healthy"
    assert condition("temporal", "temporal-schema") == "service_completed_successfully"
    assert condition("temporal-namespace", "temporal") == "service_healthy"
    for name in ("worker", "webhook"):
        assert condition(name, "temporal-namespace") == "service_completed_successfully"
    schema = services["temporal-schema"]
    assert schema["image"].startswith("temporalio/admin-tools:")
    assert services["temporal"]["environment"]["DB"] == "postgres12"


def test_long_running_services_have_health_checks(compose: dict[str, Any]) -> None:
    for name in LONG_RUNNING:
        check = compose["services"][name].get("healthcheck")
        assert check and check.get("test"), f"{name} has no health check"
        assert not check.get("disable"), f"{name} disables its health check"


def test_health_checks_probe_what_the_service_serves(compose: dict[str, Any]) -> None:
    services = compose["services"]
    worker_check = " ".join(services["worker"]["healthcheck"]["test"])
    assert ":9465/healthz" in worker_check
    assert _env(services["worker"])["SICKBAY_METRICS_PORT"] == "9464"
    webhook_check = " ".join(services["webhook"]["healthcheck"]["test"])
    port = service_argv(services["webhook"])
    assert f":{port[port.index('--port') + 1]}/healthz" in webhook_check


def test_sickbay_env_names_are_read_by_the_code(compose: dict[str, Any]) -> None:
    for name in SICKBAY_SERVICES:
        service = compose["services"][name]
        assert_known_env(set(_env(service)), f"docker-compose.yml service {name}")
        for path, _ in _env_file_paths(service):
            file = repo_path(interpolate_defaults(path))
            keys = {
                line.split("=", 1)[0].strip()
                for line in file.read_text().splitlines()
                if line.strip() and not line.lstrip().startswith("#")
            }
            assert_known_env(keys, str(file.relative_to(ROOT)))


def test_twin_sends_alerts_to_the_webhook_with_the_secret_token(compose: dict[str, Any]) -> None:
    twin = compose["services"]["twin"]
    argv = service_argv(twin)
    webhook_port = service_argv(compose["services"]["webhook"])
    port = webhook_port[webhook_port.index("--port") + 1]
    assert argv[argv.index("--alert-webhook") + 1] == f"http://webhook:{port}/v1/alertmanager"
    script = compose_script(twin) or ""
    assert 'SICKBAY_TWIN_ALERT_TOKEN="$(cat /run/secrets/webhook_token)"' in script
    assert "webhook_token" in twin["secrets"]
    assert_known_env({"SICKBAY_TWIN_ALERT_TOKEN"}, "the twin's start script")


def test_no_secret_values_inline(compose: dict[str, Any]) -> None:
    for name in SICKBAY_SERVICES:
        env = _env(compose["services"][name])
        for key in env:
            assert not key.endswith(("_TOKEN", "_API_KEY", "_PASSWORD")), (
                f"{name}: {key} would put a secret in the environment; use a *_FILE secret"
            )
    webhook = compose["services"]["webhook"]
    assert _env(webhook)["SICKBAY_WEBHOOK_TOKEN_FILE"].startswith("/run/secrets/")
    assert "webhook_token" in webhook["secrets"]


def test_worker_gets_a_kubeconfig(compose: dict[str, Any]) -> None:
    worker = compose["services"]["worker"]
    target = _env(worker)["KUBECONFIG"]
    volumes = [interpolate_defaults(v).split(":") for v in worker["volumes"]]
    sources = [v[0] for v in volumes if v[1] == target]
    assert sources, f"nothing is mounted at KUBECONFIG={target}"
    default = repo_path(sources[0])
    kubeconfig = yaml.safe_load(default.read_text())
    server = kubeconfig["clusters"][0]["cluster"]["server"]
    twin_port = service_argv(compose["services"]["twin"])
    port = twin_port[twin_port.index("--port") + 1]
    # The twin listens on 127.0.0.1 inside the worker's network namespace.
    assert compose["services"]["twin"]["network_mode"] == "service:worker"
    assert server == f"http://127.0.0.1:{port}", "the default kubeconfig must point at the twin"


@pytest.mark.parametrize("name", SICKBAY_SERVICES)
def test_commands_are_accepted_by_the_cli(compose: dict[str, Any], name: str) -> None:
    service = compose["services"][name]
    program = service_program(service)
    assert program == ("sickbay-dev" if name == "twin" else "sickbay"), program
    assert_cli_accepts(service_argv(service), f"docker-compose.yml service {name}", program)


@pytest.mark.parametrize("path", OVERRIDES, ids=lambda p: p.name)
def test_temporal_cloud_overrides(path: Path) -> None:
    override = yaml.safe_load(path.read_text())
    text = path.read_text()
    for name in ("worker", "webhook"):
        env = _env(override["services"][name])
        assert set(env) >= {"SICKBAY_TEMPORAL_ADDRESS", "SICKBAY_TEMPORAL_NAMESPACE"}
        assert_known_env(set(env), f"{path.name} service {name}")
        for key in ("SICKBAY_TEMPORAL_ADDRESS", "SICKBAY_TEMPORAL_NAMESPACE"):
            assert required_variables(env[key]), f"{path.name}: {key} must be required"
        credential_files = {k: v for k, v in env.items() if k != "SICKBAY_TEMPORAL_ADDRESS"}
        assert any(v.startswith("/run/secrets/") for v in credential_files.values())
        for secret in override["services"][name]["secrets"]:
            assert secret in override["secrets"]
    for secret in override["secrets"].values():
        assert required_variables(secret["file"]), f"{path.name}: secret files must be required"
    assert "--no-deps" in text, f"{path.name} must say to start without the local Temporal"


def test_override_names_exist() -> None:
    assert {p.name for p in OVERRIDES} == {"temporal-cloud.yml", "temporal-cloud-mtls.yml"}


@pytest.mark.parametrize("script", ["setup-postgres.sh", "create-namespace.sh"])
def test_setup_scripts(script: str, compose: dict[str, Any]) -> None:
    path = DEPLOY / "compose" / script
    text = path.read_text()
    assert text.startswith("#!/bin/sh\n")
    assert "set -eu" in text
    assert os.access(path, os.X_OK), f"{path} is not executable"
    syntax = subprocess.run(["sh", "-n", str(path)], capture_output=True, text=True, timeout=10)
    assert syntax.returncode == 0, f"{script}: {syntax.stderr}"
    mounted = [
        v
        for service in compose["services"].values()
        for v in service.get("volumes") or []
        if isinstance(v, str) and v.startswith(f"./deploy/compose/{script}:")
    ]
    assert mounted, f"{script} is not mounted by any service"


def test_compose_file_is_at_the_root() -> None:
    assert COMPOSE_FILE.parent == ROOT


def _published(service: dict[str, Any]) -> list[str]:
    return [str(p) for p in service.get("ports") or []]


def test_published_ports_bind_to_loopback_by_default(compose: dict[str, Any]) -> None:
    published = {n: _published(s) for n, s in compose["services"].items() if s.get("ports")}
    assert {"temporal", "temporal-ui", "worker", "webhook"} <= set(published)
    for name, ports in published.items():
        for port in ports:
            assert port.startswith("${SICKBAY_PUBLISH_ADDRESS:-127.0.0.1}:"), (
                f"{name}: port {port!r} must bind to 127.0.0.1 unless the operator says otherwise"
            )
            host, _, _ = interpolate_defaults(port).partition(":")
            assert host == "127.0.0.1", f"{name}: {port!r} publishes on {host!r} by default"


def test_no_default_passwords_or_tokens(compose: dict[str, Any]) -> None:
    text = COMPOSE_FILE.read_text()
    for service_name, service in compose["services"].items():
        for key, value in (service.get("environment") or {}).items():
            if "PASSWORD" in key or "PWD" in key or key.endswith(("_TOKEN", "_SECRET")):
                value = str(value)
                assert required_variables(value) and interpolate_defaults(value) == value, (
                    f"{service_name}: {key}={value!r} must be a required variable, no default"
                )
    secret = compose["secrets"]["webhook_token"]["file"]
    assert required_variables(secret) == ["SICKBAY_WEBHOOK_TOKEN_SECRET"], secret
    assert "openssl rand" in secret, "the error must say how to make a token"
    assert "TEMPORAL_POSTGRES_PASSWORD:?" in text
    assert not (DEPLOY / "compose" / "webhook-token.example").exists(), (
        "an example token in the checkout ends up in production; the webhook refuses it anyway"
    )


def test_worker_metrics_listen_inside_the_container_only(compose: dict[str, Any]) -> None:
    from worker.settings import Settings

    assert Settings.model_fields["metrics_host"].default == "127.0.0.1"
    worker = compose["services"]["worker"]
    assert _env(worker)["SICKBAY_METRICS_HOST"] == "0.0.0.0"
    assert all(p.startswith("${SICKBAY_PUBLISH_ADDRESS:-127.0.0.1}:") for p in _published(worker))


def test_ui_auth_override() -> None:
    path = DEPLOY / "compose" / "temporal-ui-oidc.yml"
    override = yaml.safe_load(path.read_text())
    env = _env(override["services"]["temporal-ui"])
    assert env["TEMPORAL_AUTH_ENABLED"] == "true"
    assert env["TEMPORAL_AUTH_TYPE"] == "oidc"
    for key in (
        "TEMPORAL_AUTH_PROVIDER_URL",
        "TEMPORAL_AUTH_CLIENT_ID",
        "TEMPORAL_AUTH_CLIENT_SECRET",
        "TEMPORAL_AUTH_CALLBACK_URL",
    ):
        assert required_variables(env[key]) == [key], f"{path.name}: {key} must be required"
    docs = (ROOT / "docs" / "deploy.md").read_text()
    assert "temporal-ui-oidc.yml" in docs, "docs/deploy.md must show how to put the UI behind auth"


def test_webhook_tls_override() -> None:
    path = DEPLOY / "compose" / "webhook-tls.yml"
    override = yaml.safe_load(path.read_text())
    webhook = override["services"]["webhook"]
    env = _env(webhook)
    assert_known_env(set(env), path.name)
    secrets = set(webhook["secrets"])
    for key in ("SICKBAY_WEBHOOK_TLS_CERT_FILE", "SICKBAY_WEBHOOK_TLS_KEY_FILE"):
        target = env[key]
        assert target.startswith("/run/secrets/") and target.split("/")[-1] in secrets
    for name in secrets:
        assert required_variables(override["secrets"][name]["file"]), f"{name} must be required"
    probe = " ".join(webhook["healthcheck"]["test"])
    assert "https://127.0.0.1:8080/healthz" in probe
    assert "webhook-tls.yml" in (ROOT / "docs" / "deploy.md").read_text()
