"""A cluster name served by two clusters is refused (worker/cluster.py).

Cases:
- the fingerprint is the twin's kube-system namespace uid, read through deploy/rbac.yaml's
  grants (the RBAC proxy denies nothing); two twins have different fingerprints;
- on the dev server: a worker of cluster `east` (fingerprint A) polling its queue makes the
  check refuse fingerprint B for `east` with a message naming the name, the queue and the
  other worker; fingerprint A (a second replica) and another cluster name pass;
- identities of other programs on the queue are ignored;
- the webhook's start-up check warns when no worker of its cluster polls its queue (a
  webhook and a worker named differently), and is quiet once one does;
- the webhook warns only once its grace has passed without a worker (one starting beside it,
  as in a rollout or the demo, is no alarm), and says so when one polls after the warning.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import uuid
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from temporalio.client import Client
from temporalio.testing import WorkflowEnvironment
from temporalio.worker import Worker

from tests.activities.kube.conftest import twin
from tests.activities.kube.test_kube_e2e import RULES
from worker.cluster import (
    check_cluster_unique,
    conflicts,
    kube_fingerprint,
    missing_worker_warning,
    queue_pollers,
    worker_identity,
)
from worker.settings import Settings
from worker.webhook.app import warn_without_worker
from workflows.remediation import DeviceRemediationWorkflow


def test_the_fingerprint_is_the_kube_system_uid_and_differs_per_cluster(tmp_path: Path) -> None:
    prints = []
    for i in range(2):
        with twin(tmp_path / str(i), "1.36", proxy_rules=RULES) as t:
            uid = t.store.get("namespaces", "kube-system")["metadata"]["uid"]
            fp = kube_fingerprint(t.acts.kube)
            assert fp == uid.replace("-", "")[:12]
            assert t.proxy is not None and t.proxy.denied == []  # rbac.yaml grants it
            prints.append(fp)
    assert prints[0] != prints[1]


def test_conflicts_only_count_sickbay_workers_of_the_same_name() -> None:
    mine, other = "aaaaaaaaaaaa", "bbbbbbbbbbbb"
    seen = [
        worker_identity("east", mine),
        worker_identity("east", other),
        worker_identity("west", other),
        worker_identity("", other),
        "1234@laptop",
    ]
    assert conflicts(seen, "east", mine) == [seen[1]]
    assert conflicts(seen, "", mine) == [seen[3]]
    assert conflicts(seen, "west", other) == []


async def test_a_second_cluster_on_the_same_name_is_refused(dev_env: WorkflowEnvironment) -> None:
    client = dev_env.client
    queue = f"guard-{uuid.uuid4().hex[:8]}-east"
    async with _east_worker(client, queue) as identity:
        problem = await check_cluster_unique(client, queue, "east", "bbbbbbbbbbbb")
        assert problem is not None
        assert problem.startswith(f"refusing to start: cluster name 'east' (task queue {queue})")
        assert identity in problem and "SICKBAY_CLUSTER" in problem
        assert await check_cluster_unique(client, queue, "east", "aaaaaaaaaaaa") is None
        assert await check_cluster_unique(client, queue, "west", "bbbbbbbbbbbb") is None


async def test_the_webhook_warns_when_no_worker_of_its_cluster_polls(
    dev_env: WorkflowEnvironment,
) -> None:
    client = dev_env.client
    queue = f"warn-{uuid.uuid4().hex[:8]}-east"
    warning = await missing_worker_warning(client, queue, "east")
    assert warning is not None
    assert warning.startswith(f"no Sickbay worker of cluster 'east' polls task queue {queue}")
    async with _east_worker(client, queue):
        assert await missing_worker_warning(client, queue, "east") is None
        assert await missing_worker_warning(client, queue, "west") is not None


@contextlib.asynccontextmanager
async def _east_worker(client: Client, queue: str) -> AsyncIterator[str]:
    """A worker of cluster `east` (fingerprint aaaa...) polling `queue`: its identity, once
    the server lists it among the queue's pollers (60 s at most)."""
    identity = worker_identity("east", "aaaaaaaaaaaa")
    async with Worker(
        client, task_queue=queue, workflows=[DeviceRemediationWorkflow], identity=identity
    ):
        for _ in range(300):
            if identity in await queue_pollers(client, queue):
                break
            await asyncio.sleep(0.2)
        else:
            raise AssertionError(f"worker {identity} never polled {queue}")
        yield identity


@contextlib.asynccontextmanager
async def _checking(
    client: Client, settings: Settings, grace: float
) -> AsyncIterator[asyncio.Task[None]]:
    """The webhook's check for a worker, running in the background for the block."""
    task = asyncio.ensure_future(warn_without_worker(client, settings, grace=grace))
    try:
        yield task
    finally:
        task.cancel()


def _said(caplog: pytest.LogCaptureFixture, level: int) -> list[str]:
    return [
        r.getMessage()
        for r in caplog.records
        if r.name == "worker.webhook.app" and r.levelno == level
    ]


async def test_the_webhook_warns_only_after_its_grace_and_says_when_a_worker_comes(
    dev_env: WorkflowEnvironment, caplog: pytest.LogCaptureFixture
) -> None:
    client = dev_env.client
    settings = Settings(task_queue=f"late-{uuid.uuid4().hex[:8]}", cluster="east")
    caplog.set_level(logging.INFO, logger="worker.webhook.app")
    async with _checking(client, settings, grace=0.5) as checking:
        for _ in range(100):  # the warning, once the grace passed with no worker
            if _said(caplog, logging.WARNING):
                break
            await asyncio.sleep(0.1)
        [warning] = _said(caplog, logging.WARNING)
        assert warning.startswith(
            f"no Sickbay worker of cluster 'east' polls task queue {settings.task_queue}"
        )
        assert not checking.done()  # still looking
        async with _east_worker(client, settings.task_queue):
            await asyncio.wait_for(checking, 30.0)  # seen within a round of checks
    assert len(_said(caplog, logging.WARNING)) == 1
    assert any(
        f"polls task queue {settings.task_queue} now" in m for m in _said(caplog, logging.INFO)
    )


async def test_a_worker_starting_beside_the_webhook_is_no_alarm(
    dev_env: WorkflowEnvironment, caplog: pytest.LogCaptureFixture
) -> None:
    client = dev_env.client
    settings = Settings(task_queue=f"beside-{uuid.uuid4().hex[:8]}", cluster="east")
    caplog.set_level(logging.INFO, logger="worker.webhook.app")
    async with _checking(client, settings, grace=60.0) as checking:
        async with _east_worker(client, settings.task_queue):
            await asyncio.wait_for(checking, 30.0)
    assert _said(caplog, logging.WARNING) == [] and _said(caplog, logging.INFO) == []
