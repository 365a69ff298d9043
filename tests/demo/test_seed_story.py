"""The four acts of `make demo` (the seed incident) as integration tests on the embedded stack:
Temporal dev server + cluster twin + real worker + webhook, driven over HTTP like a user would.

- act 1: a GPU dies under an inference Deployment -> restart loop, Unhealthy (XID 79) in the
  pod's allocatedResourcesStatus under the driver's CDI device id (as a 1.36 kubelet reports
  it), the twin's Alertmanager holds a firing alert for that GPU;
- act 2: the alert reaches the webhook -> one workflow per GPU (started by the alert), search
  attributes set, a NoExecute DeviceTaintRule selecting exactly the failed device, the pod
  evicted, the replacement Running on the second GPU; Events (printed as `kubectl get events`)
  on the Deployment and the rule for every decision, on the old pod only while it existed;
- act 3: the second GPU dies -> the replacement stays Pending past the (scaled) deadline ->
  one node-pool resize -> a new node with its ResourceSlice -> the replacement Running there;
  the timeline shows pending before the capacity request;
- act 4: both GPUs repaired -> both rules removed, both workflows closed `released`, the
  blast-radius budget holds no lease any more; Sickbay's Events listed cluster-wide.

Acts share one stack and build on each other, in file order.
"""

from __future__ import annotations

from typing import Any

import pytest

from contract.names import BUDGET_WORKFLOW_ID, SA_DEVICE, SA_PHASE
from harness.scenarios import (
    TAINT_RULE_VERSIONS,
    Demo,
    SeedState,
    act1_gpu_dies,
    act2_quarantine,
    act3_scale_up,
    act4_repair,
)
from workflows.budget import BudgetWorkflow

pytestmark = pytest.mark.devserver

STATE = SeedState()


def _need(*attrs: str) -> None:
    for attr in attrs:
        if not getattr(STATE, attr):
            # A failure, not a skip: an act that cannot run has not shown its part of the demo.
            pytest.fail(f"an earlier act did not complete ({attr} missing); acts run in file order")


async def _rules(demo: Demo) -> list[dict[str, Any]]:
    for version in TAINT_RULE_VERSIONS:
        r = await demo.kube.get(f"/apis/resource.k8s.io/{version}/devicetaintrules")
        if r.status_code == 200:
            return list(r.json()["items"])
    return []


async def test_act1_gpu_dies_restart_loop(demo: Demo) -> None:
    await act1_gpu_dies(demo, STATE)
    pods = await demo.pods(STATE.ns, STATE.app)
    [pod] = [p for p in pods if p["metadata"]["name"] == STATE.pod]
    [cs] = pod["status"]["containerStatuses"]
    assert cs["restartCount"] >= 1
    [res] = [r for a in cs["allocatedResourcesStatus"] for r in a["resources"]]
    # As a 1.36 kubelet reports it for NVIDIA's driver: the first CDI device id, not the key.
    claim = pod["status"]["resourceClaimStatuses"][0]["resourceClaimName"]
    uid = (
        await demo.k(
            "GET", f"/apis/resource.k8s.io/v1/namespaces/{STATE.ns}/resourceclaims/{claim}"
        )
    )["metadata"]["uid"]
    cdi = f"k8s.gpu.nvidia.com/claim={uid}-{STATE.device.rsplit('/', 1)[-1]}"
    assert res == {"resourceID": cdi, "health": "Unhealthy", "message": "XID 79"}
    alerts = (await demo.k("GET", "/twin/alerts"))["active"]
    mine = [a for a in alerts if a["labels"]["UUID"] == STATE.gpu1["uuid"]]
    assert mine and mine[0]["labels"]["err_code"] == "79"
    assert mine[0]["labels"]["pod"] == STATE.pod


async def test_act2_alert_taint_eviction_replacement(demo: Demo) -> None:
    _need("gpu1")
    await act2_quarantine(demo, STATE)
    assert STATE.first is not None
    # The alert, not anything else, started the workflow: its first evidence came from
    # Alertmanager through the webhook.
    timeline = await demo.timeline(STATE.first)
    # An Xid 79 fires the fell-off-the-bus alert: its class comes from its name, not a code.
    assert timeline[0].actor == "alertmanager"
    assert timeline[0].outcome == "SickbayGpuFellOffBus" and "Xid 79" in timeline[0].reason
    sent = (await demo.k("GET", "/twin/alerts"))["sent"]
    assert any(a["labels"]["UUID"] == STATE.gpu1["uuid"] for p in sent for a in p["alerts"])
    desc = await demo.handle(STATE.first.workflow_id).describe()
    attrs = desc.search_attributes
    assert attrs[SA_DEVICE] == [f"{STATE.gpu1['node']}/{STATE.gpu1['uuid']}"]
    assert attrs[SA_PHASE] == ["holding"]
    # Exactly the failed device is tainted.
    [rule] = await _rules(demo)
    driver, pool, device = STATE.device.split("/")
    assert rule["spec"]["deviceSelector"] == {"driver": driver, "pool": pool, "device": device}
    assert rule["spec"]["taint"]["effect"] == "NoExecute"
    names = [p["metadata"]["name"] for p in await demo.pods(STATE.ns, STATE.app)]
    assert names == [STATE.replacement]
    assert STATE.device2.split("/")[-1] != device
    # Events: on the Deployment and the rule, and on pods only while they exist.
    assert any(c.startswith("Events on Deployment") for c in demo.checks)
    events = (await demo.k("GET", f"/api/v1/namespaces/{STATE.ns}/events"))["items"]
    mine = [e for e in events if e.get("reportingComponent") == "sickbay"]
    on_pods = {
        (e["involvedObject"]["name"], e["reason"])
        for e in mine
        if e["involvedObject"]["kind"] == "Pod"
    }
    assert (STATE.pod, "GPUQuarantined") in on_pods
    assert (STATE.pod, "GPUReplacementRunning") not in on_pods  # evicted by then
    assert (STATE.replacement, "GPUReplacementRunning") in on_pods


async def test_act3_second_gpu_pending_deadline_scale_up(demo: Demo) -> None:
    _need("device2", "first")
    await act3_scale_up(demo, STATE)
    assert STATE.second is not None
    actions = [(e.action, e.outcome) for e in await demo.timeline(STATE.second)]
    pending = actions.index(("replacement wait", "pending"))
    capacity = next(i for i, (a, _o) in enumerate(actions) if a == "capacity requested")
    assert pending < capacity
    assert actions[capacity][1] in ("satisfied", "requested", "in-progress")
    pools = (await demo.k("GET", "/twin/pools"))["items"]
    [pool] = [p for p in pools if p["name"] == "gpu-pool"]
    assert sorted(pool["nodes"]) == sorted([STATE.gpu1["node"], *STATE.new_nodes])
    slices = (await demo.k("GET", "/apis/resource.k8s.io/v1/resourceslices"))["items"]
    assert any(s["spec"]["nodeName"] == STATE.new_nodes[0] for s in slices)
    assert len(await _rules(demo)) == 2


async def test_act4_repair_lifts_quarantine(demo: Demo) -> None:
    _need("second")
    await act4_repair(demo, STATE)
    assert STATE.first is not None and STATE.second is not None
    for incident in (STATE.first, STATE.second):
        assert incident.result is not None
        assert incident.result.outcome == "released"
        assert incident.result.timeline[-1].action == "closed"
    assert await _rules(demo) == []
    assert any(" Sickbay Events, one per decision" in c for c in demo.checks)
    state = await demo.client.get_workflow_handle(BUDGET_WORKFLOW_ID).query(BudgetWorkflow.state)
    assert state.leases == []
