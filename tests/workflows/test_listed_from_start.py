"""A remediation is listed by phase, cluster, GPU and node from its start, not its first task.

Case (dev server, its real visibility store; no worker polls the queue, as when a burst keeps
every worker busy): a remediation started the one way every trigger starts it
(signal-with-start) is found by `SickbayPhase = 'received'` and `SickbayCluster` (what the
open-remediation gauges and `sickbay status --cluster` filter on), `SickbayDevice` and
`SickbayNode` although its first workflow task never ran. Before, those attributes came from
the first task, and under a burst `status --cluster` missed about half the running ones.
"""

from __future__ import annotations

import asyncio
import uuid

import pytest
from temporalio.client import Client

from activities.launch import signal_with_start
from contract.kube import DeviceRef
from contract.names import SA_CLUSTER, SA_DEVICE, SA_NODE, SA_PHASE, WF_REMEDIATE
from contract.remediation import AlertEvidence, Phase, RemediationInput

pytestmark = pytest.mark.devserver


async def test_a_remediation_is_listed_by_cluster_before_its_first_task(
    dev_client: Client,
) -> None:
    cluster = f"c{uuid.uuid4().hex[:8]}"
    node = f"node-{uuid.uuid4().hex[:6]}"
    device = DeviceRef(node=node, gpu_uuid=f"GPU-{uuid.uuid4()}")
    inp = RemediationInput(device=device, trigger="alert", cluster=cluster)
    launched = await signal_with_start(
        dev_client,
        inp,
        task_queue=f"nobody-polls-{uuid.uuid4().hex[:8]}",
        evidence=AlertEvidence(source="alertmanager", alertname="GpuXid", xid=79),
    )
    query = (
        f"WorkflowType = '{WF_REMEDIATE}' AND ExecutionStatus = 'Running' "
        f"AND {SA_CLUSTER} = '{cluster}' AND {SA_DEVICE} = '{device.key}' "
        f"AND {SA_NODE} = '{node}' AND {SA_PHASE} = '{Phase.RECEIVED.value}'"
    )
    listed: list[str] = []
    give_up = asyncio.get_running_loop().time() + 30  # visibility lags the start a little
    while asyncio.get_running_loop().time() < give_up:
        listed = [wf.id async for wf in dev_client.list_workflows(query)]
        if listed:
            break
        await asyncio.sleep(0.1)
    history = await dev_client.get_workflow_handle(launched.workflow_id).fetch_history()
    await dev_client.get_workflow_handle(launched.workflow_id).terminate("test done")
    assert launched.started
    assert listed == [launched.workflow_id]
    # Its first task never ran: the attributes came with the start.
    assert not any(e.HasField("workflow_task_started_event_attributes") for e in history.events)
