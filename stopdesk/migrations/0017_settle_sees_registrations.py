"""The settle check's second look (stopdesk.services.transitions.settled): a volatile function that
answers whether the task has work in one of the given states, and if it seems to have none, locks
the task row and asks again with a fresh snapshot. A settle statement's own snapshot is taken
before it waits for the row, so it cannot see an item that a registration holding the row commits
meanwhile; this function, called per row, can. Its declared cost makes the planner call it after
the statement's cheap checks. PostgreSQL only: SQLite serialises writers at BEGIN.

And two partial indexes: the settle sweep's (the tasks not settled yet) and the review queue's
oldest uncertain item."""

from django.db import migrations, models

BUSY_FUNCTION = """
CREATE OR REPLACE FUNCTION stopdesk_task_busy(task bigint, open_states text[]) RETURNS boolean
LANGUAGE plpgsql VOLATILE COST 10000 AS $$
BEGIN
    IF EXISTS (SELECT 1 FROM stopdesk_workitem WHERE task_id = task AND state = ANY(open_states)) THEN
        RETURN true;  -- the common answer, without a lock
    END IF;
    PERFORM 1 FROM stopdesk_task WHERE id = task FOR NO KEY UPDATE;
    RETURN EXISTS (SELECT 1 FROM stopdesk_workitem WHERE task_id = task AND state = ANY(open_states));
END;
$$
"""


def forward(apps, schema_editor):
    if schema_editor.connection.vendor == "postgresql":
        with schema_editor.connection.cursor() as cursor:
            cursor.execute(BUSY_FUNCTION)


def backward(apps, schema_editor):
    if schema_editor.connection.vendor == "postgresql":
        with schema_editor.connection.cursor() as cursor:
            cursor.execute("DROP FUNCTION IF EXISTS stopdesk_task_busy(bigint, text[])")


class Migration(migrations.Migration):

    dependencies = [
        ("stopdesk", "0016_task_gate_function"),
    ]

    operations = [
        migrations.RunPython(forward, backward),
        migrations.AddIndex(
            model_name="task",
            index=models.Index(condition=models.Q(("settled_at__isnull", True)), fields=["id"], name="task_unsettled"),
        ),
        migrations.AddIndex(
            model_name="workitem",
            index=models.Index(
                condition=models.Q(("state", "uncertain")), fields=["updated_at"], name="item_uncertain_since"
            ),
        ),
    ]
