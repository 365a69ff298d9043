"""GKE provider request shapes, checked against the Kubernetes Engine API v1 reference with
respx (no network), through the real CloudActivities in an ActivityEnvironment.

Cases:
- describe: GET nodePools/{np}, each instance group manager's targetSize summed over zones,
  autoscaling bounds (per zone x zones, or totalMax), running SET_NODE_POOL_SIZE operation of
  this pool found in GET .../operations (other pools' ignored);
- scale: POST .../nodePools/{np}:setSize with {"nodeCount": per-zone count} and the bearer
  token from a file; 3 zones, target 7, max 8 -> 2 per zone (never above max);
- a running resize is adopted instead of a second setSize; already big enough -> no call;
- target above max refused before any call;
- errors: 403 quota -> ERR_CLOUD_REJECTED non-retryable with Google's message; 401 ->
  rejected; 429 with Retry-After -> retryable with that delay; 503 -> retryable;
  400 FAILED_PRECONDITION "incompatible operation" -> retryable;
- operation polling: RUNNING -> ERR_STILL_WAITING (retryable); DONE with error -> returned
  with the error; DONE -> done;
- credentials: missing token names the variable (ERR_CONFIG); the metadata server is asked
  with Metadata-Flavor: Google; the token is never sent to an instance group URL on another
  host.
"""

from __future__ import annotations

import json
from datetime import timedelta
from pathlib import Path

import httpx
import pytest
import respx
from temporalio.exceptions import ApplicationError
from temporalio.testing import ActivityEnvironment

from activities.cloud import CloudActivities
from activities.cloud.config import CloudConfig, GkeConfig
from contract.capacity import DescribePoolInput, NodePoolTarget, PoolOperationInput, ScalePoolInput
from contract.errors import (
    ERR_CLOUD_REJECTED,
    ERR_CLOUD_UNAVAILABLE,
    ERR_CONFIG,
    ERR_INVALID_INPUT,
    ERR_STILL_WAITING,
)
from twin.cloudapi import CloudApi, CloudApiServer, TwinPool
from worker.settings import Settings

API = "https://container.googleapis.com/v1"
LOC = f"{API}/projects/proj-1/locations/us-central1"
POOL_URL = f"{LOC}/clusters/gpu-cluster/nodePools/h100-pool"
COMPUTE = "https://www.googleapis.com/compute/v1/projects/proj-1/zones"
IGMS = [f"{COMPUTE}/us-central1-{z}/instanceGroupManagers/gke-gpu-h100-{z}-grp" for z in "abc"]
POOL = NodePoolTarget(
    provider="gke",
    name="h100-pool",
    project="proj-1",
    location="us-central1",
    cluster="gpu-cluster",
)
TOKEN = "ya29.test-token"


def node_pool(autoscaling: dict[str, object] | None = None) -> dict[str, object]:
    return {
        "name": "h100-pool",
        "status": "RUNNING",
        "locations": ["us-central1-a", "us-central1-b", "us-central1-c"],
        "instanceGroupUrls": IGMS,
        "autoscaling": autoscaling or {},
    }


def operation(
    name: str, status: str = "RUNNING", pool: str = "h100-pool", **extra: object
) -> dict[str, object]:
    return {
        "name": name,
        "operationType": "SET_NODE_POOL_SIZE",
        "status": status,
        "selfLink": f"{LOC}/operations/{name}",
        "targetLink": f"{LOC}/clusters/gpu-cluster/nodePools/{pool}",
        **extra,
    }


@pytest.fixture
def acts(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> CloudActivities:
    token_file = tmp_path / "token"
    token_file.write_text(TOKEN + "\n")
    monkeypatch.delenv("SICKBAY_GKE_TOKEN", raising=False)
    monkeypatch.setenv("SICKBAY_GKE_TOKEN_FILE", str(token_file))
    return CloudActivities(CloudConfig())


def mock_pool(
    sizes: tuple[int, int, int] = (2, 2, 2),
    ops: list[dict[str, object]] | None = None,
    autoscaling: dict[str, object] | None = None,
) -> None:
    respx.get(POOL_URL).respond(200, json=node_pool(autoscaling))
    for url, size in zip(IGMS, sizes, strict=True):
        respx.get(url).respond(200, json={"name": url.rsplit("/", 1)[1], "targetSize": size})
    respx.get(f"{LOC}/operations").respond(200, json={"operations": ops or []})


async def run(fn: object, arg: object) -> object:
    return await ActivityEnvironment().run(fn, arg)  # type: ignore[arg-type]


@respx.mock
async def test_describe_sums_zones_and_reads_bounds(acts: CloudActivities) -> None:
    mock_pool(
        (2, 1, 0),
        ops=[operation("op-other", pool="cpu-pool"), operation("op-done", status="DONE")],
        autoscaling={"enabled": True, "minNodeCount": 0, "maxNodeCount": 3},
    )
    desc = await run(acts.describe_pool, DescribePoolInput(pool=POOL))
    assert desc.current_size == 3
    assert (desc.min_size, desc.max_size) == (0, 9)
    assert desc.pending_operation is None  # other pool's and finished operations ignored
    for call in respx.calls:
        assert call.request.headers["authorization"] == f"Bearer {TOKEN}"


@respx.mock
async def test_describe_finds_running_resize_and_total_bounds(acts: CloudActivities) -> None:
    mock_pool(ops=[operation("op-7")], autoscaling={"enabled": True, "totalMaxNodeCount": 10})
    desc = await run(acts.describe_pool, DescribePoolInput(pool=POOL))
    assert desc.max_size == 10
    assert desc.pending_operation is not None and desc.pending_operation.id == "op-7"


@respx.mock
async def test_set_size_posts_per_zone_count(acts: CloudActivities) -> None:
    mock_pool((1, 1, 1))
    route = respx.post(f"{POOL_URL}:setSize").respond(200, json=operation("operation-123"))
    result = await run(
        acts.scale_pool,
        ScalePoolInput(pool=POOL, target_size=7, max_size=8, idempotency_key="k1"),
    )
    request = route.calls.last.request
    assert request.method == "POST"
    assert request.headers["authorization"] == f"Bearer {TOKEN}"
    assert json.loads(request.content) == {"nodeCount": 2}  # ceil(7/3)=3 -> 9 > 8 -> 2
    assert result.previous_size == 3 and result.target_size == 6
    assert result.operation is not None and result.operation.id == "operation-123"
    assert not result.adopted


@respx.mock
async def test_running_resize_is_adopted_not_repeated(acts: CloudActivities) -> None:
    mock_pool(ops=[operation("op-9")])
    route = respx.post(f"{POOL_URL}:setSize")
    result = await run(
        acts.scale_pool, ScalePoolInput(pool=POOL, target_size=9, max_size=9, idempotency_key="k")
    )
    assert result.adopted and result.operation is not None and result.operation.id == "op-9"
    assert not route.called


@respx.mock
async def test_big_enough_pool_is_left_alone(acts: CloudActivities) -> None:
    mock_pool((2, 2, 2))
    route = respx.post(f"{POOL_URL}:setSize")
    result = await run(
        acts.scale_pool, ScalePoolInput(pool=POOL, target_size=6, max_size=9, idempotency_key="k")
    )
    assert result.operation is None and result.target_size == 6 and not route.called


async def test_target_above_max_is_refused_before_any_call(acts: CloudActivities) -> None:
    with respx.mock(assert_all_called=False) as mock:
        with pytest.raises(ApplicationError) as info:
            await run(
                acts.scale_pool,
                ScalePoolInput(pool=POOL, target_size=5, max_size=4, idempotency_key="k"),
            )
        assert not mock.calls
    assert info.value.type == ERR_INVALID_INPUT and info.value.non_retryable


QUOTA = {
    "error": {
        "code": 403,
        "message": 'Insufficient regional quota to satisfy request: resource "NVIDIA_H100_GPUS"',
        "status": "PERMISSION_DENIED",
    }
}


@pytest.mark.parametrize(
    ("status", "body", "headers", "err_type", "retryable", "words"),
    [
        (403, QUOTA, {}, ERR_CLOUD_REJECTED, False, "NVIDIA_H100_GPUS"),
        (
            401,
            {
                "error": {
                    "code": 401,
                    "message": "Request had invalid authentication credentials.",
                    "status": "UNAUTHENTICATED",
                }
            },
            {},
            ERR_CLOUD_REJECTED,
            False,
            "UNAUTHENTICATED",
        ),
        (
            429,
            {
                "error": {
                    "code": 429,
                    "message": "Quota exceeded for quota metric 'Write requests'",
                    "status": "RESOURCE_EXHAUSTED",
                }
            },
            {"Retry-After": "30"},
            ERR_CLOUD_UNAVAILABLE,
            True,
            "RESOURCE_EXHAUSTED",
        ),
        (
            503,
            {
                "error": {
                    "code": 503,
                    "message": "The service is currently unavailable.",
                    "status": "UNAVAILABLE",
                }
            },
            {},
            ERR_CLOUD_UNAVAILABLE,
            True,
            "UNAVAILABLE",
        ),
        (
            400,
            {
                "error": {
                    "code": 400,
                    "message": "Cluster is running incompatible operation operation-1.",
                    "status": "FAILED_PRECONDITION",
                }
            },
            {},
            ERR_CLOUD_UNAVAILABLE,
            True,
            "incompatible operation",
        ),
        (
            400,
            {
                "error": {
                    "code": 400,
                    "message": "Invalid value at 'node_count'",
                    "status": "INVALID_ARGUMENT",
                }
            },
            {},
            ERR_CLOUD_REJECTED,
            False,
            "INVALID_ARGUMENT",
        ),
    ],
)
@respx.mock
async def test_set_size_errors(
    acts: CloudActivities,
    status: int,
    body: dict[str, object],
    headers: dict[str, str],
    err_type: str,
    retryable: bool,
    words: str,
) -> None:
    mock_pool((1, 1, 1))
    respx.post(f"{POOL_URL}:setSize").respond(status, json=body, headers=headers)
    with pytest.raises(ApplicationError) as info:
        await run(
            acts.scale_pool,
            ScalePoolInput(pool=POOL, target_size=6, max_size=9, idempotency_key="k"),
        )
    assert info.value.type == err_type
    assert info.value.non_retryable is (not retryable)
    assert words in str(info.value)
    if "Retry-After" in headers:
        assert info.value.next_retry_delay == timedelta(seconds=30)


@respx.mock
async def test_operation_polling(acts: CloudActivities) -> None:
    route = respx.get(f"{LOC}/operations/operation-1")
    route.side_effect = [
        httpx.Response(200, json=operation("operation-1")),
        httpx.Response(
            200,
            json=operation(
                "operation-1", status="DONE", error={"code": 8, "message": "Quota 'GPUS' exceeded"}
            ),
        ),
    ]
    req = PoolOperationInput(pool=POOL, operation="operation-1")
    with pytest.raises(ApplicationError) as info:
        await run(acts.wait_pool_operation, req)
    assert info.value.type == ERR_STILL_WAITING and not info.value.non_retryable
    op = await run(acts.wait_pool_operation, req)
    assert op.done and op.error == "Quota 'GPUS' exceeded"


async def test_missing_token_names_the_variable(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("SICKBAY_GKE_TOKEN", raising=False)
    monkeypatch.delenv("SICKBAY_GKE_TOKEN_FILE", raising=False)
    acts = CloudActivities(CloudConfig())
    with pytest.raises(ApplicationError) as info:
        await run(acts.describe_pool, DescribePoolInput(pool=POOL))
    assert info.value.type == ERR_CONFIG and "SICKBAY_GKE_TOKEN" in str(info.value)


async def test_workload_identity_token_through_google_auth(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """No token configured: google-auth's Application Default Credentials find the metadata
    server (the twin's, as on a GKE node with Workload Identity) and its token is sent; it is
    asked once and reused while valid."""
    for var in ("SICKBAY_GKE_TOKEN", "SICKBAY_GKE_TOKEN_FILE", "GOOGLE_APPLICATION_CREDENTIALS"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("CLOUDSDK_CONFIG", str(tmp_path))  # no gcloud login of this machine
    api = CloudApi(token="from-the-metadata-server", project="proj-1", location="us-central1")
    api.add_pool(TwinPool(name="h100-pool", size=2, max_size=4))
    async with CloudApiServer(api) as server:
        host = server.url.removeprefix("http://")
        monkeypatch.setenv("GCE_METADATA_IP", host)
        # google-auth reads GCE_METADATA_HOST once, when it is imported: set what it read
        from google.auth.compute_engine import _metadata

        monkeypatch.setattr(_metadata, "_GCE_METADATA_HOST", host)
        gke = GkeConfig(endpoint=server.url, compute_hosts=[server.url])
        acts = CloudActivities(CloudConfig(gke=gke))
        pool = POOL.model_copy(update={"cluster": "twin"})
        try:
            first = await run(acts.describe_pool, DescribePoolInput(pool=pool))
            asked = api.metadata_requests
            await run(acts.describe_pool, DescribePoolInput(pool=pool))
        finally:
            await acts.aclose()
    assert first.current_size == 2  # the twin took the metadata server's token
    assert asked >= 1 and api.metadata_requests == asked  # reused, not asked again
    assert all(r.status == 200 for r in api.requests)


@respx.mock
async def test_token_never_sent_to_a_foreign_instance_group_host(acts: CloudActivities) -> None:
    pool = node_pool()
    pool["instanceGroupUrls"] = ["https://evil.example.com/igm"]
    respx.get(POOL_URL).respond(200, json=pool)
    evil = respx.get("https://evil.example.com/igm")
    with pytest.raises(ApplicationError) as info:
        await run(acts.describe_pool, DescribePoolInput(pool=POOL))
    assert info.value.type == ERR_CONFIG and not evil.called


async def test_pool_without_project_is_a_config_error(acts: CloudActivities) -> None:
    with pytest.raises(ApplicationError) as info:
        await run(
            acts.describe_pool, DescribePoolInput(pool=POOL.model_copy(update={"project": None}))
        )
    assert info.value.type == ERR_CONFIG and "`project`" in str(info.value)


@respx.mock
async def test_worker_defaults_fill_a_provider_only_pool(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("SICKBAY_GKE_TOKEN", TOKEN)
    monkeypatch.setenv("SICKBAY_GKE_PROJECT", "proj-1")
    monkeypatch.setenv("SICKBAY_GKE_LOCATION", "us-central1")
    monkeypatch.setenv("SICKBAY_GKE_CLUSTER", "gpu-cluster")
    mock_pool()
    acts = CloudActivities(Settings().cloud.cloud_config())  # as the worker builds it
    desc = await run(
        acts.describe_pool, DescribePoolInput(pool=NodePoolTarget(provider="gke", name="h100-pool"))
    )
    assert desc.current_size == 6
