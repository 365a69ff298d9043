"""The one way a node incident starts: signal-with-start of `sickbay-node-incident`.

Workflow id `contract.names.node_workflow_id(node, cluster)`, `USE_EXISTING`: the health
watcher, every sweep and a person all reach the one run of a node (a second finding is a
`node-finding` signal into it), so a node that lost eight GPUs is one incident. A closed
incident may be followed by a new one (the node broke again).

`start_node_incident()` is the plain async function (the watcher calls it with its client);
`NodeLaunchActivities.signal_with_start_node_incident` wraps it as the activity the sweep
workflow calls.
"""

from __future__ import annotations

from datetime import UTC, datetime

from temporalio.client import Client
from temporalio.common import WorkflowIDConflictPolicy, WorkflowIDReusePolicy
from temporalio.exceptions import ApplicationError

from activities.defn import implements
from contract.errors import ERR_INVALID_INPUT
from contract.launch import SIGNAL_WITH_START_NODE_INCIDENT, LaunchResult
from contract.names import (
    SIG_NODE_FINDING,
    WF_NODE_INCIDENT,
    node_workflow_id,
)
from contract.node_incident import NodeFinding, NodeIncidentInput, NodeIncidentResult, NodeLaunch


async def start_node_incident(
    client: Client, inp: NodeIncidentInput, *, task_queue: str
) -> LaunchResult:
    """Start the node's incident, or signal the running one with this finding."""
    workflow_id = node_workflow_id(inp.node, inp.cluster)
    finding = NodeFinding(
        source=inp.trigger, message=inp.reason, at=datetime.now(UTC), planned=inp.planned
    )
    handle = await client.start_workflow(
        WF_NODE_INCIDENT,
        inp,
        id=workflow_id,
        task_queue=task_queue,
        result_type=NodeIncidentResult,
        id_conflict_policy=WorkflowIDConflictPolicy.USE_EXISTING,
        id_reuse_policy=WorkflowIDReusePolicy.ALLOW_DUPLICATE,
        start_signal=SIG_NODE_FINDING,
        start_signal_args=[finding],
        static_summary=f"node {inp.node}: GPUs vanished",
        static_details=inp.reason[:1000],
    )
    resp = getattr(handle, "_start_workflow_response", None)
    return LaunchResult(
        workflow_id=workflow_id,
        run_id=handle.result_run_id,
        started=bool(getattr(resp, "started", False)),
        device=f"{inp.node}/nvidia.com/gpu",
    )


class NodeLaunchActivities:
    def __init__(self, client: Client, task_queue: str, cluster: str = "") -> None:
        self._client = client
        self._task_queue = task_queue
        self._cluster = cluster

    @implements(SIGNAL_WITH_START_NODE_INCIDENT)
    async def signal_with_start_node_incident(self, req: NodeLaunch) -> LaunchResult:
        inp = req.incident
        if inp.cluster and inp.cluster != self._cluster:
            raise ApplicationError(
                f"node incident for cluster {inp.cluster!r} refused by the worker of cluster "
                f"{self._cluster or '(unnamed)'!r}",
                type=ERR_INVALID_INPUT,
                non_retryable=True,
            )
        if not inp.cluster and self._cluster:
            inp = inp.model_copy(update={"cluster": self._cluster})
        return await start_node_incident(
            self._client, inp, task_queue=req.task_queue or self._task_queue
        )
