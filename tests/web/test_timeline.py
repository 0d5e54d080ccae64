"""The stop timeline on the task page: a bar per child from start to outcome, coloured by its
latest known outcome, Stop as a vertical line, the items that crossed the boundary before it
marked; the same size on every poll."""

from __future__ import annotations

import re

import pytest
from django.urls import reverse

from stopdesk.services.items import item_finish
from stopdesk.services.stop import task_request_stop
from stopdesk.states import ItemState, Kind
from tests.factories import make_item, make_task
from tests.web.conftest import htmx
from tests.web.scenes import settle

pytestmark = pytest.mark.django_db
S = ItemState


def _svg(html: str) -> str:
    match = re.search(r"<svg class=\"timeline-svg\".*?</svg>", html, re.S)
    assert match, html
    return match[0]


def test_the_timeline_draws_each_child_the_stop_line_and_what_crossed_the_boundary(as_user):
    task = make_task("Timeline")
    queued = make_item(task, noun="draft")
    running = make_item(task, state=S.RUNNING, noun="export", kind=Kind.LOCAL_WORKER)
    flipped = make_item(task, state=S.RUNNING, noun="reply")
    task_request_stop(task_id=task.pk, actor="test", dispatch=lambda ids: None)
    settle(running.pk, S.CANCELLED)
    settle(flipped.pk, S.CANCELLED)
    item_finish(item_id=flipped.pk, succeeded=True, actor="test")  # a late result: completed after all
    svg = _svg(as_user("operator").get(reverse("task-detail", args=[task.pk])).content.decode())
    bars = re.findall(r'<g class="bar ([^"]+)">\s*<title>([^<]+)</title>', svg)
    assert len(bars) == 3
    by_id = {title.split(":")[0].split("#")[1]: (cls, title) for cls, title in bars}
    assert by_id[str(queued.pk)][0] == "cancelled never"
    assert by_id[str(running.pk)][0] == "cancelled crossed"
    assert by_id[str(flipped.pk)][0] == "completed crossed"  # its latest outcome, not the recorded one
    assert "crossed the boundary before Stop and was in flight when it came" in by_id[str(running.pk)][1]
    assert svg.count('class="stop-line"') == 1 and ">Stop</text>" in svg
    assert (
        "2 had crossed the boundary before it and were still in flight"
        in as_user("operator").get(reverse("task-detail", args=[task.pk])).content.decode()
    )
    assert "style=" not in svg  # the CSP allows no inline style; presentation attributes and classes only


def test_the_timeline_keeps_its_size_between_polls_and_draws_no_stop_line_before_stop(as_user):
    task = make_task("Still running")
    make_item(task, state=S.RUNNING, noun="export", kind=Kind.LOCAL_WORKER)
    make_item(task, state=S.COMPLETED)
    client = as_user("operator")
    sizes = set()
    for _ in range(2):
        svg = _svg(client.get(reverse("task-detail", args=[task.pk]), **htmx("live")).content.decode())
        sizes.add(re.search(r'viewBox="([^"]+)"', svg)[1])
        assert "stop-line" not in svg
    assert len(sizes) == 1


def test_a_task_with_no_children_has_no_timeline(as_user):
    task = make_task("Empty")
    html = as_user("operator").get(reverse("task-detail", args=[task.pk])).content.decode()
    assert 'id="timeline"' in html and "timeline-svg" not in html
