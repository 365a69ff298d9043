"""Quarantine, preview, release, budget count and fallback against the twin over HTTP.

Cases:
- DRA profiles serving DeviceTaintRule (1.35 v1alpha3, 1.36 v1beta2, 1.37 v1): the rule is
  created in the preferred version with the managed-by label, workflow/reason/device
  annotations and the exact selector; repeating is "unchanged" (no second rule, no write);
  a different effect is "updated"; a MIG GPU gets one rule per slice;
- a same-named rule Sickbay did not create is neither changed nor deleted;
- release deletes Sickbay's rules, absent is success, and is idempotent;
- count_devices counts physical GPUs per pool/cluster and Sickbay's quarantines;
- preview (effect None) leaves no rule behind and names the pods that would be evicted;
- fallback (1.34, device plugin): consumers evicted through the Eviction API; a PDB that
  allows no disruption blocks (429) and is reported; the node is tainted only below the
  healthy-GPU threshold, and release removes exactly Sickbay's taint and marks;
- evict_pods: 201 evicted, 404 gone, 429 blocked, force delete when blocked, heartbeats
  while it works; with retry_blocked_for, a blocked pod is tried again with doubling backoff
  and evicted once the budget frees; a budget that never frees is reported by its name and
  the server's message after the whole window, the pod untouched; dry run
  (server-side dryRun=All) changes nothing;
- release deletes by the recorded rule uid (precondition; one request, no list); a rule
  replaced by a foreign one under the same name is left alone;
- cordon/uncordon only undo Sickbay's own cordon;
- record_event: one Event per target, source sickbay, message with the workflow id, no
  duplicate on retry; aggregated: one Event per workflow, object and reason whose count a
  repeat PATCHes (deploy/rbac.yaml allows it), a retry changes nothing.
"""

from __future__ import annotations

import time
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from temporalio.exceptions import ApplicationError

from activities.kube import quarantine
from contract.errors import ERR_INVALID_INPUT
from contract.kube import (
    CordonInput,
    CountDevicesInput,
    DeviceRef,
    EventTarget,
    EvictPodsInput,
    PodRef,
    QuarantineInput,
    RecordEventInput,
    ReleaseInput,
    ResolveDeviceInput,
)
from contract.names import (
    ANN_DEVICE_KEY,
    ANN_WORKFLOW_ID,
    LABEL_MANAGED_BY,
    TAINT_KEY,
    taint_rule_name,
)
from tests.activities.kube.conftest import KubeTwin, twin

RULES = "devicetaintrules.resource.k8s.io"
WF = "sickbay-gpu-test"


async def _resolved(t: KubeTwin, node: str, index: int):
    return await t.run(
        t.acts.resolve_device,
        ResolveDeviceInput(device=DeviceRef(node=node, gpu_uuid=t.uuid_of(node, index))),
    )


@pytest.mark.parametrize(
    "profile,version", [("1.35", "v1alpha3"), ("1.36", "v1beta2"), ("1.37", "v1")]
)
async def test_rule_created_idempotent_updated_released(
    tmp_path: Path, profile: str, version: str
) -> None:
    with twin(tmp_path, profile) as t:
        node = t.node(0)
        device = await _resolved(t, node, 1)
        inp = QuarantineInput(device=device, workflow_id=WF, reason="xid 79", taint_value="xid-79")
        first = await t.run(t.acts.quarantine_device, inp)
        name = taint_rule_name(node, device.gpu_uuid)
        assert (first.mode, first.action, first.rule_name, first.api_version) == (
            "rule",
            "created",
            name,
            version,
        )
        creates = [
            r for r in t.requests() if r.verb == "create" and r.resource == "devicetaintrules"
        ]
        assert [r.version for r in creates] == [version]
        rule = t.store.get(RULES, name)
        assert rule["metadata"]["labels"][LABEL_MANAGED_BY] == "sickbay"
        assert rule["metadata"]["annotations"][ANN_WORKFLOW_ID] == WF
        assert rule["metadata"]["annotations"][ANN_DEVICE_KEY] == device.key
        assert rule["spec"]["deviceSelector"] == {
            "driver": "gpu.nvidia.com",
            "pool": node,
            "device": "gpu-1",
        }
        assert rule["spec"]["taint"]["key"] == TAINT_KEY
        assert rule["spec"]["taint"]["effect"] == "NoExecute"

        writes_before = len([r for r in t.requests() if r.method != "GET" and r.status < 300])
        again = await t.run(t.acts.quarantine_device, inp)
        assert again.action == "unchanged"
        assert (
            len([r for r in t.requests() if r.method != "GET" and r.status < 300]) == writes_before
        )
        assert len(t.store.list(RULES).items) == 1

        changed = await t.run(
            t.acts.quarantine_device, inp.model_copy(update={"effect": "NoSchedule"})
        )
        assert changed.action == "updated"
        assert t.store.get(RULES, name)["spec"]["taint"]["effect"] == "NoSchedule"

        counts = await t.run(t.acts.count_devices, CountDevicesInput(node_pool="gpu-pool"))
        assert (counts.cluster_devices, counts.pool_devices) == (4, 4)
        assert (counts.cluster_quarantined, counts.pool_quarantined) == (1, 1)

        released = await t.run(
            t.acts.release_quarantine,
            ReleaseInput(device=device, rule_name=name, api_version=version, workflow_id=WF),
        )
        assert released.removed and t.store.try_get(RULES, name) is None
        again = await t.run(
            t.acts.release_quarantine, ReleaseInput(device=device, rule_name=name, workflow_id=WF)
        )
        assert not again.removed and "absent" in again.message


async def test_foreign_rule_is_never_touched(tmp_path: Path) -> None:
    with twin(tmp_path, "1.37") as t:
        node = t.node(0)
        device = await _resolved(t, node, 0)
        name = taint_rule_name(node, device.gpu_uuid)
        t.store.create(
            RULES,
            {
                "metadata": {"name": name},
                "spec": {
                    "deviceSelector": {"driver": "gpu.nvidia.com", "pool": node, "device": "gpu-0"},
                    "taint": {"key": "admin.example/broken", "effect": "NoSchedule"},
                },
            },
        )
        with pytest.raises(ApplicationError) as info:
            await t.run(t.acts.quarantine_device, QuarantineInput(device=device, workflow_id=WF))
        assert info.value.type == ERR_INVALID_INPUT and info.value.non_retryable
        released = await t.run(
            t.acts.release_quarantine, ReleaseInput(device=device, rule_name=name, workflow_id=WF)
        )
        assert not released.removed
        assert t.store.get(RULES, name)["spec"]["taint"]["key"] == "admin.example/broken"


async def test_mig_gpu_gets_one_rule_per_slice(tmp_path: Path) -> None:
    with twin(tmp_path, "1.36", nodes=1, topology="mig", slices_per_gpu=2) as t:
        node = t.node(0)
        physical = t.slice_device(node, "gpu-0-mig-0")["attributes"]["parentUUID"]["string"]
        device = await t.run(
            t.acts.resolve_device,
            ResolveDeviceInput(device=DeviceRef(node=node, gpu_uuid=physical)),
        )
        await t.run(t.acts.quarantine_device, QuarantineInput(device=device, workflow_id=WF))
        rules = t.store.list(RULES).items
        assert sorted(r["spec"]["deviceSelector"]["device"] for r in rules) == [
            "gpu-0-mig-0",
            "gpu-0-mig-1",
        ]
        counts = await t.run(t.acts.count_devices, CountDevicesInput(node_pool="gpu-pool"))
        assert counts.cluster_quarantined == 1  # one physical GPU
        await t.run(t.acts.release_quarantine, ReleaseInput(device=device, workflow_id=WF))
        assert t.store.list(RULES).items == []


async def test_preview_names_would_be_evicted_and_leaves_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from activities.kube import quarantine

    monkeypatch.setattr(quarantine, "PREVIEW_WAIT_SECONDS", 1)  # no controllers: no verdict
    with twin(tmp_path, "1.36") as t:
        node = t.node(0)
        t.consumer_pod("ml", "victim", node, "gpu-0")
        device = await _resolved(t, node, 0)
        result = await t.run(
            t.acts.preview_quarantine, QuarantineInput(device=device, workflow_id=WF)
        )
        assert result.mode == "dry-run"
        assert [p.name for p in result.would_evict] == ["victim"]
        assert "does not seem to run" in result.message
        assert t.store.list(RULES).items == []
        creates = [
            r for r in t.requests() if r.resource == "devicetaintrules" and r.verb == "create"
        ]
        deletes = [
            r for r in t.requests() if r.resource == "devicetaintrules" and r.verb == "delete"
        ]
        assert len(creates) == len(deletes) == 1


def _pdb(t: KubeTwin, ns: str, app: str) -> None:
    t.store.create(
        "poddisruptionbudgets.policy",
        {
            "metadata": {"name": f"{app}-pdb", "namespace": ns},
            "spec": {"minAvailable": 1, "selector": {"matchLabels": {"app": app}}},
        },
        namespace=ns,
    )


@pytest.mark.parametrize("profile", ["1.34", "device-plugin"])
async def test_fallback_eviction_with_and_without_pdb(tmp_path: Path, profile: str) -> None:
    with twin(tmp_path, profile, nodes=1, gpus_per_node=2) as t:
        node = t.node(0)
        device = await _resolved(t, node, 0)
        free = t.consumer_pod(
            "ml", "free", node, "gpu-0", labels={"app": "free"}, gpu_uuid=device.gpu_uuid
        )
        guarded = t.consumer_pod(
            "ml", "guarded", node, "gpu-0", labels={"app": "guarded"}, gpu_uuid=device.gpu_uuid
        )
        _pdb(t, "ml", "guarded")
        await _wait_pdb_status(t, "ml", "guarded-pdb")
        refs = [
            PodRef(namespace="ml", name=p["metadata"]["name"], uid=p["metadata"]["uid"])
            for p in (free, guarded)
        ]
        inp = QuarantineInput(
            device=device, workflow_id=WF, consumers=refs, fallback_node_threshold=1
        )
        result = await t.run(t.acts.quarantine_device, inp)
        assert result.mode == "fallback"
        assert [p.name for p in result.evicted] == ["free"]
        assert [p.name for p in result.blocked] == ["guarded"]
        assert not result.node_tainted  # 1 healthy GPU left, threshold 1
        evicted = t.store.try_get("pods", "free", "ml")
        # Evicted: Terminating for its 30 s grace period (no kubelet runs here to end it).
        assert evicted is not None
        assert evicted["metadata"].get("deletionTimestamp")
        assert not t.store.get("pods", "guarded", "ml")["metadata"].get("deletionTimestamp")

        second = await _resolved(t, node, 1)
        result2 = await t.run(
            t.acts.quarantine_device,
            QuarantineInput(device=second, workflow_id=WF + "-2", fallback_node_threshold=1),
        )
        assert result2.node_tainted  # 0 healthy left < 1
        taints = t.store.get("nodes", node)["spec"].get("taints") or []
        assert [x["key"] for x in taints] == [TAINT_KEY]
        counts = await t.run(t.acts.count_devices, CountDevicesInput(node_pool="gpu-pool"))
        assert counts.cluster_quarantined == 2

        await t.run(
            t.acts.release_quarantine,
            ReleaseInput(device=device, node_tainted=True, workflow_id=WF),
        )
        assert t.store.get("nodes", node)["spec"].get("taints")  # the other GPU still needs it
        await t.run(
            t.acts.release_quarantine,
            ReleaseInput(device=second, node_tainted=True, workflow_id=WF + "-2"),
        )
        node_obj = t.store.get("nodes", node)
        assert not node_obj["spec"].get("taints")
        assert "sickbay.dev/quarantined-gpus" not in (node_obj["metadata"].get("annotations") or {})


async def _wait_pdb_status(t: KubeTwin, ns: str, name: str) -> None:
    import asyncio

    for _ in range(300):
        pdb = t.store.get("poddisruptionbudgets.policy", name, ns)
        if (pdb.get("status") or {}).get("observedGeneration"):
            return
        await asyncio.sleep(0.05)
    raise AssertionError("the twin's disruption controller never computed the PDB status")


async def test_evict_pods_outcomes(tmp_path: Path) -> None:
    with twin(tmp_path, "1.37", nodes=1) as t:
        node = t.node(0)
        t.consumer_pod("ml", "a", node, "gpu-0", labels={"app": "a"})
        t.consumer_pod("ml", "b", node, "gpu-1", labels={"app": "b"})
        _pdb(t, "ml", "b")
        await _wait_pdb_status(t, "ml", "b-pdb")
        pods = [PodRef(namespace="ml", name=n) for n in ("a", "b", "ghost")]
        dry = await t.run(
            t.acts.evict_pods, EvictPodsInput(pods=pods[:1], workflow_id=WF, dry_run=True)
        )
        assert [p.name for p in dry.evicted] == ["a"]  # the server says it would be allowed
        assert not t.store.get("pods", "a", "ml")["metadata"].get("deletionTimestamp")
        beats = len(t.heartbeats)
        result = await t.run(t.acts.evict_pods, EvictPodsInput(pods=pods, workflow_id=WF))
        assert len(t.heartbeats) > beats  # heartbeats while evicting (30 s heartbeat_timeout)
        assert ([p.name for p in result.evicted], [p.name for p in result.blocked]) == (
            ["a"],
            ["b"],
        )
        assert [p.name for p in result.gone] == ["ghost"]
        forced = await t.run(
            t.acts.evict_pods,
            EvictPodsInput(pods=pods[1:2], workflow_id=WF, delete_if_blocked=True),
        )
        assert [p.name for p in forced.deleted] == ["b"]


class _FakeTime:
    """The retry loop's clock and sleep: sleeping moves the clock, and may change the world."""

    def __init__(self, on_sleep: Any = None) -> None:
        self.now = 1000.0
        self.slept: list[float] = []
        self.on_sleep = on_sleep

    def clock(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.slept.append(seconds)
        self.now += seconds
        if self.on_sleep is not None:
            self.on_sleep(len(self.slept))


def _wait_healthy(t: KubeTwin, ns: str, name: str, healthy: int) -> None:
    deadline = time.monotonic() + 10  # the disruption controller reacts within milliseconds
    while time.monotonic() < deadline:
        status = t.store.get("poddisruptionbudgets.policy", name, ns).get("status") or {}
        if status.get("currentHealthy") == healthy:
            return
        time.sleep(0.02)
    raise AssertionError(f"PDB {name} never saw {healthy} healthy pods")


async def test_blocked_eviction_is_retried_until_the_budget_frees(tmp_path: Path) -> None:
    """429 is "not now", not "never": a second Ready pod frees the budget during the backoff
    and the retry evicts the pod, without deleting anything past the budget."""
    with twin(tmp_path, "1.37", nodes=1) as t:
        node = t.node(0)
        t.consumer_pod("ml", "b", node, "gpu-0", labels={"app": "b"})
        _pdb(t, "ml", "b")
        await _wait_pdb_status(t, "ml", "b-pdb")

        def replacement_ready(n: int) -> None:
            if n == 2:  # after two refused tries, the replacement turns Ready
                t.consumer_pod("ml", "b-new", node, "gpu-1", labels={"app": "b"})
                _wait_healthy(t, "ml", "b-pdb", 2)

        fake = _FakeTime(replacement_ready)
        inp = EvictPodsInput(
            pods=[PodRef(namespace="ml", name="b")],
            workflow_id=WF,
            retry_blocked_for=timedelta(minutes=30),
        )
        result = quarantine.evict_pods(t.acts._kube, inp, sleep=fake.sleep, clock=fake.clock)
        assert [p.name for p in result.evicted] == ["b"] and result.blocked == []
        assert result.attempts == 3 and fake.slept == [5.0, 10.0]  # backoff doubles
        assert t.store.get("pods", "b", "ml")["metadata"].get("deletionTimestamp")
        assert result.deleted == []


async def test_budget_that_never_frees_is_reported_by_name(tmp_path: Path) -> None:
    with twin(tmp_path, "1.37", nodes=1) as t:
        node = t.node(0)
        t.consumer_pod("ml", "llm-worker-0", node, "gpu-0", labels={"app": "llm-worker"})
        _pdb(t, "ml", "llm-worker")
        await _wait_pdb_status(t, "ml", "llm-worker-pdb")
        fake = _FakeTime()
        inp = EvictPodsInput(
            pods=[PodRef(namespace="ml", name="llm-worker-0")],
            workflow_id=WF,
            retry_blocked_for=timedelta(minutes=5),
        )
        result = quarantine.evict_pods(t.acts._kube, inp, sleep=fake.sleep, clock=fake.clock)
        assert [p.name for p in result.blocked] == ["llm-worker-0"]
        assert sum(fake.slept) == 300.0 and max(fake.slept) == 60.0  # the whole window
        assert result.budgets == [
            "ml/llm-worker-0: The disruption budget llm-worker-pdb needs 1 healthy pods and "
            "has 1 currently"
        ]
        assert quarantine.budget_names(result) == ["llm-worker-pdb"]
        assert not t.store.get("pods", "llm-worker-0", "ml")["metadata"].get("deletionTimestamp")


async def test_cordon_only_undoes_its_own(tmp_path: Path) -> None:
    with twin(tmp_path, "1.37", nodes=2) as t:
        mine, theirs = t.node(0), t.node(1)
        t.store.mutate("nodes", theirs, lambda n: n["spec"].update(unschedulable=True))
        r = await t.run(t.acts.cordon_node, CordonInput(node=mine, workflow_id=WF))
        assert r.changed and t.store.get("nodes", mine)["spec"]["unschedulable"]
        r = await t.run(t.acts.cordon_node, CordonInput(node=mine, workflow_id=WF))
        assert not r.changed
        r = await t.run(t.acts.cordon_node, CordonInput(node=theirs, workflow_id=WF))
        assert not r.changed and "someone else" in r.message
        r = await t.run(t.acts.cordon_node, CordonInput(node=theirs, cordon=False, workflow_id=WF))
        assert not r.changed and t.store.get("nodes", theirs)["spec"]["unschedulable"]
        r = await t.run(t.acts.cordon_node, CordonInput(node=mine, cordon=False, workflow_id=WF))
        assert r.changed and not t.store.get("nodes", mine)["spec"].get("unschedulable")
        r = await t.run(t.acts.cordon_node, CordonInput(node="ghost", workflow_id=WF))
        assert not r.changed and "does not exist" in r.message


async def test_record_event_once_per_target(tmp_path: Path) -> None:
    with twin(tmp_path, "1.37", nodes=1) as t:
        t.consumer_pod("ml", "p", t.node(0), "gpu-0")
        inp = RecordEventInput(
            targets=[
                EventTarget(api_version="v1", kind="Pod", name="p", namespace="ml"),
                EventTarget(api_version="resource.k8s.io/v1", kind="DeviceTaintRule", name="r"),
            ],
            reason="Quarantined",
            message="GPU quarantined",
            workflow_id=WF,
        )
        await t.run(t.acts.record_event, inp)
        await t.run(t.acts.record_event, inp)  # a retry: same names, no duplicates
        events = [
            e
            for e in t.store.list("events").items
            if (e.get("source") or {}).get("component") == "sickbay"
        ]
        assert len(events) == 2
        assert {e["metadata"]["namespace"] for e in events} == {"ml", "default"}
        assert all(WF in e["message"] and e["reportingComponent"] == "sickbay" for e in events)


async def test_node_event_takes_the_kubelets_uid_without_a_read(tmp_path: Path) -> None:
    """An Event about a node names it by uid = the node's name, as the kubelet's own node
    Events do (`kubectl describe node` lists both the node's uid and its name, kubectl
    pkg/describe NodeDescriber): no read of the node before the write, and still shown after
    the node object is recreated under the same name. A pod's Event still reads the pod's uid
    (a pod has no such convention)."""
    with twin(tmp_path, "1.37", nodes=1) as t:
        node = t.node(0)
        t.consumer_pod("ml", "p", node, "gpu-0")
        t.clear_requests()
        await t.run(
            t.acts.record_event,
            RecordEventInput(
                targets=[EventTarget(api_version="v1", kind="Node", name=node)],
                reason="GPUQuarantined",
                message="GPU quarantined",
                workflow_id=WF,
            ),
        )
        calls = [(r.verb, r.resource) for r in t.requests()]
        assert calls == [("create", "events")], calls
        (event,) = [
            e
            for e in t.store.list("events").items
            if e["involvedObject"].get("kind") == "Node" and e.get("reason") == "GPUQuarantined"
        ]
        assert event["involvedObject"]["uid"] == node
        assert event["involvedObject"]["name"] == node
        t.clear_requests()
        await t.run(
            t.acts.record_event,
            RecordEventInput(
                targets=[EventTarget(api_version="v1", kind="Pod", name="p", namespace="ml")],
                reason="GPUQuarantined",
                message="GPU quarantined",
                workflow_id=WF,
            ),
        )
        calls = [(r.verb, r.resource) for r in t.requests()]
        assert calls == [("list", "pods"), ("create", "events")], calls


async def test_aggregated_event_raises_its_count(tmp_path: Path) -> None:
    """A remediation's decision told again about the same object is one Event whose count
    rises (as `kubectl get events` shows `(x2)`), through the RBAC of deploy/rbac.yaml; a retry
    of the same call changes nothing."""
    from tests.activities.kube.test_kube_e2e import RULES as RBAC_RULES

    with twin(tmp_path, "1.36", nodes=1, proxy_rules=RBAC_RULES) as t:
        node = t.node(0)

        def told(count: int, run: str = "run-1") -> RecordEventInput:
            return RecordEventInput(
                targets=[EventTarget(api_version="v1", kind="Node", name=node, count=count)],
                reason="GPURemediationEscalated",
                message=f"escalation number {count} of {run}",
                type="Warning",
                workflow_id=WF,
                aggregate=True,
                series=f"{WF}/{run}",
            )

        await t.run(t.acts.record_event, told(1))
        await t.run(t.acts.record_event, told(2))
        await t.run(t.acts.record_event, told(2))  # a retry: absolute count, no change
        events = [
            e
            for e in t.store.list("events", "default").items
            if e.get("reason") == "GPURemediationEscalated"
        ]
        assert len(events) == 1
        (event,) = events
        assert event["count"] == 2 and event["message"].startswith("escalation number 2")
        assert event["involvedObject"]["kind"] == "Node" and event["type"] == "Warning"
        # A later incident of the same GPU (same workflow id, new run chain): its own Event.
        await t.run(t.acts.record_event, told(1, run="run-2"))
        later = [
            e
            for e in t.store.list("events", "default").items
            if e.get("reason") == "GPURemediationEscalated"
        ]
        assert sorted((e["count"], e["message"][:28]) for e in later) == [
            (1, "escalation number 1 of run-2"),
            (2, "escalation number 2 of run-1"),
        ]
        assert t.proxy is not None and t.proxy.denied == []


async def test_release_by_uid_precondition(tmp_path: Path) -> None:
    """The quarantine records its rule's uid; release deletes with that uid as precondition:
    one request, no list. A rule replaced under the same name by someone else (other uid,
    not Sickbay's) is left alone."""
    with twin(tmp_path, "1.37") as t:
        node = t.node(0)
        device = await _resolved(t, node, 0)
        result = await t.run(
            t.acts.quarantine_device, QuarantineInput(device=device, workflow_id=WF)
        )
        name = result.rule_name
        assert name and result.rule_uids[name] == t.store.get(RULES, name)["metadata"]["uid"]
        t.clear_requests()
        released = await t.run(
            t.acts.release_quarantine,
            ReleaseInput(
                device=device,
                rule_name=name,
                api_version=result.api_version,
                workflow_id=WF,
                rule_uids=result.rule_uids,
            ),
        )
        assert released.removed and t.store.try_get(RULES, name) is None
        assert [(r.verb, r.resource) for r in t.requests()] == [("delete", "devicetaintrules")]

        again = await t.run(
            t.acts.quarantine_device, QuarantineInput(device=device, workflow_id=WF)
        )
        t.store.delete(RULES, name)
        t.store.create(
            RULES,
            {
                "metadata": {"name": name},
                "spec": {
                    "deviceSelector": {"driver": "gpu.nvidia.com", "pool": node, "device": "gpu-0"},
                    "taint": {"key": "admin.example/broken", "effect": "NoSchedule"},
                },
            },
        )
        stale = await t.run(
            t.acts.release_quarantine,
            ReleaseInput(device=device, rule_name=name, workflow_id=WF, rule_uids=again.rule_uids),
        )
        assert not stale.removed
        assert t.store.get(RULES, name)["spec"]["taint"]["key"] == "admin.example/broken"
