"""An auditor in Chromium at a person's pace: yesterday's stops in one click, a typed date range
on the audit log, and the filtered list downloaded as CSV."""

from __future__ import annotations

import csv
import datetime as dt

import pytest
from django.utils import timezone

from stopdesk.models import Event, StopRequest
from stopdesk.services.stop import task_request_stop
from tests.factories import make_task

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]
KEY_DELAY_MS = 90


def test_an_auditor_downloads_yesterdays_stops_and_filters_the_log_by_typed_dates(live_server, browser, shots, roles):
    for title in ("Refund run, Monday", "Vendor update, today"):
        task_request_stop(task_id=make_task(title).pk, actor="user:operator", dispatch=lambda ids: None)
    # Set-up, not history: the stop request row is not an audit event.
    yesterday = timezone.now() - dt.timedelta(days=1)
    StopRequest.objects.filter(task__title="Refund run, Monday").update(requested_at=yesterday)
    context = browser.new_context(viewport={"width": 1280, "height": 900}, accept_downloads=True)
    page = context.new_page()
    page.goto(f"{live_server.url}/admin/login/")
    page.get_by_label("Username").press_sequentially("admin", delay=KEY_DELAY_MS)
    page.get_by_label("Password").press_sequentially("admin-pass-123", delay=KEY_DELAY_MS)
    page.get_by_role("button", name="Log in").click()
    page.wait_for_url(f"{live_server.url}/admin/")

    page.get_by_role("link", name="Stop requests").click()
    page.wait_for_timeout(800)
    page.get_by_role("link", name="Yesterday", exact=True).click()
    page.wait_for_timeout(800)
    results = page.locator("#result_list").inner_text()
    assert "Refund run, Monday" in results and "Vendor update, today" not in results
    page.screenshot(path=shots / "admin-stops-yesterday.png", full_page=True)
    with page.expect_download() as download:
        page.get_by_role("link", name="Export CSV").click()
    with open(download.value.path(), newline="") as exported:
        rows = list(csv.DictReader(exported))
    assert [r["task_title"] for r in rows] == ["Refund run, Monday"]

    page.goto(f"{live_server.url}/admin/stopdesk/event/")
    today = timezone.localdate()
    page.get_by_label("From").press_sequentially(today.strftime("%m%d%Y"), delay=KEY_DELAY_MS)
    page.get_by_label("To (included)").press_sequentially(today.strftime("%m%d%Y"), delay=KEY_DELAY_MS)
    page.wait_for_timeout(600)
    page.get_by_role("button", name="Show").click()
    page.wait_for_load_state()
    assert f"at__gte={today.isoformat()}" in page.url and f"at__lte={today.isoformat()}" in page.url
    assert page.get_by_label("From").input_value() == today.isoformat()
    page.screenshot(path=shots / "admin-events-date-range.png", full_page=True)
    with page.expect_download() as download:
        page.get_by_role("link", name="Export JSON Lines").click()
    with open(download.value.path()) as exported:
        lines = exported.read().splitlines()
    # Today's events, and the two exports' own audit events (each written before its rows).
    assert len(lines) == Event.objects.filter(at__date=today).exclude(kind="export_began").count() + 2
    context.close()
