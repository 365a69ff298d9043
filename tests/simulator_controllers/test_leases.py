"""Node Leases and heartbeats (simulator/controllers/leases.py).

Cases:
- every Ready node gets kube-node-lease/<node> (holder = node, 40 s, owned by the Node) and a
  Ready condition with a real lastHeartbeatTime; renewTime advances on the simulated clock;
- a NotReady node's Lease is no longer renewed;
- the write budget: a 40-node twin gets at most BURST Leases in one pass, the rest later.
"""

from __future__ import annotations

from simulator.clock import Clock
from simulator.controllers.leases import BURST, LEASE_NAMESPACE, LEASES
from simulator.controllers.manager import ControllerManager
from simulator.runtime import Simulator
from simulator.store import parse_time
from tests.simulator_controllers.conftest import Twin, eventually


def test_leases_renew_and_heartbeats_are_set(twin: object) -> None:
    t: Twin = twin(nodes=2, gpus_per_node=1)  # type: ignore[operator]
    store = t.rs.store
    lease = eventually(lambda: store.try_get(LEASES, "gpu-pool-node-0", LEASE_NAMESPACE))
    node = store.get("nodes", "gpu-pool-node-0")
    assert lease["spec"]["holderIdentity"] == "gpu-pool-node-0"
    assert lease["spec"]["leaseDurationSeconds"] == 40
    assert lease["metadata"]["ownerReferences"][0]["uid"] == node["metadata"]["uid"]
    first = parse_time(lease["spec"]["renewTime"])
    ready = eventually(
        lambda: next(
            c
            for c in store.get("nodes", "gpu-pool-node-0")["status"]["conditions"]
            if c["type"] == "Ready" and c.get("lastHeartbeatTime")
        )
    )
    assert parse_time(ready["lastHeartbeatTime"]).year >= 2026

    def renewed() -> bool:
        now = store.get(LEASES, "gpu-pool-node-0", LEASE_NAMESPACE)["spec"]["renewTime"]
        return parse_time(now) > first

    eventually(renewed)


def test_a_not_ready_node_stops_renewing() -> None:
    sim = Simulator(profile="1.36", clock=Clock(time_scale=50.0))
    sim.seed(nodes=1, gpus_per_node=1)
    manager = ControllerManager()
    manager.attach(sim)
    manager.run_once()
    lease = sim.store.get(LEASES, "gpu-pool-node-0", LEASE_NAMESPACE)

    def not_ready(node: dict) -> None:  # type: ignore[type-arg]
        node["status"]["conditions"][0]["status"] = "False"

    sim.store.mutate("nodes", "gpu-pool-node-0", not_ready, subresource="status")
    manager.run_once()
    after = sim.store.get(LEASES, "gpu-pool-node-0", LEASE_NAMESPACE)
    assert after["metadata"]["resourceVersion"] == lease["metadata"]["resourceVersion"]


def test_write_budget_spreads_a_big_twin() -> None:
    sim = Simulator(profile="1.36")
    sim.seed(nodes=40, gpus_per_node=1)
    manager = ControllerManager()
    manager.attach(sim)
    manager.run_once()
    created = len(sim.store.list(LEASES, LEASE_NAMESPACE).items)
    assert 0 < created <= BURST
