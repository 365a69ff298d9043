"""The worker's Prometheus endpoint listens where SICKBAY_METRICS_HOST says, loopback by default.

Linux routes all of 127.0.0.0/8 to the loopback interface, so a listener on 127.0.0.1 only is
told apart from one on every address by connecting to 127.0.0.2.

Cases:
- default (`Settings().metrics_host`): 127.0.0.1 answers, 127.0.0.2 is refused;
- `0.0.0.0`: both answer (what deploy/ and compose set inside a pod/container).
"""

from __future__ import annotations

import socket
import sys
import time

import pytest

from worker import main as worker_main
from worker.settings import Settings

pytestmark = pytest.mark.skipif(sys.platform != "linux", reason="127.0.0.2 is loopback on Linux")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _answers(host: str, port: int) -> bool:
    try:
        with socket.create_connection((host, port), timeout=5):
            return True
    except OSError:
        return False


def _wait_listening(port: int) -> None:
    deadline = time.monotonic() + 30
    while not _answers("127.0.0.1", port):
        assert time.monotonic() < deadline, "the metrics endpoint never listened"
        time.sleep(0.1)


def test_metrics_listen_on_loopback_by_default() -> None:
    port = _free_port()
    runtime = worker_main.metrics_runtime(port, Settings(metrics_port=port).metrics_host)
    assert runtime is not None
    _wait_listening(port)
    assert not _answers("127.0.0.2", port), "metrics reachable beyond loopback by default"


def test_metrics_on_every_address_when_asked() -> None:
    port = _free_port()
    runtime = worker_main.metrics_runtime(port, "0.0.0.0")
    assert runtime is not None
    _wait_listening(port)
    assert _answers("127.0.0.2", port)
