"""`sickbay doctor` says which optional grants the loaded runbooks and the cluster need.

The twin behind the RBAC proxy, holding the ClusterRoles deploy/ ships (all, or with the
optional ones dropped); runbooks from `--runbooks DIR`.

Cases:
- the shipped runbooks on a cluster serving DeviceTaintRule, every role applied: ok; the
  `grants` line names the `inference` runbook as needing pods delete, and nodes patch as not
  needed (its file can be dropped);
- the shipped runbooks (they repair) with deploy/rbac-repair.yaml dropped: error naming the
  repair grants and the file to apply, exit 1;
- a runbook with `eviction.force: delete` and deploy/rbac-force-delete.yaml dropped: error
  naming the runbook and the missing grant, exit 1;
- no forcing runbook and both optional roles dropped, DeviceTaintRule served: no error, both
  files named as droppable;
- a cluster serving no DeviceTaintRule (device plugin) without deploy/rbac-node-fallback.yaml:
  error, the fallback needs nodes patch;
- runbooks that do not load: error naming the problem;
- `needed()` per optional grant: pods delete only for `eviction.force: delete` runbooks, nodes
  patch only without DeviceTaintRule, DeviceTaintRule verbs only with it, Cluster API verbs
  only for a `cluster-api` scale-up runbook.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from activities.kube.permissions import (
    ROLE_FORCE_DELETE,
    ROLE_HEALTH_WATCHER,
    ROLE_NODE_FALLBACK,
    ROLE_REPAIR_MACHINES,
)
from tests.activities.kube.conftest import twin
from tests.activities.kube.rbac_proxy import deploy_rules
from tests.activities.kube.test_kube_doctor import doctor, line

# The shipped runbooks repair: the worker has an allowlist (else doctor says none).
pytestmark = pytest.mark.usefixtures("repair_allowlist_env")

ROOT = Path(__file__).resolve().parents[3]


def _runbooks(tmp_path: Path, force: str) -> Path:
    directory = tmp_path / f"runbooks-{force}"
    directory.mkdir()
    (directory / "one.yaml").write_text(
        "apiVersion: sickbay/v1\nkind: Runbook\nmetadata:\n  name: stuck-pods\n"
        f"spec:\n  eviction:\n    mode: taint\n    force: {force}\n"
    )
    return directory


async def test_shipped_runbooks_need_force_delete_not_node_patch(tmp_path: Path) -> None:
    with twin(tmp_path, "1.37", proxy_rules=deploy_rules()) as t:
        code, out = doctor(t.kubeconfig, "--runbooks", str(ROOT / "runbooks"))
    assert code == 0, out
    grants = line(out, "grants")
    assert grants.startswith("ok"), out
    assert "delete pods: needed by runbook inference (eviction.force: delete)" in out
    assert "patch nodes: not needed" in out and "deploy/rbac-node-fallback.yaml" in out
    assert "create,get,delete jobs.batch: needed by runbook batch (repair.enabled)" in grants


async def test_repairing_runbooks_without_the_repair_grants_are_an_error(tmp_path: Path) -> None:
    rules = deploy_rules("sickbay", ROLE_FORCE_DELETE, ROLE_NODE_FALLBACK, ROLE_HEALTH_WATCHER)
    with twin(tmp_path, "1.37", proxy_rules=rules) as t:
        code, out = doctor(t.kubeconfig, "--runbooks", str(ROOT / "runbooks"))
    assert code == 1, out
    grants = line(out, "grants")
    assert grants.startswith("error"), out
    assert "get pods/log: needed by runbook" in grants and "but NOT granted" in grants
    assert "apply deploy/rbac-repair.yaml" in out


async def test_forcing_runbook_without_its_grant_is_an_error(tmp_path: Path) -> None:
    rules = deploy_rules("sickbay", ROLE_NODE_FALLBACK)  # rbac-force-delete.yaml dropped
    with twin(tmp_path, "1.37", proxy_rules=rules) as t:
        code, out = doctor(t.kubeconfig, "--runbooks", str(_runbooks(tmp_path, "delete")))
    assert code == 1, out
    errors = [ln for ln in out.splitlines() if ln.startswith("error")]
    assert any("delete pods" in ln and "stuck-pods" in ln for ln in errors), out
    assert "deploy/rbac-force-delete.yaml" in out


async def test_dropped_grants_nothing_needs_are_fine(tmp_path: Path) -> None:
    with twin(tmp_path, "1.37", proxy_rules=deploy_rules("sickbay")) as t:
        code, out = doctor(t.kubeconfig, "--runbooks", str(_runbooks(tmp_path, "eviction-api")))
    assert code == 0, out
    assert not [ln for ln in out.splitlines() if ln.startswith("error")], out
    assert line(out, "permissions").startswith("ok"), out
    assert "delete pods: not needed" in out and "patch nodes: not needed" in out
    assert f"not granted ({ROLE_FORCE_DELETE})" in out


async def test_fallback_cluster_needs_node_patch(tmp_path: Path) -> None:
    rules = deploy_rules("sickbay", ROLE_FORCE_DELETE)  # rbac-node-fallback.yaml dropped
    with twin(tmp_path, "device-plugin", proxy_rules=rules) as t:
        code, out = doctor(t.kubeconfig, "--runbooks", str(_runbooks(tmp_path, "none")))
    assert code == 1, out
    errors = [ln for ln in out.splitlines() if ln.startswith("error")]
    assert any("patch nodes" in ln and "no DeviceTaintRule" in ln for ln in errors), out


async def test_runbooks_that_do_not_load_are_an_error(tmp_path: Path) -> None:
    bad = tmp_path / "bad"
    bad.mkdir()
    (bad / "x.yaml").write_text("apiVersion: sickbay/v1\nkind: Runbook\nmetadata: {}\n")
    with twin(tmp_path, "1.37", proxy_rules=deploy_rules()) as t:
        code, out = doctor(t.kubeconfig, "--runbooks", str(bad))
    assert code == 1
    assert line(out, "runbooks").startswith("error") and "x.yaml" in out


def test_needed_names_the_runbook_choice_of_each_optional_grant() -> None:
    from activities.kube.permissions import PERMISSIONS, needed
    from contract.runbook import Runbook

    def runbook(name: str, spec: dict[str, object]) -> Runbook:
        return Runbook.model_validate(
            {
                "apiVersion": "sickbay/v1",
                "kind": "Runbook",
                "metadata": {"name": name},
                "spec": spec,
            }
        )

    plain = runbook("plain", {})
    forcing = runbook("forcing", {"eviction": {"force": "delete"}})
    capi = runbook("capi", {"scaleUp": {"enabled": True, "provider": "cluster-api", "maxSize": 4}})
    optional = [p for p in PERMISSIONS if not p.required]
    # nodes patch is in two roles: the fallback's (by_resource) and the AKS reboot's record
    by_resource = {
        p.resource: p for p in optional if (p.resource, p.role) != ("nodes", ROLE_REPAIR_MACHINES)
    }
    (aks_record,) = [p for p in optional if p.role == ROLE_REPAIR_MACHINES and p.plural == "nodes"]
    assert set(by_resource) == {
        "nodes",
        "pods",
        "devicetaintrules",
        "machinedeployments",
        "jobs",
        "resourceclaims",
        "pods/log",
        "events",
        "machines",
    }
    repairing = runbook("repairing", {"repair": {"enabled": True, "order": ["reset"]}})
    assert needed(by_resource["jobs"], [plain, capi], True) == []
    assert needed(by_resource["jobs"], [plain, repairing], True) == [
        "runbook repairing (repair.enabled)"
    ]
    assert needed(by_resource["machines"], [repairing], True) == []  # a reset only
    assert needed(by_resource["pods"], [plain, capi], True) == []
    assert needed(by_resource["pods"], [plain, forcing], True) == [
        "runbook forcing (eviction.force: delete)"
    ]
    assert needed(by_resource["nodes"], [forcing], True) == []
    assert needed(by_resource["nodes"], [plain], False)  # the fallback patches nodes
    assert needed(by_resource["devicetaintrules"], [plain], False) == []
    assert needed(by_resource["machinedeployments"], [plain, forcing], True) == []
    assert needed(by_resource["machinedeployments"], [capi], True) == [
        "runbook capi (scaleUp provider cluster-api)"
    ]
    assert all(needed(p, [], True) == ["always"] for p in PERMISSIONS if p.required)
    aks = runbook(
        "aks",
        {
            "scaleUp": {"provider": "aks", "maxSize": 4},
            "repair": {"enabled": True, "order": ["reset", "reboot"]},
        },
    )
    aks_reset = runbook(
        "aks-reset",
        {
            "scaleUp": {"provider": "aks", "maxSize": 4},
            "repair": {"enabled": True, "order": ["reset"]},
        },
    )
    assert needed(aks_record, [aks, aks_reset, repairing], True) == [
        "runbook aks (repair: reboot through provider aks)"
    ]
    assert needed(aks_record, [plain], False) == []  # the fallback's need is its own grant
