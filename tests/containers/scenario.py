"""The remediation scenario shared by the K3s container test and its twin counterpart.

`remediation_scenario(temporal_address, kubeconfig)` publishes what the NVIDIA DRA driver
would (a DeviceClass and a ResourceSlice with two GPUs on the cluster's first node), runs the
production worker (`worker.main.build_worker`) in this process against that cluster and
Temporal, launches a remediation for GPU 0 the way the webhook and CLI do
(`activities.launch.signal_with_start`), and checks what the cluster's API shows:

- a Sickbay DeviceTaintRule selecting exactly driver/pool/device gpu-0, NoExecute, with the
  workflow id annotation; GPU 1 untouched;
- the same launch again reaches the same run (started=False);
- Xid 79: the default runbook's repair ladder (reboot, then replace) has no machine provider on
  this cluster, so it escalates `repair-failed` naming that and holds the device;
- `repaired` -> the workflow releases the device (closing `escalated`) and the rule is gone.
"""

from __future__ import annotations

import asyncio
import contextlib
import uuid
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

DRIVER = "gpu.nvidia.com"
# Bounds for the polls below. Quarantine happens within seconds of the start (resolve,
# evidence, budget, create rule); 90 s allows for a cold worker and a busy CI machine.
RULE_APPEARS_WITHIN = timedelta(seconds=90)
RULE_GONE_WITHIN = timedelta(seconds=90)


def _gpu_uuid(node: str, index: int) -> str:
    return "GPU-" + str(uuid.uuid5(uuid.NAMESPACE_URL, f"sickbay-test/{node}/{index}"))


def _publish_gpus(kubeconfig: Path) -> tuple[str, list[str]]:
    """DeviceClass + ResourceSlice for two H100s on the K3s node, shaped like the NVIDIA DRA
    driver's (attributes uuid, index, productName, ...). Returns the node and the UUIDs."""
    from kubernetes import client, config

    api = config.new_client_from_config(config_file=str(kubeconfig))
    node = client.CoreV1Api(api).list_node().items[0].metadata.name
    resource = client.ResourceV1Api(api)
    resource.create_device_class(
        {
            "apiVersion": "resource.k8s.io/v1",
            "kind": "DeviceClass",
            "metadata": {"name": DRIVER},
            "spec": {"selectors": [{"cel": {"expression": f'device.driver == "{DRIVER}"'}}]},
        }
    )
    uuids = [_gpu_uuid(node, i) for i in range(2)]
    resource.create_resource_slice(
        {
            "apiVersion": "resource.k8s.io/v1",
            "kind": "ResourceSlice",
            "metadata": {"name": f"{node}-{DRIVER}"},
            "spec": {
                "driver": DRIVER,
                "nodeName": node,
                "pool": {"name": node, "generation": 1, "resourceSliceCount": 1},
                "devices": [
                    {
                        "name": f"gpu-{i}",
                        "attributes": {
                            "type": {"string": "gpu"},
                            "uuid": {"string": uuids[i]},
                            "index": {"int": i},
                            "minor": {"int": i},
                            "productName": {"string": "NVIDIA H100 80GB HBM3"},
                            "driverVersion": {"version": "580.65.6"},
                        },
                        "capacity": {"memory": {"value": "81559Mi"}},
                    }
                    for i in range(2)
                ],
            },
        }
    )
    return node, uuids


def _sickbay_rules(kubeconfig: Path) -> list[dict[str, Any]]:
    from kubernetes import client, config

    from contract.names import LABEL_MANAGED_BY, MANAGED_BY_VALUE

    api = config.new_client_from_config(config_file=str(kubeconfig))
    rules = client.ResourceV1beta2Api(api).list_device_taint_rule(
        label_selector=f"{LABEL_MANAGED_BY}={MANAGED_BY_VALUE}"
    )
    return [api.sanitize_for_serialization(r) for r in rules.items]


async def _eventually(check: Any, within: timedelta, what: str) -> Any:
    deadline = asyncio.get_running_loop().time() + within.total_seconds()
    last: Any = None
    while asyncio.get_running_loop().time() < deadline:
        last = await asyncio.to_thread(check)
        if last:
            return last
        await asyncio.sleep(1)  # a real API server; one list per second is cheap
    raise AssertionError(f"{what} did not happen within {within}; last saw {last!r}")


@contextlib.asynccontextmanager
async def _running_worker(settings: Any, client: Any) -> AsyncIterator[None]:
    """The production worker (worker.main's registrations) in this process."""
    from worker import main as worker_main

    worker = await worker_main.build_worker(client, settings)
    async with worker:
        yield


async def remediation_scenario(temporal_address: str, kubeconfig: Path) -> None:
    """Publish two GPUs, run the worker, launch a remediation for GPU 0, see the rule come and
    go. Also run against the cluster twin (test_remediation_on_twin.py), so this logic is
    exercised on machines without Docker too."""
    from activities.launch import signal_with_start
    from contract.kube import DeviceRef
    from contract.names import ANN_WORKFLOW_ID, SIG_REPAIRED, TAINT_KEY, device_workflow_id
    from contract.remediation import (
        AlertEvidence,
        RemediationInput,
        RemediationResult,
        RepairedRequest,
    )
    from worker.settings import Settings
    from worker.temporal import connect

    node, uuids = await asyncio.to_thread(_publish_gpus, kubeconfig)
    settings = Settings(
        temporal_address=temporal_address,
        task_queue=f"sickbay-k3s-{uuid.uuid4().hex[:8]}",
        KUBECONFIG=kubeconfig,
        metrics_port=0,
    )
    client = await connect(settings)
    inp = RemediationInput(
        device=DeviceRef(node=node, gpu_uuid=uuids[0]),
        trigger="alert",
        runbook="default",
        requested_by="tests/containers",
        reason="Xid 79 on a K3s node",
    )
    alert = AlertEvidence(
        source="alertmanager",
        alertname="GPUXidError",
        fingerprint="k3s-xid-79",
        xid=79,
        starts_at=datetime.now(UTC),
        received_at=datetime.now(UTC),
        labels={"Hostname": node, "UUID": uuids[0], "gpu": "0", "Xid": "79"},
    )
    workflow_id = device_workflow_id(node, uuids[0])

    async with _running_worker(settings, client):
        first = await signal_with_start(client, inp, task_queue=settings.task_queue, evidence=alert)
        assert first.workflow_id == workflow_id

        rules = await _eventually(
            lambda: _sickbay_rules(kubeconfig), RULE_APPEARS_WITHIN, "a DeviceTaintRule"
        )
        assert len(rules) == 1, rules
        rule = rules[0]
        assert rule["spec"]["deviceSelector"] == {"driver": DRIVER, "pool": node, "device": "gpu-0"}
        assert rule["spec"]["taint"]["key"] == TAINT_KEY
        assert rule["spec"]["taint"]["effect"] == "NoExecute"
        assert rule["metadata"]["annotations"][ANN_WORKFLOW_ID] == workflow_id

        again = await signal_with_start(client, inp, task_queue=settings.task_queue, evidence=alert)
        assert again.workflow_id == workflow_id and again.run_id == first.run_id
        assert not again.started

        handle = client.get_workflow_handle(workflow_id, result_type=RemediationResult)
        await handle.signal(SIG_REPAIRED, RepairedRequest(actor="tests/containers"))
        result = await asyncio.wait_for(handle.result(), RULE_GONE_WITHIN.total_seconds())
        assert result.outcome == "escalated", result
        assert "repair-failed" in result.reason and "released" in result.reason, result
        assert await asyncio.to_thread(_sickbay_rules, kubeconfig) == []
