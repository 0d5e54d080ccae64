"""Chromium through Playwright, against pytest-django's live server. Debian's Chromium, never a
downloaded one."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

# Playwright's sync API keeps an event loop on the main thread; the test's own database calls
# are still synchronous, so tell Django not to refuse them.
os.environ.setdefault("DJANGO_ALLOW_ASYNC_UNSAFE", "true")

CHROMIUM = "/usr/bin/chromium"
ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
]
ARTIFACTS = Path(__file__).resolve().parents[2] / "test-artifacts" / "screenshots"


# Package scope, not session: Playwright's sync API keeps an asyncio loop marked running on the
# main thread while it is open, and every later test that calls asyncio.run() would fail.
@pytest.fixture(scope="package")
def browser() -> Iterator[object]:
    # Without Chromium the tests marked browser are skipped (or refused in CI) at collection: tests/conftest.py.
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=ARGS, headless=True)
        yield browser
        browser.close()


@pytest.fixture
def shots() -> Path:
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    return ARTIFACTS


# The page tests' fixtures: the cast in their roles, the sandbox CRM, eager Celery.
from tests.web.conftest import _fast_passwords, _fresh_cache, crm, crm_server, eager, roles  # noqa: E402, F401


@pytest.fixture
def operator_page(live_server, browser, roles):  # type: ignore[no-untyped-def]  # noqa: F811 (the fixture)
    """A desktop browser page signed in as the operator."""
    from tests.browser.test_dashboard import _login

    context = browser.new_context(viewport={"width": 1280, "height": 900})
    page = context.new_page()
    page.set_default_timeout(10000)
    _login(page, live_server.url, "operator")
    yield page
    context.close()
