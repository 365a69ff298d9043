"""The webhook's delivery spool (worker/spool.py): bounded acknowledgement, nothing lost.

Cases:
- the journal: deliveries added are pending after a reopen (a new process), done ones are not;
  a torn last line (crash mid-write) is skipped; once nothing is pending the file is empty;
  firing and resolved alerts round-trip intact
- a second process cannot open a spool in use (clear error naming the directory), and
  `sickbay webhook` on one exits 2 with that line, no traceback
- Temporal stalls (a TCP proxy stops forwarding): the notification is answered 200 within
  the ack deadline with its alert `queued` and journaled; once Temporal answers again the
  same call completes, the workflow has the alert, and the journal is empty
- with Temporal answering, nothing is spooled (acknowledged as started, as without a spool)
- a full spool takes no more: the notification waits for Temporal (503 past the deadline)
- a spooled alert whose call fails stays journaled and the next redelivery round sends it;
  on shutdown (the spool's emptyDir may go with the pod) it is sent once more and waited for
- at the deadline, an alert whose call was answered behind a slower call of the same GPU is
  acknowledged, not failed (with and without a spool)
- crash: `sickbay webhook` acknowledges through the spool while Temporal stalls and is
  SIGKILLed; its connections are dropped unsent, so only the spool has the alert; a new
  webhook on the same spool delivers it (one workflow, the alert's signal) and empties it
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import signal
import uuid
from collections.abc import AsyncIterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx
import pytest
from temporalio.service import RPCError, RPCStatusCode
from temporalio.testing import WorkflowEnvironment

from bench.common import until
from contract.kube import DeviceRef
from contract.launch import LaunchResult
from contract.names import SIG_ALERT, device_workflow_id
from contract.remediation import AlertEvidence, AlertResolved
from tests.webhook.helpers import (
    TOKEN,
    auth,
    count_runs,
    free_socket,
    payload,
    serve,
    settings_for,
    signal_names,
    unique_device,
    xid_alert,
)
from tests.webhook.test_webhook_cli import SICKBAY, clean_env, wait_healthy
from worker.alerts import AmPayload, MappedAlert, map_alert
from worker.settings import Settings, WebhookSettings
from worker.spool import JOURNAL, Spool, SpoolError
from worker.webhook.app import create_app
from worker.webhook.metrics import WebhookMetrics
from worker.webhook.service import AlertService, TemporalUnavailable


def _alert(i: int, status: str = "firing") -> MappedAlert:
    node, gpu = f"node-{i}", f"GPU-{i:08d}"
    device = DeviceRef(node=node, gpu_uuid=gpu)
    at = datetime(2026, 11, 29, 10, i % 60, tzinfo=UTC)
    return MappedAlert(
        index=i,
        status="firing" if status == "firing" else "resolved",
        device=device,
        workflow_id=device_workflow_id(node, gpu),
        evidence=AlertEvidence(source="alertmanager", fingerprint=f"fp{i}", alertname="Xid", xid=79)
        if status == "firing"
        else None,
        resolved=AlertResolved(fingerprint=f"fp{i}", alertname="Xid", ends_at=at)
        if status != "firing"
        else None,
        starts_at=at,
    )


def test_journal_replays_pending_and_skips_torn_lines(tmp_path: Path) -> None:
    spool = Spool(tmp_path)
    assert spool.open() == []
    a, b, c = _alert(1), _alert(2), _alert(3, "resolved")
    assert spool.add([a, b]) == 2
    assert spool.add([c, a]) == 1  # a again: journaled once
    spool.done(b.delivery_key())
    spool.close()
    # A crash mid-write leaves half a line at the end.
    with (tmp_path / JOURNAL).open("ab") as f:
        f.write(b'{"op": "add", "alert": {"ind')

    again = Spool(tmp_path)
    left = again.open()
    assert sorted(m.delivery_key() for m in left) == sorted([a.delivery_key(), c.delivery_key()])
    got = {m.delivery_key(): m for m in left}
    assert got[a.delivery_key()] == a and got[c.delivery_key()] == c  # intact round trip
    # Compacted on open: only the two pending adds remain, the torn line is gone.
    lines = (tmp_path / JOURNAL).read_text().splitlines()
    assert [json.loads(x)["op"] for x in lines] == ["add", "add"]
    again.done(a.delivery_key())
    again.done(c.delivery_key())
    assert again.pending == {} and (tmp_path / JOURNAL).read_bytes() == b""
    again.close()
    assert Spool(tmp_path).open() == []


def test_second_process_cannot_share_a_spool(tmp_path: Path) -> None:
    first = Spool(tmp_path)
    first.open()
    try:
        with pytest.raises(SpoolError, match=str(tmp_path)):
            Spool(tmp_path).open()
        with pytest.raises(SpoolError, match="in use by another process"):
            Spool(tmp_path).check()
    finally:
        first.close()
    Spool(tmp_path).check()  # free again
    with pytest.raises(SpoolError, match="cannot use the webhook spool"):
        Spool(tmp_path / JOURNAL / "below-a-file").check()
    second = Spool(tmp_path)  # free again once the first closed
    second.open()
    second.close()


def test_spool_is_bounded(tmp_path: Path) -> None:
    spool = Spool(tmp_path, max_pending=2)
    spool.open()
    spool.add([_alert(1)])
    assert spool.room(1) and not spool.room(2)
    spool.close()


class StallProxy:
    """TCP proxy in front of Temporal that can stall (stop forwarding, data stays queued) and
    drop (close every connection, discarding what is queued)."""

    def __init__(self, target_port: int) -> None:
        self.target_port = target_port
        self.flowing = asyncio.Event()
        self.flowing.set()
        self.conns: list[tuple[asyncio.StreamWriter, asyncio.StreamWriter]] = []
        self.server: asyncio.Server | None = None
        self.port = 0

    async def start(self) -> None:
        self.server = await asyncio.start_server(self._conn, "127.0.0.1", 0)
        self.port = self.server.sockets[0].getsockname()[1]

    async def _conn(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        up_r, up_w = await asyncio.open_connection("127.0.0.1", self.target_port)
        self.conns.append((writer, up_w))

        async def pump(src: asyncio.StreamReader, dst: asyncio.StreamWriter) -> None:
            with contextlib.suppress(OSError, asyncio.CancelledError):
                while data := await src.read(65536):
                    await self.flowing.wait()
                    if dst.is_closing():
                        return
                    dst.write(data)
                    await dst.drain()
            with contextlib.suppress(OSError):
                dst.close()

        await asyncio.gather(pump(reader, up_w), pump(up_r, writer))

    def stall(self) -> None:
        self.flowing.clear()

    def resume(self) -> None:
        self.flowing.set()

    def drop(self) -> None:
        for a, b in self.conns:
            a.transport.abort()
            b.transport.abort()
        self.conns.clear()
        self.flowing.set()

    async def stop(self) -> None:
        self.drop()
        if self.server is not None:
            self.server.close()


@contextlib.asynccontextmanager
async def proxied(env: WorkflowEnvironment) -> AsyncIterator[StallProxy]:
    target = int(env.client.service_client.config.target_host.rsplit(":", 1)[1])
    proxy = StallProxy(target)
    await proxy.start()
    try:
        yield proxy
    finally:
        await proxy.stop()


@pytest.mark.devserver
async def test_stalled_temporal_is_acknowledged_through_the_spool(
    dev_env: WorkflowEnvironment, tmp_path: Path
) -> None:
    queue = f"spool-{uuid.uuid4().hex[:8]}"
    async with proxied(dev_env) as proxy:
        from worker.temporal import connect

        settings = settings_for(dev_env, queue).model_copy(
            update={"temporal_address": f"127.0.0.1:{proxy.port}"}
        )
        client = await connect(settings)
        app = create_app(
            settings,
            client,
            webhook=WebhookSettings(
                webhook_token=TOKEN,
                webhook_spool_dir=tmp_path,
                webhook_ack_seconds=0.3,
                # Far past the HTTP client's 30 s: a webhook that waited for Temporal instead
                # of acknowledging by the 0.3 s deadline would never answer this POST.
                webhook_temporal_timeout=120,
                webhook_spool_retry_seconds=0.2,
            ),
        )
        async with serve(app) as url, httpx.AsyncClient(base_url=url, timeout=30) as http:
            # Temporal answering: acknowledged as accepted, nothing spooled.
            n1, g1 = unique_device()
            ok = await http.post(
                "/v1/alertmanager", json=payload(xid_alert(n1, g1)), headers=auth()
            )
            assert ok.status_code == 200 and ok.json()["started"] == 1, ok.text
            assert (tmp_path / JOURNAL).read_bytes() == b""

            proxy.stall()
            n2, g2 = unique_device()
            resp = await http.post(
                "/v1/alertmanager", json=payload(xid_alert(n2, g2)), headers=auth()
            )
            body = resp.json()
            assert resp.status_code == 200, resp.text
            assert [r["result"] for r in body["results"]] == ["queued"]
            assert body["queued"] == 1 and body["started"] == 0
            journal = (tmp_path / JOURNAL).read_text()
            assert f"fp-{n2}" in journal  # on disk before the answer
            assert (await http.get("/healthz")).json()["spool_pending"] == 1
            wid = device_workflow_id(n2, g2)
            assert await count_runs(dev_env.client, f"WorkflowId = '{wid}'") == 0

            proxy.resume()

            async def delivered() -> bool:
                return (tmp_path / JOURNAL).read_bytes() == b""

            await until("the spooled alert to be delivered", delivered, 30, 0.1)
            assert await count_runs(dev_env.client, f"WorkflowId = '{wid}'", expect=1) == 1
            assert await signal_names(dev_env.client, wid) == [SIG_ALERT]
            assert (await http.get("/healthz")).json()["spool_pending"] == 0
            metrics = (await http.get("/metrics")).text
            assert "sickbay_webhook_alerts_spooled_total 1.0" in metrics
            assert "sickbay_webhook_spool_pending 0.0" in metrics
        for n, g in ((n1, g1), (n2, g2)):
            await dev_env.client.get_workflow_handle(device_workflow_id(n, g)).terminate("done")


@pytest.mark.devserver
async def test_crashed_webhook_spool_is_delivered_by_the_next(
    dev_env: WorkflowEnvironment, tmp_path: Path
) -> None:
    queue = f"spool-crash-{uuid.uuid4().hex[:8]}"
    token_file = tmp_path / "token"
    token_file.write_text(TOKEN)
    spool_dir = tmp_path / "spool"

    async def webhook(proxy: StallProxy) -> tuple[asyncio.subprocess.Process, str]:
        sock = free_socket()
        port = sock.getsockname()[1]
        sock.close()
        proc = await asyncio.create_subprocess_exec(
            SICKBAY,
            *("webhook", "--host", "127.0.0.1", "--port", str(port)),
            env=clean_env(
                SICKBAY_TEMPORAL_ADDRESS=f"127.0.0.1:{proxy.port}",
                SICKBAY_TASK_QUEUE=queue,
                SICKBAY_WEBHOOK_TOKEN_FILE=str(token_file),
                SICKBAY_WEBHOOK_SPOOL_DIR=str(spool_dir),
                SICKBAY_WEBHOOK_ACK_SECONDS="0.3",
                SICKBAY_WEBHOOK_SPOOL_RETRY_SECONDS="0.2",
            ),
            stdout=asyncio.subprocess.DEVNULL,
            stderr=asyncio.subprocess.DEVNULL,
        )
        url = f"http://127.0.0.1:{port}"
        assert (await wait_healthy(url))["temporal_connected"] is True
        return proc, url

    node, gpu = unique_device()
    wid = device_workflow_id(node, gpu)
    async with proxied(dev_env) as proxy:
        first, url = await webhook(proxy)
        try:
            proxy.stall()
            async with httpx.AsyncClient(base_url=url, timeout=30) as http:
                resp = await http.post(
                    "/v1/alertmanager", json=payload(xid_alert(node, gpu)), headers=auth()
                )
            assert resp.status_code == 200 and resp.json()["results"][0]["result"] == "queued"
        finally:
            first.send_signal(signal.SIGKILL)
            await first.wait()
        proxy.drop()  # the dead process's call never reaches Temporal
        await asyncio.sleep(0.5)  # the behaviour: no run appears meanwhile
        assert await count_runs(dev_env.client, f"WorkflowId = '{wid}'") == 0

        second, url = await webhook(proxy)
        try:

            async def delivered() -> bool:
                return (spool_dir / JOURNAL).read_bytes() == b""

            await until("the next webhook to deliver the spool", delivered, 30, 0.1)
            assert await count_runs(dev_env.client, f"WorkflowId = '{wid}'", expect=1) == 1
            assert await signal_names(dev_env.client, wid) == [SIG_ALERT]
            async with httpx.AsyncClient(base_url=url, timeout=30) as http:
                metrics = (await http.get("/metrics")).text
            assert "sickbay_webhook_spool_redelivered_total 1.0" in metrics
        finally:
            second.send_signal(signal.SIGTERM)
            await second.wait()
    await dev_env.client.get_workflow_handle(wid).terminate("done")


async def test_spool_in_use_refuses_to_serve(tmp_path: Path) -> None:
    held = Spool(tmp_path)
    held.open()
    try:
        app = create_app(
            Settings(temporal_address="127.0.0.1:1", task_queue="nowhere"),
            webhook=WebhookSettings(webhook_token=TOKEN, webhook_spool_dir=tmp_path),
        )
        with pytest.raises(SpoolError, match="in use by another process"):
            async with app.router.lifespan_context(app):
                pass
    finally:
        held.close()


class ControlledTemporal:
    """Stands in for `signal_with_start`: every call waits until the test answers it."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, asyncio.Future[None]]] = []

    async def __call__(self, client: object, inp: Any, **kw: Any) -> LaunchResult:
        answered: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self.calls.append((inp.device.workflow_id(), answered))
        await answered
        return LaunchResult(workflow_id=inp.device.workflow_id(), started=len(self.calls) == 1)


def controlled(
    wh: WebhookSettings, monkeypatch: pytest.MonkeyPatch
) -> tuple[AlertService, ControlledTemporal]:
    """An AlertService (no HTTP) whose Temporal calls wait for the test, with the spool of
    `wh` opened when it has one."""
    temporal = ControlledTemporal()
    monkeypatch.setattr("worker.webhook.service.signal_with_start", temporal)

    async def nothing_handled(self: AlertService, client: object, workflow_id: str) -> list[Any]:
        return []  # no closed run before (tests/webhook/test_webhook_repeats.py has those)

    monkeypatch.setattr(AlertService, "_handled_before", nothing_handled)
    service = AlertService(Settings(task_queue="controlled"), wh, WebhookMetrics(), object())  # type: ignore[arg-type]
    if wh.webhook_spool_dir is not None:
        service.spool = wh.new_spool()
        service.spool.open()
    return service, temporal


@pytest.mark.parametrize("spooled", [False, True], ids=["deadline", "spool"])
async def test_answered_call_behind_a_slow_one_is_acknowledged(
    spooled: bool, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A notification whose first delivery waits behind its GPU's call in flight, and whose
    second delivery joined that call: when the call is answered but the queued one is not by
    the notification's deadline, the joined alert is acknowledged, not failed; only the
    queued one is failed (deadline, no spool: 503) or queued (spool: 200)."""
    wh = WebhookSettings(
        webhook_token=TOKEN,
        webhook_temporal_timeout=0.5,
        webhook_ack_seconds=0.2,
        webhook_spool_dir=tmp_path if spooled else None,
    )
    service, temporal = controlled(wh, monkeypatch)
    node, gpu = unique_device()
    x = xid_alert(node, gpu)
    y = xid_alert(node, gpu, fingerprint="fp-second-rule")
    first = asyncio.ensure_future(service.handle(AmPayload.model_validate(payload(x))))
    await until("the first call", lambda: _true(len(temporal.calls) == 1), 5, 0.01)
    # Y queues behind the call in flight; X joins it.
    second = asyncio.ensure_future(service.handle(AmPayload.model_validate(payload(y, x))))
    await asyncio.sleep(0.05)
    temporal.calls[0][1].set_result(None)  # the call carrying X is answered
    code1, _ = await first
    assert code1 == 200
    await until("Y's call", lambda: _true(len(temporal.calls) == 2), 5, 0.01)
    code2, body = await second  # Y's call is never answered in time
    by_index = {r["index"]: r for r in body["results"]}
    assert by_index[1]["result"] == "duplicate" and by_index[1]["via"] == "in-flight"
    if spooled:
        assert code2 == 200 and by_index[0]["result"] == "queued" and not body["failed"]
        assert list(service.spool.pending) == [service_key(service, y)]  # type: ignore[union-attr]
    else:
        assert code2 == 503
        assert [(f["index"], f["reason"]) for f in body["failed"]] == [(0, "temporal-timeout")]
    temporal.calls[1][1].set_result(None)
    await service.drain(5)
    if spooled:
        assert service.spool is not None and service.spool.pending == {}
        service.spool.close()


async def _true(value: bool) -> bool:
    return value


def service_key(service: AlertService, alert: dict[str, Any]) -> tuple[str, str, str, str]:
    m = map_alert(0, AmPayload.model_validate(payload(alert)).alerts[0], service.mapping)
    assert isinstance(m, MappedAlert)
    return m.delivery_key()


async def test_full_spool_waits_for_temporal(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Past SICKBAY_WEBHOOK_SPOOL_MAX pending alerts the spool takes no more: the notification
    waits for Temporal as without a spool, and fails (503) past the deadline."""
    wh = WebhookSettings(
        webhook_token=TOKEN,
        webhook_temporal_timeout=0.6,
        webhook_ack_seconds=0.1,
        webhook_spool_dir=tmp_path,
        webhook_spool_max=1,
    )
    service, temporal = controlled(wh, monkeypatch)
    assert service.spool is not None
    (n1, g1), (n2, g2) = unique_device(), unique_device()
    code, body = await service.handle(
        AmPayload.model_validate(payload(xid_alert(n1, g1), xid_alert(n2, g2)))
    )
    assert code == 503 and not body["queued"]
    assert {f["reason"] for f in body["failed"]} == {"temporal-timeout"}
    assert service.spool.pending == {}
    for _wf, answered in temporal.calls:
        answered.set_result(None)
    await service.drain(5)
    service.spool.close()


async def test_failed_spooled_call_is_sent_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A spooled alert whose call fails stays in the journal; the next redelivery round sends
    it again, and once Temporal accepts it the journal is empty."""
    wh = WebhookSettings(webhook_token=TOKEN, webhook_ack_seconds=0.1, webhook_spool_dir=tmp_path)
    service, temporal = controlled(wh, monkeypatch)
    assert service.spool is not None
    node, gpu = unique_device()
    code, body = await service.handle(AmPayload.model_validate(payload(xid_alert(node, gpu))))
    assert code == 200 and body["queued"] == 1
    temporal.calls[0][1].set_exception(RPCError("unavailable", RPCStatusCode.UNAVAILABLE, b""))
    await until("the failed call to end", lambda: _true(not service.lanes), 5, 0.01)
    assert len(service.spool.pending) == 1  # still journaled
    assert await service.redeliver() == 1
    await until("the call sent again", lambda: _true(len(temporal.calls) == 2), 5, 0.01)
    temporal.calls[1][1].set_result(None)
    await service.drain(5)
    assert service.spool.pending == {}
    assert (tmp_path / JOURNAL).read_bytes() == b""
    service.spool.close()


async def test_shutdown_sends_what_the_spool_still_holds(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """On shutdown (a pod deleted: its emptyDir spool goes with it) a spooled alert whose call
    failed, waiting for the next redelivery round, is sent once more and waited for: the
    journal is empty when the process ends."""
    wh = WebhookSettings(webhook_token=TOKEN, webhook_ack_seconds=0.1, webhook_spool_dir=tmp_path)
    service, temporal = controlled(wh, monkeypatch)
    assert service.spool is not None
    node, gpu = unique_device()
    code, body = await service.handle(AmPayload.model_validate(payload(xid_alert(node, gpu))))
    assert code == 200 and body["queued"] == 1
    temporal.calls[0][1].set_exception(RPCError("unavailable", RPCStatusCode.UNAVAILABLE, b""))
    await until("the failed call to end", lambda: _true(not service.lanes), 5, 0.01)
    assert len(service.spool.pending) == 1  # journaled, waiting for the next round
    stopping = asyncio.ensure_future(service.shutdown(5))
    await until(
        "the call sent again, or the shutdown over",
        lambda: _true(len(temporal.calls) == 2 or stopping.done()),
        10,
        0.01,
    )
    assert len(temporal.calls) == 2, "shutdown left the spooled alert unsent"
    temporal.calls[1][1].set_result(None)
    await stopping
    assert service.spool.pending == {}
    assert (tmp_path / JOURNAL).read_bytes() == b""
    service.spool.close()


async def test_cli_refuses_a_spool_in_use(tmp_path: Path) -> None:
    """`sickbay webhook` on a spool another process holds exits 2 with one clear line."""
    held = Spool(tmp_path)
    held.open()
    try:
        proc = await asyncio.create_subprocess_exec(
            SICKBAY,
            "webhook",
            env=clean_env(
                SICKBAY_TEMPORAL_ADDRESS="127.0.0.1:1",
                SICKBAY_WEBHOOK_TOKEN=TOKEN,
                SICKBAY_WEBHOOK_SPOOL_DIR=str(tmp_path),
            ),
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
        )
        async with asyncio.timeout(30):
            _, err = await proc.communicate()
    finally:
        held.close()
    assert proc.returncode == 2
    assert b"in use by another process" in err and b"Traceback" not in err


async def test_unreachable_temporal_is_reported_once_a_minute_not_every_round(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """Redelivery rounds run every few seconds; while Temporal cannot be reached the log says
    so once (then at most once a minute), and once when it can be reached again."""
    wh = WebhookSettings(webhook_token=TOKEN, webhook_spool_dir=tmp_path)
    service, temporal = controlled(wh, monkeypatch)
    assert service.spool is not None
    service.spool.add([_alert(1), _alert(2)])
    reachable = False

    async def client() -> object:
        if not reachable:
            raise TemporalUnavailable("cannot reach Temporal at nowhere:7233: refused")
        return object()

    monkeypatch.setattr(service, "client", client)
    caplog.set_level("INFO", logger="worker.webhook")
    for _ in range(5):
        assert await service.redeliver() == 0
    waits = [r for r in caplog.records if "wait for Temporal" in r.getMessage()]
    assert len(waits) == 1 and waits[0].levelname == "WARNING"
    assert "2 alert(s)" in waits[0].getMessage() and "nowhere:7233" in waits[0].getMessage()

    monkeypatch.setattr("worker.webhook.delivery.SPOOL_WAIT_LOG_SECONDS", 0.0)  # a minute later
    assert await service.redeliver() == 0
    assert len([r for r in caplog.records if "wait for Temporal" in r.getMessage()]) == 2

    reachable = True
    assert await service.redeliver() == 2
    again = [r for r in caplog.records if "reachable again" in r.getMessage()]
    assert len(again) == 1 and again[0].levelname == "INFO"
    await until("both calls made", lambda: _true(len(temporal.calls) == 2), 5, 0.01)
    for _wf, answered in temporal.calls:
        answered.set_result(None)
    await service.drain(5)
    assert service.spool.pending == {}
    service.spool.close()
