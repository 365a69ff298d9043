"""A remediation against real servers: Temporal in a container and a K3s cluster (Kubernetes
1.36) with DeviceTaintRules enabled (marker `docker`).

The worker runs in this process with its real activities, pointed by `Settings` at both
containers; the remediation is launched the way the webhook and CLI launch one
(`activities.launch.signal_with_start`). K3s has no GPU driver, so the test publishes what the
NVIDIA DRA driver would: a DeviceClass and a ResourceSlice with two GPUs on the K3s node.

Cases:
- an Xid 79 on GPU 0 → a DeviceTaintRule managed by Sickbay appears in the K3s API, selecting
  exactly that device (driver/pool/device) with effect NoExecute, annotated with the workflow id;
- GPU 1 is left alone;
- a second alert for the same GPU reaches the same workflow (no second run);
- `repaired` → the rule is deleted and the workflow closes with outcome `released`.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.containers.scenario import remediation_scenario

pytestmark = pytest.mark.docker


async def test_remediation_quarantines_and_releases_on_k3s(
    temporal_container: str, k3s_kubeconfig: Path
) -> None:
    await remediation_scenario(temporal_container, k3s_kubeconfig)
