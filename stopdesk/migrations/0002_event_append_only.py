"""On PostgreSQL, audit events are append-only at the database too: UPDATE and DELETE raise."""

from django.db import migrations

FORWARD = """
CREATE OR REPLACE FUNCTION stopdesk_event_append_only() RETURNS trigger AS $$
BEGIN
    RAISE EXCEPTION 'stopdesk_event is append-only (% refused)', TG_OP;
END;
$$ LANGUAGE plpgsql;
CREATE TRIGGER stopdesk_event_append_only
    BEFORE UPDATE OR DELETE ON stopdesk_event
    FOR EACH ROW EXECUTE FUNCTION stopdesk_event_append_only();
"""
BACKWARD = """
DROP TRIGGER IF EXISTS stopdesk_event_append_only ON stopdesk_event;
DROP FUNCTION IF EXISTS stopdesk_event_append_only();
"""


def forward(apps, schema_editor):
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute(FORWARD, params=None)


def backward(apps, schema_editor):
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute(BACKWARD, params=None)


class Migration(migrations.Migration):
    dependencies = [("stopdesk", "0001_initial")]
    operations = [migrations.RunPython(forward, backward)]
