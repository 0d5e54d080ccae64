"""The audit trail's database side: triggers that keep events append-only, keep the rows they
describe, and (below) chain each task's events by hash.

Every writer is covered, the ORM and set-based SQL alike, because the database does the work.
A database owner can still switch triggers off; the hash chain is what makes that visible.
"""

from __future__ import annotations

from typing import Any

# PostgreSQL. UPDATE and DELETE of events were refused since migration 0002.
POSTGRES_PROTECT = """
CREATE OR REPLACE FUNCTION stopdesk_refuse_truncate() RETURNS trigger AS $$
BEGIN
    RAISE EXCEPTION '% is append-only (TRUNCATE refused)', TG_TABLE_NAME;
END;
$$ LANGUAGE plpgsql;

CREATE OR REPLACE FUNCTION stopdesk_keep_audited() RETURNS trigger AS $$
BEGIN
    IF TG_TABLE_NAME = 'stopdesk_task' THEN
        IF EXISTS (SELECT 1 FROM stopdesk_event WHERE task_id = OLD.id) THEN
            RAISE EXCEPTION 'task % has audit events; it cannot be deleted', OLD.id;
        END IF;
    ELSIF TG_TABLE_NAME = 'stopdesk_workitem' THEN
        IF EXISTS (SELECT 1 FROM stopdesk_event WHERE item_id = OLD.id) THEN
            RAISE EXCEPTION 'work item % has audit events; it cannot be deleted', OLD.id;
        END IF;
    ELSIF EXISTS (SELECT 1 FROM stopdesk_event WHERE item_id = OLD.item_id) THEN
        RAISE EXCEPTION 'external record % has audit events (on item %); it cannot be deleted', OLD.id, OLD.item_id;
    END IF;
    RETURN OLD;
END;
$$ LANGUAGE plpgsql;

CREATE TRIGGER stopdesk_event_no_truncate BEFORE TRUNCATE ON stopdesk_event
    FOR EACH STATEMENT EXECUTE FUNCTION stopdesk_refuse_truncate();
""" + "".join(
    f"""
CREATE TRIGGER {table}_keep_audited BEFORE DELETE ON {table}
    FOR EACH ROW EXECUTE FUNCTION stopdesk_keep_audited();
CREATE TRIGGER {table}_no_truncate BEFORE TRUNCATE ON {table}
    FOR EACH STATEMENT EXECUTE FUNCTION stopdesk_refuse_truncate();
"""
    for table in ("stopdesk_task", "stopdesk_workitem", "stopdesk_externalrecord")
)

# SQLite. `stopdesk_audit_guard()` is registered on every connection the application opens (1);
# a tool without it (the sqlite3 shell) fails on the triggers instead of writing past them.
# Statements are separated by blank lines.
SQLITE_EVENT_NO_UPDATE = """CREATE TRIGGER stopdesk_event_no_update BEFORE UPDATE ON stopdesk_event
WHEN stopdesk_audit_guard()
BEGIN SELECT RAISE(ABORT, 'stopdesk_event is append-only (UPDATE refused)'); END;"""

SQLITE_PROTECT = f"""{SQLITE_EVENT_NO_UPDATE}

CREATE TRIGGER stopdesk_event_no_delete BEFORE DELETE ON stopdesk_event
WHEN stopdesk_audit_guard()
BEGIN SELECT RAISE(ABORT, 'stopdesk_event is append-only (DELETE refused)'); END;

CREATE TRIGGER stopdesk_task_keep_audited BEFORE DELETE ON stopdesk_task
WHEN stopdesk_audit_guard() AND EXISTS (SELECT 1 FROM stopdesk_event WHERE task_id = OLD.id)
BEGIN SELECT RAISE(ABORT, 'task has audit events; it cannot be deleted'); END;

CREATE TRIGGER stopdesk_workitem_keep_audited BEFORE DELETE ON stopdesk_workitem
WHEN stopdesk_audit_guard() AND EXISTS (SELECT 1 FROM stopdesk_event WHERE item_id = OLD.id)
BEGIN SELECT RAISE(ABORT, 'work item has audit events; it cannot be deleted'); END;

CREATE TRIGGER stopdesk_externalrecord_keep_audited BEFORE DELETE ON stopdesk_externalrecord
WHEN stopdesk_audit_guard() AND EXISTS (SELECT 1 FROM stopdesk_event WHERE item_id = OLD.item_id)
BEGIN SELECT RAISE(ABORT, 'external record has audit events (on its item); it cannot be deleted'); END;"""


def sqlite_statements(script: str) -> list[str]:
    return [statement for statement in script.split("\n\n") if statement.strip()]


def sqlite_register(dbapi_connection: Any) -> None:
    """Give a SQLite connection the functions the audit triggers call."""
    dbapi_connection.create_function("stopdesk_audit_guard", 0, lambda: 1)
