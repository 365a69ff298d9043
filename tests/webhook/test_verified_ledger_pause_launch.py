"""`POST /v1/actions` for unretire, pause / resume and launch, against the twin's TokenReview /
SubjectAccessReview, the production workflows and the dev server:

- unretire: a person RBAC does not grant verb `unretire` (name: the ledger workflow id) is 403;
  a GPU whose runbook requires verified actors refuses the un-retire straight through Temporal
  and takes it through the endpoint (`sickbay gpus unretire --via`), recorded verified with the
  groups in what `sickbay gpus` shows;
- pause / resume: verbs `pause` / `resume` on the budget workflow id; `sickbay pause --via` and
  `sickbay resume --via` go through the endpoint, the budget records the pauser verified, and
  `sickbay status` shows it; `fleet` reaches every running budget; a person without the verb
  is 403 and nothing is paused;
- launch: verb `launch` on the device's workflow id; a GPU the cluster has not got is 422 and
  nothing starts (the device is confirmed with the API as the CLI does); `sickbay launch --via`
  starts the remediation and its timeline shows the launch verified; a launch straight
  through Temporal is recorded unverified;
- no token or key in any history or the webhook's log;
- `sickbay launch --via` refuses `--dry-run` / `--runbook` / a selector (exit 2) rather than
  dropping them.
"""

from __future__ import annotations

import asyncio
import logging
import uuid
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path

import httpx
import pytest
from pydantic import SecretStr
from temporalio.client import WorkflowUpdateFailedError
from temporalio.testing import WorkflowEnvironment
from temporalio.worker import Worker

from activities.actors import ActorActivities
from activities.kube import KubeActivities
from activities.kube.client import Kube
from activities.ledger import LedgerActivities
from contract.budget import BudgetState
from contract.kube import DeviceRef, ResolveDeviceInput
from contract.ledger import (
    LedgerState,
    RecordFailureInput,
    UnretireRequest,
    UnretireResult,
)
from contract.names import (
    QRY_BUDGET_STATE,
    QRY_LEDGER_STATE,
    QRY_TIMELINE,
    SIG_ABORT,
    UPD_LEDGER_UNRETIRE,
    budget_task_queue,
    budget_workflow_id,
    ledger_task_queue,
    ledger_workflow_id,
)
from contract.remediation import AbortRequest, RemediationInput, TimelineEntry
from tests.webhook.helpers import TOKEN, serve, settings_for
from tests.workflows.fakes import ACTIONS_TEST_KEY, FakeWorld, new_worker
from twin.testing import RunningTwin
from worker.cli import main as cli_main
from worker.main import sender_identity_options
from worker.settings import WebhookSettings
from worker.webhook.app import create_app
from workflows.budget import BudgetWorkflow
from workflows.ledger import GpuLedgerWorkflow, describe

pytestmark = pytest.mark.devserver

RBAC = "rbac.authorization.k8s.io"


@pytest.fixture
def crew(twin: RunningTwin) -> Iterator[dict[str, str]]:
    """alice (group ops, granted unretire / launch / pause / resume on remediations.sickbay.dev)
    and bob (no grant), each with a bearer token the twin knows."""
    tag = uuid.uuid4().hex[:6]
    role, group = f"sickbay-operator-{tag}", f"ops-{tag}"
    twin.store.create(
        f"clusterroles.{RBAC}",
        {
            "metadata": {"name": role},
            "rules": [
                {
                    "apiGroups": ["sickbay.dev"],
                    "resources": ["remediations"],
                    "verbs": ["unretire", "launch", "pause", "resume", "abort"],
                }
            ],
        },
    )
    twin.store.create(
        f"clusterrolebindings.{RBAC}",
        {
            "metadata": {"name": role},
            "roleRef": {"apiGroup": RBAC, "kind": "ClusterRole", "name": role},
            "subjects": [{"kind": "Group", "apiGroup": RBAC, "name": group}],
        },
    )
    tokens = {"alice": f"alice-{uuid.uuid4().hex}", "bob": f"bob-{uuid.uuid4().hex}"}
    twin.twin.add_user(tokens["alice"], f"alice-{tag}", [group])
    twin.twin.add_user(tokens["bob"], f"bob-{tag}", ["developers"])
    yield {**tokens, "tag": tag, "group": group}
    twin.store.delete(f"clusterrolebindings.{RBAC}", role)
    twin.store.delete(f"clusterroles.{RBAC}", role)


def _app(dev_env: WorkflowEnvironment, twin: RunningTwin, queue: str):  # type: ignore[no-untyped-def]
    settings = settings_for(dev_env, queue).model_copy(
        update={"actions_key": SecretStr(ACTIONS_TEST_KEY.decode())}
    )
    return create_app(
        settings,
        dev_env.client,
        webhook=WebhookSettings(webhook_token=TOKEN),
        kube_api_client=twin.api_client(),
    )


async def _post(url: str, token: str, body: dict[str, str]) -> httpx.Response:
    async with httpx.AsyncClient(base_url=url, timeout=60) as http:
        return await http.post(
            "/v1/actions", json=body, headers={"Authorization": f"Bearer {token}"}
        )


async def _cli(*argv: str) -> int:
    return await asyncio.to_thread(cli_main, list(argv))


async def test_unretire_through_the_endpoint(
    dev_env: WorkflowEnvironment,
    twin: RunningTwin,
    crew: dict[str, str],
    caplog: pytest.LogCaptureFixture,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
) -> None:
    caplog.set_level(logging.DEBUG)
    client, tag = dev_env.client, crew["tag"]
    queue = f"unretire-{uuid.uuid4().hex[:8]}"
    ledger_id = ledger_workflow_id(queue)
    acts = LedgerActivities(client, queue)
    gpu = f"GPU-{uuid.uuid4()}"
    worker = Worker(
        client,
        task_queue=ledger_task_queue(queue),
        workflows=[GpuLedgerWorkflow],
        activities=[ActorActivities(ACTIONS_TEST_KEY).verify_actor],
        **sender_identity_options(),
    )
    async with worker, serve(_app(dev_env, twin, queue)) as url:
        await acts.record_gpu_failure(
            RecordFailureInput(
                gpu_uuid=gpu,
                node="gpu-pool-node-0",
                incident="i1",
                evidence="pod status reports the device Unhealthy",
                failures=1,
                window=timedelta(days=7),
                require_verified_actors=True,
            )
        )
        handle = client.get_workflow_handle(ledger_id)
        body = {"action": "unretire", "target": f"gpu-pool-node-0/{gpu}", "reason": "swapped"}
        bob = await _post(url, crew["bob"], body)
        assert bob.status_code == 403, bob.text
        assert f'may not unretire remediations.sickbay.dev "{ledger_id}"' in bob.json()["error"]
        bad = await _post(url, crew["alice"], {**body, "target": "not-a-gpu"})
        assert bad.status_code == 422
        with pytest.raises(WorkflowUpdateFailedError) as direct:
            await handle.execute_update(
                UPD_LEDGER_UNRETIRE,
                UnretireRequest(gpu_uuid=gpu, reason="swapped", actor=f"alice-{tag}"),
                result_type=UnretireResult,
            )
        assert "requires a verified actor for unretire" in str(direct.value.cause)

        kubeconfig = twin.twin.write_kubeconfig(tmp_path / "alice", token=crew["alice"])
        monkeypatch.setenv("KUBECONFIG", str(kubeconfig))
        capsys.readouterr()
        code = await _cli("gpus", "unretire", gpu, "--reason", "vendor swap", "--via", url)
        out = capsys.readouterr()
        assert code == 0, out.err
        assert f"{ledger_id} un-retired, verified as alice-{tag}" in out.out
        again = await _post(url, crew["alice"], body)  # no longer retired: the ledger says so
        assert again.status_code == 409 and "is not retired" in again.json()["error"]
        state = await handle.query(QRY_LEDGER_STATE, result_type=LedgerState)
        history = (await handle.fetch_history()).to_json()
        await handle.terminate("test done")
    (entry,) = [e for g in state.gpus for e in g.entries if e.kind == "unretired"]
    assert (entry.actor, entry.verification, entry.via) == (
        f"alice-{tag}",
        "verified",
        "kubernetes",
    )
    assert crew["group"] in entry.groups
    assert f"by alice-{tag} (verified via kubernetes" in describe(entry)
    logs = caplog.text
    for secret in (crew["alice"], crew["bob"], ACTIONS_TEST_KEY.decode()):
        assert secret not in history and secret not in logs


async def test_pause_resume_through_the_endpoint(
    dev_env: WorkflowEnvironment,
    twin: RunningTwin,
    crew: dict[str, str],
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
) -> None:
    client, tag = dev_env.client, crew["tag"]
    queue = f"pause-{uuid.uuid4().hex[:8]}"
    budget_id = budget_workflow_id(queue)
    address = client.service_client.config.target_host
    conn = ["--address", address, "--task-queue", queue, "--cluster", ""]
    worker = Worker(
        client,
        task_queue=budget_task_queue(queue),
        workflows=[BudgetWorkflow],
        activities=[ActorActivities(ACTIONS_TEST_KEY).verify_actor],
    )
    async with worker, serve(_app(dev_env, twin, queue)) as url:
        bob = await _post(url, crew["bob"], {"action": "pause", "target": budget_id, "reason": "x"})
        assert bob.status_code == 403, bob.text
        assert f'may not pause remediations.sickbay.dev "{budget_id}"' in bob.json()["error"]
        no_reason = await _post(url, crew["alice"], {"action": "pause", "target": budget_id})
        assert no_reason.status_code == 422

        kubeconfig = twin.twin.write_kubeconfig(tmp_path / "alice", token=crew["alice"])
        monkeypatch.setenv("KUBECONFIG", str(kubeconfig))
        capsys.readouterr()
        code = await _cli("pause", *conn, "--reason", "driver rollout", "--via", url)
        out = capsys.readouterr()
        assert code == 0, out.err
        assert f"{budget_id} paused, verified as alice-{tag}" in out.out
        code = await _cli("status", *conn)
        status = capsys.readouterr().out
        assert code == 0
        first = status.splitlines()[0]
        assert f"by alice-{tag} (verified via kubernetes) (driver rollout)" in first
        fleet = await _post(url, crew["alice"], {"action": "resume", "target": "fleet"})
        assert fleet.status_code == 200, fleet.text
        assert fleet.json()["clusters"][budget_id] == "running"
        code = await _cli("pause", *conn, "--reason", "again", "--via", url)
        assert code == 0
        code = await _cli("resume", *conn, "--via", url)
        out = capsys.readouterr()
        assert code == 0, out.err
        assert f"{budget_id} resumed, verified as alice-{tag}" in out.out
        state = await client.get_workflow_handle(budget_id).query(
            QRY_BUDGET_STATE, result_type=BudgetState
        )
        await client.get_workflow_handle(budget_id).terminate("test done")
    assert [(e.action, e.actor, e.verification) for e in state.pause_log] == [
        ("pause", f"alice-{tag}", "verified"),
        ("resume", f"alice-{tag}", "verified"),
        ("pause", f"alice-{tag}", "verified"),
        ("resume", f"alice-{tag}", "verified"),
    ]
    assert state.pause is None


async def test_launch_through_the_endpoint(
    dev_env: WorkflowEnvironment,
    twin: RunningTwin,
    crew: dict[str, str],
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
) -> None:
    client, tag = dev_env.client, crew["tag"]
    kube = KubeActivities(kube=Kube(twin.api_client()))
    node = "gpu-pool-node-1"
    found = await kube.resolve_device(ResolveDeviceInput(device=DeviceRef(node=node, gpu_index=1)))
    world = FakeWorld(node=node, gpu_uuid=found.gpu_uuid)
    queue = f"launch-{uuid.uuid4().hex[:8]}"
    wf_id = DeviceRef(node=node, gpu_uuid=found.gpu_uuid).workflow_id("")
    address = client.service_client.config.target_host
    conn = ["--address", address, "--task-queue", queue, "--cluster", ""]
    async with (
        new_worker(client, world, task_queue=queue),
        serve(_app(dev_env, twin, queue)) as url,
    ):
        body = {"action": "launch", "target": f"{node}/{found.gpu_uuid}", "reason": "ECC storm"}
        bob = await _post(url, crew["bob"], body)
        assert bob.status_code == 403
        assert f'may not launch remediations.sickbay.dev "{wf_id}"' in bob.json()["error"]
        typo = f"GPU-{uuid.uuid4()}"
        wrong = await _post(url, crew["alice"], {**body, "target": f"{node}/{typo}"})
        assert wrong.status_code == 422, wrong.text
        assert "nothing launched" in wrong.json()["error"]
        assert [wf async for wf in client.list_workflows(f"WorkflowId = '{wf_id}'")] == []

        kubeconfig = twin.twin.write_kubeconfig(tmp_path / "alice", token=crew["alice"])
        monkeypatch.setenv("KUBECONFIG", str(kubeconfig))
        capsys.readouterr()
        code = await _cli(
            "launch",
            *conn,
            "--node",
            node,
            "--uuid",
            found.gpu_uuid,
            "--reason",
            "ECC storm",
            "--via",
            url,
        )
        out = capsys.readouterr()
        assert code == 0, out.err
        assert f"{wf_id} launched, verified as alice-{tag}" in out.out
        handle = client.get_workflow_handle(wf_id)
        timeline = await handle.query(QRY_TIMELINE, result_type=list[TimelineEntry])
        await handle.signal(SIG_ABORT, AbortRequest(reason="test done", actor="t"))
        await handle.result()

        # Straight through Temporal: the launch is recorded, unverified.
        direct = await client.start_workflow(
            "remediate-gpu-device",
            RemediationInput(
                device=DeviceRef(node=node, gpu_uuid=found.gpu_uuid),
                trigger="manual",
                requested_by=f"alice-{tag}",
            ),
            id=wf_id,
            task_queue=queue,
        )
        direct_timeline: list[TimelineEntry] = []
        for _ in range(200):
            direct_timeline = await direct.query(QRY_TIMELINE, result_type=list[TimelineEntry])
            if any(e.action == "launched" for e in direct_timeline):
                break
            await asyncio.sleep(0.05)
        await direct.signal(SIG_ABORT, AbortRequest(reason="test done", actor="t"))
        await direct.result()
    (launched,) = [e for e in timeline if e.action == "launched"]
    assert (launched.actor, launched.verification, launched.via) == (
        f"alice-{tag}",
        "verified",
        "kubernetes",
    )
    assert crew["group"] in launched.groups
    (claimed,) = [e for e in direct_timeline if e.action == "launched"]
    assert (claimed.actor, claimed.verification) == (f"alice-{tag}", "unverified")
    history = (await handle.fetch_history()).to_json()
    for secret in (crew["alice"], ACTIONS_TEST_KEY.decode()):
        assert secret not in history


def test_launch_via_refuses_what_the_endpoint_cannot_carry(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """`--dry-run`, `--runbook` or a maintenance selector cannot go through the endpoint: the
    CLI says so (exit 2) before sending anything, instead of dropping them silently."""
    argv = ["launch", "--cluster", "", "--node", "n1", "--uuid", f"GPU-{uuid.uuid4()}"]
    assert cli_main([*argv, "--dry-run", "--via", "http://127.0.0.1:9"]) == 2
    assert "no maintenance selector, --runbook or --dry-run" in capsys.readouterr().err
