"""A reviewer asks for one email per item, at a person's pace in real Chromium, on a phone-width
screen: the choice is explained where it is made, and it is kept."""

from __future__ import annotations

import pytest

from stopdesk.notify.models import EmailPreference
from tests.browser.test_dashboard import _login

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]


def test_a_reviewer_asks_for_one_email_per_item_besides_the_digest(live_server, browser, roles, shots):
    context = browser.new_context(viewport={"width": 390, "height": 844})
    page = context.new_page()
    page.set_default_timeout(10000)
    try:
        _login(page, live_server.url, "reviewer")
        page.goto(f"{live_server.url}/notifications/email/")
        per_item = page.get_by_label("Also send me one email per item")
        assert not per_item.is_checked()
        page.get_by_text("one digest per task").wait_for()
        page.wait_for_timeout(1500)  # a person reads what the box means
        per_item.click()
        page.wait_for_timeout(600)
        page.get_by_role("button", name="Save").click()
        page.wait_for_load_state()
        assert page.get_by_label("Also send me one email per item").is_checked()
        assert page.evaluate("document.documentElement.scrollWidth") <= 390  # nothing runs off the screen
        page.screenshot(path=str(shots / "email-choices-per-item-390.png"), full_page=True)
    finally:
        context.close()
    choice = EmailPreference.objects.get(user=roles["reviewer"])
    assert choice.per_item and "item_uncertain" in choice.topics  # the role's topics, kept as chosen
