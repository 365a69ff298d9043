"""The container remediation scenario (scenario.py) against the cluster twin and the Temporal
dev server, so the logic of the K3s test runs on every machine, Docker or not.

Cases: those of scenario.py — a DeviceTaintRule for exactly the failed GPU appears through the
official client, a repeated launch reaches the same run, `repaired` releases the rule.
"""

from __future__ import annotations

from pathlib import Path

from temporalio.testing import WorkflowEnvironment

from simulator.testing import running_sim
from tests.containers.scenario import DRIVER, remediation_scenario


async def test_remediation_scenario_on_the_twin(
    dev_env: WorkflowEnvironment, tmp_path: Path
) -> None:
    # A 1.36 twin serving DeviceTaintRules, one node and no GPUs: the scenario publishes the
    # DeviceClass and ResourceSlice itself, as it does on K3s.
    with running_sim(tmp_path, profile="1.36", nodes=1, gpus_per_node=0) as twin:
        from kubernetes import client

        api = twin.api_client()
        classes = {c.metadata.name for c in client.ResourceV1Api(api).list_device_class().items}
        if DRIVER in classes:  # the twin's seed creates the NVIDIA class; K3s has none
            client.ResourceV1Api(api).delete_device_class(DRIVER)
        await remediation_scenario(
            dev_env.client.service_client.config.target_host, twin.kubeconfig_path
        )
