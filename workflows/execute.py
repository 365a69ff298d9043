"""Calling an activity through its declaration (`contract.activity.Activity[I, R]`).

`execute(DECL, arg, ...)` / `execute_local(DECL, arg, ...)` are the SDK's `execute_activity` /
`execute_local_activity` by the declaration's name, with `result_type=DECL.result`, typed so
that mypy holds `arg` to the declared input model and the answer is the declared result: a
workflow cannot call an activity with another model than the one its implementation takes.
An activity declared with input `None` gets no argument. The options are the SDK's own,
passed on unchanged (the commands, and so the recorded histories, are the same as calling the
SDK directly).
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from datetime import timedelta
from typing import Any, TypeVar

from temporalio import workflow
from temporalio.common import RetryPolicy

with workflow.unsafe.imports_passed_through():
    from contract.activity import Activity

I = TypeVar("I")  # noqa: E741 - the input model, as in Activity[I, R]
R = TypeVar("R")

TRY_CANCEL = workflow.ActivityCancellationType.TRY_CANCEL


def _args(decl: Activity[Any, Any], arg: object) -> Sequence[Any]:
    return [] if decl.input is type(None) else [arg]


async def execute(
    decl: Activity[I, R],
    arg: I,
    *,
    start_to_close_timeout: timedelta | None = None,
    schedule_to_close_timeout: timedelta | None = None,
    heartbeat_timeout: timedelta | None = None,
    retry_policy: RetryPolicy | None = None,
    cancellation_type: workflow.ActivityCancellationType = TRY_CANCEL,
    task_queue: str | None = None,
    summary: str | None = None,
) -> R:
    """`workflow.execute_activity` of `decl` with `arg`: its declared result."""
    result: R = await workflow.execute_activity(
        decl.name,
        args=_args(decl, arg),
        result_type=decl.result,
        start_to_close_timeout=start_to_close_timeout,
        schedule_to_close_timeout=schedule_to_close_timeout,
        heartbeat_timeout=heartbeat_timeout,
        retry_policy=retry_policy,
        cancellation_type=cancellation_type,
        task_queue=task_queue,
        summary=summary,
    )
    return result


async def execute_local(
    decl: Activity[I, R],
    arg: I,
    *,
    start_to_close_timeout: timedelta | None = None,
    schedule_to_close_timeout: timedelta | None = None,
    retry_policy: RetryPolicy | None = None,
    summary: str | None = None,
) -> R:
    """`workflow.execute_local_activity` of `decl` with `arg`: its declared result."""
    result: R = await workflow.execute_local_activity(
        decl.name,
        args=_args(decl, arg),
        result_type=decl.result,
        start_to_close_timeout=start_to_close_timeout,
        schedule_to_close_timeout=schedule_to_close_timeout,
        retry_policy=retry_policy,
        summary=summary,
    )
    return result


def abandon(task: asyncio.Task[Any]) -> None:
    """Cancel `task` (an activity call under TRY_CANCEL) without waiting for it. How it ends,
    the cancellation's ActivityError or a result that came first, is read when it comes: that
    end is expected, and the worker's log must not call it "Task exception was never
    retrieved" (at ERROR, with a traceback) on every deadline."""
    task.cancel()
    task.add_done_callback(_read_end)


def _read_end(task: asyncio.Task[Any]) -> None:
    if not task.cancelled():
        task.exception()
