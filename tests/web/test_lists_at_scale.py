"""Lists whose cost must not grow with history: capped counts, bounded filters, indexed searches.
The figures at ten million rows are in bench/bench_scale.py; these check the behaviour."""

from __future__ import annotations

import pytest
from django.db import connection
from django.test import Client
from django.test.utils import CaptureQueriesContext
from django.urls import reverse

from stopdesk import paging
from stopdesk.models import Event, WorkItem
from stopdesk.paging import CappedCount, CappedPaginator, capped_count
from stopdesk.states import ItemState as S
from tests.factories import make_item, make_task

pytestmark = pytest.mark.django_db


def test_a_count_is_exact_up_to_its_cap_and_says_so_beyond():
    task = make_task()
    for _ in range(6):
        make_item(task)
    items = WorkItem.objects.filter(task=task)
    assert capped_count(items, 6) == 6
    assert not isinstance(capped_count(items, 6), CappedCount)
    beyond = capped_count(items, 5)
    assert isinstance(beyond, CappedCount)
    assert str(beyond) == "5+"
    with CaptureQueriesContext(connection) as queries:
        capped_count(items, 5)
    assert "LIMIT 6" in queries.captured_queries[0]["sql"]


def test_the_paginator_stops_at_its_cap():
    task = make_task()
    for _ in range(7):
        make_item(task)

    class Small(CappedPaginator):
        cap = 4

    pages = Small(WorkItem.objects.filter(task=task).order_by("id"), 2)
    assert str(pages.count) == "4+"
    assert pages.num_pages == 2


def test_the_admin_shows_a_capped_count_and_never_counts_the_whole_table(roles, monkeypatch):
    from stopdesk.admin_scale import ReadOnlyAdmin

    class Small(paging.AdminPaginator):
        cap = 3

    monkeypatch.setattr(ReadOnlyAdmin, "paginator", Small)
    task = make_task()
    for _ in range(3):
        make_item(task, state=S.COMPLETED)  # three events each, and the task's own
    client = Client()
    client.force_login(roles["admin"])
    with CaptureQueriesContext(connection) as queries:
        page = client.get(reverse("admin:stopdesk_event_changelist")).content.decode()
    assert "3+ events" in page
    counts = [q["sql"] for q in queries.captured_queries if "COUNT(" in q["sql"].upper()]
    assert counts and all("LIMIT 4" in sql for sql in counts), counts


def test_admin_filters_list_recent_values_and_filter_by_any(roles):
    task = make_task()
    item = make_item(task, state=S.COMPLETED, mechanism="openai")
    client = Client()
    client.force_login(roles["admin"])
    page = client.get(reverse("admin:stopdesk_workitem_changelist")).content.decode()
    assert "?mechanism=openai" in page
    page = client.get(reverse("admin:stopdesk_workitem_changelist") + "?mechanism=openai").content.decode()
    assert f">{item.pk}<" in page
    page = client.get(reverse("admin:stopdesk_event_changelist") + "?kind=item_started").content.decode()
    assert page.count("item_started") >= 2  # the filter's choice and the row


def test_admin_search_by_id_finds_through_indexes(roles):
    task = make_task("first")
    other = make_task("second")
    item = make_item(task)
    make_item(other)
    client = Client()
    client.force_login(roles["admin"])
    url = reverse("admin:stopdesk_event_changelist")
    response = client.get(url, {"q": str(task.pk)})
    assert response.status_code == 200
    shown = response.context["cl"].result_list
    assert {e.task_id for e in shown} == {task.pk}
    assert len(shown) == Event.objects.filter(task=task).count()
    response = client.get(reverse("admin:stopdesk_workitem_changelist"), {"q": "not a number"})
    assert response.status_code == 200
    assert list(response.context["cl"].result_list) == []
    response = client.get(reverse("admin:stopdesk_workitem_changelist"), {"q": str(item.pk)})
    assert item in response.context["cl"].result_list


def test_the_review_queue_counts_exactly_up_to_its_cap(as_user, monkeypatch):
    task = make_task()
    for _ in range(4):
        make_item(task, state=S.UNCERTAIN)
    monkeypatch.setattr("stopdesk.views.selectors.QUEUE_CAP", 3)
    from stopdesk.views.selectors import review_queue

    assert str(review_queue({}, only="uncertain")["uncertain"].count) == "3+"
    monkeypatch.setattr("stopdesk.views.selectors.QUEUE_CAP", 4)
    assert review_queue({}, only="uncertain")["uncertain"].count == 4
