"""The GPUFailureConfirmed Event is written beside the budget and the quarantine, not before
them: a GPU failing under a pod (the common case) does not wait one Kubernetes write and one
local-activity round trip longer for its DeviceTaintRule. The Events still read in order on
the objects: GPUQuarantined is written only after GPUFailureConfirmed is in. Likewise the
GPURemediationEscalated Event beside the page: a refused GPU's page does not wait for it."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

from temporalio import activity
from temporalio.exceptions import ApplicationError
from temporalio.testing import WorkflowEnvironment

from contract.kube import RecordEventInput
from contract.names import ACT_NOTIFY, ACT_QUARANTINE, ACT_RECORD_EVENT, SIG_REPAIRED
from contract.remediation import Phase, RepairedRequest
from tests.workflows.fakes import FakeWorld, new_worker, start, wait_phase


@dataclass
class SlowApi:
    """The record-event fake of an API server slow on one Event `reason`: that write answers
    once `seen()` holds or after `seconds` (`meanwhile`: whether it held); one that did not
    see it fails, and the local activity's next attempt looks again. `written`: the reasons
    written, in order."""

    reason: str
    seen: Callable[[], object]
    seconds: float
    written: list[str] = field(default_factory=list)
    meanwhile: list[bool] = field(default_factory=list)

    def fake(self) -> Callable[[RecordEventInput], Awaitable[None]]:
        @activity.defn(name=ACT_RECORD_EVENT)
        async def record_event(req: RecordEventInput) -> None:
            if req.reason == self.reason:
                loop = asyncio.get_running_loop()
                give_up = loop.time() + self.seconds
                for _ in range(1_000_000):
                    if self.seen() or loop.time() > give_up:
                        break
                    await asyncio.sleep(0.02)
                self.meanwhile.append(bool(self.seen()))
                if not self.meanwhile[-1]:  # a busy machine: the next attempt looks again
                    raise ApplicationError("the API server is slow (test)")
            self.written.append(req.reason)

        return record_event


async def test_quarantine_does_not_wait_for_the_confirmed_event(
    time_skipping_env: WorkflowEnvironment,
) -> None:
    client = time_skipping_env.client
    world = FakeWorld()  # a Deployment's pod on the GPU: the Events go on it
    assert world.consumers
    # Up to 8 s, within the local activity's 10 s, until the quarantine is asked for.
    api = SlowApi("GPUFailureConfirmed", lambda: world.args(ACT_QUARANTINE), 8.0)

    with time_skipping_env.auto_time_skipping_disabled():
        async with new_worker(client, world, extra_activities=[api.fake()]) as worker:
            handle = await start(client, worker, world)
            await wait_phase(handle, Phase.HOLDING)
            await handle.terminate("test done")
    assert True in api.meanwhile, "the quarantine waited for the GPUFailureConfirmed Event"
    assert api.written.index("GPUFailureConfirmed") < api.written.index("GPUQuarantined"), (
        api.written
    )


async def test_a_page_does_not_wait_for_the_escalated_event(
    time_skipping_env: WorkflowEnvironment,
) -> None:
    """A GPU the budget refuses is paged while its GPURemediationEscalated Event is still being
    written: an API server that hangs on the write holds the page back only until the
    workflow task's heartbeat (the SDK completes the task, the page in it, at 80 % of its
    10 s timeout), not through the write's five tries of up to 10 s each, as when the page
    waited for the Event. Both Events beside the steps are written, in the order decided,
    before the run ends."""
    client = time_skipping_env.client
    world = FakeWorld(budget_granted=False)
    # An API server that hangs on the escalation's Event, until the page is sent (30 s at most).
    api = SlowApi("GPURemediationEscalated", lambda: world.args(ACT_NOTIFY), 30.0)

    with time_skipping_env.auto_time_skipping_disabled():
        async with new_worker(client, world, extra_activities=[api.fake()]) as worker:
            handle = await start(client, worker, world)
            await wait_phase(handle, Phase.ESCALATED)
            await handle.signal(SIG_REPAIRED, RepairedRequest(actor="ops"))
            result = await handle.result()
    assert result.status.escalation_reason == "budget-exhausted", result.status
    assert True in api.meanwhile, "the page waited for the GPURemediationEscalated Event"
    assert api.written[:2] == ["GPUFailureConfirmed", "GPURemediationEscalated"], api.written
