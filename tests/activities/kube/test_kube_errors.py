"""403 and 404 paths against the twin over HTTP (403s come from the RBAC-enforcing proxy in
front of the twin, holding a role without the verb in question).

Cases:
- 403: quarantine without `create devicetaintrules` -> non-retryable ERR_FORBIDDEN naming the
  verb and the resource; nothing half-done (no rule exists afterwards); listing claims
  forbidden -> the same for consumers; eviction forbidden -> ERR_FORBIDDEN;
- 404 on the target is an outcome, not a crash: evicting a missing pod -> "gone"; releasing
  an absent rule -> success; cordoning a missing node -> not changed; waiting for a missing
  pod -> gone at once; resolving on a missing node -> ERR_DEVICE_NOT_FOUND;
- 401 (bad token) -> non-retryable ERR_CONFIG; API unreachable -> retryable error.
"""

from __future__ import annotations

import copy
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from temporalio.exceptions import ApplicationError

from activities.kube import KubeActivities, KubeSettings
from contract.errors import ERR_CONFIG, ERR_DEVICE_NOT_FOUND, ERR_FORBIDDEN, ERR_KUBE_UNAVAILABLE
from contract.kube import (
    CordonInput,
    DeviceRef,
    EvictPodsInput,
    FindConsumersInput,
    PodRef,
    QuarantineInput,
    ReleaseInput,
    ResolveDeviceInput,
    WaitEvictionInput,
)
from tests.activities.kube.conftest import twin
from tests.activities.kube.rbac_proxy import deploy_rules

RULES: list[dict[str, Any]] = deploy_rules()  # every ClusterRole deploy/ ships


def without(group: str, resource: str, verb: str) -> list[dict[str, Any]]:
    rules = copy.deepcopy(RULES)
    for rule in rules:
        if group in rule["apiGroups"] and resource in rule["resources"] and verb in rule["verbs"]:
            if len(rule["resources"]) > 1:
                rule["resources"].remove(resource)
                rules.append(
                    {
                        "apiGroups": [group],
                        "resources": [resource],
                        "verbs": [v for v in rule["verbs"] if v != verb],
                    }
                )
            else:
                rule["verbs"].remove(verb)
    return rules


async def test_forbidden_rule_create_is_non_retryable_and_leaves_nothing(tmp_path: Path) -> None:
    with twin(
        tmp_path, "1.37", proxy_rules=without("resource.k8s.io", "devicetaintrules", "create")
    ) as t:
        node = t.node(0)
        device = await t.run(
            t.acts.resolve_device,
            ResolveDeviceInput(device=DeviceRef(node=node, gpu_index=0)),
        )
        with pytest.raises(ApplicationError) as info:
            await t.run(t.acts.quarantine_device, QuarantineInput(device=device, workflow_id="wf"))
        err = info.value
        assert err.type == ERR_FORBIDDEN and err.non_retryable
        assert "'create'" in str(err) and "devicetaintrules" in str(err)
        assert t.store.list("devicetaintrules.resource.k8s.io").items == []


async def test_forbidden_list_claims_and_eviction(tmp_path: Path) -> None:
    rules = without("resource.k8s.io", "resourceclaims", "list")
    rules = [r for r in rules if "pods/eviction" not in r["resources"]]
    with twin(tmp_path, "1.36", proxy_rules=rules) as t:
        node = t.node(0)
        t.consumer_pod("ml", "p", node, "gpu-0")
        device = await t.run(
            t.acts.resolve_device, ResolveDeviceInput(device=DeviceRef(node=node, gpu_index=0))
        )
        with pytest.raises(ApplicationError) as info:
            await t.run(t.acts.find_consumers, FindConsumersInput(device=device))
        assert info.value.type == ERR_FORBIDDEN and "'list'" in str(info.value)
        assert "resourceclaims" in str(info.value)
        with pytest.raises(ApplicationError) as info:
            await t.run(
                t.acts.evict_pods,
                EvictPodsInput(pods=[PodRef(namespace="ml", name="p")], workflow_id="wf"),
            )
        assert info.value.type == ERR_FORBIDDEN and "pods/eviction" in str(info.value)


async def test_not_found_targets_are_outcomes(tmp_path: Path) -> None:
    with twin(tmp_path, "1.37") as t:
        node = t.node(0)
        ghost = PodRef(namespace="ml", name="ghost")
        evicted = await t.run(t.acts.evict_pods, EvictPodsInput(pods=[ghost], workflow_id="wf"))
        assert evicted.gone == [ghost] and not evicted.evicted
        device = await t.run(
            t.acts.resolve_device, ResolveDeviceInput(device=DeviceRef(node=node, gpu_index=0))
        )
        released = await t.run(
            t.acts.release_quarantine, ReleaseInput(device=device, workflow_id="wf")
        )
        assert not released.removed
        cordoned = await t.run(t.acts.cordon_node, CordonInput(node="ghost-node", workflow_id="wf"))
        assert not cordoned.changed
        report = await t.run(
            t.acts.wait_for_eviction, WaitEvictionInput(pods=[ghost], timeout=timedelta(seconds=5))
        )
        assert report.gone == [ghost] and not report.timed_out
        with pytest.raises(ApplicationError) as info:
            await t.run(
                t.acts.resolve_device,
                ResolveDeviceInput(device=DeviceRef(node="ghost-node", gpu_index=0)),
            )
        assert info.value.type == ERR_DEVICE_NOT_FOUND and info.value.non_retryable


async def test_bad_token_and_unreachable(tmp_path: Path) -> None:
    with twin(tmp_path, "1.37", token="right", kube_token="wrong") as t:
        with pytest.raises(ApplicationError) as info:
            await t.run(
                t.acts.resolve_device,
                ResolveDeviceInput(device=DeviceRef(node=t.node(0), gpu_index=0)),
            )
        assert info.value.type == ERR_CONFIG and info.value.non_retryable
        kubeconfig = t.kubeconfig
    # The twin is stopped now: connection refused is transient, Temporal retries it.
    acts = KubeActivities(KubeSettings(kubeconfig=str(kubeconfig), request_timeout=2.0))
    from temporalio.testing import ActivityEnvironment

    try:
        with pytest.raises(ApplicationError) as info:
            await ActivityEnvironment().run(
                acts.resolve_device,
                ResolveDeviceInput(device=DeviceRef(node="n", gpu_index=0)),
            )
        assert info.value.type == ERR_KUBE_UNAVAILABLE and not info.value.non_retryable
    finally:
        acts.close()
