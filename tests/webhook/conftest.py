"""Fixtures for the webhook tests: `served`, the webhook under a real uvicorn server on a free
loopback port, token auth on, talking to the session's Temporal dev server on its own task
queue (no worker polls it).
"""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator

import httpx
import pytest
from temporalio.testing import WorkflowEnvironment

from tests.webhook.helpers import TOKEN, Served, serve, settings_for
from worker.settings import WebhookSettings
from worker.webhook.app import create_app


@pytest.fixture(scope="module")
async def served(dev_env: WorkflowEnvironment) -> AsyncIterator[Served]:
    """The webhook under uvicorn, token auth on, its own task queue."""
    task_queue = f"webhook-test-{uuid.uuid4().hex[:8]}"
    settings = settings_for(dev_env, task_queue)
    app = create_app(
        settings,
        dev_env.client,
        webhook=WebhookSettings(webhook_token=TOKEN, webhook_max_body_bytes=256 * 1024),
    )
    async with serve(app) as url:
        async with httpx.AsyncClient(base_url=url, timeout=30) as http:
            yield Served(url=url, client=dev_env.client, settings=settings, http=http)
