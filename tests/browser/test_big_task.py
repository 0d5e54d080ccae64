"""A big stopped task as a person sees it, in real Chromium on a desktop and at 390 px: the summary
leads with what needs a person, the timeline draws the items in flight at Stop first and stays
legible on a phone, and the page does not move while its live refresh tells items settling.
Screenshots go to test-artifacts/screenshots/."""

from __future__ import annotations

import re

import pytest

from stopdesk.models import Task
from stopdesk.services.stop import task_request_stop
from stopdesk.states import ItemState, Kind
from tests.browser.test_dashboard import _login
from tests.factories import make_external_effect, make_item, make_task
from tests.web.scenes import settle

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]
S = ItemState

# Layout shifts the browser itself reports (the Layout Instability API), summed as CLS does.
WATCH_SHIFTS = """
window.__shift = 0;
new PerformanceObserver(list => {
  for (const e of list.getEntries()) { if (!e.hadRecentInput) window.__shift += e.value; }
}).observe({type: 'layout-shift', buffered: false});
window.__polls = 0;
document.body.addEventListener('htmx:afterRequest', () => { window.__polls += 1 });
"""


@pytest.fixture
def refund_run(roles):  # type: ignore[no-untyped-def]
    """140 children: refunds and emails done before Stop, 30 refunds in flight, 10 queued, 12
    gone uncertain."""
    task = make_task("Refund the March double charges")
    for _ in range(60):
        make_item(task, state=S.COMPLETED, noun="refund", kind=Kind.EXTERNAL_OPERATION)
    for _ in range(16):
        make_external_effect(task, noun="email", system="outbox", effect="sent", reversible=False, version="")
    for _ in range(12):
        make_external_effect(task, noun="vendor record", system="crm", effect="updated", reversible=True)
    in_flight = [make_item(task, state=S.RUNNING, noun="refund", kind=Kind.EXTERNAL_OPERATION) for _ in range(30)]
    for _ in range(12):
        make_item(task, state=S.UNCERTAIN, noun="refund", kind=Kind.EXTERNAL_OPERATION)
    for _ in range(10):
        make_item(task, noun="refund", kind=Kind.EXTERNAL_OPERATION)
    task_request_stop(task_id=task.pk, actor="operator", dispatch=lambda ids: None)
    return Task.objects.get(pk=task.pk), in_flight


def _box(page, selector: str) -> tuple[float, float]:  # type: ignore[no-untyped-def]
    # Measured in the page, relative to the document: a poll may be swapping the element right
    # when Playwright asks for its box.
    top, height = page.evaluate(
        f"(() => {{ const r = document.querySelector('{selector}').getBoundingClientRect();"
        " return [r.top + window.scrollY, r.height]; })()"
    )
    return round(top, 1), round(height, 1)


def _wait_polls(page, n: int) -> None:  # type: ignore[no-untyped-def]
    """n refreshes seen, or the page stopped refreshing because everything settled. A loop, not
    wait_for_function: the page's CSP forbids evaluating strings."""
    for _ in range(150):  # 30 s: on a busy machine a poll of this page can take a second or two
        if page.evaluate("window.__polls") >= n or page.locator("#stop-state", has_text="Stopped").count():
            page.wait_for_timeout(300)
            return
        page.wait_for_timeout(200)
    raise AssertionError("the page neither refreshed nor settled")


@pytest.mark.parametrize("width", [1280, 390])
def test_a_big_stopped_task_reads_right_and_holds_still_while_it_settles(
    live_server, browser, shots, refund_run, width
):
    task, in_flight = refund_run
    context = browser.new_context(viewport={"width": width, "height": 900})
    page = context.new_page()
    page.set_default_timeout(10000)
    _login(page, live_server.url, "operator")
    page.goto(f"{live_server.url}/tasks/{task.pk}/")
    page.wait_for_load_state("networkidle")
    page.evaluate(WATCH_SHIFTS)

    summary = page.locator("#summary").inner_text()
    first = summary.split(". ")[1]
    assert first == "12 refunds with unknown outcome; review required", summary
    assert "still being checked" in summary
    rows = page.locator("#timeline .tl-rows li")
    assert rows.count() == 60
    assert all("crossed" in (rows.nth(i).get_attribute("class") or "") for i in range(30))
    # Legible: the names are text at a readable size, on a phone too.
    size = page.evaluate("parseFloat(getComputedStyle(document.querySelector('.tl-name')).fontSize)")
    assert size >= 11.5
    assert page.evaluate("document.documentElement.scrollWidth") <= width  # nothing runs off the side
    page.screenshot(path=shots / f"big-task-{width}-stopping.png", full_page=True)
    page.screenshot(path=shots / f"big-task-{width}-stopping-top.png")

    timeline = _box(page, "#timeline")
    # The items in flight settle, ten at a time, while the page refreshes itself.
    for batch in range(3):
        polls = page.evaluate("window.__polls")
        for item in in_flight[batch * 10 : batch * 10 + 10]:
            settle(item.pk, S.CANCELLED)  # a no-op for one the reconciler settled first
        _wait_polls(page, polls + 2)
        assert _box(page, "#timeline") == timeline, f"the timeline moved after refresh {batch + 1}"

    page.locator("#stop-state", has_text="Stopped").wait_for()
    assert "still being checked" not in page.locator("#summary").inner_text()
    assert page.evaluate("window.__shift") == 0
    page.screenshot(path=shots / f"big-task-{width}-stopped.png", full_page=True)
    page.screenshot(path=shots / f"big-task-{width}-stopped-top.png")
    page.locator("#timeline").screenshot(path=shots / f"big-task-{width}-timeline.png")
    assert re.search(r"30 had crossed the boundary", page.locator("#timeline-desc").inner_text())

    # What needs a person, read-only for the operator, and the same count on the task list.
    review = page.locator(".review-state")
    assert review.locator("h2").inner_text() == "Needs a person: 24 items"
    review.screenshot(path=shots / f"big-task-{width}-needs-a-person.png")
    page.get_by_role("link", name="Tasks", exact=True).first.click()
    page.locator("#task-table").wait_for()
    assert "24 items need review" in page.locator("#task-table").inner_text()
    page.get_by_role("link", name="1 task needs review").click()
    page.wait_for_url(re.compile(r"status=review"))
    page.screenshot(path=shots / f"big-task-{width}-list-needs-review.png")
    context.close()
