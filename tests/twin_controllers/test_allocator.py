"""Pure DRA allocation logic (no store, no HTTP).

Cases:
- CEL selectors: equality on driver attributes, quantity and semver comparison, has(), an
  unknown domain is an empty map, error absorption in || and &&, syntax errors are ValueError;
- quantities compare by value across suffixes;
- a request takes a free matching device; a busy one is skipped; no device -> None;
- firstAvailable falls back to the second sub-request and names the result `main/sub`;
- count 2 and allocationMode All (fails when one matching device is busy); matchAttribute constraint keeps devices on one parent GPU;
- DeviceTaintRule taints block allocation (NoSchedule and NoExecute, not None), are merged in
  memory only, and request tolerations are copied into the result;
- an expired NoExecute toleration no longer tolerates, unless the 1.36 bug switch is on;
- a missing DeviceClass is an AllocationError naming the class.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from twin.controllers.allocator import (
    AllocationError,
    Allocator,
    DeviceId,
    Inventory,
    allocated_devices,
    untolerated,
)
from twin.controllers.cel import CelError, Quantity, compile_expr, device_env

NOW = datetime(2026, 11, 29, 10, 0, tzinfo=UTC)
DRIVER = "gpu.nvidia.com"


def gpu(name: str, product: str = "NVIDIA H100", parent: str | None = None, taints=None):
    attrs = {
        "uuid": {"string": f"GPU-{name}"},
        "productName": {"string": product},
        "driverVersion": {"version": "550.54.15"},
    }
    if parent:
        attrs["parentUUID"] = {"string": parent}
    dev = {"name": name, "attributes": attrs, "capacity": {"memory": {"value": "80Gi"}}}
    if taints:
        dev["taints"] = taints
    return dev


def slice_for(node: str, devices: list[dict]) -> dict:
    return {
        "metadata": {"name": f"{node}-slice"},
        "spec": {
            "driver": DRIVER,
            "nodeName": node,
            "pool": {"name": node, "generation": 1, "resourceSliceCount": 1},
            "devices": devices,
        },
    }


def device_class(name: str, expression: str | None = None) -> dict:
    expr = expression or f'device.driver == "{DRIVER}"'
    return {"metadata": {"name": name}, "spec": {"selectors": [{"cel": {"expression": expr}}]}}


CLASSES = {
    "gpu.nvidia.com": device_class("gpu.nvidia.com"),
    "h100": device_class("h100", f'device.attributes["{DRIVER}"].productName == "NVIDIA H100"'),
    "l40s": device_class("l40s", f'device.attributes["{DRIVER}"].productName == "NVIDIA L40S"'),
}


def claim(name: str, requests: list[dict], constraints=None) -> dict:
    devices = {"requests": requests}
    if constraints:
        devices["constraints"] = constraints
    return {"metadata": {"name": name, "namespace": "default"}, "spec": {"devices": devices}}


def exactly(name: str, cls: str = "gpu.nvidia.com", **extra) -> dict:
    return {"name": name, "exactly": {"deviceClassName": cls, **extra}}


def rule(selector: dict, effect: str, added: datetime = NOW, key: str = "sickbay.dev/unhealthy"):
    return {
        "metadata": {"name": "r", "creationTimestamp": added.strftime("%Y-%m-%dT%H:%M:%SZ")},
        "spec": {
            "deviceSelector": selector,
            "taint": {
                "key": key,
                "value": "xid-79",
                "effect": effect,
                "timeAdded": added.strftime("%Y-%m-%dT%H:%M:%SZ"),
            },
        },
    }


def allocator(slices, rules=(), busy=(), now=NOW, bug=False) -> Allocator:
    return Allocator(Inventory(slices, rules), CLASSES, set(busy), now, bug)


# --- CEL ---------------------------------------------------------------------------------------


def test_cel_device_selectors() -> None:
    env = device_env(DRIVER, gpu("gpu-0"))
    assert compile_expr(f'device.driver == "{DRIVER}"').matches(env)
    assert compile_expr(
        f'device.capacity["{DRIVER}"].memory.compareTo(quantity("40Gi")) >= 0'
    ).matches(env)
    assert not compile_expr(
        f'device.capacity["{DRIVER}"].memory.isGreaterThan(quantity("100Gi"))'
    ).matches(env)
    assert compile_expr(
        f'device.attributes["{DRIVER}"].driverVersion.isGreaterThan(semver("550.0.0"))'
    ).matches(env)
    assert not compile_expr(f'has(device.attributes["{DRIVER}"].parentUUID)').matches(env)
    assert compile_expr(f'has(device.attributes["{DRIVER}"].uuid)').matches(env)
    # An unknown domain is an empty map; a missing key is an error that || can absorb.
    assert not compile_expr('has(device.attributes["other.example.com"].x)').matches(env)
    assert compile_expr('device.attributes["other.example.com"].x == 1 || true').matches(env)
    assert not compile_expr('false && device.attributes["other.example.com"].x == 1').matches(env)
    with pytest.raises(CelError, match="no such key"):
        compile_expr('device.attributes["other.example.com"].x == 1').matches(env)
    assert compile_expr(f'device.attributes["{DRIVER}"].productName.startsWith("NVIDIA")').matches(
        env
    )
    assert compile_expr(f'"{DRIVER}/uuid" != "" ? size([1, 2]) == 2 : false').matches(env)


def test_cel_syntax_error_is_value_error() -> None:
    with pytest.raises(ValueError, match="expected"):
        compile_expr('device.driver == ("x"')


def test_quantities_compare_by_value() -> None:
    assert Quantity.parse("1Gi") == Quantity.parse("1073741824")
    assert Quantity.parse("500m") < Quantity.parse("1")
    assert Quantity.parse("1e3") == Quantity.parse("1k")


# --- allocation ----------------------------------------------------------------------------------


def test_takes_free_device_and_skips_busy() -> None:
    slices = [slice_for("node-a", [gpu("gpu-0"), gpu("gpu-1")])]
    got = allocator(slices).allocate([claim("c1", [exactly("gpu")])], "node-a")
    assert got["c1"]["devices"]["results"] == [
        {"device": "gpu-0", "driver": DRIVER, "pool": "node-a", "request": "gpu"}
    ]
    assert got["c1"]["nodeSelector"]["nodeSelectorTerms"][0]["matchFields"][0]["values"] == [
        "node-a"
    ]
    busy = {DeviceId(DRIVER, "node-a", "gpu-0")}
    got = allocator(slices, busy=busy).allocate([claim("c2", [exactly("gpu")])], "node-a")
    assert got["c2"]["devices"]["results"][0]["device"] == "gpu-1"
    busy.add(DeviceId(DRIVER, "node-a", "gpu-1"))
    assert allocator(slices, busy=busy).allocate([claim("c3", [exactly("gpu")])], "node-a") is None
    assert allocator(slices).allocate([claim("c4", [exactly("gpu")])], "node-b") is None


def test_busy_set_comes_from_allocated_claims() -> None:
    slices = [slice_for("node-a", [gpu("gpu-0")])]
    first = claim("c1", [exactly("gpu")])
    first["status"] = {"allocation": allocator(slices).allocate([first], "node-a")["c1"]}
    assert allocated_devices([first]) == {DeviceId(DRIVER, "node-a", "gpu-0")}


def test_first_available_falls_back_to_lesser_class() -> None:
    slices = [slice_for("node-a", [gpu("gpu-0", "NVIDIA L40S")])]
    request = {
        "name": "gpu",
        "firstAvailable": [
            {"name": "big", "deviceClassName": "h100"},
            {"name": "small", "deviceClassName": "l40s"},
        ],
    }
    got = allocator(slices).allocate([claim("c", [request])], "node-a")
    assert got["c"]["devices"]["results"][0]["request"] == "gpu/small"
    slices = [slice_for("node-a", [gpu("gpu-0", "NVIDIA L40S"), gpu("gpu-1", "NVIDIA H100")])]
    got = allocator(slices).allocate([claim("c", [request])], "node-a")
    assert got["c"]["devices"]["results"][0] == {
        "device": "gpu-1",
        "driver": DRIVER,
        "pool": "node-a",
        "request": "gpu/big",
    }


def test_count_all_and_match_attribute() -> None:
    devices = [
        gpu("mig-0", parent="GPU-A"),
        gpu("mig-1", parent="GPU-B"),
        gpu("mig-2", parent="GPU-B"),
    ]
    slices = [slice_for("node-a", devices)]
    got = allocator(slices).allocate([claim("c", [exactly("gpu", count=2)])], "node-a")
    assert [r["device"] for r in got["c"]["devices"]["results"]] == ["mig-0", "mig-1"]
    same_parent = [{"requests": ["gpu"], "matchAttribute": f"{DRIVER}/parentUUID"}]
    got = allocator(slices).allocate([claim("c", [exactly("gpu", count=2)], same_parent)], "node-a")
    assert [r["device"] for r in got["c"]["devices"]["results"]] == ["mig-1", "mig-2"]
    everything = [claim("c", [exactly("gpu", allocationMode="All")])]
    got = allocator(slices).allocate(everything, "node-a")
    assert len(got["c"]["devices"]["results"]) == 3
    busy = {DeviceId(DRIVER, "node-a", "mig-2")}
    assert allocator(slices, busy=busy).allocate(everything, "node-a") is None


def test_taint_rules_block_unless_tolerated() -> None:
    slices = [slice_for("node-a", [gpu("gpu-0"), gpu("gpu-1")])]
    on_gpu0 = {"driver": DRIVER, "pool": "node-a", "device": "gpu-0"}
    for effect in ("NoSchedule", "NoExecute"):
        got = allocator(slices, [rule(on_gpu0, effect)]).allocate(
            [claim("c", [exactly("gpu")])], "node-a"
        )
        assert got["c"]["devices"]["results"][0]["device"] == "gpu-1", effect
    got = allocator(slices, [rule(on_gpu0, "None")]).allocate(
        [claim("c", [exactly("gpu")])], "node-a"
    )
    assert got["c"]["devices"]["results"][0]["device"] == "gpu-0"
    # Rule taints are merged in memory: the slice object itself is unchanged.
    assert "taints" not in slices[0]["spec"]["devices"][0]
    everything = rule({"driver": DRIVER}, "NoExecute")
    assert (
        allocator(slices, [everything]).allocate([claim("c", [exactly("gpu")])], "node-a") is None
    )
    tolerate = [{"key": "sickbay.dev/unhealthy", "operator": "Exists", "effect": "NoExecute"}]
    got = allocator(slices, [everything]).allocate(
        [claim("c", [exactly("gpu", tolerations=tolerate)])], "node-a"
    )
    assert got["c"]["devices"]["results"][0]["tolerations"] == tolerate
    # A rule with no selector fields selects nothing.
    assert allocator(slices, [rule({}, "NoExecute")]).allocate(
        [claim("c", [exactly("gpu")])], "node-a"
    )


def test_slice_taints_block_too() -> None:
    taint = [{"key": "gpu.nvidia.com/xid", "value": "79", "effect": "NoSchedule"}]
    slices = [slice_for("node-a", [gpu("gpu-0", taints=taint)])]
    assert allocator(slices).allocate([claim("c", [exactly("gpu")])], "node-a") is None


def test_expired_toleration_window() -> None:
    slices = [slice_for("node-a", [gpu("gpu-0")])]
    added = NOW - timedelta(seconds=120)
    rules = [rule({"driver": DRIVER}, "NoExecute", added=added)]
    tol = [{"key": "sickbay.dev/unhealthy", "operator": "Exists", "tolerationSeconds": 60}]
    request = [claim("c", [exactly("gpu", tolerations=tol)])]
    assert allocator(slices, rules).allocate(request, "node-a") is None
    got = allocator(slices, rules, bug=True).allocate(request, "node-a")
    assert got["c"]["devices"]["results"][0]["device"] == "gpu-0"
    long_tol = [{**tol[0], "tolerationSeconds": 600}]
    assert allocator(slices, rules).allocate(
        [claim("c", [exactly("gpu", tolerations=long_tol)])], "node-a"
    )
    taint = rules[0]["spec"]["taint"]
    assert untolerated([taint], tol, ("NoExecute",), NOW) == [taint]
    assert untolerated([taint], long_tol, ("NoExecute",), NOW) == []


def test_missing_device_class_is_named() -> None:
    slices = [slice_for("node-a", [gpu("gpu-0")])]
    with pytest.raises(AllocationError, match="device class nope does not exist"):
        allocator(slices).allocate([claim("c", [exactly("gpu", cls="nope")])], "node-a")
