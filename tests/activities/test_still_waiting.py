"""A polling activity's "not yet" (StillWaiting) is a normal answer, not a failure.

The polling activities (a repair Job still running, a node not back yet, a pool resize in
progress) answer "not yet" by raising a retryable ApplicationError of type StillWaiting: the
caller's retry policy is the polling loop. Raised as an ordinary error, each poll was logged
by the worker at WARNING as "Completing activity as failed" with a 25-line traceback (ten in
one repair of the demo), so an SRE reading the worker's log saw failures where a Job simply
ran. Each is raised through `activities.waiting.still_waiting`, a BENIGN error: the SDK logs
it at DEBUG, and Temporal does not count it as a failure in its metrics.

Cases:
- every StillWaiting the activities raise goes through `still_waiting` (read from the code);
- a real worker polling an activity that says "not yet" twice logs no WARNING for it, and the
  third attempt's answer is the result.
"""

from __future__ import annotations

import ast
import logging
import uuid
from datetime import timedelta
from pathlib import Path

import pytest
from temporalio import activity, workflow
from temporalio.common import RetryPolicy
from temporalio.exceptions import ApplicationErrorCategory
from temporalio.testing import WorkflowEnvironment
from temporalio.worker import Worker

from activities.waiting import still_waiting
from contract.errors import ERR_STILL_WAITING

ROOT = Path(__file__).resolve().parents[2]


def _raw_still_waiting(path: Path) -> list[int]:
    """Lines of `path` that build an ApplicationError of type StillWaiting themselves."""
    lines = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if not isinstance(node, ast.Call):
            continue
        name = node.func.id if isinstance(node.func, ast.Name) else getattr(node.func, "attr", "")
        if name != "ApplicationError":
            continue
        for kw in node.keywords:
            if kw.arg == "type" and isinstance(kw.value, ast.Name):
                if kw.value.id == "ERR_STILL_WAITING":
                    lines.append(node.lineno)
    return lines


def test_every_still_waiting_is_raised_benign() -> None:
    own = ROOT / "activities" / "waiting.py"
    raw = {
        str(p.relative_to(ROOT)): lines
        for p in sorted((ROOT / "activities").rglob("*.py"))
        if p != own and (lines := _raw_still_waiting(p))
    }
    assert not raw, f"StillWaiting raised without activities.waiting.still_waiting: {raw}"


def test_still_waiting_is_retryable_and_benign() -> None:
    err = still_waiting("Job sickbay-repair/x still running")
    assert err.type == ERR_STILL_WAITING and not err.non_retryable
    assert err.category == ApplicationErrorCategory.BENIGN
    assert err.message == "Job sickbay-repair/x still running"


ATTEMPTS_BEFORE_DONE = 3


@activity.defn(name="test-poll")
async def poll() -> str:
    attempt = activity.info().attempt
    if attempt < ATTEMPTS_BEFORE_DONE:
        raise still_waiting(f"not yet (attempt {attempt})")
    return f"done at attempt {attempt}"


@workflow.defn(name="test-poll-until-done", sandboxed=False)  # a test-only workflow
class PollUntilDone:
    @workflow.run
    async def run(self) -> str:
        result: str = await workflow.execute_activity(
            poll,
            start_to_close_timeout=timedelta(seconds=10),
            retry_policy=RetryPolicy(
                initial_interval=timedelta(milliseconds=10), backoff_coefficient=1.0
            ),
        )
        return result


async def test_a_poll_that_says_not_yet_logs_no_warning(
    time_skipping_env: WorkflowEnvironment, caplog: pytest.LogCaptureFixture
) -> None:
    queue = f"tq-poll-{uuid.uuid4()}"
    with caplog.at_level(logging.DEBUG, logger="temporalio.activity"):
        async with Worker(
            time_skipping_env.client,
            task_queue=queue,
            workflows=[PollUntilDone],
            activities=[poll],
        ):
            said = await time_skipping_env.client.execute_workflow(
                PollUntilDone.run, id=f"poll-{uuid.uuid4()}", task_queue=queue
            )
    assert said == f"done at attempt {ATTEMPTS_BEFORE_DONE}"
    polls = [r for r in caplog.records if "Completing activity as failed" in r.getMessage()]
    assert len(polls) == ATTEMPTS_BEFORE_DONE - 1, polls  # the SDK still says it, at DEBUG
    assert all(r.levelno == logging.DEBUG for r in polls), [r.levelname for r in polls]
