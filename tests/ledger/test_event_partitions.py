"""The audit table by month on PostgreSQL: partitions made ahead, every one append-only and
chained, and a month archived without losing a chain or anything a reviewer still needs."""

import gzip
import io
import json
import threading
import time
from datetime import UTC, date, datetime

import pytest
from django.core.management import CommandError, call_command
from django.db import DatabaseError, connection, connections, transaction
from django.test import Client
from django.urls import reverse

from reconcile.models import Compensation
from stopdesk.models import Event, EventChain
from stopdesk.services.audit_seal import audit_seal
from stopdesk.services.events import event_record
from stopdesk.services.partitions import ArchiveRefused, event_partitions, event_partitions_ensure, events_archive
from stopdesk.states import ItemState as S
from tests.factories import make_external_effect, make_item, make_task

pytestmark = [pytest.mark.django_db, pytest.mark.postgres]

PAST = date(2025, 3, 1)


def _past_event(task, item=None, minute=0) -> Event:  # type: ignore[no-untyped-def]
    at = datetime(PAST.year, PAST.month, 10, 12, minute, tzinfo=UTC)
    return Event.objects.create(at=at, task=task, item=item, kind="note", actor="test", message=f"m{minute}")


def _ensure_past_month() -> str:
    with connection.cursor() as cursor:
        cursor.execute("SELECT stopdesk_event_partition(%s)", [PAST])
        return cursor.fetchone()[0]


def _verify() -> str:
    out = io.StringIO()
    call_command("audit_verify", stdout=out)
    return out.getvalue()


def test_partitions_are_made_months_ahead_and_events_land_in_their_month():
    made = event_partitions_ensure(months_ahead=2)
    assert len(made) == 3
    months = {p.month for p in event_partitions()}
    today = date.today().replace(day=1)
    assert today in months
    task = make_task()
    with connection.cursor() as cursor:
        cursor.execute("SELECT tableoid::regclass::text FROM stopdesk_event WHERE task_id = %s", [task.pk])
        assert cursor.fetchone()[0] == f"stopdesk_event_{today:%Y_%m}"
    assert event_partitions_ensure(months_ahead=2) == made  # idempotent


def test_every_partition_is_append_only_and_refuses_truncate():
    task = make_task()
    _ensure_past_month()
    _past_event(task)
    with connection.cursor() as cursor:
        cursor.execute("SELECT DISTINCT tableoid::regclass::text FROM stopdesk_event")
        with_rows = {row[0] for row in cursor.fetchall()}
    assert len(with_rows) == 2
    for part in event_partitions():
        statements = [f"TRUNCATE {part.name}"]
        if part.name in with_rows:  # a row trigger fires only for a row
            statements += [f"UPDATE {part.name} SET message = 'x'", f"DELETE FROM {part.name}"]
        for sql in statements:
            with pytest.raises(DatabaseError, match="append-only"), transaction.atomic(), connection.cursor() as c:
                c.execute(sql)
        with connection.cursor() as cursor:
            cursor.execute("SELECT tgname FROM pg_trigger WHERE tgrelid = %s::regclass", [part.name])
            names = {row[0] for row in cursor.fetchall()}
        assert {"stopdesk_event_append_only", "stopdesk_event_no_truncate"} <= names, part
        assert not {"stopdesk_event_chain", "stopdesk_event_chain_flush"} & names, part  # sealed after commit


def test_an_insert_straight_into_a_partition_is_sealed_too():
    task = make_task()
    name = f"stopdesk_event_{date.today():%Y_%m}"
    with connection.cursor() as cursor:
        cursor.execute(
            f"INSERT INTO {name} (at, task_id, kind, actor, from_state, to_state, message, data)"
            " VALUES (now(), %s, 'raw', 'sql', '', '', '', '{}')",
            [task.pk],
        )
    assert audit_seal() == 2
    assert list(Event.objects.filter(task=task).order_by("seq").values_list("seq", flat=True)) == [1, 2]
    assert "0 broken" in _verify()


def test_archiving_a_month_keeps_the_chain_and_the_timeline(tmp_path, cast):
    _ensure_past_month()
    task = make_task()  # its first event is this month; the notes below are back-dated
    old = [_past_event(task, minute=m) for m in range(3)]
    event_record(kind="later", actor="test", task=task)
    assert "0 broken" in _verify()  # and sealed
    old_seqs = list(Event.objects.filter(pk__in=[e.pk for e in old]).values_list("seq", flat=True))
    out = io.StringIO()
    call_command("events_archive", month=f"{PAST:%Y-%m}", to=tmp_path, stdout=out)
    assert "archived stopdesk_event_2025_03: 3 events" in out.getvalue()
    assert not Event.objects.filter(pk__in=[e.pk for e in old]).exists()
    chain = EventChain.objects.get(task_id=task.pk)
    assert chain.anchor_seq == max(old_seqs) == 4
    assert "0 broken" in _verify()  # the live events check from the anchor
    with gzip.open(tmp_path / "stopdesk_event_2025_03.csv.gz", "rt") as export:
        lines = export.read().splitlines()
    assert len(lines) == 4 and lines[0].startswith("id,at,kind")
    manifest = json.loads((tmp_path / "stopdesk_event_2025_03.manifest.json").read_text())
    assert manifest["anchors"][str(task.pk)]["seq"] == chain.anchor_seq
    client = Client()
    client.force_login(cast["admin"])
    page = client.get(reverse("admin:stopdesk_task_timeline", args=[task.pk])).content.decode()
    assert f"the first {chain.anchor_seq} were archived" in page
    assert "later" in page


def test_archiving_refuses_a_month_a_review_still_needs(tmp_path):
    _ensure_past_month()
    task = make_task()
    item = make_item(task, state=S.UNCERTAIN)
    _past_event(task, item=item)
    with pytest.raises(CommandError, match=rf"still under review.*tasks {task.pk}"):
        call_command("events_archive", month=f"{PAST:%Y-%m}", to=tmp_path)
    assert Event.objects.filter(task=task, kind="note").exists()
    assert not list(tmp_path.iterdir())


def test_archiving_refuses_a_month_a_compensation_under_way_still_needs(tmp_path, django_user_model):
    """Compensations are reconcile's: the ledger learns of them through its open-work port."""
    _ensure_past_month()
    task = make_task()
    item = make_external_effect(task)
    _past_event(task, item=item)
    reviewer = django_user_model.objects.create_user("reviewer")
    record = item.external_records.get()
    Compensation.objects.create(external_record=record, action="archive", expected_version="1", proposed_by=reviewer)
    with pytest.raises(CommandError, match=rf"tasks {task.pk}"):
        call_command("events_archive", month=f"{PAST:%Y-%m}", to=tmp_path)
    assert Event.objects.filter(task=task, kind="note").exists()


def test_archiving_refuses_this_month(tmp_path):
    with pytest.raises(CommandError, match="only past months"):
        call_command("events_archive", month=f"{date.today():%Y-%m}", to=tmp_path)


def test_archiving_seals_the_month_first(tmp_path):
    _ensure_past_month()
    task = make_task()
    audit_seal()
    _past_event(task)  # committed, not sealed yet
    call_command("events_archive", month=f"{PAST:%Y-%m}", to=tmp_path, stdout=io.StringIO())
    with gzip.open(tmp_path / "stopdesk_event_2025_03.csv.gz", "rt") as export:
        lines = export.read().splitlines()
    assert len(lines) == 2 and lines[1].endswith(",2")  # sealed as the task's second event
    assert EventChain.objects.get(task_id=task.pk).anchor_seq == 2
    assert "0 broken" in _verify()


@pytest.mark.django_db(transaction=True)
def test_archiving_drops_nothing_when_the_export_read_back_does_not_match(tmp_path):
    """The export is damaged after it was written (here: cut to its first rows while the archive
    waits for a chain head a reader holds); the archive reads it back, refuses, and the month
    stays in the database with its chains as they were."""
    _ensure_past_month()
    task = make_task()
    for minute in range(5):
        _past_event(task, minute=minute)
    audit_seal()
    export = tmp_path / "stopdesk_event_2025_03.csv.gz"
    outcome: list[BaseException | None] = []

    def archive() -> None:
        try:
            events_archive(month=PAST, out_dir=tmp_path, today=date.today())
            outcome.append(None)
        except BaseException as error:
            outcome.append(error)
        finally:
            connections.close_all()

    holder = connections.create_connection("default")
    try:
        with holder.cursor() as cursor:
            cursor.execute("BEGIN")
            cursor.execute("SELECT 1 FROM stopdesk_eventchain WHERE task_id = %s FOR UPDATE", [task.pk])
            thread = threading.Thread(target=archive)
            thread.start()
            deadline = time.monotonic() + 30
            while True:  # the export is written and the archive waits for the head
                with connection.cursor() as watch:  # not the holder's: its view is fixed for its transaction
                    watch.execute(
                        "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' AND query LIKE %s",
                        ["%UPDATE stopdesk_eventchain c SET anchor_seq%"],
                    )
                    waiting = watch.fetchone()[0]
                if waiting and export.exists():
                    break
                assert time.monotonic() < deadline and thread.is_alive(), outcome
                time.sleep(0.05)
            with gzip.open(export, "rt") as written:
                lines = written.read().splitlines()
            assert len(lines) == 6
            with gzip.open(export, "wt") as damaged:
                damaged.write("\n".join(lines[:3]) + "\n")
            cursor.execute("COMMIT")
    finally:
        holder.close()
    thread.join(30)
    assert len(outcome) == 1 and isinstance(outcome[0], ArchiveRefused), outcome
    assert "differs from what was written" in str(outcome[0]) and "nothing was dropped" in str(outcome[0])
    assert "stopdesk_event_2025_03" in {p.name for p in event_partitions()}
    assert Event.objects.filter(task=task, kind="note").count() == 5
    assert EventChain.objects.get(task_id=task.pk).anchor_seq == 0
    assert not list(tmp_path.iterdir())  # the unverified export is not left to pass for an archive
    assert "0 broken" in _verify()
