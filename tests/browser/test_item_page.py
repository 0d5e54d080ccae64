"""The item page in real Chromium at a person's pace: a reviewer follows an uncertain tool call from
its task to its page and reads what is needed to decide, on a desktop and on a 390 px phone; then
reports a manual item done before it turns uncertain. Screenshots go to test-artifacts/screenshots/."""

from __future__ import annotations

import pytest

from stopdesk.models import WorkItem
from stopdesk.states import ItemState
from tests.browser.test_dashboard import _login
from tests.web.test_item_page import manual_after_stop, uncertain_remote_tool

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]
S = ItemState


def _overflow(page) -> int:  # type: ignore[no-untyped-def]
    """How far the page is wider than its window (0: nothing to scroll sideways)."""
    return int(page.evaluate("document.documentElement.scrollWidth - window.innerWidth"))


def test_a_reviewer_reads_an_uncertain_tool_call_on_its_page(live_server, browser, shots, roles):
    item = uncertain_remote_tool()
    base = live_server.url
    for width, height, name in ((1280, 900, "12-item-page"), (390, 844, "12-item-page-390")):
        context = browser.new_context(viewport={"width": width, "height": height})
        page = context.new_page()
        errors: list[str] = []
        page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
        _login(page, base, "reviewer")
        page.goto(f"{base}/tasks/{item.task_id}/")
        page.wait_for_timeout(400)  # a person finds the row
        if width > 390:
            # The row's evidence trail reads as fields too.
            page.locator(f"#trail-{item.pk} summary").click()
            trail = page.locator(f"#trail-{item.pk}").inner_text()
            assert "Uncertain because" in trail and "{" not in trail
            page.screenshot(path=shots / "12-task-row-trail.png", full_page=True)
        page.get_by_role("link", name="Upload invoices to the portal").click()
        page.wait_for_url(f"{base}/items/{item.pk}/")
        assert page.get_by_role("heading", name="Where it stands").is_visible()
        assert "Outcome unknown; investigate." in page.locator(".standing").inner_text()
        what = page.locator("section", has=page.get_by_role("heading", name="What it is")).inner_text()
        assert "upload_file" in what and "/exports/invoices-q3.csv" in what and "mcp-req-42" in what
        assert page.get_by_role("link", name=f"Resolve #{item.pk}…").is_visible()
        assert _overflow(page) <= 0, f"the page scrolls sideways at {width} px"
        page.screenshot(path=shots / f"{name}.png", full_page=True)
        assert not errors, errors
        context.close()


def test_a_reviewer_reports_a_manual_item_done_before_it_turns_uncertain(live_server, browser, shots, roles):
    item = manual_after_stop()
    base = live_server.url
    context = browser.new_context(viewport={"width": 1280, "height": 900})
    page = context.new_page()
    _login(page, base, "reviewer")
    page.goto(f"{base}/tasks/{item.task_id}/")
    row = page.locator(f"#item-{item.pk}")
    assert "report within" in row.inner_text()
    row.get_by_role("link", name=f"Details of letter #{item.pk}").click()
    page.wait_for_url(f"{base}/items/{item.pk}/")
    assert "turns uncertain at" in page.locator(".standing").inner_text()
    page.get_by_label("Done: it happened").check()
    page.wait_for_timeout(300)
    page.get_by_role("textbox", name="Evidence").press_sequentially("Royal Mail receipt 88412", delay=40)
    page.wait_for_timeout(300)
    page.screenshot(path=shots / "12-item-report.png", full_page=True)
    page.get_by_role("button", name=f"Report #{item.pk}").click()
    page.wait_for_url(f"{base}/items/{item.pk}/")
    assert f"Reported letter #{item.pk} as done." in page.locator(".messages").inner_text()
    assert "Recorded completed: reported done." in page.locator(".standing").inner_text()
    item.refresh_from_db()
    assert item.state == S.COMPLETED and WorkItem.objects.get(pk=item.pk).evidence["report"]["by"] == "reviewer"
    context.close()
