"""`sickbay doctor`'s cloud checks: for each cloud this worker is set up for (or a runbook
names), where its credentials come from and, for AWS, whether they reach what the runbooks
name. Read-only: nothing is scaled, rebooted or written.

- AWS (provider `eks`): a region; the credential the AWS SDK's standard chain finds and which
  leg found it (EKS Pod Identity, IRSA web identity, environment, shared file, instance
  profile); `sts:GetCallerIdentity` (needs no permission: who Sickbay acts as); for every EKS
  node group a runbook names, `eks:DescribeNodegroup` (its size and bounds, or the permission
  it lacks).
- GKE: a ready token, or google-auth's Application Default Credentials and their kind
  (metadata server / Workload Identity, Workload Identity Federation, service-account key).
- AKS: a ready token, or the variables azure-identity signs in with (workload identity's
  federated token file readable, or managed identity); no token is asked for.

`cloud_checks` returns `worker.doctor.Check`s; `worker/doctor.py` prints them with the rest.
AWS calls here are synchronous boto3 (doctor is a CLI, not an activity).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from activities.cloud.config import CloudConfig
from activities.cloud.machines import aks_configured, aws_configured, gke_configured
from activities.outbound import ConfigError
from contract.capacity import NodePoolTarget
from contract.runbook import Runbook
from worker.doctor import Check

# How each leg of boto3's chain names itself (Credentials.method) -> what a person calls it.
AWS_METHODS = {
    "container-role": "EKS Pod Identity (container credentials)",
    "assume-role-with-web-identity": "IRSA (web identity token)",
    "env": "environment variables (AWS_ACCESS_KEY_ID)",
    "shared-credentials-file": "shared credentials file",
    "config-file": "shared config file",
    "iam-role": "instance profile (node IAM role via IMDS)",
    "sso": "IAM Identity Center (SSO) profile",
    "assume-role": "assumed role from a profile",
}


def _pools(runbooks: list[Runbook] | None, provider: str) -> list[NodePoolTarget]:
    found: list[NodePoolTarget] = []
    for runbook in runbooks or []:
        scale_up = runbook.spec.scale_up
        if scale_up.pool is not None and scale_up.pool.provider == provider:
            found.append(scale_up.pool)
        elif scale_up.pool is None and scale_up.provider == provider:
            found.append(NodePoolTarget(provider=provider, name=""))  # the failed node's pool
    return found


def cloud_checks(
    runbooks: list[Runbook] | None, config: CloudConfig | None = None, settings: Any = None
) -> list[Check]:
    """The cloud lines of `sickbay doctor` (the config `settings` name, SICKBAY_CLOUD_FILE and
    the providers' defaults, unless given)."""
    if config is None:
        try:
            if settings is None:
                from worker.settings import Settings

                settings = Settings()
            config = settings.cloud.cloud_config()
        except ConfigError as exc:
            return [Check("error", "cloud config", str(exc), "fix SICKBAY_CLOUD_FILE")]
    check = Check
    out: list[Check] = []
    eks_pools = _pools(runbooks, "eks")
    if aws_configured(config.aws) or eks_pools:
        out.extend(aws_checks(config, eks_pools, check))
    if gke_configured(config.gke) or _pools(runbooks, "gke"):
        out.append(gke_check(config, check))
    if aks_configured(config.aks) or _pools(runbooks, "aks"):
        out.append(aks_check(config, check))
    return out


def aws_checks(config: CloudConfig, pools: list[NodePoolTarget], check: type[Check]) -> list[Check]:
    from botocore.exceptions import BotoCoreError, ClientError

    from activities.cloud.aws import AwsClients

    aws = config.aws
    bind = "bind Sickbay's ServiceAccount to an IAM role (EKS Pod Identity or IRSA; docs/cloud.md)"
    try:
        import boto3

        session = boto3.session.Session(profile_name=aws.profile)
    except BotoCoreError as exc:
        return [check("error", "aws config", f"AWS profile {aws.profile!r}: {exc}")]
    region = aws.region or session.region_name
    out: list[Check] = []
    if not region and not all(p.location for p in pools):
        out.append(
            check(
                "error",
                "aws region",
                "no AWS region: not in the cloud config, AWS_REGION or the shared config",
                "set `aws.region` in SICKBAY_CLOUD_FILE (or SICKBAY_AWS_REGION / AWS_REGION)",
            )
        )
        return out
    out.append(check("ok", "aws region", f"{region or 'from each runbook pool'}"))
    try:
        credentials = session.get_credentials()
    except BotoCoreError as exc:
        credentials = None
        out.append(check("error", "aws credentials", f"the credential chain failed: {exc}", bind))
        return out
    if credentials is None:
        out.append(
            check(
                "error",
                "aws credentials",
                "the AWS SDK's standard chain found no credentials (Pod Identity, IRSA, "
                "environment, shared files, instance profile)",
                bind,
            )
        )
        return out
    method = str(getattr(credentials, "method", "") or "")
    out.append(check("ok", "aws credentials", AWS_METHODS.get(method, method or "found")))
    clients = AwsClients(aws)
    if not aws.endpoints or "sts" in aws.endpoints:
        try:
            who = clients.client("sts", region).get_caller_identity()
            out.append(check("ok", "aws identity", str(who.get("Arn", "?"))))
        except (ClientError, BotoCoreError) as exc:
            out.append(check("error", "aws identity", f"sts:GetCallerIdentity: {exc}", bind))
            return out
    cluster_default = aws.cluster
    for pool in pools:
        if not pool.name:
            out.append(
                check(
                    "ok",
                    "eks node group",
                    "scaleUp.provider eks: the failed node's node group (not checked here)",
                )
            )
            continue
        cluster = pool.cluster or cluster_default
        what = f"{cluster}/{pool.name}"
        if not cluster:
            out.append(
                check(
                    "error",
                    "eks node group",
                    f"{pool.name}: no cluster in the runbook pool or `aws.cluster`",
                    "name the EKS cluster in scaleUp.pool.cluster or SICKBAY_EKS_CLUSTER",
                )
            )
            continue
        try:
            eks = clients.client("eks", pool.location or region)
            group = eks.describe_nodegroup(clusterName=cluster, nodegroupName=pool.name)
        except ClientError as exc:
            code = str((exc.response.get("Error") or {}).get("Code", ""))
            fix = (
                "grant eks:DescribeNodegroup, eks:UpdateNodegroupConfig, eks:DescribeUpdate, "
                "eks:ListUpdates on this node group (docs/cloud.md)"
                if code in ("AccessDeniedException", "AccessDenied", "UnauthorizedOperation")
                else "check the cluster and node group names in the runbook"
            )
            out.append(check("error", "eks node group", f"{what}: {code}: {exc}", fix))
            continue
        except BotoCoreError as exc:
            out.append(check("error", "eks node group", f"{what}: {exc}"))
            continue
        scaling = (group.get("nodegroup") or {}).get("scalingConfig") or {}
        status = (group.get("nodegroup") or {}).get("status", "?")
        out.append(
            check(
                "ok",
                "eks node group",
                f"{what}: {status}, size {scaling.get('desiredSize')} "
                f"(min {scaling.get('minSize')}, max {scaling.get('maxSize')})",
            )
        )
    return out


def gke_check(config: CloudConfig, check: type[Check]) -> Check:
    if config.gke.token.available():
        return check("ok", "gke credentials", f"a ready token ({config.gke.token.describe()})")
    import google.auth
    from google.auth.exceptions import DefaultCredentialsError

    try:
        credentials, _project = google.auth.default()
    except DefaultCredentialsError as exc:
        return check(
            "error",
            "gke credentials",
            f"no token and no Application Default Credentials: {exc}",
            "on GKE, bind the ServiceAccount with Workload Identity (docs/cloud.md)",
        )
    kind = type(credentials).__module__
    name = (
        "metadata server (GKE Workload Identity)"
        if "compute_engine" in kind
        else "Workload Identity Federation"
        if "external_account" in kind or "identity_pool" in kind
        else "service-account key"
        if "service_account" in kind
        else type(credentials).__name__
    )
    return check("ok", "gke credentials", f"google-auth ADC: {name}")


def aks_check(config: CloudConfig, check: type[Check]) -> Check:
    if config.aks.token.available():
        return check("ok", "aks credentials", f"a ready token ({config.aks.token.describe()})")
    token_file = os.environ.get("AZURE_FEDERATED_TOKEN_FILE")
    if token_file:
        missing = [v for v in ("AZURE_CLIENT_ID", "AZURE_TENANT_ID") if not os.environ.get(v)]
        if missing or not Path(token_file).is_file():
            return check(
                "error",
                "aks credentials",
                f"workload identity incomplete: {', '.join(missing) or token_file + ' unreadable'}",
                "label the pod azure.workload.identity/use=true and annotate its "
                "ServiceAccount with azure.workload.identity/client-id (docs/cloud.md)",
            )
        return check("ok", "aks credentials", "azure-identity: AKS workload identity")
    if os.environ.get("AZURE_CLIENT_SECRET") or os.environ.get("AZURE_CLIENT_CERTIFICATE_PATH"):
        return check("ok", "aks credentials", "azure-identity: service principal (environment)")
    return check(
        "warning",
        "aks credentials",
        "no token and no workload identity: azure-identity will try managed identity (IMDS), "
        "not probed here",
        "prefer workload identity (docs/cloud.md)",
    )
