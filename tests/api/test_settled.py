"""The task's own record, read through the API: settled_at is written when the last item settles
(also by Stop's set-based cancel, and when two items settle at once in two threads), kept when a
late result reopens review, cleared by new work; uncertain items say needs_review, as the review
queue does. Transactional: settled_at is written after the settling transaction commits."""

from __future__ import annotations

import threading
from datetime import datetime

import pytest
from django.db import connection

from stopdesk.models import Event
from stopdesk.views.selectors import queue_late_results, queue_uncertain
from tests.api.conftest import Api

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.postgres]


def _task(api: Api) -> int:
    return api.post("/tasks", {"title": "Analyse invoices"}).body["id"]


def _item(api: Api, task_id: int, *, start: bool = True) -> int:
    item = api.post(f"/tasks/{task_id}/items", {"kind": "local_worker", "noun": "job"}).body["id"]
    if start:
        assert api.post(f"/items/{item}/start", {}).status == 200
    return item


def _settled_at(api: Api, task_id: int) -> str | None:
    return api.get(f"/tasks/{task_id}").body["settled_at"]


def test_settled_at_is_written_when_the_last_item_finishes(api):
    task = _task(api)
    first, second = _item(api, task), _item(api, task)
    api.post(f"/items/{first}/finish", {"status": "completed"})
    assert _settled_at(api, task) is None
    api.post(f"/items/{second}/finish", {"status": "failed"})
    settled = _settled_at(api, task)
    assert settled is not None
    finished = api.get(f"/items/{second}").body["finished_at"]
    assert datetime.fromisoformat(settled) >= datetime.fromisoformat(finished)
    assert Event.objects.filter(task_id=task, kind="task_settled").count() == 1


def test_stop_cancelling_queued_items_settles_the_task(api):
    task = _task(api)
    _item(api, task, start=False)
    _item(api, task, start=False)
    assert api.post(f"/tasks/{task}/stop", {"reason": "wrong list"}).status in (200, 201)
    assert _settled_at(api, task) is not None


def test_an_uncertain_item_settles_the_task_and_needs_review_like_the_queue_says(api):
    task = _task(api)
    item = _item(api, task)
    api.post(f"/items/{item}/uncertain", {"detail": "no answer"})
    body = api.get(f"/items/{item}").body
    assert body["state"] == "uncertain" and body["needs_review"] is True
    assert list(queue_uncertain().values_list("pk", flat=True)) == [item]
    assert _settled_at(api, task) is not None


def test_a_late_result_reopens_review_but_keeps_settled_at(api):
    task = _task(api)
    item = _item(api, task)
    api.post(f"/tasks/{task}/stop", {})
    api.post(f"/items/{item}/cancel", {"detail": "cancel confirmed"})
    settled = _settled_at(api, task)
    assert settled is not None
    assert api.get(f"/items/{item}").body["needs_review"] is False
    # The worker's result arrives after the item was recorded cancelled.
    api.post(f"/items/{item}/finish", {"status": "completed"})
    body = api.get(f"/items/{item}").body
    assert body["state"] == "cancelled" and body["needs_review"] is True
    assert list(queue_late_results().values_list("pk", flat=True)) == [item]
    # No work resumed: the task settled when it did. The summary counts the item completed.
    detail = api.get(f"/tasks/{task}").body
    assert detail["settled_at"] == settled
    assert "One job completed; a late report contradicts its record: review required." in detail["summary"]


def test_new_work_on_a_settled_task_clears_settled_at_until_it_settles_again(api):
    task = _task(api)
    first = _item(api, task)
    api.post(f"/items/{first}/finish", {"status": "completed"})
    before = _settled_at(api, task)
    assert before is not None
    again = _item(api, task)
    assert _settled_at(api, task) is None
    api.post(f"/items/{again}/finish", {"status": "completed"})
    after = _settled_at(api, task)
    assert after is not None and after > before


def test_two_last_items_settling_at_once_write_settled_at_exactly_once(api, runtime):
    task = _task(api)
    items = [_item(api, task) for _ in range(2)]
    barrier = threading.Barrier(2)
    errors: list[BaseException] = []

    def finish(item_id: int) -> None:
        try:
            barrier.wait()
            Api(runtime[1]).post(f"/items/{item_id}/finish", {"status": "completed"})
        except BaseException as exc:  # reported by the main thread
            errors.append(exc)
        finally:
            connection.close()

    threads = [threading.Thread(target=finish, args=(i,)) for i in items]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert not errors
    assert _settled_at(api, task) is not None
    assert Event.objects.filter(task_id=task, kind="task_settled").count() == 1
