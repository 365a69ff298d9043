"""`sickbay-dev demo --scenario watch` on an embedded stack whose worker runs the health watcher:

- the twin's Alertmanager is silenced and no sweep Schedule exists; a GPU dies under a
  Deployment -> the watcher (real `sickbay worker`, Lease in the twin's `sickbay` namespace)
  starts the remediation: its first timeline entry is the watch's, a DeviceTaintRule
  quarantines the GPU, the pod moves; repaired -> released;
- the worker holds the health watcher's Lease in the twin.
"""

from __future__ import annotations

import asyncio
import sys
import time
from collections.abc import AsyncIterator, Iterator

import pytest

from harness.scenarios import Demo, Progress, watch_detection
from harness.stack import Stack
from tests.demo.conftest import start_stack

pytestmark = pytest.mark.devserver


@pytest.fixture(scope="module")
def watch_stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    s = start_stack(tmp_path_factory.mktemp("watch-stack"), watch=True)
    try:
        yield s
    finally:
        s.stop()


@pytest.fixture(scope="module")
async def watch_demo(watch_stack: Stack) -> AsyncIterator[Demo]:
    d = await Demo.open(watch_stack, Progress(lambda line: print(line, file=sys.stderr)))
    try:
        yield d
    finally:
        await d.close()


LEASE = "/apis/coordination.k8s.io/v1/namespaces/sickbay/leases/sickbay-health-watcher-default"


async def test_detection_by_watch(watch_demo: Demo) -> None:
    deadline = time.monotonic() + 60
    while True:  # the worker's watcher takes the Lease right after it starts polling
        response = await watch_demo.kube.get(LEASE)
        if response.status_code == 200 and response.json()["spec"].get("holderIdentity"):
            break
        assert time.monotonic() < deadline, f"no watcher holds the Lease: {response.text}"
        await asyncio.sleep(0.2)
    await watch_detection(watch_demo)
    incident = watch_demo.incidents[-1]
    assert incident.result is not None and incident.result.outcome == "released"
    assert incident.result.status.rule_name  # it was quarantined
    entries = await watch_demo.timeline(incident)
    assert entries[0].actor == "watch"
