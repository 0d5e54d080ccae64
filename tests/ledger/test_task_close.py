"""When a task is over: closed by its runtime or after the idle timeout, never by its items all
settling. A closed task takes no new work; a stop on a settled but open task refuses the next."""

import threading
from datetime import timedelta

import pytest
from django.db import connections
from django.utils import timezone

from stopdesk.models import Event, StopRequest, Task, WorkItem
from stopdesk.services.closing import task_close, tasks_close_idle
from stopdesk.services.errors import TaskClosed, TaskStopped
from stopdesk.services.items import item_register, item_register_started
from stopdesk.services.stop import task_request_stop
from stopdesk.services.transitions import item_submit
from stopdesk.services.transitions.settled import tasks_settle
from stopdesk.states import ItemState as S
from stopdesk.states import Kind
from tests.factories import make_item, make_task

pytestmark = pytest.mark.django_db


def _register(task: Task) -> WorkItem:
    return item_register(task=task, kind=Kind.EXTERNAL_OPERATION, noun="vendor", actor="runtime:test")


def _settled(title: str = "Vendor updates") -> Task:
    task = make_task(title)
    make_item(task, state=S.COMPLETED, noun="vendor")
    tasks_settle(task_ids=[task.pk])  # as after the commit that settled the last item
    task.refresh_from_db()
    assert task.settled_at is not None
    return task


def test_a_task_whose_items_all_settled_is_still_open_and_takes_new_work():
    task = _settled()
    assert task.closed_at is None
    item = _register(task)
    assert item.state == S.QUEUED
    task.refresh_from_db()
    assert task.settled_at is None  # reopened by the new work


def test_closing_is_recorded_once_with_its_event_and_a_repeat_changes_nothing():
    task = _settled()
    closed, first = task_close(task_id=task.pk, actor="runtime:invoices", reason="all vendors done")
    again, second = task_close(task_id=task.pk, actor="runtime:invoices")
    assert first and not second
    assert closed.closed_at is not None and again.closed_at == closed.closed_at
    events = Event.objects.filter(task=task, kind="task_closed")
    assert [(e.actor, e.message) for e in events] == [("runtime:invoices", "all vendors done")]


def test_a_closed_task_refuses_registration_and_writes_nothing():
    task = _settled()
    task_close(task_id=task.pk, actor="runtime:test")
    items, events = WorkItem.objects.count(), Event.objects.count()
    with pytest.raises(TaskClosed) as refused:
        _register(task)
    assert refused.value.code == "task_closed" and f"Task {task.pk} is closed" in str(refused.value)
    with pytest.raises(TaskClosed):
        item_register_started(task_id=task.pk, actor="runtime:test", kind=Kind.LOCAL_WORKER, noun="tool call")
    assert (WorkItem.objects.count(), Event.objects.count()) == (items, events)


def test_a_stop_on_a_settled_open_task_is_recorded_and_the_next_registration_cannot_start():
    task = _settled()
    outcome = task_request_stop(task_id=task.pk, actor="user:operator", reason="wrong vendor list", dispatch=list)
    assert outcome.created and StopRequest.objects.get(task=task).reason == "wrong vendor list"
    item = _register(task)
    assert item.state == S.CANCELLED and item.started_at is None
    with pytest.raises(TaskStopped):
        item_submit(item_id=item.pk, idempotency_key="vendor-next", actor="runtime:test")
    with pytest.raises(TaskStopped):
        item_register_started(task_id=task.pk, actor="runtime:test", kind=Kind.LOCAL_WORKER, noun="tool call")
    assert not WorkItem.objects.filter(task=task, started_at__gt=outcome.stop_request.requested_at).exists()


def test_the_idle_sweep_closes_tasks_idle_past_the_timeout_and_leaves_the_others_open(settings):
    settings.STOPDESK = {**settings.STOPDESK, "TASK_IDLE_CLOSE_MINUTES": 30}
    idle = _settled("Idle")
    recent = _settled("Settled a minute ago")
    running = make_task("Still working")
    make_item(running, state=S.RUNNING)
    empty = make_task("Never registered anything")
    now = timezone.now()
    Task.objects.filter(pk=idle.pk).update(settled_at=now - timedelta(minutes=31))
    Task.objects.filter(pk=recent.pk).update(settled_at=now - timedelta(minutes=1))
    Task.objects.filter(pk__in=[running.pk, empty.pk]).update(created_at=now - timedelta(hours=2))

    assert sorted(tasks_close_idle(now=now)) == sorted([idle.pk, empty.pk])
    assert set(Task.objects.filter(closed_at__isnull=False).values_list("pk", flat=True)) == {idle.pk, empty.pk}
    event = Event.objects.get(task=idle, kind="task_closed")
    assert event.actor == "system:idle-close" and event.message == "Closed after 30 minutes with no new work."
    assert tasks_close_idle(now=now) == []  # closed once
    # The recent one closes once it has been idle long enough, measured from when it settled.
    assert tasks_close_idle(now=now + timedelta(minutes=30)) == [recent.pk]


def test_new_work_restarts_the_idle_clock():
    task = _settled()
    Task.objects.filter(pk=task.pk).update(settled_at=timezone.now() - timedelta(days=1))
    _register(task)  # reopens: settled_at cleared
    assert tasks_close_idle() == []
    assert Task.objects.get(pk=task.pk).closed_at is None


@pytest.mark.postgres
@pytest.mark.django_db(transaction=True)
def test_a_registration_racing_the_close_either_commits_before_it_or_is_refused():
    """Real threads on PostgreSQL: registrations keep arriving while the runtime closes the task.
    Every item that exists was created before the close; every refused one wrote nothing."""
    task = _settled()
    registered: list[int] = []
    refused: list[int] = []
    go = threading.Barrier(5)

    def agent(n: int) -> None:
        try:
            go.wait()
            for i in range(60):
                try:
                    registered.append(_register(task).pk)
                except TaskClosed:
                    refused.append(n * 1000 + i)
        finally:
            connections.close_all()

    threads = [threading.Thread(target=agent, args=(n,)) for n in range(4)]
    for t in threads:
        t.start()
    go.wait()
    while len(registered) < 20:
        pass
    closed, _ = task_close(task_id=task.pk, actor="runtime:test")
    at_close = WorkItem.objects.filter(task=task).count()
    for t in threads:
        t.join()

    # Nothing committed after the close: the registrations under way when it came finished first.
    assert WorkItem.objects.filter(task=task).count() == at_close

    assert refused, "the close should land mid-race for this test to mean anything"
    items = WorkItem.objects.filter(task=task, noun="vendor", state=S.QUEUED)
    assert sorted(items.values_list("pk", flat=True)) == sorted(registered)
    assert closed.closed_at is not None
    assert not items.filter(created_at__gte=closed.closed_at).exists()
    registrations = Event.objects.filter(task=task, kind="item_registered", item__in=items)
    assert not registrations.filter(at__gte=closed.closed_at).exists()


def test_the_idle_sweep_takes_a_bounded_batch_the_longest_idle_first():
    tasks = [_settled(f"Idle {n}") for n in range(3)]
    now = timezone.now()
    for hours, task in zip((2, 4, 3), tasks, strict=True):
        Task.objects.filter(pk=task.pk).update(settled_at=now - timedelta(hours=hours))
    assert tasks_close_idle(now=now, batch=2) == [tasks[1].pk, tasks[2].pk]
    assert tasks_close_idle(now=now, batch=2) == [tasks[0].pk]
    assert tasks_close_idle(now=now, batch=2) == []
