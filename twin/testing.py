"""Start the cluster twin in-process for tests and scripts.

    with running_twin(tmp_path, profile="1.36", nodes=2, gpus_per_node=2) as rs:
        api = rs.api_client()                    # kubernetes.client.ApiClient via the kubeconfig
        CoreV1Api(api).list_node()
        rs.requests(verb="create")               # request log records
        rs.store.get("pods", "p", "default")     # direct store access

`start_twin(...)` returns a `RunningTwin` (call `.stop()`); the server runs on a background thread
on a free 127.0.0.1 port and the kubeconfig is written under `directory`.
"""

from __future__ import annotations

import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from twin.controllers.common import MACHINES
from twin.runtime import Twin
from twin.store import Store


@dataclass
class RunningTwin:
    twin: Twin
    kubeconfig_path: Path
    _clients: list[Any] = field(default_factory=list)

    @property
    def url(self) -> str:
        return self.twin.url

    @property
    def store(self) -> Store:
        return self.twin.store

    @property
    def profile(self) -> str:
        return self.twin.profile.name

    def requests(self, **filters: Any) -> list[Any]:
        """Request-log records matching filters (verb=, resource=, namespace=, name=, status=)."""
        return self.twin.requests.entries(**filters)

    def clear_requests(self) -> None:
        self.twin.requests.clear()

    def api_client(self) -> Any:
        from kubernetes import config

        client = config.new_client_from_config(str(self.kubeconfig_path))
        self._clients.append(client)
        return client

    def stop(self) -> None:
        for c in self._clients:
            try:
                c.close()
            except Exception:  # closing a pool must not mask the test result
                pass
        self.twin.stop()


def start_twin(
    directory: str | Path | None = None,
    profile: str = "1.36",
    nodes: int = 2,
    gpus_per_node: int = 2,
    device_taint_rules: bool = True,
    token: str | None = None,
    clock: Any = None,
    controllers: tuple[Any, ...] = (),
    **seed: Any,
) -> RunningTwin:
    twin = Twin(profile=profile, device_taint_rules=device_taint_rules, token=token, clock=clock)
    twin.seed(nodes=nodes, gpus_per_node=gpus_per_node, **seed)
    for c in controllers:
        twin.add_controller(c)
    twin.start()
    base = (
        Path(directory) if directory is not None else Path(tempfile.mkdtemp(prefix="sickbay-twin-"))
    )
    path = twin.write_kubeconfig(base / f"kubeconfig-{profile}-{twin.port}.yaml")
    return RunningTwin(twin, path)


@contextmanager
def running_twin(directory: str | Path | None = None, **kwargs: Any) -> Iterator[RunningTwin]:
    rs = start_twin(directory, **kwargs)
    try:
        yield rs
    finally:
        rs.stop()


def capi_machine(store: Store, node: str, namespace: str = "default") -> str:
    """A Cluster API Machine `m-<node>` whose status points at `node` (as a MachineSet's
    Machine does once its node joined); returns its name."""
    name = f"m-{node}"
    store.create(
        MACHINES,
        {
            "apiVersion": "cluster.x-k8s.io/v1beta1",
            "kind": "Machine",
            "metadata": {"name": name, "namespace": namespace},
            "spec": {"clusterName": "twin", "bootstrap": {"dataSecretName": "x"}},
        },
        namespace=namespace,
    )
    store.mutate(
        MACHINES,
        name,
        lambda m: m.update(status={"nodeRef": {"kind": "Node", "name": node}}),
        namespace=namespace,
        subresource="status",
    )
    return name
