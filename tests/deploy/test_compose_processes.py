"""The compose services' own command lines and environment, run as local processes on loopback
(no Docker): what the container would run, with container paths mapped to the repository
files compose mounts there, and only host/port changed to free loopback ports.

Cases:
- webhook: starts from its compose command + env (token read from the compose secret file);
  its compose health check URL (/healthz) answers 200 while Temporal is down; an alert without
  the token gets 401, with the token from the secret file it gets 503 (Temporal down), so
  Alertmanager would retry; the process exits cleanly on SIGTERM;
- worker: starts from its compose command + env (kubeconfig mount mapped) against the
  Temporal dev server; its compose health check URL (/metrics on SICKBAY_METRICS_PORT)
  answers; SIGTERM (what `docker stop` sends) ends it cleanly with exit 0;
- twin: its compose shell script, run by /bin/sh, starts the twin; the worker's default
  kubeconfig (deploy/compose/twin.kubeconfig, server rewritten to the loopback port) lists one
  node whose ResourceSlice publishes two GPUs; an Xid 79 fault makes the twin post an
  Alertmanager notification to the webhook URL with the token from the compose secret file;
- the `twin` profile end to end (twin + webhook + worker from their compose definitions, the
  dev server as Temporal): `twin fail` -> alert -> webhook -> remediation -> a DeviceTaintRule
  in the twin; `sickbay repaired` -> the rule is gone.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from functools import cache
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from harness.stack import free_port
from tests.deploy.helpers import (
    COMPOSE_FILE,
    ROOT,
    compose_script,
    interpolate,
    repo_path,
    service_argv,
)

SICKBAY = str(Path(sys.executable).parent / "sickbay")
# The twin's image runs the dev tools' `sickbay-dev`; here its module form (the same parser),
# which needs no re-install of the venv.
SICKBAY_DEV = [sys.executable, "-m", "harness.cli"]
# Start-up bound for one process: imports plus binding a port take ~1-3 s here; 30 s leaves
# room on a loaded 2-core CI machine without hiding a hang.
START_WITHIN = 30.0


@cache
def _operator_variables() -> dict[str, str]:
    """What the operator must set before `docker compose up` (no defaults for secrets): a
    webhook token file made as docs/deploy.md says (`openssl rand -hex 32`)."""
    directory = Path(tempfile.mkdtemp(prefix="compose-operator-"))
    token = directory / "webhook-token"
    token.write_text(secrets.token_hex(32) + "\n")
    token.chmod(0o600)
    return {"SICKBAY_WEBHOOK_TOKEN_SECRET": str(token)}


def _fill(value: str) -> str:
    return interpolate(value, _operator_variables())


def _compose() -> dict[str, Any]:
    return yaml.safe_load(COMPOSE_FILE.read_text())


def _host_env(name: str, **overrides: str) -> dict[str, str]:
    """The service's environment as the container sees it, container paths of mounted files
    and secrets replaced by the repository files compose mounts there."""
    compose = _compose()
    service = compose["services"][name]
    env: dict[str, str] = {}
    for entry in service.get("env_file") or []:
        path = repo_path(_fill(entry["path"] if isinstance(entry, dict) else entry))
        for line in path.read_text().splitlines():
            if line.strip() and not line.lstrip().startswith("#"):
                key, _, value = line.partition("=")
                env[key.strip()] = value.strip()
    for key, value in (service.get("environment") or {}).items():
        env[key] = _fill(str(value))
    mounts: dict[str, str] = {}
    for volume in service.get("volumes") or []:
        source, target, *_ = _fill(volume).split(":")
        if source in (compose.get("volumes") or {}):  # a named volume: a fresh directory
            mounts[target] = tempfile.mkdtemp(prefix=f"compose-{source}-")
        else:
            mounts[target] = str(repo_path(source))
    for secret in service.get("secrets") or []:
        file = compose["secrets"][secret]["file"]
        mounts[f"/run/secrets/{secret}"] = str(repo_path(_fill(file)))
    for key, value in env.items():
        if value in mounts:
            env[key] = mounts[value]
    env.update(overrides)
    base = {k: v for k, v in os.environ.items() if not k.startswith("SICKBAY_")}
    base.pop("KUBECONFIG", None)
    return {**base, **env}


def _args(name: str, **replace: str) -> list[str]:
    """The service's command with `--flag value` pairs replaced (host/port only)."""
    argv = service_argv(_compose()["services"][name])
    for flag, value in replace.items():
        option = "--" + flag.replace("_", "-")
        assert option in argv, f"compose command of {name} has no {option}"
        argv[argv.index(option) + 1] = value
    return argv


@contextmanager
def _process(
    argv: list[str], env: dict[str, str], log: Path, program: str | None = SICKBAY
) -> Iterator[subprocess.Popen[bytes]]:
    cmd = [program, *argv] if program else argv
    with log.open("wb") as out:
        proc = subprocess.Popen(cmd, env=env, stdout=out, stderr=subprocess.STDOUT)
    try:
        yield proc
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout=15)  # graceful shutdown is bounded at a few seconds
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout=5)


def _wait_http(
    url: str, proc: subprocess.Popen[bytes], log: Path, status: int | None = None
) -> httpx.Response:
    """The first answer of `url` (with `status`: the first answer with that status)."""
    deadline = time.monotonic() + START_WITHIN
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            pytest.fail(f"{proc.args} exited with {proc.returncode}:\n{log.read_text()[-3000:]}")
        try:
            answer = httpx.get(url, timeout=2)
            if status is None or answer.status_code == status:
                return answer
        except httpx.TransportError:
            pass
        time.sleep(0.2)
    pytest.fail(f"{url} did not answer within {START_WITHIN} s:\n{log.read_text()[-3000:]}")


def _require_commands(*commands: str, program: str = "sickbay") -> None:
    """The compose file runs these subcommands of `program` (`sickbay`, or the twin's
    `sickbay-dev`): each must exist (a missing one is a failure, never a skip)."""
    if program == "sickbay-dev":
        from harness.cli import build_parser
    else:
        from worker.cli import build_parser

    parser = build_parser()
    choices: dict[str, object] = {}
    for action in parser._actions:
        if hasattr(action, "choices") and isinstance(action.choices, dict):
            choices = action.choices
            break
    missing = [c for c in commands if c not in choices]
    assert not missing, f"`{program}` has no subcommand {missing}; docker-compose.yml runs them"


def _dev_script(script: str) -> str:
    """The twin's compose script with its `exec sickbay-dev` as the module form."""
    assert "exec sickbay-dev " in script, script
    return script.replace("exec sickbay-dev ", f"exec {' '.join(SICKBAY_DEV)} ")


def test_webhook_from_its_compose_definition(tmp_path: Path) -> None:
    port = free_port()
    dead_temporal = f"127.0.0.1:{free_port()}"  # nothing listens there
    env = _host_env(
        "webhook", SICKBAY_TEMPORAL_ADDRESS=dead_temporal, SICKBAY_WEBHOOK_TEMPORAL_TIMEOUT="2"
    )
    token_file = Path(env["SICKBAY_WEBHOOK_TOKEN_FILE"])
    assert token_file.is_file(), "the compose secret did not map to a file"
    log = tmp_path / "webhook.log"
    with _process(_args("webhook", host="127.0.0.1", port=str(port)), env, log) as proc:
        health = _wait_http(f"http://127.0.0.1:{port}/healthz", proc, log)
        assert health.status_code == 200
        assert health.json()["temporal_connected"] is False
        url = f"http://127.0.0.1:{port}/v1/alertmanager"
        payload = {
            "version": "4",
            "groupKey": '{}:{alertname="GPUXidError"}',
            "status": "firing",
            "receiver": "sickbay",
            "groupLabels": {},
            "commonLabels": {},
            "commonAnnotations": {},
            "externalURL": "http://alertmanager:9093",
            "alerts": [],
        }
        assert httpx.post(url, json=payload, timeout=10).status_code == 401
        token = token_file.read_text().strip()
        answer = httpx.post(
            url, json=payload, headers={"Authorization": f"Bearer {token}"}, timeout=20
        )
        assert answer.status_code in (200, 503), answer.text  # no alerts: nothing to start
        proc.send_signal(signal.SIGTERM)
        # uvicorn shuts down gracefully, then re-raises the signal it caught (exit -SIGTERM).
        assert proc.wait(timeout=15) in (0, -signal.SIGTERM)
        assert "Finished server process" in log.read_text(), log.read_text()[-3000:]


def test_worker_from_its_compose_definition(tmp_path: Path, request: pytest.FixtureRequest) -> None:
    _require_commands("worker")
    from twin.testing import running_twin

    dev_env = request.getfixturevalue("own_dev_server")
    metrics, health = free_port(), free_port()
    address = dev_env.client.service_client.config.target_host
    env = _host_env(
        "worker",
        SICKBAY_TEMPORAL_ADDRESS=address,
        SICKBAY_METRICS_PORT=str(metrics),
        SICKBAY_HEALTH_PORT=str(health),
        SICKBAY_TASK_QUEUE=f"deploy-test-{metrics}",
        SICKBAY_SWEEP_ENABLED="false",  # nothing to sweep; keep the test to the worker
    )
    assert Path(env["KUBECONFIG"]).is_file(), "the compose kubeconfig did not map to a file"
    log = tmp_path / "worker.log"
    check = " ".join(_compose()["services"]["worker"]["healthcheck"]["test"])
    assert ":9465/healthz" in check
    # The worker reads (or records) the cluster name in its cluster before it polls: a twin
    # with Sickbay's namespace, as the compose twin makes it (`--namespace sickbay`).
    with contextlib.ExitStack() as stack:
        rs = stack.enter_context(running_twin(tmp_path / "twin", nodes=1, gpus_per_node=1))
        rs.store.create("namespaces", {"metadata": {"name": "sickbay"}})
        env["KUBECONFIG"] = str(rs.kubeconfig_path)
        _run_compose_worker(env, log, metrics, health)
    assert rs.store.get("configmaps", "sickbay-cluster", "sickbay")["data"] == {"name": ""}


def _run_compose_worker(
    env: dict[str, str], log: Path, metrics: int, health: int | None = None
) -> None:
    with _process(_args("worker"), env, log) as proc:
        answer = _wait_http(f"http://127.0.0.1:{metrics}/metrics", proc, log)
        assert answer.status_code == 200
        assert "temporal" in answer.text or "sickbay" in answer.text
        # Metrics come up with the runtime, before the Temporal connection: wait until the
        # worker says it polls (signal handlers installed), then stop it as Docker would.
        deadline = time.monotonic() + START_WITHIN
        while "worker polling" not in log.read_text() and time.monotonic() < deadline:
            assert proc.poll() is None, log.read_text()[-3000:]
            time.sleep(0.2)
        assert "worker polling" in log.read_text(), log.read_text()[-3000:]
        if health is not None:  # the compose healthcheck's target: 200 once it polls
            _wait_http(f"http://127.0.0.1:{health}/healthz", proc, log, status=200)
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=45) == 0, log.read_text()[-3000:]
        assert "worker stopped" in log.read_text()


def test_twin_from_its_compose_definition(tmp_path: Path) -> None:
    """The twin's compose shell script itself, run by /bin/sh: secret file and ports mapped."""
    _require_commands("twin", program="sickbay-dev")
    from kubernetes import client, config

    compose = _compose()
    script = compose_script(compose["services"]["twin"])
    assert script is not None
    port = free_port()
    secret = repo_path(_fill(compose["secrets"]["webhook_token"]["file"]))
    with _alert_sink() as (sink_url, received):
        script = (
            _dev_script(script)
            .replace("/run/secrets/webhook_token", str(secret))
            .replace("--port 6443", f"--port {port}")
            # 60: Alertmanager's group_wait passes in well under a second.
            .replace("--time-scale 1 ", "--time-scale 60 ")
            .replace("http://webhook:8080/v1/alertmanager", sink_url)
        )
        env = _host_env("twin", HOME=str(tmp_path), SICKBAY_STATE_DIR=str(tmp_path / "state"))
        env["PATH"] = f"{Path(SICKBAY).parent}{os.pathsep}{env.get('PATH', '')}"
        log = tmp_path / "twin.log"
        with _process(["/bin/sh", "-c", script], env, log, program=None) as proc:
            _wait_http(f"http://127.0.0.1:{port}/version", proc, log)
            kubeconfig = yaml.safe_load((ROOT / "deploy/compose/twin.kubeconfig").read_text())
            kubeconfig["clusters"][0]["cluster"]["server"] = f"http://127.0.0.1:{port}"
            api = config.new_client_from_config_dict(kubeconfig)
            nodes = client.CoreV1Api(api).list_node().items
            assert len(nodes) == 1
            slices = client.ResourceV1Api(api).list_resource_slice().items
            devices = [d for s in slices for d in s.spec.devices or []]
            assert len(devices) == 2
            # docs/deploy.md's demo step, as `docker compose exec twin ...` would run it (the
            # same env: the state file under SICKBAY_STATE_DIR tells the CLI where the twin is).
            node = nodes[0].metadata.name
            assert node == "gpu-pool-node-0", "docs/deploy.md names the twin's node"
            fail = subprocess.run(
                [*SICKBAY_DEV, "twin", "fail", node, "0", "--xid", "79"],
                env=env,
                capture_output=True,
                text=True,
                timeout=START_WITHIN,
            )
            assert fail.returncode == 0, fail.stdout + fail.stderr
            # The fault makes the twin post an alert to the webhook URL with the secret token.
            deadline = time.monotonic() + START_WITHIN
            while not received and time.monotonic() < deadline:
                time.sleep(0.2)
            assert received, f"no alert reached the webhook URL:\n{log.read_text()[-3000:]}"
            authorization, body = received[0]
            assert authorization == f"Bearer {secret.read_text().strip()}"
            assert body["alerts"][0]["labels"]["Hostname"] == node


@contextmanager
def _alert_sink() -> Iterator[tuple[str, list[tuple[str, dict[str, Any]]]]]:
    """A loopback HTTP server standing in for the webhook: records (Authorization, body)."""
    import json
    import threading
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    received: list[tuple[str, dict[str, Any]]] = []

    class Sink(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            length = int(self.headers.get("Content-Length", "0"))
            body = json.loads(self.rfile.read(length) or b"{}")
            received.append((self.headers.get("Authorization", ""), body))
            self.send_response(200)
            self.send_header("Content-Length", "0")
            self.end_headers()

        def log_message(self, format: str, *args: Any) -> None:  # quiet
            return

    server = ThreadingHTTPServer(("127.0.0.1", 0), Sink)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/v1/alertmanager", received
    finally:
        server.shutdown()
        server.server_close()


def _managed_rules(api: Any) -> list[Any]:
    from kubernetes import client

    from contract.names import LABEL_MANAGED_BY, MANAGED_BY_VALUE

    return (
        client.ResourceV1beta2Api(api)
        .list_device_taint_rule(label_selector=f"{LABEL_MANAGED_BY}={MANAGED_BY_VALUE}")
        .items
    )


def _until(check: Any, within: float, what: str, logs: list[Path]) -> Any:
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        found = check()
        if found:
            return found
        time.sleep(0.5)  # poll interval
    tails = "\n".join(f"--- {p.name}\n{p.read_text()[-2000:]}" for p in logs)
    pytest.fail(f"{what} did not happen within {within:.0f} s\n{tails}")


def test_twin_profile_remediates_end_to_end(tmp_path: Path, request: pytest.FixtureRequest) -> None:
    """`docker compose --profile twin up` as processes: twin, webhook and worker from their
    compose definitions (one shared token file, the worker's default kubeconfig), the dev
    server as Temporal. docs/deploy.md's steps: `twin fail` -> the twin's alert -> webhook ->
    remediation -> DeviceTaintRule in the twin; `sickbay repaired` -> the rule is gone."""
    _require_commands("worker", "repaired")
    _require_commands("twin", program="sickbay-dev")
    from kubernetes import client, config

    dev_env = request.getfixturevalue("own_dev_server")
    temporal = dev_env.client.service_client.config.target_host
    compose = _compose()
    twin_port, webhook_port, metrics = free_port(), free_port(), free_port()
    queue = f"deploy-twin-{twin_port}"
    common = {
        "SICKBAY_TEMPORAL_ADDRESS": temporal,
        "SICKBAY_TASK_QUEUE": queue,
        "SICKBAY_SWEEP_ENABLED": "false",
    }
    secret = repo_path(_fill(compose["secrets"]["webhook_token"]["file"]))
    script = compose_script(compose["services"]["twin"])
    assert script is not None
    script = (
        _dev_script(script)
        .replace("/run/secrets/webhook_token", str(secret))
        .replace("--port 6443", f"--port {twin_port}")
        .replace("--time-scale 1 ", "--time-scale 60 ")
        .replace("http://webhook:8080/", f"http://127.0.0.1:{webhook_port}/")
    )
    kubeconfig = yaml.safe_load((ROOT / "deploy/compose/twin.kubeconfig").read_text())
    kubeconfig["clusters"][0]["cluster"]["server"] = f"http://127.0.0.1:{twin_port}"
    kubeconfig_path = tmp_path / "kubeconfig"
    kubeconfig_path.write_text(yaml.safe_dump(kubeconfig))

    twin_env = _host_env("twin", HOME=str(tmp_path), SICKBAY_STATE_DIR=str(tmp_path / "state"))
    twin_env["PATH"] = f"{Path(SICKBAY).parent}{os.pathsep}{twin_env.get('PATH', '')}"
    webhook_env = _host_env("webhook", **common)
    worker_env = _host_env(
        "worker", **common, SICKBAY_METRICS_PORT=str(metrics), KUBECONFIG=str(kubeconfig_path)
    )
    cli_env = {**worker_env, "SICKBAY_METRICS_PORT": "0"}
    logs = [tmp_path / "twin.log", tmp_path / "webhook.log", tmp_path / "worker.log"]
    webhook_argv = _args("webhook", host="127.0.0.1", port=str(webhook_port))
    with (
        _process(["/bin/sh", "-c", script], twin_env, logs[0], program=None) as twin,
        _process(webhook_argv, webhook_env, logs[1]) as webhook,
        _process(_args("worker"), worker_env, logs[2]) as worker,
    ):
        _wait_http(f"http://127.0.0.1:{twin_port}/version", twin, logs[0])
        _wait_http(f"http://127.0.0.1:{webhook_port}/healthz", webhook, logs[1])
        _until(lambda: "worker polling" in logs[2].read_text(), START_WITHIN, "worker", logs)
        assert worker.poll() is None

        api = config.new_client_from_config_dict(kubeconfig)
        devices = [
            d for s in client.ResourceV1Api(api).list_resource_slice().items for d in s.spec.devices
        ]
        gpu0 = next(d for d in devices if d.name == "gpu-0")
        uuid = gpu0.attributes["uuid"].string
        fail = subprocess.run(
            [*SICKBAY_DEV, "twin", "fail", "gpu-pool-node-0", "0", "--xid", "79"],
            env=twin_env,
            capture_output=True,
            text=True,
            timeout=START_WITHIN,
        )
        assert fail.returncode == 0, fail.stdout + fail.stderr

        # 60 s: alert group_wait (scaled), one workflow task, one rule create.
        (rule,) = _until(lambda: _managed_rules(api), 60, "a DeviceTaintRule", logs)
        assert rule.spec.device_selector.device == "gpu-0"
        assert rule.spec.taint.effect == "NoExecute"

        repaired = subprocess.run(
            [SICKBAY, "repaired", f"gpu-pool-node-0/{uuid}", "--actor", "tests/deploy"],
            env=cli_env,
            capture_output=True,
            text=True,
            timeout=START_WITHIN,
        )
        assert repaired.returncode == 0, repaired.stdout + repaired.stderr
        _until(lambda: not _managed_rules(api), 60, "the release of the rule", logs)
