"""Workflow-test fixtures: the time-skipping server knows Sickbay's search attributes.

The Java test server implements AddSearchAttributes but not ListSearchAttributes, so
worker.temporal.ensure_search_attributes cannot be used there; register them directly.
"""

from __future__ import annotations

from typing import Any

import pytest
from temporalio.api.enums.v1 import IndexedValueType
from temporalio.api.operatorservice.v1 import AddSearchAttributesRequest
from temporalio.api.testservice.v1 import LockTimeSkippingRequest, UnlockTimeSkippingRequest
from temporalio.service import RPCError
from temporalio.testing import WorkflowEnvironment

from contract.names import DEFAULT_NAMESPACE, SEARCH_ATTRIBUTES


@pytest.fixture(scope="module", autouse=True)
async def _search_attributes(time_skipping_env: WorkflowEnvironment) -> None:
    await register_search_attributes(time_skipping_env)


async def register_search_attributes(env: WorkflowEnvironment) -> None:
    try:
        await env.client.operator_service.add_search_attributes(
            AddSearchAttributesRequest(
                namespace=DEFAULT_NAMESPACE,
                search_attributes={
                    name: IndexedValueType.INDEXED_VALUE_TYPE_KEYWORD for name in SEARCH_ATTRIBUTES
                },
            )
        )
    except RPCError as exc:  # already registered by another test module's fixture
        if "already" not in exc.message.lower():
            raise


@pytest.fixture(autouse=True)
async def _clock_held_after(request: pytest.FixtureRequest) -> Any:
    """After a test on its module's time-skipping server, the test's client must hold time
    again: a hold given back once too often leaves the clock free, jumping to each left-over
    run's timers (years ahead) under every later test of the module. The server refuses an
    unlock when nothing holds time; the check's own unlock is taken back at once."""
    yield
    defs = request.node._fixtureinfo.name2fixturedefs.get("time_skipping_env")
    if not defs or defs[-1].scope != "module":  # none, or the test's own server (gone by now)
        return
    service = request.node.funcargs["time_skipping_env"].client.test_service
    try:
        await service.unlock_time_skipping(UnlockTimeSkippingRequest())
    except RPCError as err:
        free = err
    else:
        free = None
    await service.lock_time_skipping(LockTimeSkippingRequest())  # held again either way
    assert free is None, (
        f"{request.node.nodeid} left the time-skipping server's clock free (every hold on it "
        f"given back: {free}); held again for the module's next test"
    )
