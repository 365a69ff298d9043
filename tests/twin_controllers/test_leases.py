"""Node Leases and heartbeats (twin/controllers/leases.py).

Cases:
- every Ready node gets kube-node-lease/<node> (holder = node, 40 s, owned by the Node) and a
  Ready condition with a real lastHeartbeatTime; renewTime advances on the simulated clock;
- a NotReady node's Lease is no longer renewed;
- the write budget: a 40-node twin gets at most BURST Leases in one pass, the rest later.
"""

from __future__ import annotations

from tests.twin_controllers.conftest import ControllersTwin, eventually
from twin.clock import Clock
from twin.controllers.leases import BURST, LEASE_NAMESPACE, LEASES
from twin.controllers.manager import ControllerManager
from twin.runtime import Twin
from twin.store import parse_time


def test_leases_renew_and_heartbeats_are_set(twin: object) -> None:
    t: ControllersTwin = twin(nodes=2, gpus_per_node=1)  # type: ignore[operator]
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
    twin = Twin(profile="1.36", clock=Clock(time_scale=50.0))
    twin.seed(nodes=1, gpus_per_node=1)
    manager = ControllerManager()
    manager.attach(twin)
    manager.run_once()
    lease = twin.store.get(LEASES, "gpu-pool-node-0", LEASE_NAMESPACE)

    def not_ready(node: dict) -> None:  # type: ignore[type-arg]
        node["status"]["conditions"][0]["status"] = "False"

    twin.store.mutate("nodes", "gpu-pool-node-0", not_ready, subresource="status")
    manager.run_once()
    after = twin.store.get(LEASES, "gpu-pool-node-0", LEASE_NAMESPACE)
    assert after["metadata"]["resourceVersion"] == lease["metadata"]["resourceVersion"]


def test_write_budget_spreads_a_big_twin() -> None:
    twin = Twin(profile="1.36")
    twin.seed(nodes=40, gpus_per_node=1)
    manager = ControllerManager()
    manager.attach(twin)
    manager.run_once()
    created = len(twin.store.list(LEASES, LEASE_NAMESPACE).items)
    assert 0 < created <= BURST
