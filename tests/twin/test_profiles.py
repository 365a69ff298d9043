"""Discovery per profile, exactly as issue 3 lists it, seen through the official client.

Cases: resource.k8s.io versions and where devicetaintrules is served for 1.34, 1.35, 1.36,
1.37 and device-plugin, with and without --no-device-taint-rules; /version minor per profile;
dynamic-client discovery finds DeviceTaintRule; one stored rule readable through every served
version (1.36: v1beta2 and v1alpha3); device-plugin nodes advertise nvidia.com/gpu and no DRA
objects exist; the unserved versions answer 404.
"""

from __future__ import annotations

from typing import Any

import pytest
from kubernetes import client, dynamic
from kubernetes.client.exceptions import ApiException

DRA = "resource.k8s.io"

# profile, device_taint_rules → {version: serves devicetaintrules?}
EXPECTED: dict[tuple[str, bool], dict[str, bool]] = {
    ("1.34", True): {"v1": False, "v1beta2": False},
    ("1.35", True): {"v1": False, "v1beta2": False, "v1alpha3": True},
    ("1.35", False): {"v1": False, "v1beta2": False},
    ("1.36", True): {"v1": False, "v1beta2": True, "v1alpha3": True},
    ("1.36", False): {"v1": False},
    ("1.37", True): {"v1": True},
    ("device-plugin", True): {},
}


def _dra_versions(api: client.ApiClient) -> dict[str, bool]:
    groups = {g.name: g for g in client.ApisApi(api).get_api_versions().groups}
    if DRA not in groups:
        return {}
    out = {}
    for v in groups[DRA].versions:
        api_cls = getattr(client, f"Resource{v.version.capitalize()}Api")
        names = [r.name for r in api_cls(api).get_api_resources().resources]
        out[v.version] = "devicetaintrules" in names
        if v.version != "v1alpha3":  # v1alpha3 may serve DeviceTaintRules alone
            assert {"resourceslices", "resourceclaims"} <= set(names)
    return out


@pytest.mark.parametrize(("profile", "dtr"), list(EXPECTED))
def test_discovery_per_profile(twin_factory: Any, profile: str, dtr: bool) -> None:
    rs = twin_factory(profile=profile, device_taint_rules=dtr, nodes=1, gpus_per_node=2)
    api = rs.api_client()
    assert _dra_versions(api) == EXPECTED[(profile, dtr)]
    minor = client.VersionApi(api).get_code().minor
    assert minor == ("36" if profile == "device-plugin" else profile.split(".")[1])
    if EXPECTED[(profile, dtr)]:
        preferred = {
            g.name: g.preferred_version.version
            for g in client.ApisApi(api).get_api_versions().groups
        }
        assert preferred[DRA] == "v1"


def test_rule_readable_through_every_served_version(twin_factory: Any) -> None:
    rs = twin_factory(profile="1.36", nodes=1)
    api = rs.api_client()
    client.ResourceV1alpha3Api(api).create_device_taint_rule(
        {
            "metadata": {"name": "r"},
            "spec": {"deviceSelector": {"pool": "p"}, "taint": {"key": "k", "effect": "None"}},
        }
    )
    beta = client.ResourceV1beta2Api(api).read_device_taint_rule("r")
    assert beta.spec.taint.effect == "None" and beta.api_version == "resource.k8s.io/v1beta2"
    dyn = dynamic.DynamicClient(api)
    rules = dyn.resources.get(api_version="resource.k8s.io/v1beta2", kind="DeviceTaintRule")
    assert [i.metadata.name for i in rules.get().items] == ["r"]
    with pytest.raises(ApiException) as v1:
        client.ResourceV1Api(api).read_device_taint_rule("r")
    assert v1.value.status == 404


def test_device_plugin_profile_has_no_dra(twin_factory: Any) -> None:
    rs = twin_factory(profile="device-plugin", nodes=2, gpus_per_node=4)
    api = rs.api_client()
    nodes = client.CoreV1Api(api).list_node().items
    assert [n.status.allocatable["nvidia.com/gpu"] for n in nodes] == ["4", "4"]
    uuids = nodes[0].metadata.annotations["sickbay.dev/gpu-uuids"].split(",")
    assert len(uuids) == 4 and all(u.startswith("GPU-") for u in uuids)
    with pytest.raises(ApiException) as missing:
        client.ResourceV1Api(api).list_resource_slice()
    assert missing.value.status == 404
    assert rs.store.count("resourceslices") == 0


def test_1_37_serves_rules_in_v1(twin_factory: Any) -> None:
    rs = twin_factory(profile="1.37", nodes=1)
    api = rs.api_client()
    res = client.ResourceV1Api(api)
    res.create_device_taint_rule(
        {
            "metadata": {"name": "r"},
            "spec": {
                "deviceSelector": {"driver": "gpu.nvidia.com"},
                "taint": {"key": "k", "effect": "NoSchedule"},
            },
        }
    )
    assert res.read_device_taint_rule("r").spec.taint.effect == "NoSchedule"
    with pytest.raises(ApiException) as beta:
        client.ResourceV1beta2Api(api).list_device_taint_rule()
    assert beta.value.status == 404
