"""Pod device health (KEP-4680) mapped to the device it is about, whatever the resourceID says.

The 1.36 kubelet writes, per container, `allocatedResourcesStatus[] {name, resources[]
{resourceID, health, message}}` where `name` is `claim:<pod claim name>[/<request>]` and
`resourceID` is the *first CDI device id* the DRA driver returned from NodePrepareResources
(`k8s.gpu.nvidia.com/claim=<claim uid>-gpu-0` for NVIDIA's driver), `<driver>/<pool>/<device>`
only when the driver returned none. So an id is never trusted to be a device key: an entry is
resolved through its name to the pod's ResourceClaim (generated names from
`status.resourceClaimStatuses`, direct ones from `spec.resourceClaims`), then to the
allocation results of that request (`main/sub` results of a `firstAvailable` request count
for `main`), then to the one device among them the resource stands for:

1. the resourceID is one of those devices' `driver/pool/device` key;
2. the request was allocated exactly one device;
3. the id names exactly one of the devices (`…=<uid>-gpu-1`, `…/gpu-1`: the device name at
   the end, after `=`, `-`, `/` or `_`).

Anything else is unresolved with the reason, never guessed: two devices behind one CDI id that
names neither could be a healthy GPU. Device-plugin entries (`name` is the resource,
`nvidia.com/gpu`) are not claims; their id is the plugin's device id (the GPU UUID).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

ClaimLookup = Callable[[str, str], dict[str, Any] | None]
CLAIM_PREFIX = "claim:"


@dataclass(frozen=True)
class EntryDevice:
    """Where one health resource points: a device key, or why it could not be told."""

    device: str | None  # driver/pool/device
    problem: str = ""


def is_claim_entry(name: str) -> bool:
    return name.startswith(CLAIM_PREFIX)


def parse_entry_name(name: str) -> tuple[str, str | None]:
    """`claim:<pod claim>[/<request>]` -> (pod claim name, request or None)."""
    rest = name[len(CLAIM_PREFIX) :] if is_claim_entry(name) else name
    claim, _, request = rest.partition("/")
    return claim, request or None


def claim_of_pod(pod: dict[str, Any], pod_claim: str) -> str | None:
    """The ResourceClaim behind a pod's claim entry (generated names are never derived)."""
    status = pod.get("status") or {}
    for s in status.get("resourceClaimStatuses") or []:
        if s.get("name") == pod_claim and s.get("resourceClaimName"):
            return str(s["resourceClaimName"])
    for ref in (pod.get("spec") or {}).get("resourceClaims") or []:
        if ref.get("name") == pod_claim and ref.get("resourceClaimName"):
            return str(ref["resourceClaimName"])
    return None


def device_key(result: dict[str, Any]) -> str:
    return f"{result.get('driver', '')}/{result.get('pool', '')}/{result.get('device', '')}"


def request_devices(claim: dict[str, Any], request: str | None) -> list[dict[str, Any]]:
    """Allocation results for `request` (all of them without one)."""
    alloc = (claim.get("status") or {}).get("allocation") or {}
    results = (alloc.get("devices") or {}).get("results") or []
    if request is None:
        return list(results)
    return [
        r
        for r in results
        if r.get("request") == request or str(r.get("request", "")).startswith(request + "/")
    ]


def _names_device(resource_id: str, device: str) -> bool:
    if not device or not resource_id.endswith(device):
        return False
    before = resource_id[: -len(device)]
    return before == "" or before[-1] in "=-/_"


def resolve_entry(
    pod: dict[str, Any], entry_name: str, resource_id: str, claims: ClaimLookup
) -> EntryDevice:
    """The device one `allocatedResourcesStatus` resource is about (see the module doc)."""
    namespace = (pod.get("metadata") or {}).get("namespace", "")
    pod_claim, request = parse_entry_name(entry_name)
    claim_name = claim_of_pod(pod, pod_claim)
    if claim_name is None:
        return EntryDevice(None, f"the pod names no ResourceClaim for {entry_name}")
    claim = claims(namespace, claim_name)
    if claim is None:
        return EntryDevice(None, f"ResourceClaim {namespace}/{claim_name} not found")
    results = request_devices(claim, request)
    keys = sorted({device_key(r) for r in results})
    if not keys:
        return EntryDevice(
            None,
            f"ResourceClaim {namespace}/{claim_name} has no allocated device"
            + (f" for request {request}" if request else ""),
        )
    wanted = resource_id.lower()
    exact = [k for k in keys if k.lower() == wanted]
    if exact:
        return EntryDevice(exact[0])
    if len(keys) == 1:
        return EntryDevice(keys[0])
    named = sorted({device_key(r) for r in results if _names_device(resource_id, r["device"])})
    if len(named) == 1:
        return EntryDevice(named[0])
    return EntryDevice(
        None,
        f"{len(keys)} devices allocated to {namespace}/{claim_name} for {entry_name} "
        f"({', '.join(keys)}) and {resource_id!r} does not tell which",
    )


class ClaimIndex:
    """ResourceClaims by (namespace, name), loaded at most once and only when first asked:
    pods whose ids are device keys (or device-plugin ids) never cost a claim list."""

    def __init__(self, load: Callable[[], list[dict[str, Any]]]) -> None:
        self._load = load
        self._index: dict[tuple[str, str], dict[str, Any]] | None = None

    def __call__(self, namespace: str, name: str) -> dict[str, Any] | None:
        if self._index is None:
            self._index = {}
            for claim in self._load():
                m = claim.get("metadata") or {}
                self._index[(m.get("namespace", ""), m.get("name", ""))] = claim
        return self._index.get((namespace, name))
