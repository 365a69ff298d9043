"""`sickbay doctor` checks Temporal and the integrations the runbooks name, as the worker uses them.

Against the Temporal dev server (its namespace and Sickbay's search attributes registered) and
the twin:
- reachable, the namespace exists, every search attribute registered: ok; no worker polls the
  task queue: a warning naming the queue; a worker polling it (workflow and activity pollers,
  seen through describe_task_queue): ok with the poller counts;
- a namespace that does not exist: error naming it;
- an address where nothing listens: one error line, exit 1;
- the shipped runbooks with no channels file: the integrations line is an error naming each
  channel, the runbooks that name it and SICKBAY_CHANNELS_FILE, exit 1 (the worker would
  refuse to start); configured: ok.
"""

from __future__ import annotations

import asyncio
import uuid
from datetime import timedelta
from pathlib import Path

import pytest
from temporalio import activity, workflow
from temporalio.api.enums.v1 import TaskQueueType
from temporalio.api.taskqueue.v1 import TaskQueue
from temporalio.api.workflowservice.v1 import DescribeTaskQueueRequest
from temporalio.client import Client
from temporalio.testing import WorkflowEnvironment
from temporalio.worker import UnsandboxedWorkflowRunner, Worker

from harness.stack import free_port
from tests.activities.kube.conftest import twin
from tests.activities.kube.rbac_proxy import deploy_rules
from tests.activities.kube.test_kube_doctor import doctor, integrations, line

pytestmark = [
    pytest.mark.devserver,
    pytest.mark.usefixtures("repair_allowlist_env"),
]  # the shipped runbooks repair


@activity.defn(name="doctor-test-noop")
async def noop() -> None:
    return None


@workflow.defn(name="doctor-test-wf")
class Noop:
    @workflow.run
    async def run(self) -> None:
        await workflow.execute_activity(noop, start_to_close_timeout=timedelta(seconds=5))


def _env(tmp_path: Path, address: str, namespace: str, queue: str) -> dict[str, str]:
    return {
        **integrations(tmp_path / "integrations"),
        "SICKBAY_TEMPORAL_ADDRESS": address,
        "SICKBAY_TEMPORAL_NAMESPACE": namespace,
        "SICKBAY_TASK_QUEUE": queue,
    }


async def _polled(client: Client, queue: str) -> None:
    """Until the server has seen both kinds of poller on `queue` (a condition, not a sleep)."""
    for _ in range(200):
        seen = []
        for kind in (
            TaskQueueType.TASK_QUEUE_TYPE_WORKFLOW,
            TaskQueueType.TASK_QUEUE_TYPE_ACTIVITY,
        ):
            described = await client.workflow_service.describe_task_queue(
                DescribeTaskQueueRequest(
                    namespace=client.namespace,
                    task_queue=TaskQueue(name=queue),
                    task_queue_type=kind,
                )
            )
            seen.append(bool(described.pollers))
        if all(seen):
            return
        await asyncio.sleep(0.05)
    raise AssertionError(f"no pollers seen on {queue}")


async def test_temporal_checks_and_the_polling_worker(
    dev_env: WorkflowEnvironment, tmp_path: Path
) -> None:
    client = dev_env.client
    address = client.service_client.config.target_host
    queue = f"doctor-{uuid.uuid4().hex[:8]}"
    env = _env(tmp_path, address, client.namespace, queue)
    with twin(tmp_path, "1.37", proxy_rules=deploy_rules()) as t:
        code, out = await asyncio.to_thread(doctor, t.kubeconfig, "--temporal", env=env)
        assert code == 0, out
        assert line(out, "temporal").startswith("ok"), out
        assert line(out, "temporal namespace").startswith("ok"), out
        assert line(out, "search attributes").startswith("ok"), out
        idle = line(out, "worker")
        assert idle.startswith("warning") and queue in idle, out

        async with Worker(
            client,
            task_queue=queue,
            workflows=[Noop],
            activities=[noop],
            workflow_runner=UnsandboxedWorkflowRunner(),
        ):
            await _polled(client, queue)
            code, out = await asyncio.to_thread(doctor, t.kubeconfig, "--temporal", env=env)
        polling = line(out, "worker")
        assert code == 0 and polling.startswith("ok"), out
        assert "workflow and" in polling and "activity poller(s)" in polling, out


async def test_unknown_namespace_and_unreachable_server(
    dev_env: WorkflowEnvironment, tmp_path: Path
) -> None:
    address = dev_env.client.service_client.config.target_host
    with twin(tmp_path, "1.37", proxy_rules=deploy_rules()) as t:
        env = _env(tmp_path, address, "no-such-namespace", "q")
        code, out = await asyncio.to_thread(doctor, t.kubeconfig, "--temporal", env=env)
        assert code == 1, out
        assert line(out, "temporal namespace").startswith("error"), out
        assert "no-such-namespace" in line(out, "temporal namespace")

        env = _env(tmp_path, f"127.0.0.1:{free_port()}", "default", "q")
        code, out = await asyncio.to_thread(doctor, t.kubeconfig, "--temporal", env=env)
        assert code == 1, out
        assert line(out, "temporal").startswith("error"), out
        assert "Traceback" not in out


async def test_unconfigured_channels_are_an_error(tmp_path: Path) -> None:
    with twin(tmp_path, "1.37", proxy_rules=deploy_rules()) as t:
        code, out = await asyncio.to_thread(doctor, t.kubeconfig, env={})
        found = line(out, "integrations")
        assert code == 1 and found.startswith("error"), out
        assert "channel 'pagerduty', named by runbook(s) default" in found, out
        assert "channel 'slack'" in found and "SICKBAY_CHANNELS_FILE is unset" in found, out
        assert "provider 'http', named by runbook(s) inference (scaleUp)" in found, out

        code, out = await asyncio.to_thread(doctor, t.kubeconfig)  # configured
        assert line(out, "integrations").startswith("ok"), out
