"""One cluster name (SICKBAY_CLUSTER) scoping every name Sickbay gives things in Temporal.

Cases:
- the unnamed cluster keeps the single-cluster names (`sickbay-gpu-...`, `sickbay-budget`,
  queue `sickbay`, `sickbay-health-sweep`); a named one prefixes every id, the queue, the
  Schedule, the pool scaler and the node notice with `sickbay-<cluster>-`; the DeviceTaintRule
  name (in the GPU's own cluster) never carries it;
- two clusters with the same node and GPU never share a workflow id, budget or queue;
- bad names are refused with the reason: not a DNS label, too long, or starting with a word
  whose ids could equal the unnamed cluster's; `RemediationInput` refuses them too;
- Settings computes the queue once (`<queue>-<cluster>`, idempotent, explicit queues too);
- the webhook's alert mapping puts the cluster into the workflow id;
- the launch activity fills in its worker's cluster and refuses another cluster's launch.
"""

from __future__ import annotations

import pytest
from pydantic import ValidationError
from temporalio.exceptions import ApplicationError
from temporalio.testing import ActivityEnvironment

from activities.launch import LaunchActivities
from contract.kube import DeviceRef
from contract.launch import LaunchRequest
from contract.names import (
    budget_task_queue,
    budget_workflow_id,
    check_cluster_name,
    cluster_task_queue,
    device_workflow_id,
    maintenance_workflow_id,
    node_notice_workflow_id,
    pool_scaler_workflow_id,
    sweep_schedule_id,
    taint_rule_name,
)
from contract.remediation import RemediationInput
from worker.alerts import AlertMapping, AmAlert, MappedAlert, map_alert
from worker.settings import Settings

NODE, GPU = "gpu-node-1", "GPU-0b6b"


def test_the_unnamed_cluster_keeps_the_single_cluster_names() -> None:
    assert device_workflow_id(NODE, GPU) == "sickbay-gpu-gpu-node-1-gpu-0b6b"
    assert budget_workflow_id(cluster_task_queue("sickbay", "")) == "sickbay-budget"
    assert cluster_task_queue("sickbay", "") == "sickbay"
    assert sweep_schedule_id() == "sickbay-health-sweep"
    assert pool_scaler_workflow_id("pool-a", "gke-1") == "sickbay-pool-gke-1-pool-a"
    assert node_notice_workflow_id("n1") == "sickbay-node-gpus-n1"


def test_a_named_cluster_prefixes_every_name_but_the_taint_rule() -> None:
    queue = cluster_task_queue("sickbay", "east")
    assert queue == "sickbay-east"
    assert budget_task_queue(queue) == "sickbay-east-budget"
    assert device_workflow_id(NODE, GPU, "east") == "sickbay-east-gpu-gpu-node-1-gpu-0b6b"
    assert budget_workflow_id(queue, "east") == "sickbay-east-budget"
    assert budget_workflow_id("tests-q-east", "east") == "sickbay-east-budget-tests-q-east"
    assert sweep_schedule_id("east") == "sickbay-east-health-sweep"
    assert pool_scaler_workflow_id("pool-a", "gke-1", "east") == "sickbay-east-pool-gke-1-pool-a"
    assert node_notice_workflow_id("n1", "east") == "sickbay-east-node-gpus-n1"
    assert maintenance_workflow_id("abc", "east") == "sickbay-east-maintenance-abc"
    assert taint_rule_name(NODE, GPU) == "sickbay-gpu-gpu-node-1-gpu-0b6b"
    assert DeviceRef(node=NODE, gpu_uuid=GPU).workflow_id("east") == device_workflow_id(
        NODE, GPU, "east"
    )


def test_two_clusters_with_the_same_gpu_share_nothing() -> None:
    def names(c: str) -> set[str]:
        q = cluster_task_queue("sickbay", c)
        return {
            device_workflow_id(NODE, GPU, c),
            budget_workflow_id(q, c),
            q,
            budget_task_queue(q),
            sweep_schedule_id(c),
            pool_scaler_workflow_id("pool-a", None, c),
        }

    assert names("east").isdisjoint(names("west"))
    assert names("east").isdisjoint(names(""))


@pytest.mark.parametrize(
    ("name", "problem"),
    [
        ("East", "lower-case DNS label"),
        ("east_1", "lower-case DNS label"),
        ("-east", "lower-case DNS label"),
        ("e" * 41, "at most 40"),
        ("gpu", "may not start with"),
        ("gpu-east", "may not start with"),
        ("budget", "may not start with"),
    ],
)
def test_bad_cluster_names_are_refused_with_the_reason(name: str, problem: str) -> None:
    with pytest.raises(ValueError, match=problem):
        check_cluster_name(name)
    with pytest.raises(ValidationError, match=problem):
        Settings(cluster=name)
    with pytest.raises(ValidationError, match=problem):
        RemediationInput(device=DeviceRef(node=NODE, gpu_uuid=GPU), cluster=name)


def test_settings_compute_the_cluster_queue_once() -> None:
    assert Settings().task_queue == "sickbay"
    assert Settings(cluster="east").task_queue == "sickbay-east"
    assert Settings(cluster="east", task_queue="sickbay-east").task_queue == "sickbay-east"
    assert Settings(cluster="east", task_queue="shared").task_queue == "shared-east"


def test_the_webhook_mapping_puts_the_cluster_into_the_workflow_id() -> None:
    raw = {
        "status": "firing",
        "labels": {"alertname": "SickbayGpuXidError", "Hostname": NODE, "UUID": GPU},
        "fingerprint": "fp-1",
        "startsAt": "2026-12-01T10:00:00Z",
    }
    for cluster in ("", "east"):
        got = map_alert(0, AmAlert.model_validate(raw), AlertMapping(cluster=cluster))
        assert isinstance(got, MappedAlert)
        assert got.workflow_id == device_workflow_id(NODE, GPU, cluster)


class _Refusing:
    """A client that must not be called: the refusal happens before any RPC."""

    def __getattr__(self, name: str) -> object:
        raise AssertionError(f"client.{name} called")


async def test_the_launch_activity_refuses_another_clusters_remediation() -> None:
    acts = LaunchActivities(_Refusing(), "sickbay-east", cluster="east")  # type: ignore[arg-type]
    req = LaunchRequest(
        remediation=RemediationInput(device=DeviceRef(node=NODE, gpu_uuid=GPU), cluster="west")
    )
    with pytest.raises(ApplicationError, match="cluster 'west' refused by the worker of cluster"):
        await ActivityEnvironment().run(acts.signal_with_start_remediation, req)
