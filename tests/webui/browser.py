"""What the Web UI tests share: Debian's Chromium, its flags, and how long a page may take."""

from __future__ import annotations

import os
import shutil

CHROMIUM = os.environ.get("SICKBAY_CHROMIUM", "/usr/bin/chromium")
REQUIRE_ENV = "SICKBAY_REQUIRE_BROWSER"
# The flags for a quiet, self-contained headless run (no network calls of its own).
CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
WAIT_MS = 30_000  # generous on a busy 2-core machine; pages answer within a second or two


def browser_missing() -> str | None:
    if shutil.which(CHROMIUM) is None:
        return f"no Chromium at {CHROMIUM}: `apt-get install chromium`"
    try:
        import playwright.async_api  # noqa: F401
    except ImportError:
        return "playwright is not installed: `make venv` (dev extra)"
    return None
