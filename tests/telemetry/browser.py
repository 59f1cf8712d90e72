"""Headless Chromium for the dashboard tests: Debian's /usr/bin/chromium driven by Playwright's sync
API. Tests skip, naming the install command, where either is missing."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING

from tests.real_parts import missing

if TYPE_CHECKING:
    from playwright.sync_api import Browser

CHROMIUM = Path("/usr/bin/chromium")
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]


@contextmanager
def launch_chromium() -> Iterator[Browser]:
    """A headless Chromium, closed on exit; skips the test where Chromium or Playwright is missing."""
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        missing("playwright")
    if not CHROMIUM.exists():
        missing("chromium", f"{CHROMIUM} not found")
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS)
        try:
            yield browser
        finally:
            browser.close()
