"""The audit trail: append-only at the database, rows it describes cannot vanish, tampering shows."""

import io
import os
import subprocess
import sys
import threading
from pathlib import Path

import pytest
from django.core.management import CommandError, call_command
from django.db import DatabaseError, connection, connections, transaction
from django.db.models import ProtectedError, Q

from stopdesk.models import Event, EventChain, ExternalRecord, Task, WorkItem
from stopdesk.services.audit import audit_verify
from stopdesk.services.audit_seal import audit_seal
from stopdesk.services.events import event_record
from stopdesk.services.transitions import items_move
from stopdesk.states import ItemState as S
from tests.factories import make_external_effect, make_item, make_task

ROOT = Path(__file__).resolve().parents[2]


def _verify(*args: str) -> tuple[bool, str]:
    out = io.StringIO()
    try:
        call_command("audit_verify", *args, stdout=out, stderr=out)
    except CommandError as error:
        return False, f"{out.getvalue()}{error}"
    return True, out.getvalue()


def _tamper(sql: str, params: list) -> None:
    """What a database owner can do: switch the triggers off, rewrite, switch them on again."""
    with connection.cursor() as cursor:
        cursor.execute("ALTER TABLE stopdesk_event DISABLE TRIGGER USER")
        cursor.execute(sql, params)
        cursor.execute("ALTER TABLE stopdesk_event ENABLE TRIGGER USER")


@pytest.mark.django_db
@pytest.mark.postgres
def test_truncate_of_the_event_table_is_refused():
    make_item(make_task())
    with pytest.raises(DatabaseError, match="append-only"), transaction.atomic(), connection.cursor() as cursor:
        cursor.execute("TRUNCATE stopdesk_event")
    assert Event.objects.exists()


@pytest.mark.django_db
def test_a_task_with_events_cannot_be_deleted():
    task = make_task()  # task_create records its event; the task has no items
    with pytest.raises(ProtectedError):
        task.delete()
    with pytest.raises(DatabaseError, match="has audit events"), transaction.atomic(), connection.cursor() as cursor:
        cursor.execute("DELETE FROM stopdesk_task WHERE id = %s", [task.pk])
    assert Task.objects.filter(pk=task.pk).exists()


@pytest.mark.django_db
def test_an_item_with_events_cannot_be_deleted():
    item = make_item(make_task())
    with pytest.raises(ProtectedError):
        item.delete()
    with pytest.raises(DatabaseError, match="has audit events"), transaction.atomic(), connection.cursor() as cursor:
        cursor.execute("DELETE FROM stopdesk_workitem WHERE id = %s", [item.pk])
    assert WorkItem.objects.filter(pk=item.pk).exists()


@pytest.mark.django_db
def test_an_external_record_whose_item_has_events_cannot_be_deleted():
    item = make_external_effect(make_task())
    record = ExternalRecord.objects.get(item=item)
    with pytest.raises(DatabaseError, match="has audit events"), transaction.atomic():
        record.delete()
    with pytest.raises(DatabaseError, match="has audit events"), transaction.atomic(), connection.cursor() as cursor:
        cursor.execute("DELETE FROM stopdesk_externalrecord WHERE id = %s", [record.pk])
    assert ExternalRecord.objects.filter(pk=record.pk).exists()


@pytest.mark.django_db
def test_every_writer_chains_the_events_of_a_task():
    task = make_task()
    items = [make_item(task) for _ in range(30)]
    event_record(kind="note", actor="test", task=task, message="a person's note")
    # The set-based writer: one statement, thirty events.
    moved = items_move(
        where=Q(task=task), from_states=(S.QUEUED,), to_state=S.CANCELLED, actor="test", kind="cancel", message="x"
    )
    assert moved == 30
    # Written unsealed; the sealer chains them after commit.
    assert set(Event.objects.filter(task=task).values_list("seq", "hash")) == {(0, "")}
    assert audit_seal(batch=7) == Event.objects.filter(task=task).count()
    assert audit_seal() == 0  # each event is sealed once
    seqs = list(Event.objects.filter(task=task).order_by("seq").values_list("seq", flat=True))
    assert seqs == list(range(1, len(seqs) + 1))
    assert len(seqs) == 1 + 30 + 1 + 30
    assert all(len(h) == 64 for h in Event.objects.filter(task=task).values_list("hash", flat=True))
    ok, report = _verify()
    assert ok, report
    assert "0 broken" in report
    assert items[0].pk  # the items exist; their events are what the chain covers


@pytest.mark.django_db
@pytest.mark.postgres
def test_audit_verify_names_the_first_broken_link():
    task = make_task()
    make_item(task, state=S.COMPLETED)
    other = make_task("untouched")
    audit_seal()
    events = list(Event.objects.filter(task=task).order_by("seq"))
    assert len(events) >= 3
    target = events[1]
    _tamper("UPDATE stopdesk_event SET message = 'nothing happened' WHERE id = %s", [target.pk])
    ok, report = _verify()
    assert not ok
    assert f"event {target.pk}" in report
    assert f"task {task.pk}" in report
    assert f"seq {target.seq}" in report
    assert f"task {other.pk}" not in report


@pytest.mark.django_db
@pytest.mark.postgres
def test_audit_verify_notices_a_deleted_event_and_a_cut_tail():
    task = make_task()
    make_item(task, state=S.COMPLETED)
    audit_seal()
    events = list(Event.objects.filter(task=task).order_by("seq"))
    _tamper("DELETE FROM stopdesk_event WHERE id = %s", [events[-1].pk])
    ok, report = _verify()
    assert not ok
    assert f"task {task.pk}" in report
    assert "head" in report


@pytest.mark.django_db(transaction=True)
@pytest.mark.postgres
def test_concurrent_appends_to_one_task_while_sealers_run_keep_one_chain():
    """Six writers append to one task (single events and set-based moves) while two sealers run
    in a loop and a verifier checks the chains as they move: every event is sealed exactly once,
    the chain has no gap and no fork, and no check along the way saw a broken link."""
    task = make_task()
    threads_n, per_thread = 6, 25
    items = [make_item(task).pk for _ in range(threads_n * 5)]
    gate = threading.Barrier(threads_n + 3)
    writing = threading.Event()
    writing.set()
    errors: list[BaseException] = []
    sealed: list[int] = []

    def worker(n: int) -> None:
        try:
            gate.wait()
            for i in range(per_thread):
                with transaction.atomic():
                    event_record(kind="note", actor=f"thread-{n}", task=task.pk, message=str(i))
            # and a set-based writer racing the single ones
            mine = items[n * 5 : (n + 1) * 5]
            items_move(
                where=Q(pk__in=mine), from_states=(S.QUEUED,), to_state=S.CANCELLED, actor="t", kind="c", message=""
            )
        except BaseException as error:
            errors.append(error)
        finally:
            connections.close_all()

    def sealer(wait: bool) -> None:
        try:
            gate.wait()
            while writing.is_set():
                sealed.append(audit_seal(batch=20, wait=wait) or 0)
        except BaseException as error:
            errors.append(error)
        finally:
            connections.close_all()

    checks: list[int] = []

    def verifier() -> None:
        try:
            gate.wait()
            while writing.is_set():
                report = audit_verify(seal=False)
                assert not report.breaks, report.breaks
                checks.append(report.events)
        except BaseException as error:
            errors.append(error)
        finally:
            connections.close_all()

    writers = [threading.Thread(target=worker, args=(n,)) for n in range(threads_n)]
    sealers = [threading.Thread(target=sealer, args=(wait,)) for wait in (True, False)]
    sealers.append(threading.Thread(target=verifier))
    for thread in writers + sealers:
        thread.start()
    for thread in writers:
        thread.join()
    writing.clear()
    for thread in sealers:
        thread.join()
    assert not errors, errors[0]
    assert sum(sealed) > 0 and checks  # the sealers and the verifier did run while the writers wrote
    audit_seal()
    seqs = sorted(Event.objects.filter(task=task).values_list("seq", flat=True))
    assert seqs == list(range(1, len(seqs) + 1))  # no fork: each seq once, no gap
    # task created, items registered, the notes, the cancels (and the task's settling, if recorded)
    written = Event.objects.filter(task=task).exclude(kind="task_settled").count()
    assert written == 1 + len(items) + threads_n * per_thread + len(items)
    assert EventChain.objects.get(task_id=task.pk).seq == len(seqs)
    ok, report = _verify()
    assert ok, report
    assert "Not sealed yet: none" in report


@pytest.mark.django_db(transaction=True)
@pytest.mark.postgres
def test_an_event_that_commits_after_a_later_one_was_sealed_is_chained_after_it():
    """Ids are taken at insert, chains are sealed after commit: a transaction holding a lower id
    can commit after a higher id was sealed. It is sealed next, at the end of the chain."""
    task = make_task()
    audit_seal()
    inserted, release = threading.Event(), threading.Event()
    early: list[int] = []
    errors: list[BaseException] = []

    def slow_writer() -> None:
        try:
            with transaction.atomic():
                early.append(event_record(kind="note", actor="slow", task=task.pk, message="lower id").pk)
                inserted.set()
                assert release.wait(30)
        except BaseException as error:
            errors.append(error)
            inserted.set()
        finally:
            connections.close_all()

    thread = threading.Thread(target=slow_writer)
    thread.start()
    assert inserted.wait(30)
    late = event_record(kind="note", actor="fast", task=task.pk, message="higher id")
    assert early and early[0] < late.pk
    assert audit_seal() == 1  # only the committed one
    release.set()
    thread.join()
    assert not errors, errors[0]
    assert audit_seal() == 1
    first = Event.objects.get(pk=late.pk)
    second = Event.objects.get(pk=early[0])
    assert second.seq == first.seq + 1
    ok, report = _verify("--no-seal")
    assert ok, report


@pytest.mark.django_db
@pytest.mark.postgres
def test_the_seal_is_the_one_update_allowed_and_only_once():
    task = make_task()
    event = Event.objects.get(task=task)
    bad_seal = "UPDATE stopdesk_event SET seq = 1, hash = repeat('a', 64), message = 'rewritten' WHERE id = %s"
    with pytest.raises(DatabaseError, match="append-only"), transaction.atomic(), connection.cursor() as cursor:
        cursor.execute(bad_seal, [event.pk])  # a seal that also changes the content
    audit_seal()
    event = Event.objects.get(pk=event.pk)
    assert event.seq == 1 and len(event.hash) == 64
    reseal = "UPDATE stopdesk_event SET seq = 2, hash = repeat('b', 64) WHERE id = %s"
    with pytest.raises(DatabaseError, match="append-only"), transaction.atomic(), connection.cursor() as cursor:
        cursor.execute(reseal, [event.pk])  # sealed already
    assert Event.objects.get(pk=event.pk).hash == event.hash


@pytest.mark.django_db
@pytest.mark.postgres
def test_audit_verify_reports_unsealed_events_apart_from_broken_links():
    task = make_task()
    audit_seal()
    event_record(kind="note", actor="test", task=task, message="not sealed yet")
    ok, report = _verify("--no-seal")
    assert ok, report  # waiting for the sealer is not a broken link
    assert "0 broken" in report
    assert "Not sealed yet: 1 events, the oldest written" in report
    ok, report = _verify()
    assert ok, report
    assert "sealed 1 new events" in report and "Not sealed yet: none" in report


@pytest.mark.django_db
@pytest.mark.postgres
def test_a_sealed_event_edited_with_the_triggers_off_fails_verification():
    task = make_task()
    make_item(task)
    audit_seal()
    target = Event.objects.filter(task=task).order_by("seq").last()
    assert target is not None and target.seq > 0
    _tamper("UPDATE stopdesk_event SET data = '{\"amount\": 1}'::jsonb WHERE id = %s", [target.pk])
    ok, report = _verify()
    assert not ok
    assert f"event {target.pk}" in report and "does not match its content" in report
    # Passing it off as not sealed yet, so the sealer would chain the edit, leaves a gap.
    _tamper("UPDATE stopdesk_event SET seq = 0, hash = '' WHERE id = %s", [target.pk])
    ok, report = _verify()
    assert not ok
    assert f"task {task.pk}" in report


@pytest.mark.django_db
def test_the_beat_job_seals_a_bounded_batch():
    from stopdesk.tasks import seal_audit_events

    task = make_task()
    make_item(task)
    assert seal_audit_events() == Event.objects.filter(task=task).count()
    assert not Event.objects.filter(seq=0).exists()
    out = io.StringIO()
    call_command("audit_seal", stdout=out)
    assert "sealed 0 events; 0 not sealed yet" in out.getvalue()
    with pytest.raises(CommandError, match="--batch 0"):
        call_command("audit_seal", batch=0)


@pytest.mark.slow
def test_sqlite_refuses_changes_to_events_and_chains_them(tmp_path):
    """`make run`'s default database: the same protection without PostgreSQL."""
    script = """
from django.db import connection, DatabaseError
from stopdesk.services.items import task_create
from stopdesk.models import Event, Task
task = task_create(title="t", actor="test")
for sql in ("UPDATE stopdesk_event SET message = 'x'", "DELETE FROM stopdesk_event",
            "DELETE FROM stopdesk_task"):
    try:
        with connection.cursor() as cursor:
            cursor.execute(sql)
    except DatabaseError as error:
        print("refused:", error)
    else:
        print("accepted:", sql)
from stopdesk.services.audit_seal import audit_seal
print("unsealed:", Event.objects.get(task=task).seq)
audit_seal()
event = Event.objects.get(task=task)
print("chained:", event.seq, len(event.hash))
"""
    env = {**os.environ, "DATABASE_URL": f"sqlite:///{tmp_path / 'db.sqlite3'}", "STOPDESK_DATA_DIR": str(tmp_path)}
    manage = [sys.executable, str(ROOT / "manage.py")]
    subprocess.run([*manage, "migrate", "-v0"], env=env, check=True, cwd=ROOT, timeout=120)
    out = subprocess.run(
        [*manage, "shell", "-c", script], env=env, cwd=ROOT, timeout=120, capture_output=True, text=True
    )
    assert out.returncode == 0, out.stderr
    assert "accepted" not in out.stdout, out.stdout
    assert out.stdout.count("refused:") == 3, out.stdout
    assert "append-only" in out.stdout and "has audit events" in out.stdout
    assert "unsealed: 0" in out.stdout and "chained: 1 64" in out.stdout


@pytest.mark.django_db(transaction=True)
@pytest.mark.postgres
def test_set_based_moves_over_the_same_tasks_at_once_neither_deadlock_nor_fork():
    """Each statement moves items of several tasks and appends their events; two at once must take
    the rows in one order (by task), or each holds a row the other waits for. The chains they
    leave verify once sealed."""
    tasks = [make_task(f"t{n}") for n in range(6)]
    rounds = 10
    items = {t.pk: [make_item(t).pk for _ in range(rounds * 2)] for t in tasks}
    gate = threading.Barrier(2, timeout=30)
    errors: list[BaseException] = []

    def worker(n: int, order: list[int]) -> None:
        try:
            for r in range(rounds):
                gate.wait()
                # One item of every task; the ids ascend with the tasks for one thread and
                # descend for the other.
                mine = [items[t][r * 2 + n] for t in order]
                items_move(
                    where=Q(pk__in=mine), from_states=(S.QUEUED,), to_state=S.CANCELLED, actor="t", kind="c", message=""
                )
        except BaseException as error:
            errors.append(error)
            gate.abort()
        finally:
            connections.close_all()

    ids = [t.pk for t in tasks]
    threads = [threading.Thread(target=worker, args=(0, ids)), threading.Thread(target=worker, args=(1, ids[::-1]))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert not errors, errors[0]
    ok, report = _verify()
    assert ok, report
