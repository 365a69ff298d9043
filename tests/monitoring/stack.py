"""A real monitoring stack in front of the embedded Sickbay stack, for tests/monitoring.

    exporter (this process)  -> Prometheus (real binary, the project's rule file)
                             -> Alertmanager (real binary, deploy/alertmanager.yaml's route and
                                receiver, intervals shortened) -> proxy -> Sickbay webhook

- `FakeDcgmExporter` serves dcgm-exporter's metric names and label sets: node 0 as
  dcgm-exporter 4.x scraped with honor_labels (`Hostname`, pod mapping as `pod`/`namespace`),
  node 1 as its main branch (`hostname`) behind a Prometheus Operator-style scrape
  (honor_labels false and the exporter's own pod/namespace/container as target labels, so
  Prometheus itself renames the series' pod mapping to `exported_*`).
- `Gate` is a TCP proxy that can refuse connections for a while: the webhook "down".
- Alertmanager also routes alerts labelled `tenant="badtoken"` to a receiver with a wrong
  token (the 401 case).
"""

from __future__ import annotations

import contextlib
import socket
import subprocess
import threading
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import yaml

from harness.stack import free_port, release_port
from tests.monitoring.conftest import binary

ROOT = Path(__file__).resolve().parents[2]
RULES = ROOT / "deploy" / "prometheus-rules.yaml"
ALERTMANAGER_EXAMPLE = ROOT / "deploy" / "alertmanager.yaml"
EXPORTER_POD = {
    "pod": "nvidia-dcgm-exporter-x7k2p",
    "namespace": "gpu-operator",
    "container": "nvidia-dcgm-exporter",
}
# Alertmanager: first notification 1 s after an alert, changes every 2 s, repeats every 4 s.
GROUP_WAIT, GROUP_INTERVAL, REPEAT_INTERVAL = "1s", "2s", "4s"
READY_SECONDS = 60.0  # a child on a busy 2-core machine


class FakeDcgmExporter:
    """`/node0` and `/node1` in Prometheus text format; series set and removed by tests.
    POST anywhere answers 200 (the `oncall` receiver of the Alertmanager example)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.series: dict[str, dict[tuple[str, tuple[tuple[str, str], ...]], float]] = {
            "/node0": {},
            "/node1": {},
        }
        exporter = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                body = exporter.render(self.path).encode()
                self.send_response(200)
                self.send_header("Content-Type", "text/plain; version=0.0.4")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def do_POST(self) -> None:
                self.rfile.read(int(self.headers.get("Content-Length") or 0))
                self.send_response(200)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.port = int(self.server.server_address[1])
        self._thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self._thread.start()

    def set(self, path: str, metric: str, labels: dict[str, str], value: float) -> None:
        with self._lock:
            self.series[path][(metric, tuple(sorted(labels.items())))] = value

    def remove(self, path: str, metric: str, labels: dict[str, str]) -> None:
        with self._lock:
            self.series[path].pop((metric, tuple(sorted(labels.items()))), None)

    def render(self, path: str) -> str:
        with self._lock:
            items = sorted(self.series.get(path, {}).items())
        out: list[str] = []
        for (metric, labels), value in items:
            text = ",".join(f'{k}="{v}"' for k, v in labels)
            out.append(f"{metric}{{{text}}} {value:g}")
        return "\n".join(out) + "\n"

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


class Gate:
    """A TCP proxy to `target`; `down()` closes its listener (connections are refused), `up()`
    listens on the same port again."""

    def __init__(self, target: tuple[str, int]) -> None:
        self.target = target
        self.port = free_port()
        release_port(self.port)
        self._listener: socket.socket | None = None
        self._lock = threading.Lock()
        self._open: list[socket.socket] = []
        self.up()

    def up(self) -> None:
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(("127.0.0.1", self.port))
        sock.listen(64)
        self._listener = sock
        threading.Thread(target=self._accept, args=(sock,), daemon=True).start()

    def up_if_down(self) -> None:
        if self._listener is None:
            self.up()

    def down(self) -> None:
        """Stop listening (new connections are refused) and drop the open ones."""
        if self._listener is not None:
            # shutdown() wakes the blocked accept() and stops listening; close() alone would
            # leave the kernel socket listening until accept() returned.
            with contextlib.suppress(OSError):
                self._listener.shutdown(socket.SHUT_RDWR)
            self._listener.close()
            self._listener = None
        with self._lock:
            open_now, self._open = self._open, []
        for conn in open_now:
            with contextlib.suppress(OSError):
                conn.shutdown(socket.SHUT_RDWR)
            conn.close()

    def _accept(self, sock: socket.socket) -> None:
        while True:
            try:
                client, _ = sock.accept()
            except OSError:
                return
            try:
                upstream = socket.create_connection(self.target, timeout=10)
            except OSError:
                client.close()
                continue
            with self._lock:
                self._open += [client, upstream]
            for a, b in ((client, upstream), (upstream, client)):
                threading.Thread(target=self._pump, args=(a, b), daemon=True).start()

    @staticmethod
    def _pump(src: socket.socket, dst: socket.socket) -> None:
        with contextlib.suppress(OSError):
            while data := src.recv(65536):
                dst.sendall(data)
        with contextlib.suppress(OSError):
            dst.shutdown(socket.SHUT_WR)


def _get(url: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(url, timeout=5) as resp:
            return resp.status, resp.read().decode()
    except OSError:
        return 0, ""


@dataclass
class Monitoring:
    dir: Path
    exporter: FakeDcgmExporter
    gate: Gate
    prometheus_url: str
    alertmanager_url: str
    children: list[subprocess.Popen[bytes]] = field(default_factory=list)

    def alertmanager_metric(self, name: str, **labels: str) -> float:
        _status, text = _get(self.alertmanager_url + "/metrics")
        want = [f'{k}="{v}"' for k, v in labels.items()]
        total = 0.0
        for line in text.splitlines():
            if line.startswith(name + "{") and all(w in line for w in want):
                total += float(line.rsplit(" ", 1)[1])
        return total

    def log(self, name: str) -> str:
        return (self.dir / f"{name}.log").read_text(errors="replace")


def _alertmanager_config(
    webhook: str, token_file: Path, bad_token_file: Path, oncall: str
) -> dict[str, Any]:
    """deploy/alertmanager.yaml with the test's URLs, token files and short intervals."""
    config = yaml.safe_load(ALERTMANAGER_EXAMPLE.read_text())
    route = config["route"]
    for r in [route, *route["routes"]]:
        r.update(group_wait=GROUP_WAIT, group_interval=GROUP_INTERVAL)
        r["repeat_interval"] = REPEAT_INTERVAL
    sickbay = next(r for r in config["receivers"] if r["name"] == "sickbay")
    hook = sickbay["webhook_configs"][0]
    hook["url"] = webhook
    hook["http_config"]["authorization"]["credentials_file"] = str(token_file)
    bad = yaml.safe_load(yaml.safe_dump(sickbay))
    bad["name"] = "sickbay-badtoken"
    bad["webhook_configs"][0]["http_config"]["authorization"]["credentials_file"] = str(
        bad_token_file
    )
    config["receivers"].append(bad)
    route["routes"].insert(
        0,
        {
            "receiver": "sickbay-badtoken",
            "matchers": ['tenant="badtoken"'],
            "group_wait": GROUP_WAIT,
            "group_interval": GROUP_INTERVAL,
            "repeat_interval": REPEAT_INTERVAL,
        },
    )
    for r in config["receivers"]:
        if r["name"] == "oncall":
            r["webhook_configs"][0]["url"] = oncall
    return config


@contextlib.contextmanager
def monitoring(directory: Path, webhook_url: str, token_file: Path) -> Iterator[Monitoring]:
    """Exporter, gate, Prometheus and Alertmanager, all on loopback; stopped on exit."""
    prometheus = binary("prometheus")
    alertmanager = binary("prometheus-alertmanager", "alertmanager")
    directory.mkdir(parents=True, exist_ok=True)
    exporter = FakeDcgmExporter()
    host, _, rest = webhook_url.removeprefix("http://").partition(":")
    webhook_port = int(rest.split("/", 1)[0])
    gate = Gate((host, webhook_port))
    bad_token = directory / "bad-token"
    bad_token.write_text("not-the-token\n")
    am_port, am_cluster, prom_port = free_port(), free_port(), free_port()
    am_config = directory / "alertmanager.yml"
    am_config.write_text(
        yaml.safe_dump(
            _alertmanager_config(
                f"http://127.0.0.1:{gate.port}/v1/alertmanager",
                token_file,
                bad_token,
                f"http://127.0.0.1:{exporter.port}/oncall",
            )
        )
    )
    prom_config = directory / "prometheus.yml"
    prom_config.write_text(
        yaml.safe_dump(
            {
                "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
                "rule_files": [str(RULES)],
                "alerting": {
                    "alertmanagers": [{"static_configs": [{"targets": [f"127.0.0.1:{am_port}"]}]}]
                },
                "scrape_configs": [
                    {
                        "job_name": "dcgm-exporter-4x",
                        "honor_labels": True,
                        "metrics_path": "/node0",
                        "static_configs": [{"targets": [f"127.0.0.1:{exporter.port}"]}],
                    },
                    {
                        "job_name": "dcgm-exporter-operator",
                        "honor_labels": False,
                        "metrics_path": "/node1",
                        "static_configs": [
                            {"targets": [f"127.0.0.1:{exporter.port}"], "labels": EXPORTER_POD}
                        ],
                    },
                ],
            }
        )
    )
    mon = Monitoring(
        dir=directory,
        exporter=exporter,
        gate=gate,
        prometheus_url=f"http://127.0.0.1:{prom_port}",
        alertmanager_url=f"http://127.0.0.1:{am_port}",
    )

    def spawn(name: str, argv: list[str]) -> None:
        with open(directory / f"{name}.log", "ab") as out:
            mon.children.append(
                subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, cwd=directory)
            )

    try:
        for port in (am_port, am_cluster, prom_port):
            release_port(port)
        spawn(
            "alertmanager",
            [
                alertmanager,
                f"--config.file={am_config}",
                f"--storage.path={directory / 'am-data'}",
                f"--web.listen-address=127.0.0.1:{am_port}",
                "--cluster.listen-address=",  # one instance, no gossip
                "--log.level=debug",
            ],
        )
        spawn(
            "prometheus",
            [
                prometheus,
                f"--config.file={prom_config}",
                f"--storage.tsdb.path={directory / 'prom-data'}",
                f"--web.listen-address=127.0.0.1:{prom_port}",
                # Firing alerts go to Alertmanager every second, not every minute.
                "--rules.alert.resend-delay=1s",
            ],
        )
        deadline = time.monotonic() + READY_SECONDS
        for url in (mon.alertmanager_url + "/-/ready", mon.prometheus_url + "/-/ready"):
            while _get(url)[0] != 200:
                for child in mon.children:
                    if child.poll() is not None:
                        raise RuntimeError(
                            f"{child.args[0]} exited ({child.returncode}): "
                            + mon.log(Path(str(child.args[0])).name.split("-")[-1])[-2000:]
                        )
                if time.monotonic() > deadline:
                    raise RuntimeError(f"{url} not ready within {READY_SECONDS:.0f} s")
                time.sleep(0.2)
        yield mon
    finally:
        for child in mon.children:
            child.terminate()
        for child in mon.children:
            try:
                child.wait(timeout=10)
            except subprocess.TimeoutExpired:
                child.kill()
                child.wait()
        gate.down()
        exporter.close()
