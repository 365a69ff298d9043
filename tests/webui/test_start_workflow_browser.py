"""The Temporal Web UI's *Start Workflow* form, driven in a real headless Chromium.

A dev server with its Web UI, a worker with activity fakes, Debian's /usr/bin/chromium driven by
playwright (the system browser; nothing is downloaded). Cases:
- the README's Web UI launch (its Workflow ID and JSON input, typed into the form): the run
  completes as a dry run and the page shows COMPLETED with outcome dry-run;
- the same form with a typo'd field (`"dryrun"`): the page shows FAILED and the message naming
  the field, at once (no run left Running under the device's id).

Skipped, with how to install it, where Chromium or playwright is missing;
SICKBAY_REQUIRE_BROWSER=1 (set by .ci/run) turns that skip into a failure.
"""

from __future__ import annotations

import json
import re
import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from temporalio.client import Client
from temporalio.service import RPCError
from temporalio.testing import WorkflowEnvironment

from contract.names import WF_REMEDIATE
from harness.stack import free_port
from tests.conftest import dev_server_args
from tests.webui.browser import WAIT_MS
from tests.workflows.fakes import FakeWorld, new_worker
from worker.converter import DATA_CONVERTER

pytestmark = pytest.mark.devserver

README = Path(__file__).resolve().parents[2] / "README.md"


def readme_ui_launch() -> tuple[str, dict[str, Any]]:
    """The README's Workflow ID example and its `<!-- input: RemediationInput -->` JSON."""
    text = README.read_text()
    wf_id = re.search(r"the Workflow ID is\s+`(sickbay-gpu-[^`]+)`", text)
    body = re.search(r"<!-- input: RemediationInput -->\s*```json\n(.*?)```", text, re.S)
    assert wf_id and body, "README lost its Web UI launch example"
    return wf_id.group(1), json.loads(body.group(1))


@pytest.fixture(scope="module")
async def ui_env(_browser_ok: None, temporal_cli_path: str) -> AsyncIterator[tuple[Any, str]]:
    ui_port = free_port()
    env = await WorkflowEnvironment.start_local(
        port=free_port(),
        data_converter=DATA_CONVERTER,
        dev_server_existing_path=temporal_cli_path,
        dev_server_extra_args=[*dev_server_args(), "--ui-disable-news-fetch"],
        ui=True,
        ui_port=ui_port,
    )
    try:
        yield env, f"http://127.0.0.1:{ui_port}"
    finally:
        await env.shutdown()


async def _start_from_form(
    client: Client, page: Any, ui: str, wf_id: str, queue: str, body: str
) -> str:
    """Fill *Start Workflow* as a person would; return the text of the run's page."""
    await page.goto(f"{ui}/namespaces/default/workflows/start-workflow")
    await page.fill("#workflowId", wf_id)
    await page.fill("#taskQueue", queue)
    await page.fill("#workflowType", WF_REMEDIATE)
    await page.locator("#workflowType").press("Tab")
    await page.click(".cm-content")  # the Input editor (CodeMirror); pasted, not typed
    await page.keyboard.press("Control+A")  # the form may keep the previous input
    await page.keyboard.insert_text(body)
    start = page.get_by_role("button", name="Start Workflow")
    # The server is the judge of "started" (the form's toast may be an earlier one). A click
    # can land while the form re-renders (task-queue check, type suggestions): click again.
    for attempt in range(int(WAIT_MS / 200)):
        if attempt % 15 == 0:
            await page.keyboard.press("Escape")
            await start.click()
        try:
            await client.get_workflow_handle(wf_id).describe()
            break
        except RPCError:
            await page.wait_for_timeout(200)
    else:
        raise AssertionError(f"the form did not start {wf_id}:\n{await page.inner_text('body')}")
    await page.goto(f"{ui}/namespaces/default/workflows/{wf_id}")
    return str(await page.inner_text("body"))


async def _frame_texts(page: Any) -> list[str]:
    """The text of every frame still attached: the tab's refresh replaces the markdown frame,
    and one that detaches while it is read is left out (the caller reads again)."""
    from playwright.async_api import Error as PageError

    texts = []
    for frame in page.frames:
        try:
            texts.append(str(await frame.locator("body").inner_text()))
        except PageError as err:
            if "detached" not in str(err):
                raise
    return texts


async def _run_page(page: Any, status: str, shows: str = "") -> str:
    """The run's page once it shows `status` and the text `shows` (the page loads its parts
    one after the other; reloaded if the run closed after it loaded)."""
    from playwright.async_api import TimeoutError as PageTimeout

    for _ in range(3):
        try:
            # The badge's DOM text is "Completed"/"Failed"; CSS shows it upper-case.
            badge = page.get_by_text(re.compile(f"^{status}$", re.I))
            await badge.first.wait_for(timeout=WAIT_MS / 3)
            for _ in range(int(WAIT_MS / 3 / 250)):
                text = str(await page.inner_text("body"))
                if shows in text:
                    return text
                await page.wait_for_timeout(250)
        except PageTimeout:
            pass
        await page.reload()
    raise AssertionError(
        f"{page.url} never showed {status} {shows!r}:\n{await page.inner_text('body')}"
    )


async def test_readme_launch_from_the_form(ui_env: tuple[Any, str], page: Any) -> None:
    env, ui = ui_env
    wf_id, body = readme_ui_launch()
    device = body["device"]
    world = FakeWorld(node=device["node"], gpu_uuid=device["gpu_uuid"])
    queue = f"ui-{uuid.uuid4().hex[:8]}"
    async with new_worker(env.client, world, task_queue=queue):
        await _start_from_form(env.client, page, ui, wf_id, queue, json.dumps(body, indent=2))
        text = await _run_page(page, "COMPLETED", '"outcome": "dry-run"')
        result = await env.client.get_workflow_handle(wf_id).result()
    assert '"outcome": "dry-run"' in text
    assert result["outcome"] == "dry-run" and result["status"]["dry_run"] is True
    assert "quarantine-device" not in world.names()


async def test_mistyped_launch_fails_visibly(ui_env: tuple[Any, str], page: Any) -> None:
    env, ui = ui_env
    world = FakeWorld()
    queue = f"ui-{uuid.uuid4().hex[:8]}"
    wf_id = f"sickbay-gpu-{world.node}-{world.gpu_uuid.lower()}"
    body = {"device": {"node": world.node, "gpu_uuid": world.gpu_uuid}, "dryrun": True}
    async with new_worker(env.client, world, task_queue=queue):
        await _start_from_form(env.client, page, ui, wf_id, queue, json.dumps(body))
        text = await _run_page(page, "FAILED", "invalid input for")
    assert f"invalid input for {WF_REMEDIATE}: dryrun: unknown field" in text
    assert world.names() == []


async def test_running_remediation_shows_current_details(
    ui_env: tuple[Any, str], page: Any
) -> None:
    """The UI's *User Metadata* tab shows the current details the workflow keeps: phase, what
    it waits for and until when, what comes next."""
    env, ui = ui_env
    world = FakeWorld()
    queue = f"ui-{uuid.uuid4().hex[:8]}"
    wf_id = f"sickbay-gpu-{world.node}-{world.gpu_uuid.lower()}"
    body = {
        "device": {"node": world.node, "gpu_uuid": world.gpu_uuid},
        "alerts": [{"source": "alertmanager", "alertname": "GpuXidError", "xid": 79}],
        "requested_by": "alice",
    }
    async with new_worker(env.client, world, task_queue=queue):
        await _start_from_form(env.client, page, ui, wf_id, queue, json.dumps(body))
        await _run_page(page, "RUNNING")
        await page.get_by_text("User Metadata", exact=True).click()
        shown = ""
        for _ in range(int(WAIT_MS / 500)):
            # The details are rendered as markdown, in a frame of their own.
            shown = "\n".join(await _frame_texts(page))
            if "waiting for: marked repaired" in shown:
                break
            await page.keyboard.press("r")  # the tab's own refresh key
            await page.wait_for_timeout(500)
        handle = env.client.get_workflow_handle(wf_id)
        await handle.signal("abort", {"reason": "test done", "actor": "t"})
        await handle.result()
    assert "holding" in shown and f"device {world.node}/{world.gpu_uuid}" in shown, shown
    assert "waiting for: marked repaired or Healthy for 30m until" in shown, shown
    assert "next: check the device’s health" in shown, shown  # the markdown's typographic ’
