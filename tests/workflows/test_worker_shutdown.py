"""A worker told to stop mid-burst lets the budget answer the leases it is still asking for.

The budget and the GPU ledger workflows poll their own queues from the same process as the
remediations. Before: SIGTERM shut the three workers down at once, so the budget's queue lost
its poller while remediations of this worker were still inside their lease's local activity:
the update was never answered, the activity ran into the graceful-shutdown timeout and was
cancelled (a traceback per remediation in the log), and its workflow task timed out for the
next worker to redo (seen at a stop 0.3 s into a burst of 24 alerts: the stop took 30 s).

Here, the production workers (`worker.main`'s three, as `build_worker` makes them) on the dev
server with the real budget client: a remediation's lease request is held until the stop has begun, then sent; it must be
answered (granted) by the budget before the workers are gone.
"""

from __future__ import annotations

import asyncio
import uuid

from temporalio.client import Client

from activities.budget_client import BudgetActivities
from contract.budget import BudgetDecision, BudgetLeaseRequest
from tests.workflows.fakes import FakeWorld, fake_of, start
from worker.main import Built, sickbay_workers
from worker.settings import Settings

GRACE = 5.0  # seconds the stop gives running activities (SICKBAY_GRACEFUL_SHUTDOWN_SECONDS)


async def test_a_stop_lets_the_budget_answer_the_leases_being_asked(dev_client: Client) -> None:
    world = FakeWorld()
    settings = Settings(task_queue=f"tq-stop-{uuid.uuid4()}", graceful_shutdown_seconds=GRACE)
    budget = BudgetActivities(dev_client, settings.task_queue)
    asking = asyncio.Event()
    stopping = asyncio.Event()
    answers: list[BudgetDecision | BaseException] = []

    @fake_of(BudgetActivities.acquire_budget_lease)
    async def acquire(req: BudgetLeaseRequest) -> BudgetDecision:
        asking.set()
        await stopping.wait()  # the lease is asked once the stop has begun
        try:
            decision = await budget.acquire_budget_lease(req)
        except BaseException as err:
            answers.append(err)
            raise
        answers.append(decision)
        return decision

    built = Built(activities=world.activities(acquire))
    worker = sickbay_workers(dev_client, settings, built)  # build_worker's, unchecked
    running = asyncio.ensure_future(worker.run())
    handle = None
    try:
        handle = await start(dev_client, worker, world)
        await asyncio.wait_for(asking.wait(), timeout=60)
        stop = asyncio.ensure_future(worker.shutdown())
        await asyncio.sleep(0.5)  # every worker has begun stopping
        stopping.set()
        await asyncio.wait_for(stop, timeout=120)
        await asyncio.wait_for(running, timeout=120)
    finally:
        stopping.set()
        if not running.done():
            await worker.shutdown()
            await running
        if handle is not None:
            await handle.terminate("test done")
    assert len(answers) == 1, answers
    (answer,) = answers
    assert isinstance(answer, BudgetDecision), f"the lease was not answered: {answer!r}"
    assert answer.granted
