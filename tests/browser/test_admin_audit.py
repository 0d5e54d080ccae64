"""The audit pages a newcomer stumbled over, in Chromium at 1280 px: the task timeline fits the
window, events are newest first, event data reads as JSON, tasks show their id beside the title,
and the model list names the idempotency keys properly."""

from __future__ import annotations

import json

import pytest

from stopdesk.models import Event
from stopdesk.services.stop import task_request_stop
from tests.web.scenes import running_task

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]


def test_the_admin_audit_pages_read_well_at_1280_px(live_server, browser, shots, roles):
    task = running_task("Invoice analysis: ACME batch 42")
    running_task("Invoice analysis: ACME batch 42")  # demo runs share a title
    task_request_stop(task_id=task.pk, actor="user:operator", dispatch=lambda ids: None, reason="A long reason " * 30)
    context = browser.new_context(viewport={"width": 1280, "height": 900})
    page = context.new_page()
    page.goto(f"{live_server.url}/admin/login/")
    page.get_by_label("Username").fill("admin")
    page.get_by_label("Password").fill("admin-pass-123")
    page.get_by_role("button", name="Log in").click()
    page.wait_for_url(f"{live_server.url}/admin/")
    assert page.get_by_role("link", name="API idempotency keys").is_visible()

    page.goto(f"{live_server.url}/admin/stopdesk/task/{task.pk}/timeline/")
    page.screenshot(path=shots / "admin-timeline.png", full_page=True)
    assert page.evaluate("document.documentElement.scrollWidth") <= 1280
    first, last = Event.objects.filter(task=task).order_by("at", "id")[:: len(Event.objects.filter(task=task)) - 1]
    rows = page.locator("#content-main tbody tr")
    assert rows.first.locator("td").nth(1).inner_text() == last.kind  # newest first
    assert rows.last.locator("td").nth(1).inner_text() == first.kind
    data = page.locator("pre.event-data").first.inner_text()
    json.loads(data)  # JSON a person can read (and a program parse), not a Python dict

    page.goto(f"{live_server.url}/admin/stopdesk/event/")
    assert f"#{task.pk} Invoice analysis: ACME batch 42" in page.locator("#result_list").inner_text()
    event = Event.objects.filter(task=task).exclude(data={}).first()
    assert event is not None
    page.goto(f"{live_server.url}/admin/stopdesk/event/{event.pk}/change/")
    shown = page.locator("pre.event-data").inner_text()
    assert json.loads(shown) == event.data and shown.startswith("{\n")
    context.close()
