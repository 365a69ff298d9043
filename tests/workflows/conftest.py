"""Workflow-test fixtures: the time-skipping server knows Sickbay's search attributes.

The Java test server implements AddSearchAttributes but not ListSearchAttributes, so
worker.temporal.ensure_search_attributes cannot be used there; register them directly.
"""

from __future__ import annotations

import pytest
from temporalio.api.enums.v1 import IndexedValueType
from temporalio.api.operatorservice.v1 import AddSearchAttributesRequest
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
