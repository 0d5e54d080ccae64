"""Audit events refuse TRUNCATE on PostgreSQL and UPDATE/DELETE on SQLite too; tasks, items and
external records that have events cannot be deleted (PROTECT for the ORM, a trigger for raw SQL)."""

import django.db.models.deletion
from django.db import migrations, models

from stopdesk.audit_db import POSTGRES_PROTECT, SQLITE_PROTECT, sqlite_statements

TRIGGERS = [("stopdesk_event", "stopdesk_event_no_truncate"), ("stopdesk_event", "stopdesk_event_no_update"), ("stopdesk_event", "stopdesk_event_no_delete")] + [
    (table, f"{table}_{suffix}")
    for table in ("stopdesk_task", "stopdesk_workitem", "stopdesk_externalrecord")
    for suffix in ("keep_audited", "no_truncate")
]


def forward(apps, schema_editor):
    vendor = schema_editor.connection.vendor
    with schema_editor.connection.cursor() as cursor:
        if vendor == "postgresql":
            cursor.execute(POSTGRES_PROTECT)
        elif vendor == "sqlite":
            for statement in sqlite_statements(SQLITE_PROTECT):
                cursor.execute(statement)


def backward(apps, schema_editor):
    vendor = schema_editor.connection.vendor
    with schema_editor.connection.cursor() as cursor:
        for table, name in TRIGGERS:
            if vendor == "postgresql":
                cursor.execute(f"DROP TRIGGER IF EXISTS {name} ON {table}")
            elif vendor == "sqlite":
                cursor.execute(f"DROP TRIGGER IF EXISTS {name}")
        if vendor == "postgresql":
            cursor.execute("DROP FUNCTION IF EXISTS stopdesk_refuse_truncate(), stopdesk_keep_audited()")


class Migration(migrations.Migration):
    dependencies = [("stopdesk", "0007_merge_dashboard_labels")]

    operations = [
        migrations.AlterField(
            model_name="event",
            name="item",
            field=models.ForeignKey(blank=True, db_constraint=False, null=True, on_delete=django.db.models.deletion.PROTECT, related_name="events", to="stopdesk.workitem"),
        ),
        migrations.AlterField(
            model_name="event",
            name="task",
            field=models.ForeignKey(blank=True, db_constraint=False, db_index=False, null=True, on_delete=django.db.models.deletion.PROTECT, related_name="events", to="stopdesk.task"),
        ),
        migrations.RunPython(forward, backward),
    ]
