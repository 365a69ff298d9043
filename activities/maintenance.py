"""Maintenance-drain activities: which physical GPUs a selector names, and waiting for a drain.

- `select-devices`: nodes (by name and labels) -> their ResourceSlice devices, filtered by
  device attributes (`driverVersion=550.54`, compared without the driver's domain prefix,
  case-insensitively), grouped per physical GPU (MIG slices / vGPUs with their parent).
  Device-plugin nodes (no slices) contribute the GPU UUIDs their node annotation lists, when no
  device attribute is asked for.
- `await-remediation-phase`: polls a remediation's `status` query until it reaches one of the
  wanted phases or closes, heartbeating each poll, so the maintenance workflow can keep at most
  N drains in flight.
"""

from __future__ import annotations

import asyncio
from collections import defaultdict
from typing import Any

from temporalio import activity
from temporalio.client import Client, WorkflowExecutionStatus
from temporalio.exceptions import ApplicationError
from temporalio.service import RPCError, RPCStatusCode

from activities.defn import implements
from activities.kube.client import ErrorKind, Kube, KubeError, to_application_error
from activities.kube.devices import list_slice_devices, node_gpu_uuids, node_pool_of
from contract.errors import ERR_INVALID_INPUT
from contract.kube import DraDevice, ResolvedDevice
from contract.maintenance import (
    AWAIT_REMEDIATION_PHASE,
    SELECT_DEVICES,
    AwaitRemediationInput,
    AwaitRemediationResult,
    MaintenanceSelector,
    SelectDevicesInput,
    SelectedDevices,
)
from contract.names import QRY_STATUS
from contract.remediation import RemediationStatus


def _labels(obj: dict[str, Any]) -> dict[str, str]:
    return (obj.get("metadata") or {}).get("labels") or {}


def select(kube: Kube, selector: MaintenanceSelector) -> list[ResolvedDevice]:
    nodes = kube.call(kube.core.list_node, verb="list", resource="nodes").get("items") or []
    chosen = {
        n["metadata"]["name"]: n
        for n in nodes
        if (not selector.nodes or n["metadata"]["name"] in selector.nodes)
        and all(_labels(n).get(k) == v for k, v in selector.node_labels.items())
    }
    unknown = [
        name for name in selector.nodes if name not in {n["metadata"]["name"] for n in nodes}
    ]
    if unknown:
        raise ApplicationError(
            f"maintenance selector names nodes that do not exist: {', '.join(unknown)}",
            type=ERR_INVALID_INPUT,
            non_retryable=True,
        )
    wanted_attrs = {
        k.rsplit("/", 1)[-1].lower(): str(v) for k, v in selector.device_attributes.items()
    }
    groups: dict[tuple[str, str], list[Any]] = defaultdict(list)
    try:
        slice_devices = list_slice_devices(kube, fresh=True)
    except KubeError as err:
        if err.kind != ErrorKind.NOT_FOUND:
            raise
        slice_devices = []  # resource.k8s.io not served: a device-plugin cluster
    for dev in slice_devices:
        node = dev.node or dev.pool
        if node not in chosen:
            continue
        if any(str(dev.attributes.get(k)) != v for k, v in wanted_attrs.items()):
            continue
        if dev.physical_uuid is None:
            continue  # cannot be named canonically; the sweep/alert path handles it
        if selector.driver and dev.driver != selector.driver:
            continue
        groups[(node, dev.physical_uuid)].append(dev)
    out = [
        ResolvedDevice(
            node=node,
            gpu_uuid=uuid,
            gpu_index=next((d.index for d in devs if d.index is not None), None),
            product=next((d.product for d in devs if d.product), None),
            mode="dra",
            devices=[DraDevice(driver=d.driver, pool=d.pool, device=d.device) for d in devs],
            node_pool=node_pool_of(chosen[node]),
        )
        for (node, uuid), devs in sorted(groups.items())
    ]
    if not wanted_attrs and not selector.driver:
        with_slices = {d.node for d in out}
        for name, node in sorted(chosen.items()):
            if name in with_slices:
                continue
            for index, uuid in enumerate(node_gpu_uuids(node)):
                out.append(
                    ResolvedDevice(
                        node=name,
                        gpu_uuid=uuid,
                        gpu_index=index,
                        mode="device-plugin",
                        node_pool=node_pool_of(node),
                    )
                )
    return out


class MaintenanceActivities:
    def __init__(self, kube: Kube, client: Client) -> None:
        self._kube = kube
        self._client = client

    @implements(SELECT_DEVICES)
    async def select_devices(self, req: SelectDevicesInput) -> SelectedDevices:
        try:
            devices = await asyncio.to_thread(select, self._kube, req.selector)
        except KubeError as err:
            raise to_application_error(err) from err
        activity.logger.info("maintenance selector matched %d device(s)", len(devices))
        return SelectedDevices(devices=devices)

    @implements(AWAIT_REMEDIATION_PHASE)
    async def await_remediation_phase(self, req: AwaitRemediationInput) -> AwaitRemediationResult:
        handle = self._client.get_workflow_handle(req.workflow_id)
        wanted = set(req.phases)
        while True:
            try:
                desc = await handle.describe()
            except RPCError as exc:
                if exc.status == RPCStatusCode.NOT_FOUND:
                    return AwaitRemediationResult(workflow_id=req.workflow_id, closed=True)
                raise
            if desc.status != WorkflowExecutionStatus.RUNNING:
                return AwaitRemediationResult(
                    workflow_id=req.workflow_id,
                    closed=True,
                    outcome=desc.status.name.lower() if desc.status else None,
                )
            status = await handle.query(QRY_STATUS, result_type=RemediationStatus)
            if status.phase in wanted:
                return AwaitRemediationResult(workflow_id=req.workflow_id, phase=status.phase)
            activity.heartbeat(status.phase.value)
            await asyncio.sleep(req.poll_interval.total_seconds())
