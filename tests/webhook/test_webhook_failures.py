"""The webhook when things go wrong, over real HTTP.

Cases:
- Temporal unreachable from the start: 503 listing every alert as temporal-unavailable,
  /healthz says disconnected, metrics count it; a notification with only unmatched alerts
  still gets 200 (nothing to hand to Temporal)
- Temporal goes away while the webhook runs (a second dev server is stopped): 503 within the
  configured Temporal timeout, not a hang
- hypothesis: random bytes, random JSON and valid payloads with one field broken always get
  400/413/422 (never 5xx), and nothing is started or signalled
- hypothesis: well-formed alerts with arbitrary label values never get a 5xx
- a webhook without a token configured refuses to start unless auth is disabled explicitly
- overload (more alerts than Temporal answers in time): 503, every alert accepted or listed
  as failed, and the retry completes the rest with one workflow per GPU
"""

from __future__ import annotations

import copy
import json
import socket
import string
import uuid
from typing import Any

import httpx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from temporalio.testing import WorkflowEnvironment

from contract.names import device_workflow_id
from tests.conftest import start_dev_server
from tests.webhook.helpers import (
    TOKEN,
    Served,
    auth,
    count_runs,
    payload,
    serve,
    settings_for,
    unique_device,
    xid_alert,
)
from worker.settings import Settings, WebhookSettings
from worker.webhook.app import create_app


def _closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


async def test_temporal_unreachable_503() -> None:
    settings = Settings(temporal_address=f"127.0.0.1:{_closed_port()}", task_queue="nowhere")
    app = create_app(settings, webhook=WebhookSettings(webhook_token=TOKEN))
    node, gpu = unique_device()
    async with serve(app) as url, httpx.AsyncClient(base_url=url, timeout=30) as http:
        health = (await http.get("/healthz")).json()
        assert health == {"status": "ok", "temporal_connected": False}
        resp = await http.post(
            "/v1/alertmanager", json=payload(xid_alert(node, gpu)), headers=auth()
        )
        assert resp.status_code == 503, resp.text
        body = resp.json()
        assert body["accepted"] == 0
        assert [f["reason"] for f in body["failed"]] == ["temporal-unavailable"]
        # Only unmatched alerts: nothing for Temporal to do, so Alertmanager need not retry.
        other = xid_alert(node, gpu)
        other["labels"]["alertname"] = "SomethingElse"
        resp = await http.post("/v1/alertmanager", json=payload(other), headers=auth())
        assert resp.status_code == 200 and len(resp.json()["unmatched"]) == 1
        metrics = (await http.get("/metrics")).text
        assert 'sickbay_webhook_alerts_rejected_total{reason="temporal-unavailable"} 1.0' in metrics
        assert 'sickbay_webhook_requests_total{code="503"} 1.0' in metrics


@pytest.mark.devserver
async def test_temporal_goes_away_503(temporal_cli_path: str) -> None:
    env = await start_dev_server(temporal_cli_path)
    settings = settings_for(env, "goes-away")
    app = create_app(
        settings,
        env.client,
        webhook=WebhookSettings(webhook_token=TOKEN, webhook_temporal_timeout=2.0),
    )
    async with serve(app) as url, httpx.AsyncClient(base_url=url, timeout=30) as http:
        node, gpu = unique_device()
        ok = await http.post("/v1/alertmanager", json=payload(xid_alert(node, gpu)), headers=auth())
        assert ok.status_code == 200 and ok.json()["started"] == 1
        await env.shutdown()
        node, gpu = unique_device()
        resp = await http.post(
            "/v1/alertmanager", json=payload(xid_alert(node, gpu)), headers=auth()
        )
        assert resp.status_code == 503, resp.text
        assert resp.json()["failed"][0]["reason"] in ("temporal-unavailable", "temporal-timeout")


def test_token_required_unless_disabled(tmp_path: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("TOKEN", "TOKEN_FILE", "AUTH_DISABLED"):
        monkeypatch.delenv(f"SICKBAY_WEBHOOK_{name}", raising=False)
    settings = Settings()
    with pytest.raises(RuntimeError, match="SICKBAY_WEBHOOK_TOKEN"):
        create_app(settings, webhook=WebhookSettings())
    token_file = tmp_path / "token"
    token_file.write_text("from-a-file-" + "f" * 32 + "\n")
    create_app(settings, webhook=WebhookSettings(webhook_token_file=token_file))
    token_file.write_text("  \n")
    with pytest.raises(RuntimeError, match="empty"):
        create_app(settings, webhook=WebhookSettings(webhook_token_file=token_file))
    create_app(settings, webhook=WebhookSettings(webhook_auth_disabled=True))


# --------------------------------------------------------------------------------------------
# Property tests
# --------------------------------------------------------------------------------------------

json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=20),
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=10), inner, max_size=4)
    ),
    max_leaves=12,
)
not_a_string = (
    st.none()
    | st.booleans()
    | st.integers()
    | st.floats(allow_nan=False)
    | st.lists(st.integers(), max_size=2)
    | st.dictionaries(st.text(max_size=3), st.integers(), max_size=2)
)
not_a_dict = (
    st.none()
    | st.booleans()
    | st.integers()
    | st.text(max_size=5)
    | st.lists(st.integers(), max_size=2)
)
not_a_date = not_a_string.filter(lambda v: not isinstance(v, int | float)) | st.text(
    alphabet=string.ascii_letters, min_size=1, max_size=10
)


def _other_than(*allowed: Any) -> st.SearchStrategy[Any]:
    return json_values.filter(lambda v: v not in allowed)


# (path into the payload, strategy of values that make it invalid); None = delete the key
BREAKS: list[tuple[tuple[Any, ...], st.SearchStrategy[Any] | None]] = [
    (("version",), _other_than("4")),
    (("version",), None),
    (("status",), _other_than("firing", "resolved")),
    (("status",), None),
    (
        ("alerts",),
        not_a_dict.filter(lambda v: not isinstance(v, list))
        | st.dictionaries(st.text(max_size=3), st.integers(), max_size=2),
    ),
    (("alerts",), None),
    (("alerts", 0), not_a_dict),
    (("alerts", 0, "status"), _other_than("firing", "resolved")),
    (("alerts", 0, "status"), None),
    (("alerts", 0, "labels"), not_a_dict),
    (("alerts", 0, "labels"), None),
    (("alerts", 0, "labels", "Hostname"), not_a_string),
    (("alerts", 0, "labels", "UUID"), not_a_string),
    (("alerts", 0, "annotations"), not_a_dict),
    (("alerts", 0, "startsAt"), not_a_date),
    (("alerts", 0, "startsAt"), None),
    (("alerts", 0, "fingerprint"), not_a_string),
    (("truncatedAlerts",), st.integers(max_value=-1) | st.text(alphabet="xyz", min_size=1)),
]


@st.composite
def broken_payloads(draw: st.DrawFn) -> bytes:
    node, gpu = draw(st.sampled_from([("fuzz-node", "GPU-fuzz-0001")]))
    body: dict[str, Any] = payload(xid_alert(node, gpu), xid_alert(node, gpu + "b"))
    path, values = draw(st.sampled_from(BREAKS))
    target: Any = body
    for part in path[:-1]:
        target = target[part]
    if values is None:
        del target[path[-1]]
    else:
        target[path[-1]] = draw(values)
    return json.dumps(body).encode()


malformed = st.one_of(
    st.binary(max_size=300),
    json_values.map(lambda v: json.dumps(v).encode()),
    broken_payloads(),
)


async def _workflow_calls(http: httpx.AsyncClient) -> float:
    text = (await http.get("/metrics")).text
    total = 0.0
    for line in text.splitlines():
        if line.startswith("sickbay_webhook_workflows_total{"):
            total += float(line.rsplit(" ", 1)[1])
    return total


@pytest.mark.devserver
@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(body=malformed)
async def test_malformed_payloads_are_4xx_and_start_nothing(served: Served, body: bytes) -> None:
    before = await _workflow_calls(served.http)
    resp = await served.http.post(
        "/v1/alertmanager",
        content=body,
        headers={**auth(), "Content-Type": "application/json"},
    )
    assert resp.status_code in (400, 413, 422), (body[:200], resp.status_code, resp.text[:300])
    assert resp.json()["error"]
    assert await _workflow_calls(served.http) == before


@pytest.mark.devserver
async def test_fuzzing_started_no_workflow(served: Served) -> None:
    # Runs after the property test in this module (file order): nothing reached Temporal.
    query = f"TaskQueue = '{served.settings.task_queue}'"
    assert await count_runs(served.client, query) == 0


# Any text, plus short runs of Unicode digits/numbers ("²", "٣", "Ⅻ"): the values most
# likely to confuse number parsing of the gpu index and the Xid.
label_text = st.text(max_size=40) | st.text(
    alphabet=st.characters(categories=("Nd", "No", "Nl")), min_size=1, max_size=6
)


@pytest.mark.devserver
@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    labels=st.dictionaries(
        st.sampled_from(["Hostname", "UUID", "gpu", "err_code", "pod", "namespace", "alertname"]),
        label_text,
    ),
    value=label_text,
)
async def test_odd_label_values_never_5xx(
    served: Served, labels: dict[str, str], value: str
) -> None:
    alert = copy.deepcopy(xid_alert("fuzz-labels", "GPU-fuzz-labels"))
    alert["labels"].update(labels)
    alert["annotations"]["value"] = value
    resp = await served.http.post("/v1/alertmanager", json=payload(alert), headers=auth())
    assert resp.status_code == 200, resp.text[:300]
    body = resp.json()
    assert body["accepted"] + len(body["unmatched"]) == 1


@pytest.mark.devserver
async def test_overload_answers_503_and_loses_nothing(dev_env: WorkflowEnvironment) -> None:
    """More alerts than Temporal answers within the deadline: the notification gets 503 (so
    Alertmanager retries), every alert is either accepted or listed as failed, and the retry
    completes the rest without a second workflow for any GPU."""
    queue = f"overload-{uuid.uuid4().hex[:8]}"
    app = create_app(
        settings_for(dev_env, queue),
        dev_env.client,
        # One call at a time and a 0.3 s deadline: a few hundred alerts cannot all make it.
        webhook=WebhookSettings(
            webhook_token=TOKEN, webhook_concurrency=1, webhook_temporal_timeout=0.3
        ),
    )
    devices = [unique_device() for _ in range(300)]
    body = payload(*(xid_alert(n, g) for n, g in devices))
    async with serve(app) as url, httpx.AsyncClient(base_url=url, timeout=30) as http:
        first = await http.post("/v1/alertmanager", json=body, headers=auth())
        assert first.status_code == 503, first.text
        data = first.json()
        accepted = {r["index"] for r in data["results"]}
        failed = {f["index"] for f in data["failed"]}
        assert accepted | failed == set(range(300)) and not accepted & failed
        # Past the deadline; a dev server slowed by a busy machine may also answer a transient
        # error: both are Temporal's, retried by Alertmanager on the 503.
        reasons = {f["reason"] for f in data["failed"]}
        assert "temporal-timeout" in reasons, reasons
        assert reasons <= {"temporal-timeout", "temporal-unavailable"}, reasons
        # Alertmanager's retry: loosen the deadline the way a recovered Temporal would.
        app.state.service.webhook = WebhookSettings(
            webhook_token=TOKEN, webhook_concurrency=1, webhook_temporal_timeout=30
        )
        retry = await http.post("/v1/alertmanager", json=body, headers=auth())
        assert retry.status_code == 200, retry.text
        assert retry.json()["accepted"] == 300
    runs = await count_runs(dev_env.client, f"TaskQueue = '{queue}'", expect=300)
    assert runs == 300  # one per GPU, none twice
    for node, gpu in devices:
        await dev_env.client.get_workflow_handle(device_workflow_id(node, gpu)).terminate("done")
