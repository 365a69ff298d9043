"""worker/main.py registration: one WORKFLOWS / ACTIVITIES list, nothing a workflow calls missing.

Cases:
- WORKFLOWS holds the remediation, budget, maintenance, rejections, pool-scaler and sweep
  workflows under their constant names;
- with the Kubernetes activities built (on a fake client) every activity any registered
  workflow calls is registered exactly once; build_worker also polls the budget's own queue;
- without the Kubernetes activities, build_worker refuses to start and names the missing
  activities; the remediation's list is derived from its typed calls (cordon-node, called on
  churn, included);
- the Prometheus runtime is only built for a non-zero metrics port, and it serves the SDK
  metrics plus the workflows' sickbay_* counters (remediations by outcome, phases entered).
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
from temporalio.testing import WorkflowEnvironment
from temporalio.worker import FixedSizeSlotSupplier

from contract.failover import (
    NONSTICKY_TO_STICKY_POLLS,
    STICKY_SCHEDULE_TO_START,
    WORKFLOW_TASK_POLLS,
)
from contract.names import (
    ACT_CORDON,
    ACT_QUARANTINE,
    ACT_RESOLVE_DEVICE,
    WF_BUDGET,
    WF_GPU_LEDGER,
    WF_MAINTENANCE,
    WF_NODE_INCIDENT,
    WF_POOL_SCALER,
    WF_REJECTIONS,
    WF_REMEDIATE,
    WF_SWEEP,
    budget_task_queue,
    ledger_task_queue,
)
from worker import main as worker_main
from worker.settings import Settings
from worker.slots import WaitAwareSlots


def test_workflows_registered_by_name() -> None:
    names = [worker_main.workflow_name(w) for w in worker_main.WORKFLOWS]
    assert names == [
        WF_REMEDIATE,
        WF_BUDGET,
        WF_MAINTENANCE,
        WF_REJECTIONS,
        WF_POOL_SCALER,
        WF_SWEEP,
        WF_GPU_LEDGER,
        WF_NODE_INCIDENT,
    ]
    assert len(names) == len(set(names))
    # The worker's map holds the name each workflow is defined with (the SDK's own record).
    for wf in worker_main.WORKFLOWS:
        assert getattr(wf, "__temporal_workflow_definition").name == worker_main.workflow_name(wf)


class _FakeApi:
    def close(self) -> None:
        pass


class _FakeKube:
    api_client = _FakeApi()


def _kube_activities() -> Any:
    from activities.kube import KubeActivities

    return KubeActivities(kube=_FakeKube())  # type: ignore[arg-type]


async def test_every_required_activity_is_registered(
    time_skipping_env: WorkflowEnvironment, tmp_path: Any
) -> None:
    settings = Settings(metrics_port=0, channels_file=None)
    built = worker_main.build_activities(
        time_skipping_env.client, settings, kube_activities=_kube_activities()
    )
    names = [worker_main.activity_name(a) for a in built.activities]
    assert None not in names, "an activity not declared with activities.defn.defn"
    assert len(names) == len(set(names)), "an activity name is registered twice"
    assert worker_main.missing_activities(worker_main.WORKFLOWS, built.activities) == {}
    worker = await worker_main.build_worker(time_skipping_env.client, settings, built=built)
    assert worker.task_queue == settings.task_queue
    # The budget workflow polls its own queue, with the reconcile activity it calls; the GPU
    # ledger its own.
    assert worker.budget.task_queue == budget_task_queue(settings.task_queue)
    assert worker.ledger.task_queue == ledger_task_queue(settings.task_queue)
    # A burst needs a task slot per confirming remediation: the settings, not the SDK's 100.
    # Long waits count apart from the short activities (worker/slots.py).
    config = worker.main.config()
    tuner = config["tuner"]
    workflow_slots = tuner._get_workflow_task_slot_supplier()
    local_slots = tuner._get_local_activity_task_slot_supplier()
    activity_slots = tuner._get_activity_task_slot_supplier()
    assert isinstance(workflow_slots, FixedSizeSlotSupplier)
    assert workflow_slots.num_slots == settings.max_concurrent_workflow_tasks
    assert isinstance(local_slots, FixedSizeSlotSupplier) and local_slots.num_slots == 200
    assert isinstance(activity_slots, WaitAwareSlots)
    assert (activity_slots.regular, activity_slots.waits) == (200, settings.max_open_waits)
    # Half of the remediation worker's pollers serve the shared queue, where new remediations'
    # first tasks and a killed worker's timed-out tasks wait (the SDK keeps one of five there).
    assert config.get("max_concurrent_workflow_task_polls") == WORKFLOW_TASK_POLLS == 8
    assert config.get("nonsticky_to_sticky_poll_ratio") == NONSTICKY_TO_STICKY_POLLS == 1.0
    # A killed worker's sticky tasks move to a live worker in 3 s, not the SDK's 10 s.
    for one in (worker.main, worker.budget, worker.ledger):
        sticky = one.config().get("sticky_queue_schedule_to_start_timeout")
        assert sticky == STICKY_SCHEDULE_TO_START == timedelta(seconds=3)


def test_remediation_requires_every_activity_it_calls(
    time_skipping_env: WorkflowEnvironment,
) -> None:
    """The remediation's required activities come from its typed calls: a worker without
    cordon-node (called when eviction churn is stopped by cordoning) refuses to start."""
    settings = Settings(metrics_port=0, channels_file=None)
    built = worker_main.build_activities(
        time_skipping_env.client, settings, kube_activities=_kube_activities()
    )
    without = [a for a in built.activities if worker_main.activity_name(a) != ACT_CORDON]
    assert len(without) == len(built.activities) - 1
    assert worker_main.missing_activities(worker_main.WORKFLOWS, without) == {
        WF_REMEDIATE: [ACT_CORDON],
        WF_NODE_INCIDENT: [ACT_CORDON],  # its reboot / replace rungs drain like the remediation's
    }


async def test_missing_kube_activities_refuse_to_start(
    time_skipping_env: WorkflowEnvironment,
) -> None:
    settings = Settings(metrics_port=0, channels_file=None)
    kube = _kube_activities()
    built = worker_main.build_activities(time_skipping_env.client, settings, kube_activities=kube)
    # The Kubernetes activity class dropped from the registration: the worker must refuse.
    kube_names = {worker_main.activity_name(a) for a in worker_main.activities_of(kube)}
    built.activities = [
        a for a in built.activities if worker_main.activity_name(a) not in kube_names
    ]
    with pytest.raises(RuntimeError) as err:
        await worker_main.build_worker(time_skipping_env.client, settings, built=built)
    assert WF_REMEDIATE in str(err.value)
    assert ACT_QUARANTINE in str(err.value) and ACT_RESOLVE_DEVICE in str(err.value)


def test_metrics_runtime_only_with_a_port() -> None:
    assert worker_main.metrics_runtime(0) is None


async def test_workflow_metrics_reach_prometheus(time_skipping_env: WorkflowEnvironment) -> None:
    """The worker's runtime exports the SDK metrics and the workflows' sickbay_* metrics."""
    import asyncio
    import socket
    import urllib.request

    from temporalio.client import Client

    from tests.waiting import until
    from tests.workflows.fakes import FakeWorld, new_worker, start, xid_alert
    from worker.converter import DATA_CONVERTER

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    runtime = worker_main.metrics_runtime(port)
    assert runtime is not None
    client = await Client.connect(
        time_skipping_env.client.service_client.config.target_host,
        data_converter=DATA_CONVERTER,
        runtime=runtime,
    )
    world = FakeWorld(health="Healthy")
    async with new_worker(client, world) as worker:
        handle = await start(client, worker, world, alerts=[xid_alert(13, "fp-13")])
        assert (await handle.result()).outcome == "not-quarantined"

    def scrape() -> str:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as resp:
            return resp.read().decode()

    async def exported() -> str:
        text = await asyncio.to_thread(scrape)
        done = "sickbay_remediations_closed" in text and "temporal_workflow_completed" in text
        return text if done else ""

    text = await until(exported, "the closed workflow's metrics exported")
    assert "sickbay_remediations_closed_total{" in text and 'outcome="not-quarantined"' in text
    assert "sickbay_remediation_phase_entered_total" in text
    # The SDK's own metrics, through the same endpoint:
    assert "temporal_request" in text  # the client's calls
    assert "temporal_workflow_completed" in text  # the worker's closed workflows
    # The Prometheus conventions: counters end in _total, durations are _seconds histograms.
    families = {
        line.split()[2]: line.split()[3] for line in text.splitlines() if line.startswith("# TYPE")
    }
    for name, kind in families.items():
        if kind == "counter":
            assert name.endswith("_total"), name
        if kind == "histogram" and name.startswith("sickbay_"):
            assert name.endswith("_seconds"), name


def test_duration_buckets_cover_seconds_to_hours() -> None:
    buckets = worker_main.DURATION_BUCKETS
    assert buckets[0] <= 1 and buckets[-1] >= 4 * 3600
    assert all(a < b for a, b in zip(buckets, buckets[1:], strict=False))
