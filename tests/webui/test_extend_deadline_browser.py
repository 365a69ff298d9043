"""`extend-deadline` sent from the Temporal Web UI's *Send an Update*, in a real headless Chromium.

The embedded stack with its Web UI (dev server, the cluster twin, a real `sickbay worker`,
webhook): a 2-replica Deployment on a 1-node x 2-GPU twin, pinned to a runbook with a 2h
Pending deadline and no scale-up; one GPU fails, so the evicted replica's replacement stays
Pending and the remediation waits for it. Then, on the run's page, as an operator would:
- *Send an Update* `extend-deadline` with the README's JSON (`by: 30m`): the status query shows
  the deadline 30 minutes later and the timeline records the extension, the claimed actor
  beside the client identity the server recorded with the UI's update;
- a second one with both `by` and `until`: the dialog shows the validator's refusal, naming
  the problem, and nothing changes (deadline, timeline);
- the remediation is not wedged: an `abort` afterwards closes it as aborted, the quarantine
  lifted.

Skipped, with how to install it, where Chromium or playwright is missing;
SICKBAY_REQUIRE_BROWSER=1 (set by .ci/run) turns that skip into a failure.
"""

from __future__ import annotations

import json
import re
import sys
from collections.abc import AsyncIterator, Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
import yaml
from temporalio.api.enums.v1 import EventType

from contract.names import LABEL_WORKLOAD_CLASS, SIG_ABORT, UPD_EXTEND_DEADLINE
from contract.remediation import Phase
from harness.scenarios import Demo, Progress
from harness.stack import Stack, StackConfig, free_port
from tests.webui.browser import WAIT_MS

pytestmark = [pytest.mark.devserver, pytest.mark.slow]

README = Path(__file__).resolve().parents[2] / "README.md"
RUNBOOK = "ui-extend"
SPEC: dict[str, Any] = {
    "confirm": {"staleAfter": "1h"},
    "quarantine": {"effect": "NoExecute"},
    "budget": {
        "maxPerPool": "100%",
        "maxPerCluster": "100%",
        "unsafe": ["maxPerPool", "maxPerCluster"],  # a 2-GPU stand
    },
    "escalation": {"channels": ["pagerduty"], "severity": "critical"},
    "release": {"mode": "repaired"},
    "eviction": {"mode": "taint", "timeout": "300s", "force": "none"},
    "replacement": {"pendingDeadline": "2h"},  # never reached during the test
    "scaleUp": {"enabled": False},
}
WITHIN = 120.0  # seconds, for states on a busy 2-core machine


def readme_extension() -> dict[str, Any]:
    """The README's `extend-deadline` Web UI input (the JSON an operator types)."""
    text = README.read_text()
    body = re.search(r"<!-- input: ExtendDeadlineRequest -->\s*```json\n(.*?)```", text, re.S)
    assert body, "README lost its Web UI extend-deadline example"
    return dict(json.loads(body.group(1)))


@pytest.fixture(scope="module")
def stack(_browser_ok: None, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    config = StackConfig(
        time_scale=30.0,
        temporal_port=free_port(),
        ui_port=free_port(),
        ui=True,
        state_dir=tmp_path_factory.mktemp("ui-stack"),
        notes=lambda text: print(text, file=sys.stderr),
    )
    s = Stack(config)
    s.__enter__()
    try:
        yield s
    finally:
        s.stop()


@pytest.fixture(scope="module")
async def demo(stack: Stack) -> AsyncIterator[Demo]:
    d = await Demo.open(stack, Progress(lambda line: print(line, file=sys.stderr)))
    try:
        yield d
    finally:
        await d.close()


async def _send_update(page: Any, ui: str, wf_id: str, name: str, body: str) -> dict[str, Any]:
    """*More Actions* → *Send an Update*, pick `name`, paste `body`, Submit; returns the
    server's answer to the UI's request (the dialog stays open when it is a refusal)."""
    await page.goto(f"{ui}/namespaces/default/workflows/{wf_id}")
    actions = page.get_by_role("button", name="More Actions").first
    await actions.wait_for(timeout=WAIT_MS)
    await actions.click()
    await page.get_by_role("menuitem", name="Send an Update").click()
    dialog = page.locator("dialog[open]")
    await dialog.get_by_test_id("update-select-button").click()
    await dialog.get_by_role("option", name=name).click()
    await dialog.locator(".cm-content").click()  # the Data editor (CodeMirror): pasted
    await page.keyboard.press("Control+A")
    await page.keyboard.insert_text(body)
    submit = dialog.get_by_test_id("confirm-modal-button")
    answers: list[Any] = []
    page.on(
        "response",
        lambda r: answers.append(r) if f"/update/{name}" in r.url else None,
    )
    # The first click may only blur the editor (the form re-renders): click until the UI sent it.
    for attempt in range(int(WAIT_MS / 250)):
        if answers:
            break
        if attempt % 8 == 0:
            await submit.click()
        await page.wait_for_timeout(250)
    else:
        raise AssertionError(f"the dialog never sent {name}:\n{await page.inner_text('body')}")
    return dict(await answers[0].json())


async def _dialog_shows(page: Any, text: str) -> str:
    dialog = page.locator("dialog[open]")
    shown = ""
    for _ in range(int(WAIT_MS / 250)):
        shown = str(await dialog.inner_text()) if await dialog.count() else ""
        if text in shown:
            return shown
        await page.wait_for_timeout(250)
    raise AssertionError(f"the dialog never showed {text!r}:\n{shown}")


async def _recorded_update_identities(demo: Demo, wf_id: str) -> list[str]:
    """The client identity the server stored with each accepted update, from history."""
    history = await demo.handle(wf_id).fetch_history()
    return [
        e.workflow_execution_update_accepted_event_attributes.accepted_request.meta.identity
        for e in history.events
        if e.event_type == EventType.EVENT_TYPE_WORKFLOW_EXECUTION_UPDATE_ACCEPTED
    ]


async def test_extend_deadline_from_the_web_ui(stack: Stack, demo: Demo, page: Any) -> None:
    assert stack.info is not None and stack.info.ui_url
    ui = stack.info.ui_url
    doc = {"apiVersion": "sickbay/v1", "kind": "Runbook", "metadata": {"name": RUNBOOK}}
    doc["spec"] = SPEC
    (Path(stack.info.runbooks_dir) / f"{RUNBOOK}.yaml").write_text(yaml.safe_dump(doc))
    ns = "ui-extend"
    await demo.namespace(ns)
    await demo.deployment(ns, "serve", replicas=2, labels={LABEL_WORKLOAD_CLASS: RUNBOOK})
    running = await demo.running(ns, "serve", count=2)
    gpu = await demo.gpu(running[0][1])
    await demo.fail(gpu)
    incident = await demo.incident(gpu, "extend the Pending deadline from the Web UI")
    waiting = await demo.phase(incident, {Phase.AWAITING_REPLACEMENT}, within=WITHIN)
    wf_id = incident.workflow_id
    assert waiting.runbook == RUNBOOK and waiting.deadline is not None
    before = waiting.deadline

    # 1. The README's input, typed into Send an Update.
    body = readme_extension()
    answer = await _send_update(page, ui, wf_id, UPD_EXTEND_DEADLINE, json.dumps(body, indent=2))
    assert "failure" not in answer.get("outcome", {}), answer
    moved = await demo.until(
        "the status query to show the new deadline",
        lambda: _moved(demo, wf_id, before),
        WITHIN,
    )
    assert moved.deadline == moved.until == before + timedelta(minutes=30)
    assert moved.phase is Phase.AWAITING_REPLACEMENT
    entries = await demo.timeline(incident)
    (entry,) = [e for e in entries if e.action.startswith("deadline extended")]
    assert entry.actor == body["actor"] and entry.reason == body["reason"]
    (identity,) = await _recorded_update_identities(demo, wf_id)
    # The timeline keeps what the server stored with the UI's update. The Web UI (2.54) sends
    # no identity with an update, so that is "unknown", as the README says; should a UI send
    # one, this names it and the README must say so.
    assert entry.client_identity == (identity or "unknown")
    assert (identity, entry.client_identity) == ("", "unknown"), identity

    # 2. Both `by` and `until`: the dialog shows the validator's refusal; nothing changes.
    bad = {**body, "until": "2030-01-01T00:00:00Z"}
    answer = await _send_update(page, ui, wf_id, UPD_EXTEND_DEADLINE, json.dumps(bad))
    assert "failure" in answer.get("outcome", {}), answer
    shown = await _dialog_shows(page, "invalid extend-deadline input")
    assert "give exactly one of `by` (a duration) or `until` (a time)" in shown, shown
    assert "Failed decoding arguments" not in shown
    after = await demo.status(wf_id)
    assert after.deadline == moved.deadline and after.phase is Phase.AWAITING_REPLACEMENT
    assert await demo.timeline(incident) == entries
    assert len(await _recorded_update_identities(demo, wf_id)) == 1  # refused, not accepted

    # 3. Not wedged: an abort still closes it, the quarantine lifted.
    await demo.handle(wf_id).signal(SIG_ABORT, {"reason": "test over", "actor": "erin"})
    result = await demo.closed(incident, within=WITHIN)
    assert result.outcome == "aborted", (result.outcome, result.reason)
    assert await demo.taint_rule(result.status.rule_name or "") is None
    await demo.delete_namespace(ns)


async def _moved(demo: Demo, wf_id: str, before: Any) -> Any:
    st = await demo.status(wf_id)
    return st if st.deadline is not None and st.deadline > before else None


def test_readme_extension_is_valid() -> None:
    """The README's typed input is one the workflow accepts as it stands."""
    from contract.remediation import ExtendDeadlineRequest

    req = ExtendDeadlineRequest.model_validate(readme_extension())
    assert req.by == timedelta(minutes=30) and req.until is None
