"""kubectl against the twin's auth reviews, node Leases and heartbeats, logs and Services.

Cases: `auth can-i` (SelfSubjectAccessReview; `--list` via SelfSubjectRulesReview; `--as` a
service account answered from deploy/rbac.yaml's role), `auth whoami` (SelfSubjectReview),
`describe node` (its Lease, real heartbeats), `get leases`, `logs` of a Deployment's pod,
`cluster-info` and the `kubernetes` Service, `create token` (TokenRequest; the token is its
service account).
"""

from __future__ import annotations

import re
from pathlib import Path

from tests.kubectl.conftest import Kubectl
from tests.kubectl.test_kubectl import WAIT, header, row
from twin.runtime import Twin

DEPLOY = Path(__file__).resolve().parents[2] / "deploy"

# ---- auth --------------------------------------------------------------------------------


def test_auth_can_i_and_whoami(kubectl: Kubectl) -> None:
    assert kubectl("auth", "can-i", "get", "pods").stdout.strip() == "yes"
    assert (
        kubectl("auth", "can-i", "create", "devicetaintrules.resource.k8s.io").stdout.strip()
        == "yes"
    )
    listed = kubectl("auth", "can-i", "--list").stdout
    assert header(listed) == ["Resources", "Non-Resource URLs", "Resource Names", "Verbs"]
    assert row(listed, "*.*")[-1] == "[*]"
    who = kubectl("auth", "whoami").stdout
    assert row(who, "Username")[1] == "system:anonymous"


def test_impersonated_service_account_gets_the_rbac_answer(kubectl: Kubectl) -> None:
    sa = "system:serviceaccount:sickbay:sickbay"
    before = kubectl(
        "auth", "can-i", "create", "pods", "--subresource=eviction", "--as", sa, ok=False
    )
    assert before.returncode == 1 and before.stdout.strip() == "no"
    denied = kubectl("get", "pods", "-n", "default", "--as", sa, ok=False)
    assert denied.stderr.strip() == (
        'Error from server (Forbidden): pods is forbidden: User "system:serviceaccount:sickbay:'
        'sickbay" cannot list resource "pods" in API group "" in the namespace "default"'
    )
    # rbac.yaml's health-watcher Role lives in Sickbay's namespace: create it first, as
    # `kubectl apply -k deploy/` does (namespace.yaml comes first there).
    kubectl("apply", "-f", str(DEPLOY / "namespace.yaml"))
    applied = kubectl("apply", "-f", str(DEPLOY / "rbac.yaml")).stdout
    assert "clusterrole.rbac.authorization.k8s.io/sickbay created" in applied
    assert "clusterrolebinding.rbac.authorization.k8s.io/sickbay created" in applied
    assert "role.rbac.authorization.k8s.io/sickbay-health-watcher created" in applied
    lease = kubectl("auth", "can-i", "update", "leases", "--as", sa, "-n", "sickbay")
    assert lease.stdout.strip() == "yes"
    yes = kubectl(
        "auth", "can-i", "create", "pods", "--subresource=eviction", "--as", sa, "-n", "serving"
    )
    assert yes.stdout.strip() == "yes"
    no = kubectl("auth", "can-i", "delete", "nodes", "--as", sa, ok=False)
    assert no.returncode == 1 and no.stdout.strip() == "no"
    who = kubectl("auth", "whoami", "--as", sa).stdout
    assert row(who, "Username")[1] == sa
    listed = kubectl("auth", "can-i", "--list", "--as", sa, "-n", "serving").stdout
    assert row(listed, "devicetaintrules.resource.k8s.io")[-1] == (
        "[get list watch create update delete]"
    )
    assert kubectl("get", "pods", "-n", "default", "--as", sa).returncode == 0


# ---- nodes, logs, services ---------------------------------------------------------------


def test_describe_node_shows_its_lease_and_heartbeats(kubectl: Kubectl) -> None:
    out = kubectl("describe", "node", "gpu-pool-node-0").stdout
    assert "Failed to get lease" not in out
    assert re.search(r"HolderIdentity:\s+gpu-pool-node-0", out)
    assert "0001" not in out
    leases = kubectl("get", "leases", "-n", "kube-node-lease").stdout
    assert header(leases) == ["NAME", "HOLDER", "AGE"]
    assert row(leases, "gpu-pool-node-0")[1] == "gpu-pool-node-0"


def test_logs_cluster_info_and_services(kubectl: Kubectl, ns: str) -> None:
    kubectl("create", "deployment", "logger", "-n", ns, "--image=busybox:1.36")
    kubectl("rollout", "status", "deployment/logger", "-n", ns, f"--timeout={int(WAIT)}s")
    logs = kubectl("logs", "deployment/logger", "-n", ns).stdout
    # The twin's container log: kubectl named the container after its image.
    assert "container busybox started (image busybox:1.36)" in logs, logs
    info = kubectl("cluster-info").stdout
    assert "Kubernetes control plane" in info and "is running at" in info
    svc = kubectl("get", "services", "-n", "default").stdout
    assert header(svc) == ["NAME", "TYPE", "CLUSTER-IP", "EXTERNAL-IP", "PORT(S)", "AGE"]
    assert row(svc, "kubernetes")[1:5] == ["ClusterIP", "10.96.0.1", "<none>", "443/TCP"]


def test_create_token_mints_a_service_account_token(kubectl: Kubectl, twin: Twin, ns: str) -> None:
    """`kubectl create token` (a protobuf TokenRequest): the token authenticates as the
    account, which gets what RBAC grants it and nothing else."""
    import httpx

    kubectl("create", "serviceaccount", "minted", "-n", ns)
    token = kubectl("create", "token", "minted", "-n", ns, "--duration=20m").stdout.strip()
    assert token
    headers = {"Authorization": f"Bearer {token}"}
    with httpx.Client(base_url=twin.url, headers=headers, timeout=10) as http:
        review = http.post(
            "/apis/authentication.k8s.io/v1/selfsubjectreviews",
            json={"apiVersion": "authentication.k8s.io/v1", "kind": "SelfSubjectReview"},
        )
        assert review.json()["status"]["userInfo"]["username"] == (
            f"system:serviceaccount:{ns}:minted"
        )
        assert http.get(f"/api/v1/namespaces/{ns}/pods").status_code == 403
    short = kubectl("create", "token", "minted", "-n", ns, "--duration=1m", ok=False)
    assert (
        short.returncode == 1 and "may not specify a duration less than 10 minutes" in short.stderr
    )
