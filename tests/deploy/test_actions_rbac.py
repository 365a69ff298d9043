"""The RBAC deploy/ ships for verified actors:

- ClusterRole sickbay-actions (deploy/rbac.yaml) grants exactly WEBHOOK_PERMISSIONS
  (tokenreviews and subjectaccessreviews create), bound to the webhook's ServiceAccount only;
- the example roles for people (deploy/examples/people-roles.yaml) name only the documented verbs on
  remediations.sickbay.dev, and, applied to the twin, a SubjectAccessReview answers as
  documented: approvers may approve but not mark repaired or pause, operators may un-retire,
  launch, pause and resume.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml
from kubernetes import client

from activities.kube.permissions import ROLE_ACTIONS, WEBHOOK_PERMISSIONS
from contract.actors import ACTION_VERBS, ACTIONS_API_GROUP, ACTIONS_RESOURCE
from twin.testing import RunningTwin

ROOT = Path(__file__).resolve().parents[2]
RBAC = "rbac.authorization.k8s.io"


def _docs(name: str) -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all((ROOT / "deploy" / name).read_text()) if d]


def test_the_webhook_may_review_tokens_and_access_nothing_else() -> None:
    docs = _docs("rbac.yaml")
    (role,) = [
        d for d in docs if d["kind"] == "ClusterRole" and d["metadata"]["name"] == ROLE_ACTIONS
    ]
    granted = {
        (g, r, v)
        for rule in role["rules"]
        for g in rule["apiGroups"]
        for r in rule["resources"]
        for v in rule["verbs"]
    }
    assert granted == {(p.group, p.resource, v) for p in WEBHOOK_PERMISSIONS for v in p.verbs}
    (binding,) = [
        d
        for d in docs
        if d["kind"] == "ClusterRoleBinding" and d["roleRef"]["name"] == ROLE_ACTIONS
    ]
    assert binding["subjects"] == [
        {"kind": "ServiceAccount", "name": "sickbay-webhook", "namespace": "sickbay"}
    ]


def test_people_roles_answer_as_documented(twin: RunningTwin) -> None:
    docs = _docs("examples/people-roles.yaml")
    for role in (d for d in docs if d["kind"] == "ClusterRole"):
        for rule in role["rules"]:
            assert rule["apiGroups"] == [ACTIONS_API_GROUP]
            assert rule["resources"] == [ACTIONS_RESOURCE]
            assert set(rule["verbs"]) <= set(ACTION_VERBS)
    plural = {"ClusterRole": "clusterroles", "ClusterRoleBinding": "clusterrolebindings"}
    for d in docs:
        twin.store.create(f"{plural[d['kind']]}.{RBAC}", d)
    try:
        authz = client.AuthorizationV1Api(twin.api_client())

        def may(group: str, verb: str) -> bool:
            review = authz.create_subject_access_review(
                {
                    "apiVersion": "authorization.k8s.io/v1",
                    "kind": "SubjectAccessReview",
                    "spec": {
                        "user": "someone",
                        "groups": [group, "system:authenticated"],
                        "resourceAttributes": {
                            "group": ACTIONS_API_GROUP,
                            "resource": ACTIONS_RESOURCE,
                            "verb": verb,
                            "name": "sickbay-gpu-n1-gpu-1",
                        },
                    },
                }
            )
            return bool(review.status.allowed)

        assert may("ml-platform-oncall", "approve")
        assert not may("ml-platform-oncall", "repaired")
        assert may("gpu-sre", "unretire") and may("gpu-sre", "repaired")
        assert may("gpu-sre", "pause") and may("gpu-sre", "resume") and may("gpu-sre", "launch")
        assert not may("ml-platform-oncall", "pause")
        assert not may("developers", "abort")
    finally:
        for d in docs:
            twin.store.delete(f"{plural[d['kind']]}.{RBAC}", d["metadata"]["name"])
