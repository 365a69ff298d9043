"""The seed incident's three acts, driven only through the official client and the fault API.

Cases (one twin: 1 node x 2 GPUs, Kubernetes 1.36, time scale 200):
1. A Deployment's pod gets a generated claim (owner = pod, pod-claim-name annotation,
   status.resourceClaimStatuses), runs on gpu-0; `POST /twin/faults` (Xid 79) -> the container
   restarts in a loop (restartCount grows, CrashLoopBackOff, kubelet BackOff events) and
   allocatedResourcesStatus says Unhealthy "XID 79" for `claim:gpu` /
   `k8s.gpu.nvidia.com/claim=<claim uid>-gpu-0` (the NVIDIA driver's first CDI device id, as
   the 1.36 kubelet reports it).
2. A NoExecute DeviceTaintRule (v1beta2) on gpu-0 -> rule status PodsPendingEviction with the
   real message, the pod gets DisruptionTarget/DeletionByDeviceTaintManager and a graceful
   deletionTimestamp, a DeviceTaintManagerEviction "Marking for deletion" event; while it is
   Terminating its claim stays allocated; the ReplicaSet's replacement runs on gpu-1; the
   rule turns Completed "1 pod evicted since starting the controller."; after the grace
   period the old pod and its generated claim are gone (kubelet Killing event).
3. gpu-1 dies too and gets a rule -> the next replacement is Pending, PodScheduled=False,
   Unschedulable with the real scheduler message, FailedScheduling events (events.k8s.io/v1
   shape); resizing the pool through /twin/pools adds a node (and its ResourceSlice) after the
   provisioning delay, and the pod runs there.
"""

from __future__ import annotations

from typing import Any

from tests.twin_controllers.conftest import eventually
from tests.twin_controllers.helpers import (
    allocated_device,
    claim_of,
    claim_template,
    condition,
    deployment,
    pods,
    taint_rule,
)

NODE = "gpu-pool-node-0"
UNSCHEDULABLE = (
    "0/1 nodes are available: 1 cannot allocate all claims. still not schedulable, preemption: "
    "0/1 nodes are available: 1 Preemption is not helpful for scheduling."
)


def _live(t: Any, ns: str) -> list[Any]:
    return [p for p in pods(t.core, ns) if p.metadata.deletion_timestamp is None]


def test_seed_incident_three_acts(twin: Any) -> None:
    t = twin()
    ns = t.namespace("training")
    t.dra.create_namespaced_resource_claim_template(ns, claim_template("gpu"))
    t.apps.create_namespaced_deployment(ns, deployment("trainer", "gpu"))

    # --- Act 1: running on gpu-0, then the GPU dies -------------------------------------
    def running() -> Any:
        (pod,) = pods(t.core, ns)
        assert pod.status.phase == "Running" and pod.spec.node_name == NODE
        return pod

    pod = eventually(running)
    claim = claim_of(t.dra, pod)
    assert claim.metadata.annotations["resource.kubernetes.io/pod-claim-name"] == "gpu"
    assert claim.metadata.owner_references[0].kind == "Pod"
    assert claim.metadata.owner_references[0].uid == pod.metadata.uid
    assert claim.metadata.name.startswith(f"{pod.metadata.name}-gpu-")
    assert claim.status.reserved_for[0].uid == pod.metadata.uid
    assert allocated_device(t.dra, pod) == f"gpu.nvidia.com/{NODE}/gpu-0"

    response = t.twin("POST", "/twin/faults", {"node": NODE, "gpu": "0", "xid": 79})
    assert response.status_code == 201, response.text
    assert response.json()["items"][0]["health"] == "Unhealthy"

    def crash_looping() -> Any:
        (p,) = pods(t.core, ns)
        cs = p.status.container_statuses[0]
        assert cs.restart_count >= 3, cs.restart_count
        # Between restarts (waiting in back-off) or in one (running): the loop decides which.
        assert cs.state.waiting is not None or cs.state.running is not None
        health = cs.allocated_resources_status[0]
        assert health.name == "claim:gpu"
        # As the 1.36 kubelet writes it: the NVIDIA driver's first CDI device id.
        uid = claim_of(t.dra, p).metadata.uid
        assert health.resources[0].resource_id == f"k8s.gpu.nvidia.com/claim={uid}-gpu-0"
        assert health.resources[0].health == "Unhealthy"
        return p

    pod = eventually(crash_looping)
    assert pod.status.phase == "Running"
    assert pod.status.container_statuses[0].last_state.terminated.exit_code != 0

    def in_backoff() -> bool:
        (p,) = pods(t.core, ns)
        waiting = p.status.container_statuses[0].state.waiting
        return waiting is not None and waiting.reason == "CrashLoopBackOff"

    eventually(in_backoff)
    backoffs = [
        e
        for e in t.core.list_namespaced_event(ns).items
        if e.reason == "BackOff" and e.involved_object.name == pod.metadata.name
    ]
    assert backoffs and backoffs[0].type == "Warning"
    assert backoffs[0].message.startswith("Back-off restarting failed container main in pod ")
    assert (backoffs[0].source.component, backoffs[0].source.host) == ("kubelet", NODE)

    # --- Act 2: quarantine gpu-0 with a NoExecute rule ----------------------------------
    t.dra_beta2.create_device_taint_rule(taint_rule("gpu0-down", NODE, "gpu-0"))

    def pending_eviction() -> Any:
        rule = t.dra_beta2.read_device_taint_rule("gpu0-down")
        cond = rule.status.conditions[0]
        assert (cond.type, cond.status, cond.reason) == (
            "EvictionInProgress",
            "True",
            "PodsPendingEviction",
        )
        assert cond.message == "1 pod needs to be evicted in 1 namespace."
        assert cond.observed_generation == 1
        return rule

    eventually(pending_eviction, timeout=5)

    def evicted() -> Any:
        old = t.core.read_namespaced_pod(pod.metadata.name, ns)
        assert old.metadata.deletion_timestamp is not None
        assert old.metadata.deletion_grace_period_seconds == 30
        target = condition(old, "DisruptionTarget")
        assert target.status == "True" and target.reason == "DeletionByDeviceTaintManager"
        assert target.message == "Device Taint manager: deleting due to NoExecute taint"
        return old

    terminating = eventually(evicted)
    # The Terminating pod still holds its claim (and so gpu-0) until the kubelet finishes it.
    old_claim = claim_of(t.dra, terminating)
    assert old_claim.status.allocation is not None
    assert old_claim.status.reserved_for[0].uid == pod.metadata.uid

    events = t.core.list_namespaced_event(
        ns, field_selector=f"involvedObject.name={pod.metadata.name}"
    ).items
    marking = [e for e in events if e.reason == "DeviceTaintManagerEviction"]
    assert marking and marking[0].message == "Marking for deletion"
    assert marking[0].source.component == "device-taint-eviction-controller"

    def replacement_running() -> Any:
        live = _live(t, ns)
        assert len(live) == 1 and live[0].metadata.name != pod.metadata.name
        assert live[0].status.phase == "Running"
        assert allocated_device(t.dra, live[0]) == f"gpu.nvidia.com/{NODE}/gpu-1"
        return live[0]

    replacement = eventually(replacement_running)

    def completed() -> bool:
        cond = t.dra_beta2.read_device_taint_rule("gpu0-down").status.conditions[0]
        assert (cond.status, cond.reason) == ("False", "Completed"), cond
        assert cond.message == "1 pod evicted since starting the controller."
        return True

    eventually(completed)

    def old_gone() -> bool:
        names = {p.metadata.name for p in pods(t.core, ns)}
        claims = {c.metadata.name for c in t.dra.list_namespaced_resource_claim(ns).items}
        return pod.metadata.name not in names and old_claim.metadata.name not in claims

    eventually(old_gone)
    killing = [
        e
        for e in t.core.list_namespaced_event(ns).items
        if e.reason == "Killing" and e.involved_object.name == pod.metadata.name
    ]
    assert killing and killing[0].message == "Stopping container main"

    # --- Act 3: the second GPU dies too; scale the pool -----------------------------------
    assert t.twin("POST", "/twin/faults", {"node": NODE, "gpu": "1", "xid": 79}).status_code == 201
    t.dra_beta2.create_device_taint_rule(taint_rule("gpu1-down", NODE, "gpu-1"))

    def unschedulable() -> Any:
        live = [p for p in _live(t, ns) if p.metadata.name != replacement.metadata.name]
        assert len(live) == 1
        cond = condition(live[0], "PodScheduled")
        assert (cond.status, cond.reason, cond.message) == ("False", "Unschedulable", UNSCHEDULABLE)
        assert live[0].status.phase == "Pending"
        return live[0]

    stuck = eventually(unschedulable)
    failed = t.events.list_namespaced_event(
        ns, field_selector=f"regarding.name={stuck.metadata.name},reason=FailedScheduling"
    ).items
    assert failed, "no FailedScheduling event"
    assert failed[0].note == UNSCHEDULABLE
    assert failed[0].type == "Warning" and failed[0].action == "Scheduling"
    assert failed[0].reporting_controller == "default-scheduler"
    # Its claim exists but is not allocated (golden 56).
    status = claim_of(t.dra, stuck).status  # None or empty: both say "no allocation"
    assert (status.allocation if status else None) is None

    resized = t.twin("POST", "/twin/pools/gpu-pool/resize", {"size": 2})
    assert resized.status_code == 200, resized.text
    assert resized.json()["provisioning"] == 1

    def new_node_runs_it() -> Any:
        p = t.core.read_namespaced_pod(stuck.metadata.name, ns)
        assert p.spec.node_name == "gpu-pool-node-1"
        assert p.status.phase == "Running"
        return p

    eventually(new_node_runs_it)
    node = t.core.read_node("gpu-pool-node-1")
    assert node.metadata.labels["sickbay.dev/node-pool"] == "gpu-pool"
    slices = t.dra.list_resource_slice(field_selector="spec.nodeName=gpu-pool-node-1").items
    assert len(slices) == 1 and len(slices[0].spec.devices) == 2
