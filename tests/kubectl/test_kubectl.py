"""kubectl v1.32, unmodified, against the cluster twin: what an SRE types on day one.

Cases, one per row of what used to fail, asserting on kubectl's own output:
- `apply -f` with default (strict) validation, `apply --server-side`, `diff`, `explain`
  (OpenAPI v3 served per group-version);
- `create namespace|configmap|deployment|secret|...`, `run` (kubectl sends protobuf bodies);
- server-side printing: nodes (`-o wide`, one node), deployments, replicasets, pods
  (`--sort-by`), services, resourceclaims,
  devicetaintrules (the default convertor), events;
- `get -w` lines;
- `patch` (strategic, merge, json), `scale`, `rollout status`, `cordon`/`drain`, `wait`;
- day-two edits: `expose`, `set image`, `rollout undo`, `taint` (and its removal).
"""

from __future__ import annotations

import json
import re
import subprocess
import time
import uuid

from tests.kubectl.conftest import KUBECTL_TIMEOUT, Kubectl
from twin.runtime import Twin

WAIT = 60.0  # seconds: a generous deadline for a state on a busy machine


def header(output: str) -> list[str]:
    """The column names of kubectl's table (split on runs of two or more spaces)."""
    first = output.strip().splitlines()[0]
    return re.split(r"\s{2,}", first.strip())


def row(output: str, name: str) -> list[str]:
    for line in output.strip().splitlines()[1:]:
        cells = re.split(r"\s{2,}", line.strip())
        if name in cells:
            return cells
    raise AssertionError(f"no row for {name!r} in:\n{output}")


def wait_for(check: object, what: str) -> None:
    deadline = time.monotonic() + WAIT
    while time.monotonic() < deadline:
        if check():  # type: ignore[operator]
            return
        time.sleep(0.1)
    raise AssertionError(f"timed out waiting for {what}")


DEPLOYMENT = """
apiVersion: apps/v1
kind: Deployment
metadata:
  name: web
  labels: {app: web}
spec:
  replicas: 2
  selector:
    matchLabels: {app: web}
  template:
    metadata:
      labels: {app: web}
    spec:
      containers:
      - name: main
        image: nginx:1.27
"""


# ---- OpenAPI: validation, explain, server-side apply, diff -------------------------------


def test_apply_with_default_validation_then_reapply(kubectl: Kubectl, ns: str) -> None:
    done = kubectl("apply", "-n", ns, "-f", "-", stdin=DEPLOYMENT)
    assert done.stdout.strip() == "deployment.apps/web created"
    changed = DEPLOYMENT.replace("nginx:1.27", "nginx:1.28")
    done = kubectl("apply", "-n", ns, "-f", "-", stdin=changed)
    assert done.stdout.strip() == "deployment.apps/web configured"
    image = kubectl(
        "get", "deploy", "web", "-n", ns, "-o", "jsonpath={.spec.template.spec.containers[0].image}"
    )
    assert image.stdout == "nginx:1.28"


def test_apply_rejects_an_unknown_field(kubectl: Kubectl, ns: str) -> None:
    bad = DEPLOYMENT.replace("replicas: 2", "replicas: 2\n  replicaz: 3")
    done = kubectl("apply", "-n", ns, "-f", "-", stdin=bad, ok=False)
    assert done.returncode != 0
    assert 'unknown field "spec.replicaz"' in done.stderr


def test_server_side_apply_and_diff(kubectl: Kubectl, ns: str) -> None:
    cm = f"apiVersion: v1\nkind: ConfigMap\nmetadata: {{name: conf, namespace: {ns}}}\n"
    done = kubectl("apply", "--server-side", "-f", "-", stdin=cm + "data: {a: '1'}\n")
    assert done.stdout.strip() == "configmap/conf serverside-applied"
    same = kubectl("diff", "-f", "-", stdin=cm + "data: {a: '1'}\n", ok=False)
    assert same.returncode == 0, same.stderr
    assert same.stdout == ""
    differs = kubectl("diff", "-f", "-", stdin=cm + "data: {a: '2'}\n", ok=False)
    assert differs.returncode == 1, differs.stderr
    assert '-  a: "1"' in differs.stdout and '+  a: "2"' in differs.stdout
    # diff is a server-side dry run: nothing changed
    value = kubectl("get", "cm", "conf", "-n", ns, "-o", "jsonpath={.data.a}")
    assert value.stdout == "1"


def test_explain_reads_the_served_openapi(kubectl: Kubectl) -> None:
    done = kubectl("explain", "pod.spec.containers")
    assert "KIND:       Pod" in done.stdout
    assert "FIELD: containers <[]Container>" in done.stdout
    assert "image\t<string>" in done.stdout
    rule = kubectl(
        "explain", "devicetaintrules.spec.taint", "--api-version=resource.k8s.io/v1beta2"
    )
    assert "GROUP:      resource.k8s.io" in rule.stdout
    assert "effect\t<string> -required-" in rule.stdout


# ---- protobuf bodies ---------------------------------------------------------------------


def test_create_commands_send_protobuf(kubectl: Kubectl, twin: Twin) -> None:
    name = f"p-{uuid.uuid4().hex[:8]}"
    assert kubectl("create", "namespace", name).stdout.strip() == f"namespace/{name} created"
    done = kubectl("create", "configmap", "settings", "-n", name, "--from-literal=mode=fast")
    assert done.stdout.strip() == "configmap/settings created"
    done = kubectl("create", "deployment", "api", "-n", name, "--image=nginx:1.27", "--replicas=2")
    assert done.stdout.strip() == "deployment.apps/api created"
    cm = twin.store.get("configmaps", "settings", name)
    assert cm["data"] == {"mode": "fast"}
    dep = twin.store.get("deployments.apps", "api", name)
    assert dep["spec"]["replicas"] == 2
    assert dep["spec"]["template"]["spec"]["containers"][0]["image"] == "nginx:1.27"
    assert dep["spec"]["selector"] == {"matchLabels": {"app": "api"}}
    # kubectl sends `strategy: {}`; the apiserver defaults it (describe shows RollingUpdate)
    assert dep["spec"]["strategy"] == {
        "type": "RollingUpdate",
        "rollingUpdate": {"maxSurge": "25%", "maxUnavailable": "25%"},
    }


def test_more_create_commands(kubectl: Kubectl, twin: Twin, ns: str) -> None:
    made = [
        ("secret", "generic", "creds", "--from-literal=user=alice"),
        ("serviceaccount", "runner"),
        ("job", "once", "--image=busybox:1.36"),
        ("service", "clusterip", "web", "--tcp=80:8080"),
        ("poddisruptionbudget", "keep", "--selector=app=web", "--min-available=1"),
        ("role", "reader", "--verb=get,list", "--resource=pods"),
        ("rolebinding", "reader", "--role=reader", "--user=bob"),
    ]
    for args in made:
        done = kubectl("create", *args, "-n", ns)
        assert done.stdout.strip().endswith(" created"), done.stdout
    run = kubectl("run", "shell", "-n", ns, "--image=busybox:1.36", "--labels=app=shell")
    assert run.stdout.strip() == "pod/shell created"
    assert twin.store.get("pods", "shell", ns)["spec"]["containers"][0]["image"] == "busybox:1.36"
    store = twin.store
    assert store.get("secrets", "creds", ns)["data"] == {"user": "YWxpY2U="}
    assert store.get("secrets", "creds", ns)["type"] == "Opaque"
    job = store.get("jobs.batch", "once", ns)
    assert job["spec"]["template"]["spec"]["restartPolicy"] == "Never"
    svc = store.get("services", "web", ns)["spec"]
    assert svc["ports"] == [{"name": "80-8080", "port": 80, "protocol": "TCP", "targetPort": 8080}]
    assert svc["type"] == "ClusterIP" and svc["clusterIP"].startswith("10.96.")
    pdb = store.get("poddisruptionbudgets.policy", "keep", ns)["spec"]
    assert pdb["minAvailable"] == 1 and pdb["selector"] == {"matchLabels": {"app": "web"}}
    role = store.get("roles.rbac.authorization.k8s.io", "reader", ns)
    assert role["rules"] == [{"verbs": ["get", "list"], "apiGroups": [""], "resources": ["pods"]}]
    assert kubectl("auth", "can-i", "list", "pods", "-n", ns, "--as", "bob").stdout.strip() == "yes"
    svc_table = kubectl("get", "svc", "web", "-n", ns).stdout
    assert row(svc_table, "web")[4] == "80/TCP"


# ---- server-side printing ----------------------------------------------------------------


def test_get_nodes_prints_status_roles_version(kubectl: Kubectl) -> None:
    out = kubectl("get", "nodes").stdout
    assert header(out) == ["NAME", "STATUS", "ROLES", "AGE", "VERSION"]
    one = kubectl("get", "node", "gpu-pool-node-0").stdout  # a single object: a one-row Table
    assert header(one) == header(out) and row(one, "gpu-pool-node-0")[1] == "Ready"
    cells = row(out, "gpu-pool-node-0")
    assert cells[1:3] == ["Ready", "<none>"] and re.match(r"v1\.36\.\d+$", cells[4])
    wide = kubectl("get", "nodes", "-o", "wide").stdout
    assert header(wide) == [
        "NAME", "STATUS", "ROLES", "AGE", "VERSION", "INTERNAL-IP", "EXTERNAL-IP",
        "OS-IMAGE", "KERNEL-VERSION", "CONTAINER-RUNTIME",
    ]  # fmt: skip
    assert row(wide, "gpu-pool-node-0")[5] == "10.0.0.1"


def test_get_workloads_print_their_columns(kubectl: Kubectl, ns: str) -> None:
    kubectl("apply", "-n", ns, "-f", "-", stdin=DEPLOYMENT)
    kubectl("rollout", "status", "deployment/web", "-n", ns, f"--timeout={int(WAIT)}s")
    out = kubectl("get", "deploy", "-n", ns).stdout
    assert header(out) == ["NAME", "READY", "UP-TO-DATE", "AVAILABLE", "AGE"]
    assert row(out, "web")[1:4] == ["2/2", "2", "2"]
    wide = kubectl("get", "deploy", "-n", ns, "-o", "wide").stdout
    assert header(wide)[-3:] == ["CONTAINERS", "IMAGES", "SELECTOR"]
    assert row(wide, "web")[-3:] == ["main", "nginx:1.27", "app=web"]
    rs = kubectl("get", "rs", "-n", ns).stdout
    assert header(rs) == ["NAME", "DESIRED", "CURRENT", "READY", "AGE"]
    assert rs.strip().splitlines()[1].split()[1:4] == ["2", "2", "2"]
    pods = kubectl("get", "pods", "-n", ns).stdout
    assert header(pods) == ["NAME", "READY", "STATUS", "RESTARTS", "AGE"]
    assert all(line.split()[1:3] == ["1/1", "Running"] for line in pods.splitlines()[1:])
    # --sort-by on a field outside metadata: kubectl asks for whole objects in the rows
    by_node = kubectl("get", "pods", "-n", ns, "--sort-by=.spec.nodeName", "-o", "wide").stdout
    nodes = [
        row_cells[6] for row_cells in (re.split(r"\s{2,}", x) for x in by_node.splitlines()[1:])
    ]
    assert nodes == sorted(nodes) and len(nodes) == 2


def test_get_dra_objects_and_events(kubectl: Kubectl, twin: Twin, ns: str) -> None:
    empty = kubectl("get", "resourceclaims", "-n", ns)
    assert empty.stdout == "" and empty.stderr.strip() == f"No resources found in {ns} namespace."
    twin.store.create(
        "resourceclaims.resource.k8s.io",
        {
            "metadata": {"name": "one"},
            "spec": {
                "devices": {
                    "requests": [{"name": "gpu", "exactly": {"deviceClassName": "gpu.nvidia.com"}}]
                }
            },
        },
        ns,
    )
    out = kubectl("get", "resourceclaims", "-n", ns).stdout
    assert header(out) == ["NAME", "STATE", "AGE"]
    assert row(out, "one")[1] == "pending"
    rule = {
        "apiVersion": "resource.k8s.io/v1beta2",
        "kind": "DeviceTaintRule",
        "metadata": {"name": f"r-{ns}"},
        "spec": {
            "deviceSelector": {"driver": "gpu.nvidia.com", "pool": "gpu-pool-node-1"},
            "taint": {"key": "example.com/maint", "effect": "None"},
        },
    }
    kubectl("create", "-f", "-", stdin=json.dumps(rule))
    rules = kubectl("get", "devicetaintrules").stdout
    assert header(rules) == ["NAME", "CREATED AT"]
    assert re.match(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ$", row(rules, f"r-{ns}")[1])
    kubectl("delete", "devicetaintrule", f"r-{ns}")
    twin.store.create(
        "events",
        {
            "metadata": {"name": "ev1"},
            "involvedObject": {"kind": "Pod", "name": "web-1", "namespace": ns},
            "reason": "Started",
            "message": "Started container main",
            "type": "Normal",
            "source": {"component": "kubelet", "host": "gpu-pool-node-0"},
            "firstTimestamp": "2026-12-01T10:00:00Z",
            "lastTimestamp": "2026-12-01T10:00:00Z",
            "count": 1,
        },
        ns,
    )
    events = kubectl("get", "events", "-n", ns).stdout
    assert header(events) == ["LAST SEEN", "TYPE", "REASON", "OBJECT", "MESSAGE"]
    assert row(events, "Started")[1:] == [
        "Normal",
        "Started",
        "pod/web-1",
        "Started container main",
    ]


def test_get_watch_prints_rows(kubectl: Kubectl, twin: Twin, ns: str) -> None:
    kubectl("create", "configmap", "first", "-n", ns, "--from-literal=a=1")
    proc = subprocess.Popen(
        [*kubectl.argv, "get", "configmaps", "-n", ns, "-w"],  # type: ignore[attr-defined]
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=kubectl.env,  # type: ignore[attr-defined]
    )
    try:
        assert proc.stdout is not None
        assert re.split(r"\s{2,}", proc.stdout.readline().strip()) == ["NAME", "DATA", "AGE"]
        assert proc.stdout.readline().split()[:2] == ["first", "1"]
        twin.store.create(
            "configmaps", {"metadata": {"name": "second"}, "data": {"x": "1", "y": "2"}}, ns
        )
        assert proc.stdout.readline().split()[:2] == ["second", "2"]
    finally:
        proc.kill()
        proc.communicate(timeout=KUBECTL_TIMEOUT)


# ---- patch, scale, rollout, drain, wait --------------------------------------------------


def test_patch_three_ways(kubectl: Kubectl, ns: str) -> None:
    kubectl("create", "configmap", "p", "-n", ns, "--from-literal=a=1")
    done = kubectl("patch", "cm", "p", "-n", ns, "-p", '{"data":{"b":"2"}}')
    assert done.stdout.strip() == "configmap/p patched"
    kubectl("patch", "cm", "p", "-n", ns, "--type=merge", "-p", '{"data":{"a":null}}')
    kubectl(
        "patch", "cm", "p", "-n", ns, "--type=json",
        "-p", '[{"op":"add","path":"/data/c","value":"3"}]',
    )  # fmt: skip
    data = kubectl("get", "cm", "p", "-n", ns, "-o", "jsonpath={.data}").stdout
    assert json.loads(data) == {"b": "2", "c": "3"}
    same = kubectl("patch", "cm", "p", "-n", ns, "--type=merge", "-p", '{"data":{"b":"2"}}')
    assert same.stdout.strip() == "configmap/p patched (no change)"


def test_scale_rollout_and_wait(kubectl: Kubectl, ns: str) -> None:
    kubectl("create", "deployment", "s", "-n", ns, "--image=nginx:1.27")
    done = kubectl("scale", "deployment/s", "-n", ns, "--replicas=3")
    assert done.stdout.strip() == "deployment.apps/s scaled"
    status = kubectl("rollout", "status", "deployment/s", "-n", ns, f"--timeout={int(WAIT)}s")
    assert 'deployment "s" successfully rolled out' in status.stdout
    waited = kubectl(
        "wait", "--for=condition=Available", "deployment/s", "-n", ns, f"--timeout={int(WAIT)}s"
    )
    assert waited.stdout.strip() == "deployment.apps/s condition met"
    pods = kubectl("wait", "--for=condition=Ready", "pods", "-l", "app=s", "-n", ns,
                   f"--timeout={int(WAIT)}s").stdout  # fmt: skip
    assert len(pods.strip().splitlines()) == 3


def test_cordon_and_drain(kubectl: Kubectl, twin: Twin, ns: str) -> None:
    kubectl("create", "deployment", "d", "-n", ns, "--image=nginx:1.27", "--replicas=2")
    kubectl("rollout", "status", "deployment/d", "-n", ns, f"--timeout={int(WAIT)}s")
    node = "gpu-pool-node-1"
    try:
        done = kubectl(
            "drain", node, "--ignore-daemonsets", "--delete-emptydir-data",
            f"--timeout={int(WAIT)}s", "--pod-selector", "app=d",
        )  # fmt: skip
        assert f"node/{node} cordoned" in done.stdout + done.stderr
        assert f"node/{node} drained" in done.stdout + done.stderr
        nodes = kubectl("get", "nodes").stdout
        assert row(nodes, node)[1] == "Ready,SchedulingDisabled"
        kubectl("rollout", "status", "deployment/d", "-n", ns, f"--timeout={int(WAIT)}s")
        wide = kubectl("get", "pods", "-n", ns, "-l", "app=d", "-o", "wide").stdout
        assert all(node not in line for line in wide.splitlines()[1:] if "Running" in line)
    finally:
        assert kubectl("uncordon", node).stdout.strip() == f"node/{node} uncordoned"


def test_day_two_edits(kubectl: Kubectl, twin: Twin, ns: str) -> None:
    kubectl("create", "deployment", "t", "-n", ns, "--image=nginx:1.27", "--port=80")
    kubectl("rollout", "status", "deployment/t", "-n", ns, f"--timeout={int(WAIT)}s")
    assert kubectl("expose", "deployment", "t", "-n", ns, "--port=80").stdout.strip() == (
        "service/t exposed"
    )
    assert twin.store.get("services", "t", ns)["spec"]["selector"] == {"app": "t"}
    done = kubectl("set", "image", "deployment/t", "nginx=nginx:1.28", "-n", ns)
    assert done.stdout.strip() == "deployment.apps/t image updated"
    kubectl("rollout", "status", "deployment/t", "-n", ns, f"--timeout={int(WAIT)}s")
    undo = kubectl("rollout", "undo", "deployment/t", "-n", ns)
    assert undo.stdout.strip() == "deployment.apps/t rolled back"
    image = "jsonpath={.spec.template.spec.containers[0].image}"
    assert kubectl("get", "deploy", "t", "-n", ns, "-o", image).stdout == "nginx:1.27"
    node = "gpu-pool-node-0"
    tainted = kubectl("taint", "nodes", node, f"example.com/{ns}=x:NoSchedule")
    assert tainted.stdout.strip() == f"node/{node} tainted"
    taints = twin.store.get("nodes", node)["spec"]["taints"]
    assert {"key": f"example.com/{ns}", "value": "x", "effect": "NoSchedule"} in taints
    kubectl("taint", "nodes", node, f"example.com/{ns}=x:NoSchedule-")
    left = twin.store.get("nodes", node)["spec"].get("taints") or []
    assert all(t["key"] != f"example.com/{ns}" for t in left)
