"""`sickbay doctor` against the twin over HTTP, every profile, through the real CLI dispatcher.

Cases:
- every profile: API reachable, the served DeviceTaintRule versions (or the fallback warning
  on 1.34 and device plugin), the known-bad 1.36.2 warning, drivers/classes, health
  reporting; exit code 0 when nothing is an error;
- permissions via SelfSubjectAccessReview (answered by the RBAC proxy from deploy/rbac.yaml):
  all allowed -> ok; a role missing a required verb -> error naming it, exit code 1;
- a cluster without SelfSubjectAccessReview (404): a warning, not a crash;
- --probe with the twin's controllers: the no-op effect-None rule gets a status condition
  ("acts"), and is deleted afterwards; without the eviction controller: error with advice;
- --probe tells the scheduler by behaviour: a pod asking for a device under a NoSchedule rule
  stays Unschedulable (ok, and no version-based warning on 1.36.2), or is bound by a scheduler
  ignoring rules (the twin's kubernetes#139651 fault: error after two tries); no scheduler:
  a warning; probe rule, claim and pod are always deleted; on 1.36 the scheduler panic
  Sickbay cannot see is documented in the output;
- an unreachable API server: one error line, exit code 1;
- the repair namespace (the shipped runbooks repair): as deploy/ ships it (enforce privileged)
  -> ok; enforce restricted or baseline -> error naming what refuses the reset pod and the
  level needed (privileged), with the label command; a namespace that does not exist and no
  allowlisted image -> errors naming both; the product's Pod Security evaluator and the twin's
  admission agree on the repair pods (reset: privileged only; validation: baseline).
"""

from __future__ import annotations

import io
import re
import time
from pathlib import Path
from typing import Any

import pytest

from tests.activities.kube.conftest import PROFILES, twin
from tests.activities.kube.test_kube_errors import RULES, without
from twin import errors
from twin.controllers.manager import ControllerManager, TwinOptions
from worker.cli import build_parser

# The shipped runbooks repair: the worker has an allowlist (else doctor says none).
pytestmark = pytest.mark.usefixtures("repair_allowlist_env")

CHANNELS = """channels:
  pagerduty: {type: webhook, url: "https://hooks.invalid/pd"}
  slack: {type: webhook, url: "https://hooks.invalid/slack"}
"""
CLOUD = """http:
  pools:
    describe: {method: GET, url: "https://pools.invalid/{pool}"}
    size_path: size
    scale: {method: POST, url: "https://pools.invalid/{pool}"}
    reboot: {method: POST, url: "https://pools.invalid/{node}/reboot"}
    replace: {method: POST, url: "https://pools.invalid/{node}/replace"}
"""


def integrations(directory: Path) -> dict[str, str]:
    """SICKBAY_CHANNELS_FILE / SICKBAY_CLOUD_FILE configuring what the shipped runbooks name
    (their channels pagerduty and slack, inference's provider http)."""
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "channels.yaml").write_text(CHANNELS)
    (directory / "cloud.yaml").write_text(CLOUD)
    return {
        "SICKBAY_CHANNELS_FILE": str(directory / "channels.yaml"),
        "SICKBAY_CLOUD_FILE": str(directory / "cloud.yaml"),
    }


def doctor(kubeconfig: Path, *extra: str, env: dict[str, str] | None = None) -> tuple[int, str]:
    """`sickbay doctor` in this process; Temporal not checked unless `--temporal` is passed
    (tests/activities/kube/test_kube_doctor_temporal.py does), the channels and providers the
    shipped runbooks name configured unless `env` says otherwise."""
    from unittest import mock

    from worker.doctor import run

    if "--temporal" in extra:
        extra = tuple(e for e in extra if e != "--temporal")
    else:
        extra = ("--no-temporal", *extra)
    args = build_parser().parse_args(["doctor", "--kubeconfig", str(kubeconfig), *extra])
    out = io.StringIO()
    if env is None:
        env = integrations(kubeconfig.parent / "integrations")
    with mock.patch.dict("os.environ", env):
        code = run(args, out)
    return code, out.getvalue()


def line(output: str, name: str) -> str:
    found = [ln for ln in output.splitlines() if re.match(rf"^\w+\s+{re.escape(name)}\s\s", ln)]
    assert found, f"no '{name}' line in:\n{output}"
    return found[0]


@pytest.mark.parametrize("profile", PROFILES)
async def test_doctor_per_profile(tmp_path: Path, profile: str) -> None:
    with twin(tmp_path, profile, proxy_rules=RULES) as t:
        code, out = doctor(t.kubeconfig)
        assert t.proxy is not None and t.proxy.denied == []  # rbac.yaml covers the doctor
    assert code == 0, out
    assert line(out, "api").startswith("ok")
    assert line(out, "permissions").startswith("ok")
    taint = {
        "1.34": "warning DeviceTaintRule",
        "1.35": "warning DeviceTaintRule",
        "1.36": "ok      DeviceTaintRule",
        "1.37": "ok      DeviceTaintRule",
    }
    if profile == "device-plugin":
        assert line(out, "DRA").startswith("warning") and "device-plugin mode" in out
        assert line(out, "device plugin").startswith("ok")
    else:
        assert line(out, "DeviceTaintRule").startswith(taint[profile].split()[0])
        assert line(out, "DRA drivers").startswith("ok")
    if profile == "1.36":
        assert line(out, "known-bad version").startswith("warning")
        assert "139651" in out
    if profile == "1.37":
        assert "served in v1; using v1" in out
    # 4 GPUs; the shipped maintenance runbook lets 25 % go at once: 1 wait, of 400 a worker keeps
    assert line(out, "open waits").startswith("ok")
    assert "up to 1 of 4 GPUs" in line(out, "open waits")


async def test_doctor_weighs_the_open_waits_against_the_budget(tmp_path: Path) -> None:
    """80 GPUs under the shipped runbooks: maintenance's 25 % lets 20 be quarantined at once,
    each with a wait open; a worker keeping 16 is warned, one keeping 20 is not."""
    with twin(tmp_path, "1.37", nodes=10, gpus_per_node=8) as t:
        env = integrations(tmp_path / "integrations")
        _, short = doctor(t.kubeconfig, env={**env, "SICKBAY_MAX_OPEN_WAITS": "16"})
        _, enough = doctor(t.kubeconfig, env={**env, "SICKBAY_MAX_OPEN_WAITS": "20"})
    warned = short.split(line(short, "open waits"), 1)[1].splitlines()[1]
    assert line(short, "open waits").startswith("warning")
    assert "up to 20 of 80 GPUs" in line(short, "open waits")
    assert "runbook maintenance: maxPerCluster 25%" in line(short, "open waits")
    assert "raise SICKBAY_MAX_OPEN_WAITS to 20" in warned
    assert line(enough, "open waits").startswith("ok")


async def test_doctor_missing_permission_is_an_error(tmp_path: Path) -> None:
    with twin(tmp_path, "1.37", proxy_rules=without("", "pods/eviction", "create")) as t:
        code, out = doctor(t.kubeconfig)
    assert code == 1
    assert line(out, "permissions").startswith("error") and "create pods/eviction" in out


async def test_doctor_without_access_reviews_warns(tmp_path: Path) -> None:
    with twin(tmp_path, "1.36") as t:
        # A cluster that does not serve SelfSubjectAccessReview answers 404 for it.
        t.twin.add_request_interceptor(
            lambda info: (
                errors.unknown_resource() if info.resource == "selfsubjectaccessreviews" else None
            )
        )
        code, out = doctor(t.kubeconfig)
    assert code == 0
    assert line(out, "permissions").startswith("warning") and "not served" in out


def _left_behind(t: Any) -> list[str]:
    """Probe objects still there, once the controllers had time to finish deletions (an
    allocated claim goes when its pod is gone and it is deallocated)."""
    deadline = time.monotonic() + 10
    while True:
        left = [
            f"{kind}/{o['metadata']['name']}"
            for kind in (
                "devicetaintrules.resource.k8s.io",
                "resourceclaims.resource.k8s.io",
                "pods",
            )
            for o in t.store.list(kind).items
        ]
        if not left or time.monotonic() > deadline:
            return left
        time.sleep(0.05)


async def test_doctor_probe(tmp_path: Path) -> None:
    with twin(tmp_path, "1.37", controllers=ControllerManager()) as t:
        code, out = doctor(t.kubeconfig, "--probe")
        assert code == 0, out
        assert line(out, "eviction controller").startswith("ok") and "acts" in out
        assert line(out, "scheduler").startswith("ok") and "honours DeviceTaintRules" in out
        assert _left_behind(t) == []
    with twin(tmp_path, "1.37") as t:  # no controllers: nobody writes the status
        code, out = doctor(t.kubeconfig, "--probe", "--probe-timeout", "1")
        assert code == 1
        assert line(out, "eviction controller").startswith("error")
        assert line(out, "scheduler").startswith("warning") and "no scheduling decision" in out
        assert _left_behind(t) == []


async def test_doctor_probe_tells_the_scheduler_by_behaviour_not_version(tmp_path: Path) -> None:
    """1.36.2 by version: a patched scheduler is ok (no known-bad warning once probed), a
    stock one (kubernetes#139651, the twin's known fault) is an error, tried twice."""
    with twin(tmp_path, "1.36", controllers=ControllerManager()) as t:
        code, out = doctor(t.kubeconfig, "--probe")
        assert code == 0, out
        assert line(out, "scheduler").startswith("ok")
        assert "known-bad version" not in out  # the behaviour, not the number, decides
        assert line(out, "scheduler crash").startswith("warning") and "tracker.go" in out
        assert _left_behind(t) == []
    broken = ControllerManager(TwinOptions(ignore_device_taint_rules=True))
    with twin(tmp_path, "1.36", controllers=broken) as t:
        code, out = doctor(t.kubeconfig, "--probe")
        assert code == 1
        assert line(out, "scheduler").startswith("error") and "2 tries" in out
        assert "139651" in line(out, "scheduler")
        assert _left_behind(t) == []
    with twin(tmp_path, "1.36") as t:  # without --probe the version alone warns
        code, out = doctor(t.kubeconfig)
        assert line(out, "known-bad version").startswith("warning") and "--probe" in out


def test_doctor_unreachable(tmp_path: Path) -> None:
    config = tmp_path / "kubeconfig"
    config.write_text(
        "apiVersion: v1\nkind: Config\ncurrent-context: c\n"
        "clusters: [{name: c, cluster: {server: 'http://127.0.0.1:9'}}]\n"
        "users: [{name: u, user: {}}]\ncontexts: [{name: c, context: {cluster: c, user: u}}]\n"
    )
    code, out = doctor(config)
    assert code == 1 and line(out, "api").startswith("error")


def test_doctor_reports_the_recorded_cluster_name_and_a_mismatch(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`cluster name`: before the first worker, what it would record (read-only: nothing is
    written); then the record; an explicit SICKBAY_CLUSTER that disagrees is an error."""
    from contract.names import CLUSTER_CONFIGMAP, derived_cluster_name

    monkeypatch.delenv("SICKBAY_CLUSTER", raising=False)
    with twin(tmp_path, "1.37", proxy_rules=RULES) as t:
        t.store.create("namespaces", {"metadata": {"name": "sickbay"}})
        uid = t.store.get("namespaces", "kube-system")["metadata"]["uid"]
        code, out = doctor(t.kubeconfig, "--namespace", "sickbay")
        assert code == 0, out
        first = line(out, "cluster name")
        assert first.startswith("ok") and "not recorded yet" in first
        assert repr(derived_cluster_name(uid)) in first
        assert t.store.try_get("configmaps", CLUSTER_CONFIGMAP, "sickbay") is None

        t.store.create(
            "configmaps",
            {"metadata": {"name": CLUSTER_CONFIGMAP}, "data": {"name": "east"}},
            "sickbay",
        )
        code, out = doctor(t.kubeconfig, "--namespace", "sickbay")
        assert code == 0, out
        assert line(out, "cluster name").startswith("ok") and "'east', recorded in" in out

        monkeypatch.setenv("SICKBAY_CLUSTER", "west")
        code, out = doctor(t.kubeconfig, "--namespace", "sickbay")
        assert code == 1, out
        mismatch = line(out, "cluster name")
        assert mismatch.startswith("error")
        assert "SICKBAY_CLUSTER is 'west'" in mismatch and "records 'east'" in mismatch
        assert t.proxy is not None and t.proxy.denied == []


# ---- the repair namespace (worker/doctor_repair.py) ------------------------------------------


@pytest.mark.parametrize(
    ("labels", "status", "says"),
    [
        (None, "ok", "enforce privileged:latest admits the reset and validation pods"),
        (
            {"pod-security.kubernetes.io/enforce": "restricted"},
            "error",
            "refuses the reset pod (privileged, allowPrivilegeEscalation != false",
        ),
        (
            {"pod-security.kubernetes.io/enforce": "baseline"},
            "error",
            "refuses the reset pod (privileged); the Jobs would be accepted and their pods "
            "refused. It needs privileged",
        ),
    ],
)
async def test_doctor_checks_the_repair_namespaces_pod_security(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    labels: dict[str, str] | None,
    status: str,
    says: str,
) -> None:
    with twin(tmp_path, "1.37", proxy_rules=RULES) as t:
        if labels is not None:  # None: as deploy/namespace.yaml ships it
            t.namespace("sickbay-repair", labels)
        code, out = doctor(t.kubeconfig)
    found = line(out, "repair namespace")
    assert found.startswith(status) and says in found, out
    assert code == (1 if status == "error" else 0), out
    if status == "error":
        assert "It needs privileged" in found
        assert "pod-security.kubernetes.io/enforce=privileged" in out  # the fix


async def test_doctor_repair_namespace_missing_and_no_images(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("SICKBAY_REPAIR_NAMESPACE", "gpu-repairs")
    monkeypatch.delenv("SICKBAY_REPAIR_ALLOWLIST", raising=False)
    with twin(tmp_path, "1.37", proxy_rules=RULES) as t:
        code, out = doctor(t.kubeconfig)
    assert code == 1
    assert line(out, "repair namespace").startswith("error")
    assert "gpu-repairs does not exist" in out
    images = line(out, "repair images (reset)")
    assert images.startswith("error") and "no reset image is allowlisted" in images


def test_doctor_judges_the_pods_the_repair_code_builds() -> None:
    """The product's evaluator and the twin's admission agree on the repair pods."""
    from activities.kube import podsecurity as product
    from contract.runbook import RepairAllowlist
    from twin import podsecurity as server
    from worker.doctor_repair import repair_pod_specs

    specs = repair_pod_specs(RepairAllowlist())
    assert product.strictest_level(specs["reset"]) == "privileged"
    assert product.strictest_level(specs["validation"]) == "baseline"
    for level in ("baseline", "restricted"):
        for spec in specs.values():
            assert bool(product.problems(level, spec)) == bool(server.violations(level, spec))
            assert product.problems(level, spec) == [
                v.split(" (", 1)[0] for v in server.violations(level, spec)
            ]
