"""One active replica through a `coordination.k8s.io/v1` Lease, as client-go's leaderelection.

The Lease lives in Sickbay's own namespace. A candidate reads it; it takes the Lease when it
does not exist, when nobody holds it, or when the holder has not renewed it for
`leaseDurationSeconds` (the holder died). The holder renews it every `retry_period`; when it
could not renew within `renew_deadline` it must stop acting, before anyone else may take over
(renew_deadline < lease_duration). Every write is a PUT carrying the read resourceVersion, so
two candidates racing for an expired Lease cannot both win: the second gets 409 Conflict.
A holder that stops cleanly releases the Lease (holder cleared, duration 1 s) so a standby
takes over at once instead of waiting for the expiry.

Times are the Lease's own (`renewTime`, MicroTime) compared with this process's clock, as
client-go does; clocks of the replicas only need to agree to well within the lease duration.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from kubernetes import client as k8s

from activities.kube.client import ErrorKind, Kube, KubeError

log = logging.getLogger(__name__)

RESOURCE = "leases.coordination.k8s.io"


@dataclass(frozen=True)
class LeaseConfig:
    name: str
    namespace: str
    identity: str
    # client-go's defaults: a dead holder is replaced within ~lease_duration + retry_period.
    lease_duration: float = 15.0
    renew_deadline: float = 10.0
    retry_period: float = 2.0


def _micro(t: datetime) -> str:
    return t.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def _parse(value: Any) -> datetime | None:
    if not value:
        return None
    text = str(value).replace("Z", "+00:00")
    try:
        return datetime.fromisoformat(text)
    except ValueError:
        return None


class LeaseElector:
    """Blocking calls (run them on a thread). `try_acquire_or_renew()` is one round."""

    def __init__(self, kube: Kube, config: LeaseConfig) -> None:
        self._kube = kube
        self.config = config
        self._api = k8s.CoordinationV1Api(kube.api_client)
        self.is_leader = False
        self.transitions = 0

    def _spec(self, now: datetime, acquire: datetime, transitions: int) -> dict[str, Any]:
        return {
            "holderIdentity": self.config.identity,
            "leaseDurationSeconds": max(1, int(round(self.config.lease_duration))),
            "acquireTime": _micro(acquire),
            "renewTime": _micro(now),
            "leaseTransitions": transitions,
        }

    def _read(self) -> dict[str, Any]:
        cfg = self.config
        return self._kube.call(
            self._api.read_namespaced_lease,
            cfg.name,
            cfg.namespace,
            verb="get",
            resource=RESOURCE,
            name=cfg.name,
        )

    def _write(self, lease: dict[str, Any]) -> None:
        """Replace the Lease as read (its resourceVersion makes a concurrent write a 409)."""
        cfg = self.config
        self._kube.call(
            self._api.replace_namespaced_lease,
            cfg.name,
            cfg.namespace,
            lease,
            verb="update",
            resource=RESOURCE,
            name=cfg.name,
        )

    def try_acquire_or_renew(self, now: datetime | None = None) -> bool:
        """True when this identity holds the Lease after the call."""
        now = now or datetime.now(UTC)
        cfg = self.config
        try:
            lease = self._read()
        except KubeError as err:
            if err.kind is not ErrorKind.NOT_FOUND:
                raise
            body = {
                "apiVersion": "coordination.k8s.io/v1",
                "kind": "Lease",
                "metadata": {"name": cfg.name, "namespace": cfg.namespace},
                "spec": self._spec(now, now, 0),
            }
            try:
                self._kube.call(
                    self._api.create_namespaced_lease,
                    cfg.namespace,
                    body,
                    verb="create",
                    resource=RESOURCE,
                    name=cfg.name,
                )
            except KubeError as exc:
                if exc.kind is ErrorKind.CONFLICT:  # another candidate created it first
                    self.is_leader = False
                    return False
                raise
            self.is_leader = True
            return True
        spec = lease.get("spec") or {}
        holder = spec.get("holderIdentity") or ""
        renewed = _parse(spec.get("renewTime")) or _parse(spec.get("acquireTime"))
        duration = float(spec.get("leaseDurationSeconds") or cfg.lease_duration)
        expired = renewed is None or now >= renewed + timedelta(seconds=duration)
        mine = holder == cfg.identity
        if holder and not mine and not expired:
            self.is_leader = False
            return False
        transitions = int(spec.get("leaseTransitions") or 0)
        if mine:
            acquire = _parse(spec.get("acquireTime")) or now
        else:
            acquire, transitions = now, transitions + 1
        lease["spec"] = self._spec(now, acquire, transitions)
        try:
            self._write(lease)
        except KubeError as exc:
            if exc.kind is ErrorKind.CONFLICT:  # someone else wrote it since our read
                self.is_leader = False
                return False
            raise
        if not mine:
            self.transitions += 1
            log.info("lease %s/%s acquired by %s", cfg.namespace, cfg.name, cfg.identity)
        self.is_leader = True
        return True

    def release(self) -> None:
        """Give the Lease up now (clean stop), if held: a standby need not wait for expiry."""
        if not self.is_leader:
            return
        cfg = self.config
        self.is_leader = False
        try:
            lease = self._read()
            spec = lease.get("spec") or {}
            if spec.get("holderIdentity") != cfg.identity:
                return
            now = datetime.now(UTC)
            spec.update(holderIdentity="", leaseDurationSeconds=1, renewTime=_micro(now))
            lease["spec"] = spec
            self._write(lease)
        except KubeError as err:  # it expires on its own
            log.warning("could not release lease %s/%s: %s", cfg.namespace, cfg.name, err)
