"""deploy/ as a user installs it, run as the applied objects say, against the cluster twin.

The twin serves TLS (a throwaway CA) and authenticates bearer tokens as a real API server:
an admin token for the user, ServiceAccount tokens minted through TokenRequest for the pods.
The user's steps, with the real kubectl: `kubectl apply -k deploy/ --server-side`, the
webhook token Secret created as docs/deploy.md says, Temporal installed in the cluster under
the Service name the shipped settings use. Then a test kubelet (tests/deploy/kubelet.py) runs
the Pod that each shipped Deployment made, read back from the API (not from the files): its
command and args (the image's entrypoint), env and envFrom, its ConfigMap, Secret and
emptyDir volumes at their mount paths, the projected ServiceAccount token with the cluster CA
and the in-cluster variables (KUBERNETES_SERVICE_HOST/PORT, as the `kubernetes` Service says),
Service DNS names and ClusterIPs, its user, group and read-only root. No setting is added.

Cases:
- `kubectl diff -k deploy/ --server-side` finds nothing to change; the runbooks ConfigMap holds
  runbooks/*.yaml byte for byte;
- both pods start; every httpGet probe (startup, readiness, liveness) answers 200 at its path
  and port on the running process; the worker polls Temporal and records the cluster name;
- an Alertmanager notification, sent as deploy/alertmanager.yaml configures it (to the
  webhook Service's URL, resolved through the Service's targetPort to the pod, with the token
  from the Secret's file) -> the worker, as ServiceAccount `sickbay`, quarantines the GPU (a
  DeviceTaintRule), the workload's pod is evicted and its replacement runs on another GPU; the
  API answered the worker no 401 and no 403;
- closed-loop repair (the shipped runbooks' ladder, from the runbooks ConfigMap): Xid 48 ->
  reset Job -> validation Job -> released, nobody acting.

Drift between deploy/ and the code (a renamed variable, a missing mount or key, a port, a
probe path, a missing grant) fails here: the processes get nothing the manifests do not say.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import secrets
import subprocess
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar
from urllib.parse import urlsplit

import httpx
import pytest
import yaml

from contract.names import (
    CLUSTER_CONFIGMAP,
    LABEL_MANAGED_BY,
    MANAGED_BY_VALUE,
    REPAIR_NAMESPACE,
    device_workflow_id,
)
from harness.stack import TWIN_REPAIR_ALLOWLIST
from tests.deploy.helpers import DEPLOY, kubectl_or_skip
from tests.deploy.kubelet import SA_DIR, Api, Backend, Kubelet, Pod

T = TypeVar("T")
NAMESPACE = "sickbay"
# The twin's controllers (pod start-up, eviction grace, Alertmanager's group_wait) run ten
# times faster than the wall clock; Sickbay's own timers are real.
TIME_SCALE = 10.0
# Start-up bound for a pod: imports, runbook validation, the Temporal connection take a few
# seconds; 60 s leaves room on a loaded 2-core machine without hiding a hang.
START_WITHIN = 60.0
# One remediation step (alert -> rule, eviction -> replacement): seconds here; the bound allows
# for a loaded machine.
STEP_WITHIN = 90.0
# The repair ladder: drain, reset Job, validation Job, each polled every few seconds.
REPAIR_WITHIN = 180.0
RESOURCE_API = "/apis/resource.k8s.io/v1"


def _until(what: str, probe: Callable[[], T | None], within: float, pods: list[Pod]) -> T:
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        for pod in pods:
            if pod.process.poll() is not None:
                pytest.fail(
                    f"pod {pod.name} exited {pod.process.returncode}:\n{pod.output()[-4000:]}"
                )
        value = probe()
        if value:
            return value
        time.sleep(0.2)
    logs = "\n".join(f"--- {p.name}\n{p.output()[-3000:]}" for p in pods)
    pytest.fail(f"{what}: not within {within:g} s\n{logs}")


@dataclass
class Applied:
    twin: Any
    api: Api
    kubectl: Callable[..., subprocess.CompletedProcess[str]]
    pods: dict[str, Pod]  # Deployment name -> its running pod
    temporal_address: str
    temporal_namespace: str

    def http(self) -> httpx.Client:
        return self.api.client()

    def twin_call(self, method: str, path: str, body: Any = None) -> Any:
        with self.http() as c:
            answer = c.request(method, path, json=body)
        assert answer.status_code < 300, f"{method} {path}: {answer.text}"
        return answer.json()

    def cluster(self) -> str:
        got = self.api.get(f"/api/v1/namespaces/{NAMESPACE}/configmaps/{CLUSTER_CONFIGMAP}")
        assert got is not None
        return str(got["data"]["name"])

    def until(self, what: str, probe: Callable[[], T | None], within: float = STEP_WITHIN) -> T:
        return _until(what, probe, within, list(self.pods.values()))

    def temporal(self, work: Callable[[Any], Any]) -> Any:
        async def run() -> Any:
            from temporalio.client import Client

            from worker.converter import DATA_CONVERTER

            client = await Client.connect(
                self.temporal_address,
                namespace=self.temporal_namespace,
                data_converter=DATA_CONVERTER,
            )
            return await work(client)

        return asyncio.run(run())


def _kubectl(path: str, kubeconfig: Path, home: Path) -> Callable[..., Any]:
    env = {"PATH": "/usr/bin:/bin", "HOME": str(home), "KUBECONFIG": str(kubeconfig)}

    def run(*args: str, ok_codes: tuple[int, ...] = (0,)) -> subprocess.CompletedProcess[str]:
        done = subprocess.run([path, *args], capture_output=True, text=True, env=env, timeout=120)
        assert done.returncode in ok_codes, f"kubectl {' '.join(args)}:\n{done.stderr}{done.stdout}"
        return done

    return run


def _pod_of(api: Api, deployment: dict[str, Any]) -> dict[str, Any] | None:
    labels = deployment["spec"]["selector"]["matchLabels"]
    selector = ",".join(f"{k}={v}" for k, v in labels.items())
    listed = api.get(f"/api/v1/namespaces/{NAMESPACE}/pods?labelSelector={selector}") or {}
    pods = [p for p in listed.get("items", []) if not p["metadata"].get("deletionTimestamp")]
    return pods[0] if pods else None


def _probe_answers(pod: Pod, probe: dict[str, Any]) -> bool:
    get = probe["httpGet"]
    assert get.get("scheme", "HTTP") == "HTTP"
    try:
        url = f"http://127.0.0.1:{pod.port(get['port'])}{get.get('path', '/')}"
        return httpx.get(url, timeout=probe.get("timeoutSeconds", 1)).status_code == 200
    except httpx.TransportError:
        return False


def _alertmanager_receiver() -> tuple[str, str, str]:
    """deploy/alertmanager.yaml's sickbay receiver: (url, credentials file, group_wait)."""
    config = yaml.safe_load((DEPLOY / "alertmanager.yaml").read_text())
    (receiver,) = [r for r in config["receivers"] if r["name"] == "sickbay"]
    (hook,) = receiver["webhook_configs"]
    (route,) = [r for r in config["route"]["routes"] if r["receiver"] == "sickbay"]
    credentials = hook["http_config"]["authorization"]["credentials_file"]
    return hook["url"], credentials, route["group_wait"]


def _service_endpoint(applied: Applied, url: str) -> str:
    """The URL Alertmanager posts to, resolved as the cluster would: Service name and port ->
    targetPort -> the selected pod's container port (here, its host bridge)."""
    parts = urlsplit(url)
    host = parts.hostname or ""
    name, namespace = host.split(".")[:2]
    service = applied.api.get(f"/api/v1/namespaces/{namespace}/services/{name}")
    assert service is not None, f"{url}: no Service {namespace}/{name}"
    (port,) = [p for p in service["spec"]["ports"] if p["port"] == parts.port]
    selected = [
        d
        for d, pod in applied.pods.items()
        if service["spec"]["selector"].items()
        <= (applied.api.get(f"/api/v1/namespaces/{namespace}/pods/{pod.name}") or {})["metadata"][
            "labels"
        ].items()
    ]
    assert selected, f"Service {name} selects none of the running pods"
    target = port.get("targetPort", port["port"])
    return f"http://127.0.0.1:{applied.pods[selected[0]].port(target)}{parts.path}"


@pytest.fixture(scope="module")
def applied(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Applied]:
    kubectl_path = kubectl_or_skip()
    from twin.clock import Clock
    from twin.controllers.manager import ControllerManager, TwinOptions
    from twin.runtime import Twin
    from twin.tls import throwaway_pki

    dev = request.getfixturevalue("own_dev_server")
    temporal = dev.client.service_client.config.target_host
    directory = tmp_path_factory.mktemp("applied")
    pki = throwaway_pki(
        dns=[
            "kubernetes",
            "kubernetes.default",
            "kubernetes.default.svc",
            "kubernetes.default.svc.cluster.local",
            "localhost",
        ],
        ips=["127.0.0.1", "10.96.0.1"],
    )
    ca_file = directory / "ca.crt"
    ca_file.write_bytes(pki.ca_pem)
    admin = secrets.token_hex(16)
    twin = Twin(profile="1.36", token=admin, tls=pki, clock=Clock(time_scale=TIME_SCALE))
    twin.seed(nodes=2, gpus_per_node=2)
    twin.add_controller(ControllerManager(TwinOptions()))
    twin.start()
    with contextlib.ExitStack() as stack:
        stack.callback(twin.stop)
        api = Api(twin.url, admin, str(ca_file))
        kubectl = _kubectl(kubectl_path, twin.write_kubeconfig(directory / "kubeconfig"), directory)
        # 1. as docs/deploy.md: the namespace, the webhook token Secret, then the kustomization.
        kubectl("apply", "--server-side", "-f", str(DEPLOY / "namespace.yaml"))
        token_file = directory / "webhook-token"
        token_file.write_text(secrets.token_hex(32) + "\n")
        kubectl(
            "-n",
            NAMESPACE,
            "create",
            "secret",
            "generic",
            "sickbay-webhook-token",
            f"--from-file=token={token_file}",
        )
        kubectl("apply", "-k", str(DEPLOY), "--server-side")
        # A trial install without escalation channels or node-pool credentials: the worker
        # starts degraded, as deploy/configmap.yaml's comment says (else it refuses to start).
        kubectl(
            "-n",
            NAMESPACE,
            "patch",
            "configmap",
            "sickbay-config",
            "--type=merge",
            "-p",
            '{"data": {"SICKBAY_ALLOW_UNCONFIGURED_INTEGRATIONS": "true"}}',
        )
        # The repair images, pinned by digest, as the operator allowlists them there
        # (deploy/configmap.yaml's comment; the twin runs no image, the digests are the stack's).
        allowlist = json.dumps(
            {"data": {"SICKBAY_REPAIR_ALLOWLIST": json.dumps(TWIN_REPAIR_ALLOWLIST)}}
        )
        kubectl(
            "-n", NAMESPACE, "patch", "configmap", "sickbay-config", "--type=merge", "-p", allowlist
        )
        # 2. Temporal in the cluster, where the applied settings say it is.
        config = api.get(f"/api/v1/namespaces/{NAMESPACE}/configmaps/sickbay-config")
        assert config is not None
        host, _, port = config["data"]["SICKBAY_TEMPORAL_ADDRESS"].rpartition(":")
        service, temporal_ns = host.split(".")[:2]
        kubectl("create", "namespace", temporal_ns)
        kubectl(
            "-n", temporal_ns, "create", "service", "clusterip", service, f"--tcp={port}:{port}"
        )
        dev_host, _, dev_port = temporal.rpartition(":")
        kubelet = Kubelet(
            api,
            pki.ca_pem,
            [
                Backend("default", "kubernetes", "127.0.0.1", twin.port),
                Backend(temporal_ns, service, dev_host, int(dev_port)),
            ],
            directory,
        )
        stack.callback(kubelet.stop)
        # 3. each shipped Deployment's pod, as the API has it.
        deployments = api.get(f"/apis/apps/v1/namespaces/{NAMESPACE}/deployments") or {}
        names = sorted(d["metadata"]["name"] for d in deployments["items"])
        assert names == ["sickbay-webhook", "sickbay-worker"], names
        pods: dict[str, Pod] = {}
        for deployment in deployments["items"]:
            pod = _until("the Deployment's pod", lambda d=deployment: _pod_of(api, d), 60, [])
            pods[deployment["metadata"]["name"]] = kubelet.start(pod)
        yield Applied(
            twin, api, kubectl, pods, temporal, config["data"]["SICKBAY_TEMPORAL_NAMESPACE"]
        )


def test_the_cluster_holds_what_deploy_says(applied: Applied) -> None:
    """Server-side apply stored the files' content: `kubectl diff --server-side` finds
    nothing, and the runbooks the worker mounts are runbooks/*.yaml byte for byte."""
    done = applied.kubectl("diff", "-k", str(DEPLOY), "--server-side", ok_codes=(0, 1))
    assert done.returncode == 0, f"the applied objects differ from deploy/:\n{done.stdout}"
    runbooks = applied.api.get(f"/api/v1/namespaces/{NAMESPACE}/configmaps/sickbay-runbooks")
    assert runbooks is not None
    shipped = {p.name: p.read_bytes() for p in (DEPLOY.parent / "runbooks").glob("*.yaml")}
    assert {k: v.encode() for k, v in runbooks["data"].items()} == shipped


def _ready(applied: Applied) -> None:
    """Every httpGet probe of every pod answers 200 at its path and port, and the worker
    polls Temporal."""
    for name, pod in applied.pods.items():
        (container,) = pod.spec["containers"]
        probes = [
            container[p]
            for p in ("startupProbe", "readinessProbe", "livenessProbe")
            if p in container
        ]
        assert probes, f"{name} has no probes"
        for probe in probes:
            applied.until(
                f"{name}: probe {probe['httpGet']}",
                lambda pod=pod, probe=probe: _probe_answers(pod, probe),
                START_WITHIN,
            )
    worker = applied.pods["sickbay-worker"]
    applied.until("the worker polling", lambda: "worker polling" in worker.output(), START_WITHIN)


def test_pods_start_and_answer_their_probes(applied: Applied) -> None:
    _ready(applied)
    worker = applied.pods["sickbay-worker"]
    # The worker recorded the cluster's name as ServiceAccount sickbay (rbac.yaml's grant).
    assert applied.cluster().startswith("k-")
    # What the kubelet gave it, and nothing of this machine's: the in-cluster variables.
    assert worker.env["KUBERNETES_SERVICE_HOST"] == "10.96.0.1"
    assert worker.env["KUBERNETES_SERVICE_PORT"] == "443"
    assert sorted(worker.files[SA_DIR]) == ["ca.crt", "namespace", "token"]
    # The webhook runs without an API token (automountServiceAccountToken: false).
    assert SA_DIR not in applied.pods["sickbay-webhook"].files
    # Both run as the pod's user and groups (runAsUser, runAsGroup, fsGroup), never root.
    import psutil

    for pod in applied.pods.values():
        (container,) = psutil.Process(pod.process.pid).children()
        security = pod.spec["securityContext"]
        assert container.uids().effective == security["runAsUser"] != 0
        assert container.gids().effective == security["runAsGroup"]
        status = Path(f"/proc/{container.pid}/status").read_text()
        groups = next(ln for ln in status.splitlines() if ln.startswith("Groups:"))
        assert str(security["fsGroup"]) in groups.split()[1:]


def _workload(applied: Applied, namespace: str, app: str) -> tuple[dict[str, Any], str]:
    """A one-replica Deployment holding one GPU through a DRA claim; (pod, device)."""
    applied.twin_call("POST", "/api/v1/namespaces", {"metadata": {"name": namespace}})
    applied.twin_call(
        "POST",
        f"{RESOURCE_API}/namespaces/{namespace}/resourceclaimtemplates",
        {
            "apiVersion": "resource.k8s.io/v1",
            "kind": "ResourceClaimTemplate",
            "metadata": {"name": "one-gpu"},
            "spec": {
                "spec": {
                    "devices": {
                        "requests": [
                            {"name": "gpu", "exactly": {"deviceClassName": "gpu.nvidia.com"}}
                        ]
                    }
                }
            },
        },
    )
    applied.twin_call(
        "POST",
        f"/apis/apps/v1/namespaces/{namespace}/deployments",
        {
            "apiVersion": "apps/v1",
            "kind": "Deployment",
            "metadata": {"name": app},
            "spec": {
                "replicas": 1,
                "selector": {"matchLabels": {"app": app}},
                "template": {
                    "metadata": {"labels": {"app": app}},
                    "spec": {
                        "containers": [
                            {
                                "name": "main",
                                "image": f"registry.invalid/{app}:1",
                                "resources": {"claims": [{"name": "gpu"}]},
                            }
                        ],
                        "resourceClaims": [{"name": "gpu", "resourceClaimTemplateName": "one-gpu"}],
                    },
                },
            },
        },
    )
    return applied.until(f"{namespace}/{app} running", lambda: _running(applied, namespace, app))


def _running(applied: Applied, namespace: str, app: str) -> tuple[dict[str, Any], str] | None:
    pods = applied.twin_call(
        "GET", f"/api/v1/namespaces/{namespace}/pods?labelSelector=app%3D{app}"
    )
    for pod in pods["items"]:
        status = pod.get("status") or {}
        if pod["metadata"].get("deletionTimestamp") or status.get("phase") != "Running":
            continue
        for entry in status.get("resourceClaimStatuses") or []:
            claim = applied.twin_call(
                "GET",
                f"{RESOURCE_API}/namespaces/{namespace}/resourceclaims/{entry['resourceClaimName']}",
            )
            for result in claim["status"]["allocation"]["devices"]["results"]:
                return pod, f"{result['driver']}/{result['pool']}/{result['device']}"
    return None


def _gpu(applied: Applied, device: str) -> dict[str, Any]:
    for gpu in applied.twin_call("GET", "/twin/gpus")["items"]:
        if any(d["resourceID"] == device for d in gpu["devices"]):
            return dict(gpu)
    raise AssertionError(f"no GPU holds {device}")


def _managed_rules(applied: Applied) -> list[dict[str, Any]]:
    listed = applied.twin_call(
        "GET",
        f"/apis/resource.k8s.io/v1beta2/devicetaintrules?labelSelector={LABEL_MANAGED_BY}%3D{MANAGED_BY_VALUE}",
    )
    return list(listed["items"])


def _deliver_alerts_as_shipped(applied: Applied) -> None:
    """The twin's Alertmanager, configured as deploy/alertmanager.yaml: the webhook Service's
    URL, the token file's content (the Secret the user created, read back), its group_wait."""
    url, credentials, group_wait = _alertmanager_receiver()
    secret_name = Path(credentials).parent.name
    secret = applied.api.get(f"/api/v1/namespaces/{NAMESPACE}/secrets/{secret_name}")
    assert secret is not None, f"Alertmanager reads {credentials}: no Secret {secret_name}"
    token = base64.b64decode(secret["data"][Path(credentials).name]).decode().strip()
    from contract.base import parse_duration

    applied.twin_call(
        "PUT",
        "/twin/alerts",
        {
            "url": _service_endpoint(applied, url),
            "token": token,
            "groupWait": parse_duration(group_wait).total_seconds(),
        },
    )


def test_alert_quarantine_replacement(applied: Applied) -> None:
    _ready(applied)
    _deliver_alerts_as_shipped(applied)
    pod, device = _workload(applied, "serving", "api")
    gpu = _gpu(applied, device)
    # Xid 74 (NVLink): degraded, quarantined by the shipped default runbook; no repair rung
    # takes it, so the GPU is held for a person.
    applied.twin_call("POST", "/twin/faults", {"node": gpu["node"], "gpu": gpu["uuid"], "xid": 74})

    def rule() -> dict[str, Any] | None:
        rules = [
            r
            for r in _managed_rules(applied)
            if "/".join(
                r["spec"]["deviceSelector"].get(k, "") for k in ("driver", "pool", "device")
            )
            == device
        ]
        return rules[0] if rules else None

    quarantine = applied.until("a DeviceTaintRule on the failed GPU", rule)
    assert quarantine["spec"]["taint"]["effect"] == "NoExecute"

    # The notification reached the webhook through its Service and was accepted (2xx): the
    # token from the Secret, the port, the path are the ones deploy/ ships.
    def accepted() -> bool:
        sent = applied.twin_call("GET", "/twin/alerts")["sent"]
        return any(a["labels"].get("UUID") == gpu["uuid"] for p in sent for a in p["alerts"])

    applied.until("Alertmanager's notification accepted by the webhook", accepted)

    def replaced() -> tuple[dict[str, Any], str] | None:
        found = _running(applied, "serving", "api")
        if found and found[0]["metadata"]["uid"] != pod["metadata"]["uid"]:
            return found
        return None

    replacement, new_device = applied.until("the replacement pod running", replaced)
    assert new_device != device
    # The worker did all of it as its ServiceAccount, with exactly what deploy/ grants.
    assert not applied.twin.requests.entries(status=401)
    assert not applied.twin.requests.entries(status=403), [
        (r.verb, r.resource, r.namespace) for r in applied.twin.requests.entries(status=403)
    ]
    # A person fixes the GPU (its fault clears, the alert resolves) and marks it repaired:
    # the quarantine is lifted.
    applied.twin_call("POST", "/twin/faults/recover", {"node": gpu["node"], "gpu": gpu["uuid"]})
    workflow_id = device_workflow_id(gpu["node"], gpu["uuid"], applied.cluster())

    async def repaired(client: Any) -> None:
        from contract.remediation import RepairedRequest
        from workflows.remediation import DeviceRemediationWorkflow

        await client.get_workflow_handle(workflow_id).signal(
            DeviceRemediationWorkflow.repaired, RepairedRequest(actor="tests/deploy")
        )

    applied.temporal(repaired)
    applied.until("the rule lifted", lambda: rule() is None)
    result = applied.until("the remediation closed", lambda: applied.temporal(_closed(workflow_id)))
    # No rung repairs an NVLink fault: the ladder escalated, then the person released it.
    assert result.outcome == "escalated", result.reason
    assert "released: repaired (tests/deploy" in result.reason, result.reason


def _run_id(workflow_id: str) -> Callable[[Any], Any]:
    """Temporal work: the latest run of the workflow id, or "" (never run)."""

    async def latest(client: Any) -> str:
        from temporalio.service import RPCError

        try:
            return str((await client.get_workflow_handle(workflow_id).describe()).run_id)
        except RPCError:
            return ""

    return latest


def _closed(workflow_id: str, earlier_run: str = "") -> Callable[[Any], Any]:
    """Temporal work: the remediation's result once a run other than `earlier_run` (a GPU
    keeps its workflow id across incidents) has closed, else None."""

    async def closed(client: Any) -> Any:
        from temporalio.client import WorkflowExecutionStatus
        from temporalio.service import RPCError

        from contract.remediation import RemediationResult

        handle = client.get_workflow_handle(workflow_id, result_type=RemediationResult)
        try:
            described = await handle.describe()
        except RPCError:
            return None
        if described.run_id == earlier_run or described.status == WorkflowExecutionStatus.RUNNING:
            return None
        return await handle.result()

    return closed


def test_closed_loop_repair_to_validated_release(applied: Applied) -> None:
    """Repair and validation Jobs go where deploy/ lets the worker create them (Role
    sickbay-repair, namespace sickbay on this branch)."""
    _ready(applied)
    _deliver_alerts_as_shipped(applied)
    _pod, device = _workload(applied, "training", "trainer")
    gpu = _gpu(applied, device)
    workflow_id = device_workflow_id(gpu["node"], gpu["uuid"], applied.cluster())
    earlier = applied.temporal(_run_id(workflow_id))
    applied.twin_call("POST", "/twin/faults", {"node": gpu["node"], "gpu": gpu["uuid"], "xid": 48})

    result = applied.until(
        "the remediation closed",
        lambda: applied.temporal(_closed(workflow_id, earlier)),
        REPAIR_WITHIN,
    )
    assert result.outcome == "released", result.reason
    assert "reset repaired it" in result.reason, result.reason
    assert not [e for e in result.timeline if e.action in ("marked repaired", "approved")]
    # The reset and validation Jobs (cleaned up since) were created where deploy/ grants it: the
    # repair namespace, whose Pod Security level (the twin enforces it) admitted their pods.
    created = applied.twin.requests.entries(verb="create", resource="jobs", status=201)
    assert {r.namespace for r in created} == {REPAIR_NAMESPACE}, created
    assert len(created) >= 2, "a reset Job and a validation Job"
    assert not applied.twin.requests.entries(status=403)
