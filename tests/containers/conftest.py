"""Container-based integration tests (marker `docker`): Temporal in a container, a K3s
cluster with DRA, the compose stack and the image.

Every test marked `docker` here is skipped, with the reason the Docker engine gave, when no
engine answers a ping (as on the development machines), or fails instead when
SICKBAY_REQUIRE_DOCKER=1. Fixtures start containers lazily, so a skipped run starts nothing.

Images are the ones docker-compose.yml pins (one place to bump them); K3s is
SICKBAY_TEST_K3S_IMAGE or the default below.
"""

from __future__ import annotations

import asyncio
import os
import socket
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.containers.docker_check import cached_reason, docker_required

ROOT = Path(__file__).resolve().parents[2]
# Kubernetes 1.36: DeviceTaintRule in resource.k8s.io/v1beta2 behind the beta gate
# DRADeviceTaintRules (off by default) — the release Sickbay must detect and use. 1.36.2's
# scheduler ignores DeviceTaintRules (kubernetes#139651); the K3s scenario schedules no pods,
# so it is unaffected. Point SICKBAY_TEST_K3S_IMAGE at a later patch release to move on.
K3S_IMAGE = os.environ.get("SICKBAY_TEST_K3S_IMAGE", "rancher/k3s:v1.36.2-k3s1")
DRA_GATES = "DRADeviceTaints=true,DRADeviceTaintRules=true"


def compose_image(repository: str) -> str:
    """The image tag docker-compose.yml pins for `repository` (e.g. temporalio/admin-tools)."""
    compose = yaml.safe_load((ROOT / "docker-compose.yml").read_text())
    for service in compose["services"].values():
        image = str(service.get("image", ""))
        if image.startswith(repository + ":"):
            return image
    raise LookupError(f"docker-compose.yml pins no {repository} image")


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def require_docker() -> None:
    """Skip (or, with SICKBAY_REQUIRE_DOCKER=1, fail) unless a Docker engine answers."""
    reason = cached_reason()
    if reason is None:
        return
    if docker_required():
        pytest.fail(f"SICKBAY_REQUIRE_DOCKER is set but {reason}")
    pytest.skip(f"needs a Docker engine: {reason}")


@pytest.fixture(scope="session")
def docker_engine() -> None:
    """Every container fixture depends on this, so it runs before any of them starts."""
    require_docker()


@pytest.fixture(autouse=True)
def _docker_marked(request: pytest.FixtureRequest) -> None:
    if request.node.get_closest_marker("docker") is not None:
        require_docker()


@pytest.fixture(scope="session")
def temporal_container(docker_engine: None) -> Iterator[str]:
    """A Temporal server in a container (the CLI's dev server from the pinned admin-tools
    image, search attributes registered); yields its host:port."""
    from testcontainers.core.container import DockerContainer

    from contract.names import SEARCH_ATTRIBUTES

    command = ["server", "start-dev", "--ip", "0.0.0.0", "--headless", "--log-level", "warn"]
    for name in SEARCH_ATTRIBUTES:
        command += ["--search-attribute", f"{name}=Keyword"]
    container = (
        DockerContainer(compose_image("temporalio/admin-tools"))
        .with_kwargs(entrypoint=["temporal"])
        .with_command(command)
        .with_exposed_ports(7233)
    )
    with container:
        address = f"{container.get_container_host_ip()}:{container.get_exposed_port(7233)}"
        _wait_for_temporal(address)
        yield address


def _wait_for_temporal(address: str, timeout: float = 90.0) -> None:
    from temporalio.client import Client

    async def probe() -> None:
        client = await Client.connect(address)
        await client.count_workflows()

    deadline = time.monotonic() + timeout  # 90 s: image start plus the dev server's boot
    last: Exception | None = None
    while time.monotonic() < deadline:
        try:
            asyncio.run(probe())
            return
        except Exception as exc:  # not up yet: connection refused, UNAVAILABLE
            last = exc
            time.sleep(1)  # poll interval while the container starts
    raise TimeoutError(f"Temporal at {address} did not serve within {timeout:.0f} s: {last}")


@pytest.fixture(scope="session")
def k3s_kubeconfig(docker_engine: None, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """A single-node K3s cluster with DeviceTaintRules served (v1beta2) and the device-taint
    gates on in apiserver, scheduler and controller-manager; yields a kubeconfig path."""
    from testcontainers.community.k3s import K3SContainer

    k3s = K3SContainer(image=K3S_IMAGE)
    host = k3s.get_container_host_ip()
    k3s.with_command(
        " ".join(
            [
                "server",
                "--disable traefik",
                "--disable metrics-server",
                f"--tls-san={host}",
                f"--kube-apiserver-arg=feature-gates={DRA_GATES}",
                "--kube-apiserver-arg=runtime-config=resource.k8s.io/v1beta2=true",
                f"--kube-scheduler-arg=feature-gates={DRA_GATES}",
                f"--kube-controller-manager-arg=feature-gates={DRA_GATES}",
            ]
        )
    )
    with k3s:
        path = tmp_path_factory.mktemp("k3s") / "kubeconfig"
        path.write_text(k3s.config_yaml())
        _wait_for_device_taint_rules(path)
        yield path


def _wait_for_device_taint_rules(kubeconfig: Path, timeout: float = 120.0) -> None:
    from kubernetes import client, config

    api = config.new_client_from_config(config_file=str(kubeconfig))
    resources = client.ResourceV1beta2Api(api)
    core = client.CoreV1Api(api)
    deadline = time.monotonic() + timeout  # 120 s: K3s boots its control plane in ~20-60 s
    last: Any = None
    while time.monotonic() < deadline:
        try:
            served = {r.name for r in resources.get_api_resources().resources}
            nodes = core.list_node().items
            ready = [
                n
                for n in nodes
                if any(c.type == "Ready" and c.status == "True" for c in n.status.conditions or [])
            ]
            if "devicetaintrules" in served and ready:
                return
            last = f"served={sorted(served)} ready_nodes={len(ready)}"
        except Exception as exc:  # API server still starting
            last = exc
        time.sleep(2)  # poll interval while K3s starts
    raise TimeoutError(
        f"K3s ({K3S_IMAGE}) did not serve resource.k8s.io/v1beta2 devicetaintrules with a "
        f"Ready node within {timeout:.0f} s: {last}"
    )


@pytest.fixture
async def temporal_client(temporal_container: str) -> AsyncIterator[Any]:
    from worker.settings import Settings
    from worker.temporal import connect

    yield await connect(Settings(temporal_address=temporal_container))
