"""The CLI addresses the cluster whose name is recorded (worker/cli_cluster.py).

Order: `--cluster`, `SICKBAY_CLUSTER` (set, even ""), `SICKBAY_CLUSTER_FILE`, then the ConfigMap
`sickbay-cluster` read through the operator's kubeconfig. Cases, on the cluster twin (its
kubeconfig as the operator's) and the dev server with a worker of activity fakes:
- the record present (a derived `k-...` name), nothing given: `launch` starts the named
  cluster's remediation on its queue, `status` lists it (no warning), `timeline` and `abort`
  reach it; nothing is written to the cluster (the CLI records no name);
- the record absent: `abort`/`launch`/`extend-deadline`/`schedule` refuse (nothing started),
  stderr names every source tried and why each gave no name, and asks for `--cluster`;
  `status` lists every cluster's remediations and says so; `timeline node/uuid` finds the one
  remediation of that device in any cluster; an id given as is (`sickbay-...`) is acted on;
  an unloadable kubeconfig is named as such;
- the legacy record "" (the unnamed cluster): the unnamed ids; `--cluster east` is refused;
- a mismatch (`--cluster west`, or `SICKBAY_CLUSTER=west` or `""`, against the record
  'east'): acting commands refuse naming both, nothing is sent; `status --cluster west` (read
  only) runs;
- `SICKBAY_CLUSTER_FILE` names the cluster when no kubeconfig can be loaded.
"""

from __future__ import annotations

import asyncio
import json
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from temporalio.client import Client
from temporalio.service import RPCError, RPCStatusCode
from temporalio.testing import WorkflowEnvironment

from contract.names import (
    CLUSTER_CONFIGMAP,
    cluster_task_queue,
    derived_cluster_name,
    device_workflow_id,
)
from contract.remediation import RemediationResult
from tests.activities.kube.conftest import Twin, twin
from tests.workflows.fakes import FakeWorld, new_worker
from worker.cli import main as cli_main

pytestmark = pytest.mark.devserver

NS = "sickbay"
DEADLINE_S = 60.0  # generous: visibility follows a start within a second when healthy


@pytest.fixture
def cluster(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Twin]:
    """The twin, as the operator's kubeconfig names it; no cluster name anywhere else."""
    with twin(tmp_path, "1.36") as t:
        t.store.create("namespaces", {"metadata": {"name": NS}})
        for var in ("SICKBAY_CLUSTER", "SICKBAY_CLUSTER_FILE", "SICKBAY_KUBE_CONTEXT"):
            monkeypatch.delenv(var, raising=False)
        monkeypatch.setenv("KUBECONFIG", str(t.kubeconfig))
        monkeypatch.setenv("SICKBAY_WATCH_NAMESPACE", NS)
        monkeypatch.setenv("SICKBAY_STATE_DIR", str(tmp_path / "no-stack"))
        monkeypatch.delenv("SICKBAY_TEMPORAL_UI_URL", raising=False)
        yield t


def _record(t: Twin, name: str) -> None:
    t.store.create(
        "configmaps", {"metadata": {"name": CLUSTER_CONFIGMAP}, "data": {"name": name}}, NS
    )


def _recorded(t: Twin) -> list[Any]:
    return [cm["data"] for cm in t.store.list("configmaps", NS).items]


def _derived(t: Twin) -> str:
    return derived_cluster_name(str(t.store.get("namespaces", "kube-system")["metadata"]["uid"]))


async def _cli(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = await asyncio.to_thread(cli_main, list(argv))
    out = capsys.readouterr()
    assert "Traceback" not in out.err + out.out, out.err
    return code, out.out, out.err


def _conn(client: Client, queue: str) -> list[str]:
    return ["--address", client.service_client.config.target_host, "--task-queue", queue]


async def _exists(client: Client, wf_id: str) -> bool:
    try:
        await client.get_workflow_handle(wf_id).describe()
    except RPCError as exc:
        if exc.status is RPCStatusCode.NOT_FOUND:
            return False
        raise
    return True


async def _listed(capsys: pytest.CaptureFixture[str], argv: list[str], wf_id: str) -> str:
    """stderr of the `status --json` that lists `wf_id` with its device (SickbayDevice is set
    at the first phase change; visibility is eventually consistent)."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + DEADLINE_S
    while True:
        code, out, err = await _cli(capsys, "status", *argv, "--json")
        assert code == 0, err
        if any(r["workflow_id"] == wf_id and r["device"] for r in json.loads(out)):
            return err
        assert loop.time() < deadline, f"{wf_id} never listed by status {argv}"
        await asyncio.sleep(0.2)


def _no_name_sources(err: str) -> None:
    """The refusal or warning names every source and why each gave no name."""
    assert "--cluster: not given" in err, err
    assert "SICKBAY_CLUSTER: not set" in err
    assert "SICKBAY_CLUSTER_FILE: not set" in err
    assert f"ConfigMap {NS}/{CLUSTER_CONFIGMAP} on http" in err
    assert "does not exist (no worker has recorded a name yet)" in err


async def test_the_recorded_name_is_used_when_none_is_given(
    dev_env: WorkflowEnvironment, cluster: Twin, capsys: pytest.CaptureFixture[str]
) -> None:
    client = dev_env.client
    name = _derived(cluster)
    _record(cluster, name)
    world = FakeWorld()
    queue = f"cli-{uuid.uuid4().hex[:8]}"
    conn = _conn(client, queue)
    device = f"{world.node}/{world.gpu_uuid}"
    wf_id = device_workflow_id(world.node, world.gpu_uuid, name)
    async with new_worker(client, world, task_queue=cluster_task_queue(queue, name)):
        code, out, err = await _cli(
            capsys, "launch", *conn, "--node", world.node, "--uuid", world.gpu_uuid, "--json"
        )
        assert code == 0, err
        assert json.loads(out)["workflow_id"] == wf_id
        assert "warning" not in err
        err = await _listed(capsys, conn, wf_id)
        assert "warning" not in err  # filtered by SickbayCluster = the recorded name
        code, out, err = await _cli(capsys, "timeline", *conn, device)
        assert code == 0, err
        assert out.startswith(wf_id)
        code, out, err = await _cli(capsys, "abort", *conn, device, "--reason", "by hand")
        assert code == 0, err
        assert f"{wf_id} aborting (taken in by the workflow)" in out
        result = await client.get_workflow_handle(wf_id, result_type=RemediationResult).result()
    assert result.outcome == "aborted"
    assert _recorded(cluster) == [{"name": name}]  # read only: nothing written


async def test_without_a_name_acting_commands_refuse_and_looking_spans_clusters(
    dev_env: WorkflowEnvironment,
    cluster: Twin,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    client = dev_env.client
    world = FakeWorld()
    queue = f"cli-{uuid.uuid4().hex[:8]}"
    conn = _conn(client, queue)
    device = f"{world.node}/{world.gpu_uuid}"
    unnamed = device_workflow_id(world.node, world.gpu_uuid)
    east = device_workflow_id(world.node, world.gpu_uuid, "east")

    for argv in (
        ["abort", *conn, device, "--reason", "x"],
        ["launch", *conn, "--node", world.node, "--uuid", world.gpu_uuid],
        ["extend-deadline", *conn, device, "--by", "30m", "--reason", "x"],
    ):
        code, _, err = await _cli(capsys, *argv)
        assert code == 2, err
        assert f"refusing to {argv[0]}: the cluster name is not known" in err
        _no_name_sources(err)
        assert "Pass --cluster NAME" in err
    monkeypatch.setenv("SICKBAY_TEMPORAL_ADDRESS", client.service_client.config.target_host)
    code, _, err = await _cli(capsys, "schedule", "delete")
    assert code == 1 and "refusing to schedule delete" in err
    assert not await _exists(client, unnamed) and not await _exists(client, east)
    assert _recorded(cluster) == []

    async with new_worker(client, world, task_queue=cluster_task_queue(queue, "east")):
        code, _, err = await _cli(
            capsys, "launch", *conn, "--cluster", "east", "--node", world.node, "--uuid",
            world.gpu_uuid,
        )  # fmt: skip
        assert code == 0, err
        # Read only: every cluster's remediations, and stderr says so and why.
        err = await _listed(capsys, conn, east)
        assert "listing the remediations of every cluster (no SickbayCluster filter)" in err
        _no_name_sources(err)
        code, out, err = await _cli(capsys, "timeline", *conn, device)
        assert code == 0, err
        assert out.startswith(east) and f"note: {device} is {east}" in err
        # An id given as is names its cluster: acted on, with the warning.
        code, out, err = await _cli(capsys, "abort", *conn, east, "--reason", "by hand")
        assert code == 0, err
        assert "acting on the workflow id as given" in err and f"{east} aborting" in out
        # Closed before the worker stops: nothing of this test stays open on the dev server.
        result = await client.get_workflow_handle(east, result_type=RemediationResult).result()
        assert result.outcome == "aborted"
    assert not await _exists(client, unnamed)

    monkeypatch.setenv("KUBECONFIG", str(cluster.kubeconfig) + ".missing")
    code, _, err = await _cli(capsys, "abort", *conn, device, "--reason", "x")
    assert code == 2 and f"ConfigMap {NS}/{CLUSTER_CONFIGMAP}: cannot load a Kubernetes" in err


async def test_the_legacy_unnamed_record_keeps_the_unnamed_ids(
    dev_env: WorkflowEnvironment, cluster: Twin, capsys: pytest.CaptureFixture[str]
) -> None:
    client = dev_env.client
    _record(cluster, "")
    world = FakeWorld()
    queue = f"cli-{uuid.uuid4().hex[:8]}"
    conn = _conn(client, queue)
    device = f"{world.node}/{world.gpu_uuid}"
    code, _, err = await _cli(capsys, "abort", *conn, "--cluster", "east", device, "--reason", "x")
    assert code == 2
    assert "--cluster is 'east'" in err and 'recorded name is "" (the unnamed cluster)' in err
    assert 'pass --cluster ""' in err
    code, out, err = await _cli(
        capsys, "launch", *conn, "--node", world.node, "--uuid", world.gpu_uuid, "--json"
    )
    assert code == 0, err
    wf_id = json.loads(out)["workflow_id"]
    assert wf_id == device_workflow_id(world.node, world.gpu_uuid)
    await client.get_workflow_handle(wf_id).terminate("test cleanup")


async def test_a_name_that_disagrees_with_the_record_is_refused_for_acting(
    dev_env: WorkflowEnvironment,
    cluster: Twin,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    client = dev_env.client
    _record(cluster, "east")
    world = FakeWorld()
    conn = _conn(client, f"cli-{uuid.uuid4().hex[:8]}")
    device = f"{world.node}/{world.gpu_uuid}"
    launch = ["launch", *conn, "--node", world.node, "--uuid", world.gpu_uuid]
    code, _, err = await _cli(capsys, *launch, "--cluster", "west")
    assert code == 2
    assert "refusing to act: --cluster is 'west'" in err
    assert f"recorded name is 'east' (ConfigMap {NS}/{CLUSTER_CONFIGMAP} on http" in err
    for value, shown in (("west", "'west'"), ("", '"" (the unnamed cluster)')):
        monkeypatch.setenv("SICKBAY_CLUSTER", value)
        for argv in (launch, ["repaired", *conn, device], ["approve", *conn, device]):
            code, _, err = await _cli(capsys, *argv)
            assert code == 2, err
            assert f"SICKBAY_CLUSTER is {shown}" in err and "recorded name is 'east'" in err
        # Looking at another cluster is no act: allowed.
        code, _, err = await _cli(capsys, "status", *conn, "--json")
        assert code == 0 and "refusing" not in err
    for name in ("west", "east", ""):
        assert not await _exists(client, device_workflow_id(world.node, world.gpu_uuid, name))


async def test_the_mounted_record_names_the_cluster_without_a_kubeconfig(
    dev_env: WorkflowEnvironment,
    cluster: Twin,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
) -> None:
    client = dev_env.client
    record = tmp_path / "cluster-name"
    record.write_text("east\n")
    monkeypatch.setenv("SICKBAY_CLUSTER_FILE", str(record))
    monkeypatch.setenv("KUBECONFIG", str(tmp_path / "no-kubeconfig"))
    world = FakeWorld()
    code, out, err = await _cli(
        capsys,
        "launch",
        *_conn(client, f"cli-{uuid.uuid4().hex[:8]}"),
        "--node",
        world.node,
        "--uuid",
        world.gpu_uuid,
        "--json",
    )
    assert code == 0, err
    wf_id = json.loads(out)["workflow_id"]
    assert wf_id == device_workflow_id(world.node, world.gpu_uuid, "east")
    await client.get_workflow_handle(wf_id).terminate("test cleanup")
