"""The CLI's verified path: `sickbay approve|reject|abort|repaired|extend-deadline|launch|pause|
resume --via URL` and `sickbay gpus unretire --via URL` (or SICKBAY_ACTIONS_URL). The person's Kubernetes bearer token, read from their kubeconfig by
the official client (a static token or an exec plugin's, as kubectl uses it), goes to the
webhook's `POST /v1/actions`, which checks it with TokenReview and the action with a
SubjectAccessReview, and records the action as *verified* (worker/webhook/actions.py).
The token is sent in the Authorization header only, never printed or logged.
"""

from __future__ import annotations

import sys
from typing import Any

import httpx

# The endpoint waits up to 10 s for the workflow to take a signal in, an update up to
# Temporal's own bound; 60 s covers both with a slow Kubernetes API in front.
VIA_TIMEOUT = 60.0


class NoBearerToken(Exception):
    pass


def bearer_token(settings: Any) -> str:
    """The kubeconfig's bearer token (running its exec plugin if it has one)."""
    from kubernetes import client as k8s
    from kubernetes import config as k8s_config

    cfg = k8s.Configuration()
    try:
        k8s_config.load_kube_config(
            config_file=str(settings.kubeconfig) if settings.kubeconfig else None,
            context=settings.kube_context,
            client_configuration=cfg,
        )
    except Exception as exc:  # no kubeconfig, bad context, exec plugin failed
        raise NoBearerToken(f"cannot load your kubeconfig: {exc}") from None
    # The client keeps it as api_key["BearerToken"] (37.x; "authorization" in older ones).
    keys = cfg.api_key or {}
    header = str(keys.get("BearerToken") or keys.get("authorization") or "")
    scheme, _, token = header.partition(" ")
    if scheme.lower() != "bearer" or not token:
        raise NoBearerToken(
            "your kubeconfig's user has no bearer token (client certificates cannot be "
            "forwarded): use a token or an exec-plugin (OIDC, cloud) user"
        )
    return token


def send(settings: Any, via: str, body: dict[str, Any]) -> int:
    """POST the action; print the outcome in one line; the exit code."""
    try:
        token = bearer_token(settings)
    except NoBearerToken as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    url = via.rstrip("/") + "/v1/actions"
    try:
        resp = httpx.post(
            url,
            json=body,
            headers={"Authorization": f"Bearer {token}"},
            timeout=VIA_TIMEOUT,
        )
    except httpx.HTTPError as exc:
        print(f"error: cannot reach the actions endpoint {url}: {exc}", file=sys.stderr)
        return 1
    try:
        answer = resp.json()
    except ValueError:
        answer = {"error": resp.text[:200]}
    if resp.status_code == 200:
        extra = f" (phase {answer['phase']})" if answer.get("phase") else ""
        print(
            f"{answer.get('workflow_id')} {answer.get('status')}{extra}, "
            f"verified as {answer.get('actor')}"
        )
        return 0
    if resp.status_code == 202:
        print(f"warning: {answer.get('workflow_id')}: {answer.get('status')}", file=sys.stderr)
        return 1
    print(f"refused ({resp.status_code}): {answer.get('error')}", file=sys.stderr)
    return 1
