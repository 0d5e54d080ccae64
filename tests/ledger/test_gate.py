"""The per-task gate between starts and Stop on PostgreSQL (stopdesk.services.transitions.gate),
with real threads, each on its own connection: starts of one task overlap, Stop waits only for
the starts holding the gate, a start arriving while Stop waits queues behind it and then sees
the stop, and registrations, Stop and settling running together do not deadlock."""

import threading
import time

import pytest
from django.db import connection, connections, transaction

from stopdesk.models import Task, WorkItem
from stopdesk.services.errors import TaskStopped
from stopdesk.services.items import item_finish, item_register_started
from stopdesk.services.stop import task_request_stop
from stopdesk.services.transitions import item_start
from stopdesk.states import ItemState as S
from stopdesk.states import Kind
from tests.factories import make_item, make_task, set_state_by_hand
from tests.pg_waits import lock_waiters

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.postgres]

WAIT = 10  # seconds: a bound on liveness, never a speed figure


class Worker(threading.Thread):
    """Runs `fn` on its own connection; keeps its result or the exception it raised."""

    def __init__(self, fn):
        super().__init__(daemon=True)
        self.fn, self.result, self.error = fn, None, None

    def run(self):
        try:
            self.result = self.fn()
        except BaseException as exc:  # handed to the test thread
            self.error = exc
        finally:
            connections.close_all()

    def outcome(self):
        self.join(WAIT)
        assert not self.is_alive(), "still blocked"
        if self.error is not None:
            raise self.error
        return self.result


def _advisory_waiters() -> int:
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND NOT granted"
            " AND database = (SELECT oid FROM pg_database WHERE datname = current_database())"
        )
        return cursor.fetchone()[0]


def _until_waiting(count: int) -> None:
    deadline = time.monotonic() + WAIT
    while _advisory_waiters() < count:
        assert time.monotonic() < deadline, f"never saw {count} waiting at the gate"
        time.sleep(0.01)


def test_starts_overlap_stop_waits_for_them_and_a_later_start_queues_behind_stop_and_sees_it():
    task = make_task()
    held, other, late = (make_item(task).pk for _ in range(3))
    holding, release = threading.Event(), threading.Event()

    def start_and_hold():
        with transaction.atomic():
            item_start(item_id=held, actor="a")
            holding.set()
            assert release.wait(WAIT)

    holder = Worker(start_and_hold)
    holder.start()
    assert holding.wait(WAIT)
    # A second start of the same task, while the first one's transaction holds the gate: not blocked.
    second = Worker(lambda: item_start(item_id=other, actor="b"))
    second.start()
    second.outcome()
    assert WorkItem.objects.get(pk=other).state == S.RUNNING

    # Stop waits for the start still holding the gate.
    stop = Worker(lambda: task_request_stop(task_id=task.pk, actor="user:op", dispatch=lambda ids: None))
    stop.start()
    _until_waiting(1)
    assert Task.objects.get(pk=task.pk).stop_requested_at is None
    # A start arriving now queues behind the waiting Stop (it would be granted alongside the holder).
    third = Worker(lambda: item_start(item_id=late, actor="c"))
    third.start()
    _until_waiting(2)
    assert stop.is_alive() and third.is_alive()

    release.set()
    holder.outcome()
    outcome = stop.outcome()
    # Its statement began before the stop committed, yet it saw the stop: refused, never started.
    with pytest.raises(TaskStopped):
        third.outcome()
    stop_at = outcome.stop_request.requested_at
    items = {item.pk: item for item in WorkItem.objects.filter(task=task)}
    assert items[held].state == S.RUNNING and items[held].started_at < stop_at
    assert items[other].state == S.RUNNING and items[other].started_at < stop_at
    assert items[late].state == S.CANCELLED and items[late].started_at is None


def test_registrations_stop_and_settling_together_do_not_deadlock():
    """Both registration paths (one statement; with a parent, the gate then the task row), items
    finishing (each settle check updates the task row), on a task that had settled, then Stop."""
    threads, per_thread = 6, 40
    task = make_task()
    parent = make_item(task, state=S.COMPLETED)  # the task settles here
    assert Task.objects.get(pk=task.pk).settled_at is not None
    registered: list[int] = []
    refused: list[int] = []
    barrier = threading.Barrier(threads + 1)

    def registrar(n):
        def run():
            barrier.wait()
            for i in range(per_thread):
                try:
                    item_id = item_register_started(
                        task_id=task.pk,
                        actor="race",
                        kind=Kind.LOCAL_WORKER,
                        noun=f"call {n}.{i}",
                        parent=parent.pk if (n + i) % 2 else None,
                    )
                    registered.append(item_id)
                    if i % 3 == 0:
                        item_finish(item_id=item_id, succeeded=True, actor="race")  # settles, maybe
                except TaskStopped as stopped:
                    refused.append(stopped.item_id)

        return run

    workers = [Worker(registrar(n)) for n in range(threads)]
    for worker in workers:
        worker.start()
    barrier.wait()
    while len(registered) < threads * per_thread // 3:
        time.sleep(0.001)
    outcome = task_request_stop(task_id=task.pk, actor="user:op", dispatch=lambda ids: None)
    for worker in workers:
        worker.outcome()  # a deadlock would raise here (PostgreSQL aborts one of the pair)

    stop_at = outcome.stop_request.requested_at
    rows = WorkItem.objects.filter(task=task).exclude(pk=parent.pk)
    assert rows.count() == threads * per_thread
    assert registered and refused
    assert not rows.filter(started_at__gte=stop_at).exists()
    assert set(rows.filter(state=S.CANCELLED).values_list("id", flat=True)) == set(refused)
    assert not rows.filter(pk__in=refused, started_at__isnull=False).exists()


def test_a_settle_waiting_for_a_registration_sees_its_new_item():
    """A registration holds the task row until it commits its new item; a settle for the task's
    last other item, whose statement began meanwhile, waits for that row. It must then see the new
    item running and leave the task unsettled (its first snapshot could not see the item)."""
    task = make_task()
    last = make_item(task, state=S.RUNNING)
    registered, release = threading.Event(), threading.Event()
    new_item: list[int] = []

    def registration():
        with transaction.atomic():  # the registration's commit is held back until `release`
            new_item.append(item_register_started(task_id=task.pk, actor="race", kind=Kind.LOCAL_WORKER, noun="call"))
            registered.set()
            assert release.wait(WAIT)

    registrar = Worker(registration)
    registrar.start()
    assert registered.wait(WAIT)
    closer = Worker(lambda: item_finish(item_id=last.pk, succeeded=True, actor="race"))  # settles after commit
    closer.start()
    deadline = time.monotonic() + WAIT
    while lock_waiters() < 1:  # the settle's UPDATE, waiting for the task row
        assert time.monotonic() < deadline, "the settle never waited for the registration"
        time.sleep(0.01)
    release.set()
    registrar.outcome()
    closer.outcome()

    assert WorkItem.objects.get(pk=new_item[0]).state == S.RUNNING
    assert Task.objects.get(pk=task.pk).settled_at is None
    assert not task.events.filter(kind="task_settled").exists()
    item_finish(item_id=new_item[0], succeeded=True, actor="race")
    assert Task.objects.get(pk=task.pk).settled_at is not None


def test_a_task_whose_settle_checks_raced_is_settled_by_the_sweep():
    """A tool result under the run's open item skips the settle check (the run is open); someone
    else settles the run meanwhile, and its check runs before the result commits. Each saw the
    other's item open, so neither settled the task; the periodic sweep does."""
    from stopdesk.services.transitions import item_close_running, tasks_settle_sweep

    task = make_task()
    run = item_register_started(task_id=task.pk, actor="race", kind=Kind.LOCAL_WORKER, noun="agent run")
    call = item_register_started(task_id=task.pk, actor="race", kind=Kind.LOCAL_WORKER, noun="call")
    written, release = threading.Event(), threading.Event()

    def result_under_the_open_run():
        with transaction.atomic():  # the result's commit is held back until `release`
            assert item_close_running(item_id=call, succeeded=True, actor="race", open_item=run)
            written.set()
            assert release.wait(WAIT)

    result = Worker(result_under_the_open_run)
    result.start()
    assert written.wait(WAIT)
    item_finish(item_id=run, succeeded=True, actor="reviewer")  # its settle check sees `call` running
    release.set()
    result.outcome()

    assert set(WorkItem.objects.filter(task=task).values_list("state", flat=True)) == {S.COMPLETED}
    assert Task.objects.get(pk=task.pk).settled_at is None  # the race, as it happens
    assert tasks_settle_sweep() == ([task.pk], 0)
    assert Task.objects.get(pk=task.pk).settled_at is not None
    assert task.events.filter(kind="task_settled").count() == 1
    assert tasks_settle_sweep() == ([], 0)


def test_the_settle_sweep_reads_a_window_of_unsettled_tasks_and_carries_on_from_there():
    from stopdesk.services.transitions import tasks_settle_sweep

    tasks = [make_task() for _ in range(5)]
    for task in tasks:
        make_item(task, state=S.RUNNING)
    missed = [tasks[1].pk, tasks[3].pk]
    set_state_by_hand(WorkItem.objects.filter(task_id__in=missed), S.COMPLETED)  # as if their checks never ran
    settled, after = tasks_settle_sweep(scan=2)
    assert (settled, after) == ([tasks[1].pk], tasks[1].pk)
    settled, after = tasks_settle_sweep(after=after, scan=2)
    assert (settled, after) == ([tasks[3].pk], tasks[3].pk)
    assert tasks_settle_sweep(after=after, scan=2) == ([], 0)  # the end: the next run starts over
    assert set(Task.objects.filter(settled_at__isnull=False).values_list("pk", flat=True)) == set(missed)


def test_attaching_a_record_leaves_the_task_row_free_for_stop_and_new_work():
    """Attaching a record locks its item, not its task: while an attach's transaction is open, a
    new tool call of the same task registers, and Stop commits (after which new work is refused).
    Locking the item with its task joined took the task row FOR UPDATE too, and every
    registration and Stop of the task queued behind a record being attached (and, with the gate
    in the circle, deadlocked). Stop's fan-out then stamps the item being attached to once the
    attach commits: that one row is all it waits for."""
    from stopdesk.services.items import item_attach_record

    task = make_task()
    item = make_item(task, state=S.RUNNING)
    attached, release = threading.Event(), threading.Event()

    def attach_and_hold():
        with transaction.atomic():
            item_attach_record(item_id=item.pk, system="crm", record_id="r-1", effect="created", actor="test")
            attached.set()
            release.wait(WAIT)

    def register():
        return item_register_started(task_id=task.pk, actor="test", kind=Kind.REMOTE_TOOL, noun="lookup")

    holder = Worker(attach_and_hold)
    holder.start()
    assert attached.wait(WAIT)
    try:
        start = Worker(register)
        start.start()
        started = start.outcome()  # the task row was free: no wait behind the open attach
        assert started is not None and WorkItem.objects.get(pk=started).state == S.RUNNING
        stop = Worker(lambda: task_request_stop(task_id=task.pk, actor="test", dispatch=lambda ids: None))
        stop.start()
        deadline = time.monotonic() + WAIT
        while not Task.objects.filter(pk=task.pk, stop_requested_at__isnull=False).exists():
            assert time.monotonic() < deadline, "the stop did not commit while the attach was open"
            time.sleep(0.02)
        refused = Worker(register)
        refused.start()
        with pytest.raises(TaskStopped):
            refused.outcome()
        assert not WorkItem.objects.get(pk=item.pk).cancel_requested_at  # the attach still holds it
    finally:
        release.set()
        holder.outcome()
    assert stop.outcome().created
    assert WorkItem.objects.get(pk=item.pk).cancel_requested_at is not None
    assert WorkItem.objects.get(pk=started).cancel_requested_at is not None
    assert lock_waiters() == 0
