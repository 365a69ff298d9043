"""Two clusters on one Temporal namespace: two twins, two workers, two webhooks, one dev server.

Stack `east` starts the dev server; stack `west` shares it (`StackConfig.shared_temporal`). Both
twins are seeded alike, so their GPUs have the SAME node names and UUIDs: were anything keyed
without the cluster, the two clusters' alerts would meet in one workflow, one budget, one queue.

The storm: every GPU of both twins fails at once (Xid 79), each alert reaching its own
cluster's webhook (and repeated: the twin re-sends while the fault lasts). Then:
- each cluster has exactly one remediation per failed GPU, id `sickbay-<cluster>-gpu-...`,
  search attribute `SickbayCluster` = its cluster, and no id without a cluster;
- each cluster has its own budget workflow (`sickbay-<cluster>-budget`) whose leases and
  waiters are that cluster's remediations only; the shipped default runbook allows one
  quarantine per cluster (10 %, at least one), so EACH twin gets exactly one DeviceTaintRule,
  annotated with its own cluster's workflow id (a shared budget would leave one twin with none);
- each sink's pages are its own cluster's only, their summaries tagged `[<cluster>]`;
- `sickbay status --cluster <name>` lists that cluster's incidents only;
- each worker recorded its name in its own twin (ConfigMap sickbay-cluster);
- a worker started on west's twin with the name `east` (a copy-pasted ConfigMap) refuses to
  start (exit 7): west's recorded name is `west`; with east's record copied into west's
  twin as well, it refuses (exit 6), naming the name and queue: another cluster's worker
  already serves them.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from temporalio.service import RPCError, RPCStatusCode

from contract.budget import BudgetState
from contract.names import ANN_WORKFLOW_ID, CLUSTER_CONFIGMAP, WF_REMEDIATE, budget_workflow_id
from harness.scenarios import Demo, Progress
from harness.stack import WATCH_NAMESPACE, Stack
from tests.demo.conftest import start_stack
from workflows.budget import BudgetWorkflow

CLUSTERS = ("east", "west")
GPUS = 3
# Every step below takes seconds; a busy 2-core machine running two stacks may take a minute.
WITHIN = 180.0


@pytest.fixture(scope="module")
def stacks(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Stack]]:
    east = start_stack(tmp_path_factory.mktemp("east"), cluster="east", gpus_per_node=GPUS)
    try:
        assert east.info is not None
        shared = (east.info.temporal_address, east.info.temporal_http)
        west = start_stack(
            tmp_path_factory.mktemp("west"),
            cluster="west",
            gpus_per_node=GPUS,
            shared_temporal=shared,
        )
        try:
            yield {"east": east, "west": west}
        finally:
            west.stop()
    finally:
        east.stop()


async def _eventually(what: str, probe: Any) -> Any:
    async with asyncio.timeout(WITHIN):
        while True:
            value = await probe()
            if value:
                return value
            await asyncio.sleep(0.5)  # poll interval
    raise AssertionError(what)  # pragma: no cover - timeout raises first


async def test_storms_on_two_clusters_never_cross(stacks: dict[str, Stack]) -> None:
    demos = {c: await Demo.open(s, Progress(lambda line: None)) for c, s in stacks.items()}
    try:
        gpus = {c: (await d.k("GET", "/twin/gpus"))["items"] for c, d in demos.items()}
        # Same seed: the twins' GPUs are indistinguishable without the cluster name.
        assert [g["uuid"] for g in gpus["east"]] == [g["uuid"] for g in gpus["west"]]
        assert len(gpus["east"]) == GPUS
        await asyncio.gather(*(demos[c].fail(g) for c in CLUSTERS for g in gpus[c]))

        client = demos["east"].client
        for cluster in CLUSTERS:
            expected = {demos[cluster].workflow_id(g) for g in gpus[cluster]}
            assert all(wid.startswith(f"sickbay-{cluster}-gpu-") for wid in expected)

            async def listed(cluster: str = cluster, expected: set[str] = expected) -> bool:
                query = f"WorkflowType = '{WF_REMEDIATE}' AND SickbayCluster = '{cluster}'"
                ids = {wf.id async for wf in client.list_workflows(query)}
                return ids == expected

            await _eventually(f"{cluster}: one remediation per GPU, tagged", listed)

        # No remediation without a cluster, and exactly one per (cluster, GPU).
        every = [wf async for wf in client.list_workflows(f"WorkflowType = '{WF_REMEDIATE}'")]
        assert sorted(wf.id for wf in every) == sorted(
            demos[c].workflow_id(g) for c in CLUSTERS for g in gpus[c]
        )
        assert all(wf.search_attributes.get("SickbayCluster") for wf in every)

        for cluster, demo in demos.items():
            info = stacks[cluster].info
            assert info is not None
            budget = client.get_workflow_handle(
                budget_workflow_id(info.task_queue, cluster), result_type=BudgetState
            )

            async def settled(budget: Any = budget) -> BudgetState | None:
                try:
                    state: BudgetState = await budget.query(BudgetWorkflow.state)
                except RPCError as e:
                    # A remediation is listed from its start request; the budget starts with
                    # the first remediation's first task, which may still be queued.
                    if e.status is RPCStatusCode.NOT_FOUND:
                        return None
                    raise
                held = {lease.holder for lease in state.leases}
                waiting = {w.holder for w in state.waiters}
                return state if len(held) == 1 and len(held | waiting) == GPUS else None

            state = await _eventually(f"{cluster}: budget holds one, queues the rest", settled)
            holders = {lease.holder for lease in state.leases} | {w.holder for w in state.waiters}
            assert holders == {demo.workflow_id(g) for g in gpus[cluster]}

            async def one_rule(demo: Demo = demo) -> list[dict[str, Any]]:
                return await demo.taint_rules()

            rules = await _eventually(f"{cluster}: its one DeviceTaintRule", one_rule)
            assert len(rules) == 1
            owner = rules[0]["metadata"]["annotations"][ANN_WORKFLOW_ID]
            assert owner in {lease.holder for lease in state.leases}
            assert owner.startswith(f"sickbay-{cluster}-gpu-")

        for cluster, demo in demos.items():

            async def paged(demo: Demo = demo) -> list[dict[str, Any]]:
                return [n for n in await demo.notifications() if n["kind"] == "pagerduty"]

            pages = await _eventually(f"{cluster}: budget pages reach its sink", paged)
            for page in pages:
                body = page["body"]
                assert body["dedup_key"].startswith(f"sickbay-{cluster}-"), body
                if body.get("event_action") == "trigger":
                    assert body["payload"]["summary"].startswith(f"[{cluster}] GPU "), body
                    assert body["payload"]["custom_details"]["cluster"] == cluster

        for cluster in CLUSTERS:
            env = stacks[cluster].sickbay_env()
            out = await asyncio.to_thread(
                subprocess.run,
                [sys.executable, "-m", "worker.cli", "status", "--cluster", cluster, "--json"],
                env=env,
                capture_output=True,
                text=True,
                timeout=120,
                check=True,
            )
            rows = json.loads(out.stdout)
            assert {r["cluster"] for r in rows} == {cluster}
            assert {r["workflow_id"] for r in rows} == {
                demos[cluster].workflow_id(g) for g in gpus[cluster]
            }

        for cluster, stack in stacks.items():  # each worker recorded its own name
            url = f"{stack.info.kube_url}/api/v1/namespaces/{WATCH_NAMESPACE}/configmaps"
            async with httpx.AsyncClient(timeout=30) as http:
                recorded = (await http.get(f"{url}/{CLUSTER_CONFIGMAP}")).json()
            assert recorded["data"] == {"name": cluster}, recorded

        # A copy-pasted configuration: west's twin, but the name `east`. West's worker recorded
        # `west` in its cluster (ConfigMap sickbay-cluster), so this one refuses (exit 7).
        env = {
            **stacks["west"].sickbay_env(),
            "SICKBAY_CLUSTER": "east",
            "SICKBAY_TASK_QUEUE": "sickbay",
            "SICKBAY_METRICS_PORT": "0",
        }

        async def worker(env: dict[str, str]) -> subprocess.CompletedProcess[str]:
            return await asyncio.to_thread(
                subprocess.run,
                [sys.executable, "-m", "worker.cli", "worker"],
                env=env,
                capture_output=True,
                text=True,
                timeout=120,
            )

        refused = await worker(env)
        assert refused.returncode == 7, refused.stderr[-2000:]
        assert "SICKBAY_CLUSTER is 'east' but this cluster's recorded name is 'west'" in (
            refused.stderr
        )
        # A copied record too (east's ConfigMap restored into west's cluster), the name unset:
        # the worker reads `east`, sees east's worker (another kube-system uid) on queue
        # sickbay-east and refuses to start (exit 6).
        record = f"{stacks['west'].info.kube_url}/api/v1/namespaces/{WATCH_NAMESPACE}/configmaps"
        async with httpx.AsyncClient(timeout=30) as http:
            gone = await http.delete(f"{record}/{CLUSTER_CONFIGMAP}")
            assert gone.status_code == 200, gone.text
            body = {"metadata": {"name": CLUSTER_CONFIGMAP}, "data": {"name": "east"}}
            made = await http.post(record, json=body)
            assert made.status_code == 201, made.text
        refused = await worker({k: v for k, v in env.items() if k != "SICKBAY_CLUSTER"})
        assert refused.returncode == 6, refused.stderr[-2000:]
        assert "refusing to start: cluster name 'east' (task queue sickbay-east)" in refused.stderr
    finally:
        for demo in demos.values():
            await demo.close()
        for stack in stacks.values():
            stack.check_alive()


def test_budget_ids_differ_per_cluster() -> None:
    """The unit rule under the end-to-end test (no servers)."""
    from contract.names import cluster_task_queue

    ids = {budget_workflow_id(cluster_task_queue("sickbay", c), c) for c in ("", *CLUSTERS)}
    assert ids == {"sickbay-budget", "sickbay-east-budget", "sickbay-west-budget"}
