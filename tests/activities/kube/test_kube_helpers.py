"""Unit tests of the pure helpers in activities/kube (no cluster, no Temporal server).

Cases:
- classify(): 403/404/409/429/5xx/422/401 ApiExceptions and connection errors map to the
  specified kinds; to_application_error(): 403 is non-retryable ERR_FORBIDDEN naming verb and
  resource, 429/5xx retryable, 422 non-retryable ERR_INVALID_INPUT;
- slice parsing: domain-qualified attribute names, MIG parentUUID grouping, index of a
  partition read from parentIndex, time-sliced replicas sharing the GPU uuid;
- rule_plan(): one rule named taint_rule_name() for a one-device GPU, one per device (unique,
  <= 253 chars, deterministic) for a group;
- parse_would_evict() reads the count from the controller's effect-None message (golden 48);
- each deploy/rbac*.yaml ClusterRole grants exactly its permissions of
  activities/kube/permissions.py; pods delete and nodes patch are in optional roles only.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import urllib3
import yaml
from kubernetes.client.exceptions import ApiException

from activities.kube.client import ErrorKind, classify, to_application_error
from activities.kube.devices import group_of, slice_devices
from activities.kube.permissions import COMPONENTS, FEATURES, PERMISSIONS, ROLE_FILES, ROLE_REPAIR
from activities.kube.quarantine import parse_would_evict, rule_plan
from contract.errors import ERR_FORBIDDEN, ERR_INVALID_INPUT
from contract.kube import DraDevice, ResolvedDevice
from contract.names import REPAIR_NAMESPACE, taint_rule_name

ROOT = Path(__file__).resolve().parents[3]
GOLDEN = ROOT / "tests" / "k8s_golden"


def _api_exc(status: int, message: str = "boom") -> ApiException:
    exc = ApiException(status=status, reason="R")
    exc.body = json.dumps({"kind": "Status", "message": message, "code": status})
    return exc


def test_classify_kinds() -> None:
    cases = {
        404: ErrorKind.NOT_FOUND,
        403: ErrorKind.FORBIDDEN,
        409: ErrorKind.CONFLICT,
        429: ErrorKind.THROTTLED,
        500: ErrorKind.TRANSIENT,
        503: ErrorKind.TRANSIENT,
        422: ErrorKind.INVALID,
        400: ErrorKind.INVALID,
        401: ErrorKind.UNAUTHORIZED,
    }
    for status, kind in cases.items():
        assert classify(_api_exc(status), verb="get", resource="pods").kind is kind, status
    reset = urllib3.exceptions.ProtocolError("Connection reset by peer")
    assert classify(reset, verb="list", resource="pods").kind is ErrorKind.TRANSIENT
    timeout = urllib3.exceptions.ReadTimeoutError(None, "/api", "read timed out")
    assert classify(timeout, verb="list", resource="pods").kind is ErrorKind.TRANSIENT


def test_application_errors() -> None:
    forbidden = to_application_error(
        classify(_api_exc(403, "cannot create"), verb="create", resource="devicetaintrules")
    )
    assert forbidden.type == ERR_FORBIDDEN and forbidden.non_retryable
    assert "'create'" in str(forbidden) and "devicetaintrules" in str(forbidden)
    throttled = to_application_error(classify(_api_exc(429), verb="list", resource="pods"))
    assert not throttled.non_retryable
    unavailable = to_application_error(classify(_api_exc(503), verb="list", resource="pods"))
    assert not unavailable.non_retryable
    invalid = to_application_error(classify(_api_exc(422, "bad"), verb="create", resource="x"))
    assert invalid.type == ERR_INVALID_INPUT and invalid.non_retryable


def _slice(node: str, devices: list[dict]) -> dict:
    return {
        "spec": {
            "driver": "gpu.nvidia.com",
            "nodeName": node,
            "pool": {"name": node},
            "devices": devices,
        }
    }


def test_slice_parsing_and_groups() -> None:
    mig = [
        {
            "name": f"gpu-0-mig-{j}",
            "attributes": {
                "gpu.nvidia.com/uuid": {"string": f"MIG-{j}"},
                "parentUUID": {"string": "GPU-A"},
                "index": {"int": 0},
                "parentIndex": {"int": 3},
                "type": {"string": "mig"},
            },
        }
        for j in range(2)
    ]
    ts = [
        {
            "name": f"gpu-1-ts-{j}",
            "attributes": {"uuid": {"string": "GPU-B"}, "parentUUID": {"string": "GPU-B"}},
        }
        for j in range(2)
    ]
    devices = slice_devices([_slice("n1", mig + ts)])
    assert [d.physical_uuid for d in devices] == ["GPU-A", "GPU-A", "GPU-B", "GPU-B"]
    assert devices[0].is_partition and devices[0].index == 3
    assert not devices[2].is_partition
    assert [d.device for d in group_of(devices, "n1", "GPU-A")] == ["gpu-0-mig-0", "gpu-0-mig-1"]
    assert len(group_of(devices, "n1", "gpu-b")) == 2  # case-insensitive
    assert group_of(devices, "n2", "GPU-A") == []


def test_rule_plan_names() -> None:
    one = ResolvedDevice(
        node="node-1",
        gpu_uuid="GPU-ABC",
        devices=[DraDevice(driver="gpu.nvidia.com", pool="node-1", device="gpu-0")],
    )
    assert rule_plan(one) == [(taint_rule_name("node-1", "GPU-ABC"), one.devices[0])]
    group = one.model_copy(
        update={
            "devices": [
                DraDevice(driver="gpu.nvidia.com", pool="node-1", device=f"gpu-0-mig-{j}")
                for j in range(3)
            ]
        }
    )
    names = [n for n, _ in rule_plan(group)]
    assert len(set(names)) == 3 and all(len(n) <= 253 for n in names)
    assert names == [n for n, _ in rule_plan(group)]  # deterministic
    assert all(n.startswith(taint_rule_name("node-1", "GPU-ABC")) for n in names)


def test_parse_would_evict_from_golden() -> None:
    golden = json.loads((GOLDEN / "48-dra-devicetaintrule-none-status.json").read_text())
    conditions = golden["response"]["status"]["conditions"]
    assert parse_would_evict(conditions) == 1
    assert parse_would_evict([{"message": "Eviction only happens for NoExecute."}]) is None


@pytest.mark.parametrize("role", sorted(ROLE_FILES))
def test_rbac_yaml_matches_permissions(role: str) -> None:
    """Each role deploy/ ships grants exactly the permissions listed for it (a ClusterRole, or
    a Role in Sickbay's namespace for the namespaced ones, the repair namespace for the repair
    Role), bound to the worker's ServiceAccount only."""
    namespaced = {p.namespaced for p in PERMISSIONS if p.role == role}
    assert len(namespaced) == 1, f"{role} mixes cluster-wide and namespaced grants"
    kind = "Role" if namespaced.pop() else "ClusterRole"
    docs = list(yaml.safe_load_all((ROOT / ROLE_FILES[role]).read_text()))
    (granting,) = [d for d in docs if d["kind"] == kind and d["metadata"]["name"] == role]
    if kind == "Role":
        # The repair Role lives in the repair namespace (the only place Jobs are created).
        expected = REPAIR_NAMESPACE if role == ROLE_REPAIR else "sickbay"
        assert granting["metadata"]["namespace"] == expected
        assert all(
            p.in_repair_namespace == (role == ROLE_REPAIR) for p in PERMISSIONS if p.role == role
        )
    granted = {
        (g, r, v)
        for rule in granting["rules"]
        for g in rule["apiGroups"]
        for r in rule["resources"]
        for v in rule["verbs"]
    }
    listed = {(p.group, p.resource, v) for p in PERMISSIONS if p.role == role for v in p.verbs}
    assert granted == listed
    (binding,) = [d for d in docs if d["kind"] == f"{kind}Binding" and d["roleRef"]["name"] == role]
    assert binding["roleRef"]["kind"] == kind
    assert binding["subjects"] == [
        {"kind": "ServiceAccount", "name": "sickbay", "namespace": "sickbay"}
    ]


def test_optional_roles_hold_only_optional_grants() -> None:
    """pods delete, nodes patch and the Cluster API grants are not in the base file: dropping
    a component drops them, and nothing required lives in a component."""
    for p in PERMISSIONS:
        if ROLE_FILES[p.role] != "deploy/rbac.yaml":
            assert not p.required, f"{p.resource} {p.verbs} is required but in {p.role}"
    base = {
        (p.resource, v)
        for p in PERMISSIONS
        if ROLE_FILES[p.role] == "deploy/rbac.yaml"
        for v in p.verbs
    }
    assert ("pods", "delete") not in base and ("nodes", "patch") not in base
    assert not {r for r, _ in base} & {"machines", "machinedeployments"}
    files = sorted(
        str(p.relative_to(ROOT))
        for p in [
            *(ROOT / "deploy").glob("rbac*.yaml"),
            *(ROOT / "deploy").glob("components/*/rbac.yaml"),
        ]
    )
    assert files == sorted(set(ROLE_FILES.values()))


@pytest.mark.parametrize("role", sorted(COMPONENTS))
def test_each_component_grants_exactly_what_its_features_need(role: str) -> None:
    """deploy/components/<name> is a kustomize Component whose role grants exactly the union
    of the grants of the FEATURES that name that role; and each of them is listed."""
    directory = ROOT / "deploy" / "components" / COMPONENTS[role]
    kustomization = yaml.safe_load((directory / "kustomization.yaml").read_text())
    assert kustomization["kind"] == "Component"
    assert kustomization["resources"] == ["rbac.yaml"]
    docs = [d for d in yaml.safe_load_all((directory / "rbac.yaml").read_text()) if d]
    (granting,) = [d for d in docs if d["kind"] in ("Role", "ClusterRole")]
    assert granting["metadata"]["name"] == role
    granted = {
        (g, r, v)
        for rule in granting["rules"]
        for g in rule["apiGroups"]
        for r in rule["resources"]
        for v in rule["verbs"]
    }
    features = [f for f in FEATURES if f.role == role]
    assert features, f"no feature needs {role}: drop the component"
    assert granted == {g for f in features for g in f.grants}


def test_base_role_optional_grants_are_features() -> None:
    """An optional grant of the base role (DeviceTaintRule: the cluster decides) has a
    feature too, so doctor can say why it is needed."""
    for p in PERMISSIONS:
        if not p.required and p.role == "sickbay":
            grants = {(p.group, p.resource, v) for v in p.verbs}
            assert any(grants <= set(f.grants) for f in FEATURES if f.role == "sickbay"), p
