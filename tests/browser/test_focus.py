"""Where the keyboard's focus is, at every moment a person could act: in the reason field from the
instant the confirmation is on the page (not a settle delay later), and after Stop on the task's
new state, through the refreshes that follow."""

from __future__ import annotations

import re

import pytest

from tests.web.scenes import running_task

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]

# Records, for each time the confirmation's reason field appears in the page, where the focus was
# at that moment: a MutationObserver runs right after the swap's own task, before any timer.
WATCH_FOCUS_ON_ARRIVAL = """
window.__focusOnArrival = [];
new MutationObserver(() => {
  const field = document.getElementById('stop-reason');
  if (field && !field.__seen) {
    field.__seen = true;
    window.__focusOnArrival.push(document.activeElement ? document.activeElement.id : null);
  }
}).observe(document.body, {childList: true, subtree: true});
"""


@pytest.fixture
def task(roles, eager):  # type: ignore[no-untyped-def]
    from stopdesk.celery import app

    app.loader.import_default_modules()
    return running_task("Draft the Q3 supplier emails")


@pytest.fixture
def page(operator_page, task):  # type: ignore[no-untyped-def]
    """Signed in, with the task already there."""
    return operator_page


def test_the_reason_field_has_the_focus_the_moment_the_confirmation_arrives(live_server, page, task):
    page.goto(f"{live_server.url}/tasks/{task.pk}/")
    page.evaluate(WATCH_FOCUS_ON_ARRIVAL)
    page.get_by_role("link", name="Stop…").focus()
    page.keyboard.press("Enter")
    page.get_by_role("heading", name="Stop this task?").wait_for()
    assert page.evaluate("window.__focusOnArrival") == ["stop-reason"]
    # Typed at once, as a quick person would: no key lost.
    page.keyboard.type("no delay")
    assert page.get_by_label("Reason").input_value() == "no delay"


def test_after_stop_the_focus_is_on_the_new_state_and_stays_there_through_refreshes(live_server, page, task):
    page.goto(f"{live_server.url}/tasks/{task.pk}/")
    page.get_by_role("link", name="Stop…").click()
    page.get_by_label("Reason").press_sequentially("focus check", delay=80)
    page.get_by_role("button", name="Stop the task").click()
    page.locator("#stop-state", has_text=re.compile("Stopping|Stopped")).wait_for()
    assert page.evaluate("document.activeElement.id") == "stop-state"
    page.wait_for_timeout(2500)  # refreshes replace the state as the children settle
    assert page.evaluate("document.activeElement.id") == "stop-state"
    assert page.locator("#stop-state").get_attribute("tabindex") == "-1"
