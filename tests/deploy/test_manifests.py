"""Kubernetes manifests under deploy/, read as data (no cluster needed).

Cases:
- every file parses; every document has apiVersion, kind and metadata.name; namespaced
  objects live in the namespace deploy/namespace.yaml creates;
- kustomization.yaml lists only files that exist, and every manifest under deploy/;
  its image override names the image the Deployments use;
- names resolve across files: the ServiceAccount of each Deployment exists; the Service
  selects the webhook pods' labels and targets a named container port; referenced
  ConfigMaps exist and mounted keys exist; Secrets are either optional or documented in
  docs/deploy.md as created out of band; Deployment selectors match their pod labels;
- hardening: non-root, read-only root filesystem, no privilege escalation, all capabilities
  dropped, RuntimeDefault seccomp, memory requests and limits, probes; worker probes on the
  metrics port the ConfigMap configures; the webhook has no API token;
- the ConfigMap's SICKBAY_* keys are read by the code; container args are `sickbay` commands;
- the runbooks ConfigMap `kubectl kustomize deploy/` builds is runbooks/*.yaml byte for byte
  (and parses to the same runbooks), from a copy under deploy/runbooks/ that is current
  (`make deploy-runbooks`); its runbooks validate and load with the runbook loader;
- no Service link variable the kubelet would set (`<SERVICE>_PORT=tcp://...`) is a setting the
  code reads, unless the pod turns them off (`enableServiceLinks: false`);
- RBAC (deploy/rbac.yaml, when present): every bound ServiceAccount exists and the worker's
  ServiceAccount is bound to a role; the webhook's is bound to none;
- NetworkPolicies (deploy/networkpolicy.yaml): everything in the namespace is denied both ways
  unless allowed; the webhook's port is open to Alertmanager's namespace only and the worker's
  metrics port to the monitoring namespace only, by container port name; both may reach DNS
  and the Temporal frontend's namespace and port (from SICKBAY_TEMPORAL_ADDRESS); the worker
  may reach HTTPS (API server, channels); the metrics listen on the pod address for that.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from contract.names import CLUSTER_CONFIGMAP, CLUSTER_CONFIGMAP_KEY
from tests.deploy.helpers import (
    DEPLOY,
    ROOT,
    assert_cli_accepts,
    assert_known_env,
    command_args,
    is_kubernetes_object,
    kubectl_or_skip,
    manifest_files,
)

CLUSTER_SCOPED = {
    "Namespace",
    "ClusterRole",
    "ClusterRoleBinding",
    "CustomResourceDefinition",
    "PriorityClass",
    "DeviceClass",
}
DOCS = ROOT / "docs" / "deploy.md"


def _by_kind(objects: list[dict[str, Any]], kind: str) -> dict[str, dict[str, Any]]:
    return {o["metadata"]["name"]: o for o in objects if o["kind"] == kind}


def _deployments(objects: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    return _by_kind(objects, "Deployment")


def _pod_spec(deployment: dict[str, Any]) -> dict[str, Any]:
    return deployment["spec"]["template"]["spec"]


def _kustomization() -> dict[str, Any]:
    return yaml.safe_load((DEPLOY / "kustomization.yaml").read_text())


def test_every_manifest_parses_and_is_named(manifests: dict[Path, list[dict[str, Any]]]) -> None:
    assert manifests, "no manifests under deploy/"
    for path, docs in manifests.items():
        assert docs, f"{path.name} is empty"
        for doc in docs:
            if path.name in _non_kubernetes_files():
                continue
            assert doc.get("apiVersion"), f"{path.name}: document without apiVersion"
            assert doc.get("kind"), f"{path.name}: document without kind"
            assert doc.get("metadata", {}).get("name"), f"{path.name}: {doc['kind']} without name"


def _non_kubernetes_files() -> set[str]:
    """Files under deploy/ that are not Kubernetes objects (e.g. a plain Alertmanager or
    Prometheus config); kustomization must not list them."""
    out = set()
    for path in manifest_files():
        docs = [d for d in yaml.safe_load_all(path.read_text()) if d is not None]
        if not all(isinstance(d, dict) and is_kubernetes_object(d) for d in docs):
            out.add(path.name)
    return out


# What lives in the repair namespace: the repair Role, its binding and the repair pods'
# ServiceAccount (no Role binds it), nothing else.
IN_REPAIR_NAMESPACE = {
    ("ServiceAccount", "sickbay-repair"),
    ("Role", "sickbay-repair"),
    ("RoleBinding", "sickbay-repair"),
}


def test_namespaced_objects_in_the_sickbay_namespace(objects: list[dict[str, Any]]) -> None:
    namespaces = set(_by_kind(objects, "Namespace"))
    assert namespaces == {"sickbay", "sickbay-repair"}
    for obj in objects:
        if obj["kind"] in CLUSTER_SCOPED:
            continue
        key = (obj["kind"], obj["metadata"]["name"])
        expected = "sickbay-repair" if key in IN_REPAIR_NAMESPACE else "sickbay"
        assert obj["metadata"].get("namespace") == expected, (
            f"{obj['kind']}/{obj['metadata']['name']} is not in namespace {expected}"
        )


def test_the_repair_namespace_admits_the_repair_pods_and_nothing_binds_their_account(
    objects: list[dict[str, Any]],
) -> None:
    """The repair namespace enforces the level the repair pods need (privileged: the reset
    pod), warns and audits at baseline (the validation pod's); the worker may create Jobs only
    there (a Role, no ClusterRole grants jobs create); the pods' ServiceAccount mounts no token
    and no binding names it."""
    from activities.kube import podsecurity
    from contract.runbook import RepairAllowlist
    from worker.doctor_repair import repair_pod_specs

    ns = _by_kind(objects, "Namespace")["sickbay-repair"]["metadata"]["labels"]
    specs = repair_pod_specs(RepairAllowlist())
    needed = min(
        (podsecurity.strictest_level(s) for s in specs.values()), key=podsecurity.LEVELS.index
    )
    assert ns["pod-security.kubernetes.io/enforce"] == needed == "privileged"
    assert podsecurity.strictest_level(specs["validation"]) == "baseline"
    assert ns["pod-security.kubernetes.io/warn"] == "baseline"
    assert ns["pod-security.kubernetes.io/audit"] == "baseline"
    for obj in objects:
        if obj["kind"] not in ("ClusterRole", "Role"):
            continue
        creates_jobs = any(
            "jobs" in rule["resources"] and "create" in rule["verbs"] for rule in obj["rules"]
        )
        if creates_jobs:
            assert (obj["kind"], obj["metadata"].get("namespace")) == ("Role", "sickbay-repair")
    account = _by_kind(objects, "ServiceAccount")["sickbay-repair"]
    assert account["automountServiceAccountToken"] is False
    for binding in objects:
        if binding["kind"].endswith("RoleBinding"):
            assert all(s["name"] != "sickbay-repair" for s in binding["subjects"]), binding


def test_kustomization_lists_exactly_the_manifests() -> None:
    kustomization = _kustomization()
    listed = kustomization["resources"]
    generated = [
        file
        for generator in kustomization.get("configMapGenerator", [])
        for file in generator.get("files", [])
    ]
    # A directory entry is a kustomization of its own (runbooks/: the generated runbooks).
    bases = [r for r in listed if (DEPLOY / r / "kustomization.yaml").is_file()]
    assert bases == ["runbooks"], f"unexpected kustomization directories: {bases}"
    listed = [r for r in listed if r not in bases]
    missing = [r for r in listed + generated if not (DEPLOY / r).is_file()]
    assert not missing, f"kustomization.yaml lists files that do not exist: {missing}"
    objects_files = {p.name for p in manifest_files()} - _non_kubernetes_files()
    assert set(listed) == objects_files, (
        f"not listed: {sorted(objects_files - set(listed))}; "
        f"listed but not Kubernetes objects: {sorted(set(listed) - objects_files)}"
    )
    # Plain Alertmanager / Prometheus files ship as generated ConfigMaps, never as resources.
    assert set(generated) == _non_kubernetes_files()
    assert len(listed) == len(set(listed)), "a file is listed twice"


def test_alertmanager_example_reaches_the_webhook(objects: list[dict[str, Any]]) -> None:
    path = DEPLOY / "alertmanager.yaml"
    assert path.is_file(), "deploy/alertmanager.yaml is missing (the shipped example)"
    config = yaml.safe_load(path.read_text())
    service = _by_kind(objects, "Service")["sickbay-webhook"]
    port = service["spec"]["ports"][0]["port"]
    name, namespace = service["metadata"]["name"], service["metadata"]["namespace"]
    receivers = {r["name"]: r for r in config["receivers"]}
    assert "sickbay" in receivers, "no `sickbay` receiver in deploy/alertmanager.yaml"
    configs = receivers["sickbay"]["webhook_configs"]
    assert configs
    for webhook in configs:
        assert webhook["url"].startswith(f"http://{name}.{namespace}.svc:{port}/v1/alertmanager")
        credentials = webhook["http_config"]["authorization"]["credentials_file"]
        secret = _pod_spec(_deployments(objects)["sickbay-webhook"])["volumes"]
        secret_names = {v["secret"]["secretName"] for v in secret if "secret" in v}
        assert any(s in credentials for s in secret_names), (
            f"Alertmanager reads the token from {credentials}, not from the webhook's Secret"
        )


def test_kustomization_image_override_matches(objects: list[dict[str, Any]]) -> None:
    names = {i["name"] for i in _kustomization().get("images", [])}
    for name, deployment in _deployments(objects).items():
        for container in _pod_spec(deployment)["containers"]:
            image = container["image"].rsplit(":", 1)[0]
            assert image in names, f"{name}: image {image} is not overridable in kustomization"


def test_service_accounts_exist(objects: list[dict[str, Any]]) -> None:
    accounts = set(_by_kind(objects, "ServiceAccount"))
    for name, deployment in _deployments(objects).items():
        account = _pod_spec(deployment).get("serviceAccountName")
        assert account, f"{name} runs as the namespace's default ServiceAccount"
        assert account in accounts, f"{name} uses ServiceAccount {account}, defined nowhere"


def test_deployment_selectors_match_pod_labels(objects: list[dict[str, Any]]) -> None:
    for name, deployment in _deployments(objects).items():
        selector = deployment["spec"]["selector"]["matchLabels"]
        labels = deployment["spec"]["template"]["metadata"]["labels"]
        assert selector.items() <= labels.items(), f"{name}: selector does not match its pods"


def test_disruption_budgets_select_their_deployment(objects: list[dict[str, Any]]) -> None:
    budgets = _by_kind(objects, "PodDisruptionBudget")
    assert set(budgets) == {"sickbay-worker", "sickbay-webhook"}
    for name, budget in budgets.items():
        selector = budget["spec"]["selector"]["matchLabels"]
        selected = [
            d
            for d, dep in _deployments(objects).items()
            if selector.items() <= dep["spec"]["template"]["metadata"]["labels"].items()
        ]
        assert selected == [name], f"PodDisruptionBudget {name} selects {selected}"
        replicas = _deployments(objects)[name]["spec"]["replicas"]
        if "minAvailable" in budget["spec"]:
            assert budget["spec"]["minAvailable"] < replicas, f"{name} could never be drained"


def test_webhook_service_selects_webhook_pods(objects: list[dict[str, Any]]) -> None:
    service = _by_kind(objects, "Service")["sickbay-webhook"]
    selector = service["spec"]["selector"]
    selected = [
        name
        for name, d in _deployments(objects).items()
        if selector.items() <= d["spec"]["template"]["metadata"]["labels"].items()
    ]
    assert selected == ["sickbay-webhook"], f"the Service selects {selected}"
    pod = _pod_spec(_deployments(objects)["sickbay-webhook"])
    ports = {p["name"]: p["containerPort"] for c in pod["containers"] for p in c["ports"]}
    for port in service["spec"]["ports"]:
        target = port["targetPort"]
        assert target in ports, f"targetPort {target} is not a named container port"
    args = command_args(pod["containers"][0]["args"])
    assert int(args[args.index("--port") + 1]) == ports["http"]


def _configmap_refs(pod: dict[str, Any]) -> list[tuple[str, list[str]]]:
    refs = []
    for container in pod["containers"]:
        for source in container.get("envFrom", []):
            if "configMapRef" in source:
                refs.append((source["configMapRef"]["name"], []))
    for volume in pod.get("volumes", []):
        if "configMap" in volume:
            keys = [i["key"] for i in volume["configMap"].get("items", [])]
            refs.append((volume["configMap"]["name"], keys))
    return refs


def _secret_refs(pod: dict[str, Any]) -> list[tuple[str, bool]]:
    refs = []
    for volume in pod.get("volumes", []):
        if "secret" in volume:
            refs.append((volume["secret"]["secretName"], bool(volume["secret"].get("optional"))))
    for container in pod["containers"]:
        for source in container.get("envFrom", []):
            if "secretRef" in source:
                refs.append(
                    (source["secretRef"]["name"], bool(source["secretRef"].get("optional")))
                )
        for env in container.get("env", []):
            ref = env.get("valueFrom", {}).get("secretKeyRef")
            if ref:
                refs.append((ref["name"], bool(ref.get("optional"))))
    return refs


def test_referenced_configmaps_exist(built: list[dict[str, Any]]) -> None:
    configmaps = _by_kind(built, "ConfigMap")
    for name, deployment in _deployments(built).items():
        for ref, keys in _configmap_refs(_pod_spec(deployment)):
            if ref == CLUSTER_CONFIGMAP:  # the worker writes it (test below)
                continue
            assert ref in configmaps, f"{name} references ConfigMap {ref}, defined nowhere"
            for key in keys:
                assert key in configmaps[ref]["data"], f"{name}: ConfigMap {ref} has no {key}"


def test_the_webhook_reads_the_recorded_cluster_name(objects: list[dict[str, Any]]) -> None:
    """No API token: the webhook reads the worker's record (worker/cluster_name.py) from the
    ConfigMap mounted as a file, optional (it exists once the first worker has started), at
    the path SICKBAY_CLUSTER_FILE names; nothing in deploy/ defines that ConfigMap."""
    assert CLUSTER_CONFIGMAP not in _by_kind(objects, "ConfigMap")
    pod = _pod_spec(_deployments(objects)["sickbay-webhook"])
    (volume,) = [
        v for v in pod["volumes"] if v.get("configMap", {}).get("name") == CLUSTER_CONFIGMAP
    ]
    assert volume["configMap"]["optional"] is True
    (item,) = volume["configMap"]["items"]
    assert item["key"] == CLUSTER_CONFIGMAP_KEY
    container = pod["containers"][0]
    (mount,) = [m for m in container["volumeMounts"] if m["name"] == volume["name"]]
    env = {e["name"]: e.get("value") for e in container.get("env", [])}
    assert env["SICKBAY_CLUSTER_FILE"] == f"{mount['mountPath']}/{item['path']}"
    worker = _pod_spec(_deployments(objects)["sickbay-worker"])["containers"][0]
    assert "SICKBAY_CLUSTER_FILE" not in {e["name"] for e in worker.get("env", [])}


def test_required_secrets_are_documented(objects: list[dict[str, Any]]) -> None:
    """Secrets are never committed; a required one must be explained in docs/deploy.md."""
    assert not _by_kind(objects, "Secret"), "no Secret belongs in deploy/ (no secrets in git)"
    docs = DOCS.read_text() if DOCS.is_file() else ""
    for name, deployment in _deployments(objects).items():
        for secret, optional in _secret_refs(_pod_spec(deployment)):
            assert secret in docs, f"{name} mounts Secret {secret}; docs/deploy.md never names it"
            if name == "sickbay-worker":
                assert optional, "the worker must start without optional Temporal credentials"


def test_containers_are_hardened(objects: list[dict[str, Any]]) -> None:
    for name, deployment in _deployments(objects).items():
        pod = _pod_spec(deployment)
        pod_sc = pod["securityContext"]
        assert pod_sc["runAsNonRoot"] is True, name
        assert pod_sc["seccompProfile"]["type"] == "RuntimeDefault", name
        mounts_tmp = False
        for container in pod["containers"]:
            sc = container["securityContext"]
            assert sc["readOnlyRootFilesystem"] is True, f"{name}/{container['name']}"
            assert sc["allowPrivilegeEscalation"] is False, f"{name}/{container['name']}"
            assert sc["capabilities"]["drop"] == ["ALL"], f"{name}/{container['name']}"
            resources = container["resources"]
            assert resources["requests"]["memory"] and resources["requests"]["cpu"], name
            assert resources["limits"]["memory"], name
            assert container.get("livenessProbe") and container.get("readinessProbe"), name
            mounts_tmp |= any(m["mountPath"] == "/tmp" for m in container["volumeMounts"])
        assert mounts_tmp, f"{name}: a read-only root needs a writable /tmp"


def test_worker_probes_its_polling_health(objects: list[dict[str, Any]]) -> None:
    """Every probe asks /healthz on the health port the settings name (200 only while the
    worker polls Temporal, worker/health.py), not the metrics port that outlives polling."""
    config = _by_kind(objects, "ConfigMap")["sickbay-config"]["data"]
    container = _pod_spec(_deployments(objects)["sickbay-worker"])["containers"][0]
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    assert ports["metrics"] == int(config["SICKBAY_METRICS_PORT"])
    assert ports["health"] == int(config["SICKBAY_HEALTH_PORT"])
    assert config["SICKBAY_METRICS_HOST"] == "0.0.0.0"  # the health server listens there too
    for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
        get = container[probe]["httpGet"]
        assert get["port"] in ("health", ports["health"]) and get["path"] == "/healthz"
    annotations = _deployments(objects)["sickbay-worker"]["spec"]["template"]["metadata"]
    assert annotations["annotations"]["prometheus.io/port"] == config["SICKBAY_METRICS_PORT"]


def test_worker_mounts_runbooks_where_settings_point(objects: list[dict[str, Any]]) -> None:
    config = _by_kind(objects, "ConfigMap")["sickbay-config"]["data"]
    pod = _pod_spec(_deployments(objects)["sickbay-worker"])
    volumes = {v["name"]: v for v in pod["volumes"]}
    mounts = {m["mountPath"]: m["name"] for m in pod["containers"][0]["volumeMounts"]}
    volume = volumes[mounts[config["SICKBAY_RUNBOOKS_DIR"]]]
    assert volume["configMap"]["name"] == "sickbay-runbooks"


def test_webhook_has_no_kubernetes_token(objects: list[dict[str, Any]]) -> None:
    pod = _pod_spec(_deployments(objects)["sickbay-webhook"])
    assert pod["automountServiceAccountToken"] is False
    account = _by_kind(objects, "ServiceAccount")[pod["serviceAccountName"]]
    assert account.get("automountServiceAccountToken") is False
    env = {e["name"]: e.get("value") for e in pod["containers"][0].get("env", [])}
    token_file = env["SICKBAY_WEBHOOK_TOKEN_FILE"]
    mounts = {m["mountPath"] for m in pod["containers"][0]["volumeMounts"]}
    assert str(Path(token_file).parent) in mounts, "the token file is not on a mounted Secret"


def test_config_keys_are_read_by_the_code(objects: list[dict[str, Any]]) -> None:
    for name, configmap in _by_kind(objects, "ConfigMap").items():
        if name == "sickbay-runbooks":
            continue
        assert_known_env(set(configmap["data"]), f"ConfigMap {name}")
    for name, deployment in _deployments(objects).items():
        for container in _pod_spec(deployment)["containers"]:
            assert_known_env({e["name"] for e in container.get("env", [])}, f"Deployment {name}")


@pytest.fixture(scope="module")
def built() -> list[dict[str, Any]]:
    """What `kubectl apply -k deploy/` sends: the objects `kubectl kustomize deploy/` builds."""
    import subprocess

    done = subprocess.run(
        [kubectl_or_skip(), "kustomize", str(DEPLOY)], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    return [d for d in yaml.safe_load_all(done.stdout) if d]


def _shipped_runbooks() -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted((ROOT / "runbooks").glob("*.yaml"))}


def test_deployed_runbooks_are_the_tested_runbooks(built: list[dict[str, Any]]) -> None:
    """One source of truth: the runbooks ConfigMap that `kubectl apply -k deploy/` installs
    holds runbooks/*.yaml (what the demo and the tests load) byte for byte, and so parses to
    the same runbooks, repair, validation and lemons blocks included."""
    from activities.runbooks import load_text

    (configmap,) = [
        o for o in built if o["kind"] == "ConfigMap" and o["metadata"]["name"] == "sickbay-runbooks"
    ]
    assert configmap["metadata"]["namespace"] == "sickbay"
    data = configmap["data"]
    shipped = _shipped_runbooks()
    assert sorted(data) == sorted(shipped), "the ConfigMap's keys are not runbooks/*.yaml"
    for key, source in shipped.items():
        deployed = data[key].encode()
        (tested,) = load_text(source.decode(), f"runbooks/{key}")
        (installed,) = load_text(data[key], f"ConfigMap sickbay-runbooks key {key}")
        assert installed.model_dump() == tested.model_dump(), f"{key}: parsed content differs"
        assert deployed == source, f"{key}: the deployed bytes differ from runbooks/{key}"
    # The generated copy under deploy/ is current (`make deploy-runbooks` rewrites it).
    from harness.deploy_runbooks import stale

    assert not stale(), f"deploy/runbooks/ is stale in {stale()}: run `make deploy-runbooks`"


def test_runbooks_configmap_validates(built: list[dict[str, Any]], tmp_path: Path) -> None:
    # The runbook loader, not yaml.safe_load: YAML 1.1 reads the key `on:` as True.
    from activities.runbooks import load_dir, load_text

    data = _by_kind(built, "ConfigMap")["sickbay-runbooks"]["data"]
    assert "default.yaml" in data, "the default runbook catches every unmatched workload"
    for key, text in data.items():
        (runbook,) = load_text(text, f"ConfigMap sickbay-runbooks key {key}")
        assert f"{runbook.name}.yaml" == key, f"{key} holds runbook {runbook.name}"
        (tmp_path / key).write_text(text)
    # As the worker sees the mounted ConfigMap: through the real loader.
    loaded = load_dir(tmp_path)
    assert {r.name for r in loaded.runbooks} == {Path(k).stem for k in data}
    shipped = {p.stem for p in (ROOT / "runbooks").glob("*.yaml")}
    assert {Path(k).stem for k in data} == shipped, (
        "the ConfigMap should carry every shipped runbook"
    )


@pytest.mark.parametrize("deployment", ["sickbay-worker", "sickbay-webhook"])
def test_container_args_are_cli_commands(objects: list[dict[str, Any]], deployment: str) -> None:
    for container in _pod_spec(_deployments(objects)[deployment])["containers"]:
        assert_cli_accepts(command_args(container["args"]), f"Deployment {deployment}")


def test_rbac_binds_the_worker_only(objects: list[dict[str, Any]]) -> None:
    assert (DEPLOY / "rbac.yaml").is_file(), "deploy/rbac.yaml is missing (the worker's RBAC)"
    accounts = {
        (o["metadata"]["namespace"], o["metadata"]["name"])
        for o in objects
        if o["kind"] == "ServiceAccount"
    }
    roles = {(o["kind"], o["metadata"]["name"]) for o in objects if o["kind"].endswith("Role")}
    bound: set[tuple[str, str]] = set()
    for binding in objects:
        if binding["kind"] not in ("ClusterRoleBinding", "RoleBinding"):
            continue
        ref = binding["roleRef"]
        assert (ref["kind"], ref["name"]) in roles, f"binding to undefined {ref}"
        for subject in binding.get("subjects", []):
            if subject["kind"] != "ServiceAccount":
                continue
            key = (subject["namespace"], subject["name"])
            assert key in accounts, f"{binding['metadata']['name']} binds unknown account {key}"
            bound.add(key)
    worker_sa = _pod_spec(_deployments(objects)["sickbay-worker"])["serviceAccountName"]
    webhook_sa = _pod_spec(_deployments(objects)["sickbay-webhook"])["serviceAccountName"]
    assert ("sickbay", worker_sa) in bound, "the worker's ServiceAccount has no role"
    # The webhook: only the reviews of verified actors (ClusterRole sickbay-actions).
    webhook_roles = {
        b["roleRef"]["name"]
        for b in objects
        if b["kind"] in ("ClusterRoleBinding", "RoleBinding")
        for subject in b.get("subjects", [])
        if subject["kind"] == "ServiceAccount" and subject["name"] == webhook_sa
    }
    assert webhook_roles == {"sickbay-actions"}, "the webhook needs only token/access reviews"


def test_kubectl_dry_run_when_available() -> None:
    """With kubectl on PATH, `kubectl kustomize deploy/` must build (no cluster needed)."""
    kubectl = kubectl_or_skip()
    import subprocess

    done = subprocess.run(
        [kubectl, "kustomize", str(DEPLOY)], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr


_TYPED_GROUPS = {
    "v1",
    "apps/v1",
    "rbac.authorization.k8s.io/v1",
    "policy/v1",
    "networking.k8s.io/v1",
}


def _dropped_fields(original: Any, roundtrip: Any, path: str = "") -> list[str]:
    if isinstance(original, dict):
        out = []
        for key, value in original.items():
            if not isinstance(roundtrip, dict) or key not in roundtrip:
                out.append(f"{path}.{key}")
            else:
                out += _dropped_fields(value, roundtrip[key], f"{path}.{key}")
        return out
    if isinstance(original, list):
        return [
            d
            for i, (a, b) in enumerate(zip(original, roundtrip or [], strict=False))
            for d in _dropped_fields(a, b, f"{path}[{i}]")
        ]
    return []


def test_fields_exist_in_the_kubernetes_api(objects: list[dict[str, Any]]) -> None:
    """Round-trip each built-in object through the official client's typed models: a field
    the API does not have (a typo such as `readOnlyRootFileSystem`) is dropped, and named."""
    import json

    from kubernetes import client

    api = client.ApiClient()
    checked = 0
    for obj in objects:
        if obj["apiVersion"] not in _TYPED_GROUPS:
            continue
        model = f"V1{obj['kind']}"
        assert hasattr(client, model), f"no typed model for {obj['kind']}"
        typed = api.deserialize(json.dumps(obj), model, "application/json")
        dropped = _dropped_fields(obj, api.sanitize_for_serialization(typed))
        assert not dropped, f"{obj['kind']}/{obj['metadata']['name']}: unknown fields {dropped}"
        checked += 1
    assert checked >= 7


def _policies(objects: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    return _by_kind(objects, "NetworkPolicy")


def _selects(policy: dict[str, Any], deployment: dict[str, Any]) -> bool:
    wanted = policy["spec"]["podSelector"].get("matchLabels") or {}
    labels = deployment["spec"]["template"]["metadata"]["labels"]
    return all(labels.get(k) == v for k, v in wanted.items())


def _port_names(deployment: dict[str, Any]) -> set[str]:
    return {p["name"] for c in _pod_spec(deployment)["containers"] for p in c.get("ports", [])}


def _namespaces(peers: list[dict[str, Any]]) -> set[str]:
    return {
        (p.get("namespaceSelector") or {}).get("matchLabels", {}).get("kubernetes.io/metadata.name")
        for p in peers
    } - {None}


def test_network_policies_deny_by_default(objects: list[dict[str, Any]]) -> None:
    policies = _policies(objects)
    deny = [
        p
        for p in policies.values()
        if p["spec"]["podSelector"] == {}
        and set(p["spec"]["policyTypes"]) == {"Ingress", "Egress"}
        and not p["spec"].get("ingress")
        and not p["spec"].get("egress")
    ]
    assert deny, "no default-deny NetworkPolicy for the sickbay namespace"
    for name, deployment in _deployments(objects).items():
        own = [p for p in policies.values() if p["spec"]["podSelector"] and _selects(p, deployment)]
        assert len(own) == 1, f"{name}: expected one NetworkPolicy of its own, got {len(own)}"


def test_network_policies_let_in_only_alertmanager_and_monitoring(
    objects: list[dict[str, Any]],
) -> None:
    policies, deployments = _policies(objects), _deployments(objects)
    expected = {"sickbay-webhook": "http", "sickbay-worker": "metrics"}
    for name, port in expected.items():
        deployment = deployments[name]
        (policy,) = [
            p for p in policies.values() if p["spec"]["podSelector"] and _selects(p, deployment)
        ]
        assert port in _port_names(deployment)
        (rule,) = policy["spec"]["ingress"]
        assert _namespaces(rule["from"]) == {"monitoring"}, f"{name}: ingress {rule['from']}"
        assert all("ipBlock" not in peer for peer in rule["from"])
        assert [p["port"] for p in rule["ports"]] == [port]
    # Alertmanager's namespace is the one the example configuration talks about.
    assert "monitoring" in (DEPLOY / "networkpolicy.yaml").read_text()


def test_network_policies_let_out_dns_temporal_and_https(objects: list[dict[str, Any]]) -> None:
    config = _by_kind(objects, "ConfigMap")["sickbay-config"]["data"]
    host, _, temporal_port = config["SICKBAY_TEMPORAL_ADDRESS"].rpartition(":")
    temporal_namespace = host.split(".")[1]  # <service>.<namespace>.svc...
    policies, deployments = _policies(objects), _deployments(objects)
    for name in ("sickbay-webhook", "sickbay-worker"):
        (policy,) = [
            p
            for p in policies.values()
            if p["spec"]["podSelector"] and _selects(p, deployments[name])
        ]
        egress = policy["spec"]["egress"]
        by_port = {(p["protocol"], p["port"]): rule for rule in egress for p in rule["ports"]}
        assert ("UDP", 53) in by_port and ("TCP", 53) in by_port, f"{name}: no DNS"
        assert _namespaces(by_port[("UDP", 53)]["to"]) == {"kube-system"}
        temporal = by_port[("TCP", int(temporal_port))]
        assert _namespaces(temporal["to"]) == {temporal_namespace}, f"{name}: Temporal egress"
        if name == "sickbay-worker":
            assert ("TCP", 443) in by_port and ("TCP", 6443) in by_port, "no API server egress"
        else:
            assert ("TCP", 443) not in by_port, "the webhook talks to Temporal only"
    assert config["SICKBAY_METRICS_HOST"] == "0.0.0.0", "probes and Prometheus need the pod IP"


def test_service_links_cannot_set_settings(objects: list[dict[str, Any]]) -> None:
    """The kubelet sets Docker-link variables (<SERVICE>_PORT=tcp://ip:port, ...) for every
    Service of the pod's namespace unless the pod says `enableServiceLinks: false`; Service
    `sickbay-webhook` yields SICKBAY_WEBHOOK_PORT, a setting: such a name must never reach a
    Sickbay process."""
    from tests.deploy.helpers import known_env_names
    from tests.deploy.kubelet import service_link_env

    services = [
        {**s, "spec": {"clusterIP": "10.96.0.10", **s["spec"]}}
        for s in _by_kind(objects, "Service").values()
    ]
    names = set(service_link_env(services))
    for name, deployment in _deployments(objects).items():
        if _pod_spec(deployment).get("enableServiceLinks", True) is False:
            continue
        clashes = sorted(n for n in names if n in known_env_names())
        assert not clashes, f"{name}: the kubelet would set {clashes} from Service links"


def test_a_stale_runbook_copy_is_named(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """`make deploy-runbooks --check` names a copy that differs by one byte, a missing one and
    one that runbooks/ no longer has; after a rewrite nothing is stale."""
    from harness import deploy_runbooks

    monkeypatch.setattr(deploy_runbooks, "TARGET", tmp_path)
    deploy_runbooks.write()
    assert deploy_runbooks.stale() == []
    first = sorted(tmp_path.glob("*.yaml"))[0]
    first.write_bytes(first.read_bytes() + b" ")
    (tmp_path / "default.yaml").unlink()
    (tmp_path / "retired.yaml").write_text("kind: Runbook\n")
    assert deploy_runbooks.stale() == sorted({first.name, "default.yaml", "retired.yaml"})
    assert deploy_runbooks.main(["--check"]) == 1
    deploy_runbooks.write()
    assert deploy_runbooks.stale() == [] and deploy_runbooks.main(["--check"]) == 0
