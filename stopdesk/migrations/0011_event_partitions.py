"""On PostgreSQL the audit table becomes partitioned by month of `at` (declarative partitioning),
with the append-only, TRUNCATE and chain triggers on every partition. Existing events are moved
as they are (their chain is unchanged). SQLite has no partitioning and keeps its table; the model
is the same on both, so this migration changes no Django state."""

from django.db import migrations

from stopdesk.audit_db import (
    EVENT_COLUMNS,
    POSTGRES_PARTITION_FUNCTION,
    postgres_event_table_triggers,
    postgres_partitioned_event_table,
)

MONTHS_AHEAD = 3


def forward(apps, schema_editor):
    if schema_editor.connection.vendor != "postgresql":
        return
    with schema_editor.connection.cursor() as cursor:
        cursor.execute(
            "SELECT indexname FROM pg_indexes WHERE tablename = 'stopdesk_event' AND indexname <> 'stopdesk_event_pkey'"
        )
        index_names = [row[0] for row in cursor.fetchall()]
        cursor.execute(
            "SELECT indexname, indexdef FROM pg_indexes WHERE tablename = 'stopdesk_event' AND indexname <> 'stopdesk_event_pkey'"
        )
        definitions = cursor.fetchall()
        cursor.execute("ALTER TABLE stopdesk_event RENAME TO stopdesk_event_unpartitioned")
        cursor.execute("ALTER TABLE stopdesk_event_unpartitioned RENAME CONSTRAINT stopdesk_event_pkey TO stopdesk_event_unpartitioned_pkey")
        cursor.execute("SELECT pg_get_serial_sequence('stopdesk_event_unpartitioned', 'id')")
        (sequence,) = cursor.fetchone()
        if sequence:
            cursor.execute(f"ALTER SEQUENCE {sequence} RENAME TO stopdesk_event_unpartitioned_id_seq")
        for name in index_names:
            cursor.execute(f'ALTER INDEX "{name}" RENAME TO "{name}_unpartitioned"')
        cursor.execute(postgres_partitioned_event_table())
        cursor.execute(POSTGRES_PARTITION_FUNCTION)
        # Every month that has events, and the next few.
        cursor.execute(
            """
            SELECT stopdesk_event_partition(m::date) FROM generate_series(
                date_trunc('month', coalesce((SELECT min(at) FROM stopdesk_event_unpartitioned), now())),
                date_trunc('month', greatest(now(), coalesce((SELECT max(at) FROM stopdesk_event_unpartitioned), now())))
                    + %s * interval '1 month',
                interval '1 month') m
            """,
            [MONTHS_AHEAD],
        )
        for name, definition in definitions:
            # Same names as before, so later migrations find them; on the partitioned table.
            cursor.execute(definition.replace(" ON public.stopdesk_event ", " ON stopdesk_event ").replace(" ON ONLY public.stopdesk_event ", " ON stopdesk_event "))
        cursor.execute(f"INSERT INTO stopdesk_event ({EVENT_COLUMNS}) SELECT {EVENT_COLUMNS} FROM stopdesk_event_unpartitioned")
        cursor.execute("SELECT setval('stopdesk_event_id_seq', coalesce((SELECT max(id) FROM stopdesk_event), 0) + 1, false)")
        cursor.execute("DROP TABLE stopdesk_event_unpartitioned")
        cursor.execute(postgres_event_table_triggers("stopdesk_event"))
        # Fresh partitions have no statistics until autovacuum comes by; without them the planner
        # walks the time index for a task's events.
        cursor.execute("ANALYZE stopdesk_event")


def backward(apps, schema_editor):
    if schema_editor.connection.vendor != "postgresql":
        return
    raise RuntimeError("Turning the partitioned audit table back into one table is not supported; restore a backup.")


class Migration(migrations.Migration):
    dependencies = [("stopdesk", "0010_scale_indexes")]
    operations = [migrations.RunPython(forward, backward)]
