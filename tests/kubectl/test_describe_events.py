"""Sickbay's Events as people read them, with the real kubectl against the twin.

Cases: an Event Sickbay writes about a node and a pod (targets named without their uid, as the
remediation names the node) shows under `kubectl describe node` and `kubectl describe pod`
(which list Events with the field selector `involvedObject.uid=...` plus name, namespace and
kind: an Event without the uid is missing there, on a real cluster too); `kubectl drain
--dry-run=server` (an Eviction whose body says `dryRun: ["All"]`) evicts nothing.
"""

from __future__ import annotations

from kubernetes import config

from activities.kube.client import Kube
from activities.kube.events import record_events
from contract.kube import EventTarget, RecordEventInput
from tests.kubectl.conftest import Kubectl
from twin.runtime import Twin

WAIT = 60  # seconds; kubectl's own --timeout for rollouts on a busy machine


def _kube(twin: Twin, kubectl: Kubectl) -> Kube:
    client = config.new_client_from_config(kubectl.env["KUBECONFIG"])  # type: ignore[attr-defined]
    return Kube(client)


def test_sickbay_events_show_in_kubectl_describe(kubectl: Kubectl, twin: Twin, ns: str) -> None:
    kubectl("run", "trainer", "-n", ns, "--image=registry.invalid/train:1")
    node = "gpu-pool-node-0"
    record_events(
        _kube(twin, kubectl),
        RecordEventInput(
            targets=[
                EventTarget(api_version="v1", kind="Node", name=node),
                EventTarget(api_version="v1", kind="Pod", name="trainer", namespace=ns),
            ],
            reason="GPUQuarantined",
            message="GPU gpu-0 quarantined: Xid 79",
            type="Warning",
            workflow_id="sickbay-gpu-describe-test",
        ),
        token="describe-test",
    )
    described_node = kubectl("describe", "node", node).stdout
    assert "GPUQuarantined" in described_node, described_node[-2000:]
    assert "GPU gpu-0 quarantined: Xid 79" in described_node
    described_pod = kubectl("describe", "pod", "trainer", "-n", ns).stdout
    assert "GPUQuarantined" in described_pod, described_pod[-2000:]


def test_drain_dry_run_server_evicts_nothing(kubectl: Kubectl, twin: Twin, ns: str) -> None:
    kubectl("create", "deployment", "keep", "-n", ns, "--image=nginx:1.27", "--replicas=2")
    kubectl("rollout", "status", "deployment/keep", "-n", ns, f"--timeout={WAIT}s")
    pods = kubectl("get", "pods", "-n", ns, "-l", "app=keep", "-o", "name").stdout.split()
    nodes = {kubectl("get", p, "-n", ns, "-o", "jsonpath={.spec.nodeName}").stdout for p in pods}
    for node in sorted(nodes):
        try:
            done = kubectl(
                "drain", node, "--dry-run=server", "--ignore-daemonsets",
                "--pod-selector", "app=keep", f"--timeout={WAIT}s",
            )  # fmt: skip
            assert "(server dry run)" in done.stdout + done.stderr
        finally:
            kubectl("uncordon", node)
    after = kubectl("get", "pods", "-n", ns, "-l", "app=keep", "-o", "name").stdout.split()
    assert sorted(after) == sorted(pods)
    for p in after:
        stamp = kubectl("get", p, "-n", ns, "-o", "jsonpath={.metadata.deletionTimestamp}")
        assert stamp.stdout == ""
