"""DRA device allocation: the scheduler's pure core, with no store and no I/O.

Given the published devices (ResourceSlices), DeviceClasses, DeviceTaintRules and the claims
that already hold devices, `Allocator.allocate(claims, node)` finds devices on one node for a
pod's unallocated claims, the way kube-scheduler's DRA plugin does:

- a request (`exactly`, or the v1beta1 flat form) takes `count` devices (`allocationMode:
  ExactCount`) or every matching device on the node (`All`: fails if any of them is in use),
  each matching the DeviceClass's CEL selectors and the request's own;
- `firstAvailable` tries its sub-requests in order and records the winner as `main/sub`;
- `constraints[].matchAttribute` makes the listed requests' devices agree on an attribute;
- a device already in another claim's allocation is busy (`adminAccess` requests excepted);
- a device with a NoSchedule or NoExecute taint (published in its slice, or put on it by a
  DeviceTaintRule) is skipped unless every such taint is tolerated by the request; a NoExecute
  toleration whose `tolerationSeconds` has run out since the taint's `timeAdded` no longer
  tolerates (unless the `expired_toleration_bug` switch reproduces the 1.36 behaviour where it
  still does); the tolerations are copied into the allocation result as the real scheduler does.
Backtracking over requests keeps an early greedy choice from starving a later request.

Device identity everywhere is `DeviceId(driver, pool, device)`; `str()` gives the
`driver/pool/device` form used in pod health status.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from itertools import combinations
from typing import Any, NamedTuple

from twin.clock import parse_time, rfc3339
from twin.controllers.cel import CelError, compile_expr, device_env

log = logging.getLogger(__name__)

BLOCKING_EFFECTS = ("NoSchedule", "NoExecute")


class DeviceId(NamedTuple):
    driver: str
    pool: str
    device: str

    def __str__(self) -> str:
        return f"{self.driver}/{self.pool}/{self.device}"


@dataclass
class Device:
    """One published device with its CEL environment and the taints in force on it."""

    id: DeviceId
    node: str | None
    raw: dict[str, Any]
    env: dict[str, Any]
    taints: list[dict[str, Any]] = field(default_factory=list)

    def attribute(self, qualified: str) -> Any:
        """Attribute value by `domain/name` (or bare name in the driver's domain), else None."""
        domain, _, name = qualified.rpartition("/")
        domain = domain or self.id.driver
        return self.env["device"]["attributes"].get(domain, {}).get(name)


# --------------------------------------------------------------------------------------------
# Taints and tolerations
# --------------------------------------------------------------------------------------------


def toleration_matches(toleration: dict[str, Any], taint: dict[str, Any]) -> bool:
    """Kubernetes toleration semantics (same for node taints and device taints)."""
    effect = toleration.get("effect") or ""
    if effect and effect != taint.get("effect"):
        return False
    operator = toleration.get("operator") or "Equal"
    key = toleration.get("key") or ""
    if not key:
        return operator == "Exists"
    if key != taint.get("key"):
        return False
    if operator == "Exists":
        return True
    return (toleration.get("value") or "") == (taint.get("value") or "")


def toleration_deadline(toleration: dict[str, Any], taint: dict[str, Any]) -> datetime | None:
    """When a matching NoExecute toleration stops tolerating (None: forever)."""
    seconds = toleration.get("tolerationSeconds")
    if seconds is None or taint.get("effect") != "NoExecute":
        return None
    added = taint.get("timeAdded")
    start = parse_time(added) if added else None
    if start is None:
        return None
    return start + timedelta(seconds=max(0, int(seconds)))


def untolerated(
    taints: Iterable[dict[str, Any]],
    tolerations: list[dict[str, Any]],
    effects: tuple[str, ...],
    now: datetime,
    honour_expiry: bool = True,
) -> list[dict[str, Any]]:
    """Taints with one of `effects` that no toleration covers (an expired one does not)."""
    left: list[dict[str, Any]] = []
    for taint in taints:
        if taint.get("effect") not in effects:
            continue
        covered = False
        for tol in tolerations:
            if not toleration_matches(tol, taint):
                continue
            deadline = toleration_deadline(tol, taint)
            if honour_expiry and deadline is not None and deadline <= now:
                continue
            covered = True
            break
        if not covered:
            left.append(taint)
    return left


def rule_selects(rule: dict[str, Any], device_id: DeviceId) -> bool:
    """DeviceTaintRule selector: each set field must match; no selector matches nothing."""
    selector = (rule.get("spec") or {}).get("deviceSelector") or {}
    fields = {k: selector.get(k) for k in ("driver", "pool", "device") if selector.get(k)}
    if not fields:
        return False
    return all(getattr(device_id, k) == v for k, v in fields.items())


def rule_taint(rule: dict[str, Any]) -> dict[str, Any]:
    taint = dict((rule.get("spec") or {}).get("taint") or {})
    if not taint.get("timeAdded"):
        taint["timeAdded"] = (rule.get("metadata") or {}).get("creationTimestamp")
    return taint


# --------------------------------------------------------------------------------------------
# Inventory of published devices
# --------------------------------------------------------------------------------------------


class Inventory:
    """Devices from ResourceSlices, with DeviceTaintRule taints merged in memory.

    Rule taints are never written back to slices, exactly as in Kubernetes: reading a slice
    shows only driver-published taints.
    """

    def __init__(
        self, slices: Iterable[dict[str, Any]], rules: Iterable[dict[str, Any]] = ()
    ) -> None:
        self.devices: dict[DeviceId, Device] = {}
        self.by_node: dict[str | None, list[Device]] = {}
        # Selector results per (device, expression): attributes only change with a new
        # inventory, so a scheduling pass over many pods evaluates each CEL program once.
        self.match_cache: dict[tuple[DeviceId, str], bool] = {}
        for piece in slices:
            spec = piece.get("spec") or {}
            driver = spec.get("driver", "")
            pool = (spec.get("pool") or {}).get("name", "")
            node = spec.get("nodeName") or None
            for raw in spec.get("devices") or []:
                body = raw.get("basic", raw)
                dev_id = DeviceId(driver, pool, raw.get("name", ""))
                try:
                    env = device_env(driver, raw)
                except CelError as err:
                    log.warning("device %s has a malformed attribute: %s", dev_id, err)
                    continue
                device = Device(dev_id, node, raw, env, list(body.get("taints") or []))
                self.devices[dev_id] = device
                self.by_node.setdefault(node, []).append(device)
        self.rules = list(rules)
        for rule in self.rules:
            taint = rule_taint(rule)
            for dev_id, device in self.devices.items():
                if rule_selects(rule, dev_id):
                    device.taints.append(taint)

    def on_node(self, node: str) -> list[Device]:
        """Devices local to `node`, then network-attached ones (`allNodes` slices)."""
        return self.by_node.get(node, []) + self.by_node.get(None, [])

    def get(self, dev_id: DeviceId) -> Device | None:
        return self.devices.get(dev_id)


def allocated_devices(claims: Iterable[dict[str, Any]]) -> set[DeviceId]:
    """Devices held by allocated claims (admin-access results do not hold a device)."""
    busy: set[DeviceId] = set()
    for claim in claims:
        for result in _results(claim):
            if not result.get("adminAccess"):
                busy.add(DeviceId(result["driver"], result["pool"], result["device"]))
    return busy


def _results(claim: dict[str, Any]) -> list[dict[str, Any]]:
    allocation = (claim.get("status") or {}).get("allocation") or {}
    return list((allocation.get("devices") or {}).get("results") or [])


def claim_devices(claim: dict[str, Any]) -> list[tuple[DeviceId, dict[str, Any]]]:
    """(device, result) pairs of an allocated claim."""
    return [
        (DeviceId(r["driver"], r["pool"], r["device"]), r)
        for r in _results(claim)
        if r.get("driver") and r.get("pool") and r.get("device")
    ]


def allocation_node(claim: dict[str, Any]) -> str | None:
    """The node an allocated claim is pinned to (from its nodeSelector), None if any node."""
    allocation = (claim.get("status") or {}).get("allocation") or {}
    for term in (allocation.get("nodeSelector") or {}).get("nodeSelectorTerms") or []:
        for expr in term.get("matchFields") or []:
            if expr.get("key") == "metadata.name" and expr.get("values"):
                return str(expr["values"][0])
    return None


# --------------------------------------------------------------------------------------------
# Requests
# --------------------------------------------------------------------------------------------


@dataclass
class _Sub:
    """One way to satisfy a request: a device class, selectors, count, tolerations."""

    result_name: str  # `req` or `req/sub`
    class_name: str
    selectors: list[dict[str, Any]]
    mode: str
    count: int
    tolerations: list[dict[str, Any]]
    admin: bool


def _sub(result_name: str, body: dict[str, Any]) -> _Sub:
    return _Sub(
        result_name=result_name,
        class_name=body.get("deviceClassName", ""),
        selectors=list(body.get("selectors") or []),
        mode=body.get("allocationMode") or "ExactCount",
        count=int(body.get("count") or 1),
        tolerations=list(body.get("tolerations") or []),
        admin=bool(body.get("adminAccess")),
    )


def request_alternatives(request: dict[str, Any]) -> list[_Sub]:
    """The ways a claim request can be met, in priority order."""
    name = request.get("name", "")
    if request.get("firstAvailable"):
        return [_sub(f"{name}/{s.get('name', '')}", s) for s in request["firstAvailable"]]
    return [_sub(name, request.get("exactly") or request)]


class AllocationError(Exception):
    """The claim cannot be allocated anywhere for a reason other than capacity."""


@dataclass
class Allocator:
    """Finds devices for claims on a node. Build one per scheduling pass."""

    inventory: Inventory
    classes: dict[str, dict[str, Any]]
    busy: set[DeviceId]
    now: datetime
    expired_toleration_bug: bool = False

    def _matches(self, device: Device, selectors: list[dict[str, Any]]) -> bool:
        cache = self.inventory.match_cache
        for selector in selectors:
            expression = (selector.get("cel") or {}).get("expression")
            if not expression:
                continue
            key = (device.id, expression)
            hit = cache.get(key)
            if hit is None:
                try:
                    hit = compile_expr(expression).matches(device.env)
                except (CelError, ValueError) as err:
                    log.info("selector %r on %s: %s", expression, device.id, err)
                    hit = False
                cache[key] = hit
            if not hit:
                return False
        return True

    def _candidates(
        self, sub: _Sub, node: str, taken: set[DeviceId], free_only: bool = True
    ) -> list[Device]:
        device_class = self.classes.get(sub.class_name)
        if device_class is None:
            raise AllocationError(f"device class {sub.class_name} does not exist")
        class_selectors = list((device_class.get("spec") or {}).get("selectors") or [])
        out: list[Device] = []
        for device in self.inventory.on_node(node):
            if free_only and device.id in taken:
                continue
            if free_only and device.id in self.busy and not sub.admin:
                continue
            if untolerated(
                device.taints,
                sub.tolerations,
                BLOCKING_EFFECTS,
                self.now,
                honour_expiry=not self.expired_toleration_bug,
            ):
                continue
            if self._matches(device, class_selectors) and self._matches(device, sub.selectors):
                out.append(device)
        return out

    def allocate(self, claims: list[dict[str, Any]], node: str) -> dict[str, dict[str, Any]] | None:
        """Allocations keyed by claim name for all `claims` on `node`, or None if impossible.

        Raises AllocationError when a claim names a DeviceClass that does not exist.
        """
        plan: list[tuple[str, dict[str, Any], list[_Sub]]] = []
        for claim in claims:
            for request in ((claim.get("spec") or {}).get("devices") or {}).get("requests") or []:
                plan.append((claim["metadata"]["name"], request, request_alternatives(request)))
        chosen: list[tuple[str, _Sub, list[Device]]] = []
        for picks in self._search(plan, 0, node, set(), chosen, claims):
            return self._build(claims, picks, node)
        return None

    def _search(
        self,
        plan: list[tuple[str, dict[str, Any], list[_Sub]]],
        index: int,
        node: str,
        taken: set[DeviceId],
        chosen: list[tuple[str, _Sub, list[Device]]],
        claims: list[dict[str, Any]],
    ) -> Iterator[list[tuple[str, _Sub, list[Device]]]]:
        if index == len(plan):
            if self._constraints_hold(claims, chosen):
                yield list(chosen)
            return
        claim_name, _request, alternatives = plan[index]
        for sub in alternatives:
            candidates = self._candidates(sub, node, taken)
            if sub.mode == "All" and len(candidates) != len(
                self._candidates(sub, node, taken, free_only=False)
            ):
                continue  # All means every matching device, and some are in use
            for devices in _combinations(sub, candidates):
                ids = {d.id for d in devices}
                chosen.append((claim_name, sub, devices))
                if self._constraints_hold(claims, chosen):
                    yield from self._search(plan, index + 1, node, taken | ids, chosen, claims)
                chosen.pop()

    def _constraints_hold(
        self, claims: list[dict[str, Any]], chosen: list[tuple[str, _Sub, list[Device]]]
    ) -> bool:
        for claim in claims:
            name = claim["metadata"]["name"]
            for constraint in ((claim.get("spec") or {}).get("devices") or {}).get(
                "constraints"
            ) or []:
                attribute = constraint.get("matchAttribute")
                if not attribute:
                    continue
                scope = set(constraint.get("requests") or [])
                values = set()
                for claim_name, sub, devices in chosen:
                    base = sub.result_name.split("/")[0]
                    if claim_name != name or (scope and base not in scope):
                        continue
                    for device in devices:
                        value = device.attribute(attribute)
                        if value is None:
                            return False
                        values.add(value)
                if len(values) > 1:
                    return False
        return True

    def _build(
        self,
        claims: list[dict[str, Any]],
        picks: list[tuple[str, _Sub, list[Device]]],
        node: str,
    ) -> dict[str, dict[str, Any]]:
        out: dict[str, dict[str, Any]] = {}
        for claim in claims:
            name = claim["metadata"]["name"]
            results: list[dict[str, Any]] = []
            class_names: dict[str, str] = {}
            for claim_name, sub, devices in picks:
                if claim_name != name:
                    continue
                class_names[sub.result_name] = sub.class_name
                for device in devices:
                    result: dict[str, Any] = {
                        "device": device.id.device,
                        "driver": device.id.driver,
                        "pool": device.id.pool,
                        "request": sub.result_name,
                    }
                    if sub.admin:
                        result["adminAccess"] = True
                    if sub.tolerations:
                        result["tolerations"] = [dict(t) for t in sub.tolerations]
                    results.append(result)
            allocation: dict[str, Any] = {
                "allocationTimestamp": rfc3339(self.now),
                "devices": {"results": results},
                "nodeSelector": {
                    "nodeSelectorTerms": [
                        {
                            "matchFields": [
                                {"key": "metadata.name", "operator": "In", "values": [node]}
                            ]
                        }
                    ]
                },
            }
            config = self._config(claim, class_names)
            if config:
                allocation["devices"]["config"] = config
            out[name] = allocation
        return out

    def _config(self, claim: dict[str, Any], class_names: dict[str, str]) -> list[dict[str, Any]]:
        """Class configuration first (source FromClass), then the claim's (FromClaim)."""
        config: list[dict[str, Any]] = []
        for result_name, class_name in class_names.items():
            for entry in (self.classes.get(class_name, {}).get("spec") or {}).get("config") or []:
                config.append({**entry, "source": "FromClass", "requests": [result_name]})
        for entry in ((claim.get("spec") or {}).get("devices") or {}).get("config") or []:
            config.append({**entry, "source": "FromClaim"})
        return config


def _combinations(sub: _Sub, candidates: list[Device]) -> Iterator[list[Device]]:
    """Device sets that satisfy one sub-request, best first (in publication order)."""
    if sub.mode == "All":
        if candidates:
            yield candidates
        return
    if sub.count <= 0 or len(candidates) < sub.count:
        return
    if sub.count == 1:
        for device in candidates:
            yield [device]
        return
    for combo in combinations(candidates, sub.count):
        yield list(combo)
