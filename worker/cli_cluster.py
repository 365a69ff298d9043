"""Which cluster a `sickbay` command addresses: the CLI side of the recorded cluster name.

Workflow ids, task queues and the `SickbayCluster` filter all carry the cluster's name
(contract/names.py). The worker derives and records it once (worker/cluster_name.py); a CLI
that computed ids of another name would reach nothing (`sickbay abort node/GPU-...` on a fresh
install named `k-3f2a9c1e` would signal `sickbay-gpu-...`, which does not exist). So every
command that computes such a name resolves it in this order:

1. `--cluster NAME`;
2. `SICKBAY_CLUSTER`, when set (even to "", the unnamed cluster);
3. `SICKBAY_CLUSTER_FILE` (the mounted record, as the webhook reads it);
4. the record itself, ConfigMap `sickbay-cluster` (key `name`) in Sickbay's namespace
   (`SICKBAY_WATCH_NAMESPACE`), read through the operator's kubeconfig (`KUBECONFIG`,
   `SICKBAY_KUBE_CONTEXT`). Read only: the CLI never records a name.

Commands that act (launch, approve, reject, abort, repaired, extend-deadline, schedule) also
read the record when a name was given (1 or 2) and refuse, naming both, when a readable record
disagrees. With no name at all they refuse and say which sources were tried and why each gave
none (a workflow id given as is, `sickbay-...`, needs no name and is acted on). Read-only
commands (status, timeline) then look across every cluster instead, and say so.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass, field
from typing import Any

from activities.kube.client import Kube, KubeError, KubeSettings
from contract.names import CLUSTER_CONFIGMAP
from worker.cluster_name import (
    MIGRATE_HINT,
    ClusterNameError,
    read_cluster_file,
    read_recorded,
    shown,
)

# Seconds for the one ConfigMap read: a CLI must not hang on an unreachable API server.
RECORD_READ_SECONDS = 10.0


class CliClusterError(ValueError):
    """The command must not run: no cluster name, or one that disagrees with the record.
    A ValueError, so the commands' runner prints it as `error: ...` and exits 2."""


@dataclass(frozen=True)
class CliCluster:
    """The resolved name (None: not known), where it came from, and what gave none."""

    name: str | None
    source: str = ""
    tried: list[str] = field(default_factory=list)

    def tried_text(self) -> str:
        return "".join(f"\n  - {line}" for line in self.tried)


def _read_configmap(settings: Any) -> tuple[str | None, str, str]:
    """(recorded name or None, where, why there is none) from the cluster's ConfigMap."""
    namespace = settings.watch.watch_namespace
    where = f"ConfigMap {namespace}/{CLUSTER_CONFIGMAP}"
    try:
        kube = Kube.from_settings(
            KubeSettings(
                kubeconfig=str(settings.kubeconfig) if settings.kubeconfig else None,
                context=settings.kube_context,
                request_timeout=min(float(settings.kube_request_timeout), RECORD_READ_SECONDS),
                max_threads=1,
            )
        )
    except Exception as exc:  # no kubeconfig, or a malformed one: say which
        return None, where, f"{where}: cannot load a Kubernetes config ({exc})"
    try:
        server = str(kube.api_client.configuration.host)
        where = f"{where} on {server}"
        try:
            recorded = read_recorded(kube, namespace)
        except KubeError as exc:
            return None, where, f"{where}: cannot read it ({exc})"
        except ClusterNameError as exc:
            return None, where, f"{where}: {exc}"
        if recorded is None:
            return None, where, f"{where}: does not exist (no worker has recorded a name yet)"
        return recorded, where, ""
    finally:
        kube.api_client.close()


def read_record(settings: Any) -> tuple[str | None, str, list[str]]:
    """The recorded name (None: none readable), where it was read, and why each source of a
    record gave none: SICKBAY_CLUSTER_FILE, then the ConfigMap."""
    tried: list[str] = []
    path = settings.cluster_file
    if path is None:
        tried.append("SICKBAY_CLUSTER_FILE: not set")
    else:
        where = f"SICKBAY_CLUSTER_FILE {path}"
        try:
            name = read_cluster_file(path)
        except ClusterNameError as exc:
            tried.append(str(exc))
        except OSError as exc:
            tried.append(f"{where}: cannot read it ({exc})")
        else:
            if name is not None:
                return name, where, tried
            tried.append(f"{where}: does not exist")
    name, where, why = _read_configmap(settings)
    if name is not None:
        return name, where, tried
    tried.append(why)
    return None, where, tried


def resolve_cli_cluster(settings: Any, flag: str | None, *, acting: bool) -> CliCluster:
    """The cluster a command addresses (the module docstring's order). `flag`: `--cluster`
    when given. Raises CliClusterError when an acting command's name disagrees with a
    readable record."""
    if flag is not None:
        explicit, source = flag, "--cluster"
    elif settings.cluster_explicit:
        explicit, source = settings.cluster, "SICKBAY_CLUSTER"
    else:
        explicit, source = None, ""
    if explicit is not None and not acting:
        return CliCluster(explicit, source)  # looking only: any cluster may be looked at
    recorded, where, tried = read_record(settings)
    if explicit is not None:
        if recorded is not None and recorded != explicit:
            as_flag = recorded or '""'
            raise CliClusterError(
                f"refusing to act: {source} is {shown(explicit)} but this cluster's recorded "
                f"name is {shown(recorded)} ({where}). Its workflow ids and task queue are "
                f"those of {shown(recorded)}: pass --cluster {as_flag} (or unset "
                f"{source}), or point KUBECONFIG / SICKBAY_KUBE_CONTEXT at the cluster named "
                f"{shown(explicit)}. A rename is a migration ({MIGRATE_HINT})"
            )
        return CliCluster(explicit, source)
    not_given = ["--cluster: not given", "SICKBAY_CLUSTER: not set"]
    if recorded is not None:
        return CliCluster(recorded, where, not_given + tried)
    return CliCluster(None, "", not_given + tried)


def cluster_settings(
    settings: Any, flag: str | None, command: str, *, acting: bool, fallback: str = ""
) -> tuple[Any, CliCluster]:
    """`settings` for the cluster `command` addresses, and how it was found.

    No name: an acting command is refused (CliClusterError, asking for --cluster) unless
    `fallback` says what it does without one (a workflow id given as is); a read-only command
    goes on with `fallback`. Either way stderr says which sources were tried and why each
    gave no name."""
    found = resolve_cli_cluster(settings, flag, acting=acting)
    if found.name is not None:
        return settings.with_cluster(found.name), found
    if acting and not fallback:
        raise CliClusterError(
            f"refusing to {command}: the cluster name is not known, and every workflow id and "
            f"task queue contains it (a name guessed wrong reaches nothing). Tried:"
            f"{found.tried_text()}\nPass --cluster NAME (`sickbay doctor` against the cluster "
            f'shows its recorded name; --cluster "" for the unnamed cluster), or set '
            f"SICKBAY_CLUSTER"
        )
    print(
        f"warning: the cluster name is not known. Tried:{found.tried_text()}\n{fallback}",
        file=sys.stderr,
    )
    return settings, found
