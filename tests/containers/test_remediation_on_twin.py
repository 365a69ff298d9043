"""The container remediation scenario (scenario.py) against the cluster twin and a Temporal
dev server, so the logic of the K3s test runs on every machine, Docker or not.

Cases: those of scenario.py — a DeviceTaintRule for exactly the failed GPU appears through the
official client, a repeated launch reaches the same run, `repaired` releases the rule.
"""

from __future__ import annotations

from pathlib import Path

from temporalio.testing import WorkflowEnvironment

from tests.conftest import dev_server_args
from tests.containers.scenario import DRIVER, remediation_scenario
from twin.testing import running_twin
from worker.converter import DATA_CONVERTER


async def test_remediation_scenario_on_the_twin(temporal_cli_path: str, tmp_path: Path) -> None:
    # A dev server of its own: the scenario's worker starts the per-namespace `sickbay-budget`
    # workflow on its own task queue; on the session's shared server that workflow would outlive
    # this worker and hang every later remediation there (and a leftover one would hang us).
    env = await WorkflowEnvironment.start_local(
        data_converter=DATA_CONVERTER,
        dev_server_existing_path=temporal_cli_path,
        dev_server_extra_args=dev_server_args(),
        ui=False,
    )
    try:
        # A 1.36 twin serving DeviceTaintRules, one node and no GPUs: the scenario publishes
        # the DeviceClass and ResourceSlice itself, as it does on K3s.
        with running_twin(tmp_path, profile="1.36", nodes=1, gpus_per_node=0) as twin:
            from kubernetes import client

            api = twin.api_client()
            classes = {c.metadata.name for c in client.ResourceV1Api(api).list_device_class().items}
            if DRIVER in classes:  # the twin's seed creates the NVIDIA class; K3s has none
                client.ResourceV1Api(api).delete_device_class(DRIVER)
            await remediation_scenario(
                env.client.service_client.config.target_host, twin.kubeconfig_path
            )
    finally:
        await env.shutdown()
