"""Node heartbeats, as the kubelet sends them: a Lease per node and the Ready condition's time.

A real kubelet renews `kube-node-lease/<node>` (holderIdentity = the node,
leaseDurationSeconds 40, owned by the Node) every 10 s and reports node status at least every
5 minutes, bumping the Ready condition's `lastHeartbeatTime`. This controller does the same
for every Ready node on the simulated clock, with one concession to a fast clock and to big
twins: it writes at most once per real second per node and about five times per real second
in all, so a 1000x demo or a 1,000-node bench does not flood the store (the Lease then reads
older than 40 s; nothing in the twin acts on lease expiry). `kubectl describe
node` shows the Lease's holder and renew time, and real heartbeat dates.
"""

from __future__ import annotations

import time
from datetime import datetime
from typing import Any

from twin.controllers.common import NODES, name_of, uid_of
from twin.errors import ApiError
from twin.store import format_micro_time, format_time, parse_time

LEASES = "leases.coordination.k8s.io"
LEASE_NAMESPACE = "kube-node-lease"
LEASE_DURATION = 40  # seconds: the kubelet's default nodeLeaseDurationSeconds
RENEW_INTERVAL = 10.0  # simulated seconds between renewals (a quarter of the duration)
STATUS_INTERVAL = 300.0  # simulated seconds: the kubelet's nodeStatusReportFrequency
MIN_REAL_INTERVAL = 1.0  # real seconds between two writes for one node ...
MAX_WRITES_PER_SECOND = 5.0  # ... and for all nodes together (a 1,000-node twin stays quiet),
BURST = 20.0  # with this many at once (a small twin gets all its Leases in the first pass)


def node_lease(node: dict[str, Any], now: datetime) -> dict[str, Any]:
    name = name_of(node)
    return {
        "metadata": {
            "name": name,
            "ownerReferences": [
                {"apiVersion": "v1", "kind": "Node", "name": name, "uid": uid_of(node)}
            ],
        },
        "spec": {
            "holderIdentity": name,
            "leaseDurationSeconds": LEASE_DURATION,
            "renewTime": format_micro_time(now),
        },
    }


class NodeLeases:
    def __init__(self, manager: Any) -> None:
        self.manager = manager
        self._last_write: dict[str, float] = {}
        self._tokens = BURST
        self._refilled = time.monotonic()
        self._cursor = 0

    def _due(self, name: str) -> bool:
        """This node's write may go now: its own spacing passed and the shared budget allows."""
        now = time.monotonic()
        if now - self._last_write.get(name, float("-inf")) < MIN_REAL_INTERVAL:
            return False
        self._tokens = min(BURST, self._tokens + (now - self._refilled) * MAX_WRITES_PER_SECOND)
        self._refilled = now
        if self._tokens < 1.0:
            return False
        self._tokens -= 1.0
        return True

    def _tokens_now(self) -> float:
        return min(
            BURST, self._tokens + (time.monotonic() - self._refilled) * MAX_WRITES_PER_SECOND
        )

    def sync(self, ctx: Any) -> float | None:
        store, now = ctx.store, ctx.now
        # Wake for the next renewal, but never more than once per real second.
        wake = max(RENEW_INTERVAL, ctx.clock.time_scale * MIN_REAL_INTERVAL)
        if self._tokens_now() < 1.0:
            return wake  # no write could go: the other controllers' passes skip the scan
        nodes = store.list(NODES, copy_objects=False).items
        names = {name_of(n) for n in nodes}
        leases = {
            name_of(lease): lease
            for lease in store.list(LEASES, LEASE_NAMESPACE, copy_objects=False).items
        }
        # Round robin from where the last pass ran out of writes, so a big twin's scan stops
        # at the first nodes it cannot write for instead of reading every node each pass.
        start = self._cursor % len(nodes) if nodes else 0
        for offset in range(len(nodes)):
            if self._tokens_now() < 1.0:
                self._cursor = start + offset
                break
            node = nodes[(start + offset) % len(nodes)]
            name = name_of(node)
            ready = next(
                (
                    c
                    for c in (node.get("status") or {}).get("conditions") or []
                    if c.get("type") == "Ready"
                ),
                None,
            )
            if ready is None or ready.get("status") != "True":
                continue  # a node whose kubelet is down stops renewing
            lease = leases.get(name)
            if lease is None:
                if not self._due(name):
                    continue
                try:
                    store.create(LEASES, node_lease(node, now), LEASE_NAMESPACE)
                except ApiError as err:
                    if err.code != 409:
                        raise
                self._last_write[name] = time.monotonic()
            else:
                renewed = (lease.get("spec") or {}).get("renewTime")
                age = (now - parse_time(renewed)).total_seconds() if renewed else RENEW_INTERVAL
                if age >= RENEW_INTERVAL and self._due(name):
                    self._renew(store, name, now)
            beat = ready.get("lastHeartbeatTime")
            age = (now - parse_time(beat)).total_seconds() if beat else STATUS_INTERVAL
            if age >= STATUS_INTERVAL and self._due(name + "/status"):
                self._heartbeat(store, name, now)
        for gone in set(self._last_write) - names - {n + "/status" for n in names}:
            self._last_write.pop(gone, None)
        return wake

    def _renew(self, store: Any, name: str, now: datetime) -> None:
        def renew(lease: dict[str, Any]) -> None:
            lease.setdefault("spec", {})["renewTime"] = format_micro_time(now)

        try:
            store.mutate(LEASES, name, renew, LEASE_NAMESPACE, manager="kubelet")
        except ApiError as err:
            if err.code != 404:
                raise
        self._last_write[name] = time.monotonic()

    def _heartbeat(self, store: Any, name: str, now: datetime) -> None:
        stamp = format_time(now)

        def beat(node: dict[str, Any]) -> None:
            for cond in (node.get("status") or {}).get("conditions") or []:
                cond["lastHeartbeatTime"] = stamp
                cond.setdefault("lastTransitionTime", stamp)

        try:
            store.mutate(NODES, name, beat, subresource="status", manager="kubelet")
        except ApiError as err:
            if err.code != 404:
                raise
        self._last_write[name + "/status"] = time.monotonic()
