"""`sickbay-dev demo --scenario hami` on a stack whose twin runs the `hami` profile (device plugin
shared by HAMi, 1 node x 2 GPUs, the worker with SICKBAY_HAMI_DEVICE_CORDON on):

- two desktops binpacked by HAMi's scheduler onto one GPU (its record on both pods); the GPU
  fails (Xid 79): one remediation whose consumers are exactly the two desktops;
- the GPU in the node's `hami.io/device-cordon`, the node neither tainted nor cordoned; both
  desktops replaced on the healthy GPU;
- the GPU recovers: HAMi's plugin re-registers it healthy and the cordon survives the rewrite,
  so a pod asking for that GPU by UUID (`nvidia.com/use-gpuuuid`) stays Pending; after the
  repair mark the cordon is lifted, the remediation released and that pod runs on the GPU.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from harness.scenarios import Demo, hami_shared_gpu
from harness.stack import Stack
from tests.demo.conftest import start_stack

pytestmark = pytest.mark.devserver


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    s = start_stack(tmp_path_factory.mktemp("hami"), profile="hami")
    try:
        yield s
    finally:
        s.stop()


async def test_hami_shared_gpu_failure(demo: Demo) -> None:
    await hami_shared_gpu(demo)
    [incident] = demo.incidents
    assert incident.result is not None and incident.result.outcome == "released"
    assert len(incident.result.status.consumers) == 2
    assert incident.result.status.escalation_reason is None
    assert any(c.startswith("GPU quarantined alone") for c in demo.checks)
    assert any(c.startswith("both desktops replaced on the healthy GPU") for c in demo.checks)
    assert any("the cordon survived the rewrite" in c for c in demo.checks)
    assert any(c.startswith("a pod asking for GPU") for c in demo.checks)
    nodes = (await demo.k("GET", "/api/v1/nodes"))["items"]
    assert all("hami.io/device-cordon" not in n["metadata"].get("annotations", {}) for n in nodes)
