"""Start the cluster twin in-process for tests and scripts.

    with running_sim(tmp_path, profile="1.36", nodes=2, gpus_per_node=2) as rs:
        api = rs.api_client()                    # kubernetes.client.ApiClient via the kubeconfig
        CoreV1Api(api).list_node()
        rs.requests(verb="create")               # request log records
        rs.store.get("pods", "p", "default")     # direct store access

`start_sim(...)` returns a `RunningSim` (call `.stop()`); the server runs on a background thread
on a free 127.0.0.1 port and the kubeconfig is written under `directory`.
"""

from __future__ import annotations

import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from simulator.runtime import Simulator
from simulator.store import Store


@dataclass
class RunningSim:
    sim: Simulator
    kubeconfig_path: Path
    _clients: list[Any] = field(default_factory=list)

    @property
    def url(self) -> str:
        return self.sim.url

    @property
    def store(self) -> Store:
        return self.sim.store

    @property
    def profile(self) -> str:
        return self.sim.profile.name

    def requests(self, **filters: Any) -> list[Any]:
        """Request-log records matching filters (verb=, resource=, namespace=, name=, status=)."""
        return self.sim.requests.entries(**filters)

    def clear_requests(self) -> None:
        self.sim.requests.clear()

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
        self.sim.stop()


def start_sim(
    directory: str | Path | None = None,
    profile: str = "1.36",
    nodes: int = 2,
    gpus_per_node: int = 2,
    device_taint_rules: bool = True,
    token: str | None = None,
    clock: Any = None,
    controllers: tuple[Any, ...] = (),
    **seed: Any,
) -> RunningSim:
    sim = Simulator(
        profile=profile, device_taint_rules=device_taint_rules, token=token, clock=clock
    )
    sim.seed(nodes=nodes, gpus_per_node=gpus_per_node, **seed)
    for c in controllers:
        sim.add_controller(c)
    sim.start()
    base = (
        Path(directory) if directory is not None else Path(tempfile.mkdtemp(prefix="sickbay-sim-"))
    )
    path = sim.write_kubeconfig(base / f"kubeconfig-{profile}-{sim.port}.yaml")
    return RunningSim(sim, path)


@contextmanager
def running_sim(directory: str | Path | None = None, **kwargs: Any) -> Iterator[RunningSim]:
    rs = start_sim(directory, **kwargs)
    try:
        yield rs
    finally:
        rs.stop()
