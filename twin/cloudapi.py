"""The twin's cloud node-pool API: GKE-shaped `setSize` with long-running operations.

Served on loopback next to the twin's Kubernetes API, it speaks the public shapes of the
Kubernetes Engine API v1 so that Sickbay's GKE provider talks to it unchanged (the `twin`
provider is the GKE provider pointed here):

    GET  /v1/projects/{p}/locations/{l}/clusters/{c}/nodePools/{np}          NodePool
    POST /v1/projects/{p}/locations/{l}/clusters/{c}/nodePools/{np}:setSize  {"nodeCount": n}
                                                                             -> Operation
    GET  /v1/projects/{p}/locations/{l}/operations                           {"operations": []}
    GET  /v1/projects/{p}/locations/{l}/operations/{op}                      Operation
    GET  /compute/v1/projects/{p}/zones/{z}/instanceGroupManagers/{igm}      {"targetSize": n}
    GET  /computeMetadata/v1/instance/service-accounts/default/token         the metadata
                                                          server's token (google-auth's ADC)

and the AWS shapes of twin/awsapi.py (EKS node groups, EC2, Auto Scaling) under /aws/.

Every call needs `Authorization: Bearer <token>` (401 UNAUTHENTICATED otherwise). Errors use
Google's body `{"error": {"code", "message", "status"}}`.

Knobs per pool (`TwinPool`): `max_size` is the quota (a resize past it is refused with 403
"Insufficient quota", or, with `quota_error="operation"`, accepted and failed in the operation
as real GKE does when VM creation hits the quota); `latency` is how long (simulated seconds) a
resize runs before the nodes are there; `inject(status, count)` makes the next calls fail
(429 with Retry-After, 500, 503) for drills. While a resize runs, another one gets 400
FAILED_PRECONDITION like GKE's "incompatible operation".

Scaling adds nodes to the twin through `on_resize(pool_name, size)`, called when a resize
finishes (sync or async callable). Wire it to the node-pool controller's resize function:

    api = CloudApi(token="t", on_resize=node_pools.resize, clock=clock)
    api.add_pool(TwinPool(name="gpu-pool", size=2, max_size=4))
    server = await CloudApiServer(api).start()      # server.url -> pool endpoint

`api.requests` logs every call (method, path, status) so tests can count resize requests.
"""

from __future__ import annotations

import argparse
import asyncio
import inspect
import itertools
import logging
import os
import secrets
import threading
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any, Literal

import uvicorn
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response

log = logging.getLogger(__name__)

ResizeCallback = Callable[[str, int], Awaitable[Any] | Any]

_STATUS_NAMES = {
    400: "INVALID_ARGUMENT",
    401: "UNAUTHENTICATED",
    403: "PERMISSION_DENIED",
    404: "NOT_FOUND",
    409: "ALREADY_EXISTS",
    429: "RESOURCE_EXHAUSTED",
    500: "INTERNAL",
    503: "UNAVAILABLE",
}


@dataclass
class TwinPool:
    name: str
    size: int = 0  # nodes (the instance group's target size)
    max_size: int = 8  # quota: no resize past this
    zone: str = "local-a"
    autoscaling: tuple[int, int] | None = None  # (min, max) when enabled
    latency: float = 5.0  # simulated seconds a resize runs
    quota_error: Literal["sync", "operation"] = "sync"
    quota_resource: str = "NVIDIA_H100_GPUS"


@dataclass
class LoggedRequest:
    method: str
    path: str
    status: int
    body: Any = None


@dataclass
class _Operation:
    name: str
    pool: str
    target: int
    self_link: str
    target_link: str
    started: datetime
    status: str = "RUNNING"
    ended: datetime | None = None
    error: dict[str, Any] | None = None
    location: str = ""
    kind: str = "SET_NODE_POOL_SIZE"

    def resource(self) -> dict[str, Any]:
        body: dict[str, Any] = {
            "name": self.name,
            "zone": self.location,
            "location": self.location,
            "operationType": self.kind,
            "status": self.status,
            "selfLink": self.self_link,
            "targetLink": self.target_link,
            "startTime": self.started.isoformat().replace("+00:00", "Z"),
        }
        if self.ended:
            body["endTime"] = self.ended.isoformat().replace("+00:00", "Z")
        if self.error:
            body["error"] = self.error
        return body


class _RealClock:
    def now(self) -> datetime:
        return datetime.now(UTC)

    async def sleep(self, seconds: float) -> None:
        await asyncio.sleep(seconds)


def _error(code: int, message: str, headers: dict[str, str] | None = None) -> JSONResponse:
    return JSONResponse(
        {"error": {"code": code, "message": message, "status": _STATUS_NAMES.get(code, "UNKNOWN")}},
        status_code=code,
        headers=headers,
    )


def _arm_time(when: datetime) -> str:
    """ARM's timestamps: seven fractional digits and an offset (2026-12-01T17:42:05.1234567+00:00)."""
    return when.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S.%f") + "0+00:00"


def _arm_error(code: int, arm_code: str, message: str) -> JSONResponse:
    """Azure Resource Manager's error shape."""
    return JSONResponse({"error": {"code": arm_code, "message": message}}, status_code=code)


class CloudApi:
    """State and behaviour of the twin's cloud API (usable without HTTP from Python)."""

    def __init__(
        self,
        token: str | None = None,
        *,
        on_resize: ResizeCallback | None = None,
        on_instance: Callable[[str, str], Any] | None = None,
        clock: Any = None,
        project: str = "twin",
        location: str = "local",
        cluster: str = "twin",
    ) -> None:
        self.token = token or secrets.token_urlsafe(24)
        self.on_resize = on_resize
        # ("reset" | "recreate" | "delete" | "terminate", node name): the twin's node rungs
        # (controllers/repair_tools.py)
        self.on_instance = on_instance
        self.instance_calls: list[tuple[str, str]] = []  # every reset / recreate acted on
        self._by_request_id: dict[str, dict[str, Any]] = {}
        # AKS: "<vmss>/<instance id>" -> node name (the node's providerID names the VM).
        self.vmss_nodes: dict[str, str] = {}
        # ARM's VM operations: "<vmss>/<id>" -> (action, started, ends); ProvisioningState is
        # Updating (restart) or Deleting (delete) until `ends`, then Succeeded (or the VM gone).
        self.vm_operation_seconds = 30.0  # simulated seconds a VM restart / delete runs
        # Real seconds ARM holds its answer to a restart / delete after acting on it (drills:
        # a worker killed in the window between the act and the answer).
        self.arm_answer_delay = 0.0
        self._vm_ops: dict[str, tuple[str, datetime, datetime]] = {}
        self._arm_ops: dict[str, tuple[datetime, datetime]] = {}  # op name -> (start, end)
        self._http_keys: dict[str, dict[str, Any]] = {}  # http provider: Idempotency-Key -> answer
        self.clock = clock or _RealClock()
        self._created = self.clock.now()  # the VMs' last provisioning before any operation
        self.project, self.location, self.cluster = project, location, cluster
        self.pools: dict[str, TwinPool] = {}
        self.operations: dict[str, _Operation] = {}
        self.requests: list[LoggedRequest] = []
        self.metadata_requests = 0  # answered metadata-server calls (Metadata-Flavor: Google)
        self._injected: list[tuple[int, str, float | None, str | None]] = []
        self._seq = itertools.count(1)
        self._tasks: set[asyncio.Task[None]] = set()
        self.base_url = ""  # set by the server once it listens
        from twin.awsapi import AwsShapes

        self.aws = AwsShapes(self)  # EKS, EC2 and Auto Scaling (twin/awsapi.py)
        self.app = self._build_app()

    # --- Python API ----------------------------------------------------------------------

    def add_pool(self, pool: TwinPool) -> TwinPool:
        self.pools[pool.name] = pool
        return pool

    def inject(
        self,
        status: int,
        count: int = 1,
        message: str = "",
        retry_after: float | None = None,
        method: str | None = None,
    ) -> None:
        """Fail the next `count` authenticated calls (only `method` ones, if given) with
        `status`."""
        text = message or f"injected {status} from the twin's cloud API"
        self._injected.extend([(status, text, retry_after, method)] * count)

    def resize_requests(self, pool: str | None = None) -> list[LoggedRequest]:
        """setSize calls that reached the API (whatever their answer)."""
        return [
            r
            for r in self.requests
            if r.method == "POST"
            and r.path.endswith(":setSize")
            and (pool is None or f"/nodePools/{pool}:" in r.path)
        ]

    async def wait_idle(self) -> None:
        """Wait for every running resize to finish (tests)."""
        while self._tasks:
            await asyncio.gather(*list(self._tasks), return_exceptions=True)

    async def aclose(self) -> None:
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*list(self._tasks), return_exceptions=True)

    # --- HTTP ------------------------------------------------------------------------------

    def _build_app(self) -> FastAPI:
        app = FastAPI(title="sickbay twin cloud node-pool API", openapi_url=None, docs_url=None)
        prefix = "/v1/projects/{project}/locations/{location}"

        @app.middleware("http")
        async def _auth_and_log(request: Request, call_next: Any) -> Any:
            body: Any = None
            if request.method == "POST":
                raw = await request.body()
                body = raw.decode(errors="replace") if raw else None
            response = self._check(request)
            if response is None:
                response = await call_next(request)
            self.requests.append(
                LoggedRequest(request.method, request.url.path, response.status_code, body)
            )
            return response

        self.aws.mount(app)
        self._mount_metadata(app)

        @app.get(prefix + "/clusters/{cluster}/nodePools/{pool}")
        async def get_pool(project: str, location: str, cluster: str, pool: str) -> Any:
            found = self._pool(project, location, cluster, pool)
            if isinstance(found, JSONResponse):
                return found
            return self._node_pool_resource(found)

        @app.post(prefix + "/clusters/{cluster}/nodePools/{pool}:setSize")
        async def set_size(
            project: str, location: str, cluster: str, pool: str, request: Request
        ) -> Any:
            found = self._pool(project, location, cluster, pool)
            if isinstance(found, JSONResponse):
                return found
            try:
                body = await request.json()
            except ValueError:
                return _error(400, "Invalid JSON payload received.")
            count = body.get("nodeCount") if isinstance(body, dict) else None
            if not isinstance(count, int) or isinstance(count, bool) or count < 0:
                return _error(
                    400, "Invalid value at 'node_count': \"nodeCount\" must be an integer >= 0."
                )
            return await self._set_size(found, count)

        @app.get(prefix + "/operations")
        async def list_operations(project: str, location: str) -> Any:
            return {
                "operations": [
                    op.resource()
                    for op in self.operations.values()
                    if op.location == location and op.kind == "SET_NODE_POOL_SIZE"
                ]
            }

        @app.get(prefix + "/operations/{name}")
        async def get_operation(project: str, location: str, name: str) -> Any:
            op = self.operations.get(name)
            if op is None or op.location != location:
                return _error(404, f"Not found: operation {name}.")
            return op.resource()

        compute = "/compute/v1/projects/{project}/zones/{zone}"

        @app.post(compute + "/instances/{instance}/reset")
        async def reset_instance(
            project: str,
            zone: str,
            instance: str,
            requestId: str = "",
        ) -> Any:
            return self._instance_op(project, zone, "reset", instance, instance, requestId)

        @app.post(compute + "/instanceGroupManagers/{igm}/recreateInstances")
        async def recreate_instances(
            project: str,
            zone: str,
            igm: str,
            request: Request,
            requestId: str = "",
        ) -> Any:
            body = await request.json()
            urls = body.get("instances") if isinstance(body, dict) else None
            if not isinstance(urls, list) or len(urls) != 1 or not isinstance(urls[0], str):
                return _error(400, "Invalid value for field 'instances': name one instance.")
            instance = urls[0].rsplit("/", 1)[-1]
            return self._instance_op(project, zone, "recreate", instance, igm, requestId)

        @app.get(compute + "/operations/{name}")
        async def get_zone_operation(project: str, zone: str, name: str) -> Any:
            for op in self._by_request_id.values():
                if op["name"] == name:
                    return op
            return _error(404, f"The resource 'operations/{name}' was not found")

        # Azure Resource Manager: VMSS VMs of AKS agent pools (restart, delete, get) and the
        # async operations ARM names in `Azure-AsyncOperation`.
        vmss = (
            "/subscriptions/{sub}/resourceGroups/{rg}/providers/Microsoft.Compute/"
            "virtualMachineScaleSets/{scale_set}/virtualMachines/{instance}"
        )

        @app.post(vmss + "/restart")
        async def restart_vm(sub: str, rg: str, scale_set: str, instance: str) -> Any:
            answer = self._vmss_op(sub, "reset", scale_set, instance)
            await asyncio.sleep(self.arm_answer_delay)  # acted on; the answer is held
            return answer

        @app.delete(vmss)
        async def delete_vm(sub: str, rg: str, scale_set: str, instance: str) -> Any:
            answer = self._vmss_op(sub, "delete", scale_set, instance)
            await asyncio.sleep(self.arm_answer_delay)
            return answer

        @app.get(vmss)
        async def get_vm(sub: str, rg: str, scale_set: str, instance: str, request: Request) -> Any:
            key = f"{scale_set}/{instance}"
            if key not in self.vmss_nodes or self._vm_gone(key):
                return _arm_error(404, "ResourceNotFound", f"VM {key} was not found.")
            state, _time, _running = self._vm_state(key)
            body: dict[str, Any] = {
                "id": request.url.path,
                "name": f"{scale_set}_{instance}",
                "type": "Microsoft.Compute/virtualMachineScaleSets/virtualMachines",
                "location": self.location,
                "instanceId": instance,
                "properties": {"provisioningState": state, "latestModelApplied": True},
            }
            if request.query_params.get("$expand") == "instanceView":
                body["properties"]["instanceView"] = self._instance_view(key)
            return body

        @app.get(vmss + "/instanceView")
        async def get_vm_instance_view(sub: str, rg: str, scale_set: str, instance: str) -> Any:
            key = f"{scale_set}/{instance}"
            if key not in self.vmss_nodes or self._vm_gone(key):
                return _arm_error(404, "ResourceNotFound", f"VM {key} was not found.")
            return self._instance_view(key)

        @app.get("/subscriptions/{sub}/providers/Microsoft.Compute/locations/{loc}/operations/{op}")
        async def get_arm_operation(sub: str, loc: str, op: str) -> Any:
            found = self._arm_ops.get(op)
            if found is None:
                return _arm_error(404, "NotFound", f"operation {op} not found")
            started, ends = found
            body = {"name": op, "startTime": _arm_time(started), "status": "InProgress"}
            if self.clock.now() >= ends:
                body.update(status="Succeeded", endTime=_arm_time(ends))
            return body

        # A generic in-house machine API (Sickbay's `http` provider): one call per rung, acted
        # on once per Idempotency-Key (a repeated key gets the first answer, nothing again).
        @app.post("/v1/machines/{node}:reboot")
        async def http_reboot(node: str, request: Request) -> Any:
            return self._http_machine_op("reset", node, request.headers.get("idempotency-key"))

        @app.delete("/v1/machines/{node}")
        async def http_delete(node: str, request: Request) -> Any:
            return self._http_machine_op("delete", node, request.headers.get("idempotency-key"))

        @app.get("/compute/v1/projects/{project}/zones/{zone}/instanceGroupManagers/{igm}")
        async def get_igm(project: str, zone: str, igm: str) -> Any:
            for pool in self.pools.values():
                if self._igm_name(pool) == igm and pool.zone == zone:
                    running = self._running(pool.name)
                    return {
                        "kind": "compute#instanceGroupManager",
                        "name": igm,
                        "zone": zone,
                        "targetSize": pool.size,
                        "currentActions": {"creating": 1 if running else 0},
                    }
            return _error(404, f"The resource 'instanceGroupManagers/{igm}' was not found")

        return app

    def _mount_metadata(self, app: FastAPI) -> None:
        """The GKE metadata server's token endpoints (what google-auth asks on a GKE node with
        Workload Identity): the twin's bearer token for the `default` service account. Only
        with `Metadata-Flavor: Google`, answered with that header, as the real server does."""
        flavor = {"Metadata-Flavor": "Google"}

        def answer(request: Request, body: Any, text: bool = False) -> Response:
            if request.headers.get("metadata-flavor") != "Google":
                return Response("Missing Metadata-Flavor:Google header.", status_code=403)
            self.metadata_requests += 1
            if text:
                return Response(str(body), media_type="application/text", headers=flavor)
            return JSONResponse(body, headers=flavor)

        @app.get("/")
        async def metadata_root(request: Request) -> Any:
            return answer(request, "computeMetadata/", text=True)

        account = "/computeMetadata/v1/instance/service-accounts/default"

        @app.get(account + "/")
        async def metadata_account(request: Request) -> Any:
            scopes = ["https://www.googleapis.com/auth/cloud-platform"]
            email = f"sickbay@{self.project}.iam.gserviceaccount.com"
            return answer(request, {"aliases": ["default"], "email": email, "scopes": scopes})

        @app.get(account + "/token")
        async def metadata_token(request: Request) -> Any:
            body = {"access_token": self.token, "expires_in": 3599, "token_type": "Bearer"}
            return answer(request, body)

        @app.get("/computeMetadata/v1/project/project-id")
        async def metadata_project(request: Request) -> Any:
            return answer(request, self.project, text=True)

    def _instance_op(
        self, project: str, zone: str, action: str, instance: str, target: str, request_id: str
    ) -> Any:
        """Compute Engine's idempotent requests: the same `requestId` answers the same
        operation and acts once."""
        if request_id and request_id in self._by_request_id:
            return self._by_request_id[request_id]
        if self.on_instance is not None:
            try:
                self.on_instance(action, instance)
            except KeyError:
                return _error(
                    404,
                    f"The resource 'projects/{project}/zones/{zone}/instances/{instance}' was "
                    "not found",
                )
        self.instance_calls.append((action, instance))
        name = f"operation-{next(self._seq)}-{secrets.token_hex(4)}"
        now = self.clock.now().isoformat().replace("+00:00", "Z")
        kind = "instances" if action == "reset" else "instanceGroupManagers"
        op = {
            "kind": "compute#operation",
            "name": name,
            "zone": zone,
            "operationType": "reset"
            if action == "reset"
            else "compute.instanceGroupManagers.recreateInstances",
            "targetLink": f"{self.base_url}/compute/v1/projects/{project}/zones/{zone}/{kind}/{target}",
            "status": "DONE",
            "insertTime": now,
            "endTime": now,
            "selfLink": f"{self.base_url}/compute/v1/projects/{project}/zones/{zone}/operations/{name}",
        }
        self._by_request_id[request_id or name] = op
        return op

    def _vm_gone(self, key: str) -> bool:
        op = self._vm_ops.get(key)
        return op is not None and op[0] == "delete" and self.clock.now() >= op[2]

    def _vm_state(self, key: str) -> tuple[str, datetime | None, bool]:
        """(provisioningState, when the last operation ended, whether one runs)."""
        op = self._vm_ops.get(key)
        if op is None:
            return "Succeeded", self._created, False
        action, _started, ends = op
        if self.clock.now() < ends:
            return ("Deleting" if action == "delete" else "Updating"), None, True
        return "Succeeded", ends, False

    def _instance_view(self, key: str) -> dict[str, Any]:
        """ARM's VirtualMachineScaleSetVMInstanceView: a transitional ProvisioningState (no
        time) while an operation runs, else `succeeded` with the time the last one ended."""
        state, ended, _running = self._vm_state(key)
        provisioning: dict[str, Any] = {
            "code": f"ProvisioningState/{state.lower()}",
            "level": "Info",
            "displayStatus": "Provisioning succeeded" if state == "Succeeded" else state,
        }
        if ended is not None:
            provisioning["time"] = _arm_time(ended)
        return {
            "platformUpdateDomain": 0,
            "platformFaultDomain": 0,
            "computerName": self.vmss_nodes.get(key, ""),
            "osName": "ubuntu",
            "osVersion": "22.04",
            "statuses": [
                provisioning,
                {"code": "PowerState/running", "level": "Info", "displayStatus": "VM running"},
            ],
        }

    def vm_restarts(self, node: str | None = None) -> int:
        """Restarts ARM acted on (every POST that got its 202), for one node or all."""
        return sum(1 for a, n in self.instance_calls if a == "reset" and node in (None, n))

    def _vmss_op(self, sub: str, action: str, scale_set: str, instance: str) -> Any:
        """ARM's answer to a VMSS VM restart / delete: 202 with an Azure-AsyncOperation URL.
        ARM has no request ids: every call acts (a repeated restart restarts again)."""
        key = f"{scale_set}/{instance}"
        node = self.vmss_nodes.get(key)
        if node is None or self._vm_gone(key):
            return _arm_error(404, "ResourceNotFound", f"VM {key} was not found.")
        if self.on_instance is not None:
            try:
                self.on_instance(action, node)
            except KeyError:
                return _arm_error(404, "ResourceNotFound", f"VM {key} was not found.")
        self.instance_calls.append((action, node))
        now = self.clock.now()
        ends = now + timedelta(seconds=self.vm_operation_seconds)
        self._vm_ops[key] = (action, now, ends)
        op = f"{next(self._seq)}-{secrets.token_hex(4)}"
        self._arm_ops[op] = (now, ends)
        url = (
            f"{self.base_url}/subscriptions/{sub}/providers/Microsoft.Compute/locations/"
            f"{self.location}/operations/{op}"
        )
        return Response(status_code=202, headers={"Azure-AsyncOperation": url})

    def _http_machine_op(self, action: str, node: str, key: str | None) -> Any:
        if not key:
            return JSONResponse({"message": "Idempotency-Key header required"}, status_code=400)
        if key in self._http_keys:
            return JSONResponse(self._http_keys[key], status_code=202)
        if self.on_instance is not None:
            try:
                self.on_instance(action, node)
            except KeyError:
                return JSONResponse({"message": f"machine {node} not found"}, status_code=404)
        self.instance_calls.append((action, node))
        answer = {"id": f"op-{next(self._seq)}", "action": action, "machine": node}
        self._http_keys[key] = answer
        return JSONResponse(answer, status_code=202)

    def _check(self, request: Request) -> Response | None:
        if request.url.path == "/" or request.url.path.startswith("/computeMetadata/"):
            return None  # the metadata server: no token (it hands them out)
        aws = request.url.path.startswith("/aws/")
        if aws:
            denied = self.aws.check(request)
            if denied is not None:
                return denied
        else:
            header = request.headers.get("authorization", "")
            if not secrets.compare_digest(header, f"Bearer {self.token}"):
                return _error(
                    401,
                    "Request had invalid authentication credentials. Expected OAuth 2 access "
                    "token, login cookie or other valid authentication credential.",
                )
        chosen = next(
            (i for i, f in enumerate(self._injected) if f[3] in (None, request.method)), None
        )
        if chosen is not None:
            status, message, retry_after, _method = self._injected.pop(chosen)
            headers = {"Retry-After": f"{retry_after:g}"} if retry_after is not None else None
            if aws:
                return self.aws.injected(request, status, message)
            return _error(status, message, headers)
        return None

    def _pool(
        self, project: str, location: str, cluster: str, name: str
    ) -> TwinPool | JSONResponse:
        if (project, location, cluster) != (self.project, self.location, self.cluster):
            return _error(
                404, f"Not found: projects/{project}/locations/{location}/clusters/{cluster}."
            )
        pool = self.pools.get(name)
        if pool is None:
            return _error(
                404,
                f"Not found: projects/{project}/locations/{location}/clusters/{cluster}/"
                f"nodePools/{name}.",
            )
        return pool

    def _igm_name(self, pool: TwinPool) -> str:
        return f"gke-{self.cluster}-{pool.name}-grp"

    def _pool_link(self, pool: TwinPool) -> str:
        return (
            f"{self.base_url}/v1/projects/{self.project}/locations/{self.location}"
            f"/clusters/{self.cluster}/nodePools/{pool.name}"
        )

    def _node_pool_resource(self, pool: TwinPool) -> dict[str, Any]:
        igm = (
            f"{self.base_url}/compute/v1/projects/{self.project}/zones/{pool.zone}"
            f"/instanceGroupManagers/{self._igm_name(pool)}"
        )
        autoscaling: dict[str, Any] = {}
        if pool.autoscaling:
            autoscaling = {
                "enabled": True,
                "minNodeCount": pool.autoscaling[0],
                "maxNodeCount": pool.autoscaling[1],
            }
        return {
            "name": pool.name,
            "config": {"machineType": "a3-highgpu-8g"},
            "initialNodeCount": 1,
            "locations": [pool.zone],
            "autoscaling": autoscaling,
            "instanceGroupUrls": [igm],
            "selfLink": self._pool_link(pool),
            "status": "RECONCILING" if self._running(pool.name) else "RUNNING",
        }

    def _running(self, pool: str) -> _Operation | None:
        return next(
            (op for op in self.operations.values() if op.pool == pool and op.status != "DONE"),
            None,
        )

    async def _set_size(self, pool: TwinPool, count: int) -> Any:
        running = self._running(pool.name)
        if running is not None:
            return _error(
                400,
                f"Cluster is running incompatible operation {running.name}.",
            )
        quota_short = count > pool.max_size
        if quota_short and pool.quota_error == "sync":
            return _error(
                403,
                f"Insufficient regional quota to satisfy request: resource "
                f"\"{pool.quota_resource}\": request requires '{count}.0' and is short "
                f"'{count - pool.max_size}.0'. Quota limit is '{pool.max_size}.0'.",
            )
        op = await self._start_resize(pool, count, "SET_NODE_POOL_SIZE", quota_short)
        return op.resource()

    async def _start_resize(
        self, pool: TwinPool, count: int, kind: str, quota_short: bool = False
    ) -> _Operation:
        """A resize operation of `pool` to `count` nodes (GKE setSize, EKS config update)."""
        name = f"operation-{next(self._seq)}-{secrets.token_hex(4)}"
        op = _Operation(
            name=name,
            pool=pool.name,
            target=count,
            location=self.location,
            self_link=f"{self.base_url}/v1/projects/{self.project}/locations/{self.location}"
            f"/operations/{name}",
            target_link=self._pool_link(pool),
            started=self.clock.now(),
            kind=kind,
        )
        self.operations[name] = op
        if not quota_short:
            pool.size = count  # the instance group's target moves at once, nodes follow
        log.info("twin cloud: pool %s resize to %d (%s, %s)", pool.name, count, kind, name)
        task = asyncio.create_task(self._finish(pool, op, quota_short))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return op

    async def _sleep(self, seconds: float) -> None:
        sleep = getattr(self.clock, "sleep", None)
        if sleep is not None and inspect.iscoroutinefunction(sleep):
            await sleep(seconds)  # simulated seconds on the twin's clock
        else:
            await asyncio.sleep(seconds)  # a plain wall clock

    async def _finish(self, pool: TwinPool, op: _Operation, quota_short: bool) -> None:
        await self._sleep(pool.latency)
        if quota_short:
            op.error = {
                "code": 8,
                "message": f"Insufficient quota to satisfy the request: {pool.quota_resource} "
                f"limit is {pool.max_size} node(s), {op.target} were requested.",
            }
        elif self.on_resize is not None:
            try:
                result = self.on_resize(pool.name, op.target)
                if inspect.isawaitable(result):
                    await result
            except Exception as exc:  # the operation fails, as a real one would
                log.warning("twin cloud: resize callback for %s failed: %s", pool.name, exc)
                op.error = {"code": 13, "message": f"node provisioning failed: {exc}"}
        op.status = "DONE"
        op.ended = self.clock.now()


class CloudApiServer:
    """Serve a `CloudApi` on 127.0.0.1 (free port unless given) inside the running loop."""

    def __init__(self, api: CloudApi, host: str = "127.0.0.1", port: int = 0) -> None:
        self.api = api
        self._config = uvicorn.Config(
            api.app, host=host, port=port, log_level="warning", lifespan="off", access_log=False
        )
        self._server = uvicorn.Server(self._config)
        self._task: asyncio.Task[None] | None = None
        self.url = ""

    async def start(self) -> CloudApiServer:
        self._task = asyncio.create_task(self._server.serve())
        while not self._server.started:
            if self._task.done():
                self._task.result()  # raise the startup error
            await asyncio.sleep(0.01)
        host, port = self._server.servers[0].sockets[0].getsockname()[:2]
        self.url = f"http://{host}:{port}"
        self.api.base_url = self.url
        return self

    async def stop(self) -> None:
        await self.api.aclose()
        self._server.should_exit = True
        if self._task is not None:
            await self._task

    async def __aenter__(self) -> CloudApiServer:
        return await self.start()

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()


# --- running inside the twin (`sickbay-dev twin up`) --------------------------------------------

POOL_LABEL = "sickbay.dev/node-pool"
READY_TIMEOUT = 10.0  # real seconds for the API thread to start listening


class CloudApiController:
    """The cloud API as a twin controller: its own thread and event loop, started and
    stopped with the twin (`twin.add_controller`). `twin.extensions["cloud"]` points here."""

    def __init__(self, api: CloudApi, port: int = 0) -> None:
        self.api = api
        self.port = port
        self.url = ""
        self._loop: asyncio.AbstractEventLoop | None = None
        self._server: CloudApiServer | None = None
        self._thread: threading.Thread | None = None
        self._ready = threading.Event()
        self._error: BaseException | None = None

    def start(self, twin: Any) -> None:
        self._thread = threading.Thread(target=self._run, name="twin-cloud-api", daemon=True)
        self._thread.start()
        if not self._ready.wait(READY_TIMEOUT):
            raise RuntimeError("the twin's cloud API did not start listening")
        if self._error is not None:
            raise RuntimeError(f"the twin's cloud API failed to start: {self._error}")
        if hasattr(twin, "extensions"):
            twin.extensions["cloud"] = self
        log.info("twin cloud node-pool API (GKE-shaped) serving %s", self.url)

    def _run(self) -> None:
        loop = asyncio.new_event_loop()
        self._loop = loop
        try:
            self._server = loop.run_until_complete(CloudApiServer(self.api, port=self.port).start())
            self.url = self._server.url
        except SystemExit:  # uvicorn's answer to a failed bind (it logged the errno)
            self._error = OSError(f"cannot listen on 127.0.0.1:{self.port} (logged above)")
            self._ready.set()
            loop.close()
            return
        except BaseException as exc:  # reported by start()
            self._error = exc
            self._ready.set()
            loop.close()
            return
        self._ready.set()
        try:
            loop.run_forever()
        finally:
            loop.run_until_complete(self._server.stop())
            loop.close()

    def stop(self) -> None:
        loop = self._loop
        if loop is not None and not loop.is_closed():
            loop.call_soon_threadsafe(loop.stop)
        if self._thread is not None:
            self._thread.join(timeout=10)


def attach_cloud_api(
    twin: Any,
    *,
    token: str | None = None,
    port: int = 0,
    max_size: int = 8,
    latency: float = 5.0,
) -> CloudApi:
    """Serve the cloud API for every node pool of `twin` (nodes labelled `sickbay.dev/node-pool`),
    resizing through the node-pool controller when it runs (`twin.extensions["node_pools"]`)."""
    node_pools = getattr(twin, "extensions", {}).get("node_pools")
    repairs = getattr(twin, "extensions", {}).get("repairs")

    def on_instance(action: str, instance: str) -> None:
        if repairs is None:
            raise KeyError(instance)
        if action == "reset":
            repairs.reboot(instance)
        elif action == "terminate":
            repairs.replace(instance)  # EC2: the group launches a new instance, a new node
        else:
            repairs.replace(instance, same_name=True)  # a recreated VM keeps its name

    api = CloudApi(
        token,
        on_resize=node_pools.resize if node_pools is not None else None,
        on_instance=on_instance,
        clock=getattr(twin, "clock", None),
    )
    sizes: dict[str, int] = {}
    for node in twin.store.list("nodes").items:
        pool = ((node.get("metadata") or {}).get("labels") or {}).get(POOL_LABEL)
        if pool:
            sizes[pool] = sizes.get(pool, 0) + 1
    for pool, size in sorted(sizes.items()):
        api.add_pool(TwinPool(name=pool, size=size, max_size=max(max_size, size), latency=latency))
    twin.add_controller(CloudApiController(api, port))
    return api


def add_twin_up_arguments(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("cloud node-pool API (GKE-shaped)")
    group.add_argument("--no-cloud-api", action="store_true", help="do not serve the cloud API")
    group.add_argument("--cloud-port", type=int, default=0, help="port (default: a free one)")
    group.add_argument(
        "--cloud-token",
        default=os.environ.get("SICKBAY_TWIN_CLOUD_TOKEN"),
        help="bearer token it requires (env SICKBAY_TWIN_CLOUD_TOKEN; default: generated, logged)",
    )
    group.add_argument(
        "--cloud-max-size", type=int, default=8, help="quota: max nodes per pool (default 8)"
    )
    group.add_argument(
        "--cloud-latency",
        type=float,
        default=5.0,
        help="simulated seconds a resize operation runs (default 5)",
    )


def configure_twin(twin: Any, args: Any) -> CloudApi | None:
    if getattr(args, "no_cloud_api", False):
        return None
    token = getattr(args, "cloud_token", None)
    api = attach_cloud_api(
        twin,
        token=token,
        port=int(getattr(args, "cloud_port", 0) or 0),
        max_size=int(getattr(args, "cloud_max_size", 8)),
        latency=float(getattr(args, "cloud_latency", 5.0)),
    )
    if not token:
        log.info("twin cloud API token (generated): %s", api.token)
    return api
