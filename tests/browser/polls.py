"""The dashboard's refreshes, counted in the page, for tests that read a page while it refreshes.

Waited for with a loop of `page.evaluate`, never `page.wait_for_function`: Playwright evaluates a
waited-for predicate with the page's own `eval`, which the dashboard's CSP (`script-src 'self'`)
forbids, so that wait fails whenever its first check comes back false."""

from __future__ import annotations

import time
from typing import Any


def count_polls(page: Any) -> None:
    """From now on, `window.__polls` counts the refreshes that came back."""
    page.evaluate(
        "window.__polls = 0; document.body.addEventListener('htmx:afterRequest', () => { window.__polls += 1 })"
    )


def polls_seen(page: Any) -> int:
    return int(page.evaluate("window.__polls || 0"))


def wait_for_polls(page: Any, n: int, *, timeout_s: float = 20.0) -> None:
    """Until `n` refreshes have come back (on a busy machine a refresh answers later)."""
    deadline = time.monotonic() + timeout_s
    while polls_seen(page) < n:
        if time.monotonic() > deadline:
            raise AssertionError(f"{polls_seen(page)} refreshes came back in {timeout_s:.0f} s, not {n}")
        page.wait_for_timeout(100)
