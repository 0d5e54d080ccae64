"""The audit trail: append-only at the database, rows it describes cannot vanish, tampering shows."""

import io
import os
import subprocess
import sys
from pathlib import Path

import pytest
from django.core.management import CommandError, call_command
from django.db import DatabaseError, connection, transaction
from django.db.models import ProtectedError

from stopdesk.models import Event, ExternalRecord, Task, WorkItem
from tests.factories import make_external_effect, make_item, make_task

ROOT = Path(__file__).resolve().parents[2]


def _verify() -> tuple[bool, str]:
    out = io.StringIO()
    try:
        call_command("audit_verify", stdout=out, stderr=out)
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


@pytest.mark.slow
def test_sqlite_refuses_changes_to_events(tmp_path):
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
