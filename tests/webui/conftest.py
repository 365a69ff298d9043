"""Fixtures of the Web UI tests: `_browser_ok` (skip, or fail under SICKBAY_REQUIRE_BROWSER=1,
naming how to install what is missing) and `page`, one headless Chromium page per module."""

from __future__ import annotations

import os
from collections.abc import AsyncIterator
from typing import Any

import pytest

from tests.webui.browser import CHROMIUM, CHROMIUM_ARGS, REQUIRE_ENV, browser_missing


@pytest.fixture(scope="module")
def _browser_ok() -> None:
    missing = browser_missing()
    if missing is None:
        return
    if os.environ.get(REQUIRE_ENV, "").lower() in ("1", "true", "yes"):
        pytest.fail(f"{REQUIRE_ENV} is set but {missing}")
    pytest.skip(missing)


@pytest.fixture(scope="module")
async def page(_browser_ok: None) -> AsyncIterator[Any]:
    from playwright.async_api import async_playwright

    async with async_playwright() as pw:
        # A fresh profile per launch (playwright gives each browser its own temporary one).
        browser = await pw.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        try:
            yield await (await browser.new_context()).new_page()
        finally:
            await browser.close()
