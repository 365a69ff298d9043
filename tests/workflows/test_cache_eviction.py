"""A remediation dropped from the worker's cache mid-wait leaves quietly.

A worker that stops (or runs short of cache) drops the workflows it holds: the SDK cancels
their tasks, and what is still suspended after that is closed by the garbage collector,
outside the workflow's event loop, in whatever order it finds the coroutines. Code on that
way out must not call the workflow's APIs: the replacement wait's cleanup read
`workflow.now()` and raised "Not in workflow event loop" from the collector (an
"Exception ignored in: <coroutine object evict_and_replace>" in full test runs).

Here: a remediation waits for a Pending replacement, its worker stops, and each of its
coroutines still suspended is closed the way the collector did in those runs (the step's
own coroutine first); none raises. Then another worker carries the remediation on from its history: nothing was lost.
"""

from __future__ import annotations

import gc
import inspect
from typing import Any

from temporalio.client import Client

from contract.kube import ReplacementReport
from contract.remediation import Phase
from tests.waiting import until
from tests.workflows.fakes import FakeWorld, new_worker, start, wait_phase

PENDING = ReplacementReport(status="pending", unschedulable_message="0/2 nodes are available")


def _suspended(name: str) -> list[Any]:
    """The suspended coroutines of remediation/replace.py's `name`."""
    return [
        obj
        for obj in gc.get_objects()
        if inspect.iscoroutine(obj)
        and obj.cr_code.co_name == name
        and obj.cr_code.co_filename.endswith("remediation/replace.py")
        and inspect.getcoroutinestate(obj) == inspect.CORO_SUSPENDED
    ]


async def test_a_dropped_remediation_closes_without_calling_the_workflow(
    dev_client: Client,
) -> None:
    world = FakeWorld(replacement_reports=[PENDING])
    queue = f"tq-evict-{world.gpu_uuid}"
    async with new_worker(dev_client, world, task_queue=queue) as worker:
        handle = await start(dev_client, worker, world)
        await wait_phase(handle, Phase.AWAITING_REPLACEMENT)
        await until(lambda: world.watching, "the replacement watch open")
    try:
        left = _suspended("evict_and_replace")
        assert left, "the dropped remediation's wait is still suspended (the case at hand)"
        raised: list[str] = []
        for coro in left:
            try:
                coro.close()  # as the collector would, outside the workflow's loop
            except BaseException as err:  # what the collector would report as ignored
                raised.append(f"{coro.cr_code.co_name}: {type(err).__name__}: {err}")
        assert raised == []
        # Nothing lost: another worker replays it and it is still waiting for the replacement.
        async with new_worker(dev_client, world, task_queue=queue):
            await until(lambda: world.watching, "the replacement watch open again", within=60)
            await wait_phase(handle, Phase.AWAITING_REPLACEMENT)
    finally:
        await handle.terminate("test done")
