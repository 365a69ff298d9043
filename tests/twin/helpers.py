"""Helpers for the twin tests: golden files, raw HTTP, shape comparison.

- `golden(n)`: the recorded response file tests/k8s_golden/<n>-*.json.
- `raw(rs, method, path, body, headers)`: one HTTP request to a running twin (httpx), for
  cases where the golden needs exact status codes, headers or bytes.
- `assert_shape(actual, expected)`: same keys (recursively), same reasons/codes/causes/kinds;
  names, uids, timestamps and resourceVersions are not compared.
- `plugin_silent_on_first_node(rs)`: a device-plugin twin without a kubelet whose first node's
  plugin offers none of its GPUs, each node with a pod reporting its first GPU Unknown.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import httpx

from activities.kube.devices import node_gpu_uuids
from twin.testing import RunningTwin

GOLDEN_DIR = Path(__file__).resolve().parents[1] / "k8s_golden"

# Bounds for waits in these tests: the twin answers from memory in milliseconds, watches end by
# their timeoutSeconds (1-2 s); these limits only turn a hang into a failure.
HTTP_TIMEOUT = 5.0
JOIN_TIMEOUT = 10.0

# Keys whose values are compared exactly by assert_shape (the rest only by presence/type).
COMPARED_VALUES = frozenset(
    {"reason", "code", "status", "kind", "apiVersion", "type", "field", "effect", "phase"}
)
# Keys the twin does not model exactly (storage hashes, field sets).
NOT_MODELLED = frozenset({"storageVersionHash", "managedFields"})


def golden(number: int) -> dict[str, Any]:
    matches = sorted(GOLDEN_DIR.glob(f"{number:02d}-*.json"))
    assert len(matches) == 1, f"golden file {number} not found"
    return json.loads(matches[0].read_text())


def raw(
    rs: RunningTwin,
    method: str,
    path: str,
    body: Any = None,
    headers: dict[str, str] | None = None,
    token: str | None = None,
) -> httpx.Response:
    hdrs = dict(headers or {})
    if token:
        hdrs["Authorization"] = f"Bearer {token}"
    content: bytes | None = None
    if isinstance(body, str):
        content = body.encode()
    elif body is not None:
        content = json.dumps(body).encode()
        hdrs.setdefault("Content-Type", "application/json")
    # A generous timeout: watch requests in tests run for a few seconds at most.
    return httpx.request(method, rs.url + path, content=content, headers=hdrs, timeout=15.0)


def replay(rs: RunningTwin, number: int, token: str | None = None) -> httpx.Response:
    """Send the request recorded in golden file `number` to the twin."""
    req = golden(number)["request"]
    return raw(rs, req["method"], req["path"], req.get("body"), req.get("headers"), token)


def assert_shape(actual: Any, expected: Any, path: str = "$") -> None:
    if isinstance(expected, dict):
        assert isinstance(actual, dict), f"{path}: expected an object, got {actual!r}"
        exp_keys = set(expected) - NOT_MODELLED
        act_keys = set(actual) - NOT_MODELLED
        assert act_keys == exp_keys, (
            f"{path}: keys differ: missing {sorted(exp_keys - act_keys)}, "
            f"extra {sorted(act_keys - exp_keys)}"
        )
        for key in exp_keys:
            sub = f"{path}.{key}"
            if key in COMPARED_VALUES and not isinstance(expected[key], dict | list):
                assert actual[key] == expected[key], f"{sub}: {actual[key]!r} != {expected[key]!r}"
            else:
                assert_shape(actual[key], expected[key], sub)
    elif isinstance(expected, list):
        assert isinstance(actual, list), f"{path}: expected a list, got {actual!r}"
        if path.endswith(".causes"):
            assert len(actual) == len(expected), f"{path}: {actual} vs {expected}"
        for i, (a, e) in enumerate(zip(actual, expected, strict=False)):
            assert_shape(a, e, f"{path}[{i}]")
    elif expected is None:
        assert actual is None, f"{path}: expected null, got {actual!r}"
    else:
        assert actual is not None, f"{path}: missing value (expected like {expected!r})"
        assert (
            type(actual) is type(expected)
            or isinstance(expected, int | float)
            and isinstance(actual, int | float)
        ), f"{path}: {type(actual).__name__} != {type(expected).__name__}"


def plugin_silent_on_first_node(rs: RunningTwin) -> tuple[str, str, dict[str, str]]:
    """On a device-plugin twin without controllers (the statuses stay as written): the first
    node's device plugin offers none of its GPUs (allocatable nvidia.com/gpu 0, capacity kept,
    as the kubelet shows for a grace period after the plugin stopped), and on each of the two
    nodes a pod reports the node's first GPU Unknown. (silent node, other node, node -> that
    GPU's UUID)."""
    silent, other = rs.twin.seed_info["nodes"][:2]
    store = rs.twin.store
    first = {n: node_gpu_uuids(store.get("nodes", n))[0] for n in (silent, other)}

    def withheld(obj: dict[str, Any]) -> dict[str, Any]:
        obj["status"]["allocatable"]["nvidia.com/gpu"] = "0"
        return obj

    store.mutate("nodes", silent, withheld, subresource="status")
    for name, node in (("s", silent), ("o", other)):
        store.create(
            "pods",
            {
                "metadata": {"name": name, "namespace": "default"},
                "spec": {"nodeName": node, "containers": [{"name": "m", "image": "x"}]},
            },
            "default",
        )

        def unknown(obj: dict[str, Any], gpu: str = first[node]) -> dict[str, Any]:
            entry = {
                "name": "nvidia.com/gpu",
                "resources": [{"resourceID": gpu, "health": "Unknown"}],
            }
            obj["status"] = {
                "phase": "Running",
                "containerStatuses": [{"name": "m", "allocatedResourcesStatus": [entry]}],
            }
            return obj

        store.mutate("pods", name, unknown, "default", subresource="status")
    return silent, other, first
