"""The embedded stack's pieces without playing a scenario:

- demo runbooks: every shipped runbook written, durations divided by the time scale with the
  floors of MIN_SECONDS, the inference scale-up aimed at the twin's cloud API (provider twin,
  the pool, its max), the widened inference budget; every change listed; the generated set
  loads with the worker's loader; a runbook the loader rejects fails loudly;
- channels file: valid for the worker (ChannelsConfig), secrets only as file references;
- notification sink: PagerDuty-shaped 202 with the dedup key, Slack "ok", webhook JSON, 400
  for a body that is not JSON, 404 elsewhere, routing key redacted, JSON lines on disk;
- sink fault rules (drills): the next `count` POSTs to a path are held `holdSeconds` (seen as
  `holding` meanwhile), answered 503 and not recorded; then delivery is normal again; a bad
  rule is a 400 naming the field; DELETE /faults removes the rules;
- ports: a taken preferred port is reported and a free one used;
- lifecycle: start without the engine, `sickbay-dev twin fail` against it via the stack's env,
  stop leaves no child alive and removes the temporary directory;
- a piece that fails at start-up: StackError naming it with the end of its log, and every
  child already started is stopped.
"""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest

from activities.notify.config import ChannelsConfig
from activities.runbooks import load_dir
from harness.sink import Sink, serve
from harness.stack import (
    MIN_SECONDS,
    PACKAGED_RUNBOOKS,
    Stack,
    StackConfig,
    StackError,
    channels_file,
    demo_runbooks,
    free_port,
    port_free,
    release_port,
)

SICKBAY_DEV = [sys.executable, "-m", "harness.cli"]  # `sickbay-dev`, without a re-install


def test_demo_runbooks_scaled_and_wired(tmp_path: Path) -> None:
    changes = demo_runbooks(tmp_path, 30, "http://127.0.0.1:4321", "gpu-pool", 2)
    shipped = {r.name: r for r in load_dir(PACKAGED_RUNBOOKS).runbooks}
    demo = {r.name: r for r in load_dir(tmp_path).runbooks}
    assert demo.keys() == shipped.keys()
    inf, inf0 = demo["inference"].spec, shipped["inference"].spec
    assert inf.replacement.pending_deadline == timedelta(seconds=10)  # 5m / 30
    assert inf0.replacement.pending_deadline == timedelta(minutes=5)
    assert inf.release.cooldown == inf0.release.cooldown / 30
    assert inf.eviction.timeout == timedelta(seconds=MIN_SECONDS["timeout"])  # 2m/30 = 4 s
    assert inf.confirm.stale_after == timedelta(seconds=60)  # 30m/30
    pool = inf.scale_up.pool
    assert pool is not None and pool.provider == "twin"
    assert (pool.name, pool.endpoint, pool.node_pool_label) == (
        "gpu-pool",
        "http://127.0.0.1:4321",
        "gpu-pool",
    )
    assert inf.scale_up.max_size == 2
    assert (inf.budget.max_per_pool, inf.budget.max_per_cluster) == ("100%", "100%")
    assert shipped["default"].spec.budget == demo["default"].spec.budget  # only inference
    assert demo["training"].spec.eviction.timeout == timedelta(seconds=20)  # 10m / 30
    assert any(line.startswith("inference: budget 100%") for line in changes)
    assert any("pendingDeadline 5m->10s" in line for line in changes)
    # A repair Job's timeout is its activeDeadlineSeconds on the twin's (scaled) clock: kept.
    for name in ("default", "training"):
        assert demo[name].spec.repair.reset.timeout == shipped[name].spec.repair.reset.timeout
        assert demo[name].spec.validation.timeout == shipped[name].spec.validation.timeout
    assert (
        demo["default"].spec.repair.reboot.timeout < shipped["default"].spec.repair.reboot.timeout
    )


def test_demo_runbooks_floor_at_high_scale(tmp_path: Path) -> None:
    demo_runbooks(tmp_path, 600, None)
    inf = {r.name: r for r in load_dir(tmp_path).runbooks}["inference"].spec
    assert inf.replacement.pending_deadline == timedelta(seconds=MIN_SECONDS["pendingDeadline"])
    assert inf.scale_up.pool is None  # no cloud endpoint: left as shipped


def test_demo_runbooks_reject_a_broken_source(tmp_path: Path) -> None:
    src = tmp_path / "src"
    src.mkdir()
    bad = (PACKAGED_RUNBOOKS / "inference.yaml").read_text().replace("timeout: 2m", "timeout: soon")
    (src / "inference.yaml").write_text(bad)
    with pytest.raises(ValueError, match="inference.yaml"):
        demo_runbooks(tmp_path / "out", 30, None, source=src)


def test_channels_file_is_valid_for_the_worker(tmp_path: Path) -> None:
    key = tmp_path / "pagerduty-key"
    key.write_text("k\n")
    path = channels_file(tmp_path / "channels.yaml", "http://127.0.0.1:9", key)
    config = ChannelsConfig.load(path)
    assert set(config.channels) == {"pagerduty", "slack", "webhook"}
    assert config.channels["pagerduty"].url == "http://127.0.0.1:9/v2/enqueue"
    assert "k" not in path.read_text().split()  # the key is referenced, never inlined


def _post(url: str, body: bytes) -> tuple[int, bytes]:
    req = urllib.request.Request(url, data=body, method="POST")
    req.add_header("Content-Type", "application/json")
    try:
        with urllib.request.urlopen(req, timeout=5) as r:
            return r.status, r.read()
    except urllib.error.HTTPError as err:
        return err.code, err.read()


def test_sink_answers_like_the_services(tmp_path: Path) -> None:
    sink = Sink(tmp_path / "n.jsonl")
    server = serve("127.0.0.1", 0, sink)
    base = f"http://127.0.0.1:{server.server_address[1]}"
    try:
        event = {"routing_key": "secret", "event_action": "trigger", "dedup_key": "wf-1"}
        status, body = _post(base + "/v2/enqueue", json.dumps(event).encode())
        assert status == 202 and json.loads(body)["dedup_key"] == "wf-1"
        assert _post(base + "/slack", b'{"text": "hi"}') == (200, b"ok")
        assert _post(base + "/webhook", b"{}")[0] == 200
        assert _post(base + "/v2/enqueue", b"not json")[0] == 400
        assert _post(base + "/nowhere", b"{}")[0] == 404
        lines = [json.loads(x) for x in (tmp_path / "n.jsonl").read_text().splitlines()]
        assert [x["kind"] for x in lines] == ["pagerduty", "slack", "webhook"]
        assert lines[0]["body"]["routing_key"] == "<redacted>"
        assert "secret" not in (tmp_path / "n.jsonl").read_text()
    finally:
        server.shutdown()


def test_sink_fault_holds_then_fails_without_recording(tmp_path: Path) -> None:
    sink = Sink(tmp_path / "n.jsonl")
    server = serve("127.0.0.1", 0, sink)
    base = f"http://127.0.0.1:{server.server_address[1]}"

    def faults() -> list[dict[str, Any]]:
        with urllib.request.urlopen(base + "/faults", timeout=5) as r:
            return list(json.loads(r.read())["items"])

    try:
        status, body = _post(
            base + "/faults", json.dumps({"path": "/v2/enqueue", "holdSeconds": 0.5}).encode()
        )
        assert status == 201 and json.loads(body)["count"] == 1
        answers: list[tuple[int, bytes]] = []
        held = threading.Thread(
            target=lambda: answers.append(_post(base + "/v2/enqueue", b'{"dedup_key": "a"}'))
        )
        started = time.monotonic()
        held.start()
        deadline = time.monotonic() + 5
        while not faults()[0]["holding"] and time.monotonic() < deadline:
            time.sleep(0.02)
        assert faults()[0]["holding"] == 1, "the request is held while it hangs"
        held.join(5)
        assert answers and answers[0][0] == 503
        assert time.monotonic() - started >= 0.5
        assert [(f["held"], f["holding"]) for f in faults()] == [(1, 0)]
        assert sink.events == [], "a failed (held) delivery is not a notification"
        assert _post(base + "/v2/enqueue", b'{"dedup_key": "a"}')[0] == 202  # count 1: spent
        assert [e["body"]["dedup_key"] for e in sink.events] == ["a"]
        for bad, field in (
            ({"path": "/nowhere"}, "path"),
            ({"path": "/slack", "count": 0}, "count"),
            ({"path": "/slack", "holdSeconds": "long"}, "holdSeconds"),
            ({"path": "/slack", "status": 200}, "status"),
            ({"path": "/slack", "colour": "red"}, "colour"),
        ):
            status, body = _post(base + "/faults", json.dumps(bad).encode())
            assert status == 400 and field in json.loads(body)["error"], (bad, body)
        assert _post(base + "/faults", b"[1]")[0] == 400
        req = urllib.request.Request(base + "/faults", method="DELETE")
        with urllib.request.urlopen(req, timeout=5) as r:
            assert json.loads(r.read()) == {"removed": 1}
        assert faults() == []
    finally:
        server.shutdown()


def test_engine_less_stack_lifecycle(tmp_path: Path) -> None:
    notes: list[str] = []
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        busy = taken.getsockname()[1]
        assert not port_free(busy)
        stack = Stack(StackConfig(temporal_port=busy, ui=False, engine=False, notes=notes.append))
        with stack:
            info = stack.info
            assert info is not None
            assert any(f"port {busy} is taken" in n for n in notes)
            assert info.temporal_address != f"127.0.0.1:{busy}"
            assert len(info.gpus) == 2 and info.node
            env = stack.sickbay_env()
            fail = subprocess.run(
                [*SICKBAY_DEV, "twin", "fail", info.node, "1", "--xid", "79"],
                env=env,
                capture_output=True,
                text=True,
                timeout=60,
            )
            assert fail.returncode == 0, fail.stderr
            faults = stack.twin("GET", "/twin/faults")["items"]
            assert [f["gpu_uuid"] for f in faults] == [info.gpus[1]]
            children = list(stack.children)
            directory = stack.dir
        assert all(not c.alive() for c in children)
        assert not directory.exists()


def test_free_port_is_free_and_outside_the_ephemeral_range() -> None:
    ports = [free_port() for _ in range(50)]
    try:
        assert all(port_free(p) for p in ports)
        assert len(set(ports)) == 50, "a port is never handed out twice"
        low = int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
        if low > 16000:  # room below the range: outgoing connections can never take these
            assert all(15000 <= p < low for p in ports), ports
    finally:
        for p in ports:
            release_port(p)


def test_free_port_holds_the_port_until_its_server_listens() -> None:
    """Between the pick and the child's bind (seconds for a Python child) no other process's
    pick may take the port - the twin once died with "Address already in use" in CI - while
    the server it is meant for binds and listens beside the hold."""
    port = free_port()
    other_pick = [
        sys.executable,
        "-c",
        "import socket, sys; s = socket.socket(); s.bind(('127.0.0.1', int(sys.argv[1])))",
        str(port),
    ]
    taken = subprocess.run(other_pick, capture_output=True, text=True, timeout=30)
    assert taken.returncode != 0 and "Address already in use" in taken.stderr, taken.stderr
    server = socket.socket()
    server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as http.server, uvicorn, Go
    server.bind(("127.0.0.1", port))
    server.listen()
    client = socket.create_connection(("127.0.0.1", port), timeout=5)
    conn, _ = server.accept()
    client.close()  # the client first: no TIME_WAIT left on the server's port
    conn.close()
    server.close()
    release_port(port)
    assert subprocess.run(other_pick, capture_output=True, timeout=30).returncode == 0


def test_a_piece_failing_at_start_stops_everything(tmp_path: Path) -> None:
    stack = Stack(
        StackConfig(
            temporal_port=free_port(),
            ui=False,
            worker_argv=["-c", "import sys; print('worker config broken'); sys.exit(3)"],
        )
    )
    with pytest.raises(StackError, match=r"worker exited during start-up \(code 3\)") as err:
        with stack:
            pass
    assert "worker config broken" in str(err.value)  # the end of its log is quoted
    assert [c.name for c in stack.children][:3] == ["temporal", "sink", "twin"]
    assert all(not c.alive() for c in stack.children)


def test_demo_runbooks_repair_off_unless_asked(tmp_path: Path) -> None:
    """The demo's scenarios hold and release as before; `--scenario repair` turns the shipped
    ladder on (and says so in neither case silently)."""
    off = demo_runbooks(tmp_path / "off", 30, None)
    on = demo_runbooks(tmp_path / "on", 30, None, repair=True)
    shipped = {r.name: r for r in load_dir(PACKAGED_RUNBOOKS).runbooks}
    demo_off = {r.name: r for r in load_dir(tmp_path / "off").runbooks}
    demo_on = {r.name: r for r in load_dir(tmp_path / "on").runbooks}
    assert shipped["inference"].spec.repair.enabled
    assert not any(r.spec.repair.enabled for r in demo_off.values())
    assert any("inference: repair ladder off" in line for line in off)
    assert demo_on["inference"].spec.repair.enabled
    assert demo_on["inference"].spec.repair.reset.xids == (48, 94, 95)
    assert not demo_on["maintenance"].spec.repair.enabled  # maintenance never repairs
    assert not any("repair ladder off" in line for line in on)


def test_demo_runbooks_lemons_on_unless_turned_off(tmp_path: Path) -> None:
    """The shipped lemons knob stays on in the demo (the repair scenario retires a lemon);
    bench/closed_loop.py, failing the same two GPUs every round, turns it off, and it says so."""
    kept = demo_runbooks(tmp_path / "kept", 30, None, repair=True)
    off = demo_runbooks(tmp_path / "off", 30, None, repair=True, lemons=False)
    shipped = {r.name: r for r in load_dir(PACKAGED_RUNBOOKS).runbooks}
    demo_kept = {r.name: r for r in load_dir(tmp_path / "kept").runbooks}
    demo_off = {r.name: r for r in load_dir(tmp_path / "off").runbooks}
    assert shipped["inference"].spec.lemons.enabled
    assert all(r.spec.lemons == shipped[name].spec.lemons for name, r in demo_kept.items())
    assert not any("lemons off" in line for line in kept)
    assert not any(r.spec.lemons.enabled for r in demo_off.values())
    assert demo_off["inference"].spec.lemons.failures == shipped["inference"].spec.lemons.failures
    assert any("inference: lemons off" in line for line in off)
