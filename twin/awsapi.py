"""The twin's AWS shapes, served beside its GKE / ARM ones (twin/cloudapi.py): EKS managed node
groups (REST-JSON, as botocore's `eks` service model describes them), EC2 instances and Auto
Scaling groups (the EC2 and Query protocols: form-encoded requests, XML answers), each under
its own prefix so boto3 reaches it with `endpoint_url`:

    /aws/eks          GET  /clusters/{c}/node-groups/{ng}                  DescribeNodegroup
                      POST /clusters/{c}/node-groups/{ng}/update-config    UpdateNodegroupConfig
                      GET  /clusters/{c}/updates?nodegroupName=            ListUpdates
                      GET  /clusters/{c}/updates/{id}?nodegroupName=       DescribeUpdate
    /aws/ec2          POST / Action=RebootInstances | DescribeInstances
    /aws/autoscaling  POST / Action=DescribeAutoScalingInstances |
                             TerminateInstanceInAutoScalingGroup

The node groups are the twin's pools (`CloudApi.pools`): `desiredSize` is the pool's size,
`maxSize` its autoscaling max or its quota. `UpdateNodegroupConfig` acts once per
`clientRequestToken` (a repeated token answers the first update, as EKS does); while an update
runs another one is refused with 409 ResourceInUseException; a `desiredSize` past `maxSize`
with 400 InvalidParameterException. An update runs the pool's `latency` (simulated seconds),
then resizes through the twin's node-pool controller (`on_resize`).

Instances: `aws_instances[<instance id>] = node name` (the node's providerID is
`aws:///<zone>/<instance id>`), each in the pool's Auto Scaling group. `RebootInstances` acts on
every call (EC2 has no request token); `TerminateInstanceInAutoScalingGroup` moves the instance
to `Terminating` for `vm_operation_seconds`, then `Terminated`; the group keeps its desired
capacity and the twin's node-pool controller brings a new node, with a new name
(`on_instance("terminate", node)`).
`aws_answer_delay` holds the answer after acting (drills: a worker killed in that window).

Every call must carry a SigV4 `Authorization` header for `aws_access_key_id` and the right
service in its credential scope (403 otherwise, as AWS answers an unknown key); the twin does
not recompute the signature.
"""

from __future__ import annotations

import asyncio
import re
import secrets
import uuid as uuidlib
from datetime import datetime
from typing import TYPE_CHECKING, Any
from xml.sax.saxutils import escape

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response

if TYPE_CHECKING:
    from twin.cloudapi import CloudApi, TwinPool

EC2_NS = "http://ec2.amazonaws.com/doc/2016-11-15/"
ASG_NS = "http://autoscaling.amazonaws.com/doc/2011-01-01/"
# The twin's AWS access key id (a made-up one): any secret is taken, the signature is not checked.
TWIN_ACCESS_KEY_ID = "AKIATWINEXAMPLE00001"
_SIGV4 = re.compile(
    r"^AWS4-HMAC-SHA256 Credential=([^/]+)/(\d{8})/([^/]+)/([^/]+)/aws4_request, "
    r"SignedHeaders=([a-z0-9;-]+), Signature=([0-9a-f]{64})$"
)


def _epoch(when: datetime) -> float:
    return when.timestamp()


def eks_error(status: int, code: str, message: str) -> JSONResponse:
    """EKS's error shape: the code in `x-amzn-ErrorType`, the words in `message`."""
    return JSONResponse(
        {"message": message}, status_code=status, headers={"x-amzn-ErrorType": code}
    )


def ec2_error(status: int, code: str, message: str) -> Response:
    body = (
        f"<?xml version='1.0' encoding='UTF-8'?><Response><Errors><Error><Code>{code}</Code>"
        f"<Message>{escape(message)}</Message></Error></Errors>"
        f"<RequestID>{uuidlib.uuid4()}</RequestID></Response>"
    )
    return Response(body, status_code=status, media_type="text/xml")


def query_error(status: int, code: str, message: str) -> Response:
    body = (
        f'<ErrorResponse xmlns="{ASG_NS}"><Error><Type>Sender</Type><Code>{code}</Code>'
        f"<Message>{escape(message)}</Message></Error>"
        f"<RequestId>{uuidlib.uuid4()}</RequestId></ErrorResponse>"
    )
    return Response(body, status_code=status, media_type="text/xml")


def _xml(body: str) -> Response:
    return Response(body, media_type="text/xml")


class AwsShapes:
    """The AWS routes of one `CloudApi` (its pools, clock, resize and instance callbacks)."""

    def __init__(self, api: CloudApi) -> None:
        self.api = api
        self.region = "us-twin-1"  # harness/stack.py EKS_REGION
        self.account = "123456789012"
        self.aws_access_key_id = TWIN_ACCESS_KEY_ID
        # EKS updates: id -> (operation name in api.operations, pool, desired size, created)
        self.updates: dict[str, tuple[str, str, int, datetime]] = {}
        self._by_token: dict[str, str] = {}  # clientRequestToken -> update id
        self.instances: dict[str, str] = {}  # instance id -> node name
        self.instance_pool: dict[str, str] = {}  # instance id -> its pool (Auto Scaling group)
        self._terminating: dict[str, datetime] = {}  # instance id -> when termination ends
        self.answer_delay = 0.0  # real seconds an answer is held after acting (drills)

    # --- checks --------------------------------------------------------------------------

    def check(self, request: Request) -> Response | None:
        """A SigV4 Authorization header for our key and the path's service, or 403."""
        service = request.url.path.split("/")[2] if request.url.path.count("/") >= 2 else ""
        match = _SIGV4.match(request.headers.get("authorization", ""))
        if match is None or not request.headers.get("x-amz-date"):
            return self._denied(service, "missing or malformed SigV4 Authorization")
        key, _day, _region, scope_service, _signed, _sig = match.groups()
        if not secrets.compare_digest(key, self.aws_access_key_id):
            return self._denied(service, "The security token included in the request is invalid.")
        if scope_service != service:
            return self._denied(service, f"credential scope names {scope_service}, not {service}")
        return None

    @staticmethod
    def injected(request: Request, status: int, message: str) -> Response:
        """An injected fault (`CloudApi.inject`) in the shape of the path's service."""
        service = request.url.path.split("/")[2]
        if service == "eks":
            code = {429: "TooManyRequestsException", 409: "ResourceInUseException"}.get(
                status, "ServerException" if status >= 500 else "AccessDeniedException"
            )
            return eks_error(status, code, message)
        if service == "ec2":
            code = {503: "RequestLimitExceeded", 500: "InternalError"}.get(
                status, "UnauthorizedOperation"
            )
            return ec2_error(status, code, message)
        code = {400: "Throttling", 500: "InternalFailure", 503: "ServiceUnavailable"}.get(
            status, "AccessDenied"
        )
        return query_error(status, code, message)

    @staticmethod
    def _denied(service: str, message: str) -> Response:
        if service == "eks":
            return eks_error(403, "UnrecognizedClientException", message)
        if service == "ec2":
            return ec2_error(401, "AuthFailure", message)
        return query_error(403, "InvalidClientTokenId", message)

    # --- EKS -----------------------------------------------------------------------------

    def _max(self, pool: TwinPool) -> int:
        return pool.autoscaling[1] if pool.autoscaling else pool.max_size

    def nodegroup(self, pool: TwinPool) -> dict[str, Any]:
        api = self.api
        created = _epoch(api._created)
        arn = f"arn:aws:eks:{self.region}:{self.account}:nodegroup/{api.cluster}/{pool.name}"
        return {
            "nodegroupName": pool.name,
            "nodegroupArn": f"{arn}/twin",
            "clusterName": api.cluster,
            "version": "1.36",
            "releaseVersion": "1.36.2-20261201",
            "createdAt": created,
            "modifiedAt": created,
            "status": "UPDATING" if api._running(pool.name) else "ACTIVE",
            "capacityType": "ON_DEMAND",
            "scalingConfig": {
                "minSize": pool.autoscaling[0] if pool.autoscaling else 0,
                "maxSize": self._max(pool),
                "desiredSize": pool.size,
            },
            "instanceTypes": ["p5.48xlarge"],
            "subnets": ["subnet-0twin"],
            "amiType": "AL2023_x86_64_NVIDIA",
            "nodeRole": f"arn:aws:iam::{self.account}:role/twin-node",
            "labels": {},
            "resources": {"autoScalingGroups": [{"name": self.asg_name(pool.name)}]},
            "health": {"issues": []},
            "updateConfig": {"maxUnavailable": 1},
            "tags": {},
        }

    def asg_name(self, pool: str) -> str:
        return f"eks-{pool}-twin"

    def update(self, update_id: str) -> dict[str, Any]:
        op_name, _pool, desired, created = self.updates[update_id]
        op = self.api.operations[op_name]
        status = "InProgress"
        errors: list[dict[str, Any]] = []
        if op.status == "DONE":
            status = "Failed" if op.error else "Successful"
            if op.error:
                errors = [
                    {
                        "errorCode": "AsgInstanceLaunchFailures",
                        "errorMessage": str(op.error.get("message", "")),
                        "resourceIds": [self.asg_name(op.pool)],
                    }
                ]
        return {
            "id": update_id,
            "status": status,
            "type": "ConfigUpdate",
            "params": [{"type": "DesiredSize", "value": str(desired)}],
            "createdAt": _epoch(created),
            "errors": errors,
        }

    def _pool(self, cluster: str, name: str) -> TwinPool | JSONResponse:
        if cluster != self.api.cluster:
            return eks_error(
                404, "ResourceNotFoundException", f"No cluster found for name: {cluster}."
            )
        pool = self.api.pools.get(name)
        if pool is None:
            return eks_error(
                404, "ResourceNotFoundException", f"No node group found for name: {name}."
            )
        return pool

    async def update_config(self, pool: TwinPool, body: Any) -> Any:
        if not isinstance(body, dict):
            return eks_error(400, "InvalidParameterException", "request body must be an object")
        token = str(body.get("clientRequestToken") or "")
        if token and token in self._by_token:
            return {"update": self.update(self._by_token[token])}
        scaling = body.get("scalingConfig") or {}
        desired = scaling.get("desiredSize")
        if not isinstance(desired, int) or isinstance(desired, bool) or desired < 0:
            return eks_error(
                400, "InvalidParameterException", "scalingConfig.desiredSize must be >= 0"
            )
        running = self.api._running(pool.name)
        if running is not None:
            return eks_error(
                409,
                "ResourceInUseException",
                f"Nodegroup {pool.name} is currently being updated ({running.name})",
            )
        if desired > self._max(pool):
            return eks_error(
                400,
                "InvalidParameterException",
                f"desired capacity {desired} can't be greater than max size {self._max(pool)}",
            )
        op = await self.api._start_resize(pool, desired, "UPDATE_NODEGROUP_CONFIG")
        update_id = str(uuidlib.uuid4())
        self.updates[update_id] = (op.name, pool.name, desired, op.started)
        if token:
            self._by_token[token] = update_id
        await asyncio.sleep(self.answer_delay)  # acted on; the answer is held (drills)
        return {"update": self.update(update_id)}

    # --- EC2 and Auto Scaling --------------------------------------------------------------

    def _state(self, instance: str) -> str:
        """The instance's Auto Scaling lifecycle state."""
        ends = self._terminating.get(instance)
        if ends is None:
            return "InService"
        return "Terminated" if self.api.clock.now() >= ends else "Terminating"

    def _act(self, action: str, instance: str) -> bool:
        node = self.instances.get(instance)
        if node is None or self._state(instance) != "InService":
            return False
        if self.api.on_instance is not None:
            try:
                self.api.on_instance(action, node)
            except KeyError:
                return False
        self.api.instance_calls.append((action, node))
        return True

    async def ec2(self, form: dict[str, list[str]]) -> Response:
        action = (form.get("Action") or [""])[0]
        ids = [v[0] for k, v in sorted(form.items()) if k.startswith("InstanceId.")]
        if action == "RebootInstances":
            missing = [i for i in ids if i not in self.instances or self._state(i) != "InService"]
            if not ids or missing:
                return ec2_error(
                    400,
                    "InvalidInstanceID.NotFound",
                    f"The instance ID '{(missing or ['?'])[0]}' does not exist",
                )
            for instance in ids:
                self._act("reset", instance)
            await asyncio.sleep(self.answer_delay)
            return _xml(
                f'<RebootInstancesResponse xmlns="{EC2_NS}"><requestId>{uuidlib.uuid4()}'
                "</requestId><return>true</return></RebootInstancesResponse>"
            )
        if action == "DescribeInstances":
            unknown = [i for i in ids if i not in self.instances]
            if unknown:
                return ec2_error(
                    400,
                    "InvalidInstanceID.NotFound",
                    f"The instance ID '{unknown[0]}' does not exist",
                )
            items = "".join(self._instance_xml(i) for i in ids)
            return _xml(
                f'<DescribeInstancesResponse xmlns="{EC2_NS}"><requestId>{uuidlib.uuid4()}'
                f"</requestId><reservationSet><item><reservationId>r-0twin</reservationId>"
                f"<ownerId>{self.account}</ownerId><instancesSet>{items}</instancesSet></item>"
                "</reservationSet></DescribeInstancesResponse>"
            )
        return ec2_error(400, "InvalidAction", f"The action {action} is not valid")

    def _instance_xml(self, instance: str) -> str:
        state = self._state(instance)
        name, code = {"InService": ("running", 16), "Terminating": ("shutting-down", 32)}.get(
            state, ("terminated", 48)
        )
        return (
            f"<item><instanceId>{instance}</instanceId><instanceType>p5.48xlarge</instanceType>"
            f"<instanceState><code>{code}</code><name>{name}</name></instanceState>"
            f"<placement><availabilityZone>{self.region}a</availabilityZone></placement></item>"
        )

    async def autoscaling(self, form: dict[str, list[str]]) -> Response:
        action = (form.get("Action") or [""])[0]
        request_id = (
            f"<ResponseMetadata><RequestId>{uuidlib.uuid4()}</RequestId></ResponseMetadata>"
        )
        if action == "DescribeAutoScalingInstances":
            ids = [v[0] for k, v in sorted(form.items()) if k.startswith("InstanceIds.member.")]
            members = "".join(
                f"<member><InstanceId>{i}</InstanceId><InstanceType>p5.48xlarge</InstanceType>"
                f"<AutoScalingGroupName>{self.asg_name(self.instance_pool.get(i, ''))}"
                f"</AutoScalingGroupName><AvailabilityZone>{self.region}a</AvailabilityZone>"
                f"<LifecycleState>{self._state(i)}</LifecycleState>"
                "<HealthStatus>HEALTHY</HealthStatus>"
                "<ProtectedFromScaleIn>false</ProtectedFromScaleIn></member>"
                for i in ids
                if i in self.instance_pool and self._state(i) != "Terminated"
            )
            return _xml(
                f'<DescribeAutoScalingInstancesResponse xmlns="{ASG_NS}">'
                f"<DescribeAutoScalingInstancesResult><AutoScalingInstances>{members}"
                f"</AutoScalingInstances></DescribeAutoScalingInstancesResult>{request_id}"
                "</DescribeAutoScalingInstancesResponse>"
            )
        if action == "TerminateInstanceInAutoScalingGroup":
            instance = (form.get("InstanceId") or [""])[0]
            decrement = (form.get("ShouldDecrementDesiredCapacity") or [""])[0]
            if decrement not in ("true", "false"):
                return query_error(
                    400, "ValidationError", "ShouldDecrementDesiredCapacity is required"
                )
            if instance not in self.instance_pool:
                return query_error(
                    400,
                    "ValidationError",
                    f"Instance Id not found - No managed instance found for instance ID: {instance}",
                )
            if self._state(instance) != "InService":
                return query_error(
                    400,
                    "ScalingActivityInProgress",
                    f"Instance {instance} is already {self._state(instance)}",
                )
            if decrement == "true":
                pool = self.api.pools.get(self.instance_pool.get(instance, ""))
                if pool is not None:
                    pool.size = max(0, pool.size - 1)
            self._act("terminate", instance)
            now = self.api.clock.now()
            self._terminating[instance] = now + _seconds(self.api.vm_operation_seconds)
            await asyncio.sleep(self.answer_delay)
            group = self.asg_name(self.instance_pool.get(instance, ""))
            activity = (
                f"<ActivityId>{uuidlib.uuid4()}</ActivityId>"
                f"<AutoScalingGroupName>{group}</AutoScalingGroupName>"
                f"<Description>Terminating EC2 instance: {instance}</Description>"
                "<Cause>At {0} instance {1} was taken out of service in response to a user "
                "request.</Cause>".replace("{0}", now.isoformat()).replace("{1}", instance)
                + f"<StartTime>{now.isoformat().replace('+00:00', 'Z')}</StartTime>"
                "<StatusCode>InProgress</StatusCode><Progress>0</Progress>"
            )
            return _xml(
                f'<TerminateInstanceInAutoScalingGroupResponse xmlns="{ASG_NS}">'
                f"<TerminateInstanceInAutoScalingGroupResult><Activity>{activity}</Activity>"
                f"</TerminateInstanceInAutoScalingGroupResult>{request_id}"
                "</TerminateInstanceInAutoScalingGroupResponse>"
            )
        return query_error(400, "InvalidAction", f"The action {action} is not valid")

    # --- routes ----------------------------------------------------------------------------

    def mount(self, app: FastAPI) -> None:
        eks = "/aws/eks/clusters/{cluster}"

        @app.get(eks + "/node-groups/{name}")
        async def describe_nodegroup(cluster: str, name: str) -> Any:
            pool = self._pool(cluster, name)
            return pool if isinstance(pool, JSONResponse) else {"nodegroup": self.nodegroup(pool)}

        @app.post(eks + "/node-groups/{name}/update-config")
        async def update_nodegroup_config(cluster: str, name: str, request: Request) -> Any:
            pool = self._pool(cluster, name)
            if isinstance(pool, JSONResponse):
                return pool
            try:
                body = await request.json()
            except ValueError:
                return eks_error(400, "InvalidParameterException", "body is not JSON")
            return await self.update_config(pool, body)

        @app.get(eks + "/updates")
        async def list_updates(cluster: str, nodegroupName: str = "", maxResults: int = 50) -> Any:
            if cluster != self.api.cluster:
                return eks_error(
                    404, "ResourceNotFoundException", f"No cluster found for name: {cluster}."
                )
            ids = [u for u, (_op, pool, _d, _c) in self.updates.items() if pool == nodegroupName]
            return {"updateIds": list(reversed(ids))[:maxResults]}

        @app.get(eks + "/updates/{update_id}")
        async def describe_update(cluster: str, update_id: str, nodegroupName: str = "") -> Any:
            found = self.updates.get(update_id)
            if cluster != self.api.cluster or found is None or found[1] != nodegroupName:
                return eks_error(
                    404, "ResourceNotFoundException", f"No update found for ID: {update_id}"
                )
            return {"update": self.update(update_id)}

        @app.post("/aws/ec2")
        @app.post("/aws/ec2/")
        async def ec2(request: Request) -> Any:
            return await self.ec2(await _form(request))

        @app.post("/aws/autoscaling")
        @app.post("/aws/autoscaling/")
        async def autoscaling(request: Request) -> Any:
            return await self.autoscaling(await _form(request))


async def _form(request: Request) -> dict[str, list[str]]:
    from urllib.parse import parse_qs

    return parse_qs((await request.body()).decode(), keep_blank_values=True)


def _seconds(value: float) -> Any:
    from datetime import timedelta

    return timedelta(seconds=value)
