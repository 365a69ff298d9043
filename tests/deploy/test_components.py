"""The optional grants as kustomize components (deploy/components/<name>).

Cases (kubectl builds them; no cluster needed):
- `kubectl kustomize deploy/` (the default install) holds the roles of exactly the components
  the shipped runbooks need (`components_needed` over runbooks/*.yaml on a cluster serving
  DeviceTaintRule: node-patch, force-delete, repair) and none of the others;
- an overlay adding every other component builds, and then holds every component's role,
  each bound to the worker's ServiceAccount only;
- docs/deploy.md names every component.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from activities.kube.permissions import COMPONENTS, components_needed
from activities.runbooks import load_dir

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy"


def _build(directory: Path) -> list[dict[str, Any]]:
    kubectl = shutil.which("kubectl")
    if kubectl is None:
        reason = "kubectl is not installed: apt-get install kubectl"
        if os.environ.get("SICKBAY_REQUIRE_KUBECTL", "").lower() in ("1", "true", "yes"):
            pytest.fail(f"SICKBAY_REQUIRE_KUBECTL is set but {reason}")
        pytest.skip(reason)
    done = subprocess.run(
        [kubectl, "kustomize", str(directory)], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    return [d for d in yaml.safe_load_all(done.stdout) if d]


def _roles(objects: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    return {o["metadata"]["name"]: o for o in objects if o["kind"] in ("Role", "ClusterRole")}


def _bindings(objects: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    kinds = ("RoleBinding", "ClusterRoleBinding")
    return {o["roleRef"]["name"]: o for o in objects if o["kind"] in kinds}


def test_the_default_install_has_what_the_shipped_runbooks_need() -> None:
    needed = components_needed(load_dir(ROOT / "runbooks").runbooks, taint_rules_served=True)
    assert needed == ["node-patch", "force-delete", "repair"]
    listed = yaml.safe_load((DEPLOY / "kustomization.yaml").read_text())["components"]
    assert listed == [f"components/{name}" for name in needed]
    roles = _roles(_build(DEPLOY))
    for role, component in COMPONENTS.items():
        assert (role in roles) == (component in needed), (role, component)


def test_every_component_builds_onto_the_default(tmp_path: Path) -> None:
    base = os.path.relpath(DEPLOY, tmp_path)  # kustomize takes relative directories only
    listed = yaml.safe_load((DEPLOY / "kustomization.yaml").read_text())["components"]
    extra = [
        f"{base}/components/{c}" for c in COMPONENTS.values() if f"components/{c}" not in listed
    ]
    assert extra, "every component is in the default install: nothing is opt-in"
    (tmp_path / "kustomization.yaml").write_text(
        yaml.safe_dump(
            {
                "apiVersion": "kustomize.config.k8s.io/v1beta1",
                "kind": "Kustomization",
                "resources": [base],
                "components": extra,
            }
        )
    )
    objects = _build(tmp_path)
    roles, bindings = _roles(objects), _bindings(objects)
    for role in COMPONENTS:
        assert role in roles, role
        assert bindings[role]["subjects"] == [
            {"kind": "ServiceAccount", "name": "sickbay", "namespace": "sickbay"}
        ]


def test_the_docs_name_every_component() -> None:
    text = (ROOT / "docs" / "deploy.md").read_text()
    for component in COMPONENTS.values():
        assert f"`{component}`" in text, component
