"""The audit trail's database side: triggers that keep events append-only and keep the rows they
describe, and (below) how each task's events are chained by hash.

Every writer is covered, the ORM and set-based SQL alike, because the database does the work.
A database owner can still switch triggers off; the hash chain is what makes that visible. The
chain is sealed after commit by `stopdesk.services.audit_seal` (from migration 0015); the
definitions that chained in the insert trigger (migrations 0009 and 0011) are kept below as the
history those migrations run.
"""

from __future__ import annotations

import hashlib
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

# SQLite. Remaking a table there (how Django alters most columns on SQLite) drops its triggers and
# trips over the others that name it: a migration that alters one of these tables drops them all
# first (SQLITE_TRIGGERS) and creates them again after. `stopdesk_audit_guard()` is registered on every connection the application opens (1);
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


SQLITE_TRIGGERS = (
    "stopdesk_event_no_update",
    "stopdesk_event_no_delete",
    "stopdesk_event_chain",
    "stopdesk_task_keep_audited",
    "stopdesk_workitem_keep_audited",
    "stopdesk_externalrecord_keep_audited",
)


def sqlite_statements(script: str) -> list[str]:
    return [statement for statement in script.split("\n\n") if statement.strip()]


def sqlite_register(dbapi_connection: Any) -> None:
    """Give a SQLite connection the functions the audit triggers call."""
    dbapi_connection.create_function("stopdesk_audit_guard", 0, lambda: 1)
    dbapi_connection.create_function("stopdesk_event_hash", 11, digest, deterministic=True)


# The hash chain. Each event's hash is SHA-256 over the previous event's hash (empty for a task's
# first event) and the event's own columns as text, each written as `<length>:<text>` so no two
# different events spell the same input. PostgreSQL computes it in a trigger with the renderings
# of `POSTGRES_COLUMNS`; SQLite's trigger calls `digest` with the columns as stored.
#
# The event's columns in chain order (`{r}` is the row's qualifier: "NEW." in the trigger, "" in
# a query). `at` is UTC with microseconds; `data` is jsonb's canonical text.
POSTGRES_COLUMNS = (
    "{r}seq::text",
    "coalesce({r}task_id::text, '')",
    "coalesce({r}item_id::text, '')",
    "to_char({r}at AT TIME ZONE 'UTC', 'YYYY-MM-DD HH24:MI:SS.US')",
    "{r}kind",
    "{r}actor",
    "{r}from_state",
    "{r}to_state",
    "{r}message",
    "{r}data::text",
)
# The same columns read back raw from SQLite (an expression has no declared type, so the driver
# leaves the stored text alone).
SQLITE_COLUMNS = (
    "seq",
    "task_id",
    "item_id",
    "at || ''",
    "kind",
    "actor",
    "from_state",
    "to_state",
    "message",
    "data || ''",
)


def digest(prev: str, *columns: Any) -> str:
    parts = [prev or "", *("" if value is None else str(value) for value in columns)]
    return hashlib.sha256("".join(f"{len(part)}:{part}" for part in parts).encode()).hexdigest()


def postgres_columns(row: str = "") -> list[str]:
    return [column.format(r=row) for column in POSTGRES_COLUMNS]


def postgres_digest_sql(prev: str, row: str) -> str:
    """The SQL expression of `digest` over `row` (NEW in a trigger), with `prev` the previous hash."""
    texts = [prev, *postgres_columns(f"{row}.")]
    body = " || ".join(f"length({text}) || ':' || {text}" for text in texts)
    return f"encode(sha256(convert_to({body}, 'UTF8')), 'hex')"


# History (migrations 0009 and 0011; replaced by SEALED_* below in 0015). The chain trigger keeps the head of the task it is appending to in a
# transaction-local setting, "task seq hash dirty|clean", and writes it to stopdesk_eventchain when
# it moves to another task and at the end of each statement: a set-based INSERT of 10,000 events
# updates the head row once, not 10,000 times (repeated updates of one row inside a transaction
# cost time quadratic in their number). The head row is locked FOR UPDATE at first use and stays
# locked until commit, so a second transaction appending to the same task waits and then reads
# the committed head: the chain never forks. The setting is rolled back with a savepoint exactly
# as the head row is.
POSTGRES_CHAIN = f"""
CREATE OR REPLACE FUNCTION stopdesk_event_chain() RETURNS trigger AS $$
DECLARE
    chain_key bigint := coalesce(NEW.task_id, 0);
    cached text[] := string_to_array(nullif(current_setting('stopdesk.chain', true), ''), ' ');
    prev_seq bigint;
    prev_hash text;
BEGIN
    IF cached IS NOT NULL AND cached[1]::bigint = chain_key THEN
        prev_seq := cached[2]::bigint;
        prev_hash := cached[3];
    ELSE
        IF cached IS NOT NULL AND cached[4] = 'dirty' THEN
            UPDATE stopdesk_eventchain SET seq = cached[2]::bigint, hash = cached[3]
                WHERE task_id = cached[1]::bigint;
        END IF;
        SELECT c.seq, c.hash INTO prev_seq, prev_hash
            FROM stopdesk_eventchain c WHERE c.task_id = chain_key FOR UPDATE;
        IF NOT FOUND THEN
            -- A task's first event; two first events at once meet in the primary key and the
            -- second then reads (and locks) the first's committed head.
            INSERT INTO stopdesk_eventchain (task_id, seq, hash, anchor_seq, anchor_hash)
                VALUES (chain_key, 0, '', 0, '') ON CONFLICT (task_id) DO NOTHING;
            SELECT c.seq, c.hash INTO prev_seq, prev_hash
                FROM stopdesk_eventchain c WHERE c.task_id = chain_key FOR UPDATE;
        END IF;
    END IF;
    NEW.seq := prev_seq + 1;
    NEW.hash := {postgres_digest_sql("prev_hash", "NEW")};
    PERFORM set_config('stopdesk.chain', chain_key || ' ' || NEW.seq || ' ' || NEW.hash || ' dirty', true);
    RETURN NEW;
END;
$$ LANGUAGE plpgsql;

CREATE OR REPLACE FUNCTION stopdesk_event_chain_flush() RETURNS trigger AS $$
DECLARE
    cached text[] := string_to_array(nullif(current_setting('stopdesk.chain', true), ''), ' ');
BEGIN
    IF cached IS NOT NULL AND cached[4] = 'dirty' THEN
        UPDATE stopdesk_eventchain SET seq = cached[2]::bigint, hash = cached[3] WHERE task_id = cached[1]::bigint;
        PERFORM set_config('stopdesk.chain', cached[1] || ' ' || cached[2] || ' ' || cached[3] || ' clean', true);
    END IF;
    RETURN NULL;
END;
$$ LANGUAGE plpgsql;

CREATE TRIGGER stopdesk_eventchain_no_truncate BEFORE TRUNCATE ON stopdesk_eventchain
    FOR EACH STATEMENT EXECUTE FUNCTION stopdesk_refuse_truncate();
"""


def postgres_chain_triggers(table: str) -> str:
    """The chain's triggers on an event table (on a partitioned table they reach every partition)."""
    return f"""
    CREATE TRIGGER stopdesk_event_chain BEFORE INSERT ON {table}
        FOR EACH ROW EXECUTE FUNCTION stopdesk_event_chain();
    CREATE TRIGGER stopdesk_event_chain_flush AFTER INSERT ON {table}
        FOR EACH STATEMENT EXECUTE FUNCTION stopdesk_event_chain_flush();
    """


# SQLite. A trigger cannot change NEW there, so the chain is written by an UPDATE right after the
# insert, the one UPDATE the append-only guard lets through (hash still empty, nothing else
# changed). SQLite runs one writer at a time, so the head needs no lock.
_SAME_ROW = " AND ".join(
    f"NEW.{c} IS OLD.{c}"
    for c in ("id", "at", "task_id", "item_id", "kind", "actor", "from_state", "to_state", "message", "data")
)
SQLITE_CHAIN = f"""CREATE TRIGGER stopdesk_event_no_update BEFORE UPDATE ON stopdesk_event
WHEN stopdesk_audit_guard() AND NOT (OLD.hash = '' AND NEW.hash <> '' AND {_SAME_ROW})
BEGIN SELECT RAISE(ABORT, 'stopdesk_event is append-only (UPDATE refused)'); END;

CREATE TRIGGER stopdesk_event_chain AFTER INSERT ON stopdesk_event
BEGIN
    INSERT INTO stopdesk_eventchain (task_id, seq, hash, anchor_seq, anchor_hash)
        VALUES (coalesce(NEW.task_id, 0), 0, '', 0, '') ON CONFLICT (task_id) DO NOTHING;
    UPDATE stopdesk_event SET
        seq = (SELECT c.seq + 1 FROM stopdesk_eventchain c WHERE c.task_id = coalesce(NEW.task_id, 0)),
        hash = (SELECT stopdesk_event_hash(c.hash, c.seq + 1, NEW.task_id, NEW.item_id, NEW.at, NEW.kind,
                    NEW.actor, NEW.from_state, NEW.to_state, NEW.message, NEW.data)
                FROM stopdesk_eventchain c WHERE c.task_id = coalesce(NEW.task_id, 0))
        WHERE id = NEW.id;
    UPDATE stopdesk_eventchain SET
        seq = (SELECT e.seq FROM stopdesk_event e WHERE e.id = NEW.id),
        hash = (SELECT e.hash FROM stopdesk_event e WHERE e.id = NEW.id)
        WHERE task_id = coalesce(NEW.task_id, 0);
END;"""


# Partitions (PostgreSQL). The event table is partitioned by month of `at`; row triggers on the
# partitioned table reach every partition, TRUNCATE triggers do not, so each partition gets its
# own, and the chain's statement trigger too (for an INSERT aimed at a partition directly). A
# DEFAULT partition catches rows outside every month (a clock far off); the daily job creates
# months ahead so it stays empty. The primary key is (id, at): a partitioned table's unique
# indexes must include the partition key. Ids still come from one sequence.
POSTGRES_PARTITION_FUNCTION = """
CREATE OR REPLACE FUNCTION stopdesk_event_partition(month date) RETURNS text AS $$
DECLARE
    first date := date_trunc('month', month)::date;
    name text := 'stopdesk_event_' || to_char(first, 'YYYY_MM');
BEGIN
    IF to_regclass(name) IS NOT NULL THEN
        RETURN name;
    END IF;
    EXECUTE format('CREATE TABLE %I PARTITION OF stopdesk_event FOR VALUES FROM (%L) TO (%L)',
                   name, first::timestamptz, (first + interval '1 month')::timestamptz);
    EXECUTE format('CREATE TRIGGER stopdesk_event_no_truncate BEFORE TRUNCATE ON %I
                    FOR EACH STATEMENT EXECUTE FUNCTION stopdesk_refuse_truncate()', name);
    EXECUTE format('CREATE TRIGGER stopdesk_event_chain_flush AFTER INSERT ON %I
                    FOR EACH STATEMENT EXECUTE FUNCTION stopdesk_event_chain_flush()', name);
    RETURN name;
END;
$$ LANGUAGE plpgsql;
"""

EVENT_COLUMNS = "id, at, kind, actor, from_state, to_state, message, data, task_id, item_id, hash, seq"


def postgres_partitioned_event_table() -> str:
    return """
    CREATE SEQUENCE stopdesk_event_id_seq AS bigint;
    CREATE TABLE stopdesk_event (
        id bigint NOT NULL DEFAULT nextval('stopdesk_event_id_seq'),
        at timestamp with time zone NOT NULL,
        kind varchar(40) NOT NULL,
        actor varchar(200) NOT NULL,
        from_state varchar(32) NOT NULL,
        to_state varchar(32) NOT NULL,
        message text NOT NULL,
        data jsonb NOT NULL,
        task_id bigint,
        item_id bigint,
        hash varchar(64) NOT NULL DEFAULT '',
        seq bigint NOT NULL DEFAULT 0,
        PRIMARY KEY (id, at)
    ) PARTITION BY RANGE (at);
    ALTER SEQUENCE stopdesk_event_id_seq OWNED BY stopdesk_event.id;
    CREATE TABLE stopdesk_event_default PARTITION OF stopdesk_event DEFAULT;
    CREATE TRIGGER stopdesk_event_no_truncate BEFORE TRUNCATE ON stopdesk_event_default
        FOR EACH STATEMENT EXECUTE FUNCTION stopdesk_refuse_truncate();
    CREATE TRIGGER stopdesk_event_chain_flush AFTER INSERT ON stopdesk_event_default
        FOR EACH STATEMENT EXECUTE FUNCTION stopdesk_event_chain_flush();
    """


def postgres_event_table_triggers(table: str) -> str:
    return f"""
    CREATE TRIGGER stopdesk_event_append_only BEFORE UPDATE OR DELETE ON {table}
        FOR EACH ROW EXECUTE FUNCTION stopdesk_event_append_only();
    CREATE TRIGGER stopdesk_event_no_truncate BEFORE TRUNCATE ON {table}
        FOR EACH STATEMENT EXECUTE FUNCTION stopdesk_refuse_truncate();
    {postgres_chain_triggers(table)}
    """


# Sealed after commit (migration 0015). The insert trigger no longer chains: an event is written
# with seq 0 and an empty hash, and the sealer (stopdesk.services.audit_seal) gives it its place
# and hash after it committed, in bounded batches under one lock. Appends to one task no longer
# wait for each other until commit. Sealing is the one UPDATE the append-only trigger lets
# through: once (from seq 0 and an empty hash), with every other column unchanged.
_PG_SAME_ROW = (
    "(NEW.id, NEW.at, NEW.task_id, NEW.item_id, NEW.kind, NEW.actor, NEW.from_state, NEW.to_state, NEW.message,"
    " NEW.data) IS NOT DISTINCT FROM (OLD.id, OLD.at, OLD.task_id, OLD.item_id, OLD.kind, OLD.actor,"
    " OLD.from_state, OLD.to_state, OLD.message, OLD.data)"
)
POSTGRES_SEALED_APPEND_ONLY = f"""
CREATE OR REPLACE FUNCTION stopdesk_event_append_only() RETURNS trigger AS $$
BEGIN
    IF TG_OP = 'UPDATE' AND OLD.seq = 0 AND OLD.hash = '' AND NEW.seq > 0 AND length(NEW.hash) = 64
       AND {_PG_SAME_ROW} THEN
        RETURN NEW;  -- the seal
    END IF;
    RAISE EXCEPTION 'stopdesk_event is append-only (% refused)', TG_OP;
END;
$$ LANGUAGE plpgsql;
"""

# New monthly partitions get the TRUNCATE refusal only (row triggers come from the parent).
POSTGRES_SEALED_PARTITION_FUNCTION = """
CREATE OR REPLACE FUNCTION stopdesk_event_partition(month date) RETURNS text AS $$
DECLARE
    first date := date_trunc('month', month)::date;
    name text := 'stopdesk_event_' || to_char(first, 'YYYY_MM');
BEGIN
    IF to_regclass(name) IS NOT NULL THEN
        RETURN name;
    END IF;
    EXECUTE format('CREATE TABLE %I PARTITION OF stopdesk_event FOR VALUES FROM (%L) TO (%L)',
                   name, first::timestamptz, (first + interval '1 month')::timestamptz);
    EXECUTE format('CREATE TRIGGER stopdesk_event_no_truncate BEFORE TRUNCATE ON %I
                    FOR EACH STATEMENT EXECUTE FUNCTION stopdesk_refuse_truncate()', name);
    RETURN name;
END;
$$ LANGUAGE plpgsql;
"""

# SQLite: the guard already lets the seal through (SQLITE_CHAIN's stopdesk_event_no_update); only
# the insert trigger stopdesk_event_chain goes.
