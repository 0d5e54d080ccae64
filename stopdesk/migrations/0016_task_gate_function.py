"""The per-task gate of the cancellation boundary (stopdesk.services.transitions.gate): a volatile
function that takes the task's advisory lock shared, then reads its stop with a fresh snapshot
(each statement of a VOLATILE function gets one in READ COMMITTED). PostgreSQL only: SQLite
serialises writers at BEGIN."""

from django.db import migrations

# GATE_CLASS is 0x53544F50 ("STOP"); the second key is the task id mod 2**32 as a signed int,
# as stopdesk.services.transitions.gate.gate_key computes it.
GATE_FUNCTION = """
CREATE OR REPLACE FUNCTION stopdesk_gate(task bigint) RETURNS boolean
LANGUAGE plpgsql VOLATILE AS $$
BEGIN
    PERFORM pg_advisory_xact_lock_shared(1398034256, (task % 4294967296 - 2147483648)::int);
    RETURN (SELECT stop_requested_at IS NOT NULL FROM stopdesk_task WHERE id = task);
END;
$$
"""


def forward(apps, schema_editor):
    if schema_editor.connection.vendor == "postgresql":
        with schema_editor.connection.cursor() as cursor:
            cursor.execute(GATE_FUNCTION)  # no parameters: its % is the operator


def backward(apps, schema_editor):
    if schema_editor.connection.vendor == "postgresql":
        with schema_editor.connection.cursor() as cursor:
            cursor.execute("DROP FUNCTION IF EXISTS stopdesk_gate(bigint)")


class Migration(migrations.Migration):
    # This migration was first released under another name; a database that applied it under that
    # name counts it as applied (Django records this name beside the old one on the next migrate)
    # and does not run it again.
    replaces = [("stopdesk", "0016_i15gate_task_gate")]

    dependencies = [
        ("stopdesk", "0015_audit_sealed_after_commit"),
    ]

    operations = [migrations.RunPython(forward, backward)]
