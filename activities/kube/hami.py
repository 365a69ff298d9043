"""HAMi (Project-HAMi vGPU sharing): which pod holds which physical GPU, each GPU's health as
HAMi's device plugin registers it, and HAMi's per-GPU cordon, all read from (or written to)
the annotations HAMi itself uses.

A device-plugin cluster cannot say which GPU a pod holds; HAMi can, because its scheduler
records the choice on the pod and its device plugin registers every GPU on the node:

- pod `hami.io/vgpu-devices-allocated` (written by the scheduler with the same value as
  `hami.io/vgpu-devices-to-allocate`, which the device plugin then empties container by
  container): one segment per container, each ending in `;`; in a segment one entry per GPU,
  each ending in `:`, an entry being `UUID,vendor,memory MB,core share`. A MIG placement of
  HAMi up to v2.9 appends `[template-slot]` to the UUID. Unchanged since HAMi v2.3.
- node `hami.io/node-nvidia-register`, rewritten by the device plugin about every 30 s:
  HAMi v2.3-v2.4 `UUID,count,memory,cores,type,numa,healthy:` per GPU (7 fields),
  v2.5-v2.7 the same plus `,index,mode` (9 fields), v2.8 and later a JSON list of objects
  (`id`, `count`, `devmem`, `devcore`, `type`, `numa`, `health`, `index`, `mode`, ...)
  written with Go's `omitempty`, so an unhealthy GPU has no `health` key at all.
- node `hami.io/device-cordon` (HAMi v2.10 and later): comma-separated GPU UUIDs the scheduler
  places no new share on; the device plugin never writes it, so it survives re-registration.

Volcano's vGPU (its deviceshare plugin with the HAMi-core `volcano-vgpu-device-plugin`) writes
the same placement encoding under `volcano.sh/vgpu-ids-new` (containers joined by `;`, the last
one unterminated) and registers `volcano.sh/node-vgpu-register`: `UUID,count,memory,type,
healthy` per GPU, later `,mode` added; it has no per-GPU cordon.

HAMi before v2.3 (the `4pd.io/` annotations of k8s-vGPU-scheduler) is recognised and refused.
Anything that does not parse exactly raises `HamiFormatError` naming the object, the
annotation and what is wrong: Sickbay never guesses which GPU a pod holds.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from temporalio.exceptions import ApplicationError

from contract.errors import ERR_HAMI_UNREADABLE

ANN_ALLOCATED = "hami.io/vgpu-devices-allocated"
ANN_TO_ALLOCATE = "hami.io/vgpu-devices-to-allocate"
ANN_ASSIGNED_NODE = "hami.io/vgpu-node"
ANN_ASSIGNED_TIME = "hami.io/vgpu-time"
ANN_BIND_PHASE = "hami.io/bind-phase"
ANN_BIND_TIME = "hami.io/bind-time"
ANN_REGISTER = "hami.io/node-nvidia-register"
ANN_DEVICE_CORDON = "hami.io/device-cordon"
# Per-pod steering (HAMi v2.3+): only GPUs listed / never GPUs listed.
ANN_USE_UUID = "nvidia.com/use-gpuuuid"
ANN_NOUSE_UUID = "nvidia.com/nouse-gpuuuid"
# Sickbay's record of the UUIDs *it* added to hami.io/device-cordon on a node: release takes
# out only those (a UUID an administrator cordoned stays cordoned).
ANN_SICKBAY_CORDONED = "sickbay.dev/hami-cordoned-gpus"
# Volcano's vGPU (deviceshare plugin + the HAMi-core volcano-vgpu-device-plugin): the same
# placement encoding under its own key, and its own registration.
VOLCANO_ALLOCATED = "volcano.sh/vgpu-ids-new"
VOLCANO_REGISTER = "volcano.sh/node-vgpu-register"
# k8s-vGPU-scheduler, HAMi's name before v2.3: placements under these keys are refused.
LEGACY_PREFIX = "4pd.io/"

FORMAT_JSON = "v2.8+ JSON"
FORMAT_NINE = "v2.5-v2.7 (9 fields)"
FORMAT_SEVEN = "v2.3-v2.4 (7 fields)"

_MIG_SUFFIX = re.compile(r"\[\d+-\d+\]$")
# Go's strconv.ParseBool, which HAMi's decoder uses for the healthy field.
_BOOLS = {
    "1": True,
    "t": True,
    "T": True,
    "TRUE": True,
    "true": True,
    "True": True,
    "0": False,
    "f": False,
    "F": False,
    "FALSE": False,
    "false": False,
    "False": False,
}


class HamiFormatError(ValueError):
    """A HAMi annotation Sickbay cannot read exactly."""

    def application_error(self) -> ApplicationError:
        """Non-retryable: reading it again gives the same text (the remediation escalates
        naming the object and annotation instead of acting on a guess)."""
        return ApplicationError(
            f"HAMi annotation unreadable, not acting on a guess: {self}",
            type=ERR_HAMI_UNREADABLE,
            non_retryable=True,
        )


@dataclass(frozen=True)
class HamiShare:
    """One GPU share of one container, as HAMi's scheduler recorded it."""

    container: int  # position of the container's segment in the annotation
    uuid: str  # the physical GPU (a MIG suffix removed)
    device_id: str  # as written (with a MIG `[t-s]` suffix when there is one)
    vendor: str
    memory_mb: int
    cores: int


@dataclass(frozen=True)
class HamiGpu:
    """One GPU as HAMi's device plugin registered it on the node."""

    uuid: str
    count: int  # shares it may be split into
    memory_mb: int
    cores: int | None  # percent; None where the format has no such field (Volcano)
    type: str
    numa: int
    healthy: bool
    index: int | None = None  # v2.5 and later
    mode: str | None = None  # hami-core | mig | mps (v2.5 and later)


def _int(text: str, what: str, where: str) -> int:
    try:
        value = int(text.strip())
    except ValueError:
        raise HamiFormatError(f"{where}: {what} {text!r} is not an integer") from None
    if value < 0:
        raise HamiFormatError(f"{where}: {what} {value} is negative")
    return value


def physical_uuid(device_id: str, where: str = "") -> str:
    """The GPU a HAMi device id names: the id itself, or the part before a MIG `[t-s]`."""
    if "[" not in device_id:
        return device_id
    if not _MIG_SUFFIX.search(device_id):
        raise HamiFormatError(f"{where}: device id {device_id!r} has a malformed MIG suffix")
    return device_id[: device_id.index("[")]


def parse_allocation(
    value: str, where: str = ANN_ALLOCATED, *, terminated: bool = True
) -> list[HamiShare]:
    """Every share in a `hami.io/vgpu-devices-allocated` (or `-to-allocate`) value; with
    `terminated` False a Volcano `volcano.sh/vgpu-ids-new` (containers joined by `;`, the last
    one unterminated)."""
    shares: list[HamiShare] = []
    if not value.strip():
        return shares
    if terminated and ";" not in value:
        raise HamiFormatError(f"{where}: no container separator ';' in {value!r}")
    for container, segment in enumerate(value.split(";")):
        for entry in segment.split(":"):
            if not entry.strip():
                continue  # every device ends in ':'; an empty container is kept in place
            fields = entry.split(",")
            if len(fields) != 4:
                raise HamiFormatError(
                    f"{where}: device entry {entry!r} has {len(fields)} fields, HAMi writes 4 "
                    "(UUID,vendor,memory,cores)"
                )
            device_id, vendor = fields[0].strip(), fields[1].strip()
            if not device_id or not vendor:
                raise HamiFormatError(f"{where}: device entry {entry!r} lacks a UUID or vendor")
            shares.append(
                HamiShare(
                    container=container,
                    uuid=physical_uuid(device_id, where),
                    device_id=device_id,
                    vendor=vendor,
                    memory_mb=_int(fields[2], "memory", where),
                    cores=_int(fields[3], "core share", where),
                )
            )
    return shares


def _json_register(value: str, where: str) -> list[HamiGpu]:
    try:
        data = json.loads(value)
    except ValueError as err:
        raise HamiFormatError(f"{where}: not valid JSON ({err})") from None
    if data is None:
        return []
    if not isinstance(data, list):
        raise HamiFormatError(f"{where}: JSON is a {type(data).__name__}, not a list of GPUs")
    gpus: list[HamiGpu] = []
    for i, item in enumerate(data):
        if not isinstance(item, dict):
            raise HamiFormatError(f"{where}: entry {i} is not an object")
        uuid = item.get("id")
        if not isinstance(uuid, str) or not uuid:
            raise HamiFormatError(f"{where}: entry {i} has no GPU id")

        def number(key: str, item: dict[str, Any] = item, i: int = i) -> int:
            raw = item.get(key, 0)  # omitempty: a zero is left out
            if isinstance(raw, bool) or not isinstance(raw, int) or raw < 0:
                raise HamiFormatError(f"{where}: entry {i} field {key} is {raw!r}")
            return raw

        health = item.get("health", False)  # omitempty: an unhealthy GPU has no key
        if not isinstance(health, bool):
            raise HamiFormatError(f"{where}: entry {i} health is {health!r}, not a boolean")
        for key in ("type", "mode"):
            if not isinstance(item.get(key, ""), str):
                raise HamiFormatError(f"{where}: entry {i} field {key} is not a string")
        gpus.append(
            HamiGpu(
                uuid=uuid,
                count=number("count"),
                memory_mb=number("devmem"),
                cores=number("devcore"),
                type=str(item.get("type", "")),
                numa=number("numa"),
                healthy=health,
                index=number("index"),
                mode=str(item.get("mode") or "hami-core"),
            )
        )
    return gpus


def parse_register(value: str, where: str = ANN_REGISTER) -> tuple[str, list[HamiGpu]]:
    """(format, GPUs) of a `hami.io/node-nvidia-register` value, any format HAMi wrote."""
    text = value.strip()
    if text.startswith(("[", "{")):
        return FORMAT_JSON, _json_register(text, where)
    if ":" not in text:
        raise HamiFormatError(
            f"{where}: {value!r} is neither HAMi's JSON list nor its ':'-separated GPU list"
        )
    gpus: list[HamiGpu] = []
    formats: set[str] = set()
    for segment in text.split(":"):
        if not segment.strip():
            continue
        fields = segment.split(",")
        if len(fields) not in (7, 9):
            raise HamiFormatError(
                f"{where}: GPU entry {segment!r} has {len(fields)} fields; HAMi v2.3-v2.4 "
                "writes 7, v2.5-v2.7 writes 9"
            )
        healthy = _BOOLS.get(fields[6].strip())
        if healthy is None:
            raise HamiFormatError(f"{where}: healthy field {fields[6]!r} is not a boolean")
        uuid = fields[0].strip()
        if not uuid:
            raise HamiFormatError(f"{where}: GPU entry {segment!r} has no UUID")
        formats.add(FORMAT_NINE if len(fields) == 9 else FORMAT_SEVEN)
        gpus.append(
            HamiGpu(
                uuid=uuid,
                count=_int(fields[1], "count", where),
                memory_mb=_int(fields[2], "memory", where),
                cores=_int(fields[3], "cores", where),
                type=fields[4].strip(),
                numa=_int(fields[5], "numa", where),
                healthy=healthy,
                index=_int(fields[7], "index", where) if len(fields) == 9 else None,
                mode=fields[8].strip() if len(fields) == 9 else None,
            )
        )
    if len(formats) > 1:
        raise HamiFormatError(f"{where}: mixes 7- and 9-field GPU entries")
    return (formats.pop() if formats else FORMAT_NINE), gpus


def parse_volcano_register(value: str, where: str = VOLCANO_REGISTER) -> list[HamiGpu]:
    """The GPUs of a `volcano.sh/node-vgpu-register` value (Volcano's vGPU device plugin,
    HAMi-core): `UUID,count,memory,type,healthy` (5 fields), later with `,mode` (6)."""
    text = value.strip()
    if text.startswith(("[", "{")):
        return _json_register(text, where)
    if ":" not in text:
        raise HamiFormatError(f"{where}: {value!r} is not a ':'-separated GPU list")
    gpus: list[HamiGpu] = []
    for segment in text.split(":"):
        if not segment.strip():
            continue
        fields = segment.split(",")
        if len(fields) not in (5, 6):
            raise HamiFormatError(
                f"{where}: GPU entry {segment!r} has {len(fields)} fields; Volcano's vGPU "
                "plugin writes 5 or 6"
            )
        healthy = _BOOLS.get(fields[4].strip())
        if healthy is None:
            raise HamiFormatError(f"{where}: healthy field {fields[4]!r} is not a boolean")
        if not fields[0].strip():
            raise HamiFormatError(f"{where}: GPU entry {segment!r} has no UUID")
        gpus.append(
            HamiGpu(
                uuid=fields[0].strip(),
                count=_int(fields[1], "count", where),
                memory_mb=_int(fields[2], "memory", where),
                cores=None,
                type=fields[3].strip(),
                numa=0,
                healthy=healthy,
                mode=fields[5].strip() if len(fields) == 6 else None,
            )
        )
    return gpus


def is_share_of(device_id: str, uuid: str) -> bool:
    """A kubelet device id of HAMi's plugin (`<UUID>-<i>`, one per share) of this GPU."""
    head, _, tail = device_id.rpartition("-")
    return device_id.lower() == uuid.lower() or (head.lower() == uuid.lower() and tail.isdigit())


def _meta(obj: dict[str, Any]) -> dict[str, Any]:
    return obj.get("metadata") or {}


def _annotations(obj: dict[str, Any]) -> dict[str, str]:
    return _meta(obj).get("annotations") or {}


def _name(obj: dict[str, Any]) -> str:
    m = _meta(obj)
    return f"{m['namespace']}/{m.get('name', '')}" if m.get("namespace") else m.get("name", "")


def pod_shares(pod: dict[str, Any]) -> list[HamiShare] | None:
    """The GPU shares HAMi recorded for a pod; None when HAMi placed nothing on it.
    `HamiFormatError` for a record Sickbay cannot read, or one of HAMi before v2.3."""
    annotations = _annotations(pod)
    value = annotations.get(ANN_ALLOCATED)
    if value is None and VOLCANO_ALLOCATED in annotations:
        where = f"pod {_name(pod)} annotation {VOLCANO_ALLOCATED}"
        return parse_allocation(annotations[VOLCANO_ALLOCATED], where, terminated=False)
    if value is None:
        legacy = sorted(k for k in annotations if k.startswith(LEGACY_PREFIX + "vgpu-ids"))
        if legacy:
            raise HamiFormatError(
                f"pod {_name(pod)}: {legacy[0]} is the placement record of HAMi before v2.3 "
                "(k8s-vGPU-scheduler), which Sickbay does not read; upgrade HAMi"
            )
        return None
    return parse_allocation(value, f"pod {_name(pod)} annotation {ANN_ALLOCATED}")


def pod_gpu_uuids(pod: dict[str, Any]) -> set[str] | None:
    shares = pod_shares(pod)
    return None if shares is None else {s.uuid.lower() for s in shares}


def is_hami_node(node: dict[str, Any]) -> bool:
    """HAMi's device plugin (or Volcano's HAMi-core vGPU plugin) registers the node's GPUs."""
    annotations = _annotations(node)
    return ANN_REGISTER in annotations or VOLCANO_REGISTER in annotations


def is_volcano_node(node: dict[str, Any]) -> bool:
    """Volcano's vGPU plugin, not HAMi's, registers the node: its scheduler (Volcano's
    deviceshare) reads neither `hami.io/device-cordon` nor any other per-GPU exclusion."""
    annotations = _annotations(node)
    return VOLCANO_REGISTER in annotations and ANN_REGISTER not in annotations


def register_key(node: dict[str, Any]) -> str:
    """The annotation the node's GPUs are registered under (HAMi's, else Volcano's)."""
    return VOLCANO_REGISTER if is_volcano_node(node) else ANN_REGISTER


def node_gpus(node: dict[str, Any]) -> list[HamiGpu] | None:
    """The GPUs HAMi's device plugin registered on a node; None when it registers none."""
    annotations = _annotations(node)
    value = annotations.get(ANN_REGISTER)
    if value is None and VOLCANO_REGISTER in annotations:
        where = f"node {_name(node)} annotation {VOLCANO_REGISTER}"
        return parse_volcano_register(annotations[VOLCANO_REGISTER], where)
    if value is None:
        return None
    return parse_register(value, f"node {_name(node)} annotation {ANN_REGISTER}")[1]


def registered(node: dict[str, Any], uuid: str) -> HamiGpu | None:
    want = uuid.lower()
    return next((g for g in node_gpus(node) or [] if g.uuid.lower() == want), None)


def _uuid_list(raw: str | None) -> list[str]:
    return [u.strip() for u in (raw or "").split(",") if u.strip()]


def cordoned(node: dict[str, Any]) -> list[str]:
    """UUIDs in the node's `hami.io/device-cordon` (by anyone)."""
    return _uuid_list(_annotations(node).get(ANN_DEVICE_CORDON))


def cordoned_by_sickbay(node: dict[str, Any]) -> list[str]:
    return _uuid_list(_annotations(node).get(ANN_SICKBAY_CORDONED))


def cordon_change(uuid: str) -> Callable[[dict[str, Any]], dict[str, Any] | None]:
    """A node change (activities/kube/nodes.converge_node) adding `uuid` to HAMi's device
    cordon; recorded as Sickbay's only when it was not cordoned already."""

    def change(node: dict[str, Any]) -> dict[str, Any] | None:
        current = cordoned(node)
        if uuid in current:
            return None
        ours = cordoned_by_sickbay(node)
        return {
            "metadata": {
                "annotations": {
                    ANN_DEVICE_CORDON: ",".join([*current, uuid]),
                    ANN_SICKBAY_CORDONED: ",".join([*ours, uuid]),
                }
            }
        }

    return change


def uncordon_change(uuid: str) -> Callable[[dict[str, Any]], dict[str, Any] | None]:
    """Take `uuid` out of HAMi's device cordon only if Sickbay put it there."""

    def change(node: dict[str, Any]) -> dict[str, Any] | None:
        ours = cordoned_by_sickbay(node)
        if uuid not in ours:
            return None
        remaining = [u for u in cordoned(node) if u != uuid]
        left = [u for u in ours if u != uuid]
        return {
            "metadata": {
                "annotations": {
                    ANN_DEVICE_CORDON: ",".join(remaining) or None,
                    ANN_SICKBAY_CORDONED: ",".join(left) or None,
                }
            }
        }

    return change
