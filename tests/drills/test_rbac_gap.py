"""Drill: an RBAC gap — the worker's ClusterRole lacks `create` on devicetaintrules.

The embedded stack's worker is replaced by one whose kubeconfig goes through an RBAC proxy
(tests/activities/kube/rbac_proxy.py) enforcing deploy/rbac.yaml minus that one permission;
the proxy answers 403 with the Status body a real API server sends. A GPU under an inference
Deployment fails. Expected:

- the remediation escalates and closes, its reason names the missing permission (verb,
  resource, group), and nothing is tainted;
- no loop: the forbidden create is tried once (non-retryable), one escalation reaches the sink,
  and a repeat of the alert does not start another escalation while the incident is open
  (the twin's Alertmanager stand-in keeps re-sending while the fault lasts).
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.activities.kube.conftest import ROLES
from tests.activities.kube.rbac_proxy import RbacProxy
from tests.drills.conftest import closed, drill_stack

pytestmark = [pytest.mark.slow, pytest.mark.devserver]

ROOT = Path(__file__).resolve().parents[2]


def rbac_without(group: str, resource: str, verb: str) -> list[dict[str, Any]]:
    rules = [
        rule
        for doc in yaml.safe_load_all((ROOT / "deploy" / "rbac.yaml").read_text())
        if doc and doc["kind"] == "ClusterRole"
        for rule in doc["rules"]
    ]
    out: list[dict[str, Any]] = []
    for rule in copy.deepcopy(rules):
        if group in rule["apiGroups"] and resource in rule["resources"] and verb in rule["verbs"]:
            others = [r for r in rule["resources"] if r != resource]
            if others:
                out.append({**rule, "resources": others})
            out.append(
                {**rule, "resources": [resource], "verbs": [v for v in rule["verbs"] if v != verb]}
            )
        else:
            out.append(rule)
    return out


def via_proxy(kubeconfig: Path, url: str, dest: Path) -> Path:
    config = yaml.safe_load(kubeconfig.read_text())
    config["clusters"][0]["cluster"]["server"] = url
    dest.write_text(yaml.safe_dump(config))
    dest.chmod(0o600)
    return dest


async def test_missing_create_permission_escalates_once_naming_it(tmp_path: Path) -> None:
    async with drill_stack(tmp_path) as d:
        demo = d.demo
        rules = rbac_without("resource.k8s.io", "devicetaintrules", "create")
        # The namespaced Roles stay (the recorded cluster name, the watcher's Lease).
        with RbacProxy(d.info.kube_url, rules, roles=ROLES) as proxy:
            path = via_proxy(Path(d.info.kubeconfig), proxy.url, tmp_path / "kubeconfig-rbac")
            d.kill_worker()
            d.start_worker(kubeconfig=str(path))

            ns = "drill-rbac"
            await demo.namespace(ns)
            await demo.deployment(ns, "serve", replicas=1)
            [(_, device)] = await demo.running(ns, "serve")
            gpu = await demo.gpu(device)
            await demo.fail(gpu)
            incident = await demo.incident(gpu, "drill: RBAC gap")
            result = await closed(demo, incident, within=90)

            assert result.outcome == "escalated", (result.outcome, result.reason)
            reason = result.reason.lower()
            assert "devicetaintrules" in reason and "create" in reason, result.reason
            assert d.rule_creates() == [] and d.rules() == []
            denied = [
                a
                for a in proxy.denied
                if a["resource"] == "devicetaintrules" and a["verb"] == "create"
            ]
            assert len(denied) == 1, f"the forbidden create was retried: {denied}"
            pages = d.notifications()
            assert len(pages) == 1, pages
            assert "devicetaintrules" in str(pages[0]).lower()
