"""Reboot and replace of one node through its provider: the node rungs of the repair ladder.

Only Cluster API is built so far (GKE `instances.reset` / `recreateInstances`, AKS VMSS
`restart` / `delete` and the generic HTTP provider are not built yet).

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

RBAC: get/list/patch/delete on machines.cluster.x-k8s.io; get on nodes.
"""

from __future__ import annotations

import asyncio
from typing import Any, Protocol

from temporalio import activity
from temporalio.exceptions import ApplicationError

from activities.cloud.base import CloudRejected, CloudUnavailable, ConfigError
from contract.repair import (
    ACT_REBOOT_NODE,
    ACT_REPLACE_NODE,
    ERR_PROVIDER_NOT_CONFIGURED,
    ERR_PROVIDER_REFUSED,
    MachineActionInput,
    MachineActionResult,
)
from workflows.constants import ERR_CLOUD_UNAVAILABLE

GROUP = "cluster.x-k8s.io"
VERSION = "v1beta1"
PLURAL = "machines"
ANN_REMEDIATE = "cluster.x-k8s.io/remediate-machine"
ANN_NODE_MACHINE = "cluster.x-k8s.io/machine"
ANN_NODE_NAMESPACE = "cluster.x-k8s.io/cluster-namespace"
ANN_REPAIR_REQUEST = "sickbay.dev/repair-request"


class MachineClient(Protocol):
    async def reboot(self, node: str, key: str) -> MachineActionResult: ...

    async def replace(self, node: str, key: str) -> MachineActionResult: ...


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

    async def reboot(self, node: str, key: str) -> MachineActionResult:
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

    async def replace(self, node: str, key: str) -> MachineActionResult:
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


class MachineActivities:
    """reboot-node / replace-node, one provider per name (`cluster-api` so far)."""

    def __init__(self, providers: dict[str, MachineClient]) -> None:
        self._providers = providers

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
            if inp.action == "reboot":
                result = await client.reboot(inp.node, inp.idempotency_key)
            else:
                result = await client.replace(inp.node, inp.idempotency_key)
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

    @activity.defn(name=ACT_REBOOT_NODE)
    async def reboot_node(self, inp: MachineActionInput) -> MachineActionResult:
        return await self._act(inp)

    @activity.defn(name=ACT_REPLACE_NODE)
    async def replace_node(self, inp: MachineActionInput) -> MachineActionResult:
        return await self._act(inp)
