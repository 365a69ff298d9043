"""End to end with the monitoring stack users run: real Prometheus and Alertmanager (the
Debian binaries), the project's rule file and receiver configuration, a fake exporter with
dcgm-exporter's metric and label sets, and the embedded Sickbay stack (Temporal dev server,
cluster twin with 2 nodes x 2 GPUs, `sickbay worker`, `sickbay webhook`).

The webhook's recent-delivery cache is off (SICKBAY_WEBHOOK_DEDUP_SECONDS=0), so every
Alertmanager repeat reaches Temporal: what stops a repeat from starting a run is Temporal's
record of the closed run, not the webhook's memory.

Cases (one GPU each; each test stops its own alert when it ends):
- Xid 79 (dcgm-exporter 4.x, `Hostname`) -> one remediation that quarantines; marked
  repaired it closes; Alertmanager keeps repeating the still-firing alert -> `already-handled`,
  no second run, no re-quarantine;
- Xid 13 (main's `hostname`, Prometheus Operator scrape: pod mapping in `exported_*`) -> a run
  that does not quarantine and closes, the owners' channel (Slack) told once, PagerDuty never;
  its repeats start nothing;
- row-remap failure fires, then resolves: the remediation's timeline shows the resolution;
- the webhook down (connections refused) while Xid 79 fires: nothing started, Alertmanager
  counts failed deliveries; back up, Alertmanager's retry starts the remediation;
- a receiver with a wrong token: 401s, the webhook logs the refusal, nothing started;
- the GPU ledger against the twin: a GPU with two failures in the ledger is drained for
  maintenance (`sickbay launch --select-node ... --select-attr uuid=...`): its remediation
  quarantines and holds, the timeline says the failure was not counted, the ledger still
  holds two failures and the GPU is not retired, nobody is asked for an RMA;
- the same Xid under new labels after `repaired`: a new pod mapping (`exported_pod`), and
  `Hostname` turning into the exporter pod's name -> already-handled, no second run of the
  device, no page, no DeviceTaintRule; `sickbay status` lists the first.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import time
import urllib.request
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from datetime import timedelta
from typing import Any

import pytest
from temporalio.client import Client, WorkflowExecutionStatus

from activities.ledger import LedgerActivities
from contract.ledger import LedgerState, RecordFailureInput
from contract.names import (
    QRY_LEDGER_STATE,
    QRY_STATUS,
    QRY_TIMELINE,
    SIG_REPAIRED,
    device_workflow_id,
    ledger_workflow_id,
)
from contract.remediation import Phase, RemediationStatus, RepairedRequest, TimelineEntry
from harness.stack import Stack, StackConfig, free_port
from tests.monitoring.conftest import binary
from tests.monitoring.stack import Monitoring, monitoring
from worker.settings import Settings
from worker.temporal import connect

WAIT = 60.0  # seconds for any one state on a busy 2-core machine (typically 2-6 s)


@pytest.fixture(scope="module")
def stacks(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Stack, Monitoring]]:
    binary("prometheus")
    binary("prometheus-alertmanager", "alertmanager")
    binary("promtool")
    tmp = tmp_path_factory.mktemp("monitoring")
    with pytest.MonkeyPatch.context() as env:
        env.setenv("SICKBAY_WEBHOOK_DEDUP_SECONDS", "0")
        config = StackConfig(
            time_scale=60.0,
            temporal_port=free_port(),
            ui=False,
            state_dir=tmp / "sickbay",
            nodes=2,
            gpus_per_node=2,
            notes=lambda text: None,
        )
        with Stack(config) as stack:
            assert stack.info is not None
            token = stack.dir / "secrets" / "webhook-token"
            with monitoring(tmp / "monitoring", stack.info.webhook_url, token) as mon:
                yield stack, mon


@pytest.fixture
async def temporal(stacks: tuple[Stack, Monitoring]) -> AsyncIterator[Client]:
    info = stacks[0].info
    assert info is not None
    yield await connect(
        Settings(temporal_address=info.temporal_address, temporal_namespace=info.namespace)
    )


async def until(what: str, probe: Callable[[], Awaitable[Any]], within: float = WAIT) -> Any:
    deadline = time.monotonic() + within
    while True:
        value = await probe()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {within:.0f} s waiting for {what}")
        await asyncio.sleep(0.25)


def gpus(stack: Stack) -> list[tuple[str, str, int]]:
    """(node, uuid, index) of the twin's GPUs, node by node."""
    items = stack.twin("GET", "/twin/gpus")["items"]
    out = [(g["node"], g["uuid"], int(g.get("index", 0))) for g in items]
    return sorted(out)


def dcgm_labels(node: str, uuid: str, index: int, shape: str) -> tuple[str, dict[str, str]]:
    """(exporter path, labels) as dcgm-exporter labels a GPU's series."""
    labels = {
        "gpu": str(index),
        "UUID": uuid,
        "device": f"nvidia{index}",
        "modelName": "NVIDIA H100 80GB HBM3",
        "pci_bus_id": f"00000000:{index + 1:02x}:00.0",
    }
    if shape == "4.x":
        return "/node0", {**labels, "Hostname": node}
    # main branch: lowercase hostname; a pod mapping, which the Operator-style scrape renames.
    return "/node1", {
        **labels,
        "hostname": node,
        "pod": f"trainer-{index}",
        "namespace": "ml",
        "container": "main",
    }


def webhook_metric(stack: Stack, name: str, **labels: str) -> float:
    assert stack.info is not None
    url = stack.info.webhook_url.rsplit("/v1/", 1)[0] + "/metrics"
    with urllib.request.urlopen(url, timeout=5) as resp:
        text = resp.read().decode()
    want = [f'{k}="{v}"' for k, v in labels.items()]
    return sum(
        float(line.rsplit(" ", 1)[1])
        for line in text.splitlines()
        if line.startswith(name + "{") and all(w in line for w in want)
    )


def taint_rules(stack: Stack) -> list[str]:
    """DeviceTaintRules in the twin (Kubernetes 1.36: resource.k8s.io/v1beta2)."""
    from kubernetes import client, config

    assert stack.info is not None
    api = client.CustomObjectsApi(config.new_client_from_config(stack.info.kubeconfig))
    body = api.list_cluster_custom_object("resource.k8s.io", "v1beta2", "devicetaintrules")
    return [item["metadata"]["name"] for item in body.get("items") or []]


def pages(stack: Stack, wid: str) -> int:
    """Notifications about this remediation that reached the stack's sink."""
    return sum(wid in json.dumps(event) for event in stack.notifications())


def owner_notes(stack: Stack, uuid: str) -> int:
    """Slack messages (the shipped runbooks' owner channel) about this GPU at the sink."""
    return sum(e.get("kind") == "slack" and uuid in json.dumps(e) for e in stack.notifications())


async def runs(client: Client, wid: str) -> int:
    return (await client.count_workflows(f"WorkflowId = '{wid}'")).count


async def status(client: Client, wid: str) -> RemediationStatus | None:
    try:
        return await client.get_workflow_handle(wid).query(
            QRY_STATUS, result_type=RemediationStatus
        )
    except Exception:  # not started yet
        return None


async def closed(client: Client, wid: str) -> bool:
    desc = await client.get_workflow_handle(wid).describe()
    return desc.status is not WorkflowExecutionStatus.RUNNING


async def repeats_answered_already_handled(stack: Stack, mon: Monitoring, n: int = 2) -> None:
    """Alertmanager re-sent the group at least `n` times more, and Temporal-backed answers
    said already-handled for them."""
    sent = mon.alertmanager_metric("alertmanager_notifications_total", integration="webhook")
    handled = webhook_metric(stack, "sickbay_webhook_workflows_total", result="already-handled")

    async def more() -> bool:
        now_sent = mon.alertmanager_metric(
            "alertmanager_notifications_total", integration="webhook"
        )
        now = webhook_metric(stack, "sickbay_webhook_workflows_total", result="already-handled")
        return now_sent >= sent + n and now >= handled + n

    await until(f"{n} more repeats answered already-handled", more)


async def test_xid79_one_remediation_and_no_requarantine_after_repaired(
    stacks: tuple[Stack, Monitoring], temporal: Client
) -> None:
    stack, mon = stacks
    node, uuid, index = gpus(stack)[0]
    wid = device_workflow_id(node, uuid)
    path, labels = dcgm_labels(node, uuid, index, "4.x")
    mon.exporter.set(path, "DCGM_FI_DEV_XID_ERRORS", labels, 79)
    try:
        holding = await until(
            "the remediation holding the quarantined GPU",
            lambda: _phase(temporal, wid, Phase.HOLDING),
        )
        assert holding.rule_name and holding.failure_class == "unhealthy"
        assert await runs(temporal, wid) == 1
        await temporal.get_workflow_handle(wid).signal(
            SIG_REPAIRED, RepairedRequest(actor="test", note="GPU replaced")
        )
        await until("the remediation closed", lambda: closed(temporal, wid))
        paged = pages(stack, wid)
        await repeats_answered_already_handled(stack, mon)
        assert await runs(temporal, wid) == 1  # the still-firing alert started nothing
        assert pages(stack, wid) == paged  # and paged nobody again
        final = await status(temporal, wid)
        assert final is not None and final.outcome == "released"
        assert taint_rules(stack) == []  # released, and never re-created by a repeat
    finally:
        mon.exporter.remove(path, "DCGM_FI_DEV_XID_ERRORS", labels)


async def test_xid13_no_remediation_and_no_new_run_on_repeats(
    stacks: tuple[Stack, Monitoring], temporal: Client
) -> None:
    stack, mon = stacks
    node, uuid, index = next(g for g in gpus(stack) if g[0] != gpus(stack)[0][0])
    wid = device_workflow_id(node, uuid)
    path, labels = dcgm_labels(node, uuid, index, "main")
    mon.exporter.set(path, "DCGM_FI_DEV_XID_ERRORS", labels, 13)
    try:
        await until("the Xid 13 run closed", lambda: _closed_run(temporal, wid))
        final = await status(temporal, wid)
        assert final is not None
        assert final.failure_class == "application" and final.rule_name is None
        assert final.outcome == "not-quarantined"
        told = owner_notes(stack, uuid)
        assert told >= 1  # the owners' channel was told once
        assert pages(stack, wid) == 0  # on-call (PagerDuty) never paged for the program's error
        await repeats_answered_already_handled(stack, mon)
        assert await runs(temporal, wid) == 1
        assert owner_notes(stack, uuid) == told and pages(stack, wid) == 0
    finally:
        mon.exporter.remove(path, "DCGM_FI_DEV_XID_ERRORS", labels)


async def test_resolved_alert_reaches_the_remediation(
    stacks: tuple[Stack, Monitoring], temporal: Client
) -> None:
    stack, mon = stacks
    node, uuid, index = gpus(stack)[1]
    wid = device_workflow_id(node, uuid)
    path, labels = dcgm_labels(node, uuid, index, "4.x")
    mon.exporter.set(path, "DCGM_FI_DEV_ROW_REMAP_FAILURE", labels, 1)
    handle = temporal.get_workflow_handle(wid)
    try:
        await until(
            "the row-remap remediation holding", lambda: _phase(temporal, wid, Phase.HOLDING)
        )
        mon.exporter.set(path, "DCGM_FI_DEV_ROW_REMAP_FAILURE", labels, 0)

        async def resolved() -> bool:
            timeline = await handle.query(QRY_TIMELINE, result_type=list[TimelineEntry])
            return any(e.action == "alert resolved" for e in timeline)

        await until("the resolution in the timeline", resolved)
        await handle.signal(SIG_REPAIRED, RepairedRequest(actor="test"))
        await until("the remediation closed", lambda: closed(temporal, wid))
    finally:
        mon.exporter.remove(path, "DCGM_FI_DEV_ROW_REMAP_FAILURE", labels)


async def test_webhook_down_then_alertmanager_retry_delivers(
    stacks: tuple[Stack, Monitoring], temporal: Client
) -> None:
    stack, mon = stacks
    node, uuid, index = gpus(stack)[3]
    wid = device_workflow_id(node, uuid)
    path, labels = dcgm_labels(node, uuid, index, "main")
    failed = mon.alertmanager_metric(
        "alertmanager_notifications_failed_total", integration="webhook"
    )
    mon.gate.down()
    try:
        mon.exporter.set(path, "DCGM_FI_DEV_XID_ERRORS", labels, 79)

        async def refused() -> bool:
            return (
                mon.alertmanager_metric(
                    "alertmanager_notifications_failed_total", integration="webhook"
                )
                > failed
            )

        await until("Alertmanager failing to deliver", refused)
        assert await runs(temporal, wid) == 0
        mon.gate.up()
        await until("the retried delivery started the remediation", lambda: runs(temporal, wid))
        await until("it holding", lambda: _phase(temporal, wid, Phase.HOLDING))
        await temporal.get_workflow_handle(wid).signal(SIG_REPAIRED, RepairedRequest(actor="t"))
        await until("the remediation closed", lambda: closed(temporal, wid))
    finally:
        mon.gate.up_if_down()
        mon.exporter.remove(path, "DCGM_FI_DEV_XID_ERRORS", labels)


async def test_wrong_token_is_401_logged_and_starts_nothing(
    stacks: tuple[Stack, Monitoring], temporal: Client
) -> None:
    stack, mon = stacks
    node, _uuid, _index = gpus(stack)[0]
    uuid = "GPU-badtoken-0000-0000-0000-000000000001"
    path, labels = dcgm_labels(node, uuid, 7, "4.x")
    labels["tenant"] = "badtoken"
    before = webhook_metric(stack, "sickbay_webhook_requests_rejected_total", reason="unauthorized")
    mon.exporter.set(path, "DCGM_FI_DEV_XID_ERRORS", labels, 79)
    try:

        async def refused() -> bool:
            now = webhook_metric(
                stack, "sickbay_webhook_requests_rejected_total", reason="unauthorized"
            )
            return now > before

        await until("the webhook refusing the wrong token", refused)
        log = (stack.dir / "logs" / "webhook.log").read_text(errors="replace")
        assert "refused a notification" in log and "401" in log
        assert "not-the-token" not in log
        assert await runs(temporal, device_workflow_id(node, uuid)) == 0
    finally:
        mon.exporter.remove(path, "DCGM_FI_DEV_XID_ERRORS", labels)


async def _phase(client: Client, wid: str, phase: Phase) -> RemediationStatus | None:
    s = await status(client, wid)
    return s if s is not None and s.phase is phase else None


async def _closed_run(client: Client, wid: str) -> bool:
    try:
        return await closed(client, wid)
    except Exception:  # not started yet
        return False


async def test_maintenance_drain_of_a_gpu_with_two_failures_does_not_retire_it(
    stacks: tuple[Stack, Monitoring], temporal: Client
) -> None:
    stack, _mon = stacks
    assert stack.info is not None
    node, uuid, _index = gpus(stack)[2]
    wid = device_workflow_id(node, uuid)
    queue = stack.info.task_queue
    ledger = LedgerActivities(temporal, queue)
    for n in (1, 2):  # two earlier, real failures of this GPU
        await ledger.record_gpu_failure(
            RecordFailureInput(
                gpu_uuid=uuid,
                node=node,
                incident=f"earlier-{n}",
                failure_class="unhealthy",
                xid=48,
                evidence="pod status reports the device Unhealthy",
                failures=3,
                window=timedelta(days=7),
            )
        )
    before = pages(stack, wid)
    launch = await asyncio.to_thread(
        subprocess.run,
        [
            sys.executable,
            "-m",
            "worker.cli",
            "launch",
            "--select-node",
            node,
            "--select-attr",
            f"uuid={uuid}",
            "--reason",
            "kernel upgrade",
        ],
        env=stack.sickbay_env(),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert launch.returncode == 0, launch.stdout + launch.stderr
    handle = temporal.get_workflow_handle(wid)
    try:
        await until("the drained GPU held", lambda: _phase(temporal, wid, Phase.HOLDING))
        timeline = await handle.query(QRY_TIMELINE, result_type=list[TimelineEntry])
        [entry] = [e for e in timeline if e.action == "failure not counted"]
        assert "maintenance" in entry.reason
        assert not any(e.action in ("failure recorded", "GPU retired") for e in timeline)
        state = await temporal.get_workflow_handle(ledger_workflow_id(queue)).query(
            QRY_LEDGER_STATE, result_type=LedgerState
        )
        [gpu] = [g for g in state.gpus if g.gpu_uuid == uuid]
        assert [e.kind for e in gpu.entries] == ["failure", "failure"]
        assert gpu.retired_at is None
        held = await status(temporal, wid)
        assert held is not None and held.escalation_reason != "gpu-retired"
        assert not any("RMA" in json.dumps(e) for e in stack.notifications()[before:])
    finally:
        await handle.signal(SIG_REPAIRED, RepairedRequest(actor="test", note="upgraded"))
        await until("the drain's remediation closed", lambda: _closed_run(temporal, wid))


async def test_same_xid_under_a_new_pod_label_after_repaired_is_already_handled(
    stacks: tuple[Stack, Monitoring], temporal: Client
) -> None:
    """The exporter's pod mapping changes after `repaired` (a new `exported_pod` behind the
    Operator-style scrape): Prometheus makes a new series and Alertmanager a new alert
    (fingerprint, startsAt) of the same Xid; the webhook answers already-handled, no second
    run, no page, no DeviceTaintRule, and `sickbay status` lists it."""
    stack, mon = stacks
    node, uuid, index = gpus(stack)[1]
    wid = device_workflow_id(node, uuid)
    path, labels = dcgm_labels(node, uuid, index, "main")
    moved = {**labels, "pod": "trainer-rescheduled"}
    mon.exporter.set(path, "DCGM_FI_DEV_XID_ERRORS", labels, 79)
    try:
        await until("the Xid 79 remediation holding", lambda: _phase(temporal, wid, Phase.HOLDING))
        first = await runs(temporal, wid)
        await temporal.get_workflow_handle(wid).signal(
            SIG_REPAIRED, RepairedRequest(actor="test", note="GPU reseated")
        )
        await until("the remediation closed", lambda: _closed_run(temporal, wid))
        paged = pages(stack, wid)
        mon.exporter.remove(path, "DCGM_FI_DEV_XID_ERRORS", labels)
        mon.exporter.set(path, "DCGM_FI_DEV_XID_ERRORS", moved, 79)

        async def listed() -> str:
            status_cmd = await asyncio.to_thread(
                subprocess.run,
                [sys.executable, "-m", "worker.cli", "status", "--all"],
                env=stack.sickbay_env(),
                capture_output=True,
                text=True,
                timeout=60,
            )
            out = status_cmd.stdout
            return out if "already-handled (same Xid, new labels)" in out else ""

        shown = await until("sickbay status listing the repeat under new labels", listed)
        assert wid in shown
        assert await runs(temporal, wid) == first  # nothing started for it
        assert pages(stack, wid) == paged  # nobody paged again
        assert taint_rules(stack) == []  # never re-quarantined
    finally:
        mon.exporter.remove(path, "DCGM_FI_DEV_XID_ERRORS", labels)
        mon.exporter.remove(path, "DCGM_FI_DEV_XID_ERRORS", moved)


async def test_hostname_turning_into_the_exporter_pod_after_repaired_is_already_handled(
    stacks: tuple[Stack, Monitoring], temporal: Client
) -> None:
    """dcgm-exporter restarted without NODE_NAME labels `Hostname` with its own pod's name:
    Prometheus makes a new series of the same Xid, Alertmanager a new alert naming the pod as
    the node. Its run resolves the pod to its node and hands over to the device's id, where
    the last run handled that Xid: closed `already handled`, no second run of the device, no
    page, no DeviceTaintRule."""
    from kubernetes import client as k8s
    from kubernetes import config as k8s_config

    stack, mon = stacks
    assert stack.info is not None
    node, uuid, index = gpus(stack)[0]
    wid = device_workflow_id(node, uuid)
    path, labels = dcgm_labels(node, uuid, index, "4.x")
    exporter_pod = "nvidia-dcgm-exporter-q7x2p"
    renamed = {**labels, "Hostname": exporter_pod}
    core = k8s.CoreV1Api(k8s_config.new_client_from_config(stack.info.kubeconfig))
    core.create_namespaced_pod(
        "default",
        {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": exporter_pod, "labels": {"app": "nvidia-dcgm-exporter"}},
            "spec": {
                "nodeName": node,
                "containers": [{"name": "exporter", "image": "nvcr.io/nvidia/k8s/dcgm-exporter"}],
            },
        },
    )
    mon.exporter.set(path, "DCGM_FI_DEV_XID_ERRORS", labels, 79)
    try:
        await until("the Xid 79 remediation holding", lambda: _phase(temporal, wid, Phase.HOLDING))
        first = await runs(temporal, wid)
        await temporal.get_workflow_handle(wid).signal(
            SIG_REPAIRED, RepairedRequest(actor="test", note="GPU reseated")
        )
        await until("the remediation closed", lambda: _closed_run(temporal, wid))
        paged = pages(stack, wid)
        mon.exporter.remove(path, "DCGM_FI_DEV_XID_ERRORS", labels)
        mon.exporter.set(path, "DCGM_FI_DEV_XID_ERRORS", renamed, 79)
        there = device_workflow_id(exporter_pod, uuid)
        await until(
            "the run under the exporter pod's name closed", lambda: _closed_run(temporal, there)
        )
        final = await status(temporal, there)
        assert final is not None and final.outcome == "not-quarantined"
        timeline = await temporal.get_workflow_handle(there).query(
            QRY_TIMELINE, result_type=list[TimelineEntry]
        )
        closing = [e for e in timeline if e.action == "closed"]
        assert closing and "already handled" in closing[-1].reason and wid in closing[-1].reason
        assert await runs(temporal, wid) == first  # the device's id: nothing started
        assert pages(stack, wid) == paged and pages(stack, there) == 0
        assert taint_rules(stack) == []
    finally:
        mon.exporter.remove(path, "DCGM_FI_DEV_XID_ERRORS", labels)
        mon.exporter.remove(path, "DCGM_FI_DEV_XID_ERRORS", renamed)
        core.delete_namespaced_pod(exporter_pod, "default")
