"""The cluster name is derived once, recorded in the cluster and stable (worker/cluster_name.py).

Cases, on the cluster twin behind deploy/rbac.yaml's grants (the RBAC proxy) and the dev server:
- the twin answers a second create of the ConfigMap as a real API server does (409
  AlreadyExists, k8s-golden 11) and the record is never overwritten;
- a first start with nothing recorded and SICKBAY_CLUSTER unset records `k-<8 hex of the
  kube-system uid>`; a second start reads the same; two replicas starting at once agree and
  leave one ConfigMap;
- an explicit SICKBAY_CLUSTER is recorded when nothing is; one that disagrees with the record
  is refused naming both, also by `sickbay worker` as a process (exit 7, before it polls);
- a ConfigMap without the key or with an invalid name is refused, never guessed around.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from temporalio.testing import WorkflowEnvironment

from contract.names import (
    CLUSTER_CONFIGMAP,
    check_cluster_name,
    derived_cluster_name,
)
from tests.activities.kube.conftest import Twin, twin
from tests.activities.kube.test_kube_e2e import RULES
from worker.cluster_name import ClusterNameError, read_recorded, record, resolve_worker_cluster

NS = "sickbay"
GOLDEN = Path(
    os.environ.get("SICKBAY_SHARED_DIR") or Path(__file__).resolve().parents[3] / "shared"
)


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[Twin]:
    with twin(tmp_path, "1.36", proxy_rules=RULES) as t:
        t.store.create("namespaces", {"metadata": {"name": NS}})
        yield t
        assert t.proxy is not None and t.proxy.denied == []  # rbac.yaml grants every call


def _uid(t: Twin) -> str:
    return str(t.store.get("namespaces", "kube-system")["metadata"]["uid"])


def _queue() -> str:
    return f"rec-{uuid.uuid4().hex[:8]}"


async def _resolve(t: Twin, explicit: str | None) -> str:
    return await resolve_worker_cluster(t.acts.kube, explicit, NS)


def test_derived_name_is_valid_and_from_the_uid() -> None:
    name = derived_cluster_name("3f2a9c1e-0b7d-4e55-9a10-7c2d9e4b1a00")
    assert name == "k-3f2a9c1e"
    assert check_cluster_name(name) == name
    with pytest.raises(ValueError):
        derived_cluster_name("12-34")


def test_a_second_create_is_a_409_as_on_a_real_api_server(cluster: Twin) -> None:
    assert read_recorded(cluster.acts.kube, NS) is None
    assert record(cluster.acts.kube, NS, "east") == "east"
    # First writer wins: a later record with another name reads the first one back.
    assert record(cluster.acts.kube, NS, "west") == "east"
    assert cluster.store.get("configmaps", CLUSTER_CONFIGMAP, NS)["data"] == {"name": "east"}
    from kubernetes.client.exceptions import ApiException

    body = {"metadata": {"name": CLUSTER_CONFIGMAP}, "data": {"name": "west"}}
    with pytest.raises(ApiException) as raised:
        cluster.acts.kube.core.create_namespaced_config_map(NS, body)
    got = json.loads(raised.value.body)
    golden = json.loads(
        (GOLDEN / "k8s-golden" / "11-error-create-existing-pod-409-alreadyexists.json").read_text()
    )["response"]
    assert raised.value.status == golden["code"] == 409
    assert {k: got[k] for k in ("kind", "status", "reason", "code")} == {
        k: golden[k] for k in ("kind", "status", "reason", "code")
    }
    assert got["details"] == {"kind": "configmaps", "name": CLUSTER_CONFIGMAP}
    assert got["message"] == f'configmaps "{CLUSTER_CONFIGMAP}" already exists'


async def test_first_start_records_a_derived_name_and_later_starts_read_it(
    cluster: Twin,
) -> None:
    first = await _resolve(cluster, None)
    assert first == derived_cluster_name(_uid(cluster))
    assert cluster.store.get("configmaps", CLUSTER_CONFIGMAP, NS)["data"] == {"name": first}
    assert await _resolve(cluster, None) == first  # a restart
    assert await _resolve(cluster, first) == first  # explicit, agreeing


async def test_two_replicas_starting_at_once_agree(cluster: Twin) -> None:
    names = await asyncio.gather(*(_resolve(cluster, None) for _ in range(4)))
    assert set(names) == {derived_cluster_name(_uid(cluster))}
    assert [cm["metadata"]["name"] for cm in cluster.store.list("configmaps", NS).items] == [
        CLUSTER_CONFIGMAP
    ]


async def test_an_explicit_name_is_recorded_and_a_mismatch_is_refused(cluster: Twin) -> None:
    assert await _resolve(cluster, "east") == "east"
    with pytest.raises(ClusterNameError) as refused:
        await _resolve(cluster, "west")
    text = str(refused.value)
    assert "'west'" in text and "'east'" in text and "migration" in text
    with pytest.raises(ClusterNameError, match="unnamed cluster"):
        await _resolve(cluster, "")
    assert cluster.store.get("configmaps", CLUSTER_CONFIGMAP, NS)["data"] == {"name": "east"}


@pytest.mark.parametrize(
    ("data", "problem"), [({}, "has no key 'name'"), ({"name": "gpu-east"}, "may not start with")]
)
def test_a_broken_record_is_refused(cluster: Twin, data: dict[str, Any], problem: str) -> None:
    cluster.store.create("configmaps", {"metadata": {"name": CLUSTER_CONFIGMAP}, "data": data}, NS)
    with pytest.raises(ClusterNameError, match=problem):
        read_recorded(cluster.acts.kube, NS)


@pytest.mark.devserver
async def test_the_worker_process_refuses_a_mismatching_name(
    dev_env: WorkflowEnvironment, cluster: Twin
) -> None:
    cluster.store.create(
        "configmaps", {"metadata": {"name": CLUSTER_CONFIGMAP}, "data": {"name": "east"}}, NS
    )
    env = {
        **os.environ,
        "SICKBAY_TEMPORAL_ADDRESS": dev_env.client.service_client.config.target_host,
        "SICKBAY_TASK_QUEUE": _queue(),
        "SICKBAY_CLUSTER": "west",
        "SICKBAY_WATCH_NAMESPACE": NS,
        "KUBECONFIG": str(cluster.kubeconfig),
        "SICKBAY_SWEEP_ENABLED": "false",
        "SICKBAY_METRICS_PORT": "0",
    }
    done = await asyncio.to_thread(
        subprocess.run,
        [sys.executable, "-m", "worker.cli", "worker"],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 7, done.stderr
    assert "SICKBAY_CLUSTER is 'west'" in done.stderr
    assert "recorded name is 'east'" in done.stderr
    assert "worker polling" not in done.stderr
