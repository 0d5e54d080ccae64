"""The task list and the task page: full pages, their htmx fragments, Stop, and live polling."""

from __future__ import annotations

import pytest
from django.urls import reverse

from stopdesk.models import StopRequest, WorkItem
from stopdesk.services.closing import task_close
from stopdesk.states import ItemState
from tests.factories import make_item, make_task
from tests.web.conftest import HTMX, htmx
from tests.web.scenes import running_task, settle, uncertain_item

pytestmark = pytest.mark.django_db
S = ItemState


def test_task_list_is_a_full_page_with_the_table(as_user):
    running_task("Draft the Q3 supplier emails")
    response = as_user("operator").get(reverse("task-list"))
    assert response.status_code == 200
    html = response.content.decode()
    assert "<html" in html and 'id="task-table"' in html
    assert "Draft the Q3 supplier emails" in html


def test_task_list_htmx_returns_only_the_table_fragment(as_user):
    running_task("Draft the Q3 supplier emails")
    response = as_user("operator").get(reverse("task-list"), {"q": "supplier"}, **htmx("task-table"))
    html = response.content.decode()
    assert response.status_code == 200
    assert html.lstrip().startswith('<div id="task-table">') and "<html" not in html
    assert "Draft the Q3 supplier emails" in html


def test_task_list_filters_by_state_and_searches(as_user):
    running = running_task("Running one")
    stopped = make_task("Stopped one")
    from stopdesk.services.stop import task_request_stop

    task_request_stop(task_id=stopped.pk, actor="test", dispatch=lambda ids: None)
    client = as_user("operator")
    html = client.get(reverse("task-list"), {"status": "running"}).content.decode()
    assert "Running one" in html and "Stopped one" not in html
    html = client.get(reverse("task-list"), {"status": "stopped"}).content.decode()
    assert "Stopped one" in html and "Running one" not in html
    html = client.get(reverse("task-list"), {"q": str(running.pk)}).content.decode()
    assert "Running one" in html


def test_the_list_calls_a_settled_open_task_running_and_only_a_closed_one_finished(as_user):
    open_task = make_task("Between two children")
    make_item(open_task, state=S.COMPLETED)
    closed_task = make_task("Closed by its runtime")
    make_item(closed_task, state=S.COMPLETED)
    task_close(task_id=closed_task.pk, actor="runtime:test")
    client = as_user("operator")
    running = client.get(reverse("task-list"), {"status": "running"}).content.decode()
    assert "Between two children" in running and "Closed by its runtime" not in running
    finished = client.get(reverse("task-list"), {"status": "finished"}).content.decode()
    assert "Closed by its runtime" in finished and "Between two children" not in finished


def test_task_list_paginates(as_user):
    for n in range(30):
        make_task(f"Task number {n}")
    client = as_user("operator")
    first = client.get(reverse("task-list")).content.decode()
    second = client.get(reverse("task-list"), {"page": 2}).content.decode()
    assert "Page 1 of 2" in first and "Task number 29" in first
    assert "Task number 0" in second and "Task number 29" not in second


def test_task_page_shows_summary_groups_records_and_trail(as_user):
    task = running_task()
    uncertain_item(task)
    html = as_user("operator").get(reverse("task-detail", args=[task.pk])).content.decode()
    assert 'id="summary"' in html and 'aria-live="polite"' in html
    assert "Running: two of five items finished." in html
    assert 'id="group-running"' in html and 'id="group-queued"' in html and 'id="group-uncertain"' in html
    assert "celery-7f3a" in html and "mcp-req-42" in html
    # Still running: the summary polls.
    assert 'hx-trigger="every 1s"' in html


def test_task_page_summary_fragment_polls_until_closed_then_answers_286(as_user):
    task = running_task()
    client = as_user("operator")
    response = client.get(reverse("task-detail", args=[task.pk]), **htmx("summary"))
    html = response.content.decode()
    assert response.status_code == 200
    assert html.lstrip().startswith('<p id="summary"') and "<html" not in html
    # The other live parts come along out of band.
    assert (
        'id="groups"' in html
        and 'id="stop-state"' in html
        and 'id="stop-action"' in html
        and 'hx-swap-oob="true"' in html
    )
    for item in WorkItem.objects.filter(task=task, state__in=[S.QUEUED, S.RUNNING]):
        if item.state == S.QUEUED:
            from stopdesk.services.transitions import item_transition

            item_transition(item_id=item.pk, to_state=S.CANCELLED, actor="test")
        else:
            settle(item.pk, S.COMPLETED)
    # Settled, but open: its agent may register more, so the page keeps refreshing.
    response = client.get(reverse("task-detail", args=[task.pk]), **htmx("summary"))
    assert response.status_code == 200
    task_close(task_id=task.pk, actor="runtime:test")
    response = client.get(reverse("task-detail", args=[task.pk]), **htmx("summary"))
    assert response.status_code == 286
    assert "every 1s" not in response.content.decode()


def test_stop_has_a_confirmation_step(as_user):
    task = running_task()
    client = as_user("operator")
    page = client.get(reverse("task-stop", args=[task.pk]))
    assert page.status_code == 200 and "Stop this task?" in page.content.decode() and "<html" in page.content.decode()
    fragment = client.get(reverse("task-stop", args=[task.pk]), **htmx("stop-action"))
    html = fragment.content.decode()
    assert html.lstrip().startswith('<div id="stop-action"') and "Stop this task?" in html
    assert not StopRequest.objects.filter(task=task).exists()


def test_stop_by_htmx_answers_stopping_at_once_and_a_second_click_gets_the_same_stop(as_user):
    task = running_task()
    client = as_user("operator")
    response = client.post(reverse("task-stop", args=[task.pk]), {"reason": "wrong recipients"}, **htmx("stop-action"))
    html = response.content.decode()
    assert response.status_code == 200
    assert "Stopping…" in html and "wrong recipients" in html
    assert 'id="summary"' in html and "Stopped new work." in html
    second = as_user("operator").post(reverse("task-stop", args=[task.pk]), **htmx("stop-action"))
    assert second.status_code == 200
    stop = StopRequest.objects.get(task=task)
    assert stop.duplicates == 1
    assert "Asked again 1 time" in second.content.decode()
    assert WorkItem.objects.filter(task=task, state=S.QUEUED).count() == 0


def test_stop_without_htmx_redirects_to_the_task_page(as_user):
    task = running_task()
    response = as_user("operator").post(reverse("task-stop", args=[task.pk]))
    assert response.status_code == 302 and response["Location"] == reverse("task-detail", args=[task.pk])
    assert StopRequest.objects.filter(task=task).exists()


def test_items_page_lists_one_state_paginated_with_fragment(as_user):
    task = make_task("Many drafts")
    for _ in range(60):
        make_item(task, noun="draft")
    client = as_user("operator")
    full = client.get(reverse("task-items", args=[task.pk]), {"state": "queued"})
    assert full.status_code == 200 and "60 items." in full.content.decode() and "Page 1 of 2" in full.content.decode()
    fragment = client.get(reverse("task-items", args=[task.pk]), {"state": "queued", "page": 2}, **htmx("items-table"))
    assert fragment.content.decode().lstrip().startswith('<div id="items-table">')


def test_task_page_groups_show_a_bounded_number_of_rows(as_user):
    task = make_task("Big one")
    for _ in range(25):
        make_item(task, noun="draft")
    html = as_user("operator").get(reverse("task-detail", args=[task.pk])).content.decode()
    assert html.count('class="item"') == 20
    assert "All 25 queued items" in html


def test_htmx_request_without_target_gets_the_full_page(as_user):
    task = running_task()
    response = as_user("operator").get(reverse("task-detail", args=[task.pk]), **HTMX)
    assert "<html" in response.content.decode()


def test_the_poll_swaps_nothing_itself_and_brings_every_live_part_out_of_band(as_user):
    task = running_task()
    response = as_user("operator").get(reverse("task-detail", args=[task.pk]), **htmx("live"))
    html = response.content.decode()
    assert response.status_code == 200 and "<html" not in html
    for part in ("stop-state", "stop-action", "summary", "timeline", "groups"):
        assert f'id="{part}"' in html
    assert html.count('hx-swap-oob="true"') == 5
    # The action part is guarded in the page: a poll never replaces it while a person uses it.
    assert 'id="stop-action" class="stop-action" data-live-guard' in html


def test_a_settled_open_task_still_offers_stop_keeps_watching_and_records_the_stop(as_user):
    task = make_task("Between two children")
    make_item(task, state=S.COMPLETED, noun="draft")
    client = as_user("operator")
    html = client.get(reverse("task-detail", args=[task.pk])).content.decode()
    assert "Stop…" in html and 'hx-trigger="every 1s"' in html and "still open" in html
    confirm = client.get(reverse("task-stop", args=[task.pk]), **htmx("stop-action"))
    assert confirm.status_code == 200 and "Stop this task?" in confirm.content.decode()
    stopped = client.post(reverse("task-stop", args=[task.pk]), {"reason": "wrong vendor list"})
    assert stopped.status_code == 302
    assert StopRequest.objects.get(task=task).reason == "wrong vendor list"


def test_a_closed_finished_task_offers_no_stop_says_why_and_still_records_a_stop(as_user):
    task = make_task("All done")
    make_item(task, state=S.COMPLETED, noun="draft")
    task_close(task_id=task.pk, actor="runtime:test")
    client = as_user("operator")
    html = client.get(reverse("task-detail", args=[task.pk])).content.decode()
    assert "Stop…" not in html and "nothing left to stop" in html
    assert 'hx-trigger="every 1s"' not in html
    recorded = client.post(reverse("task-stop", args=[task.pk]), {"reason": "late"}, **htmx("stop-action"))
    assert recorded.status_code == 200
    assert StopRequest.objects.get(task=task).reason == "late"


def test_a_task_with_no_work_yet_still_offers_stop_and_keeps_watching(as_user):
    task = make_task("Just started")
    html = as_user("operator").get(reverse("task-detail", args=[task.pk])).content.decode()
    assert "Stop…" in html and 'hx-trigger="every 1s"' in html


@pytest.mark.django_db(transaction=True)
def test_the_page_shows_when_the_task_settled_as_the_api_does(as_user):
    task = make_task("Settles")
    item = make_item(task, state=S.RUNNING)
    html = as_user("operator").get(reverse("task-detail", args=[task.pk])).content.decode()
    assert "settled <time" not in html
    settle(item.pk, S.COMPLETED)
    task.refresh_from_db()
    assert task.settled_at is not None
    html = as_user("operator").get(reverse("task-detail", args=[task.pk])).content.decode()
    assert f'settled <time datetime="{task.settled_at.isoformat()}' in html


def test_a_stopped_settled_task_keeps_refreshing_until_it_closes(as_user):
    from stopdesk.services.stop import task_request_stop

    task = make_task("Stopped between two children")
    make_item(task, state=S.COMPLETED)
    task_request_stop(task_id=task.pk, actor="user:operator", dispatch=lambda ids: None)
    client = as_user("operator")
    page = client.get(reverse("task-detail", args=[task.pk])).content.decode()
    assert "Stop…" not in page and 'hx-trigger="every 1s"' in page
    assert client.get(reverse("task-detail", args=[task.pk]), **htmx("live")).status_code == 200
    task_close(task_id=task.pk, actor="system:idle-close")
    assert client.get(reverse("task-detail", args=[task.pk]), **htmx("live")).status_code == 286
