"""`sickbay-dev demo --scenario vgpu` on a stack whose twin node has 2 GPUs x 2 vGPUs:

- two desktops on the two vGPUs of one physical GPU; the GPU fails (two alerts, one per pod);
- exactly one remediation (one workflow id per physical GPU), the second alert deduplicated
  into it; one DeviceTaintRule per vGPU device of that GPU, none on the healthy GPU;
- both desktops replaced on the healthy GPU's vGPUs; released after repair.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from harness.scenarios import Demo, vgpu_correlated
from harness.stack import Stack
from tests.demo.conftest import start_stack

pytestmark = pytest.mark.devserver


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    s = start_stack(tmp_path_factory.mktemp("vgpu"), topology="vgpu", slices_per_gpu=2)
    try:
        yield s
    finally:
        s.stop()


async def test_vgpu_correlated_failure(demo: Demo) -> None:
    await vgpu_correlated(demo)
    [incident] = demo.incidents
    assert incident.result is not None and incident.result.outcome == "released"
    assert incident.result.status.alerts == 2  # one per desktop pod, one workflow
    assert len(incident.result.status.consumers) == 2
    assert any(c.startswith("one remediation for the physical GPU tainted") for c in demo.checks)
    assert await demo.taint_rules() == []  # all removed after repair
    gpus = (await demo.k("GET", "/twin/gpus"))["items"]
    assert [len(g["devices"]) for g in gpus] == [2, 2]  # the twin really had vGPU pairs
