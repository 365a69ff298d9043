"""Fixtures for the Kubernetes activity tests: a cluster twin per test over real HTTP, the real
`KubeActivities` on a kubeconfig pointing at it, and helpers that put workloads into the twin.

Workloads are written straight into the twin's store in the shape a real cluster has them
(ReplicaSet owned by a Deployment, generated claim allocated and reserved for the pod, pod
bound with status.resourceClaimStatuses), so tests do not depend on the twin's controllers;
the tests that need controllers (eviction, replacement) start them explicitly.
"""

from __future__ import annotations

import contextlib
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import yaml
from temporalio.testing import ActivityEnvironment

from activities.kube import KubeActivities, KubeSettings
from tests.activities.kube.rbac_proxy import RbacProxy, role_rules
from twin.runtime import Twin

# The namespaced Roles of deploy/rbac.yaml (the health watcher's Lease), for the RBAC proxy.
ROLES = role_rules(
    list(
        yaml.safe_load_all(
            (Path(__file__).resolve().parents[3] / "deploy" / "rbac.yaml").read_text()
        )
    )
)

# The repair Jobs' namespace as deploy/namespace.yaml ships it (its Pod Security labels):
# every twin here starts with it, as a cluster Sickbay was deployed to. (Sickbay's own
# namespace is left to the tests that need it.)
DEPLOYED_NAMESPACES = [
    {"metadata": {"name": d["metadata"]["name"], "labels": d["metadata"].get("labels") or {}}}
    for d in yaml.safe_load_all(
        (Path(__file__).resolve().parents[3] / "deploy" / "namespace.yaml").read_text()
    )
    if d and d.get("kind") == "Namespace" and d["metadata"]["name"] == "sickbay-repair"
]
PROFILES = ("1.34", "1.35", "1.36", "1.37", "device-plugin")
DRIVER = "gpu.nvidia.com"


@dataclass
class KubeTwin:
    twin: Twin
    acts: KubeActivities
    kubeconfig: Path
    env: ActivityEnvironment = field(default_factory=ActivityEnvironment)
    heartbeats: list[Any] = field(default_factory=list)
    proxy: RbacProxy | None = None

    @property
    def store(self) -> Any:
        return self.twin.store

    @property
    def dra(self) -> bool:
        return self.twin.profile.dra

    async def run(self, fn: Any, arg: Any) -> Any:
        self.env.on_heartbeat = lambda *details: self.heartbeats.append(details)
        return await self.env.run(fn, arg)

    def node(self, i: int = 0) -> str:
        return self.twin.seed_info["nodes"][i]

    def slice_device(self, node: str, name: str) -> dict[str, Any]:
        for s in self.store.list("resourceslices.resource.k8s.io").items:
            if s["spec"].get("nodeName") == node:
                for d in s["spec"]["devices"]:
                    if d["name"] == name:
                        return d
        raise KeyError(name)

    def uuid_of(self, node: str, index: int) -> str:
        if self.dra:
            dev = self.slice_device(node, f"gpu-{index}")
            return dev["attributes"]["uuid"]["string"]
        node_obj = self.store.get("nodes", node)
        return node_obj["metadata"]["annotations"]["sickbay.dev/gpu-uuids"].split(",")[index]

    def request_count(self) -> int:
        return len(list(self.requests()))

    def requests(self) -> list[Any]:
        log = self.twin.requests
        if hasattr(log, "entries"):
            return list(log.entries())
        return list(log)

    def clear_requests(self) -> None:
        log = self.twin.requests
        if hasattr(log, "clear"):
            log.clear()

    # -- workloads written into the store ---------------------------------------------------

    def namespace(self, name: str, labels: dict[str, str] | None = None) -> None:
        """Create the namespace; given `labels`, an existing one gets exactly those."""
        if self.store.try_get("namespaces", name) is None:
            self.store.create("namespaces", {"metadata": {"name": name, "labels": labels or {}}})
        elif labels is not None:

            def relabel(ns: dict[str, Any]) -> None:
                ns["metadata"]["labels"] = dict(labels)

            self.store.mutate("namespaces", name, relabel)

    def consumer_pod(
        self,
        ns: str,
        name: str,
        node: str,
        device: str | None,
        owner: dict[str, Any] | None = None,
        labels: dict[str, str] | None = None,
        gpu_uuid: str | None = None,
        running: bool = True,
        priority_class: str | None = None,
        resource: str = "nvidia.com/gpu",
    ) -> dict[str, Any]:
        """A bound pod using `device` (DRA: generated claim; device plugin: `resource`, whose
        health it reports under the device id `gpu_uuid`)."""
        self.namespace(ns)
        container: dict[str, Any] = {"name": "main", "image": "cuda:12"}
        spec: dict[str, Any] = {"containers": [container], "nodeName": node}
        if priority_class:
            spec["priorityClassName"] = priority_class
        if self.dra:
            container["resources"] = {"claims": [{"name": "gpu"}]}
            spec["resourceClaims"] = [{"name": "gpu", "resourceClaimTemplateName": "gpu"}]
        else:
            container["resources"] = {"limits": {resource: "1"}}
        meta: dict[str, Any] = {"name": name, "namespace": ns, "labels": labels or {}}
        if owner:
            meta["ownerReferences"] = [owner]
        pod = self.store.create("pods", {"metadata": meta, "spec": spec}, namespace=ns)
        status: dict[str, Any] = {
            "phase": "Running" if running else "Pending",
            "conditions": [{"type": "PodScheduled", "status": "True"}]
            + ([{"type": "Ready", "status": "True"}] if running else []),
        }
        if self.dra and device:
            claim_name = f"{name}-gpu-{uuid.uuid4().hex[:5]}"
            self.store.create(
                "resourceclaims.resource.k8s.io",
                {
                    "metadata": {
                        "name": claim_name,
                        "namespace": ns,
                        "annotations": {"resource.kubernetes.io/pod-claim-name": "gpu"},
                        "ownerReferences": [
                            {
                                "apiVersion": "v1",
                                "kind": "Pod",
                                "name": name,
                                "uid": pod["metadata"]["uid"],
                                "controller": True,
                            }
                        ],
                    },
                    "spec": {
                        "devices": {
                            "requests": [
                                {
                                    "name": "gpu",
                                    "exactly": {"deviceClassName": DRIVER},
                                }
                            ]
                        }
                    },
                },
                namespace=ns,
            )
            self.store.mutate(
                "resourceclaims.resource.k8s.io",
                claim_name,
                lambda c: c.update(
                    status={
                        "allocation": {
                            "devices": {
                                "results": [
                                    {
                                        "request": "gpu",
                                        "driver": DRIVER,
                                        "pool": node,
                                        "device": device,
                                    }
                                ]
                            }
                        },
                        "reservedFor": [
                            {"resource": "pods", "name": name, "uid": pod["metadata"]["uid"]}
                        ],
                    }
                ),
                namespace=ns,
                subresource="status",
            )
            status["resourceClaimStatuses"] = [{"name": "gpu", "resourceClaimName": claim_name}]
            rid = f"{DRIVER}/{node}/{device}"
            status["containerStatuses"] = [
                {
                    "name": "main",
                    "ready": running,
                    "restartCount": 0,
                    "allocatedResourcesStatus": [
                        {
                            "name": "claim:gpu",
                            "resources": [{"resourceID": rid, "health": "Healthy"}],
                        }
                    ],
                }
            ]
        elif gpu_uuid:
            status["containerStatuses"] = [
                {
                    "name": "main",
                    "ready": running,
                    "restartCount": 0,
                    "allocatedResourcesStatus": [
                        {
                            "name": resource,
                            "resources": [{"resourceID": gpu_uuid, "health": "Healthy"}],
                        }
                    ],
                }
            ]
        return self.store.mutate(
            "pods", name, lambda p: p.update(status=status), namespace=ns, subresource="status"
        )

    def deployment_owner(self, ns: str, name: str, replicas: int = 1) -> dict[str, Any]:
        """Deployment + ReplicaSet (no controllers): returns the ownerReference for pods."""
        self.namespace(ns)
        selector = {"matchLabels": {"app": name}}
        template = {
            "metadata": {"labels": {"app": name}},
            "spec": {"containers": [{"name": "main", "image": "cuda:12"}]},
        }
        dep = self.store.create(
            "deployments.apps",
            {
                "metadata": {"name": name, "namespace": ns},
                "spec": {"replicas": replicas, "selector": selector, "template": template},
            },
            namespace=ns,
        )
        rs = self.store.create(
            "replicasets.apps",
            {
                "metadata": {
                    "name": f"{name}-7d9c",
                    "namespace": ns,
                    "labels": {"app": name},
                    "ownerReferences": [
                        {
                            "apiVersion": "apps/v1",
                            "kind": "Deployment",
                            "name": name,
                            "uid": dep["metadata"]["uid"],
                            "controller": True,
                        }
                    ],
                },
                "spec": {"replicas": replicas, "selector": selector, "template": template},
            },
            namespace=ns,
        )
        return {
            "apiVersion": "apps/v1",
            "kind": "ReplicaSet",
            "name": rs["metadata"]["name"],
            "uid": rs["metadata"]["uid"],
            "controller": True,
        }

    def job_owner(self, ns: str, name: str) -> dict[str, Any]:
        self.namespace(ns)
        job = self.store.create(
            "jobs.batch",
            {
                "metadata": {"name": name, "namespace": ns},
                "spec": {
                    "template": {
                        "metadata": {"labels": {"job-name": name}},
                        "spec": {
                            "restartPolicy": "Never",
                            "containers": [{"name": "main", "image": "cuda:12"}],
                        },
                    },
                },
            },
            namespace=ns,
        )
        return {
            "apiVersion": "batch/v1",
            "kind": "Job",
            "name": name,
            "uid": job["metadata"]["uid"],
            "controller": True,
        }


@contextlib.contextmanager
def twin(
    tmp_path: Path,
    profile: str,
    *,
    token: str | None = None,
    kube_token: str | None = None,
    controllers: Any = None,
    clock: Any = None,
    proxy_rules: list[dict[str, Any]] | None = None,
    **seed: Any,
) -> Iterator[KubeTwin]:
    """A running twin (+ controllers if given); with `proxy_rules`, the activities reach it
    through an RBAC-enforcing proxy holding those ClusterRole rules."""
    twin = Twin(profile=profile, token=token, clock=clock)
    seed.setdefault("nodes", 2)
    seed.setdefault("gpus_per_node", 2)
    twin.seed(**seed)
    for ns in DEPLOYED_NAMESPACES:  # as `kubectl apply -k deploy/` leaves them
        twin.store.create("namespaces", ns)
    if controllers is not None:
        twin.add_controller(controllers)
    twin.start()
    path = twin.write_kubeconfig(tmp_path / f"kubeconfig-{uuid.uuid4().hex[:6]}", token=kube_token)
    with contextlib.ExitStack() as stack:
        proxy = None
        if proxy_rules is not None:
            proxy = stack.enter_context(RbacProxy(twin.url, proxy_rules, roles=ROLES))
            config = yaml.safe_load(path.read_text())
            config["clusters"][0]["cluster"]["server"] = proxy.url
            path.write_text(yaml.safe_dump(config))
        acts = KubeActivities(
            KubeSettings(kubeconfig=str(path), request_timeout=5.0, max_threads=8)
        )
        try:
            yield KubeTwin(twin=twin, acts=acts, kubeconfig=path, proxy=proxy)
        finally:
            acts.close()
            twin.stop()


@pytest.fixture(params=PROFILES)
def cluster(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[KubeTwin]:
    with twin(tmp_path, request.param) as t:
        yield t


# A worker's repair allowlist (SICKBAY_REPAIR_ALLOWLIST): images pinned by digest, naming
# nothing real (the twin runs no image).
REPAIR_ALLOWLIST_ENV = (
    '{"reset": {"images": ["registry.invalid/ops/nvidia-smi@sha256:' + "d" * 64 + '"]},'
    ' "validation": {"images": ["registry.invalid/ops/dcgm@sha256:' + "e" * 64 + '"]}}'
)


@pytest.fixture
def repair_allowlist_env(monkeypatch: pytest.MonkeyPatch) -> None:
    """`sickbay doctor` as configured for the shipped runbooks (they repair): an allowlist."""
    monkeypatch.setenv("SICKBAY_REPAIR_ALLOWLIST", REPAIR_ALLOWLIST_ENV)
