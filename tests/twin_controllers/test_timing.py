"""Exact controller timing on a ManualClock (in-process store, no HTTP, no waiting).

Cases:
- Pending -> Running exactly `pod_startup_seconds` after binding;
- a NoExecute rule: PodsPendingEviction at once, unchanged 9 s later, Completed at +10 s with
  lastTransitionTime = creation + 10 s (golden 41); the evicted pod lingers for its 30 s grace
  period with its claim allocated, then the pod and its generated claim are gone;
- CrashLoopBackOff: restarts follow the kubelet's 10 s, 20 s, 40 s ... backoff;
- `sickbay-dev twin up` wiring: the CLI's extension hooks give the twin a scaled clock, the
  controller manager (before start, so node pools are reachable) and the known-fault flags.
"""

from __future__ import annotations

import argparse
from datetime import timedelta
from typing import Any

from twin.clock import ManualClock, parse_time
from twin.controllers.manager import ControllerManager, TwinOptions
from twin.runtime import Twin

NS = "demo"
NODE = "gpu-pool-node-0"
CLAIMS = "resourceclaims.resource.k8s.io"
RULES = "devicetaintrules.resource.k8s.io"


def _twin() -> tuple[Twin, ControllerManager, ManualClock]:
    clock = ManualClock()
    twin = Twin(profile="1.36", clock=clock)
    twin.seed(nodes=1, gpus_per_node=2)
    manager = ControllerManager(TwinOptions())
    manager.attach(twin)
    store = twin.store
    store.create("namespaces", {"metadata": {"name": NS}})
    store.create(
        "resourceclaimtemplates.resource.k8s.io",
        {
            "metadata": {"name": "gpu", "namespace": NS},
            "spec": {
                "spec": {
                    "devices": {
                        "requests": [
                            {"name": "gpu", "exactly": {"deviceClassName": "gpu.nvidia.com"}}
                        ]
                    }
                }
            },
        },
    )
    store.create(
        "deployments.apps",
        {
            "metadata": {"name": "app", "namespace": NS},
            "spec": {
                "replicas": 1,
                "selector": {"matchLabels": {"app": "a"}},
                "template": {
                    "metadata": {"labels": {"app": "a"}},
                    "spec": {
                        "containers": [
                            {
                                "name": "main",
                                "image": "x",
                                "resources": {"claims": [{"name": "gpu"}]},
                            }
                        ],
                        "resourceClaims": [{"name": "gpu", "resourceClaimTemplateName": "gpu"}],
                    },
                },
            },
        },
    )
    manager.settle()
    return twin, manager, clock


def _step(manager: ControllerManager, clock: ManualClock, seconds: float) -> None:
    clock.advance(seconds)
    manager.settle()


def _pods(twin: Twin) -> list[dict[str, Any]]:
    return twin.store.list("pods", namespace=NS).items


def test_startup_delay() -> None:
    twin, manager, clock = _twin()
    (pod,) = _pods(twin)
    assert pod["spec"]["nodeName"] == NODE and pod["status"]["phase"] == "Pending"
    _step(manager, clock, 1.9)
    assert _pods(twin)[0]["status"]["phase"] == "Pending"
    _step(manager, clock, 0.1)
    assert _pods(twin)[0]["status"]["phase"] == "Running"


def test_rule_status_cadence_and_grace_period() -> None:
    twin, manager, clock = _twin()
    _step(manager, clock, 2)
    (pod,) = _pods(twin)
    claim_name = pod["status"]["resourceClaimStatuses"][0]["resourceClaimName"]
    created = twin.store.create(
        RULES,
        {
            "metadata": {"name": "r"},
            "spec": {
                "deviceSelector": {"driver": "gpu.nvidia.com", "pool": NODE, "device": "gpu-0"},
                "taint": {"key": "k", "effect": "NoExecute"},
            },
        },
    )
    t0 = parse_time(created["metadata"]["creationTimestamp"])
    manager.settle()
    cond = twin.store.get(RULES, "r")["status"]["conditions"][0]
    assert (cond["reason"], cond["message"]) == (
        "PodsPendingEviction",
        "1 pod needs to be evicted in 1 namespace.",
    )
    old = twin.store.get("pods", pod["metadata"]["name"], NS)
    assert parse_time(old["metadata"]["deletionTimestamp"]) == t0 + timedelta(seconds=30)
    _step(manager, clock, 9)
    assert twin.store.get(RULES, "r")["status"]["conditions"][0]["reason"] == "PodsPendingEviction"
    _step(manager, clock, 1)
    cond = twin.store.get(RULES, "r")["status"]["conditions"][0]
    assert (cond["status"], cond["reason"]) == ("False", "Completed")
    assert parse_time(cond["lastTransitionTime"]) == t0 + timedelta(seconds=10)
    # Still Terminating and holding gpu-0 until the grace period ends.
    _step(manager, clock, 19)
    assert twin.store.try_get("pods", pod["metadata"]["name"], NS) is not None
    held = twin.store.get(CLAIMS, claim_name, NS)
    assert held["status"]["allocation"]["devices"]["results"][0]["device"] == "gpu-0"
    _step(manager, clock, 1)
    assert twin.store.try_get("pods", pod["metadata"]["name"], NS) is None
    assert twin.store.try_get(CLAIMS, claim_name, NS) is None
    (replacement,) = _pods(twin)
    assert replacement["status"]["phase"] == "Running"


def test_crash_loop_backoff_sequence() -> None:
    twin, manager, clock = _twin()
    _step(manager, clock, 2)
    manager.faults.fail(NODE, "0", xid=79)
    restarts = []
    for _ in range(100):
        _step(manager, clock, 1)
        cs = _pods(twin)[0]["status"]["containerStatuses"][0]
        if not restarts or restarts[-1][1] != cs["restartCount"]:
            restarts.append((manager.clock.monotonic(), cs["restartCount"]))
    # Started at 2 s; crash 3 s after each start, then wait 10, 20, 40 s before the next start.
    assert [c for _t, c in restarts] == [0, 1, 2, 3]
    assert [t for t, _c in restarts[1:]] == [2 + 13, 2 + 13 + 23, 2 + 13 + 23 + 43], restarts
    waiting = _pods(twin)[0]["status"]["containerStatuses"][0]["state"]["waiting"]
    assert waiting["reason"] == "CrashLoopBackOff"


def test_twin_up_wiring() -> None:
    from twin import cli

    parser = argparse.ArgumentParser()
    cli.register(parser.add_subparsers())
    args = parser.parse_args(
        [
            "twin",
            "up",
            "--nodes",
            "1",
            "--time-scale",
            "60",
            "--ignore-device-taint-rules",
            "--alert-webhook",
            "http://127.0.0.1:9/alerts",
            "--alert-group-wait",
            "5",
        ]
    )
    twin = cli.build_twin(args)
    manager = twin.extensions["controllers"]
    assert isinstance(manager, ControllerManager)
    assert twin.clock.time_scale == 60
    assert manager.options.ignore_device_taint_rules is True
    assert manager.alerts.config.url == "http://127.0.0.1:9/alerts"
    assert manager.alerts.config.group_wait == 5
    assert twin.extensions["node_pools"].status("gpu-pool").nodes == ["gpu-pool-node-0"]
