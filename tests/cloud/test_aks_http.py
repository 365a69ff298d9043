"""AKS and generic-HTTP providers: request shapes with respx, through CloudActivities.

AKS (Azure Resource Manager, Microsoft.ContainerService agentPools):
- describe: GET .../managedClusters/{c}/agentPools/{p}?api-version=...; count, autoscaling
  bounds, a non-terminal provisioningState is a running resize;
- scale: GET then PUT with the full properties, only `count` changed, read-only fields
  dropped, If-Match with the etag, bearer token; Azure-AsyncOperation URL followed
  (InProgress -> still waiting, Failed -> error message, Succeeded -> done);
- 412 (etag race) and 429/5xx -> retryable; 400 (autoscaler on / quota) -> rejected with
  ARM's code and message; an async-operation URL on another host is not followed;
- client-credentials login (Microsoft Entra v2 token endpoint, scope .default) when no token
  is configured; federated token file (workload identity) as client assertion.
Generic HTTP (an OpenStack Magnum-like profile):
- templated URL/headers/body (numbers stay numbers), secret header from env, Idempotency-Key;
- operation id from the answer, polled until done / failed with its message;
- without an operation: describe until the size is reached;
- unknown profile -> ERR_CONFIG naming the configured ones.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import httpx
import pytest
import respx
from azure.core.credentials import AccessToken
from azure.identity import CredentialUnavailableError
from temporalio.exceptions import ApplicationError
from temporalio.testing import ActivityEnvironment

from activities.cloud import CloudActivities
from activities.cloud.config import AksConfig, CloudConfig
from activities.cloud.credentials import AzureToken
from contract.capacity import DescribePoolInput, NodePoolTarget, PoolOperationInput, ScalePoolInput
from contract.errors import ERR_CLOUD_REJECTED, ERR_CLOUD_UNAVAILABLE, ERR_CONFIG, ERR_STILL_WAITING

ARM = "https://management.azure.com"
SUB, RG = "00000000-0000-0000-0000-000000000001", "gpu-rg"
POOL_PATH = (
    f"/subscriptions/{SUB}/resourceGroups/{RG}/providers/Microsoft.ContainerService/"
    "managedClusters/aks-gpu/agentPools/h100"
)
POOL_URL = f"{ARM}{POOL_PATH}?api-version=2024-09-01"
ASYNC_URL = f"{ARM}/subscriptions/{SUB}/providers/Microsoft.ContainerService/locations/eastus/operations/op-1?api-version=2024-09-01"
AKS = NodePoolTarget(
    provider="aks", name="h100", cluster="aks-gpu", subscription=SUB, resource_group=RG
)


def agent_pool(count: int = 2, state: str = "Succeeded", **props: object) -> dict[str, object]:
    return {
        "id": POOL_PATH,
        "name": "h100",
        "etag": "etag-7",
        "properties": {
            "count": count,
            "vmSize": "Standard_ND96isr_H100_v5",
            "mode": "User",
            "provisioningState": state,
            "nodeImageVersion": "AKSUbuntu-2204gen2containerd-2026.11.01",
            "currentOrchestratorVersion": "1.34.2",
            "orchestratorVersion": "1.34",
            "enableAutoScaling": False,
            **props,
        },
    }


async def run(fn: object, arg: object) -> object:
    return await ActivityEnvironment().run(fn, arg)  # type: ignore[arg-type]


@pytest.fixture
def aks(monkeypatch: pytest.MonkeyPatch) -> CloudActivities:
    monkeypatch.setenv("SICKBAY_AZURE_TOKEN", "arm-token")
    return CloudActivities(CloudConfig())


@respx.mock
async def test_aks_describe(aks: CloudActivities) -> None:
    respx.get(POOL_URL).respond(
        200, json=agent_pool(3, "Scaling", enableAutoScaling=True, minCount=1, maxCount=6)
    )
    desc = await run(aks.describe_pool, DescribePoolInput(pool=AKS))
    assert (desc.current_size, desc.min_size, desc.max_size) == (3, 1, 6)
    assert desc.pending_operation is not None  # Scaling
    assert respx.calls.last.request.headers["authorization"] == "Bearer arm-token"


@respx.mock
async def test_aks_scale_puts_full_pool_with_new_count(aks: CloudActivities) -> None:
    respx.get(POOL_URL).respond(200, json=agent_pool(2))
    put = respx.put(POOL_URL).respond(
        200, json=agent_pool(4, "Scaling"), headers={"Azure-AsyncOperation": ASYNC_URL}
    )
    result = await run(
        aks.scale_pool, ScalePoolInput(pool=AKS, target_size=4, max_size=4, idempotency_key="k")
    )
    request = put.calls.last.request
    assert request.headers["if-match"] == "etag-7"
    assert request.headers["authorization"] == "Bearer arm-token"
    props = json.loads(request.content)["properties"]
    assert props["count"] == 4
    assert props["vmSize"] == "Standard_ND96isr_H100_v5" and props["mode"] == "User"
    for read_only in ("provisioningState", "nodeImageVersion", "currentOrchestratorVersion"):
        assert read_only not in props
    assert result.operation is not None and result.operation.id == ASYNC_URL

    op_route = respx.get(ASYNC_URL)
    op_route.side_effect = [
        httpx.Response(200, json={"name": "op-1", "status": "InProgress"}),
        httpx.Response(
            200,
            json={
                "name": "op-1",
                "status": "Failed",
                "error": {
                    "code": "QuotaExceeded",
                    "message": "Operation could not be completed as it results in exceeding approved standardNDSH100v5Family Cores quota.",
                },
            },
        ),
    ]
    req = PoolOperationInput(pool=AKS, operation=ASYNC_URL)
    with pytest.raises(ApplicationError) as info:
        await run(aks.wait_pool_operation, req)
    assert info.value.type == ERR_STILL_WAITING
    op = await run(aks.wait_pool_operation, req)
    assert op.done and "QuotaExceeded" in op.error and "Cores quota" in op.error


@pytest.mark.parametrize(
    ("status", "err_type", "words"),
    [
        (400, ERR_CLOUD_REJECTED, "InvalidParameter"),
        (412, ERR_CLOUD_UNAVAILABLE, "etag"),
        (429, ERR_CLOUD_UNAVAILABLE, "TooManyRequests"),
        (500, ERR_CLOUD_UNAVAILABLE, "InternalServerError"),
    ],
)
@respx.mock
async def test_aks_put_errors(aks: CloudActivities, status: int, err_type: str, words: str) -> None:
    respx.get(POOL_URL).respond(200, json=agent_pool(2))
    code = {
        400: "InvalidParameter",
        412: "PreconditionFailed",
        429: "TooManyRequests",
        500: "InternalServerError",
    }[status]
    respx.put(POOL_URL).respond(
        status, json={"error": {"code": code, "message": f"{code}: details from ARM"}}
    )
    with pytest.raises(ApplicationError) as info:
        await run(
            aks.scale_pool, ScalePoolInput(pool=AKS, target_size=3, max_size=4, idempotency_key="k")
        )
    assert info.value.type == err_type and words in str(info.value)


@respx.mock
async def test_aks_foreign_async_url_is_not_followed(aks: CloudActivities) -> None:
    with pytest.raises(ApplicationError) as info:
        await run(
            aks.wait_pool_operation,
            PoolOperationInput(pool=AKS, operation="https://evil.example.com/op"),
        )
    assert info.value.type == ERR_CONFIG


class FakeCredential:
    """An azure-identity credential (its `get_token` protocol) that counts its sign-ins."""

    def __init__(self, lifetime: float) -> None:
        self.lifetime, self.scopes = lifetime, []  # type: list[str]

    def get_token(self, *scopes: str, **_: object) -> AccessToken:
        self.scopes.extend(scopes)
        return AccessToken(f"entra-token-{len(self.scopes)}", int(time.time() + self.lifetime))


@respx.mock
async def test_aks_token_from_the_azure_identity_credential(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """No token configured: the credential's token for ARM's scope is sent, reused while it
    has more than the margin left, asked again after."""
    monkeypatch.delenv("SICKBAY_AZURE_TOKEN", raising=False)
    respx.get(POOL_URL).respond(200, json=agent_pool(2))
    long, short = FakeCredential(3600), FakeCredential(60)  # 60 s: inside the margin
    for credential in (long, short):
        acts = CloudActivities(CloudConfig())
        provider = acts.provider_for(AKS)
        provider._token = AzureToken(AksConfig(), credential)  # type: ignore[attr-defined]
        await run(acts.describe_pool, DescribePoolInput(pool=AKS))
        await run(acts.describe_pool, DescribePoolInput(pool=AKS))
    assert long.scopes == ["https://management.azure.com/.default"]  # once, then reused
    assert len(short.scopes) == 2
    assert respx.calls.last.request.headers["authorization"] == "Bearer entra-token-2"


def test_the_azure_chain_is_workload_identity_and_managed_identity(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """What AKS workload identity injects selects azure-identity's workload identity
    credential; no developer sign-in (CLI, PowerShell, VS Code, browser) is in the chain."""
    federated = tmp_path / "azure-identity-token"
    federated.write_text("eyJfederated")
    monkeypatch.setenv("AZURE_TENANT_ID", "tenant-1")
    monkeypatch.setenv("AZURE_CLIENT_ID", "client-1")
    monkeypatch.setenv("AZURE_FEDERATED_TOKEN_FILE", str(federated))
    monkeypatch.setenv("AZURE_AUTHORITY_HOST", "https://login.microsoftonline.us")
    chain = AzureToken(AksConfig()).credential()
    kinds = [type(c).__name__ for c in chain.credentials]
    assert "WorkloadIdentityCredential" in kinds and "ManagedIdentityCredential" in kinds
    assert not {
        "AzureCliCredential",
        "AzurePowerShellCredential",
        "VisualStudioCodeCredential",
        "InteractiveBrowserCredential",
        "AzureDeveloperCliCredential",
    } & set(kinds)


async def test_aks_without_credentials_says_what_to_set(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("SICKBAY_AZURE_TOKEN", raising=False)
    acts = CloudActivities(CloudConfig())
    provider = acts.provider_for(AKS)

    class Nothing:
        def get_token(self, *scopes: str, **_: object) -> AccessToken:
            raise CredentialUnavailableError("DefaultAzureCredential failed to retrieve a token")

    provider._token = AzureToken(AksConfig(), Nothing())  # type: ignore[attr-defined]
    with pytest.raises(ApplicationError) as info:
        await run(acts.describe_pool, DescribePoolInput(pool=AKS))
    assert info.value.type == ERR_CONFIG and "AZURE_FEDERATED_TOKEN_FILE" in str(info.value)


# --- generic HTTP --------------------------------------------------------------------------

MAGNUM = "https://magnum.cloud.internal:9511"
HTTP_POOL = NodePoolTarget(
    provider="http", name="gpu-ng", cluster="c-42", endpoint=MAGNUM, profile="magnum"
)
PROFILE = """
http:
  magnum:
    headers:
      X-Auth-Token: {env: OS_TOKEN}
      OpenStack-API-Version: container-infra latest
    describe:
      url: "{endpoint}/v1/clusters/{cluster}/nodegroups/{name}"
    size_path: node_count
    max_path: max_node_count
    scale:
      method: PATCH
      url: "{endpoint}/v1/clusters/{cluster}/nodegroups/{name}"
      body: [{op: replace, path: /node_count, value: "{size}"}]
      ok_status: [202]
    operation_id_path: uuid
    operation:
      call: {url: "{endpoint}/v1/clusters/{cluster}/nodegroups/{operation}"}
      done_path: status
      done_values: [UPDATE_COMPLETE]
      failed_values: [UPDATE_FAILED]
      message_path: status_reason
  sync:
    describe: {url: "{endpoint}/pools/{name}"}
    size_path: spec.size
    scale: {method: PUT, url: "{endpoint}/pools/{name}", body: {size: "{size}"}}
"""


@pytest.fixture
def http_acts(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> CloudActivities:
    monkeypatch.setenv("OS_TOKEN", "gAAAAos-token")
    path = tmp_path / "cloud.yaml"
    path.write_text(PROFILE)
    return CloudActivities(CloudConfig.load(path))


@respx.mock
async def test_http_profile_scale_and_operation(http_acts: CloudActivities) -> None:
    ng = f"{MAGNUM}/v1/clusters/c-42/nodegroups/gpu-ng"
    respx.get(ng).respond(200, json={"uuid": "ng-uuid", "node_count": 2, "max_node_count": 5})
    patch = respx.patch(ng).respond(202, json={"uuid": "ng-uuid"})
    result = await run(
        http_acts.scale_pool,
        ScalePoolInput(pool=HTTP_POOL, target_size=3, max_size=8, idempotency_key="idem-1"),
    )
    request = patch.calls.last.request
    assert json.loads(request.content) == [{"op": "replace", "path": "/node_count", "value": 3}]
    assert request.headers["x-auth-token"] == "gAAAAos-token"
    assert request.headers["openstack-api-version"] == "container-infra latest"
    assert request.headers["idempotency-key"] == "idem-1"
    assert result.operation is not None and result.operation.id == "ng-uuid"

    poll = respx.get(f"{MAGNUM}/v1/clusters/c-42/nodegroups/ng-uuid")
    poll.side_effect = [
        httpx.Response(200, json={"status": "UPDATE_IN_PROGRESS"}),
        httpx.Response(
            200, json={"status": "UPDATE_FAILED", "status_reason": "Quota exceeded for instances"}
        ),
    ]
    req = PoolOperationInput(pool=HTTP_POOL, operation="ng-uuid")
    with pytest.raises(ApplicationError):
        await run(http_acts.wait_pool_operation, req)
    op = await run(http_acts.wait_pool_operation, req)
    assert op.done and op.error == "UPDATE_FAILED: Quota exceeded for instances"


@respx.mock
async def test_http_profile_provider_max_is_respected(http_acts: CloudActivities) -> None:
    ng = f"{MAGNUM}/v1/clusters/c-42/nodegroups/gpu-ng"
    respx.get(ng).respond(200, json={"node_count": 4, "max_node_count": 5})
    patch = respx.patch(ng)
    with pytest.raises(ApplicationError) as info:
        await run(
            http_acts.scale_pool,
            ScalePoolInput(pool=HTTP_POOL, target_size=6, max_size=8, idempotency_key="k"),
        )
    assert info.value.type == ERR_CLOUD_REJECTED and "max for this pool is 5" in str(info.value)
    assert not patch.called


@respx.mock
async def test_http_profile_without_operation_polls_the_size(http_acts: CloudActivities) -> None:
    pool = HTTP_POOL.model_copy(update={"profile": "sync"})
    get = respx.get(f"{MAGNUM}/pools/gpu-ng")
    get.side_effect = [
        httpx.Response(200, json={"spec": {"size": 1}}),
        httpx.Response(200, json={"spec": {"size": 1}}),
        httpx.Response(200, json={"spec": {"size": 2}}),
    ]
    put = respx.put(f"{MAGNUM}/pools/gpu-ng").respond(200, json={})
    result = await run(
        http_acts.scale_pool,
        ScalePoolInput(pool=pool, target_size=2, max_size=4, idempotency_key="k"),
    )
    assert json.loads(put.calls.last.request.content) == {"size": 2}
    assert result.operation is not None
    req = PoolOperationInput(pool=pool, operation=result.operation.id)
    with pytest.raises(ApplicationError):
        await run(http_acts.wait_pool_operation, req)
    assert (await run(http_acts.wait_pool_operation, req)).done


async def test_unknown_http_profile(http_acts: CloudActivities) -> None:
    pool = HTTP_POOL.model_copy(update={"profile": "nope"})
    with pytest.raises(ApplicationError) as info:
        await run(http_acts.describe_pool, DescribePoolInput(pool=pool))
    assert info.value.type == ERR_CONFIG and "configured: magnum, sync" in str(info.value)


# --- a generic HTTP profile with EKS shapes (e.g. behind a signing proxy; EKS itself is the -----
# --- built-in `eks` provider, tests/cloud/test_eks.py) -----------------------------------------

EKS_PROXY = "http://127.0.0.1:8005"
EKS_PROFILE = """
http:
  eks:
    describe: {url: "{endpoint}/clusters/{cluster}/node-groups/{name}"}
    size_path: nodegroup.scalingConfig.desiredSize
    min_path: nodegroup.scalingConfig.minSize
    max_path: nodegroup.scalingConfig.maxSize
    scale:
      method: POST
      url: "{endpoint}/clusters/{cluster}/node-groups/{name}/update-config"
      body: {scalingConfig: {desiredSize: "{size}"}, clientRequestToken: "{idempotency_key}"}
      ok_status: [200]
    idempotency_header: null
    operation_id_path: update.id
    operation:
      call: {url: "{endpoint}/clusters/{cluster}/updates/{operation}?nodegroupName={name}"}
      done_path: update.status
      done_values: [Successful]
      failed_values: [Failed, Cancelled]
      message_path: update.errors.0.errorMessage
"""


@respx.mock
async def test_eks_profile_follows_the_eks_api(tmp_path: Path) -> None:
    path = tmp_path / "cloud.yaml"
    path.write_text(EKS_PROFILE)
    acts = CloudActivities(CloudConfig.load(path))
    pool = NodePoolTarget(
        provider="http", profile="eks", name="gpu-ng", cluster="prod", endpoint=EKS_PROXY
    )
    respx.get(f"{EKS_PROXY}/clusters/prod/node-groups/gpu-ng").respond(
        200,
        json={
            "nodegroup": {
                "nodegroupName": "gpu-ng",
                "status": "ACTIVE",
                "scalingConfig": {"minSize": 1, "maxSize": 6, "desiredSize": 2},
            }
        },
    )
    update = respx.post(f"{EKS_PROXY}/clusters/prod/node-groups/gpu-ng/update-config").respond(
        200, json={"update": {"id": "upd-1", "status": "InProgress", "type": "ConfigUpdate"}}
    )
    result = await run(
        acts.scale_pool,
        ScalePoolInput(pool=pool, target_size=3, max_size=8, idempotency_key="sickbay-r1"),
    )
    assert json.loads(update.calls.last.request.content) == {
        "scalingConfig": {"desiredSize": 3},
        "clientRequestToken": "sickbay-r1",
    }
    assert "idempotency-key" not in update.calls.last.request.headers
    assert result.operation is not None and result.operation.id == "upd-1"
    respx.get(
        f"{EKS_PROXY}/clusters/prod/updates/upd-1", params={"nodegroupName": "gpu-ng"}
    ).respond(
        200,
        json={
            "update": {
                "id": "upd-1",
                "status": "Failed",
                "errors": [
                    {"errorCode": "NodeCreationFailure", "errorMessage": "Instances failed to join"}
                ],
            }
        },
    )
    op = await run(acts.wait_pool_operation, PoolOperationInput(pool=pool, operation="upd-1"))
    assert op.done and op.error == "Failed: Instances failed to join"


@respx.mock
async def test_http_profile_keeps_its_credentials_on_its_endpoints(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("OS_TOKEN", "gAAAAos-token")
    path = tmp_path / "cloud.yaml"
    path.write_text(PROFILE.replace("  magnum:\n", f"  magnum:\n    endpoint: {MAGNUM}\n", 1))
    acts = CloudActivities(CloudConfig.load(path))
    evil = respx.get(url__startswith="https://evil.example.com")
    with pytest.raises(ApplicationError) as info:
        await run(
            acts.describe_pool,
            DescribePoolInput(
                pool=HTTP_POOL.model_copy(update={"endpoint": "https://evil.example.com"})
            ),
        )
    assert info.value.type == ERR_CONFIG and not evil.called
    # without an endpoint in the runbook the profile's own is used
    respx.get(f"{MAGNUM}/v1/clusters/c-42/nodegroups/gpu-ng").respond(200, json={"node_count": 1})
    desc = await run(
        acts.describe_pool, DescribePoolInput(pool=HTTP_POOL.model_copy(update={"endpoint": None}))
    )
    assert desc.current_size == 1
