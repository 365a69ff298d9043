"""TokenReview (authentication.k8s.io/v1) and SubjectAccessReview (authorization.k8s.io/v1),
served by the twin as the API does, through the official client:

- a person's token (`Twin.add_user`) is authenticated with username, uid and groups (plus
  system:authenticated); an unknown token is a 201 with an empty user and no `authenticated`;
  an empty token is 400;
- a SubjectAccessReview is answered from the RBAC objects the twin stores: allowed with the
  RBAC reason for a person a ClusterRoleBinding grants the verb, by user or by group, and
  `resourceNames` restricts it; denied for anyone else; system:masters is allowed;
  neither user nor groups is a 422;
- a request presenting a person's token runs as that person, so RBAC governs it.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from twin.testing import RunningTwin

RBAC = "rbac.authorization.k8s.io"


@pytest.fixture
def grants(twin: RunningTwin) -> Iterator[str]:
    """A ClusterRole granting approve/repaired on sickbay.dev remediations, bound to user
    alice and group sre-leads; a second one limited to one resource name for carol."""
    tag = uuid.uuid4().hex[:6]
    store = twin.store
    store.create(
        f"clusterroles.{RBAC}",
        {
            "metadata": {"name": f"approvers-{tag}"},
            "rules": [
                {
                    "apiGroups": ["sickbay.dev"],
                    "resources": ["remediations"],
                    "verbs": ["approve", "repaired"],
                }
            ],
        },
    )
    store.create(
        f"clusterroles.{RBAC}",
        {
            "metadata": {"name": f"one-{tag}"},
            "rules": [
                {
                    "apiGroups": ["sickbay.dev"],
                    "resources": ["remediations"],
                    "resourceNames": ["sickbay-gpu-a"],
                    "verbs": ["abort"],
                }
            ],
        },
    )
    for name, role, subjects in (
        (
            f"approvers-{tag}",
            f"approvers-{tag}",
            [
                {"kind": "User", "apiGroup": RBAC, "name": f"alice-{tag}"},
                {"kind": "Group", "apiGroup": RBAC, "name": f"sre-leads-{tag}"},
            ],
        ),
        (f"one-{tag}", f"one-{tag}", [{"kind": "User", "apiGroup": RBAC, "name": f"carol-{tag}"}]),
    ):
        store.create(
            f"clusterrolebindings.{RBAC}",
            {
                "metadata": {"name": name},
                "roleRef": {"apiGroup": RBAC, "kind": "ClusterRole", "name": role},
                "subjects": subjects,
            },
        )
    yield tag
    for name in (f"approvers-{tag}", f"one-{tag}"):
        store.delete(f"clusterrolebindings.{RBAC}", name)
        store.delete(f"clusterroles.{RBAC}", name)


def _post(call: Any, body: dict[str, Any]) -> tuple[int, dict[str, Any]]:
    try:
        resp = call(body, _preload_content=False)
        return resp.status, json.loads(resp.data)
    except ApiException as exc:
        return exc.status, json.loads(exc.body)


def token_review(api: client.ApiClient, token: str) -> tuple[int, dict[str, Any]]:
    return _post(
        client.AuthenticationV1Api(api).create_token_review,
        {"apiVersion": "authentication.k8s.io/v1", "kind": "TokenReview", "spec": {"token": token}},
    )


def sar(
    api: client.ApiClient, user: str, groups: list[str], verb: str, name: str = "sickbay-gpu-a"
) -> tuple[int, dict[str, Any]]:
    return _post(
        client.AuthorizationV1Api(api).create_subject_access_review,
        {
            "apiVersion": "authorization.k8s.io/v1",
            "kind": "SubjectAccessReview",
            "spec": {
                "user": user,
                "groups": groups,
                "resourceAttributes": {
                    "group": "sickbay.dev",
                    "resource": "remediations",
                    "verb": verb,
                    "name": name,
                },
            },
        },
    )


def test_token_review(twin: RunningTwin, api: client.ApiClient) -> None:
    token = f"tok-{uuid.uuid4().hex}"
    twin.twin.add_user(token, "alice@example.com", ["sre"])
    code, review = token_review(api, token)
    assert code == 201
    assert (review["kind"], review["apiVersion"]) == ("TokenReview", "authentication.k8s.io/v1")
    assert review["status"] == {
        "authenticated": True,
        "user": {
            "username": "alice@example.com",
            "uid": "uid-alice@example.com",
            "groups": ["sre", "system:authenticated"],
        },
    }
    code, review = token_review(api, "not-a-known-token")
    assert code == 201 and review["status"] == {"user": {}}
    code, status = token_review(api, "")
    assert code == 400 and status["reason"] == "BadRequest"


def test_subject_access_review(api: client.ApiClient, grants: str) -> None:
    tag = grants
    code, review = sar(api, f"alice-{tag}", ["system:authenticated"], "approve")
    assert code == 201 and review["kind"] == "SubjectAccessReview"
    assert review["status"]["allowed"] is True
    assert f'ClusterRole "approvers-{tag}"' in review["status"]["reason"]
    # By group, and a verb the role does not grant.
    assert sar(api, "dave", [f"sre-leads-{tag}"], "repaired")[1]["status"]["allowed"] is True
    assert sar(api, f"alice-{tag}", [], "unretire")[1]["status"] == {"allowed": False}
    assert sar(api, "mallory", ["system:authenticated"], "approve")[1]["status"] == {
        "allowed": False
    }
    # resourceNames: carol may abort one remediation, not another.
    assert sar(api, f"carol-{tag}", [], "abort")[1]["status"]["allowed"] is True
    assert sar(api, f"carol-{tag}", [], "abort", "sickbay-gpu-b")[1]["status"] == {"allowed": False}
    assert sar(api, "root", ["system:masters"], "launch")[1]["status"]["allowed"] is True
    code, status = sar(api, "", [], "approve")
    assert code == 422 and "at least one of user or group" in status["message"]


def test_a_persons_token_runs_as_that_person(twin: RunningTwin, grants: str) -> None:
    token = f"tok-{uuid.uuid4().hex}"
    twin.twin.add_user(token, f"alice-{grants}", [])
    cfg = client.Configuration()
    cfg.host = twin.url
    cfg.api_key = {"authorization": f"Bearer {token}"}
    with client.ApiClient(cfg) as as_alice:
        with pytest.raises(ApiException) as refused:
            client.CoreV1Api(as_alice).list_namespace()
        assert refused.value.status == 403
        message = json.loads(refused.value.body)["message"]
        assert f'User "alice-{grants}" cannot list resource "namespaces"' in message
