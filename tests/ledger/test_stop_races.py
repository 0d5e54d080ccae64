"""Stop racing real concurrent work on PostgreSQL: threads with their own connections."""

import threading
import time

import pytest
from django.db import connection, connections, transaction

from stopdesk.models import Event, StopRequest, Task, WorkItem
from stopdesk.services.errors import IllegalTransition, TaskStopped
from stopdesk.services.stop import task_request_stop
from stopdesk.services.transitions import item_start, item_transition
from stopdesk.states import ItemState as S
from tests.factories import make_item, make_task
from tests.pg_waits import lock_waiters

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.postgres]

THREADS = 8
PER_THREAD = 200


def _in_thread(fn):
    def run(*args):
        try:
            fn(*args)
        finally:
            connections.close_all()

    return run


def test_no_item_enters_running_after_the_stop_commits():
    task = make_task()
    items = [make_item(task).pk for _ in range(THREADS * PER_THREAD)]
    started, refused = [], []
    gate = threading.Barrier(THREADS + 1)
    dispatched: list[list[int]] = []

    @_in_thread
    def worker(chunk):
        gate.wait()
        for item_id in chunk:
            try:
                item_start(item_id=item_id, actor="race")
                started.append(item_id)
            except (TaskStopped, IllegalTransition):
                refused.append(item_id)

    threads = [threading.Thread(target=worker, args=(items[i::THREADS],)) for i in range(THREADS)]
    for t in threads:
        t.start()
    gate.wait()
    # Let the workers get going so the stop lands in the middle of the starts.
    while len(started) < len(items) // 4:
        pass
    outcome = task_request_stop(task_id=task.pk, actor="user:operator", dispatch=dispatched.append)
    for t in threads:
        t.join()

    stop_at = outcome.stop_request.requested_at
    rows = WorkItem.objects.filter(task=task)
    running = rows.filter(state=S.RUNNING)
    assert 0 < running.count() < len(items), "the stop should land mid-race for this test to mean anything"
    # Database timestamps: every started item started before the stop request was written.
    assert not running.filter(started_at__gte=stop_at).exists()
    assert not rows.filter(started_at__gte=stop_at).exists()
    # Every item is either cancelled, or was started before the stop.
    assert rows.exclude(state__in=[S.RUNNING, S.CANCELLED]).count() == 0
    assert rows.filter(state=S.CANCELLED, started_at__isnull=False).count() == 0
    assert set(started) == set(running.values_list("id", flat=True))
    # Each in-flight item is dispatched exactly once.
    assert sorted(dispatched[0]) == sorted(started)
    # No state change without its event.
    assert Event.objects.filter(task=task, to_state=S.CANCELLED).count() == rows.filter(state=S.CANCELLED).count()


def test_two_concurrent_stops_make_one_request_and_one_dispatch_per_item():
    task = make_task()
    running = [make_item(task, state=S.RUNNING).pk for _ in range(20)]
    for _ in range(30):
        make_item(task)
    dispatched: list[list[int]] = []
    outcomes = []
    gate = threading.Barrier(4)

    @_in_thread
    def stop(who):
        gate.wait()
        outcomes.append(task_request_stop(task_id=task.pk, actor=f"user:{who}", dispatch=dispatched.append))

    threads = [threading.Thread(target=stop, args=(f"op{i}",)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()

    assert StopRequest.objects.filter(task=task).count() == 1
    assert len({o.stop_request.pk for o in outcomes}) == 1
    assert [o.created for o in outcomes].count(True) == 1
    assert sum(len(batch) for batch in dispatched) == len(running)
    assert sorted(i for batch in dispatched for i in batch) == sorted(running)
    assert Event.objects.filter(task=task, kind="stop_duplicate").count() == 3
    assert StopRequest.objects.get(task=task).duplicates == 3
    assert WorkItem.objects.filter(task=task, state=S.CANCELLED).count() == 30


def test_a_later_stop_returns_the_same_request_and_dispatches_nothing():
    task = make_task()
    make_item(task, state=S.RUNNING)
    first_batch, second_batch = [], []
    first = task_request_stop(task_id=task.pk, actor="user:a", dispatch=first_batch.extend)
    second = task_request_stop(task_id=task.pk, actor="user:b", dispatch=second_batch.extend)
    assert second.stop_request.pk == first.stop_request.pk and not second.created
    assert len(first_batch) == 1 and second_batch == []


def test_stop_commits_its_request_in_its_own_transaction_before_the_queued_cancel():
    """PostgreSQL's xmin names the transaction that wrote a row version: the stop request, the
    task's stop mark (with its audit event) and the cancelled items must come from two
    transactions, in that order."""
    task = make_task()
    make_item(task)
    make_item(task)
    # Still running after Stop, so the task does not settle (settled_at would rewrite its row).
    make_item(task, state=S.RUNNING)
    task_request_stop(task_id=task.pk, actor="user:a", dispatch=lambda ids: None)
    with connection.cursor() as cursor:
        cursor.execute("SELECT xmin::text::bigint FROM stopdesk_task WHERE id = %s", [task.pk])
        (stop_xid,) = cursor.fetchone()
        cursor.execute(
            "SELECT xmin::text::bigint FROM stopdesk_event WHERE task_id = %s AND kind = 'stop_requested'", [task.pk]
        )
        (request_xid,) = cursor.fetchone()
        cursor.execute("SELECT DISTINCT xmin::text::bigint FROM stopdesk_workitem WHERE task_id = %s", [task.pk])
        cancel_xids = [row[0] for row in cursor.fetchall()]
    assert request_xid == stop_xid
    assert len(cancel_xids) == 1 and cancel_xids[0] > stop_xid


def test_a_stop_whose_process_died_after_the_commit_is_finished_by_the_resumer():
    from datetime import timedelta

    from django.utils import timezone

    from stopdesk.services.stop import _commit_stop_request, stops_resume_fanout

    task = make_task()
    queued = make_item(task)
    running = make_item(task, state=S.RUNNING)
    stop_request, created = _commit_stop_request(task_id=task.pk, actor="user:a", by=None, reason="")
    assert created
    # The process died here: the boundary holds, but nothing was cancelled or dispatched yet.
    assert WorkItem.objects.get(pk=queued.pk).state == S.QUEUED
    assert stops_resume_fanout(older_than_seconds=30) == []  # too recent: its own process may still be at it
    StopRequest.objects.filter(pk=stop_request.pk).update(requested_at=timezone.now() - timedelta(minutes=1))
    dispatched: list[int] = []
    assert stops_resume_fanout(older_than_seconds=30, dispatch=dispatched.extend) == [stop_request.pk]
    assert stops_resume_fanout(older_than_seconds=30, dispatch=dispatched.extend) == []
    assert WorkItem.objects.get(pk=queued.pk).state == S.CANCELLED
    assert dispatched == [running.pk]


def test_an_item_registered_while_the_stop_committed_is_settled_by_the_resumer():
    from datetime import timedelta

    from django.utils import timezone

    from stopdesk.services.stop import stops_resume_fanout
    from stopdesk.states import Kind

    task = make_task()
    task_request_stop(task_id=task.pk, actor="user:a", dispatch=lambda ids: None)
    # A registration whose transaction read "not stopped" before the stop committed, and
    # committed after the fan-out: the row the race leaves behind (written here directly).
    raced = WorkItem.objects.create(task=task, kind=Kind.MODEL_REQUEST, noun="draft")
    Task = type(task)
    Task.objects.filter(pk=task.pk).update(stop_requested_at=timezone.now() - timedelta(minutes=2))
    WorkItem.objects.filter(pk=raced.pk).update(created_at=timezone.now() - timedelta(minutes=1))
    stops_resume_fanout(older_than_seconds=30, dispatch=lambda ids: None)
    raced.refresh_from_db()
    assert raced.state == S.CANCELLED
    assert Event.objects.filter(item=raced, kind="stop_cancelled", to_state=S.CANCELLED).count() == 1


def test_a_second_stop_waiting_on_the_first_ones_fanout_holds_no_task_row_lock():
    """The duplicate-Stop deadlock: the first Stop's fan-out holds the stop request and waits for
    an item row that a result writer holds; that writer next needs the task row (the settle). A
    second Stop counting itself must wait for the stop request without holding the task row."""
    task = make_task()
    item = make_item(task, state=S.RUNNING)
    writer_has_row, writer_done = threading.Event(), threading.Event()
    outcomes, errors = [], []

    @_in_thread
    def result_writer():
        # A result write in progress: its transaction holds the item row.
        with transaction.atomic(), connection.cursor() as cursor:
            cursor.execute("SELECT 1 FROM stopdesk_workitem WHERE id = %s FOR UPDATE", [item.pk])
            writer_has_row.set()
            writer_done.wait(30)

    @_in_thread
    def stop(who):
        try:
            outcomes.append(task_request_stop(task_id=task.pk, actor=f"user:{who}", dispatch=lambda ids: None))
        except Exception as exc:  # handed to the test thread
            errors.append(exc)

    threads = [threading.Thread(target=result_writer)]
    threads[0].start()
    assert writer_has_row.wait(10)
    threads.append(threading.Thread(target=stop, args=("first",)))
    threads[1].start()
    deadline = time.monotonic() + 10
    while not Task.objects.filter(pk=task.pk, stop_requested_at__isnull=False).exists() or lock_waiters() < 1:
        assert time.monotonic() < deadline, "the first Stop's fan-out never waited for the item row"
        time.sleep(0.01)
    threads.append(threading.Thread(target=stop, args=("second",)))
    threads[2].start()
    while lock_waiters() < 2:
        assert time.monotonic() < deadline, "the second Stop never waited for the stop request"
        time.sleep(0.01)
    try:
        # What the writer's settle does next: the task row. Free, or the three would deadlock.
        with transaction.atomic(), connection.cursor() as cursor:
            cursor.execute("SET LOCAL lock_timeout = '2s'")
            cursor.execute("SELECT 1 FROM stopdesk_task WHERE id = %s FOR NO KEY UPDATE", [task.pk])
    finally:
        writer_done.set()
        for t in threads:
            t.join(30)
    assert not errors
    assert sorted(o.created for o in outcomes) == [False, True]
    assert len({o.stop_request.pk for o in outcomes}) == 1
    assert StopRequest.objects.get(task=task).duplicates == 1
    assert WorkItem.objects.get(pk=item.pk).cancel_requested_at is not None


def _settle_while_the_fanout_waits(to_state: str, succeeded_words: str) -> WorkItem:
    """A run item in flight; an integration hears the pushed Stop and settles it while the stop's
    fan-out waits for its row (the writer's transaction holds it), and commits before the fan-out
    moves on. Real threads on PostgreSQL: the stop in one, the integration's write in this one."""
    task = make_task()
    item = make_item(task, state=S.RUNNING)
    errors: list[Exception] = []

    @_in_thread
    def stop():
        try:
            task_request_stop(task_id=task.pk, actor="user:operator", dispatch=lambda ids: None)
        except Exception as exc:  # handed to the test thread
            errors.append(exc)

    stopper = threading.Thread(target=stop)
    with transaction.atomic():
        # The integration's settle is under way: it holds the item row.
        list(WorkItem.objects.select_for_update().filter(pk=item.pk).values_list("pk"))
        stopper.start()
        deadline = time.monotonic() + 10
        while not Task.objects.filter(pk=task.pk, stop_requested_at__isnull=False).exists() or lock_waiters() < 1:
            assert time.monotonic() < deadline, "the fan-out never waited for the item row"
            time.sleep(0.01)
        item_transition(item_id=item.pk, to_state=to_state, actor="agent:integration", outcome=succeeded_words)
    stopper.join(30)
    assert not errors, errors
    return WorkItem.objects.get(pk=item.pk)


@pytest.mark.parametrize(
    ("to_state", "words"), [(S.CANCELLED, "stopped before it finished"), (S.COMPLETED, "finished anyway")]
)
def test_an_item_settled_between_the_stops_commit_and_its_fanout_carries_the_stamp(to_state, words):
    item = _settle_while_the_fanout_waits(to_state, words)
    stop = StopRequest.objects.get(task=item.task_id)
    assert item.state == to_state
    assert item.cancel_requested_at == stop.requested_at
    assert Event.objects.filter(item=item, kind="cancel_requested").count() == 1


def test_an_item_settled_after_the_stop_commits_and_before_the_fanout_runs_carries_the_stamp():
    """The other order: the settle has committed before the fan-out starts at all."""
    from stopdesk.services.stop import _commit_stop_request, stop_fanout

    task = make_task()
    ran = make_item(task, state=S.RUNNING)
    never = make_item(task)  # queued: cancelled by the fan-out, never in flight
    before = make_item(task, state=S.RUNNING)
    item_transition(item_id=before.pk, to_state=S.COMPLETED, actor="agent:integration", outcome="done before Stop")
    stop, created = _commit_stop_request(task_id=task.pk, actor="user:operator", by=None, reason="")
    assert created
    item_transition(item_id=ran.pk, to_state=S.CANCELLED, actor="agent:integration", outcome="heard the push")
    stop_fanout(stop_request_id=stop.pk, actor="user:operator", dispatch=lambda ids: None)
    stamps = dict(WorkItem.objects.filter(task=task).values_list("pk", "cancel_requested_at"))
    assert stamps == {ran.pk: stop.requested_at, never.pk: None, before.pk: None}
