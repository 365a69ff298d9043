"""`sickbay demo --scenario vgpu` on a stack whose twin node has 2 GPUs x 2 vGPUs:

- two desktops on the two vGPUs of one physical GPU; the GPU fails (two alerts, one per pod);
- exactly one remediation (one workflow id per physical GPU), the second alert deduplicated
  into it; one DeviceTaintRule per vGPU device of that GPU, none on the healthy GPU;
- both desktops replaced on the healthy GPU's vGPUs; released after repair.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.demo.conftest import start_stack
from worker.scenarios import TAINT_RULE_VERSIONS, Demo, vgpu_correlated
from worker.stack import Stack

pytestmark = pytest.mark.devserver


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    s = start_stack(tmp_path_factory.mktemp("vgpu"), topology="vgpu", slices_per_gpu=2)
    try:
        yield s
    finally:
        s.stop()


async def test_vgpu_correlated_failure(demo: Demo) -> None:
    seen_rules: list[dict[str, object]] = []
    original = demo.taint_rule

    async def record(name: str) -> dict[str, object] | None:
        rule = await original(name)
        if rule is not None:
            seen_rules.append(rule)
        return rule

    demo.taint_rule = record  # type: ignore[method-assign]
    await vgpu_correlated(demo)
    [incident] = demo.incidents
    assert incident.result is not None and incident.result.outcome == "released"
    assert incident.result.status.alerts == 2  # one per desktop pod, one workflow
    assert len(incident.result.status.consumers) == 2
    assert seen_rules, "the scenario looked at the rule while quarantined"
    # Every rule Sickbay made targets a vGPU of the failed GPU only.
    for version in TAINT_RULE_VERSIONS:
        r = await demo.kube.get(f"/apis/resource.k8s.io/{version}/devicetaintrules")
        if r.status_code == 200:
            assert r.json()["items"] == []  # all removed after repair
            break
    failed_index = incident.device  # node/uuid
    assert failed_index.endswith(incident.result.status.device.split("/")[-1])
