"""Node rungs through the generic HTTP provider (activities/cloud/machines.py `HttpMachines`)
against the twin's machine endpoints (twin/cloudapi.py), wired to the twin's node rungs.

Cases:
- reboot: the profile's `reboot` call (templated with {node}, {provider_id}), with the
  attempt's key in the Idempotency-Key header; the twin reboots the node; the retried attempt
  (same key) is acted on once;
- replace: the profile's `replace` call; the twin replaces the node; a retry acts once;
- failure modes: 503, 429 and 409 retryable; 403 non-retryable RepairProviderRefused with the
  API's words; a profile without the call, or a pool naming no configured profile ->
  RepairProviderNotConfigured.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from kubernetes import config
from temporalio.exceptions import ApplicationError
from temporalio.testing import ActivityEnvironment

from activities.cloud.config import HttpCall, HttpProfile
from activities.cloud.machines import HttpMachines, MachineActivities
from activities.outbound import SecretRef
from contract.capacity import NodePoolTarget
from contract.errors import (
    ERR_CLOUD_UNAVAILABLE,
    ERR_PROVIDER_NOT_CONFIGURED,
    ERR_PROVIDER_REFUSED,
)
from contract.repair_rungs import MachineActionInput
from tests.activities.kube.conftest import twin
from twin.clock import Clock
from twin.cloudapi import CloudApi, CloudApiServer
from twin.controllers.manager import ControllerManager, TwinOptions

TOKEN = "http-twin-token"


def _profile(url: str, *, replace: bool = True) -> HttpProfile:
    auth = {"Authorization": SecretRef(env="SICKBAY_TEST_HTTP_AUTH")}
    return HttpProfile(
        endpoint=url,
        headers=auth,
        describe=HttpCall(url="{endpoint}/v1/pools/{name}"),
        size_path="size",
        scale=HttpCall(method="POST", url="{endpoint}/v1/pools/{name}:scale"),
        reboot=HttpCall(method="POST", url="{endpoint}/v1/machines/{node}:reboot"),
        replace=HttpCall(method="DELETE", url="{endpoint}/v1/machines/{node}") if replace else None,
    )


@pytest.fixture
async def http_rungs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[Any]:
    monkeypatch.setenv("SICKBAY_TEST_HTTP_AUTH", f"Bearer {TOKEN}")
    cm = twin(
        tmp_path,
        "1.36",
        controllers=ControllerManager(
            TwinOptions(pod_startup_seconds=1, reboot_seconds=20, provisioning_delay=10)
        ),
        clock=Clock(time_scale=20),
    )
    t = cm.__enter__()
    repairs = t.twin.extensions["repairs"]

    def on_instance(action: str, node: str) -> None:
        if action == "reset":
            repairs.reboot(node)
        else:
            repairs.replace(node)

    api = CloudApi(token=TOKEN, on_instance=on_instance)
    server = await CloudApiServer(api).start()
    http = httpx.AsyncClient(timeout=10.0)
    kube_client = config.new_client_from_config(str(t.kubeconfig))
    profiles = {"inhouse": _profile(server.url), "reboot-only": _profile(server.url, replace=False)}
    acts = MachineActivities({"http": HttpMachines(http, profiles, kube_client)})
    try:
        yield t, api, acts
    finally:
        kube_client.close()
        await http.aclose()
        await server.stop()
        cm.__exit__(None, None, None)


async def _run(fn: Any, arg: Any) -> Any:
    return await ActivityEnvironment().run(fn, arg)


def _inp(node: str, action: str, profile: str | None = "inhouse") -> MachineActionInput:
    pool = NodePoolTarget(provider="http", name="gpu-pool", profile=profile)
    return MachineActionInput(workflow_id="wf", action=action, node=node, pool=pool)  # type: ignore[arg-type]


async def test_reboot_and_replace_act_once_per_key(http_rungs: Any) -> None:
    t, api, acts = http_rungs
    node, other = t.node(), t.node(1)
    first = await _run(acts.reboot_node, _inp(node, "reboot"))
    await _run(acts.reboot_node, _inp(node, "reboot"))  # the retried attempt: same key
    assert first.asked and "HTTP 202" in first.detail
    assert t.twin.extensions["repairs"].reboots == [node]
    await _run(acts.replace_node, _inp(other, "replace"))
    await _run(acts.replace_node, _inp(other, "replace"))
    assert api.instance_calls == [("reset", node), ("delete", other)]
    assert t.twin.extensions["repairs"].replacements == [other]


@pytest.mark.parametrize(
    ("status", "kind", "retryable"),
    [
        (503, ERR_CLOUD_UNAVAILABLE, True),
        (429, ERR_CLOUD_UNAVAILABLE, True),
        (409, ERR_CLOUD_UNAVAILABLE, True),
        (403, ERR_PROVIDER_REFUSED, False),
    ],
)
async def test_failure_modes(http_rungs: Any, status: int, kind: str, retryable: bool) -> None:
    t, api, acts = http_rungs
    node = t.node()
    api.inject(status, message="machine quota exhausted" if status == 403 else "")
    with pytest.raises(ApplicationError) as err:
        await _run(acts.reboot_node, _inp(node, "reboot"))
    assert err.value.type == kind and err.value.non_retryable is (not retryable)
    if status == 403:
        assert "machine quota exhausted" in str(err.value)
    assert api.instance_calls == []
    await _run(acts.reboot_node, _inp(node, "reboot"))
    assert api.instance_calls == [("reset", node)]


@pytest.mark.parametrize(
    ("profile", "problem"),
    [("reboot-only", "has no `replace` call"), ("nope", "no HTTP profile 'nope'")],
)
async def test_not_configured(http_rungs: Any, profile: str, problem: str) -> None:
    t, api, acts = http_rungs
    with pytest.raises(ApplicationError) as err:
        await _run(acts.replace_node, _inp(t.node(), "replace", profile))
    assert err.value.type == ERR_PROVIDER_NOT_CONFIGURED and err.value.non_retryable
    assert problem in str(err.value)
    assert api.instance_calls == []
