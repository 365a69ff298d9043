"""Helpers shared by the benchmarks: machine facts, percentiles, alerts, the twin's request log.

Everything here talks to loopback only (the embedded stack of harness/stack.py).
"""

from __future__ import annotations

import asyncio
import os
import platform
import re
import subprocess
import sys
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx
import yaml

from contract.runbook import SAFE_BOUNDS

ROOT = Path(__file__).resolve().parent.parent
OUT = ROOT / "bench" / "out"  # raw JSON results (gitignored)
PLOTS = ROOT / "docs" / "bench"  # committed PNGs referenced from BENCHMARKS.md
RULES = "devicetaintrules"


def percentile(values: list[float], q: float) -> float:
    """Nearest-rank percentile (q in 0..1) of a non-empty list."""
    ordered = sorted(values)
    idx = min(len(ordered) - 1, max(0, round(q * (len(ordered) - 1))))
    return ordered[idx]


def summary(values: list[float]) -> dict[str, float]:
    if not values:
        return {"n": 0}
    return {
        "n": len(values),
        "p50": percentile(values, 0.50),
        "p90": percentile(values, 0.90),
        "p99": percentile(values, 0.99),
        "max": max(values),
        "min": min(values),
    }


def machine_facts() -> dict[str, Any]:
    """CPU model, cores, RAM, OS, Python and Temporal versions, and the date."""
    cpu = platform.processor() or "unknown"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    ram_gib = 0.0
    try:
        m = re.search(r"MemTotal:\s+(\d+) kB", Path("/proc/meminfo").read_text())
        ram_gib = int(m.group(1)) / 1024 / 1024 if m else 0.0
    except OSError:
        pass
    from importlib.metadata import PackageNotFoundError, version

    def ver(pkg: str) -> str:
        try:
            return version(pkg)
        except PackageNotFoundError:
            return "not installed"

    temporal_cli = "unknown"
    binary = Path(sys.executable).parent / "temporal"
    try:
        temporal_cli = subprocess.run(
            [str(binary), "--version"], capture_output=True, text=True, timeout=20, check=False
        ).stdout.strip()
    except (OSError, subprocess.TimeoutExpired):
        pass
    return {
        "date": datetime.now(UTC).isoformat(timespec="seconds"),
        "cpu": cpu,
        "cores": os.cpu_count(),
        "ram_gib": round(ram_gib, 1),
        "os": f"{platform.system()} {platform.release()}",
        "python": platform.python_version(),
        "temporalio": ver("temporalio"),
        "temporal_cli": temporal_cli,
        "kubernetes_client": ver("kubernetes"),
    }


# Alertmanager keeps an alert's startsAt for as long as it fires; a re-fire gets a new one.
# Repeats of one fingerprint therefore carry the startsAt of its first notification.
_STARTS_AT: dict[str, str] = {}


def dcgm_alert(
    node: str,
    uuid: str,
    index: int = 0,
    xid: int = 79,
    fingerprint: str | None = None,
    mig_instance: int | None = None,
) -> dict[str, Any]:
    """One firing Alertmanager alert as deploy/prometheus-rules.yaml produces it from
    dcgm-exporter series. A MIG slice's series carries the parent GPU's UUID plus GPU_I_ID
    (dcgm-exporter's labelling), so MIG siblings name the same physical GPU."""
    labels = {
        "alertname": "SickbayGpuXidError",
        "Hostname": node,
        "UUID": uuid,
        "gpu": str(index),
        "modelName": "NVIDIA H100 80GB HBM3",
        "err_code": str(xid),
        "severity": "critical",
    }
    if mig_instance is not None:
        labels["GPU_I_ID"] = str(mig_instance)
        labels["GPU_I_PROFILE"] = "3g.40gb"
    fingerprint = fingerprint or f"{node}-{uuid}-{mig_instance or 0}"
    starts_at = _STARTS_AT.setdefault(
        fingerprint, datetime.now(UTC).isoformat().replace("+00:00", "Z")
    )
    return {
        "status": "firing",
        "labels": labels,
        "annotations": {"summary": f"Xid {xid} on {node}", "value": str(xid)},
        "startsAt": starts_at,
        "endsAt": "0001-01-01T00:00:00Z",
        "fingerprint": fingerprint,
    }


def notification(alerts: list[dict[str, Any]]) -> dict[str, Any]:
    return {
        "version": "4",
        "status": "firing",
        "receiver": "sickbay",
        "groupKey": '{}:{alertname="SickbayGpuXidError"}',
        "alerts": alerts,
    }


def requests_log(kube_url: str, **filters: str) -> list[dict[str, Any]]:
    """The twin's API request log (GET /twin/requests), optionally filtered."""
    resp = httpx.get(f"{kube_url}/twin/requests", params=filters, timeout=60.0)
    resp.raise_for_status()
    return list(resp.json()["items"])


def clear_requests(kube_url: str) -> None:
    httpx.delete(f"{kube_url}/twin/requests", timeout=30.0).raise_for_status()


def rule_creations(kube_url: str) -> list[dict[str, Any]]:
    """Successful DeviceTaintRule creates in the twin's request log, in answer order.

    A create's path names no object: `created` names the object it made."""
    recs = [r for r in requests_log(kube_url, verb="create", resource=RULES) if r["status"] < 300]
    return sorted(recs, key=lambda r: r["time"])


def gpus(kube_url: str) -> list[dict[str, Any]]:
    resp = httpx.get(f"{kube_url}/twin/gpus", timeout=60.0)
    resp.raise_for_status()
    return list(resp.json()["items"])


def set_budget(runbooks_dir: str | Path, per_pool: str, per_cluster: str) -> None:
    """Rewrite every generated runbook's blast-radius budget (the worker's load-runbooks
    activity reloads a changed file). The benchmarks say when they do this."""
    for path in sorted(Path(runbooks_dir).glob("*.yaml")):
        doc = yaml.safe_load(path.read_text())
        spec = doc.setdefault("spec", {})
        spec["budget"] = {"maxPerPool": per_pool, "maxPerCluster": per_cluster}
        # Budgets past the safe bounds (100% for the hot path) must be acknowledged, or the
        # worker keeps its last good runbooks: say so, as an operator would have to.
        spec["budget"]["unsafe"] = [
            k for k in ("maxPerPool", "maxPerCluster") if f"budget.{k}" in SAFE_BOUNDS
        ]
        path.write_text(
            f"# Generated by the benchmark from {path.name}: budget {per_pool}/{per_cluster} "
            "(acknowledged as unsafe).\n" + yaml.safe_dump(doc, sort_keys=False)
        )


def rss_mb(pid: int) -> float:
    """Resident set size of one process, MiB (from /proc)."""
    text = Path(f"/proc/{pid}/status").read_text()
    m = re.search(r"VmRSS:\s+(\d+) kB", text)
    return int(m.group(1)) / 1024 if m else 0.0


async def until(what: str, probe: Any, within: float, every: float = 0.25) -> Any:
    """Await `probe()` until truthy; TimeoutError naming `what` after `within` seconds."""
    deadline = time.monotonic() + within
    while True:
        value = await probe()
        if value:
            return value
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out after {within:.0f} s waiting for {what}")
        await asyncio.sleep(every)


WORKER_LOG_SIGNS = {
    "budget update refused (in-flight update limit)": "limit on number of concurrent in-flight updates",
    "workflow task over 5 s": "Workflow task duration exceeded",
    "workflow task lost (timed out)": "Workflow task not found",
    "local activity timed out": "Local Activity timed out",
}


def worker_log_signs(stack_dir: str | Path) -> dict[str, int]:
    """How often the worker logged each known sign of overload (worker.log of the stack)."""
    try:
        text = (Path(stack_dir) / "logs" / "worker.log").read_text(errors="replace")
    except OSError:
        return {}
    return {label: text.count(needle) for label, needle in WORKER_LOG_SIGNS.items()}
