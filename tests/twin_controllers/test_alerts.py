"""Alertmanager stand-in: payloads, cadence, and delivery to a loopback receiver.

Cases:
- payload builder: version 4, groupKey `{}:{alertname="...", Hostname="..."}`, group/common
  labels, firing alerts with endsAt 0001-01-01, fingerprints stable per label set; the
  payload validates against Sickbay's own webhook model and maps to the GPU's workflow id;
- cadence on a ManualClock: nothing before group_wait; sent once; not again until
  repeat_interval; a resolved alert goes out once more (status resolved, endsAt set) at the
  next group_interval tick and is then dropped; a failed post is retried;
- end to end: a GPU fault on a node whose pod uses it posts a grouped v4 payload with the
  DCGM labels (Hostname, gpu, UUID, modelName, pci_bus_id, err_code) and the consumer's pod,
  namespace and container to the receiver with the bearer token; it repeats; recovery sends
  `resolved`; a receiver answering 500 gets the notification again later;
- the receiver can be set at run time (PUT /twin/alerts): alerts raised before that are
  delivered then; the token is never echoed.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

from contract.names import device_workflow_id
from tests.twin_controllers.conftest import Receiver, eventually
from tests.twin_controllers.helpers import claim_template, deployment, pods
from twin.alerts import AlertConfig, AlertmanagerTwin, fingerprint
from twin.clock import ManualClock
from twin.controllers.manager import TwinOptions
from worker.alerts import AlertMapping, AmPayload, MappedAlert, map_alert

NODE = "gpu-pool-node-0"
LABELS = {
    "alertname": "SickbayGpuFellOffBus",
    "Hostname": "node-1",
    "gpu": "0",
    "UUID": "GPU-1234",
    "err_code": "79",
}


def test_payload_shape_and_interop() -> None:
    clock = ManualClock()
    am = AlertmanagerTwin(clock, AlertConfig(url=None, group_wait=0))
    am.fire({**LABELS, "gpu": "1", "UUID": "GPU-5678"}, {"value": "79"})
    am.fire(LABELS, {"value": "79"})
    ((_key, payload),) = am.due()
    assert payload["version"] == "4" and payload["status"] == "firing"
    assert payload["groupKey"] == '{}:{Hostname="node-1", alertname="SickbayGpuFellOffBus"}'
    assert payload["commonLabels"] == {
        "alertname": "SickbayGpuFellOffBus",
        "Hostname": "node-1",
        "err_code": "79",
    }
    assert [a["labels"]["gpu"] for a in payload["alerts"]] == ["0", "1"]
    assert payload["alerts"][0]["endsAt"] == "0001-01-01T00:00:00Z"
    assert payload["alerts"][0]["fingerprint"] == fingerprint(LABELS)
    assert fingerprint(LABELS) != fingerprint({**LABELS, "gpu": "1"})
    parsed = AmPayload.model_validate(payload)
    mapped = map_alert(0, parsed.alerts[0], AlertMapping())
    assert isinstance(mapped, MappedAlert)
    assert mapped.workflow_id == device_workflow_id("node-1", "GPU-1234")


def test_cadence_repeat_and_resolve() -> None:
    clock = ManualClock()
    config = AlertConfig(url=None, group_wait=30, group_interval=300, repeat_interval=3600)
    am = AlertmanagerTwin(clock, config)
    fp = am.fire(LABELS, {})
    assert am.due() == []  # group_wait not over
    clock.advance(30)
    (due,) = am.due()
    am.mark_sent(*due)
    clock.advance(300)
    assert am.due() == []  # unchanged: no repeat before repeat_interval
    clock.advance(3300)
    (again,) = am.due()
    assert again[1]["alerts"][0]["status"] == "firing"
    am.mark_sent(*again)
    assert am.fire(LABELS, {}) == fp  # still firing: the same alert, no change
    am.resolve([fp])
    assert am.due() == []  # waits for the next group_interval tick
    clock.advance(300)
    (resolved,) = am.due()
    assert resolved[1]["status"] == "resolved"
    assert resolved[1]["alerts"][0]["endsAt"] != "0001-01-01T00:00:00Z"
    am.mark_sent(*resolved)
    assert am.active() == [] and am.due() == []


def test_failed_post_is_retried(receiver: Receiver) -> None:
    clock = ManualClock()
    am = AlertmanagerTwin(clock, AlertConfig(url=receiver.url, group_wait=0))
    am.fire(LABELS, {})
    receiver.status = 500
    assert asyncio.run(am.flush()) == 0 and am.failures == 1
    receiver.status = 200
    clock.advance(10)
    assert asyncio.run(am.flush()) == 1
    assert len(receiver.posts) == 2 and receiver.posts[1][2]["status"] == "firing"


def test_fault_alerts_reach_receiver_and_resolve(twin: Any, receiver: Receiver) -> None:
    options = TwinOptions(
        alert_webhook=receiver.url,
        alert_token="s3cret-token",
        alert_group_wait=5,
        alert_group_interval=20,
        alert_repeat_interval=60,
    )
    t = twin(options)
    ns = t.namespace("training")
    t.dra.create_namespaced_resource_claim_template(ns, claim_template("gpu"))
    t.apps.create_namespaced_deployment(ns, deployment("trainer", "gpu"))
    pod = eventually(lambda: pods(t.core, ns)[0].status.phase == "Running" and pods(t.core, ns)[0])
    gpu = t.twin("GET", f"/twin/gpus?node={NODE}").json()["items"][0]
    assert t.twin("POST", "/twin/faults", {"node": NODE, "gpu": "0", "xid": 79}).status_code == 201

    def firing() -> Any:
        assert receiver.posts
        return receiver.posts[0]

    path, headers, payload = eventually(firing)
    assert path == "/alerts"
    assert headers["Authorization"] == "Bearer s3cret-token"
    assert payload["version"] == "4" and payload["status"] == "firing"
    assert payload["groupLabels"] == {"alertname": "SickbayGpuFellOffBus", "Hostname": NODE}
    (alert,) = payload["alerts"]
    labels = alert["labels"]
    assert {k: labels[k] for k in ("Hostname", "gpu", "UUID", "err_code")} == {
        "Hostname": NODE,
        "gpu": "0",
        "UUID": gpu["uuid"],
        "err_code": "79",
    }
    assert labels["modelName"] == "NVIDIA H100 80GB HBM3"
    assert labels["pci_bus_id"] == gpu["pciBusID"]
    assert (labels["namespace"], labels["pod"], labels["container"]) == (
        ns,
        pod.metadata.name,
        "main",
    )
    assert alert["annotations"]["value"] == "79"
    AmPayload.model_validate(payload)

    eventually(lambda: len(receiver.posts) >= 2)  # repeat_interval: sent again, unchanged
    assert receiver.posts[1][2]["alerts"][0]["fingerprint"] == alert["fingerprint"]
    assert "s3cret-token" not in str(t.twin("GET", "/twin/alerts").json())

    assert t.twin("POST", "/twin/faults/recover", {"node": NODE}).status_code == 200

    def resolved() -> Any:
        last = receiver.posts[-1][2]
        assert last["status"] == "resolved", last["status"]
        return last

    last = eventually(resolved)
    assert last["alerts"][0]["fingerprint"] == alert["fingerprint"]
    assert last["alerts"][0]["endsAt"] != "0001-01-01T00:00:00Z"
    count = len(receiver.posts)
    eventually(lambda: t.twin("GET", "/twin/alerts").json()["active"] == [])
    time.sleep(0.5)  # 100 simulated seconds: a resolved group is not sent again
    assert len(receiver.posts) == count


def test_receiver_configured_at_run_time(twin: Any, receiver: Receiver) -> None:
    t = twin()
    assert t.twin("POST", "/twin/faults", {"node": NODE, "gpu": "1", "xid": 95}).status_code == 201
    time.sleep(0.3)  # 60 simulated seconds: past group_wait, with nowhere to send yet
    configured = t.twin(
        "PUT", "/twin/alerts", {"url": receiver.url, "token": "tok-123", "groupWait": 1}
    )
    assert configured.status_code == 200 and configured.json()["receiver"] == receiver.url
    assert "tok-123" not in configured.text
    (alert,) = configured.json()["active"]
    assert alert["labels"]["alertname"] == "SickbayGpuEccDoubleBitError"
    assert "pod" not in alert["labels"]  # nothing used that GPU
    path, headers, payload = eventually(lambda: receiver.posts and receiver.posts[0])
    assert headers["Authorization"] == "Bearer tok-123"
    assert payload["alerts"][0]["labels"]["gpu"] == "1"
    bad = t.twin("PUT", "/twin/alerts", {"webhook": "x"})
    assert bad.status_code == 400
