"""The reversal list in real Chromium at a person's pace: effects completed before Stop wait in
their own section; a reviewer ticks two, types one note and accepts them as they are, and puts
the third on the reversal list."""

from __future__ import annotations

import pytest

from reconcile.models import RecordDecision
from stopdesk.models import Event
from tests.browser.test_dashboard import _login
from tests.web.conftest import system_url
from tests.web.scenes import crm_effect

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]

KEY_DELAY_MS = 90
PAUSE_MS = 600


@pytest.fixture
def effects(roles, crm):  # type: ignore[no-untyped-def]
    before = [crm_effect(system_url("crm"), name=f"Vendor {n}", before_stop=True) for n in range(3)]
    after = crm_effect(system_url("crm"), name="Created after Stop")
    return before, after


def test_a_reviewer_accepts_two_effects_with_one_note_and_flags_the_third(live_server, browser, shots, effects):
    (first, second, third), after = effects
    base = live_server.url
    context = browser.new_context(viewport={"width": 1280, "height": 900})
    page = context.new_page()
    page.set_default_timeout(15000)
    _login(page, base, "reviewer")
    page.goto(f"{base}/queue/#before-stop")
    section = page.locator("#before-stop")
    assert "Completed before Stop (3)" in section.get_by_role("heading").inner_text()
    assert page.locator("#reversals").locator(f"#record-{after.pk}").count() == 1
    page.screenshot(path=shots / "reversals-1-before-stop.png", full_page=True)

    for record in (first, second):
        page.wait_for_timeout(PAUSE_MS)
        section.get_by_label(f"Choose crm {record.record_id}").check()
    note = section.get_by_label("Why they can stay")
    note.click()
    note.press_sequentially("Vendor updates the operator asked for before Stop.", delay=KEY_DELAY_MS)
    page.wait_for_timeout(PAUSE_MS)
    section.get_by_role("button", name="Accept the chosen ones").click()
    page.get_by_text("Accepted 2 effects as they are.").wait_for()
    accepted = RecordDecision.objects.filter(kind="accepted")
    assert sorted(d.external_record_id for d in accepted) == sorted([first.pk, second.pk])
    assert Event.objects.filter(kind="record_accepted").count() == 2

    page.wait_for_timeout(PAUSE_MS)
    page.locator(f"#record-{third.pk}").get_by_role("button", name="Needs reversal").click()
    page.get_by_text(f"Put crm {third.record_id} on the reversal list.").wait_for()
    reversals = page.locator("#reversals")
    assert reversals.locator(f"#record-{third.pk}").count() == 1
    assert "completed before Stop" in reversals.locator(f"#record-{third.pk}").inner_text()
    assert page.locator("#before-stop").count() == 0  # nothing left undecided there
    page.screenshot(path=shots / "reversals-2-after-decisions.png", full_page=True)

    phone = browser.new_context(viewport={"width": 390, "height": 844}, device_scale_factor=2, is_mobile=True)
    mobile = phone.new_page()
    _login(mobile, base, "reviewer")
    mobile.goto(f"{base}/queue/#reversals")
    mobile.screenshot(path=shots / "reversals-3-phone.png", full_page=True)
    phone.close()
    context.close()
