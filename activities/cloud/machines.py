"""Reboot and replace of one node through its provider: the node rungs of the repair ladder.

Built: Cluster API, GKE, AKS, EKS (EC2 instances: activities/cloud/ec2.py) and the generic
HTTP provider.

Generic HTTP (a worker-side profile, `HttpProfile.reboot` / `.replace` in the cloud config
file; the pool's `profile` names it): one templated call each, with `{node}` and
`{provider_id}` besides the pool's placeholders, sent with the profile's idempotency header
carrying the attempt's key: the API is expected to act once per key (as the twin's does). A
profile without the call: RepairProviderNotConfigured. A 404 on replace: the machine is gone.

AKS (Azure Resource Manager, Microsoft.Compute VMSS VMs, with the AKS provider's endpoint and
credentials):
- the node's VM from its `spec.providerID` (`azure:///subscriptions/<s>/resourceGroups/<rg>/`
  `providers/Microsoft.Compute/virtualMachineScaleSets/<vmss>/virtualMachines/<id>`);
- reboot: `POST <vm>/restart?api-version=2024-07-01` (202, `Azure-AsyncOperation`);
- replace: `DELETE <vm>?api-version=2024-07-01`; the agent pool (its count, or the cluster
  autoscaler) brings a new VM, a new node with new GPUs;
- asked for once per attempt: ARM has no request ids, so the record is kept on the Node,
  never in the worker's memory. Before the POST one patch writes `sickbay.dev/repair-request:
  <key>` and `sickbay.dev/restart-record` (JSON: state `asking`, the node's bootID, its Ready
  condition as `<status>@<lastTransitionTime>`, the VM's instanceView provisioning status as
  `<code>@<time>`); after ARM's answer the state becomes `asked` (202) or `refused` (a 4xx: ARM
  did not act); a 5xx or no answer leaves `asking`. A retry under the same key: `asked` ->
  nothing asked; `refused` -> asked again; `asking` -> nothing asked when the bootID or the
  Ready condition changed, or the VM shows an operation running or ended since the record (the
  evidence is named in the result's detail and logged as a warning; if it came from something
  else, the rung's wait times out into the next rung or escalation); no evidence -> asked (the
  try before died before the POST). Each check compares a value with the same value read
  earlier: no two clocks are compared. RBAC: patch on nodes.
  A replace first reads the VM: gone (404) or `provisioningState: Deleting` means it was asked
  already, and nothing is asked again.

GKE (Compute Engine API v1, with the GKE provider's endpoint, credentials and compute hosts):
- the node's instance from its `spec.providerID` (`gce://<project>/<zone>/<instance>`);
- reboot: `POST .../zones/{z}/instances/{i}/reset?requestId=<uuid>`;
- replace: `POST <the pool's instance group manager in that zone>/recreateInstances?requestId=`
  `{"instances": ["zones/{z}/instances/{i}"]}` (the group is read from the node pool's
  `instanceGroupUrls`; the recreated VM registers as a node with new GPUs);
- asked for once per attempt: `requestId` is a UUID derived from the attempt's key; Compute
  Engine answers a repeated request with the same id with the first one's operation and does
  not act again.

Cluster API (cluster.x-k8s.io/v1beta1 Machines, through the official kubernetes client):
- the node's Machine: the node annotations `cluster.x-k8s.io/machine` +
  `cluster.x-k8s.io/cluster-namespace` (set by Cluster API), else the Machine whose
  `status.nodeRef.name` is the node;
- reboot: the machine remediation contract - annotate the Machine
  `cluster.x-k8s.io/remediate-machine`, which its MachineHealthCheck treats as unhealthy and
  hands to its remediation: an external remediation template that reboots (e.g. Metal3's
  reboot strategy) reboots it; an MHC without a template has the owner *replace* the Machine
  instead, so configure the MHC for the rung you want. No MHC covering the Machine: nothing
  happens and the rung times out (escalation);
- replace: delete the Machine; its MachineSet creates a new one, hence a new node;
- asked for once per attempt: the request's key goes on the Machine
  (`sickbay.dev/repair-request`) in the same patch as the remediation annotation, or just
  before the delete; a retried call that finds its key (or its Machine already being deleted
  under that key) asks nothing again (`asked: false`).

RBAC: get/list/patch/delete on machines.cluster.x-k8s.io; get on nodes (AKS: patch too).
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import uuid as uuidlib
from datetime import UTC, datetime
from typing import Any, Protocol

import httpx
from temporalio import activity
from temporalio.exceptions import ApplicationError

from activities.cloud.base import CloudRejected, CloudUnavailable, json_of, send
from activities.cloud.config import (
    AksConfig,
    AwsConfig,
    CloudConfig,
    GkeConfig,
    HttpCall,
    HttpProfile,
)
from activities.cloud.credentials import AzureToken, StaticToken
from activities.cloud.gke import GkeNodePools
from activities.cloud.http import HttpNodePools
from activities.defn import implements
from activities.heartbeat import HEARTBEAT_EVERY, heartbeating
from activities.outbound import ConfigError
from contract.capacity import NodePoolTarget
from contract.errors import ERR_CLOUD_UNAVAILABLE, ERR_PROVIDER_NOT_CONFIGURED, ERR_PROVIDER_REFUSED
from contract.repair_rungs import REBOOT_NODE, REPLACE_NODE, MachineActionInput, MachineActionResult

GROUP = "cluster.x-k8s.io"
VERSION = "v1beta1"
PLURAL = "machines"
ANN_REMEDIATE = "cluster.x-k8s.io/remediate-machine"
ANN_NODE_MACHINE = "cluster.x-k8s.io/machine"
ANN_NODE_NAMESPACE = "cluster.x-k8s.io/cluster-namespace"
ANN_REPAIR_REQUEST = "sickbay.dev/repair-request"


class MachineClient(Protocol):
    async def reboot(
        self, node: str, key: str, pool: NodePoolTarget | None = None
    ) -> MachineActionResult: ...

    async def replace(
        self, node: str, key: str, pool: NodePoolTarget | None = None
    ) -> MachineActionResult: ...


class ClusterApiMachines:
    def __init__(self, api_client: Any) -> None:
        from kubernetes.client import CoreV1Api, CustomObjectsApi

        self._custom = CustomObjectsApi(api_client)
        self._core = CoreV1Api(api_client)

    async def _run(self, what: str, fn: Any, *args: Any, **kwargs: Any) -> Any:
        from kubernetes.client.exceptions import ApiException
        from urllib3.exceptions import HTTPError

        try:
            return await asyncio.to_thread(fn, *args, **kwargs)
        except ApiException as exc:
            message = f"{what}: HTTP {exc.status} {exc.reason}: {str(exc.body or '')[:300]}"
            if exc.status in (409, 429) or (exc.status or 0) >= 500:
                raise CloudUnavailable(message) from exc
            raise CloudRejected(message, exc.status) from exc
        except HTTPError as exc:
            raise CloudUnavailable(f"{what}: {exc!r}") from exc

    async def _machine(self, node: str) -> tuple[dict[str, Any] | None, bool]:
        """(the node's Machine or None, whether the node says it has one)."""
        try:
            obj = await self._run(f"get node {node}", self._core.read_node, node)
            annotations = obj.metadata.annotations or {}
        except CloudRejected as err:
            if err.status != 404:
                raise
            return None, True  # the node is gone with its Machine
        name, ns = annotations.get(ANN_NODE_MACHINE), annotations.get(ANN_NODE_NAMESPACE)
        if name and ns:
            try:
                machine = await self._run(
                    f"get Machine {ns}/{name}",
                    self._custom.get_namespaced_custom_object,
                    GROUP,
                    VERSION,
                    ns,
                    PLURAL,
                    name,
                )
                return machine, True
            except CloudRejected as err:
                if err.status == 404:
                    return None, True
                raise
        listed = await self._run(
            "list Machines", self._custom.list_cluster_custom_object, GROUP, VERSION, PLURAL
        )
        for machine in listed.get("items") or []:
            if ((machine.get("status") or {}).get("nodeRef") or {}).get("name") == node:
                return machine, True
        return None, False

    @staticmethod
    def _id(machine: dict[str, Any]) -> tuple[str, str]:
        return machine["metadata"].get("namespace", "default"), machine["metadata"]["name"]

    async def _mark(self, machine: dict[str, Any], annotations: dict[str, str]) -> None:
        ns, name = self._id(machine)
        await self._run(
            f"patch Machine {ns}/{name}",
            self._custom.patch_namespaced_custom_object,
            GROUP,
            VERSION,
            ns,
            PLURAL,
            name,
            {"metadata": {"annotations": annotations}},
            _content_type="application/merge-patch+json",
        )

    async def reboot(
        self, node: str, key: str, pool: NodePoolTarget | None = None
    ) -> MachineActionResult:
        machine, _claimed = await self._machine(node)
        if machine is None:
            raise ConfigError(f"node {node} has no Cluster API Machine: cannot ask for a reboot")
        ns, name = self._id(machine)
        annotations = machine["metadata"].get("annotations") or {}
        if annotations.get(ANN_REPAIR_REQUEST) == key:
            return MachineActionResult(
                action="reboot",
                node=node,
                operation=f"{ns}/{name}",
                asked=False,
                detail="remediation already asked for under this key",
            )
        await self._mark(machine, {ANN_REMEDIATE: "", ANN_REPAIR_REQUEST: key})
        return MachineActionResult(
            action="reboot",
            node=node,
            operation=f"{ns}/{name}",
            detail=f"Machine {ns}/{name} annotated {ANN_REMEDIATE} for its MachineHealthCheck",
        )

    async def replace(
        self, node: str, key: str, pool: NodePoolTarget | None = None
    ) -> MachineActionResult:
        machine, claimed = await self._machine(node)
        if machine is None:
            if claimed:  # the node (or the Machine it names) is gone: deleted already
                return MachineActionResult(
                    action="replace", node=node, asked=False, detail="the Machine is gone already"
                )
            raise ConfigError(f"node {node} has no Cluster API Machine: cannot replace it")
        ns, name = self._id(machine)
        annotations = machine["metadata"].get("annotations") or {}
        if annotations.get(ANN_REPAIR_REQUEST) == key and machine["metadata"].get(
            "deletionTimestamp"
        ):
            return MachineActionResult(
                action="replace",
                node=node,
                operation=f"{ns}/{name}",
                asked=False,
                detail="the Machine is being deleted under this key",
            )
        if annotations.get(ANN_REPAIR_REQUEST) != key:
            await self._mark(machine, {ANN_REPAIR_REQUEST: key})  # recorded before the delete
        await self._run(
            f"delete Machine {ns}/{name}",
            self._custom.delete_namespaced_custom_object,
            GROUP,
            VERSION,
            ns,
            PLURAL,
            name,
        )
        return MachineActionResult(
            action="replace",
            node=node,
            operation=f"{ns}/{name}",
            detail=f"Machine {ns}/{name} deleted: its MachineSet creates the replacement",
        )


class NodeGone(ConfigError):
    """The node object is gone (deleted, or its VM being recreated)."""


class GkeMachines:
    """Reboot / replace of GKE nodes' VMs; the node is read through the kubernetes client."""

    def __init__(self, pools: GkeNodePools, api_client: Any, compute_base: str) -> None:
        from kubernetes.client import CoreV1Api

        self._pools = pools
        self._core = CoreV1Api(api_client)
        self._compute = compute_base.rstrip("/")

    @classmethod
    def from_config(
        cls, client: httpx.AsyncClient, config: GkeConfig, api_client: Any
    ) -> GkeMachines:
        base = config.compute_hosts[0] if config.compute_hosts else config.endpoint
        return cls(GkeNodePools.from_config(client, config), api_client, base)

    async def _instance(self, node: str) -> tuple[str, str, str]:
        from kubernetes.client.exceptions import ApiException

        try:
            obj = await asyncio.to_thread(self._core.read_node, node)
        except ApiException as exc:
            if exc.status == 404:
                raise NodeGone(f"node {node} not found: no instance to act on") from exc
            raise CloudUnavailable(f"get node {node}: HTTP {exc.status}") from exc
        provider_id = str(getattr(obj.spec, "provider_id", None) or "")
        parts = provider_id.removeprefix("gce://").split("/")
        if not provider_id.startswith("gce://") or len(parts) != 3 or not all(parts):
            raise ConfigError(
                f"node {node} has providerID {provider_id!r}, not gce://<project>/<zone>/<name>: "
                "not a GKE/Compute Engine node"
            )
        return parts[0], parts[1], parts[2]

    @staticmethod
    def _request_id(key: str) -> str:
        return str(uuidlib.uuid5(uuidlib.NAMESPACE_URL, f"sickbay:{key}"))

    async def _post(self, url: str, body: Any = None) -> dict[str, Any]:
        headers = await self._pools._headers()
        return json_of(
            await send(self._pools._client, "POST", url, headers=headers, json_body=body)
        )

    async def reboot(
        self, node: str, key: str, pool: NodePoolTarget | None = None
    ) -> MachineActionResult:
        project, zone, name = await self._instance(node)
        url = (
            f"{self._compute}/compute/v1/projects/{project}/zones/{zone}/instances/{name}/reset"
            f"?requestId={self._request_id(key)}"
        )
        op = await self._post(url)
        return MachineActionResult(
            action="reboot",
            node=node,
            operation=str(op.get("name", "")),
            detail=f"instances.reset of {zone}/{name} ({op.get('status', '?')})",
        )

    async def replace(
        self, node: str, key: str, pool: NodePoolTarget | None = None
    ) -> MachineActionResult:
        if pool is None:
            raise ConfigError(
                f"replacing {node} on GKE needs its node pool (project, location, cluster)"
            )
        try:
            project, zone, name = await self._instance(node)
        except NodeGone:
            # Only a retry gets here: the node was resolved when the rung began, and the
            # recreated VM has not registered yet. Nothing is asked again.
            return MachineActionResult(
                action="replace", node=node, asked=False, detail="node gone: being recreated"
            )
        node_pool = await self._pools._get(self._pools._pool_url(pool))
        groups = [str(u) for u in node_pool.get("instanceGroupUrls") or []]
        in_zone = [u for u in groups if f"/zones/{zone}/" in u]
        chosen = in_zone or (groups if len(groups) == 1 else [])
        if not chosen:
            raise ConfigError(
                f"node pool {pool.name} has no instance group in zone {zone} for {node}"
            )
        igm = self._pools._checked_group_url(chosen[0]).replace(
            "/instanceGroups/", "/instanceGroupManagers/"
        )
        op = await self._post(
            f"{igm}/recreateInstances?requestId={self._request_id(key)}",
            {"instances": [f"zones/{zone}/instances/{name}"]},
        )
        return MachineActionResult(
            action="replace",
            node=node,
            operation=str(op.get("name", "")),
            detail=f"recreateInstances of {zone}/{name} in {igm.rsplit('/', 1)[-1]}",
        )


async def patch_node_annotations(core: Any, node: str, annotations: dict[str, str]) -> None:
    """One merge patch of the node's annotations (the reboot records), errors mapped."""
    from kubernetes.client.exceptions import ApiException
    from urllib3.exceptions import HTTPError

    body = {"metadata": {"annotations": annotations}}
    try:
        await asyncio.to_thread(core.patch_node, node, body)
    except ApiException as exc:
        message = f"patch node {node}: HTTP {exc.status} {exc.reason}"
        if exc.status in (409, 429) or (exc.status or 0) >= 500:
            raise CloudUnavailable(message) from exc
        raise CloudRejected(f"{message}: {str(exc.body or '')[:300]}", exc.status) from exc
    except HTTPError as exc:
        raise CloudUnavailable(f"patch node {node}: {exc!r}") from exc


def _secret_set(ref: Any) -> bool:
    try:
        return bool(ref.resolve())
    except ConfigError:
        return False


AZURE_COMPUTE_API = "2024-07-01"
_AZURE_VM = re.compile(
    r"^azure:///subscriptions/([^/]+)/resourceGroups/([^/]+)/providers/Microsoft\.Compute/"
    r"virtualMachineScaleSets/([^/]+)/virtualMachines/([^/]+)$",
    re.IGNORECASE,
)
# The AKS reboot's durable record on the Node, beside `sickbay.dev/repair-request: <key>`: a
# JSON object written in the same patch before the restart and updated after ARM's answer:
# {"state": "asking" | "asked" | "refused", "bootID", "ready", "vm", "at", "operation"}.
ANN_RESTART_RECORD = "sickbay.dev/restart-record"
# ARM's instanceView while a user-initiated operation runs on the VM (its transitional states).
_ARM_RUNNING = frozenset(
    {"provisioningstate/creating", "provisioningstate/updating", "provisioningstate/deleting"}
)


def _boot_id(obj: Any) -> str:
    return str(getattr(getattr(obj.status, "node_info", None), "boot_id", "") or "")


def _ready_mark(obj: Any) -> str:
    """The node's Ready condition as `<status>@<lastTransitionTime>`: it changes with every
    transition, whoever's clock wrote the time."""
    for cond in getattr(obj.status, "conditions", None) or []:
        if cond.type == "Ready":
            when = cond.last_transition_time
            stamp = when.isoformat() if isinstance(when, datetime) else str(when or "")
            return f"{cond.status}@{stamp}"
    return ""


def _vm_mark(view: dict[str, Any]) -> tuple[str, bool]:
    """(the VM's provisioning status as `<code>@<time>`, whether an operation runs on it)."""
    for status in view.get("statuses") or []:
        code = str(status.get("code", ""))
        if code.lower().startswith("provisioningstate/"):
            return f"{code}@{status.get('time', '')}", code.lower() in _ARM_RUNNING
    return "", False


class AksMachines:
    """Reboot / replace of AKS nodes' VMSS VMs; the node is read (and, for a reboot, annotated)
    through the kubernetes client."""

    def __init__(self, client: httpx.AsyncClient, config: AksConfig, api_client: Any) -> None:
        from kubernetes.client import CoreV1Api

        self._client = client
        self._endpoint = config.endpoint.rstrip("/")
        self._token = AzureToken(config)
        self._core = CoreV1Api(api_client)

    async def _node(self, node: str) -> Any:
        from kubernetes.client.exceptions import ApiException

        try:
            return await asyncio.to_thread(self._core.read_node, node)
        except ApiException as exc:
            if exc.status == 404:
                raise NodeGone(f"node {node} not found: no VM to act on") from exc
            raise CloudUnavailable(f"get node {node}: HTTP {exc.status}") from exc

    def _vm_of(self, node: str, obj: Any) -> str:
        provider_id = str(getattr(obj.spec, "provider_id", None) or "")
        match = _AZURE_VM.match(provider_id)
        if match is None:
            raise ConfigError(
                f"node {node} has providerID {provider_id!r}, not azure:///subscriptions/.../"
                "virtualMachineScaleSets/<vmss>/virtualMachines/<id>: not an AKS VMSS node"
            )
        sub, rg, vmss, instance = match.groups()
        return (
            f"{self._endpoint}/subscriptions/{sub}/resourceGroups/{rg}/providers/"
            f"Microsoft.Compute/virtualMachineScaleSets/{vmss}/virtualMachines/{instance}"
        )

    async def _vm_url(self, node: str) -> str:
        return self._vm_of(node, await self._node(node))

    async def _headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {await self._token.get()}", "Accept": "application/json"}

    async def _instance_view(self, vm: str) -> dict[str, Any]:
        url = f"{vm}/instanceView?api-version={AZURE_COMPUTE_API}"
        return json_of(await send(self._client, "GET", url, headers=await self._headers()))

    async def _annotate(self, node: str, annotations: dict[str, str]) -> None:
        await patch_node_annotations(self._core, node, annotations)

    async def _record_after(self, node: str, key: str, record: dict[str, Any]) -> None:
        """The record after ARM's answer. Best effort: without it a retry finds `asking` and
        decides from the evidence instead."""
        try:
            await self._annotate(
                node, {ANN_REPAIR_REQUEST: key, ANN_RESTART_RECORD: json.dumps(record)}
            )
        except (CloudUnavailable, CloudRejected) as err:
            activity.logger.warning(
                "node %s: ARM's answer to the restart not recorded: %s", node, err
            )

    async def _evidence(self, vm: str, obj: Any, record: dict[str, Any]) -> str:
        """Why a restart recorded as `asking` (the try that asked died or lost ARM's answer)
        may have reached ARM, from what changed since the record; "" when nothing did."""
        boot_id = _boot_id(obj)
        if record.get("bootID") and boot_id and boot_id != record["bootID"]:
            return f"the node booted again since (bootID {record['bootID']} -> {boot_id})"
        ready = _ready_mark(obj)
        if ready != record.get("ready", ""):
            return f"the node's Ready condition changed since ({record.get('ready')} -> {ready})"
        mark, running = _vm_mark(await self._instance_view(vm))
        if running:
            return f"an operation is running on the VM ({mark.split('@', 1)[0]})"
        if mark != record.get("vm", ""):
            return f"an operation on the VM ended since ({record.get('vm')} -> {mark})"
        return ""

    async def reboot(
        self, node: str, key: str, pool: NodePoolTarget | None = None
    ) -> MachineActionResult:
        obj = await self._node(node)
        vm = self._vm_of(node, obj)
        name = vm.split("/virtualMachineScaleSets/", 1)[1]
        annotations = obj.metadata.annotations or {}
        if annotations.get(ANN_REPAIR_REQUEST) == key:
            try:
                record = json.loads(annotations.get(ANN_RESTART_RECORD) or "{}")
            except ValueError:
                record = {}
            if not isinstance(record, dict):
                record = {}
            state = record.get("state")
            if state == "asked":
                return MachineActionResult(
                    action="reboot",
                    node=node,
                    operation=str(record.get("operation") or ""),
                    asked=False,
                    detail=f"restart of {name} already asked for under this key (recorded on "
                    "the node)",
                )
            if state != "refused":  # asking, or unreadable: the try that asked may have reached ARM
                evidence = (
                    await self._evidence(vm, obj, record)
                    if state == "asking"
                    else (f"its record on the node is unreadable ({ANN_RESTART_RECORD})")
                )
                if evidence:
                    activity.logger.warning(
                        "restart of %s (node %s) NOT asked again: an earlier try of this "
                        "attempt was cut off after recording it, and %s; the rung's wait "
                        "decides",
                        name,
                        node,
                        evidence,
                    )
                    return MachineActionResult(
                        action="reboot",
                        node=node,
                        asked=False,
                        detail=f"restart of {name} not asked again: an earlier try of this "
                        f"attempt was cut off after recording it, and {evidence}",
                    )
        # Recorded before the restart (one patch): what a retry compares to find evidence.
        view_mark, _running = _vm_mark(await self._instance_view(vm))
        record = {
            "state": "asking",
            "bootID": _boot_id(obj),
            "ready": _ready_mark(obj),
            "vm": view_mark,
            "at": datetime.now(UTC).isoformat(timespec="seconds").replace("+00:00", "Z"),
        }
        await self._annotate(
            node, {ANN_REPAIR_REQUEST: key, ANN_RESTART_RECORD: json.dumps(record)}
        )
        try:
            response = await send(
                self._client,
                "POST",
                f"{vm}/restart?api-version={AZURE_COMPUTE_API}",
                headers=await self._headers(),
            )
        except (CloudRejected, CloudUnavailable) as err:
            status = getattr(err, "status", None)
            if status is not None and status < 500:  # a 4xx answer: ARM refused, did not act
                await self._record_after(node, key, {**record, "state": "refused"})
            raise  # 5xx or no answer: left `asking`, the retry decides from the evidence
        operation = response.headers.get("azure-asyncoperation", "")
        await self._record_after(node, key, {**record, "state": "asked", "operation": operation})
        return MachineActionResult(
            action="reboot",
            node=node,
            operation=operation,
            detail=f"VMSS VM restart of {name}",
        )

    async def replace(
        self, node: str, key: str, pool: NodePoolTarget | None = None
    ) -> MachineActionResult:
        try:
            vm = await self._vm_url(node)
        except NodeGone:
            return MachineActionResult(
                action="replace", node=node, asked=False, detail="node gone: deleted already"
            )
        headers = await self._headers()
        url = f"{vm}?api-version={AZURE_COMPUTE_API}"
        try:
            current = json_of(await send(self._client, "GET", url, headers=headers))
        except CloudRejected as err:
            if err.status != 404:
                raise
            return MachineActionResult(
                action="replace", node=node, asked=False, detail="the VM is gone already"
            )
        state = str((current.get("properties") or {}).get("provisioningState", ""))
        if state == "Deleting":
            return MachineActionResult(
                action="replace", node=node, asked=False, detail="the VM is being deleted"
            )
        response = await send(self._client, "DELETE", url, headers=headers)
        return MachineActionResult(
            action="replace",
            node=node,
            operation=response.headers.get("azure-asyncoperation", ""),
            detail=f"VMSS VM {vm.split('/virtualMachineScaleSets/', 1)[1]} deleted: its "
            "agent pool brings a new one",
        )


class HttpMachines:
    """Reboot / replace through a generic HTTP profile (provider `http`, the pool's `profile`)."""

    def __init__(
        self, client: httpx.AsyncClient, profiles: dict[str, HttpProfile], api_client: Any
    ) -> None:
        from kubernetes.client import CoreV1Api

        self._client = client
        self._profiles = profiles
        self._core = CoreV1Api(api_client)

    async def _provider_id(self, node: str) -> str | None:
        from kubernetes.client.exceptions import ApiException

        try:
            obj = await asyncio.to_thread(self._core.read_node, node)
        except ApiException as exc:
            if exc.status == 404:
                return None
            raise CloudUnavailable(f"get node {node}: HTTP {exc.status}") from exc
        return str(getattr(obj.spec, "provider_id", None) or "")

    def _profile(self, pool: NodePoolTarget | None, action: str) -> tuple[HttpProfile, HttpCall]:
        name = pool.profile if pool else None
        profile = self._profiles.get(name or "")
        if profile is None:
            raise ConfigError(
                f"no HTTP profile {name!r} for the node {action} "
                f"(configured: {', '.join(sorted(self._profiles)) or 'none'})"
            )
        call = profile.reboot if action == "reboot" else profile.replace
        if call is None:
            raise ConfigError(f"HTTP profile {name!r} has no `{action}` call")
        return profile, call

    async def _act(
        self, action: str, node: str, key: str, pool: NodePoolTarget | None
    ) -> MachineActionResult:
        profile, call = self._profile(pool, action)
        provider_id = await self._provider_id(node)
        if provider_id is None and action == "replace":
            return MachineActionResult(
                action="replace", node=node, asked=False, detail="node gone: replaced already"
            )
        assert pool is not None  # _profile found one through it
        pools = HttpNodePools(self._client, profile)
        values = pools._values(pool, node=node, provider_id=provider_id, idempotency_key=key)
        extra = {profile.idempotency_header: key} if profile.idempotency_header else {}
        try:
            response = await pools._call(call, values, extra)
        except CloudRejected as err:
            if action == "replace" and err.status == 404:
                return MachineActionResult(
                    action="replace", node=node, asked=False, detail="the machine is gone already"
                )
            raise
        operation = ""
        if profile.operation_id_header:
            operation = response.headers.get(profile.operation_id_header, "")
        return MachineActionResult(
            action=action,  # type: ignore[arg-type]
            node=node,
            operation=operation,
            detail=f"{call.method} {action} of {node} through HTTP profile {pool.profile} "
            f"(HTTP {response.status_code})",
        )

    async def reboot(
        self, node: str, key: str, pool: NodePoolTarget | None = None
    ) -> MachineActionResult:
        return await self._act("reboot", node, key, pool)

    async def replace(
        self, node: str, key: str, pool: NodePoolTarget | None = None
    ) -> MachineActionResult:
        return await self._act("replace", node, key, pool)


def machine_providers(
    config: CloudConfig, http: httpx.AsyncClient, kube_api: Any
) -> dict[str, MachineClient]:
    """The reboot / replace providers this worker can use, by the pool's provider name; one
    not listed here is "not configured" (the remediation escalates naming it). Cluster API
    whenever the worker has a Kubernetes client; GKE and AKS when `gke_configured` /
    `aks_configured`; `twin` (the twin's Compute Engine endpoints) when its URL is set; `eks` (EC2) when AWS is (`aws_configured`); `http` when a
    profile has a `reboot` or `replace` call."""
    providers: dict[str, MachineClient] = {}
    if kube_api is not None:
        providers["cluster-api"] = ClusterApiMachines(kube_api)
        if gke_configured(config.gke):
            providers["gke"] = GkeMachines.from_config(http, config.gke, kube_api)
        twin = config.twin
        if twin.endpoint:
            pools = GkeNodePools(
                http,
                endpoint=twin.endpoint,
                token=StaticToken(twin.token),
                defaults={
                    "project": twin.project,
                    "location": twin.location,
                    "cluster": twin.cluster,
                },
            )
            providers["twin"] = GkeMachines(pools, kube_api, twin.endpoint)
        aks = config.aks
        if aks_configured(aks):
            providers["aks"] = AksMachines(http, aks, kube_api)
        if any(p.reboot or p.replace for p in config.http.values()):
            providers["http"] = HttpMachines(http, config.http, kube_api)
        if aws_configured(config.aws):
            from activities.cloud.aws import AwsClients
            from activities.cloud.ec2 import Ec2Machines

            providers["eks"] = Ec2Machines(AwsClients(config.aws), kube_api)
    return providers


def gke_configured(gke: GkeConfig) -> bool:
    """Whether this worker is meant to act on GKE: a ready token, a default project or cluster,
    or Application Default Credentials named by $GOOGLE_APPLICATION_CREDENTIALS. (On GKE with
    Workload Identity no variable is needed for the token: set SICKBAY_GKE_PROJECT.)"""
    return bool(
        _secret_set(gke.token)
        or gke.project
        or gke.cluster
        or os.environ.get("GOOGLE_APPLICATION_CREDENTIALS")
    )


def aks_configured(aks: AksConfig) -> bool:
    """Whether this worker is meant to act on AKS: a ready token, a default subscription or
    cluster, or the variables azure-identity signs in with (workload identity's among them)."""
    return bool(
        _secret_set(aks.token)
        or aks.subscription
        or aks.cluster
        or os.environ.get("AZURE_CLIENT_ID")
        or os.environ.get("AZURE_FEDERATED_TOKEN_FILE")
    )


def aws_configured(aws: AwsConfig) -> bool:
    """Whether this worker is meant to act on AWS: a region, cluster, profile or endpoint in
    its config, or the region variables the AWS SDK reads. (Credentials are the SDK's chain,
    found at the first call; missing ones are named then.)"""
    return bool(
        aws.region
        or aws.cluster
        or aws.profile
        or aws.endpoints
        or os.environ.get("AWS_REGION")
        or os.environ.get("AWS_DEFAULT_REGION")
    )


class MachineActivities:
    """reboot-node / replace-node, one provider per name (`machine_providers`). Each heartbeats
    while the provider is asked, so a worker that dies meanwhile is noticed within the
    workflow's heartbeat timeout (contract/failover.py), not its 2-minute start-to-close; the
    retry then decides from the provider's own record."""

    def __init__(
        self, providers: dict[str, MachineClient], http: httpx.AsyncClient | None = None
    ) -> None:
        self._providers = providers
        self._http = http

    @classmethod
    def from_config(cls, config: CloudConfig, kube_api: Any) -> MachineActivities:
        http = httpx.AsyncClient(timeout=config.request_timeout)
        return cls(machine_providers(config, http, kube_api), http)

    async def aclose(self) -> None:
        if self._http is not None:
            await self._http.aclose()

    def all(self) -> list[Any]:
        return [self.reboot_node, self.replace_node]

    def _provider(self, inp: MachineActionInput) -> MachineClient:
        name = inp.pool.provider if inp.pool else None
        client = self._providers.get(name or "")
        if client is None:
            raise ApplicationError(
                f"no {inp.action} provider for node {inp.node}: "
                f"{'its pool names none' if not name else repr(name) + ' is not configured'} "
                f"(configured: {', '.join(sorted(self._providers)) or 'none'})",
                type=ERR_PROVIDER_NOT_CONFIGURED,
                non_retryable=True,
            )
        return client

    async def _act(self, inp: MachineActionInput) -> MachineActionResult:
        client = self._provider(inp)
        if inp.dry_run:
            return MachineActionResult(
                action=inp.action,
                node=inp.node,
                asked=False,
                dry_run=True,
                detail=f"would ask {inp.pool.provider if inp.pool else '?'} to {inp.action} it",
            )
        try:
            async with heartbeating(HEARTBEAT_EVERY):
                if inp.action == "reboot":
                    result = await client.reboot(inp.node, inp.idempotency_key, inp.pool)
                else:
                    result = await client.replace(inp.node, inp.idempotency_key, inp.pool)
        except ConfigError as err:
            raise ApplicationError(
                str(err), type=ERR_PROVIDER_NOT_CONFIGURED, non_retryable=True
            ) from err
        except CloudRejected as err:
            raise ApplicationError(str(err), type=ERR_PROVIDER_REFUSED, non_retryable=True) from err
        except CloudUnavailable as err:
            raise ApplicationError(str(err), type=ERR_CLOUD_UNAVAILABLE) from err
        activity.logger.info(
            "%s of node %s: %s (%s)",
            inp.action,
            inp.node,
            result.detail,
            "asked" if result.asked else "not asked again",
        )
        return result

    @implements(REBOOT_NODE)
    async def reboot_node(self, inp: MachineActionInput) -> MachineActionResult:
        return await self._act(inp)

    @implements(REPLACE_NODE)
    async def replace_node(self, inp: MachineActionInput) -> MachineActionResult:
        return await self._act(inp)
