"""The way out of a stale-version escalation, in real Chromium at a person's pace: a reviewer
proposes archiving a CRM record, someone else edits it on the sandbox CRM's own page, the
approval escalates, the approver compares the two versions and proposes again at the current
one, and a second approver approves it: the record is archived, once."""

from __future__ import annotations

import pytest

from reconcile.models import Compensation
from tests.browser.test_dashboard import _login
from tests.web.conftest import system_url
from tests.web.scenes import crm_effect

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]

KEY_DELAY_MS = 90  # a person typing at ordinary speed
PAUSE_MS = 700  # a person reading before the next click


@pytest.fixture
def record(roles, crm, eager):  # type: ignore[no-untyped-def]
    from stopdesk.celery import app

    app.loader.import_default_modules()  # the approved compensation's job runs eagerly here
    return crm_effect(system_url("crm"), name="ACME Ltd")


def _type(page, label: str, text: str) -> None:  # type: ignore[no-untyped-def]
    field = page.get_by_label(label)
    field.click()
    field.press_sequentially(text, delay=KEY_DELAY_MS)
    page.wait_for_timeout(PAUSE_MS)


def test_an_approver_finds_the_way_out_of_a_stale_version(live_server, browser, shots, record, crm):
    base = live_server.url
    context = browser.new_context(viewport={"width": 1280, "height": 900})
    page = context.new_page()
    page.set_default_timeout(15000)
    errors: list[str] = []
    # Our pages only: the sandbox CRM's page has no favicon, and its 404 is not ours.
    page.on(
        "console",
        lambda m: errors.append(m.text) if m.type == "error" and m.location.get("url", "").startswith(base) else None,
    )

    # A reviewer proposes archiving the record from the review queue.
    _login(page, base, "reviewer")
    page.goto(f"{base}/queue/")
    page.wait_for_timeout(PAUSE_MS)
    page.locator(f"#record-{record.pk}").get_by_role("link", name="Propose…").click()
    page.get_by_role("radio", name="Archive the record").wait_for()
    assert page.get_by_role("radio", name="Report only (nothing can be reversed)").count() == 0
    _type(page, "Note for the approver", "Created after Stop; the customer never asked.")
    page.get_by_role("button", name="Propose").click()
    page.get_by_text("Another person with the approver role must approve it.").first.wait_for()
    first = Compensation.objects.get(external_record=record)
    assert first.expected_version == "1"

    # Someone else edits the record on the CRM's own page: version 1 becomes 2.
    page.goto(system_url("crm") + "/")
    page.wait_for_timeout(PAUSE_MS)
    page.locator("tr", has_text=record.record_id).get_by_role("button", name="Edit as someone else").click()
    page.locator("tr", has_text=record.record_id).get_by_text("v2").wait_for()
    page.screenshot(path=shots / "way-out-1-crm-edited.png", full_page=True)

    # The approver approves; stopdesk reads version 2, writes nothing and escalates.
    _login(page, base, "approver")
    page.goto(f"{base}/compensations/{first.pk}/")
    page.wait_for_timeout(PAUSE_MS)
    _type(page, "Your password", "approver-pass-123")
    page.get_by_role("button", name="Approve and run").click()
    page.locator("#stale").wait_for()
    table = page.locator("#versions-compared")
    assert "1 field differs" in table.inner_text()
    changed = table.locator("tr.differs")
    assert changed.count() == 1 and "note" in changed.inner_text() and "(absent)" in changed.inner_text()
    assert page.get_by_role("button", name="Approve and run").count() == 0
    page.screenshot(path=shots / "way-out-2-escalated-versions.png", full_page=True)
    phone = browser.new_context(viewport={"width": 390, "height": 844}, device_scale_factor=2, is_mobile=True)
    mobile = phone.new_page()
    _login(mobile, base, "approver")
    mobile.goto(f"{base}/compensations/{first.pk}/#way-out")
    width = mobile.evaluate("document.documentElement.scrollWidth")
    mobile.screenshot(path=shots / "way-out-2-phone.png", full_page=True)
    phone.close()
    assert width <= 390, width  # the comparison fits a phone without sideways scrolling

    # ... and proposes again at version 2: a new proposal, which this approver cannot approve.
    _type(page, "Note for the approver", "Still created after Stop; archive it at v2.")
    page.get_by_role("button", name="Propose at version 2").click()
    page.get_by_text("Proposed again at version 2.").wait_for()
    second = Compensation.objects.filter(external_record=record).latest("pk")
    assert (second.expected_version, second.state) == ("2", "proposed")
    assert Compensation.objects.get(pk=first.pk).state == "rejected"
    assert page.get_by_role("button", name="Approve and run").count() == 0
    page.screenshot(path=shots / "way-out-3-proposed-again.png", full_page=True)

    # A second approver approves it; it runs at version 2 and archives the record.
    _login(page, base, "approver2")
    page.goto(f"{base}/queue/")
    page.locator(f"#compensation-{second.pk}").get_by_role("link", name="Review…").click()
    page.wait_for_timeout(PAUSE_MS)
    _type(page, "Your password", "approver2-pass-123")
    page.get_by_role("button", name="Approve and run").click()
    page.locator("#compensation-status", has_text="Done").wait_for()
    assert "Done: archive at version 2." in page.locator("#compensation-status").inner_text()
    assert crm.get(record.record_id)["status"] == "archived" and crm.counts.count("archive") == 1
    page.screenshot(path=shots / "way-out-4-done.png", full_page=True)
    context.close()
    assert not errors, errors
