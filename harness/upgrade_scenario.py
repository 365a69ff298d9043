"""`sickbay-dev demo --scenario upgrade`: "after the upgrade the node forgot its GPU".

A pool of GPU nodes runs the NVIDIA GPU plugin pods (twin/upgrade.py). Two acts, no alert,
no sweep: the health watcher detects, the node incident (`sickbay-node-incident`) does the rest.

1. A kubelet upgrade of one node leaves the DRA driver's kubelet plugin Ready but
   unregistered: its ResourceSlice empties. One node incident: diagnosed ("Ready but
   publishes fewer GPUs ... lost its registration"), contained (condition
   GPUDevicesAvailable=False, Sickbay's NoSchedule taint, a Node Event), the plugin restarted
   once, the GPUs back and validated (a validation Job per GPU), released: `healed`.
2. An inference Deployment runs on a node whose upgrade then breaks the container toolkit
   hook (CreateContainerError). A restart cannot fix that: one page at once, with the
   diagnosis naming the hook, the kubelet change and the pool's other nodes; no restart, no
   per-GPU remediation; the node stays tainted; the workload that lost its GPU is evicted and
   runs again on another node.
   The platform team rolls out a fixed toolkit; the GPUs come back, are validated, and the
   node is released (`healed`, by hand), the page resolved.
"""

from __future__ import annotations

import time
from typing import Any

from temporalio.client import WorkflowExecutionStatus

from contract.names import QRY_NODE_STATUS, QRY_TIMELINE, WF_REMEDIATE, node_workflow_id
from contract.node_incident import CONDITION_GPU_DEVICES, NodeIncidentResult, NodeIncidentStatus
from harness.scenarios import Demo, DemoFailure, _ns

PLUGIN_NS = "gpu-operator"
REPAIR_WAIT = 120.0  # real seconds: a restart, GPUs back and two validation Jobs at demo pace


async def _node(demo: Demo, name: str) -> dict[str, Any]:
    node: dict[str, Any] = await demo.k("GET", f"/api/v1/nodes/{name}")
    return node


def _condition(node: dict[str, Any]) -> dict[str, Any] | None:
    for c in (node.get("status") or {}).get("conditions") or []:
        if c.get("type") == CONDITION_GPU_DEVICES:
            return c
    return None


def _tainted(node: dict[str, Any]) -> bool:
    return any(
        t.get("key") == "sickbay.dev/gpus-vanished"
        for t in (node.get("spec") or {}).get("taints") or []
    )


async def _plugins_ready(demo: Demo, nodes: list[str]) -> None:
    async def probe() -> bool:
        pods = (await demo.k("GET", f"/api/v1/namespaces/{PLUGIN_NS}/pods"))["items"]
        ready = {
            p["spec"].get("nodeName")
            for p in pods
            if "kubelet-plugin" in p["metadata"]["name"]
            and all(
                cs.get("ready") for cs in (p.get("status") or {}).get("containerStatuses") or [{}]
            )
        }
        return set(nodes) <= ready

    await demo.until("the GPU plugin pods Ready on every node", probe)


async def _status(demo: Demo, wid: str) -> NodeIncidentStatus | None:
    try:
        st: NodeIncidentStatus = await demo.client.get_workflow_handle(wid).query(
            QRY_NODE_STATUS, result_type=NodeIncidentStatus
        )
        return st
    except Exception:  # not started yet
        return None


async def _closed(demo: Demo, wid: str, within: float) -> NodeIncidentResult:
    handle = demo.client.get_workflow_handle(wid, result_type=NodeIncidentResult)

    async def probe() -> bool:
        desc = await handle.describe()
        return desc.status != WorkflowExecutionStatus.RUNNING

    await demo.until(f"{wid} to close", probe, within)
    result: NodeIncidentResult = await handle.result()
    return result


def _print_timeline(demo: Demo, lines: list[str]) -> None:
    for line in lines:
        demo.say(f"  {line[:200]}", tag="timeline")


async def _run_id(demo: Demo, wid: str) -> str | None:
    """The latest run of `wid` (None: never started), so a new incident of the same node is
    told from the closed one."""
    try:
        return (await demo.client.get_workflow_handle(wid).describe()).run_id
    except Exception:
        return None


async def _diagnosed(
    demo: Demo, wid: str, t0: float, earlier: str | None = None
) -> NodeIncidentStatus:
    async def probe() -> NodeIncidentStatus | None:
        if earlier is not None and await _run_id(demo, wid) == earlier:
            return None  # the node's earlier incident, closed
        st = await _status(demo, wid)
        return st if st is not None and st.summary else None

    st = await demo.until(f"{wid} to diagnose", probe)
    demo.say(f"diagnosis ({time.monotonic() - t0:.1f} s after the upgrade): {st.summary}")
    return st


async def upgrade_story(demo: Demo) -> None:
    say = demo.say
    cluster = demo.stack.config.cluster
    nodes = sorted(await demo.nodes())
    if len(nodes) < 3:
        raise DemoFailure(f"the upgrade scenario needs a pool of 3+ nodes, the twin has {nodes}")
    await demo.k("POST", "/twin/gpu-plugins")
    await _plugins_ready(demo, nodes)
    say(f"a pool of {len(nodes)} GPU nodes, the NVIDIA DRA driver's kubelet plugin on each")
    before = (await _node(demo, nodes[0]))["status"]["nodeInfo"]["kubeletVersion"]
    since = len(await demo.notifications())

    # -- act 1: the plugin lost its registration; one restart heals it ----------------------
    node = nodes[0]
    wid = node_workflow_id(node, cluster)
    say(f"act 1: node {node}'s kubelet is upgraded {before} -> v1.36.3; the DRA plugin stays")
    say("Ready but never registers again with the new kubelet: its ResourceSlice empties")
    t0 = time.monotonic()
    await demo.k("POST", "/twin/upgrades", {"node": node, "kubelet": "v1.36.3", "breaks": "socket"})
    st = await _diagnosed(demo, wid, t0)
    if st.cause != "driver-not-publishing":
        raise DemoFailure(f"diagnosed {st.cause}, not driver-not-publishing: {st.summary}")
    demo.check(f"one node incident {wid}, diagnosed {st.cause}")
    result = await _closed(demo, wid, REPAIR_WAIT)
    back = time.monotonic() - t0
    _print_timeline(demo, result.timeline)
    if result.outcome != "healed" or result.rung != "restart-plugin":
        raise DemoFailure(f"act 1 closed {result.outcome} ({result.summary})")
    demo.check(f"healed by one plugin restart, validated, released {back:.1f} s after the upgrade")
    obj = await _node(demo, node)
    cond = _condition(obj)
    if cond is None or cond["status"] != "True" or _tainted(obj):
        raise DemoFailure(f"node {node} not released: condition {cond}, taints {obj['spec']}")
    demo.check(f"node {node}: {CONDITION_GPU_DEVICES}=True, Sickbay's taint removed")

    # -- act 2: the toolkit hook fails; a restart cannot fix it: escalate at once ----------
    ns = _ns("upgrade")
    await demo.namespace(ns)
    await demo.deployment(ns, "llm")
    [(pod, _device)] = await demo.running(ns, "llm")
    node = pod["spec"]["nodeName"]
    before = (await _node(demo, node))["status"]["nodeInfo"]["kubeletVersion"]
    wid = node_workflow_id(node, cluster)
    earlier = await _run_id(demo, wid)
    say(f"act 2: an inference Deployment {ns}/llm runs on {node}; the node's upgrade breaks")
    say("the container toolkit hook (CreateContainerError)")
    t0 = time.monotonic()
    await demo.k("POST", "/twin/upgrades", {"node": node, "kubelet": "v1.36.9", "breaks": "hook"})
    st = await _diagnosed(demo, wid, t0, earlier)
    if st.cause != "toolkit-hook" or "nvidia-container-toolkit" not in st.summary.replace(
        "container toolkit", "nvidia-container-toolkit"
    ):
        raise DemoFailure(f"diagnosed {st.cause}: {st.summary}")

    async def held() -> NodeIncidentStatus | None:
        s = await _status(demo, wid)
        return s if s is not None and s.phase == "held" else None

    await demo.until(f"{wid} to escalate and hold", held)
    pages = [
        n
        for n in await demo.notifications(since)
        if n["kind"] == "pagerduty" and n["body"].get("dedup_key", "").startswith(wid[:60])
    ]
    if not pages:
        raise DemoFailure(f"no page for {wid}")
    summary = str(pages[0]["body"].get("payload", {}).get("summary", ""))
    say(f"paged: {summary[:300]}")
    if f"from {before} to v1.36.9" not in summary:
        raise DemoFailure(f"the page does not name the kubelet change: {summary}")
    demo.check("escalated at once with the diagnosis: no restart of a plugin a restart cannot fix")
    obj = await _node(demo, node)
    cond = _condition(obj) or {}
    if cond.get("status") != "False" or cond.get("reason") != "ContainerToolkitHookFailed":
        raise DemoFailure(f"node condition {cond}")
    if not _tainted(obj):
        raise DemoFailure(f"node {node} not tainted")
    demo.check(f"node {node}: {CONDITION_GPU_DEVICES}=False ({cond['reason']}), tainted NoSchedule")
    timeline: list[str] = await demo.client.get_workflow_handle(wid).query(
        QRY_TIMELINE, result_type=list[str]
    )
    if any("restart-plugin (attempt" in line for line in timeline):
        raise DemoFailure("the plugin was restarted though a restart cannot fix the hook")

    async def moved() -> str | None:
        for p in await demo.pods(ns, "llm"):
            running = (p.get("status") or {}).get("phase") == "Running"
            if (
                running
                and p["spec"].get("nodeName") != node
                and not p["metadata"].get("deletionTimestamp")
            ):
                return str(p["spec"]["nodeName"])
        return None

    try:
        elsewhere = await demo.until(f"{ns}/llm running on another node", moved)
    except DemoFailure:
        _print_timeline(
            demo,
            await demo.client.get_workflow_handle(wid).query(QRY_TIMELINE, result_type=list[str]),
        )
        raise
    demo.check(f"the workload that lost its GPU was evicted and runs again on {elsewhere}")

    say("the platform team rolls out a container toolkit that works with the new runtime")
    demo.person(f"rolled out a fixed container toolkit on {node}")
    await demo.k("POST", "/twin/upgrades/recover", {"node": node})
    result = await _closed(demo, wid, REPAIR_WAIT)
    _print_timeline(demo, result.timeline)
    if result.outcome != "healed":
        raise DemoFailure(f"act 2 closed {result.outcome} ({result.summary})")
    actions = [
        n["body"].get("event_action")
        for n in await demo.notifications(since)
        if n["kind"] == "pagerduty" and n["body"].get("dedup_key", "").startswith(wid[:60])
    ]
    if actions != ["trigger", "resolve"]:
        raise DemoFailure(f"pages of {wid}: {actions}, not one trigger then its resolve")
    demo.check("GPUs back, validated, node released; the page resolved")
    await demo.delete_namespace(ns)

    listed = [
        w
        async for w in demo.client.list_workflows(
            f"WorkflowType = '{WF_REMEDIATE}' AND SickbayNode IN ('{nodes[0]}', '{node}')"
        )
    ]
    if listed:
        raise DemoFailure(
            f"per-GPU remediations started for vanished GPUs: {[w.id for w in listed]}"
        )
    demo.check("no per-GPU remediation and no DeviceTaintRule for a GPU that merely vanished")
