"""The health sweep against the twin with its controllers running (scheduler, kubelet stand-in,
fault injection), on the Temporal dev server with the real activities.

Cases:
- a Deployment's pod gets a GPU; the twin kills that GPU (Xid 79) and its kubelet reports the
  pod's device Unhealthy; another GPU of the node vanishes from the ResourceSlice. One sweep
  starts exactly one remediation, for the killed GPU, and one node incident for the node
  short of a GPU (no notice, no remediation for the vanished GPU); a second sweep only
  signals the same two workflows;
- the MIG manager repartitioning the node (`nvidia.com/mig.config.state=pending`) while a GPU
  is gone from its ResourceSlice: one sweep starts the node incident with `planned` naming
  the work (the incident waits for it, bounded), and notifies nobody.
"""

from __future__ import annotations

import asyncio
import dataclasses
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client as k8s
from temporalio import activity
from temporalio.testing import WorkflowEnvironment
from temporalio.worker import Worker

from activities.kube.client import Kube, KubeSettings
from activities.launch import LaunchActivities
from activities.node_launch import NodeLaunchActivities
from activities.sweep import SweepActivities
from contract.names import ACT_NOTIFY, device_workflow_id, node_workflow_id
from contract.node_incident import NodeIncidentInput
from contract.notify import NotifyInput, NotifyResult
from contract.sweep import SweepInput, SweepResult
from tests.webhook.helpers import count_runs, history_counts
from twin.clock import Clock
from twin.controllers.manager import ControllerManager, TwinOptions
from twin.testing import RunningTwin, start_twin
from workflows.sweep import HealthSweepWorkflow

pytestmark = pytest.mark.devserver  # the session's Temporal dev server (dev_env)

DRIVER = "gpu.nvidia.com"
TIME_SCALE = 200.0  # simulated seconds per real second: container starts take milliseconds


@pytest.fixture
def twin(tmp_path: Path) -> Iterator[tuple[RunningTwin, ControllerManager]]:
    manager = ControllerManager(TwinOptions())
    rs = start_twin(
        tmp_path,
        profile="1.36",
        nodes=1,
        gpus_per_node=2,
        node_prefix=f"twin-{uuid.uuid4().hex[:6]}-",
        clock=Clock(time_scale=TIME_SCALE),
        controllers=(manager,),
    )
    try:
        yield rs, manager
    finally:
        rs.stop()


def deploy_trainer(api: Any) -> None:
    core, apps, dra = k8s.CoreV1Api(api), k8s.AppsV1Api(api), k8s.ResourceV1Api(api)
    core.create_namespace({"metadata": {"name": "ml"}})
    dra.create_namespaced_resource_claim_template(
        "ml",
        {
            "metadata": {"name": "one-gpu"},
            "spec": {
                "spec": {
                    "devices": {
                        "requests": [{"name": "gpu", "exactly": {"deviceClassName": DRIVER}}]
                    }
                }
            },
        },
    )
    labels = {"app": "trainer"}
    apps.create_namespaced_deployment(
        "ml",
        {
            "metadata": {"name": "trainer"},
            "spec": {
                "replicas": 1,
                "selector": {"matchLabels": labels},
                "template": {
                    "metadata": {"labels": labels},
                    "spec": {
                        "containers": [
                            {
                                "name": "main",
                                "image": "registry.invalid/trainer:1",
                                "resources": {"claims": [{"name": "gpu"}]},
                            }
                        ],
                        "resourceClaims": [{"name": "gpu", "resourceClaimTemplateName": "one-gpu"}],
                    },
                },
            },
        },
    )


async def wait_for(check: Any, within: float = 15.0) -> Any:
    deadline = time.monotonic() + within
    while True:
        result = await asyncio.to_thread(check)
        if result:
            return result
        if time.monotonic() > deadline:
            raise AssertionError(f"{check.__name__} not reached within {within}s")
        await asyncio.sleep(0.05)


@dataclasses.dataclass
class Swept:
    results: list[SweepResult]
    notices: list[NotifyInput]
    device_queue: str  # where the sweeps started remediations and node incidents


async def sweep_times(rs: RunningTwin, env: WorkflowEnvironment, times: int) -> Swept:
    """Run the health-sweep workflow `times` in a row with the real sweep and launch
    activities against the twin; notices are recorded, not sent."""
    client = env.client
    notices: list[NotifyInput] = []

    @activity.defn(name=ACT_NOTIFY)
    async def notify(req: NotifyInput) -> NotifyResult:
        notices.append(req)
        return NotifyResult(channel=req.channel, delivered=True)

    sweep_queue = f"twin-sweep-{uuid.uuid4().hex[:8]}"
    device_queue = f"twin-devices-{uuid.uuid4().hex[:8]}"
    kube = Kube.from_settings(KubeSettings(kubeconfig=str(rs.kubeconfig_path)))
    results: list[SweepResult] = []
    async with Worker(
        client,
        task_queue=sweep_queue,
        workflows=[HealthSweepWorkflow],
        activities=[
            SweepActivities(kube).sweep_cluster,
            LaunchActivities(client, device_queue).signal_with_start_remediation,
            NodeLaunchActivities(client, device_queue).signal_with_start_node_incident,
            notify,
        ],
    ):
        for i in range(times):
            results.append(
                await client.execute_workflow(
                    HealthSweepWorkflow.run,
                    SweepInput(task_queue=device_queue, notify_channels=["ops"]),
                    id=f"twin-sweep-{uuid.uuid4().hex[:8]}-{i}",
                    task_queue=sweep_queue,
                    result_type=SweepResult,
                )
            )
    return Swept(results, notices, device_queue)


async def test_twin_fault_to_one_remediation(
    twin: tuple[RunningTwin, ControllerManager], dev_env: WorkflowEnvironment
) -> None:
    rs, manager = twin
    api = rs.api_client()
    core = k8s.CoreV1Api(api)
    (node,) = rs.twin.seed_info["nodes"]
    deploy_trainer(api)

    def allocated() -> str | None:
        for pod in core.list_namespaced_pod("ml").items:
            if pod.status.phase == "Running" and pod.status.resource_claim_statuses:
                claim = k8s.ResourceV1Api(api).read_namespaced_resource_claim(
                    pod.status.resource_claim_statuses[0].resource_claim_name, "ml"
                )
                return claim.status.allocation.devices.results[0].device
        return None

    device = await wait_for(allocated)  # e.g. "gpu-1"
    index = int(device.rsplit("-", 1)[1])
    other = 1 - index
    gpus = {g.index: g for g in manager.faults.gpus(node)}
    killed_uuid = gpus[index].uuid
    manager.faults.fail(node, str(index), xid=79)
    manager.faults.fail(node, str(other), vanish=True)

    def unhealthy_reported() -> bool:
        for pod in core.list_namespaced_pod("ml").items:
            for cs in pod.status.container_statuses or []:
                for entry in cs.allocated_resources_status or []:
                    if any(r.health == "Unhealthy" for r in entry.resources or []):
                        return True
        return False

    await wait_for(unhealthy_reported)
    swept = await sweep_times(rs, dev_env, 2)
    client, results, notices = dev_env.client, swept.results, swept.notices
    device_queue = swept.device_queue
    wid = device_workflow_id(node, killed_uuid)
    first, second = results
    assert first.started == [wid] and first.signalled == []
    assert second.started == [] and second.signalled == [wid]
    node_wid = node_workflow_id(node)
    assert first.node_incidents == [node_wid] and second.node_incidents == [node_wid]
    assert first.notified_nodes == [] and notices == []
    assert await count_runs(client, f"TaskQueue = '{device_queue}'", expect=2) == 2
    counts = await history_counts(client, wid)
    assert counts == {"started": 1, "signaled": 2}
    assert await history_counts(client, node_wid) == {"started": 1, "signaled": 2}
    await client.get_workflow_handle(wid).terminate("test done")
    await client.get_workflow_handle(node_wid).terminate("test done")


async def test_a_vanish_under_a_mig_repartition_starts_the_incident_naming_it(
    twin: tuple[RunningTwin, ControllerManager], dev_env: WorkflowEnvironment
) -> None:
    """The MIG manager repartitions the node (`nvidia.com/mig.config.state=pending`) and a GPU
    is gone from its ResourceSlice meanwhile: the sweep starts the node incident (which waits
    for the planned work, bounded) with `planned` naming it, and notifies nobody."""
    rs, manager = twin
    core = k8s.CoreV1Api(rs.api_client())
    (node,) = rs.twin.seed_info["nodes"]
    core.patch_node(node, {"metadata": {"labels": {"nvidia.com/mig.config.state": "pending"}}})
    manager.faults.fail(node, "1", vanish=True)

    def one_gpu_published() -> bool:
        devices = k8s.ResourceV1Api(rs.api_client()).list_resource_slice().items
        return sum(len(s.spec.devices or []) for s in devices if s.spec.node_name == node) == 1

    await wait_for(one_gpu_published)
    swept = await sweep_times(rs, dev_env, 1)
    client, [result], notices = dev_env.client, swept.results, swept.notices
    node_wid = node_workflow_id(node)
    assert result.node_incidents == [node_wid] and result.started == []
    assert result.notified_nodes == [] and notices == []
    history = await client.get_workflow_handle(node_wid).fetch_history()
    [payload] = history.events[0].workflow_execution_started_event_attributes.input.payloads
    started = NodeIncidentInput.model_validate_json(payload.data)
    assert started.trigger == "sweep" and started.planned == (
        "the MIG manager is repartitioning its GPUs (nvidia.com/mig.config.state=pending)"
    )
    assert started.planned in started.reason
    await client.get_workflow_handle(node_wid).terminate("test done")
