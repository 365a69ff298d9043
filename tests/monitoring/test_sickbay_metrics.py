"""Sickbay's own metrics, the dashboard and the self-health alerts, checked against each other.

Cases:
- every metric the code creates (workflows, activities and worker through the Temporal
  runtime, the webhook through prometheus_client) follows the Prometheus conventions: counters
  end in `_total` once exported, duration histograms in `_seconds`;
- the shipped Grafana dashboard (deploy/monitoring/grafana-dashboard.json): every query is valid
  PromQL (`promtool check rules` on each one as a recording rule) and names only metrics the
  code exports (Sickbay's from the code, the Temporal SDK's from a real worker's scrape);
- deploy/monitoring/sickbay-health-rules.yaml: `promtool check rules`, `promtool test rules`
  (tests/monitoring/health_rules.test.yaml) with every rule made to fire, and the same
  "exported metrics only" check;
- `sickbay_remediations_open{phase}` counts open remediations of one cluster by phase from
  Temporal's visibility (dev server), and the reporter exports it on a Prometheus endpoint.
"""

from __future__ import annotations

import ast
import asyncio
import json
import re
import subprocess
import urllib.request
import uuid
from pathlib import Path

import yaml
from prometheus_client import CollectorRegistry
from temporalio.client import Client
from temporalio.common import SearchAttributeKey, SearchAttributePair, TypedSearchAttributes
from temporalio.runtime import PrometheusConfig, Runtime, TelemetryConfig
from temporalio.testing import WorkflowEnvironment

import worker.main as worker_main
from contract.names import SA_CLUSTER, SA_PHASE, WF_REMEDIATE
from harness.stack import free_port
from tests.monitoring.conftest import binary
from tests.pysource import parse
from tests.workflows.conftest import _search_attributes  # noqa: F401  (autouse: the time-skipping server knows them)
from tests.workflows.fakes import FakeWorld, new_worker, start
from worker.converter import DATA_CONVERTER
from worker.gauges import count_open, report_open_remediations
from worker.webhook.metrics import WebhookMetrics

ROOT = Path(__file__).resolve().parents[2]
DASHBOARD = ROOT / "deploy" / "monitoring" / "grafana-dashboard.json"
HEALTH_RULES = ROOT / "deploy" / "monitoring" / "sickbay-health-rules.yaml"
HEALTH_TESTS = Path(__file__).with_name("health_rules.test.yaml")
CREATORS = {"create_counter": "counter", "create_gauge": "gauge"}
HISTOGRAMS = ("create_histogram", "create_histogram_timedelta", "create_histogram_float")


def _code_metrics() -> dict[str, str]:
    """Every metric the product's code creates through a Temporal meter: name -> kind."""
    found: dict[str, str] = {}
    for folder in ("workflows", "activities", "worker"):
        for path in (ROOT / folder).rglob("*.py"):
            for node in ast.walk(parse(path.read_text(), str(path))):
                if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)):
                    continue
                kind = CREATORS.get(node.func.attr) or (
                    "histogram" if node.func.attr in HISTOGRAMS else None
                )
                if kind and node.args and isinstance(node.args[0], ast.Constant):
                    found[str(node.args[0].value)] = kind
    return found


def _exported_sickbay_names() -> set[str]:
    """The names Prometheus sees for Sickbay's metrics (suffixes as exported)."""
    names: set[str] = set()
    for name, kind in _code_metrics().items():
        if kind == "counter":
            names.add(f"{name}_total")
        elif kind == "histogram":
            names |= {f"{name}_bucket", f"{name}_sum", f"{name}_count"}
        else:
            names.add(name)
    registry = WebhookMetrics().registry
    assert isinstance(registry, CollectorRegistry)
    for family in registry.collect():
        names |= {sample.name for sample in family.samples} | {family.name}
        if family.type == "counter":
            names.add(f"{family.name}_total")
        if family.type == "histogram":
            names |= {f"{family.name}_{s}" for s in ("bucket", "sum", "count")}
    return names


def test_sickbay_metrics_follow_the_conventions() -> None:
    for name, kind in _code_metrics().items():
        assert name.startswith("sickbay_"), name
        assert not name.endswith("_total"), f"{name}: the runtime adds _total to counters"
        if kind == "histogram":
            assert name.endswith("_seconds"), f"{name}: a duration histogram is in seconds"
            assert name in worker_main.DURATION_HISTOGRAMS, f"{name}: no seconds-to-hours buckets"
    for family in WebhookMetrics().registry.collect():
        if family.type == "histogram":
            assert family.name.endswith(("_seconds", "_alerts")), family.name


async def _temporal_names(env: WorkflowEnvironment) -> set[str]:
    """The Temporal SDK's metric names, from a real worker's scrape after a remediation."""
    port = free_port()
    runtime = worker_main.metrics_runtime(port)
    assert runtime is not None
    client = await Client.connect(
        env.client.service_client.config.target_host,
        data_converter=DATA_CONVERTER,
        runtime=runtime,
    )
    world = FakeWorld(health="Healthy")
    async with new_worker(client, world) as worker:
        from tests.workflows.fakes import xid_alert

        handle = await start(client, worker, world, alerts=[xid_alert(13, "fp-13")])
        await handle.result()
    text = await asyncio.to_thread(
        lambda: urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read()
    )
    return {
        line.split("{")[0].split(" ")[0]
        for line in text.decode().splitlines()
        if line.startswith("temporal_")
    }


METRIC = re.compile(r"\b((?:sickbay|temporal)_[a-z0-9_]+)")


def _queries() -> list[str]:
    dash = json.loads(DASHBOARD.read_text())
    return [t["expr"] for p in dash["panels"] for t in p["targets"]]


def _promtool_check(exprs: list[str], tmp_path: Path) -> None:
    rules = {
        "groups": [
            {
                "name": "dashboard",
                "rules": [{"record": f"dashboard:q{i}", "expr": e} for i, e in enumerate(exprs)],
            }
        ]
    }
    path = tmp_path / "queries.yaml"
    path.write_text(yaml.safe_dump(rules))
    checked = subprocess.run(
        [binary("promtool"), "check", "rules", str(path)], capture_output=True, text=True
    )
    assert checked.returncode == 0, checked.stdout + checked.stderr


async def test_dashboard_and_alerts_name_only_exported_metrics(
    time_skipping_env: WorkflowEnvironment, tmp_path: Path
) -> None:
    exprs = _queries()
    assert len(exprs) >= 10
    _promtool_check(exprs, tmp_path)
    exported = _exported_sickbay_names() | await _temporal_names(time_skipping_env)
    rules = yaml.safe_load(HEALTH_RULES.read_text())
    rule_exprs = [r["expr"] for g in rules["groups"] for r in g["rules"]]
    for expr in exprs + rule_exprs:
        for name in METRIC.findall(expr):
            assert name in exported, f"{name} (in {expr!r}) is not exported"


def test_promtool_tests_the_health_rules() -> None:
    promtool = binary("promtool")
    checked = subprocess.run(
        [promtool, "check", "rules", str(HEALTH_RULES)], capture_output=True, text=True
    )
    assert checked.returncode == 0, checked.stdout + checked.stderr
    tested = subprocess.run(
        [promtool, "test", "rules", str(HEALTH_TESTS)], capture_output=True, text=True
    )
    assert tested.returncode == 0, tested.stdout + tested.stderr
    fired = {
        case["alertname"]
        for test in yaml.safe_load(HEALTH_TESTS.read_text())["tests"]
        for case in test.get("alert_rule_test", [])
        if case.get("exp_alerts")
    }
    rules = yaml.safe_load(HEALTH_RULES.read_text())
    assert {r["alert"] for g in rules["groups"] for r in g["rules"]} <= fired


async def test_open_remediations_by_phase(dev_env: WorkflowEnvironment) -> None:
    client = dev_env.client
    cluster = f"c{uuid.uuid4().hex[:8]}"
    started = []
    for phase, n in (("holding", 2), ("evicting", 1)):
        for _ in range(n):
            wf_id = f"sickbay-{cluster}-gpu-{uuid.uuid4().hex[:8]}"
            await client.start_workflow(
                WF_REMEDIATE,
                id=wf_id,
                task_queue=f"nobody-{cluster}",  # no worker: they stay Running
                search_attributes=TypedSearchAttributes(
                    [
                        SearchAttributePair(SearchAttributeKey.for_keyword(SA_PHASE), phase),
                        SearchAttributePair(SearchAttributeKey.for_keyword(SA_CLUSTER), cluster),
                    ]
                ),
            )
            started.append(wf_id)
    try:
        counts: dict[str, int] = {}
        for _ in range(100):  # visibility is eventually consistent
            counts = await count_open(client, cluster)
            if counts["holding"] == 2 and counts["evicting"] == 1:
                break
            await asyncio.sleep(0.1)
        assert counts["holding"] == 2 and counts["evicting"] == 1 and counts["confirming"] == 0
        port = free_port()
        runtime = Runtime(  # kept referenced: its exporter lives as long as it does
            telemetry=TelemetryConfig(metrics=PrometheusConfig(bind_address=f"127.0.0.1:{port}"))
        )
        meter = runtime.metric_meter
        stop = asyncio.Event()
        task = asyncio.create_task(report_open_remediations(client, cluster, stop, meter=meter))
        text = ""
        for _ in range(100):
            try:
                text = await asyncio.to_thread(
                    lambda: (
                        urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics").read().decode()
                    )
                )
            except OSError:  # the exporter not listening yet
                text = ""
            if 'phase="holding"' in text:
                break
            await asyncio.sleep(0.1)
        stop.set()
        await task
        line = next(
            x
            for x in text.splitlines()
            if x.startswith("sickbay_remediations_open{") and 'phase="holding"' in x
        )
        assert float(line.rsplit(" ", 1)[1]) == 2
    finally:
        for wf_id in started:
            await client.get_workflow_handle(wf_id).terminate("test done")
