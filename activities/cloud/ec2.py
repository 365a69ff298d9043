"""Reboot and replace of an EKS node's EC2 instance (provider `eks`), through boto3 with the
AWS provider's region, endpoints and credential chain (activities/cloud/aws.py).

- the instance from the node's `spec.providerID` (`aws:///<availability zone>/<instance id>`);
- reboot: EC2 `RebootInstances`. EC2 has no request token for it, so, as for AKS, the record
  is kept on the Node: before the call one patch writes `sickbay.dev/repair-request: <key>` and
  `sickbay.dev/restart-record` (state `asking`, the node's bootID, its Ready condition as
  `<status>@<lastTransitionTime>`); after EC2's answer the state becomes `asked` or `refused`
  (a 4xx: EC2 did not act); a 5xx or no answer leaves `asking`. A retry under the same key:
  `asked` -> nothing asked; `refused` -> asked again; `asking` -> nothing asked when the bootID
  or the Ready condition changed since the record (named in the result and logged as a
  warning); no evidence -> asked (the try before died before the call, or EC2 has not begun
  the reboot: a second reboot request of an instance not yet rebooting is the one EC2 runs).
- replace: Auto Scaling `TerminateInstanceInAutoScalingGroup` with
  `ShouldDecrementDesiredCapacity: false`: the group (the managed node group's) keeps its
  desired capacity and launches a new instance, a new node with new GPUs. Asked once: the
  instance's lifecycle state is read first (`DescribeAutoScalingInstances`); `Terminating*` or
  `Terminated` means it was asked already, and an instance no group lists any more is looked
  up in EC2 (`DescribeInstances`): `shutting-down` / `terminated` / not found -> gone. An
  instance in no Auto Scaling group is refused (RepairProviderNotConfigured): Sickbay never
  terminates an instance that nothing would replace.

IAM: `ec2:RebootInstances`, `ec2:DescribeInstances`, `autoscaling:DescribeAutoScalingInstances`,
`autoscaling:TerminateInstanceInAutoScalingGroup` (docs/cloud.md). RBAC: get/patch on nodes.
"""

from __future__ import annotations

import asyncio
import json
import re
from datetime import UTC, datetime
from typing import Any

from temporalio import activity

from activities.cloud.aws import AwsClients
from activities.cloud.base import CloudRejected, CloudUnavailable
from activities.cloud.machines import (
    ANN_REPAIR_REQUEST,
    ANN_RESTART_RECORD,
    NodeGone,
    _boot_id,
    _ready_mark,
    patch_node_annotations,
)
from activities.outbound import ConfigError
from contract.capacity import NodePoolTarget
from contract.repair_rungs import MachineActionResult

_AWS_INSTANCE = re.compile(r"^aws:///([a-z0-9-]+)/(i-[0-9a-f]+)$")
# The region of an availability zone (us-west-2a -> us-west-2; us-gov-west-1b -> us-gov-west-1),
# used only when neither the pool nor the worker's config names a region.
_ZONE_REGION = re.compile(r"^([a-z]{2}(?:-gov|-iso[a-z]?)?-[a-z]+-\d+)")
_GONE_STATES = ("shutting-down", "terminated")


class Ec2Machines:
    """Reboot / replace of EKS nodes' EC2 instances; the node is read (and, for a reboot,
    annotated) through the kubernetes client."""

    def __init__(self, clients: AwsClients, api_client: Any) -> None:
        from kubernetes.client import CoreV1Api

        self._clients = clients
        self._core = CoreV1Api(api_client)

    async def _node(self, node: str) -> Any:
        from kubernetes.client.exceptions import ApiException

        try:
            return await asyncio.to_thread(self._core.read_node, node)
        except ApiException as exc:
            if exc.status == 404:
                raise NodeGone(f"node {node} not found: no instance to act on") from exc
            raise CloudUnavailable(f"get node {node}: HTTP {exc.status}") from exc

    def _instance(self, node: str, obj: Any, pool: NodePoolTarget | None) -> tuple[str, str]:
        """(region, instance id) of the node."""
        provider_id = str(getattr(obj.spec, "provider_id", None) or "")
        match = _AWS_INSTANCE.match(provider_id)
        if match is None:
            raise ConfigError(
                f"node {node} has providerID {provider_id!r}, not aws:///<zone>/<instance id>: "
                "not an EC2 node"
            )
        zone, instance = match.groups()
        region = self._clients.region(pool)
        if not region:
            found = _ZONE_REGION.match(zone)
            region = found.group(1) if found else None
        if not region:
            raise ConfigError(f"no AWS region for {instance} (zone {zone}): set `aws.region`")
        return region, instance

    async def _annotate(self, node: str, annotations: dict[str, str]) -> None:
        await patch_node_annotations(self._core, node, annotations)

    async def _record_after(self, node: str, key: str, record: dict[str, Any]) -> None:
        """The record after EC2's answer. Best effort: without it a retry finds `asking` and
        decides from the evidence instead."""
        try:
            await self._annotate(
                node, {ANN_REPAIR_REQUEST: key, ANN_RESTART_RECORD: json.dumps(record)}
            )
        except (CloudUnavailable, CloudRejected) as err:
            activity.logger.warning(
                "node %s: EC2's answer to the reboot not recorded: %s", node, err
            )

    @staticmethod
    def _evidence(obj: Any, record: dict[str, Any]) -> str:
        """Why a reboot recorded as `asking` may have reached EC2; "" when nothing changed."""
        boot_id = _boot_id(obj)
        if record.get("bootID") and boot_id and boot_id != record["bootID"]:
            return f"the node booted again since (bootID {record['bootID']} -> {boot_id})"
        ready = _ready_mark(obj)
        if ready != record.get("ready", ""):
            return f"the node's Ready condition changed since ({record.get('ready')} -> {ready})"
        return ""

    async def reboot(
        self, node: str, key: str, pool: NodePoolTarget | None = None
    ) -> MachineActionResult:
        obj = await self._node(node)
        region, instance = self._instance(node, obj, pool)
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
                    operation=instance,
                    asked=False,
                    detail=f"reboot of {instance} already asked for under this key (recorded "
                    "on the node)",
                )
            if state != "refused":
                evidence = (
                    self._evidence(obj, record)
                    if state == "asking"
                    else f"its record on the node is unreadable ({ANN_RESTART_RECORD})"
                )
                if evidence:
                    activity.logger.warning(
                        "reboot of %s (node %s) NOT asked again: an earlier try of this "
                        "attempt was cut off after recording it, and %s; the rung's wait "
                        "decides",
                        instance,
                        node,
                        evidence,
                    )
                    return MachineActionResult(
                        action="reboot",
                        node=node,
                        operation=instance,
                        asked=False,
                        detail=f"reboot of {instance} not asked again: an earlier try of this "
                        f"attempt was cut off after recording it, and {evidence}",
                    )
        record = {
            "state": "asking",
            "bootID": _boot_id(obj),
            "ready": _ready_mark(obj),
            "at": datetime.now(UTC).isoformat(timespec="seconds").replace("+00:00", "Z"),
        }
        await self._annotate(
            node, {ANN_REPAIR_REQUEST: key, ANN_RESTART_RECORD: json.dumps(record)}
        )
        ec2 = self._clients.client("ec2", region)
        try:
            await self._clients.call(
                f"RebootInstances {instance}", ec2.reboot_instances, InstanceIds=[instance]
            )
        except (CloudRejected, CloudUnavailable) as err:
            if err.status is not None and err.status < 500:  # EC2 answered 4xx: it did not act
                await self._record_after(node, key, {**record, "state": "refused"})
            raise  # 5xx or no answer: left `asking`, the retry decides from the evidence
        await self._record_after(node, key, {**record, "state": "asked", "operation": instance})
        return MachineActionResult(
            action="reboot",
            node=node,
            operation=instance,
            detail=f"EC2 RebootInstances of {instance}",
        )

    async def replace(
        self, node: str, key: str, pool: NodePoolTarget | None = None
    ) -> MachineActionResult:
        try:
            obj = await self._node(node)
        except NodeGone:
            return MachineActionResult(
                action="replace", node=node, asked=False, detail="node gone: replaced already"
            )
        region, instance = self._instance(node, obj, pool)
        asg = self._clients.client("autoscaling", region)
        listed = await self._clients.call(
            f"DescribeAutoScalingInstances {instance}",
            asg.describe_auto_scaling_instances,
            InstanceIds=[instance],
        )
        found = listed.get("AutoScalingInstances") or []
        if not found:
            return await self._not_in_group(region, node, instance)
        group = str(found[0].get("AutoScalingGroupName", ""))
        state = str(found[0].get("LifecycleState", ""))
        if state.startswith("Terminating") or state == "Terminated":
            return MachineActionResult(
                action="replace",
                node=node,
                operation=instance,
                asked=False,
                detail=f"{instance} is {state} in {group}: asked already",
            )
        answer = await self._clients.call(
            f"TerminateInstanceInAutoScalingGroup {instance}",
            asg.terminate_instance_in_auto_scaling_group,
            InstanceId=instance,
            ShouldDecrementDesiredCapacity=False,
        )
        activity_id = str((answer.get("Activity") or {}).get("ActivityId", ""))
        return MachineActionResult(
            action="replace",
            node=node,
            operation=activity_id or instance,
            detail=f"{instance} terminated in Auto Scaling group {group} (desired capacity "
            "kept): the group launches its replacement",
        )

    async def _not_in_group(self, region: str, node: str, instance: str) -> MachineActionResult:
        ec2 = self._clients.client("ec2", region)
        try:
            answer = await self._clients.call(
                f"DescribeInstances {instance}", ec2.describe_instances, InstanceIds=[instance]
            )
        except CloudRejected as err:
            if "InvalidInstanceID.NotFound" in str(err):
                return MachineActionResult(
                    action="replace", node=node, asked=False, detail=f"{instance} is gone"
                )
            raise
        states = [
            str((i.get("State") or {}).get("Name", ""))
            for r in answer.get("Reservations") or []
            for i in r.get("Instances") or []
        ]
        if not states or any(s in _GONE_STATES for s in states):
            return MachineActionResult(
                action="replace",
                node=node,
                asked=False,
                detail=f"{instance} is {states[0] if states else 'gone'}: terminated already",
            )
        raise ConfigError(
            f"{instance} (node {node}) is in no Auto Scaling group: nothing would launch its "
            "replacement, so Sickbay does not terminate it"
        )
