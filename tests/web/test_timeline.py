"""The stop timeline on the task page: a bar per child from start to outcome, coloured by its
latest known outcome, Stop as a vertical line, the items that crossed the boundary before it
marked and drawn first, then an even sample; a bar ends at the item's outcome, not at a person's
resolution; the same size on every poll."""

from __future__ import annotations

import re
import time

import pytest
from django.urls import reverse

from reconcile.services.review import item_resolve
from stopdesk.models import Task
from stopdesk.services.items import item_finish
from stopdesk.services.stop import task_request_stop
from stopdesk.services.transitions import item_transition
from stopdesk.states import ItemState, Kind
from stopdesk.views.timeline import LIMIT, task_timeline
from tests.factories import make_item, make_task
from tests.web.conftest import htmx
from tests.web.scenes import settle

pytestmark = pytest.mark.django_db
S = ItemState


def _svg(html: str) -> str:
    """The timeline's rows."""
    match = re.search(r'<div class="tl".*?<div class="tl-axis"', html, re.S)
    assert match, html
    return match[0]


def _stopped(task: Task) -> Task:
    task_request_stop(task_id=task.pk, actor="test", dispatch=lambda ids: None)
    return Task.objects.get(pk=task.pk)


def _timeline(task: Task):  # type: ignore[no-untyped-def]
    task = Task.objects.get(pk=task.pk)
    timeline = task_timeline(task, total=task.items.count())
    assert timeline is not None
    return timeline


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
    bars = re.findall(r'<li class="bar ([^"]+)" title="([^"]+)"', svg)
    assert len(bars) == 3
    by_id = {title.split(":")[0].split("#")[1]: (cls, title) for cls, title in bars}
    assert by_id[str(queued.pk)][0] == "cancelled never"
    assert by_id[str(running.pk)][0] == "cancelled crossed"
    assert by_id[str(flipped.pk)][0] == "completed crossed"  # its latest outcome, not the recorded one
    assert "crossed the boundary before Stop and was in flight when it came" in by_id[str(running.pk)][1]
    assert svg.count('class="stop-line"') == 3  # one stretch of the Stop line in each row
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
        sizes.add(svg.count('<li class="bar'))
        assert "stop-line" not in svg
    assert len(sizes) == 1


def test_a_task_with_no_children_has_no_timeline(as_user):
    task = make_task("Empty")
    html = as_user("operator").get(reverse("task-detail", args=[task.pk])).content.decode()
    assert 'id="timeline"' in html and 'class="tl"' not in html


def test_a_big_task_draws_the_items_in_flight_at_stop_first_then_an_even_sample_of_the_rest(as_user):
    task = make_task("Refund run")
    before = [make_item(task, state=S.COMPLETED, noun="refund", kind=Kind.EXTERNAL_OPERATION) for _ in range(100)]
    in_flight = [make_item(task, state=S.RUNNING, noun="refund", kind=Kind.EXTERNAL_OPERATION) for _ in range(30)]
    queued = [make_item(task, noun="refund", kind=Kind.EXTERNAL_OPERATION) for _ in range(10)]
    task = _stopped(task)
    for item in in_flight:
        settle(item.pk, S.CANCELLED)
    t = _timeline(task)
    assert t.total == 140 and t.crossed == 30 and len(t.bars) == LIMIT
    assert [b.item_id for b in t.in_flight] == [i.pk for i in in_flight]
    assert all(b.crossed for b in t.in_flight) and not any(b.crossed for b in t.sample)
    # The sample spreads over the other 110, from the first to the last registered.
    sampled = [b.item_id for b in t.sample]
    assert len(sampled) == LIMIT - 30
    assert sampled[0] == before[0].pk and sampled[-1] > before[-1].pk - 10
    assert any(b.item_id in {i.pk for i in queued} for b in t.sample)

    html = as_user("operator").get(reverse("task-detail", args=[task.pk])).content.decode()
    assert "30 had crossed the boundary before it and were still in flight" in html
    assert "60 of 140 are drawn: every one in flight at Stop, then an even sample of 30 of the other 110." in html


def test_a_resolved_item_ends_where_it_became_uncertain_not_at_the_resolution(roles):
    task = make_task("Crashed run")
    lost_before = make_item(task, state=S.RUNNING, noun="vendor update", kind=Kind.EXTERNAL_OPERATION)
    lost_after = make_item(task, state=S.RUNNING, noun="vendor update", kind=Kind.EXTERNAL_OPERATION)
    slow = make_item(task, state=S.RUNNING, noun="vendor update", kind=Kind.EXTERNAL_OPERATION)
    # Its heartbeat went stale before Stop: uncertain, not in flight, when Stop came.
    item_transition(item_id=lost_before.pk, to_state=S.UNCERTAIN, actor="system:reaper")
    task = _stopped(task)
    item_transition(item_id=lost_after.pk, to_state=S.UNCERTAIN, actor="system:reconciler")
    time.sleep(0.3)
    settle(slow.pk, S.CANCELLED)
    time.sleep(0.3)
    for item in (lost_before, lost_after):  # a reviewer resolves both, later
        item_resolve(
            item_id=item.pk, outcome=S.COMPLETED, note="Done", evidence="Vendor shows it", by=roles["reviewer"]
        )

    bars = {b.item_id: b for b in _timeline(task).bars}
    assert not bars[lost_before.pk].crossed  # resolved after Stop, yet it was not in flight at Stop
    assert bars[lost_after.pk].crossed and bars[slow.pk].crossed
    # Bars end at the outcome the system learnt: the resolution, 0.3 s after the last of them,
    # would stretch the resolved bars to the right edge.
    end = {pk: b.x + b.w for pk, b in bars.items()}
    assert end[lost_after.pk] < end[slow.pk] - 200 and end[lost_before.pk] < end[slow.pk] - 200
    assert bars[lost_after.pk].outcome == S.COMPLETED
    assert "until a reviewer resolved it" in bars[lost_after.pk].title
    assert _timeline(task).crossed == 2
