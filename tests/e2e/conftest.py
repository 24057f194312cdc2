"""Fixtures shared by the browser suites (tests/e2e/test_dashboard.py, test_console_pages.py,
test_setup_pages.py)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from tests.e2e.dashboard_browser import CHROMIUM, CHROMIUM_ARGS


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    """One Chromium per module (Playwright starts on first use: modules without a browser never load it)."""
    from playwright.sync_api import sync_playwright

    with sync_playwright() as playwright:
        chromium = playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        yield chromium
        chromium.close()
