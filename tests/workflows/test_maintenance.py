"""Maintenance drain: selector -> devices -> one remediation per device, at most N at a time.

Cases:
- the drain workflow launches a `maintenance` remediation (signal-with-start, real
  LaunchActivities) for each selected device, never more than the runbook's maxParallel (2)
  drains at once, and reports every device finished (holding);
- `select()` (the select-devices activity body), with a fake client and over HTTP against
  the cluster twin (1.36 full GPUs and MIG, device-plugin profile), picks devices by node name, node label and
  device attribute from ResourceSlices, groups MIG slices under their physical GPU, adds
  device-plugin GPUs from the node annotation, and refuses unknown node names;
- the await-remediation-phase activity returns on the wanted phase and on a closed run.
"""

from __future__ import annotations

import asyncio
import uuid
from datetime import timedelta
from typing import Any

import pytest
from temporalio import activity
from temporalio.client import Client
from temporalio.exceptions import ApplicationError
from temporalio.testing import WorkflowEnvironment
from temporalio.worker import Worker

from activities.launch import LaunchActivities
from activities.maintenance import select
from contract.kube import ResolvedDevice
from contract.maintenance import (
    AwaitRemediationInput,
    AwaitRemediationResult,
    MaintenanceInput,
    MaintenanceResult,
    MaintenanceSelector,
    SelectDevicesInput,
    SelectedDevices,
)
from contract.names import (
    ACT_AWAIT_REMEDIATION,
    ACT_QUARANTINE,
    ACT_SELECT_DEVICES,
    QRY_STATUS,
    SIG_ABORT,
    WF_MAINTENANCE,
)
from contract.remediation import AbortRequest, Phase, RemediationStatus
from tests.workflows.fakes import FakeWorld
from workflows.budget import BudgetWorkflow
from workflows.maintenance import MaintenanceWorkflow
from workflows.remediation import DeviceRemediationWorkflow


async def test_drain_respects_max_parallel(time_skipping_env: WorkflowEnvironment) -> None:
    client: Client = time_skipping_env.client
    world = FakeWorld(consumers=[])
    queue = f"tq-{uuid.uuid4()}"
    devices = [
        ResolvedDevice(node=world.node, gpu_uuid=f"GPU-{uuid.uuid4()}", node_pool="pool-a")
        for _ in range(3)
    ]
    in_flight = 0
    peak = 0

    @activity.defn(name=ACT_SELECT_DEVICES)
    async def select_devices(req: SelectDevicesInput) -> SelectedDevices:
        assert req.selector.nodes == [world.node]
        return SelectedDevices(devices=devices)

    @activity.defn(name=ACT_AWAIT_REMEDIATION)
    async def await_phase(req: AwaitRemediationInput) -> AwaitRemediationResult:
        nonlocal in_flight, peak
        in_flight += 1
        peak = max(peak, in_flight)
        try:
            handle = client.get_workflow_handle(req.workflow_id)
            # A generous deadline, not a count of polls: queries slow down on a busy machine.
            give_up = asyncio.get_running_loop().time() + 120
            while asyncio.get_running_loop().time() < give_up:
                status = await handle.query(QRY_STATUS, result_type=RemediationStatus)
                if status.phase in req.phases:
                    await asyncio.sleep(0.05)  # hold the slot a moment: overlap shows up
                    return AwaitRemediationResult(workflow_id=req.workflow_id, phase=status.phase)
                await asyncio.sleep(0.02)
            raise AssertionError(f"{req.workflow_id} never drained")
        finally:
            in_flight -= 1

    launch = LaunchActivities(client, queue)
    async with Worker(
        client,
        task_queue=queue,
        workflows=[DeviceRemediationWorkflow, BudgetWorkflow, MaintenanceWorkflow],
        activities=[
            *world.activities(),
            select_devices,
            await_phase,
            launch.signal_with_start_remediation,
        ],
    ):
        # Real time throughout: nothing on this path waits on a durable timer, and a
        # `maintenance` run holds until repaired with no timer at all. With time skipping on,
        # the test server would jump straight to the next timer it knows of whenever nothing
        # ran: the holding runs' default execution timeout (3650 days), so a busy machine
        # (a slow client between the drain's end and the clean-up) saw them time out.
        with time_skipping_env.auto_time_skipping_disabled():
            result = await client.execute_workflow(
                WF_MAINTENANCE,
                MaintenanceInput(
                    selector=MaintenanceSelector(nodes=[world.node]), requested_by="ops"
                ),
                id=f"maint-{uuid.uuid4().hex[:8]}",
                task_queue=queue,
                result_type=MaintenanceResult,
            )
            for launched in result.launched:
                handle = client.get_workflow_handle(launched.workflow_id)
                status = await handle.query(QRY_STATUS, result_type=RemediationStatus)
                assert status.runbook == "maintenance" and status.phase is Phase.HOLDING
                await handle.signal(SIG_ABORT, AbortRequest(reason="test done", actor="t"))
                # Closed before the worker goes: an undo step left running without a worker
                # would hold back time skipping for whatever runs next on this server.
                await asyncio.wait_for(handle.result(), 60)
    assert len(result.devices) == 3 and len(result.launched) == 3
    assert {f.phase.value for f in result.finished if f.phase} == {"holding"}
    assert peak <= 2, f"{peak} drains at once; the maintenance runbook allows 2"
    assert peak == 2
    assert len(world.args(ACT_QUARANTINE)) == 3


class FakeKube:
    """Just enough of activities.kube.client.Kube for select(): list nodes and slices."""

    def __init__(self, nodes: list[dict[str, Any]], slices: list[dict[str, Any]]) -> None:
        self.core = type("Core", (), {"list_node": lambda _s: {"items": nodes}})()
        self.resource_v1 = type("Res", (), {"list_resource_slice": lambda _s: {"items": slices}})()

    def call(self, fn: Any, **_: Any) -> Any:
        return fn()

    def store_cached(self, key: Any, value: Any) -> None:
        pass

    def cached(self, key: Any, ttl: float, load: Any) -> Any:
        return load()


def _node(name: str, labels: dict[str, str] | None = None, uuids: str = "") -> dict[str, Any]:
    meta: dict[str, Any] = {"name": name, "labels": labels or {}}
    if uuids:
        meta["annotations"] = {"sickbay.dev/gpu-uuids": uuids}
    return {"metadata": meta}


def _slice(node: str, devices: list[tuple[str, dict[str, Any]]]) -> dict[str, Any]:
    return {
        "spec": {
            "driver": "gpu.nvidia.com",
            "pool": {"name": node},
            "nodeName": node,
            "devices": [
                {"name": n, "attributes": {k: {"string": v} for k, v in a.items()}}
                for n, a in devices
            ],
        }
    }


def test_select_by_node_label_and_attribute() -> None:
    kube = FakeKube(
        nodes=[
            _node("n1", {"sickbay.dev/node-pool": "a100"}),
            _node("n2", {"sickbay.dev/node-pool": "a100"}),
            _node("n3", {"sickbay.dev/node-pool": "t4"}, uuids="GPU-dp-0,GPU-dp-1"),
        ],
        slices=[
            _slice(
                "n1",
                [
                    ("gpu-0", {"uuid": "GPU-A", "driverVersion": "550"}),
                    (
                        "gpu-0-mig-1",
                        {"uuid": "MIG-1", "parentUUID": "GPU-A", "driverVersion": "550"},
                    ),
                    ("gpu-1", {"uuid": "GPU-B", "driverVersion": "535"}),
                ],
            ),
            _slice("n2", [("gpu-0", {"uuid": "GPU-C", "driverVersion": "550"})]),
        ],
    )
    by_label = select(
        kube,
        MaintenanceSelector(
            node_labels={"sickbay.dev/node-pool": "a100"},
            device_attributes={"gpu.nvidia.com/driverVersion": "550"},
        ),
    )
    assert [(d.node, d.gpu_uuid) for d in by_label] == [("n1", "GPU-A"), ("n2", "GPU-C")]
    assert {x.device for x in by_label[0].devices} == {"gpu-0", "gpu-0-mig-1"}
    assert by_label[0].node_pool == "a100"
    plugin = select(kube, MaintenanceSelector(nodes=["n3"]))
    assert [(d.gpu_uuid, d.mode, d.gpu_index) for d in plugin] == [
        ("GPU-dp-0", "device-plugin", 0),
        ("GPU-dp-1", "device-plugin", 1),
    ]
    with pytest.raises(ApplicationError, match="do not exist: nope"):
        select(kube, MaintenanceSelector(nodes=["nope"]))


@pytest.mark.parametrize("topology", ["full", "mig"])
def test_select_against_the_twin(tmp_path: Any, topology: str) -> None:
    """select-devices' body over real HTTP against the cluster twin (profile 1.36)."""
    from activities.kube.client import Kube, KubeSettings
    from twin.seed import DRIVER_VERSION, gpu_uuid
    from twin.testing import running_twin

    with running_twin(tmp_path, profile="1.36", nodes=2, gpus_per_node=2, topology=topology) as rs:
        kube = Kube.from_settings(KubeSettings(kubeconfig=str(rs.kubeconfig_path)))
        node = "gpu-pool-node-1"
        picked = select(kube, MaintenanceSelector(nodes=[node]))
        by_attr = select(
            kube,
            MaintenanceSelector(
                node_labels={"sickbay.dev/node-pool": "gpu-pool"},
                device_attributes={"driverVersion": DRIVER_VERSION},
            ),
        )
        none = select(
            kube,
            MaintenanceSelector(
                device_attributes={"driverVersion": "1.0"},
                node_labels={"sickbay.dev/node-pool": "gpu-pool"},
            ),
        )
    assert [(d.node, d.gpu_uuid) for d in picked] == sorted(
        (node, gpu_uuid(node, i)) for i in range(2)
    )
    assert len(by_attr) == 4 and none == []
    if topology == "mig":
        assert all(len(d.devices) == 2 for d in picked)  # both MIG slices of each GPU


def test_select_device_plugin_twin(tmp_path: Any) -> None:
    from activities.kube.client import Kube, KubeSettings
    from twin.seed import gpu_uuid
    from twin.testing import running_twin

    with running_twin(tmp_path, profile="device-plugin", nodes=1, gpus_per_node=2) as rs:
        kube = Kube.from_settings(KubeSettings(kubeconfig=str(rs.kubeconfig_path)))
        picked = select(kube, MaintenanceSelector(nodes=["gpu-pool-node-0"]))
    assert [(d.gpu_uuid, d.mode) for d in picked] == [
        (gpu_uuid("gpu-pool-node-0", i), "device-plugin") for i in range(2)
    ]


async def test_await_remediation_phase_activity(time_skipping_env: WorkflowEnvironment) -> None:
    """The real await-remediation-phase activity against a running and a closed remediation."""
    from temporalio.testing import ActivityEnvironment

    from activities.maintenance import MaintenanceActivities
    from tests.workflows.fakes import new_worker, start

    client = time_skipping_env.client
    world = FakeWorld()
    acts = MaintenanceActivities(None, client)  # type: ignore[arg-type]  # no Kubernetes needed
    env = ActivityEnvironment()
    async with new_worker(client, world) as worker:
        handle = await start(client, worker, world)
        drained = await env.run(
            acts.await_remediation_phase,
            AwaitRemediationInput(
                workflow_id=handle.id, phases=[Phase.HOLDING], poll_interval=timedelta(seconds=0.05)
            ),
        )
        await handle.signal(SIG_ABORT, AbortRequest(reason="test done", actor="t"))
        await handle.result()
        closed = await env.run(
            acts.await_remediation_phase,
            AwaitRemediationInput(workflow_id=handle.id, phases=[Phase.HOLDING]),
        )
    assert drained.phase is Phase.HOLDING and not drained.closed
    assert closed.closed and closed.outcome == "completed"
