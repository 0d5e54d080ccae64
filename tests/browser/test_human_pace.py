"""Stop at a person's pace, in real Chromium: the confirmation is opened, left open while the page
polls, a reason is typed key by key, and only then is the button clicked. The page refreshes every
second while the task runs; none of that may take the form, the focus or the typed text away."""

from __future__ import annotations

import re

import pytest

from stopdesk.models import StopRequest
from tests.browser.polls import count_polls, polls_seen, wait_for_polls
from tests.web.scenes import running_task

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]

KEY_DELAY_MS = 120  # a person typing at ordinary speed
POLLS_MS = 3500  # longer than three of the page's one-second polls


@pytest.fixture
def task(roles, eager):  # type: ignore[no-untyped-def]
    from stopdesk.celery import app

    app.loader.import_default_modules()  # the cancel job Stop dispatches runs eagerly here
    return running_task("Draft the Q3 supplier emails")


@pytest.fixture
def page(operator_page, task):  # type: ignore[no-untyped-def]
    """Signed in, with the task already there."""
    return operator_page


def _read_through_polls(page, polls: int = 3) -> None:  # type: ignore[no-untyped-def]
    """A person reads for a few seconds while the page refreshes: at least POLLS_MS, and until
    `polls` more refreshes have come back. On a busy machine a refresh answers later; what is
    tested is what the refreshes do to the page, so it waits for them rather than assume them."""
    seen = polls_seen(page)
    page.wait_for_timeout(POLLS_MS)
    wait_for_polls(page, seen + polls)


def _wait_stopping(page) -> None:  # type: ignore[no-untyped-def]
    page.locator("#stop-state", has_text=re.compile("Stopping|Stopped")).wait_for()


def _stopped_with(task, reason: str) -> StopRequest:  # type: ignore[no-untyped-def]
    stop = StopRequest.objects.get(task=task)
    assert stop.reason == reason
    return stop


def test_a_person_opens_waits_types_and_stops(live_server, page, task, shots):
    page.goto(f"{live_server.url}/tasks/{task.pk}/")
    count_polls(page)
    page.get_by_role("link", name="Stop…").click()
    page.get_by_role("heading", name="Stop this task?").wait_for()
    _read_through_polls(page)
    page.get_by_label("Reason").press_sequentially("Wrong supplier list", delay=KEY_DELAY_MS)
    page.wait_for_timeout(1500)  # a person reads what they typed; the page polls meanwhile
    assert page.get_by_label("Reason").input_value() == "Wrong supplier list"
    page.get_by_role("button", name="Stop the task").click()
    _wait_stopping(page)
    _stopped_with(task, "Wrong supplier list")


def test_the_confirmation_keeps_its_focus_and_text_for_a_minute(live_server, page, task):
    page.goto(f"{live_server.url}/tasks/{task.pk}/")
    count_polls(page)
    page.get_by_role("link", name="Stop…").click()
    page.get_by_role("heading", name="Stop this task?").wait_for()
    page.get_by_label("Reason").press_sequentially("Checking first", delay=KEY_DELAY_MS)
    page.wait_for_timeout(60_000)
    assert polls_seen(page) >= 40
    assert page.get_by_role("heading", name="Stop this task?").is_visible()
    assert page.evaluate("document.activeElement && document.activeElement.id") == "stop-reason"
    assert page.get_by_label("Reason").input_value() == "Checking first"
    assert not StopRequest.objects.filter(task=task).exists()


def test_keyboard_only_at_human_pace(live_server, page, task):
    page.goto(f"{live_server.url}/tasks/{task.pk}/")
    count_polls(page)
    page.get_by_role("link", name="Stop…").focus()
    page.keyboard.press("Enter")
    page.get_by_role("heading", name="Stop this task?").wait_for()
    assert page.evaluate("document.activeElement.id") == "stop-reason"
    _read_through_polls(page)
    assert page.evaluate("document.activeElement && document.activeElement.id") == "stop-reason"
    page.keyboard.type("keyboard only", delay=KEY_DELAY_MS)
    page.wait_for_timeout(1200)
    page.keyboard.press("Tab")
    page.wait_for_timeout(1200)  # focus on the button through a poll or two
    assert page.evaluate("document.activeElement && document.activeElement.innerText").strip() == "Stop the task"
    page.keyboard.press("Enter")
    _wait_stopping(page)
    _stopped_with(task, "keyboard only")


def test_the_full_stop_page_works_at_human_pace(live_server, page, task):
    page.goto(f"{live_server.url}/tasks/{task.pk}/stop/")
    count_polls(page)
    page.get_by_role("heading", name="Stop this task?").wait_for()
    _read_through_polls(page)
    page.get_by_label("Reason").press_sequentially("From the stop page", delay=KEY_DELAY_MS)
    page.wait_for_timeout(1500)
    page.get_by_role("button", name="Stop the task").click()
    _wait_stopping(page)
    _stopped_with(task, "From the stop page")


def test_live_regions_change_only_when_their_content_does(live_server, page, task):
    """A screen reader announces a live region's change; a poll that brings the same words must
    not touch it, and a real change is announced once."""
    from stopdesk.models import WorkItem
    from stopdesk.states import ItemState
    from tests.web.scenes import settle

    page.goto(f"{live_server.url}/tasks/{task.pk}/")
    count_polls(page)
    page.evaluate(
        """window.__mutations = 0;
        new MutationObserver(ms => { window.__mutations += ms.length })
          .observe(document.querySelector('.summary-live'), {childList: true, subtree: true, characterData: true});
        window.__state = document.getElementById('stop-state');"""
    )
    _read_through_polls(page)
    assert page.evaluate("window.__mutations") == 0
    assert page.evaluate("document.getElementById('stop-state') === window.__state")
    export = WorkItem.objects.get(task=task, noun="export")
    settle(export.pk, ItemState.COMPLETED)
    page.locator("#summary", has_text="Running: two of four items finished.").wait_for()
    changed = page.evaluate("window.__mutations")
    assert 1 <= changed <= 2  # one replacement of the summary (its removal and its insertion)
    page.evaluate("window.__summary = document.getElementById('summary')")
    _read_through_polls(page)
    assert page.evaluate("window.__mutations") == changed  # announced once, not again on each poll
    assert page.evaluate("document.getElementById('summary') === window.__summary")
