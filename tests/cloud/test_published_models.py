"""Every request Sickbay sends to a cloud, checked against that cloud's published model, not
only against the twin: a misspelt field, a wrong type, an unknown query parameter or a path
the API does not have fails here.

- AWS: botocore's service models (eks 2017-11-01, ec2 2016-11-15, autoscaling 2011-01-01)
  through its Stubber: each call is validated by botocore's parameter validation on the real
  model and compared with the parameters expected, and each canned answer (the twin's own
  EKS answers among them) is validated against the model's output shape. The twin's EC2 and
  Auto Scaling XML answers are walked against the output shapes too.
- GKE: the Kubernetes Engine API v1 and Compute Engine v1 discovery documents shipped with
  google-api-python-client: method and path template, query parameters, body schema.
- AKS: azure-mgmt-containerservice's AgentPool model (the ARM agent-pool schema): the PUT
  body's fields, their types, and no read-only field sent back; the agent-pool URL template.

The requests are captured from the real providers (against the twin for GKE, respx for AKS,
the Stubber for AWS).
"""

from __future__ import annotations

import functools
import json
import re
import typing
import xml.etree.ElementTree as ET
from collections.abc import AsyncIterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any
from urllib.parse import parse_qs, urlsplit

import botocore.session
import httpx
import pytest
import respx
from botocore.stub import Stubber

from activities.cloud.aks import AksNodePools
from activities.cloud.aws import AwsClients, EksNodeGroups, request_token
from activities.cloud.config import AksConfig, AwsConfig
from activities.cloud.credentials import StaticToken
from activities.cloud.ec2 import Ec2Machines
from activities.cloud.gke import GkeNodePools
from activities.cloud.machines import GkeMachines
from activities.outbound import SecretRef
from contract.capacity import NodePoolTarget
from tests.cloud.aws_twin import REGION, aws_config, aws_env
from twin.cloudapi import CloudApi, CloudApiServer, TwinPool

# --- AWS ---------------------------------------------------------------------------------------

EKS_POOL = NodePoolTarget(provider="eks", name="gpu-ng", cluster="prod", location=REGION)
INSTANCE = "i-0123456789abcdef0"


class FakeCore:
    """The kubernetes client's CoreV1Api, as far as the machine rungs read and patch nodes."""

    def __init__(self, provider_id: str) -> None:
        self.node = SimpleNamespace(
            spec=SimpleNamespace(provider_id=provider_id),
            metadata=SimpleNamespace(annotations={}),
            status=SimpleNamespace(conditions=[], node_info=SimpleNamespace(boot_id="b-1")),
        )
        self.patches: list[Any] = []

    def read_node(self, name: str) -> Any:
        return self.node

    def patch_node(self, name: str, body: Any) -> Any:
        self.patches.append(body)
        return self.node


@functools.cache
def _session() -> Any:
    """One botocore session: its loader reads each service model once (EC2's is large)."""
    return botocore.session.get_session()


def stubbed(clients: AwsClients, service: str) -> tuple[Any, Stubber]:
    client = _session().create_client(
        service,
        region_name=REGION,
        aws_access_key_id="AKIASTUBBEREXAMPLE01",
        aws_secret_access_key="stubber-secret",
    )
    clients._clients[(service, REGION)] = client
    stub = Stubber(client)
    stub.activate()
    return client, stub


@pytest.fixture
def aws(monkeypatch: pytest.MonkeyPatch) -> AwsClients:
    aws_env(monkeypatch, "AKIASTUBBEREXAMPLE01")
    return AwsClients(AwsConfig(region=REGION, cluster="prod"))


@pytest.fixture
async def twin_nodegroup(monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[dict[str, Any]]:
    """The twin's DescribeNodegroup answer (validated below against the model)."""
    api = CloudApi(token="unused", cluster="prod")
    api.add_pool(TwinPool(name="gpu-ng", size=2, max_size=4))
    yield api.aws.nodegroup(api.pools["gpu-ng"])


async def test_eks_requests_match_the_eks_model(
    aws: AwsClients, twin_nodegroup: dict[str, Any]
) -> None:
    _client, stub = stubbed(aws, "eks")
    eks = EksNodeGroups(aws, AwsConfig(region=REGION, cluster="prod"))
    names = {"clusterName": "prod", "nodegroupName": "gpu-ng"}
    update = {"id": "u-1", "status": "InProgress", "type": "ConfigUpdate", "errors": [],
              "params": [{"type": "DesiredSize", "value": "3"}]}  # fmt: skip
    stub.add_response("describe_nodegroup", {"nodegroup": twin_nodegroup}, names)
    stub.add_response(
        "update_nodegroup_config",
        {"update": update},
        {**names, "scalingConfig": {"desiredSize": 3}, "clientRequestToken": request_token("k")},
    )
    stub.add_response(
        "describe_update",
        {"update": {**update, "status": "Successful"}},
        {"name": "prod", "updateId": "u-1", "nodegroupName": "gpu-ng"},
    )
    updating = {**twin_nodegroup, "status": "UPDATING"}
    stub.add_response("describe_nodegroup", {"nodegroup": updating}, names)
    stub.add_response(
        "list_updates",
        {"updateIds": ["u-1"]},
        {"name": "prod", "nodegroupName": "gpu-ng", "maxResults": 10},
    )
    stub.add_response(
        "describe_update",
        {"update": update},
        {"name": "prod", "updateId": "u-1", "nodegroupName": "gpu-ng"},
    )
    assert (await eks.describe(EKS_POOL)).current_size == 2
    outcome = await eks.set_size(EKS_POOL, 3, 4, "k")
    assert outcome.operation is not None
    assert (await eks.get_operation(EKS_POOL, "u-1")).done
    pending = (await eks.describe(EKS_POOL)).pending_operation
    assert pending is not None and pending.id == "u-1" and pending.target_size == 3
    stub.assert_no_pending_responses()


async def test_ec2_and_auto_scaling_requests_match_their_models(aws: AwsClients) -> None:
    _ec2, ec2_stub = stubbed(aws, "ec2")
    _asg, asg_stub = stubbed(aws, "autoscaling")
    machines = Ec2Machines(aws, None)
    machines._core = FakeCore(f"aws:///{REGION}a/{INSTANCE}")  # type: ignore[assignment]
    ec2_stub.add_response("reboot_instances", {}, {"InstanceIds": [INSTANCE]})
    member = {"InstanceId": INSTANCE, "AutoScalingGroupName": "eks-gpu-ng-1", "LifecycleState":
              "InService", "AvailabilityZone": f"{REGION}a", "HealthStatus": "HEALTHY",
              "ProtectedFromScaleIn": False}  # fmt: skip
    asg_stub.add_response(
        "describe_auto_scaling_instances",
        {"AutoScalingInstances": [member]},
        {"InstanceIds": [INSTANCE]},
    )
    activity = {"ActivityId": "a-1", "AutoScalingGroupName": "eks-gpu-ng-1", "Cause": "user",
                "StartTime": "2026-12-05T07:00:00Z", "StatusCode": "InProgress"}  # fmt: skip
    asg_stub.add_response(
        "terminate_instance_in_auto_scaling_group",
        {"Activity": activity},
        {"InstanceId": INSTANCE, "ShouldDecrementDesiredCapacity": False},
    )
    asg_stub.add_response(
        "describe_auto_scaling_instances", {"AutoScalingInstances": []}, {"InstanceIds": [INSTANCE]}
    )
    ec2_stub.add_response(
        "describe_instances",
        {"Reservations": [{"Instances": [{"InstanceId": INSTANCE, "State": {"Name": "running",
                                                                           "Code": 16}}]}]},
        {"InstanceIds": [INSTANCE]},
    )  # fmt: skip
    assert (await machines.reboot("n1", "k", EKS_POOL)).asked
    assert (await machines.replace("n1", "k", EKS_POOL)).asked
    with pytest.raises(Exception, match="no Auto Scaling group"):
        await machines.replace("n1", "k2", EKS_POOL)
    ec2_stub.assert_no_pending_responses()
    asg_stub.assert_no_pending_responses()


def test_a_misspelt_aws_field_fails_the_model() -> None:
    """The check itself: botocore refuses a request the model does not have."""
    from botocore.exceptions import ParamValidationError

    client = _session().create_client(
        "eks", region_name=REGION, aws_access_key_id="a", aws_secret_access_key="b"
    )
    stub = Stubber(client)
    stub.add_response("update_nodegroup_config", {})  # no expected params: only the model
    stub.activate()
    with pytest.raises(ParamValidationError, match="desiredsize"):
        client.update_nodegroup_config(
            clusterName="c", nodegroupName="n", scalingConfig={"desiredsize": 3}
        )


def _xml_against(element: ET.Element, shape: Any, where: str) -> None:
    """Every element of the twin's XML is a member of the model's shape, recursively."""
    tag = element.tag.split("}", 1)[-1]
    if shape.type_name == "structure":
        members = {m.serialization.get("name", n): m for n, m in shape.members.items()}
        for child in element:
            name = child.tag.split("}", 1)[-1]
            assert name in members, f"{where}/{tag}: <{name}> is not in {shape.name}"
            _xml_against(child, members[name], f"{where}/{tag}")
    elif shape.type_name == "list":
        item = shape.member.serialization.get("name", "member")
        for child in element:
            name = child.tag.split("}", 1)[-1]
            assert name == item, f"{where}/{tag}: <{name}> is not a list item <{item}>"
            _xml_against(child, shape.member, f"{where}/{tag}")
    else:
        assert len(element) == 0, f"{where}/{tag}: a {shape.type_name} has no children"


@pytest.mark.parametrize(
    ("service", "action", "form"),
    [
        ("ec2", "RebootInstances", {"InstanceId.1": INSTANCE}),
        ("ec2", "DescribeInstances", {"InstanceId.1": INSTANCE}),
        ("autoscaling", "DescribeAutoScalingInstances", {"InstanceIds.member.1": INSTANCE}),
        (
            "autoscaling",
            "TerminateInstanceInAutoScalingGroup",
            {"InstanceId": INSTANCE, "ShouldDecrementDesiredCapacity": "false"},
        ),
    ],
)
async def test_the_twins_xml_answers_match_the_models(
    service: str, action: str, form: dict[str, str]
) -> None:
    api = CloudApi(token="unused")
    api.aws.instances[INSTANCE] = "n1"
    api.aws.instance_pool[INSTANCE] = "gpu-ng"
    handler = api.aws.ec2 if service == "ec2" else api.aws.autoscaling
    answer = await handler({"Action": [action], **{k: [v] for k, v in form.items()}})
    assert answer.status_code == 200, answer.body
    model = _session().get_service_model(service)
    output = model.operation_model(action).output_shape
    root = ET.fromstring(bytes(answer.body))
    assert root.tag.split("}", 1)[-1] == f"{action}Response"
    for child in root:
        name = child.tag.split("}", 1)[-1]
        if name in ("requestId", "ResponseMetadata"):
            continue
        if output is None:  # no output in the model: EC2 answers only <return>true</return>
            assert name == "return" and child.text == "true", name
            continue
        if service == "autoscaling":  # the Query protocol wraps the output in <ActionResult>
            assert name == f"{action}Result"
            for grandchild in child:
                wrapper = ET.Element("r")
                wrapper.append(grandchild)
                _xml_against(wrapper, output, action)
        else:
            wrapper = ET.Element("r")
            wrapper.append(child)
            _xml_against(wrapper, output, action)


# --- GKE ---------------------------------------------------------------------------------------

DISCOVERY = Path(__import__("googleapiclient").__file__).parent / "discovery_cache" / "documents"


@functools.cache
def _discovery(name: str) -> dict[str, Any]:
    return dict(json.loads((DISCOVERY / name).read_text()))


def _methods(resource: dict[str, Any]) -> list[dict[str, Any]]:
    found = list((resource.get("methods") or {}).values())
    for child in (resource.get("resources") or {}).values():
        found.extend(_methods(child))
    return found


def _template(path: str) -> re.Pattern[str]:
    parts = re.split(r"(\{\+?[A-Za-z]+\})", path)
    return re.compile(
        "".join("[^/]+" if p.startswith("{") else re.escape(p) for p in parts if p) + "$"
    )


def _check_body(value: Any, schema: dict[str, Any], schemas: dict[str, Any], where: str) -> None:
    if "$ref" in schema:
        schema = schemas[schema["$ref"]]
    kind = schema.get("type")
    if kind == "object" and "properties" in schema:
        assert isinstance(value, dict), f"{where}: expected an object"
        for key, item in value.items():
            assert key in schema["properties"], f"{where}.{key} is not in the published schema"
            _check_body(item, schema["properties"][key], schemas, f"{where}.{key}")
    elif kind == "array":
        assert isinstance(value, list), f"{where}: expected an array"
        for i, item in enumerate(value):
            _check_body(item, schema["items"], schemas, f"{where}[{i}]")
    elif kind == "integer":
        assert isinstance(value, int) and not isinstance(value, bool), f"{where}: not an integer"
    elif kind == "string":
        assert isinstance(value, str), f"{where}: not a string"


def check_google(request: httpx.Request, base: str) -> str:
    """The discovery method `request` is (its id), or an assertion naming what is wrong."""
    path = str(request.url).removeprefix(base).split("?", 1)[0].lstrip("/")
    for doc_name in ("container.v1.json", "compute.v1.json"):
        doc = _discovery(doc_name)
        for method in _methods(doc):
            template = doc["servicePath"] + method.get("flatPath", method["path"])
            if method["httpMethod"] != request.method or not _template(template).match(path):
                continue
            query = set(parse_qs(urlsplit(str(request.url)).query))
            known = {n for n, p in method.get("parameters", {}).items() if p["location"] == "query"}
            assert query <= known, f"{method['id']}: unknown query {query - known}"
            if request.content:
                assert "request" in method, f"{method['id']} takes no body"
                body = json.loads(request.content)
                _check_body(body, method["request"], doc["schemas"], method["id"])
            return str(method["id"])
    raise AssertionError(f"{request.method} {path}: no such method in the published APIs")


async def test_gke_requests_match_the_published_discovery_documents(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("SICKBAY_TEST_GKE_TOKEN", "t")
    api = CloudApi(token="t", project="proj-1", location="us-central1", cluster="gpu")
    api.add_pool(TwinPool(name="h100", size=2, max_size=4, latency=0.05))
    sent: list[httpx.Request] = []

    async def capture(request: httpx.Request) -> None:
        sent.append(request)

    async with (
        CloudApiServer(api) as server,
        httpx.AsyncClient(event_hooks={"request": [capture]}) as client,
    ):
        pools = GkeNodePools(
            client,
            endpoint=server.url,
            token=StaticToken(SecretRef(env="SICKBAY_TEST_GKE_TOKEN")),
            compute_hosts=[server.url],
        )
        pool = NodePoolTarget(
            provider="gke", name="h100", project="proj-1", location="us-central1", cluster="gpu"
        )
        await pools.describe(pool)
        outcome = await pools.set_size(pool, 3, 4, "k")
        assert outcome.operation is not None
        await pools.get_operation(pool, outcome.operation.id)
        await api.wait_idle()
        machines = GkeMachines(pools, None, server.url)
        machines._core = FakeCore("gce://proj-1/local-a/gke-gpu-h100-0")  # type: ignore[assignment]
        await machines.reboot("n1", "k", pool)
        await machines.replace("n1", "k", pool)
        ids = [check_google(r, server.url) for r in sent]
    assert set(ids) == {
        "container.projects.locations.clusters.nodePools.get",
        "container.projects.locations.clusters.nodePools.setSize",
        "container.projects.locations.operations.list",
        "container.projects.locations.operations.get",
        "compute.instanceGroupManagers.get",
        "compute.instances.reset",
        "compute.instanceGroupManagers.recreateInstances",
    }, ids


def test_a_misspelt_gke_field_fails_the_discovery_check() -> None:
    request = httpx.Request(
        "POST",
        "https://container.googleapis.com/v1/projects/p/locations/l/clusters/c/nodePools/n:setSize",
        json={"node_count": 3},
    )
    with pytest.raises(AssertionError, match="node_count is not in the published schema"):
        check_google(request, "https://container.googleapis.com")


# --- AKS ---------------------------------------------------------------------------------------


def _aks_model() -> tuple[Any, Any]:
    from azure.mgmt.containerservice import models
    from azure.mgmt.containerservice.models import _models

    return models, _models


def check_arm_model(value: Any, cls: Any, where: str) -> None:
    """`value` (a JSON body) against an azure-mgmt model class: known rest names, writable
    (not read-only), nested models and scalar types."""
    from azure.mgmt.containerservice._utils.model_base import Model as base

    models, private = _aks_model()
    hints = typing.get_type_hints(cls, globalns={**vars(private), "_models": models})
    fields = {f._rest_name: (attr, f) for attr, f in cls()._attr_to_rest_field.items()}
    assert isinstance(value, dict), f"{where}: expected an object"
    for key, item in value.items():
        assert key in fields, f"{where}.{key} is not in {cls.__name__}"
        attr, field = fields[key]
        assert field._visibility != ["read"], f"{where}.{key} is read-only: never sent"
        kind = hints[attr]
        args = [a for a in typing.get_args(kind) if a is not type(None)] or [kind]
        model = next((a for a in args if isinstance(a, type) and issubclass(a, base)), None)
        if model is not None:
            check_arm_model(item, model, f"{where}.{key}")
        elif int in args:
            assert isinstance(item, int) and not isinstance(item, bool), f"{where}.{key}: int"
        elif bool in args:
            assert isinstance(item, bool), f"{where}.{key}: bool"


ARM = "https://management.azure.com"
AGENT_POOL = (
    "/subscriptions/sub-1/resourceGroups/rg-1/providers/Microsoft.ContainerService/"
    "managedClusters/aks1/agentPools/gpupool"
)


def arm_agent_pool() -> dict[str, Any]:
    """An agent pool as ARM returns it (read-only fields included)."""
    return {
        "id": AGENT_POOL,
        "name": "gpupool",
        "type": "Microsoft.ContainerService/managedClusters/agentPools",
        "properties": {
            "eTag": "0e1f2a",
            "count": 2,
            "vmSize": "Standard_ND96isr_H100_v5",
            "osType": "Linux",
            "mode": "User",
            "enableAutoScaling": True,
            "minCount": 0,
            "maxCount": 4,
            "orchestratorVersion": "1.36.2",
            "currentOrchestratorVersion": "1.36.2",
            "nodeImageVersion": "AKSUbuntu-2204gen2containerd-202611.01.0",
            "provisioningState": "Succeeded",
            "powerState": {"code": "Running"},
            "nodeTaints": ["sku=gpu:NoSchedule"],
            "upgradeSettings": {"maxSurge": "10%"},
        },
    }


@respx.mock
async def test_aks_requests_match_the_arm_agent_pool_schema(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("SICKBAY_AZURE_TOKEN", "arm-token")
    url = f"{ARM}{AGENT_POOL}"
    respx.get(url__startswith=url).respond(200, json=arm_agent_pool(), headers={"ETag": "x"})
    put = respx.put(url__startswith=url).respond(200, json=arm_agent_pool())
    async with httpx.AsyncClient() as client:
        pools = AksNodePools(client, AksConfig())
        pool = NodePoolTarget(
            provider="aks", name="gpupool", subscription="sub-1", resource_group="rg-1",
            cluster="aks1",
        )  # fmt: skip
        await pools.describe(pool)
        await pools.set_size(pool, 3, 4, "k")
    models, _private = _aks_model()
    body = json.loads(put.calls.last.request.content)
    check_arm_model(body, models.AgentPool, "AgentPool")
    assert body["properties"]["count"] == 3
    source = Path(models.__file__).parent.parent / "operations" / "_operations.py"
    template = re.search(
        r'_url = "(/subscriptions/[^"]+/agentPools/\{agentPoolName\})"', source.read_text()
    )
    assert template is not None
    for call in respx.calls:
        assert _template(template.group(1)).match(call.request.url.path), call.request.url.path


def test_a_read_only_or_misspelt_aks_field_fails_the_schema() -> None:
    models, _private = _aks_model()
    with pytest.raises(AssertionError, match="eTag is read-only"):
        check_arm_model({"properties": {"eTag": "x"}}, models.AgentPool, "AgentPool")
    with pytest.raises(AssertionError, match="nodeCount is not in"):
        check_arm_model({"properties": {"nodeCount": 3}}, models.AgentPool, "AgentPool")


def test_the_aws_twin_config_names_only_modelled_services() -> None:
    """The services Sickbay reaches (its config's endpoint keys) are botocore services."""
    session = _session()
    available = set(session.get_available_services())
    for service in ("eks", "ec2", "autoscaling"):
        assert service in available
    server = SimpleNamespace(url="http://127.0.0.1:1", api=SimpleNamespace(cluster="twin"))
    assert set(aws_config(server).endpoints) == {"eks", "ec2", "autoscaling"}  # type: ignore[arg-type]
