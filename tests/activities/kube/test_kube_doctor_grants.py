"""`sickbay doctor` says which optional grants the loaded runbooks and the cluster need.

The twin behind the RBAC proxy, holding the ClusterRoles deploy/ ships (all, or with the
optional ones dropped); runbooks from `--runbooks DIR`.

Cases:
- the shipped runbooks on a cluster serving DeviceTaintRule, every role applied: ok; the
  `grants` line names the `inference` runbook as needing pods delete, and nodes patch as
  needed by the churn stop's cordon (replacement.onChurn: cordon, every shipped runbook); the
  `components` line names node-patch, force-delete and repair;
- the shipped runbooks without components/node-patch: error naming the churn stop's cordon
  and the component to add, exit 1 (the churn stop's cordon would get 403);
- the shipped runbooks (they repair) without components/repair: error naming the repair grants
  and the component to add, exit 1;
- a runbook with `eviction.force: delete` and components/force-delete dropped: error naming
  the runbook and the missing grant, exit 1;
- no forcing runbook, onChurn noschedule, the optional roles dropped, DeviceTaintRule served:
  no error, the components named as droppable;
- a cluster serving no DeviceTaintRule (device plugin) without components/node-patch: error,
  the fallback needs nodes patch;
- runbooks that do not load: error naming the problem;
- `needed()` per optional grant: pods delete only for `eviction.force: delete` runbooks, nodes
  patch for onChurn cordon, without DeviceTaintRule, for replace + validation and AKS reboots,
  DeviceTaintRule verbs only with it, Cluster API verbs only for `cluster-api` runbooks.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from activities.kube.permissions import (
    ROLE_CLUSTER_NAME,
    ROLE_FORCE_DELETE,
    ROLE_HEALTH_WATCHER,
    ROLE_NODE_INCIDENT,
    ROLE_NODE_PATCH,
    ROLE_REPAIR,
)
from tests.activities.kube.conftest import twin
from tests.activities.kube.rbac_proxy import deploy_rules
from tests.activities.kube.test_kube_doctor import doctor, line

# The shipped runbooks repair: the worker has an allowlist (else doctor says none).
pytestmark = pytest.mark.usefixtures("repair_allowlist_env")

ROOT = Path(__file__).resolve().parents[3]


BASE = ("sickbay", ROLE_HEALTH_WATCHER, ROLE_CLUSTER_NAME)


def _runbooks(tmp_path: Path, force: str, on_churn: str = "cordon") -> Path:
    directory = tmp_path / f"runbooks-{force}-{on_churn}"
    directory.mkdir()
    (directory / "one.yaml").write_text(
        "apiVersion: sickbay/v1\nkind: Runbook\nmetadata:\n  name: stuck-pods\n"
        f"spec:\n  eviction:\n    mode: taint\n    force: {force}\n"
        f"  replacement:\n    onChurn: {on_churn}\n"
        # The node incident's grants are checked on their own (below): off here.
        "  nodeIncident:\n    enabled: false\n"
    )
    return directory


async def test_shipped_runbooks_need_their_components(tmp_path: Path) -> None:
    with twin(tmp_path, "1.37", proxy_rules=deploy_rules()) as t:
        code, out = doctor(t.kubeconfig, "--runbooks", str(ROOT / "runbooks"))
    assert code == 0, out
    grants = line(out, "grants")
    assert grants.startswith("ok"), out
    assert "delete pods: needed by runbook inference (eviction.force: delete)" in out
    every = "batch, default, inference, long-session, maintenance, training"
    assert f"patch nodes: needed by runbooks {every} (replacement.onChurn: cordon)" in grants
    repairing = "batch, default, inference, long-session, training"
    assert (
        f"create,get,delete jobs.batch: needed by runbooks {repairing} (repair.enabled)" in grants
    )
    components = line(out, "components")
    assert components.endswith("node-patch, force-delete, repair"), components


async def test_churn_cordon_without_node_patch_is_an_error(tmp_path: Path) -> None:
    rules = deploy_rules(*BASE, ROLE_FORCE_DELETE, ROLE_REPAIR)  # no components/node-patch
    with twin(tmp_path, "1.37", proxy_rules=rules) as t:
        code, out = doctor(t.kubeconfig, "--runbooks", str(ROOT / "runbooks"))
    assert code == 1, out
    grants = line(out, "grants")
    assert grants.startswith("error"), out
    assert "patch nodes: needed by runbooks batch, default" in grants
    assert "(replacement.onChurn: cordon)" in grants and "but NOT granted" in grants
    assert "add component deploy/components/node-patch" in out


async def test_repairing_runbooks_without_the_repair_grants_are_an_error(tmp_path: Path) -> None:
    rules = deploy_rules(*BASE, ROLE_FORCE_DELETE, ROLE_NODE_PATCH)  # no components/repair
    with twin(tmp_path, "1.37", proxy_rules=rules) as t:
        code, out = doctor(t.kubeconfig, "--runbooks", str(ROOT / "runbooks"))
    assert code == 1, out
    grants = line(out, "grants")
    assert grants.startswith("error"), out
    assert "get pods/log: needed by runbook" in grants and "but NOT granted" in grants
    assert "add component deploy/components/repair" in out


async def test_forcing_runbook_without_its_grant_is_an_error(tmp_path: Path) -> None:
    rules = deploy_rules(*BASE, ROLE_NODE_PATCH)  # components/force-delete dropped
    with twin(tmp_path, "1.37", proxy_rules=rules) as t:
        code, out = doctor(t.kubeconfig, "--runbooks", str(_runbooks(tmp_path, "delete")))
    assert code == 1, out
    errors = [ln for ln in out.splitlines() if ln.startswith("error")]
    assert any("delete pods" in ln and "stuck-pods" in ln for ln in errors), out
    assert "deploy/components/force-delete" in out


async def test_dropped_grants_nothing_needs_are_fine(tmp_path: Path) -> None:
    runbooks = _runbooks(tmp_path, "eviction-api", on_churn="noschedule")
    with twin(tmp_path, "1.37", proxy_rules=deploy_rules(*BASE)) as t:
        code, out = doctor(t.kubeconfig, "--runbooks", str(runbooks))
    assert code == 0, out
    assert not [ln for ln in out.splitlines() if ln.startswith("error")], out
    assert line(out, "permissions").startswith("ok"), out
    assert "delete pods: not needed" in out and "patch nodes: not needed" in out
    assert f"not granted ({ROLE_FORCE_DELETE})" in out
    assert line(out, "components").endswith("need deploy/components: none"), out


async def test_fallback_cluster_needs_node_patch(tmp_path: Path) -> None:
    rules = deploy_rules(*BASE, ROLE_FORCE_DELETE)  # components/node-patch dropped
    runbooks = _runbooks(tmp_path, "none", on_churn="noschedule")
    with twin(tmp_path, "device-plugin", proxy_rules=rules) as t:
        code, out = doctor(t.kubeconfig, "--runbooks", str(runbooks))
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
        spec = {"replacement": {"onChurn": "noschedule"}, **spec}
        return Runbook.model_validate(
            {
                "apiVersion": "sickbay/v1",
                "kind": "Runbook",
                "metadata": {"name": name},
                "spec": spec,
            }
        )

    plain = runbook("plain", {})
    cordoning = runbook("cordoning", {"replacement": {"onChurn": "cordon"}})
    forcing = runbook("forcing", {"eviction": {"force": "delete"}})
    capi = runbook("capi", {"scaleUp": {"enabled": True, "provider": "cluster-api", "maxSize": 4}})
    optional = [p for p in PERMISSIONS if not p.required]
    by_resource = {p.resource: p for p in optional if p.role != ROLE_NODE_INCIDENT}
    # one optional Permission per resource, the node incident's (a role of its own) aside
    assert len(by_resource) == len([p for p in optional if p.role != ROLE_NODE_INCIDENT])
    node_incident = [p for p in optional if p.role == ROLE_NODE_INCIDENT]
    assert {(p.resource, p.verbs) for p in node_incident} == {
        ("nodes", ("patch",)),
        ("nodes/status", ("patch",)),
        ("pods", ("delete",)),
        ("runtimeclasses", ("get",)),
    }
    default_off = runbook("default", {"nodeIncident": {"enabled": False}})
    for p in node_incident:  # read from the runbook named default, else the first
        assert needed(p, [forcing, plain], True) == ["runbook forcing (nodeIncident.enabled)"]
        assert needed(p, [plain, default_off], True) == []
        assert needed(p, [], True) == []
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
    nodes = by_resource["nodes"]
    repairing = runbook(
        "repairing", {"repair": {"enabled": True, "order": ["reset"]}, "validation": {}}
    )
    assert needed(by_resource["jobs"], [plain, capi], True) == []
    assert needed(by_resource["jobs"], [plain, repairing], True) == [
        "runbook repairing (repair.enabled)"
    ]
    assert needed(by_resource["machines"], [repairing], True) == []  # a reset only
    assert needed(by_resource["pods"], [plain, capi], True) == []
    assert needed(by_resource["pods"], [plain, forcing], True) == [
        "runbook forcing (eviction.force: delete)"
    ]
    assert needed(nodes, [forcing], True) == []
    assert needed(nodes, [plain], False)  # the fallback patches nodes
    assert needed(nodes, [plain, cordoning], True) == [
        "runbook cordoning (replacement.onChurn: cordon)"
    ]
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
    assert needed(nodes, [aks, aks_reset, repairing], True) == [
        "runbook aks (repair: reboot through provider aks)"
    ]
    replacing = runbook("replacing", {"repair": {"enabled": True, "order": ["replace"]}})
    unvalidated = runbook(
        "unvalidated",
        {"repair": {"enabled": True, "order": ["replace"]}, "validation": {"enabled": False}},
    )
    assert needed(nodes, [replacing, unvalidated], True) == [
        "runbook replacing (repair: replace cordons the new node while validation runs)"
    ]
