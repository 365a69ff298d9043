"""The twin's AWS shapes for tests: a `CloudApi` on loopback, the test's own (fake) AWS
credentials in the environment, and an `AwsConfig` whose endpoints point boto3 at the twin."""

from __future__ import annotations

import pytest

from activities.cloud.config import AwsConfig
from twin.cloudapi import CloudApiServer

REGION = "us-twin-1"


def aws_env(monkeypatch: pytest.MonkeyPatch, key_id: str) -> None:
    """The environment leg of boto3's standard chain, and nothing else of this machine's: no
    shared files, no profile, no instance metadata."""
    for var in ("AWS_PROFILE", "AWS_SESSION_TOKEN", "AWS_ROLE_ARN", "AWS_WEB_IDENTITY_TOKEN_FILE"):
        monkeypatch.delenv(var, raising=False)
    for var in ("AWS_CONTAINER_CREDENTIALS_FULL_URI", "AWS_CONTAINER_CREDENTIALS_RELATIVE_URI"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", key_id)
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "twin-secret-for-tests")
    monkeypatch.setenv("AWS_CONFIG_FILE", "/nonexistent/aws-config")
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", "/nonexistent/aws-credentials")
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")


def aws_config(server: CloudApiServer, **extra: object) -> AwsConfig:
    base = server.url
    return AwsConfig(
        region=REGION,
        cluster=server.api.cluster,
        endpoints={
            "eks": f"{base}/aws/eks",
            "ec2": f"{base}/aws/ec2",
            "autoscaling": f"{base}/aws/autoscaling",
        },
        **extra,  # type: ignore[arg-type]
    )
