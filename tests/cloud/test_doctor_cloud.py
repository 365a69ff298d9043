"""`sickbay doctor`'s cloud checks (worker/doctor_cloud.py): AWS against the twin's EKS shapes
through boto3 with the test's own credentials in the environment; GKE and AKS from what
google-auth and azure-identity would use.

Cases:
- AWS: region, the chain's leg that found the credentials (environment here), each runbook
  EKS node group described (status, size, bounds); a node group that is not there, a call
  denied (names the eks: permissions to grant), a key AWS does not know, no credentials at
  all, no region: each an error with its fix; a runbook pool without a cluster;
- nothing configured and no runbook naming a cloud: no cloud line at all;
- GKE: a ready token is named; Application Default Credentials that cannot be found -> error
  naming Workload Identity;
- AKS: workload identity's variables and readable token file -> ok; the file missing -> error;
  a ready token -> ok.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from activities.cloud.config import AksConfig, CloudConfig, GkeConfig
from contract.capacity import NodePoolTarget
from tests.cloud.aws_twin import aws_config, aws_env
from twin.cloudapi import CloudApi, CloudApiServer, TwinPool
from worker.doctor_cloud import cloud_checks

CLOUD_VARS = (
    "SICKBAY_AWS_REGION",
    "SICKBAY_AWS_PROFILE",
    "SICKBAY_EKS_CLUSTER",
    "AWS_REGION",
    "AWS_DEFAULT_REGION",
    "SICKBAY_GKE_TOKEN",
    "SICKBAY_GKE_TOKEN_FILE",
    "SICKBAY_GKE_PROJECT",
    "SICKBAY_GKE_CLUSTER",
    "GOOGLE_APPLICATION_CREDENTIALS",
    "SICKBAY_AZURE_TOKEN",
    "SICKBAY_AZURE_TOKEN_FILE",
    "SICKBAY_AKS_SUBSCRIPTION",
    "SICKBAY_AKS_CLUSTER",
    "AZURE_CLIENT_ID",
    "AZURE_TENANT_ID",
    "AZURE_FEDERATED_TOKEN_FILE",
    "AZURE_CLIENT_SECRET",
)


@pytest.fixture(autouse=True)
def no_cloud_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for var in CLOUD_VARS:
        monkeypatch.delenv(var, raising=False)


def runbook_with(pool: NodePoolTarget) -> Any:
    return SimpleNamespace(spec=SimpleNamespace(scale_up=SimpleNamespace(pool=pool, provider=None)))


async def checked(pool: NodePoolTarget, config: CloudConfig) -> list[Any]:
    """doctor's checks off the event loop: the twin serves on it, boto3 blocks."""
    return await asyncio.to_thread(cloud_checks, [runbook_with(pool)], config)


def lines(checks: list[Any]) -> list[tuple[str, str, str]]:
    return [(c.status, c.name, c.detail) for c in checks]


@pytest.fixture
async def aws_twin(monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[tuple[CloudApi, Any]]:
    api = CloudApi(token="unused")
    api.add_pool(TwinPool(name="gpu-ng", size=2, max_size=4))
    aws_env(monkeypatch, api.aws.aws_access_key_id)
    async with CloudApiServer(api) as server:
        yield api, CloudConfig(aws=aws_config(server))


POOL = NodePoolTarget(provider="eks", name="gpu-ng", cluster="twin")


async def test_aws_names_the_credentials_and_describes_each_node_group(aws_twin: Any) -> None:
    _api, config = aws_twin
    checks = await checked(POOL, config)
    assert lines(checks) == [
        ("ok", "aws region", "us-twin-1"),
        ("ok", "aws credentials", "environment variables (AWS_ACCESS_KEY_ID)"),
        ("ok", "eks node group", "twin/gpu-ng: ACTIVE, size 2 (min 0, max 4)"),
    ]


async def test_aws_errors_name_their_fix(aws_twin: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    api, config = aws_twin
    missing = POOL.model_copy(update={"name": "no-such-ng"})
    [*_, gone] = await checked(missing, config)
    assert gone.status == "error" and "ResourceNotFoundException" in gone.detail
    api.inject(403, message="not authorized to perform: eks:DescribeNodegroup")
    [*_, denied] = await checked(POOL, config)
    assert denied.status == "error" and "eks:UpdateNodegroupConfig" in denied.fix
    no_cluster = NodePoolTarget(provider="eks", name="gpu-ng")
    bare = config.model_copy(update={"aws": config.aws.model_copy(update={"cluster": None})})
    [*_, unnamed] = await checked(no_cluster, bare)
    assert unnamed.status == "error" and "no cluster" in unnamed.detail
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "AKIAUNKNOWNKEY000000")
    [*_, unknown] = await checked(POOL, config)
    assert unknown.status == "error" and "UnrecognizedClientException" in unknown.detail
    monkeypatch.delenv("AWS_ACCESS_KEY_ID")
    monkeypatch.delenv("AWS_SECRET_ACCESS_KEY")
    [*_, none] = await checked(POOL, config)
    assert none.status == "error" and "found no credentials" in none.detail
    assert "Pod Identity or IRSA" in none.fix
    regionless = config.model_copy(update={"aws": config.aws.model_copy(update={"region": None})})
    [nowhere] = await checked(POOL, regionless)
    assert nowhere.status == "error" and nowhere.name == "aws region"


def test_nothing_configured_no_cloud_line() -> None:
    assert cloud_checks([], CloudConfig()) == []


def test_gke_token_or_adc(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("SICKBAY_GKE_TOKEN", "ya29.t")
    [ready] = cloud_checks([], CloudConfig(gke=GkeConfig()))
    assert ready.status == "ok" and "$SICKBAY_GKE_TOKEN" in ready.detail
    monkeypatch.delenv("SICKBAY_GKE_TOKEN")
    monkeypatch.setenv("GOOGLE_APPLICATION_CREDENTIALS", str(tmp_path / "missing.json"))
    [none] = cloud_checks([], CloudConfig(gke=GkeConfig()))
    assert none.status == "error" and "Workload Identity" in none.fix


def test_aks_workload_identity(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    token = tmp_path / "azure-identity-token"
    monkeypatch.setenv("AZURE_CLIENT_ID", "client-1")
    monkeypatch.setenv("AZURE_TENANT_ID", "tenant-1")
    monkeypatch.setenv("AZURE_FEDERATED_TOKEN_FILE", str(token))
    [missing] = cloud_checks([], CloudConfig(aks=AksConfig()))
    assert missing.status == "error" and "unreadable" in missing.detail
    token.write_text("eyJ")
    [ok] = cloud_checks([], CloudConfig(aks=AksConfig()))
    assert (ok.status, ok.detail) == ("ok", "azure-identity: AKS workload identity")
    monkeypatch.setenv("SICKBAY_AZURE_TOKEN", "t")
    [ready] = cloud_checks([], CloudConfig(aks=AksConfig()))
    assert ready.status == "ok" and "ready token" in ready.detail
