"""The audit table's monthly partitions on PostgreSQL: created ahead by a daily job, and archived
(exported, anchored, dropped) by `manage.py events_archive` when a deployment no longer wants to
keep old months online.

Archiving a month never breaks what is left: each task's chain keeps an anchor (the seq and hash
of its last archived event), so `audit_verify` checks the live events from there, and the export
carries every archived row with its hash for checking on its own. It refuses a month while any
task with events in it is still under review or has a compensation under way, and it drops the
partition only after reading the export back and finding in it exactly what the database holds.
"""

from __future__ import annotations

import csv
import gzip
import hashlib
import json
from dataclasses import dataclass, field
from datetime import date
from pathlib import Path

from django.db import connection, transaction

from stopdesk import ports
from stopdesk.audit_db import EVENT_COLUMNS
from stopdesk.services.audit_seal import audit_seal_in_transaction, audit_seal_lock
from stopdesk.services.sql import is_postgres
from stopdesk.states import ItemState as S

MONTHS_AHEAD = 3
# A task with any of these is still someone's work: its history stays online.
OPEN_ITEM_STATES = (S.QUEUED, S.RUNNING, S.AWAITING_RECONCILIATION, S.UNCERTAIN)


class ArchiveRefused(Exception):
    pass


@dataclass(frozen=True)
class Partition:
    name: str
    month: date | None  # None: the default partition
    rows: int


@dataclass
class Archived:
    partition: str
    rows: int
    path: Path
    anchors: int
    sha256: str
    tasks: list[int] = field(default_factory=list)


def event_partitions_ensure(*, months_ahead: int = MONTHS_AHEAD) -> list[str]:
    """Create this month's partition and the next `months_ahead` (idempotent)."""
    if not is_postgres():
        return []
    with connection.cursor() as cursor:
        cursor.execute(
            """
            SELECT stopdesk_event_partition(m::date) FROM generate_series(
                date_trunc('month', now()), date_trunc('month', now()) + %s * interval '1 month',
                interval '1 month') m
            """,
            [months_ahead],
        )
        return [row[0] for row in cursor.fetchall()]


def event_partitions() -> list[Partition]:
    """Every partition, oldest first, with PostgreSQL's row estimate (no count over the table)."""
    if not is_postgres():
        return []
    with connection.cursor() as cursor:
        cursor.execute(
            """
            SELECT c.relname, greatest(c.reltuples, 0)::bigint FROM pg_inherits i
            JOIN pg_class c ON c.oid = i.inhrelid
            WHERE i.inhparent = 'stopdesk_event'::regclass ORDER BY c.relname
            """
        )
        rows = cursor.fetchall()
    parts = []
    for name, estimate in rows:
        suffix = name.removeprefix("stopdesk_event_")
        month = None if suffix == "default" else date(int(suffix[:4]), int(suffix[5:7]), 1)
        parts.append(Partition(name, month, estimate))
    return parts


def _still_needed(name: str) -> list[int]:
    # Compensations and escalations are reconcile's: their tasks come through the ledger's port.
    open_work, open_work_params = ports.tasks_with_open_work().query.sql_with_params()
    with connection.cursor() as cursor:
        cursor.execute(
            f"""
            SELECT DISTINCT e.task_id FROM {name} e
            WHERE e.task_id IS NOT NULL AND (
                EXISTS (SELECT 1 FROM stopdesk_workitem i WHERE i.task_id = e.task_id
                        AND (i.state = ANY(%s) OR i.needs_review))
                OR e.task_id IN ({open_work}))
            ORDER BY e.task_id LIMIT 20
            """,
            [list(OPEN_ITEM_STATES), *open_work_params],
        )
        return [row[0] for row in cursor.fetchall()]


def events_archive(*, month: date, out_dir: Path, today: date) -> Archived:
    """Export one month's partition to `out_dir` (gzip CSV, every column with its hash, in chain
    order, and a manifest with each task's anchor), check the export against the database, record
    the anchors, and drop the partition: all in one transaction that holds off writers to that
    month and the sealer. Refuses with ArchiveRefused (and then drops nothing)."""
    if not is_postgres():
        raise ArchiveRefused("archiving needs PostgreSQL: on SQLite the audit table is not partitioned")
    month = month.replace(day=1)
    if (month.year, month.month) >= (today.year, today.month):
        raise ArchiveRefused(f"{month:%Y-%m} is this month or later; only past months can be archived")
    name = f"stopdesk_event_{month:%Y_%m}"
    if name not in {p.name for p in event_partitions()}:
        raise ArchiveRefused(f"there is no partition for {month:%Y-%m} (already archived?)")
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / f"{name}.csv.gz"
    manifest_path = out_dir / f"{name}.manifest.json"
    if path.exists() or manifest_path.exists():
        raise ArchiveRefused(f"{path} exists; an archive is never overwritten")
    try:
        with transaction.atomic():
            # No sealer moves a chain until this commits (taken first: a sealer holds it while it
            # updates rows of this month).
            audit_seal_lock()
            with connection.cursor() as cursor:
                # Writers to this month wait (and those under way commit first); everything else goes on.
                cursor.execute(f"LOCK TABLE {name} IN SHARE MODE")
            # Every event of the month gets its place before the anchors are taken.
            audit_seal_in_transaction()
            needed = _still_needed(name)
            if needed:
                listed = ", ".join(str(t) for t in needed)
                raise ArchiveRefused(
                    f"{month:%Y-%m} has events of tasks still under review or with a compensation under way "
                    f"(tasks {listed}{'...' if len(needed) == 20 else ''}); settle them first"
                )
            digest = _export(name, path)
            with connection.cursor() as cursor:
                cursor.execute(
                    f"""
                    SELECT DISTINCT ON (coalesce(task_id, 0)) coalesce(task_id, 0), seq, hash FROM {name}
                    ORDER BY coalesce(task_id, 0), seq DESC
                    """
                )
                anchors = cursor.fetchall()
                cursor.execute(
                    """
                    UPDATE stopdesk_eventchain c SET anchor_seq = a.seq, anchor_hash = a.hash
                    FROM unnest(%s::bigint[], %s::bigint[], %s::text[]) AS a(task_id, seq, hash)
                    WHERE c.task_id = a.task_id AND a.seq > c.anchor_seq
                    """,
                    [[a[0] for a in anchors], [a[1] for a in anchors], [a[2] for a in anchors]],
                )
            rows = _export_check(name, path, digest, anchors)
            manifest = {
                "partition": name,
                "month": f"{month:%Y-%m}",
                "rows": rows,
                "csv_sha256": digest,
                "anchors": {str(task): {"seq": seq, "hash": value} for task, seq, value in anchors},
            }
            manifest_path.write_text(json.dumps(manifest, indent=1))
            with connection.cursor() as cursor:
                cursor.execute(f"ALTER TABLE stopdesk_event DETACH PARTITION {name}")
                cursor.execute(f"DROP TABLE {name}")
    except BaseException:
        # Nothing was dropped; an export that was not kept must not pass for an archive.
        path.unlink(missing_ok=True)
        manifest_path.unlink(missing_ok=True)
        raise
    return Archived(name, rows, path, len(anchors), digest, [a[0] for a in anchors])


def _export(name: str, path: Path) -> str:
    """COPY the partition to a gzip CSV in chain order; the SHA-256 of the CSV as written."""
    digest = hashlib.sha256()
    with connection.cursor() as cursor, gzip.open(path, "wb") as out:
        copy_sql = (
            f"COPY (SELECT {EVENT_COLUMNS} FROM {name} ORDER BY coalesce(task_id, 0), seq, id)"
            " TO STDOUT WITH (FORMAT csv, HEADER)"
        )
        with cursor.cursor.copy(copy_sql) as copy:
            for chunk in copy:
                data = bytes(chunk)
                digest.update(data)
                out.write(data)
    return digest.hexdigest()


def _export_check(name: str, path: Path, digest: str, anchors: list[tuple[int, int, str]]) -> int:
    """Read the export back from disk and compare it with the partition: the bytes' SHA-256, the
    row count, every event's (id, seq, hash) in order, and each task's last link. Streams both
    sides (a month can be millions of events). Returns the row count."""
    written = hashlib.sha256()
    with gzip.open(path, "rb") as export:
        while chunk := export.read(1 << 20):
            written.update(chunk)
    if written.hexdigest() != digest:
        raise ArchiveRefused(f"the export {path} read back differs from what was written; nothing was dropped")
    in_file, rows = hashlib.sha256(), 0
    last: dict[int, tuple[int, str]] = {}
    with gzip.open(path, "rt", newline="", encoding="utf-8") as export:
        for row in csv.DictReader(export):
            rows += 1
            in_file.update(f"{row['id']}:{row['seq']}:{row['hash']};".encode())
            last[int(row["task_id"] or 0)] = (int(row["seq"]), row["hash"])
    in_db, count = hashlib.sha256(), 0
    with connection.chunked_cursor() as cursor:
        cursor.execute(f"SELECT id, seq, hash FROM {name} ORDER BY coalesce(task_id, 0), seq, id")
        while batch := cursor.fetchmany(10_000):
            count += len(batch)
            for event_id, seq, value in batch:
                in_db.update(f"{event_id}:{seq}:{value};".encode())
    if rows != count:
        raise ArchiveRefused(f"the export {path} has {rows} events, the partition {count}; nothing was dropped")
    if in_file.hexdigest() != in_db.hexdigest():
        raise ArchiveRefused(f"the export {path} does not hold the partition's links; nothing was dropped")
    if last != {task: (seq, value) for task, seq, value in anchors}:
        raise ArchiveRefused(f"the export {path} ends on other links than the chains' anchors; nothing was dropped")
    return rows
